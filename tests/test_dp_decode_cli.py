"""`jaxroute decode`: table, relative columns, JSON with one BR-H row per predictor, plot, one compilation, errors."""

import json

import pytest

from jaxroute import sim
from jaxroute.cli import main
from jaxroute.clusters.dp_decode import DecodeModel
from tests.cli_helpers import cli

SMALL = ["--workload", "synthetic-prod", "--requests", "60", "--seeds", "2", "--workers", "3", "--slots", "4",
         "--pool", "8", "--window", "3", "--horizon", "6", "--no-progress"]


def test_decode_table_json_plot_one_compilation(tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    sim.clear_compiled(DecodeModel)
    assert main(["decode", *SMALL, "--predictor", "oracle,none", "--out", str(out), "--plot", str(png)]) == 0
    assert sim.compile_count(DecodeModel, "advance") == 1  # 8 rows x 2 seeds, one compilation
    text = capsys.readouterr().out
    for name in ("random", "least_kv", "br0", "brh[oracle]", "brh[none]", "tput vs best", "imbalance_tokens"):
        assert name in text
    data = json.loads(out.read_text())
    assert data["command"] == "decode" and data["config"]["workers"] == 3
    labels = [r["params"]["label"] for r in data["results"]]
    assert labels == ["random", "rr", "p2c", "jsq", "least_kv", "br0", "brh[oracle]", "brh[none]"]
    brh = [r for r in data["results"] if r["policy"] == "brh"]
    assert [r["params"]["predictor"] for r in brh] == ["oracle", "none"]
    assert all(r["params"]["dispatch"] == "pooled" for r in brh)
    assert data["results"][0]["params"]["dispatch"] == "immediate"
    for r in data["results"]:
        assert r["overflow"] is False
        for m in ("imbalance_tokens", "barrier_idle_tokens", "tpot_p95_s", "throughput_tok_s",
                  "throughput_tok_s_vs_best_pct", "util_worker2"):
            s = r["metrics"][m]
            assert len(s["per_seed"]) == 2 and s["ci95"][0] <= s["mean"] <= s["ci95"][1]
    # the best paper baseline is 0 % against itself
    best = data["results"][0]["params"]["best_baseline"]["throughput_tok_s"]
    rec = next(r for r in data["results"] if r["params"]["label"] == best)
    assert rec["metrics"]["throughput_tok_s_vs_best_pct"]["mean"] == 0.0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_dispatch_override_and_poisson(capsys):
    assert main(["decode", *SMALL, "--policies", "jsq,br0", "--dispatch", "pooled", "--arrival", "poisson:40"]) == 0
    text = capsys.readouterr().out
    assert "jsq/pooled" in text and "br0/pooled" in text


@pytest.mark.parametrize("flags,message", [
    (["--workers", "0"], "--workers"),
    (["--seeds", "x"], "--seeds"),
    (["--requests", "0"], "--requests"),
    (["--policies", "br0,bogus"], "unknown policy 'bogus'"),
    (["--policies", "br0,br0"], "twice"),
    (["--predictor", "psychic"], "unknown predictor"),
    (["--workload", "nope"], "unknown decode workload"),
    (["--arrival", "poisson"], "needs a rate"),
    (["--arrival", "poisson:-2"], "poisson"),
    (["--arrival", "bursty"], "unknown --arrival"),
    (["--dispatch", "later"], "unknown dispatch mode"),
    (["--gamma", "nan"], "--gamma"),
    (["--window", "20"], "W=20"),
    (["--gpu", "TPU9"], "TPU9"),
    (["--model", "GPT-9"], "GPT-9"),
    (["--deployment", "moon"], "unknown deployment 'moon'"),
    (["--preemption", "maybe"], "--preemption value"),
    (["--block-size", "0"], "--block-size"),
    (["--parallel", "pipeline"], "unknown parallel mode 'pipeline'"),
    (["--parallel", "dp_ep"], "needs a MoE model"),  # Llama-3-8B is dense
    (["--deployment", "paper"], "leave no room for KV cache"),  # DeepSeek-V3 on 3 x 4 dies: weights do not fit
])
def test_bad_input(flags, message, capsys):
    assert cli(["decode", *SMALL, *flags]) == 2
    err = capsys.readouterr().err
    assert "jaxroute decode: error:" in err and message in err
    assert "Traceback" not in err


def test_missing_trace_is_a_clear_error(tmp_path, capsys):
    assert main(["decode", *SMALL, "--workload", "azure-conv", "--trace", str(tmp_path / "nope.csv")]) == 2
    assert "trace file not found" in capsys.readouterr().err


def test_overflow_refused_then_allowed(monkeypatch, capsys):
    # 2 slots per worker and a 10-step budget cannot finish: the CLI refuses, unless --allow-overflow
    args = ["decode", *SMALL, "--policies", "rr,br0", "--slots", "2"]
    from jaxroute.experiments import decode as experiment

    real = experiment.run_comparison

    def tiny_budget(*a, **k):
        return real(*a, **{**k, "max_steps": 10})

    monkeypatch.setattr(experiment, "run_comparison", tiny_budget)
    assert main(args) == 2
    assert "overflowed" in capsys.readouterr().err
    assert main([*args, "--allow-overflow"]) == 0
    assert "OVERFLOW" in capsys.readouterr().out


PAPER_SMALL = ["--workload", "synthetic-prod", "--requests", "40", "--seeds", "2", "--workers", "4", "--slots", "4",
               "--pool", "8", "--window", "3", "--horizon", "6", "--no-progress", "--deployment", "paper"]


def test_paper_deployment_paged_preemption_columns(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["decode", *PAPER_SMALL, "--policies", "rr,br0", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "DeepSeek-V3-W8A8 on 4xAscend-910C (dp_ep)" in text and "blocks of 128" in text
    for col in ("tok/step", "loaded tok/step", "loaded tpot vs best", "preempt", "recomputed tok"):
        assert col in text
    data = json.loads(out.read_text())
    cfg = data["config"]
    assert cfg["parallel"] == "dp_ep" and cfg["preempt"] is True and cfg["block_size"] == 128
    assert cfg["collective_s"] == 0.0
    for r in data["results"]:
        assert r["metrics"]["tokens_per_step"]["mean"] > 0


def test_tiny_block_pool_preempts_and_off_flags(monkeypatch, tmp_path, capsys):
    """32 blocks of 128 per worker: with preemption the run finishes and reports recomputation; off, it overflows."""
    import numpy as np

    from jaxroute import cost_models
    from jaxroute.experiments import decode as experiment
    from jaxroute.workloads.decode import DecodeRequests

    real = experiment.run_comparison

    def short_requests(req, rows, **k):  # prompts <= 300 and outputs <= 400 tokens: each fits alone
        short = DecodeRequests(req.name, req.arrival_s, np.minimum(req.prompt_tokens, 300),
                               np.minimum(req.output_tokens, 400), req.key_id)
        return real(short, rows, **k)

    monkeypatch.setattr(cost_models, "kv_capacity_tokens", lambda *a, **k: 4096)
    monkeypatch.setattr(experiment, "run_comparison", short_requests)
    args = ["decode", *SMALL, "--policies", "rr", "--slots", "8"]
    assert main([*args, "--out", str(tmp_path / "on.json")]) == 0
    on = json.loads((tmp_path / "on.json").read_text())["results"][0]["metrics"]
    assert on["preemptions"]["mean"] > 0 and on["recomputed_tokens"]["mean"] > 0
    assert on["completed"]["mean"] == 60
    assert main([*args, "--preemption", "off"]) == 2
    assert "overflowed" in capsys.readouterr().err
