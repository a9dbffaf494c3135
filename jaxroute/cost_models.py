"""Cost models: GPU and LLM catalogs, iteration step time, KV capacity, BalanceRoute F-scores.

Two step-time models share one traced `CostParams` pytree (field `kind`), so a
single compilation can serve both and a stacked `CostParams` vmaps:

- `kind=0` roofline: time = overhead + max(compute, memory) + TP all-reduce,
  with efficiency factors calibrated once on the lecture's Mistral-7B/A6000 anchors.
- `kind=1` Preble's fitted A6000 equations (Mistral-7B, SGLang + FlashInfer).

An iteration (one forward pass of continuous batching) holds prefill chunks
(new tokens on top of tokens already cached) and decode requests (one new token
on top of their context). `step_time` takes them as masked fixed-size arrays.
An empty iteration takes 0 s.

Roofline (T = new tokens, R = requests needing logits, n/c = a chunk's new/cached tokens):
    FLOPs   = 2 (A - 2 V d) T + 2 V d R + a (sum n c + n^2 / 2 + sum decode contexts)
              (A active params, V d embedding size, a = 2 L H (d_qk + d_v) FLOPs per query-key pair;
              a = 4 L d when H d_qk = d, as in Mistral and Llama: the lecture's causal 4 L d n^2 / 2)
    bytes   = weights read (all but the embedding table; MoE experts only as far as T tokens hit them:
              1 - (1 - k/E)^T of them) / tp + KV bytes per rank x (cached tokens read + T written)
    time    = OVERHEAD_S + max(FLOPs / (tp ETA_COMPUTE peak), bytes / (ETA_MEMORY bandwidth)) + all-reduces
    (KV bytes per rank: KV heads split over min(tp, KV heads) ranks, replicated beyond that.)
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxroute.errors import JaxrouteError

ROOFLINE, PREBLE = 0, 1
PREBLE_QUAD_PEAK = 1.25 / (2 * 2.56e-3)  # 244.14 tokens: the vertex of Preble's middle linear-time branch
KINDS = {"roofline": ROOFLINE, "preble": PREBLE}

# --------------------------------------------------------------------------- catalogs


@dataclasses.dataclass(frozen=True)
class GPUSpec:
    """One GPU: dense bf16 tensor FLOP/s, HBM/GDDR bandwidth, memory, and per-direction link bandwidth."""

    name: str
    flops: float  # dense bf16 FLOP/s (no sparsity)
    mem_bw: float  # bytes/s
    mem_bytes: float  # bytes (decimal GB, as on the spec sheet)
    link_bw: float  # bytes/s per direction to peers (NVLink, or PCIe when no NVLink switch)


# Sources (spec sheets; dense = half the "with sparsity" figure):
# - RTX A6000: NVIDIA RTX A6000 datasheet + Ampere GA102 whitepaper (Appendix A): 48 GB GDDR6, 768 GB/s,
#   BF16 tensor (FP32 accumulate) 154.8 TFLOPS dense / 309.7 sparse. Multi-GPU A6000 servers talk over
#   PCIe Gen4 x16 (32 GB/s per direction); the NVLink bridge joins pairs only.
# - A100 80GB SXM: NVIDIA A100 datasheet: BF16 tensor 312 TFLOPS dense (624 sparse), 2,039 GB/s HBM2e,
#   80 GB, NVLink 600 GB/s (bidirectional) -> 300 GB/s per direction.
# - H100 SXM: NVIDIA H100 datasheet: BF16 tensor 1,979 TFLOPS with sparsity -> 989.4 dense, 3.35 TB/s HBM3,
#   80 GB, NVLink 900 GB/s (bidirectional) -> 450 GB/s per direction.
# - H200 SXM: NVIDIA H200 datasheet: BF16 tensor 1,979 TFLOPS with sparsity -> 989.4 dense, 4.8 TB/s HBM3e,
#   141 GB, NVLink 900 GB/s -> 450 GB/s per direction.
GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in [
        GPUSpec("A6000", flops=154.8e12, mem_bw=768e9, mem_bytes=48e9, link_bw=32e9),
        GPUSpec("A100-80GB", flops=312e12, mem_bw=2039e9, mem_bytes=80e9, link_bw=300e9),
        GPUSpec("H100-SXM", flops=989.4e12, mem_bw=3350e9, mem_bytes=80e9, link_bw=450e9),
        GPUSpec("H200", flops=989.4e12, mem_bw=4800e9, mem_bytes=141e9, link_bw=450e9),
    ]
}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One LLM. MoE models give total vs active parameters and the expert routing (experts, per token)."""

    name: str
    total_params: float  # all weights held in memory
    active_params: float  # weights used per token (== total for dense models)
    n_layers: int
    hidden: int
    vocab: int  # embedding and LM head are untied in every model here
    n_heads: int  # query heads
    head_dim_qk: int
    head_dim_v: int
    n_kv_heads: int  # KV heads that TP can shard (1 for MLA: one latent shared by all heads)
    kv_bytes_per_token: int  # bf16 KV cache bytes per token, all layers
    n_experts: int = 1  # routed experts per MoE layer (1 = dense)
    experts_per_token: int = 1
    weight_bytes_per_param: int = 2  # bf16; DeepSeek-V3 ships FP8 weights

    @property
    def weight_bytes(self) -> float:
        return self.total_params * self.weight_bytes_per_param

    @property
    def expert_params(self) -> float:
        """Parameters in routed experts: total - active = experts * (1 - k/E)."""
        if self.n_experts <= 1:
            return 0.0
        return (self.total_params - self.active_params) / (1.0 - self.experts_per_token / self.n_experts)


