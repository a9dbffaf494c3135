"""Decode data-parallel workers behind a barrier: routers x predictors on the same seeds (BalanceRoute).

Every (policy, predictor) row and every seed runs in ONE compiled program: the policy, the
dispatch mode, the predictor id and BR-H's alpha/beta/gamma are traced parameters.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxroute import cost_models, report
from jaxroute.clusters import dp_decode as dd
from jaxroute.deployment import DECODE, Deployment
from jaxroute.errors import JaxrouteError
from jaxroute.experiments.comparison import (
    Comparison,
    Results,
    Row,
    paired_difference,
    run_with_retry,
)
from jaxroute.experiments.names import LOWER_IS_BETTER
from jaxroute.metrics import summarize
from jaxroute.predictors import base as predictors
from jaxroute.routers import balance
from jaxroute.workloads.decode import DecodeRequests

METRICS = ("imbalance_tokens", "barrier_idle_tokens", "tpot_p95_s", "throughput_tok_s")
EXTRA_METRICS = ("imbalance_loaded_tokens", "throughput_loaded_tok_s", "tpot_p95_loaded_s", "tokens_per_step",
                 "tokens_per_step_loaded", "completed_loaded", "preemptions", "recomputed_tokens", "mean_step_s", "util_mean", "util_min",
                 "makespan_s", "steps", "mean_load_tokens", "completed", "running_per_worker",
                 "running_per_worker_loaded", "slots_in_use", "kv_share_of_step")
# Direction of "better" for the relative columns: LOWER_IS_BETTER (experiments/names.py).


@dataclasses.dataclass(frozen=True)
class DecodeRow:
    """One configuration of the comparison (becomes one traced params row)."""

    policy: str
    predictor: str | None = None  # BR-H only
    alpha: float = dd.DEFAULT_ALPHA
    beta: float | None = None  # None: G
    gamma: float = dd.DEFAULT_GAMMA
    dispatch: str | None = None  # None: the policy's own mode

    def label(self) -> str:
        base = self.policy if self.predictor is None else f"{self.policy}[{self.predictor}]"
        return base if self.dispatch is None else f"{base}/{self.dispatch}"




def rows_for(policies, predictor_names, *, alpha=dd.DEFAULT_ALPHA, beta=None, gamma=dd.DEFAULT_GAMMA,
             dispatch=None) -> list[DecodeRow]:
    """One row per policy; BR-H gets one row per predictor."""
    rows = []
    for p in policies:
        if p == "brh":
            rows += [DecodeRow("brh", k, alpha, beta, gamma, dispatch) for k in predictor_names]
        else:
            rows.append(DecodeRow(p, None, alpha, beta, gamma, dispatch))
    return rows


def run_comparison(req: DecodeRequests, rows: list[DecodeRow], *, workers: int, seeds: int, dep: Deployment = DECODE,
                   arrival: str = "saturated", rate: float = 1.0, seed: int = 0, bank: tuple = (),
                   progress: bool | str = False, max_steps: int | None = None) -> Results:
    """Run all rows x seeds in one compiled grid; records get `<metric>_vs_best_pct` columns.

    When a run hits the step budget, the whole grid is rerun once with a 1.6x budget (one
    compilation per budget), unless `max_steps` was given.
    """
    if workers < 1:
        raise JaxrouteError(f"--workers must be >= 1, got {workers}")
    cost = cost_models.cost_params(dep.gpu, dep.model, dep.tp, parallel=dep.parallel, dp_ranks=workers)
    kv_cap = cost_models.kv_capacity_tokens(dep.gpu, dep.model, dep.tp, parallel=dep.parallel, dp_ranks=workers)
    wl = dd.make_workload(req, cost, dep.collective_s, bank)
    params = [
        dd.make_params(r.policy, n_workers=workers, dispatch=r.dispatch,
                       predictor=predictors.kind_id(r.predictor) if r.predictor else 1,
                       alpha=r.alpha, beta=r.beta, gamma=r.gamma, arrival=arrival, rate=rate) for r in rows]
    min_step = float(cost_models.decode_step_time(cost, 1.0, 1.0)) + dep.collective_s  # the fastest barrier step
    budget = max_steps or dd.step_budget(req, workers, dep.slots, dep.r_max, arrival, rate, min_step_s=min_step)
    rows_info = [Row(r.policy, params_i, {"label": r.label(), "predictor": r.predictor, "alpha": r.alpha,
                                          "beta": workers if r.beta is None else r.beta, "gamma": r.gamma,
                                          "dispatch": balance.DISPATCH_MODES[int(params_i.dispatch)],
                                          "horizon": dep.horizon})
                 for r, params_i in zip(rows, params, strict=True)]

    def run(caps):
        model = dd.DecodeModel(
            n_workers=workers, n_requests=len(req), max_steps=caps["max_steps"], slots=dep.slots, pool=dep.pool,
            window=dep.window, horizon=dep.horizon, r_max=dep.r_max, kv_capacity=kv_cap, block_size=dep.block_size,
            preempt=dep.preempt, cap_immediate=dep.cap_immediate)
        return Comparison(model, rows_info, seeds, METRICS + EXTRA_METRICS, workload=wl, seed=seed,
                          chunk=max(1, math.ceil(caps["max_steps"] / 20)), progress=progress).run()

    results, _ = run_with_retry(run, {"max_steps": budget}, {"max_steps": "overflow_steps"},
                                max_tries=1 if max_steps else 2, growth=1.6)
    records, grid = results.records, results.grid
    util = np.asarray(grid.metrics["worker_util"])  # [C, S, G]
    for c, rec in enumerate(records):
        for g in range(workers):
            rec.metrics[f"util_worker{g}"] = summarize(util[c, :, g])
    add_relative(results)
    return results


def best_baseline(records, metric: str) -> int | None:
    """Index of the best of the four paper baselines (random, rr, p2c, jsq) on a metric."""
    idx = [i for i, r in enumerate(records) if r.policy in balance.PAPER_BASELINES and r.params.get("dispatch") ==
           balance.DISPATCH_MODES[balance.default_dispatch(r.policy)]]
    if not idx:  # every row forced to one dispatch mode: compare with the baselines as run
        idx = [i for i, r in enumerate(records) if r.policy in balance.PAPER_BASELINES]
    if not idx:
        return None
    key = lambda i: records[i].metrics[metric].mean
    return min(idx, key=key) if LOWER_IS_BETTER[metric] else max(idx, key=key)


def add_relative(results: Results) -> None:
    """Add `<metric>_vs_best_pct`: paired per-seed % change against the best paper baseline."""
    records = results.records
    for metric in LOWER_IS_BETTER:
        b = best_baseline(records, metric)
        if b is None:
            continue
        for c, rec in enumerate(records):
            rec.metrics[f"{metric}_vs_best_pct"] = paired_difference(results, metric, c, b, relative=True)
            rec.params.setdefault("best_baseline", {})[metric] = records[b].params["label"]


def _pct(rec, metric):
    s = rec.metrics.get(f"{metric}_vs_best_pct")
    if metric == "tpot_p95_loaded_s" and min(rec.metrics["completed_loaded"].per_seed) <= 0:
        return "-"  # some seed finished no request before the last admission
    return "" if s is None else f"{s.mean:+.1f}±{s.half_width:.1f}%"


def comparison_columns() -> dict:
    """The comparison table's extra columns: title -> record -> text (changes vs the best baseline, step stats)."""
    return {"imb vs best": lambda r: _pct(r, "imbalance_tokens"),
             "tpot vs best": lambda r: _pct(r, "tpot_p95_s"),
             "tput vs best": lambda r: _pct(r, "throughput_tok_s"),
             "tok/step": lambda r: f"{r.metrics['tokens_per_step'].mean:.1f}",
             "loaded imb vs best": lambda r: _pct(r, "imbalance_loaded_tokens"),
             "loaded tput": lambda r: report.fmt_ci(r.metrics["throughput_loaded_tok_s"]),
             "loaded vs best": lambda r: _pct(r, "throughput_loaded_tok_s"),
             "loaded tpot vs best": lambda r: _pct(r, "tpot_p95_loaded_s"),
             "loaded tok/step": lambda r: f"{r.metrics['tokens_per_step_loaded'].mean:.1f}",
             "loaded run/rank": lambda r: f"{r.metrics['running_per_worker_loaded'].mean:.1f}",
             "KV share": lambda r: f"{r.metrics['kv_share_of_step'].mean:.0%}",
             "preempt": lambda r: f"{r.metrics['preemptions'].mean:.0f}",
             "recomputed tok": lambda r: f"{r.metrics['recomputed_tokens'].mean:,.0f}"}


def format_records(records) -> str:
    return report.format_table(records, METRICS, label=lambda r: r.params["label"], extra=comparison_columns())


