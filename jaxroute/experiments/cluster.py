"""Replica cluster with prefix caches: routers on the same seeds, workloads by name, capacities grown on overflow."""

from __future__ import annotations

import math

import numpy as np

from jaxroute.clusters import replicas
from jaxroute.errors import JaxrouteError
from jaxroute.experiments.comparison import Comparison, Results, Row, run_with_retry
from jaxroute.routers import preble
from jaxroute.routers.prefix import policy_id
from jaxroute.workloads import prefix as wl_prefix
from jaxroute.workloads import traces

WORKLOADS = wl_prefix.PREFIX_WORKLOADS + wl_prefix.TRACE_WORKLOADS
METRICS = replicas.METRICS
# Fixed capacities of the replica model and the bool metric that says each one overflowed.
CAPACITY_FLAGS = {"max_queue": "queue_overflow", "router_window": "e2_ring_overflow"}


def build_workload(name: str, requests: int, trace: str | None = None, hot_tool: float = 0.0):
    """A prefix workload by CLI name (synthetic, or a trace adapted to segment form)."""
    if name not in WORKLOADS:
        raise JaxrouteError(f"unknown workload '{name}'; choose from: {', '.join(WORKLOADS)}")
    if name in wl_prefix.PREFIX_WORKLOADS:
        if trace is not None:
            raise JaxrouteError(f"--trace is for mooncake / azure-conv, not the synthetic workload '{name}'")
        if hot_tool and name != "toolbench":
            raise JaxrouteError("--hot-tool applies to --workload toolbench only")
        kw = {"hot_tool_share": hot_tool} if name == "toolbench" else {}
        return wl_prefix.synthetic(name, requests, **kw)
    path = trace or wl_prefix.DEFAULT_TRACE_PATHS[name]
    if name == "mooncake":
        return wl_prefix.from_mooncake(traces.load_mooncake_jsonl(path).head(requests))
    return wl_prefix.from_azure(traces.load_azure_csv(path).head(requests))


def policy_rows(policies, *, rate=1.0, stale=0.0, kv_capacity=None, gpu="a6000", model_name="mistral-7b",
                cost_model="roofline", theta=0.5, e2_window_s=180.0, e2_th_bal=1.5) -> list[tuple]:
    """One (label, params) row per router, all with the same settings."""
    return [(p, replicas.make_params(p, rate=rate, stale_s=stale, kv_capacity=kv_capacity, gpu=gpu, model=model_name,
                                     cost_model=cost_model, theta=theta, e2_window_s=e2_window_s,
                                     e2_th_bal=e2_th_bal)) for p in policies]


def _is_e2(p: replicas.ReplicaParams) -> bool:
    return int(np.asarray(p.policy)) == policy_id("preble_e2")


def row_info(p: replicas.ReplicaParams) -> dict:
    """The JSON description of a row's params."""
    out = {"rate": float(p.rate), "theta": float(p.router.theta), "stale_s": float(p.stale_s),
           "kv_capacity": int(p.kv_capacity)}
    if _is_e2(p):
        th = float(p.router.e2_th_bal)
        out.update(e2_window_s=float(p.router.e2_window_s), e2_th_bal=th if math.isfinite(th) else None)
    return out


def initial_capacities(workload, params, n_replicas: int) -> dict[str, int]:
    """Local queue and E2 ring sizes to start from (E2's ring is 0 when no row runs preble_e2)."""
    n = workload.n_requests
    e2 = [p for p in params if _is_e2(p)]
    caps = {"max_queue": replicas.default_max_queue(n, n_replicas), "router_window": 0}
    if e2:
        rate = max(float(p.rate) for p in e2)
        window = max(float(p.router.e2_window_s) for p in e2)
        caps["router_window"] = preble.default_window(rate, window, n_replicas, n)
    return caps


def run_cluster(rows, workload, *, replicas_n=4, seeds=16, local="fcfs", chunk=512,
                max_running=64, seed=0, progress=False, label_params=None, max_tries=4,
                capacities: dict[str, int | None] | None = None) -> Results:
    """Run (label, ReplicaParams) rows on the same seeds in one compiled grid (see `policy_rows`).

    The local queue and Preble E2's ring start from `initial_capacities` and are doubled (the
    grid rerun) while one overflowed; `capacities` overrides their starting sizes (None = default;
    an E2 ring only matters when some row runs preble_e2). label_params is added to every record's params. The router
    keeps a stale view only when some row has stale_s > 0.
    """
    params = [p for _, p in rows]
    stale_view = any(float(p.stale_s) > 0 for p in params)
    for cap in {int(np.asarray(p.kv_capacity)) for p in params}:
        wl_prefix.check_fits(workload, cap)
    rows = [Row(name, p, dict(label_params or {}, **row_info(p))) for name, p in rows]
    caps = initial_capacities(workload, params, replicas_n)
    for name, size in (capacities or {}).items():
        if size is not None and (name != "router_window" or caps["router_window"] > 0):
            caps[name] = int(size)
    flags = {k: v for k, v in CAPACITY_FLAGS.items() if caps[k] > 0}

    def run(caps):
        model = replicas.ReplicaModel(
            n_replicas=replicas_n, chunk=chunk, max_running=max_running, max_queue=caps["max_queue"],
            local_order=local, stale_view=stale_view, router_window=caps["router_window"])
        return Comparison(model, rows, seeds, METRICS, workload=workload, seed=seed, chunk=1000,
                          progress="cluster" if progress else False).run()

    results, _ = run_with_retry(run, caps, flags, max_tries=max_tries)
    return results
