"""Decode DP barrier simulator: equal to the Python reference, conservation, overflow, bad input, compile once."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_dp_decode as ref

from jaxroute import cost_models, sim
from jaxroute.clusters import dp_decode as dd
from jaxroute.errors import JaxrouteError
from jaxroute.routers import balance
from jaxroute.workloads.decode import DecodeRequests

G, S, P, W, R, H = 3, 2, 6, 3, 2, 4
N = 24
CAP = 10**6
COST = cost_models.cost_params("H200", "Llama-3-8B", 1)


def _requests(seed=0, n=N):
    rng = np.random.default_rng(seed)
    prompt = rng.integers(5, 400, n)
    output = rng.integers(1, 14, n)
    arrival = np.round(np.cumsum(rng.exponential(0.02, n)), 3) - 0.0
    arrival -= arrival[0]
    return DecodeRequests("tiny", arrival, prompt, output, np.full(n, -1))


def _model(max_steps=400, **kw):
    cfg = dict(n_workers=G, n_requests=N, max_steps=max_steps, slots=S, pool=P, window=W, horizon=H, r_max=R,
               kv_capacity=CAP, trace_points=8)
    cfg.update(kw)
    return dd.DecodeModel(**cfg)


# (policy, dispatch override, predictor, gamma, arrival)
CASES = [
    ("random", None, 1, 0.5, "saturated"),
    ("rr", None, 1, 0.5, "saturated"),
    ("p2c", None, 1, 0.5, "saturated"),
    ("jsq", None, 1, 0.5, "saturated"),
    ("least_kv", None, 1, 0.5, "saturated"),
    ("br0", None, 1, 0.5, "saturated"),
    ("brh", None, 1, 0.5, "saturated"),  # oracle
    ("brh", None, 0, 1.0, "saturated"),  # no prediction
    ("jsq", "pooled", 1, 0.5, "saturated"),
    ("p2c", "pooled", 1, 0.5, "saturated"),
    ("br0", "immediate", 1, 0.5, "saturated"),
    ("brh", "immediate", 1, 0.5, "trace"),
    ("br0", None, 1, 0.5, "trace"),
    ("rr", None, 1, 0.5, "poisson"),
]


def _case_rows(beta=None):
    """The CASES as params rows (beta: one BR-H weight for every row; None: G)."""
    return [dd.make_params(p, n_workers=G, dispatch=disp, predictor=pred, gamma=gam, arrival=arr, rate=30.0,
                           **({} if beta is None else {"beta": beta})) for p, disp, pred, gam, arr in CASES]


@pytest.fixture(scope="module")
def grid():
    req = _requests()
    wl = dd.make_workload(req, COST)
    res = sim.run_grid(_model(), jax.random.PRNGKey(7), wl, sim.stack_params(_case_rows()), 2)
    return req, res


@pytest.mark.parametrize("case", range(len(CASES)))
def test_jitted_equals_reference(grid, case):
    req, res = grid
    policy, disp, pred, gam, arr = CASES[case]
    seed_keys = jax.random.split(jax.random.PRNGKey(7), 2)
    for s in range(2):
        out = ref.simulate(seed_keys[s], req.prompt_tokens.tolist(), req.output_tokens.tolist(),
                           req.arrival_s.tolist(), n_workers=G, slots=S, pool=P, window=W, horizon=H, r_max=R,
                           kv_capacity=CAP, max_steps=400, cost=COST, collective_s=dd.DEFAULT_COLLECTIVE_S,
                           policy=balance.policy_id(policy),
                           dispatch=(balance.default_dispatch(policy) if disp is None
                                     else balance.DISPATCH_MODES.index(disp)),
                           predictor=pred, gamma=gam, arrival=dd.ARRIVALS.index(arr), rate=30.0)
        m = {k: np.asarray(v[case, s]) for k, v in res.metrics.items()}
        assert out["done"].all() and int(m["completed"]) == N
        np.testing.assert_array_equal(m["request_worker"], out["worker"])
        np.testing.assert_allclose(m["request_admit_s"], out["admit_t"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(m["request_finish_s"], out["finish_t"], rtol=1e-5, atol=1e-7)
        assert int(m["steps"]) == out["steps"]
        np.testing.assert_allclose(m["imbalance_tokens"], out["imbalance_tokens"], rtol=1e-5)
        np.testing.assert_allclose(m["barrier_idle_tokens"], out["barrier_idle_tokens"], rtol=1e-5)
        # concurrency and the step's KV share come out of the run (issue 36: not set, measured)
        np.testing.assert_allclose(m["running_per_worker"], out["running_per_worker"], rtol=1e-5)
        np.testing.assert_allclose(m["slots_in_use"], out["running_per_worker"] / S, rtol=1e-5)
        np.testing.assert_allclose(m["kv_share_of_step"], out["kv_share_of_step"], rtol=1e-4)
        assert 0.0 < float(m["kv_share_of_step"]) < 1.0 and 0.0 < float(m["slots_in_use"]) <= 1.0
        np.testing.assert_allclose(m["tpot_p95_s"], out["tpot_p95_s"], rtol=1e-4)
        np.testing.assert_allclose(m["throughput_tok_s"], out["throughput_tok_s"], rtol=1e-4)
        assert int(m["conservation_error"]) == 0 and not bool(m["overflow"])


def test_policies_really_differ(grid):
    _, res = grid
    workers = res.metrics["request_worker"][:, 0]
    assert len({tuple(w) for w in workers}) >= 6  # the reference match above is not a trivial one


def test_conservation_midway_and_sticky():
    """Stopped early (step budget too small): requests in flight are conserved, and the run flags it."""
    req = _requests(1)
    wl = dd.make_workload(req, COST)
    rows = sim.stack_params([dd.make_params(p, n_workers=G) for p in ("jsq", "br0", "brh")])
    res = sim.run_grid(_model(max_steps=10), jax.random.PRNGKey(0), wl, rows, 2)
    assert np.all(res.metrics["conservation_error"] == 0)
    assert np.all(res.metrics["completed"] < N)
    assert np.all(res.metrics["overflow_steps"]) and np.all(res.overflow)


def _rank_lists(model, st):
    """A state as the reference keeps it: each rank's running requests (oldest first), its local queue, and the
    tokens each request has generated."""
    slot_req, slot_seq, slot_gen = (np.asarray(x) for x in (st.slot_req, st.slot_seq, st.slot_gen))
    ids, ok = (np.asarray(x) for x in model.queue_entries(st, model.n_requests))
    gen = np.asarray(st.req_gen).copy()
    running = []
    for g in range(model.n_workers):
        order = [s for s in np.argsort(slot_seq[g], kind="stable") if slot_req[g, s] >= 0]
        running.append([int(slot_req[g, s]) for s in order])
        gen[slot_req[g, order]] = slot_gen[g, order]
    return running, [[int(i) for i, o in zip(ids[g], ok[g], strict=True) if o] for g in range(model.n_workers)], \
        gen.tolist()


def test_preemption_and_local_admission_phases_match_their_slices_of_the_reference():
    """The decode step's phases one at a time, on the states of a run that preempts: `_preempt` against the
    reference's `preempt_rank`, `_admit_local` against its `admit_rank`, rank by rank."""
    req = _growing_requests()
    wl = dd.make_workload(req, COST)
    model = _model(max_steps=600, kv_capacity=TIGHT, block_size=BLOCK)
    params = dd.make_params("rr", n_workers=G, arrival="saturated")
    step = jax.jit(lambda s: sim.held_step(model, s, wl, params))
    preempt = jax.jit(model._preempt)
    admit = jax.jit(model._admit_local)
    st = jax.jit(lambda k: model.init(k, wl, params))(jax.random.PRNGKey(3))
    prompt = np.asarray(st.prompt).tolist()  # this seed's requests (the saturated replay orders them per seed)
    evicted = admitted_total = 0
    for _ in range(80):
        st = step(st)
        running, queues, gen = _rank_lists(model, st)
        after, preempted, free_blocks = preempt(st)
        running2, queues2, gen2 = _rank_lists(model, after)
        after2, local = admit(after, preempted, free_blocks)
        running3, queues3, _ = _rank_lists(model, after2)
        for g in range(G):
            keep, queue, n_ev = ref.preempt_rank(running[g], queues[g], gen, prompt, model.n_blocks, BLOCK)
            assert (running2[g], queues2[g], bool(preempted[g])) == (keep, queue, n_ev > 0)
            admitted, slots_left, blocks_left = ref.admit_rank(keep, queue, gen2, prompt, n_ev > 0, model.n_blocks,
                                                               BLOCK, S, R)
            assert queues3[g] == queue[len(admitted):] and running3[g] == keep + admitted
            assert (int(local.free[g]), int(local.free_blocks[g])) == (slots_left, blocks_left)
            evicted, admitted_total = evicted + n_ev, admitted_total + len(admitted)
    assert evicted > 0 and admitted_total > 0  # both phases did something


