"""Capacity search (WIP): the M/M/1 answer for random routing, JSQ and p2c above it."""

import numpy as np

from jaxroute.experiments import capacity as cap


def test_random_routing_matches_mm1_and_jsq_beats_it():
    """Random routing to N servers with exponential service is N independent M/M/1 queues: a mean response
    SLO of T service times holds up to load 1 - 1/T per server (T = 5: 0.8)."""
    slo = cap.parse_slo("mean_response<=5")
    ev = cap.dispatch_evaluator(["random", "p2c", "jsq"], servers=8, seeds=4, requests=20_000)
    res = cap.search(ev, 3, 0.3, 1.0, slo, tol=0.02, points=6)
    c = np.nanmean(res.capacity, axis=1)
    assert np.all(np.isfinite(res.capacity))
    assert abs(c[0] - 0.8) < 0.03, c
    assert c[1] > c[0] + 0.05 and c[2] >= c[1] - 0.01, c


def test_cluster_capacity_grows_with_replicas_in_one_compilation():
    from jaxroute import sim
    from jaxroute.clusters import replicas
    from jaxroute.workloads import prefix as W

    wl = W.toolbench(120, n_tools=20, tool_mean=1500)
    rows = [("rr", 2), ("rr", 4), ("llmd_precise", 4)]
    sim.clear_compiled(replicas.ReplicaModel)
    res = cap.search(cap.cluster_evaluator(rows, wl, seeds=2), len(rows), 2.0, 80.0, cap.parse_slo("ttft_p90_s<=1"),
                     tol=0.05, points=4, max_rounds=6)
    c = np.nanmean(res.capacity, axis=1)
    assert c[1] > c[0]  # more replicas take more load
    assert sim.compile_count(replicas.ReplicaModel, "advance") == 1
    assert cap.min_replicas(res, rows, float(c[0]) * 0.5)["rr"] == 2


def test_bad_slo_is_refused():
    import pytest

    from jaxroute.errors import JaxrouteError

    with pytest.raises(JaxrouteError, match="METRIC<=VALUE"):
        cap.parse_slo("ttft<2")
    with pytest.raises(JaxrouteError, match="finite"):
        cap.parse_slo("ttft<=1e999")
    assert cap.parse_slo("a<=1, b>=2") == (cap.Bound("a", "<=", 1.0), cap.Bound("b", ">=", 2.0))


def test_an_overrun_ring_grows_and_gives_the_large_ring_answer():
    """JSQ reads queue lengths from a ring of K departures per server: with K = 16 the runs near capacity
    overrun it. Without growth those brackets are unknown; growing the ring reproduces the K = 256 answer.
    (K = 16, not smaller: the stuck and grown searches then share their first program, and growth takes one
    doubling, not four: three dispatch programs in all.)"""
    slo = cap.parse_slo("mean_response<=3")
    kw = dict(servers=4, seeds=2, requests=6000)
    big = cap.search(cap.DispatchEvaluator(["jsq"], **kw), 1, 0.3, 1.0, slo, tol=0.05, points=4)
    stuck = cap.search(cap.DispatchEvaluator(["jsq"], ring=16, max_ring=16, **kw), 1, 0.3, 1.0, slo, tol=0.05, points=4)
    ev = cap.DispatchEvaluator(["jsq"], ring=16, **kw)
    grown = cap.search(ev, 1, 0.3, 1.0, slo, tol=0.05, points=4)
    assert np.all(np.isfinite(big.capacity))
    assert stuck.overflowed.any() and np.isnan(stuck.capacity).any()
    assert ev.ring > 16 and np.array_equal(grown.capacity, big.capacity)


def test_routers_with_replica_state_get_one_model_per_count():
    from jaxroute.workloads import prefix as W

    wl = W.toolbench(100, n_tools=20, tool_mean=1500)
    rows = [("sglang_cache_aware", 2), ("sglang_cache_aware", 4), ("rr", 2)]
    ev = cap.ClusterEvaluator(rows, wl, seeds=2)
    assert set(ev.groups) == {2, 4, "partial"}
    res = cap.search(ev, len(rows), 2.0, 80.0, cap.parse_slo("ttft_p90_s<=1"), tol=0.1, points=3, max_rounds=4)
    c = np.nanmean(res.capacity, axis=1)
    assert np.all(np.isfinite(res.capacity)) and c[1] > c[0]
