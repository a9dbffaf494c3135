"""`jaxroute pd` end to end: tables, JSON, PNG, a ratio sweep in one grid, and bad input."""

import json

import pytest

from jaxroute.cli import main
from jaxroute.deployment import PD_PAPER
from jaxroute.experiments import pd
from tests.cli_helpers import cli
from tests.data_paths import MOONCAKE

SMALL = ["--workload", "toolbench", "--requests", "40", "--seeds", "2", "--rate", "20", "--model", "Llama-3-8B",
         "--tp", "1", "--no-progress"]


def test_pd_ratio_sweep_with_colocated_rows(tmp_path, capsys):
    out, png = tmp_path / "pd.json", tmp_path / "pd.png"
    rc = main(["pd", *SMALL, "--ratios", "1:3,2:2,3:1", "--prefill-router", "llmd_precise,random",
               "--decode-router", "jsq,br0", "--colocated", "--slo-ttft", "0.5", "--slo-tpot", "0.05",
               "--kv-link-gbps", "100", "--kv-link-latency-ms", "0.2", "--out", str(out), "--plot", str(png)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "goodput_rps" in text and "TTFT split" in text and "colocated[4] llmd_precise" in text
    assert "SLOs TTFT 0.5 s, TPOT 0.05 s" in text and "100 Gb/s + 0.2 ms" in text
    res = json.loads(out.read_text())
    assert res["command"] == "pd" and len(res["results"]) == 2 * 2 * 3 + 2
    labels = [r["policy"] for r in res["results"]]
    assert "1:3 llmd_precise > jsq" in labels and "3:1 random > br0" in labels
    row = res["results"][0]
    assert row["params"]["n_prefill"] == 1 and row["params"]["n_decode"] == 3 and row["params"]["link_gbps"] == 100
    assert len(row["metrics"]["goodput_rps"]["per_seed"]) == 2
    assert res["config"]["ratios"] == ["1:3", "2:2", "3:1"] and res["config"]["slo_ttft_s"] == 0.5
    assert png.stat().st_size > 5000
    # the link is 4x slower than the default: its busy time shows
    assert row["metrics"]["transfer_s"]["mean"] > 0


def test_pd_threshold_keeps_short_prompts_on_the_decode_tier(capsys):
    rc = main(["pd", *SMALL, "--prefill", "2", "--decode", "2", "--prefill-router", "rr", "--decode-router", "rr",
               "--pd-threshold", "0,100000"])
    assert rc == 0
    text = capsys.readouterr().out
    lines = [ln for ln in text.splitlines() if ln.startswith("2:2 rr > rr")]
    assert len(lines) == 6 and any("th=100000" in ln for ln in lines)  # three tables, two rows each


def test_pd_brh_with_a_fitted_predictor(tmp_path, capsys):
    out = tmp_path / "brh.json"
    rc = main(["pd", *SMALL, "--prefill", "2", "--decode", "2", "--decode-router", "br0,brh", "--predictor", "survival",
               "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["config"]["predictor"] == "survival" and len(res["results"]) == 2


def test_pd_independent_decode_replicas(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["pd", *SMALL, "--ratios", "1:3,3:1", "--prefill-router", "rr", "--decode-tier", "replicas",
               "--decode-router", "least_load,random", "--out", str(out)])
    assert rc == 0
    assert "decode tier replicas" in capsys.readouterr().out
    res = json.loads(out.read_text())
    assert res["config"]["decode_tier"] == "replicas" and len(res["results"]) == 4
    assert {r["params"]["decode_router"] for r in res["results"]} == {"least_load", "random"}


@pytest.mark.parametrize("argv, message", [
    (["--ratios", "4-4"], "P:D ratio"),
    (["--ratios", "0:4"], "at least one"),
    (["--prefill-router", "nope"], "unknown prefill router"),
    (["--decode-router", "nope"], "unknown decode router"),
    (["--ratios", "1:1,2:2", "--prefill-router", "sglang_cache_aware"], "cannot run on 1 of 2"),
    (["--ratios", "1:1", "--prefill", "2"], "either --ratios or --prefill"),
    (["--workload", "nope"], "unknown workload"),
    (["--decode-tier", "nope"], "unknown decode tier"),
    (["--decode-router", "brh", "--predictor", "nope"], "unknown predictor"),
    (["--workload", "mooncake", "--trace", str(MOONCAKE), "--requests", "3000", "--decode-router", "brh",
      "--predictor", "survival"],
     "too few to fit a predictor"),
    (["--decode-tier", "replicas", "--decode-router", "br0"], "unknown decode router"),
    (["--decode-tier", "replicas", "--ratios", "1:1,1:2", "--decode-router", "sglang_cache_aware"],
     "decode router 'sglang_cache_aware' cannot run on 1 of 2"),
    (["--model", "nope"], "unknown model"),
    (["--slo-ttft", "-1"], None),
    (["--kv-link-gbps", "0"], None),
    (["--pd-threshold", "nan"], None),
    (["--deployment", "nope"], "unknown deployment"),
    (["--deployment", "paper"], "needs a MoE model"),  # SMALL's dense Llama-3-8B cannot step as dp_ep
    (["--rate", "fast"], None),
    (["--workload", "synthetic-prod", "--trace", "x.csv"], "do not apply"),
])
def test_pd_bad_input(argv, message, capsys):
    rc = cli(["pd", *SMALL, *argv])
    err = capsys.readouterr().err
    assert rc != 0
    if message:
        assert message in err
    assert "Traceback" not in err


def test_pd_refuses_lost_requests(monkeypatch, capsys):
    real = pd.run_pd

    def leaky(*a, **k):  # a broken model: one request lost in one seed
        res, raw = real(*a, **k)
        res.grid.metrics["conservation_error"][0, 1] = 1
        return res, raw

    monkeypatch.setattr(pd, "run_pd", leaky)  # the command imports pd.run_pd when it runs
    # the threshold test's 2:2 rr > rr tiers (its two rows and this one row fill the same 4 lanes): its programs
    rc = cli(["pd", *SMALL, "--prefill", "2", "--decode", "2", "--prefill-router", "rr", "--decode-router", "rr"])
    assert rc != 0 and "conservation failed" in capsys.readouterr().err


def test_help_lists_every_flag(capsys):
    with pytest.raises(SystemExit):
        main(["pd", "--help"])
    text = capsys.readouterr().out
    for flag in ("--prefill ", "--decode ", "--ratios", "--prefill-router", "--decode-router", "--pd-threshold",
                 "--colocated", "--decode-tier", "--kv-link-gbps", "--kv-link-latency-ms", "--slo-ttft", "--slo-tpot", "--out", "--plot"):
        assert flag in text
    assert str(pd.DEFAULT_LINK_GBPS).rstrip("0").rstrip(".") in text


@pytest.mark.parametrize("argv, message", [
    (["--ratios", "4:8,4:4"], "one decode size at a time"),
    (["--decode-tier", "replicas", "--decode-router", "least_load"], "decode-tier dp"),
    (["--prefill-tp", "3"], "tensor parallelism 3"),
])
def test_pd_paper_deployment_bad_input(argv, message, capsys):
    rc = cli(["pd", "--deployment", "paper", "--workload", "synthetic-prod", "--requests", "16", "--no-progress",
              *argv])
    err = capsys.readouterr().err
    assert rc != 0 and message in err and "Traceback" not in err


def test_pd_paper_deployment_runs_4p1d_paced_by_its_prefill_tier(tmp_path, capsys):
    out = tmp_path / "paper.json"
    rc = main(["pd", "--deployment", "paper", "--workload", "synthetic-prod", "--rate", "max", "--requests", "24",
               "--seeds", "2", "--decode-router", "jsq,br0", "--no-progress", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "all at t = 0" in text and "16xAscend-910C (prefill), 4xAscend-910C (decode, dp_ep)" in text
    assert "decode_running_per_group" in text and "decode_kv_share" in text
    res = json.loads(out.read_text())
    cfg = res["config"]
    assert cfg["deployment"] == "paper" and cfg["prefill_tp"] == 16 and cfg["ratios"] == ["4:8"]
    assert cfg["decode_parallel"] == "dp_ep" and cfg["chunk"] == PD_PAPER.chunk
    for r in res["results"]:
        m = {k: v["mean"] for k, v in r["metrics"].items()}
        assert m["completed"] == 24 and 0 < m["decode_kv_share"] < 1
        assert 0 < m["decode_slots_in_use"] <= 1 and m["decode_running_per_group"] > 0
