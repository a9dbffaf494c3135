"""`jaxroute dispatch`: classic dispatch policies on N FCFS servers, many seeds, one compilation."""

from __future__ import annotations

import time

import jax

from jaxroute import report, sim
from jaxroute.clusters.queueing import QueueingModel, default_ring, dispatch_params
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
from jaxroute.workloads.service import SERVICE_LAWS, law_moments

# CLI policy names -> model policy ids; p2c is power-of-d with d = --d (2 unless changed).
CLI_POLICIES = {"random": "random", "rr": "rr", "jsq": "jsq", "p2c": "pod", "pod": "pod", "lwl": "lwl"}
METRICS = ("mean_response", "p99_response")
HEAVY_TAIL_RING = {"pareto": 256, "lognormal": 64}


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
    p.add_argument("--servers", default="16", metavar="N", help="number of servers (default 16)")
    p.add_argument("--load", default="0.9", metavar="RHO",
                   help="utilisation rho = arrival rate / total service rate (default 0.9); >= 1 is unstable")
    p.add_argument("--service", default="exp", metavar="LAW",
                   help="service-time law, mean 1: exp, pareto (bounded, alpha 1.5, CV 5.7), "
                   "lognormal (CV 3) or det (default exp)")
    p.add_argument("--policies", default="random,rr,jsq,p2c,lwl", metavar="LIST",
                   help="comma-separated: random, rr (round robin), jsq (join the shortest queue), "
                   "p2c (power of d choices, d from --d; alias pod), lwl (least work left) "
                   "(default: all five)")
    p.add_argument("--seeds", default="64", metavar="S", help="independent runs per policy (default 64)")
    p.add_argument("--requests", default="20000", metavar="R", help="requests per run (default 20000)")
    p.add_argument("--warmup", default="0.1", metavar="F",
                   help="fraction of each run's first requests left out of the metrics (default 0.1)")
    p.add_argument("--stale", default="0", metavar="T",
                   help="queue lengths seen by jsq / p2c are a board refreshed every T service times "
                   "(default 0: fresh)")
    p.add_argument("--d", default="2", metavar="D", help="choices sampled by p2c / pod (default 2)")
    p.add_argument("--ring", default=None, metavar="K",
                   help="max queue length per server the router can count (default: sized from load, "
                   "servers and --stale, and enlarged automatically if a run overflows)")
    p.add_argument("--seed", default="0", metavar="INT", help="base PRNG seed (default 0)")
    add_output_args(p)
    p.set_defaults(func=run)




def policy_label(name: str, d: int) -> str:
    return "p2c" if CLI_POLICIES[name] == "pod" and d == 2 else (f"po{d}c" if CLI_POLICIES[name] == "pod" else name)


