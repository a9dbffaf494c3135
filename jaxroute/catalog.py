"""GPU and LLM catalogs, tensor-parallel and DP-mode checks, KV capacity: plain Python, no JAX.

The command line lists and checks these names (and shows KV capacities in its help) without importing
JAX; `cost_models` builds the traced step-time parameters from them and re-exports every name here, so
`cost_models.GPUS`, `cost_models.get_model`, `cost_models.kv_capacity_tokens`, ... stay where they were.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re

from jaxroute.errors import JaxrouteError

INDEPENDENT, DP_EP = 0, 1  # decode data-parallel modes (traced field `CostParams.parallel`)
PARALLEL = {"independent": INDEPENDENT, "dp_ep": DP_EP}

# --------------------------------------------------------------------------- catalogs


@dataclasses.dataclass(frozen=True)
class GPUSpec:
    """One accelerator device: dense bf16 and INT8 tensor rates, HBM/GDDR bandwidth, memory, per-direction link."""

    name: str
    flops: float  # dense bf16 FLOP/s (no sparsity)
    mem_bw: float  # bytes/s
    mem_bytes: float  # bytes (decimal GB, as on the spec sheet)
    link_bw: float  # bytes/s per direction to peers (NVLink, or PCIe when no NVLink switch)
    int8_ops: float = 0.0  # dense INT8 tensor OP/s (no sparsity); the rate of W8A8 linear layers
    host_bw: float = 0.0  # bytes/s per direction to host memory (PCIe): KV offload tiers load over it


# Sources (spec sheets; dense = half the "with sparsity" figure):
# - RTX A6000: NVIDIA RTX A6000 datasheet + Ampere GA102 whitepaper (Appendix A): 48 GB GDDR6, 768 GB/s,
#   BF16 tensor (FP32 accumulate) 154.8 TFLOPS dense / 309.7 sparse, INT8 tensor 309.7 TOPS dense / 619.4 sparse.
#   Multi-GPU A6000 servers talk over PCIe Gen4 x16 (32 GB/s per direction); the NVLink bridge joins pairs only.
# - A100 80GB SXM: NVIDIA A100 datasheet: BF16 tensor 312 TFLOPS dense (624 sparse), INT8 624 TOPS dense
#   (1,248 sparse), 2,039 GB/s HBM2e, 80 GB, NVLink 600 GB/s (bidirectional) -> 300 GB/s per direction.
# - H100 SXM: NVIDIA H100 datasheet: BF16 tensor 1,979 TFLOPS with sparsity -> 989.4 dense, INT8 3,958 TOPS with
#   sparsity -> 1,979 dense, 3.35 TB/s HBM3, 80 GB, NVLink 900 GB/s (bidirectional) -> 450 GB/s per direction.
# - H200 SXM: NVIDIA H200 datasheet: BF16 tensor 1,979 TFLOPS with sparsity -> 989.4 dense, INT8 3,958 TOPS with
#   sparsity -> 1,979 dense, 4.8 TB/s HBM3e, 141 GB, NVLink 900 GB/s -> 450 GB/s per direction.
# - Ascend-910C: ONE DIE of Huawei's dual-die Ascend 910C package, i.e. one NPU device as the software counts
#   them. Huawei's CloudMatrix384 paper (Zuo et al., "Serving Large Language Models on Huawei CloudMatrix384",
#   arXiv 2506.12708, Sec. 3 "CloudMatrix384 architecture", Ascend 910C chip) gives the package: two dies,
#   752 TFLOPS dense BF16/FP16 (376 per die), 128 GB of on-package HBM at 3.2 TB/s (64 GB and 1.6 TB/s per die),
#   and over 392 GB/s of unidirectional UB-plane bandwidth per 910C (196 GB/s per die). Cross-checks: the
#   supernode totals 384 x 752 TFLOPS = 289 PFLOPS BF16 and ~48 TB HBM (Huawei Cloud's CloudMatrix 384 project
#   write-up); SemiAnalysis (2025-04-16, "Huawei AI CloudMatrix 384") gives 1,229 TB/s and 49.2 TB for 384 chips
#   (3.2 TB/s, 128 GB each; it quotes 780 TFLOPS BF16, we keep Huawei's 752); vLLM-Ascend's DeepSeek tutorials
#   list an Atlas 800T A3 server (8 x 910C) as "64G x 16", i.e. 16 devices of 64 GB (one per die; the Chinese
#   long-sequence tutorial: "8 个 NPU(16 个芯片)"). Why one die: the BalanceRoute paper's counts are device
#   counts in that sense ("TP=4" per decode DP worker, "最大 144 NPU"): G=8 x TP=4 = 32 devices = two A3 servers.
#   INT8: 2 x BF16 = 752 TOPS per die is derived, not a spec-sheet figure: the Da Vinci cube does a 16x32x16 INT8
#   tile where it does 16x16x16 in FP16 (CANN platform_config DtypeMKN: Default=16,16,16, DT_INT8=16,32,16), as
#   in Huawei's Ascend 910 launch figures (256 TFLOPS FP16 / 512 TOPS INT8). The BF16 figure counts cube + vector
#   (cube alone: 24 cores x 4096 MACs x 2 x 1.8 GHz = 353.9 TFLOPS; CANN Ascend910B2C.ini: 24 cube cores at
#   1800 MHz). link_bw is the UB plane per die, used for TP all-reduces and EP all-to-alls.
# host_bw (the KV offload tiers' CPU link): PCIe per direction, Gen4 x16 32 GB/s (A6000, A100: their datasheets'
#   PCIe Gen4 host interface), Gen5 x16 64 GB/s (H100 SXM, H200: "PCIe Gen5: 128 GB/s" bidirectional on their
#   datasheets). Ascend 910C: assumed Gen5 x16 as well (no per-die host figure found).
GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in [
        GPUSpec("A6000", flops=154.8e12, mem_bw=768e9, mem_bytes=48e9, link_bw=32e9, int8_ops=309.7e12, host_bw=32e9),
        GPUSpec("A100-80GB", flops=312e12, mem_bw=2039e9, mem_bytes=80e9, link_bw=300e9, int8_ops=624e12,
                host_bw=32e9),
        GPUSpec("H100-SXM", flops=989.4e12, mem_bw=3350e9, mem_bytes=80e9, link_bw=450e9, int8_ops=1979e12,
                host_bw=64e9),
        GPUSpec("H200", flops=989.4e12, mem_bw=4800e9, mem_bytes=141e9, link_bw=450e9, int8_ops=1979e12, host_bw=64e9),
        GPUSpec("Ascend-910C", flops=376e12, mem_bw=1600e9, mem_bytes=64e9, link_bw=196e9, int8_ops=752e12,
                host_bw=64e9),
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
    dense_layers: int = 0  # MoE models: leading layers with a dense MLP instead of routed experts
    mla_latent: int = 0  # MLA: width of the cached compressed KV (kv_lora_rank); 0 = not MLA
    mla_rope: int = 0  # MLA: width of the decoupled rope key cached beside the latent
    tp_replicated_params: float = 0.0  # non-expert weights every TP rank holds and reads whole (dp_ep mode)
    w8a8: bool = False  # INT8 weights and activations: linear layers run at the device's INT8 rate

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts (each has one dispatch and one combine all-to-all under EP)."""
        return self.n_layers - self.dense_layers if self.n_experts > 1 else 0

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
#   32 heads, 8 KV heads of dim 128, vocab 32000 -> KV 131,072 B/token (docs/architecture.md).
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
#   config.json "first_k_dense_replace": 3 (layers 0-2 have a dense MLP, 58 layers have experts), q_lora_rank 1536.
#   vLLM keeps MLA's down-projections whole on every TP rank: DeepseekV2MLAAttention.fused_qkv_a_proj is a
#   MergedColumnParallelLinear with disable_tp=True of shape 2112 x 7168 = [q_lora_rank 1536, kv_lora_rank 512 +
#   rope 64] (vllm-project/vllm vllm/model_executor/models/deepseek_v2.py @002d607, DeepSeekV2FusedQkvAProjLinear),
#   so 61 * 7168 * 2112 = 923.5M params are replicated across TP; the rest of the attention (q_b, kv_b, o) and the
#   MLPs split by heads / columns.
# - DeepSeek-V3-W8A8: the same weights quantized to INT8 weights and INT8 activations, as the BalanceRoute paper
#   serves it on Ascend ("DeepSeek-V3 671B W8A8", vllm-ascend) and as vLLM-Ascend's tutorials ship it
#   ("DeepSeek-V3.1-w8a8"); still 1 byte per weight. The embedding, LM head and norms are counted at 1 B too
#   (in the released W8A8 checkpoints they may stay bf16: an approximation of < 0.3 % of the bytes).
_DEEPSEEK_V3 = ModelSpec("DeepSeek-V3", 671e9, 37e9, 61, 7168, 129280, 128, 192, 128, 1,
                         61 * (512 + 64) * 2, n_experts=256, experts_per_token=8, weight_bytes_per_param=1,
                         dense_layers=3, mla_latent=512, mla_rope=64, tp_replicated_params=61 * 7168 * (1536 + 576))
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
        _DEEPSEEK_V3,
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
        dataclasses.replace(_DEEPSEEK_V3, name="DeepSeek-V3-W8A8", w8a8=True),
    ]
}
# Short names the CLI accepts for the only catalog entry of that kind (lower-case, '-'/'_'/'.' ignored).
GPU_ALIASES = {"h100": "H100-SXM", "a100": "A100-80GB", "910c": "Ascend-910C", "ascend": "Ascend-910C"}


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
    """Catalog GPU by name (case-insensitive, '-'/'_'/'.' ignored; 'h100', 'a100', '910c', 'ascend' name one)."""
    return _lookup(name, GPUS, "GPU", GPU_ALIASES)


