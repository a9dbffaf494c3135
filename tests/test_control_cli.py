"""`jaxroute cluster --autoscaler/--gate` end to end: rows per autoscaler and gate, the control and per-class
tables, JSON, the replicas PNG, a saved spec that reruns it, and one-line errors for bad control flags."""

import json

import pytest

from jaxroute.cli import main
from tests.cli_helpers import assert_spec_reruns, cli

ARGV = ["cluster", "--workload", "toolbench", "--requests", "120", "--seeds", "2", "--rate-stages", "5:6,25:6,5:6",
        "--replicas", "3", "--policies", "least_load", "--autoscaler", "fixed,hpa,kpa", "--gate",
        "none,tier_shed,flow_control", "--fairness", "round_robin", "--tenant-mix", "0.5,0.5",
        "--provision-s", "2", "--scale-interval", "1", "--scale-target", "3", "--class-mix", "critical=0.4,batch=0.6",
        "--control-set", "down_window_s=4,stable_window_s=4,panic_window_s=1,tier_threshold=4,slo_ttft_s=2",
        "--gpu-price", "3"]


def test_cluster_with_autoscalers_and_gates(tmp_path, capsys):
    out, png, spec = tmp_path / "r.json", tmp_path / "r.png", tmp_path / "job.yaml"
    assert main([*ARGV, "--out", str(out), "--plot", str(png), "--save-spec", str(spec)]) == 0
    text = capsys.readouterr().out
    assert "control plane" in text and "class critical" in text and "class batch" in text
    res = json.loads(out.read_text())
    labels = [r["policy"] for r in res["results"]]
    assert labels == [f"least_load+{s}+{g}" for s in ("fixed", "hpa", "kpa") for g in ("none", "tier_shed", "flow_control")]
    by = {r["policy"]: r for r in res["results"]}
    fixed, hpa = by["least_load+fixed+none"]["metrics"], by["least_load+hpa+none"]["metrics"]
    assert fixed["mean_ready"]["mean"] == 1.0 and fixed["scale_ups"]["mean"] == 0
    assert hpa["scale_ups"]["mean"] > 0 and hpa["peak_ready"]["mean"] > 1
    # cost = GPU-hours x the price; tier_shed sheds batch requests only
    assert hpa["cost"]["mean"] == pytest.approx(3 * hpa["gpu_hours"]["mean"], rel=1e-5)
    shed = by["least_load+hpa+tier_shed"]["metrics"]
    assert shed["class.batch.shed_fraction"]["mean"] > 0 and shed["class.critical.shed_fraction"]["mean"] == 0
    assert by["least_load+hpa+none"]["metrics"]["shed_fraction"]["mean"] == 0
    # the flow-control gateway sheds nothing and serves the critical band first
    flow = by["least_load+fixed+flow_control"]
    assert flow["params"]["control"]["fairness"] == "round_robin" and flow["metrics"]["shed_fraction"]["mean"] == 0
    m = flow["metrics"]
    assert m["class.critical.ttft_p90_s"]["mean"] < m["class.batch.ttft_p90_s"]["mean"]
    params = by["least_load+kpa+tier_shed"]["params"]["control"]
    assert params["scaler"] == "kpa" and params["gate"] == "tier_shed" and params["class_mix"] == {
        "critical": pytest.approx(0.4), "batch": pytest.approx(0.6)}
    assert res["config"]["replica_slots"] >= 3 and (tmp_path / "r-replicas.png").stat().st_size > 1000
    # the saved spec (a control section) reruns to the same per-seed numbers
    assert "control:" in spec.read_text()
    assert_spec_reruns(spec, by, ("gpu_hours", "slo_attainment", "shed_fraction"), tmp_path)


@pytest.mark.parametrize("argv, msg", [
    (["--gate", "flow_control", "--fairness", "lottery"], "unknown fairness 'lottery'"),
    (["--autoscaler", "vpa"], "unknown autoscaler 'vpa'; choose from: fixed, hpa, kpa, sla"),
    (["--gate", "queue"], "unknown gate 'queue'; choose from: none, token_bucket, tier_shed, saturation"),
    (["--min-replicas", "2"], "--min-replicas applies with --autoscaler or --gate"),
    (["--autoscaler", "hpa", "--min-replicas", "5"], "--min-replicas 5 is more than --replicas 4"),
    (["--autoscaler", "hpa", "--control-set", "panic=2"], "unknown --control-set name 'panic'"),
    (["--gate", "tier_shed", "--class-mix", "gold=1"], "unknown class 'gold' in --class-mix"),
    (["--autoscaler", "hpa", "--scale-metric", "gpu"], "unknown metric 'gpu'"),
    (["--autoscaler", "kpa", "--policies", "sglang_cache_aware"], "cannot run with an autoscaler"),
    (["--autoscaler", "hpa", "--control-set", "kv_threshold=2"], "kv_threshold must be in (0, 1]"),
    (["--autoscaler", "hpa", "--tenant-mix", "1,1,1,1,1,1,1,1,1"], "tenant_mix needs 1 to 8 shares"),
])
def test_bad_control_flags(argv, msg, capsys):
    assert cli(["cluster", "--requests", "5", "--seeds", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_tune_control_finds_settings_and_reports_the_cost_saved(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["tune", "control", "--autoscaler", "hpa", "--params", "target,down_window_s", "--workload", "toolbench",
                 "--rate-stages", "5:6,25:6,5:6", "--replicas", "3", "--provision-s", "2", "--scale-interval", "1",
                 "--control-set", "slo_ttft_s=2", "--population", "3", "--generations", "2", "--seeds", "2",
                 "--final-seeds", "2", "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "min GPU-hours with SLO attainment >= 0.9" in text and "generation 1" in text
    res = json.loads(out.read_text())
    assert res["router"] == "least_load+hpa" and [k["name"] for k in res["knobs"]] == ["target", "down_window_s"]
    assert res["objective"]["metric"] == "cost" and not res["objective"]["maximise"]
    defaults = res["candidates"][0]
    assert defaults["label"] == "defaults" and defaults["values"] == {"target": 16.0, "down_window_s": 300.0}
    assert res["config"]["control"]["slo_ttft_s"] == 2.0 and len(res["generations"]) == 2


@pytest.mark.parametrize("argv, msg", [
    (["--autoscaler", "fixed"], "give one autoscaler to tune"),
    (["--autoscaler", "hpa,kpa"], "give one autoscaler to tune"),
    (["--autoscaler", "hpa"], "tune control needs an SLO"),
    (["--autoscaler", "sla", "--params", "target", "--control-set", "slo_ttft_s=1"], "'target' is not a tunable setting of sla"),
    (["--autoscaler", "hpa", "--router", "preble", "--control-set", "slo_ttft_s=1"], "unknown router under an autoscaler"),
])
def test_tune_control_bad_input(argv, msg, capsys):
    assert cli(["tune", "control", "--requests", "5", *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err
