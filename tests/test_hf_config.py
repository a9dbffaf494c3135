"""Models from Hugging Face config.json files (jaxroute/hf_config.py), the catalog built from them, the GPU table from
the datasheets, and --model-config on the command line. No compilation: plain Python, plus cost_params' arrays."""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from pathlib import Path

import pytest

from jaxroute import catalog, spec
from jaxroute.catalog import ModelSpec
from jaxroute.cli import build_parser, main
from jaxroute.errors import JaxrouteError
from jaxroute.hf_config import model_from_config, read_model_config
from tests.data_paths import SHARED_DATA, require

REPO = Path(__file__).resolve().parents[1]
RUNS = SHARED_DATA / "vllm-h100-inference-perf"


def config_dir(folder: str) -> Path:
    return require(RUNS / "model_configs" / folder / "config.json").parent


def write(tmp_path: Path, config, name: str = "model", raw: str | None = None) -> Path:
    """A folder `name` holding config.json (the JSON of `config`, or `raw` text)."""
    d = tmp_path / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(raw if raw is not None else json.dumps(config))
    return d


# --------------------------------------------------------------------------- the four models of the real runs

# (folder in model_configs, catalog name, published total, published active, KV bytes per token, layers, KV heads)
# Published counts: the models' Hugging Face pages / papers (Mixtral of Experts: 46.7B total, 12.9B active).
REAL = [
    ("Llama-2-7b-hf", "Llama-2-7B", 6_738_415_616, None, 524_288),  # 2 x 32 layers x 32 KV heads x 128 x 2 B
    ("Llama-2-70b-hf", "Llama-2-70B", 68_976_648_192, None, 327_680),  # 2 x 80 x 8 x 128 x 2
    ("Mixtral-8x7B-v0.1", "Mixtral-8x7B", 46_702_792_704, 12.9e9, 131_072),  # 2 x 32 x 8 x 128 x 2
    ("CodeLlama-34b-Instruct-hf", "CodeLlama-34B", 33_743_970_304, None, 196_608),  # 2 x 48 x 8 x 128 x 2
]


@pytest.mark.parametrize("folder, name, total, active, kv", REAL)
def test_real_run_models_match_their_published_counts(folder, name, total, active, kv):
    m = read_model_config(config_dir(folder))
    assert m.name == folder  # named after its folder
    assert m.total_params == pytest.approx(total, rel=0.01)
    assert m.active_params == pytest.approx(active or total, rel=0.01)
    assert m.kv_bytes_per_token == kv
    assert m.weight_bytes_per_param == 2 and not m.w8a8 and not m.tied_embeddings
    # the catalog's entry is the same config (copied into the package, its source cited)
    assert dataclasses.replace(catalog.get_model(name), name=folder) == m


def test_real_run_models_exact_counts():
    # Exact by hand: per layer q, k, v, o + 3 x hidden x intermediate + 2 norms; embedding + LM head + final norm.
    m = catalog.get_model("Llama-2-7B")
    assert m.total_params == 32 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096) + 2 * 32000 * 4096 + 4096
    assert m.total_params == 6_738_415_616
    mx = catalog.get_model("Mixtral-8x7B")
    attn = 2 * 4096 * 4096 + 2 * 4096 * 1024  # 32 query heads, 8 KV heads of 128
    expert = 3 * 4096 * 14336
    layer = attn + 8 * expert + 4096 * 8 + 2 * 4096  # 8 experts + router gate + 2 norms
    assert mx.total_params == 32 * layer + 2 * 32000 * 4096 + 4096 == 46_702_792_704
    assert mx.active_params == mx.total_params - 32 * 6 * expert  # 2 of 8 experts per token
    assert (mx.n_experts, mx.experts_per_token, mx.dense_layers, mx.moe_layers) == (8, 2, 0, 32)
    assert mx.expert_params == 32 * 8 * expert


# --------------------------------------------------------------------------- the catalog, read from its configs

