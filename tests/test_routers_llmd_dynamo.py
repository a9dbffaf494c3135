"""llm-d scheduler presets and Dynamo's KV router: exact match with the reference, hand-built rules."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxroute.errors import JaxrouteError
from jaxroute.routers import dynamo, llmd, parts
from jaxroute.routers import prefix as routers
from jaxroute.routers.view import Request, RouterStatic, RouterView
from tests import reference_llmd_dynamo as refl
from tests.test_replicas import _compare

NAMES = ("llmd_precise", "llmd_approx", "llmd_load", "llmd_load_aware", "dynamo_kv")


# ----------------------------------------------------------------------------- exact match with the reference


@pytest.mark.parametrize("case", ["toolbench", "agent"])
def test_match_reference(case):
    for name in NAMES:
        _compare(case, name)


def test_match_reference_stale_view():
    for name in NAMES:
        _compare("agent", name, stale=2.0)


def test_match_reference_settings():
    """Non-default settings take the other paths: min-max precise scores, a small LRU index that evicts,
    Dynamo's softmax at T > 0 and a heavier prefill weight."""
    _compare("toolbench", "llmd_precise", router={"llmd_precise_minmax": True, "llmd_block_tokens": 16})
    _compare("toolbench", "llmd_precise", router={"weights": {"prefix": 1.0, "kv": 1.0}})
    _compare("toolbench", "llmd_approx", router={"llmd_lru_blocks": 40, "llmd_block_tokens": 16,
                                                 "weights": {"prefix": 3.0, "kv": 1.0, "queue": 1.0}})
    assert refl.LlmdApprox.last.stats["evicted"] > 0
    _compare("agent", "llmd_approx", router={"llmd_lru_blocks": 120, "llmd_block_tokens": 32})
    st = refl.LlmdApprox.last.stats  # no two prompts are equal in these workloads: the tail is unit-tested
    assert st["evicted"] > 0 and st["split_counts"] > 0  # a server counted past a block it had evicted
    _compare("agent", "llmd_approx", router={"llmd_max_blocks": 4, "llmd_block_tokens": 32})
    _compare("toolbench", "dynamo_kv", router={"dyn_temperature": 0.5})
    _compare("agent", "dynamo_kv", router={"dyn_overlap_weight": 4.0, "dyn_block_tokens": 64})


# ----------------------------------------------------------------------------- hand-built views


def _view(G=3, M=6, cached_match=(0.0, 0.0, 0.0), waiting=(0.0, 0.0, 0.0), kv=(0.0, 0.0, 0.0), seg_len=None,
          depth=None, cap=6400):
    f = lambda x: jnp.asarray(x, jnp.float32)
    seg_len = jnp.asarray(seg_len if seg_len is not None else [100] * M + [0], jnp.int32)
    depth = jnp.asarray(depth if depth is not None else list(range(M)) + [0], jnp.int32)
    table = type("T", (), {})()
    table.seg_len, table.seg_depth = seg_len, depth
    z = jnp.zeros((G,), jnp.float32)
    return RouterView(now=f(0.0), inflight=z, tokens=z, record=jnp.zeros((G, M + 1), bool),
                      locked=jnp.zeros((G, M + 1), bool), match_tokens=z, cached=jnp.zeros((G, M + 1), bool),
                      cached_match=f(cached_match), waiting=f(waiting), running=z, kv_usage=f(kv),
                      kv_capacity=jnp.int32(cap), cost=None, table=table)


def _req(segs, tok, rid=0, S=4, dummy=6):
    segs = list(segs) + [dummy] * (S - len(segs))
    tok = list(tok) + [0] * (S - len(tok))
    return Request(jnp.int32(rid), jnp.asarray(segs, jnp.int32), jnp.asarray(tok, jnp.int32), jnp.int32(sum(tok)),
                   jnp.int32(10), jnp.int32(dummy), jnp.int32(-1))


