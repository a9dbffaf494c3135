"""Engine tests: sharding, batch-of-one, chunking and compile-once, on a toy model."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxroute import metrics, sim


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ToyParams:
    policy: jax.Array  # [] int32: 0 = add draw, 1 = add twice the draw
    scale: jax.Array  # [] float32


@dataclasses.dataclass(frozen=True)
class ToyModel:
    """A random walk with a policy switch: small enough to check by hand."""

    n: int = 10

    def init(self, key, workload, params):
        return {"t": jnp.int32(0), "x": jnp.float32(0.0), "key": key}

    def step(self, state, workload, params):
        key, sub = jax.random.split(state["key"])
        u = jax.random.uniform(sub)
        inc = jax.lax.switch(params.policy, [lambda u: u, lambda u: 2 * u], u) * params.scale * workload
        live = state["t"] < self.n  # a no-op past the end, as the engine requires
        return {"t": state["t"] + live, "x": state["x"] + jnp.where(live, inc, 0.0), "key": key}

    def metrics(self, state, workload, params):
        return {"x": state["x"], "overflow": state["x"] > 1e9}

    def num_steps(self, workload):
        return self.n


def _params(policies, scale=1.0):
    return sim.stack_params([ToyParams(jnp.int32(p), jnp.float32(scale)) for p in policies])


def test_batch_of_one_equals_plain_call():
    model = ToyModel()
    key = jax.random.PRNGKey(3)
    grid = sim.run_grid(model, key, jnp.float32(1.0), _params([1]), 1)
    seed_key = jax.random.split(key, 1)[0]
    plain = sim.run(model, seed_key, jnp.float32(1.0), ToyParams(jnp.int32(1), jnp.float32(1.0)))
    np.testing.assert_array_equal(grid.metrics["x"][0, 0], np.asarray(plain["x"]))


def test_sharded_equals_unsharded():
    assert len(jax.devices()) == 4, "conftest should give 4 CPU devices"
    model = ToyModel()
    key = jax.random.PRNGKey(0)
    a = sim.run_grid(model, key, jnp.float32(1.0), _params([0, 1, 0]), 5)  # 15 rows, padded to 16
    b = sim.run_grid(model, key, jnp.float32(1.0), _params([0, 1, 0]), 5, devices=jax.devices()[:1])
    np.testing.assert_array_equal(a.metrics["x"], b.metrics["x"])
    # policy 1 doubles every draw, with common random numbers per seed
    np.testing.assert_allclose(a.metrics["x"][1], 2 * a.metrics["x"][0], rtol=1e-6)
    np.testing.assert_array_equal(a.metrics["x"][0], a.metrics["x"][2])


def test_chunked_equals_single_scan():
    model = ToyModel(n=10)
    key = jax.random.PRNGKey(1)
    whole = sim.run_grid(model, key, jnp.float32(1.0), _params([0, 1]), 3)
    chunked = sim.run_grid(model, key, jnp.float32(1.0), _params([0, 1]), 3, chunk=4)  # 3 chunks, 2 padded steps
    np.testing.assert_allclose(whole.metrics["x"], chunked.metrics["x"], rtol=1e-6)


def test_policy_comparison_compiles_once():
    model = ToyModel(n=7)
    key = jax.random.PRNGKey(2)
    name = "ToyModel.run"
    before = sim.TRACE_COUNTS.get(name, 0)
    sim.run_grid(model, key, jnp.float32(1.0), _params([0, 1]), 4)
    sim.run_grid(model, key, jnp.float32(1.0), _params([1, 0]), 4)  # same shapes: cached
    assert sim.TRACE_COUNTS[name] - before == 1


def test_run_batch_fn_and_summary():
    def run(key, workload, params):
        return {"v": jax.random.normal(key) * params.scale + workload}

    grid = sim.run_batch_fn(run, jax.random.PRNGKey(0), jnp.float32(5.0), _params([0, 0], scale=0.0), 8)
    s = grid.summary("v")[0]
    assert s.mean == pytest.approx(5.0) and s.lo == pytest.approx(5.0)
    assert not grid.overflow.any()


def test_t_quantile_and_ci():
    assert metrics.t_quantile_975(1) == pytest.approx(12.706, abs=1e-3)
    assert metrics.t_quantile_975(30) == pytest.approx(2.042, abs=1e-3)
    s = metrics.summarize(np.array([1.0, 2.0, 3.0, 4.0]))
    assert s.mean == 2.5
    assert s.hi - s.mean == pytest.approx(3.182 * np.std([1, 2, 3, 4], ddof=1) / 2, rel=1e-3)


def test_masked_quantile_matches_numpy():
    x = np.array([5.0, 1.0, 9.0, 3.0, 7.0, 100.0], dtype=np.float32)
    mask = np.array([1, 1, 1, 1, 1, 0], dtype=bool)
    for q in (0.0, 0.5, 0.95, 0.99, 1.0):
        got = float(metrics.masked_quantile(jnp.asarray(x), jnp.asarray(mask), q))
        assert got == pytest.approx(np.quantile(x[mask], q), rel=1e-6)
    assert float(metrics.masked_mean(jnp.asarray(x), jnp.asarray(mask))) == pytest.approx(5.0)
