"""`jaxroute capacity dispatch|cluster|pd|decode`: the largest arrival rate at which an SLO holds, every row
searched in parallel (one compiled batch per round)."""

from __future__ import annotations

import time

from jaxroute.clusters.names import REPLICA_GPU, REPLICA_MODEL
from jaxroute.commands._common import (
    PD_DEFAULT_REQUESTS,
    add_latency_args,
    add_model_args,
    add_pd_args,
    add_save_spec,
    choose,
    csv_list,
    latency_choice,
    list_of,
    pd_setup,
    positive_float,
    positive_int,
    rate_range,
    show_progress,
    slo_clauses,
    warn_extrapolation,
)
from jaxroute.deployment import DECODE_PRESETS
from jaxroute.errors import JaxrouteError
from jaxroute.experiments.names import (
    CLUSTER_WORKLOADS,
    DECODE_DEPLOYMENTS,
    DISPATCH_POLICIES,
)
from jaxroute.routers.names import DECODE_POLICIES, PREFIX_POLICIES
from jaxroute.workloads.names import DECODE_WORKLOADS

MODELS = ("dispatch", "cluster", "pd", "decode")
DEFAULT_RANGE = {"dispatch": (0.3, 1.0), "cluster": (0.5, 100.0), "pd": (0.5, 50.0), "decode": (2.0, 200.0)}
UNITS = {"dispatch": "load per server", "cluster": "requests/s", "pd": "requests/s", "decode": "requests/s"}
SLO_EXAMPLES = {"dispatch": "mean_response<=5", "cluster": "ttft_p90_s<=1,tpot_p90_s<=0.05",
                "pd": "ttft_p90_s<=2,tpot_p90_s<=0.1 or slo_attainment>=0.9", "decode": "tpot_p90_s<=0.05,ttft_p90_s<=1"}


def _search_args(p, model: str) -> None:
    lo, hi = DEFAULT_RANGE[model]
    p.add_argument("--slo", type=slo_clauses, required=True, metavar="METRIC<=V,...",
                   help=f"clauses that must all hold (METRIC<=V or METRIC>=V, any metric the model reports), e.g. "
                   f"{SLO_EXAMPLES[model]}")
    p.add_argument("--rate-range", type=rate_range, default=(lo, hi), metavar="LO:HI",
                   help=f"rates searched, in {UNITS[model]} (default {lo:g}:{hi:g}); the first round spaces --points "
                   "rates geometrically over it")
    p.add_argument("--tol", type=positive_float, default=0.02, metavar="F",
                   help="stop when every bracket's miss / success - 1 <= F (default 0.02)")
    p.add_argument("--points", type=positive_int, default=6, metavar="K", help="rates per row per round (default 6)")
    p.add_argument("--max-rounds", type=positive_int, default=8, metavar="N", help="rounds at most (default 8)")
    p.add_argument("--seeds", type=positive_int, default=4, metavar="S",
                   help="seeds per row; each seed's capacity is searched on its own, the CI is over them (default 4)")
    p.add_argument("--seed", type=int, default=0, metavar="INT", help="base PRNG seed (default 0)")
    p.add_argument("--out", metavar="PATH.json", help="write the capacities, per-seed values and curves as JSON (default: none)")
    p.add_argument("--plot", metavar="PATH.png", help="write a PNG of the first SLO metric against the rate per row (default: none)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars of the batches (default: shown)")
    add_save_spec(p)


