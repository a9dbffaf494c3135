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
GATES: tuple[str, ...] = ("none", "token_bucket", "tier_shed", "saturation")  # gateway admission policies
# Request classes and their priorities: GAIE's defaults as BLIS documents them (negative = sheddable)
CLASSES: tuple[str, ...] = ("critical", "standard", "batch", "sheddable", "background")
CLASS_PRIORITY: tuple[int, ...] = (4, 3, -1, -2, -3)
