"""Simulated requests per second of the replica cluster at several seed counts: now a thin wrapper around
the harness, the same as `jaxroute bench --only cluster` (see `jaxroute bench --help`), beside the
radix-tree reference.

Flags as before: --workload (now a comma-separated list), --requests, --replicas, --rate, --seeds,
--policies (run together in one grid); --separate LIST adds grids of their own (default none here).

    python scripts/bench_cluster.py [--requests 500] [--seeds 1,64] [--out results/bench_cluster.json]
"""

from __future__ import annotations

import argparse

from _bench_wrapper import QUICK_HELP, ints, run


def main(argv=None) -> int:
    names = lambda text: tuple(t.strip() for t in text.split(",") if t.strip() and t.strip() != "none")  # noqa: E731
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", type=names, default=("longdoc",), help="synthetic workload(s) (default longdoc)")
    ap.add_argument("--requests", type=int, default=500, help="requests per run (default 500)")
    ap.add_argument("--replicas", type=int, default=4, help="replicas (default 4)")
    ap.add_argument("--rate", type=float, default=1.0, help="arrival rate, requests/s (default 1.0)")
    ap.add_argument("--seeds", type=ints, default=(1, 64), help="comma-separated seed counts (default 1,64)")
    ap.add_argument("--policies", type=names, default=("rr", "least_load", "threshold", "cache_guard", "sglang_cache_aware"),
                    help="routers run together in each grid (default: all but affinity, whose herd makes the "
                    "slowest row and so sets the batch's time)")
    ap.add_argument("--separate", type=names, default=(), help="routers each timed in a grid of their own (default none)")
    ap.add_argument("--out", default="results/bench_cluster.json")
    ap.add_argument("--quick", action="store_true", help=QUICK_HELP)
    args = ap.parse_args(argv)
    return run(dict(parts=("cluster",), cluster_workloads=args.workload, cluster_requests=args.requests,
                    replicas=args.replicas, cluster_rate=args.rate, cluster_seeds=args.seeds, policies=args.policies,
                    separate=args.separate), args.out, quick=args.quick)


if __name__ == "__main__":
    raise SystemExit(main())