# Every field of the catalog's models before they became config files (name, total, active, layers, hidden, vocab,
# heads, head_dim_qk, head_dim_v, KV heads, KV bytes, experts, per token, weight bytes, dense layers, MLA latent,
# MLA rope, TP-replicated params, W8A8): they must not change.
BEFORE = [
    ("Mistral-7B", 7241732096, 7241732096, 32, 4096, 32000, 32, 128, 128, 8, 131072, 1, 1, 2, 0, 0, 0, 0.0, False),
    ("Llama-3-8B", 8030261248, 8030261248, 32, 4096, 128256, 32, 128, 128, 8, 131072, 1, 1, 2, 0, 0, 0, 0.0, False),
    ("Llama-3-70B", 70553706496, 70553706496, 80, 8192, 128256, 64, 128, 128, 8, 327680, 1, 1, 2, 0, 0, 0, 0.0, False),
    ("Qwen3-30B-A3B", 30.5e9, 3.3e9, 48, 2048, 151936, 32, 128, 128, 4, 98304, 128, 8, 2, 0, 0, 0, 0.0, False),
    ("DeepSeek-V3", 671e9, 37e9, 61, 7168, 129280, 128, 192, 128, 1, 70272, 256, 8, 1, 3, 512, 64, 923467776, False),
    ("Qwen3-32B", 32762123264, 32762123264, 64, 5120, 151936, 64, 128, 128, 8, 262144, 1, 1, 2, 0, 0, 0, 0.0, False),
    ("Qwen3-8B", 8190735360, 8190735360, 36, 4096, 151936, 32, 128, 128, 8, 147456, 1, 1, 2, 0, 0, 0, 0.0, False),
    ("Llama-3.1-8B", 8030261248, 8030261248, 32, 4096, 128256, 32, 128, 128, 8, 131072, 1, 1, 2, 0, 0, 0, 0.0, False),
    ("Llama-3.1-70B", 70553706496, 70553706496, 80, 8192, 128256, 64, 128, 128, 8, 327680, 1, 1, 2, 0, 0, 0, 0.0,
     False),
    ("DeepSeek-V3-W8A8", 671e9, 37e9, 61, 7168, 129280, 128, 192, 128, 1, 70272, 256, 8, 1, 3, 512, 64, 923467776, True),
]


def test_catalog_models_unchanged():
    names = [b[0] for b in BEFORE]
    assert list(catalog.MODELS)[:len(names)] == names  # the order the CLI lists them in, too
    for before in BEFORE:
        m = catalog.MODELS[before[0]]
        assert dataclasses.astuple(m) == (*before, False)  # + tied_embeddings
        assert [type(v) for v in dataclasses.astuple(m)[1:3]] == [type(v) for v in before[1:3]]


def test_catalog_is_its_package_configs():
    files = sorted(catalog.MODEL_DIR.glob("*.json"))
    assert {f.stem for f in files} == set(catalog.MODELS)
    for f in files:
        data = json.loads(f.read_text())
        assert len(data["_source"]) > 40  # where the values come from
        assert catalog.MODELS[f.stem] == read_model_config(f)  # named after the file
    # an installed package carries them
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "data/models/*.json" in pyproject["tool"]["setuptools"]["package-data"]["jaxroute"]


def test_deepseek_v3_derived_from_its_config():
    data = json.loads((catalog.MODEL_DIR / "DeepSeek-V3.json").read_text())
    published = data.pop("_total_params"), data.pop("_active_params")
    m = model_from_config(data, "DeepSeek-V3")
    # the config's weights: 671.03B and 37.55B, the model card's 671B and 37B
    assert (m.total_params, m.active_params) == (671_026_419_200, 37_552_297_472)
    assert m.total_params == pytest.approx(published[0], rel=1e-3)
    assert m.active_params == pytest.approx(published[1], rel=0.02)
    d = catalog.get_model("DeepSeek-V3")
    assert dataclasses.replace(m, total_params=d.total_params, active_params=d.active_params) == d
    # MLA: latent 512 + rope 64 per layer; q/k 128 + 64, v 128; 3 dense layers; vLLM's TP-replicated q_a + kv_a
    assert (m.mla_latent, m.mla_rope, m.head_dim_qk, m.head_dim_v, m.n_kv_heads) == (512, 64, 192, 128, 1)
    assert m.kv_bytes_per_token == 61 * 576 * 2 and m.dense_layers == 3 and m.moe_layers == 58
    assert m.tp_replicated_params == 61 * 7168 * (1536 + 512 + 64)
    assert m.weight_bytes_per_param == 1 and not m.w8a8  # quant_method fp8
    # a published count too far from the config's is refused, naming the field
    with pytest.raises(JaxrouteError, match=r"field '_total_params' is 700,000,000,000 but .* more than 3% apart"):
        model_from_config({**data, "_total_params": 700e9}, "x", "cfg.json")


