"""Time one jitted BalanceRoute dispatch decision and the whole decode simulator.

1. One BR-0 and one BR-H (H = 80) binding decision at G = 8, a full prompt pool of 32,
   W = 8 (2^8 subsets), R_max = 4, on random loads: P50 / P99 over many calls of the
   jitted `balance_dispatch` (compile excluded, block_until_ready). Both stage 1 (ample
   slots) and stage 2 (scarce slots) are timed. The paper's Python proxy: 1.20 / 2.77 ms.
2. Simulated decode steps x seeds per second for the whole simulator (7 policies in one
   grid), the number that sets how long a comparison takes.

Usage: python scripts/bench_dispatch_latency.py [--calls 2000] [--out results/bench_dispatch.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute import cost_models, report
from jaxroute.clusters import dp_decode as dd
from jaxroute.experiments import Comparison
from jaxroute.predictors import base as predictors
from jaxroute.routers import balance
from jaxroute.workloads.decode import make_decode_requests

G, POOL, W, H, R_MAX, SLOTS = 8, 32, 8, 80, 4, 64


def time_calls(fn, args_list, calls):
    jax.block_until_ready(fn(*args_list[0]))  # compile
    jax.block_until_ready(fn(*args_list[1 % len(args_list)]))
    out = []
    for i in range(calls):
        a = args_list[i % len(args_list)]
        t = time.perf_counter()
        jax.block_until_ready(fn(*a))
        out.append(time.perf_counter() - t)
    ms = np.asarray(out) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean()), "calls": calls}


def decision_inputs(rng, n, stage):
    rows = []
    for _ in range(n):
        pool_s = jnp.asarray(rng.integers(100, 12000, POOL), jnp.float32)
        base = rng.integers(150_000, 400_000, G).astype(np.float32)
        # predicted loads: each worker loses a random share of its load over the horizon
        decay = rng.uniform(0.0, 0.6, G).astype(np.float32)
        h = np.arange(H + 1, dtype=np.float32) / H
        loads_h = jnp.asarray(base[:, None] * (1 - decay[:, None] * h[None, :]))
        free = jnp.full((G,), R_MAX, jnp.int32) if stage == 1 else jnp.asarray(rng.integers(0, 2, G), jnp.int32)
        rows.append((pool_s, jnp.ones((POOL,), bool), loads_h, free, jnp.full((G,), 1e7, jnp.float32)))
    return rows


def bench_decisions(calls, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for name, policy in (("br0", balance.BR0), ("brh", balance.BRH)):
        a, b, d = balance.score_weights(jnp.int32(policy), 1.0, float(G), dd.DEFAULT_GAMMA, G, H)

        @jax.jit
        def decide(pool_s, valid, loads_h, free, room, a=a, b=b, d=d):
            return balance.balance_dispatch(pool_s, valid, loads_h, free, room, a, b, d, W, G * R_MAX)

        for stage in (1, 2):
            out[f"{name}_stage{stage}"] = time_calls(decide, decision_inputs(rng, 64, stage), calls)
    return out


def bench_predicted_loads(calls):
    """BR-H's per-step input: predicted loads of every active request (oracle), part of a BR-H decision."""
    model = dd.DecodeModel(n_workers=G, n_requests=4096, max_steps=1, slots=SLOTS, pool=POOL, window=W, horizon=H)
    req = make_decode_requests("synthetic-prod", 4096, seed=0)
    wl = dd.make_workload(req, cost_models.cost_params(dd.DEFAULT_GPU, dd.DEFAULT_MODEL, dd.DEFAULT_TP))
    params = dd.make_params("brh", n_workers=G, predictor=predictors.kind_id("oracle"))
    st = model.init(jax.random.key(0), wl, params)
    rng = np.random.default_rng(1)
    states = []
    for _ in range(16):
        st = dd.dataclasses.replace(st, slot_req=jnp.asarray(rng.integers(0, 4096, (G, SLOTS)), jnp.int32),
                                    slot_gen=jnp.asarray(rng.integers(0, 500, (G, SLOTS)), jnp.int32))
        states.append((st,))
    fn = jax.jit(lambda s: model.predicted_loads(s, wl, params))
    return time_calls(fn, states, calls)


def bench_simulator(requests, seeds, slots):
    req = make_decode_requests("synthetic-azure24", requests, seed=0)
    wl = dd.make_workload(req, cost_models.cost_params(dd.DEFAULT_GPU, dd.DEFAULT_MODEL, dd.DEFAULT_TP))
    steps = 2000
    model = dd.DecodeModel(n_workers=G, n_requests=requests, max_steps=steps, slots=slots, pool=POOL, window=W,
                             horizon=H, kv_capacity=cost_models.kv_capacity_tokens(dd.DEFAULT_GPU, dd.DEFAULT_MODEL))
    rows = [(p, dd.make_params(p, n_workers=G)) for p in balance.POLICIES]
    Comparison(model, rows, seeds, ("steps",), workload=wl, seed=0).run()  # compile + warm
    t = time.perf_counter()
    grid = Comparison(model, rows, seeds, ("steps",), workload=wl, seed=1).run().grid
    dt = time.perf_counter() - t
    rows = len(balance.POLICIES) * seeds
    return {"rows": rows, "steps_per_row": steps, "seconds": dt, "step_rows_per_s": rows * steps / dt,
            "all_busy_steps": bool(np.all(grid.metrics["steps"] == steps)), "slots": slots, "workers": G}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000, help="timed calls per decision benchmark")
    ap.add_argument("--sim-requests", type=int, default=4000)
    ap.add_argument("--sim-seeds", type=int, default=4)
    ap.add_argument("--out", default="results/bench_dispatch_latency.json", help="where to write the JSON")
    args = ap.parse_args(argv)
    os.environ.setdefault("JAXROUTE_NO_PROGRESS", "1")
    dev = jax.devices()[0]
    res = {"device": f"{dev.platform}:{dev.device_kind}", "n_devices": len(jax.devices()),
           "G": G, "pool": POOL, "W": W, "H": H, "R_max": R_MAX,
           "paper_python_proxy_ms": {"p50": 1.20, "p99": 2.77}}
    res["decisions"] = bench_decisions(args.calls)
    res["brh_predicted_loads"] = bench_predicted_loads(args.calls)
    print(f"device {res['device']} x{res['n_devices']}; G={G}, pool {POOL}, W={W} (2^{W} subsets), H={H}")
    print(f"{'decision':22s} {'P50 ms':>8s} {'P99 ms':>8s}   (paper's Python proxy: P50 1.20 ms, P99 2.77 ms)")
    for k, v in res["decisions"].items():
        print(f"{k:22s} {v['p50_ms']:8.3f} {v['p99_ms']:8.3f}")
    v = res["brh_predicted_loads"]
    print(f"{'brh predicted loads':22s} {v['p50_ms']:8.3f} {v['p99_ms']:8.3f}   (oracle, {G}x{SLOTS} active requests)")
    res["simulator"] = bench_simulator(args.sim_requests, args.sim_seeds, SLOTS)
    s = res["simulator"]
    print(f"simulator: {s['rows']} rows (7 policies x {args.sim_seeds} seeds) x {s['steps_per_row']} steps in "
          f"{s['seconds']:.1f} s = {s['step_rows_per_s']:,.0f} decode steps x seeds per second")
    path = report.write_json(args.out, res)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
