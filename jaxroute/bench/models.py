"""The three cluster models as benchmark scenarios, each run through the experiments API.

- dispatch: JSQ on N = 16 FCFS servers at load 0.9, exponential service (`experiments.dispatch`);
- cluster: the replica cluster on synthetic longdoc / toolbench with the default routers in one grid,
  and each `separate` router (preble_e2) in a grid of its own (`experiments.cluster`);
- decode: decode DP at G = 8 with BR-0 and BR-H (oracle predictor), saturated (`experiments.decode`).

Each scenario comes with its pure-Python reference timed on the same workload (`references`).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from jaxroute import cost_models
from jaxroute.bench import references
from jaxroute.bench.config import DECODE_WORKERS, DECODE_WORKLOAD, BenchConfig
from jaxroute.bench.measure import RunOut, Scenario
from jaxroute.clusters.names import REPLICA_GPU, REPLICA_MODEL
from jaxroute.experiments import conservation_failures


def _conserved(results) -> bool:
    return not conservation_failures(results)


# --------------------------------------------------------------------------- dispatch


def dispatch_scenario(cfg: BenchConfig) -> Scenario:
    from jaxroute.experiments.dispatch import run_dispatch

    def run(seeds: int, requests: int, seed: int) -> RunOut:
        res = run_dispatch(["jsq"], servers=cfg.dispatch_servers, load=cfg.dispatch_load, service="exp",
                           seeds=seeds, requests=requests, seed=seed)
        return RunOut(res, None, float(seeds * requests), bool(res.grid.overflow.any()),
                      {"conserved": _conserved(res), "ring": res.model.ring,
                       "mean_response": float(np.mean(res.metrics["mean_response"]))})

    info = {"policy": "jsq", "servers": cfg.dispatch_servers, "load": cfg.dispatch_load, "service": "exp",
            "requests_per_seed": cfg.dispatch_requests}
    return Scenario("dispatch", "dispatch", 1, cfg.dispatch_requests, run, info)


def dispatch_reference(cfg: BenchConfig) -> dict:
    return references.time_python_jsq(cfg.dispatch_servers, cfg.dispatch_requests, cfg.dispatch_load, cfg.ref_seeds)


# --------------------------------------------------------------------------- replica cluster


@functools.lru_cache(maxsize=16)
def cluster_workload(name: str, requests: int):
    from jaxroute.workloads import prefix

    return prefix.synthetic(name, requests)


def cluster_scenario(cfg: BenchConfig, workload: str, policies: tuple[str, ...]) -> Scenario:
    from jaxroute.experiments.cluster import policy_rows, run_cluster

    rate = cfg.rate_of(workload)
    rows = policy_rows(list(policies), rate=rate)

    def run(seeds: int, requests: int, seed: int) -> RunOut:
        wl = cluster_workload(workload, requests)
        res = run_cluster(rows, wl, replicas_n=cfg.replicas, seeds=seeds, seed=seed, progress=cfg.progress)
        return RunOut(res, wl, float(len(rows) * seeds * requests), bool(res.grid.overflow.any()),
                      {"conserved": _conserved(res)})

    name = f"cluster/{workload}" + ("" if tuple(policies) == tuple(cfg.policies) else f"/{'+'.join(policies)}")
    info = {"workload": workload, "policies": list(policies), "rate": rate, "replicas": cfg.replicas,
            "requests_per_seed": cfg.cluster_requests, "gpu": REPLICA_GPU, "model": REPLICA_MODEL}
    return Scenario(name, "cluster", len(rows), cfg.cluster_requests, run, info)


def cluster_reference(cfg: BenchConfig, workload: str, policies: tuple[str, ...]) -> dict:
    """The radix-tree reference on `ref_requests` requests of the same workload, with one of the grid's
    routers (rr when the grid has it, else its first)."""
    from jaxroute.clusters import replicas

    policy = "rr" if "rr" in policies else policies[0]
    params = replicas.make_params(policy, rate=cfg.rate_of(workload))
    wl = cluster_workload(workload, cfg.ref_requests)
    return references.time_replica_reference(
        wl, params, replicas=cfg.replicas, max_running=replicas.ReplicaModel.max_running,
        max_queue=replicas.default_max_queue(cfg.ref_requests, cfg.replicas), policy=policy)


# --------------------------------------------------------------------------- decode DP


@functools.lru_cache(maxsize=8)
def decode_requests(requests: int, output_cap: int | None):
    from jaxroute.workloads.decode import clip_outputs, make_decode_requests

    return clip_outputs(make_decode_requests(DECODE_WORKLOAD, requests, seed=0), output_cap)


def decode_scenario(cfg: BenchConfig) -> Scenario:
    from jaxroute.clusters import dp_decode as dd
    from jaxroute.experiments.decode import Deployment, rows_for, run_comparison

    dep = Deployment()
    rows = rows_for(["br0", "brh"], ["oracle"])

    def run(seeds: int, requests: int, seed: int) -> RunOut:
        req = decode_requests(requests, cfg.decode_output_cap)
        res = run_comparison(req, rows, workers=DECODE_WORKERS, seeds=seeds, dep=dep, seed=seed,
                             progress="decode" if cfg.progress else False)
        m = res.metrics
        tokens = float(np.sum(np.asarray(m["throughput_tok_s"], np.float64) * np.asarray(m["makespan_s"], np.float64)))
        wl = dd.make_workload(req, cost_models.cost_params(dep.gpu, dep.model, dep.tp), dep.collective_s)
        return RunOut(res, wl, float(np.sum(m["completed"])), bool(res.grid.overflow.any()),
                      {"conserved": _conserved(res), "tokens_simulated": tokens,
                       "barrier_steps_simulated": float(np.sum(m["steps"]))})

    info = {"policies": ["br0", "brh[oracle]"], "workers": DECODE_WORKERS, "workload": DECODE_WORKLOAD,
            "arrival": "saturated", "requests_per_seed": cfg.decode_requests, "output_cap": cfg.decode_output_cap,
            "gpu": dep.gpu, "model": dep.model, "slots": dep.slots, "pool": dep.pool, "window": dep.window,
            "horizon": dep.horizon, "r_max": dep.r_max,
            "requests_are": "completed requests (tokens_per_s: output tokens)"}
    return Scenario("decode", "decode", len(rows), cfg.decode_requests, run, info)


def decode_reference(cfg: BenchConfig) -> dict:
    """The step-by-step reference on the first `ref_decode_requests` requests, BR-0, stopped after
    `ref_decode_steps` barrier steps; compared in output tokens per second."""
    from jaxroute.clusters import dp_decode as dd
    from jaxroute.experiments.decode import Deployment

    dep = Deployment()
    full = decode_requests(cfg.decode_requests, cfg.decode_output_cap)
    n = min(cfg.ref_decode_requests, len(full))
    req = dataclasses.replace(full, **{k: getattr(full, k)[:n] for k in  # the first n of the same workload
                                       ("arrival_s", "prompt_tokens", "output_tokens", "key_id")})
    return references.time_decode_reference(
        req, cost_models.cost_params(dep.gpu, dep.model, dep.tp), workers=DECODE_WORKERS, slots=dep.slots,
        pool=dep.pool, window=dep.window, horizon=dep.horizon, r_max=dep.r_max,
        kv_capacity=cost_models.kv_capacity_tokens(dep.gpu, dep.model, dep.tp), collective_s=dd.DEFAULT_COLLECTIVE_S,
        max_steps=cfg.ref_decode_steps, policy="br0", mean_output=float(np.mean(full.output_tokens)))
