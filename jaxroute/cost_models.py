"""Cost models: iteration step time and BalanceRoute F-scores, on the GPU and LLM catalogs.

The catalogs (GPUs, models, tensor-parallel checks, KV capacity) are plain Python in `jaxroute.catalog`,
which the command line reads without JAX; every name of it is re-exported here (`cost_models.GPUS`,
`cost_models.kv_capacity_tokens`, ...).

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

Decode data parallelism (`dp_step_times`, traced field `parallel`): G DP ranks, each of `tp` devices.
- `parallel=0` "independent" (default): every rank is a replica running the roofline above on its own tokens
  (experts hit counted from its own tokens only); the barrier is the slowest rank.
- `parallel=1` "dp_ep" (MoE only; DP attention + expert parallelism, as vllm-ascend and SGLang serve DeepSeek-V3):
  per layer, each rank runs attention on its own requests (non-expert weights / tp, its KV reads, its FLOPs), then
  the routed experts, spread over all G*tp devices, serve the tokens of every rank (experts hit from the *global*
  token count), with an all-to-all dispatch + combine per MoE layer. Every rank waits at every layer:
      barrier = OVERHEAD_S + max_g attention_g + experts + all-to-all
  (the layers are treated as identical, so summing the per-layer max over layers equals the max of the sums).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxroute.catalog import (  # noqa: F401  (the catalogs and KV capacity, re-exported: cost_models.GPUS, ...)
    DP_EP,
    GPU_ALIASES,
    GPUS,
    INDEPENDENT,
    MODELS,
    PARALLEL,
    GPUSpec,
    ModelSpec,
    _check_parallel,
    _expert_share,
    _kv_shards,
    check_tp,
    get_gpu,
    get_model,
    kv_capacity_tokens,
)
from jaxroute.errors import JaxrouteError
from jaxroute.latency_params import ALPHA, BASIS, N_BASIS, US  # noqa: F401  (the trained basis's names)

ROOFLINE, PREBLE, TRAINED = 0, 1, 2
PREBLE_QUAD_PEAK = 1.25 / (2 * 2.56e-3)  # 244.14 tokens: the vertex of Preble's middle linear-time branch
KINDS = {"roofline": ROOFLINE, "preble": PREBLE, "trained": TRAINED}



# --------------------------------------------------------------------------- calibration
#
# Three constants, derived once from the lecture's three Mistral-7B / A6000 anchors (docs/architecture.md, reference facts) and then
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
# Expert parallelism (dp_ep mode): each MoE layer runs one dispatch and one combine all-to-all. Each token goes to
# its k experts: dispatch carries its hidden vector at the activation width (1 B for FP8 / W8A8 models, whose
# experts take 8-bit activations; 2 B for bf16), combine brings k bf16 results back. The bytes cross the sending
# device's link (a share 1/devices stays local); the busiest sender sets the time. A2A_LATENCY_S, the fixed cost
# of one all-to-all, is an assumption (the same small-message latency as ALLREDUCE_LATENCY_S; not measured on
# either NVIDIA or Ascend hardware).
A2A_LATENCY_S = 10e-6
COMBINE_BYTES = 2  # bf16 expert outputs


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
    # decode data parallelism (dp_step_times); the number of DP ranks G is the length of its arrays
    parallel: jax.Array  # [] int32: 0 independent replicas, 1 DP attention + expert-parallel MoE (dp_ep)
    linear_flops: jax.Array  # [] float32 effective OP/s of the linear layers per GPU (INT8 rate for W8A8, else flops)
    ep_devices: jax.Array  # [] float32 devices the routed experts are spread over (dp_ranks * tp in dp_ep, else tp)
    expert_share: jax.Array  # [] float32 routed experts on the busiest EP device / E (ceil(E / devices) / E)
    moe_layers: jax.Array  # [] float32 layers with routed experts (one dispatch + one combine each)
    expert_flops_per_token: jax.Array  # [] float32 2 * routed-expert params one token activates (k of E)
    a2a_bytes_per_token: jax.Array  # [] float32 bytes one token sends per MoE layer, dispatch + combine
    a2a_latency_s: jax.Array  # [] float32 fixed cost of one all-to-all
    tp_replicated_bytes: jax.Array  # [] float32 non-expert weights each TP rank reads whole (dp_ep)
    tp_replicated_flops_per_token: jax.Array  # [] float32 2 * those params (not split by TP)
    decode_attn_flops_per_pair: jax.Array  # [] float32 dp_ep: FLOPs per (decode query, cached token), all layers
    # calibration terms (0 from `cost_params`; `calibrate.py` fits them): seconds an iteration of a replica or
    # DP rank adds per token it computes and per cached token it reads, beyond the roofline
    token_s: jax.Array  # [] float32
    kv_token_s: jax.Array  # [] float32
    # the trained model (kind 2): datasheet peaks (no efficiency factor) and one coefficient per basis term
    peak_flops: jax.Array  # [] float32 dense bf16 (fp8 for FP8-weight models) FLOP/s per GPU, datasheet
    peak_mem_bw: jax.Array  # [] float32 HBM bytes/s per GPU, datasheet
    beta: jax.Array  # [N_BASIS] float32 coefficients of `trained_basis` (zeros unless `with_beta`)
    alpha: jax.Array  # [3] float32 request-level costs (latency_params.ALPHA, seconds; zeros but for the trained model)


def _mla_decode_pair_flops(m: ModelSpec) -> float:
    """FLOPs per (decode query, cached token) pair, all layers.

    MLA decodes in latent space (the "absorbed" path of vLLM's MLACommonImpl, vllm/v1/attention/backends/mla/
    common.py, and FlashMLA): W_UK is folded into the query and W_UV into the output, so each head scores against
    the (latent + rope)-wide cached vector and sums the latent-wide values: 2 H (r + rope) + 2 H r per layer.
    Other models: the prefill formula's 2 L H (d_qk + d_v)."""
    if m.mla_latent:
        return 2.0 * m.n_layers * m.n_heads * (2 * m.mla_latent + m.mla_rope)
    return 2.0 * m.n_layers * m.n_heads * (m.head_dim_qk + m.head_dim_v)