def test_deepseek_without_q_lora_and_v2():
    base = json.loads((catalog.MODEL_DIR / "DeepSeek-V3.json").read_text())
    small = {**base, "model_type": "deepseek_v2", "q_lora_rank": None, "num_hidden_layers": 4, "n_routed_experts": 8,
             "num_experts_per_tok": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_shared_experts": 2,
             "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32, "num_attention_heads": 4,
             "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8, "vocab_size": 100}
    for k in ("_total_params", "_active_params", "quantization_config"):
        small.pop(k)
    m = model_from_config(small, "tiny-v2")
    h, H = 64, 4
    attn = h * H * 16 + h * (16 + 8) + 16 + 16 * H * (8 + 8) + H * 8 * h  # q, kv_a, kv_a norm, kv_b, o
    moe = 8 * 3 * h * 32 + 3 * h * 64 + h * 8  # routed, 2 shared of 32, router (no V3 correction bias)
    total = 4 * (attn + 2 * h) + 1 * 3 * h * 96 + 3 * moe + 2 * 100 * h + h
    assert m.total_params == total
    assert m.active_params == total - 3 * 6 * 3 * h * 32
    assert m.tp_replicated_params == 4 * h * (16 + 8)  # only kv_a without q_lora_rank
    assert m.weight_bytes_per_param == 2 and (m.dense_layers, m.n_experts, m.experts_per_token) == (1, 8, 2)


# --------------------------------------------------------------------------- families and options


def llama_config(**kw) -> dict:
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
         "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 3, "vocab_size": 1000,
         "tie_word_embeddings": False}
    c.update(kw)
    return c


def dense_by_hand(L, d, H, kv, hd, ffn, V, tied=False, qkv_bias=False, qk_norm=False) -> int:
    layer = d * H * hd + 2 * d * kv * hd + H * hd * d + 3 * d * ffn + 2 * d
    layer += (H * hd + 2 * kv * hd) if qkv_bias else 0
    layer += 2 * hd if qk_norm else 0
    return L * layer + (1 if tied else 2) * V * d + d


def test_dense_families(tmp_path):
    m = read_model_config(write(tmp_path, llama_config()))
    assert m.total_params == m.active_params == dense_by_hand(3, 256, 8, 2, 32, 512, 1000)
    assert (m.n_heads, m.n_kv_heads, m.head_dim_qk, m.kv_bytes_per_token) == (8, 2, 32, 2 * 3 * 2 * 32 * 2)
    # no num_key_value_heads: multi-head attention
    mha = model_from_config({k: v for k, v in llama_config().items() if k != "num_key_value_heads"}, "mha")
    assert mha.n_kv_heads == 8 and mha.total_params == dense_by_hand(3, 256, 8, 8, 32, 512, 1000)
    # qwen2: q/k/v biases; qwen3: per-head q/k RMSNorms; mistral and yi as llama; by `architectures` alone too
    q2 = model_from_config(llama_config(model_type="qwen2", architectures=["Qwen2ForCausalLM"]), "q2")
    assert q2.total_params == dense_by_hand(3, 256, 8, 2, 32, 512, 1000, qkv_bias=True)
    q3 = model_from_config(llama_config(model_type="qwen3", head_dim=64), "q3")
    assert q3.total_params == dense_by_hand(3, 256, 8, 2, 64, 512, 1000, qk_norm=True)
    for other in (dict(model_type="mistral"), dict(model_type="yi"), dict(model_type=None, architectures=["MistralForCausalLM"])):
        assert model_from_config(llama_config(**other), "x").total_params == m.total_params
    # llama's attention_bias: q, k, v and o biases
    b = model_from_config(llama_config(attention_bias=True), "b")
    assert b.total_params - m.total_params == 3 * (8 * 32 + 2 * 2 * 32 + 256)


