"""scripts/reproduce_lecture_selector.py (a wrapper over jaxroute.reproduce.llmselector) writes the report."""

import json
import re
import runpy
import sys

import numpy as np
import pytest

from jaxroute.reproduce import llmselector
from tests.cli_helpers import SCRIPTS


def test_quick_noisy_diagnoser_report(tmp_path, monkeypatch):
    out = tmp_path / "sel"
    monkeypatch.setattr(sys, "argv", ["reproduce_lecture_selector.py", "--quick", "--only", "noisy_diagnoser",
                                      "--out", str(out), "--no-progress"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(SCRIPTS / "reproduce_lecture_selector.py"), run_name="__main__")
    assert exit_info.value.code == 0
    text = (out / "report.md").read_text()
    assert "QUICK RUN" in text and "debate with a noisy diagnoser" in text
    assert "| claim | where | source | ours (95 % CI) | verdict | reason |" in text
    assert "evaluates 68 allocations" in text and "not monotonically" in text
    links = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text)
    assert links == ["llmselector_noisy_diagnoser.png"]
    assert all((out / f).exists() for f in links)

    data = json.loads((out / "results.json").read_text())
    assert {r["policy"] for r in data["results"]} == {"llmselector.noisy_diagnoser"}
    exp = data["experiments"]["llmselector.noisy_diagnoser"]
    assert exp["q"] == list(llmselector.DIAGNOSER_Q)
    for ev, te in zip(exp["allocations_evaluated"], exp["test_accuracy"], strict=True):
        # debate has 6 modules: the stopping rule (7 identical allocations counting the initial one) needs at
        # least 6 rounds of 5 candidates; each pool value is a mean over 2 seeds of multiples of 5
        assert all(x >= 30 and (2 * x) % 5 == 0 for x in ev["per_seed"])
        assert all(0 <= x <= 1 for x in te["per_seed"])
    assert exp["hit_round_cap_fraction"] == [0.0] * len(llmselector.DIAGNOSER_Q)


def test_pareto_frontier_and_verdict_helpers():
    cost = np.array([2.0, 1.0, 3.0, 1.0, 5.0])
    acc = np.array([0.5, 0.2, 0.4, 0.3, 0.9])
    assert llmselector.pareto(cost, acc) == [3, 0, 4]  # the cheaper tie wins; dominated allocations drop out
    assert llmselector._share_verdict(1.0, "x")[0] == "reproduced"
    assert llmselector._share_verdict(0.75, "x")[0] == "direction only"
    assert llmselector._share_verdict(0.5, "x")[0] == "differs"
    s = llmselector._pools(np.array([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]]))  # [S, P]: seeds averaged per pool
    assert s.per_seed == (2.0, 3.0, 4.0) and s.lo < 3.0 < s.hi
    assert llmselector._range_verdict({"a": s}, 2.0, 4.0)[0] == "reproduced"
    assert llmselector._range_verdict({"a": s}, 10.0, 20.0)[0] == "direction only"
