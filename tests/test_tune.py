"""Router tuning (experiments/tune.py): the knob table, objectives, CMA-ES runs on a small workload."""

import math

import jax
import numpy as np
import pytest

from jaxroute import sim
from jaxroute.clusters import replicas
from jaxroute.errors import JaxrouteError
from jaxroute.experiments import tune as T
from jaxroute.experiments.capacity import parse_slo
from jaxroute.routers import prefix as routers
from jaxroute.workloads import prefix as W


@pytest.fixture(scope="module")
def workload():
    return W.toolbench(120, n_tools=20, tool_mean=1500)


@pytest.mark.parametrize("router", T.TUNABLE_ROUTERS)
def test_defaults_round_trip_to_the_preset(router):
    """The knobs' defaults are the preset's, inside the bounds, and map back to the same RouterParams."""
    space = T.Space.of(router)
    v = space.default_values()
    assert all(k.lo <= x <= k.hi for k, x in zip(space.knobs, v, strict=True))
    np.testing.assert_allclose(space.from_unit(space.to_unit(v)), v, rtol=1e-9, atol=1e-12)
    same = jax.tree.leaves(routers.router_params(router, **space.settings(v)))
    for a, b in zip(same, jax.tree.leaves(routers.router_params(router)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_knob_mapping_and_names():
    k = T.Knob("x", 1.0, 100.0, log=True)
    assert k.from_unit(0.5) == pytest.approx(10.0) and k.to_unit(1000.0) == 1.0 and k.from_unit(-1) == 1.0
    space = T.Space.of("llmd_precise", ["w_inflight"])  # any scorer's weight; untuned weights keep the preset's
    assert space.settings([4.0]) == {"weights": {"prefix": 3.0, "inflight": 4.0, "queue": 2.0, "kv": 2.0}}
    with pytest.raises(JaxrouteError, match="not a tunable setting of dynamo_kv"):
        T.Space.of("dynamo_kv", ["theta"])
    with pytest.raises(JaxrouteError, match="no tunable settings"):
        T.Space.of("rr")
    with pytest.raises(JaxrouteError, match="twice"):
        T.Space.of("threshold", ["theta", "theta"])


def test_objectives_and_settings_are_checked():
    g = T.objective("goodput", parse_slo("ttft_p90_s<=1,tpot_p90_s<=0.05"))
    assert (g.metric, g.maximise, g.slo_ttft, g.slo_tpot) == ("goodput_rps", True, 1.0, 0.05)
    assert not T.objective("ttft_p90_s").maximise and T.objective("hit_rate").maximise
    for name, slo, msg in [("goodput", (), "needs an SLO"), ("goodput", parse_slo("mean_latency_s<=1"), "per-request"),
                           ("capacity", (), "needs an SLO"), ("ttft_p90_s", parse_slo("ttft_p90_s<=1"), "--slo applies"),
                           ("nope", (), "unknown objective")]:
        with pytest.raises(JaxrouteError, match=msg):
            T.objective(name, slo)
    assert T.check_settings("dynamo_kv", {"dyn_overlap_weight": 2.0}) == {"dyn_overlap_weight": 2.0}
    for router, settings, msg in [("nope", {}, "unknown router"), ("dynamo_kv", {"weights": {"kv": 1}}, "unknown setting"),
                                  ("llmd_precise", {"weights": {"kv": "x"}}, "scorer: number"),
                                  ("llmd_precise", {"weights": {"nope": 1}}, "unknown scorer"),
                                  ("threshold", {"theta": math.nan}, "finite number"), ("threshold", [], "object")]:
        with pytest.raises(JaxrouteError, match=msg):
            T.check_settings(router, settings)


def test_cma_es_improves_a_bad_start_in_one_compilation(workload):
    """From pure prefix affinity (w_prefix=10, no load scorers) CMA-ES finds a much lower TTFT p90 on the search
    seeds; every generation reuses the one compiled program, and the defaults are re-evaluated on fresh seeds."""
    sim.clear_compiled(T.TuneStage)
    counts = []
    res = T.tune(T.Space.of("llmd_precise"), T.objective("ttft_p90_s"), T.Setup(workload, replicas=2, rate=8.0),
                 population=6, generations=3, seeds=2, final_seeds=3, start=[10.0, 0.0, 0.0],
                 on_generation=lambda g: counts.append(sim.compile_count(T.TuneStage, "advance")))
    assert counts == [1, 1, 1]  # the final re-evaluation (another batch shape) may compile once more
    curve = [g.best_ever for g in res.generations]
    assert curve == sorted(curve, reverse=True) and curve[-1] < 0.8 * res.start_score
    assert res.candidates[0].label == "defaults" and res.candidates[0].gain is None
    assert all(len(c.final.per_seed) == 3 and c.gain is not None for c in res.candidates[1:])
    assert res.runs == 3 * 6 * 2 + len(res.candidates) * 3


def test_goodput_search_never_ends_below_the_defaults(workload):
    """The defaults are member 0 of generation 0 on the common search seeds, so best-ever >= the defaults."""
    res = T.tune(T.Space.of("threshold"), T.objective("goodput", parse_slo("ttft_p90_s<=1,tpot_p90_s<=0.05")),
                 T.Setup(workload, replicas=2, rate=8.0), population=6, generations=2, seeds=2, final_seeds=3)
    assert res.start_score > 0 and res.generations[-1].best_ever >= res.start_score
    assert res.candidates[0].search_score == res.start_score
    out = res.params_json({"workload": "toolbench"})
    assert out["router"] == "threshold" and T.check_settings("threshold", out["settings"]) == res.best.settings


def test_capacity_objective_runs_the_capacity_search(workload):
    obj = T.objective("capacity", parse_slo("ttft_p90_s<=1"), T.CapacitySearch(2.0, 80.0, tol=0.1, points=3, max_rounds=2))
    sim.clear_compiled(replicas.ReplicaModel)
    res = T.tune(T.Space.of("threshold"), obj, T.Setup(workload, replicas=2), population=3, generations=2, seeds=2,
                 final_seeds=2)
    assert 2.0 <= res.start_score <= 80.0 and res.generations[-1].best_ever >= res.start_score
    assert all(2.0 <= c.final.mean <= 80.0 for c in res.candidates)
    assert sim.compile_count(replicas.ReplicaModel, "advance") <= 2  # the generations' batches, then the final one
