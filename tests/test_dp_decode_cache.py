"""Per-rank prefix caches in the decode DP barrier simulator (SGLang DP attention: every rank caches and
prefills its own requests) and the cache-aware routers br_cache / cache: equal to the Python reference."""

import jax
import numpy as np
import pytest
import reference_dp_decode as ref

from jaxroute import cost_models, sim
from jaxroute.clusters import dp_decode as dd
from jaxroute.errors import JaxrouteError
from jaxroute.routers import balance
from jaxroute.workloads import prefix as W

G, S, P, WIN, R, H = 3, 3, 6, 3, 2, 4
N = 40
CAP = 10**6
BUDGET = 2500  # tokens per rank: the system prompt and about two tools, so ranks evict
COST = cost_models.cost_params("H200", "Llama-3-8B", 1)
RATE = 20.0
SEEDS = 2

# (policy, dispatch override, arrival, cache weight)
CASES = [(p, None, arr, 1.0) for arr in ("trace", "saturated") for p in ("br0", "br_cache", "cache", "jsq", "rr")]
CASES += [("br_cache", "immediate", "trace", 1.0), ("cache", "pooled", "saturated", 1.0),
          ("br_cache", None, "saturated", 0.1), ("br_cache", None, "saturated", 0.0)]


def _table():
    wl = W.toolbench(N, n_tools=6, tool_mean=800, output_tokens=12)
    return wl.realize(jax.random.key(0), np.float32(RATE))


def _model(budget=BUDGET, **kw):
    cfg = dict(n_workers=G, n_requests=N, max_steps=500, slots=S, pool=P, window=WIN, horizon=H, r_max=R,
               kv_capacity=CAP, trace_points=8, prefix_cache_tokens=budget)
    cfg.update(kw)
    return dd.DecodeModel(**cfg)


def _dispatch(policy, disp):
    return balance.default_dispatch(policy) if disp is None else balance.DISPATCH_MODES.index(disp)


def _reference(table, key, policy, disp, arrival, weight, budget=BUDGET):
    seg_ids, seg_tok = np.asarray(table.seg_ids), np.asarray(table.seg_tok)
    segs = [[(int(i), int(k)) for i, k in zip(seg_ids[r], seg_tok[r], strict=True) if k > 0] for r in range(N)]
    return ref.simulate(key, np.asarray(table.prompt_tok).tolist(), np.asarray(table.out_tok).tolist(),
                        np.asarray(table.arrival_s).tolist(), n_workers=G, slots=S, pool=P, window=WIN, horizon=H,
                        r_max=R, kv_capacity=CAP, max_steps=500, cost=COST, collective_s=dd.DEFAULT_COLLECTIVE_S,
                        policy=balance.policy_id(policy), dispatch=_dispatch(policy, disp),
                        arrival=dd.ARRIVALS.index(arrival), rate=RATE, local=[True] * N, segs=segs,
                        seg_len=np.asarray(table.seg_len).tolist(), cache_tokens=budget, cache_weight=weight)


def _rows(cases):
    return sim.stack_params([dd.make_params(p, n_workers=G, dispatch=disp, arrival=arr, rate=RATE, cache_weight=w)
                             for p, disp, arr, w in cases])


@pytest.fixture(scope="module")
def grid():
    table = _table()
    res = sim.run_grid(_model(), jax.random.PRNGKey(7), dd.make_prefix_workload(table, COST), _rows(CASES), SEEDS)
    return table, res


def _check(m, out, label):
    assert out["done"].all() and int(m["completed"]) == N, label
    np.testing.assert_array_equal(m["request_worker"], out["worker"], err_msg=label)
    for mine, theirs in (("request_admit_s", "admit_t"), ("request_first_s", "first_t"),
                         ("request_finish_s", "finish_t")):
        np.testing.assert_allclose(m[mine], out[theirs], rtol=1e-5, atol=1e-7, err_msg=f"{label} {mine}")
    assert int(m["steps"]) == out["steps"], label
    assert int(m["prefill_tokens"]) == out["prefill_tokens"], label
    np.testing.assert_allclose(m["hit_rate"], out["hit_rate"], rtol=1e-6, err_msg=label)
    assert int(m["cache_evictions"]) == out["cache_evictions"], label
    np.testing.assert_allclose(m["imbalance_tokens"], out["imbalance_tokens"], rtol=1e-5, err_msg=label)
    assert int(m["conservation_error"]) == 0 and not bool(m["overflow"]), label


@pytest.mark.parametrize("case", range(len(CASES)))
def test_jitted_equals_reference(grid, case):
    table, res = grid
    policy, disp, arr, w = CASES[case]
    keys = jax.random.split(jax.random.PRNGKey(7), SEEDS)
    for s in range(SEEDS):
        out = _reference(table, keys[s], policy, disp, arr, w)
        m = {k: np.asarray(v[case, s]) for k, v in res.metrics.items()}
        _check(m, out, f"{CASES[case]} seed {s}")
        assert out["cache_evictions"] > 0  # the budget really binds


def _case(*key):
    return next(i for i, c in enumerate(CASES) if c[:3] == key[:3] and (len(key) < 4 or c[3] == key[3]))


