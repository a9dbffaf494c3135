"""Decode workloads: prefilled requests for the decode data-parallel barrier model (BalanceRoute).

Each request has an arrival time (when its prefill completes), a prompt length s_i
(its KV load on admission), an output length (decode steps until it finishes) and a
prompt key (`key_id`, for exact-match predictors; -1 where unknown).

Built-in synthetic workloads (documented, heavy-tailed length laws):

- `synthetic-azure24`: modelled on the paper's Azure-2024 conversation split
  (mean prompt 4652, mean output 1052). Prompt ~ clip(LogNormal, 32, 32768) with
  sigma 1.0; output ~ clip(LogNormal, 1, 4096) with sigma 1.0 (max_tokens 4096). The location mu of
  each law is solved so that the mean of the *clipped* law is the target mean.
  No prompt keys (key_id = -1). Note: the write-up says the paper filtered Azure-2024
  by "output length > 1000"; we keep a heavy-tailed output law with the same mean
  instead of a narrow band just above 1000 tokens (see the reproduction script).
- `synthetic-prod`: modelled on the paper's production data (mean prompt 3197, mean
  output 1185), which is dominated by repeated prompt templates. 80 % of requests
  use one of 200 templates chosen by Zipf(1.1) popularity; a template has a prompt
  length (clipped LogNormal, sigma 0.8, per-request jitter x U(0.95, 1.05)) and a
  typical output length o_t (clipped LogNormal, sigma 1.0); a request of that
  template outputs o_t x LogNormal(0, 0.1), so outputs repeat closely within a
  template and exact-match prediction works. key_id is the template id. The other
  20 % are one-off prompts (unique key_id >= 200 that never repeats) with lengths
  from the global laws. The template laws are scaled so the mixture hits the means.

Synthetic arrival times are a Poisson process at `SYNTHETIC_RATE_PER_S` requests/s
(used only with `--arrival trace`; `saturated` and `poisson:RATE` ignore them).

Trace workloads `azure-conv` / `azure-code` read the Azure LLM 2023 CSV through
`traces.load_azure_csv` (no keys). `time_scale` multiplies trace timestamps
(0.5 replays twice as fast).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from jaxroute.errors import JaxrouteError
from jaxroute.workloads import traces

DECODE_WORKLOADS = ("synthetic-azure24", "synthetic-prod", "azure-conv", "azure-code")

# Trace files in the shared data folder (never bundled); resolved relative to the cwd.
DEFAULT_TRACE_PATHS = {
    "azure-conv": "../shared/data/azure_llm_2023_conv.csv",
    "azure-code": "../shared/data/azure_llm_2023_code.csv",
}

SYNTHETIC_RATE_PER_S = 2.0  # nominal Poisson arrival rate of synthetic workloads (requests/s)

# (mean, sigma, lo, hi) of the clipped log-normal laws.
AZURE24_PROMPT = (4652.0, 1.0, 32, 32768)
AZURE24_OUTPUT = (1052.0, 1.0, 1, 4096)
PROD_PROMPT = (3197.0, 0.8, 32, 32768)
PROD_OUTPUT = (1185.0, 1.0, 1, 4096)
PROD_TEMPLATES = 200
PROD_TEMPLATE_FRACTION = 0.8
PROD_ZIPF = 1.1
PROD_OUTPUT_JITTER_SIGMA = 0.1
PROD_PROMPT_JITTER = 0.05


@dataclasses.dataclass(frozen=True)
class DecodeRequests:
    """Prefilled requests in arrival order (host arrays)."""

    name: str
    arrival_s: np.ndarray  # [N] float64, seconds since the first request
    prompt_tokens: np.ndarray  # [N] int64, >= 1: KV tokens on admission (s_i)
    output_tokens: np.ndarray  # [N] int64, >= 1: decode steps until the request finishes
    key_id: np.ndarray  # [N] int64, prompt key (template / hash id), -1 where unknown

    def __len__(self) -> int:
        return len(self.arrival_s)


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def clipped_lognormal_mean(mu: float, sigma: float, lo: float, hi: float) -> float:
    """E[clip(X, lo, hi)] for X ~ LogNormal(mu, sigma) (closed form)."""
    a, b = math.log(lo), math.log(hi)
    inner = math.exp(mu + sigma**2 / 2) * (_phi((b - mu - sigma**2) / sigma) - _phi((a - mu - sigma**2) / sigma))
    return lo * _phi((a - mu) / sigma) + inner + hi * (1.0 - _phi((b - mu) / sigma))


def solve_lognormal_mu(mean: float, sigma: float, lo: float, hi: float) -> float:
    """The mu for which clip(LogNormal(mu, sigma), lo, hi) has the given mean (bisection)."""
    if not lo < mean < hi:
        raise JaxrouteError(f"target mean {mean} must lie strictly between the clip bounds {lo} and {hi}")
    left, right = math.log(lo) - 10 * sigma, math.log(hi) + 10 * sigma
    for _ in range(200):
        mid = (left + right) / 2
        if clipped_lognormal_mean(mid, sigma, lo, hi) < mean:
            left = mid
        else:
            right = mid
    return (left + right) / 2


def _lognormal(rng: np.random.Generator, law: tuple, size: int, mean_scale: float = 1.0) -> np.ndarray:
    mean, sigma, lo, hi = law
    mu = solve_lognormal_mu(mean * mean_scale, sigma, lo, hi)
    x = rng.lognormal(mu, sigma, size)
    return np.clip(np.rint(x), lo, hi).astype(np.int64)


def _poisson_arrivals(rng: np.random.Generator, n: int) -> np.ndarray:
    t = np.cumsum(rng.exponential(1.0 / SYNTHETIC_RATE_PER_S, n))
    return t - t[0]


def _synthetic_azure24(n: int, rng: np.random.Generator) -> DecodeRequests:
    prompt = _lognormal(rng, AZURE24_PROMPT, n)
    output = _lognormal(rng, AZURE24_OUTPUT, n)
    return DecodeRequests("synthetic-azure24", _poisson_arrivals(rng, n), prompt, output, np.full(n, -1, np.int64))


def _synthetic_prod(n: int, rng: np.random.Generator) -> DecodeRequests:
    k = PROD_TEMPLATES
    # Template table (fixed per seed): prompt base and typical output of each template.
    t_prompt = _lognormal(rng, PROD_PROMPT, k)
    t_output = _lognormal(rng, PROD_OUTPUT, k)
    popularity = 1.0 / np.arange(1, k + 1) ** PROD_ZIPF
    popularity /= popularity.sum()
    # Rescale the template tables so the popularity-weighted means hit the targets exactly
    # (a few popular templates would otherwise move the mixture mean a lot).
    t_prompt = np.maximum(np.rint(t_prompt * PROD_PROMPT[0] / float(popularity @ t_prompt)), 1).astype(np.int64)
    t_output = np.maximum(np.rint(t_output * PROD_OUTPUT[0] / float(popularity @ t_output)), 1).astype(np.int64)

    templated = rng.random(n) < PROD_TEMPLATE_FRACTION
    tid = rng.choice(k, size=n, p=popularity)
    jitter_p = rng.uniform(1 - PROD_PROMPT_JITTER, 1 + PROD_PROMPT_JITTER, n)
    jitter_o = rng.lognormal(-(PROD_OUTPUT_JITTER_SIGMA**2) / 2, PROD_OUTPUT_JITTER_SIGMA, n)
    prompt_t = np.maximum(np.rint(t_prompt[tid] * jitter_p), 1).astype(np.int64)
    output_t = np.clip(np.rint(t_output[tid] * jitter_o), 1, PROD_OUTPUT[3]).astype(np.int64)
    prompt_u = _lognormal(rng, PROD_PROMPT, n)
    output_u = _lognormal(rng, PROD_OUTPUT, n)
    prompt = np.where(templated, prompt_t, prompt_u)
    output = np.where(templated, output_t, output_u)
    key = np.where(templated, tid, k + np.arange(n)).astype(np.int64)  # one-off prompts never repeat
    return DecodeRequests("synthetic-prod", _poisson_arrivals(rng, n), prompt, output, key)


def resolve_trace_path(name: str, trace_path: str | Path | None) -> Path:
    """The explicit --trace path, else the default shared-data path; a clear error if missing."""
    if trace_path is not None:
        p = Path(trace_path)
        if not p.exists():
            raise JaxrouteError(f"trace file not found: {p}")
        return p
    p = Path(DEFAULT_TRACE_PATHS[name])
    if not p.exists():
        raise JaxrouteError(
            f"workload '{name}' needs the Azure LLM 2023 trace CSV: pass --trace PATH "
            f"(default {DEFAULT_TRACE_PATHS[name]} relative to the current directory was not found)"
        )
    return p


def make_decode_requests(
    name: str, n: int, seed: int = 0, trace_path: str | Path | None = None, time_scale: float = 1.0
) -> DecodeRequests:
    """The first n requests of a decode workload (synthetic draws use numpy `seed`)."""
    if name not in DECODE_WORKLOADS:
        raise JaxrouteError(f"unknown decode workload '{name}'; choose from: {', '.join(DECODE_WORKLOADS)}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise JaxrouteError(f"number of requests must be a positive integer, got {n!r}")
    if not (isinstance(time_scale, (int, float)) and math.isfinite(time_scale) and time_scale > 0):
        raise JaxrouteError(f"time scale must be a positive finite number, got {time_scale!r}")
    n = int(n)
    if name.startswith("synthetic"):
        rng = np.random.default_rng(seed)
        req = _synthetic_azure24(n, rng) if name == "synthetic-azure24" else _synthetic_prod(n, rng)
        return dataclasses.replace(req, arrival_s=req.arrival_s * time_scale)
    tr = traces.load_azure_csv(resolve_trace_path(name, trace_path))
    if n > len(tr):
        raise JaxrouteError(f"workload '{name}' has only {len(tr)} requests in {tr.name}; asked for {n}")
    tr = tr.head(n)
    return DecodeRequests(
        name,
        np.asarray(tr.arrival_s, np.float64) * time_scale,
        np.asarray(tr.prompt_tokens, np.int64),
        np.asarray(tr.output_tokens, np.int64),
        np.full(n, -1, np.int64),
    )