def test_explicit_head_dim(tmp_path):
    # Mistral-Nemo style: hidden 5120, 32 heads, head_dim 128 (not 5120 / 32 = 160)
    m = read_model_config(write(tmp_path, llama_config(model_type="mistral", hidden_size=5120, num_attention_heads=32,
                                                       num_key_value_heads=8, head_dim=128, intermediate_size=14336,
                                                       num_hidden_layers=40, vocab_size=131072)))
    assert (m.head_dim_qk, m.head_dim_v) == (128, 128)
    assert m.kv_bytes_per_token == 2 * 40 * 8 * 128 * 2
    assert m.total_params == dense_by_hand(40, 5120, 32, 8, 128, 14336, 131072)
    assert m.total_params == pytest.approx(12.2e9, rel=0.01)  # Mistral-NeMo-12B


def test_tied_embeddings_counted_once_and_costed_right(tmp_path):
    from jaxroute import cost_models as cm

    untied = read_model_config(write(tmp_path, llama_config(), "untied"))
    tied = read_model_config(write(tmp_path, llama_config(tie_word_embeddings=True), "tied"))
    assert tied.tied_embeddings and not untied.tied_embeddings
    assert untied.total_params - tied.total_params == 1000 * 256  # one table fewer
    assert tied.total_params == dense_by_hand(3, 256, 8, 2, 32, 512, 1000, tied=True)
    # the same layers and the same LM head: the cost model must see the same FLOPs and weight reads
    a, b = cm.cost_params("A6000", untied), cm.cost_params("A6000", tied)
    for field in ("linear_flops_per_token", "logits_flops", "dense_weight_bytes"):
        assert float(getattr(a, field)) == float(getattr(b, field)), field
    assert float(b.dense_weight_bytes) == tied.total_params * 2  # the tied table is read, as the LM head
    assert float(b.linear_flops_per_token) == 2 * (tied.active_params - 1000 * 256)


FP8_DS = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def ct(weights: dict, acts: dict | None = None) -> dict:
    group = {"targets": ["Linear"], "weights": weights}
    if acts is not None:
        group["input_activations"] = acts
    return {"quant_method": "compressed-tensors", "config_groups": {"group_0": group}}


@pytest.mark.parametrize("qc, w8a8", [
    (FP8_DS, False),
    ({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}, False),
    (ct({"num_bits": 8, "type": "float"}, {"num_bits": 8, "type": "float"}), False),  # FP8 W8A8
    (ct({"num_bits": 8, "type": "int"}, {"num_bits": 8, "type": "int", "dynamic": True}), True),  # INT8 W8A8
    (ct({"num_bits": 8, "type": "int"}), False),  # INT8 weights only
])
def test_eight_bit_quantization(qc, w8a8):
    m = model_from_config(llama_config(quantization_config=qc), "q")
    assert m.weight_bytes_per_param == 1 and m.w8a8 == w8a8
    assert m.weight_bytes == m.total_params  # one byte per weight
    assert model_from_config(llama_config(), "bf16").weight_bytes_per_param == 2


