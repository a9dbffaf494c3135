"""`jaxroute capacity` (WIP): dispatch and cluster end to end, and bad input."""

import json

from jaxroute.cli import main
from tests.cli_helpers import cli


def test_capacity_dispatch_writes_json_and_plot(tmp_path, capsys):
    out, png = tmp_path / "c.json", tmp_path / "c.png"
    rc = main(["capacity", "dispatch", "--slo", "mean_response<=5", "--servers", "4", "--seeds", "2", "--requests",
               "8000", "--policies", "random,jsq", "--out", str(out), "--plot", str(png), "--no-progress"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "random" in text and "seeds known" in text
    res = json.loads(out.read_text())
    rows = {r["row"]: r for r in res["rows"]}
    assert rows["jsq"]["known"] == 2 and min(rows["jsq"]["per_seed"]) > max(rows["random"]["per_seed"]) - 0.05
    assert png.stat().st_size > 3000


def test_capacity_bad_input(capsys):
    assert cli(["capacity", "dispatch", "--slo", "mean_response<5"]) == 2
    assert "METRIC<=VALUE" in capsys.readouterr().err
    assert cli(["capacity", "dispatch", "--slo", "nope<=5", "--seeds", "2", "--requests", "2000"]) != 0
    assert "unknown SLO metric 'nope'" in capsys.readouterr().err
    assert cli(["capacity", "cluster", "--slo", "ttft_p90_s<=1", "--policies", "sglang_cache_aware"]) != 0
    assert "unknown router" in capsys.readouterr().err
