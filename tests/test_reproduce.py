"""`jaxroute reproduce`: claims and verdicts, the report, resuming, refusals (fake experiments; no simulation)."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxroute import cli, sim
from jaxroute import reproduce as rp
from jaxroute.errors import JaxrouteError
from jaxroute.metrics import summarize
from jaxroute.reproduce.document import (
    Claim,
    Experiment,
    Section,
    gain_verdict,
    holds_verdict,
    load_part,
    value_verdict,
)


def test_value_verdict_uses_the_ci_and_the_tolerance():
    s = summarize(np.array([9.0, 10.0, 11.0]))
    assert value_verdict(s, 10.5)[0] == "reproduced"  # inside the CI
    assert value_verdict(summarize(np.array([10.0, 10.0])), 11.0, rel_tol=0.15)[0] == "reproduced"
    verdict, reason = value_verdict(summarize(np.array([10.0, 10.0])), 20.0, rel_tol=0.15)
    assert verdict == "differs" and "0.50x" in reason


def test_gain_verdict_sign_size_and_noise():
    big = summarize(np.array([20.0, 22.0, 21.0]))
    assert gain_verdict(big, 21.0)[0] == "reproduced"
    assert gain_verdict(big, 5.0)[0] == "direction only"  # same sign, 4x the size
    assert gain_verdict(big, -10.0)[0] == "differs"  # the source claims the other direction
    assert gain_verdict(summarize(np.array([-1.0, 2.0, 0.5])), 1.0)[0] == "differs"  # CI includes 0
    assert gain_verdict(big, None) == ("direction only", "the source states a direction, not a number")
    assert gain_verdict(summarize(np.array([-3.0, -4.0, -3.5, -3.2])), -3.5)[0] == "reproduced"


def test_a_claim_that_is_not_reproduced_needs_a_reason():
    with pytest.raises(ValueError, match="without a reason"):
        Claim("x", "§1", "1", "2", "differs")
    with pytest.raises(ValueError, match="verdict must be one of"):
        Claim("x", "§1", "1", "2", "roughly")
    assert holds_verdict(False, "no")[0] == "differs"


def _grid_of(overflow: bool, superseded: bool = False):
    """A tiny grid whose runs overflowed or not (a superseded one is dropped, as a rerun with a larger capacity
    drops it)."""
    grid = sim.run_batch_fn(lambda k, w, p: {"overflow": p > 0}, jax.random.key(0), None, jnp.array([overflow]), 1)
    if superseded:
        sim.discard_grid(grid.metrics)


def _fake_experiments(calls, figure=True):
    def make(name, verdict):
        def run(ctx):
            calls.append(name)
            _grid_of(overflow=True, superseded=True)
            _grid_of(overflow=name == "second")
            ctx.advance("one")
            ctx.log(f"{name} ran")
            figs = []
            if figure:
                path, file = ctx.figure("fake", name)
                path.write_bytes(b"\x89PNG fake")
                figs = [(f"{name} figure", file)]
            s = summarize(np.array([1.0, 2.0, 3.0]))
            reason = "" if verdict == "reproduced" else "because"
            return Section("fake", name, f"Fake {name}", intro="intro text",
                           claims=[Claim(f"{name} claim | with a pipe", "§9", "2", "2 ± 1", verdict, reason, s.as_json())],
                           tables=[("a table", "| a |\n|---|\n| 1 |")], figures=figs, data={"x": [1, 2]}, seeds=3)
        return Experiment("fake", name, f"fake {name}", run, lambda q: 1)

    return [make("first", "reproduced"), make("second", "differs")]


def test_report_results_json_and_resume(tmp_path, monkeypatch):
    calls = []
    exps = _fake_experiments(calls)
    path, sections = rp.run(["fake"], tmp_path, quick=True, todo=exps, progress=False, echo=False, command="cmd")
    assert calls == ["first", "second"]
    text = path.read_text()
    assert "QUICK RUN" in text and "- command: `cmd`" in text and "git commit" in text and "device:" in text
    assert "1 reproduced, 0 direction only, 1 differs (2 claims)" in text
    for s in sections:
        assert f"## {s.title}" in text
    assert "claim \\| with a pipe" in text  # a pipe inside a cell does not break the table
    for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (tmp_path / link).exists()
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["command"] == "reproduce" and len(res["results"]) == 2
    assert res["results"][1]["verdict"] == "differs" and res["results"][1]["metrics"]["ours"]["mean"] == 2.0
    # a claim's overflow flag comes from the grids its experiment kept (not the superseded one)
    assert [r["overflow"] for r in res["results"]] == [False, True]
    assert res["experiments"]["fake.first"] == {"x": [1, 2]}
    # resume: both parts exist, nothing runs again; --fresh reruns; a full-size run does not reuse quick parts
    calls.clear()
    _, again = rp.run(["fake"], tmp_path, quick=True, todo=exps, progress=False, echo=False)
    assert calls == [] and all(s.resumed for s in again) and [s.overflow for s in again] == [False, True]
    assert "resumed from an earlier run" in (tmp_path / "report.md").read_text()
    rp.run(["fake"], tmp_path, quick=True, todo=exps, progress=False, echo=False, fresh=True, only=["second"])
    assert calls == ["second"]
    assert load_part(tmp_path, "fake", "first", quick=False) is None
    # an interrupted run: one part missing -> only that one runs
    (tmp_path / "parts" / "fake.first.json").unlink()
    calls.clear()
    rp.run(["fake"], tmp_path, quick=True, todo=exps, progress=False, echo=False)
    assert calls == ["first"]


def test_a_part_file_that_is_corrupt_is_run_again(tmp_path):
    calls = []
    exps = _fake_experiments(calls, figure=False)
    rp.run(["fake"], tmp_path, todo=exps, progress=False, echo=False)
    (tmp_path / "parts" / "fake.first.json").write_text("{not json")
    calls.clear()
    rp.run(["fake"], tmp_path, todo=exps, progress=False, echo=False)
    assert calls == ["first"]


def test_a_linked_figure_that_was_not_written_is_an_error(tmp_path):
    def run(ctx):
        return Section("fake", "bad", "Bad", figures=[("missing", "nope.png")])

    with pytest.raises(RuntimeError, match="nope.png"):
        rp.run(["fake"], tmp_path, todo=[Experiment("fake", "bad", "bad", run)], progress=False, echo=False)


def test_unknown_source_and_experiment_are_refused(tmp_path, capsys):
    with pytest.raises(JaxrouteError, match="unknown source 'nope'"):
        rp.parse_sources("lecture,nope")
    assert rp.parse_sources("all") == list(rp.SOURCES)
    with pytest.raises(JaxrouteError, match="unknown experiment"):
        rp.run(["lecture"], tmp_path, only=["nope"], progress=False, echo=False)
    with pytest.raises(SystemExit):
        cli.main(["reproduce", "nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err
    assert cli.main(["reproduce", "lecture", "--only", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown experiment(s) nope" in capsys.readouterr().err


def test_list_names_every_experiment(capsys):
    assert cli.main(["reproduce", "all", "--list"]) == 0
    out = capsys.readouterr().out
    for source in rp.SOURCES:
        for e in rp.experiments(source):
            assert e.name in out


def test_every_experiment_name_is_unique_within_its_source():
    for source in rp.SOURCES:
        names = [e.name for e in rp.experiments(source)]
        assert len(names) == len(set(names)), source
        assert all(e.source == source for e in rp.experiments(source))


@pytest.mark.parametrize("lines, expect", [
    (([0.41, 0.415], [0.44, 0.454], [0.46, 0.48]), {"0.42", "0.45", "0.48"}),  # under 3x: every step labelled
    (([2.0, 5.0], [2.1, 4.0]), {"2", "3", "5"}),  # under 30x: 2, 3 and 5 labelled
])
def test_a_narrow_log_axis_shows_its_values(lines, expect):
    """A log axis spanning less than a decade has no major tick inside it: its minor ticks carry the numbers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxroute import report

    fig, ax = plt.subplots()
    for y in lines:
        ax.plot([8, 16], y)
    report.log_scale(ax)
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    ticks = zip(ax.yaxis.get_minorticklabels(), ax.yaxis.get_minorticklocs(), strict=True)
    shown = {t.get_text() for t, v in ticks if lo <= v <= hi}
    plt.close(fig)
    assert expect <= shown


