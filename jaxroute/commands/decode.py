"""`jaxroute decode`: routers for decode data-parallel workers behind a barrier (BalanceRoute BR-0 / BR-H).

Every (policy, predictor) row and every seed runs in ONE compiled program (see
`jaxroute.experiments.decode`); this module parses flags, prints and plots.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from jaxroute.clusters import names as dd  # dp_decode's defaults, dd.DEFAULT_*
from jaxroute.commands._common import (
    add_grid_args,
    add_model_args,
    check_conservation,
    check_overflow,
    choose,
    csv_list,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    save_outputs,
    show_progress,
)
from jaxroute.deployment import DECODE_PRESETS
from jaxroute.errors import JaxrouteError
from jaxroute.experiments.names import DECODE_DEPLOYMENTS, check_trace_flag
from jaxroute.routers.names import (
    DECODE_POLICIES,
    DISPATCH_MODES,
    PREDICTOR_SPEC_HELP,
    check_predictor_specs,
)
from jaxroute.workloads.names import DECODE_TRACE_WORKLOADS, DECODE_WORKLOADS

DEFAULT_REQUESTS = 2000
DEFAULT_SEEDS = 8


def plot_loads(path, results) -> None:
    """Per-worker KV load over time (seed 0) for the best paper baseline, BR-0 and the first BR-H row."""
    import numpy as np

    from jaxroute import report
    from jaxroute.experiments.decode import best_baseline

    records, grid = results.records, results.grid
    picks = []
    b = best_baseline(records, "throughput_tok_s")
    if b is not None:
        picks.append(b)
    for name in ("br0", "brh"):
        hit = [i for i, r in enumerate(records) if r.policy == name]
        if hit:
            picks.append(hit[0])
    panels = {}
    for c in picks or [0]:
        t = np.asarray(grid.metrics["trace_t"][c, 0])
        kv = np.asarray(grid.metrics["trace_kv"][c, 0])  # [T, G]
        keep = ((t > 0) | (np.arange(len(t)) == 0)) & (kv.sum(axis=1) > 0)
        rec = records[c]
        title = f"{rec.params['label']}: imbalance {rec.metrics['imbalance_tokens'].mean / 1e3:.1f}k tok"
        panels[title] = [{"x": t[keep], "y": kv[keep, g] / 1e3, "lw": 0.8} for g in range(kv.shape[1])]
    report.line_plot(panels, path, xlabel="time (s)", ylabel="KV load per worker (k tokens)", sharey=True)


# --------------------------------------------------------------------------- CLI


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "decode",
        help="route prefilled requests to decode DP workers behind a barrier (BalanceRoute BR-0 / BR-H)",
        description="Simulate G decode data-parallel workers that step in lockstep (each step waits for the "
        "heaviest worker) and compare routers: random, rr, p2c, jsq (the paper's baselines, on request "
        "count), least_kv (fewest KV tokens, a stronger baseline reported apart), br0 and brh. All rows "
        "and seeds run in one compiled program. Prints imbalance (mean max-min KV load), barrier idle "
        "tokens, TPOT P95 and throughput with 95 % CIs, each relative to the best of random/rr/p2c/jsq "
        "(paired over seeds), output tokens per barrier step, preemptions and recomputed tokens, for the "
        "whole run and the loaded phase. Workers admit like vLLM DP ranks (paged KV blocks, FCFS head of line, "
        "recompute preemption). Default deployment: Llama-3-8B on one H200 per worker, 64 slots, 1 ms "
        f"collective per step; --deployment paper is the paper's DeepSeek-V3 / Ascend 910C setting. Defaults ({DEFAULT_REQUESTS} requests x {DEFAULT_SEEDS} seeds, smaller than "
        "the paper's 8000 requests) take a few minutes on two CPU cores.",
    )
    p.add_argument("--workload", default="synthetic-azure24", metavar="NAME",
                   help=f"one of {', '.join(DECODE_WORKLOADS)} (default synthetic-azure24); the azure-* "
                   "workloads read the Azure LLM 2023 CSV (--trace)")
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="Azure trace CSV for azure-conv / azure-code (default ../shared/data/azure_llm_2023_*.csv)")
    p.add_argument("--workers", type=positive_int, default=8, metavar="G", help="decode DP workers (default 8)")
    p.add_argument("--policies", default=",".join(DECODE_POLICIES), metavar="LIST",
                   help=f"comma-separated from {', '.join(DECODE_POLICIES)} (default: all)")
    p.add_argument("--predictor", default="oracle", metavar="LIST",
                   help="BR-H horizon predictor(s), comma-separated; one BR-H row each (default oracle): "
                   "none, oracle, survival, exact, learned:DIR (deployable ones are fitted on requests "
                   "distinct from the simulated ones)")
    p.add_argument("--arrival", default="saturated", metavar="MODE",
                   help="saturated (all requests ready at t=0, peak throughput as in the paper's replays), "
                   "poisson:RATE (requests/s), or trace[:SCALE] (workload timestamps x SCALE) (default saturated)")
    p.add_argument("--horizon", type=non_negative_int, default=dd.DEFAULT_HORIZON, metavar="H",
                   help=f"BR-H horizon H (default {dd.DEFAULT_HORIZON})")
    p.add_argument("--alpha", type=non_negative_float, default=dd.DEFAULT_ALPHA, metavar="A",
                   help=f"BR-H gain weight alpha (default {dd.DEFAULT_ALPHA:g})")
    p.add_argument("--beta", type=non_negative_float, default=None, metavar="B",
                   help="BR-H overflow penalty beta (default G)")
    p.add_argument("--gamma", type=non_negative_float, default=dd.DEFAULT_GAMMA, metavar="GAMMA",
                   help=f"BR-H discount gamma (default {dd.DEFAULT_GAMMA:g})")
    p.add_argument("--dispatch", default=None, metavar="MODE",
                   help="immediate|pooled: override every policy's dispatch mode (default: baselines "
                   "immediate, br0/brh pooled)")
    p.add_argument("--slots", type=positive_int, default=dd.DEFAULT_SLOTS, metavar="S",
                   help=f"slots per worker (default {dd.DEFAULT_SLOTS})")
    p.add_argument("--pool", type=positive_int, default=dd.DEFAULT_POOL, metavar="P",
                   help="prompt pool of pooled dispatch (BR-0/BR-H): prefill-completed requests the dispatcher chooses "
                   f"from; the rest wait in the prefill tier, holding their KV (default {dd.DEFAULT_POOL}). "
                   "Immediate dispatch (the baselines) is not capped")
    p.add_argument("--window", type=positive_int, default=dd.DEFAULT_WINDOW, metavar="W",
                   help=f"BR stage-2 candidate window, 2^W subsets (default {dd.DEFAULT_WINDOW})")
    p.add_argument("--r-max", type=positive_int, default=dd.DEFAULT_R_MAX, metavar="R",
                   help=f"new requests per worker per step (default {dd.DEFAULT_R_MAX})")
    p.add_argument("--deployment", default="default", metavar="NAME",
                   help="default (Llama-3-8B on one H200 per worker, independent replicas, 1 ms collective) or "
                   "paper (the BalanceRoute paper's: DeepSeek-V3 W8A8 on 4 Ascend 910C dies per DP worker, DP "
                   "attention + expert-parallel MoE, all-to-all in the cost model); --gpu/--model/--tp/"
                   "--parallel/--collective-ms override single fields (default default)")
    p.add_argument("--gpu", default=None, metavar="NAME",
                   help=f"GPU of each worker (cost-model catalog) (default: the deployment's, {dd.DEFAULT_GPU})")
    add_model_args(p, default=None, help=f"served model (catalog) (default: the deployment's, {dd.DEFAULT_MODEL})")
    p.add_argument("--tp", type=positive_int, default=None, metavar="TP",
                   help=f"tensor parallelism per worker (default: the deployment's, {dd.DEFAULT_TP})")
    p.add_argument("--parallel", default=None, metavar="MODE",
                   help="independent (each worker a replica holding all weights) or dp_ep (MoE models: DP "
                   "attention per worker, experts spread over all workers' devices, shared per step) "
                   "(default: the deployment's, independent)")
    p.add_argument("--collective-ms", type=non_negative_float, default=None, metavar="MS",
                   help="fixed barrier/collective overhead per step in ms (default: the deployment's, "
                   f"{dd.DEFAULT_COLLECTIVE_S * 1e3:g} for default, 0 for paper)")
    p.add_argument("--block-size", type=positive_int, default=dd.DEFAULT_BLOCK_SIZE, metavar="TOKENS",
                   help=f"KV block size of each worker's paged KV pool (default {dd.DEFAULT_BLOCK_SIZE})")
    p.add_argument("--preemption", default="on", metavar="on|off",
                   help="on: a worker out of KV blocks preempts its newest requests, which are recomputed on "
                   "readmission (vLLM); off: growth past capacity is only flagged (default on)")
    add_grid_args(p, seeds=DEFAULT_SEEDS, requests=DEFAULT_REQUESTS, seeds_help="independent runs per row")
    p.set_defaults(func=run)


def _arrival_number(text: str, what: str) -> float:
    try:
        return positive_float(text)
    except argparse.ArgumentTypeError as e:
        raise JaxrouteError(f"--arrival {what}: {e}") from None


def parse_arrival(text: str) -> tuple[str, float, float]:
    """'saturated' | 'poisson:RATE' | 'trace[:SCALE]' -> (mode, rate, time_scale)."""
    mode, _, arg = text.partition(":")
    if mode == "saturated" and not arg:
        return "saturated", 1.0, 1.0
    if mode == "poisson":
        if not arg:
            raise JaxrouteError("--arrival poisson needs a rate: poisson:RATE (requests/s)")
        rate = _arrival_number(arg, "poisson rate")
        return "poisson", rate, 1.0
    if mode == "trace":
        scale = _arrival_number(arg, "trace time scale") if arg else 1.0
        return "trace", 1.0, scale
    raise JaxrouteError(f"unknown --arrival '{text}'; use saturated, poisson:RATE or trace[:SCALE]")


def run(args) -> int:
    workers, seeds, n_req, seed = args.workers, args.seeds, args.requests, args.seed
    deployment = choose([args.deployment], DECODE_DEPLOYMENTS, "deployment")[0]
    preempt = choose([args.preemption], ("on", "off"), "--preemption value")[0] == "on"
    workload = choose([args.workload], DECODE_WORKLOADS, "decode workload")[0]
    policies = choose(csv_list(args.policies), DECODE_POLICIES, "policy")
    dispatch = None if args.dispatch is None else choose([args.dispatch], DISPATCH_MODES, "dispatch mode")[0]
    arrival, rate, scale = parse_arrival(args.arrival)
    check_trace_flag(workload, args.trace, DECODE_TRACE_WORKLOADS)
    specs = csv_list(args.predictor)
    if not specs:
        raise JaxrouteError(f"no predictor given; choose from: {PREDICTOR_SPEC_HELP}")
    check_predictor_specs(specs)
    # the models, once the flags are checked
    from jaxroute import cost_models
    from jaxroute.experiments import decode as experiment
    from jaxroute.predictors import bank as bank_lib  # registers the deployable kinds
    from jaxroute.workloads.decode import make_decode_requests

    base = DECODE_PRESETS[deployment]
    given = {"gpu": args.gpu, "model": args.model, "tp": args.tp, "parallel": args.parallel,
             "collective_s": None if args.collective_ms is None else args.collective_ms / 1e3}
    dep = dataclasses.replace(base, slots=args.slots, pool=args.pool, window=args.window, horizon=args.horizon,
                              r_max=args.r_max, block_size=args.block_size, preempt=preempt,
                              **{k: v for k, v in given.items() if v is not None})
    cost_models.get_gpu(dep.gpu)
    cost_models.get_model(dep.model)
    cost_models.cost_params(dep.gpu, dep.model, dep.tp, parallel=dep.parallel, dp_ranks=workers)  # clear errors first
    req = make_decode_requests(workload, n_req, seed=seed, trace_path=args.trace, time_scale=scale)
    # Deployable predictors (survival, exact, learned:DIR) are fitted on requests distinct from the simulated ones.
    bank, preds, _ = (bank_lib.bank_for_simulation(specs, workload, n_req, seed, args.trace, dep.horizon)
                      if "brh" in policies else ((), [bank_lib.parse_spec(x)[0] for x in specs], None))
    rows = experiment.rows_for(policies, preds, alpha=args.alpha, beta=args.beta, gamma=args.gamma, dispatch=dispatch)
    start = time.perf_counter()
    results = experiment.run_comparison(req, rows, workers=workers, seeds=seeds, dep=dep, arrival=arrival, rate=rate,
                                        seed=seed, bank=bank, progress="decode" if show_progress(args) else False)
    elapsed = time.perf_counter() - start
    records, model = results.records, results.model
    check_conservation(results, [r.params["label"] for r in records])
    check_overflow(records, args, "A request cannot fit in a worker's KV blocks, a worker's KV outgrew its "
                   "capacity with --preemption off, or a run hit the step budget: use fewer --slots or a smaller "
                   "--requests")
    print(f"decode: {workload}, {len(req)} requests (mean prompt {req.prompt_tokens.mean():.0f}, mean output "
          f"{req.output_tokens.mean():.0f}), arrival {args.arrival}; G={workers} workers x {dep.slots} slots, "
          f"{dep.model} on {dep.tp}x{dep.gpu} ({dep.parallel}), KV {model.kv_capacity:,} tokens per worker in blocks "
          f"of {dep.block_size}, preemption {'on' if dep.preempt else 'off'}, pool {dep.pool}, W={dep.window}, "
          f"H={dep.horizon}, R_max={dep.r_max}; {seeds} seeds; {elapsed:.0f} s")
    print(experiment.format_records(records))
    print("vs best = paired per-seed change against the best of random/rr/p2c/jsq on that metric; least_kv is "
          "not one of the paper's baselines. 'loaded' = the phase until the last request was admitted "
          "(the drain of the longest requests afterwards is not routable).")
    cfg = {"workload": workload, "requests": len(req), "workers": workers, "seeds": seeds, "arrival": args.arrival,
           "seed": seed, **dataclasses.asdict(dep), "kv_capacity_tokens": model.kv_capacity,
           "max_steps": model.max_steps}
    save_outputs(args, "decode", cfg, records, lambda path: plot_loads(path, results))
    return 0
