"""The bench's counted costs (`bench.program_cost`): on a model whose steps and loop trips are known in closed
form, the profile finds exactly that many scan steps and trips; the projection and the printed table follow."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxroute import sim
from jaxroute.bench import program_cost
from jaxroute.bench.harness import format_report

EVENTS = 20  # events per run: the batched loop runs whole blocks of sim.DONE_CHECK_EVERY steps
BLOCKS = -(-EVENTS // sim.DONE_CHECK_EVERY)


@dataclasses.dataclass(frozen=True)
class CountingModel(sim.Model):
    """Event t (t = 0, 1, ...) runs an inner loop of t mod 3 trips; done after EVENTS events."""

    def init(self, key, workload, params):
        return {"t": jnp.int32(0), "trips": jnp.int32(0)}

    def step(self, state, workload, params):
        live = state["t"] < EVENTS
        n = jnp.where(live, state["t"] % 3, 0)
        _, trips = jax.lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] + params), (jnp.int32(0), jnp.int32(0)))
        return {"t": state["t"] + live, "trips": state["trips"] + trips}

    def metrics(self, state, workload, params):
        return {"trips": state["trips"], "overflow": jnp.bool_(False), "conservation_error": jnp.int32(0)}

    def num_steps(self, workload):
        return EVENTS

    def is_done(self, state):
        return state["t"] >= EVENTS


def _run(seeds=4):
    # 64 rows: XLA runs a much smaller program inline, without the per-operation events the profile counts
    return sim.run_grid(CountingModel(), jax.random.key(0), None, jnp.ones((16,), jnp.int32), seeds)


def test_counts_steps_and_loop_trips_exactly():
    want_trips = sum(t % 3 for t in range(EVENTS))
    assert int(np.asarray(_run().metrics["trips"])[0, 0]) == want_trips  # the model does what it says
    fig = program_cost.profile(_run, requests_per_row=10)
    assert fig["available"]
    assert fig["steps"] == BLOCKS * sim.DONE_CHECK_EVERY  # whole blocks, on one device
    assert fig["scan_steps_per_request"] == fig["steps"] / 10
    loops = [loop for loop in fig["nested_loops"] if loop["trips"]]
    assert len(loops) == 1 and loops[0]["trips"] == want_trips  # rows run the loop together: one row's trips
    assert loops[0]["trips_per_step"] == pytest.approx(want_trips / fig["steps"])
    loop_ops = loops[0]["ops_per_trip"]
    assert fig["compiled_ops_per_step"] >= 1 and loop_ops >= 1
    # the step's operations every step, the loop body's every trip, the loop's condition once more per step
    assert fig["launches"] >= fig["steps"] * fig["compiled_ops_per_step"] + want_trips * loop_ops
    assert fig["launches_per_step"] == fig["launches"] / fig["steps"]
    proj = program_cost.projection(fig, rows=1000, requests_per_row=10, us_per_launch=2.0)
    assert proj["requests_per_s"] == pytest.approx(1000 * 10 / (fig["launches"] * 2e-6))


def test_recording_keeps_the_advancing_programs_on_one_device():
    with sim.recording_programs() as launched:
        res = _run()
    assert len(launched) == 1  # the run program (init, metrics and done programs advance nothing)
    fn, args = launched[0]
    assert all(len(x.sharding.device_set) == 1 for x in jax.tree.leaves(args))
    assert res.metrics["trips"].shape == (16, 4)


def test_a_program_run_inline_is_reported_not_counted():
    fig = program_cost.profile(lambda: sim.run_grid(CountingModel(), jax.random.key(0), None, jnp.ones((2,), jnp.int32), 1), 10)
    assert not fig["available"] and "inline" in fig["why"]


def test_a_program_without_a_scan_step_is_not_counted():
    text = jax.jit(lambda x: x + 1).lower(jnp.float32(1)).compile().as_text()
    assert program_cost.step_body(program_cost.parse_hlo(text)) is None
    assert program_cost.program_figures(text, {}) is None


def test_the_report_prints_the_cost_table():
    fig = program_cost.profile(_run, requests_per_row=10)
    fig["projection"] = program_cost.projection(fig, rows=6, requests_per_row=10)
    res = {"config": {"preset": "quick", "compile_effort": "auto"}, "n_devices": 1, "device": {"kind": "cpu", "platform": "cpu"},
           "cores": {"used": 1, "per": "core", "os_cpu_count": 2}, "jax_version": jax.__version__,
           "load_average": {"before": None, "after": None}, "errors": [], "elapsed_s": 1.0,
           "models": [{"model": "counting", "sizes": [], "cost": fig}]}
    text = format_report(res)
    assert "cost per simulated request (counted, not timed)" in text
    row = next(line for line in text.splitlines() if line.startswith("counting "))
    assert f"{fig['scan_steps_per_request']:.2f}" in row and "@ 6 rows" in row
