"""Prefill/decode disaggregation: the three-stage pipeline equals its reference; a P:D sweep is one compilation."""

import dataclasses

import jax
import numpy as np
import pytest

from jaxroute import sim
from jaxroute.clusters import disagg
from jaxroute.deployment import PD
from jaxroute.errors import JaxrouteError
from jaxroute.experiments import conservation_failures, pd
from jaxroute.routers import balance
from jaxroute.workloads import prefix as W
from tests import reference_disagg as ref

DEP = dataclasses.replace(PD, gpu="H200", model="Llama-3-8B", tp=1, max_running=8, slots=3, pool=6, window=3,
                          horizon=4, r_max=2, link_gbps=10.0, link_latency_ms=0.5)
RATE = 40.0
SEEDS = 2
# (prefill router, decode router, P, D, threshold): every row runs in the same two compiled tiers (P_max 3, D_max 3)
ROWS = [pd.PDRow("rr", "jsq", 2, 2), pd.PDRow("random", "br0", 1, 3), pd.PDRow("least_load", "random", 3, 1, 1200.0),
        pd.PDRow("llmd_load", "rr", 3, 3), pd.PDRow("least_tokens", "p2c", 2, 3, 1180.0),
        pd.PDRow("affinity", "brh", 3, 2)]


def _workload():  # 6 tools of 1,000-1,300 tokens: prompts differ, and a tool's prompt recurs (cache hits)
    return W.toolbench(36, n_tools=6, tool_mean=800, output_tokens=12)


@pytest.fixture(scope="module")
def raw():
    sim.clear_compiled(disagg.PrefillStage)
    sim.clear_compiled(disagg.DecodeStage)
    out = pd.run_disaggregated(ROWS, _workload(), rate=RATE, seeds=SEEDS, dep=DEP, seed=3)
    return out


def test_a_ratio_sweep_is_one_compilation_per_tier(raw):
    for stage in (disagg.PrefillStage, disagg.DecodeStage):  # one program steps every row (a whole run, or chunks)
        assert sim.compile_count(stage, "advance") == 1, stage


@pytest.mark.parametrize("row", range(len(ROWS)))
def test_pipeline_matches_reference(raw, row):
    r = ROWS[row]
    wl = _workload()
    seed_keys = jax.random.split(jax.random.key(3), SEEDS)
    dec_key = jax.random.split(jax.random.fold_in(jax.random.key(3), 1), 1)[0]
    cost = DEP.cost()
    for s in range(SEEDS):
        table = wl.realize(seed_keys[s], np.float32(RATE))
        pol = balance.policy_id(r.decode_router)
        want = ref.simulate(
            table, n_prefill=r.n_prefill, prefill_router=r.prefill_router, cap=DEP.prefill_kv_capacity(), cost=cost,
            chunk=DEP.chunk, B=DEP.max_running, Q=wl.n_requests,
            router_key=seed_keys[s], threshold=r.threshold, bytes_per_token=float(cost.kv_bytes_per_token_gpu),
            link_bytes_per_s=np.float32(DEP.link_gbps * 1e9 / 8), latency_s=np.float32(DEP.link_latency_ms * 1e-3),
            decode_key=jax.random.fold_in(dec_key, s), n_decode=r.n_decode, decode_policy=pol, decode_width=3,
            decode_kw=dict(slots=DEP.slots, pool=DEP.pool, window=DEP.window,
                           horizon=DEP.horizon, r_max=DEP.r_max, kv_capacity=DEP.prefill_kv_capacity(),
                           max_steps=10**6, collective_s=DEP.collective_s,
                           dispatch=balance.default_dispatch(r.decode_router), block_size=DEP.block_size))
        got = {k: np.asarray(v[row, s]) for k, v in raw.items() if np.ndim(v) >= 2}
        np.testing.assert_array_equal(got["disagg"], want["disagg"])
        assert 0 < want["disagg"].sum() or r.threshold > 0
        np.testing.assert_array_equal(got["prefill_replica"], want["prefill_replica"])
        np.testing.assert_array_equal(got["decode_worker"], want["decode_worker"])
        assert want["done"].all() and int(got["completed"]) == len(want["done"])
        for mine, theirs in (("prefill_admit_s", "prefill_admit"), ("prefill_done_s", "prefill_done"),
                             ("link_start_s", "link_start"), ("delivered_s", "delivered"),
                             ("first_token_s", "first_token"), ("finish_s", "finish")):
            np.testing.assert_allclose(got[mine], want[theirs], rtol=1e-5, atol=1e-6, err_msg=f"{r.label} {mine}")
        np.testing.assert_allclose(got["imbalance_tokens"], want["imbalance_tokens"], rtol=1e-5)
        assert int(got["conservation_error"]) == 0


