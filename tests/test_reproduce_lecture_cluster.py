"""scripts/reproduce_lecture_cluster.py --quick on one experiment: its report section, claims and figure, and
properties its numbers must have (conservation, round robin's exact even split, ranges)."""

import json
import re
import runpy
import sys

import pytest

from tests.cli_helpers import SCRIPTS, resume_from


@pytest.mark.slow
def test_quick_cluster_finding2_report(tmp_path, monkeypatch, quick_report):
    out = tmp_path / "rep"
    resume_from(quick_report, out, ["lecture.cluster_finding2"])  # the suite's `reproduce all --quick` ran it; the wrapper resumes
    monkeypatch.setattr(sys, "argv", ["reproduce_lecture_cluster.py", "--quick", "--only", "cluster_finding2",
                                      "--out", str(out), "--no-progress"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(SCRIPTS / "reproduce_lecture_cluster.py"), run_name="__main__")
    assert done.value.code == 0
    text = (out / "report.md").read_text()
    assert "Lecture §2.4: the cluster's total cache" in text and "lecture.cluster_finding2" in text
    assert "**Claims**" in text and "round robin's hit rate stays flat" in text
    assert "cluster_finding1" not in text  # --only ran just this one
    pngs = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text)
    assert pngs == ["lecture_cluster_finding2.png"]
    for png in pngs:
        assert (out / png).stat().st_size > 0
    res = json.loads((out / "results.json").read_text())
    assert {r["verdict"] for r in res["results"]} <= {"reproduced", "direction only", "differs"}
    assert len(res["results"]) == 3  # flat, rises, exercise 4 (b): every claim runs in quick mode too
    data = res["experiments"]["lecture.cluster_finding2"]
    assert data["conservation_failures"] == []
    sizes = [int(g) for g in data if g.isdigit()]
    assert sizes == [2, 4]
    for g in sizes:
        recs = {r["policy"]: r["metrics"] for r in data[str(g)]}
        assert recs["rr"]["max_replica_share"]["mean"] == pytest.approx(1 / g)  # round robin splits exactly
        for m in recs.values():
            assert all(0 <= x <= 1 for x in m["hit_rate"]["per_seed"])
            assert all(1 - 1e-6 <= x <= g + 1e-6 for x in m["replication_factor"]["per_seed"])
            assert all(1 / g - 1e-9 <= x <= 1 for x in m["max_replica_share"]["per_seed"])
