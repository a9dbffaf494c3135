"""The trained latency model's coefficients: the shipped fit, a user's own fit, and their files. No JAX.

The step time of an iteration is `beta . basis` (`cost_models.trained_basis`: prefill and decode compute and KV
traffic, weight reads, TP all-reduce, per-layer, per-request, per-step and per-MoE-layer costs). Three
request-level costs the GPU step does not see are added to each request as the client measures it (`alpha`):
a fixed time before its first token (HTTP, tokenization, scheduling: BLIS's alpha_0 "QueueingTime"), a time
per prompt token before it (tokenization), and a time per output token after the first (detokenization and
streaming). The shipped coefficients (`jaxroute/data/latency/trained.json`) were fitted by
`jaxroute fit-latency` to real vLLM runs on H100; the file records which runs, the commit and the
cross-validation figures.
"""

from __future__ import annotations

import dataclasses
import json
import math
from importlib import resources
from pathlib import Path

from jaxroute.errors import JaxrouteError
from jaxroute.mapping_files import read_mapping

BASIS = ("prefill_compute", "prefill_kv", "decode_compute", "decode_kv", "weights", "tp_allreduce",
         "tp_hop_us", "per_layer_us", "per_request_us", "per_step_us", "per_moe_layer_us")
N_BASIS = len(BASIS)
US = 1e-6  # the overhead bases are counts x 1 us, so their coefficients read in microseconds
ALPHA = ("first_token_s", "per_prompt_token_s", "per_output_token_s")
MODELS = ("trained", "roofline")  # --latency-model
KIND = "jaxroute latency params"
MAX_COEFFICIENT = 1e6  # a sanity bound on any coefficient read from a file
FIT_REQUESTS = 400  # `jaxroute fit-latency`: requests simulated per stage that keeps up (a stage holds 3,000-12,000)
FIT_ROUNDS = 8  # its Gauss-Newton rounds


@dataclasses.dataclass(frozen=True)
class LatencyParams:
    """Coefficients of the trained model: beta per basis term, alpha per request-level cost."""

    beta: tuple[float, ...]  # [N_BASIS], in BASIS order
    alpha: tuple[float, ...]  # [3], in ALPHA order (seconds)
    provenance: dict = dataclasses.field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        if len(self.beta) != N_BASIS or len(self.alpha) != len(ALPHA):
            raise JaxrouteError(f"latency params need {N_BASIS} beta ({', '.join(BASIS)}) and {len(ALPHA)} alpha "
                                f"coefficients; got {len(self.beta)} and {len(self.alpha)}")

    def as_json(self) -> dict:
        return {"kind": KIND, "beta": dict(zip(BASIS, self.beta, strict=True)),
                "alpha": dict(zip(ALPHA, self.alpha, strict=True)), "provenance": self.provenance}

    def text(self) -> str:
        b = ", ".join(f"{k} {v:.3g}" for k, v in zip(BASIS, self.beta, strict=True))
        a = ", ".join(f"{k} {v:.3g}" for k, v in zip(ALPHA, self.alpha, strict=True))
        return f"beta: {b}; alpha: {a}"


def _numbers(name: str, section, keys: tuple[str, ...], what: str) -> tuple[float, ...]:
    if not isinstance(section, dict) or set(section) != set(keys):
        got = sorted(section) if isinstance(section, dict) else type(section).__name__
        raise JaxrouteError(f"{name}: expected {what} with exactly {', '.join(keys)}; got {got}")
    out = []
    for k in keys:
        v = section[k]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not 0 <= v <= MAX_COEFFICIENT:
            raise JaxrouteError(f"{name}: {what}.{k} = {v!r}; expected a number in [0, {MAX_COEFFICIENT:g}]")
        out.append(float(v))
    return tuple(out)


def from_json(doc: dict, name: str) -> LatencyParams:
    """LatencyParams from a mapping as `as_json` writes it, checked field by field."""
    beta = _numbers(name, doc.get("beta"), BASIS, "beta")
    alpha = _numbers(name, doc.get("alpha"), ALPHA, "alpha")
    prov = doc.get("provenance", {})
    return LatencyParams(beta, alpha, prov if isinstance(prov, dict) else {})


def load(path: str | Path) -> LatencyParams:
    """A coefficients file (`jaxroute fit-latency --out`); every problem a one-line error."""
    p = Path(path)
    doc = read_mapping(p, "latency params file", "a mapping with beta and alpha (`jaxroute fit-latency --out`)")
    return from_json(doc, p.name)


def save(path: str | Path, params: LatencyParams) -> Path:
    from jaxroute.report import write_json

    return write_json(path, params.as_json())


def _package(name: str) -> LatencyParams:
    text = resources.files("jaxroute").joinpath(f"data/latency/{name}").read_text()
    return from_json(json.loads(text), f"jaxroute/data/latency/{name}")


def default() -> LatencyParams:
    """The shipped coefficients (package data: `jaxroute fit-latency`'s fit, with its provenance)."""
    return _package("trained.json")


def start() -> LatencyParams:
    """Where a fit starts unless told: BLIS's published trained-physics coefficients mapped onto this basis
    (inference-sim defaults.yaml `trained_physics_coefficients`; the hop term, which BLIS lacks, at 0). Not the
    shipped fit: a held-out fold must not start from coefficients fitted to the model it predicts (BLIS's own fit
    saw three of the Llama-2-7B runs: `real_runs` and the README say which)."""
    return _package("blis_start.json")