def cost_params(gpu: str | GPUSpec, model: str | ModelSpec, tp: int = 1, kind: str = "roofline",
                parallel: str = "independent", dp_ranks: int = 1) -> CostParams:
    """Build the traced CostParams for a GPU, a model, a TP degree and a cost model kind.

    parallel / dp_ranks select the decode data-parallel mode of `dp_step_times`: "independent" (default; each DP
    rank a replica, dp_ranks unused) or "dp_ep" (DP attention over dp_ranks ranks of tp devices each, routed
    experts spread over all dp_ranks * tp devices; MoE models and the roofline only).
    """
    g, m = get_gpu(gpu), get_model(model)
    tp = check_tp(m, tp)
    if kind not in KINDS:
        raise JaxrouteError(f"unknown cost model '{kind}'; choose from: {', '.join(KINDS)}")
    dp_ranks = _check_parallel(m, parallel, dp_ranks)
    if kind == "preble" and (g.name, m.name, tp) != ("A6000", "Mistral-7B", 1):
        raise JaxrouteError(f"the preble cost model is Preble's fit for Mistral-7B on one A6000; "
                            f"got {m.name} on {tp}x{g.name} (use --cost-model roofline)")
    if m.w8a8 and g.int8_ops <= 0:
        raise JaxrouteError(f"{m.name} runs its linear layers in INT8 and the catalog has no INT8 rate for {g.name}")
    embed = m.vocab * m.hidden
    # Tied embeddings: one table (counted once in the params) is the embedding and the LM head, so the params hold
    # one table to take out of the linear layers, and the weights read every iteration keep it (the LM head reads it).
    tables, unread = (1, 0) if m.tied_embeddings else (2, embed)
    dp_ep = parallel == "dp_ep"
    devices = dp_ranks * tp if dp_ep else tp
    routed_active = m.expert_params * m.experts_per_token / m.n_experts
    act_bytes = m.weight_bytes_per_param  # dispatch width: 8-bit for FP8 / W8A8 models, bf16 otherwise
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
        linear_flops_per_token=f32(2.0 * (m.active_params - tables * embed)),
        logits_flops=f32(2.0 * embed),
        attn_flops_per_pair=f32(2.0 * m.n_layers * m.n_heads * (m.head_dim_qk + m.head_dim_v)),
        kv_bytes_per_token_gpu=f32(m.kv_bytes_per_token / _kv_shards(m, tp)),
        dense_weight_bytes=f32((m.total_params - unread - m.expert_params) * m.weight_bytes_per_param),
        expert_weight_bytes=f32(m.expert_params * m.weight_bytes_per_param),
        expert_hit_prob=f32(m.experts_per_token / m.n_experts),
        parallel=jnp.asarray(PARALLEL[parallel], jnp.int32),
        linear_flops=f32((g.int8_ops if m.w8a8 else g.flops) * ETA_COMPUTE),
        ep_devices=f32(devices),
        expert_share=f32(_expert_share(m, devices) if dp_ep else 1.0),
        moe_layers=f32(m.moe_layers),
        expert_flops_per_token=f32(2.0 * routed_active),
        a2a_bytes_per_token=f32(m.experts_per_token * m.hidden * (act_bytes + COMBINE_BYTES) if m.n_experts > 1 else 0),
        a2a_latency_s=f32(A2A_LATENCY_S),
        tp_replicated_bytes=f32(m.tp_replicated_params * m.weight_bytes_per_param),
        tp_replicated_flops_per_token=f32(2.0 * m.tp_replicated_params),
        decode_attn_flops_per_pair=f32(_mla_decode_pair_flops(m)),
        token_s=f32(0.0),
        kv_token_s=f32(0.0),
        peak_flops=f32(_peak_flops(g, m)),
        peak_mem_bw=f32(g.mem_bw),
        beta=jnp.asarray(_default().beta if kind == "trained" else (0.0,) * N_BASIS, jnp.float32),
        alpha=jnp.asarray(_default().alpha if kind == "trained" else (0.0,) * len(ALPHA), jnp.float32),
    )


