"""scripts/reproduce_lecture_preble.py --quick runs every demo end to end (same code paths as the full run)."""

import pytest

from tests.cli_helpers import load_script, run_quick


def _load():
    return load_script("reproduce_lecture_preble")


@pytest.mark.slow
def test_quick_reproduction_runs_every_demo(tmp_path, capsys):
    text, data = run_quick("reproduce_lecture_preble", tmp_path / "preble.json", capsys)
    for heading in ("[demo 1]", "[demo 2]", "[demo 3]", "[demo 5]", "[finding 1]", "[ablation]"):
        assert heading in text
    assert text.count("lecture:") >= 5 and "paper (Fig. 5)" in text  # each demo prints its source beside ours
    assert data["config"]["quick"] is True and len(data["elapsed_s"]["grids"]) == 12
    assert len(data["demo1"]) == 10  # five workloads x two loads
    for cell in data["demo1"].values():
        assert cell["ratio_mean"]["mean"] > 0 and cell["arrival_span_s"] > 0
    terms = data["demo2"]["terms"]["toolbench"]
    assert terms["e2_mean_L_s"]["mean"] > terms["e2_mean_P_s"]["mean"] >= 0  # L dominates
    assert data["demo2"]["pairing"]["toolbench"]["off"]["metrics"]["e2_paired"]["mean"] == 0
    assert [s["step"] for s in data["ablation"]][:4] == ["E2", "+ rebalancing", "+ pairing", "+ priority groups"]
    assert set(data["demo5"]) == {"fcfs", "priority", "lpm"}
    hot = {r["policy"]: r for r in data["demo3"]["records"]}
    assert hot["preble_e2 no rebalancing"]["metrics"]["e2_rebalanced"]["mean"] == 0
    assert hot["preble_e2 Th_bal=1.2"]["metrics"]["e2_rebalanced"]["mean"] > 0


def test_unknown_demo_is_refused(capsys):
    with pytest.raises(SystemExit):
        _load().main(["--demos", "7"])
    assert "unknown demo" in capsys.readouterr().err