def test_qwen3_moe(tmp_path):
    c = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 128,
         "intermediate_size": 384, "moe_intermediate_size": 48, "num_experts": 16, "num_experts_per_tok": 4,
         "decoder_sparse_step": 2, "mlp_only_layers": [3], "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 64, "num_hidden_layers": 6, "vocab_size": 500, "tie_word_embeddings": False}
    m = read_model_config(write(tmp_path, c, "Qwen3-tiny-MoE"))
    assert m.name == "Qwen3-tiny-MoE"
    # MoE where (i + 1) % 2 == 0 and i not in mlp_only_layers: layers 1 and 5; dense MLPs of 384 elsewhere
    attn = 128 * 4 * 64 * 2 + 2 * 128 * 2 * 64 + 2 * 64 + 2 * 128  # q, o, k, v, q/k norms, 2 norms
    expert = 3 * 128 * 48
    moe_layer = attn + 16 * expert + 128 * 16  # experts + router, no shared expert
    dense_layer = attn + 3 * 128 * 384
    assert m.total_params == 2 * moe_layer + 4 * dense_layer + 2 * 500 * 128 + 128
    assert m.active_params == m.total_params - 2 * 12 * expert
    assert (m.n_experts, m.experts_per_token, m.dense_layers, m.moe_layers) == (16, 4, 4, 2)
    assert m.expert_params == 2 * 16 * expert and m.kv_bytes_per_token == 2 * 6 * 2 * 64 * 2
    # the catalog's Qwen3-30B-A3B config gives the model card's 30.5B / 3.3B within 2 %
    data = json.loads((catalog.MODEL_DIR / "Qwen3-30B-A3B.json").read_text())
    data.pop("_total_params"), data.pop("_active_params")
    q = model_from_config(data, "q")
    assert (q.total_params, q.active_params) == (30_532_122_624, 3_353_032_704)
    assert q.active_params == pytest.approx(3.3e9, rel=0.02) and q.total_params == pytest.approx(30.5e9, rel=0.002)


def llama4_text(**kw) -> dict:
    t = {"model_type": "llama4_text", "hidden_size": 64, "intermediate_size": 32, "intermediate_size_mlp": 96,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 4,
         "num_local_experts": 8, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "vocab_size": 300,
         "tie_word_embeddings": False, "use_qk_norm": True}
    t.update(kw)
    return t


def test_llama4_interleaved_moe_with_a_shared_expert(tmp_path):
    c = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "text_config": llama4_text(),
         "vision_config": {"hidden_size": 1408}}
    m = read_model_config(write(tmp_path, c, "Llama-4-tiny"))
    attn = 64 * 4 * 16 * 2 + 2 * 64 * 2 * 16 + 2 * 64  # q, o, k, v, 2 norms (the L2 q/k norm has no weights)
    expert = 3 * 64 * 32  # routed and shared experts: intermediate_size
    moe_layer = attn + 8 * expert + expert + 64 * 8  # 8 routed + 1 shared + router
    dense_layer = attn + 3 * 64 * 96  # intermediate_size_mlp
    # interleave step 2: layers 1 and 3 are MoE
    assert m.total_params == 2 * moe_layer + 2 * dense_layer + 2 * 300 * 64 + 64
    assert m.active_params == m.total_params - 2 * 7 * expert  # 1 of 8 routed experts; the shared one always
    assert (m.n_experts, m.experts_per_token, m.dense_layers, m.moe_layers) == (8, 1, 2, 2)
    assert m.expert_params == 2 * 8 * expert
    # an explicit moe_layers list wins over the step; FP8 from the top-level quantization_config
    c2 = {**c, "text_config": llama4_text(moe_layers=[0, 1, 2]), "quantization_config": {"quant_method": "fbgemm_fp8"}}
    m2 = model_from_config(c2, "x")
    assert m2.dense_layers == 1 and m2.weight_bytes_per_param == 1
    # Llama-4 Maverick's text config: the model card's 400B total, 17B active (text weights; vision not counted)
    mav = llama4_text(hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384, num_attention_heads=40,
                      num_key_value_heads=8, head_dim=128, num_hidden_layers=48, num_local_experts=128,
                      interleave_moe_layer_step=2, vocab_size=202048)
    mm = model_from_config({"model_type": "llama4", "text_config": mav}, "Maverick")
    assert mm.total_params == pytest.approx(400e9, rel=0.01)
    assert mm.active_params == pytest.approx(17e9, rel=0.02)


# --------------------------------------------------------------------------- bad files