def _default():
    from jaxroute import latency_params

    return latency_params.default()


def _peak_flops(g: GPUSpec, m: ModelSpec) -> float:
    """The datasheet's dense tensor rate the linear layers run at: FP8 for 1-byte (FP8) weights where the chip has
    an FP8 rate (vLLM's FP8 W8A8 kernels), INT8 for W8A8 models, bf16 otherwise."""
    if m.w8a8 and g.int8_ops > 0:
        return g.int8_ops
    fp8 = getattr(g, "fp8_flops", 0.0)
    return fp8 if m.weight_bytes_per_param == 1 and fp8 > 0 else g.flops


def with_beta(cp: CostParams, beta, alpha=None) -> CostParams:
    """`cp` under the trained step-time model with coefficients `beta` [N_BASIS] (traced values differentiate) and,
    when given, the request-level costs `alpha` [3]."""
    cp = dataclasses.replace(cp, kind=jnp.zeros_like(cp.kind) + TRAINED,
                             beta=jnp.broadcast_to(jnp.asarray(beta, jnp.float32), cp.beta.shape))
    if alpha is None:
        return cp
    return dataclasses.replace(cp, alpha=jnp.broadcast_to(jnp.asarray(alpha, jnp.float32), cp.alpha.shape))


def with_latency_params(cp: CostParams, lp) -> CostParams:
    """`cp` under the trained model with `lp`'s coefficients (`latency_params.LatencyParams`)."""
    return with_beta(cp, lp.beta, lp.alpha)


def client_times(cp: CostParams, first_s, finish_s, prompt_tokens, output_tokens):
    """When the client sees a request's first token and its end: the engine's times plus the request-level costs
    (`latency_params.ALPHA`: before the first token, per prompt token, per output token after the first)."""
    pre = cp.alpha[0] + cp.alpha[1] * prompt_tokens
    return first_s + pre, finish_s + pre + cp.alpha[2] * jnp.maximum(output_tokens - 1, 0)


class CostFactors(NamedTuple):
    """The roofline's fitted factors (`experiments.fit_roofline`): a GPU's effective share of its peak FLOP/s and
    memory bandwidth, and the fixed time of an iteration; the defaults are ETA_COMPUTE, ETA_MEMORY, OVERHEAD_S."""

    eta_compute: float | jax.Array = ETA_COMPUTE
    eta_memory: float | jax.Array = ETA_MEMORY
    overhead_s: float | jax.Array = OVERHEAD_S


