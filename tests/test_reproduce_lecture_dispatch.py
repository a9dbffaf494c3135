"""scripts/reproduce_lecture_dispatch.py (a wrapper over jaxroute.reproduce.lecture_dispatch) writes the report."""

import json
import re
import runpy
import sys

import pytest

from tests.cli_helpers import SCRIPTS, resume_from


@pytest.mark.slow
def test_quick_theory_report(tmp_path, monkeypatch, quick_report):
    out = tmp_path / "disp"
    resume_from(quick_report, out, ["lecture.theory"])  # the suite's `reproduce all --quick` ran it; the wrapper resumes
    monkeypatch.setattr(sys, "argv", ["reproduce_lecture_dispatch.py", "--quick", "--only", "theory", "--out", str(out),
                                      "--no-progress"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(SCRIPTS / "reproduce_lecture_dispatch.py"), run_name="__main__")
    assert exit_info.value.code == 0
    text = (out / "report.md").read_text()
    assert "QUICK RUN" in text and "## Lecture §1: queueing theory checks" in text
    links = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text)
    assert links == ["lecture_supermarket.png"] and (out / links[0]).stat().st_size > 1000
    data = json.loads((out / "results.json").read_text())
    claims = [r for r in data["results"] if r["policy"] == "lecture.theory"]
    assert len(claims) == 5
    # M/M/1 at rho 0.5 and 0.8: mean response 1 / (1 - rho) within 5 % (theory, not a tuned number)
    for rec, rho in zip(claims[:2], (0.5, 0.8), strict=True):
        assert abs(rec["metrics"]["ours"]["mean"] - 1 / (1 - rho)) <= 0.05 / (1 - rho)
    mm1 = data["experiments"]["lecture.theory"]["mm1"]
    assert mm1[0]["metrics"]["mean_response"]["mean"] < mm1[1]["metrics"]["mean_response"]["mean"]  # load raises it
