"""`jaxroute capacity`: every model end to end, and bad input."""

import json

from jaxroute.cli import main
from tests.cli_helpers import cli


def test_capacity_dispatch_writes_json_and_plot(tmp_path, capsys):
    out, png = tmp_path / "c.json", tmp_path / "c.png"
    rc = main(["capacity", "dispatch", "--slo", "mean_response<=5", "--servers", "4", "--seeds", "2", "--requests",
               "8000", "--policies", "random,jsq", "--out", str(out), "--plot", str(png), "--no-progress"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "random" in text and "seeds known" in text and "round 1:" in text
    res = json.loads(out.read_text())
    assert res["command"] == "capacity" and res["config"]["seeds"] == 2  # the results convention of every command
    rows = {r["policy"]: r for r in res["results"]}
    jsq, rnd = rows["jsq"]["metrics"]["capacity"], rows["random"]["metrics"]["capacity"]
    assert rows["jsq"]["params"]["seeds_known"] == 2 and min(jsq["per_seed"]) > max(rnd["per_seed"]) - 0.05
    assert jsq["ci95"][0] <= jsq["mean"] <= jsq["ci95"][1] and not rows["jsq"]["overflow"]
    assert jsq["per_seed"] == rows["jsq"]["params"]["capacity_per_seed"]
    assert "capacity" in out.with_suffix(".csv").read_text()
    assert png.stat().st_size > 3000


def test_capacity_pd_more_groups_take_more_load(tmp_path, capsys):
    out = tmp_path / "pd.json"
    rc = main(["capacity", "pd", "--slo", "ttft_p90_s<=2", "--ratios", "1:1,2:2", "--workload", "toolbench",
               "--requests", "80", "--seeds", "2", "--points", "4", "--max-rounds", "3", "--tol", "0.1",
               "--rate-range", "0.5:60", "--out", str(out), "--no-progress"])
    assert rc == 0
    rows = {r["policy"]: r["metrics"]["capacity"] for r in json.loads(out.read_text())["results"]}
    assert rows["2:2 llmd_precise > br0"]["mean"] > rows["1:1 llmd_precise > br0"]["mean"]


def test_capacity_decode_more_ranks_take_more_load(tmp_path):
    # two rounds: a third refines the brackets near 4 req/s, whose runs (30 simulated seconds) took 2/3 of the time
    out = tmp_path / "d.json"
    rc = main(["capacity", "decode", "--slo", "tpot_p90_s<=0.0095,ttft_p90_s<=1", "--policies", "br0", "--workers", "2,4",
               "--requests", "120", "--rate-range", "4:256", "--seeds", "2", "--points", "4", "--max-rounds", "2", "--tol", "0.1",
               "--out", str(out), "--no-progress"])
    assert rc == 0
    rows = {r["policy"]: r for r in json.loads(out.read_text())["results"]}
    assert rows["br0@4"]["params"]["seeds_known"] == 2
    assert rows["br0@4"]["metrics"]["capacity"]["mean"] > rows["br0@2"]["metrics"]["capacity"]["mean"]


def test_capacity_bad_input(capsys):
    assert cli(["capacity", "dispatch", "--slo", "mean_response<5"]) == 2
    assert "METRIC<=VALUE" in capsys.readouterr().err
    assert cli(["capacity", "dispatch", "--slo", "nope<=5", "--seeds", "2", "--requests", "2000"]) != 0
    assert "unknown SLO metric 'nope'" in capsys.readouterr().err
    assert cli(["capacity", "cluster", "--slo", "ttft_p90_s<=1", "--policies", "nope"]) != 0
    assert "unknown router" in capsys.readouterr().err
    assert cli(["capacity", "dispatch", "--slo", "mean_response<=5", "--rate-range", "2:1"]) == 2
    assert "0 < LO < HI" in capsys.readouterr().err
    assert cli(["capacity", "pd", "--slo", "ttft_p90_s<=1", "--ratios", "0:2"]) == 2
    assert cli(["capacity"]) == 2
