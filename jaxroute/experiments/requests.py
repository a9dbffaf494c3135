"""Per-request records of a grid run, and the per-stage results computed from them.

A model built with `request_records=True` returns every request's record in its metrics ("req.<field>",
[rows, seeds, N]); `request_table` reads them as host arrays. From them, vectorised over rows and seeds:
`stage_summaries` gives inference-perf's per-stage view of a staged run (one row per load stage; a
request belongs to the stage it arrived in), and `write_requests` writes the records (CSV or JSONL, one
line per row x seed x request, the columns of `COLUMNS`), which `jaxroute compare` reads back.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from jaxroute import output_paths
from jaxroute.errors import JaxrouteError
from jaxroute.metrics import Summary, summarize_present

# the columns of a records file (times in seconds since the run's first arrival; an unfinished request's
# admit, first-token and finish times are empty in CSV, null in JSONL; replica -1: never dispatched)
COLUMNS = ("router", "seed", "request", "arrival_s", "replica", "admit_s", "first_token_s", "finish_s",
           "prompt_tokens", "cached_tokens", "output_tokens", "preemptions", "ttft_s", "e2e_s", "tpot_s", "stage")
INT_COLUMNS = ("seed", "request", "replica", "prompt_tokens", "cached_tokens", "output_tokens", "preemptions", "stage")
# per-stage metrics (inference-perf's per-stage report: rate, requests, TTFT, ITL/TPOT, E2E, output tok/s)
STAGE_METRICS = ("requests", "ttft_mean_s", "ttft_p90_s", "ttft_p99_s", "tpot_mean_s", "tpot_p90_s",
                 "e2e_mean_s", "e2e_p90_s", "e2e_p99_s", "output_tokens_per_s", "hit_rate")
STAGE_PLOT_METRICS = ("ttft_mean_s", "ttft_p90_s", "tpot_mean_s", "e2e_p90_s", "output_tokens_per_s", "hit_rate")


def request_table(results) -> dict[str, np.ndarray]:
    """{field: [rows, seeds, N]} of a comparison run with request records, plus ttft_s, e2e_s, tpot_s
    (NaN where not finished, tpot also for one-token outputs)."""
    table = {k.removeprefix("req."): np.asarray(v) for k, v in results.metrics.items() if k.startswith("req.")}
    if not table:
        raise JaxrouteError("this run kept no per-request records (build the model with request_records=True)")
    t = {k: v.astype(np.float64) for k, v in table.items() if k.endswith("_s")}
    done = np.isfinite(t["finish_s"])
    out = table["output_tokens"]
    with np.errstate(invalid="ignore", divide="ignore"):
        table["ttft_s"] = np.where(np.isfinite(t["first_token_s"]), t["first_token_s"] - t["arrival_s"], np.nan)
        table["e2e_s"] = np.where(done, t["finish_s"] - t["arrival_s"], np.nan)
        table["tpot_s"] = np.where(done & (out > 1), (t["finish_s"] - t["first_token_s"]) / np.maximum(out - 1, 1),
                                   np.nan)
    return table


def stage_of(arrival_s: np.ndarray, stages: Sequence[tuple[float, float]]) -> np.ndarray:
    """Stage index of each arrival: stages [(rate, seconds), ...] run in order from t = 0; arrivals after
    the last stage's end belong to it (its rate continues)."""
    ends = np.cumsum([d for _, d in stages])[:-1]
    return np.searchsorted(ends, arrival_s, side="right").astype(np.int64)


