"""`jaxroute cost`: JSON keys and values, case-insensitive names, clear errors."""

import json

import jax.numpy as jnp
import pytest

from jaxroute import cost_models as cm
from jaxroute.cli import main
from tests.cli_helpers import cli


def run_json(capsys, *argv):
    assert main(["cost", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_anchors(capsys):
    out = run_json(capsys, "--gpu", "A6000", "--model", "mistral-7b", "--prefill", "2100",
                   "--decode-batch", "1", "--context", "1")
    assert {"kv_capacity_tokens", "prefill_s", "decode_step_s"} <= set(out)
    assert out["kv_capacity_tokens"] == 219_089
    assert out["prefill_s"] == pytest.approx(0.2817, rel=0.03)
    assert out["decode_step_s"] == pytest.approx(0.024, rel=0.10)
    cp = cm.cost_params("A6000", "Mistral-7B")
    assert out["prefill_s"] == pytest.approx(float(cm.prefill_time(cp, 2100)), rel=1e-6)


def test_names_are_case_insensitive(capsys):
    a = run_json(capsys, "--gpu", "a6000", "--model", "MISTRAL-7B")
    b = run_json(capsys, "--gpu", "A6000", "--model", "Mistral-7B")
    assert a == b


def test_preble_cost_model(capsys):
    out = run_json(capsys, "--cost-model", "Preble", "--prefill", "4000", "--decode-batch", "32",
                   "--context", "2000")
    assert out["cost_model"] == "preble"
    assert out["prefill_s"] == pytest.approx(0.539, rel=0.01)
    assert out["decode_step_s"] == pytest.approx(0.038, rel=0.01)


def test_tensor_parallel(capsys):
    out = run_json(capsys, "--gpu", "H100-SXM", "--model", "llama-3-70b", "--tp", "4", "--prefill", "8000")
    assert out["tp"] == 4
    assert out["kv_capacity_tokens"] == cm.kv_capacity_tokens("H100-SXM", "Llama-3-70B", tp=4)
    cp = cm.cost_params("H100-SXM", "Llama-3-70B", tp=4)
    assert out["prefill_s"] == pytest.approx(float(cm.prefill_time(cp, 8000)), rel=1e-6)


def test_text_output(capsys):
    assert main(["cost", "--gpu", "A6000", "--model", "mistral-7b", "--prefill", "21000"]) == 0
    text = capsys.readouterr().out
    assert "219,089 tokens" in text
    assert "prefill 21,000 tokens" in text and "compute-bound" in text
    assert "memory-bound" in text  # single-request decode


def test_dp_ep_decode_step(capsys):
    argv = ["--gpu", "910c", "--model", "deepseek-v3-w8a8", "--tp", "4", "--parallel", "dp_ep", "--dp-ranks", "8",
            "--decode-batch", "64", "--context", "4400"]
    out = run_json(capsys, *argv)
    assert (out["gpu"], out["model"], out["parallel"], out["dp_ranks"]) == ("Ascend-910C", "DeepSeek-V3-W8A8", "dp_ep", 8)
    cp = cm.cost_params("Ascend-910C", "DeepSeek-V3-W8A8", 4, parallel="dp_ep", dp_ranks=8)
    b, kv = jnp.full(8, 64.0), jnp.full(8, 64 * 4400.0)
    assert out["decode_step_s"] == pytest.approx(float(cm.dp_step_times(cp, b, kv)[0]), rel=1e-6)
    assert out["decode_tokens_per_s"] == pytest.approx(8 * 64 / out["decode_step_s"])
    assert out["kv_step_fraction"] == pytest.approx(float(cm.kv_step_fraction(cp, b, kv)), rel=1e-6)
    assert out["kv_capacity_tokens"] == cm.kv_capacity_tokens("910c", "deepseek-v3-w8a8", 4, parallel="dp_ep", dp_ranks=8)
    t = out["decode_terms"]
    assert out["decode_step_s"] == pytest.approx(t["overhead_s"] + t["attention_s"] + t["experts_s"] + t["all_to_all_s"])
    assert main(["cost", *argv]) == 0
    text = capsys.readouterr().out
    assert "8 DP ranks x 4x Ascend-910C" in text and "KV capacity per DP rank" in text
    assert "scales with the max KV load" in text and "all-to-all" in text
    # independent mode reports the KV share too, and keeps today's numbers
    out = run_json(capsys, "--gpu", "A6000", "--model", "mistral-7b", "--decode-batch", "4", "--context", "2000")
    assert out["parallel"] == "independent" and 0 < out["kv_step_fraction"] < 1
    assert out["decode_step_s"] == pytest.approx(float(cm.decode_step_time(cm.cost_params("A6000", "Mistral-7B"), 4, 2000)))


def test_list(capsys):
    assert main(["cost", "--list"]) == 0
    text = capsys.readouterr().out
    for name in list(cm.GPUS) + list(cm.MODELS):
        assert name in text


@pytest.mark.parametrize("argv,message", [
    (["--gpu", "V100"], "unknown GPU 'V100'; choose from: A6000, A100-80GB, H100-SXM, H200"),
    (["--model", "gpt2"], "choose from: Mistral-7B, Llama-3-8B, Llama-3-70B, Qwen3-30B-A3B, DeepSeek-V3"),
    (["--cost-model", "vidur"], "choose from: trained, roofline, preble"),
    (["--prefill", "abc"], "argument --prefill: expected a positive integer, got 'abc'"),
    (["--prefill", "0"], "argument --prefill: expected a positive integer, got '0'"),
    (["--decode-batch", "-3"], "argument --decode-batch: expected a positive integer"),
    (["--context", "1.5"], "argument --context: expected a positive integer, got '1.5'"),
    (["--tp", "0"], "argument --tp: expected a positive integer"),
    (["--mem-util", "2"], "argument --mem-util: expected a fraction in (0, 1], got '2'"),
    (["--mem-util", "nan"], "argument --mem-util: expected a fraction in (0, 1], got 'nan'"),
    (["--gpu", "H100-SXM", "--model", "Llama-3-70B"], "use tensor parallelism >= 2"),
    (["--cost-model", "preble", "--gpu", "H200"], "Mistral-7B on one A6000"),
    (["--parallel", "dp_ep", "--dp-ranks", "2"], "dp_ep (DP attention + expert-parallel MoE) needs a MoE model"),
    (["--parallel", "ep"], "unknown parallel mode 'ep'; choose from: independent, dp_ep"),
    (["--dp-ranks", "0"], "argument --dp-ranks: expected a positive integer"),
    (["--gpu", "910c", "--model", "deepseek-v3-w8a8", "--tp", "4", "--parallel", "dp_ep", "--cached", "10"],
     "--cached is not modelled with --parallel dp_ep"),
    (["--gpu", "910c", "--model", "deepseek-v3-w8a8", "--tp", "4", "--parallel", "dp_ep", "--dp-ranks", "1"],
     "leave no room for KV cache on Ascend-910C"),
])
def test_bad_input_gives_clear_error(capsys, argv, message):
    assert cli(["cost", *argv]) == 2
    captured = capsys.readouterr()
    assert "jaxroute cost: error:" in captured.err
    assert message in captured.err
    assert captured.out == ""