def get_model(name: str | ModelSpec) -> ModelSpec:
    """Catalog model by name (case-insensitive, '-'/'_'/'.' ignored: 'qwen3-32b', 'llama-3.1-70b')."""
    return _lookup(name, MODELS, "model")


# --------------------------------------------------------------------------- tensor and data parallelism


def _positive_int(value, what: str) -> int:
    """value as an int if it is a positive integer, else a JaxrouteError naming `what`."""
    try:
        n = operator.index(value)
    except TypeError:
        n = 0
    if n < 1:
        raise JaxrouteError(f"{what} must be a positive integer, got {value!r}")
    return n


def _tp(tp) -> int:
    return _positive_int(tp, "tensor-parallel degree")


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


def _dp_ranks(dp_ranks) -> int:
    return _positive_int(dp_ranks, "the number of DP ranks")


def _check_parallel(m: ModelSpec, parallel: str, dp_ranks) -> int:
    """Validate a decode parallel mode for a model; returns the DP rank count."""
    if parallel not in PARALLEL:
        raise JaxrouteError(f"unknown parallel mode '{parallel}'; choose from: {', '.join(PARALLEL)}")
    dp_ranks = _dp_ranks(dp_ranks)
    if parallel == "dp_ep" and m.n_experts <= 1:
        raise JaxrouteError(f"parallel mode dp_ep (DP attention + expert-parallel MoE) needs a MoE model; "
                            f"{m.name} is dense (use parallel 'independent')")
    return dp_ranks