def bad_cases(tmp_path: Path):
    return {
        "missing file": (tmp_path / "nowhere" / "config.json", r"nowhere/config.json: no such file or folder"),
        "folder without config.json": (tmp_path, r"the folder has no config.json"),
        "not JSON": (write(tmp_path, None, "notjson", raw="{hidden_size: 4096"), r"config.json: not valid JSON \("),
        "a JSON list": (write(tmp_path, None, "list", raw="[1, 2]"), r"expected a JSON object of config fields, got list"),
        "unknown architecture": (write(tmp_path, llama_config(model_type="gemma2", architectures=["Gemma2ForCausalLM"]),
                                       "gemma"), r"field 'model_type': unknown architecture \(model_type 'gemma2'\); supported: llama"),
        "no model_type": (write(tmp_path, {"hidden_size": 8}, "notype"), r"field 'model_type' is missing"),
        "missing field": (write(tmp_path, {k: v for k, v in llama_config().items() if k != "hidden_size"}, "nohidden"),
                          r"field 'hidden_size' is missing"),
        "a string number": (write(tmp_path, llama_config(num_hidden_layers="32"), "str"),
                            r"field 'num_hidden_layers' must be a positive integer, got '32'"),
        "a boolean": (write(tmp_path, llama_config(vocab_size=True), "bool"), r"field 'vocab_size' must be a positive integer, got True"),
        "zero": (write(tmp_path, llama_config(num_attention_heads=0), "zero"), r"field 'num_attention_heads' must be a positive integer, got 0"),
        "heads do not split hidden": (write(tmp_path, llama_config(num_attention_heads=7), "split"),
                                      r"field 'hidden_size' 256 does not split into 7 attention heads"),
        "4-bit weights": (write(tmp_path, llama_config(quantization_config=ct({"num_bits": 4, "type": "int"})), "w4"),
                          r"field 'quantization_config.config_groups.group_0.weights.num_bits' is 4; only 8-bit"),
        "AWQ": (write(tmp_path, llama_config(quantization_config={"quant_method": "awq", "bits": 4}), "awq"),
                r"field 'quantization_config.quant_method' 'awq' is not supported"),
        "nested field": (write(tmp_path, {"model_type": "llama4", "text_config": llama4_text(num_local_experts="8")}, "l4"),
                         r"field 'text_config.num_local_experts' must be a positive integer, got '8'"),
        "top-k above experts": (write(tmp_path, llama_config(model_type="mixtral", num_local_experts=2,
                                                             num_experts_per_tok=3), "topk"),
                                r"field 'num_experts_per_tok' is 3, more than the 2 experts"),
    }


@pytest.mark.parametrize("case", ["missing file", "folder without config.json", "not JSON", "a JSON list",
                                  "unknown architecture", "no model_type", "missing field", "a string number",
                                  "a boolean", "zero", "heads do not split hidden", "4-bit weights", "AWQ",
                                  "nested field", "top-k above experts"])
def test_bad_config_one_line_error_naming_file_and_field(tmp_path, case):
    path, message = bad_cases(tmp_path)[case]
    with pytest.raises(JaxrouteError, match=message) as e:
        read_model_config(path)
    text = str(e.value)
    assert "\n" not in text and text.startswith("model config ") and str(path) in text
    # get_model and the CLI flag say the same
    with pytest.raises(JaxrouteError, match=message):
        catalog.get_model(path)


# --------------------------------------------------------------------------- get_model(path), names


