"""The trained latency model: its basis, vLLM server files, coefficient files, real runs read as stages, and a fit
that recovers known coefficients through the simulator."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxroute import cost_models as cm
from jaxroute import latency_params, real_runs, server
from jaxroute.errors import JaxrouteError
from jaxroute.experiments import fit_latency as fl
from tests.data_paths import SHARED_DATA, require

RUNS = SHARED_DATA / "vllm-h100-inference-perf"
CODEGEN_7B = "20260217-155451-llama-2-7b-tp1-codegen"


def _runs():
    return require(RUNS / "runs")


# --------------------------------------------------------------------------- the basis


def test_trained_step_time_is_linear_in_beta_and_its_jacobian_is_the_basis():
    cp = cm.cost_params("H100-SXM", "Llama-2-70B", tp=4, kind="trained")
    stats = cm.iteration_stats(jnp.array([512.0, 0.0]), jnp.array([1000.0, 0.0]), jnp.array([True, False]),
                               jnp.array([700.0, 900.0, 1200.0]), jnp.array([True, True, False]))
    beta = jnp.asarray(latency_params.default().beta, jnp.float32)
    basis = cm.trained_basis(cp, stats)
    t = cm.time_from_stats(cm.with_beta(cp, beta), stats)
    np.testing.assert_allclose(t, jnp.sum(beta * basis), rtol=1e-6)
    jac = jax.jacfwd(lambda b: cm.time_from_stats(cm.with_beta(cp, b), stats))(beta)
    np.testing.assert_allclose(jac, basis, rtol=1e-6)
    # the phases split the roofline's counts: decode KV reads the decoders' contexts, prefill KV the chunk's
    assert float(basis[cm.BASIS.index("tp_allreduce")]) > 0
    one = cm.cost_params("H100-SXM", "Llama-2-7B", tp=1, kind="trained")
    assert float(cm.trained_basis(one, stats)[cm.BASIS.index("tp_allreduce")]) == 0.0
    kv = cp.kv_bytes_per_token_gpu / cp.peak_mem_bw
    np.testing.assert_allclose(basis[cm.BASIS.index("decode_kv")], kv * (700 + 900 + 2), rtol=1e-5)
    np.testing.assert_allclose(basis[cm.BASIS.index("prefill_kv")], kv * (1000 + 512), rtol=1e-5)


def test_an_empty_iteration_takes_no_time_and_other_kinds_are_unchanged():
    cp = cm.cost_params("H100-SXM", "Llama-2-7B", kind="trained")
    assert float(cm.decode_step_time(cp, 0, 100)) == 0.0
    roof = cm.cost_params("H100-SXM", "Llama-2-7B")
    assert float(jnp.sum(roof.beta)) == 0.0 and int(roof.kind) == cm.ROOFLINE
    assert float(cm.decode_step_time(roof, 8, 500)) > 0


# --------------------------------------------------------------------------- server files


def test_a_harness_server_file_reads_with_vllm_defaults(tmp_path):
    s = server.read_server(require(_runs() / CODEGEN_7B / "exp-config.yaml"))
    assert (s.tensor_parallel_size, s.max_num_batched_tokens, s.max_num_seqs, s.max_model_len) == (1, 2048, 128, 4096)
    assert s.gpu_memory_utilization == 0.9 and s.block_size == 16 and s.enable_prefix_caching
    f = tmp_path / "serve.yaml"
    f.write_text("model: m\ntensor-parallel-size: 2\n")
    s = server.read_server(f)
    assert s.tensor_parallel_size == 2 and s.max_num_seqs == 256 and s.max_num_batched_tokens == 8192


KUBECON = Path(__file__).resolve().parent / "fixtures" / "inference_perf_kubecon_na_2025_vllm"


def test_the_kubecon_demo_reads_as_a_run_folder_without_prefix_caching_and_its_paced_stages_apart():
    """tests/fixtures/...kubecon...: server.yaml (the demo's manifest: no prefix caching, no chunked prefill,
    max_num_seqs 128), config.yaml (a sweep: the stages' rates come from their reports), 7 stage reports; the last
    three were sent at about 106 req/s of 123-183 asked (the client's cap)."""
    srv = server.read_server(KUBECON / "server.yaml")
    assert (srv.max_num_seqs, srv.max_model_len, srv.enable_prefix_caching, srv.enable_chunked_prefill) == \
        (128, 512, False, False)
    assert srv.max_num_batched_tokens == 8192  # V1 chunks regardless, at the OpenAI server's H100 default
    stages = real_runs.read_run(KUBECON)
    assert stages[0].model == "Llama-3.1-8B" and [s.client_bound for s in stages] == [False] * 4 + [True] * 3
    assert not stages[0].prefix_caching and all(s.run_measured == {} for s in stages)
    assert real_runs.discover(KUBECON) == [KUBECON]
    # no prefix caching: each request's whole prompt (128 + 64 tokens) is private
    sent = stages[1].sent(50)
    assert sent.shared_prefix is None and set(sent.prompt_tokens.tolist()) == {192}
    assert set(stages[1].sent(50).output_tokens.tolist()) == {64}
    with_cache = dataclasses.replace(stages[1], prefix_caching=True).sent(50)
    assert with_cache.shared_prefix["groups"] == 10 and with_cache.prompt_tokens is None


def test_served_model_names_map_to_the_catalog():
    assert real_runs.served_model_name("meta-llama/Llama-3.1-8B-Instruct") == "Llama-3.1-8B"
    assert real_runs.served_model_name("meta-llama/Llama-2-7b-chat-hf") == "Llama-2-7B"
    assert real_runs.served_model_name("org/unknown-model") == "org/unknown-model"


@pytest.mark.parametrize("text, needle", [
    ("model: m\nmax_num_sqs: 4\n", "unknown server setting 'max_num_sqs'"),
    ("model: m\nmax_num_seqs: 0\n", "max_num_seqs = 0"),
    ("model: m\ngpu_memory_utilization: 1.5\n", "gpu_memory_utilization = 1.5"),
    ("model: m\nenable_prefix_caching: maybe\n", "enable_prefix_caching"),
    ("model: m\nenable_chunked_prefill: 0\n", "enable_chunked_prefill = 0"),
    ("tensor_parallel_size: 2\n", "no model"),
    ("model: m\ntp: 2\ntensor_parallelism: 2\n", "twice"),
    ("[1, 2]\n", "expected a mapping"),
])
def test_bad_server_files_get_one_line(tmp_path, text, needle):
    f = tmp_path / "serve.yaml"
    f.write_text(text)
    with pytest.raises(JaxrouteError, match=needle) as e:
        server.read_server(f)
    assert "\n" not in str(e.value)


def test_kv_pool_is_sized_as_vllm_sizes_it():
    p = server.kv_parts("H100-SXM", "Llama-2-7B", 1)
    free = 80e9 * 0.9 - 6_738_415_616 * 2 - 5.5 * 2**30 - 0.15 * 2**30
    assert p.tokens == int(free // (524_288 * 16)) * 16
    assert "activations" in p.text()
    with pytest.raises(JaxrouteError, match="no room for a KV block"):
        server.kv_parts("H100-SXM", "Llama-2-70B", 1)


# --------------------------------------------------------------------------- coefficient files


def test_shipped_coefficients_load_and_a_saved_file_round_trips(tmp_path):
    lp = latency_params.default()
    assert len(lp.beta) == len(cm.BASIS) and len(lp.alpha) == 3 and lp.provenance
    path = latency_params.save(tmp_path / "lp.json", lp)
    assert latency_params.load(path) == lp


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d["beta"].pop("weights"), "exactly"),
    (lambda d: d["beta"].update(weights=-1), "beta.weights"),
    (lambda d: d["alpha"].update(first_token_s="x"), "alpha.first_token_s"),
    (lambda d: d.pop("alpha"), "alpha"),
])
def test_bad_coefficient_files_get_one_line(tmp_path, edit, needle):
    doc = latency_params.default().as_json()
    edit(doc)
    f = tmp_path / "lp.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(JaxrouteError, match=needle) as e:
        latency_params.load(f)
    assert "\n" not in str(e.value)


