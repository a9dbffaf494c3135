"""Replica cluster with prefix caches: exact match with the radix-tree reference, invariants, flags."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxroute import sim
from jaxroute.clusters import replicas as R
from jaxroute.errors import JaxrouteError
from jaxroute.routers import preble
from jaxroute.routers.prefix import modules_for
from jaxroute.workloads import prefix as W
from tests import reference_replicas as ref

# The router modules these tests' policies need (the reference's): the other modules (llm-d, Dynamo, AIBrix,
# vLLM production-stack) would only make every program larger (~30 % more compilation), as the CLI leaves them out.
_model = functools.partial(R.ReplicaModel, router_modules=modules_for(ref.POLICIES))

# Small workloads with tight KV capacities: admission waits for memory and the LRU evicts.
CASES = {
    "toolbench": (lambda: W.toolbench(60, n_tools=8, tool_mean=1500), 6000, 30.0),
    "agent": (lambda: W.agent(60, n_envs=4, turns=3, think_s=0.5), 8000, 8.0),
    "programming": (lambda: W.programming(48, n_problems=20, problem_mean=1500, samples=4), 9000, 10.0),
    # 6 fixed prompts recur: fully cached prompts (the last token is recomputed for the first token)
    "shared-prefix": (lambda: W.shared_prefix(60, groups=2, prompts_per_group=3, system_tokens=600,
                                              question_tokens=200, output_tokens=30), 3000, 40.0),
}


def _compare(case, policy, G=3, B=8, Q=64, local="fcfs", stale=0.0, leap=32, key=1, theta=0.5, e2_ring=64,
             router=None, admission="reserve", slots=0, workload=None, cap=None, groups=10, max_admit=4):
    """Run the jitted model and the radix-tree reference on one case; assert they agree request by request.
    slots: cache table slots per replica (0 = one per segment id, "bound" = `slot_bound` of the case)."""
    make, case_cap, rate = CASES[case]
    wl = make() if workload is None else workload
    cap = case_cap if cap is None else cap
    if slots == "bound":
        slots = R.slot_bound(wl.segment_lengths(), cap)
    model = _model(n_replicas=G, max_running=B, max_queue=Q, local_order=local, stale_view=stale > 0,
                           leap=leap, router_window=e2_ring if policy in ref.PREBLE else 0, admission=admission,
                           cache_slots=slots, priority_groups=groups, max_admit=max_admit,
                           router_modules=modules_for((*ref.POLICIES, policy)))  # the gateway tests' routers too
    p = R.make_params(policy, rate=rate, kv_capacity=cap, stale_s=stale, theta=theta, **(router or {}))
    st = R.run_single(model, jax.random.key(key), wl, p)
    got = R.records(st)
    want, violations = ref.simulate(st.req, G=G, cap=cap, policy=policy, cost=p.cost, B=B, Q=Q, local=local,
                                    stale=stale, router={"theta": theta, **(router or {})},
                                    router_key=jax.random.key(key), admission=admission, priority_groups=groups,
                                    max_admit=max_admit)
    assert violations == []
    np.testing.assert_array_equal(got["replica"], want["replica"])
    np.testing.assert_array_equal(got["cached_tokens"], want["cached"])
    np.testing.assert_array_equal(got["preemptions"], want["preempted"])
    for a, b in (("admit_s", "admit"), ("first_token_s", "first"), ("finish_s", "finish")):
        np.testing.assert_allclose(got[a], want[b], rtol=1e-6)
    m = model.metrics(st, wl, p)
    assert bool(m["overflow"]) == want["overflow"] == bool(m["queue_overflow"])
    assert not bool(m["cache_full"])
    assert not bool(m["e2_ring_overflow"])
    assert bool(m["running_full"]) == want["running_full"]
    assert int(m["conservation_error"]) == 0
    prompt = got["prompt_tokens"]
    np.testing.assert_allclose(float(m["hit_rate"]), want["cached"].sum() / prompt.sum(), rtol=1e-5)
    assert int(m["preemptions"]) == want["preemptions"]
    for k in ("output_tokens_per_s", "ttft_p90_s", "queue_mean", "kv_usage_mean"):  # float sums: tolerance
        np.testing.assert_allclose(float(m[k]), want["metrics"][k], rtol=1e-4, err_msg=k)
    if policy in ref.PREBLE:  # Preble's decision counts and mean cost terms
        st_ = want["stats"]
        assert int(m["e2_decisions"]) == len(prompt)
        for k, r in (("e2_exploits", "e2_exploit"), ("e2_rebalanced", "e2_rebalanced"), ("e2_paired", "e2_paired"),
                     ("e2_autoscaled", "e2_autoscaled")):
            assert int(m[k]) == st_.get(r, 0), k
        for k in ("e2_mean_L_s", "e2_mean_M_s", "e2_mean_P_s"):
            np.testing.assert_allclose(float(m[k]), st_[k], rtol=1e-4, atol=1e-9, err_msg=k)
    return dict(want["stats"], preemptions=want["preemptions"]), m


@pytest.mark.parametrize("policy", ref.POLICIES)
def test_matches_reference_toolbench_under_memory_pressure(policy):
    stats, _ = _compare("toolbench", policy)
    assert stats["evicted"] > 0  # the LRU was exercised
    assert stats["blocked_by_memory"] > 0  # admission waited for memory


def test_preble_e2_matches_reference_on_every_path():
    """E2's exploit, explore, rebalancing and a nonzero eviction cost all occur, and match the reference."""
    stats, m = _compare("toolbench", "preble_e2")
    assert min(stats["e2_exploit"], stats["e2_explore"], stats["e2_rebalanced"], stats["e2_evict_cost"]) > 0
    assert not bool(m["overflow"])
    stats, _ = _compare("programming", "preble_e2", local="lpm")
    assert stats["e2_rebalanced"] > 0
    _compare("agent", "preble_e2", stale=2.0)


