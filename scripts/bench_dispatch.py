"""Simulated requests per second of the dispatch model (JSQ, N FCFS servers, Poisson arrivals, exponential
service) beside a tight pure-Python JSQ loop: now a thin wrapper around the harness, the same as
`jaxroute bench --only dispatch` (see `jaxroute bench --help`).

Flags as before: --seeds, --requests, --servers, --load, --python-seeds (the Python loop's seeds),
--devices (CPU devices to shard over). The ring is sized, and grown on overflow, by the experiments
API, so --ring and --repeats are gone.

    python scripts/bench_dispatch.py [--seeds 1,64,1024] [--requests 20000] [--out results/bench_dispatch.json]
"""

from __future__ import annotations

import argparse
import sys

from _bench_wrapper import QUICK_HELP, ints, run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=ints, default=(1, 64, 1024), help="comma-separated seed counts (default 1,64,1024)")
    ap.add_argument("--requests", type=int, default=20_000, help="requests per seed (default 20000)")
    ap.add_argument("--servers", type=int, default=16, help="servers (default 16)")
    ap.add_argument("--load", type=float, default=0.9, help="load rho (default 0.9)")
    ap.add_argument("--python-seeds", type=int, default=2, help="seeds of the Python loop timing (default 2)")
    ap.add_argument("--devices", type=int, default=None, help="CPU devices to shard over (default: one per core)")
    ap.add_argument("--out", default="results/bench_dispatch.json", help="write the JSON here")
    ap.add_argument("--quick", action="store_true", help=QUICK_HELP)
    args = ap.parse_args(argv)
    return run(dict(parts=("dispatch",), dispatch_seeds=args.seeds, dispatch_requests=args.requests,
                    dispatch_servers=args.servers, dispatch_load=args.load, ref_seeds=args.python_seeds),
               args.out, args.devices, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
