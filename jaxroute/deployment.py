"""What a simulation runs on: the hardware, the model and the engine's sizes, in one jax-free dataclass.

One `Deployment` describes every kind of cluster the commands simulate: the replicas of a replayed measurement
(`experiments.replay`, `experiments.stage_replay`, `experiments.fit_roofline`), the prefill tier and the decode
tier of a P/D cluster (`experiments.pd`), and the decode data-parallel ranks behind a barrier
(`experiments.decode`). Each field has one default here, and the engine sizes every command starts from
(`DEFAULT_CHUNK`, `DEFAULT_MAX_RUNNING`, in `clusters.names`) are defined once. The commands' starting points are named presets below:
`REPLAY` (vLLM V1 on one H100), `PD` and `PD_PAPER`, `DECODE` and `DECODE_PAPER`.

Static fields decide shapes (chunk, max_running, slots, pool, window, horizon, r_max, block_size), the others
are folded into traced parameters by the experiment that runs it. No JAX is imported here: the methods that
need the cost model import it when called.
"""

from __future__ import annotations

import dataclasses

from jaxroute.clusters import (
    names as dd,  # the decode ranks' documented defaults, dd.DEFAULT_*
)
from jaxroute.clusters.names import DEFAULT_CHUNK, DEFAULT_MAX_RUNNING
from jaxroute.experiments.names import (
    DECODE_DEPLOYMENTS,
    DEFAULT_LINK_GBPS,
    DEFAULT_LINK_LATENCY_MS,
    PD_DEPLOYMENTS,
)


@dataclasses.dataclass(frozen=True)
class Deployment:
    """Hardware, model and engine sizes of every replica, group or rank of a run."""

    gpu: str = dd.DEFAULT_GPU
    model: str = dd.DEFAULT_MODEL  # a catalog name or a config.json path (`catalog.get_model`)
    tp: int = dd.DEFAULT_TP  # GPUs per replica / decode group
    cost_model: str = "roofline"  # the step time: roofline, preble or trained (`cost_models.KINDS`)
    # a replica (replay replicas, P/D prefill tier, colocated replicas)
    replicas: int = 1  # replicas of a replayed measurement
    chunk: int = DEFAULT_CHUNK  # prefill tokens per iteration
    max_running: int = DEFAULT_MAX_RUNNING  # running requests per replica
    admission: str = "reserve"  # KV admission: reserve, or vLLM's on-demand
    kv_capacity: int | None = None  # KV tokens per replica (None: from GPU memory at 90 % less the weights)
    # decode ranks behind a barrier (clusters.dp_decode)
    slots: int = dd.DEFAULT_SLOTS  # running requests per rank
    pool: int = dd.DEFAULT_POOL
    window: int = dd.DEFAULT_WINDOW
    horizon: int = dd.DEFAULT_HORIZON
    r_max: int = dd.DEFAULT_R_MAX
    collective_s: float = dd.DEFAULT_COLLECTIVE_S  # per-step DP synchronisation
    parallel: str = "independent"  # ranks' step: "independent", or "dp_ep" (DP attention + EP MoE over all ranks)
    block_size: int = dd.DEFAULT_BLOCK_SIZE  # tokens per KV block
    preempt: bool = True  # vLLM recompute preemption when a rank runs out of blocks (False: only flagged)
    cap_immediate: bool = False  # legacy: immediate dispatch held to `pool` waiting requests in total
    # prefill/decode disaggregation (experiments.pd)
    prefill_tp: int = 0  # GPUs per prefill group (0: tp)
    link_gbps: float = DEFAULT_LINK_GBPS
    link_latency_ms: float = DEFAULT_LINK_LATENCY_MS
    decode_tier: str = "dp"  # "dp": ranks behind a barrier (dp_decode); "replicas": independent, continuous batching
    predictor: int = 1  # BR-H's predictor kind id (`predictors.base.kind_names()`; 1 = oracle); its table in `bank`
    bank: tuple = ()  # fitted predictor tables (`pd.predictor_bank`)
    ratio: tuple[int, int] = (4, 4)  # the command line's P:D when none is given

    @property
    def prefill_group_tp(self) -> int:
        return self.prefill_tp or self.tp

    def prefill_kv_capacity(self) -> int:
        """KV tokens of one prefill replica (prefill_tp GPUs; colocated rows need prefill_tp == tp)."""
        from jaxroute import cost_models

        return cost_models.kv_capacity_tokens(self.gpu, self.model, self.prefill_group_tp)

    def decode_kv_capacity(self, n_decode: int) -> int:
        """KV tokens of one decode DP rank of n_decode (dp_ep spreads the experts' weights over all of them)."""
        from jaxroute import cost_models

        return cost_models.kv_capacity_tokens(self.gpu, self.model, self.tp, parallel=self.parallel,
                                              dp_ranks=n_decode)

    def cost(self, n_decode: int = 1):
        """The decode ranks' step cost (`cost_models.CostParams`; n_decode of them: dp_ep's expert spread)."""
        from jaxroute import cost_models

        return cost_models.cost_params(self.gpu, self.model, self.tp, kind=self.cost_model, parallel=self.parallel,
                                       dp_ranks=n_decode)


