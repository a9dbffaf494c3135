"""Compile effort: a small job compiles with less effort, a long one for speed, and the results are the same."""

import jax
import numpy as np
import pytest

from jaxroute import compile_effort, sim
from jaxroute.clusters import replicas as R
from jaxroute.clusters.dp_decode import DecodeModel
from jaxroute.clusters.queueing import DispatchModel
from jaxroute.errors import JaxrouteError
from jaxroute.workloads import prefix as W


def test_effort_follows_the_work_and_can_be_forced(monkeypatch):
    level = compile_effort.level
    assert level(compile_effort.FAST_MAX_WORK) == "fast" and level(compile_effort.FAST_MAX_WORK + 1) == "optimized"
    assert level(1) == "fast"  # a model without a calibrated minimal level never gets it
    assert level(500, minimal_max_work=500) == "minimal" and level(501, minimal_max_work=500) == "fast"
    with compile_effort.forced("optimized"):
        assert level(1, minimal_max_work=10) == "optimized"
        with compile_effort.forced("fast"):
            assert level(10**12) == "fast" and level(1, minimal_max_work=10) == "fast"
            with compile_effort.forced("minimal"):
                assert level(10**12) == "minimal"
        assert level(1) == "optimized"  # restored on leaving the inner blocks
    assert level(1) == "fast"
    with pytest.raises(JaxrouteError, match="unknown compile effort 'max'; choose from: auto, minimal, fast, optimized"):
        with compile_effort.forced("max"):
            pass
    monkeypatch.setenv(compile_effort.ENV, "optimized")  # a process-wide choice; a forced block still wins
    assert level(1) == "optimized"
    with compile_effort.forced("fast"):
        assert level(10**12) == "fast"
    monkeypatch.setenv(compile_effort.ENV, "quick")
    with pytest.raises(JaxrouteError, match="JAXROUTE_COMPILE_EFFORT='quick' is not a compile effort"):
        level(1)
    monkeypatch.delenv(compile_effort.ENV)
    assert compile_effort.options("optimized") is None
    assert compile_effort.options("fast") == compile_effort.FAST_OPTIONS
    assert compile_effort.options("minimal") == {**compile_effort.FAST_OPTIONS, "xla_backend_optimization_level": 0}
    for model in (R.ReplicaModel, DispatchModel, DecodeModel):  # calibrated: a tiny job of each compiles minimal
        assert 0 < model.minimal_max_work < compile_effort.FAST_MAX_WORK


def test_every_level_gives_the_same_replica_grid():
    """The suite's small exact-match runs compile at the lower levels; this holds the optimized program (long jobs)
    to them: at fast, every metric bit for bit; at minimal, every per-request record and every count bit for bit
    and each float statistic to its last bits."""
    wl = W.toolbench(60, n_tools=8, tool_mean=1500)
    model = R.ReplicaModel(n_replicas=3, max_running=8, max_queue=64, local_order="lpm",
                           router_policies=("rr", "least_load", "sglang_cache_aware"))
    rows = sim.stack_params([R.make_params(p, rate=30.0, kv_capacity=6000)
                             for p in ("rr", "least_load", "sglang_cache_aware")])
    sim.clear_compiled(model)
    grids, records = {}, {}
    for effort in compile_effort.LEVELS:
        with compile_effort.forced(effort):
            grids[effort] = sim.run_grid(model, jax.random.key(4), wl, rows, 2)
            tail = sim.last_traced_program().split()[-1]  # "... x1 minimal", "... x1 fast", "... x1"
            assert tail == effort if effort != "optimized" else tail.startswith("x")
            if effort != "fast":  # the records of the new level, one row (the fast level's are held by the grid)
                records[effort] = R.records(R.run_single(model, jax.random.key(4), wl, jax.tree.map(lambda x: x[2], rows)))
    assert sim.compile_count(model, "run") == 3  # one program per level
    optimized = grids["optimized"].metrics
    for effort in ("minimal", "fast"):
        low = grids[effort].metrics
        assert low.keys() == optimized.keys()
        for name in low:
            if effort == "minimal" and np.issubdtype(np.asarray(low[name]).dtype, np.floating):
                # a statistic over the records (a mean, an interpolated quantile): -O0 rounds some of its steps
                # separately where -O2 fuses them (a multiply-add), so its last bits may differ
                np.testing.assert_allclose(low[name], optimized[name], rtol=1e-6, err_msg=name)
            else:
                np.testing.assert_array_equal(low[name], optimized[name], err_msg=f"{effort}: {name}")
    for name in records["minimal"]:
        np.testing.assert_array_equal(records["minimal"][name], records["optimized"][name], err_msg=name)
    assert np.all(optimized["completed"] == 60)


def test_reproductions_compile_optimized_unless_told(tmp_path, monkeypatch):
    """A report's runs are long for their programs and reports are rerun: `reproduce` compiles optimized."""
    from jaxroute import reproduce
    from jaxroute.reproduce.document import Experiment

    class Seen(Exception):
        pass

    def run(ctx):
        raise Seen(compile_effort.effort())

    exp = Experiment("lecture", "effort", "the effort in force", run, lambda quick: 1)
    monkeypatch.delenv(compile_effort.ENV, raising=False)
    with pytest.raises(Seen, match="^optimized$"):
        reproduce._run_one(exp, tmp_path, quick=True, seeds=None, progress=False, echo=False)
    monkeypatch.setenv(compile_effort.ENV, "auto")
    with pytest.raises(Seen, match="^auto$"):
        reproduce._run_one(exp, tmp_path, quick=True, seeds=None, progress=False, echo=False)
    assert compile_effort.effort() == "auto"  # the block is left
