"""The tunable settings of `jaxroute tune` and their bounds, defined once and importable without JAX.

`tune.py` (cluster routers) and `tune_decode.py` (BR-H's weights) search these; the parser of `jaxroute
tune` lists them in its help without importing the models.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Knob:
    """One tunable setting: a `make_params` router keyword (`w_<scorer>` = that scorer's weight) in [lo, hi]."""

    name: str
    lo: float
    hi: float
    log: bool = False

    @property
    def scorer(self) -> str | None:
        """The scorer whose weight this is (None for other settings)."""
        return self.name.removeprefix("w_") if self.name.startswith("w_") else None

    def to_unit(self, v: float) -> float:
        v = min(max(float(v), self.lo), self.hi)
        if self.log:
            return (math.log(v) - math.log(self.lo)) / (math.log(self.hi) - math.log(self.lo))
        return (v - self.lo) / (self.hi - self.lo)

    def from_unit(self, u: float) -> float:
        u = min(max(float(u), 0.0), 1.0)
        if self.log:
            return math.exp(math.log(self.lo) + u * (math.log(self.hi) - math.log(self.lo)))
        return self.lo + u * (self.hi - self.lo)


def weight_knobs(*scorers: str) -> tuple[Knob, ...]:
    """The weights `w_<scorer>` of the weighted presets, each in [0, 10]."""
    return tuple(Knob(f"w_{s}", 0.0, 10.0) for s in scorers)


_THETA = Knob("theta", 0.0, 1.0)
_SGL = (Knob("sgl_cache_threshold", 0.0, 1.0), Knob("sgl_balance_abs", 1.0, 1024.0, log=True),
        Knob("sgl_balance_rel", 1.0, 4.0))
_E2 = (Knob("e2_th_bal", 1.0, 4.0), Knob("e2_window_s", 10.0, 1800.0, log=True))

# preset -> the settings tuned by default (bounds; their defaults are the preset's, `Space.default_values`)
TUNABLE: dict[str, tuple[Knob, ...]] = {
    "threshold": (_THETA,),
    "cache_guard": (_THETA, Knob("guard_abs", 1.0, 256.0, log=True), Knob("guard_rel", 1.0, 4.0)),
    "weighted": weight_knobs("prefix", "inflight", "tokens"),
    "llmd_precise": weight_knobs("prefix", "kv", "queue"),
    "llmd_approx": weight_knobs("prefix", "kv", "queue"),
    "llmd_load": weight_knobs("queue", "kv"),
    "llmd_load_aware": (Knob("load_threshold", 4.0, 1024.0, log=True),),
    "dynamo_kv": (Knob("dyn_overlap_weight", 0.0, 10.0), Knob("dyn_temperature", 0.0, 2.0)),
    "sglang_cache_aware": _SGL,
    "sglang_cache_aware_rs": _SGL,
    "sglang_gateway": _SGL,
    "preble_e2": _E2,
    "preble": _E2,
}
TUNABLE_ROUTERS = tuple(TUNABLE)


# BR-H's weights in the decode model (`tune_decode.py`). beta: log range (the default, G workers, is inside for
# G <= 64); gamma: discount; alpha: gain weight
DECODE_KNOBS = (Knob("beta", 0.5, 64.0, log=True), Knob("gamma", 0.5, 0.999), Knob("alpha", 0.1, 4.0))
