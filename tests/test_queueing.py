"""Classic dispatch model: exact agreement with the pure-Python reference, compile-once, invariants."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxroute import sim
from jaxroute.clusters.queueing import BinsModel, BinsParams, QueueingModel, default_ring, dispatch_params
from jaxroute.errors import JaxrouteError
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
    model = QueueingModel(n_servers=5, n_requests=403, warmup=40, ring=64, max_d=3)  # 403: a partial last block
    params = dispatch_params(policy, load=0.9, service=law, stale=stale, d=d)
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
    model = QueueingModel(n_servers=5, n_requests=400, ring=64, block=2)
    means = {p: float(_run_one(model, jax.random.key(1), dispatch_params(p, 0.9))[1]["mean_response"])
             for p in POLICY_NAMES}
    assert len({round(v, 4) for v in means.values()}) == len(POLICY_NAMES)


@pytest.mark.parametrize("policy,stale", [("jsq", 2.0), ("pod", 0.0), ("random", 0.0)])
def test_ring_overflow_flag_matches_reference(policy, stale):
    model = QueueingModel(n_servers=3, n_requests=300, ring=2, block=2)
    params = dispatch_params(policy, load=0.95, service="pareto", stale=stale)
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
    model = QueueingModel(n_servers=4, n_requests=203, warmup=20, ring=16, block=2)
    params = sim.stack_params([dispatch_params(p, 0.8) for p in POLICY_NAMES])
    before = sim.TRACE_COUNTS.get("QueueingModel.run", 0)
    whole = sim.run_grid(model, jax.random.key(0), None, params, n_seeds=6)
    assert sim.TRACE_COUNTS["QueueingModel.run"] == before + 1
    chunked = sim.run_grid(model, jax.random.key(0), None, params, n_seeds=6, chunk=50)
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
        dispatch_params(**kwargs)


def test_bad_static_config_raises():
    with pytest.raises(JaxrouteError):
        QueueingModel(n_servers=0)
    with pytest.raises(JaxrouteError):
        QueueingModel(n_requests=10, warmup=10)


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