def test_preble_pairing_and_autoscaling_match_reference():
    """The full preset (pairing + autoscaling) with priority groups, request by request equal to the
    reference; the rules fire (a window short enough for the overload detector to see TTFTs double)."""
    stats, m = _compare("toolbench", "preble", local="priority", router={"e2_overload_window_s": 4.0, "e2_pair_hit": 0.5})
    assert stats.get("e2_paired", 0) > 0 and stats.get("e2_autoscaled", 0) > 0
    stats, _ = _compare("programming", "preble", router={"e2_pair_hit": 0.3})
    assert stats.get("e2_paired", 0) > 0


def test_preble_e2_rule_on_hand_built_costs():
    f = lambda x: jnp.asarray(x, jnp.float32)
    no_rebalance = preble.make_params(e2_th_bal=float("inf"))

    def route(match, load, extra, p=no_rebalance):
        return int(preble.rule(f(load), f(extra), f(match), f(1000.0), p)[0])

    # cached 600 > missed 400: exploit -> cheapest of the holders (2), not the cheapest overall (1)
    assert route([600, 0, 600], [5.0, 1.0, 4.0], [0, 0, 0]) == 2
    # cached 400 <= missed 600: explore -> cheapest overall
    assert route([400, 0, 400], [5.0, 1.0, 4.0], [0, 0, 0]) == 1
    assert route([500, 0, 500], [5.0, 1.0, 4.0], [0, 0, 0]) == 1  # a tie explores
    # M + P count: replica 1's eviction + prefill cost makes replica 2 cheaper
    assert route([400, 0, 400], [5.0, 1.0, 4.0], [0, 3.5, 0]) == 2
    # rebalancing: the exploited replica's L (4) > 1.5 x the lightest's (1) -> the lightest
    assert route([600, 0, 600], [5.0, 1.0, 4.0], [0, 0, 0], preble.make_params(e2_th_bal=1.5)) == 1
    assert route([600, 0, 600], [5.0, 1.0, 4.0], [0, 0, 0], preble.make_params(e2_th_bal=5.0)) == 2


