"""Any model from its Hugging Face config.json: parameter counts, KV bytes per token and every `ModelSpec` field.

Plain Python, no JAX: the command line reads a `--model-config` before JAX loads. `read_model_config(path)` takes a
config.json file or a folder holding one; the catalog's own models are such files (jaxroute/data/models/*.json),
read here too, so one path builds every model.

Supported (model_type, or the class in `architectures`); the weights counted are those of the Hugging Face
transformers module of each family (modeling_<family>.py), the language model only (Llama-4's vision encoder and
DeepSeek-V3's multi-token-prediction layer are not used to serve text and are not counted):

- dense GQA/MHA decoders: llama (Llama-2/3/3.1, CodeLlama, Yi), mistral, qwen2 (q/k/v biases), qwen3 (per-head
  q/k RMSNorms of head_dim weights each). Per layer: q, k, v, o projections, a SwiGLU MLP (gate, up, down), two
  RMSNorms; then the embedding, the LM head (none when `tie_word_embeddings`) and the final RMSNorm.
- MoE: mixtral (`num_local_experts` SwiGLU experts of `intermediate_size`, `num_experts_per_tok` per token, a
  router gate hidden x E), qwen3_moe (`num_experts` experts of `moe_intermediate_size`; layer i is MoE unless it is
  in `mlp_only_layers` or (i + 1) % `decoder_sparse_step` != 0, else a dense MLP of `intermediate_size`), llama4
  (the `text_config`; MoE layers `moe_layers`, by default every `interleave_moe_layer_step`-th from layer step - 1,
  each with routed experts of `intermediate_size`, a router and one shared expert of `intermediate_size`; the other
  layers a dense MLP of `intermediate_size_mlp`; its q/k norm is an L2 norm without weights), deepseek_v3 and
  deepseek_v2 (MLA attention: q_a (hidden x q_lora_rank) + q_a norm + q_b (q_lora_rank x heads (nope + rope)), or
  one q projection when q_lora_rank is null; kv_a (hidden x (kv_lora_rank + rope)) + kv_a norm + kv_b
  (kv_lora_rank x heads (nope + v)); o (heads v x hidden). Layers from `first_k_dense_replace` on (every
  `moe_layer_freq`-th) are MoE: `n_routed_experts` experts and `n_shared_experts` shared ones of
  `moe_intermediate_size`, a router hidden x E (plus V3's E routing-correction biases); the others a dense MLP of
  `intermediate_size`).

Active parameters: everything but the routed experts a token does not use (k of E; shared experts and routers are
active). KV bytes per token: a bf16 cache of K and V, 2 x layers x KV heads x head_dim x 2 B; MLA caches one latent of
kv_lora_rank plus the rope key per layer, layers x (kv_lora_rank + qk_rope_head_dim) x 2 B, shared by all heads.

Weights: 2 B (vLLM's dtype "auto" serves float16 and bfloat16 checkpoints as they are and float32 ones in 16 bits:
its `--dtype` help), 1 B for 8-bit `quantization_config`s: quant_method fp8 (DeepSeek-V3, Qwen3-FP8), fbgemm_fp8
(Llama-3.1-405B-FP8, Llama-4-Maverick-FP8), compressed-tensors whose weights are 8-bit (float: FP8; int with 8-bit
int input activations: W8A8, the linear layers run at the device's INT8 rate; int alone: INT8 weights, 16-bit math).
Other quantizations (4-bit, AWQ, GPTQ, bitsandbytes, ...) are refused: the catalog counts whole bytes per weight.

Optional `_total_params` / `_active_params` keys (jaxroute's own, like transformers' `_name_or_path`) give a model
card's published counts to use instead of the computed ones; the computed counts must agree within 3 %.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jaxroute.errors import JaxrouteError

if TYPE_CHECKING:
    from jaxroute.catalog import ModelSpec

# model_type -> family; the `architectures` class names that mean the same family
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "llama4", "deepseek_v3", "deepseek_v2")
MODEL_TYPES = {**{f: f for f in FAMILIES}, "yi": "llama", "llama4_text": "llama4"}
ARCHITECTURES = {
    "LlamaForCausalLM": "llama", "YiForCausalLM": "llama", "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3", "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3_moe", "Llama4ForConditionalGeneration": "llama4", "Llama4ForCausalLM": "llama4",
    "DeepseekV3ForCausalLM": "deepseek_v3", "DeepseekV2ForCausalLM": "deepseek_v2",
}
PUBLISHED_TOLERANCE = 0.03  # `_total_params` / `_active_params` must be within 3 % of the computed counts
_REQUIRED = object()


class _Fields:
    """A config's keys, read with one-line errors naming the file and the field."""

    def __init__(self, data: dict, where: str, prefix: str = "") -> None:
        self.data, self.where, self.prefix = data, where, prefix

    def fail(self, key: str, problem: str) -> JaxrouteError:
        return JaxrouteError(f"model config {self.where}: field '{self.prefix}{key}' {problem}")

    def raw(self, key: str, default: Any = _REQUIRED) -> Any:
        if key not in self.data or (self.data[key] is None and default is not _REQUIRED):
            if default is _REQUIRED:
                raise self.fail(key, "is missing")
            return default
        return self.data[key]

    def int(self, key: str, default: Any = _REQUIRED, minimum: int = 1) -> int:
        value = self.raw(key, default)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise self.fail(key, f"must be {what}, got {value!r}")
        return value

    def optional_int(self, key: str, minimum: int = 1) -> int | None:
        return None if self.data.get(key) is None else self.int(key, minimum=minimum)

    def bool(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {value!r}")
        return value

    def number(self, key: str) -> float | None:
        if self.data.get(key) is None:
            return None
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise self.fail(key, f"must be a positive number, got {value!r}")
        return value

    def int_list(self, key: str, default: list) -> list[int]:
        value = self.raw(key, default)
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value):
            raise self.fail(key, f"must be a list of layer indices, got {value!r}")
        return value