def register(subparsers) -> None:
    top = subparsers.add_parser(
        "capacity", help="the largest arrival rate at which an SLO holds, per row, with CIs over seeds",
        description="Search the capacity of every row at once: each round runs K rates per row in one compiled "
        "batch on common seeds, and narrows every (row, seed) bracket until it is known to --tol. The capacity is "
        "in the model's rate unit: load per server for dispatch, requests/s for the others. Overload is a normal "
        "outcome (the SLO is missed); a run that overflowed a fixed buffer is rerun with larger buffers, and a "
        "bracket that still holds one, or a row that misses the SLO at the lowest rate or meets it at the "
        "highest, is reported as unknown. `jaxroute capacity MODEL --help` lists each model's flags.")
    sub = top.add_subparsers(dest="capacity_model", metavar="MODEL", required=True,
                           help="the model searched: dispatch, cluster, pd or decode")
    p = sub.add_parser("dispatch", help="classic dispatch (random, rr, jsq, p2c, ...): load per server",
                       description="Capacity of the classic dispatch model, in load per server (arrival rate / "
                       "(servers x service rate)). Rows are policies.")
    p.add_argument("--policies", default="random,p2c,jsq", metavar="LIST",
                   help=f"policies from: {', '.join(DISPATCH_POLICIES)} (default random,p2c,jsq)")
    p.add_argument("--servers", type=positive_int, default=16, metavar="N", help="servers (default 16)")
    p.add_argument("--service", default="exp", metavar="LAW", help="service-time law (default exp)")
    p.add_argument("--requests", type=positive_int, default=20_000, metavar="N",
                   help="jobs per run, the first 20 %% discarded as warm-up (default 20000)")
    _search_args(p, "dispatch")
    p = sub.add_parser("cluster", help="prefix-cache replica cluster: routers x replica counts, requests/s",
                       description="Capacity of the prefix-cache replica cluster in requests/s. Rows are router x "
                       "replica count; routers that run on part of a cluster share one compiled model with a traced "
                       "count, the others get one model per count.")
    p.add_argument("--policies", default="rr,llmd_precise", metavar="LIST",
                   help=f"routers from: {', '.join(PREFIX_POLICIES)} (default rr,llmd_precise)")
    p.add_argument("--replicas", type=list_of(positive_int), default=[4], metavar="G[,...]",
                   help="replica counts, one row each (default 4)")
    p.add_argument("--min-replicas", type=positive_float, default=None, metavar="RATE",
                   help="also report, per router, the fewest of --replicas whose capacity reaches RATE req/s")
    p.add_argument("--workload", default="toolbench", metavar="NAME", help=f"one of: {', '.join(CLUSTER_WORKLOADS)} (default toolbench)")
    p.add_argument("--trace", default=None, metavar="PATH", help="trace file for mooncake / azure-conv")
    p.add_argument("--requests", type=positive_int, default=300, metavar="N", help="requests per run (default 300)")
    p.add_argument("--gpu", default=REPLICA_GPU, metavar="NAME", help=f"GPU (default {REPLICA_GPU})")
    add_model_args(p, default=REPLICA_MODEL, flag="--model-name", help=f"model served (default {REPLICA_MODEL})")
    p.add_argument("--tp", type=positive_int, default=1, metavar="T", help="GPUs per replica (default 1)")
    add_latency_args(p)
    _search_args(p, "cluster")
    p = sub.add_parser("pd", help="prefill/decode disaggregation: P:D ratios x routers, requests/s",
                       description="Capacity of the disaggregated cluster of `jaxroute pd` in requests/s; every "
                       "flag of `pd` except --rate (which is searched). Metrics: goodput_rps, slo_attainment (at "
                       "--slo-ttft / --slo-tpot per request), ttft_p90_s, ttft_p99_s, tpot_p90_s, e2e_mean_s, ...")
    add_pd_args(p)
    p.add_argument("--requests", type=positive_int, default=PD_DEFAULT_REQUESTS, metavar="N",
                   help=f"requests per run (default {PD_DEFAULT_REQUESTS})")
    _search_args(p, "pd")
    p = sub.add_parser("decode", help="decode DP ranks behind a barrier (BalanceRoute), Poisson arrivals, requests/s",
                       description="Capacity of the decode data-parallel model under Poisson arrivals in requests/s. "
                       "Rows are policy x ranks in use (traced). ttft_p90_s is from a request's arrival at the pool "
                       "to its first token; BR-H uses the oracle predictor.")
    p.add_argument("--policies", default="jsq,br0", metavar="LIST",
                   help=f"policies from: {', '.join(DECODE_POLICIES)} (default jsq,br0)")
    p.add_argument("--workers", type=list_of(positive_int), default=[8], metavar="G[,...]",
                   help="ranks in use, one row each (default 8)")
    p.add_argument("--workload", default="synthetic-azure24", metavar="NAME",
                   help=f"one of: {', '.join(DECODE_WORKLOADS)} (default synthetic-azure24)")
    p.add_argument("--trace", default=None, metavar="PATH", help="trace file for azure-conv / azure-code")
    p.add_argument("--deployment", default="default", metavar="NAME",
                   help=f"hardware and batching: {', '.join(DECODE_DEPLOYMENTS)} (default default)")
    p.add_argument("--requests", type=positive_int, default=400, metavar="N", help="requests per run (default 400)")
    _search_args(p, "decode")
    top.set_defaults(func=run)