def test_kv_overflow_flag_without_preemption():
    """With preemption off (the old model), KV growth past a rank's blocks is only flagged."""
    req = _requests(2)
    wl = dd.make_workload(req, COST)
    big = int(req.prompt_tokens.max()) + 1  # every prompt fits alone, but growth and sharing overflow
    rows = sim.stack_params([dd.make_params(p, n_workers=G) for p in ("rr", "br0")])
    res = sim.run_grid(_model(kv_capacity=big, block_size=1, preempt=False), jax.random.PRNGKey(0), wl, rows, 1)
    assert np.all(res.metrics["overflow_kv"]) and np.all(res.overflow)
    assert np.all(res.metrics["conservation_error"] == 0)
    assert np.all(res.metrics["preemptions"] == 0)


# A block pool small enough that growth forces preemptions: (policy, dispatch override, arrival)
PREEMPT_CASES = [("rr", None, "saturated"), ("jsq", None, "saturated"), ("least_kv", None, "poisson"),
                 ("br0", None, "saturated"), ("brh", None, "saturated"), ("p2c", "pooled", "saturated"),
                 ("br0", "immediate", "trace")]
BLOCK, TIGHT = 8, 160  # 20 blocks of 8 tokens per rank


def _growing_requests(seed=8, n=N):
    """Short prompts, long outputs: admissions fit, but growth runs ranks out of blocks."""
    rng = np.random.default_rng(seed)
    arrival = np.round(np.cumsum(rng.exponential(0.02, n)), 3)
    return DecodeRequests("growing", arrival - arrival[0], rng.integers(10, 100, n), rng.integers(10, 60, n),
                          np.full(n, -1))


