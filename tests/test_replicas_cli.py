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


def test_cluster_preble_complete_and_its_ablation_grid(tmp_path, capsys):
    """--local priority with the full preset; the switches as a grid of rows in one compilation."""
    out = tmp_path / "p.json"
    rc = main(["cluster", "--workload", "toolbench", "--requests", "80", "--seeds", "2", "--rate", "20",
               "--policies", "rr,preble", "--local", "priority", "--priority-groups", "5",
               "--e2-pairing", "on,off", "--e2-autoscale", "off", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "local priority (5 groups)" in text and "e2_paired" in text
    res = json.loads(out.read_text())
    rows = {r["policy"]: r for r in res["results"]}
    assert set(rows) == {"rr", "preble[pairing=on,autoscale=off]", "preble[pairing=off,autoscale=off]"}
    on, off = rows["preble[pairing=on,autoscale=off]"], rows["preble[pairing=off,autoscale=off]"]
    assert on["params"]["e2_pairing"] is True and off["params"]["e2_pairing"] is False
    assert not on["params"]["e2_autoscale"]
    assert off["metrics"]["e2_paired"]["mean"] == 0 and rows["rr"]["metrics"]["e2_exploits"]["mean"] == 0
    assert on["metrics"]["e2_exploits"]["mean"] > 0
    assert res["config"]["priority_groups"] == 5 and res["config"]["local"] == "priority"


def test_cluster_on_traces(tmp_path, capsys):
    short = tmp_path / "mooncake40.jsonl"  # the trace's first 40 requests, asked for 60: the 40 run, said so
    short.write_text("".join(require(MOONCAKE).read_text().splitlines(keepends=True)[:40]))
    rc = main(["cluster", "--workload", "mooncake", "--trace", str(short),
               "--requests", "60", "--seeds", "1", "--policies", "rr,affinity", "--rate", "2",
               "--out", str(tmp_path / "m.json")])
    assert rc == 0
    out, err = capsys.readouterr()
    assert "the trace holds 40 requests, fewer than --requests 60: all 40 run" in err
    assert "1 seeds x 40 requests" in out and "simulated 80 requests" in out
    config = json.loads((tmp_path / "m.json").read_text())["config"]
    assert config["requests"] == 40 and config["requests_asked"] == 60
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
    (["--gpu", "h100", "--model", "llama-3.1-70b"], "Llama-3.1-70B weights (141.1 GB) do not fit"),
    (["--gpu", "h100", "--model", "qwen3-32b", "--tp", "3"], "64 attention heads, which 3 GPUs cannot split"),
    (["--gpu", "v100"], "unknown GPU 'v100'; choose from: A6000"),
    (["--model", "qwen3-14b"], "unknown model 'qwen3-14b'; choose from:"),
    (["--tp", "0"], "--tp"),
    (["--rate", "2", "--rate-stages", "1:5"], "mutually exclusive"),
    (["--rate-stages", "1:0"], "--rate-stages"),
    (["--rate-stages", "10"], "--rate-stages"),
    (["--sp-groups", "3"], "--sp-* flags apply to --workload shared-prefix only"),
    (["--priority-groups", "5"], "--priority-groups applies to --local priority"),
    (["--local", "priority", "--priority-groups", "0"], "--priority-groups"),
    (["--policies", "preble", "--e2-pairing", "maybe"], "expected on or off, got 'maybe'"),
    (["--policies", "rr", "--e2-autoscale", "on"], "--e2-pairing and --e2-autoscale apply to preble_e2 and preble"),
    (["--workload", "shared-prefix", "--sp-question-len", "0"], "--sp-question-len"),
])
def test_cluster_bad_input(argv, msg, capsys):
    assert cli(["cluster", "--requests", "5", "--seeds", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert "jaxroute cluster: error:" in err and msg in err


def test_cluster_shared_prefix_on_tensor_parallel_h100_with_load_stages(tmp_path, capsys):
    from jaxroute import cost_models as cm

    out = tmp_path / "sp.json"
    assert main(["cluster", "--workload", "shared-prefix", "--gpu", "h100", "--model", "qwen3-32b", "--tp", "2",
                 "--rate-stages", "10:3,20:3", "--sp-groups", "4", "--sp-prompts-per-group", "5",
                 "--seeds", "2", "--policies", "rr,threshold", "--out", str(out)]) == 0
    assert "qwen3-32b on 2xh100" in capsys.readouterr().out
    res = json.loads(out.read_text())
    config = res["config"]
    assert config["rate_stages"] == [{"rate": 10.0, "seconds": 3.0}, {"rate": 20.0, "seconds": 3.0}]
    assert config["requests"] == 90 and config["rate"] == 15.0  # the stage total; the stages' mean rate
    assert config["tp"] == 2 and config["kv_capacity"] == cm.kv_capacity_tokens("H100-SXM", "Qwen3-32B", 2)
    assert config["shared_prefix"] == {"groups": 4, "prompts_per_group": 5, "system_tokens": 100,
                                       "question_tokens": 50, "output_tokens": 50}
    threshold = res["results"][1]["metrics"]["hit_rate"]["mean"]
    assert threshold > 0.5  # 20 prompts recur 4-5 times: most prompt tokens are cached on their replica


def test_cluster_on_demand_admission(tmp_path, capsys):
    """--admission on-demand (vLLM V1, with preemption) runs, is saved, and its preemptions are in the table."""
    out = tmp_path / "od.json"
    assert main(["cluster", "--workload", "toolbench", "--requests", "60", "--seeds", "2", "--rate", "30",
                 "--replicas", "2", "--kv-capacity", "8000", "--policies", "least_load",
                 "--admission", "on-demand", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "on-demand admission" in text and "preemptions" in text and "kv_usage_mean" in text
    res = json.loads(out.read_text())
    assert res["config"]["admission"] == "on-demand"
    assert res["results"][0]["metrics"]["preemptions"]["mean"] > 0  # 8,000 KV tokens are short at 30 req/s
    assert cli(["cluster", "--requests", "5", "--seeds", "1", "--admission", "eager"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "jaxroute cluster: error: unknown admission 'eager'; choose from: reserve, on-demand"


def test_cluster_refuses_broken_conservation(monkeypatch, capsys):
    from jaxroute.experiments import cluster as experiment

    leak(monkeypatch, experiment, "run_cluster", row=0, seed=1)  # row 'rr', seed 1 (the command imports it when it runs)
    assert main(["cluster", "--workload", "toolbench", "--requests", "30", "--seeds", "2", "--rate", "20",
                 "--policies", "rr,least_load", "--allow-overflow"]) == 2
    captured = capsys.readouterr()
    assert "conservation failed" in captured.err and "in: rr;" in captured.err and "hit_rate" not in captured.out


def test_capacity_overrides_grow_on_overflow(tmp_path, capsys):
    """--max-queue / --e2-ring set the starting sizes; an overflowed one is doubled and the grid rerun."""
    out = tmp_path / "c.json"
    assert main(["cluster", "--workload", "toolbench", "--requests", "40", "--seeds", "2", "--rate", "10",
                 "--replicas", "2", "--policies", "rr,preble_e2", "--max-queue", "4", "--e2-ring", "8", "--latency-model", "roofline",
                 "--cache-slots", "24", "--out", str(out)]) == 0
    config = json.loads(out.read_text())["config"]
    assert config["max_queue"] > 4 and config["e2_ring"] > 8  # both overflowed and were grown
    assert config["cache_slots"] > 24  # the cache table too
    assert config["max_queue"] & (config["max_queue"] - 1) == 0  # by doubling
    assert cli(["cluster", "--requests", "5", "--e2-ring", "0"]) == 2
    assert "--e2-ring" in capsys.readouterr().err
    assert cli(["cluster", "--requests", "5", "--cache-slots", "-1"]) == 2
    assert "argument --cache-slots: expected an integer >= 0, got '-1'" in capsys.readouterr().err
