"""The pure-Python side of each comparison, timed on the same workload as the jitted model.

- dispatch: `python_jsq`, a tight heap-based JSQ event loop (one seed per call, one core);
- replica cluster: `tests/reference_replicas.py::simulate`, the radix-tree reference;
- decode DP: `tests/reference_dp_decode.py::simulate`, the step-by-step reference.

The two references live in the repository's `tests/` folder, not in the package: `load_reference`
puts the repository root (the parent of the `jaxroute` package) on sys.path when `tests/` is there,
and otherwise says why the reference is unavailable (e.g. jaxroute installed elsewhere).
"""

from __future__ import annotations

import dataclasses
import heapq
import importlib
import random
import sys
import time
from pathlib import Path
from types import ModuleType

import jax
import numpy as np

import jaxroute
from jaxroute.bench.measure import say


def python_jsq(n_servers: int, n_requests: int, load: float, seed: int) -> list[float]:
    """Response times of N FCFS servers under JSQ (ties to the lowest index), Poisson arrivals at load x N,
    exponential service of mean 1: a heap of departures and per-server queue counters."""
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


def repo_root() -> Path:
    return Path(jaxroute.__file__).resolve().parent.parent


def load_reference(name: str) -> tuple[ModuleType | None, str | None]:
    """(tests.<name> module, None), or (None, why it is unavailable)."""
    root = repo_root()
    if not (root / "tests" / f"{name}.py").is_file():
        return None, f"tests/{name}.py not found beside the jaxroute package ({root}); run from a source checkout"
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        return importlib.import_module(f"tests.{name}"), None
    except Exception as e:  # e.g. another installed package called `tests` shadows the folder
        return None, f"importing tests.{name} failed: {type(e).__name__}: {e}"


def _unavailable(source: str, why: str) -> dict:
    say(f"  reference {source}: unavailable ({why})")
    return {"source": source, "available": False, "reason": why}


def _result(source: str, seconds: float, requests: float, **extra) -> dict:
    rps = requests / seconds
    what = f"{requests:,.0f} requests"
    if "tokens_simulated" in extra:
        what = f"{extra['tokens_simulated']:,} output tokens in {extra['steps']} steps (= {requests:,.1f} requests)"
    say(f"  reference {source}: {what} in {seconds:.2f} s = {rps:,.1f} requests/s (one core)")
    return {"source": source, "available": True, "seconds": seconds, "requests": requests, "requests_per_s": rps,
            "cores": 1, "requests_per_s_per_core": rps, **extra}


def time_python_jsq(n_servers: int, requests: int, load: float, seeds: int, repeats: int = 3) -> dict:
    """Best of `repeats` timings of the JSQ loop over `seeds` seeds (the same system as the dispatch model)."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for s in range(seeds):
            python_jsq(n_servers, requests, load, s)
        best = min(best, time.perf_counter() - t)
    return _result("jaxroute.bench.references.python_jsq", best, seeds * requests, seeds=seeds,
                   requests_per_seed=requests, policy="jsq")


def time_replica_reference(workload, params, *, replicas: int, max_running: int, max_queue: int,
                           policy: str) -> dict:
    """`tests/reference_replicas.py::simulate` on one realised table of `workload` (seed 0), compile excluded."""
    source = "tests/reference_replicas.py::simulate"
    ref, why = load_reference("reference_replicas")
    if ref is None:
        return _unavailable(source, why)
    if policy not in ref.POLICIES:
        return _unavailable(source, f"the reference has no router '{policy}'")
    table = workload.realize(jax.random.key(0), params.rate)
    kw = dict(G=replicas, cap=int(params.kv_capacity), policy=policy, cost=params.cost, B=max_running, Q=max_queue)
    ref.simulate(_head(table, 4), **kw)  # warm-up: compiles the cost functions it calls (excluded)
    t = time.perf_counter()
    rec, violations = ref.simulate(table, **kw)
    dt = time.perf_counter() - t
    n = int(np.asarray(table.arrival_s).shape[0])
    return _result(source, dt, n, policy=policy, seeds=1, violations=len(violations),
                   finished=int(np.isfinite(np.asarray(rec["finish"])).sum()))


def _head(table, n: int):
    """The first n requests of a RequestTable (its segment catalogue unchanged)."""
    per_request = ("arrival_s", "seg_ids", "seg_tok", "out_tok", "out_seg", "prompt_tok", "session")
    return dataclasses.replace(table, **{k: getattr(table, k)[:n] for k in per_request})


def time_decode_reference(requests, cost, *, workers: int, slots: int, pool: int, window: int, horizon: int,
                          r_max: int, kv_capacity: int, collective_s: float, max_steps: int, policy: str,
                          mean_output: float) -> dict:
    """`tests/reference_dp_decode.py::simulate`, saturated, stopped after `max_steps` barrier steps.

    A partial run finishes few requests, so the figure compared is output tokens per second (each active
    request emits one token per step); `requests_per_s` is that divided by `mean_output` (the benchmark
    workload's mean output length), the rate at which the reference would finish its requests."""
    from jaxroute.routers import balance

    source = "tests/reference_dp_decode.py::simulate"
    ref, why = load_reference("reference_dp_decode")
    if ref is None:
        return _unavailable(source, why)
    prompt, output = requests.prompt_tokens.tolist(), requests.output_tokens.tolist()
    kw = dict(n_workers=workers, slots=slots, pool=pool, window=window, horizon=horizon, r_max=r_max,
              kv_capacity=kv_capacity, cost=cost, collective_s=collective_s, policy=balance.policy_id(policy),
              dispatch=balance.default_dispatch(policy), predictor=1)
    ref.simulate(jax.random.key(1), prompt[:2], output[:2], requests.arrival_s.tolist()[:2], max_steps=2, **kw)  # warm-up
    t = time.perf_counter()
    out = ref.simulate(jax.random.key(0), prompt, output, requests.arrival_s.tolist(), max_steps=max_steps, **kw)
    dt = time.perf_counter() - t
    tokens = int(out["tokens_out"])
    return _result(source, dt, tokens / mean_output, policy=policy, seeds=1, requests_run=len(prompt),
                  steps=int(out["steps"]), tokens_simulated=tokens, tokens_per_s=tokens / dt,
                  completed=int(np.sum(out["done"])), requests_are="output tokens / mean output length")