def _gqa_kv_bytes(n_layers: int, n_kv_heads: int, head_dim: int) -> int:
    return 2 * n_layers * n_kv_heads * head_dim * 2  # K and V, bf16


def _dense_params(layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int, vocab: int,
                  qk_norm: bool = False) -> int:
    """Weights of a dense Llama/Qwen3-style decoder from its config.json (untied embedding and LM head).

    Per layer: q, k, v, o projections (no bias), SwiGLU MLP (gate, up, down), two RMSNorms, and for
    Qwen3 the per-head q/k RMSNorms (head_dim each); plus embedding, LM head and the final norm.
    """
    attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    layer = attn + 3 * hidden * ffn + 2 * hidden + (2 * head_dim if qk_norm else 0)
    return layers * layer + 2 * vocab * hidden + hidden


def _dense_model(name: str, *, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int,
                 vocab: int, qk_norm: bool = False) -> ModelSpec:
    """A dense bf16 GQA ModelSpec built from config.json values."""
    p = _dense_params(layers, hidden, heads, kv_heads, head_dim, ffn, vocab, qk_norm)
    return ModelSpec(name, p, p, layers, hidden, vocab, heads, head_dim, head_dim, kv_heads,
                     _gqa_kv_bytes(layers, kv_heads, head_dim))