def test_precise_score_counts_whole_blocks_and_minmax_variant():
    p = llmd.make_params(llmd_block_tokens=64)
    # prompt 200 tokens = 3 full blocks (the tail is dropped); cached 127 -> 1 block, 192 -> 3, 0 -> 0
    v = _view(cached_match=(127.0, 192.0, 0.0))
    req = _req([0, 1], [150, 50])
    np.testing.assert_allclose(np.asarray(llmd.precise_score(v, req, p)), [1 / 3, 1.0, 0.0], rtol=1e-6)
    mm = dataclasses.replace(p, llmd_precise_minmax=jnp.bool_(True))
    np.testing.assert_allclose(np.asarray(llmd.precise_score(v, req, mm)), [0.0, 1.0, 0.0])  # min hit -> 0
    v2 = _view(cached_match=(130.0, 128.0, 0.0))  # equal hits (2 blocks each) -> 1.0; no hit -> 0
    np.testing.assert_allclose(np.asarray(llmd.precise_score(v2, req, mm)), [1.0, 1.0, 0.0])
    short = _req([0], [63])  # shorter than a block: no blocks, score 0
    assert float(jnp.max(llmd.precise_score(_view(cached_match=(63.0, 0.0, 0.0)), short, p))) == 0.0


def test_llmd_presets_pick_by_their_weights():
    """llmd_precise: 3 x prefix outweighs a longer queue; llmd_load ignores the prefix."""
    v = _view(cached_match=(192.0, 0.0, 0.0), waiting=(4.0, 0.0, 2.0), kv=(0.5, 0.5, 0.5))
    req = _req([0, 1], [150, 50])
    keys = jax.random.split(jax.random.key(0), 50)
    for name, want in (("llmd_precise", 0), ("llmd_load", 1), ("llmd_load_aware", 1)):
        p = routers.router_params(name)
        got = set(np.asarray(jax.vmap(lambda k, p=p: llmd.scheduler(v, req, p, k))(keys)).tolist())
        assert got == {want}, name


def test_load_aware_scorer_matches_the_source():
    """0.5 at an empty queue, linear to 0 at the threshold, 0 beyond (load_aware.go:87-97)."""
    got = parts.load_aware(jnp.asarray([0.0, 1.0, 64.0, 128.0, 500.0]), jnp.float32(128.0))
    np.testing.assert_allclose(np.asarray(got), [0.5, 0.5 * (1 - 1 / 128), 0.25, 0.0, 0.0], rtol=1e-6)


def _approx_state(G=3, M=6):
    return llmd.init(RouterStatic(G, M + 1))


def test_approx_index_greedy_walk_counts_holders_past_a_gap():
    """Server 1 holds only the second segment's blocks; the walk goes on through server 0, so server 1
    is counted for them (A/plugin.go:214-230); a block no server holds ends the walk."""
    p = llmd.make_params(llmd_block_tokens=100, llmd_lru_blocks=1000)
    s = _approx_state()
    s = dataclasses.replace(s, blk=s.blk.at[0, 0].set(1).at[0, 1].set(1).at[1, 1].set(1).at[2, 2].set(1))
    req = _req([0, 1, 2], [100, 100, 100])  # 3 full blocks, one per segment; segment 2 held by server 2 only
    count, total = llmd.approx_match(s, req, p)
    assert int(total) == 3
    np.testing.assert_array_equal(np.asarray(count), [2, 1, 1])
    s2 = dataclasses.replace(s, blk=s.blk.at[0, 0].set(0))  # nobody holds the first block: no match at all
    np.testing.assert_array_equal(np.asarray(llmd.approx_match(s2, req, p)[0]), [0, 0, 0])


def test_approx_index_tail_block_and_lru_order():
    """A prompt of 250 tokens (B = 100) has 2 full blocks + a tail; the tail matches only the same prompt.
    Over capacity, the least recent request's segments go first, shallower first."""
    p = llmd.make_params(llmd_block_tokens=100, llmd_lru_blocks=4)
    v = _view()
    s = _approx_state()
    a = _req([0, 1], [150, 100], rid=0)  # blocks end in seg 0 (100) and seg 1 (200); tail 200..250 in seg 1
    s = llmd.on_dispatch(s, v, a, jnp.int32(0), jnp.bool_(True), p)
    np.testing.assert_array_equal(np.asarray(s.blk[0, :2]), [1, 2])
    assert int(s.size[0]) == 3 and bool(s.tail[0, 1])
    count, total = llmd.approx_match(s, a, p)
    assert int(total) == 3 and int(count[0]) == 3
    longer = _req([0, 1, 2], [150, 100, 100], rid=1)  # 350 tokens: 3 full blocks + a tail; seg 2 unknown
    count, total = llmd.approx_match(s, longer, p)
    assert int(total) == 4 and int(count[0]) == 2
    s = llmd.on_dispatch(s, v, longer, jnp.int32(0), jnp.bool_(True), p)  # seg 2 adds 2 entries: 5 > 4
    # all three segments now carry rid 1; on that tie the shallowest (seg 0) goes first, as the source's
    # LRU holds a prompt's first block as its least recent entry
    np.testing.assert_array_equal(np.asarray(s.blk[0, :3]), [0, 2, 2])
    assert int(s.size[0]) == 4 == int(jnp.sum(s.blk[0]))


