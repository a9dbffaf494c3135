"""The tunable settings of `jaxroute tune` and their bounds, defined once and importable without JAX.

`tune.py` (cluster routers) and `tune_decode.py` (BR-H's weights) search these; the parser of `jaxroute
tune` lists them in its help without importing the models.
"""

from __future__ import annotations

from jaxroute.routers.spec import SPECS, Knob

# preset -> the settings tuned by default, with bounds (their defaults are the preset's, `Space.default_values`):
# each router's spec says which (routers/spec.py)
TUNABLE: dict[str, tuple[Knob, ...]] = {s.name: s.tunable for s in SPECS if s.tunable}
TUNABLE_ROUTERS = tuple(TUNABLE)


# BR-H's weights in the decode model (`tune_decode.py`). beta: log range (the default, G workers, is inside for
# G <= 64); gamma: discount; alpha: gain weight
DECODE_KNOBS = (Knob("beta", 0.5, 64.0, log=True), Knob("gamma", 0.5, 0.999), Knob("alpha", 0.1, 4.0))

# An autoscaler's settings `jaxroute tune control` searches, per autoscaler (their defaults: the sources',
# `clusters.names.CONTROL_DEFAULTS`; docs/control.md)
CONTROL_KNOBS: dict[str, tuple[Knob, ...]] = {
    "hpa": (Knob("target", 0.5, 64.0, log=True), Knob("down_window_s", 0.0, 600.0), Knob("tolerance", 0.0, 0.5)),
    "kpa": (Knob("target", 1.0, 128.0, log=True), Knob("stable_window_s", 6.0, 300.0, log=True),
            Knob("panic_threshold", 1.1, 10.0, log=True)),
    "sla": (Knob("capacity_rps", 0.2, 100.0, log=True), Knob("interval_s", 5.0, 300.0, log=True)),
}