def test_rows_really_differ_and_threshold_keeps_short_prompts_local(raw):
    assert len({tuple(raw["decode_worker"][c, 0]) for c in range(len(ROWS))}) >= 4
    local = ~raw["disagg"][2, 0]
    assert local.any() and (~local).any()  # threshold 1200: some prompts are shorter
    assert np.all(np.asarray(raw["prompt"][2, 0])[local] < 1200)
    assert np.all(raw["prefill_replica"][2, 0][local] == -1)
    for c, r in enumerate(ROWS):  # traced counts: no request reaches a replica or rank not in use
        assert raw["prefill_replica"][c].max() < r.n_prefill
        assert raw["decode_worker"][c].max() < r.n_decode


def test_run_pd_table_and_colocated_rows():
    # the disaggregated rows are ROWS (so the two tiers are the `raw` fixture's programs), then two colocated
    rows = ROWS + [pd.PDRow("rr", "jsq", 2, 2, colocated=True), pd.PDRow("least_load", "br0", 1, 2, colocated=True)]
    res, raw = pd.run_pd(rows, _workload(), rate=RATE, seeds=SEEDS, dep=DEP, slo_ttft=1.0, slo_tpot=0.05)
    assert res.labels == [r.label for r in rows]
    for rec in res.records:
        assert rec.metrics["completed"].mean == 36
        assert 0 <= rec.metrics["slo_attainment"].mean <= 1
        assert rec.metrics["ttft_p90_s"].mean > 0
        for k in ("util_prefill", "util_decode"):
            assert 0 < rec.metrics[k].mean <= 1, (rec.policy, k)
    assert conservation_failures(res) == []
    dis, col = res.records[0].metrics, res.records[len(ROWS)].metrics  # rr > jsq at 2:2, split and colocated
    assert dis["transfer_s"].mean > 0 and col["transfer_s"].mean == 0
    assert dis["disagg_fraction"].mean == 1.0
    # the TTFT split adds up: queue + prefill + link queue + transfer + decode wait = mean TTFT (all disaggregated)
    parts = sum(dis[k].mean for k in ("prefill_queue_s", "prefill_s", "link_queue_s", "transfer_s", "decode_wait_s"))
    np.testing.assert_allclose(parts, dis["ttft_mean_s"].mean, rtol=1e-4)
    assert raw["colocated"]["n_groups"][1, 0] == 3


def test_bad_rows_are_refused():
    with pytest.raises(JaxrouteError, match="P:D ratio"):
        pd.parse_ratios("4-4")
    with pytest.raises(JaxrouteError, match="at least one"):
        pd.parse_ratios("0:8")
    assert pd.parse_ratios("2:6, 4:4") == [(2, 6), (4, 4)]
    with pytest.raises(JaxrouteError, match="prefill router .sglang_cache_aware. cannot run on 2 of 3"):
        pd.check_rows([pd.PDRow("sglang_cache_aware", "jsq", 2, 2), pd.PDRow("sglang_cache_aware", "jsq", 3, 1)])
    with pytest.raises(JaxrouteError, match="unknown decode router"):
        pd.check_rows([pd.PDRow("rr", "nope", 2, 2)])
    with pytest.raises(JaxrouteError, match="threshold"):
        pd.check_rows([pd.PDRow("rr", "jsq", 2, 2, threshold=-1.0)])


# independent decode replicas: (prefill router, decode router, P, D, threshold)
REPLICA_ROWS = [pd.PDRow("rr", "least_load", 2, 2), pd.PDRow("random", "llmd_precise", 1, 3, 1200.0),
                pd.PDRow("least_tokens", "rr", 3, 1)]


