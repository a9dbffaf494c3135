"""`jaxroute decode`: routers for decode data-parallel workers behind a barrier (BalanceRoute BR-0 / BR-H).

Every (policy, predictor) row and every seed runs in ONE compiled program: the policy, the
dispatch mode, the predictor id and BR-H's alpha/beta/gamma are traced parameters.
"""

from __future__ import annotations

import dataclasses
import math
import time

import jax
import numpy as np

from jaxroute import cost_models, report, sim
from jaxroute.clusters import dp_decode as dd
from jaxroute.commands._common import (
    add_output_args,
    check_overflow,
    choose,
    csv_list,
    float_arg,
    int_arg,
    show_progress,
    warn,
)
from jaxroute.errors import JaxrouteError
from jaxroute.metrics import summarize
from jaxroute.predictors import base as predictors
from jaxroute.routers import balance
from jaxroute.workloads.decode import DECODE_WORKLOADS, DecodeRequests, make_decode_requests

METRICS = ("imbalance_tokens", "barrier_idle_tokens", "tpot_p95_s", "throughput_tok_s")
EXTRA_METRICS = ("imbalance_loaded_tokens", "throughput_loaded_tok_s", "mean_step_s", "util_mean", "util_min", "makespan_s", "steps")
# Direction of "better" for the relative columns.
LOWER_IS_BETTER = {"imbalance_tokens": True, "imbalance_loaded_tokens": True, "barrier_idle_tokens": True, "tpot_p95_s": True,
                   "throughput_tok_s": False, "throughput_loaded_tok_s": False}
DEFAULT_REQUESTS = 2000
DEFAULT_SEEDS = 8


@dataclasses.dataclass(frozen=True)
class Row:
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


@dataclasses.dataclass(frozen=True)
class Deployment:
    gpu: str = dd.DEFAULT_GPU
    model: str = dd.DEFAULT_MODEL
    tp: int = dd.DEFAULT_TP
    slots: int = dd.DEFAULT_SLOTS
    pool: int = dd.DEFAULT_POOL
    window: int = dd.DEFAULT_WINDOW
    horizon: int = dd.DEFAULT_HORIZON
    r_max: int = dd.DEFAULT_R_MAX
    collective_s: float = dd.DEFAULT_COLLECTIVE_S


def rows_for(policies, predictor_names, *, alpha=dd.DEFAULT_ALPHA, beta=None, gamma=dd.DEFAULT_GAMMA,
             dispatch=None) -> list[Row]:
    """One row per policy; BR-H gets one row per predictor."""
    rows = []
    for p in policies:
        if p == "brh":
            rows += [Row("brh", k, alpha, beta, gamma, dispatch) for k in predictor_names]
        else:
            rows.append(Row(p, None, alpha, beta, gamma, dispatch))
    return rows


def run_comparison(req: DecodeRequests, rows: list[Row], *, workers: int, seeds: int, dep: Deployment = Deployment(),
                   arrival: str = "saturated", rate: float = 1.0, seed: int = 0, bank: tuple = (),
                   progress: bool | str = False, max_steps: int | None = None):
    """Run all rows x seeds in one compiled grid. Returns (records, grid, model).

    Rows whose run hit the step budget are rerun once with a 1.6x budget (the whole grid, still
    one compilation per budget).
    """
    if workers < 1:
        raise JaxrouteError(f"--workers must be >= 1, got {workers}")
    cost = cost_models.cost_params(dep.gpu, dep.model, dep.tp)
    kv_cap = cost_models.kv_capacity_tokens(dep.gpu, dep.model, dep.tp)
    wl = dd.make_workload(req, cost, dep.collective_s, bank)
    params = sim.stack_params([
        dd.make_params(r.policy, n_workers=workers, dispatch=r.dispatch,
                       predictor=predictors.kind_id(r.predictor) if r.predictor else 1,
                       alpha=r.alpha, beta=r.beta, gamma=r.gamma, arrival=arrival, rate=rate) for r in rows])
    min_step = float(cost_models.decode_step_time(cost, 1.0, 1.0)) + dep.collective_s  # the fastest barrier step
    budget = max_steps or dd.step_budget(req, workers, dep.slots, dep.r_max, arrival, rate, min_step_s=min_step)
    for attempt in range(2):
        model = dd.DPDecodeModel(n_workers=workers, n_requests=len(req), max_steps=budget, slots=dep.slots,
                                 pool=dep.pool, window=dep.window, horizon=dep.horizon, r_max=dep.r_max,
                                 kv_capacity=kv_cap)
        chunk = max(1, math.ceil(budget / 20))
        grid = sim.run_grid(model, jax.random.key(seed), wl, params, seeds, chunk=chunk, progress=progress)
        if not np.any(grid.metrics["overflow_steps"]) or max_steps is not None or attempt == 1:
            break
        warn(f"a run did not finish within {budget} steps; rerunning with {int(budget * 1.6)}")
        budget = int(budget * 1.6)
    labels = [(r.policy, {"label": r.label(), "predictor": r.predictor, "alpha": r.alpha,
                          "beta": workers if r.beta is None else r.beta, "gamma": r.gamma,
                          "dispatch": balance.DISPATCH_MODES[int(params.dispatch[i])], "horizon": dep.horizon})
              for i, r in enumerate(rows)]
    records = report.records_from_grid(grid, labels, METRICS + EXTRA_METRICS)
    util = np.asarray(grid.metrics["worker_util"])  # [C, S, G]
    for c, rec in enumerate(records):
        for g in range(workers):
            rec.metrics[f"util_worker{g}"] = summarize(util[c, :, g])
    add_relative(records, grid)
    return records, grid, model


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