# Sources (Hugging Face config.json / model cards):
# - Mistral-7B-v0.1 (mistralai/Mistral-7B-v0.1): 7,241,732,096 params, 32 layers, hidden 4096,
#   32 heads, 8 KV heads of dim 128, vocab 32000 -> KV 131,072 B/token (DESIGN.md).
# - Llama-3-8B (meta-llama/Meta-Llama-3-8B): 8,030,261,248 params, 32 layers, hidden 4096, 32 heads,
#   8 KV heads, head dim 128, vocab 128256.
# - Llama-3-70B (meta-llama/Meta-Llama-3-70B): 70,553,706,496 params, 80 layers, hidden 8192, 64 heads,
#   8 KV heads, head dim 128, vocab 128256.
# - Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B model card): 30.5B total, 3.3B activated, 48 layers, 32 Q heads,
#   4 KV heads, head dim 128, hidden 2048, 128 experts with 8 activated, vocab 151936.
# - DeepSeek-V3 (deepseek-ai/DeepSeek-V3 model card + config): 671B total, 37B activated (the 14B MTP module
#   of the 685B checkpoint is not used for serving), 61 layers, hidden 7168, 128 heads, q/k head dim
#   128 (nope) + 64 (rope) = 192, v head dim 128, 256 routed experts with 8 per token, vocab 129280,
#   FP8 weights. MLA caches one compressed latent per token and layer: kv_lora_rank 512 + rope key 64,
#   bf16 -> 61 * 576 * 2 = 70,272 B/token, shared by all heads (so TP replicates it on every rank).
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        ModelSpec("Mistral-7B", 7_241_732_096, 7_241_732_096, 32, 4096, 32000, 32, 128, 128, 8,
                  _gqa_kv_bytes(32, 8, 128)),
        ModelSpec("Llama-3-8B", 8_030_261_248, 8_030_261_248, 32, 4096, 128256, 32, 128, 128, 8,
                  _gqa_kv_bytes(32, 8, 128)),
        ModelSpec("Llama-3-70B", 70_553_706_496, 70_553_706_496, 80, 8192, 128256, 64, 128, 128, 8,
                  _gqa_kv_bytes(80, 8, 128)),
        ModelSpec("Qwen3-30B-A3B", 30.5e9, 3.3e9, 48, 2048, 151936, 32, 128, 128, 4,
                  _gqa_kv_bytes(48, 4, 128), n_experts=128, experts_per_token=8),
        ModelSpec("DeepSeek-V3", 671e9, 37e9, 61, 7168, 129280, 128, 192, 128, 1,
                  61 * (512 + 64) * 2, n_experts=256, experts_per_token=8, weight_bytes_per_param=1),
        # Hugging Face config.json values (all four: "tie_word_embeddings": false, bf16). Qwen3 configs
        # copied in citsjtu2020/LLM-Prof sglang/Model_Config.md @8434c8d: Qwen3-32B lines 264-293
        # (head_dim 273, hidden_size 275, intermediate_size 277, num_attention_heads 281, num_hidden_layers
        # 282, num_key_value_heads 283, tie_word_embeddings 288, vocab_size 293); Qwen3-8B lines 328-357
        # (337, 339, 341, 345-347, 352, 357). Llama-3.1-8B: same file, lines 1-34 (hidden_size 11,
        # intermediate_size 13, heads 17, layers 18, KV heads 19, tied 30, vocab 34; no head_dim key, so
        # 4096 / 32 = 128). Llama-3.1-70B: oumi-ai/oumi configs/recipes/llama3_1/README.md @2f02887 lines
        # 27-39 (vocab 128,256, hidden 8192, MLP intermediate 28,672, 80 layers, 64 heads, 8 KV heads,
        # weight tying False; head dim 8192 / 64 = 128). Parameter counts follow from these by
        # `_dense_params` (Llama-3.1: 8,030,261,248 and 70,553,706,496, as Llama-3; Qwen3-32B 32.76e9).
        _dense_model("Qwen3-32B", layers=64, hidden=5120, heads=64, kv_heads=8, head_dim=128, ffn=25600,
                     vocab=151936, qk_norm=True),
        _dense_model("Qwen3-8B", layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=12288,
                     vocab=151936, qk_norm=True),
        _dense_model("Llama-3.1-8B", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336,
                     vocab=128256),
        _dense_model("Llama-3.1-70B", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672,
                     vocab=128256),
    ]
}
# Short names the CLI accepts for the only catalog entry of that kind (lower-case, '-'/'_'/'.' ignored).
GPU_ALIASES = {"h100": "H100-SXM", "a100": "A100-80GB"}


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _lookup(name, table: dict, what: str, aliases: dict | None = None):
    if isinstance(name, GPUSpec | ModelSpec):
        return name
    keyed = {_key(k): v for k, v in table.items()}
    keyed.update({_key(a): table[k] for a, k in (aliases or {}).items()})
    found = keyed.get(_key(str(name)))
    if found is None:
        also = f" (or: {', '.join(aliases)})" if aliases else ""
        raise JaxrouteError(f"unknown {what} '{name}'; choose from: {', '.join(table)}{also}")
    return found


def get_gpu(name: str | GPUSpec) -> GPUSpec:
    """Catalog GPU by name (case-insensitive, '-'/'_'/'.' ignored; 'h100' and 'a100' name the only one)."""
    return _lookup(name, GPUS, "GPU", GPU_ALIASES)