def test_preble_e2_rebalancing_moves_a_hot_prefix():
    """A hot tool (60 % of traffic): without rebalancing E2 keeps exploiting the one replica that holds it;
    with Th_bal = 1.5 the hot tool's requests are sent to other replicas too (its prefix gets replicated)."""
    wl = W.toolbench(120, n_tools=20, tool_mean=1500, hot_tool_share=0.6)
    model = _model(n_replicas=4, max_queue=120, router_window=120)
    spread, share = {}, {}
    for th in (float("inf"), 1.5):
        p = R.make_params("preble_e2", rate=40.0, kv_capacity=60_000, e2_th_bal=th)
        st = R.run_single(model, jax.random.key(0), wl, p)
        rec = R.records(st)
        ids = np.asarray(st.req.seg_ids)
        hot = np.bincount(ids[:, 1]).argmax()  # the hot tool's segment (second in every prompt)
        spread[th] = len(set(rec["replica"][ids[:, 1] == hot]))
        met = model.metrics(st, wl, p)
        share[th] = float(met["max_replica_share"])
        assert not bool(met["overflow"]) and int(met["conservation_error"]) == 0
    assert spread[float("inf")] == 1
    assert spread[1.5] >= 3
    assert share[1.5] < share[float("inf")]


@pytest.mark.parametrize("policy", ["rr", "least_load", "threshold", "sglang_cache_aware"])
def test_matches_reference_multi_turn_agent(policy):
    stats, m = _compare("agent", policy)
    assert stats["evicted"] > 0


@pytest.mark.parametrize("policy", ["least_tokens", "affinity", "cache_guard"])
def test_matches_reference_parallel_samples(policy):
    _compare("programming", policy)


def test_priority_groups_match_reference():
    """Preble's priority groups: the group cursor, the quota ((group + 1) x 10, binding with max_admit 16)
    and the leap all agree with the reference; with and without preemption."""
    _compare("toolbench", "affinity", local="priority")
    _compare("toolbench", "least_load", local="priority", groups=3, max_admit=16)
    stats, _ = _compare("toolbench", "affinity", local="priority", admission="on-demand")
    assert stats["preemptions"] > 0
    make, cap, rate = CASES["toolbench"]
    wl, p = make(), R.make_params("affinity", rate=rate, kv_capacity=cap)
    runs = {order: R.run_single(_model(n_replicas=3, max_running=8, max_queue=64, local_order=order),
                                jax.random.key(1), wl, p) for order in ("fcfs", "priority")}
    assert len(set(np.asarray(runs["priority"].rec_group).tolist())) >= 3  # the groups are used
    assert not np.array_equal(R.records(runs["fcfs"])["admit_s"], R.records(runs["priority"])["admit_s"])


def test_priority_group_of_a_request():
    from jaxroute.clusters.replicas.iteration import priority_group
    g = lambda hit, n, P=10: int(priority_group(jnp.int32(hit), jnp.int32(n), P))
    assert g(63, 100) == 6  # the lecture's exercise 5
    assert g(0, 100) == 0 and g(1, 100) == 0 and g(10, 100) == 0 and g(11, 100) == 1
    assert g(100, 100) == 9 and g(99, 100) == 9 and g(60, 100) == 5  # ceil(6) - 1: Preble's code
    assert g(63, 100, P=1) == 0


def test_matches_reference_lpm_and_stale_view():
    _compare("toolbench", "threshold", local="lpm")
    _compare("agent", "cache_guard", stale=2.0)
    _compare("toolbench", "sglang_cache_aware", stale=0.5, local="lpm")


def test_event_leaping_changes_nothing():
    make, cap, rate = CASES["agent"]
    wl = make()
    p = R.make_params("threshold", rate=rate, kv_capacity=cap)
    a = R.records(R.run_single(_model(n_replicas=3, leap=0), jax.random.key(3), wl, p))
    b = R.records(R.run_single(_model(n_replicas=3, leap=32), jax.random.key(3), wl, p))
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-6)


@pytest.mark.parametrize("case, policy, local", [("toolbench", "rr", "fcfs"), ("toolbench", "affinity", "fcfs"),
                                                 ("toolbench", "least_load", "lpm"),
                                                 ("programming", "least_tokens", "fcfs")])
def test_on_demand_matches_reference_with_preemptions(case, policy, local):
    """vLLM V1 admission (KV on demand, preempt the last admitted, recompute): request by request equal
    to the reference, under enough memory pressure that requests are preempted."""
    stats, m = _compare(case, policy, local=local, admission="on-demand")
    assert stats["preemptions"] > 0  # the reference preempted (and the model counted as many)
    assert 0 < float(m["kv_usage_mean"]) <= 1 and float(m["queue_mean"]) > 0
    assert not bool(m["overflow"])