def add_relative(records, grid) -> None:
    """Add `<metric>_vs_best_pct`: paired per-seed % change against the best paper baseline."""
    for metric in ("imbalance_tokens", "imbalance_loaded_tokens", "tpot_p95_s", "throughput_tok_s",
                   "throughput_loaded_tok_s"):
        b = best_baseline(records, metric)
        if b is None:
            continue
        base = np.asarray(grid.metrics[metric][b], np.float64)
        for c, rec in enumerate(records):
            rel = 100.0 * (np.asarray(grid.metrics[metric][c], np.float64) / np.maximum(base, 1e-12) - 1.0)
            rec.metrics[f"{metric}_vs_best_pct"] = summarize(rel)
            rec.params.setdefault("best_baseline", {})[metric] = records[b].params["label"]


def _pct(rec, metric):
    s = rec.metrics.get(f"{metric}_vs_best_pct")
    return "" if s is None else f"{s.mean:+.1f}±{s.half_width:.1f}%"


def format_records(records) -> str:
    extra = {"imb vs best": lambda r: _pct(r, "imbalance_tokens"),
             "tpot vs best": lambda r: _pct(r, "tpot_p95_s"),
             "tput vs best": lambda r: _pct(r, "throughput_tok_s"),
             "loaded imb vs best": lambda r: _pct(r, "imbalance_loaded_tokens"),
             "loaded tput": lambda r: report.fmt_ci(r.metrics["throughput_loaded_tok_s"]),
             "loaded vs best": lambda r: _pct(r, "throughput_loaded_tok_s")}
    return report.format_table(records, METRICS, label=lambda r: r.params["label"], extra=extra)