def get_model(name: str | ModelSpec) -> ModelSpec:
    """Catalog model by name (case-insensitive, '-'/'_'/'.' ignored: 'qwen3-32b', 'llama-3.1-70b')."""
    return _lookup(name, MODELS, "model")


# --------------------------------------------------------------------------- calibration
#
# Three constants, derived once from the lecture's three Mistral-7B / A6000 anchors (DESIGN.md) and then
# used for every GPU and model (an assumption: real efficiencies differ somewhat per chip):
#
#   Prefill FLOPs of n tokens (no cache) = 2 * (P - 2*V*d) * n      linear layers (embedding lookup and
#                                          + 2 * V * d               LM head excluded; LM head on 1 token)
#                                          + 4 * L * d * n^2 / 2     causal attention (QK^T and AV)
#   For Mistral-7B: F(2100) = 3.0470e13, F(21000) = 4.0875e14 FLOPs. Prefill is compute bound, so
#   t = OVERHEAD + F / (ETA_COMPUTE * 154.8e12). Solving the two anchors t(2100) = 0.2817 s and
#   t(21000) = 3.77 s for the two unknowns gives 1.0844e14 FLOP/s effective (ETA = 0.7005) and
#   OVERHEAD = 0.71 ms; rounded: ETA_COMPUTE = 0.70, OVERHEAD_S = 0.7 ms.
#   Single-request decode is memory bound: it reads the weights except the embedding table,
#   2 * (P - V*d) = 14.221e9 B (the KV of a short context is < 1 % of that). Then
#   24 ms = OVERHEAD + 14.221e9 / (ETA_MEMORY * 768e9) gives ETA_MEMORY = 0.7947 -> 0.795
#   (0.61 TB/s effective; the lecture quotes ~0.6 TB/s).
ETA_COMPUTE = 0.70
ETA_MEMORY = 0.795
OVERHEAD_S = 0.7e-3
# Tensor parallelism: two all-reduces of the activations (tokens x hidden, bf16) per layer, ring
# algorithm (2 (tp-1)/tp of the bytes cross each link), plus a fixed latency per all-reduce. Not
# overlapped with compute. ALLREDUCE_LATENCY_S is an assumption (NCCL small-message latency is ~5-20 us).
ALLREDUCE_LATENCY_S = 10e-6


# --------------------------------------------------------------------------- traced parameters


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CostParams:
    """Traced cost-model configuration; every field is a scalar array (a stacked one has a leading axis)."""

    kind: jax.Array  # [] int32: 0 roofline, 1 preble
    tp: jax.Array  # [] float32 tensor-parallel degree
    flops: jax.Array  # [] float32 effective FLOP/s per GPU (peak * ETA_COMPUTE)
    mem_bw: jax.Array  # [] float32 effective bytes/s per GPU (peak * ETA_MEMORY)
    link_bw: jax.Array  # [] float32 bytes/s per direction between TP ranks
    overhead_s: jax.Array  # [] float32 fixed time per iteration
    allreduce_latency_s: jax.Array  # [] float32
    n_layers: jax.Array  # [] float32
    hidden: jax.Array  # [] float32
    linear_flops_per_token: jax.Array  # [] float32 2 * active params without embedding and LM head
    logits_flops: jax.Array  # [] float32 2 * V * d per token that needs logits
    attn_flops_per_pair: jax.Array  # [] float32 FLOPs per (query token, key token) pair, all layers
    kv_bytes_per_token_gpu: jax.Array  # [] float32 KV bytes per token held by one TP rank
    dense_weight_bytes: jax.Array  # [] float32 weights read every iteration (no embedding table)
    expert_weight_bytes: jax.Array  # [] float32 routed-expert weights (read as far as tokens hit them)
    expert_hit_prob: jax.Array  # [] float32 k / E (chance that one token routes to a given expert)


def _tp(tp) -> int:
    try:
        value = operator.index(tp)
    except TypeError:
        value = 0
    if value < 1:
        raise JaxrouteError(f"tensor-parallel degree must be a positive integer, got {tp!r}")
    return value


