"""Benchmark the replica cluster: simulated requests per second at 1 and 64 seeds, side by side.

Each size is compiled and run once (excluded), then timed on a second run with fresh keys;
requests/s = policies x seeds x requests / seconds. Writes JSON.

    python scripts/bench_cluster.py [--requests 500] [--seeds 1,64] [--out results/bench_cluster.json]
"""

from __future__ import annotations

import argparse
import time

import jax

from jaxroute import report
from jaxroute.cli import use_all_cpu_cores
from jaxroute.experiments.cluster import policy_rows, run_cluster
from jaxroute.workloads import prefix as W


def bench(workload, policies, n_seeds: int, n_replicas: int, rate: float) -> dict:
    rows = policy_rows(policies, rate=rate)
    t0 = time.perf_counter()
    run_cluster(rows, workload, replicas_n=n_replicas, seeds=n_seeds, seed=0)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    grid = run_cluster(rows, workload, replicas_n=n_replicas, seeds=n_seeds, seed=1).grid
    wall = time.perf_counter() - t0
    n = len(policies) * n_seeds * workload.n_requests
    return {"seeds": n_seeds, "policies": list(policies), "requests_per_run": workload.n_requests,
            "simulated_requests": n, "seconds": wall, "first_run_seconds_incl_compile": first,
            "requests_per_s": n / wall, "overflow": bool(grid.overflow.any())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="longdoc")
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--seeds", default="1,64", help="comma-separated seed counts (default 1,64)")
    ap.add_argument("--policies", default="rr,least_load,threshold,cache_guard,sglang_cache_aware",
                    help="routers run together in each grid (default: all but affinity, whose herd makes the "
                    "slowest row and so sets the batch's time)")
    ap.add_argument("--out", default="results/bench_cluster.json")
    args = ap.parse_args(argv)
    use_all_cpu_cores()  # one JAX CPU device per core: the grid is sharded across cores
    wl = W.synthetic(args.workload, args.requests)
    pols = args.policies.split(",")
    rows = [bench(wl, pols, int(s), args.replicas, args.rate) for s in args.seeds.split(",")]
    dev = jax.devices()[0]
    print(f"replica cluster: {args.workload}, {args.replicas} replicas, {args.rate:g} req/s, {len(pols)} policies, "
          f"{args.requests} requests per run; {len(jax.devices())} x {dev.device_kind} ({dev.platform})")
    for r in rows:
        print(f"  seeds {r['seeds']:>3}: {r['simulated_requests']:>8,} requests in {r['seconds']:7.2f} s -> "
              f"{r['requests_per_s']:>9,.0f} simulated requests/s (first run incl. compile {r['first_run_seconds_incl_compile']:.1f} s)")
    if len(rows) > 1:
        print(f"  ratio {rows[-1]['seeds']} / {rows[0]['seeds']} seeds: "
              f"{rows[-1]['requests_per_s'] / rows[0]['requests_per_s']:.1f}x requests/s")
    out = {"command": "bench_cluster", "config": vars(args), "device": f"{dev.device_kind} ({dev.platform})",
           "n_devices": len(jax.devices()), "results": rows}
    path = report.write_json(args.out, out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