def test_on_demand_leaping_is_exact():
    """Leaped iterations take their KV from free memory only, so leaping changes no event (leap=0 vs 32)."""
    stats, _ = _compare("toolbench", "least_load", leap=0, admission="on-demand")
    assert stats["preemptions"] > 0


def test_reserve_never_preempts():
    stats, m = _compare("toolbench", "least_load")
    assert stats["blocked_by_memory"] > 0  # memory was short ...
    assert stats["preemptions"] == 0 and int(m["preemptions"]) == 0  # ... and admission waited instead


def test_admission_mode_is_checked():
    with pytest.raises(JaxrouteError, match="unknown admission 'eager'; choose from: reserve, on-demand"):
        _model(admission="eager")


def _parents(req) -> np.ndarray:
    """Parent segment of every segment id (-1 for roots), from the prompts."""
    ids, tok = np.asarray(req.seg_ids), np.asarray(req.seg_tok)
    parent = np.full(len(np.asarray(req.seg_len)), -2)
    for row, t in zip(ids, tok, strict=True):
        prev = -1
        for s, n in zip(row, t, strict=True):
            if n == 0:
                break
            assert parent[s] in (-2, prev), "a segment id with two parents"
            parent[s] = prev
            prev = s
    out_seg, last = np.asarray(req.out_seg), [row[t > 0][-1] for row, t in zip(ids, tok, strict=True)]
    for o, lst in zip(out_seg, last, strict=True):
        if o < len(parent) - 1:
            parent[o] = lst
    return parent


def test_cache_invariants_during_a_run():
    """Cached tokens + private tokens never exceed capacity; every cached segment's parent is cached."""
    make, cap, rate = CASES["agent"]
    wl = make()
    model = _model(n_replicas=2, max_running=8, max_queue=64)
    p = R.make_params("rr", rate=rate, kv_capacity=cap)
    state = model.init(jax.random.key(5), wl, p)
    parent = _parents(state.req)
    step = jax.jit(lambda s: sim.scan_steps(model, s, wl, p, 25))
    seg_len = np.asarray(state.req.seg_len)
    for _ in range(40):
        state = step(state)
        cached = np.asarray(R.cached_mask(state.cache_index, state.rep.slot_seg))
        used = (cached * seg_len).sum(1) + np.asarray(state.rep.run_res).sum(1)
        assert (used <= cap).all()
        for g in range(cached.shape[0]):
            for s in np.nonzero(cached[g])[0]:
                assert parent[s] == -1 or cached[g, parent[s]], f"segment {s} cached without its parent"
        np.testing.assert_array_equal(np.asarray(state.copies), cached.sum(0))
        assert int(model.metrics(state, wl, p)["conservation_error"]) == 0
    assert bool(model.is_done(state))


def test_overflow_flags():
    make, cap, rate = CASES["toolbench"]
    wl = make()
    p = R.make_params("affinity", rate=rate, kv_capacity=50_000)
    m = _model(n_replicas=2, max_running=2, max_queue=64)
    met = m.metrics(R.run_single(m, jax.random.key(0), wl, p), wl, p)
    assert bool(met["running_full"]) and not bool(met["overflow"])  # a modeled limit, not an overflow
    m = _model(n_replicas=2, max_running=64, max_queue=2)
    st = R.run_single(m, jax.random.key(0), wl, p)
    met = m.metrics(st, wl, p)
    assert bool(met["overflow"])  # a local queue was full
    m = _model(n_replicas=2, max_running=64, max_queue=64)
    met = m.metrics(R.run_single(m, jax.random.key(0), wl, p), wl, p)
    assert not bool(met["overflow"]) and int(met["conservation_error"]) == 0


def test_incomplete_run_is_flagged():
    make, cap, rate = CASES["toolbench"]
    wl = make()
    model = _model(n_replicas=2)
    p = R.make_params("rr", rate=rate, kv_capacity=cap)
    state = jax.jit(lambda: sim.scan_steps(model, model.init(jax.random.key(0), wl, p), wl, p, 30))()
    m = model.metrics(state, wl, p)
    assert bool(m["overflow"]) and int(m["conservation_error"]) == 0


