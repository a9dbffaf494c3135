"""Active replicas (`ReplicaParams.n_active`): a traced replica count under the static n_replicas.

The routers of `routers.prefix.PARTIAL_OK` must decide on the first n_active of G replicas exactly as on
a cluster of n_active replicas: same records request by request (random draws included), inactive
replicas never chosen; a sweep over n_active is one compilation; other routers are refused.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxroute import sim
from jaxroute.clusters import replicas as R
from jaxroute.errors import JaxrouteError
from jaxroute.routers import dynamo, parts
from jaxroute.routers import prefix as routers
from jaxroute.workloads import prefix as W

# (workload, KV capacity per replica, rate): memory pressure (admission waits, the LRU evicts) and, with
# shared-prefix, many equal prefix scores (ties for the pickers)
CASES = {
    "toolbench": (lambda: W.toolbench(60, n_tools=8, tool_mean=1500), 6000, 30.0),
    "shared-prefix": (lambda: W.shared_prefix(48, groups=2, prompts_per_group=3, system_tokens=600,
                                              question_tokens=200, output_tokens=30), 3000, 40.0),
}
_WORKLOADS = {}
K, G_MAX = 2, 4  # active replicas, static maximum
MODULES = ("dynamo",)  # the only stateful module a partial-cluster router uses (a lean step)

# every router that supports a partial cluster, with the settings that exercise its pickers
ROWS = [
    ("rr", {}), ("random", {}), ("least_load", {}), ("least_tokens", {}), ("affinity", {}), ("threshold", {}),
    ("weighted", {}), ("weighted", {"picker": "random"}), ("weighted", {"picker": "softmax", "temperature": 0.5}),
    ("llmd_precise", {}), ("llmd_precise", {"llmd_precise_minmax": True}), ("llmd_load", {}),
    ("llmd_load", {"picker": "softmax", "temperature": 1.0}), ("llmd_load_aware", {}),
    ("dynamo_kv", {}), ("dynamo_kv", {"dyn_temperature": 0.5}),
]


def _workload(case):
    if case not in _WORKLOADS:
        _WORKLOADS[case] = CASES[case][0]()
    return _WORKLOADS[case]


def _model(G):
    return R.ReplicaModel(n_replicas=G, max_running=8, max_queue=64, router_modules=MODULES)


def _run(case, policy, kw, G, n_active=None, key=1):
    _, cap, rate = CASES[case]
    wl = _workload(case)
    model = _model(G)
    p = R.make_params(policy, rate=rate, kv_capacity=cap, n_active=n_active, **kw)
    st = R.run_single(model, jax.random.key(key), wl, p)
    return st, R.records(st), model.metrics(st, wl, p)


def _assert_same(a, b):
    """Records equal request by request; metrics equal (float sums to rounding)."""
    for k in ("replica", "cached_tokens"):
        np.testing.assert_array_equal(a[1][k], b[1][k], err_msg=k)
    for k in ("admit_s", "first_token_s", "finish_s"):
        np.testing.assert_array_equal(a[1][k], b[1][k], err_msg=k)
    for k, v in b[2].items():
        got, want = np.asarray(a[2][k]), np.asarray(v)
        if np.issubdtype(want.dtype, np.floating):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9, err_msg=k)
        else:
            np.testing.assert_array_equal(got, want, err_msg=k)


def _assert_inactive_untouched(st, k):
    rec = np.asarray(st.rec_replica)
    assert ((rec >= 0) & (rec < k)).all()
    assert np.isinf(np.asarray(st.clock)[k:]).all()
    assert (np.asarray(st.rep.q_count)[k:] == 0).all() and (np.asarray(st.kv_used)[k:] == 0).all()
    assert (np.asarray(st.cache_tok)[k:] == 0).all() and (np.asarray(st.inflight)[k:] == 0).all()


@pytest.mark.parametrize("case", ["toolbench", "shared-prefix"])
@pytest.mark.parametrize("policy, kw", ROWS, ids=[f"{p}-{'-'.join(map(str, kw.values())) or 'default'}"
                                                  for p, kw in ROWS])
def test_partial_cluster_equals_a_smaller_cluster(case, policy, kw):
    """G_MAX replicas with K active = a K-replica cluster, request by request (ties and draws included)."""
    part = _run(case, policy, kw, G_MAX, n_active=K)
    small = _run(case, policy, kw, K)
    _assert_inactive_untouched(part[0], K)
    assert int(part[2]["conservation_error"]) == 0
    assert np.isfinite(part[1]["finish_s"]).all()
    _assert_same(part, small)


def test_the_random_pickers_are_exercised():
    """The workloads above do make the random pickers draw: on shared-prefix with llmd_load, random ties
    and another key change the decisions (so the equality above checks the draws)."""
    a = _run("shared-prefix", "llmd_load", {}, G_MAX, n_active=K, key=1)[1]["replica"]
    b = _run("shared-prefix", "llmd_load", {}, G_MAX, n_active=K, key=2)[1]["replica"]
    c = _run("shared-prefix", "llmd_load", {"picker": "argmax"}, G_MAX, n_active=K, key=1)[1]["replica"]
    assert (a != c).any() and (a != b).any()


def test_all_active_equals_no_mask():
    """n_active = n_replicas gives the unmasked run bit for bit (every partial-cluster router)."""
    for policy, kw in ROWS[::3] + [ROWS[-1]]:
        _assert_same(_run("toolbench", policy, kw, K, n_active=K), _run("toolbench", policy, kw, K))


def test_draws_over_the_first_k_equal_draws_over_k():
    """The property the random pickers rely on (partitionable Threefry, JAX's default): the first k
    entries of a [G] draw are the [k] draw; categorical over [G] with -inf beyond k equals it over [k]."""
    assert jax.config.jax_threefry_partitionable
    keys = jax.random.split(jax.random.key(7), 500)
    u4 = jax.vmap(lambda k: jax.random.uniform(k, (G_MAX,)))(keys)
    u2 = jax.vmap(lambda k: jax.random.uniform(k, (K,)))(keys)
    np.testing.assert_array_equal(np.asarray(u4[:, :K]), np.asarray(u2))
    logits = jnp.asarray([0.3, -0.4])
    masked = jnp.concatenate([logits, jnp.full((G_MAX - K,), -jnp.inf)])
    got = jax.vmap(lambda k: jax.random.categorical(k, masked))(keys)
    want = jax.vmap(lambda k: jax.random.categorical(k, logits))(keys)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    active = jnp.arange(G_MAX) < K
    cost = jnp.asarray([1.0, 1.0, 0.0, 0.0])  # the inactive ones would be cheapest
    picks = jax.vmap(lambda k: dynamo.pick(cost, k, jnp.float32(0.0), active))(keys)
    small = jax.vmap(lambda k: dynamo.pick(cost[:K], k, jnp.float32(0.0)))(keys)
    np.testing.assert_array_equal(np.asarray(picks), np.asarray(small))
    assert set(np.asarray(picks).tolist()) == {0, 1}
    np.testing.assert_array_equal(np.asarray(parts.spread(jnp.asarray([1.0, 3.0, 0.0, 9.0]), active))[:K], [1.0, 0.0])


def test_a_sweep_over_active_replicas_compiles_once():
    """n_active in (1, ..., G) x two routers: one program; each row equals its own K-replica cluster."""
    case = "toolbench"
    _, cap, rate = CASES[case]
    wl = _workload(case)
    model = _model(G_MAX)
    sim.clear_compiled(model)
    counts = (1, 2, 3, 4)
    rows = [R.make_params(pol, rate=rate, kv_capacity=cap, n_active=k) for pol in ("least_load", "llmd_load")
            for k in counts]
    grid = sim.run_grid(model, jax.random.key(0), wl, sim.stack_params(rows), 1)
    assert sim.compile_count(model, "run") == 1
    assert (grid.metrics["conservation_error"] == 0).all() and not grid.metrics["overflow"].any()
    assert float(grid.metrics["max_replica_share"][0, 0]) == 1.0  # one replica in use takes everything
    seed = jax.random.split(jax.random.key(0), 1)[0]
    for r, p in enumerate(rows):
        k = counts[r % len(counts)]
        if k not in (1, 3):  # two smaller clusters checked (each is one more compilation)
            continue
        want = jax.jit(lambda key, w, q, m=_model(k): sim.run(m, key, w, q))(seed, wl, R.make_params(
            routers.REGISTRY.name(int(p.policy)), rate=rate, kv_capacity=cap))
        for name, v in want.items():
            got = grid.metrics[name][r, 0]
            if np.issubdtype(np.asarray(v).dtype, np.floating):
                np.testing.assert_allclose(got, np.asarray(v), rtol=1e-5, atol=1e-9, err_msg=f"row {r}: {name}")
            else:
                np.testing.assert_array_equal(got, np.asarray(v), err_msg=f"row {r}: {name}")


def test_check_params_refuses_bad_counts_and_unsupported_routers():
    _, cap, rate = CASES["toolbench"]
    wl = _workload("toolbench")
    model = _model(G_MAX)
    with pytest.raises(JaxrouteError, match="n_active"):
        R.make_params("rr", n_active=0)
    with pytest.raises(JaxrouteError, match="n_active"):
        R.make_params("rr", n_active=1.5)
    with pytest.raises(JaxrouteError, match="n_active=5 needs 1 <= n_active <= n_replicas=4"):
        model.check_params(R.make_params("rr", n_active=5))
    zero = R.make_params("rr", n_active=1)
    zero = zero.__class__(**{**zero.__dict__, "n_active": jnp.int32(0)})  # past make_params' own check
    with pytest.raises(JaxrouteError, match="n_active=0"):
        model.check_params(zero)
    full = R.ReplicaModel(n_replicas=G_MAX)
    with pytest.raises(JaxrouteError, match="router 'sglang_cache_aware' cannot run on a partial cluster.*llmd_load"):
        full.check_params(R.make_params("sglang_cache_aware", n_active=2))
    rows = sim.stack_params([R.make_params("rr", n_active=2), R.make_params("vllm_session", n_active=3)])
    with pytest.raises(JaxrouteError, match="'vllm_session'"):
        full.check_params(rows)
    with pytest.raises(JaxrouteError, match="'sglang_cache_aware'"):  # run_single checks before tracing
        R.run_single(full, jax.random.key(0), wl, R.make_params("sglang_cache_aware", rate=rate, kv_capacity=cap,
                                                                  n_active=2))
    # every router runs on a full cluster given as n_active = n_replicas, and the supported ones partially
    full.check_params(sim.stack_params([R.make_params(p, n_active=G_MAX) for p in ("sglang_cache_aware", "rr")]))
    full.check_params(sim.stack_params([R.make_params(p, n_active=1) for p in routers.PARTIAL_OK]))
    assert set(routers.PARTIAL_OK) <= set(routers.PRESETS)