def _kv_shards(model: ModelSpec, tp: int) -> int:
    """TP ranks that split the KV cache; KV heads are replicated beyond that."""
    return max(1, min(tp, model.n_kv_heads))


def _tp_split_problem(m: ModelSpec, tp: int) -> str | None:
    """Why tp cannot split m's heads evenly, or None. Heads are whole on a rank: the query heads must
    divide by tp, and the KV heads either divide by tp or (replicated) divide tp. These are vLLM's rules
    (ModelConfig.verify_with_parallel_config in vllm/config.py; the KV-head rule in the attention layers of
    vllm/model_executor/models/llama.py); the roofline's per-rank FLOPs and KV bytes assume them."""
    if m.n_heads % tp:
        return f"{m.name} has {m.n_heads} attention heads, which {tp} GPUs cannot split evenly"
    kv = m.n_kv_heads
    if (kv % tp) if kv >= tp else (tp % kv):
        return f"{m.name} has {kv} KV heads, which {tp} GPUs can neither split nor replicate evenly"
    return None


def check_tp(model: str | ModelSpec, tp: int) -> int:
    """Validate a tensor-parallel degree for a model (a positive integer that splits its heads); returns it."""
    m, tp = get_model(model), _tp(tp)
    problem = _tp_split_problem(m, tp)
    if problem:
        ok = [t for t in range(1, m.n_heads + 1) if _tp_split_problem(m, t) is None]
        raise JaxrouteError(f"tensor parallelism {tp}: {problem}; use one of {', '.join(map(str, ok))}")
    return tp


def cost_params(gpu: str | GPUSpec, model: str | ModelSpec, tp: int = 1, kind: str = "roofline") -> CostParams:
    """Build the traced CostParams for a GPU, a model, a TP degree and a cost model kind."""
    g, m = get_gpu(gpu), get_model(model)
    tp = check_tp(m, tp)
    if kind not in KINDS:
        raise JaxrouteError(f"unknown cost model '{kind}'; choose from: {', '.join(KINDS)}")
    if kind == "preble" and (g.name, m.name, tp) != ("A6000", "Mistral-7B", 1):
        raise JaxrouteError(f"the preble cost model is Preble's fit for Mistral-7B on one A6000; "
                            f"got {m.name} on {tp}x{g.name} (use --cost-model roofline)")
    embed = m.vocab * m.hidden
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    return CostParams(
        kind=jnp.asarray(KINDS[kind], jnp.int32),
        tp=f32(tp),
        flops=f32(g.flops * ETA_COMPUTE),
        mem_bw=f32(g.mem_bw * ETA_MEMORY),
        link_bw=f32(g.link_bw),
        overhead_s=f32(OVERHEAD_S),
        allreduce_latency_s=f32(ALLREDUCE_LATENCY_S),
        n_layers=f32(m.n_layers),
        hidden=f32(m.hidden),
        linear_flops_per_token=f32(2.0 * (m.active_params - 2 * embed)),
        logits_flops=f32(2.0 * embed),
        attn_flops_per_pair=f32(2.0 * m.n_layers * m.n_heads * (m.head_dim_qk + m.head_dim_v)),
        kv_bytes_per_token_gpu=f32(m.kv_bytes_per_token / _kv_shards(m, tp)),
        dense_weight_bytes=f32((m.total_params - embed - m.expert_params) * m.weight_bytes_per_param),
        expert_weight_bytes=f32(m.expert_params * m.weight_bytes_per_param),
        expert_hit_prob=f32(m.experts_per_token / m.n_experts),
    )


# --------------------------------------------------------------------------- step time


class IterationStats(NamedTuple):
    """Sums over one iteration's work; both cost models are functions of these."""

    tokens: jax.Array  # new tokens (prefill tokens + one per decode request)
    requests: jax.Array  # prefill chunks + decode requests (each needs logits)
    attn_pairs: jax.Array  # (query, key) pairs: prefill n*c + n^2/2, decode context
    kv_read: jax.Array  # cached tokens read (prefill context + decode context)
    total_context: jax.Array  # sequence lengths summed (Preble's total_context)
    preble_extend_ms: jax.Array  # Preble's per-request extend term, summed


