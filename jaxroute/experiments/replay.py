"""A measured run replayed through the simulator, and how far the simulation is from it.

The measured requests (`jaxroute.measured`: vLLM `bench serve`, inference-perf, or jaxroute's own records) are
replayed with their send times and their prompt and output lengths as private prompts (no file records which
prompts share a prefix) on one deployment behind one router. The comparison follows BLIS's `calibrate`
(inference-sim/inference-sim, sim/workload/calibrate.go lines 400-510 and 604-636): per metric (TTFT, TPOT, E2E)
the workload-level mean, p50, p90, p99 measured and simulated with their percent errors, and the request-level
MAPE (mean over requests of |measured - simulated| / measured, requests whose measured value is 0 skipped), the
Pearson correlation, the bias direction and BLIS's quality rating.
"""

from __future__ import annotations

import numpy as np

from jaxroute.deployment import Deployment
from jaxroute.errors import JaxrouteError
from jaxroute.measured import METRICS, MeasuredRun, summary

DEFAULT_ROUTER = "least_load"  # one replica: the router does not matter

STATS = ("mean", "p50", "p90", "p99")


def replayable(run: MeasuredRun) -> np.ndarray:
    """[N] bool: the requests a replay can send (a prompt and an output of at least one token)."""
    return (run.prompt_tokens >= 1) & (run.output_tokens >= 1)


def workload(run: MeasuredRun):
    """The replayable requests as a trace workload of private prompts, at their recorded send times."""
    from jaxroute.workloads import prefix, traces

    keep = replayable(run)
    if not keep.any():
        raise JaxrouteError(f"{run.name}: no request with a prompt and an output of at least one token to replay")
    trace = traces.Trace(run.name, run.arrival_s[keep], run.prompt_tokens[keep], run.output_tokens[keep])
    return prefix.from_azure(trace, name=run.name)


def simulated(run: MeasuredRun, dep: Deployment, router: str = DEFAULT_ROUTER, factors=None) -> MeasuredRun:
    """The replay's per-request results, as a MeasuredRun over the same (replayable) requests."""
    from jaxroute.experiments import requests as req_lib
    from jaxroute.experiments.cluster import policy_rows, run_cluster

    wl = workload(run)
    rows = policy_rows([router], rate=0.0, kv_capacity=dep.kv_capacity, gpu=dep.gpu, model_name=dep.model,
                       cost_model=dep.cost_model, tp=dep.tp, cost_factors=factors)
    res = run_cluster(rows, wl, replicas_n=dep.replicas, seeds=1, chunk=dep.chunk, max_running=dep.max_running,
                      admission=dep.admission, request_records=True)
    if res.grid.overflow.any():
        raise JaxrouteError("the replay overflowed a fixed capacity (its local queue or cache table); "
                        "give more replicas or a larger --max-running")
    t = {k: v[0, 0] for k, v in req_lib.request_table(res).items()}
    keep = replayable(run)
    ok = np.isfinite(t["finish_s"])
    return MeasuredRun("jaxroute", f"replay of {run.name}", run.arrival_s[keep], t["prompt_tokens"].astype(np.int64),
                       t["output_tokens"].astype(np.int64), t["ttft_s"].astype(np.float64),
                       t["e2e_s"].astype(np.float64), t["tpot_s"].astype(np.float64), ok, run.stage[keep], True)


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 3 or np.std(a) == 0 or np.std(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def quality(mape_fraction: float, r: float) -> str:
    """BLIS's rating (calibrate.go `qualityRating`, lines 627-636): MAPE as a fraction, Pearson r ("n/a" when r is
    undefined: fewer than 3 pairs, or one side constant)."""
    if not np.isfinite(r):
        return "n/a"
    for label, m, c in (("excellent", 0.10, 0.95), ("good", 0.20, 0.85), ("fair", 0.35, 0.70)):
        if mape_fraction < m and r > c:
            return label
    return "poor"


def compare(measured: MeasuredRun, sim: MeasuredRun) -> dict[str, dict]:
    """{metric: the workload-level statistics and request-level errors} of a replay against its measured run."""
    keep = replayable(measured)
    out = {}
    for metric in METRICS:
        m_all, s = getattr(measured, f"{metric}_s")[keep], getattr(sim, f"{metric}_s")
        both = measured.ok[keep] & np.isfinite(m_all) & np.isfinite(s)
        ms, ss = summary(measured, metric), summary(sim, metric)
        use = both & (m_all != 0)
        err = np.abs(m_all[use] - s[use]) / m_all[use]
        mape_fraction = float(err.mean()) if use.any() else float("nan")
        r = _pearson(m_all[both], s[both])
        bias = float(np.sum(s[use] - m_all[use]))
        out[metric] = {
            "measured": ms, "simulated": ss,
            "percent_error": {k: (abs(ss[k] - ms[k]) / ms[k] * 100 if ms[k] > 0 else float("nan")) for k in STATS},
            "mape_pct": mape_fraction * 100, "pearson_r": r, "pairs": int(both.sum()),
            "bias": "over-predict" if bias > 0 else "under-predict" if bias < 0 else "neutral",
            "quality": quality(mape_fraction, r),
        }
    return out


def format_comparison(result: dict[str, dict]) -> str:
    """A table: one line per metric, measured and simulated statistics (ms) and the errors."""
    head = ["metric", "pairs"] + [f"{k} meas/sim ms" for k in STATS] + ["MAPE %", "r", "bias", "quality"]
    rows = []
    for metric, c in result.items():
        cells = [metric, str(c["pairs"])]
        cells += [f"{c['measured'][k] * 1e3:.4g} / {c['simulated'][k] * 1e3:.4g}" for k in STATS]
        r = c["pearson_r"]
        cells += [f"{c['mape_pct']:.2f}", f"{r:.3f}" if np.isfinite(r) else "undefined", c["bias"], c["quality"]]
        rows.append(cells)
    from jaxroute.report import text_table

    return text_table(head, rows)
