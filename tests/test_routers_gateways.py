"""SGLang gateway, vLLM production-stack and AIBrix routers: exact match with their references
(tests/reference_gateways.py) on small cases, and hand-built checks of the rules that could fail."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxroute.routers import aibrix, prefix, sglang, vllm_stack
from jaxroute.routers.view import Request, RouterStatic, RouterView
from jaxroute.workloads import prefix as W
from tests import reference_gateways as refg
from tests.test_replicas import CASES, _compare

GATEWAYS = ("random", "sglang_cache_aware_rs", "sglang_gateway", "sglang_power_of_two", "vllm_prefixaware",
            "vllm_session", "vllm_kvaware", "aibrix_prefix_cache", "aibrix_least_request")


@pytest.mark.parametrize("policy", GATEWAYS)
def test_matches_reference(policy):
    _compare("toolbench", policy)
    _compare("agent", policy, stale=2.0)


@pytest.mark.parametrize("policy", ("sglang_cache_aware", "vllm_kvaware", "aibrix_prefix_cache"))
def test_matches_reference_agent_fresh(policy):
    _compare("agent", policy)


def test_sglang_pruning_and_miss_rule_match_reference():
    """Size pruning every 2 s to 1,500 tokens (it evicts), and the least-load miss rule."""
    _compare("toolbench", "sglang_cache_aware_rs", router=dict(sgl_evict_interval_s=0.5, sgl_max_tree_tokens=1500.0))
    _compare("agent", "sglang_cache_aware", router=dict(sgl_miss_rule="least_load", sgl_evict_interval_s=1.0,
                                                        sgl_max_tree_tokens=800.0))


def test_vllm_options_match_reference():
    _compare("toolbench", "vllm_prefixaware", router=dict(vllm_prefix_min_match=1000.0, vllm_qps_window_s=0.5))
    _compare("agent", "vllm_kvaware", router=dict(vllm_kv_threshold=50.0, vllm_kv_chunk_tokens=16.0))
    _compare("toolbench", "aibrix_prefix_cache", router=dict(aibrix_imbalance_abs=1.0, aibrix_block_tokens=64,
                                                             aibrix_ttl_s=0.5))


# ----------------------------------------------------------------------------- hand-built rules


def _view(G, M=8, inflight=None, kv=None, cached_match=None, arrival=None):
    f = lambda x: jnp.asarray(x, jnp.float32)
    table = W.RequestTable(arrival_s=f(arrival if arrival is not None else [0.0]), seg_ids=jnp.zeros((1, 2), jnp.int32),
                           seg_tok=jnp.zeros((1, 2), jnp.int32), out_tok=jnp.ones(1, jnp.int32),
                           out_seg=jnp.full(1, M, jnp.int32), seg_len=jnp.full(M + 1, 100, jnp.int32).at[M].set(0),
                           seg_depth=jnp.arange(M + 1, dtype=jnp.int32), prompt_tok=jnp.zeros(1, jnp.int32),
                           session=jnp.full(1, -1, jnp.int32))
    z = jnp.zeros((G,), jnp.float32)
    return RouterView(now=jnp.float32(0), inflight=f(inflight) if inflight is not None else z, tokens=z,
                        record=jnp.zeros((G, M + 1), bool), locked=jnp.zeros((G, M + 1), bool), match_tokens=z,
                        cached=jnp.zeros((G, M + 1), bool),
                        cached_match=f(cached_match) if cached_match is not None else z, waiting=z, running=z,
                        kv_usage=f(kv) if kv is not None else z, kv_capacity=jnp.int32(1000), cost=None, table=table)


def _req(segs, tok, session=-1, M=8):
    segs = jnp.asarray(segs, jnp.int32)
    tok = jnp.asarray(tok, jnp.int32)
    return Request(jnp.int32(0), segs, tok, jnp.sum(tok), jnp.int32(1), jnp.int32(M), jnp.int32(session))


def test_hash_ring_matches_bisect_reference_and_is_sticky():
    for G in (1, 2, 3, 5):
        ring = refg.HashRing(G)
        for sess in (0, 1, 7, 123, 99991, 2**31 - 1):
            assert int(vllm_stack.hash_ring(jnp.int32(sess), G)) == ring.get(sess)
    # balanced in expectation: every replica owns some of 300 sessions
    owners = {refg.HashRing(4).get(s) for s in range(300)}
    assert owners == {0, 1, 2, 3}


def test_qps_routing_unseen_first_then_lowest_count_and_window_expiry():
    st = vllm_stack.init(RouterStatic(3, 9))
    p = vllm_stack.make_params(vllm_qps_window_s=10.0)
    view = _view(3, arrival=[0.0, 1.0, 20.0])
    req = _req([0], [100])
    for t, g in ((0.0, 0), (1.0, 0)):
        st = vllm_stack.on_dispatch(st, dataclasses.replace(view, now=jnp.float32(t)), req, jnp.int32(g),
                                    jnp.bool_(True), p)
    assert int(vllm_stack.qps_routing(st)) == 1  # replicas 1, 2 have no stats: the first of them
    st = dataclasses.replace(st, ever=jnp.ones(3, bool), count=jnp.asarray([2, 1, 1], jnp.int32))
    assert int(vllm_stack.qps_routing(st)) == 1  # lowest count, ties -> first
    # at t = 11 the dispatch at t = 0 is older than the window (0 < 11 - 10), the one at t = 1 is not
    st2 = vllm_stack.on_refresh(st, dataclasses.replace(view, now=jnp.float32(11.0)), jnp.bool_(True), p)
    assert int(st2.head) == 1 and st2.count.tolist() == [1, 1, 1]
    st3 = vllm_stack.on_refresh(st, dataclasses.replace(view, now=jnp.float32(11.0)), jnp.bool_(False), p)
    assert int(st3.head) == 0  # inactive: untouched


def test_kvaware_threshold_edge():
    st = vllm_stack.init(RouterStatic(2, 9))
    p = vllm_stack.make_params(vllm_kv_threshold=2000.0, vllm_kv_chunk_tokens=256.0)
    req = _req([0, 1], [2000, 2512])  # prompt 4512: needs matched >= 2512
    hit = int(vllm_stack.kvaware(st, _view(2, cached_match=[0, 2560]), req, p, jax.random.key(0)))
    assert hit == 1  # 2560 = 10 chunks >= 2512
    st = dataclasses.replace(st, ever=jnp.asarray([True, True]), count=jnp.asarray([5, 3], jnp.int32))
    miss = int(vllm_stack.kvaware(st, _view(2, cached_match=[0, 2511]), req, p, jax.random.key(0)))
    assert miss == 1  # 2304 matched < 2512 -> QPS fallback: replica 1 has the lower count
    st = dataclasses.replace(st, count=jnp.asarray([1, 3], jnp.int32))
    assert int(vllm_stack.kvaware(st, _view(2, cached_match=[0, 2511]), req, p, jax.random.key(0))) == 0


def test_prefixaware_random_among_equal_chunks():
    st = vllm_stack.init(RouterStatic(3, 9))
    st = dataclasses.replace(st, tree=st.tree.at[0, 0].set(True).at[2, 0].set(True).at[2, 1].set(True))
    p = vllm_stack.make_params(vllm_chunk_tokens=64.0)
    req = _req([0, 1], [100, 20])  # replica 0 matches 100 tokens (1 chunk), replica 2 120 (1 chunk): a tie
    picks = {int(vllm_stack.prefixaware(st, _view(3), req, p, jax.random.key(k))) for k in range(40)}
    assert picks == {0, 2}


def test_power_of_two_two_distinct_and_lighter():
    p = None
    for k in range(30):
        g = int(sglang.power_of_two(_view(3, kv=[0.9, 0.1, 0.5]), _req([0], [10]), p, jax.random.key(k)))
        assert g != 0  # the heaviest replica never wins: it is drawn with a lighter one
    assert {int(sglang.power_of_two(_view(2, kv=[0.3, 0.3]), _req([0], [10]), p, jax.random.key(k)))
            for k in range(30)} == {0, 1}  # a tie goes to the first draw, which is uniform


def test_aibrix_rule_edges():
    G = 4
    st = aibrix.init(RouterStatic(G, 9))
    p = aibrix.make_params()
    view = _view(G, inflight=[0, 9, 1, 1])
    req = _req([0, 1], [100, 100])
    # replica 1 holds the whole prompt, replica 2 half of it; spread 9 > 8 -> only replica 0 may match
    for g, segs in ((1, [0, 1]), (2, [0])):
        st = aibrix.on_dispatch(st, view, _req(segs, [100] * len(segs)), jnp.int32(g), jnp.bool_(True), p)
    assert int(aibrix.choose(st, view, req, p, jax.random.key(0))) == 0  # least request
    # balanced (spread 8): counts [0, 8, 1, 1], mean 2.5, std ~3.7 -> bound ~6.2: replica 1 is over it
    view = _view(G, inflight=[0, 8, 1, 1])
    assert int(aibrix.choose(st, view, req, p, jax.random.key(0))) == 2
    # TTL: 20 min later the index entries have expired -> least request (replica 0)
    late = dataclasses.replace(view, now=jnp.float32(1201.0))
    assert int(aibrix.choose(st, late, req, p, jax.random.key(0))) == 0
    # a re-add after expiry forgets the other pods: replica 3 alone holds segment 0
    st = aibrix.on_dispatch(st, late, _req([0], [100]), jnp.int32(3), jnp.bool_(True), p)
    assert np.asarray(aibrix.held(st, jnp.float32(1201.0), p, jnp.arange(1)))[:, 0].tolist() == [False, False, False, True]


def test_presets_registered_with_unique_settings():
    for name in GATEWAYS:
        assert name in prefix.PRESETS
    assert float(prefix.router_params("sglang_cache_aware_rs").own["sglang"].sgl_cache_threshold) == 0.5
    assert float(prefix.router_params("sglang_cache_aware").own["sglang"].sgl_evict_interval_s) == 0.0
    assert int(prefix.router_params("sglang_gateway").own["sglang"].sgl_miss_rule) == 1


def test_cases_exist():
    assert {"toolbench", "agent"} <= set(CASES)