def _preble_extend_ms(e: jax.Array, s: jax.Array) -> jax.Array:
    """Preble's quadratic attention term for one extend of e tokens to sequence length s (ms)."""
    return jnp.where(e * s > 1024.0 * 1024.0, 1.13e-3 * e + 1.75e-3 * s + 2.19e-6 * e * s, 0.0)


def iteration_stats(prefill_tokens, prefill_context, prefill_mask, decode_context, decode_mask) -> IterationStats:
    """Reduce masked per-request arrays ([P] prefill chunks, [B] decode requests) to IterationStats."""
    pm = jnp.asarray(prefill_mask, bool)
    dm = jnp.asarray(decode_mask, bool)
    n = jnp.where(pm, jnp.asarray(prefill_tokens, jnp.float32), 0.0)
    c = jnp.where(pm, jnp.asarray(prefill_context, jnp.float32), 0.0)
    dc = jnp.where(dm, jnp.asarray(decode_context, jnp.float32), 0.0)
    n_dec = jnp.sum(dm.astype(jnp.float32))
    return IterationStats(
        tokens=jnp.sum(n) + n_dec,
        requests=jnp.sum(pm.astype(jnp.float32)) + n_dec,
        attn_pairs=jnp.sum(n * c + 0.5 * n * n) + jnp.sum(dc),
        kv_read=jnp.sum(c) + jnp.sum(dc),
        total_context=jnp.sum(c + n) + jnp.sum(dc),
        preble_extend_ms=jnp.sum(jnp.where(pm, _preble_extend_ms(n, c + n), 0.0)),
    )


def leap_stats(chunk, context0, has_prefill, decode_context0, n_decode, shifts) -> IterationStats:
    """IterationStats of the iterations `shifts` [L] (0, 1, ...) after one whose stats are: one prefill chunk of
    `chunk` tokens on `context0` cached tokens (when `has_prefill`) and `n_decode` decoders of summed context
    `decode_context0`. Each later iteration adds `chunk` to the prefill context and one token to every decoder.

    Closed form, O(L) instead of O(L x B): bit for bit `iteration_stats` of the per-request arrays, because
    token counts are integers that float32 holds exactly (the decoders' summed context is bounded by the KV
    capacity, far below 2**24)."""
    shift = jnp.asarray(shifts, jnp.float32)
    n = jnp.where(has_prefill, jnp.asarray(chunk, jnp.float32), 0.0)
    c = jnp.where(has_prefill, jnp.asarray(context0, jnp.float32) + shift * n, 0.0)
    n_dec = jnp.asarray(n_decode, jnp.float32)
    dc = jnp.asarray(decode_context0, jnp.float32) + shift * n_dec
    ones = jnp.ones_like(shift)
    return IterationStats(
        tokens=(n + n_dec) * ones,
        requests=(jnp.where(has_prefill, 1.0, 0.0) + n_dec) * ones,
        attn_pairs=(n * c + 0.5 * n * n) + dc,
        kv_read=c + dc,
        total_context=(c + n) + dc,
        preble_extend_ms=jnp.where(has_prefill, _preble_extend_ms(n, c + n), 0.0) * ones,
    )


