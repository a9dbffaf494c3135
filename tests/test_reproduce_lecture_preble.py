"""scripts/reproduce_lecture_preble.py: the wrapper over jaxroute.reproduce.lecture_preble writes a report.

One quick experiment (the hot tool: one compiled grid) end to end; the others share its code paths.
"""

import json
import re
import runpy
import sys

import pytest

from tests.cli_helpers import SCRIPTS, resume_from


def _wrapper(argv, monkeypatch) -> int:
    """`python scripts/reproduce_lecture_preble.py argv` in this process; its exit code."""
    monkeypatch.setattr(sys, "argv", ["reproduce_lecture_preble.py", *argv])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(SCRIPTS / "reproduce_lecture_preble.py"), run_name="__main__")
    return done.value.code


@pytest.mark.slow
def test_quick_hot_tool_report(tmp_path, monkeypatch, quick_report):
    out = tmp_path / "rep"
    resume_from(quick_report, out, ["lecture.preble_hot_tool"])  # the suite's `reproduce all --quick` ran it; the wrapper resumes
    assert _wrapper(["--quick", "--only", "preble_hot_tool", "--out", str(out), "--no-progress"], monkeypatch) == 0
    text = (out / "report.md").read_text()
    assert "QUICK RUN" in text and "Lecture §3.4 demo 3" in text and "**Claims**" in text
    assert "| claim | where | source | ours (95 % CI) | verdict | reason |" in text
    assert "preble_fig3" not in text  # --only ran just this one
    links = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text)
    assert links == ["lecture_preble_hot_tool.png"] and (out / links[0]).stat().st_size > 5000
    res = json.loads((out / "results.json").read_text())
    assert len(res["results"]) == 4 and {r["verdict"] for r in res["results"]} <= {"reproduced", "direction only",
                                                                                    "differs"}
    data = res["experiments"]["lecture.preble_hot_tool"]
    assert set(data["checks"]) == {"hot/fcfs"}
    check = data["checks"]["hot/fcfs"]
    assert check["conservation_failures"] == [] and check["all_completed"] and not check["overflow"]
    recs = {r["policy"]: r["metrics"] for r in data["records"]}
    # rebalancing is off exactly where Th_bal is infinite; it fires at the lowest threshold
    assert recs["preble_e2 no rebalancing"]["e2_rebalanced"]["mean"] == 0
    assert recs["preble_e2 Th_bal=1.2"]["e2_rebalanced"]["mean"] > 0
    # the run is far shorter than the 3-minute detector's 90 s, so autoscaling with it is a no-op: per seed equal
    # to the same row without the switch
    assert recs["preble_e2 + autoscaling"]["e2_autoscaled"]["mean"] == 0
    for m in ("mean_latency_s", "p99_latency_s"):
        assert recs["preble_e2 + autoscaling"][m]["per_seed"] == recs["preble_e2 Th_bal=1.5"][m]["per_seed"]
    # with 8 replicas the busiest replica takes at least 1/8 of the requests; rebalancing spreads the hot tool
    assert all(1 / 8 - 1e-6 <= r["max_replica_share"]["mean"] <= 1 for r in recs.values())
    assert recs["preble_e2 no rebalancing"]["max_replica_share"]["mean"] > recs["preble_e2 Th_bal=1.2"][
        "max_replica_share"]["mean"]


def test_unknown_experiment_is_refused(monkeypatch, capsys):
    assert _wrapper(["--only", "preble_nope"], monkeypatch) == 2
    assert "unknown experiment(s) preble_nope" in capsys.readouterr().err