def _setup(args):
    """(rows as (label, policy, size), evaluator); the names are checked before the models are imported."""
    kw = dict(seeds=args.seeds, seed=args.seed, progress=show_progress(args))
    if args.capacity_model == "dispatch":
        policies = choose(csv_list(args.policies), tuple(DISPATCH_POLICIES), "policy")
        from jaxroute.experiments import capacity as cap

        ev = cap.DispatchEvaluator(policies, servers=args.servers, requests=args.requests, service=args.service, **kw)
        return [(p, p, args.servers) for p in policies], ev
    if args.capacity_model == "cluster":
        policies = choose(csv_list(args.policies), PREFIX_POLICIES, "router")
        rows = [(p, g) for p in policies for g in args.replicas]
        from jaxroute.experiments import capacity as cap
        from jaxroute.experiments.cluster import build_workload

        cost_model, latency = latency_choice(args)
        warn_extrapolation(args, cost_model, latency)
        wl = build_workload(args.workload, args.requests, args.trace)
        ev = cap.ClusterEvaluator(rows, wl, gpu=args.gpu, model_name=args.model_name, tp=args.tp,
                                  cost_model=cost_model, latency=latency, **kw)
        return [(f"{p}@{g}", p, g) for p, g in rows], ev
    if args.capacity_model == "pd":
        _, rows, wl, dep = pd_setup(args)
        from jaxroute.experiments import capacity as cap

        ev = cap.PDEvaluator(rows, wl, dep=dep, slo_ttft=args.slo_ttft, slo_tpot=args.slo_tpot, **kw)
        return [(r.label, r.prefill_router, r.n_prefill + r.n_decode) for r in rows], ev
    policies = choose(csv_list(args.policies), DECODE_POLICIES, "policy")
    deployment = choose([args.deployment], DECODE_DEPLOYMENTS, "deployment")[0]
    name = choose([args.workload], DECODE_WORKLOADS, "workload")[0]
    from jaxroute.experiments import capacity as cap
    from jaxroute.workloads.decode import make_decode_requests

    dep = DECODE_PRESETS[deployment]
    req = make_decode_requests(name, args.requests, seed=args.seed, trace_path=args.trace)
    rows = [(p, g) for p in policies for g in args.workers]
    ev = cap.DecodeEvaluator(rows, req, dep=dep, lo_rate=args.rate_range[0], **kw)
    return [(f"{p}@{g}", p, g) for p, g in rows], ev


def run(args) -> int:
    rows, ev = _setup(args)
    import numpy as np

    from jaxroute import report
    from jaxroute.experiments import capacity as cap
    from jaxroute.metrics import summarize

    lo, hi = args.rate_range
    unit = UNITS[args.capacity_model]
    start = time.perf_counter()
    res = cap.search(ev, len(rows), lo, hi, args.slo, tol=args.tol, points=args.points, max_rounds=args.max_rounds,
                     on_round=lambda r, n: print(f"  round {r}: {n} (row, seed) brackets still open", flush=True))
    elapsed = time.perf_counter() - start
    slo_txt = ",".join(f"{b.metric}{b.op}{b.value:g}" for b in args.slo)
    print(f"capacity ({unit}) under {slo_txt}: {len(rows)} rows x {args.seeds} seeds, {res.rounds} rounds, "
          f"{res.evaluations:,} runs in {res.batches} batches, {elapsed:.1f} s")
    records = []
    for (label, policy, size), c, over in zip(rows, res.capacity, res.overflowed, strict=True):
        known = np.isfinite(c)
        s = summarize(c[known]) if known.any() else None
        why = "" if known.all() else (" (overflowed a fixed buffer)" if over.any() else " (outside --rate-range)")
        print(f"  {label:<32} {report.fmt_ci(s) if s else 'unknown':>22}  ({int(known.sum())}/{len(c)} seeds known{why})")
        # the results convention (report.Record): the row's label as its policy, the capacity as its metric
        # (over the seeds whose capacity is known; every seed's, None where unknown, in the params)
        records.append(report.Record(label, {"router": policy, "size": size, "seeds_known": int(known.sum()),
                                             "seeds_overflowed": int(over.sum()),
                                             "capacity_per_seed": [float(x) if np.isfinite(x) else None for x in c]},
                                     bool(over.any()), {"capacity": s} if s is not None else {}))
    config = {"model": args.capacity_model, "slo": slo_txt, "unit": unit, "rate_range": [lo, hi], "tol": args.tol,
              "seeds": args.seeds, "rounds": res.rounds, "runs": res.evaluations, "batches": res.batches,
              "elapsed_s": elapsed}
    extra = {"curves": [[{"rate": x, **m} for x, m in cv] for cv in res.curve]}
    if args.capacity_model == "cluster" and args.min_replicas:
        need = cap.min_replicas(res, [(p, g) for _, p, g in rows], args.min_replicas)
        for policy, k in need.items():
            print(f"  min replicas for {args.min_replicas:g} req/s, {policy}: {k if k else 'more than ' + str(max(args.replicas))}")
        extra["min_replicas"] = need
    if args.out:
        path = report.write_results(args.out, "capacity", config, records, extra)
        print(f"wrote {path} and {path.with_suffix('.csv')}")
    if getattr(args, "plot", None):
        metric = args.slo[0].metric
        panels = {f"{metric} against the rate": [
            dict(x=[x for x, _ in sorted(cv)], y=[m[metric] for _, m in sorted(cv)], marker=".", label=r.policy)
            for cv, r in zip(res.curve, records, strict=True)]}
        report.line_plot(panels, args.plot, xlabel=unit, ylabel=metric, title=f"capacity search under {slo_txt}")
        print(f"wrote {args.plot}")
    if not any(r.params["seeds_known"] for r in records):
        raise JaxrouteError("no capacity is known: widen --rate-range (every row met or missed the SLO everywhere)")
    return 0
