"""`jaxroute cluster --adapters` end to end: a row per adapter count and skew, the adapter table, JSON with the
settings, a saved spec that reruns to the same numbers, a trace's own adapter_id column, and one-line errors."""

import json

import pytest

from jaxroute.cli import main
from tests.cli_helpers import assert_spec_reruns, cli

ARGV = ["cluster", "--workload", "toolbench", "--requests", "160", "--rate", "20", "--seeds", "2", "--replicas", "3",
        "--kv-capacity", "6000", "--policies", "least_load,llmd_lora", "--adapters", "2,12", "--adapter-zipf", "1.5",
        "--lora-slots", "2", "--lora-set", "load_ms=20,rank=8", "--no-progress"]


def test_cluster_with_adapters(tmp_path, capsys):
    out, spec = tmp_path / "r.json", tmp_path / "job.yaml"
    assert main([*ARGV, "--out", str(out), "--save-spec", str(spec)]) == 0
    text = capsys.readouterr().out
    assert "LoRA adapters (2 slots per replica)" in text and "adapter_hit_rate" in text
    res = json.loads(out.read_text())
    labels = [r["policy"] for r in res["results"]]
    assert labels == [f"{p}+{k}ad-zipf1.5" for p in ("least_load", "llmd_lora") for k in (2, 12)]
    by = {r["policy"]: r for r in res["results"]}
    few, many = by["least_load+2ad-zipf1.5"]["metrics"], by["least_load+12ad-zipf1.5"]["metrics"]
    assert few["adapter_loads"]["mean"] <= 2 * 3 < many["adapter_loads"]["mean"]
    lora = by["llmd_lora+12ad-zipf1.5"]["params"]["lora"]
    assert lora["n_adapters"] == 12 and lora["load_s"] == pytest.approx(0.02)
    assert res["config"]["lora_slots"] == 2 and res["config"]["adapter_ids"] == 12
    assert "adapters:" in spec.read_text()
    assert_spec_reruns(spec, by, ("adapter_loads", "ttft_mean_s"), tmp_path)


def _azure(tmp_path, adapters):
    path = tmp_path / "t.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens,adapter_id"]
    rows += [f"2023-11-16 18:15:{i // 10:02d}.{i % 10}000000,{200 + 10 * i},20,{a}" for i, a in enumerate(adapters)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_a_trace_names_its_adapters(tmp_path, capsys):
    names = ["sql", "chat", "base", "sql", "math", "sql", "chat", "base"] * 5
    out = tmp_path / "r.json"
    assert main(["cluster", "--workload", "azure-conv", "--trace", str(_azure(tmp_path, names)), "--seeds", "1",
                 "--replicas", "2", "--policies", "llmd_lora", "--lora-slots", "1", "--out", str(out),
                 "--no-progress"]) == 0
    res = json.loads(out.read_text())
    (row,) = res["results"]
    assert row["policy"] == "llmd_lora+adapters" and res["config"]["adapter_ids"] == 3
    # 30 of 40 requests name an adapter; each admission of one is a hit or a load
    assert row["metrics"]["adapter_loads"]["mean"] >= 3


@pytest.mark.parametrize("argv, msg", [
    (["--adapter-zipf", "1"], "--adapter-zipf applies with --adapters"),
    (["--adapters", "4", "--lora-set", "alpha=2"], "unknown --lora-set name 'alpha'"),
    (["--adapters", "4", "--lora-set", "base_share=1"], "base_share must be in [0, 1)"),
    (["--adapters", "0"], "--adapters"),
    (["--adapters", "4", "--lora-slots", "0"], "--lora-slots"),
])
def test_bad_adapter_flags(argv, msg, capsys):
    assert cli(["cluster", "--requests", "5", "--seeds", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err