# --------------------------------------------------------------------------- reading


def config_file(path: str | Path) -> Path:
    """The config.json of `path` (the file itself, or config.json in the folder); a one-line error if missing."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            raise JaxrouteError(f"model config {path}: the folder has no config.json")
        return p
    if not p.is_file():
        raise JaxrouteError(f"model config {path}: no such file or folder")
    return p


def load_config(path: str | Path) -> tuple[dict, Path]:
    """(the parsed JSON object, its file) of a config.json or its folder; one-line errors for a missing file, text
    that is not JSON, or JSON that is not an object."""
    p = config_file(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise JaxrouteError(f"model config {p}: not a JSON text file (not UTF-8)") from None
    except json.JSONDecodeError as e:
        raise JaxrouteError(f"model config {p}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except OSError as e:
        raise JaxrouteError(f"model config {p}: cannot be read ({e.strerror})") from None
    if not isinstance(data, dict):
        raise JaxrouteError(f"model config {p}: expected a JSON object of config fields, got {type(data).__name__}")
    return data, p


def _default_name(file: Path, data: dict) -> str:
    """The folder's name (a file not named config.json: its stem). A Hugging Face cache snapshot
    (models--ORG--NAME/snapshots/<commit hash>/config.json) is named NAME, or by `_name_or_path` outside such a cache."""
    if file.name != "config.json":
        return file.stem
    folder = file.resolve().parent
    if re.fullmatch(r"[0-9a-f]{40}", folder.name):
        repo = folder.parent.parent.name
        if folder.parent.name == "snapshots" and repo.startswith("models--"):
            return repo.split("--")[-1]
        given = data.get("_name_or_path")
        if isinstance(given, str) and given.strip("/"):
            return given.rstrip("/").split("/")[-1]
    return folder.name or file.stem


def read_model_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """The ModelSpec of a Hugging Face config.json (a file, or a folder holding one), named `name` or after its folder
    (see `_default_name`). Unknown architectures, missing or non-numeric fields, unsupported quantization, a file
    that is not JSON or does not exist: a one-line JaxrouteError naming the file and the field."""
    data, file = load_config(path)
    return model_from_config(data, name or _default_name(file, data), str(file))


def _family(data: dict, where: str) -> str:
    model_type = data.get("model_type")
    if isinstance(model_type, str) and model_type.lower() in MODEL_TYPES:
        return MODEL_TYPES[model_type.lower()]
    archs = data.get("architectures")
    known = [ARCHITECTURES[a] for a in archs if isinstance(a, str) and a in ARCHITECTURES] if isinstance(archs, list) else []
    if known:
        return known[0]
    supported = ", ".join(FAMILIES) + " (yi as llama)"
    if model_type is None and not archs:
        raise JaxrouteError(f"model config {where}: field 'model_type' is missing (and no 'architectures'); "
                            f"supported: {supported}")
    shown = f"model_type {model_type!r}" if model_type is not None else f"architectures {archs!r}"
    raise JaxrouteError(f"model config {where}: field 'model_type': unknown architecture ({shown}); supported: {supported}")


def _quantization(top: _Fields, text: _Fields) -> tuple[int, bool]:
    """(bytes per weight, W8A8) from `quantization_config` (at the top level, or in Llama-4's text_config)."""
    f = top if top.data.get("quantization_config") is not None else text
    qc = f.data.get("quantization_config")
    if qc is None:
        return 2, False
    key = "quantization_config"
    if not isinstance(qc, dict):
        raise f.fail(key, f"must be an object, got {qc!r}")
    method = str(qc.get("quant_method", "")).lower()
    if method in ("fp8", "fbgemm_fp8"):
        return 1, False
    if method != "compressed-tensors":
        raise f.fail(f"{key}.quant_method", f"{method or None!r} is not supported (fp8, fbgemm_fp8, or compressed-tensors "
                     "with 8-bit weights: jaxroute counts whole bytes per weight)")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise f.fail(f"{key}.config_groups", f"must be an object of quantization groups, got {groups!r}")
    schemes = set()
    for gname, group in groups.items():
        weights = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(weights, dict):
            raise f.fail(f"{key}.config_groups.{gname}.weights", f"must be an object, got {weights!r}")
        bits, kind = weights.get("num_bits"), str(weights.get("type", "int")).lower()
        if bits != 8:
            raise f.fail(f"{key}.config_groups.{gname}.weights.num_bits",
                         f"is {bits!r}; only 8-bit weights are supported (whole bytes per weight)")
        acts = group.get("input_activations")
        act8 = isinstance(acts, dict) and acts.get("num_bits") == 8 and str(acts.get("type", "int")).lower() == "int"
        schemes.add((kind, kind == "int" and act8))
    if len(schemes) > 1:
        raise f.fail(f"{key}.config_groups", f"mixes weight schemes {sorted(schemes)}; give one")
    (_, w8a8), = schemes
    return 1, w8a8


# --------------------------------------------------------------------------- counting


def _mlp(hidden: int, ffn: int, bias: bool = False) -> int:
    """SwiGLU MLP: gate and up (hidden x ffn), down (ffn x hidden), with their biases if any."""
    return 3 * hidden * ffn + (2 * ffn + hidden if bias else 0)


def _gqa_attention(c: _Fields, family: str, hidden: int, heads: int, kv: int, hd: int) -> int:
    """q, k, v, o projections (+ biases where the family has them, + Qwen3's q/k RMSNorms)."""
    params = hidden * heads * hd + 2 * hidden * kv * hd + heads * hd * hidden
    if family == "qwen2":  # Qwen2Attention: q/k/v with bias, o without (modeling_qwen2.py)
        params += heads * hd + 2 * kv * hd
    elif c.bool("attention_bias", False):  # LlamaAttention & co.: bias=config.attention_bias on q, k, v and o
        params += heads * hd + 2 * kv * hd + hidden
    if family in ("qwen3", "qwen3_moe"):
        params += 2 * hd  # q_norm and k_norm: RMSNorm(head_dim) each
    return params


def _counts(c: _Fields, family: str) -> dict:
    """Every ModelSpec field but name, weight bytes and W8A8, from the (text) config's fields."""
    layers, hidden, vocab = c.int("num_hidden_layers"), c.int("hidden_size"), c.int("vocab_size")
    heads = c.int("num_attention_heads")
    tied = c.bool("tie_word_embeddings", False)  # every supported family's config class defaults to False
    out = dict(n_layers=layers, hidden=hidden, vocab=vocab, n_heads=heads, tied_embeddings=tied)
    norms = 2 * hidden  # input_layernorm and post_attention_layernorm
    if family in ("deepseek_v3", "deepseek_v2"):
        rank, rope = c.int("kv_lora_rank"), c.int("qk_rope_head_dim")
        nope, v = c.int("qk_nope_head_dim"), c.int("v_head_dim")
        q_rank = c.optional_int("q_lora_rank")
        bias = c.bool("attention_bias", False)
        q = (hidden * q_rank + q_rank + q_rank * heads * (nope + rope) + (q_rank if bias else 0) if q_rank
             else hidden * heads * (nope + rope))
        attn = (q + hidden * (rank + rope) + (rank + rope if bias else 0) + rank + rank * heads * (nope + v)
                + heads * v * hidden + (hidden if bias else 0))
        # vLLM keeps MLA's down-projections whole on every TP rank: DeepseekV2MLAAttention.fused_qkv_a_proj is a
        # MergedColumnParallelLinear with disable_tp=True of [q_lora_rank, kv_lora_rank + rope] x hidden
        # (vllm-project/vllm vllm/model_executor/models/deepseek_v2.py @002d607, DeepSeekV2FusedQkvAProjLinear);
        # the rest of the attention (q_b, kv_b, o) and the MLPs split by heads / columns. Without q_lora_rank
        # only kv_a is replicated.
        replicated = layers * hidden * ((q_rank or 0) + rank + rope)
        out.update(head_dim_qk=nope + rope, head_dim_v=v, n_kv_heads=1, kv_bytes_per_token=layers * (rank + rope) * 2,
                   mla_latent=rank, mla_rope=rope, tp_replicated_params=replicated)
    else:
        kv = c.int("num_key_value_heads", heads)  # absent: multi-head attention (LlamaConfig's default)
        if c.data.get("head_dim") is not None:  # an explicit head_dim (Qwen3, Mistral-Nemo, Llama-4)
            hd = c.int("head_dim")
        elif hidden % heads:
            raise c.fail("hidden_size", f"{hidden} does not split into {heads} attention heads (give head_dim)")
        else:
            hd = hidden // heads
        attn = _gqa_attention(c, family, hidden, heads, kv, hd)
        out.update(head_dim_qk=hd, head_dim_v=hd, n_kv_heads=kv, kv_bytes_per_token=2 * layers * kv * hd * 2,
                   mla_latent=0, mla_rope=0, tp_replicated_params=0.0)

    # which layers are MoE, and the MoE layer's routed (per expert), shared and router weights
    moe: set[int] = set()
    experts = k = expert = shared = router = 0
    if family == "mixtral":
        experts, k = c.int("num_local_experts"), c.int("num_experts_per_tok")
        expert, router = _mlp(hidden, c.int("intermediate_size")), hidden * experts
        moe = set(range(layers))
    elif family == "qwen3_moe":
        experts, k = c.int("num_experts"), c.int("num_experts_per_tok")
        expert, router = _mlp(hidden, c.int("moe_intermediate_size")), hidden * experts
        step, only = c.int("decoder_sparse_step", 1), set(c.int_list("mlp_only_layers", []))
        moe = {i for i in range(layers) if i not in only and (i + 1) % step == 0}
    elif family == "llama4":
        experts, k = c.int("num_local_experts"), c.int("num_experts_per_tok", 1)
        ffn = c.int("intermediate_size")
        expert, shared, router = _mlp(hidden, ffn), _mlp(hidden, ffn), hidden * experts
        step = c.int("interleave_moe_layer_step", 1)
        given = c.data.get("moe_layers")
        moe = set(c.int_list("moe_layers", [])) if given is not None else set(range(step - 1, layers, step))
        if any(i >= layers for i in moe):
            raise c.fail("moe_layers", f"names a layer >= num_hidden_layers {layers}: {sorted(moe)}")
    elif family in ("deepseek_v3", "deepseek_v2"):
        if c.data.get("n_routed_experts") is not None:
            experts, k = c.int("n_routed_experts"), c.int("num_experts_per_tok")
            ffn = c.int("moe_intermediate_size")
            expert, shared = _mlp(hidden, ffn), _mlp(hidden, ffn * c.int("n_shared_experts", 0, minimum=0))
            # MoEGate: weight E x hidden, plus V3's e_score_correction_bias (E) for noaux_tc routing
            router = hidden * experts + (experts if family == "deepseek_v3" else 0)
            first, freq = c.int("first_k_dense_replace", 0, minimum=0), c.int("moe_layer_freq", 1)
            moe = {i for i in range(layers) if i >= first and i % freq == 0}
    if moe and k > experts:
        raise c.fail("num_experts_per_tok", f"is {k}, more than the {experts} experts")
    dense_layers = layers - len(moe)
    if dense_layers:
        ffn_key = "intermediate_size_mlp" if family == "llama4" else "intermediate_size"
        dense_ffn = _mlp(hidden, c.int(ffn_key), bias=c.bool("mlp_bias", False))
    else:
        dense_ffn = 0
    qk_base = attn + norms
    total = dense_layers * (qk_base + dense_ffn) + len(moe) * (qk_base + experts * expert + shared + router)
    active = dense_layers * (qk_base + dense_ffn) + len(moe) * (qk_base + k * expert + shared + router)
    embeddings = vocab * hidden * (1 if tied else 2) + hidden  # embedding, LM head unless tied, final norm
    out.update(total_params=total + embeddings, active_params=active + embeddings,
               n_experts=experts if moe else 1, experts_per_token=k if moe else 1, dense_layers=dense_layers if moe else 0)
    return out


def _published(top: _Fields, counts: dict) -> None:
    """Replace the computed counts by `_total_params` / `_active_params` where given (each within 3 %)."""
    for key, field in (("_total_params", "total_params"), ("_active_params", "active_params")):
        given = top.number(key)
        if given is None:
            continue
        computed = counts[field]
        if abs(given - computed) > PUBLISHED_TOLERANCE * computed:
            raise top.fail(key, f"is {given:,.0f} but the config's weights count {computed:,}: more than "
                           f"{PUBLISHED_TOLERANCE:.0%} apart")
        counts[field] = float(given)


def model_from_config(data: dict, name: str, where: str = "<config>") -> ModelSpec:
    """The ModelSpec named `name` of a parsed config.json (`where` names it in errors)."""
    # imported here: the catalog builds its models through this module
    from jaxroute.catalog import ModelSpec

    family = _family(data, where)
    top = _Fields(data, where)
    text = top
    if family == "llama4" and data.get("text_config") is not None:
        if not isinstance(data["text_config"], dict):
            raise top.fail("text_config", f"must be an object, got {data['text_config']!r}")
        text = _Fields(data["text_config"], where, "text_config.")
    counts = _counts(text, family)
    _published(top, counts)
    if counts["active_params"] > counts["total_params"]:
        raise top.fail("_active_params", "exceeds the total parameter count")
    weight_bytes, w8a8 = _quantization(top, text)
    return ModelSpec(name=name, weight_bytes_per_param=weight_bytes, w8a8=w8a8, **counts)
