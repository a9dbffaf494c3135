"""A vLLM deployment read as vLLM reads it: its serve arguments, and its KV cache sized as vLLM sizes it. No JAX.

`--server FILE` (YAML or JSON) holds `vllm serve`'s arguments under their own names (either spelling of a flag:
`tensor_parallel_size` or the harness's `tensor_parallelism`, dashes or underscores). vLLM V1's defaults apply
to what the file leaves out (vllm/config: `SchedulerConfig` max_num_seqs 256 and, on a GPU serving online,
max_num_batched_tokens 8192 (2048 below H100-class chips); `CacheConfig` gpu_memory_utilization 0.9, block_size
16, prefix caching and chunked prefill on). `enable_chunked_prefill: false` is read and kept, but a V1 engine
chunks regardless: vLLM 0.11's `EngineArgs._set_default_args` sets it back to true for every generating model
(vllm/engine/arg_utils.py:1546-1548), so the simulator chunks at max_num_batched_tokens (`CHUNKED_PREFILL_NOTE`,
printed by the commands that read the file). vLLM V1 admits on demand (KV blocks allocated as tokens arrive, a
request preempted by recompute when none are free), so a deployment read from a server file always runs the
simulator's on-demand admission.

KV capacity, as vLLM V1 sizes it (`Worker.determine_available_memory`, vllm/v1/worker/gpu_worker.py: requested
memory = total x gpu_memory_utilization, less the non-KV memory the profiling run measured: the weights, the
PyTorch activation peak of one forward pass of max_num_batched_tokens, and the non-PyTorch memory: CUDA graphs,
NCCL buffers). Without a GPU to profile, the activation peak and the non-PyTorch memory are BLIS's estimates
(inference-sim sim/latency/kv_capacity.go, constants from llm-d-benchmark's capacity_planner.py): 5.5 GiB of
activations per GPU for a dense model, 8 GiB for MoE, and 0.15 GiB of non-PyTorch memory at TP 1, 0.6 GiB beyond.
The KV pool is then whole blocks of `block_size` tokens across the TP group (`kv_parts` returns every part).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from jaxroute import catalog
from jaxroute.errors import JaxrouteError
from jaxroute.mapping_files import read_mapping

GIB = 1 << 30
ACTIVATION_DENSE_GIB = 5.5  # BLIS kv_capacity.go activationMemoryDenseGiB (llm-d-benchmark capacity_planner.py)
ACTIVATION_MOE_GIB = 8.0  # activationMemoryMoEGiB
NON_TORCH_TP1_GIB = 0.15  # nonTorchMemoryTP1GiB
NON_TORCH_TP_GIB = 0.6  # nonTorchMemoryTPMultiGiB

# vLLM V1 defaults of what a server file may leave out (vllm/config/scheduler.py, vllm/config/cache.py,
# vllm/engine/arg_utils.py `_set_default_args`: max_num_batched_tokens 8192 for the OpenAI server on GPUs with
# 70 GiB or more, 2048 below; max_num_seqs 256 (1024 on H100/H200-class at 70 GiB+ in newer releases: the data
# here states its value)).
DEFAULTS = {"tensor_parallel_size": 1, "max_num_batched_tokens": None, "max_num_seqs": 256, "max_model_len": None,
            "gpu_memory_utilization": 0.9, "block_size": 16, "enable_prefix_caching": True,
            "enable_chunked_prefill": True}
ALIASES = {"tensor_parallelism": "tensor_parallel_size", "tp": "tensor_parallel_size"}
IGNORED = ("app", "served_model_name", "port", "host", "seed", "dtype", "trust_remote_code", "download_dir")
LARGE_GPU_BYTES = 70 * GIB
CHUNKED_PREFILL_NOTE = ("enable_chunked_prefill false: vLLM V1 chunks prefills regardless (0.11's arg_utils.py:1546-1548 "
                        "sets it back to true), and so does the simulation")


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """`vllm serve`'s arguments that decide scheduling and memory (after vLLM's defaults)."""

    model: str  # the served model's name (the model itself comes from a catalog name or a config.json)
    tensor_parallel_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int | None
    gpu_memory_utilization: float
    block_size: int
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    source: str = ""


def _int(p: Path, key: str, v, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise JaxrouteError(f"{p.name}: {key} = {v!r}; expected an integer >= {minimum}")
    return v


def read_server(path: str | Path, gpu: str = "H100-SXM") -> ServerConfig:
    """A server file's settings with vLLM's defaults; an unknown key or a bad value is a one-line error."""
    p = Path(path)
    raw = read_mapping(p, "server file", "a mapping of vLLM serve arguments (model, tensor_parallel_size, ...)")
    seen: dict = {}
    for k, v in raw.items():
        key = ALIASES.get(str(k).replace("-", "_"), str(k).replace("-", "_"))
        if key in IGNORED:
            continue
        if key != "model" and key not in DEFAULTS:
            raise JaxrouteError(f"{p.name}: unknown server setting '{k}'; known: model, "
                                f"{', '.join(DEFAULTS)} (and {', '.join(ALIASES)})")
        if key in seen:
            raise JaxrouteError(f"{p.name}: '{k}' sets {key} twice")
        seen[key] = v
    if not isinstance(seen.get("model"), str) or not seen["model"]:
        raise JaxrouteError(f"{p.name}: no model (the served model's name, e.g. meta-llama/Llama-2-7b-hf)")
    cfg = {**DEFAULTS, **seen}
    if cfg["max_num_batched_tokens"] is None:
        cfg["max_num_batched_tokens"] = 8192 if catalog.get_gpu(gpu).mem_bytes >= LARGE_GPU_BYTES else 2048
    for key in ("tensor_parallel_size", "max_num_batched_tokens", "max_num_seqs", "block_size"):
        cfg[key] = _int(p, key, cfg[key])
    if cfg["max_model_len"] is not None:
        cfg["max_model_len"] = _int(p, "max_model_len", cfg["max_model_len"])
    u = cfg["gpu_memory_utilization"]
    if isinstance(u, bool) or not isinstance(u, int | float) or not 0 < u <= 1:
        raise JaxrouteError(f"{p.name}: gpu_memory_utilization = {u!r}; expected a number in (0, 1]")
    for key in ("enable_prefix_caching", "enable_chunked_prefill"):
        if not isinstance(cfg[key], bool):
            raise JaxrouteError(f"{p.name}: {key} = {cfg[key]!r}; expected true or false")
    return ServerConfig(source=str(p), **{f.name: cfg[f.name] for f in dataclasses.fields(ServerConfig)
                                          if f.name != "source"})


@dataclasses.dataclass(frozen=True)
class KVParts:
    """vLLM's KV sizing of one replica (bytes summed over its TP group; `tokens` the pool)."""

    requested: float  # memory x gpu_memory_utilization x tp
    weights: float
    activations: float  # the profiling run's PyTorch peak (estimate)
    non_torch: float  # CUDA graphs, NCCL buffers (estimate)
    kv_bytes_per_token: float  # across the group
    block_size: int
    tokens: int

    def text(self) -> str:
        g = lambda b: f"{b / GIB:.2f} GiB"
        return (f"KV cache {self.tokens:,} tokens = ({g(self.requested)} requested - {g(self.weights)} weights - "
                f"{g(self.activations)} activations - {g(self.non_torch)} non-torch) / "
                f"{self.kv_bytes_per_token / 1024:.0f} KiB per token, in blocks of {self.block_size}")


