"""Engine tests: sharding, batch-of-one, chunking and compile-once, on a toy model."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxroute import compile_effort, metrics, sim
from jaxroute.errors import JaxrouteError
from jaxroute.registry import PolicyRegistry


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ToyParams:
    policy: jax.Array  # [] int32: 0 = add draw, 1 = add twice the draw
    scale: jax.Array  # [] float32


@dataclasses.dataclass(frozen=True)
class ToyModel(sim.Model):
    """A random walk with a policy switch: small enough to check by hand."""

    n: int = 10
    max_scale: float = 1e6

    def check_params(self, params, workload=None):
        if np.max(np.asarray(params.scale)) > self.max_scale:
            raise JaxrouteError(f"scale {np.max(np.asarray(params.scale))} > max_scale {self.max_scale}")

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

    def is_done(self, state):
        return state["t"] >= self.n


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
    chunked = sim.run_grid(model, key, jnp.float32(1.0), _params([0, 1]), 3, chunk=4,
                           progress="chunks")  # 3 chunks, 2 padded steps
    np.testing.assert_allclose(whole.metrics["x"], chunked.metrics["x"], rtol=1e-6)


def test_policy_comparison_compiles_once():
    model = ToyModel(n=7)
    key = jax.random.PRNGKey(2)
    sim.clear_compiled(model)
    assert sim.compile_count(model, "run") == 0
    sim.run_grid(model, key, jnp.float32(1.0), _params([0, 1]), 4)
    sim.run_grid(model, key, jnp.float32(1.0), _params([1, 0]), 4)  # same shapes: cached
    assert sim.compile_count(model, "run") == 1
    sim.run_grid(model, key, jnp.float32(1.0), _params([1, 0, 1]), 4)  # a new batch shape compiles again
    assert sim.compile_count(model, "run") == 2
    sim.run_grid(model, key, jnp.float32(1.0), _params([0, 1]), 4, chunk=3, progress="chunks")
    sim.run_grid(model, key, jnp.float32(1.0), _params([1, 1]), 4, chunk=3, progress="chunks")
    assert sim.compile_count(model, "chunk") == 1 and sim.compile_count(model, "init") == 1
    # without a progress bar to show between chunks, the same grid is the one whole-run program compiled above
    sim.run_grid(model, key, jnp.float32(1.0), _params([1, 0]), 4, chunk=3)
    assert sim.compile_count(model, "chunk") == 1 and sim.compile_count(model, "run") == 2
    assert sim.compile_count(model, "advance") == 3


def test_models_must_implement_the_whole_contract():
    class NoDone(sim.Model):
        def init(self, key, workload, params):
            return 0

        def step(self, state, workload, params):
            return state

        def metrics(self, state, workload, params):
            return {}

        def num_steps(self, workload):
            return 1

    with pytest.raises(TypeError, match="is_done"):
        NoDone()
    with pytest.raises(TypeError, match="subclass"):
        sim.run_grid(object(), jax.random.PRNGKey(0), None, _params([0]), 1)


def test_check_params_runs_before_tracing():
    model = ToyModel(n=3, max_scale=2.0)
    sim.clear_compiled(model)
    with pytest.raises(JaxrouteError, match="max_scale"):
        sim.run_grid(model, jax.random.PRNGKey(0), jnp.float32(1.0), _params([0], scale=5.0), 2)
    assert sim.compile_count(model, "run") == 0


def test_a_grid_whose_state_cannot_fit_is_refused_before_it_compiles(monkeypatch):
    """Its state estimated from shapes (`state_bytes`, no compile) against the memory free (here set by
    JAXROUTE_MEMORY_BYTES): refused in one line with the estimate, nothing compiled; a grid that fits runs."""
    model = ToyModel(n=3, max_scale=2.0)
    sim.clear_compiled(model)
    monkeypatch.setattr(sim, "MEMORY_CHECK_ROW_STEPS", 0)  # check even this small grid
    per_row = sim.state_bytes(model, jnp.float32(1.0), jax.tree.map(lambda x: x[0], _params([0])))
    assert per_row > 0
    monkeypatch.setenv(sim.MEMORY_ENV, str(per_row * 3))  # room for 3 rows, not for 8
    with pytest.raises(JaxrouteError) as e:
        sim.run_grid(model, jax.random.PRNGKey(0), jnp.float32(1.0), _params([0, 1]), 4)
    assert "the grid needs at least" in str(e.value) and "GiB is free: run fewer" in str(e.value)
    assert "\n" not in str(e.value) and sim.compile_count(model, "run") == 0
    monkeypatch.setenv(sim.MEMORY_ENV, str(2**30))
    assert sim.run_grid(model, jax.random.PRNGKey(0), jnp.float32(1.0), _params([0, 1]), 4).n_configs == 2


@dataclasses.dataclass(frozen=True)
class EarlyModel(ToyModel):
    """Done after `stop` steps although num_steps allows n: chunked runs stop early, same result. Its step
    does not hold a done state (it counts on): the engine does (`sim.held_step`)."""

    holds_when_done = False
    stop: int = 5

    def is_done(self, state):
        return state["t"] >= self.stop


def test_chunked_run_stops_early_and_equals_the_full_run():
    model = EarlyModel(n=100, stop=5)
    done = dict(model.init(jax.random.PRNGKey(0), None, None), t=jnp.int32(5), x=jnp.float32(2.0))
    toy = ToyParams(jnp.int32(0), jnp.float32(1.0))
    held = sim.held_step(model, done, jnp.float32(1.0), toy)
    assert int(held["t"]) == 5 and float(held["x"]) == 2.0  # the engine holds it
    assert int(model.step(done, jnp.float32(1.0), toy)["t"]) == 6  # the model's own step goes on
    key = jax.random.PRNGKey(4)
    whole = sim.run_grid(model, key, jnp.float32(1.0), _params([0, 1]), 3)
    sim.clear_compiled(model)
    chunked = sim.run_grid(model, key, jnp.float32(1.0), _params([0, 1]), 3, chunk=2, progress="chunks")
    np.testing.assert_allclose(whole.metrics["x"], chunked.metrics["x"], rtol=1e-6)
    assert sim.compile_count(model, "done") == 1


@dataclasses.dataclass(frozen=True)
class RaggedModel(ToyModel):
    """Each row stops after its own number of steps (drawn at init), and each step runs a loop of its own length:
    batched rows then differ in both."""

    cpu_rows_together = 4  # groups of at most 4 rows on a CPU
    holds_when_done = False  # the engine holds a row once it is done

    def init(self, key, workload, params):
        return dict(super().init(key, workload, params), stop=3 + jax.random.randint(key, (), 0, 20))

    def step(self, state, workload, params):
        new = super().step(state, workload, params)
        extra = jax.lax.while_loop(lambda c: c[0] < state["t"] % 5, lambda c: (c[0] + 1, c[1] + 0.5 * c[0]),
                                   (jnp.int32(0), jnp.float32(0.0)))[1]
        return dict(new, x=new["x"] + extra, stop=state["stop"])

    def metrics(self, state, workload, params):
        return {"x": state["x"], "t": state["t"]}

    def is_done(self, state):
        return state["t"] >= state["stop"]


def test_rows_together_sizes(monkeypatch):
    monkeypatch.delenv(sim.ROWS_TOGETHER_ENV, raising=False)
    together = sim.rows_together
    assert together(1, "cpu", 16) == together(2, "cpu", 16) == together(2, "gpu", None) == 1  # unbatched
    assert together(3, "cpu", 16) == together(16, "cpu", 16) == 1  # no more than a group: one at a time
    assert together(17, "cpu", 16) == 9 and together(160, "cpu", 16) == 16
    assert together(33, "cpu", 16) == 11  # 3 equal groups, not 16 + 16 + 1
    assert together(40, "gpu", 16) == together(40, "cpu", None) == 40  # accelerators and uniform models: all
    assert together(160, "cpu", 16, fast=True) == 1  # a small job of a branchy model: one at a time
    assert together(40, "cpu", None, fast=True) == together(40, "gpu", 16, fast=True) == 40
    monkeypatch.setenv(sim.ROWS_TOGETHER_ENV, "0")
    assert together(2, "cpu", 16) == 2 and together(40, "cpu", 16) == 40
    assert together(40, "cpu", 16, fast=True) == 40  # the override wins
    monkeypatch.setenv(sim.ROWS_TOGETHER_ENV, "1")
    assert together(40, "cpu", None) == 1 and together(40, "gpu", 16) == 40  # the override is for CPUs


def test_every_way_of_running_rows_gives_the_same_result(monkeypatch):
    # 21 rows on 4 devices: 6 a device, run in groups of 3 (the model's limit is 4), or all 6 together, or one
    # at a time unbatched; whole or in chunks. Rows stop at different steps and loop for different lengths.
    # A job compiled fast runs its rows one at a time by default; one compiled optimized, in groups.
    model, key = RaggedModel(n=40), jax.random.PRNGKey(5)
    runs = {}
    for effort, env in (("optimized", ""), ("optimized", "0"), ("optimized", "1"), ("fast", "")):
        monkeypatch.setenv(sim.ROWS_TOGETHER_ENV, env)
        for chunk in (None, 8):
            with compile_effort.forced(effort):
                runs[effort, env, chunk] = sim.run_grid(model, key, jnp.float32(1.0), _params([0, 1, 0]), 7,
                                                        chunk=chunk, progress=chunk is not None and "chunks").metrics
            if env == "" and chunk is None:
                assert sim.last_traced_program().endswith(" x3" if effort == "optimized" else " x1 fast")
    base = runs["optimized", "1", None]
    assert len(set(np.asarray(base["t"]).ravel().tolist())) > 3  # the rows do stop at different steps
    for got in runs.values():
        np.testing.assert_array_equal(got["t"], base["t"])
        np.testing.assert_allclose(got["x"], base["x"], rtol=1e-6)
    assert {k[4] for k in sim._TRACES if k[0] == model} == {1, 3, 6}  # the three ways were compiled


@pytest.mark.parametrize("length", [sim.DONE_CHECK_EVERY, 3 * sim.DONE_CHECK_EVERY + 5])
def test_advance_holds_one_copy_of_the_step(length):
    """A length that is not whole blocks still traces the step once (a second copy doubled the compile time of
    every grid program), and the extra events of the last block are no-ops."""
    traced, model = [], ToyModel(n=length)

    def step(s):
        traced.append(1)
        return model.step(s, jnp.float32(1.0), ToyParams(jnp.int32(0), jnp.float32(1.0)))

    state = jax.jit(lambda k: sim.advance(step, model.is_done, model.init(k, None, None), length))(jax.random.key(0))
    assert len(traced) == 1 and int(state["t"]) == length


def test_switch_shared_traces_each_rule_once_and_picks_each_policys():
    reg = PolicyRegistry("toy", ["double", "double_too", "negate", "double_again"])
    traced = []

    def branch(rule):
        traced.append(rule)
        return (lambda x: 2 * x) if rule == "double" else (lambda x: -x)

    rules = ["double", "double", "negate", "double"]
    out = jax.jit(jax.vmap(lambda p, x: reg.switch_shared(p, rules, branch, x)))(jnp.arange(4), jnp.full(4, 3.0))
    assert sorted(traced) == ["double", "negate"]
    np.testing.assert_array_equal(out, [6.0, 6.0, -3.0, 6.0])
    with pytest.raises(ValueError, match="3 rules for 4 policies"):
        reg.switch_shared(jnp.int32(0), rules[:3], branch, 1.0)


def test_registry_names_one_host_id_and_refuses_what_it_cannot_name():
    reg = PolicyRegistry("toy", ["a", "b", "c"])
    assert reg.name(1) == "b" and reg.name(np.int32(2)) == "c" and reg.name(jnp.array([0])) == "a"
    with pytest.raises(JaxrouteError, match=r"2 toy policy ids \[0, 2\] have no one name"):
        reg.name(np.array([0, 2]))  # used to answer the last name
    with pytest.raises(JaxrouteError, match="a traced toy policy id has no name"):
        jax.jit(lambda i: jnp.float32(len(reg.name(i))))(jnp.int32(1))
    with pytest.raises(JaxrouteError, match="out of range 0..2"):
        reg.name(3)


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


def test_cli_compile_cache_location_and_switches(tmp_path):
    from jaxroute import cli, runtime

    assert runtime.compile_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "jaxroute" / "jax"
    assert runtime.compile_cache_dir({"HOME": "/nowhere"}) == runtime.Path.home() / ".cache" / "jaxroute" / "jax"
    assert runtime.compile_cache_dir({"XDG_CACHE_HOME": str(tmp_path), "JAXROUTE_NO_COMPILE_CACHE": "1"}) is None
    assert runtime.compile_cache_dir({"JAX_COMPILATION_CACHE_DIR": str(tmp_path)}) == tmp_path
    # conftest: the suite's cache is the checkout's .jax_cache/tests (git ignores it), never the user's
    from tests.conftest import TEST_COMPILE_CACHE

    assert runtime.compile_cache_dir() == TEST_COMPILE_CACHE and runtime.use_compile_cache(True) == TEST_COMPILE_CACHE
    try:
        assert runtime.use_compile_cache(False) is None
        assert not jax.config.jax_enable_compilation_cache  # off, even with a folder set through JAX's variable
    finally:
        assert runtime.use_compile_cache(True) == TEST_COMPILE_CACHE
    assert jax.config.jax_enable_compilation_cache
    assert jax.config.jax_compilation_cache_dir == str(TEST_COMPILE_CACHE)
    args = cli.build_parser().parse_args(["--no-compile-cache", "bins", "--n", "10"])
    assert args.no_compile_cache
