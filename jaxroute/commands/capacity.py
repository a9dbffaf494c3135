"""`jaxroute capacity`: the largest arrival rate at which an SLO holds, every row searched in parallel (WIP)."""

from __future__ import annotations

import argparse
import time

import numpy as np

from jaxroute import report
from jaxroute.commands._common import (
    add_output_args,
    choose,
    csv_list,
    list_of,
    positive_float,
    positive_int,
    warn,
)
from jaxroute.errors import JaxrouteError
from jaxroute.experiments import capacity as cap
from jaxroute.experiments.cluster import WORKLOADS, build_workload
from jaxroute.experiments.dispatch import CLI_POLICIES
from jaxroute.metrics import summarize
from jaxroute.routers.prefix import PARTIAL_OK

MODELS = ("dispatch", "cluster")


def _range(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO:HI, got '{text}'") from None
    if not 0 < lo < hi:
        raise argparse.ArgumentTypeError(f"expected 0 < LO < HI, got '{text}'")
    return lo, hi


def _slo(text: str):
    try:
        return cap.parse_slo(text)
    except JaxrouteError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "capacity", help="the largest arrival rate at which an SLO holds, per row, with CIs over seeds",
        description="Search the capacity of every row (router x replica count) at once: each round runs K rates per "
        "row in one compiled batch on common seeds, and narrows every (row, seed) bracket until it is known to "
        "--tol. The capacity is in the model's rate unit: load per server for dispatch, requests/s for cluster. A "
        "bracket that holds an overflowed run, or a row that misses the SLO at the lowest rate or meets it at the "
        "highest, is reported as unknown.")
    p.add_argument("model", choices=MODELS, help="which model: dispatch or cluster")
    p.add_argument("--slo", type=_slo, required=True, metavar="METRIC<=V,...",
                   help="clauses that must all hold, e.g. mean_response<=5 (dispatch) or ttft_p90_s<=2 (cluster)")
    p.add_argument("--rate-range", type=_range, default=None, metavar="LO:HI",
                   help="rates searched (default 0.3:1.0 for dispatch, 0.5:100 for cluster)")
    p.add_argument("--tol", type=positive_float, default=0.02, metavar="F", help="relative width of a known bracket (default 0.02)")
    p.add_argument("--points", type=positive_int, default=6, metavar="K", help="rates per row per round (default 6)")
    p.add_argument("--max-rounds", type=positive_int, default=10, metavar="N", help="rounds at most (default 10)")
    p.add_argument("--policies", default=None, metavar="LIST", help="routers (default: random,p2c,jsq / rr,llmd_precise)")
    p.add_argument("--servers", type=positive_int, default=16, metavar="N", help="dispatch: servers (default 16)")
    p.add_argument("--service", default="exp", metavar="LAW", help="dispatch: service law (default exp)")
    p.add_argument("--workload", default="toolbench", metavar="NAME", help=f"cluster: one of {', '.join(WORKLOADS)} (default toolbench)")
    p.add_argument("--trace", default=None, metavar="PATH", help="cluster: trace file for mooncake / azure-conv")
    p.add_argument("--replicas", type=list_of(positive_int), default=[4], metavar="G[,...]",
                   help="cluster: replica counts, one row each, all in one compiled batch (default 4)")
    p.add_argument("--min-replicas", type=positive_float, default=None, metavar="RATE",
                   help="cluster: also report, per router, the fewest replicas whose capacity reaches RATE req/s")
    p.add_argument("--gpu", default="a6000", metavar="NAME", help="cluster: GPU (default a6000)")
    p.add_argument("--model-name", default="mistral-7b", metavar="NAME", help="cluster: model served (default mistral-7b)")
    p.add_argument("--requests", type=positive_int, default=None, metavar="N",
                   help="requests per run (default 20000 dispatch, 300 cluster)")
    p.add_argument("--seeds", type=positive_int, default=4, metavar="S", help="seeds per row (default 4)")
    p.add_argument("--seed", type=int, default=0, metavar="INT", help="base PRNG seed (default 0)")
    add_output_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    if args.model == "dispatch":
        policies = choose(csv_list(args.policies or "random,p2c,jsq"), tuple(CLI_POLICIES), "policy")
        rows = [(p, args.servers) for p in policies]
        ev = cap.dispatch_evaluator(policies, servers=args.servers, seeds=args.seeds, requests=args.requests or 20_000,
                                    service=args.service, seed=args.seed)
        lo, hi = args.rate_range or (0.3, 1.0)
        unit = "load per server"
    else:
        policies = choose(csv_list(args.policies or "rr,llmd_precise"), PARTIAL_OK, "router (one that runs on part of a cluster)")
        rows = [(p, g) for p in policies for g in args.replicas]
        wl = build_workload(args.workload, args.requests or 300, args.trace)
        ev = cap.cluster_evaluator(rows, wl, seeds=args.seeds, gpu=args.gpu, model_name=args.model_name, seed=args.seed)
        lo, hi = args.rate_range or (0.5, 100.0)
        unit = "requests/s"
    if args.seeds < 2:
        warn("one seed gives no confidence interval")
    start = time.perf_counter()
    res = cap.search(ev, len(rows), lo, hi, args.slo, tol=args.tol, points=args.points, max_rounds=args.max_rounds)
    elapsed = time.perf_counter() - start
    slo_txt = ",".join(f"{b.metric}{b.op}{b.value:g}" for b in args.slo)
    print(f"capacity ({unit}) under {slo_txt}: {len(rows)} rows x {args.seeds} seeds, {res.rounds} rounds, "
          f"{res.evaluations:,} runs in {elapsed:.1f} s")
    records = []
    for (policy, g), c in zip(rows, res.capacity, strict=True):
        known = np.isfinite(c)
        s = summarize(c[known]) if known.any() else None
        label = policy if args.model == "dispatch" else f"{policy}@{g}"
        print(f"  {label:<24} {report.fmt_ci(s) if s else 'unknown':>22}  ({int(known.sum())}/{len(c)} seeds known)")
        records.append({"row": label, "policy": policy, "replicas": g, "per_seed": c.tolist(), "known": int(known.sum())})
    out = {"command": "capacity", "model": args.model, "slo": slo_txt, "unit": unit, "rounds": res.rounds,
           "runs": res.evaluations, "elapsed_s": elapsed, "rows": records,
           "curves": [[{"rate": x, **m} for x, m in cv] for cv in res.curve]}
    if args.model == "cluster" and args.min_replicas:
        need = cap.min_replicas(res, rows, args.min_replicas)
        for policy, k in need.items():
            print(f"  min replicas for {args.min_replicas:g} req/s, {policy}: {k if k else 'more than ' + str(max(args.replicas))}")
        out["min_replicas"] = need
    if args.out:
        print(f"wrote {report.write_json(args.out, out)}")
    if getattr(args, "plot", None):
        metric = args.slo[0].metric
        panels = {f"{metric} against the rate": [
            dict(x=[x for x, _ in sorted(cv)], y=[m[metric] for _, m in sorted(cv)], marker=".", label=r["row"])
            for cv, r in zip(res.curve, records, strict=True)]}
        report.line_plot(panels, args.plot, xlabel=unit, ylabel=metric, title=f"capacity search under {slo_txt}")
        print(f"wrote {args.plot}")
    if not any(r["known"] for r in records):
        raise JaxrouteError("no capacity is known: widen --rate-range (every row met or missed the SLO everywhere)")
    return 0