def test_get_model_takes_a_config_path(tmp_path, monkeypatch):
    folder = config_dir("Llama-2-7b-hf")
    m = catalog.get_model(str(folder))
    assert m == catalog.get_model(folder / "config.json") == catalog.get_model(folder)  # str, file, Path
    assert m.name == "Llama-2-7b-hf" and m.total_params == catalog.get_model("llama-2-7b").total_params
    # names still mean the catalog; a bare folder name in the current folder is read when no model has that name
    assert catalog.get_model("mistral-7b") is catalog.MODELS["Mistral-7B"]
    write(tmp_path, llama_config(), "my-model")
    monkeypatch.chdir(tmp_path)
    assert catalog.get_model("my-model").name == "my-model"
    assert catalog.model_ref("my-model") == str(tmp_path / "my-model")
    assert catalog.model_ref("LLAMA-2-7B") == "Llama-2-7B"
    with pytest.raises(JaxrouteError, match=r"unknown model 'gpt-5'; choose from: Mistral-7B.* \(or a path to a "
                                            r"Hugging Face config.json or its folder\)"):
        catalog.get_model("gpt-5")
    # every catalog function takes it: KV capacity, TP checks
    assert catalog.kv_capacity_tokens("h100", folder) == int((80e9 * 0.9 - 2 * 6_738_415_616) // 524_288)
    with pytest.raises(JaxrouteError, match="64 attention heads, which 3 GPUs"):
        catalog.check_tp(config_dir("Llama-2-70b-hf"), 3)
    # a changed file is read again
    d = write(tmp_path, llama_config(), "edited")
    before = catalog.get_model(d).total_params
    (d / "config.json").write_text(json.dumps(llama_config(num_hidden_layers=4)) + "\n")
    assert catalog.get_model(d).total_params > before


def test_names(tmp_path):
    snap = write(tmp_path / "models--meta-llama--Llama-2-7b-hf" / "snapshots", llama_config(), "a" * 40)
    assert read_model_config(snap).name == "Llama-2-7b-hf"  # the Hugging Face cache's repo name
    loose = write(tmp_path, {**llama_config(), "_name_or_path": "org/Some-Model"}, "b" * 40)
    assert read_model_config(loose).name == "Some-Model"
    f = tmp_path / "Tiny-Llama.json"
    f.write_text(json.dumps(llama_config()))
    assert read_model_config(f).name == "Tiny-Llama" and read_model_config(f, name="mine").name == "mine"


# --------------------------------------------------------------------------- GPUs from their datasheets


def test_gpu_table_from_datasheets():
    g = catalog.GPUS
    # the entries that were there keep every value
    assert dataclasses.astuple(g["A6000"])[:7] == ("A6000", 154.8e12, 768e9, 48e9, 32e9, 309.7e12, 32e9)
    assert dataclasses.astuple(g["A100-80GB"])[:7] == ("A100-80GB", 312e12, 2039e9, 80e9, 300e9, 624e12, 32e9)
    assert dataclasses.astuple(g["H100-SXM"])[:7] == ("H100-SXM", 989.4e12, 3350e9, 80e9, 450e9, 1979e12, 64e9)
    assert dataclasses.astuple(g["H200"])[:7] == ("H200", 989.4e12, 4800e9, 141e9, 450e9, 1979e12, 64e9)
    assert dataclasses.astuple(g["Ascend-910C"])[:7] == ("Ascend-910C", 376e12, 1600e9, 64e9, 196e9, 752e12, 64e9)
    # H100 SXM against its datasheet's figures (with sparsity: dense is half; links bidirectional: half per direction)
    sheet = json.loads(require(RUNS / "datasheets" / "h100-sxm.json").read_text())
    c = sheet["compute"]
    assert c["with_sparsity"]
    h = g["H100-SXM"]
    assert h.flops == pytest.approx(c["bf16_tensor_core"] * 1e12 / 2, rel=1e-3)
    assert h.fp8_flops == pytest.approx(c["fp8_tensor_core"] * 1e12 / 2, rel=1e-3)
    assert h.int8_ops == pytest.approx(c["int8_tensor_core"] * 1e12 / 2, rel=1e-3)
    assert h.mem_bytes == sheet["memory"]["capacity_gb"] * 1e9
    assert h.mem_bw == pytest.approx(sheet["memory"]["bandwidth_tb_s"] * 1e12, rel=1e-12)
    assert h.link_bw == sheet["interconnect"]["nvlink_bandwidth_gb_s"] * 1e9 / 2
    assert h.host_bw == sheet["interconnect"]["pcie_bandwidth_gb_s"] * 1e9 / 2
    # the new ones (datasheet: sparse figure / 2)
    nvl, l40s, b200 = g["H100-NVL"], g["L40S"], g["B200"]
    assert (nvl.flops, nvl.fp8_flops, nvl.mem_bytes, nvl.mem_bw, nvl.link_bw) == (1671e12 / 2, 3341e12 / 2, 94e9, 3.9e12, 300e9)
    assert (l40s.flops, l40s.fp8_flops, l40s.int8_ops, l40s.mem_bw) == (733e12 / 2, 1466e12 / 2, 1466e12 / 2, 864e9)
    assert l40s.link_bw == l40s.host_bw == 32e9  # no NVLink: PCIe Gen4 x16
    assert (b200.flops, b200.fp8_flops, b200.mem_bytes, b200.mem_bw, b200.link_bw) == (2.25e15, 4.5e15, 180e9, 7.7e12, 900e9)
    for name in ("A6000", "A100-80GB", "Ascend-910C"):
        assert g[name].fp8_flops == 0.0  # no FP8 tensor math
    for gpu in g.values():
        assert gpu.fp8_flops in (0.0, gpu.int8_ops)  # FP8 and INT8 dense rates are equal where both exist
    assert catalog.get_gpu("h100") is h and catalog.get_gpu("H100 NVL") is nvl and catalog.get_gpu("hgx-b200") is b200
    assert catalog.get_gpu("rtx a6000") is g["A6000"] and catalog.get_gpu("l40s") is l40s


# --------------------------------------------------------------------------- the command line and specs


def test_model_config_flag_on_every_command_that_takes_a_model():
    folder = str(config_dir("Llama-2-7b-hf"))
    p = build_parser()
    for argv, dest in ((["cost"], "model"), (["cluster"], "model"), (["pd"], "model"), (["decode"], "model"),
                       (["capacity", "cluster", "--slo", "ttft_p90_s<=1"], "model_name"),
                       (["capacity", "pd", "--slo", "ttft_p90_s<=1"], "model"),
                       (["tune", "cluster", "--router", "llmd_precise"], "model"),
                       (["tune", "control"], "model")):
        args = p.parse_args([*argv, "--model-config", folder])
        assert getattr(args, dest) == folder == args.model_config, argv
        assert catalog.get_model(getattr(args, dest)).name == "Llama-2-7b-hf"


def test_model_config_cli(capsys, tmp_path):
    folder = str(config_dir("Mixtral-8x7B-v0.1"))
    assert main(["cost", "--gpu", "h100", "--tp", "2", "--model-config", folder, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "Mixtral-8x7B-v0.1"
    m = catalog.get_model("Mixtral-8x7B")
    assert out["kv_capacity_tokens"] == int((2 * 80e9 * 0.9 - 2 * m.total_params) // 131_072)  # 8 KV heads split over 2
    # --model and --model-config together, and a bad config: one line each
    for argv, message in ((["--model", "mistral-7b", "--model-config", folder],
                           "argument --model-config: not allowed with argument --model"),
                          (["--model-config", str(tmp_path / "none")], f"model config {tmp_path / 'none'}: no such file")):
        with pytest.raises(SystemExit) as e:
            main(["cost", *argv])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert message in err


def test_spec_model_config_key(tmp_path):
    root = build_parser()
    folder = config_dir("Llama-2-7b-hf")
    rel = os.path.relpath(folder, tmp_path)
    path = tmp_path / "run.yaml"
    path.write_text(f"command: cluster\ndeployment:\n  model_config: {rel}\n  gpu: h100\n")
    command, argv = spec.read(path, root)
    assert command == "cluster" and argv[argv.index("--model-config") + 1] == str(tmp_path / rel)
    assert root.parse_args([command, *argv]).model == str(folder)  # the same folder, relative to the spec
    assert spec.SECTION_OF["model_config"] == "deployment"
    path.write_text("command: cluster\ndeployment:\n  model_config: nowhere\n")
    with pytest.raises(JaxrouteError, match=r"run.yaml: deployment.model_config: model config .*nowhere: no such file"):
        spec.read(path, root)


def test_model_spec_defaults_keep_old_callers_working():
    m = ModelSpec("x", 1e9, 1e9, 2, 64, 100, 4, 16, 16, 4, 512)
    assert not m.tied_embeddings and m.weight_bytes_per_param == 2
    assert catalog.GPUSpec("g", 1.0, 1.0, 1.0, 1.0).fp8_flops == 0.0
