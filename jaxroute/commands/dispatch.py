"""`jaxroute dispatch`: classic dispatch policies on N FCFS servers, many seeds, one compilation."""

from __future__ import annotations

import time

from jaxroute.commands._common import (
    add_grid_args,
    check_conservation,
    check_overflow,
    choose,
    csv_list,
    fraction,
    non_negative_float,
    positive_float,
    positive_int,
    save_outputs,
    show_progress,
)
from jaxroute.experiments.names import DISPATCH_POLICIES, check_load, unstable_reason
from jaxroute.workloads.names import SERVICE_LAWS


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "dispatch",
        help="compare random / round robin / JSQ / power-of-d / least-work-left on N FCFS servers",
        description="Simulate N first-come-first-served servers with Poisson arrivals and compare dispatch "
        "policies. Every policy runs on the same seeds (common random numbers) in one compiled program; "
        "the table gives mean and P99 response time in mean service times, with 95% CIs over seeds. "
        "The defaults (64 seeds x 20,000 requests) finish in about a minute on two CPU cores; the "
        "lecture's setting is --seeds 256 --requests 50000.",
    )
    p.add_argument("--servers", type=positive_int, default=16, metavar="N", help="number of servers (default 16)")
    p.add_argument("--load", type=positive_float, default=0.9, metavar="RHO",
                   help="utilisation rho = arrival rate / total service rate (default 0.9); >= 1 is unstable and "
                   "refused unless --allow-unstable")
    p.add_argument("--service", default="exp", metavar="LAW",
                   help="service-time law, mean 1: exp, pareto (bounded, alpha 1.5, CV 5.7), "
                   "lognormal (CV 3) or det (default exp)")
    p.add_argument("--policies", default="random,rr,jsq,p2c,lwl", metavar="LIST",
                   help="comma-separated: random, rr (round robin), jsq (join the shortest queue), "
                   "p2c (power of d choices, d from --d; alias pod), lwl (least work left) "
                   "(default: all five)")
    p.add_argument("--warmup", type=fraction, default=0.1, metavar="F",
                   help="fraction of each run's first requests left out of the metrics (default 0.1)")
    p.add_argument("--stale", type=non_negative_float, default=0.0, metavar="T",
                   help="queue lengths seen by jsq / p2c are a board refreshed every T service times "
                   "(default 0: fresh)")
    p.add_argument("--d", type=positive_int, default=2, metavar="D", help="choices sampled by p2c / pod (default 2)")
    p.add_argument("--ring", type=positive_int, default=None, metavar="K",
                   help="max queue length per server the router can count (default: sized from load, "
                   "servers and --stale, and doubled automatically while a run overflows)")
    p.add_argument("--allow-unstable", action="store_true",
                   help="run a load >= 1 once (queues grow without bound) and report it as unstable: a ring the "
                   "queues outgrew is part of that report, not an error (default: refuse a load >= 1)")
    add_grid_args(p, seeds=64, requests=20000, seeds_help="independent runs per policy")
    p.set_defaults(func=run)


def run(args) -> int:
    service = choose([args.service], SERVICE_LAWS, "service law")[0]
    policies = choose(csv_list(args.policies), list(DISPATCH_POLICIES), "policy")
    check_load(args.load, args.allow_unstable)  # before the models are imported: a one-line refusal
    from jaxroute import report
    from jaxroute.clusters.queueing import TIME_UNIT
    from jaxroute.experiments.dispatch import METRICS, run_dispatch
    from jaxroute.workloads.service import law_moments

    load, stale, seeds, requests = args.load, args.stale, args.seeds, args.requests
    unstable = load >= 1.0

    start = time.perf_counter()
    results = run_dispatch(policies, servers=args.servers, load=load, service=service, seeds=seeds,
                           requests=requests, warmup=args.warmup, stale=stale, d=args.d, ring=args.ring,
                           seed=args.seed, progress=show_progress(args), allow_unstable=args.allow_unstable)
    elapsed = time.perf_counter() - start
    records, model = results.records, results.model
    check_conservation(results)
    if not unstable:
        check_overflow(records, args, f"Queues outgrew the ring capacity {model.ring}: pass a larger --ring")

    mean, cv = law_moments(service)
    print(f"dispatch: {args.servers} FCFS servers, load {load}, service {service} (mean {mean:.3g}, CV {cv:.3g}), "
          f"{'stale board T=' + str(stale) if stale > 0 else 'fresh queue lengths'}; "
          f"{seeds} seeds x {requests} requests, first {model.warmup} left out; times in {TIME_UNIT}s")
    print(report.format_table(records, METRICS))
    if unstable:
        grew = [r.policy for r in records if r.overflow]
        print(f"UNSTABLE: {unstable_reason(load)}" + (f"; the queues outgrew the ring of {model.ring} in "
              f"{', '.join(grew)} (queue-reading policies saw at most {model.ring} per server)" if grew else ""))
    if service == "exp" and load < 1 and "random" in policies:
        print(f"theory: random dispatch with exp service is M/M/1 per server, mean response 1/(1-rho) = "
              f"{1 / (1 - load):.3g}")
    print(f"({len(records)} policies x {seeds} seeds in one compiled grid, {elapsed:.1f} s)")
    config = dict(servers=args.servers, load=load, service=service, service_cv=cv, seeds=seeds, requests=requests,
                  warmup=args.warmup, warmup_requests=model.warmup, stale=stale, d=args.d, ring=model.ring,
                  seed=args.seed, time_unit=TIME_UNIT, unstable=unstable)
    title = f"{args.servers} servers, load {load}, {service} service" + (f", stale T={stale}" if stale > 0 else "")
    save_outputs(args, "dispatch", config, records,
                 lambda path: report.bar_plot(records, METRICS, path, title, ylabel=f"response ({TIME_UNIT}s)"))
    return 0
