"""GPU and LLM catalogs, tensor-parallel and DP-mode checks, KV capacity: plain Python, no JAX.

The command line lists and checks these names (and shows KV capacities in its help) without importing
JAX; `cost_models` builds the traced step-time parameters from them and re-exports every name here, so
`cost_models.GPUS`, `cost_models.get_model`, `cost_models.kv_capacity_tokens`, ... stay where they were.
The models are Hugging Face config.json files (jaxroute/data/models/, read by `jaxroute.hf_config`), and any
function here that takes a model name also takes the path of a config.json or its folder.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import os
import re
from pathlib import Path

from jaxroute.errors import JaxrouteError
from jaxroute.hf_config import read_model_config

INDEPENDENT, DP_EP = 0, 1  # decode data-parallel modes (traced field `CostParams.parallel`)
PARALLEL = {"independent": INDEPENDENT, "dp_ep": DP_EP}

# --------------------------------------------------------------------------- catalogs


@dataclasses.dataclass(frozen=True)
class GPUSpec:
    """One accelerator device: dense bf16, FP8 and INT8 tensor rates, HBM/GDDR bandwidth, memory, per-direction link."""

    name: str
    flops: float  # dense bf16 FLOP/s (no sparsity)
    mem_bw: float  # bytes/s
    mem_bytes: float  # bytes (decimal GB, as on the spec sheet)
    link_bw: float  # bytes/s per direction to peers (NVLink, or PCIe when no NVLink switch)
    int8_ops: float = 0.0  # dense INT8 tensor OP/s (no sparsity); the rate of W8A8 linear layers
    host_bw: float = 0.0  # bytes/s per direction to host memory (PCIe): KV offload tiers load over it
    fp8_flops: float = 0.0  # dense FP8 tensor FLOP/s (no sparsity); 0 where the chip has no FP8 tensor math


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
# - H100 NVL: NVIDIA H100 datasheet (the H100 NVL column): BF16 tensor 1,671 TFLOPS with sparsity -> 835.5 dense,
#   FP8 3,341 -> 1,670.5, INT8 3,341 TOPS -> 1,670.5, 94 GB HBM3 at 3.9 TB/s, NVLink 600 GB/s (bidirectional, the
#   NVLink bridge of a pair of cards) -> 300 GB/s per direction, PCIe Gen5 128 GB/s. link_bw is that bridge: TP
#   beyond the bridged GPUs crosses PCIe (64 GB/s per direction), which the catalog does not model.
# - L40S: NVIDIA L40S datasheet: BF16 tensor 733 TFLOPS with sparsity -> 366.5 dense (the datasheet's dense column
#   prints 362.05; we keep half the sparse figure, as for every chip here), FP8 1,466 -> 733, INT8 1,466 TOPS -> 733,
#   48 GB GDDR6 at 864 GB/s, no NVLink: peers and host over "PCIe Gen4 x16: 64GB/s bidirectional" -> 32 GB/s.
# - B200 (HGX B200): NVIDIA Blackwell datasheet (GB200 NVL72 / HGX B200 table, "Individual Blackwell GPU
#   Specifications", HGX B200 column): FP16/BF16 tensor 4.5 PFLOPS with sparsity -> 2.25 dense, FP8/FP6 9 PFLOPS ->
#   4.5, INT8 9 POPS -> 4.5, 180 GB HBM3e at 7.7 TB/s, 5th-generation NVLink 1.8 TB/s (bidirectional) -> 900 GB/s per
#   direction, PCIe Gen5 128 GB/s -> 64.
# - fp8_flops: H100 SXM and H200 FP8 tensor 3,958 TFLOPS with sparsity -> 1,979 dense (their datasheets; the
#   H100 SXM figure is cross-checked against ../shared/data/vllm-h100-inference-perf/datasheets/h100-sxm.json,
#   datasheet 2430615). A6000 and A100 (Ampere) have no FP8 tensor math; nor has the Ascend 910C in Huawei's
#   published figures (BF16/FP16 and INT8 only): 0.
# host_bw (the KV offload tiers' CPU link): PCIe per direction, Gen4 x16 32 GB/s (A6000, A100, L40S: their datasheets'
#   PCIe Gen4 host interface), Gen5 x16 64 GB/s (H100 SXM, H100 NVL, H200, B200: "PCIe Gen5: 128 GB/s" bidirectional
#   on their datasheets). Ascend 910C: assumed Gen5 x16 as well (no per-die host figure found).
GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in [
        GPUSpec("A6000", flops=154.8e12, mem_bw=768e9, mem_bytes=48e9, link_bw=32e9, int8_ops=309.7e12, host_bw=32e9),
        GPUSpec("A100-80GB", flops=312e12, mem_bw=2039e9, mem_bytes=80e9, link_bw=300e9, int8_ops=624e12,
                host_bw=32e9),
        GPUSpec("H100-SXM", flops=989.4e12, mem_bw=3350e9, mem_bytes=80e9, link_bw=450e9, int8_ops=1979e12,
                host_bw=64e9, fp8_flops=1979e12),
        GPUSpec("H200", flops=989.4e12, mem_bw=4800e9, mem_bytes=141e9, link_bw=450e9, int8_ops=1979e12, host_bw=64e9,
                fp8_flops=1979e12),
        GPUSpec("Ascend-910C", flops=376e12, mem_bw=1600e9, mem_bytes=64e9, link_bw=196e9, int8_ops=752e12,
                host_bw=64e9),
        GPUSpec("H100-NVL", flops=835.5e12, mem_bw=3900e9, mem_bytes=94e9, link_bw=300e9, int8_ops=1670.5e12,
                host_bw=64e9, fp8_flops=1670.5e12),
        GPUSpec("L40S", flops=366.5e12, mem_bw=864e9, mem_bytes=48e9, link_bw=32e9, int8_ops=733e12, host_bw=32e9,
                fp8_flops=733e12),
        GPUSpec("B200", flops=2250e12, mem_bw=7700e9, mem_bytes=180e9, link_bw=900e9, int8_ops=4500e12, host_bw=64e9,
                fp8_flops=4500e12),
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
    vocab: int  # embedding and LM head: two tables of vocab x hidden, one when tied_embeddings
    n_heads: int  # query heads
    head_dim_qk: int
    head_dim_v: int
    n_kv_heads: int  # KV heads that TP can shard (1 for MLA: one latent shared by all heads)
    kv_bytes_per_token: int  # bf16 KV cache bytes per token, all layers
    n_experts: int = 1  # routed experts per MoE layer (1 = dense)
    experts_per_token: int = 1
    weight_bytes_per_param: int = 2  # bf16; DeepSeek-V3 ships FP8 weights
    dense_layers: int = 0  # MoE models: layers with a dense MLP instead of routed experts (DeepSeek-V3's leading
    # first_k_dense_replace, Llama-4's interleaved non-MoE layers, Qwen3-MoE's mlp_only_layers)
    mla_latent: int = 0  # MLA: width of the cached compressed KV (kv_lora_rank); 0 = not MLA
    mla_rope: int = 0  # MLA: width of the decoupled rope key cached beside the latent
    tp_replicated_params: float = 0.0  # non-expert weights every TP rank holds and reads whole (dp_ep mode)
    w8a8: bool = False  # INT8 weights and activations: linear layers run at the device's INT8 rate
    tied_embeddings: bool = False  # one vocab x hidden table is both the embedding and the LM head (counted once)

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


# The models: one Hugging Face config.json-style file per model in jaxroute/data/models/ (package data), its
# `_source` key citing where the values come from, read by `hf_config.read_model_config` like any config.json
# a user gives (`get_model(PATH)`, `--model-config PATH`): one path builds every model. This order is the order
# the command line lists them in; any other file there follows, by name.
MODEL_DIR = Path(__file__).resolve().parent / "data" / "models"
MODEL_ORDER = ("Mistral-7B", "Llama-3-8B", "Llama-3-70B", "Qwen3-30B-A3B", "DeepSeek-V3", "Qwen3-32B", "Qwen3-8B",
               "Llama-3.1-8B", "Llama-3.1-70B", "DeepSeek-V3-W8A8",
               # the models of the real vLLM H100 runs (../shared/data/vllm-h100-inference-perf/model_configs)
               "Llama-2-7B", "Llama-2-70B", "Mixtral-8x7B", "CodeLlama-34B")


def _catalog_models() -> dict[str, ModelSpec]:
    files = {f.stem: f for f in MODEL_DIR.glob("*.json")}
    missing = [n for n in MODEL_ORDER if n not in files]
    if missing:
        raise JaxrouteError(f"the package's model configs are missing {', '.join(missing)} (looked in {MODEL_DIR})")
    names = list(MODEL_ORDER) + sorted(set(files) - set(MODEL_ORDER))
    return {n: read_model_config(files[n], name=n) for n in names}


MODELS: dict[str, ModelSpec] = _catalog_models()
# Short names the CLI accepts for the only catalog entry of that kind (lower-case, '-'/'_'/'.' ignored). "h100" named
# the only H100 before H100-NVL joined; it keeps meaning the SXM part (the default everywhere it is used).
GPU_ALIASES = {"h100": "H100-SXM", "a100": "A100-80GB", "910c": "Ascend-910C", "ascend": "Ascend-910C",
               "rtx-a6000": "A6000", "h100-sxm5": "H100-SXM", "h200-sxm": "H200", "hgx-b200": "B200"}


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


def is_model_path(name) -> bool:
    """Whether a model argument names a config.json or its folder rather than a catalog name: a path object, text
    with a path separator or ending in .json, or (not a catalog name) an existing file or folder."""
    if isinstance(name, os.PathLike):
        return True
    if not isinstance(name, str):
        return False
    text = name.strip()
    if any(sep and sep in text for sep in (os.sep, os.altsep, "/")) or text.lower().endswith(".json"):
        return True
    return _key(text) not in {_key(k) for k in MODELS} and os.path.exists(text)


@functools.lru_cache(maxsize=64)
def _model_at(path: str, _stamp: tuple) -> ModelSpec:
    return read_model_config(path)


def _model_from_path(path) -> ModelSpec:
    """The model of a config.json or its folder, read once per file version (path, size and mtime)."""
    resolved = os.path.realpath(os.path.expanduser(os.fspath(path)))
    file = os.path.join(resolved, "config.json") if os.path.isdir(resolved) else resolved
    try:
        st = os.stat(file)
        stamp = (st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = ()
    return _model_at(resolved, stamp)  # a missing file: read_model_config's one-line error


def model_ref(name) -> str:
    """What to pass on as a model argument: a catalog model's name (case fixed), or a config path made absolute
    (so it reads the same from any folder or process). Checks the model."""
    if is_model_path(name):
        _model_from_path(name)
        return os.path.abspath(os.path.expanduser(os.fspath(name).strip()))
    return get_model(name).name


def get_model(name: str | os.PathLike | ModelSpec) -> ModelSpec:
    """Catalog model by name (case-insensitive, '-'/'_'/'.' ignored: 'qwen3-32b', 'llama-3.1-70b'), or the model of a
    Hugging Face config.json or the folder holding it (`hf_config.read_model_config`): any place that takes a model
    name takes a config path."""
    if is_model_path(name):
        return _model_from_path(os.fspath(name).strip() if isinstance(name, str) else name)
    try:
        return _lookup(name, MODELS, "model")
    except JaxrouteError as e:
        raise JaxrouteError(f"{e} (or a path to a Hugging Face config.json or its folder)") from None


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


def check_args(args) -> None:
    """The GPU and model a parsed command line names (--gpu, --model / --model-config) resolve, checked before the
    command runs: one line naming the one that does not, without JAX."""
    if isinstance(gpu := getattr(args, "gpu", None), str):
        get_gpu(gpu)
    if isinstance(model := getattr(args, "model", None), str):
        get_model(model)