def test_policies_behave_as_described():
    """Pure affinity herds on the shared system prompt; load-only routers replicate the cache."""
    wl = W.toolbench(150, n_tools=30, tool_mean=1500, sys_tokens=13)
    model = _model(n_replicas=4, max_queue=150)
    res = {}
    for pol in ("rr", "affinity", "threshold"):
        p = R.make_params(pol, rate=20.0, kv_capacity=30_000)
        res[pol] = model.metrics(R.run_single(model, jax.random.key(0), wl, p), wl, p)
    assert float(res["affinity"]["max_replica_share"]) == 1.0
    assert float(res["rr"]["replication_factor"]) > 1.2
    assert float(res["threshold"]["hit_rate"]) > float(res["rr"]["hit_rate"])


def test_bad_input():
    with pytest.raises(JaxrouteError, match="unknown .*policy"):
        R.make_params("jsq")
    with pytest.raises(JaxrouteError, match="staleness"):
        R.make_params("rr", stale_s=-1)
    with pytest.raises(JaxrouteError, match="E2 window"):
        R.make_params("preble_e2", e2_window_s=0)
    with pytest.raises(JaxrouteError, match="rebalancing threshold"):
        R.make_params("preble_e2", e2_th_bal=0.5)
    with pytest.raises(JaxrouteError, match="pairing hit ratio"):
        R.make_params("preble", e2_pair_hit=1.5)
    with pytest.raises(JaxrouteError, match="pairing window"):
        R.make_params("preble", e2_pair_window_s=0)
    with pytest.raises(JaxrouteError, match="overload detector"):
        R.make_params("preble", e2_overload_window_s=-1)
    with pytest.raises(JaxrouteError, match="priority groups"):
        _model(local_order="priority", priority_groups=0)
    with pytest.raises(JaxrouteError, match="router_window"):
        _model(router_window=-1)
    with pytest.raises(JaxrouteError, match="local order"):
        _model(local_order="lifo")
    with pytest.raises(JaxrouteError, match=">= 1"):
        _model(n_replicas=0)
    with pytest.raises(JaxrouteError, match="holds only"):
        W.check_fits(W.longdoc(10), 10_000)


def test_records_are_consistent():
    make, cap, rate = CASES["programming"]
    wl = make()
    model = _model(n_replicas=3)
    p = R.make_params("cache_guard", rate=rate, kv_capacity=cap)
    rec = R.records(R.run_single(model, jax.random.key(2), wl, p))
    assert (rec["arrival_s"] <= rec["admit_s"]).all()
    assert (rec["admit_s"] < rec["first_token_s"]).all()
    assert (rec["first_token_s"] <= rec["finish_s"]).all()
    assert ((rec["replica"] >= 0) & (rec["replica"] < 3)).all()
    assert ((rec["cached_tokens"] >= 0) & (rec["cached_tokens"] < rec["prompt_tokens"] + 1)).all()
    # parallel samples share their problem: most samples after the first find it cached
    assert (rec["cached_tokens"] > 0).mean() > 0.5


def test_params_are_vmappable_pytrees():
    p = R.make_params("threshold", theta=0.3)
    leaves = jax.tree.leaves(p)
    assert all(isinstance(x, jax.Array) for x in leaves)
    q = dataclasses.replace(p, router=dataclasses.replace(p.router, theta=jnp.float32(0.7)))
    stacked = sim.stack_params([p, q])
    assert stacked.router.theta.shape == (2,)


def test_preble_e2_window_expiry_matches_reference():
    """A short window: entries leave the incremental window sums and hit counts during the run."""
    stats, m = _compare("toolbench", "preble_e2", router={"e2_window_s": 0.4})
    assert min(stats["e2_exploit"], stats["e2_explore"]) > 0
    assert not bool(m["e2_ring_overflow"])


def test_capacity_flags_are_separate():
    make, cap, rate = CASES["toolbench"]
    wl = make()
    p = R.make_params("preble_e2", rate=rate, kv_capacity=cap)
    model = _model(n_replicas=2, max_queue=2, router_window=2)
    met = model.metrics(R.run_single(model, jax.random.key(0), wl, p), wl, p)
    assert bool(met["queue_overflow"]) and bool(met["e2_ring_overflow"]) and bool(met["overflow"])
    q = R.make_params("rr", rate=rate, kv_capacity=cap)  # the ring is E2's: other rows are not flagged
    met = model.metrics(R.run_single(model, jax.random.key(0), wl, q), wl, q)
    assert bool(met["queue_overflow"]) and not bool(met["e2_ring_overflow"])