def _quantile(x: np.ndarray, mask: np.ndarray, q: float) -> np.ndarray:
    """Quantile over the last axis where mask, linear interpolation (`metrics.masked_quantile`); NaN if none."""
    xs = np.sort(np.where(mask, x, np.inf), axis=-1)
    n = mask.sum(-1)
    pos = q * np.maximum(n - 1, 0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
    x_lo = np.take_along_axis(xs, lo[..., None], -1)[..., 0]
    x_hi = np.take_along_axis(xs, hi[..., None], -1)[..., 0]
    with np.errstate(invalid="ignore"):
        val = x_lo + (x_hi - x_lo) * (pos - lo)
    return np.where(n > 0, val, np.nan)


def _mean(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    n = mask.sum(-1)
    return np.where(n > 0, np.where(mask, x, 0.0).sum(-1) / np.maximum(n, 1), np.nan)  # none: missing, not 0


def stage_values(table: dict[str, np.ndarray], stages: Sequence[tuple[float, float]]) -> dict[str, np.ndarray]:
    """{metric: [rows, seeds, K]} per load stage: the requests that arrived in the stage, and of them the
    finished ones' TTFT, TPOT and E2E (means and quantiles), output tokens per second over the stage's span
    (first arrival to last finish of its requests) and hit rate (cached / prompt tokens)."""
    stage = stage_of(table["arrival_s"], stages)
    out: dict[str, list] = {m: [] for m in STAGE_METRICS}
    done = np.isfinite(table["finish_s"])
    for k in range(len(stages)):
        inside = stage == k
        fin = inside & done
        out["requests"].append(inside.sum(-1).astype(np.float64))
        for name, q in (("ttft", None), ("ttft", 0.9), ("ttft", 0.99), ("tpot", None), ("tpot", 0.9), ("e2e", None),
                        ("e2e", 0.9), ("e2e", 0.99)):
            x = table[f"{name}_s"]
            m = fin & np.isfinite(x)
            key = f"{name}_mean_s" if q is None else f"{name}_p{round(q * 100)}_s"
            out[key].append(_mean(x, m) if q is None else _quantile(x, m, q))
        first = np.where(inside, table["arrival_s"], np.inf).min(-1)
        last = np.where(fin, table["finish_s"], -np.inf).max(-1)
        span = np.where(fin.any(-1), last - first, 0.0)
        tokens = np.where(fin, table["output_tokens"], 0).sum(-1)
        out["output_tokens_per_s"].append(np.where(span > 0, tokens / np.where(span > 0, span, 1.0), 0.0))
        prompt = np.where(fin, table["prompt_tokens"], 0).sum(-1)
        cached = np.where(fin, table["cached_tokens"], 0).sum(-1)
        out["hit_rate"].append(np.where(prompt > 0, cached / np.maximum(prompt, 1), np.nan))
    return {m: np.stack(v, axis=-1) for m, v in out.items()}


def stage_summaries(table: dict[str, np.ndarray], stages: Sequence[tuple[float, float]]) -> list[list[dict[str, Summary]]]:
    """[row][stage] {metric: mean and 95 % CI over seeds} of `stage_values`."""
    values = stage_values(table, stages)
    rows, _, k = values["requests"].shape
    return [[{m: summarize_present(values[m][c, :, j]) for m in STAGE_METRICS} for j in range(k)] for c in range(rows)]


def stages_json(labels: Sequence[str], stages, summaries) -> dict:
    """The per-stage results as JSON: {router: [{stage, rate, seconds, metrics}, ...]}."""
    return {label: [{"stage": j, "rate": r, "seconds": d, "metrics": {m: s.as_json() for m, s in per.items()}}
                    for j, ((r, d), per) in enumerate(zip(stages, rows, strict=True))]
            for label, rows in zip(labels, summaries, strict=True)}


def stage_plot(labels: Sequence[str], stages, summaries, path: str | Path, title: str) -> Path:
    """PNG: each per-stage metric against the stage's rate, one line per router with its 95 % CI band."""
    from jaxroute import report

    rates = [r for r, _ in stages]
    ordinal = len(set(rates)) < len(rates) or rates != sorted(rates)  # a ladder down (or repeated): by stage
    x = list(range(len(stages))) if ordinal else rates
    panels = {m: [{"x": x, "y": [per[m].mean for per in rows], "lo": [per[m].lo for per in rows],
                   "hi": [per[m].hi for per in rows], "label": label, "marker": "o"}
                  for label, rows in zip(labels, summaries, strict=True)] for m in STAGE_PLOT_METRICS}
    ticks = (x, [f"{j}: {r:g}" for j, r in enumerate(rates)]) if ordinal else None
    return report.line_plot(panels, path, xlabel="stage: requests/s" if ordinal else "stage rate (requests/s)",
                            ylabel={m: m for m in STAGE_PLOT_METRICS}, title=title, xticks=ticks)


def format_stage_table(label: str, stages, rows: Sequence[dict[str, Summary]]) -> str:
    """One router's per-stage table (mean ± 95 % CI half-width over seeds)."""
    from jaxroute import report

    recs = [report.Record(f"{j}: {r:g} req/s x {d:g} s", {}, False, per)
            for j, ((r, d), per) in enumerate(zip(stages, rows, strict=True))]
    return f"{label}, per load stage\n" + report.format_table(recs, STAGE_METRICS).replace("policy", "stage ", 1)


def peak_in_flight(table: dict[str, np.ndarray]) -> int:
    """The most requests in flight at once (arrived, not finished) over every row and seed."""
    a = table["arrival_s"].astype(np.float64)
    f = np.where(np.isfinite(table["finish_s"]), table["finish_s"], np.inf).astype(np.float64)
    times = np.concatenate([a, f], axis=-1)
    steps = np.concatenate([np.ones_like(a), -np.ones_like(f)], axis=-1)
    order = np.lexsort((steps, times), axis=-1)  # a finish before an arrival at the same time
    return int(np.cumsum(np.take_along_axis(steps, order, -1), axis=-1).max())


def write_requests(path: str | Path, labels: Sequence[str], table: dict[str, np.ndarray],
                   stages: Sequence[tuple[float, float]] | None = None) -> Path:
    """Write every row x seed x request record (`COLUMNS`) as CSV, or JSONL when the path ends in .jsonl."""
    path = Path(path)
    rows, seeds, n = table["arrival_s"].shape
    cols = {"router": np.repeat(np.asarray(labels, dtype=object), seeds * n),
            "seed": np.tile(np.repeat(np.arange(seeds), n), rows), "request": np.tile(np.arange(n), rows * seeds)}
    stage = stage_of(table["arrival_s"], stages) if stages else np.zeros(table["arrival_s"].shape, np.int64)
    for name in COLUMNS[3:]:
        cols[name] = (stage if name == "stage" else table[name]).reshape(-1)
    times = [c for c in COLUMNS if c.endswith("_s")]
    values = {c: cols[c].tolist() for c in COLUMNS}
    for c in times:  # unfinished: empty / null
        values[c] = [v if np.isfinite(v) else None for v in values[c]]
    if path.suffix.lower() == ".jsonl":
        with output_paths.atomic(path) as f:
            for i in range(rows * seeds * n):
                f.write(json.dumps({c: values[c][i] for c in COLUMNS}) + "\n")
    else:
        with output_paths.atomic(path, newline="") as f:
            w = csv.writer(f)
            w.writerow(COLUMNS)
            w.writerows(zip(*(["" if v is None else v for v in values[c]] for c in COLUMNS), strict=True))
    return path