def _expert_share(m: ModelSpec, devices: int) -> float:
    """Fraction of the routed experts on the busiest of `devices` EP devices (vLLM gives the first E mod D one more)."""
    return math.ceil(m.n_experts / devices) / m.n_experts


# --------------------------------------------------------------------------- KV capacity


def kv_capacity_tokens(gpu: str | GPUSpec, model: str | ModelSpec, tp: int = 1, mem_util: float = 0.9,
                       parallel: str = "independent", dp_ranks: int = 1) -> int:
    """Tokens of KV cache that fit in one replica (independent) or one DP rank (dp_ep).

    independent: floor((memory * tp * mem_util - weights) / KV bytes per token across the group).
    KV heads split over TP ranks up to the number of KV heads and are replicated beyond (MLA's latent
    on every rank), so the KV bytes per token across the group is kv_bytes * tp / shards.
    dp_ep (dp_ranks ranks of tp devices): each device holds its rank's non-expert weights / tp (MLA's
    down-projections whole) and its share of the routed experts (ceil(E / (dp_ranks tp)) of them), and its shard of
    the rank's KV; per rank: floor((memory * mem_util - weights per device) / KV bytes per token per device).
    """
    g, m = get_gpu(gpu), get_model(model)
    tp = check_tp(m, tp)
    if not 0.0 < mem_util <= 1.0:
        raise JaxrouteError(f"mem_util must be in (0, 1], got {mem_util}")
    dp_ranks = _check_parallel(m, parallel, dp_ranks)
    if parallel == "dp_ep":
        weights = _dp_ep_device_weight_bytes(m, tp, dp_ranks)
        free = g.mem_bytes * mem_util - weights
        kv_per_token = m.kv_bytes_per_token / _kv_shards(m, tp)
        if free < kv_per_token:
            raise JaxrouteError(f"{m.name} weights per device ({weights / 1e9:.1f} GB with {dp_ranks} DP ranks x {tp} "
                                f"devices) leave no room for KV cache on {g.name} ({g.mem_bytes * mem_util / 1e9:.1f} "
                                f"GB usable at {mem_util:.0%} memory); use more DP ranks or tensor parallelism")
        return int(math.floor(free / kv_per_token))
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


def _dp_ep_device_weight_bytes(m: ModelSpec, tp: int, dp_ranks: int) -> float:
    """Weights on the fullest device under dp_ep: non-expert weights (embedding included) / tp, the TP-replicated
    ones whole, and the busiest device's routed experts."""
    non_expert = (m.total_params - m.expert_params) * m.weight_bytes_per_param
    replicated = m.tp_replicated_params * m.weight_bytes_per_param
    experts = m.expert_params * m.weight_bytes_per_param * _expert_share(m, dp_ranks * tp)
    return (non_expert - replicated) / tp + replicated + experts


def _kv_tokens(g: GPUSpec, m: ModelSpec, tp: int, mem_util: float) -> float:
    return (g.mem_bytes * tp * mem_util - m.weight_bytes) / (m.kv_bytes_per_token * tp / _kv_shards(m, tp))