# --------------------------------------------------------------------------- real runs


def test_the_sixteen_runs_read_as_stages_with_the_three_overloaded_ones_apart():
    stages = [s for f in real_runs.discover(RUNS) for s in real_runs.read_run(f)]
    assert len({s.run for s in stages}) == 16 and len(stages) == 24
    over = sorted({s.run for s in stages if s.overloaded})
    assert len(over) == 3 and all("reasoning" in r and "codellama" not in r for r in over)
    s = next(s for s in stages if s.run == CODEGEN_7B and s.index == 0)
    # results/config.yaml, not profile.yaml: 10 groups x 10 prompts of 100 + 466 tokens, 247 output tokens
    assert s.data["shared_prefix"]["num_groups"] == 10 and s.output_len == 247 and s.rate == 5.0
    assert s.model.endswith("Llama-2-7b-hf") and s.tp == 1 and s.timeout_s == 300.0
    # the per-token time from the means, about twice the reported TPOT (the client counted tokens twice)
    assert s.measured["itl"] == pytest.approx((s.measured["e2e_mean"] - s.measured["ttft_mean"]) / 246)
    assert 1.9 < s.measured["itl"] / s.measured["reported_tpot"] < 2.1


# --------------------------------------------------------------------------- the fit


def test_a_fit_recovers_known_coefficients_through_the_simulator():
    """Targets simulated under known coefficients; a fit from other values finds them again."""
    stages = [s for f in ("20260217-155451-llama-2-7b-tp1-codegen", "20260218-150304-codellama-34b-tp2-general")
              for s in real_runs.read_run(_runs() / f)]
    truth = latency_params.LatencyParams((0.6, 0.0, 0.0, 1.4, 1.2, 0.5, 2.0, 20.0, 5.0, 300.0, 0.0), (0.01, 0.0, 2e-5))
    groups = fl.prepare(stages, n=60, seed=1)
    res = fl.simulate(stages, truth, groups)
    synthetic = [dataclasses.replace(s, measured={**s.measured, **fl.predictions(r, truth)})
                 for s, r in zip(stages, res, strict=True)]
    only = ("decode_kv", "weights", "first_token_s")
    start = latency_params.LatencyParams(
        tuple(b * (0.5 if n in only else 1) for n, b in zip(cm.BASIS, truth.beta, strict=True)), (0.02, 0.0, 2e-5))
    f = fl.fit(synthetic, start=start, rounds=5, groups=groups, only=only)
    got = dict(zip(cm.BASIS + latency_params.ALPHA, f.params.beta + f.params.alpha, strict=True))
    want = dict(zip(cm.BASIS + latency_params.ALPHA, truth.beta + truth.alpha, strict=True))
    for name in only:
        assert got[name] == pytest.approx(want[name], rel=0.05), name  # 60 requests a stage: ~1 % event noise
    assert min(f.loss) < 1e-3 < 0.1 < f.loss[0]
    with pytest.raises(JaxrouteError, match="unknown coefficient"):
        fl.fit(synthetic, start=start, rounds=1, groups=groups, only=("decode_vk",))