# A measured run replayed (`jaxroute compare`): vLLM V1 on one H100, on-demand admission, max_num_seqs 256 and
# max_num_batched_tokens 2048 (vllm/config/scheduler.py and DEFAULT_MAX_NUM_BATCHED_TOKENS: the engine's defaults;
# `vllm serve` on an H100 raises the latter to 8192, `jaxroute.server`, which reads a deployment's own).
REPLAY = Deployment(gpu="H100-SXM", model="Llama-3.1-8B", tp=1, admission="on-demand", max_running=256, chunk=2048)

# `jaxroute pd`: 8 groups of Llama-3.1-70B on 4 H200 each, no DP collective between independent decode ranks.
PD = Deployment(gpu="H200", model="Llama-3.1-70B", tp=4, collective_s=0.0)

# BalanceRoute's 4P1D (write-up section 10): DeepSeek-V3 W8A8 on Ascend 910C with vllm-ascend; 4 prefill nodes, one
# instance each (vllm-ascend's P/D tutorial, docs/source/tutorials/multi_node_pd_disaggregation_mooncake.md: "use 8
# NPUs 16 chips to deploy one service instance" per Atlas 800T A3 server -> 16 devices), and a decode tier of G = 8
# DP ranks x TP 4 with DP attention + expert parallelism (as `DECODE_PAPER`). The prefill chunk of 8,192 tokens is
# an assumption (the seed gives none).
PD_PAPER = dataclasses.replace(PD, gpu="Ascend-910C", model="DeepSeek-V3-W8A8", tp=4, prefill_tp=16, parallel="dp_ep",
                               chunk=8192, ratio=(4, 8))

# `jaxroute decode`: the decode ranks' documented defaults (dd.DEFAULT_*).
DECODE = Deployment()

# The paper's serving setting (BalanceRoute, write-up section 10): DeepSeek-V3 671B W8A8 on Atlas 910C NPUs with
# vllm-ascend, decode DP G = 8 with TP = 4 per DP worker (4 dies), DP attention + expert-parallel MoE. The per-step
# all-to-all and the per-layer barrier are in the cost model, so no extra collective is added. Slots (64)
# and R_max (4, the paper's dispatch setting) are not given as a batch limit by the seed; 64 is kept.
DECODE_PAPER = Deployment(gpu="Ascend-910C", model="DeepSeek-V3-W8A8", tp=4, parallel="dp_ep", collective_s=0.0)

# The presets by the name the command lines take (`--deployment`).
PD_PRESETS = dict(zip(PD_DEPLOYMENTS, (PD, PD_PAPER), strict=True))
DECODE_PRESETS = dict(zip(DECODE_DEPLOYMENTS, (DECODE, DECODE_PAPER), strict=True))
