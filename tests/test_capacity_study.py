"""scripts/capacity_study.py (a wrapper over jaxroute.reproduce.capacity_study) runs one capacity experiment in
quick mode: the report has its section, claims and figure, and the numbers obey the search's invariants."""

import json
import math
import re
import runpy
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import resume_from

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "capacity_study.py"
NAME = "capacity_shared_prefix"


@pytest.mark.slow
def test_quick_capacity_shared_prefix(tmp_path, monkeypatch, quick_report):
    resume_from(quick_report, tmp_path, ["production-routers.capacity_shared_prefix"])  # the suite's `reproduce all --quick` ran it; the wrapper resumes
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--quick", "--only", NAME, "--out", str(tmp_path), "--no-progress"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert done.value.code == 0
    text = (tmp_path / "report.md").read_text()
    assert "QUICK RUN" in text and "## Capacity under the SLO: shared-prefix" in text
    assert "| claim | where | source | ours (95 % CI) | verdict | reason |" in text
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text)
    assert figures and all((tmp_path / f).stat().st_size > 5000 for f in figures)
    assert "capacity_mooncake" not in text and "capacity_tuned" not in text  # --only ran just the one

    data = json.loads((tmp_path / "results.json").read_text())["experiments"][f"production-routers.{NAME}"]
    routers = {r["router"] for r in data["rows"].values()}
    counts = sorted({r["replicas"] for r in data["rows"].values()})
    assert "rr" in routers and len(counts) >= 2
    seeds, n_rows = data["seeds"], len(data["rows"])
    assert data["batches"] >= data["rounds"] and data["runs"] >= data["rounds"] * n_rows * seeds  # 4 rates per row
    lo, hi = data["rate_range"]
    for key, cell in data["per_seed"].items():
        assert len(cell["capacity"]) == seeds
        for c, ok, fail, status in zip(cell["capacity"], cell["ok"], cell["fail"], cell["status"], strict=True):
            if status == "known":  # the capacity is the bracket's lower end, strictly below its miss, in range
                assert c == ok and ok < fail and lo / 2 <= c <= 2 * hi, key
            else:
                assert c is None, key
        known = [c for c in cell["capacity"] if c is not None]
        if known:
            assert math.isclose(data["rows"][key]["mean"], sum(known) / len(known))
    # twice the replicas sustain more under round robin
    small, big = data["rows"][f"rr@{counts[0]}"]["mean"], data["rows"][f"rr@{counts[-1]}"]["mean"]
    assert small is not None and big is not None and small < big
    assert data["speed"]["runs"] == data["runs"] and data["speed"]["wall_s"] > 0


def _cell(caps, status, ok=None):
    """A part's per-seed record: a known seed's bracket is [capacity, 2 x capacity)."""
    ok = ok or list(caps)
    fail = [None if s != "known" else 2 * o for s, o in zip(status, ok, strict=True)]
    return {"capacity": caps, "ok": ok, "fail": fail, "overflowed": [s == "overflowed" for s in status],
            "status": status}


def _row(key, cell):
    known = [c for c in cell["capacity"] if c is not None]
    return {"router": key.split("@")[0], "replicas": int(key.split("@")[1]), "known": len(known),
            "mean": sum(known) / len(known) if known else None, "ci95": [0, 0], "per_seed": known}


def test_claims_use_lower_bounds_and_say_what_is_unknown():
    """No simulation: a seed that met the SLO at every rate tried counts as a lower bound (a growth still
    measured), an overflowed count leaves its steps unmeasured (direction only, with the reason)."""
    from jaxroute.reproduce import capacity_study as cs

    k = ["known"] * 3
    cells = {"rr@4": _cell([40.0, 42.0, 44.0], k), "rr@8": _cell([90.0, 95.0, 99.0], k),
             "rr@16": _cell([180.0, 190.0, 200.0], k),
             "preble@4": _cell([45.0, 48.0, 50.0], k),
             "preble@8": _cell([None] * 3, ["above"] * 3, ok=[790.0, 780.0, 785.0]),
             "preble@16": _cell([None] * 3, ["overflowed"] * 3, ok=[None] * 3)}
    rows = {key: _row(key, cell) for key, cell in cells.items()}
    part = {"workload": "shared-prefix", "seeds": 3, "rows": rows, "per_seed": cells}
    counts = (4, 8, 16)
    assert cs.growth_claim(part, "rr", counts).verdict == "reproduced"
    grow = cs.growth_claim(part, "preble", counts)
    assert grow.verdict == "direction only" and "8->16" in grow.reason and "overflowed" in grow.reason
    assert grow.ours.startswith("4->8: >= +")  # a lower bound
    claim, table = cs.cache_aware_claim(part, "preble", counts, ["rr"])
    assert claim.verdict == "direction only" and "not measured at 16" in claim.reason
    assert [r[1] for r in table] == [4, 8, 16] and table[1][2].startswith("≥") and table[2][2] == "not measured"
    text = cs.capacity_table(part, ["rr", "preble"], counts)
    assert "3 seed(s) met the SLO at every rate tried (>= 790 req/s)" in text and "3 seed(s) overflowed" in text
