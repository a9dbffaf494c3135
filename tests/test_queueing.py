"""Classic dispatch model: exact agreement with the pure-Python reference, compile-once, invariants."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxroute import metrics as metrics_lib
from jaxroute import sim
from jaxroute.clusters import bins, queueing
from jaxroute.clusters.bins import BinsModel, BinsParams
from jaxroute.clusters.queueing import (
    DispatchModel,
    DispatchState,
    default_ring,
    make_params,
)
from jaxroute.errors import JaxrouteError
from jaxroute.routers import classic
from jaxroute.routers.classic import POLICY_NAMES
from jaxroute.workloads import service as service_lib
from tests import reference_queueing as ref


@functools.cache
def _compiled(model):
    """Jitted draws and single run for one static model (params and key are traced: compiled once)."""

    def run(key, params):
        state = sim.scan_steps(model, model.init(key, None, params), None, params, model.num_steps())
        return state, model.metrics(state, None, params)

    return jax.jit(model.all_draws), jax.jit(run)


def _draws(model, key, params):
    dr = _compiled(model)[0](key, params)
    return np.asarray(dr.gap), np.asarray(dr.service), np.asarray(dr.picks)


def _run_one(model, key, params):
    state, m = _compiled(model)[1](key, params)
    return state, jax.tree.map(np.asarray, m)


CASES = [
    (policy, law, stale, d)
    for policy in POLICY_NAMES
    for law in ("exp", "pareto")
    for stale in ((0.0, 0.5, 2.0) if policy in ("jsq", "pod") else (0.0,))
    for d in ((2, 3) if policy == "pod" else (2,))
]


@pytest.mark.parametrize("policy,law,stale,d", CASES)
def test_matches_reference_event_loop(policy, law, stale, d):
    model = DispatchModel(n_servers=5, n_requests=403, warmup=40, ring=64, max_d=3)  # 403: a partial last block
    params = make_params(policy, load=0.9, service=law, stale=stale, d=d)
    key = jax.random.key(7)
    gaps, svcs, picks = _draws(model, key, params)
    expect = ref.simulate_dispatch(gaps, svcs, picks, policy, 5, stale=stale, d=d, ring=64)
    state, m = _run_one(model, key, params)
    np.testing.assert_allclose(np.asarray(state.response).reshape(-1)[:403], expect["response"], rtol=2e-4, atol=2e-4)
    assert np.bincount(expect["server"], minlength=5).tolist() == np.asarray(state.assigned).tolist()
    resp = np.asarray(expect["response"][40:])
    np.testing.assert_allclose(m["mean_response"], resp.mean(), rtol=1e-4)
    np.testing.assert_allclose(m["p99_response"], np.quantile(resp, 0.99), rtol=1e-4)
    assert not m["overflow"] and not expect["overflow"]
    assert m["conservation_error"] == 0


def test_policies_really_differ_on_the_same_draws():
    model = DispatchModel(n_servers=5, n_requests=400, ring=64, block=2)
    means = {p: float(_run_one(model, jax.random.key(1), make_params(p, 0.9))[1]["mean_response"])
             for p in POLICY_NAMES}
    assert len({round(v, 4) for v in means.values()}) == len(POLICY_NAMES)


@pytest.mark.parametrize("policy,stale", [("jsq", 2.0), ("pod", 0.0), ("random", 0.0)])
def test_ring_overflow_flag_matches_reference(policy, stale):
    model = DispatchModel(n_servers=3, n_requests=300, ring=2, block=2)
    params = make_params(policy, load=0.95, service="pareto", stale=stale)
    key = jax.random.key(3)
    gaps, svcs, picks = _draws(model, key, params)
    expect = ref.simulate_dispatch(gaps, svcs, picks, policy, 3, stale=stale, d=2, ring=2)
    _, m = _run_one(model, key, params)
    assert bool(m["overflow"]) == expect["overflow"]
    if policy != "random":  # random never reads queue lengths, so its ring can't overflow
        assert expect["overflow"]


@pytest.mark.parametrize("d", [1, 2, 3])
def test_bins_match_reference(d):
    model = BinsModel(n=300, max_d=3)
    key = jax.random.key(d)
    picks = np.asarray(jax.jit(jax.vmap(lambda i: model.draws(key, i)))(jnp.arange(300)))
    expect = ref.balls_into_bins(picks, d, 300)
    state = jax.jit(lambda k: sim.scan_steps(model, model.init(k, None, BinsParams(jnp.int32(d))), None,
                                              BinsParams(jnp.int32(d)), 300))(key)
    assert np.asarray(state.loads).tolist() == expect
    m = model.metrics(state, None, BinsParams(jnp.int32(d)))
    assert int(m["max_load"]) == max(expect) and int(m["conservation_error"]) == 0


def test_all_policies_compile_once_and_chunking_is_exact():
    model = DispatchModel(n_servers=4, n_requests=203, warmup=20, ring=16, block=2)
    params = sim.stack_params([make_params(p, 0.8) for p in POLICY_NAMES])
    sim.clear_compiled(model)
    whole = sim.run_grid(model, jax.random.key(0), None, params, n_seeds=6)
    sim.run_grid(model, jax.random.key(1), None, sim.stack_params([make_params(p, 0.7) for p in POLICY_NAMES[::-1]]),
                 n_seeds=6)
    assert sim.compile_count(model, "run") == 1  # five policies, two grids: one program
    chunked = sim.run_grid(model, jax.random.key(0), None, params, n_seeds=6, chunk=50, progress="chunks")
    assert sim.compile_count(model, "chunk") == 1
    # Padded steps after the end are no-ops; the two programs may differ by float rounding only.
    for name in ("mean_response", "p99_response"):
        np.testing.assert_allclose(whole.metrics[name], chunked.metrics[name], rtol=1e-6)
    np.testing.assert_array_equal(chunked.metrics["conservation_error"], 0)
    assert whole.metrics["mean_response"].shape == (5, 6)


def test_service_laws_have_mean_one_and_documented_cv():
    u = jax.random.uniform(jax.random.key(0), (400_000,))
    for law in service_lib.SERVICE_LAWS:
        x = np.asarray(jax.jit(service_lib.service_time)(jnp.int32(service_lib.SERVICE_LAWS.index(law)), u),
                       dtype=np.float64)
        mean, cv = service_lib.law_moments(law)
        assert mean == pytest.approx(1.0, rel=1e-9)
        assert x.mean() == pytest.approx(1.0, rel=0.03), law
        if law in ("exp", "det", "lognormal"):
            assert x.std() / x.mean() == pytest.approx(cv, rel=0.1), law
    assert service_lib.law_moments("pareto")[1] >= 3 and service_lib.law_moments("lognormal")[1] >= 3


def test_default_ring_grows_with_staleness():
    assert default_ring(16, 0.9, 0.0) == 16
    assert default_ring(16, 0.9, 4.0) >= 2 * 0.9 * 16 * 4


@pytest.mark.parametrize("kwargs", [dict(policy="jsqq"), dict(service="weibull"), dict(load=0.0),
                                    dict(stale=-1.0), dict(d=0)])
def test_bad_params_raise_clear_errors(kwargs):
    with pytest.raises(JaxrouteError):
        make_params(**kwargs)


def test_bad_static_config_raises():
    with pytest.raises(JaxrouteError):
        DispatchModel(n_servers=0)
    with pytest.raises(JaxrouteError):
        DispatchModel(n_requests=10, warmup=10)


@pytest.mark.parametrize("n", [1, 2, 7, 100, 1001])
def test_quantile_by_bisection_equals_sorting(n):
    from jaxroute.metrics import masked_quantile, masked_quantile_select

    key = jax.random.key(n)
    x = jax.random.normal(key, (n,)) * 30.0
    x = jnp.where(jnp.arange(n) % 3 == 0, jnp.round(x), x)  # some ties
    mask = jax.random.bernoulli(jax.random.fold_in(key, 1), 0.7, (n,))
    for q in (0.0, 0.37, 0.99, 1.0):
        np.testing.assert_allclose(masked_quantile_select(x, mask, q), masked_quantile(x, mask, q), rtol=1e-6)
        assert np.isclose(masked_quantile_select(x, mask, q),
                          np.quantile(np.asarray(x)[np.asarray(mask)], q) if np.asarray(mask).any() else 0.0,
                          rtol=1e-5)


# --------------------------------------------------------------------------- params meet the model


@pytest.mark.parametrize("d", [3, 0])
def test_d_outside_max_d_is_refused_before_tracing(d):
    model = DispatchModel(n_servers=4, n_requests=40, max_d=2)
    row = dataclasses.replace(make_params("pod", 0.8), d=jnp.int32(d))
    with pytest.raises(JaxrouteError, match=f"d={d}.*max_d=2"):
        sim.run_grid(model, jax.random.key(0), None, sim.stack_params([make_params("jsq", 0.8), row]), 1)
    bins_model = BinsModel(n=10, max_d=2)
    with pytest.raises(JaxrouteError, match=f"d={d}.*max_d=2"):
        sim.run_grid(bins_model, jax.random.key(0), None, sim.stack_params([BinsParams(jnp.int32(d))]), 1)


@pytest.mark.parametrize("field,value", [("policy", len(POLICY_NAMES)), ("policy", -1), ("service", 4)])
def test_out_of_range_ids_are_refused(field, value):
    """lax.switch would clamp them and silently run the last policy / law."""
    row = dataclasses.replace(make_params("jsq", 0.8), **{field: jnp.int32(value)})
    with pytest.raises(JaxrouteError, match="out of range"):
        sim.run_grid(DispatchModel(n_servers=4, n_requests=40), jax.random.key(0), None, sim.stack_params([row]), 1)


def test_bins_make_params_and_errors():
    assert int(bins.make_params(3).d) == 3
    with pytest.raises(JaxrouteError):
        bins.make_params(0)


# --------------------------------------------------------------------------- conservation can fail


def test_dispatch_conservation_catches_a_lost_arrival(monkeypatch):
    """A router that returns no valid server for one request loses it: the check must say so."""
    model = DispatchModel(n_servers=4, n_requests=60, ring=32, block=4)
    params = make_params("jsq", 0.8)
    good = jax.jit(lambda k: model.run(k, None, params))(jax.random.key(0))
    assert int(good["conservation_error"]) == 0
    route = classic.route

    def lossy(policy, view):
        server = route(policy, view)
        return jnp.where(view.rr_index == 2, model.n_servers, server)  # out of range: no server chosen

    monkeypatch.setattr(classic, "route", lossy)
    bad = jax.jit(lambda k: model.run(k, None, params))(jax.random.key(0))
    assert int(bad["conservation_error"]) > 0


@pytest.mark.parametrize("corrupt", ["arrivals", "assigned", "server_of"])
def test_dispatch_conservation_catches_a_corrupted_counter(corrupt):
    model = DispatchModel(n_servers=4, n_requests=60, ring=32, block=4)
    params = make_params("lwl", 0.8)
    state, m = _run_one(model, jax.random.key(2), params)
    assert int(m["conservation_error"]) == 0 and isinstance(state, DispatchState)
    broken = {
        "arrivals": lambda s: dataclasses.replace(s, arrivals=s.arrivals - 1),
        "assigned": lambda s: dataclasses.replace(s, assigned=s.assigned.at[0].add(1).at[1].add(-1)),
        "server_of": lambda s: dataclasses.replace(s, server_of=s.server_of.at[0, 0].set((s.server_of[0, 0] + 1) % 4)),
    }[corrupt](state)
    assert int(model.metrics(broken, None, params)["conservation_error"]) > 0


@pytest.mark.parametrize("corrupt", ["balls", "loads", "placed"])
def test_bins_conservation_catches_a_corrupted_counter(corrupt):
    model = BinsModel(n=50, max_d=2)
    params = bins.make_params(2)
    state = jax.jit(lambda k: sim.scan_steps(model, model.init(k, None, params), None, params, 50))(jax.random.key(0))
    assert int(model.metrics(state, None, params)["conservation_error"]) == 0
    broken = {
        "balls": lambda s: dataclasses.replace(s, balls=s.balls + 1),
        "loads": lambda s: dataclasses.replace(s, loads=s.loads.at[0].add(1).at[1].add(-1)),
        "placed": lambda s: dataclasses.replace(s, placed=s.placed.at[3].set(-1)),
    }[corrupt](state)
    assert int(model.metrics(broken, None, params)["conservation_error"]) > 0


@pytest.mark.parametrize("n", [1, 5, 100, 1000])
def test_upper_quantile_equals_counting_quantile(n):
    x = jnp.asarray(np.random.default_rng(n).exponential(size=n).astype(np.float32))
    for q in (0.5, 0.9, 0.99):
        expected = metrics_lib.masked_quantile_select(x, jnp.ones(n, bool), q)
        np.testing.assert_array_equal(np.asarray(queueing.upper_quantile(x, q)), np.asarray(expected))


def test_ordered_keys_sort_and_tie_as_the_floats():
    v = jnp.asarray([-3.5, -0.0, 0.0, 1e-30, 2.0, -1e30, 2.0, 7.25], jnp.float32)
    keys = np.asarray(classic.ordered_key(v)).astype(np.int64)
    f = np.asarray(v)
    np.testing.assert_array_equal(np.sign(keys[:, None] - keys[None, :]), np.sign(f[:, None] - f[None, :]))
