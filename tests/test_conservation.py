"""A lost request is an error on every model, never an overflow: each model's books find a request dropped from
its final state (an injected bug), the engine refuses that grid whatever its overflow flags say, and a request a
full capacity refused is counted as dropped (flagged as that capacity's overflow), not as lost."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxroute import cost_models, sim
from jaxroute.clusters import disagg
from jaxroute.clusters import dp_decode as dd
from jaxroute.clusters import replicas as R
from jaxroute.clusters.bins import BinsModel, BinsParams
from jaxroute.clusters.queueing import DispatchModel, make_params
from jaxroute.errors import LostRequests
from jaxroute.experiments import Comparison
from jaxroute.routers.prefix import modules_for
from jaxroute.workloads import prefix as W
from jaxroute.workloads.decode import DecodeRequests


@dataclasses.dataclass(frozen=True)
class DropsDispatch(DispatchModel):
    def metrics(self, state, workload, params):  # request 0's routing decision forgotten
        return super().metrics(dataclasses.replace(state, server_of=state.server_of.at[0, 0].set(-1)), workload, params)


@dataclasses.dataclass(frozen=True)
class DropsBins(BinsModel):
    def metrics(self, state, workload, params):  # ball 0 thrown and recorded, then taken out of its bin
        b = state.placed[0]
        return super().metrics(dataclasses.replace(state, loads=state.loads.at[b].add(-1)), workload, params)


def _unfinish_first(state):  # the first request to finish forgotten: neither completed nor in flight
    first = jnp.argmin(state.rec_finish)
    return dataclasses.replace(state, rec_finish=state.rec_finish.at[first].set(jnp.inf))


@dataclasses.dataclass(frozen=True)
class DropsReplicas(R.ReplicaModel):
    def metrics(self, state, workload, params):
        return super().metrics(_unfinish_first(state), workload, params)


@dataclasses.dataclass(frozen=True)
class DropsDecode(dd.DecodeModel):
    def metrics(self, state, workload, params):  # request 0 neither done nor in flight
        return super().metrics(dataclasses.replace(state, done=state.done.at[0].set(False)), workload, params)


@dataclasses.dataclass(frozen=True)
class DropsPrefill(disagg.PrefillStage):
    def metrics(self, state, workload, params):
        return super().metrics(dataclasses.replace(state, tier=_unfinish_first(state.tier)), workload, params)


def _replicas(cls, max_queue=64):
    return cls(n_replicas=2, max_running=4, max_queue=max_queue, router_modules=modules_for(("rr",)))


TOOLBENCH = W.toolbench(30, n_tools=4, tool_mean=600, output_tokens=8)
REPLICA_PARAMS = R.make_params("rr", rate=20.0, kv_capacity=20_000)


def _decode(cls):
    rng = np.random.default_rng(0)
    reqs = DecodeRequests("tiny", np.zeros(12), rng.integers(5, 200, 12), rng.integers(1, 9, 12), np.full(12, -1))
    model = cls(n_workers=2, n_requests=12, max_steps=200, slots=2, pool=4, window=2, horizon=2, r_max=2,
                kv_capacity=10**6, trace_points=4)
    return model, dd.make_workload(reqs, cost_models.cost_params("H200", "Llama-3-8B", 1)), dd.make_params("rr", n_workers=2)


CASES = {
    "dispatch": lambda cls: (cls(n_servers=3, n_requests=64, warmup=0, ring=16, block=2), None, make_params("jsq", 0.7)),
    "bins": lambda cls: (cls(n=50, max_d=2), None, BinsParams(jnp.int32(2))),
    "replicas": lambda cls: (_replicas(cls), TOOLBENCH, REPLICA_PARAMS),
    "decode": _decode,
    "prefill stage": lambda cls: (cls(_replicas(R.ReplicaModel)), TOOLBENCH,
                                  disagg.PrefillStageParams(REPLICA_PARAMS, jnp.float32(0.0))),
}
DROPS = {"dispatch": (DispatchModel, DropsDispatch), "bins": (BinsModel, DropsBins),
         "replicas": (R.ReplicaModel, DropsReplicas), "decode": (dd.DecodeModel, DropsDecode),
         "prefill stage": (disagg.PrefillStage, DropsPrefill)}


@pytest.mark.parametrize("name", list(CASES))
def test_a_dropped_request_is_refused_on_every_model(name):
    sound, drops = DROPS[name]
    model, workload, params = CASES[name](drops)
    rows = [("a", params), ("b", params)]
    with pytest.raises(LostRequests, match=r"lost or invented requests .* in rows a, b: .* simulator bug"):
        Comparison(model, rows, seeds=2, metrics=(), workload=workload).run()
    model, workload, params = CASES[name](sound)  # the same run without the injected bug is conserved
    grid = sim.run_grid(model, jax.random.key(0), workload, sim.stack_params([params]), 2)
    assert grid.lost_rows() == [] and not grid.overflow.any()


def test_a_full_queue_drops_requests_as_an_overflow_and_a_lost_one_is_still_an_error():
    grid = sim.run_grid(_replicas(R.ReplicaModel, max_queue=1), jax.random.key(0), TOOLBENCH,
                        sim.stack_params([REPLICA_PARAMS]), 2)
    m = grid.metrics
    assert m["queue_overflow"].all() and grid.overflow.all()  # a capacity, flagged
    assert (m["dropped"] > 0).all() and (m["completed"] + m["dropped"] == TOOLBENCH.n_requests).all()
    assert (m["conservation_error"] == 0).all()  # dropped by the capacity: counted, not lost
    with pytest.raises(LostRequests):  # an overflowed run is checked like any other
        sim.run_grid(_replicas(DropsReplicas, max_queue=1), jax.random.key(0), TOOLBENCH,
                     sim.stack_params([REPLICA_PARAMS]), 2)


@pytest.mark.parametrize("name", list(CASES))
def test_a_done_state_is_a_fixed_point_of_the_engines_step(name):
    """`Model.holds_when_done` says who keeps a finished run as it is, the model's step or the engine
    (`sim.held_step`, once for every model that leaves it to the engine); either way one more event changes
    nothing, so a chunked run that stops early equals the whole run."""
    model, workload, params = CASES[name](DROPS[name][0])

    def finish_and_step_again(key):
        state = sim.advance(lambda s: sim.held_step(model, s, workload, params), model.is_done,
                            model.init(key, workload, params), model.num_steps(workload))
        return state, sim.held_step(model, state, workload, params)

    state, again = jax.jit(finish_and_step_again)(jax.random.PRNGKey(0))
    assert bool(model.is_done(state))
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