def run_dispatch(policies, *, servers=16, load=0.9, service="exp", seeds=64, requests=20_000, warmup=0.1,
                 stale=0.0, d=2, ring=None, seed=0, progress=False, auto_ring=True):
    """Run every policy on the same seeds in one compiled grid; returns (records, model).

    The ring is doubled (up to twice) and the grid rerun when a policy that reads queue
    lengths overflowed it, unless `ring` was given.
    """
    if not 0.0 <= warmup < 1.0:
        raise JaxrouteError(f"--warmup must be in [0, 1), got {warmup}")
    if not load > 0:
        raise JaxrouteError(f"--load must be > 0, got {load}")
    labels = [(policy_label(p, d), {"load": load, "service": service, "stale": stale,
                                    "d": d if CLI_POLICIES[p] == "pod" else None}) for p in policies]
    params = sim.stack_params([dispatch_params(CLI_POLICIES[p], load, service, stale, d) for p in policies])
    reads_queue = any(CLI_POLICIES[p] in ("jsq", "pod") for p in policies)
    k = ring or (default_ring(servers, min(load, 1.0), stale) if reads_queue else 1)  # unread: keep it tiny
    if ring is None and reads_queue:
        # Heavy tails: big jobs block servers and queues pile up elsewhere (sizes seen at load 0.9).
        k = max(k, HEAVY_TAIL_RING.get(service, 0))
    for attempt in range(3):
        model = QueueingModel(n_servers=servers, n_requests=requests, warmup=int(warmup * requests), ring=k,
                              max_d=max(d, 2))
        chunk = max(1, model.num_steps() // 20)
        grid = sim.run_grid(model, jax.random.key(seed), None, params, seeds, chunk=chunk,
                            progress="dispatch" if progress else False)
        if not grid.overflow.any() or ring is not None or not auto_ring or attempt == 2:
            break
        warn(f"a queue reached the ring capacity {k}; rerunning with {2 * k}")
        k *= 2
    return report.records_from_grid(grid, labels, METRICS), model


def run(args) -> int:
    servers = int_arg(args.servers, "--servers", 1)
    seeds = int_arg(args.seeds, "--seeds", 1)
    requests = int_arg(args.requests, "--requests", 1)
    d = int_arg(args.d, "--d", 1)
    seed = int_arg(args.seed, "--seed", 0)
    ring = None if args.ring is None else int_arg(args.ring, "--ring", 1)
    load = float_arg(args.load, "--load")
    warmup = float_arg(args.warmup, "--warmup")
    stale = float_arg(args.stale, "--stale")
    if stale < 0:
        raise JaxrouteError(f"--stale must be >= 0, got {args.stale}")
    if load <= 0:
        raise JaxrouteError(f"--load must be > 0, got {args.load}")
    service = choose([args.service], SERVICE_LAWS, "service law")[0]
    policies = choose(csv_list(args.policies), list(CLI_POLICIES), "policy")
    if len(set(policies)) != len(policies):
        raise JaxrouteError(f"--policies lists a policy twice: {args.policies}")
    if load >= 1.0:
        warn(f"load {load} >= 1: the queues are unstable (they grow without bound), so response times "
             "depend on --requests and do not converge")
    if seeds < 2:
        warn("one seed gives no confidence interval")

    start = time.perf_counter()
    records, model = run_dispatch(policies, servers=servers, load=load, service=service, seeds=seeds,
                                  requests=requests, warmup=warmup, stale=stale, d=d, ring=ring, seed=seed,
                                  progress=show_progress(args))
    elapsed = time.perf_counter() - start
    check_overflow(records, args, f"Queues outgrew the ring capacity {model.ring}: pass a larger --ring")

    mean, cv = law_moments(service)
    print(f"dispatch: {servers} FCFS servers, load {load}, service {service} (mean {mean:.3g}, CV {cv:.3g}), "
          f"{'stale board T=' + str(stale) if stale > 0 else 'fresh queue lengths'}; "
          f"{seeds} seeds x {requests} requests, first {model.warmup} left out; times in mean service times")
    print(report.format_table(records, METRICS))
    if service == "exp" and load < 1 and "random" in policies:
        print(f"theory: random dispatch with exp service is M/M/1 per server, mean response 1/(1-rho) = "
              f"{1 / (1 - load):.3g}")
    print(f"({len(records)} policies x {seeds} seeds in one compiled grid, {elapsed:.1f} s)")
    config = dict(servers=servers, load=load, service=service, service_cv=cv, seeds=seeds, requests=requests,
                  warmup=warmup, warmup_requests=model.warmup, stale=stale, d=d, ring=model.ring, seed=seed,
                  time_unit="mean service time")
    if args.out:
        path = report.write_results(args.out, "dispatch", config, records)
        print(f"wrote {path} and {path.with_suffix('.csv')}")
    if args.plot:
        plot_records(records, METRICS, args.plot, f"{servers} servers, load {load}, {service} service"
                     + (f", stale T={stale}" if stale > 0 else ""), ylabel="response (mean service times)")
        print(f"wrote {args.plot}")
    return 0


def plot_records(records, metric_names, path, title, ylabel):
    """Bar chart: one panel per metric, one bar per record, 95 % CI error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(metric_names), figsize=(4.2 * len(metric_names), 3.6), squeeze=False)
    names = [r.policy for r in records]
    for ax, metric in zip(axes[0], metric_names, strict=True):
        means = [r.metrics[metric].mean for r in records]
        errs = [r.metrics[metric].half_width for r in records]
        ax.bar(names, means, yerr=errs, capsize=4, color="#4C72B0")
        ax.set_title(metric)
        ax.set_ylabel(ylabel)
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