def test_default_capacities():
    assert R.default_max_queue(300, 4) == 300  # small runs: everything
    assert R.default_max_queue(100_000, 4) == 100_000  # 4 x 25,000, capped at n
    assert R.default_max_queue(100_000, 40) == 10_000
    assert preble.default_window(40.0, 180.0, 4, 100_000) == 7_200
    assert preble.default_window(40.0, 180.0, 4, 1_000) == 1_000
    assert preble.default_window(0.0, 180.0, 4, 5_000) == 5_000  # recorded trace times: no rate to size from
    assert preble.default_window(1.0, 1.0, 4, 5_000) == 64


def test_static_switches_refuse_traced_values_they_would_ignore():
    make, cap, rate = CASES["toolbench"]
    wl = make()
    with pytest.raises(JaxrouteError, match="router_window"):
        R.run_single(_model(n_replicas=2), jax.random.key(0), wl, R.make_params("preble_e2", rate=rate))
    rows = sim.stack_params([R.make_params(p, rate=rate) for p in ("rr", "preble_e2")])
    with pytest.raises(JaxrouteError, match="router_window"):
        sim.run_grid(_model(n_replicas=2), jax.random.key(0), wl, rows, 1)
    with pytest.raises(JaxrouteError, match="stale_view"):
        R.run_single(_model(n_replicas=2), jax.random.key(0), wl, R.make_params("rr", rate=rate, stale_s=1.0))


@pytest.mark.parametrize("slots", [40, 400])
def test_cached_mask_is_the_slots_segments(slots):
    """Either way of reading a cache whole (scatter the slots' segments when there are fewer slots than
    segments, else read the index everywhere) gives the segments the slots hold, stale index entries ignored."""
    rng = np.random.default_rng(slots)
    G, m1 = 3, 200
    slot_seg, index = np.full((G, slots), -1, np.int32), np.full((G, m1), -1, np.int32)
    for g in range(G):
        n = min(slots, 30)
        segs = rng.choice(m1, n, replace=False)
        where = rng.choice(slots, n, replace=False)
        slot_seg[g, where], index[g, segs] = segs, where
        stale = np.setdiff1d(rng.choice(m1, 40), segs)  # an evicted segment's index entry stays behind
        index[g, stale] = rng.integers(0, slots, len(stale))
    want = np.zeros((G, m1), bool)
    for g in range(G):
        want[g, slot_seg[g][slot_seg[g] >= 0]] = True
    got = np.asarray(R.cached_mask(jnp.asarray(index), jnp.asarray(slot_seg)))
    np.testing.assert_array_equal(got, want)


def test_lru_eviction_order():
    """Least recently used first, deeper first on ties, then lowest id; whole segments until the deficit;
    `value` summed over the evicted ones (Preble E2's eviction cost uses the same walk)."""
    from jaxroute.clusters import prefix_cache as C

    rng = np.random.default_rng(0)
    for _ in range(20):
        m = 30
        ev, last = rng.random(m) < 0.7, rng.integers(0, 5, m).astype(np.float32)  # many ties
        depth, seg_len, value = rng.integers(0, 3, m), rng.integers(1, 50, m), rng.random(m).astype(np.float32)
        deficit = int(rng.integers(-10, 600))
        want, freed, total = np.zeros(m, bool), 0, np.float32(0)
        for k in sorted(np.nonzero(ev)[0], key=lambda k: (last[k], -depth[k], k)):
            if freed >= deficit:
                break
            want[k], freed, total = True, freed + seg_len[k], np.float32(total + value[k])
        mask, got_freed, got_total = C.evict_lru(jnp.asarray(ev), jnp.asarray(last), jnp.asarray(depth),
                                                 jnp.asarray(seg_len), jnp.int32(deficit), jnp.asarray(value).__getitem__)
        np.testing.assert_array_equal(np.asarray(mask), want)
        assert int(got_freed) == freed and float(got_total) == total


