"""`jaxroute compare RUN_DIR` on a real vLLM run, `jaxroute fit-latency`, and the latency flags: tables, files,
one-line errors."""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import cli
from tests.data_paths import SHARED_DATA, require

RUNS = SHARED_DATA / "vllm-h100-inference-perf" / "runs"
RUN = "20260217-155451-llama-2-7b-tp1-codegen"


def test_compare_a_run_folder_per_stage_with_json_and_plot(tmp_path, capsys):
    run = require(RUNS / RUN)
    out, png = tmp_path / "cmp.json", tmp_path / "cmp.png"
    assert cli(["compare", str(run), "--requests", "40", "--out", str(out), "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "KV cache" in text and "activations" in text  # the pool as vLLM sizes it, with its parts
    assert "tpot_reported" in text and "counted every streamed token twice" in text
    doc = json.loads(out.read_text())
    assert doc["latency_model"] == "trained" and len(doc["stages"]) == 2
    for row in doc["stages"]:
        for metric in ("ttft", "itl", "e2e"):
            m, s = row["measured"][metric]["mean"], row["simulated"][metric]["mean"]
            assert m > 0 and s > 0
            assert row["error_pct"][metric]["mean"] == pytest.approx(100 * (s / m - 1))
        assert row["simulated_failed_pct"] == 0 and not row["simulated_overloaded"]
    assert set(doc["run"]["error_pct"]) == {"ttft_mean", "ttft_p90", "e2e_mean", "e2e_p90", "itl"}
    assert png.stat().st_size > 0
    # the roofline on the same run, for comparison
    assert cli(["compare", str(run), "--requests", "40", "--latency-model", "roofline", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["latency_model"] == "roofline"


@pytest.mark.parametrize("extra, needle", [
    (["--latency-model", "roofline", "--latency-params", "x.json"], "drop --latency-model roofline"),
    (["--fit"], "fit a run folder with `jaxroute fit-latency`"),
    (["--latency-params", "missing.json"], "latency params file not found"),
    (["--out", "{file}/x.json"], "cannot write"),
])
def test_compare_run_folder_bad_flags_one_line(tmp_path, capsys, extra, needle):
    (tmp_path / "file").write_text("")
    extra = [x.format(file=tmp_path / "file") for x in extra]
    assert cli(["compare", str(require(RUNS / RUN)), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_compare_server_file_errors_and_non_run_flags(tmp_path, capsys):
    bad = tmp_path / "serve.yaml"
    bad.write_text("model: m\nmax_num_seq: 8\n")
    assert cli(["compare", str(require(RUNS / RUN)), "--server", str(bad)]) == 2
    assert "unknown server setting 'max_num_seq'" in capsys.readouterr().err
    rec = tmp_path / "req.json"
    rec.write_text("{}")
    assert cli(["compare", str(rec), "--latency-params", "x.json"]) == 2
    assert "go with a run folder" in capsys.readouterr().err


def test_fit_latency_bad_inputs_one_line(tmp_path, capsys):
    assert cli(["fit-latency", str(tmp_path / "none")]) == 2
    assert "data folder not found" in capsys.readouterr().err
    assert cli(["fit-latency", str(tmp_path)]) == 2
    assert "no run folders" in capsys.readouterr().err
    assert cli(["fit-latency", str(require(RUNS.parent)), "--runs", "no-such-run"]) == 2
    assert "matches --runs" in capsys.readouterr().err
    assert cli(["fit-latency", str(RUNS.parent), "--params-out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_cost_shows_both_latency_models_and_cluster_refuses_mixed_flags(tmp_path, capsys):
    assert cli(["cost", "--gpu", "h100", "--model", "llama-2-7b", "--json"]) == 0
    both = json.loads(capsys.readouterr().out)["latency_models"]
    assert set(both) == {"trained", "roofline"} and both["trained"]["first_token_extra_s"] > 0
    assert both["roofline"]["first_token_extra_s"] == 0
    assert cli(["cluster", "--latency-model", "roofline", "--latency-params", "x.json", "--requests", "8"]) == 2
    assert "--latency-params holds the trained model's coefficients" in capsys.readouterr().err
    assert cli(["cluster", "--latency-model", "vidur", "--requests", "8"]) == 2
    assert "choose from: trained, roofline, preble" in capsys.readouterr().err


def test_cluster_reads_a_vllm_server_file(tmp_path, capsys):
    srv = tmp_path / "serve.yaml"
    srv.write_text("model: meta-llama/Llama-2-7b-hf\ntensor_parallel_size: 1\nmax_num_batched_tokens: 2048\n"
                   "max_num_seqs: 128\n")
    model = str(require(SHARED_DATA / "vllm-h100-inference-perf" / "model_configs" / "Llama-2-7b-hf"))
    out = tmp_path / "c.json"
    assert cli(["cluster", "--server", str(srv), "--model-config", model, "--gpu", "h100", "--requests", "12",
                "--seeds", "2", "--policies", "rr", "--out", str(out)]) == 0
    assert "activations" in capsys.readouterr().out  # vLLM's KV sizing, its parts printed
    config = json.loads(out.read_text())["config"]
    assert (config["chunk"], config["max_running"], config["admission"]) == (2048, 128, "on-demand")
    from jaxroute import server

    assert config["kv_capacity"] == server.kv_parts("H100-SXM", model, 1).tokens
    assert cli(["cluster", "--server", str(srv), "--tp", "2", "--gpu", "h100", "--requests", "4"]) == 2
    assert "--tp 2 disagrees with the server file's 1" in capsys.readouterr().err
    srv.write_text("model: m\nmax_num_seqs: -1\n")
    assert cli(["cluster", "--server", str(srv), "--requests", "4"]) == 2
    assert "max_num_seqs = -1" in capsys.readouterr().err


def test_compare_the_kubecon_demo_folder_simulates_its_paced_stages_only(tmp_path, capsys):
    """The committed KubeCon fixture is a run folder (server.yaml beside its reports): stages 0-3 simulated under
    the trained model without prefix caching, stages 4-6 (sent at ~106 of 123-183 req/s) reported client-bound."""
    from pathlib import Path

    kubecon = Path(__file__).resolve().parent / "fixtures" / "inference_perf_kubecon_na_2025_vllm"
    out = tmp_path / "kc.json"
    assert cli(["compare", str(kubecon), "--requests", "20", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Llama-3.1-8B on 1 x H100-SXM" in text and "enable_chunked_prefill false" in text
    assert text.count("client-bound: sent at") == 3
    rows = json.loads(out.read_text())["stages"]
    assert [r["client_bound"] for r in rows] == [False] * 4 + [True] * 3
    assert all(r["simulated"] is None for r in rows[4:])
    assert all(r["simulated"]["e2e"]["mean"] > r["simulated"]["ttft"]["mean"] > 0 for r in rows[:4])
