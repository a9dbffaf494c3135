"""Replica-cluster routers from parts: pickers' tie rules, traced weights, the registry."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxroute import sim
from jaxroute.clusters import replicas as R
from jaxroute.errors import JaxrouteError
from jaxroute.routers import parts
from jaxroute.routers import prefix as routers
from jaxroute.workloads import prefix as W


def test_argmax_ties_go_to_the_lowest_index_then_the_tie_score():
    s = jnp.asarray([1.0, 3.0, 3.0, 0.0])
    assert int(parts.argmax(s)) == 1
    assert int(parts.argmax(s, tie=jnp.asarray([9.0, 1.0, 2.0, 9.0]))) == 2
    assert int(parts.argmax(s, tie=jnp.asarray([9.0, 2.0, 2.0, 9.0]))) == 1


def test_random_picker_spreads_over_the_tied_replicas_only():
    s = jnp.asarray([3.0, 1.0, 3.0, 3.0])
    keys = jax.random.split(jax.random.key(0), 300)
    picks = np.asarray(jax.vmap(lambda k: parts.random_among_ties(s, k))(keys))
    counts = np.bincount(picks, minlength=4)
    assert counts[1] == 0 and min(counts[[0, 2, 3]]) > 60


def test_softmax_picker_tends_to_argmax():
    s = jnp.asarray([0.2, 0.9, 0.5])
    keys = jax.random.split(jax.random.key(1), 200)
    cold = np.asarray(jax.vmap(lambda k: parts.softmax(s, k, jnp.float32(1e-3)))(keys))
    assert (cold == 1).all()
    assert (np.asarray(jax.vmap(lambda k: parts.softmax(s, k, jnp.float32(0.0)))(keys)) == 1).all()
    hot = np.asarray(jax.vmap(lambda k: parts.softmax(s, k, jnp.float32(10.0)))(keys))
    assert len(set(hot.tolist())) == 3
    masked = parts.keep(s, jnp.asarray([True, False, True]))
    assert int(parts.pick(jnp.int32(0), masked, keys[0], jnp.float32(0.0))) == 2  # a filter is never picked


def test_weight_sweep_compiles_once():
    wl = W.toolbench(30, n_tools=8, tool_mean=1500)
    model = R.ReplicaModel(n_replicas=3, max_queue=32, router_modules=())  # "weighted" keeps no module state
    sim.clear_compiled(model)
    rows = [R.make_params("weighted", rate=20.0, kv_capacity=8000, weights=w, picker=pk, temperature=0.5)
            for w, pk in (({"prefix": 1.0}, "argmax"), ({"inflight": 1.0}, "random"),
                          ({"prefix": 1.0, "inflight": 1.0, "tokens": 1.0}, "softmax"))]
    grid = sim.run_grid(model, jax.random.key(0), wl, sim.stack_params(rows), 2, chunk=300)
    assert sim.compile_count(model, "advance") == 1
    assert (grid.metrics["conservation_error"] == 0).all() and not grid.metrics["overflow"].any()
    share = grid.metrics["max_replica_share"].mean(1)
    assert share[0] > share[1]  # prefix-only herds more than queue-only
    # a model built for its grid's routers only (router_policies: the others' branches are left out) gives the
    # same grid, and refuses a row of another router before tracing
    only = dataclasses.replace(model, router_policies=("weighted",))
    same = sim.run_grid(only, jax.random.key(0), wl, sim.stack_params(rows), 2, chunk=300)
    for name, value in grid.metrics.items():
        np.testing.assert_array_equal(same.metrics[name], value, err_msg=name)
    with pytest.raises(JaxrouteError, match="router 'rr' is not among the routers this model was built for"):
        sim.run_grid(only, jax.random.key(0), wl, sim.stack_params([rows[0], R.make_params("rr", rate=20.0)]), 2)
    with pytest.raises(JaxrouteError, match="unknown .*'nope'"):
        R.ReplicaModel(router_policies=("rr", "nope"))
    # its routers' modules are derived (no module list to keep in step), and an explicit list still wins
    assert R.ReplicaModel(router_policies=("preble_e2", "rr")).router_static(1).modules == routers.modules_for(("preble_e2",))
    assert R.ReplicaModel(router_policies=("rr",), router_modules=("sglang",)).router_static(1).modules == ("sglang",)
    assert R.ReplicaModel().router_static(1).modules is None


def test_unknown_names_are_refused_before_tracing():
    with pytest.raises(JaxrouteError, match="unknown .*policy 'jsq'"):
        R.make_params("jsq")
    with pytest.raises(JaxrouteError, match="picker"):
        R.make_params("weighted", picker="max")
    with pytest.raises(JaxrouteError, match="unknown router setting"):
        R.make_params("rr", e2_windw_s=3.0)
    with pytest.raises(JaxrouteError, match="weights"):
        R.make_params("weighted", weights=(1.0, 2.0))
    with pytest.raises(JaxrouteError, match="unknown scorer"):
        R.make_params("weighted", weights={"prefx": 1.0})


def test_stateful_settings_are_traced_and_readable_by_name():
    p = R.make_params("preble_e2", e2_window_s=30.0, sgl_cache_threshold=0.75)
    assert float(p.router.e2_window_s) == 30.0 and float(p.router.sgl_cache_threshold) == 0.75
    stacked = sim.stack_params([p, R.make_params("preble_e2", e2_window_s=60.0)])
    assert stacked.router.e2_window_s.shape == (2,)
    assert {"sglang_cache_aware", "preble_e2"} <= set(routers.STATEFUL)


def test_router_modules_are_checked_at_import():
    """A misspelled or undeclared hook would never run and a setting two modules claim would answer the first
    one's value: all are refused when the registry is built."""
    import dataclasses
    import inspect
    import types

    from jaxroute.routers import prefix, sglang
    from jaxroute.routers.spec import RouterModule

    prefix.check_modules({n: prefix._python_module(n) for n in prefix.MODULES})  # the registered modules pass

    def fake(name, **settings):
        mod = types.ModuleType(name)
        make_params = lambda **kw: None  # noqa: E731
        make_params.__signature__ = inspect.Signature(
            [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v) for k, v in settings.items()])
        mod.MODULE = RouterModule(init=lambda static: None, make_params=make_params)
        return mod

    with pytest.raises(TypeError, match="on_finsh"):  # a hook field that does not exist
        RouterModule(init=lambda static: None, make_params=lambda: None, on_finsh=lambda *a: None)
    stray = fake("stray", recent_s=1.0)
    stray.on_finish = lambda *a: None  # defined, but MODULE does not declare it: it would never run
    with pytest.raises(ImportError, match=r"defines on_finish\(\), which its MODULE does not declare"):
        prefix.check_modules({"stray": stray})
    stray.MODULE = dataclasses.replace(stray.MODULE, on_finish=stray.on_finish)
    prefix.check_modules({"stray": stray})  # declared: accepted
    with pytest.raises(ImportError, match="'bare' has no MODULE"):
        prefix.check_modules({"bare": types.ModuleType("bare")})
    with pytest.raises(ImportError, match="'sgl_cache_threshold' is claimed by module 'clash' and by 'sglang'"):
        prefix.check_modules({"sglang": sglang, "clash": fake("clash", sgl_cache_threshold=0.5)})
    with pytest.raises(ImportError, match="'theta' is claimed by module 'shadow' and by RouterParams"):
        prefix.check_modules({"shadow": fake("shadow", theta=0.5)})
    with pytest.raises(ImportError, match="jaxroute.routers.presets.nope does not exist"):
        prefix._resolve("presets.nope", "router 'x'")


