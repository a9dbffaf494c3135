"""Compile effort: a small job compiles fast, a long one for speed, and the results are the same bit for bit."""

import jax
import numpy as np
import pytest

from jaxroute import compile_effort, sim
from jaxroute.clusters import replicas as R
from jaxroute.errors import JaxrouteError
from jaxroute.workloads import prefix as W


def test_effort_follows_the_work_and_can_be_forced(monkeypatch):
    assert compile_effort.is_fast(compile_effort.FAST_MAX_WORK)
    assert not compile_effort.is_fast(compile_effort.FAST_MAX_WORK + 1)
    with compile_effort.forced("optimized"):
        assert not compile_effort.is_fast(1)
        with compile_effort.forced("fast"):
            assert compile_effort.is_fast(10**12)
        assert not compile_effort.is_fast(1)  # restored on leaving the inner block
    assert compile_effort.is_fast(1)
    with pytest.raises(JaxrouteError, match="unknown compile effort 'max'; choose from: auto, fast, optimized"):
        with compile_effort.forced("max"):
            pass
    monkeypatch.setenv(compile_effort.ENV, "optimized")  # a process-wide choice; a forced block still wins
    assert not compile_effort.is_fast(1)
    with compile_effort.forced("fast"):
        assert compile_effort.is_fast(10**12)
    monkeypatch.setenv(compile_effort.ENV, "quick")
    with pytest.raises(JaxrouteError, match="JAXROUTE_COMPILE_EFFORT='quick' is not a compile effort"):
        compile_effort.is_fast(1)
    monkeypatch.delenv(compile_effort.ENV)
    assert compile_effort.options(False) is None
    assert compile_effort.options(True) == compile_effort.FAST_OPTIONS


# floats of two differently compiled programs: XLA's CPU code differs with the host's instruction set (one ulp seen
# in kv_usage_mean on another machine of the CI kind); counts and decisions stay exact
FLOAT_ULPS = 4


def test_both_efforts_give_the_same_replica_grid(monkeypatch):
    """The suite's small exact-match runs compile fast; this holds the optimized program (long jobs) to them.
    12 rows on the suite's 4 devices: the fast program runs a device's 3 rows one at a time, the optimized one
    vmapped together (as a device holding more than a group's rows would: `sim.rows_together`)."""
    wl = W.toolbench(60, n_tools=8, tool_mean=1500)
    model = R.ReplicaModel(n_replicas=3, max_running=8, max_queue=64, local_order="lpm",
                           router_policies=("rr", "least_load", "sglang_cache_aware"))
    rows = sim.stack_params([R.make_params(p, rate=30.0, kv_capacity=6000)
                             for p in ("rr", "least_load", "sglang_cache_aware")])
    sim.clear_compiled(model)
    grids = {}
    for effort in ("fast", "optimized"):
        monkeypatch.setenv(sim.ROWS_TOGETHER_ENV, "" if effort == "fast" else "3")
        with compile_effort.forced(effort):
            grids[effort] = sim.run_grid(model, jax.random.key(4), wl, rows, 4)
        assert sim.last_traced_program().endswith(" x1 fast" if effort == "fast" else " x3")
    assert sim.compile_count(model, "run") == 2  # one program per effort
    fast, optimized = grids["fast"].metrics, grids["optimized"].metrics
    assert fast.keys() == optimized.keys()
    for name in fast:  # counts and decisions exact; floats within a few ulp (XLA's CPU code follows the host's ISA)
        a, b = np.asarray(fast[name]), np.asarray(optimized[name])
        if not np.issubdtype(a.dtype, np.floating):
            np.testing.assert_array_equal(a, b, err_msg=name)
            continue
        finite = np.isfinite(a)
        np.testing.assert_array_equal(finite, np.isfinite(b), err_msg=name)
        np.testing.assert_array_equal(a[~finite], b[~finite], err_msg=name)
        np.testing.assert_array_max_ulp(a[finite], b[finite], maxulp=FLOAT_ULPS)
    assert np.all(fast["completed"] == 60)


def test_reproductions_follow_the_job_unless_told(tmp_path, monkeypatch):
    """A report's runs compile at their job's effort (a quick report's small grids fast, unbatched: README has
    the cold and warm times at both efforts), or at the process-wide effort when one is set."""
    from jaxroute import reproduce
    from jaxroute.reproduce.document import Experiment

    class Seen(Exception):
        pass

    def run(ctx):
        raise Seen(compile_effort.effort())

    exp = Experiment("lecture", "effort", "the effort in force", run, lambda quick: 1)
    monkeypatch.delenv(compile_effort.ENV, raising=False)
    with pytest.raises(Seen, match="^auto$"):
        reproduce._run_one(exp, tmp_path, quick=True, seeds=None, progress=False, echo=False)
    monkeypatch.setenv(compile_effort.ENV, "optimized")
    with pytest.raises(Seen, match="^optimized$"):
        reproduce._run_one(exp, tmp_path, quick=True, seeds=None, progress=False, echo=False)
