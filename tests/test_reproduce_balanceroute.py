"""scripts/reproduce_balanceroute.py: the wrapper over jaxroute.reproduce.balanceroute writes a report.

One quick experiment (`sensitivity`: one compiled grid) end to end; the others share its code paths
(run_comparison, best_baseline, the gain claims). The calibration script's quick run is checked here too.
"""

import json
import re
import runpy
import sys

import pytest

from tests.cli_helpers import SCRIPTS, resume_from, run_quick


def _wrapper(argv, monkeypatch) -> int:
    """`python scripts/reproduce_balanceroute.py argv` in this process; its exit code."""
    monkeypatch.setattr(sys, "argv", ["reproduce_balanceroute.py", *argv])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(SCRIPTS / "reproduce_balanceroute.py"), run_name="__main__")
    return done.value.code


@pytest.mark.slow
def test_quick_sensitivity_report(tmp_path, monkeypatch, quick_report):
    out = tmp_path / "rep"
    resume_from(quick_report, out, ["balanceroute.sensitivity"])  # the suite's `reproduce all --quick` ran it; the wrapper resumes
    assert _wrapper(["--quick", "--only", "sensitivity", "--out", str(out), "--no-progress"], monkeypatch) == 0
    text = (out / "report.md").read_text()
    assert "QUICK RUN" in text and "BalanceRoute §12: oracle BR-H's beta x gamma sensitivity" in text
    assert "**Claims**" in text and "| claim | where | source | ours (95 % CI) | verdict | reason |" in text
    assert "the main table" not in text  # --only ran just this one
    for link in re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text):
        assert (out / link).stat().st_size > 1000
    res = json.loads((out / "results.json").read_text())
    assert len(res["results"]) == 3 and {r["verdict"] for r in res["results"]} <= {"reproduced", "direction only",
                                                                                    "differs"}
    data = res["experiments"]["balanceroute.sensitivity"]
    assert data["conservation_error"] == 0  # every request and token accounted for, in every row and seed
    recs = data["records"]
    assert [r["policy"] for r in recs] == ["random", "rr", "p2c", "jsq", "brh", "brh"]  # 4 baselines, 1 x 2 cells
    assert [(r["params"]["beta"], r["params"]["gamma"]) for r in recs[4:]] == [(8.0, 0.9), (8.0, 0.99)]
    best = max(recs[:4], key=lambda r: r["metrics"]["throughput_tok_s"]["mean"])
    assert best["metrics"]["throughput_tok_s_vs_best_pct"]["mean"] == 0  # gains are against the best baseline
    for r in recs:
        m = {k: v["mean"] for k, v in r["metrics"].items()}
        assert m["completed"] == 40 and not r["overflow"]  # every request decoded, none lost
        # per step G max - sum = sum over workers of (max - L_g) >= max - min: so on the step means too
        assert 0 <= m["imbalance_tokens"] <= m["barrier_idle_tokens"] * (1 + 1e-5)
        assert 0 <= m["util_min"] <= m["util_mean"] <= 1 + 1e-6
    assert data["gains_pct"] == [r["metrics"]["throughput_tok_s_vs_best_pct"]["mean"] for r in recs[4:]]


def test_unknown_experiment_is_refused(monkeypatch, capsys):
    assert _wrapper(["--only", "ladder,plots"], monkeypatch) == 2
    assert "unknown experiment(s) plots" in capsys.readouterr().err


def test_calibration_script_quick(tmp_path, capsys):
    text, data = run_quick("calibrate_decode_workloads", tmp_path / "cal.json", capsys)
    assert "synthetic-azure24" in text and "synthetic-prod" in text and "chosen" in text
    assert data