def with_factors(cp: CostParams, f: CostFactors) -> CostParams:
    """`cp` (built with the default factors) under factors `f` (traced values differentiate through)."""
    c, m = f.eta_compute / ETA_COMPUTE, f.eta_memory / ETA_MEMORY
    return dataclasses.replace(cp, flops=cp.flops * c, linear_flops=cp.linear_flops * c, mem_bw=cp.mem_bw * m,
                               overhead_s=jnp.zeros_like(cp.overhead_s) + f.overhead_s)


# --------------------------------------------------------------------------- step time


class IterationStats(NamedTuple):
    """Sums over one iteration's work; both cost models are functions of these."""

    tokens: jax.Array  # new tokens (prefill tokens + one per decode request)
    requests: jax.Array  # prefill chunks + decode requests (each needs logits)
    attn_pairs: jax.Array  # (query, key) pairs: prefill n*c + n^2/2, decode context
    kv_read: jax.Array  # cached tokens read (prefill context + decode context)
    total_context: jax.Array  # sequence lengths summed (Preble's total_context)
    preble_extend_ms: jax.Array  # Preble's per-request extend term, summed
    prefill_tokens: jax.Array  # the prefill chunks' new tokens (tokens - prefill_tokens: one per decoder)
    prefill_pairs: jax.Array  # the chunks' (query, key) pairs n*c + n^2/2 (attn_pairs - these: decode contexts)
    prefill_kv: jax.Array  # cached tokens the chunks read (kv_read - these: decode contexts)


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
        prefill_tokens=jnp.sum(n),
        prefill_pairs=jnp.sum(n * c + 0.5 * n * n),
        prefill_kv=jnp.sum(c),
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
        prefill_tokens=n * ones,
        prefill_pairs=(n * c + 0.5 * n * n) * ones,
        prefill_kv=c * ones,
    )