def test_cache_aware_routing_differs_and_hits_more(grid):
    """br_cache binds other requests than br0 and, saturated, hits more (a fixed replay: deterministic)."""
    _, res = grid
    br0, brc = _case("br0", None, "saturated"), _case("br_cache", None, "saturated", 1.0)
    for s in range(SEEDS):
        assert np.any(res.metrics["request_worker"][br0, s] != res.metrics["request_worker"][brc, s])
        assert res.metrics["hit_rate"][brc, s] > res.metrics["hit_rate"][br0, s]
        assert res.metrics["prefill_tokens"][brc, s] < res.metrics["prefill_tokens"][br0, s]
    # the weight is traced and used: 0 is br0 exactly, 0.1 binds differently from 1
    zero, small = _case("br_cache", None, "saturated", 0.0), _case("br_cache", None, "saturated", 0.1)
    np.testing.assert_array_equal(res.metrics["request_worker"][zero], res.metrics["request_worker"][br0])
    assert np.any(res.metrics["request_worker"][small] != res.metrics["request_worker"][brc])
    # cache-only routing on arrival differs from jsq on a trace replay (warm caches attract requests)
    cache, jsq = _case("cache", None, "trace"), _case("jsq", None, "trace")
    assert np.any(res.metrics["request_worker"][cache, 0] != res.metrics["request_worker"][jsq, 0])


def test_prefill_and_hit_accounting(grid):
    """Every request is prefilled by its rank: prefill tokens + cached tokens = all prompt tokens."""
    table, res = grid
    total = int(np.sum(np.asarray(table.prompt_tok)))
    hit = res.metrics["hit_rate"] * total
    np.testing.assert_allclose(res.metrics["prefill_tokens"] + hit, total, rtol=1e-6)
    assert np.all(res.metrics["hit_rate"] > 0) and np.all(res.metrics["cache_evictions"] > 0)


def test_budget_below_one_prompt_equals_reference():
    """A budget smaller than any prompt: this step's segments are never evicted, so a rank holds one step's
    prompts over budget until the next step's eviction; jitted and reference agree."""
    table = _table()
    assert int(np.min(np.asarray(table.prompt_tok))) > 1000
    cases = [("br0", None, "saturated", 1.0), ("br_cache", None, "saturated", 1.0), ("cache", None, "trace", 1.0)]
    res = sim.run_grid(_model(budget=1000), jax.random.PRNGKey(3), dd.make_prefix_workload(table, COST),
                       _rows(cases), 1)
    key = jax.random.split(jax.random.PRNGKey(3), 1)[0]
    for c, case in enumerate(cases):
        out = _reference(table, key, *case, budget=1000)
        _check({k: np.asarray(v[c, 0]) for k, v in res.metrics.items()}, out, str(case))
        assert out["cache_evictions"] > 0


def test_no_caches_leaves_the_model_unchanged():
    """prefix_cache_tokens = 0: state arrays [G, 1], no hits, every prompt token prefilled, as the reference."""
    table = _table()
    wl = dd.make_prefix_workload(table, COST)
    model = _model(budget=0)
    params = dd.make_params("br0", n_workers=G)
    st = jax.eval_shape(lambda k: model.init(k, wl, params), jax.random.PRNGKey(0))
    assert st.cached.shape == (G, 1) and st.last_use.shape == (G, 1) and st.seg_ids.shape == (N, 1)
    cases = [("br0", None, "trace", 1.0), ("jsq", None, "saturated", 1.0)]
    res = sim.run_grid(model, jax.random.PRNGKey(7), wl, _rows(cases), 1)
    key = jax.random.split(jax.random.PRNGKey(7), 1)[0]
    for c, case in enumerate(cases):
        out = _reference(table, key, *case, budget=0)
        m = {k: np.asarray(v[c, 0]) for k, v in res.metrics.items()}
        _check(m, out, str(case))
        assert float(m["hit_rate"]) == 0.0 and int(m["cache_evictions"]) == 0
        assert int(m["prefill_tokens"]) == int(np.sum(np.asarray(table.prompt_tok)))


def test_cache_policies_refused_without_caches():
    table = _table()
    wl = dd.make_prefix_workload(table, COST)
    for policy in balance.CACHE_POLICIES:
        rows = _rows([(policy, None, "saturated", 1.0)])
        with pytest.raises(JaxrouteError, match=f"decode policy {policy} needs per-rank prefix caches"):
            _model(budget=0).check_params(rows, wl)
        model = _model(budget=0, max_steps=20)
        sim.clear_compiled(model)
        with pytest.raises(JaxrouteError, match="prefix caches"):
            sim.run_grid(model, jax.random.PRNGKey(0), wl, rows, 1)
        assert sim.compile_count(model, "run") == 0
    plain = dd.DecodeWorkload(wl.prompt, wl.output, wl.arrival_s, wl.key_id, wl.cost, wl.collective_s)
    with pytest.raises(JaxrouteError, match="prompt segments"):
        _model().check_params(_rows([("br_cache", None, "saturated", 1.0)]), plain)
    with pytest.raises(JaxrouteError, match="cache weight"):
        dd.make_params("br_cache", n_workers=G, cache_weight=-1.0)
    with pytest.raises(JaxrouteError, match="prefix cache tokens"):
        _model(budget=-1)
    assert balance.default_dispatch("br_cache") == balance.POOLED
    assert balance.default_dispatch("cache") == balance.IMMEDIATE