def test_independent_decode_replicas_match_reference():
    """The decode tier as replicas with continuous batching: landed KV computes only its last prompt token,
    then is cached; requests kept local are prefilled there. Equal to the reference request by request."""
    import dataclasses

    dep = dataclasses.replace(DEP, decode_tier="replicas")
    wl = _workload()
    raw = pd.run_disaggregated(REPLICA_ROWS, wl, rate=RATE, seeds=1, dep=dep, seed=4)
    seed_key = jax.random.split(jax.random.key(4), 1)[0]
    dec_key = jax.random.fold_in(jax.random.split(jax.random.fold_in(jax.random.key(4), 1), 1)[0], 0)
    cost = dep.cost()
    for row, r in enumerate(REPLICA_ROWS):
        want = ref.simulate(
            wl.realize(seed_key, np.float32(RATE)), n_prefill=r.n_prefill, prefill_router=r.prefill_router,
            cap=dep.prefill_kv_capacity(), cost=cost, chunk=dep.chunk, B=dep.max_running, Q=wl.n_requests, router_key=seed_key,
            threshold=r.threshold, bytes_per_token=float(cost.kv_bytes_per_token_gpu),
            link_bytes_per_s=np.float32(dep.link_gbps * 1e9 / 8), latency_s=np.float32(dep.link_latency_ms * 1e-3),
            decode_key=dec_key, n_decode=r.n_decode, decode_policy=r.decode_router, decode_tier="replicas",
            decode_kw=dict(B=dep.slots, Q=wl.n_requests))
        got = {k: np.asarray(v[row, 0]) for k, v in raw.items() if np.ndim(v) >= 2}
        np.testing.assert_array_equal(got["prefill_replica"], want["prefill_replica"])
        np.testing.assert_array_equal(got["decode_worker"], want["decode_worker"])
        np.testing.assert_array_equal(got["decode_cached"], want["decode_cached"])
        assert want["done"].all() and int(got["completed"]) == wl.n_requests
        for mine, theirs in (("delivered_s", "delivered"), ("first_token_s", "first_token"), ("finish_s", "finish")):
            np.testing.assert_allclose(got[mine], want[theirs], rtol=1e-5, atol=1e-6, err_msg=f"{r.label} {mine}")
        assert int(got["conservation_error"]) == 0
        assert got["decode_worker"].max() < r.n_decode
    # landed prompts are cached on the decode replicas: later requests of a tool hit there
    assert raw["decode_cached"][0, 0].sum() > 0


def test_cache_aware_dp_comparison_runs_every_policy_in_one_grid():
    wl = W.toolbench(40, n_tools=6, tool_mean=800, output_tokens=12)
    res = pd.run_cache_aware_dp(wl, ["jsq", "br0", "br_cache", "cache"], ranks=3, rate=RATE, seeds=2, dep=DEP,
                                cache_tokens=2500, arrival="saturated")
    rec = {r.policy: r.metrics for r in res.records}
    assert rec["br_cache"]["hit_rate"].mean > rec["br0"]["hit_rate"].mean  # saturated: the pool holds choices
    for m in rec.values():
        assert m["cache_evictions"].mean > 0 and 0 <= m["hit_rate"].mean <= 1
    assert conservation_failures(res) == []


def test_an_unfinished_decode_tier_is_rerun_with_a_doubled_step_budget(monkeypatch, capsys):
    """The DP tier's step budget grows as every capacity does (`run_with_retry`: the tier rerun, each rerun and a
    budget still short said on stderr), and a budget that stayed short is an overflow, not a silent result."""
    monkeypatch.setattr(pd.dd, "step_bound", lambda *a, **k: 1)
    rows = ROWS[:1]
    with pytest.raises(JaxrouteError, match="overflow"):
        pd.run_disaggregated(rows, _workload(), rate=RATE, seeds=1, dep=DEP, seed=3, max_tries=2)
    err = capsys.readouterr().err
    assert "capacity max_steps = 1 overflowed (overflow_steps); rerunning with 2" in err
    assert "capacity max_steps = 2 still overflowed after 2 tries" in err


def test_an_undone_request_is_excused_only_in_the_seed_that_overflowed():
    """The books read one overflow fact, per seed: seed 0 overflowed (its undone request is the stage's books'
    to explain), seed 1 did not (its undone request is a lost one), though both are the same row's."""
    inf = np.inf
    rec = {"arrival_s": np.array([[[0.0, 1.0], [0.0, 1.0]]]), "output": np.full((1, 2, 2), 4.0),
           "prompt": np.full((1, 2, 2), 100.0), "first_token_s": np.array([[[0.5, inf], [0.5, inf]]]),
           "finish_s": np.array([[[2.0, inf], [2.0, inf]]]), "overflow": np.array([[True, False]]),
           "conservation_error": np.zeros((1, 2)), "admit_s": np.zeros((1, 2, 2)), "n_groups": np.ones((1, 2)), "slots": np.ones((1, 2)),
           "busy_s": np.ones((1, 2, 2)), "cached": np.zeros((1, 2, 2)),  # a colocated run's records
           "row_overflow": np.array([True])}  # a row's flag (the pipeline kept one, read first) excuses no seed
    books = [pd.request_metrics(rec, 0, s, 10.0, 10.0, True)["conservation_error"] for s in range(2)]
    assert books == [0.0, 1.0]