def roofline_terms(cp: CostParams, s: IterationStats) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(compute_s, memory_s, comm_s) of one iteration under the roofline model, per TP rank."""
    # Linear FLOPs in bf16-equivalent units: a W8A8 model's run at the INT8 rate (the factor is exactly 1 otherwise).
    linear = cp.linear_flops_per_token * (cp.flops / cp.linear_flops)
    flops = linear * s.tokens + cp.logits_flops * s.requests + cp.attn_flops_per_pair * s.attn_pairs
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


def trained_basis(cp: CostParams, s: IterationStats) -> jax.Array:
    """The trained step time's basis [N_BASIS] (`BASIS`), seconds per TP rank, at datasheet peaks.

    BLIS's trained-physics basis (inference-sim sim/latency/trained_physics_model.go, `StepTime`: prefill and
    decode compute and KV traffic, weight reads, TP all-reduce, per-layer, per-request and per-step overheads and
    a per-MoE-layer term), on this module's counts: the linear and attention FLOPs of the roofline split by phase
    (the logits with the decode compute), the KV bytes a prefill chunk reads and writes and those a decoder reads
    and writes, the weights read once per step (MoE experts as far as the step's tokens hit them, as the roofline),
    the ring all-reduce bytes of 2 L all-reduces over the TP link and their 2 L x 2 (tp - 1) ring steps x 1 us (a
    fixed latency per step: beyond BLIS, which has no latency term, so a model's TP degree separates it from the
    per-layer cost), then layers, requests, 1 and MoE layers x 1 us.
    The step time is `beta . basis`: linear in the coefficients, so a fit's Jacobian is the basis summed."""
    tp = cp.tp
    n_pf = s.prefill_tokens
    n_dc = s.tokens - n_pf
    linear = cp.linear_flops_per_token * (cp.flops / cp.linear_flops)  # bf16-equivalent (as the roofline)
    peak = tp * cp.peak_flops
    pf_compute = (linear * n_pf + cp.attn_flops_per_pair * s.prefill_pairs) / peak
    dc_compute = (linear * n_dc + cp.attn_flops_per_pair * (s.attn_pairs - s.prefill_pairs)
                  + cp.logits_flops * s.requests) / peak
    pf_kv = cp.kv_bytes_per_token_gpu * (s.prefill_kv + n_pf) / cp.peak_mem_bw
    dc_kv = cp.kv_bytes_per_token_gpu * (s.kv_read - s.prefill_kv + n_dc) / cp.peak_mem_bw
    experts_hit = 1.0 - jnp.power(1.0 - cp.expert_hit_prob, s.tokens)
    weights = (cp.dense_weight_bytes + cp.expert_weight_bytes * experts_hit) / tp / cp.peak_mem_bw
    ring = 2.0 * (tp - 1.0) / tp * s.tokens * cp.hidden * 2.0 / cp.link_bw
    allreduce = jnp.where(tp > 1.0, 2.0 * cp.n_layers * ring, 0.0)
    one = jnp.ones_like(s.tokens)
    # a ring all-reduce takes 2 (tp - 1) steps, each with a fixed latency (NCCL's ring algorithm), 2 L of them a step
    hops = 2.0 * cp.n_layers * 2.0 * (tp - 1.0) * US * one
    return jnp.stack([pf_compute, pf_kv, dc_compute, dc_kv, weights, allreduce, hops, cp.n_layers * US * one,
                      s.requests * US, US * one, cp.moe_layers * US * one], axis=-1)


def trained_time(cp: CostParams, s: IterationStats) -> jax.Array:
    """The trained model's iteration time: coefficients x basis."""
    return jnp.sum(cp.beta * trained_basis(cp, s), axis=-1)


def time_from_stats(cp: CostParams, s: IterationStats) -> jax.Array:
    """Iteration time (s) under the cost model selected by cp.kind; 0 for an empty iteration."""
    t = jax.lax.switch(jnp.clip(cp.kind, 0, 2), [roofline_time, preble_time, trained_time], cp, s)
    return jnp.where(s.tokens > 0, t + cp.token_s * s.tokens + cp.kv_token_s * s.kv_read, 0.0)


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
                          kv_read=c, total_context=c + n, preble_extend_ms=_preble_extend_ms(n, c + n),
                          prefill_tokens=n, prefill_pairs=n * c + 0.5 * n * n, prefill_kv=c)


def decode_stats(batch, context) -> IterationStats:
    """IterationStats of a decode iteration of `batch` requests, each with `context` tokens."""
    b = jnp.asarray(batch, jnp.float32)
    bc = b * jnp.asarray(context, jnp.float32)
    zero = jnp.zeros_like(bc)
    return IterationStats(tokens=b, requests=b, attn_pairs=bc, kv_read=bc, total_context=bc,
                          preble_extend_ms=zero, prefill_tokens=zero, prefill_pairs=zero, prefill_kv=zero)


def prefill_time(cp: CostParams, n, cached=0) -> jax.Array:
    """Seconds to prefill one chunk of n new tokens on top of `cached` cached tokens (n, cached may be traced)."""
    return time_from_stats(cp, prefill_stats(n, cached))


def decode_step_time(cp: CostParams, batch, context) -> jax.Array:
    """Seconds for one decode iteration of `batch` requests, each with `context` tokens (may be traced)."""
    return time_from_stats(cp, decode_stats(batch, context))


# --------------------------------------------------------------------------- decode data parallelism


def mixed_stats(batch, kv_tokens, prefill_tokens=0) -> IterationStats:
    """IterationStats of one rank's iteration: `batch` decode requests reading `kv_tokens` cached tokens in all, plus
    one prefill chunk of `prefill_tokens` new tokens on nothing cached (recomputing a preempted request's KV).

    Equals `iteration_stats` of those arrays (one chunk with context 0, decoders whose contexts sum to kv_tokens).
    Elementwise: the arguments may be [G] arrays."""
    b = jnp.asarray(batch, jnp.float32)
    k = jnp.asarray(kv_tokens, jnp.float32)
    pre = prefill_stats(prefill_tokens)  # one chunk on nothing cached
    return IterationStats(tokens=b + pre.tokens, requests=b + pre.requests, attn_pairs=k + pre.attn_pairs,
                          kv_read=k + pre.kv_read, total_context=k + pre.total_context,
                          preble_extend_ms=jnp.where(pre.tokens > 0, pre.preble_extend_ms, 0.0),
                          prefill_tokens=pre.prefill_tokens + 0.0 * b, prefill_pairs=pre.prefill_pairs + 0.0 * b,
                          prefill_kv=pre.prefill_kv + 0.0 * b)


