"""scripts/capacity_study.py --quick runs both workloads end to end (same code paths as the full study)."""

from pathlib import Path

import pytest

from tests.cli_helpers import run_quick


@pytest.mark.slow
def test_quick_capacity_study(tmp_path, capsys):
    text, data = run_quick("capacity_study", tmp_path / "cap.json", capsys)
    assert data["quick"] is True and len(data["capacity"]) == 2
    for part in data["capacity"]:
        assert len(part["rows"]) == len(data["routers"]) * len(data["replicas"])
        assert part["runs"] > 0 and part["batches"] >= part["rounds"]
        assert any(r["mean"] is not None for r in part["rows"].values())  # the search brackets some capacity
    assert "configurations x seeds" in text and "at the reference's speed" in text
    assert all(s["speedup"] > 0 for s in data["speed"])
    assert Path(tmp_path / "cap.png").stat().st_size > 5000
