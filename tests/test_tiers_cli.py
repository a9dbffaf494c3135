"""`jaxroute cluster --cpu-tier/--shared-tier` end to end: a row per tier size, the tier table, JSON with the tier
settings, a saved spec that reruns to the same numbers, and one-line errors for bad tier flags."""

import json

import pytest

from jaxroute.cli import main
from tests.cli_helpers import assert_spec_reruns, cli

ARGV = ["cluster", "--workload", "toolbench", "--requests", "160", "--rate", "20", "--seeds", "2", "--replicas", "3",
        "--kv-capacity", "6000", "--policies", "least_load,llmd_precise", "--cpu-tier", "0,0.5", "--shared-tier", "0,2",
        "--tier-set", "shared_latency_ms=2", "--no-progress"]


def test_cluster_with_tiers(tmp_path, capsys):
    out, spec = tmp_path / "r.json", tmp_path / "job.yaml"
    assert main([*ARGV, "--out", str(out), "--save-spec", str(spec)]) == 0
    text = capsys.readouterr().out
    assert "KV offload tiers" in text and "hit_rate_all" in text
    res = json.loads(out.read_text())
    labels = [r["policy"] for r in res["results"]]
    tiers = ("gpu-only", "shared2G", "cpu0.5G", "cpu0.5G+shared2G")
    assert labels == [f"{p}+{t}" for p in ("least_load", "llmd_precise") for t in tiers]
    by = {r["policy"]: r for r in res["results"]}
    plain, both = by["least_load+gpu-only"]["metrics"], by["least_load+cpu0.5G+shared2G"]["metrics"]
    assert plain["hit_rate_all"]["mean"] == plain["hit_rate"]["mean"] and plain["kv_loaded_gb"]["mean"] == 0
    assert both["hit_rate_all"]["mean"] > plain["hit_rate_all"]["mean"] and both["kv_loaded_gb"]["mean"] > 0
    params = by["least_load+cpu0.5G+shared2G"]["params"]["tiers"]
    assert params["cpu_tokens"] == 4096 and params["shared_latency_s"] == pytest.approx(0.002)
    assert res["config"]["cpu_tier_gib"] == [0.0, 0.5] and res["config"]["cpu_slots"] > 0
    # the saved spec (tier flags in its deployment section) reruns to the same per-seed numbers
    assert "cpu_tier:" in spec.read_text()
    assert_spec_reruns(spec, by, ("hit_rate_all", "ttft_mean_s", "kv_offloaded_gb"), tmp_path)


@pytest.mark.parametrize("argv, msg", [
    (["--tier-set", "cpu_gbps=10"], "--tier-set applies with --cpu-tier or --shared-tier"),
    (["--cpu-tier", "1", "--tier-set", "pcie=10"], "unknown --tier-set name 'pcie'"),
    (["--cpu-tier", "1", "--tier-set", "cpu_gbps=0"], "cpu_gbps must be > 0"),
    (["--cpu-tier", "1", "--stale", "2"], "need a fresh router view"),
    (["--cpu-tier", "-1"], "--cpu-tier"),
    (["--shared-tier", "1", "--policies", "rr", "--router-set", "llmd_cpu_weight=2"], "llmd_cpu_weight must be in [0, 1]"),
])
def test_bad_tier_flags(argv, msg, capsys):
    assert cli(["cluster", "--requests", "5", "--seeds", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err