class DPStepTerms(NamedTuple):
    """The parts of a dp_ep decode step (seconds); barrier = overhead + max(attention) + experts + all_to_all."""

    attention_s: jax.Array  # [G] per rank: max(compute, memory) of its non-expert work + its TP all-reduces
    kv_read_s: jax.Array  # [G] the KV-read share of each rank's attention memory time (inside attention_s)
    experts_s: jax.Array  # [] shared: max(compute, weight reads) of the routed experts on the busiest device
    all_to_all_s: jax.Array  # [] shared: dispatch + combine of every MoE layer
    overhead_s: jax.Array  # [] fixed per-step overhead


def dp_ep_terms(cp: CostParams, batch: jax.Array, kv_tokens: jax.Array,
                prefill_tokens: jax.Array | None = None) -> DPStepTerms:
    """The dp_ep decode step of G DP ranks (arrays [G], as in `dp_step_times`), by part.

    Per rank g (n_g = batch_g + prefill_g new tokens; each of its tp devices does the same):
      compute_g = [(non-expert linear - TP-replicated) n_g / tp + TP-replicated n_g] / linear rate
                  + [logits r_g + decode pair FLOPs kv_g + prefill pair FLOPs prefill_g^2 / 2] / (tp flops)
                  (TP splits the heads, so the attention FLOPs; MLA's down-projections are whole on every rank)
      memory_g  = [(non-expert weights - replicated) / tp + replicated + KV bytes per device (kv_g + n_g)] / mem_bw
                  (MLA's latent is one vector shared by all heads: every TP device holds and reads all of it)
      attention_g = max(compute_g, memory_g) + 2 L TP all-reduces of n_g tokens (as the roofline)
    A rank with no requests still runs (vLLM runs a dummy batch on idle DP ranks so the collectives proceed).
    Shared by all G tp devices (T = sum_g n_g tokens, routing uniform, expert load balanced):
      experts = max(expert FLOPs T share / linear rate, expert bytes share (1 - (1 - k/E)^T) / mem_bw)
      all_to_all = MoE layers x (2 latency + max_g(n_g) / tp x bytes per token (D - 1) / D / link_bw)
      (each TP device of a rank dispatches 1/tp of the rank's tokens: an assumption about how the rank splits
      them; D = G tp devices, a share 1/D of the traffic stays on the device)
    The layers are treated as identical (DeepSeek-V3's 3 dense-MLP layers and the LM head are spread over them).
    """
    b = jnp.asarray(batch, jnp.float32)
    kv = jnp.asarray(kv_tokens, jnp.float32)
    p = jnp.zeros_like(b) if prefill_tokens is None else jnp.asarray(prefill_tokens, jnp.float32)
    n = b + p
    r = b + jnp.where(p > 0, 1.0, 0.0)
    tp = cp.tp
    non_expert_linear = cp.linear_flops_per_token - cp.expert_flops_per_token
    split_linear = (non_expert_linear - cp.tp_replicated_flops_per_token) * n / tp + cp.tp_replicated_flops_per_token * n
    attn_flops = cp.logits_flops * r + cp.decode_attn_flops_per_pair * kv + cp.attn_flops_per_pair * 0.5 * p * p
    compute = split_linear / cp.linear_flops + attn_flops / (tp * cp.flops)
    weights = (cp.dense_weight_bytes - cp.tp_replicated_bytes) / tp + cp.tp_replicated_bytes
    kv_read_s = cp.kv_bytes_per_token_gpu * kv / cp.mem_bw
    memory = (weights + cp.kv_bytes_per_token_gpu * n) / cp.mem_bw + kv_read_s
    allreduce = cp.allreduce_latency_s + 2.0 * (tp - 1.0) / tp * n * cp.hidden * 2.0 / cp.link_bw
    comm = jnp.where(tp > 1.0, 2.0 * cp.n_layers * allreduce, 0.0)
    attention = jnp.maximum(compute, memory) + comm + cp.token_s * n + cp.kv_token_s * kv

    total = jnp.sum(n, axis=-1)
    hit = 1.0 - jnp.power(1.0 - cp.expert_hit_prob, total)
    experts = jnp.maximum(cp.expert_flops_per_token * total * cp.expert_share / cp.linear_flops,
                          cp.expert_weight_bytes * cp.expert_share * hit / cp.mem_bw)
    devices = cp.ep_devices
    sent = jnp.max(n, axis=-1) / tp * cp.a2a_bytes_per_token * (devices - 1.0) / devices
    a2a = jnp.where(devices > 1.0, cp.moe_layers * (2.0 * cp.a2a_latency_s + sent / cp.link_bw), 0.0)
    return DPStepTerms(attention_s=attention, kv_read_s=kv_read_s, experts_s=experts, all_to_all_s=a2a,
                       overhead_s=cp.overhead_s)