def roofline_terms(cp: CostParams, s: IterationStats) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(compute_s, memory_s, comm_s) of one iteration under the roofline model, per TP rank."""
    flops = cp.linear_flops_per_token * s.tokens + cp.logits_flops * s.requests + cp.attn_flops_per_pair * s.attn_pairs
    compute_s = flops / (cp.tp * cp.flops)
    # Expected fraction of experts hit by `tokens` tokens routed independently (uniform routing).
    experts_hit = 1.0 - jnp.power(1.0 - cp.expert_hit_prob, s.tokens)
    weight_bytes = (cp.dense_weight_bytes + cp.expert_weight_bytes * experts_hit) / cp.tp
    kv_bytes = cp.kv_bytes_per_token_gpu * (s.kv_read + s.tokens)  # read the cache, write the new tokens
    memory_s = (weight_bytes + kv_bytes) / cp.mem_bw
    allreduce_s = cp.allreduce_latency_s + 2.0 * (cp.tp - 1.0) / cp.tp * s.tokens * cp.hidden * 2.0 / cp.link_bw
    comm_s = jnp.where(cp.tp > 1.0, 2.0 * cp.n_layers * allreduce_s, 0.0)
    return compute_s, memory_s, comm_s


def roofline_time(cp: CostParams, s: IterationStats) -> jax.Array:
    """Overhead + max(compute, memory) + TP all-reduce time of one iteration, in seconds."""
    compute_s, memory_s, comm_s = roofline_terms(cp, s)
    return cp.overhead_s + jnp.maximum(compute_s, memory_s) + comm_s


def preble_time(cp: CostParams, s: IterationStats) -> jax.Array:
    """Preble's fitted Mistral-7B / A6000 (SGLang + FlashInfer) iteration time in seconds.

    No prefix-sharing information reaches the cost model, so the unique KV is the total context
    (Preble's own default when `num_unique_kv` is None).
    """
    n = s.tokens
    # Preble's middle branch (-118 + 1.25 n - 2.56e-3 n^2) peaks at n = 244.14 (34.6 ms) and then falls,
    # to below zero for 360 < n < 384. We hold it at its peak past n = 244.14 (its running maximum), so
    # the model stays positive and monotone in tokens; every other value is Preble's fit as published.
    nq = jnp.minimum(n, PREBLE_QUAD_PEAK)
    linear_ms = jnp.where(n >= 384, 0.10842571 * n + 4.209777054806409,
                          jnp.where(n >= 192, -118.0 + 1.25 * nq - 2.56e-3 * nq * nq, 22.0))
    ctx = s.total_context
    unique = ctx
    reqs = jnp.maximum(s.requests, 1.0)
    halve = (unique / reqs <= 1024.0) & (reqs * unique <= 32.0 * 256.0 * 2048.0)
    attn_ms = jnp.where(ctx <= 1024.0, 0.32, (1.86e-4 * ctx + 0.159) * jnp.where(halve, 0.5, 1.0))
    return (linear_ms + attn_ms + s.preble_extend_ms) / 0.9 / 1e3


def time_from_stats(cp: CostParams, s: IterationStats) -> jax.Array:
    """Iteration time (s) under the cost model selected by cp.kind; 0 for an empty iteration."""
    t = jax.lax.switch(jnp.clip(cp.kind, 0, 1), [roofline_time, preble_time], cp, s)
    return jnp.where(s.tokens > 0, t, 0.0)


def step_time(cp: CostParams, prefill_tokens, prefill_context, prefill_mask, decode_context, decode_mask) -> jax.Array:
    """Seconds for one iteration.

    prefill_tokens [P]: new tokens of each prefill chunk; prefill_context [P]: tokens already cached
    before the chunk; prefill_mask [P] bool. decode_context [B]: context of each decode request;
    decode_mask [B] bool. Jittable and vmappable (over cp as well).
    """
    return time_from_stats(cp, iteration_stats(prefill_tokens, prefill_context, prefill_mask,
                                               decode_context, decode_mask))


def prefill_stats(n, cached=0) -> IterationStats:
    """IterationStats of one prefill chunk of n new tokens on top of `cached` tokens, nothing else batched."""
    n = jnp.asarray(n, jnp.float32)
    c = jnp.asarray(cached, jnp.float32)
    return IterationStats(tokens=n, requests=jnp.where(n > 0, 1.0, 0.0), attn_pairs=n * c + 0.5 * n * n,
                          kv_read=c, total_context=c + n, preble_extend_ms=_preble_extend_ms(n, c + n))


def decode_stats(batch, context) -> IterationStats:
    """IterationStats of a decode iteration of `batch` requests, each with `context` tokens."""
    b = jnp.asarray(batch, jnp.float32)
    bc = b * jnp.asarray(context, jnp.float32)
    return IterationStats(tokens=b, requests=b, attn_pairs=bc, kv_read=bc, total_context=bc,
                          preble_extend_ms=jnp.zeros_like(bc))


def prefill_time(cp: CostParams, n, cached=0) -> jax.Array:
    """Seconds to prefill one chunk of n new tokens on top of `cached` cached tokens (n, cached may be traced)."""
    return time_from_stats(cp, prefill_stats(n, cached))


def decode_step_time(cp: CostParams, batch, context) -> jax.Array:
    """Seconds for one decode iteration of `batch` requests, each with `context` tokens (may be traced)."""
    return time_from_stats(cp, decode_stats(batch, context))


# --------------------------------------------------------------------------- KV capacity


def kv_capacity_tokens(gpu: str | GPUSpec, model: str | ModelSpec, tp: int = 1, mem_util: float = 0.9) -> int:
    """Tokens of KV cache that fit: floor((memory * tp * mem_util - weights) / KV bytes per token).

    KV heads split over TP ranks up to the number of KV heads and are replicated beyond (MLA's latent
    on every rank), so the KV bytes per token across the group is kv_bytes * tp / shards.
    """
    g, m = get_gpu(gpu), get_model(model)
    tp = check_tp(m, tp)
    if not 0.0 < mem_util <= 1.0:
        raise JaxrouteError(f"mem_util must be in (0, 1], got {mem_util}")
    free = g.mem_bytes * tp * mem_util - m.weight_bytes
    kv_per_token = m.kv_bytes_per_token * tp / _kv_shards(m, tp)
    if _kv_tokens(g, m, tp, mem_util) < 1:
        fits = [t for t in range(tp + 1, 257)
                if _tp_split_problem(m, t) is None and _kv_tokens(g, m, t, mem_util) >= 1]
        hint = f"use tensor parallelism >= {fits[0]}" if fits else "choose a larger GPU"
        raise JaxrouteError(f"{m.name} weights ({m.weight_bytes / 1e9:.1f} GB) do not fit with room for KV cache "
                            f"on {tp}x{g.name} ({g.mem_bytes * tp * mem_util / 1e9:.1f} GB usable at "
                            f"{mem_util:.0%} memory); {hint}")
    return int(math.floor(free / kv_per_token))


def _kv_tokens(g: GPUSpec, m: ModelSpec, tp: int, mem_util: float) -> float:
    return (g.mem_bytes * tp * mem_util - m.weight_bytes) / (m.kv_bytes_per_token * tp / _kv_shards(m, tp))


# --------------------------------------------------------------------------- BalanceRoute


def barrier_stats(loads) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Barrier statistics of per-worker KV loads [G]: (M = max load, I = G*M - sum, margins = M - L [G])."""
    loads = jnp.asarray(loads)
    m = jnp.max(loads, axis=-1)
    g = loads.shape[-1]
    return m, g * m - jnp.sum(loads, axis=-1), m[..., None] - loads


def br0_score(delta_s, margin, G) -> jax.Array:
    """BR-0 score F = Δs - G * (Δs - m)_+: gain while under the barrier, slope -(G-1) past it."""
    delta_s = jnp.asarray(delta_s)
    return delta_s - G * jnp.maximum(delta_s - margin, 0)


def discounts(gamma, H: int) -> jax.Array:
    """d = (1, γ, ..., γ^H) [H+1]."""
    return jnp.power(jnp.asarray(gamma, jnp.float32), jnp.arange(H + 1, dtype=jnp.float32))


def brh_score(delta_s, margins, alpha, beta, gamma_discounts) -> jax.Array:
    """BR-H score F = α (1ᵀd) Δs - β ((Δs·1 - m_h)_+)ᵀ d over the horizon h = 0..H.

    margins [..., H+1]: the worker's predicted margins; gamma_discounts [H+1] = (1, γ, ..., γ^H).
    Reduces to BR-0 at H = 0 with (α, β) = (1, G).
    """
    d = jnp.asarray(gamma_discounts)
    ds = jnp.asarray(delta_s)[..., None]
    over = jnp.maximum(ds - jnp.asarray(margins), 0)
    return alpha * jnp.sum(d) * ds[..., 0] - beta * jnp.sum(over * d, axis=-1)