def plot_loads(path, records, grid, workers: int) -> None:
    """Per-worker KV load over time (seed 0) for the best paper baseline, BR-0 and the first BR-H row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    picks = []
    b = best_baseline(records, "throughput_tok_s")
    if b is not None:
        picks.append(b)
    for name in ("br0", "brh"):
        hit = [i for i, r in enumerate(records) if r.policy == name]
        if hit:
            picks.append(hit[0])
    if not picks:
        picks = [0]
    fig, axes = plt.subplots(1, len(picks), figsize=(5 * len(picks), 3.6), sharey=True, squeeze=False)
    for ax, c in zip(axes[0], picks, strict=True):
        t = np.asarray(grid.metrics["trace_t"][c, 0])
        kv = np.asarray(grid.metrics["trace_kv"][c, 0])  # [T, G]
        keep = (t > 0) | (np.arange(len(t)) == 0)
        keep &= kv.sum(axis=1) > 0
        for g in range(workers):
            ax.plot(t[keep], kv[keep, g] / 1e3, lw=0.8)
        rec = records[c]
        ax.set_title(f"{rec.params['label']}: imbalance {rec.metrics['imbalance_tokens'].mean / 1e3:.1f}k tok")
        ax.set_xlabel("time (s)")
    axes[0][0].set_ylabel("KV load per worker (k tokens)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- CLI


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "decode",
        help="route prefilled requests to decode DP workers behind a barrier (BalanceRoute BR-0 / BR-H)",
        description="Simulate G decode data-parallel workers that step in lockstep (each step waits for the "
        "heaviest worker) and compare routers: random, rr, p2c, jsq (the paper's baselines, on request "
        "count), least_kv (fewest KV tokens, a stronger baseline reported apart), br0 and brh. All rows "
        "and seeds run in one compiled program. Prints imbalance (mean max-min KV load), barrier idle "
        "tokens, TPOT P95 and throughput with 95%% CIs, each relative to the best of random/rr/p2c/jsq "
        "(paired over seeds). Default deployment: Llama-3-8B on one H200 per worker, 64 slots, 1 ms "
        f"collective per step. Defaults ({DEFAULT_REQUESTS} requests x {DEFAULT_SEEDS} seeds, smaller than "
        "the paper's 8000 requests) take a few minutes on two CPU cores.",
    )
    p.add_argument("--workload", default="synthetic-azure24", metavar="NAME",
                   help=f"one of {', '.join(DECODE_WORKLOADS)} (default synthetic-azure24); the azure-* "
                   "workloads read the Azure LLM 2023 CSV (--trace)")
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="Azure trace CSV for azure-conv / azure-code (default ../shared/data/azure_llm_2023_*.csv)")
    p.add_argument("--workers", default="8", metavar="G", help="decode DP workers (default 8)")
    p.add_argument("--policies", default=",".join(balance.POLICIES), metavar="LIST",
                   help=f"comma-separated from {', '.join(balance.POLICIES)} (default: all)")
    p.add_argument("--predictor", default="oracle", metavar="LIST",
                   help="BR-H horizon predictor(s), comma-separated; one BR-H row each (default oracle): "
                   "none, oracle, survival, exact, learned:DIR (deployable ones are fitted on requests "
                   "distinct from the simulated ones)")
    p.add_argument("--seeds", default=str(DEFAULT_SEEDS), metavar="S",
                   help=f"independent runs per row (default {DEFAULT_SEEDS})")
    p.add_argument("--requests", default=str(DEFAULT_REQUESTS), metavar="N",
                   help=f"requests per run (default {DEFAULT_REQUESTS})")
    p.add_argument("--arrival", default="saturated", metavar="MODE",
                   help="saturated (all requests ready at t=0, peak throughput as in the paper's replays), "
                   "poisson:RATE (requests/s), or trace[:SCALE] (workload timestamps x SCALE) (default saturated)")
    p.add_argument("--horizon", default=str(dd.DEFAULT_HORIZON), metavar="H", help="BR-H horizon H (default 80)")
    p.add_argument("--alpha", default=str(dd.DEFAULT_ALPHA), metavar="A", help="BR-H gain weight alpha (default 1)")
    p.add_argument("--beta", default=None, metavar="B", help="BR-H overflow penalty beta (default G)")
    p.add_argument("--gamma", default=str(dd.DEFAULT_GAMMA), metavar="GAMMA",
                   help="BR-H discount gamma (default 0.95)")
    p.add_argument("--dispatch", default=None, metavar="MODE",
                   help="immediate|pooled: override every policy's dispatch mode (default: baselines "
                   "immediate, br0/brh pooled)")
    p.add_argument("--slots", default=str(dd.DEFAULT_SLOTS), metavar="S", help="slots per worker (default 64)")
    p.add_argument("--pool", default=str(dd.DEFAULT_POOL), metavar="P",
                   help="prompt pool capacity = requests that may wait at the proxy (default 32)")
    p.add_argument("--window", default=str(dd.DEFAULT_WINDOW), metavar="W",
                   help="BR stage-2 candidate window, 2^W subsets (default 8)")
    p.add_argument("--r-max", default=str(dd.DEFAULT_R_MAX), metavar="R",
                   help="new requests per worker per step (default 4)")
    p.add_argument("--gpu", default=dd.DEFAULT_GPU, help="GPU of each worker (cost-model catalog; default H200)")
    p.add_argument("--model", default=dd.DEFAULT_MODEL, help="served model (catalog; default Llama-3-8B)")
    p.add_argument("--tp", default=str(dd.DEFAULT_TP), metavar="TP", help="tensor parallelism per worker (default 1)")
    p.add_argument("--collective-ms", default=str(dd.DEFAULT_COLLECTIVE_S * 1e3), metavar="MS",
                   help="fixed barrier/collective overhead per step in ms (default 1)")
    p.add_argument("--seed", default="0", metavar="INT", help="base seed (workload draws and PRNG) (default 0)")
    add_output_args(p)
    p.set_defaults(func=run)




def parse_arrival(text: str) -> tuple[str, float, float]:
    """'saturated' | 'poisson:RATE' | 'trace[:SCALE]' -> (mode, rate, time_scale)."""
    mode, _, arg = text.partition(":")
    if mode == "saturated" and not arg:
        return "saturated", 1.0, 1.0
    if mode == "poisson":
        if not arg:
            raise JaxrouteError("--arrival poisson needs a rate: poisson:RATE (requests/s)")
        rate = float_arg(arg, "--arrival poisson:RATE", 0.0)
        if rate <= 0:
            raise JaxrouteError(f"--arrival poisson rate must be > 0, got {arg}")
        return "poisson", rate, 1.0
    if mode == "trace":
        scale = float_arg(arg, "--arrival trace:SCALE", 0.0) if arg else 1.0
        if scale <= 0:
            raise JaxrouteError(f"--arrival trace time scale must be > 0, got {arg}")
        return "trace", 1.0, scale
    raise JaxrouteError(f"unknown --arrival '{text}'; use saturated, poisson:RATE or trace[:SCALE]")


def run(args) -> int:
    workers = int_arg(args.workers, "--workers", 1)
    seeds = int_arg(args.seeds, "--seeds", 1)
    n_req = int_arg(args.requests, "--requests", 1)
    seed = int_arg(args.seed, "--seed", 0)
    dep = Deployment(gpu=args.gpu, model=args.model, tp=int_arg(args.tp, "--tp", 1), slots=int_arg(args.slots, "--slots", 1),
                     pool=int_arg(args.pool, "--pool", 1), window=int_arg(args.window, "--window", 1),
                     horizon=int_arg(args.horizon, "--horizon", 0), r_max=int_arg(args.r_max, "--r-max", 1),
                     collective_s=float_arg(args.collective_ms, "--collective-ms", 0.0) / 1e3)
    cost_models.get_gpu(dep.gpu)
    cost_models.get_model(dep.model)
    workload = choose([args.workload], DECODE_WORKLOADS, "decode workload")[0]
    policies = choose(csv_list(args.policies), balance.POLICIES, "policy")
    if len(set(policies)) != len(policies):
        raise JaxrouteError(f"--policies lists a policy twice: {args.policies}")
    from jaxroute.predictors import bank as bank_lib  # registers the deployable kinds

    specs = csv_list(args.predictor)
    if not specs:
        raise JaxrouteError(f"no predictor given; choose from: {bank_lib.SPEC_HELP}")
    dispatch = None if args.dispatch is None else choose([args.dispatch], balance.DISPATCH_MODES, "dispatch mode")[0]
    arrival, rate, scale = parse_arrival(args.arrival)
    beta = None if args.beta is None else float_arg(args.beta, "--beta", 0.0)
    alpha, gamma = float_arg(args.alpha, "--alpha", 0.0), float_arg(args.gamma, "--gamma", 0.0)
    if seeds < 2:
        warn("one seed gives no confidence interval")
    req = make_decode_requests(workload, n_req, seed=seed, trace_path=args.trace, time_scale=scale)
    # Deployable predictors (survival, exact, learned:DIR) are fitted on requests distinct from the simulated ones.
    bank, preds, _ = (bank_lib.bank_for_simulation(specs, workload, n_req, seed, args.trace, dep.horizon)
                      if "brh" in policies else ((), [bank_lib.parse_spec(x)[0] for x in specs], None))
    rows = rows_for(policies, preds, alpha=alpha, beta=beta, gamma=gamma, dispatch=dispatch)
    start = time.perf_counter()
    records, grid, model = run_comparison(req, rows, workers=workers, seeds=seeds, dep=dep, arrival=arrival,
                                          rate=rate, seed=seed, bank=bank,
                                          progress="decode" if show_progress(args) else False)
    elapsed = time.perf_counter() - start
    check_overflow(records, args, "A worker's KV outgrew its capacity or a run hit the step budget: use fewer "
                   "--slots or a smaller --requests")
    if np.any(grid.metrics["conservation_error"]):
        raise JaxrouteError("internal error: request or token conservation failed; please report this")
    print(f"decode: {workload}, {len(req)} requests (mean prompt {req.prompt_tokens.mean():.0f}, mean output "
          f"{req.output_tokens.mean():.0f}), arrival {args.arrival}; G={workers} workers x {dep.slots} slots, "
          f"{dep.model} on {dep.tp}x{dep.gpu}, pool {dep.pool}, W={dep.window}, H={dep.horizon}, R_max={dep.r_max}; "
          f"{seeds} seeds; {elapsed:.0f} s")
    print(format_records(records))
    print("vs best = paired per-seed change against the best of random/rr/p2c/jsq on that metric; least_kv is "
          "not one of the paper's baselines. 'loaded' = the phase until the last request was admitted "
          "(the drain of the longest requests afterwards is not routable).")
    if args.out:
        cfg = {"workload": workload, "requests": len(req), "workers": workers, "seeds": seeds, "arrival": args.arrival,
               "seed": seed, **dataclasses.asdict(dep), "kv_capacity_tokens": model.kv_capacity,
               "max_steps": model.max_steps}
        path = report.write_results(args.out, "decode", cfg, records)
        print(f"wrote {path}")
    if args.plot:
        plot_loads(args.plot, records, grid, workers)
        print(f"wrote {args.plot}")
    return 0
