"""Latency of one jitted BalanceRoute binding decision (BR-0 and BR-H) at G = 8.

A full prompt pool of 32, W = 8 (2^8 subsets), R_max = 4, H = 80, on random loads: P50 / P99 over
many calls of the jitted `balance.balance_dispatch` (compile and first call excluded,
block_until_ready each call). Stage 1 has ample slots, stage 2 scarce ones. BR-H's per-step input,
the predicted loads of every active request (oracle), is timed too. BalanceRoute's Python proxy took
1.20 ms (P50) and 2.77 ms (P99); the target here is 0.1 ms at P50.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute import fast_prng  # noqa: F401  (unrolled Threefry on CPU; this module jits without jaxroute.sim)
from jaxroute.bench.config import DECISION_TARGET_P50_MS
from jaxroute.bench.measure import say

G, POOL, W, H, R_MAX, SLOTS = 8, 32, 8, 80, 4, 64
PAPER_PYTHON_PROXY_MS = {"p50": 1.20, "p99": 2.77}


def time_calls(fn, args_list, calls: int) -> dict:
    """P50 / P99 / mean milliseconds of `fn(*args)` over `calls` calls, cycling through args_list."""
    jax.block_until_ready(fn(*args_list[0]))  # compile
    jax.block_until_ready(fn(*args_list[1 % len(args_list)]))  # first call after compiling
    out = np.empty(calls)
    for i in range(calls):
        a = args_list[i % len(args_list)]
        t = time.perf_counter()
        jax.block_until_ready(fn(*a))
        out[i] = time.perf_counter() - t
    ms = out * 1e3
    p50 = float(np.percentile(ms, 50))
    return {"p50_ms": p50, "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean()), "calls": calls,
            "target_p50_ms": DECISION_TARGET_P50_MS, "meets_target": bool(p50 <= DECISION_TARGET_P50_MS)}


def decision_inputs(rng: np.random.Generator, n: int, stage: int) -> list[tuple]:
    rows = []
    h = np.arange(H + 1, dtype=np.float32) / H
    for _ in range(n):
        pool_s = jnp.asarray(rng.integers(100, 12000, POOL), jnp.float32)
        base = rng.integers(150_000, 400_000, G).astype(np.float32)
        decay = rng.uniform(0.0, 0.6, G).astype(np.float32)  # each worker loses a share of its load over H
        loads_h = jnp.asarray(base[:, None] * (1 - decay[:, None] * h[None, :]))
        free = jnp.full((G,), R_MAX, jnp.int32) if stage == 1 else jnp.asarray(rng.integers(0, 2, G), jnp.int32)
        rows.append((pool_s, jnp.ones((POOL,), bool), loads_h, free, jnp.full((G,), 1e7, jnp.float32)))
    return rows


def bench_decisions(calls: int, seed: int = 0) -> dict:
    from jaxroute.clusters import dp_decode as dd
    from jaxroute.routers import balance

    rng = np.random.default_rng(seed)
    out = {}
    for name, policy in (("br0", balance.BR0), ("brh", balance.BRH)):
        a, b, d = balance.score_weights(jnp.int32(policy), 1.0, float(G), dd.DEFAULT_GAMMA, G, H)

        @jax.jit
        def decide(pool_s, valid, loads_h, free, room, a=a, b=b, d=d):
            return balance.balance_dispatch(pool_s, valid, loads_h, free, room, a, b, d, W, G * R_MAX)

        for stage in (1, 2):
            out[f"{name}_stage{stage}"] = r = time_calls(decide, decision_inputs(rng, 64, stage), calls)
            say(f"  {name} decision, stage {stage}: P50 {r['p50_ms']:.3f} ms, P99 {r['p99_ms']:.3f} ms")
    return out


def bench_predicted_loads(calls: int) -> dict:
    """BR-H's per-step input: the predicted loads of G x SLOTS active requests (oracle)."""
    from jaxroute import cost_models
    from jaxroute.clusters import dp_decode as dd
    from jaxroute.predictors import base as predictors
    from jaxroute.workloads.decode import make_decode_requests

    n = 4096
    model = dd.DecodeModel(n_workers=G, n_requests=n, max_steps=1, slots=SLOTS, pool=POOL, window=W, horizon=H)
    req = make_decode_requests("synthetic-prod", n, seed=0)
    wl = dd.make_workload(req, cost_models.cost_params(dd.DEFAULT_GPU, dd.DEFAULT_MODEL, dd.DEFAULT_TP))
    params = dd.make_params("brh", n_workers=G, predictor=predictors.kind_id("oracle"))
    st = model.init(jax.random.key(0), wl, params)
    rng = np.random.default_rng(1)
    states = [(dataclasses.replace(st, slot_req=jnp.asarray(rng.integers(0, n, (G, SLOTS)), jnp.int32),
                                   slot_gen=jnp.asarray(rng.integers(0, 500, (G, SLOTS)), jnp.int32)),)
              for _ in range(16)]
    r = time_calls(jax.jit(lambda s: model.predicted_loads(s, wl, params)), states, calls)
    say(f"  brh predicted loads ({G}x{SLOTS} active, oracle): P50 {r['p50_ms']:.3f} ms, P99 {r['p99_ms']:.3f} ms")
    return r


def run_decision(calls: int) -> dict:
    return {"G": G, "pool": POOL, "W": W, "H": H, "R_max": R_MAX, "paper_python_proxy_ms": PAPER_PYTHON_PROXY_MS,
            "target_p50_ms": DECISION_TARGET_P50_MS, "decisions": bench_decisions(calls),
            "brh_predicted_loads": bench_predicted_loads(calls)}