@pytest.fixture(scope="module")
def tight_grid():
    req = _growing_requests()
    wl = dd.make_workload(req, COST)
    rows = [dd.make_params(p, n_workers=G, dispatch=disp, arrival=arr, rate=30.0) for p, disp, arr in PREEMPT_CASES]
    model = _model(max_steps=600, kv_capacity=TIGHT, block_size=BLOCK)
    return req, sim.run_grid(model, jax.random.PRNGKey(3), wl, sim.stack_params(rows), 2)


@pytest.mark.parametrize("case", range(len(PREEMPT_CASES)))
def test_preemption_equals_reference(tight_grid, case):
    """vLLM-style paged admission: blocks on demand, newest preempted and recomputed, FCFS head of line."""
    req, res = tight_grid
    policy, disp, arr = PREEMPT_CASES[case]
    keys = jax.random.split(jax.random.PRNGKey(3), 2)
    for s in range(2):
        out = ref.simulate(keys[s], req.prompt_tokens.tolist(), req.output_tokens.tolist(), req.arrival_s.tolist(),
                           n_workers=G, slots=S, pool=P, window=W, horizon=H, r_max=R, kv_capacity=TIGHT,
                           max_steps=600, cost=COST, collective_s=dd.DEFAULT_COLLECTIVE_S,
                           policy=balance.policy_id(policy),
                           dispatch=(balance.default_dispatch(policy) if disp is None
                                     else balance.DISPATCH_MODES.index(disp)),
                           arrival=dd.ARRIVALS.index(arr), rate=30.0, block_size=BLOCK)
        m = {k: np.asarray(v[case, s]) for k, v in res.metrics.items()}
        assert out["done"].all() and int(m["completed"]) == N
        np.testing.assert_array_equal(m["request_worker"], out["worker"])
        np.testing.assert_allclose(m["request_finish_s"], out["finish_t"], rtol=1e-5, atol=1e-7)
        assert int(m["steps"]) == out["steps"]
        assert int(m["preemptions"]) == out["preemptions"]
        assert int(m["recomputed_tokens"]) == out["recomputed_tokens"]
        assert int(m["conservation_error"]) == 0 and not bool(m["overflow"])
    assert np.sum(res.metrics["preemptions"][case]) > 0  # the case really preempts
    assert np.sum(res.metrics["recomputed_tokens"][case]) > 0