def test_dynamo_cost_counts_prefill_and_unique_active_blocks():
    p = dynamo.make_params(dyn_block_tokens=16)
    G, M = 2, 6
    s = dynamo.init(RouterStatic(G, M + 1))
    v = _view(G=2, cached_match=(32.0, 0.0))
    a = _req([0, 1], [40, 24], rid=0)  # 64 tokens = 4 full blocks: 2 end in seg 0, 2 in seg 1
    cost = dynamo.costs(s, v, a, p)
    # worker 0: prefill (64 - 2 x 16) / 16 = 2, decode 4 -> 6; worker 1: 64 / 16 = 4, + 4 -> 8
    np.testing.assert_allclose(np.asarray(cost), [6.0, 8.0])
    s = dynamo.on_dispatch(s, v, a, jnp.int32(0), jnp.bool_(True), p)
    assert int(s.active[0]) == 4 and int(s.prefill[0]) == 32
    b = _req([0, 2], [40, 24], rid=1)  # shares seg 0 (2 blocks) with the active request on worker 0
    cost = dynamo.costs(s, v, b, p)
    # worker 0: prefill (32 + 32) / 16 = 4, decode 4 active + 2 new = 6 -> 10; worker 1: 4 + 4 = 8
    np.testing.assert_allclose(np.asarray(cost), [10.0, 8.0])
    tab = type("T", (), {})()
    tab.seg_ids = jnp.asarray([[0, 1, 6, 6]], jnp.int32)
    tab.seg_tok = jnp.asarray([[40, 24, 0, 0]], jnp.int32)
    s = dynamo.on_finish(s, dataclasses.replace(v, table=tab), jnp.int32(0), jnp.asarray([0, -1]),
                         jnp.asarray([True, False]), p)
    assert int(s.active[0]) == 0 and int(s.prefill[0]) == 0 and int(jnp.sum(s.count)) == 0
    assert not bool(dynamo.flags(s)["dyn_slot_overflow"])


def test_dynamo_ties_are_random_and_softmax_follows_the_scaled_costs():
    keys = jax.random.split(jax.random.key(3), 2000)
    cost = jnp.asarray([5.0, 3.0, 3.0, 7.0])
    picks = np.asarray(jax.vmap(lambda k: dynamo.pick(cost, k, jnp.float32(0.0)))(keys))
    counts = np.bincount(picks, minlength=4)
    assert counts[0] == counts[3] == 0 and min(counts[1], counts[2]) > 800  # ties uniform, never a worse one
    hot = np.asarray(jax.vmap(lambda k: dynamo.pick(jnp.asarray([0.0, 1.0]), k, jnp.float32(1.0)))(keys))
    want = 1 / (1 + np.exp(-1.0))  # p(0) = e^0 / (e^0 + e^-(1-0)/((1-0) x 1))
    assert abs((hot == 0).mean() - want) < 0.03
    same = np.asarray(jax.vmap(lambda k: dynamo.pick(jnp.asarray([2.0, 2.0]), k, jnp.float32(0.5)))(keys))
    assert abs((same == 0).mean() - 0.5) < 0.04  # equal costs: uniform


def test_settings_are_checked():
    with pytest.raises(JaxrouteError):
        llmd.make_params(llmd_block_tokens=0)
    with pytest.raises(JaxrouteError):
        llmd.make_params(llmd_max_blocks=0)
    with pytest.raises(JaxrouteError):
        dynamo.make_params(dyn_temperature=-1.0)
    p = routers.router_params("dynamo_kv", dyn_temperature=0.3, llmd_block_tokens=32)
    assert float(p.dyn_temperature) == pytest.approx(0.3) and int(p.llmd_block_tokens) == 32