@pytest.mark.parametrize("policy, admission", [("least_load", "reserve"), ("affinity", "on-demand")])
def test_fully_cached_prompts_still_get_a_first_token(policy, admission):
    """Repeated prompts hit the cache whole; the request then computes its last prompt token, so every
    finished request has a first token after its admission (TTFT > 0), as in the reference."""
    _compare("shared-prefix", policy, admission=admission)
    make, cap, rate = CASES["shared-prefix"]
    model = _model(n_replicas=3, max_running=8, max_queue=64, admission=admission)
    st = R.run_single(model, jax.random.key(1), make(), R.make_params(policy, rate=rate, kv_capacity=cap))
    rec = R.records(st)
    done = np.isfinite(rec["finish_s"])
    full = done & (rec["cached_tokens"] == rec["prompt_tokens"])
    assert full.sum() > 10  # the path is exercised
    first = rec["first_token_s"][done]
    assert np.all(np.isfinite(first)) and np.all(first > rec["admit_s"][done])


def test_the_batch_phase_matches_its_slice_of_the_reference():
    """A replica iteration's batch alone (`iteration._run_batch`), on random running sets: the prefill tokens
    each slot gets equal the reference's `chunk_allocation` (admission order shares the chunk), and decoding,
    completed prefills, first tokens and generated counts follow from them."""
    import types

    from jaxroute.clusters.replicas import iteration
    from jaxroute.clusters.replicas.types import Replica

    rng = np.random.default_rng(5)
    B, chunk, n = 8, 96, 40
    r = types.SimpleNamespace(prompt_tok=jnp.asarray(rng.integers(1, 300, n), jnp.int32),
                              out_tok=jnp.asarray(rng.integers(1, 20, n), jnp.int32))
    model = types.SimpleNamespace(chunk=chunk)
    params = R.make_params("rr")
    zero = {f.name: jnp.zeros((B,), jnp.int32) for f in dataclasses.fields(Replica)}
    run = jax.jit(lambda row, active: iteration._run_batch(model, row, r, jnp.float32(1.0), params, active,
                                                           jnp.float32(0.0)))
    for trial in range(30):
        running = rng.random(B) < 0.7
        rid = np.where(running, rng.choice(n, B, replace=False), -1)
        tgt = np.where(running, np.asarray(r.prompt_tok)[np.maximum(rid, 0)], 0)
        pos = np.where(rng.random(B) < 0.4, tgt, (rng.random(B) * tgt).astype(int))  # decoding or prefilling
        gen = np.where(pos == tgt, rng.integers(1, 5, B), 0)
        seq = rng.permutation(B)
        row = Replica(**dict(zero, run_req=jnp.asarray(rid, jnp.int32), run_pos=jnp.asarray(pos, jnp.int32),
                             run_gen=jnp.asarray(gen, jnp.int32), run_tgt=jnp.asarray(tgt, jnp.int32),
                             run_seq=jnp.asarray(seq, jnp.int32)))
        b = run(row, jnp.bool_(True))
        slots = [ref.Running(int(rid[k]), int(pos[k]), gen=int(gen[k]), seq=int(seq[k]), tgt=int(tgt[k]))
                 if running[k] else None for k in range(B)]
        alloc = ref.chunk_allocation(slots, chunk)
        np.testing.assert_array_equal(np.asarray(b.new_pos) - pos, alloc, err_msg=str(trial))
        decoding = running & (pos == tgt)
        done_pre = running & (pos < tgt) & (pos + alloc >= tgt)
        np.testing.assert_array_equal(np.asarray(b.decoding), decoding)
        np.testing.assert_array_equal(np.asarray(b.done_pre), done_pre)
        np.testing.assert_array_equal(np.asarray(b.first), done_pre & (gen == 0))
        np.testing.assert_array_equal(np.asarray(b.new_gen), gen + (done_pre | decoding))
        assert float(b.t_end) > 1.0 if running.any() else float(b.t_end) == 1.0
        idle = run(row, jnp.bool_(False))  # a row that does not iterate runs nothing
        np.testing.assert_array_equal(np.asarray(idle.new_pos), pos)
        assert float(idle.t_end) == 1.0