def test_request_that_never_fits_is_flagged():
    req = _requests(9)
    wl = dd.make_workload(req, COST)
    small = 128  # one block of 128: most prompts plus their first token cannot fit at all
    rows = sim.stack_params([dd.make_params(p, n_workers=G) for p in ("rr", "br0")])
    res = sim.run_grid(_model(max_steps=200, kv_capacity=small), jax.random.PRNGKey(0), wl, rows, 1)
    assert np.all(res.metrics["overflow_kv"]) and np.all(res.overflow)
    assert np.all(res.metrics["conservation_error"] == 0)


def test_immediate_dispatch_is_not_capped():
    """Baselines route every prefill-completed request on arrival (the legacy cap held P in total)."""
    req = _requests(10)
    wl = dd.make_workload(req, COST)
    params = dd.make_params("rr", n_workers=G)
    for cap, expect in ((False, N), (True, P)):
        model = _model(cap_immediate=cap)
        st = jax.jit(lambda k, m=model: m.step(m.init(k, wl, params), wl, params))(jax.random.PRNGKey(0))
        assert int(st.next_in) == expect
        assert int(jnp.sum(st.q_len) + jnp.sum(st.slot_req >= 0)) == expect
        assert int(jnp.max(st.q_len)) <= expect // G + 1  # round robin spreads them evenly


def test_compile_once_for_policies_and_predictors(grid):
    """Every policy, dispatch mode, predictor and weight is a traced row: one program for the grid (the `grid`
    fixture's shape, so its program), none more for the rows reversed with other BR-H weights."""
    req, _ = grid
    wl = dd.make_workload(req, COST)
    model = _model()
    sim.clear_compiled(model)
    sim.run_grid(model, jax.random.PRNGKey(0), wl, sim.stack_params(_case_rows()), 2)
    sim.run_grid(model, jax.random.PRNGKey(1), wl, sim.stack_params(_case_rows(beta=1.0)[::-1]), 2)
    assert sim.compile_count(model, "run") == 1


def test_bad_inputs():
    with pytest.raises(JaxrouteError, match="unknown decode policy"):
        dd.make_params("nope", n_workers=4)
    with pytest.raises(JaxrouteError, match="dispatch"):
        dd.make_params("rr", n_workers=4, dispatch="later")
    with pytest.raises(JaxrouteError, match="arrival"):
        dd.make_params("rr", n_workers=4, arrival="bursty")
    with pytest.raises(JaxrouteError, match="rate"):
        dd.make_params("rr", n_workers=4, arrival="poisson", rate=0.0)
    with pytest.raises(JaxrouteError, match="gamma"):
        dd.make_params("brh", n_workers=4, gamma=float("nan"))
    with pytest.raises(JaxrouteError, match="n workers"):
        _model(n_workers=0)
    with pytest.raises(JaxrouteError, match="window"):
        _model(window=13, pool=32)
    with pytest.raises(JaxrouteError, match="exceeds the pool"):
        _model(window=8, pool=4)
    with pytest.raises(JaxrouteError, match="horizon"):
        _model(horizon=-1)


def test_seeds_are_different_replays(grid):
    """Deterministic routers still vary over seeds: each seed replays the requests in its own order."""
    _, res = grid
    rr = CASES.index(("rr", None, 1, 0.5, "saturated"))
    assert res.metrics["imbalance_tokens"][rr, 0] != res.metrics["imbalance_tokens"][rr, 1]
    trace = CASES.index(("br0", None, 1, 0.5, "trace"))  # a trace replay keeps its order and times
    np.testing.assert_array_equal(res.metrics["request_worker"][trace, 0], res.metrics["request_worker"][trace, 1])