def dp_step_times(cp: CostParams, batch: jax.Array, kv_tokens: jax.Array,
                  prefill_tokens: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """One decode iteration of G data-parallel ranks under cp.parallel: (barrier_s [], per_rank_s [G]).

    batch [G] f32: decode requests per rank; kv_tokens [G] f32: cached tokens those requests read in all;
    prefill_tokens [G] f32 (default zeros): new tokens a rank also prefills in the iteration (one chunk on nothing
    cached, e.g. a preempted request's recompute). barrier_s is the time every rank waits for (0 when no rank has
    work); per_rank_s is each rank's own busy time (barrier_s - per_rank_s is its idle wait).
    - independent (cp.parallel 0): per rank `time_from_stats` of its mixed iteration (cp.kind's model), barrier =
      max over ranks; the caller adds its own per-step collective overhead.
    - dp_ep (cp.parallel 1): see `dp_ep_terms`; barrier = overhead + max_g attention_g + experts + all-to-all and a
      rank's busy time is overhead + attention_g + experts + all-to-all (the per-layer all-to-alls are included).
    Jittable and vmappable (over cp as well); G is the arrays' length. Both modes are evaluated and one is selected,
    so one compilation serves rows of either mode.
    """
    b = jnp.asarray(batch, jnp.float32)
    kv = jnp.asarray(kv_tokens, jnp.float32)
    p = jnp.zeros_like(b) if prefill_tokens is None else jnp.asarray(prefill_tokens, jnp.float32)
    independent = time_from_stats(cp, mixed_stats(b, kv, p))
    t = dp_ep_terms(cp, b, kv, p)
    busy = jnp.sum(b + p, axis=-1) > 0
    shared = t.overhead_s + t.experts_s + t.all_to_all_s
    ep_rank = jnp.where(busy, shared + t.attention_s, 0.0)
    ep_barrier = jnp.where(busy, shared + jnp.max(t.attention_s, axis=-1), 0.0)
    dp_ep = cp.parallel == DP_EP
    return jnp.where(dp_ep, ep_barrier, jnp.max(independent, axis=-1)), jnp.where(dp_ep, ep_rank, independent)


def kv_step_fraction(cp: CostParams, batch: jax.Array, kv_tokens: jax.Array,
                     prefill_tokens: jax.Array | None = None) -> jax.Array:
    """Fraction of the barrier that scales with KV: (d barrier / d s) / barrier for every rank's KV scaled by s at
    s = 1, i.e. sum_g kv_g d barrier / d kv_g / barrier. The barrier follows the busiest rank, so this is the part of
    the step proportional to the max KV load (its KV reads, or its attention FLOPs where those bind).
    Independent mode: relative to `dp_step_times`'s barrier, without the caller's collective overhead. 0 when idle."""
    kv = jnp.asarray(kv_tokens, jnp.float32)
    barrier, slope = jax.jvp(lambda x: dp_step_times(cp, batch, x, prefill_tokens)[0], (kv,), (kv,))
    return jnp.where(barrier > 0, slope / jnp.where(barrier > 0, barrier, 1.0), 0.0)


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
