"""`jaxroute tune` end to end (JSON, PNG, settings file rerun by `jaxroute cluster --params-json`) and bad input."""

import json

import pytest

from tests.cli_helpers import cli

SMALL = ["--workload", "toolbench", "--requests", "120", "--replicas", "2", "--rate", "8"]


def test_tune_writes_results_plot_and_settings_that_cluster_reruns(tmp_path, capsys):
    out, png, params = tmp_path / "t.json", tmp_path / "t.png", tmp_path / "p.json"
    rc = cli(["tune", "cluster", "--router", "llmd_precise", "--params", "w_prefix,w_queue", *SMALL,
              "--slo", "ttft_p90_s<=1,tpot_p90_s<=0.05", "--population", "6", "--generations", "3", "--seeds", "2",
              "--final-seeds", "3", "--out", str(out), "--plot", str(png), "--params-out", str(params)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "generation 2:" in text and "gain (+ = better)" in text and "configurations x seeds" in text
    res = json.loads(out.read_text())
    assert res["command"] == "tune" and res["router"] == "llmd_precise" and len(res["generations"]) == 3
    assert [k["name"] for k in res["knobs"]] == ["w_prefix", "w_queue"]
    first = res["candidates"][0]
    assert first["label"] == "defaults" and first["values"] == {"w_prefix": 3.0, "w_queue": 2.0}
    assert all(c["gain"]["ci95"][0] <= c["gain"]["mean"] <= c["gain"]["ci95"][1] for c in res["candidates"][1:])
    assert res["generations"][-1]["best_ever"] >= res["start_score"]
    assert png.stat().st_size > 3000
    saved = json.loads(params.read_text())
    assert saved["router"] == "llmd_precise" and saved["settings"]["weights"]["kv"] == 2.0  # untuned: the preset's

    rerun = tmp_path / "c.json"
    assert cli(["cluster", *SMALL, "--policies", "llmd_precise", "--seeds", "2", "--params-json", str(params),
                "--out", str(rerun), "--no-progress"]) == 0
    rows = {r["policy"]: r for r in json.loads(rerun.read_text())["results"]}
    assert set(rows) == {"llmd_precise", "llmd_precise[tuned]"}
    assert rows["llmd_precise[tuned]"]["params"]["weights"] == pytest.approx(saved["settings"]["weights"])


@pytest.mark.parametrize("argv, msg", [
    (["--router", "rr"], "unknown tunable router 'rr'"),
    (["--router", "dynamo_kv", "--params", "w_prefix"], "not a tunable setting of dynamo_kv"),
    (["--router", "threshold", "--objective", "nope"], "unknown objective 'nope'"),
    (["--router", "threshold", "--objective", "capacity"], "needs an SLO"),
    (["--router", "threshold", "--objective", "capacity", "--slo", "ttft_p90_s<=1", "--rate", "2"], "--rate does not apply"),
    (["--router", "threshold", "--slo", "mean_latency_s<=1"], "per-request bounds"),
])
def test_tune_bad_input(argv, msg, capsys):
    assert cli(["tune", "cluster", *argv, "--requests", "20", "--generations", "1"]) == 2
    assert msg in capsys.readouterr().err


def test_tune_usage_errors(capsys):
    assert cli(["tune", "cluster"]) == 2  # --router is required
    assert cli(["tune", "cluster", "--router", "threshold", "--population", "0"]) == 2
    assert cli(["tune", "cluster", "--router", "threshold", "--slo", "ttft<1"]) == 2
    assert "METRIC<=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize("content, msg", [
    ("{not json", "is not JSON"),
    ('["threshold"]', "expected an object with 'router' and 'settings'"),
    ('{"router": "nope", "settings": {}}', "unknown router 'nope'"),
    ('{"router": "threshold", "settings": {"theta": 0.4}, "extra": 1}', "unknown key(s) extra"),
    ('{"router": "threshold", "settings": {"w_prefix": 1}}', "unknown setting(s) w_prefix for threshold"),
    ('{"router": "llmd_precise", "settings": {"weights": [1, 2]}}', "weights must be an object"),
    ('{"router": "llmd_precise", "settings": {"weights": {"nope": 1}}}', "unknown scorer"),
    ('{"router": "preble_e2", "settings": {"e2_th_bal": 0.5}}', "rebalancing threshold must be >= 1"),
])
def test_cluster_refuses_a_bad_params_json(tmp_path, content, msg, capsys):
    path = tmp_path / "p.json"
    path.write_text(content)
    assert cli(["cluster", *SMALL, "--policies", "rr", "--seeds", "2", "--params-json", str(path)]) == 2
    err = capsys.readouterr().err
    assert msg in err and "jaxroute cluster: error:" in err


def test_cluster_params_json_missing_file(tmp_path, capsys):
    assert cli(["cluster", *SMALL, "--policies", "rr", "--params-json", str(tmp_path / "none.json")]) == 2
    assert "--params-json file not found" in capsys.readouterr().err