def kv_parts(gpu, model, tp: int, gpu_memory_utilization: float = 0.9, block_size: int = 16) -> KVParts:
    """The KV pool of one replica of `model` on `tp` x `gpu`, as vLLM V1 sizes it (module docstring)."""
    g, m = catalog.get_gpu(gpu), catalog.get_model(model)
    tp = catalog.check_tp(m, tp)
    requested = g.mem_bytes * gpu_memory_utilization * tp
    act = (ACTIVATION_MOE_GIB if m.n_experts > 1 else ACTIVATION_DENSE_GIB) * GIB * tp
    non_torch = (NON_TORCH_TP1_GIB if tp == 1 else NON_TORCH_TP_GIB) * GIB * tp
    per_token = m.kv_bytes_per_token * tp / catalog._kv_shards(m, tp)
    free = requested - m.weight_bytes - act - non_torch
    blocks = math.floor(free / (per_token * block_size)) if free > 0 else 0
    if blocks < 1:
        raise JaxrouteError(f"{m.name} on {tp} x {g.name}: no room for a KV block after {m.weight_bytes / GIB:.1f} "
                            f"GiB of weights and {(act + non_torch) / GIB:.1f} GiB of activations in "
                            f"{requested / GIB:.1f} GiB; use more GPUs (tensor parallelism)")
    return KVParts(requested, m.weight_bytes, act, non_torch, per_token, block_size, blocks * block_size)
