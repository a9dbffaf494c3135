"""Every cluster model passes the shared smoke check (tests/smoke.py) on a small case."""

import jax
import numpy as np
from smoke import check_model

from jaxroute import cost_models
from jaxroute.clusters import bins, dp_decode, queueing
from jaxroute.routers import balance, classic
from jaxroute.workloads.decode import DecodeRequests


def test_dispatch_smoke():
    model = queueing.DispatchModel(n_servers=4, n_requests=101, warmup=10, ring=32, max_d=3, tail_levels=2)
    rows = [queueing.make_params(p, 0.8, service="pareto", stale=0.5 if p == "jsq" else 0.0, d=3)
            for p in classic.POLICY_NAMES]
    check_model(model, None, rows, chunk=4)  # 13 blocks in 4 chunks (the batch of one runs the whole scan)


def test_bins_smoke():
    check_model(bins.BinsModel(n=64, max_d=3), None, [bins.make_params(d) for d in (1, 2, 3)], chunk=20)


def test_decode_smoke():
    rng = np.random.default_rng(0)
    n, g = 16, 2
    req = DecodeRequests("smoke", np.zeros(n), rng.integers(5, 200, n), rng.integers(1, 9, n), np.full(n, -1))
    wl = dp_decode.make_workload(req, cost_models.cost_params("H200", "Llama-3-8B", 1))
    model = dp_decode.DecodeModel(n_workers=g, n_requests=n, max_steps=120, slots=2, pool=4, window=2, horizon=3,
                                  r_max=2, trace_points=4)
    rows = [dp_decode.make_params(p, n_workers=g) for p in balance.POLICIES]
    grid = check_model(model, wl, rows)
    assert (grid.metrics["completed"] == n).all()


def test_replica_smoke():
    from jaxroute.clusters import replicas
    from jaxroute.routers.prefix import PREFIX_POLICIES
    from jaxroute.workloads import prefix

    wl = prefix.synthetic("toolbench", 60)
    model = replicas.ReplicaModel(n_replicas=2, max_queue=64, router_window=64)
    rows = [replicas.make_params(p, rate=20.0) for p in PREFIX_POLICIES]  # every preset
    rows += [replicas.make_params("threshold", rate=20.0, theta=th) for th in (0.1, 0.9)]  # a traced sweep
    check_model(model, wl, rows, chunk=400, key=jax.random.key(1))