def test_a_ci_band_of_a_nonnegative_metric_stops_at_zero():
    """Two seeds' t interval of a goodput can reach below 0; its band is cut at 0 (at half the mean on a log
    axis, where 0 cannot be drawn), and a band clear of 0 is left as it is."""
    from jaxroute import report
    from jaxroute.metrics import summarize

    wide, narrow = summarize(np.array([0.1, 2.0])), summarize(np.array([5.0, 5.2]))
    assert wide.lo < 0 < narrow.lo
    band = report.ci_band([wide, narrow])
    assert band["lo"] == [0.0, narrow.lo] and band["hi"] == [wide.hi, narrow.hi]
    assert band["y"] == [wide.mean, narrow.mean]
    assert report.ci_band([wide, narrow], log=True)["lo"] == [wide.mean / 2, narrow.lo]


def test_many_panels_wrap_into_rows(tmp_path):
    """Five panels in one row were 3,500 px wide and unreadable where the report shows them: they wrap after
    PANELS_PER_ROW, so five panels are as wide as three, on two rows."""
    import matplotlib.image

    from jaxroute import report

    def png(n):
        panels = {f"panel {i}": [dict(x=[1, 2], y=[1.0, 2.0], lo=[0.5, 1.5], hi=[1.5, 2.5], label="a")]
                  for i in range(n)}
        path = report.line_plot(panels, tmp_path / f"{n}.png", xlabel="x", ylabel="y")
        return matplotlib.image.imread(path).shape[:2]

    (h3, w3), (h5, w5) = png(report.PANELS_PER_ROW), png(5)
    assert report.PANELS_PER_ROW == 3 and w5 == w3 and h5 > 1.8 * h3


