"""`jaxroute cluster` end to end: table, JSON, PNG, traces, and bad input."""

import json

import pytest

from jaxroute.cli import main
from tests.cli_helpers import cli, leak
from tests.data_paths import AZURE_CONV, MOONCAKE, require


def test_cluster_writes_table_json_and_plot(tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    rc = main(["cluster", "--workload", "toolbench", "--requests", "80", "--seeds", "2", "--rate", "20",
               "--policies", "rr,threshold,cache_guard", "--cost-model", "preble", "--local", "lpm", "--stale", "1",
               "--out", str(out), "--plot", str(png)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "hit_rate" in text and "cache_guard" in text and "requests/s" in text
    res = json.loads(out.read_text())
    assert res["command"] == "cluster" and len(res["results"]) == 3
    assert res["config"]["cost_model"] == "preble" and res["config"]["local"] == "lpm"
    row = res["results"][1]
    assert row["policy"] == "threshold" and row["params"]["theta"] == 0.5 and row["params"]["stale_s"] == 1.0
    assert len(row["metrics"]["mean_latency_s"]["per_seed"]) == 2
    assert png.stat().st_size > 1000


def test_cluster_preble_e2(tmp_path, capsys):
    out = tmp_path / "e2.json"
    rc = main(["cluster", "--workload", "toolbench", "--requests", "60", "--seeds", "2", "--rate", "20",
               "--policies", "least_load,preble_e2", "--e2-window", "60", "--e2-th-bal", "2", "--out", str(out)])
    assert rc == 0
    assert "preble_e2" in capsys.readouterr().out
    res = json.loads(out.read_text())
    row = res["results"][1]
    assert row["policy"] == "preble_e2" and row["params"]["e2_window_s"] == 60.0 and row["params"]["e2_th_bal"] == 2.0
    assert "e2_th_bal" not in res["results"][0]["params"]
    assert res["config"]["e2_th_bal"] == 2.0


def test_cluster_on_traces(tmp_path, capsys):
    rc = main(["cluster", "--workload", "mooncake", "--trace", str(require(MOONCAKE)),
               "--requests", "40", "--seeds", "1", "--policies", "rr,affinity", "--rate", "2",
               "--out", str(tmp_path / "m.json")])
    assert rc == 0
    rc = main(["cluster", "--workload", "azure-conv", "--trace", str(require(AZURE_CONV)),
               "--requests", "40", "--seeds", "1", "--policies", "rr", "--out", str(tmp_path / "a.json")])
    assert rc == 0
    azure = json.loads((tmp_path / "a.json").read_text())
    assert azure["results"][0]["metrics"]["hit_rate"]["mean"] == 0.0  # no sharing in Azure


@pytest.mark.parametrize("argv, msg", [
    (["--workload", "chat"], "unknown workload"),
    (["--policies", "rr,jsq"], "unknown policy"),
    (["--rate", "-1"], "--rate"),
    (["--theta", "1.5"], "--theta"),
    (["--hot-tool", "0.4"], "--hot-tool"),
    (["--trace", "x.jsonl"], "--trace"),
    (["--workload", "mooncake", "--trace", "/nonexistent.jsonl"], "not found"),
    (["--local", "lifo"], "local order"),
    (["--kv-capacity", "1000"], "holds only"),
    (["--policies", "preble_e2", "--e2-window", "0"], "--e2-window"),
    (["--policies", "preble_e2", "--e2-th-bal", "0.9"], "--e2-th-bal"),
])
def test_cluster_bad_input(argv, msg, capsys):
    assert cli(["cluster", "--requests", "5", "--seeds", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert "jaxroute cluster: error:" in err and msg in err


def test_cluster_refuses_broken_conservation(monkeypatch, capsys):
    from jaxroute.commands import cluster as cmd

    leak(monkeypatch, cmd, "run_cluster", row=0, seed=1)  # row 'rr', seed 1
    assert main(["cluster", "--workload", "toolbench", "--requests", "30", "--seeds", "2", "--rate", "20",
                 "--policies", "rr,least_load", "--allow-overflow"]) == 2
    captured = capsys.readouterr()
    assert "conservation failed" in captured.err and "in: rr;" in captured.err and "hit_rate" not in captured.out


def test_capacity_overrides_grow_on_overflow(tmp_path, capsys):
    """--max-queue / --e2-ring set the starting sizes; an overflowed one is doubled and the grid rerun."""
    out = tmp_path / "c.json"
    assert main(["cluster", "--workload", "toolbench", "--requests", "40", "--seeds", "2", "--rate", "10",
                 "--replicas", "2", "--policies", "rr,preble_e2", "--max-queue", "4", "--e2-ring", "8",
                 "--out", str(out)]) == 0
    config = json.loads(out.read_text())["config"]
    assert config["max_queue"] > 4 and config["e2_ring"] > 8  # both overflowed and were grown
    assert config["max_queue"] & (config["max_queue"] - 1) == 0  # by doubling
    assert cli(["cluster", "--requests", "5", "--e2-ring", "0"]) == 2
    assert "--e2-ring" in capsys.readouterr().err
