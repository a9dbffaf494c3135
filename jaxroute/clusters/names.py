"""The cluster models' names and defaults, defined once and importable without JAX (the command line shows them).

`replicas/model.py` and `dp_decode.py` import these; the parsers of `jaxroute` read them without
importing the models, so `jaxroute --help` and argument errors need no JAX.
"""

from __future__ import annotations

# ----------------------------------------------------------------- replica cluster (replicas/model.py)
REPLICA_METRICS: tuple[str, ...] = (
    "mean_latency_s", "p99_latency_s", "ttft_mean_s", "ttft_p90_s", "ttft_p99_s", "tpot_mean_s", "output_tokens_per_s",
    "hit_rate", "replication_factor", "max_replica_share", "queue_mean", "kv_usage_mean", "preemptions")
ADMISSIONS: tuple[str, ...] = ("reserve", "on-demand")
LOCAL_ORDERS: tuple[str, ...] = ("fcfs", "lpm", "priority")
# The lecture's replica deployment: Mistral-7B on one RTX A6000 (the roofline's calibration anchors)
REPLICA_GPU = "a6000"
REPLICA_MODEL = "mistral-7b"
# A replica engine's sizes every command starts from (`deployment.Deployment`)
DEFAULT_CHUNK = 512  # prefill tokens per iteration (SGLang's chunked_prefill_size on a small GPU)
DEFAULT_MAX_RUNNING = 64  # running requests per replica (SGLang's max_running_requests; a real limit)

# ----------------------------------------------------------------- decode data parallelism (dp_decode.py)
# Documented default deployment: Llama-3-8B (dense, GQA, 128 KiB KV/token) on one H200 per DP
# worker, 64 slots. A loaded worker (64 x ~5.7k tokens) steps in ~17 ms, of which ~60 % is KV
# reads, so the barrier pays for KV imbalance as in the paper (whose steps take ~60 ms).
DEFAULT_GPU = "H200"
DEFAULT_MODEL = "Llama-3-8B"
DEFAULT_TP = 1
DEFAULT_SLOTS = 64
DEFAULT_POOL = 32
DEFAULT_WINDOW = 8
DEFAULT_HORIZON = 80
DEFAULT_R_MAX = 4
DEFAULT_COLLECTIVE_S = 1.0e-3  # per-step DP synchronisation / collective overhead
DEFAULT_BLOCK_SIZE = 128  # tokens per KV block (issue 12: vLLM-style paged KV, block size 128)
# BR-H weights. α = 1 keeps the gain in tokens; β = G makes the h = 0 term exactly BR-0's
# penalty; γ = 0.95 halves the weight of a step ~14 steps ahead (predictions far ahead count less).
DEFAULT_ALPHA = 1.0
DEFAULT_GAMMA = 0.95

# ----------------------------------------------------------------- control plane (replicas/control.py)
SCALERS: tuple[str, ...] = ("fixed", "hpa", "kpa", "sla")  # autoscalers, in traced-id order
SCALE_METRICS: tuple[str, ...] = ("waiting", "running", "kv_usage", "in_flight")  # HPA metrics, per ready replica
GATES: tuple[str, ...] = ("none", "token_bucket", "tier_shed", "saturation", "flow_control")  # gateway admission


def check_control_names(scalers, gates) -> None:
    """Refuse, in one line and without JAX, an autoscaler or gate name that is not modelled."""
    from jaxroute.errors import JaxrouteError

    for name, given, known in (("autoscaler", scalers, SCALERS), ("gate", gates, GATES)):
        for x in given:
            if x not in known:
                raise JaxrouteError(f"unknown {name} '{x}'; choose from: {', '.join(known)}")

FAIRNESS: tuple[str, ...] = ("global_strict", "round_robin")  # flow_control: how a priority band picks among tenants
# Request classes and their priorities: GAIE's defaults as BLIS documents them (negative = sheddable)
CLASSES: tuple[str, ...] = ("critical", "standard", "batch", "sheddable", "background")
CLASS_PRIORITY: tuple[int, ...] = (4, 3, -1, -2, -3)
# The control plane's settings and their defaults (the rules' sources: docs/control.md)
CONTROL_DEFAULTS: dict = dict(
    scaler="fixed", min_replicas=1, max_replicas=None, initial=None, interval_s=None, metric="in_flight",
    target=16.0, tolerance=0.1, down_window_s=300.0, stable_window_s=60.0, panic_window_s=6.0,
    panic_threshold=2.0, max_up_rate=1000.0, max_down_rate=2.0, capacity_rps=1.0, provision_s=60.0,
    gate="none", bucket_tokens=10000.0, bucket_refill=1000.0, tier_threshold=0.0, min_priority=3,
    qd_threshold=5.0, kv_threshold=0.8, tenant_budget=0.0, class_mix=(0.0, 1.0, 0.0, 0.0, 0.0),
    tenant_mix=(1.0,), slo_ttft_s=float("inf"), slo_tpot_s=float("inf"), gpu_price=1.0, band_ceiling=1.0,
    fairness="global_strict")
SCALER_INTERVAL_S: dict = {"fixed": 15.0, "hpa": 15.0, "kpa": 2.0, "sla": 60.0}  # HPA sync period, KPA tick, planner interval

# ----------------------------------------------------------------- KV offload tiers (replicas/tiers.py)
# Sizes in GiB of KV per replica (CPU) or for the cluster (shared), bandwidths in GB/s per GPU, latency per load;
# each default's source: docs/tiers.md. cpu_gbps None = the GPU's host link (catalog `host_bw`).
TIER_DEFAULTS: dict = dict(cpu_gib=0.0, cpu_gbps=None, shared_gib=0.0, shared_gbps=25.0, shared_latency_ms=1.0)

# ----------------------------------------------------------------- LoRA adapters (replicas/adapters.py)
# Each default's source: docs/adapters.md. load_ms None = base_latency_ms + the adapter's bytes over the host link.
LORA_SLOTS = 1  # adapters a replica holds at once (vLLM's max_loras default)
LORA_DEFAULTS: dict = dict(n_adapters=8, zipf_s=1.0, base_share=0.0, rank=16, load_ms=None, base_latency_ms=1.5,
                           step_overhead=0.035)
