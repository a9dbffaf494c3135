"""Latency of one jitted BalanceRoute dispatch decision, and the decode simulator's speed: now a thin
wrapper around the harness, the same as `jaxroute bench --only decision,decode` (see `jaxroute bench --help`).

1. One BR-0 and one BR-H (H = 80) binding decision at G = 8, a full prompt pool of 32, W = 8 (2^8
   subsets), R_max = 4, on random loads: P50 / P99 of the jitted decision (compile and first call
   excluded), stage 1 (ample slots) and stage 2 (scarce slots), and BR-H's predicted loads. The
   paper's Python proxy: 1.20 / 2.77 ms; the target is 0.1 ms at P50.
2. The decode simulator (BR-0 and BR-H at G = 8, saturated): simulated requests per second beside
   its step-by-step reference.

Flags as before: --calls, --sim-requests (decode requests per seed), --sim-seeds (now a list).

Usage: python scripts/bench_dispatch_latency.py [--calls 2000] [--out results/bench_dispatch_latency.json]
"""

from __future__ import annotations

import argparse
import sys

from _bench_wrapper import QUICK_HELP, ints, run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000, help="timed calls per decision benchmark (default 2000)")
    ap.add_argument("--sim-requests", type=int, default=1000, help="decode requests per seed (default 1000)")
    ap.add_argument("--sim-seeds", type=ints, default=(4,), help="comma-separated decode seed counts (default 4)")
    ap.add_argument("--out", default="results/bench_dispatch_latency.json", help="where to write the JSON")
    ap.add_argument("--quick", action="store_true", help=QUICK_HELP)
    args = ap.parse_args(argv)
    return run(dict(parts=("decision", "decode"), decision_calls=args.calls, decode_requests=args.sim_requests,
                    decode_seeds=args.sim_seeds), args.out, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