def test_worker_tasks_keep_shared_state_together_and_start_the_longest(tmp_path):
    from jaxroute.reproduce.document import save_part

    todo = rp.experiments("lecture") + rp.experiments("production-routers")
    plan = rp.plan_tasks(todo, tmp_path, quick=True)
    assert sorted(k for task in plan for k in task) == sorted((e.source, e.name) for e in todo)  # each once
    preble = [t for t in plan if ("lecture", "preble_fig3") in t]
    assert len(preble) == 1 and len(preble[0]) == 6  # lecture_preble shares its grids: one task, in order
    capacity = [t for t in plan if ("production-routers", "capacity_shared_prefix") in t][0]
    assert capacity[0] == ("production-routers", "capacity_shared_prefix")  # its part is read by the next two
    assert [("lecture", "theory")] in plan and [("production-routers", "routers_mooncake")] in plan
    # no earlier parts: the tasks of several experiments first, then the later source's (the production routers')
    assert plan[0] == preble[0] and plan[1] == capacity and plan[2][0][0] == "production-routers"
    assert plan[-1] == [("lecture", "theory")]
    # with an earlier run's parts, the longest task first
    for e in todo:
        save_part(tmp_path, Section(e.source, e.name, e.title, quick=True, wall_s=100.0 if e.name == "theory" else 1.0))
    assert rp.plan_tasks(todo, tmp_path, quick=True)[0] == [("lecture", "theory")]
    assert rp.plan_tasks(todo, tmp_path, quick=False)[0] == preble[0]  # full-size parts: none


def test_ctrl_c_stops_the_workers_at_once_and_says_what_was_saved(tmp_path):
    """Ctrl-C on `reproduce --jobs 2`: the workers stop with it (they went on finishing and saving experiments),
    one line says how many experiments are saved for a rerun to resume, exit 130."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "r"
    env = {k: v for k, v in os.environ.items() if k != "JAXROUTE_COMPILE_LOG"}  # the suite's log is not this run's
    proc = subprocess.Popen([sys.executable, "-m", "jaxroute", "reproduce", "lecture", "--quick", "--jobs", "2",
                             "--no-progress", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)

    def workers() -> list[int]:
        kids = []
        for task in os.listdir(f"/proc/{proc.pid}/task"):
            with open(f"/proc/{proc.pid}/task/{task}/children") as f:
                kids += [int(x) for x in f.read().split()]
        return kids

    deadline = time.monotonic() + 120
    while len(workers()) < 2 and time.monotonic() < deadline:  # the pool's workers (and its resource tracker)
        time.sleep(0.2)
    started = workers()
    assert len(started) >= 2, started
    time.sleep(3)  # the workers are importing or compiling
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    lines = err.strip().splitlines()
    assert re.fullmatch(r"jaxroute reproduce: interrupted; \d+ of \d+ experiments saved in .*parts, rerun the same "
                        r"command to resume", lines[-1]), lines[-3:]
    assert "Traceback" not in err
    time.sleep(1)
    for pid in started:  # gone, or a zombie waiting to be reaped: not running an experiment
        try:
            with open(f"/proc/{pid}/stat") as f:
                assert f.read().split(") ")[1][0] in "ZX", f"worker {pid} still runs"
        except FileNotFoundError:
            pass