def test_done_run_stops_early_in_chunks_and_equals_the_full_run(grid):
    """is_done: every request finished; later steps change nothing, so an early exit is exact."""
    req, whole = grid  # the whole scan of 400 steps, every case
    wl = dd.make_workload(req, COST)
    model = _model(max_steps=400)
    assert np.all(whole.metrics["completed"] == N) and int(whole.metrics["steps"].max()) < 200
    chunked = sim.run_grid(model, jax.random.PRNGKey(7), wl, sim.stack_params(_case_rows()), 2, chunk=40,
                           progress="chunks")
    for name, v in whole.metrics.items():  # stopped well before 400 steps, the same numbers
        np.testing.assert_array_equal(v, chunked.metrics[name], err_msg=name)
    # a finished state is a fixed point of the engine's step (the decode model's step leaves it to the engine)
    assert not dd.DecodeModel.holds_when_done
    params = dd.make_params("jsq", n_workers=G)
    st = jax.jit(lambda k: sim.scan_steps(model, model.init(k, wl, params), wl, params, 400))(jax.random.PRNGKey(0))
    assert bool(model.is_done(st))
    again = jax.jit(lambda s: sim.held_step(model, s, wl, params))(st)
    for a, b in zip(jax.tree.leaves(st), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_missing_predictor_slot_is_an_error_before_tracing():
    """lax.switch clamps: a `learned` id with a bank lacking the learned table would silently run `exact`."""
    from jaxroute import predictors

    req = _requests(5)
    table = predictors.survival.fit_survival(req.output_tokens, H)
    bank = (table, predictors.exact.fit_exact(req.output_tokens, req.key_id, table))  # survival, exact: no learned
    wl = dd.make_workload(req, COST, bank=bank)
    learned = predictors.kind_id("learned")
    model = _model(max_steps=50)
    sim.clear_compiled(model)
    rows = sim.stack_params([dd.make_params("brh", n_workers=G, predictor=predictors.kind_id("exact")),
                             dd.make_params("brh", n_workers=G, predictor=learned)])
    with pytest.raises(JaxrouteError, match="'learned'.*no fitted table"):
        sim.run_grid(model, jax.random.PRNGKey(0), wl, rows, 1)
    assert sim.compile_count(model, "run") == 0
    with pytest.raises(JaxrouteError, match="no fitted table"):  # the same check on a concrete id outside a grid
        predictors.predict(bank, learned, predictors.RequestFeatures(*(jnp.zeros(2, jnp.int32),) * 4), H)
    with pytest.raises(JaxrouteError, match="out of range"):
        dd.make_params("brh", n_workers=G, predictor=len(predictors.kind_names()))


@pytest.mark.parametrize("field,value", [("policy", len(balance.POLICIES)), ("dispatch", 2), ("arrival", 3)])
def test_out_of_range_ids_are_refused(field, value):
    import dataclasses

    row = dataclasses.replace(dd.make_params("rr", n_workers=G), **{field: jax.numpy.int32(value)})
    req = _requests(6)
    with pytest.raises(JaxrouteError, match="out of range"):
        sim.run_grid(_model(max_steps=20), jax.random.PRNGKey(0), dd.make_workload(req, COST),
                     sim.stack_params([row]), 1)


def test_dp_ep_cost_equals_reference():
    """The DP-attention + EP step (experts and all-to-all shared per step) in the model and the reference."""
    req = _requests(11)
    cost = cost_models.cost_params("Ascend-910C", "DeepSeek-V3-W8A8", 4, parallel="dp_ep", dp_ranks=G)
    wl = dd.make_workload(req, cost, collective_s=0.0)
    cases = [("jsq", None), ("br0", None)]
    rows = sim.stack_params([dd.make_params(p, n_workers=G) for p, _ in cases])
    res = sim.run_grid(_model(), jax.random.PRNGKey(2), wl, rows, 1)
    key = jax.random.split(jax.random.PRNGKey(2), 1)[0]
    for c, (policy, _) in enumerate(cases):
        out = ref.simulate(key, req.prompt_tokens.tolist(), req.output_tokens.tolist(), req.arrival_s.tolist(),
                           n_workers=G, slots=S, pool=P, window=W, horizon=H, r_max=R, kv_capacity=CAP, max_steps=400,
                           cost=cost, collective_s=0.0, policy=balance.policy_id(policy),
                           dispatch=balance.default_dispatch(policy))
        m = {k: np.asarray(v[c, 0]) for k, v in res.metrics.items()}
        np.testing.assert_array_equal(m["request_worker"], out["worker"])
        np.testing.assert_allclose(m["request_finish_s"], out["finish_t"], rtol=1e-5, atol=1e-7)
        assert int(m["steps"]) == out["steps"]


PARTIAL_CASES = [("random", None), ("rr", None), ("p2c", None), ("jsq", None), ("least_kv", None), ("br0", None),
                 ("brh", None), ("jsq", "pooled")]


def test_ranks_in_use_and_local_prefill_match_reference():
    """A 4-rank model with 3 ranks in use (traced) equals the reference's 3-rank run, and requests the P/D
    decider kept local are prefilled by their rank at admission (a prefill in that step); all rows, one compile."""
    req = _requests(3)
    local = np.random.default_rng(3).random(N) < 0.4
    wl = dd.make_workload(req, COST)
    wl = dd.DecodeWorkload(wl.prompt, wl.output, wl.arrival_s, wl.key_id, wl.cost, wl.collective_s, wl.bank,
                           local_prefill=jnp.asarray(local))
    model = _model(n_workers=G + 1)
    rows = [dd.make_params(p, n_workers=G + 1, n_active=G, dispatch=disp, arrival="trace") for p, disp in PARTIAL_CASES]
    sim.clear_compiled(model)
    res = sim.run_grid(model, jax.random.PRNGKey(5), wl, sim.stack_params(rows), 1)
    assert sim.compile_count(model) == 1
    key = jax.random.split(jax.random.PRNGKey(5), 1)[0]
    for c, (policy, disp) in enumerate(PARTIAL_CASES):
        out = ref.simulate(key, req.prompt_tokens.tolist(), req.output_tokens.tolist(), req.arrival_s.tolist(),
                           n_workers=G, slots=S, pool=P, window=W, horizon=H, r_max=R, kv_capacity=CAP, max_steps=400,
                           cost=COST, collective_s=dd.DEFAULT_COLLECTIVE_S, policy=balance.policy_id(policy),
                           dispatch=(balance.default_dispatch(policy) if disp is None
                                     else balance.DISPATCH_MODES.index(disp)),
                           arrival=2, local=local.tolist(), draw_width=G + 1)
        m = {k: np.asarray(v[c, 0]) for k, v in res.metrics.items()}
        assert out["done"].all() and int(m["completed"]) == N, policy
        assert np.all(m["request_worker"] < G), policy  # the rank not in use never gets a request
        np.testing.assert_array_equal(m["request_worker"], out["worker"])
        for mine, theirs in (("request_admit_s", "admit_t"), ("request_first_s", "first_t"),
                             ("request_finish_s", "finish_t")):
            np.testing.assert_allclose(m[mine], out[theirs], rtol=1e-5, atol=1e-7, err_msg=f"{policy} {mine}")
        np.testing.assert_allclose(m["imbalance_tokens"], out["imbalance_tokens"], rtol=1e-5)
        np.testing.assert_allclose(m["barrier_idle_tokens"], out["barrier_idle_tokens"], rtol=1e-5)
        assert int(m["conservation_error"]) == 0 and not bool(m["overflow"])
    # local prefill costs time: the same requests without it finish no later
    plain = sim.run_grid(model, jax.random.PRNGKey(5), dd.make_workload(req, COST), sim.stack_params(rows[:1]), 1)
    assert plain.metrics["makespan_s"][0, 0] < res.metrics["makespan_s"][0, 0]


def test_ranks_in_use_refused_out_of_range():
    with pytest.raises(JaxrouteError, match="ranks in use"):
        dd.make_params("jsq", n_workers=2, n_active=3)
    rows = sim.stack_params([dd.make_params("jsq", n_workers=3, n_active=2)])
    bad = dataclasses.replace(rows, n_active=jnp.asarray([5], jnp.int32))
    with pytest.raises(JaxrouteError, match="ranks in use"):
        _model().check_params(bad)


def test_step_bound_widens_for_the_busiest_worker_of_a_small_run():
    """The loaded steps are widened by 1 + 3 sqrt(G / n): a random spread of few requests over many workers
    loads the busiest one well above the mean (40 requests over 8 workers: 5 +- 2.2 each)."""
    out = np.full(40, 1000)
    small = dd.step_bound(out, n_workers=8, slots=4, r_max=4, slack=1.0)
    loaded = 40 * 1000 / 32
    assert small == int((1 + 3 * np.sqrt(8 / 40)) * loaded + 40 / 32 + 1000 + 64)
    big = dd.step_bound(np.full(8000, 1000), n_workers=8, slots=4, r_max=4, slack=1.0)
    assert big < 1.1 * (8000 * 1000 / 32) + 8000 / 32 + 1000 + 64  # at the paper's size it widens under 10 %
