"""Simulated requests per second: the batched jitted dispatch model vs a tight pure-Python loop.

Both simulate the same system (N FCFS servers, Poisson arrivals, exponential service,
join-the-shortest-queue) side by side in one run. The batched run is timed after a
first call that compiles (excluded), with results fetched to the host
(block_until_ready). Wall-clock and process CPU time are both reported, because
this machine may be shared: CPU time shows the work per simulated request even
when other processes compete for the cores.

    python scripts/bench_dispatch.py [--seeds 1,64,1024] [--requests 20000] [--out bench_dispatch.json]
"""

from __future__ import annotations

import argparse
import heapq
import os
import platform
import random
import time


def python_jsq(n_servers: int, n_requests: int, load: float, seed: int) -> list[float]:
    """A tight per-seed Python loop: heap of departures, queue counters, JSQ (ties to the lowest index)."""
    rng = random.Random(seed)
    expo = rng.expovariate
    rate = load * n_servers
    heap: list[tuple[float, int]] = []
    queue = [0] * n_servers
    free = [0.0] * n_servers
    responses = [0.0] * n_requests
    pop, push, length, servers = heapq.heappop, heapq.heappush, queue.__getitem__, range(n_servers)
    t = 0.0
    for i in range(n_requests):
        t += expo(rate)
        while heap and heap[0][0] <= t:
            queue[pop(heap)[1]] -= 1
        s = min(servers, key=length)
        f = (free[s] if free[s] > t else t) + expo(1.0)
        free[s] = f
        queue[s] += 1
        push(heap, (f, s))
        responses[i] = f - t
    return responses


def _timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="1,64,1024", help="comma-separated batch sizes (seeds) to time")
    ap.add_argument("--requests", type=int, default=20_000, help="requests per seed")
    ap.add_argument("--servers", type=int, default=16)
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--python-seeds", type=int, default=8, help="seeds for the Python loop timing")
    ap.add_argument("--ring", type=int, default=16,
                    help="ring capacity K (16 fits fresh JSQ at load 0.9 over 1024 x 20000 requests; 8 does "
                    "not; overflow is checked)")
    ap.add_argument("--repeats", type=int, default=2, help="timed repeats (best is kept)")
    ap.add_argument("--devices", type=int, default=os.cpu_count() or 1,
                    help="CPU devices to shard the batch over (default: one per core)")
    ap.add_argument("--out", default="bench_dispatch.json", help="write the numbers as JSON here")
    args = ap.parse_args()

    import jax

    if args.devices > 1:  # only affects the CPU backend
        jax.config.update("jax_num_cpu_devices", args.devices)
    import numpy as np

    from jaxroute import report
    from jaxroute.clusters.queueing import DispatchModel, make_params
    from jaxroute.experiments import Comparison

    seeds = [int(s) for s in args.seeds.split(",")]
    model = DispatchModel(n_servers=args.servers, n_requests=args.requests, ring=args.ring)
    jsq_rows = [("jsq", make_params("jsq", args.load, "exp"))]

    def python_rate():
        best_w = best_c = float("inf")
        for _ in range(args.repeats):
            _, w, c = _timed(lambda: [python_jsq(args.servers, args.requests, args.load, s)
                                      for s in range(args.python_seeds)])
            best_w, best_c = min(best_w, w), min(best_c, c)
        n = args.python_seeds * args.requests
        return n / best_w, n / best_c

    py_wall, py_cpu = python_rate()
    rows = []
    for n_seeds in seeds:
        run = lambda k: Comparison(model, jsq_rows, n_seeds, ("mean_response",), seed=k).run().grid  # noqa: B023
        grid = run(0)  # compile (excluded)
        best_w = best_c = float("inf")
        for r in range(args.repeats):
            grid, w, c = _timed(lambda: jax.block_until_ready(run(r + 1)))  # noqa: B023
            best_w, best_c = min(best_w, w), min(best_c, c)
        assert not grid.overflow.any() and not np.any(grid.metrics["conservation_error"])
        n = n_seeds * args.requests
        rows.append(dict(seeds=n_seeds, requests_per_s=n / best_w, requests_per_cpu_s=n / best_c,
                         mean_response=float(np.mean(grid.metrics["mean_response"]))))
    py_wall2, py_cpu2 = python_rate()  # again after the batched runs, to catch drift in machine load
    py_wall, py_cpu = max(py_wall, py_wall2), max(py_cpu, py_cpu2)

    print(f"dispatch benchmark: N={args.servers} servers, load {args.load}, exp service, JSQ, "
          f"{args.requests} requests per seed; {len(jax.devices())} x {jax.devices()[0].device_kind}")
    print(f"{'run':>22s}  {'requests/s':>12s}  {'vs python':>9s}  {'req/CPU-s':>12s}  {'vs python':>9s}")
    print(f"{'python loop (1 core)':>22s}  {py_wall:12,.0f}  {1.0:9.1f}  {py_cpu:12,.0f}  {1.0:9.1f}")
    for r in rows:
        r["ratio_wall"] = r["requests_per_s"] / py_wall
        r["ratio_cpu"] = r["requests_per_cpu_s"] / py_cpu
        print(f"{'batched, ' + str(r['seeds']) + ' seeds':>22s}  {r['requests_per_s']:12,.0f}  "
              f"{r['ratio_wall']:9.1f}  {r['requests_per_cpu_s']:12,.0f}  {r['ratio_cpu']:9.1f}")
    out = dict(
        scenario=dict(servers=args.servers, load=args.load, service="exp", policy="jsq", requests=args.requests,
                      ring=model.ring, block=model.block),
        device_kind=jax.devices()[0].device_kind, backend=jax.default_backend(), n_devices=len(jax.devices()),
        cpu_count=os.cpu_count(), load_average=os.getloadavg(), python=platform.python_version(),
        jax=jax.__version__,
        python_loop=dict(requests_per_s=py_wall, requests_per_cpu_s=py_cpu),
        batched=rows,
    )
    report.write_json(args.out, out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
