"""Decode data-parallel workers behind a barrier (BalanceRoute's setting), one barrier step per event.

G decode workers (DP ranks) advance in lockstep. Worker g has S slots and a paged KV pool of
kv_capacity // block_size blocks; its load is L_g(k) = Σ_{i running on g} (s_i + j_i) (prompt
plus tokens generated so far). One step, in the order of vLLM's scheduler:

1. Intake. *Immediate* dispatch (the baselines, as a vLLM-router deployment does) routes every
   prefill-completed request (arrival time <= now) on arrival to a worker's local FCFS queue
   (`choose_worker`); nothing caps it (`cap_immediate` restores the old cap of P requests
   waiting in total). *Pooled* dispatch (BR-0/BR-H) moves them, oldest first, into the prompt
   pool of capacity P; the rest wait in the prefill tier, which holds their KV.
2. Running requests first. Each needs the blocks for its next token, ceil((s + j + 1) / block);
   a rank that runs out preempts its newest requests (vLLM's recompute preemption): their
   blocks are freed and they go back to the front of that rank's queue, oldest first, keeping
   their generated count (assignment stays sticky). With `preempt=False` growth is only flagged.
3. Admission from the local queue: FCFS with head-of-line blocking, at most R_max per worker
   per step, into free slots, while the blocks for the prompt plus tokens already generated
   (recomputed now, a prefill of s + j tokens in this step) plus the next token fit. A rank
   that preempted this step admits nothing.
4. Pooled binding: BalanceRoute's two-stage binding (br0/brh) or, for a baseline forced to
   pooled, oldest-first with the baseline's worker choice, into the free slots and blocks the
   local queues left (only ranks whose queue is empty).
5. Decode. Every running request emits one token; it finishes when it has emitted its output
   length. Step time = the barrier of `cost_models.dp_step_times` (per-rank decode batch, KV
   read and recompute prefill; independent replicas or DP-attention + EP MoE) + collective
   overhead. When nothing runs the clock jumps to the next arrival (no barrier step).

Per-rank prefix caches (SGLang DP attention: every rank has its own radix cache and prefills its
own requests; static `DecodeModel.prefix_cache_tokens` > 0, 0 = none). A workload with segments
(`make_prefix_workload`: seg_ids/seg_tok per request, seg_len per id; a segment id always has the
same parent, so the leading cached segments are a prefix match) sets `cached` [G, M+1] and
`last_use` [G, M+1] per rank. At a request's first admission on rank g (local queue admission or
pooled binding) that it prefills itself (local_prefill), it prefills prompt - hit tokens, hit = the
leading cached tokens of its segments on g, at most prompt - 1 (a fully cached prompt still
computes its last token, as vLLM). Hits are read on the cache as it was at the step's start:
admissions and bindings within one step do not see each other's insertions (nor do the routers'
estimates). After binding, every admitted request's segments are inserted on its rank with
last_use = the step's start time; then, while a rank's cached tokens (Σ seg_len of its cached
segments) exceed prefix_cache_tokens, its least recently used segment goes (ties: lowest segment
id), never one inserted or touched in this step: when only those remain the cache stays over its
budget until the next step's eviction. Simplifications: the cache's KV sits outside the block pool
(its own budget; admission still takes blocks for the whole prompt); only locally prefilled
requests read or fill it (landed KV and preemption recomputes do not), and outputs are not cached.
Policies br_cache and cache (`routers.balance.CACHE_POLICIES`) route on these caches.

Seeds: saturated and Poisson runs take the workload's requests in a per-seed random order
(trace replays keep the trace order), so every seed is a different replay.
Metrics average over barrier steps: imbalance_tokens (max - min load), barrier_idle_tokens
(I = G*M - Σ L); per request TPOT = (finish - first admission) / output tokens; preemptions and
recomputed tokens; output tokens per step; prefill_tokens (prefilled by the ranks at first
admissions), hit_rate (cached prompt tokens at those admissions / their prompt tokens) and
cache_evictions (segments evicted). The loaded phase ends when the last request is admitted.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute import cost_models, metrics, sim
from jaxroute.clusters import prefix_cache
from jaxroute.clusters.names import (  # noqa: F401  (the documented default deployment and BR-H weights: dd.DEFAULT_*)
    DEFAULT_ALPHA,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_COLLECTIVE_S,
    DEFAULT_GAMMA,
    DEFAULT_GPU,
    DEFAULT_HORIZON,
    DEFAULT_MODEL,
    DEFAULT_POOL,
    DEFAULT_R_MAX,
    DEFAULT_SLOTS,
    DEFAULT_TP,
    DEFAULT_WINDOW,
)
from jaxroute.errors import JaxrouteError
from jaxroute.predictors import base as predictors
from jaxroute.registry import PolicyRegistry
from jaxroute.routers import balance
from jaxroute.workloads.decode import DecodeRequests

ARRIVALS = ("saturated", "poisson", "trace")
ARRIVAL_REGISTRY = PolicyRegistry("decode", ARRIVALS, what="arrival mode")
SATURATED, POISSON, TRACE = range(3)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeWorkload:
    """Requests and deployment, broadcast to every (config, seed) row."""

    prompt: jax.Array  # [N] int32 prompt tokens s_i (KV on admission)
    output: jax.Array  # [N] int32 output tokens (decode steps)
    arrival_s: jax.Array  # [N] float32 trace arrival times (used with arrival=trace)
    key_id: jax.Array  # [N] int32 prompt key for predictors (-1 unknown)
    cost: cost_models.CostParams  # per-worker step-time model
    collective_s: jax.Array  # [] float32 fixed per-step barrier overhead
    bank: tuple = ()  # fitted predictor tables (predictors.base), one per registered deployable kind
    local_prefill: jax.Array | None = None  # [N] bool the rank prefills the prompt itself at first admission
    #                                         (a request a P/D decider kept off the prefill tier; None = none)
    seg_ids: jax.Array | None = None  # [N, S] int32 prompt segment ids in prompt order (pad M; None = no segments)
    seg_tok: jax.Array | None = None  # [N, S] int32 tokens of each (0 = pad)
    seg_len: jax.Array | None = None  # [M+1] int32 tokens of each segment id (dummy M last, 0 tokens)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeParams:
    """Traced per-row settings (vmapped over for comparisons and sweeps)."""

    policy: jax.Array  # [] int32 id in balance.REGISTRY
    dispatch: jax.Array  # [] int32 id in balance.DISPATCH_REGISTRY (0 immediate, 1 pooled)
    predictor: jax.Array  # [] int32 predictor kind id (predictors.base.kind_names(); BR-H only)
    alpha: jax.Array  # [] float32 BR-H gain weight
    beta: jax.Array  # [] float32 BR-H overflow penalty
    gamma: jax.Array  # [] float32 BR-H discount
    arrival: jax.Array  # [] int32 id in ARRIVAL_REGISTRY (0 saturated, 1 poisson, 2 trace)
    rate: jax.Array  # [] float32 Poisson rate (requests/s)
    n_active: jax.Array | None = None  # [] int32 ranks in use, the first n_active (None = all n_workers)
    cache_weight: jax.Array | None = None  # [] float32 br_cache's weight on missed prefill tokens (None = 1.0)


def make_params(policy: str, *, n_workers: int, dispatch: str | None = None, predictor: int = 1,
                alpha: float = DEFAULT_ALPHA, beta: float | None = None, gamma: float = DEFAULT_GAMMA,
                arrival: str = "saturated", rate: float = 1.0, n_active: int | None = None,
                cache_weight: float = 1.0) -> DecodeParams:
    """Params for one row; beta defaults to G (the ranks in use); dispatch defaults to the policy's own mode.

    n_active: ranks in use of a model built for n_workers (a traced count: a sweep over it is one compilation).
    cache_weight: br_cache's penalty per prompt token a rank would prefill (traced; other policies ignore it).

    predictor is a kind id (`predictors.base.kind_id(name)`); whether the workload's bank has
    its fitted table is checked where params and workload meet (`DecodeModel.check_params`).
    """
    pid = balance.policy_id(policy)
    if dispatch is not None:
        balance.DISPATCH_REGISTRY.id(dispatch)
    ARRIVAL_REGISTRY.id(arrival)
    predictors.check_kind_ids(predictor)
    if n_active is not None and not 1 <= n_active <= n_workers:
        raise JaxrouteError(f"decode ranks in use must be between 1 and {n_workers}, got {n_active}")
    if arrival == "poisson" and not (math.isfinite(rate) and rate > 0):
        raise JaxrouteError(f"Poisson arrival rate must be positive and finite, got {rate}")
    for name, v in (("alpha", alpha), ("beta", beta), ("gamma", gamma)):
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise JaxrouteError(f"BR-H {name} must be a finite non-negative number, got {v}")
    if not (math.isfinite(cache_weight) and cache_weight >= 0):
        raise JaxrouteError(f"cache weight must be a finite non-negative number, got {cache_weight}")
    disp = balance.default_dispatch(policy) if dispatch is None else balance.DISPATCH_MODES.index(dispatch)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    i32 = lambda x: jnp.asarray(x, jnp.int32)
    g = n_workers if n_active is None else n_active
    return DecodeParams(i32(pid), i32(disp), i32(predictor), f32(alpha), f32(g if beta is None else beta), f32(gamma),
                        i32(ARRIVALS.index(arrival)), f32(rate), None if n_active is None else i32(n_active),
                        f32(cache_weight))


def make_workload(req: DecodeRequests, cost: cost_models.CostParams, collective_s: float = DEFAULT_COLLECTIVE_S,
                  bank: tuple = ()) -> DecodeWorkload:
    return DecodeWorkload(
        prompt=jnp.asarray(req.prompt_tokens, jnp.int32),
        output=jnp.asarray(req.output_tokens, jnp.int32),
        arrival_s=jnp.asarray(req.arrival_s, jnp.float32),
        key_id=jnp.asarray(req.key_id, jnp.int32),
        cost=cost,
        collective_s=jnp.asarray(collective_s, jnp.float32),
        bank=tuple(bank),
    )


def make_prefix_workload(table, cost: cost_models.CostParams, collective_s: float = DEFAULT_COLLECTIVE_S,
                         bank: tuple = ()) -> DecodeWorkload:
    """A DecodeWorkload from a prefix workload's realised `RequestTable` (workloads.prefix): colocated
    prefill (every request is prefilled by its rank, local_prefill all True) and the prompt segments,
    for a model with per-rank prefix caches (`DecodeModel.prefix_cache_tokens`). Output segments
    (`out_seg`) are not cached; landed KV (`landed`) is ignored."""
    n = table.prompt_tok.shape[0]
    return DecodeWorkload(
        prompt=jnp.asarray(table.prompt_tok, jnp.int32),
        output=jnp.asarray(table.out_tok, jnp.int32),
        arrival_s=jnp.asarray(table.arrival_s, jnp.float32),
        key_id=jnp.full((n,), -1, jnp.int32),
        cost=cost,
        collective_s=jnp.asarray(collective_s, jnp.float32),
        bank=tuple(bank),
        local_prefill=jnp.ones((n,), bool),
        seg_ids=jnp.asarray(table.seg_ids, jnp.int32),
        seg_tok=jnp.asarray(table.seg_tok, jnp.int32),
        seg_len=jnp.asarray(table.seg_len, jnp.int32),
    )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
    key: jax.Array  # PRNG key for router coin flips
    t: jax.Array  # [] float32 clock (s)
    event: jax.Array  # [] int32 events processed (scan iterations that did something)
    steps: jax.Array  # [] int32 barrier steps
    arrival_t: jax.Array  # [N] float32 when each request's prefill completes
    prompt: jax.Array  # [N] int32 prompt tokens, in this run's arrival order
    output: jax.Array  # [N] int32 output tokens, same order
    key_id: jax.Array  # [N] int32 prompt keys, same order
    next_in: jax.Array  # [] int32 requests taken in by the proxy (a prefix of arrival order)
    pool: jax.Array  # [P] int32 request ids waiting in the prompt pool, oldest first, -1 empty
    queue: jax.Array  # [G, N] int32 local FCFS queues, rings: entry k of rank g at (q_head[g] + k) % N
    q_head: jax.Array  # [G] int32 ring position of each queue's oldest entry
    q_len: jax.Array  # [G] int32 entries in each queue
    q_tokens: jax.Array  # [G] int32 prompt tokens of the queued requests
    rr_next: jax.Array  # [] int32 round-robin pointer
    slot_req: jax.Array  # [G, S] int32 request in each slot, -1 free
    slot_gen: jax.Array  # [G, S] int32 tokens generated so far by that request
    slot_seq: jax.Array  # [G, S] int32 admission order of that request (larger = newer)
    seq: jax.Array  # [] int32 admissions so far (next admission order)
    req_gen: jax.Array  # [N] int32 tokens a preempted request had generated (kept while it waits)
    preemptions: jax.Array  # [] int32 requests preempted (KV freed, to be recomputed)
    recomputed_tokens: jax.Array  # [] int32 tokens prefilled again on readmission after a preemption
    admit_t: jax.Array  # [N] float32 start of the request's first decode step
    first_t: jax.Array  # [N] float32 end of that step (its first token)
    local: jax.Array  # [N] bool prefilled by its rank at first admission (DecodeWorkload.local_prefill)
    finish_t: jax.Array  # [N] float32 end of its last decode step
    done: jax.Array  # [N] bool
    worker_of: jax.Array  # [N] int32 worker the request was bound to, -1 before
    tokens_out: jax.Array  # [] int32 tokens emitted
    sum_imb: jax.Array  # [] float32 Σ over steps of max - min load
    sum_idle: jax.Array  # [] float32 Σ over steps of I(k) = G M - Σ L
    sum_load: jax.Array  # [] float32 Σ over steps of mean load
    sum_imb_loaded: jax.Array  # [] float32 Σ of max - min over the loaded phase (requests still to admit)
    steps_loaded: jax.Array  # [] int32 barrier steps in the loaded phase
    sum_running: jax.Array  # [] float32 Σ over steps of the requests running on all ranks
    sum_running_loaded: jax.Array  # [] float32 the same over the loaded phase
    kv_step_s: jax.Array  # [] float32 Σ over steps of the barrier's KV-proportional seconds (d barrier / d s, KV x s)
    busy_s: jax.Array  # [G] float32 Σ of each worker's own compute time
    barrier_s: jax.Array  # [] float32 Σ of barrier step times
    kv_overflow: jax.Array  # [] bool KV blocks exceeded (no preemption) or a request that can never fit
    all_admitted_t: jax.Array  # [] float32 time the last request was admitted (end of the loaded phase)
    tokens_loaded: jax.Array  # [] int32 tokens emitted up to then
    trace_kv: jax.Array  # [T, G] float32 sampled per-worker loads
    trace_t: jax.Array  # [T] float32 sample times
    seg_ids: jax.Array  # [N, S] int32 prompt segments, in this run's arrival order ([N, 1] without caches)
    seg_tok: jax.Array  # [N, S] int32 their tokens, same order
    cached: jax.Array  # [G, M+1] bool segments in each rank's prefix cache ([G, 1] without caches)
    last_use: jax.Array  # [G, M+1] float32 start of the step that last inserted or hit each
    cache_evictions: jax.Array  # [] int32 segments evicted
    prefill_tok: jax.Array  # [] int32 tokens prefilled by the ranks at first admissions (prompt - hit)
    hit_tok: jax.Array  # [] int32 cached prompt tokens at those admissions
    first_prompt_tok: jax.Array  # [] int32 prompt tokens of those admissions


class StepContext(NamedTuple):
    """What every phase of a decode step reads, taken at its start."""

    pooled: jax.Array  # [] bool prompt-pool dispatch (else immediate, to local queues)
    use: jax.Array  # [G] bool ranks in use
    g_use: jax.Array  # [] int32 ranks in use
    a: jax.Array  # [] float32 BalanceRoute score weight alpha
    b: jax.Array  # [] float32 beta
    d: jax.Array  # [H + 1] float32 discounts gamma^h
    loads_h: jax.Array  # [G, H + 1] float32 predicted KV loads over the horizon
    w_cache: jax.Array  # [] float32 weight of missed prefill tokens (br_cache; others 0)


class LocalAdmission(NamedTuple):
    """What admission from the local queues leaves for the later phases."""

    free: jax.Array  # [G] int32 slots still free for pooled binding this step
    free_blocks: jax.Array  # [G] int32 KV blocks still free
    admitted: jax.Array  # [G] int32 admitted from the local queue
    running_before: jax.Array  # [G] int32 running after preemption, before admission
    recompute: jax.Array  # [G] int32 tokens recomputed for readmitted preempted requests
    prefill_first: jax.Array  # [G] int32 prompt tokens prefilled here for first admissions (cache misses)
    hit_tok: jax.Array  # [] int32 their cache hits
    prompt_tok: jax.Array  # [] int32 their prompt tokens
    inserted: jax.Array  # [G, M] bool segments their admissions insert into the caches
    too_big: jax.Array  # [] bool a request that can never fit a rank's KV


@dataclasses.dataclass(frozen=True)
class DecodeModel(sim.Model):
    """Static configuration (shapes) of the decode DP barrier simulator."""

    cpu_rows_together: ClassVar[int | None] = sim.CPU_ROWS_TOGETHER  # branches and loops: rows in groups
    holds_when_done: ClassVar[bool] = False  # a done state is held by the engine (sim.held_step)

    n_workers: int
    n_requests: int
    max_steps: int
    slots: int = DEFAULT_SLOTS
    pool: int = DEFAULT_POOL
    window: int = DEFAULT_WINDOW
    horizon: int = DEFAULT_HORIZON
    r_max: int = DEFAULT_R_MAX
    kv_capacity: int = 10**9  # KV tokens per worker (its block pool holds kv_capacity // block_size blocks)
    trace_points: int = 128
    block_size: int = DEFAULT_BLOCK_SIZE  # tokens per KV block (vLLM paged attention)
    preempt: bool = True  # preempt the newest requests (recompute) when a rank runs out of blocks
    cap_immediate: bool = False  # legacy: immediate dispatch also held to P waiting requests in total
    prefix_cache_tokens: int = 0  # per-rank prefix cache budget in tokens (0 = no caches; outside the block pool)

    def __post_init__(self):
        for name in ("n_workers", "n_requests", "max_steps", "slots", "pool", "window", "r_max", "trace_points"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise JaxrouteError(f"{name.replace('_', ' ')} must be a positive integer, got {v!r}")
        if not isinstance(self.horizon, int) or self.horizon < 0:
            raise JaxrouteError(f"horizon must be a non-negative integer, got {self.horizon!r}")
        if self.window > 12:
            raise JaxrouteError(f"candidate window W={self.window} enumerates 2^W subsets; use W <= 12")
        if self.window > self.pool:
            raise JaxrouteError(f"candidate window W={self.window} exceeds the pool capacity P={self.pool}")
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise JaxrouteError(f"KV block size must be a positive integer, got {self.block_size!r}")
        if self.kv_capacity < self.block_size:
            raise JaxrouteError(f"KV capacity {self.kv_capacity} tokens holds no block of {self.block_size} tokens")
        if not isinstance(self.prefix_cache_tokens, int) or self.prefix_cache_tokens < 0:
            raise JaxrouteError(f"prefix cache tokens must be a non-negative integer, got {self.prefix_cache_tokens!r}")

    @property
    def n_blocks(self) -> int:
        """KV blocks per rank."""
        return self.kv_capacity // self.block_size

    @property
    def trace_stride(self) -> int:
        return max(1, math.ceil(self.max_steps / self.trace_points))

    def num_steps(self, workload) -> int:
        return self.max_steps

    def is_done(self, st: DecodeState) -> jax.Array:
        """Every request has finished (`step` is then a no-op)."""
        return jnp.all(st.done)

    def check_params(self, params: DecodeParams, workload: DecodeWorkload | None = None) -> None:
        """Refuse ids that `lax.switch` / `lax.cond` would clamp or misread, before tracing.

        Policy, dispatch mode and arrival mode ids must name an entry; a predictor id must
        name a predictor whose fitted table is in the workload's bank (a `learned` id with a
        bank that lacks the learned slot would otherwise run the last fitted predictor).
        The cache-aware policies (br_cache, cache) need prefix caches, and caches need segments.
        """
        balance.REGISTRY.check_id(params.policy)
        if not isinstance(params.policy, jax.core.Tracer):
            ids = np.asarray(params.policy)
            bad = sorted({balance.REGISTRY.names[i] for i in ids.ravel().tolist() if i in balance.CACHE_IDS})
            if bad and self.prefix_cache_tokens == 0:
                raise JaxrouteError(f"decode policy {', '.join(bad)} needs per-rank prefix caches: its id is out of "
                                    "range for a model without them (set DecodeModel.prefix_cache_tokens > 0 and give "
                                    "the workload its segments, e.g. make_prefix_workload)")
        if self.prefix_cache_tokens > 0 and workload is not None and workload.seg_ids is None:
            raise JaxrouteError("a decode model with prefix caches needs a workload with prompt segments "
                                "(make_prefix_workload)")
        balance.DISPATCH_REGISTRY.check_id(params.dispatch)
        if params.n_active is not None:
            use = np.asarray(params.n_active)
            if np.any(use < 1) or np.any(use > self.n_workers):
                raise JaxrouteError(f"decode ranks in use must be between 1 and {self.n_workers}, got {sorted(set(use.ravel().tolist()))}")
            if workload is not None and np.any(use < self.n_workers) and np.any(np.asarray(workload.cost.parallel) != 0):
                raise JaxrouteError("fewer decode ranks in use than the model has needs --parallel independent "
                                    "(dp_ep shares the experts over every rank)")
        ARRIVAL_REGISTRY.check_id(params.arrival)
        predictors.check_kind_ids(params.predictor, None if workload is None else workload.bank)

    # ------------------------------------------------------------------ init

    def init(self, key, wl: DecodeWorkload, params: DecodeParams) -> DecodeState:
        n, g, s, p = self.n_requests, self.n_workers, self.slots, self.pool
        caching = self.prefix_cache_tokens > 0
        if caching and (wl.seg_ids is None or wl.seg_tok is None or wl.seg_len is None):
            raise JaxrouteError("a decode model with prefix caches needs a workload with prompt segments "
                                "(make_prefix_workload)")
        m1 = wl.seg_len.shape[0] if caching else 1
        key, k_arr, k_perm = jax.random.split(key, 3)
        # Per-seed variation: saturated and Poisson runs take the requests in a random order;
        # trace replays keep the trace's order and timestamps.
        perm = jnp.where(params.arrival == TRACE, jnp.arange(n), jax.random.permutation(k_perm, n))
        gaps = jax.random.exponential(k_arr, (n,)) / jnp.maximum(params.rate, 1e-12)
        poisson_t = jnp.cumsum(gaps) - gaps[0]
        arrival_t = jnp.select([params.arrival == SATURATED, params.arrival == POISSON],
                               [jnp.zeros((n,), jnp.float32), poisson_t], wl.arrival_s).astype(jnp.float32)
        f0, i0 = jnp.float32(0.0), jnp.int32(0)
        return DecodeState(
            key=key, t=f0, event=i0, steps=i0, arrival_t=arrival_t, next_in=i0,
            prompt=wl.prompt[perm], output=wl.output[perm], key_id=wl.key_id[perm],
            pool=jnp.full((p,), -1, jnp.int32), queue=jnp.full((g, n), -1, jnp.int32),
            q_head=jnp.zeros((g,), jnp.int32), q_len=jnp.zeros((g,), jnp.int32),
            q_tokens=jnp.zeros((g,), jnp.int32), rr_next=i0,
            slot_req=jnp.full((g, s), -1, jnp.int32), slot_gen=jnp.zeros((g, s), jnp.int32),
            slot_seq=jnp.zeros((g, s), jnp.int32), seq=i0, req_gen=jnp.zeros((n,), jnp.int32),
            preemptions=i0, recomputed_tokens=i0,
            admit_t=jnp.zeros((n,), jnp.float32), first_t=jnp.zeros((n,), jnp.float32),
            local=jnp.zeros((n,), bool) if wl.local_prefill is None else wl.local_prefill[perm],
            finish_t=jnp.zeros((n,), jnp.float32),
            done=jnp.zeros((n,), bool), worker_of=jnp.full((n,), -1, jnp.int32), tokens_out=i0,
            sum_imb=f0, sum_idle=f0, sum_load=f0, sum_imb_loaded=f0, steps_loaded=i0,
            sum_running=f0, sum_running_loaded=f0, kv_step_s=f0,
            busy_s=jnp.zeros((g,), jnp.float32), barrier_s=f0,
            kv_overflow=jnp.bool_(False), all_admitted_t=f0, tokens_loaded=i0,
            trace_kv=jnp.zeros((self.trace_points, g), jnp.float32),
            trace_t=jnp.zeros((self.trace_points,), jnp.float32),
            seg_ids=wl.seg_ids[perm] if caching else jnp.zeros((n, 1), jnp.int32),
            seg_tok=wl.seg_tok[perm] if caching else jnp.zeros((n, 1), jnp.int32),
            cached=jnp.zeros((g, m1), bool), last_use=jnp.zeros((g, m1), jnp.float32), cache_evictions=i0,
            prefill_tok=i0, hit_tok=i0, first_prompt_tok=i0,
        )

    # ------------------------------------------------------------------ helpers

    def hits_from(self, st: DecodeState, cached: jax.Array, ids: jax.Array) -> jax.Array:
        """Leading cached prompt tokens of requests ids [...] given their segments' flags cached [..., S],
        at most prompt - 1 (a fully cached prompt still computes its last token)."""
        _, tok = prefix_cache.leading_run(cached, st.seg_tok[ids])
        return jnp.clip(tok, 0, jnp.maximum(st.prompt[ids] - 1, 0)).astype(jnp.int32)

    def prefix_hits(self, st: DecodeState, ids: jax.Array) -> jax.Array:
        """[G, ...] each rank's cached leading prompt tokens of requests ids [...] (valid ids)."""
        return self.hits_from(st, st.cached[:, st.seg_ids[ids]], ids)

    def inserted(self, st: DecodeState, ranks: jax.Array, ids: jax.Array, mask: jax.Array) -> jax.Array:
        """[G, M+1] bool the segments of requests ids [K] on ranks [K] where mask [K] (pads left out)."""
        seg = st.seg_ids[ids]
        ok = mask[:, None] & (st.seg_tok[ids] > 0)
        m1 = st.cached.shape[1]
        rows = jnp.where(ok, ranks[:, None], self.n_workers)
        return jnp.zeros(st.cached.shape, bool).at[rows, jnp.where(ok, seg, m1)].set(True, mode="drop")

    def evict(self, cached: jax.Array, last_use: jax.Array, new: jax.Array, seg_len: jax.Array):
        """(cached, segments evicted): on every rank over its budget, the least recently used cached
        segment (ties: lowest id) goes, never one in `new` (this step's), until it fits or only those remain."""
        g = self.n_workers
        ranks = jnp.arange(g)

        def need(c):
            over = jnp.sum(jnp.where(c, seg_len[None, :], 0), axis=1) > self.prefix_cache_tokens
            return over & jnp.any(c & ~new, axis=1)

        def body(c):
            cached, n_ev = c
            go = need(cached)
            lu = jnp.where(cached & ~new, last_use, jnp.inf)
            k = jnp.argmax(cached & ~new & (lu == jnp.min(lu, axis=1, keepdims=True)), axis=1)  # lowest id
            return cached.at[ranks, k].set(cached[ranks, k] & ~go), n_ev + jnp.sum(go).astype(jnp.int32)

        return jax.lax.while_loop(lambda c: jnp.any(need(c[0])), body, (cached, jnp.int32(0)))

    def in_use(self, params: DecodeParams) -> jax.Array:
        """[G] bool ranks in use (the first params.n_active; the rest never get a request)."""
        if params.n_active is None:
            return jnp.ones((self.n_workers,), bool)
        return jnp.arange(self.n_workers) < params.n_active

    def n_in_use(self, params: DecodeParams) -> jax.Array:
        return jnp.asarray(self.n_workers if params.n_active is None else params.n_active, jnp.int32)

    def loads(self, st: DecodeState, wl: DecodeWorkload) -> jax.Array:
        """[G] float32 KV load of the active requests: Σ (s_i + j_i)."""
        active = st.slot_req >= 0
        ctx = st.prompt[jnp.maximum(st.slot_req, 0)] + st.slot_gen
        return jnp.sum(jnp.where(active, ctx, 0), axis=1).astype(jnp.float32)

    def predicted_loads(self, st: DecodeState, wl: DecodeWorkload, params: DecodeParams) -> jax.Array:
        """[G, H+1] BR-H's predicted loads L_g(k+h) of the active requests.

        A request contributes (c_i + h), c_i = s_i + j_i, times its predicted presence: 1 at h = 0,
        and (1 - p_fin) + p_fin * clip(mu_rem - h, 0, 1) for h >= 1 (it stays beyond H unless it
        ends, and then for mu_rem steps); the sum of the presence over h = 0..H-1 is
        c_hat = (1 - p_fin) H + p_fin mu_rem. Computed with per-worker bins over h (O(G S + G H)).
        """
        hzn, g = self.horizon, self.n_workers
        rid = jnp.maximum(st.slot_req, 0).reshape(-1)
        active = (st.slot_req >= 0).reshape(-1)
        gen = st.slot_gen.reshape(-1)
        feats = predictors.RequestFeatures(prompt_len=st.prompt[rid], generated=gen, key_id=st.key_id[rid],
                                           remaining=st.output[rid] - gen)
        p_fin, mu = predictors.predict(wl.bank, params.predictor, feats, hzn)
        act = active.astype(jnp.float32)
        p_fin = jnp.clip(p_fin, 0.0, 1.0) * act
        mu = jnp.maximum(mu, 0.0)
        c = (st.prompt[rid] + gen).astype(jnp.float32) * act
        worker = jnp.repeat(jnp.arange(g), self.slots)
        q = jnp.minimum(jnp.floor(mu), hzn + 1).astype(jnp.int32)  # presence 1 for h < q
        frac = jnp.where(q <= hzn, mu - jnp.floor(mu), 0.0)  # presence frac at h = q
        h = jnp.arange(hzn + 1, dtype=jnp.float32)
        zeros = jnp.zeros((g, hzn + 2), jnp.float32)
        p_bin = zeros.at[worker, q].add(p_fin)
        pc_bin = zeros.at[worker, q].add(p_fin * c)
        alive_p = (jnp.cumsum(p_bin[:, ::-1], axis=1)[:, ::-1])[:, 1:]  # Σ_{q_i > h} p_i, h = 0..H
        alive_pc = (jnp.cumsum(pc_bin[:, ::-1], axis=1)[:, ::-1])[:, 1:]
        f_p = zeros.at[worker, q].add(p_fin * frac)[:, : hzn + 1]
        f_pc = zeros.at[worker, q].add(p_fin * frac * c)[:, : hzn + 1]
        stay = zeros[:, 0].at[worker].add(act - p_fin)  # Σ (1 - p_i) over active
        stay_c = zeros[:, 0].at[worker].add((act - p_fin) * c)
        future = stay_c[:, None] + stay[:, None] * h + alive_pc + alive_p * h + f_pc + f_p * h
        now = zeros[:, 0].at[worker].add(c)
        return jnp.where(h[None, :] == 0, now[:, None], future)

    def place(self, st: DecodeState, ids: jax.Array, workers: jax.Array) -> DecodeState:
        """Put requests ids [K] into free slots of workers [K] (-1 = skip), in the given order.

        A readmitted (preempted) request resumes its generated count; admit_t and the worker are
        those of the first admission (assignment is sticky: a preempted request waits on its rank).
        """
        g = self.n_workers
        onehot = (workers[:, None] == jnp.arange(g)[None, :]) & (ids[:, None] >= 0)  # [K, G]
        rank = jnp.sum(jnp.cumsum(onehot, axis=0) * onehot, axis=1) - 1  # k-th request for its worker
        ok = jnp.any(onehot, axis=1)
        w = jnp.where(ok, workers, 0)
        free = st.slot_req[w] < 0  # [K, S] free slots of each request's worker
        hit = free & (jnp.cumsum(free, axis=1) - 1 == rank[:, None])
        slot = jnp.argmax(hit, axis=1)  # the rank-th free slot
        w_drop = jnp.where(ok, workers, g)  # out of range -> dropped by the scatter
        safe = jnp.maximum(ids, 0)
        first = ok & (st.worker_of[safe] < 0)
        rid = jnp.where(first, ids, self.n_requests)
        order = st.seq + jnp.cumsum(ok) - 1
        return dataclasses.replace(
            st,
            slot_req=st.slot_req.at[w_drop, slot].set(ids, mode="drop"),
            slot_gen=st.slot_gen.at[w_drop, slot].set(st.req_gen[safe], mode="drop"),
            slot_seq=st.slot_seq.at[w_drop, slot].set(order, mode="drop"),
            seq=st.seq + jnp.sum(ok).astype(jnp.int32),
            admit_t=st.admit_t.at[rid].set(st.t, mode="drop"),
            worker_of=st.worker_of.at[rid].set(workers, mode="drop"),
        )

    # ------------------------------------------------------------------ step

    def blocks(self, tokens: jax.Array) -> jax.Array:
        """KV blocks that hold `tokens` tokens (ceil division by the block size)."""
        return (tokens + self.block_size - 1) // self.block_size

    def queue_entries(self, st: DecodeState, n: int) -> tuple[jax.Array, jax.Array]:
        """The first n entries of every local queue [G, n] (request ids) and whether each exists."""
        j = jnp.arange(n)[None, :]
        pos = (st.q_head[:, None] + j) % self.n_requests  # a ring of N entries never overflows
        ids = jnp.take_along_axis(st.queue, pos, axis=1)
        ok = j < st.q_len[:, None]
        return jnp.where(ok, ids, -1), ok

    def step(self, st: DecodeState, wl: DecodeWorkload, params: DecodeParams) -> DecodeState:
        """One barrier step, in the order of vLLM's scheduler and BalanceRoute's dispatch: intake, preemption of
        running requests, FCFS admission from the local queues, pooled binding, the caches' insertions, one
        decode step. Each phase is its own method (a done state is held by the engine, `sim.held_step`)."""
        key, k_in, k_out = jax.random.split(st.key, 3)
        st = dataclasses.replace(st, key=key)
        ctx = self._context(st, wl, params)
        st = self._intake(st, wl, params, ctx, k_in)
        st, preempted, free_blocks = self._preempt(st)
        st, local = self._admit_local(st, preempted, free_blocks)
        st, pooled_tok, pooled_hit, pooled_prompt, ins_p = jax.lax.cond(
            ctx.pooled, lambda st: self._bind_pooled(st, wl, params, ctx, local, preempted, k_out),
            self._no_pool, st)
        st = dataclasses.replace(st, prefill_tok=st.prefill_tok + jnp.sum(local.prefill_first) + jnp.sum(pooled_tok),
                                 hit_tok=st.hit_tok + local.hit_tok + pooled_hit,
                                 first_prompt_tok=st.first_prompt_tok + local.prompt_tok + pooled_prompt)
        if self.prefix_cache_tokens > 0:
            st = self._fill_caches(st, wl, local.inserted | ins_p)
        return self._decode(st, wl, params, ctx, local.recompute + local.prefill_first + pooled_tok, local.too_big)

    def _context(self, st: DecodeState, wl: DecodeWorkload, params: DecodeParams) -> StepContext:
        """What every phase reads, taken at the step's start."""
        a, b, d = balance.score_weights(params.policy, params.alpha, params.beta, params.gamma, self.n_in_use(params),
                                        self.horizon)
        weight = jnp.float32(1.0) if params.cache_weight is None else params.cache_weight
        return StepContext(pooled=params.dispatch == balance.POOLED, use=self.in_use(params),
                           g_use=self.n_in_use(params), a=a, b=b, d=d, loads_h=self.predicted_loads(st, wl, params),
                           w_cache=jnp.where(params.policy == balance.BR_CACHE, weight, 0.0).astype(jnp.float32))

    def _intake(self, st: DecodeState, wl: DecodeWorkload, params: DecodeParams, ctx: StepContext,
                key: jax.Array) -> DecodeState:
        """Pooled mode fills the prompt pool (capacity P; the rest wait in the prefill tier, which holds their
        KV); immediate mode routes every prefill-completed request to a local queue on arrival."""
        g, p, n = self.n_workers, self.pool, self.n_requests
        n_arrived = jnp.sum(st.arrival_t <= st.t).astype(jnp.int32)
        n_pool = jnp.sum(st.pool >= 0)
        backlog = jnp.maximum(n_arrived - st.next_in, 0)
        cap_left = p - n_pool - (jnp.sum(st.q_len) if self.cap_immediate else 0)
        take = jnp.where(ctx.pooled | self.cap_immediate, jnp.clip(jnp.minimum(backlog, cap_left), 0, p), backlog)

        def intake_pooled(st):
            j = jnp.arange(p)
            new_ids = st.next_in + j - n_pool
            pool = jnp.where((j >= n_pool) & (j < n_pool + take), new_ids, st.pool)
            return dataclasses.replace(st, pool=pool, next_in=st.next_in + take)

        def intake_immediate(st):
            q_load = st.q_tokens.astype(jnp.float32)
            counts0 = (jnp.sum(st.slot_req >= 0, axis=1) + st.q_len).astype(jnp.float32)
            margins = balance.margins_of(ctx.loads_h + q_load[:, None])

            def body(c):
                i, queue, qlen, counts, kv, took, rr, k, q_tok = c
                k, sub = jax.random.split(k)
                rid = st.next_in + i
                s_i = st.prompt[rid].astype(jnp.float32)
                single = jax.vmap(lambda gg: balance.score(s_i, margins, ctx.d, gg, took[gg], ctx.a, ctx.b))(
                    jnp.arange(g))
                hit_i = None
                if self.prefix_cache_tokens > 0:
                    hit_i = self.prefix_hits(st, rid).astype(jnp.float32)  # [G]
                    miss_i = jnp.where(st.local[rid], s_i - hit_i, 0.0)
                    single = single - ctx.w_cache * miss_i
                gi = balance.choose_worker(params.policy, sub, counts, kv, rr, ctx.use, single, hit_i)
                queue = queue.at[gi, (st.q_head[gi] + qlen[gi]) % n].set(rid)
                return (i + 1, queue, qlen.at[gi].add(1), counts.at[gi].add(1.0), kv.at[gi].add(s_i),
                        took.at[gi].add(s_i), (gi + 1) % ctx.g_use, k, q_tok.at[gi].add(st.prompt[rid]))

            init = (jnp.int32(0), st.queue, st.q_len, counts0, self.loads(st, wl) + q_load,
                    jnp.zeros((g,), jnp.float32), st.rr_next, key, st.q_tokens)
            out = jax.lax.while_loop(lambda c: c[0] < take, body, init)
            return dataclasses.replace(st, queue=out[1], q_len=out[2], rr_next=out[6], next_in=st.next_in + take,
                                       q_tokens=out[8])  # exact ints (float32 sums round past 2^24 tokens)

        return jax.lax.cond(ctx.pooled, intake_pooled, intake_immediate, st)

    def _preempt(self, st: DecodeState) -> tuple[DecodeState, jax.Array, jax.Array]:
        """Running requests first (vLLM's scheduler): each needs the blocks for its next token; when a rank runs
        out, its newest requests are preempted (KV freed, recomputed on readmission) and go back to the front of
        its local queue, oldest first. Returns (state, [G] ranks that preempted, [G] blocks left free)."""
        g, n, s_n = self.n_workers, self.n_requests, self.slots
        rows = jnp.arange(g)[:, None]
        active = st.slot_req >= 0
        n_active = jnp.sum(active, axis=1)
        context = st.prompt[jnp.maximum(st.slot_req, 0)] + st.slot_gen
        need = jnp.where(active, self.blocks(context + 1), 0)
        order = jnp.argsort(jnp.where(active, st.slot_seq, jnp.iinfo(jnp.int32).max), axis=1)  # oldest first
        cum = jnp.cumsum(jnp.take_along_axis(need, order, axis=1), axis=1)
        keep_sorted = cum <= self.n_blocks
        keep = jnp.zeros((g, s_n), bool).at[rows, order].set(keep_sorted)
        evict = active & ~keep & self.preempt
        n_evict = jnp.sum(evict, axis=1)
        n_keep = n_active - n_evict
        rank_sorted = jnp.zeros((g, s_n), jnp.int32).at[rows, order].set(jnp.arange(s_n)[None, :])
        q_head = (st.q_head - n_evict) % n
        dest = jnp.where(evict, (q_head[:, None] + rank_sorted - n_keep[:, None]) % n, n)
        evicted_ids = jnp.where(evict, st.slot_req, n)
        st = dataclasses.replace(
            st,
            queue=st.queue.at[rows, dest].set(st.slot_req, mode="drop"),
            q_head=q_head, q_len=st.q_len + n_evict,
            q_tokens=st.q_tokens + jnp.sum(jnp.where(evict, st.prompt[jnp.maximum(st.slot_req, 0)], 0), axis=1),
            req_gen=st.req_gen.at[evicted_ids].set(st.slot_gen, mode="drop"),
            slot_req=jnp.where(evict, -1, st.slot_req), slot_gen=jnp.where(evict, 0, st.slot_gen),
            preemptions=st.preemptions + jnp.sum(n_evict),
        )
        free_blocks = self.n_blocks - jnp.sum(jnp.where(evict, 0, need), axis=1)  # the kept requests' blocks
        return st, n_evict > 0, free_blocks

    def _admit_local(self, st: DecodeState, preempted: jax.Array, free_blocks: jax.Array
                     ) -> tuple[DecodeState, LocalAdmission]:
        """FCFS admission from each local queue with head-of-line blocking, at most R_max per step, into free
        slots, if the blocks for the prompt (plus tokens generated before a preemption, recomputed now) and the
        next token fit; none on a rank that just preempted."""
        g, n, s_n = self.n_workers, self.n_requests, self.slots
        rows = jnp.arange(g)[:, None]
        n_active = jnp.sum(st.slot_req >= 0, axis=1)
        free = jnp.where(preempted, 0, jnp.minimum(s_n - n_active, self.r_max))
        head, ok = self.queue_entries(st, self.r_max)
        hid = jnp.maximum(head, 0)
        h_gen = st.req_gen[hid]
        h_need = self.blocks(st.prompt[hid] + h_gen + 1)
        j = jnp.arange(self.r_max)[None, :]
        fits = jnp.cumsum(jnp.where(ok, h_need, 0), axis=1) <= free_blocks[:, None]
        admit = ok & (j < free[:, None]) & jnp.cumprod(fits, axis=1).astype(bool)
        n_adm = jnp.sum(admit, axis=1)
        pool_need = self.blocks(st.prompt[jnp.maximum(st.pool, 0)] + 1)
        too_big = (jnp.any(ok[:, :1] & (h_need[:, :1] > self.n_blocks))  # a request that can never fit
                   | jnp.any((st.pool >= 0) & (pool_need > self.n_blocks)))
        recompute = jnp.sum(jnp.where(admit & (h_gen > 0), st.prompt[hid] + h_gen, 0), axis=1)
        first_local = admit & st.local[hid] & (st.worker_of[hid] < 0)  # prefilled here, in this step
        if self.prefix_cache_tokens > 0:  # each head entry's hit on its own rank
            hit_q = jnp.where(first_local, self.hits_from(st, st.cached[rows[:, :, None], st.seg_ids[hid]], hid), 0)
            ins = self.inserted(st, jnp.broadcast_to(rows, hid.shape).reshape(-1), hid.reshape(-1),
                                first_local.reshape(-1))
        else:
            hit_q = jnp.zeros(hid.shape, jnp.int32)
            ins = jnp.zeros(st.cached.shape, bool)
        prefill_first = jnp.sum(jnp.where(first_local, st.prompt[hid] - hit_q, 0), axis=1)
        st = self.place(st, jnp.where(admit, head, -1).reshape(-1), jnp.where(admit, rows, -1).reshape(-1))
        st = dataclasses.replace(st, q_head=(st.q_head + n_adm) % n, q_len=st.q_len - n_adm,
                                 q_tokens=st.q_tokens - jnp.sum(jnp.where(admit, st.prompt[hid], 0), axis=1),
                                 recomputed_tokens=st.recomputed_tokens + jnp.sum(recompute))
        return st, LocalAdmission(
            free=free - n_adm, free_blocks=free_blocks - jnp.sum(jnp.where(admit, h_need, 0), axis=1),
            admitted=n_adm, running_before=n_active, recompute=recompute, prefill_first=prefill_first,
            hit_tok=jnp.sum(hit_q), prompt_tok=jnp.sum(jnp.where(first_local, st.prompt[hid], 0)), inserted=ins,
            too_big=too_big)

    def _bind_pooled(self, st: DecodeState, wl: DecodeWorkload, params: DecodeParams, ctx: StepContext,
                     local: LocalAdmission, preempted: jax.Array, key: jax.Array):
        """Pooled binding (BalanceRoute's two stages, or a baseline's worker choice, oldest first) into what the
        local queues left: only ranks whose local queue is empty may take new requests. Returns (state, [G]
        prompt tokens prefilled here, hit tokens, their prompt tokens, [G, M] cache insertions)."""
        g, p = self.n_workers, self.pool
        caching = self.prefix_cache_tokens > 0
        free_p = jnp.where((st.q_len == 0) & ~preempted & ctx.use, local.free, 0)
        valid = st.pool >= 0
        pid = jnp.maximum(st.pool, 0)
        pool_s = jnp.where(valid, st.prompt[pid], 0).astype(jnp.float32)
        pool_need = jnp.where(valid, self.blocks(st.prompt[pid] + 1) * self.block_size, 0).astype(jnp.float32)
        room = (local.free_blocks * self.block_size).astype(jnp.float32)
        is_br = (params.policy == balance.BR0) | (params.policy == balance.BRH) | (params.policy == balance.BR_CACHE)
        counts = local.running_before.astype(jnp.float32) + local.admitted
        first_p = valid & st.local[pid] & (st.worker_of[pid] < 0)
        if caching:
            hit_p = self.prefix_hits(st, pid).T  # [P, G] on the cache at the step's start
            miss = jnp.where(first_p[:, None], st.prompt[pid][:, None] - hit_p, 0).astype(jnp.float32)
        else:
            hit_p = miss = None

        def br(_):
            return balance.balance_dispatch(pool_s, valid, ctx.loads_h, free_p, room, ctx.a, ctx.b, ctx.d, self.window,
                                            g * self.r_max, pool_need=pool_need, miss=miss,
                                            miss_weight=ctx.w_cache), st.rr_next

        def fifo(_):
            return balance.fifo_dispatch(params.policy, key, pool_s, valid, counts, self.loads(st, wl),
                                         st.rr_next, free_p, room, g * self.r_max, pool_need=pool_need,
                                         cached=None if hit_p is None else hit_p.astype(jnp.float32))

        assign, rr = jax.lax.cond(is_br, br, fifo, None)
        bound_local = (assign >= 0) & first_p
        hit_b = (jnp.where(bound_local, hit_p[jnp.arange(p), jnp.maximum(assign, 0)], 0) if caching
                 else jnp.zeros((p,), jnp.int32))
        local_tok = jnp.zeros((g,), jnp.int32).at[jnp.where(bound_local, assign, g)].add(
            st.prompt[pid] - hit_b, mode="drop")
        ins_p = self.inserted(st, assign, pid, bound_local) if caching else jnp.zeros(st.cached.shape, bool)
        hit_tok, prompt_tok = jnp.sum(hit_b), jnp.sum(jnp.where(bound_local, st.prompt[pid], 0))
        st = self.place(st, jnp.where(assign >= 0, st.pool, -1), assign)
        left = jnp.where(assign >= 0, -1, st.pool)
        return dataclasses.replace(st, pool=compact(left), rr_next=rr), local_tok, hit_tok, prompt_tok, ins_p

    def _no_pool(self, st: DecodeState):
        """`_bind_pooled`'s result in immediate mode: nothing bound."""
        zero = jnp.int32(0)
        return st, jnp.zeros((self.n_workers,), jnp.int32), zero, zero, jnp.zeros(st.cached.shape, bool)

    def _fill_caches(self, st: DecodeState, wl: DecodeWorkload, ins: jax.Array) -> DecodeState:
        """This step's admissions fill their ranks' caches, then LRU eviction to the budget."""
        last_use = jnp.where(ins, st.t, st.last_use)
        cached, n_ev = self.evict(st.cached | ins, last_use, ins, wl.seg_len)
        return dataclasses.replace(st, cached=cached, last_use=last_use, cache_evictions=st.cache_evictions + n_ev)

    def _decode(self, st: DecodeState, wl: DecodeWorkload, params: DecodeParams, ctx: StepContext,
                prefill_now: jax.Array, too_big: jax.Array) -> DecodeState:
        """One decode step behind the barrier (or a jump to the next arrival when idle), and its statistics."""
        n = self.n_requests
        use, g_use = ctx.use, ctx.g_use
        active = st.slot_req >= 0
        n_act = jnp.sum(active, axis=1)
        load = self.loads(st, wl)
        any_active = jnp.any(active)

        def step_times(kv):
            barrier, per_worker = cost_models.dp_step_times(wl.cost, n_act.astype(jnp.float32), kv,
                                                            prefill_now.astype(jnp.float32))
            per_worker = jnp.where(use, per_worker, 0.0)
            if params.n_active is not None:  # independent ranks (check_params): the barrier of the ranks in use
                barrier = jnp.max(per_worker)
            return barrier, per_worker

        # the step and its KV-proportional part: d barrier / d s with every rank's KV scaled by s, at s = 1
        (barrier, per_worker), (kv_part, _) = jax.jvp(step_times, (load,), (load,))
        dt = jnp.where(any_active, barrier + wl.collective_s, 0.0)
        t_end = st.t + dt
        gen = st.slot_gen + active
        out_len = st.output[jnp.maximum(st.slot_req, 0)]
        fin = active & (gen >= out_len)
        fin_ids = jnp.where(fin, st.slot_req, n).reshape(-1)
        m_load = jnp.max(load)  # ranks not in use hold nothing
        imb = m_load - jnp.min(jnp.where(use, load, jnp.inf))
        idle = g_use * m_load - jnp.sum(load)
        first_ids = jnp.where(active & (st.slot_gen == 0), st.slot_req, n).reshape(-1)  # first token ever
        blocks_after = jnp.sum(jnp.where(active, self.blocks(st.prompt[jnp.maximum(st.slot_req, 0)] + gen), 0), axis=1)
        emitted = jnp.sum(active).astype(jnp.int32)

        # idle jump: the next request not yet in the proxy
        next_t = st.arrival_t[jnp.minimum(st.next_in, n - 1)]
        nothing_waiting = (jnp.sum(st.pool >= 0) + jnp.sum(st.q_len)) == 0
        jump = ~any_active & nothing_waiting & (st.next_in < n)
        t_new = jnp.where(any_active, t_end, jnp.where(jump, jnp.maximum(st.t, next_t), st.t))

        all_in = (st.next_in >= n) & nothing_waiting
        first_all_in = all_in & (st.all_admitted_t == 0) & (st.tokens_loaded == 0)
        stride = self.trace_stride
        rec = any_active & (st.steps % stride == 0) & (st.steps // stride < self.trace_points)
        ti = jnp.where(rec, st.steps // stride, self.trace_points)
        w = any_active.astype(jnp.float32)
        return dataclasses.replace(
            st,
            t=t_new,
            event=st.event + 1,
            steps=st.steps + any_active.astype(jnp.int32),
            slot_gen=jnp.where(fin, 0, gen),
            slot_req=jnp.where(fin, -1, st.slot_req),
            finish_t=st.finish_t.at[fin_ids].set(t_end, mode="drop"),
            done=st.done.at[fin_ids].set(True, mode="drop"),
            tokens_out=st.tokens_out + emitted,
            sum_imb=st.sum_imb + w * imb,
            sum_idle=st.sum_idle + w * idle,
            sum_load=st.sum_load + w * jnp.sum(load) / g_use,
            first_t=st.first_t.at[first_ids].set(t_end, mode="drop"),
            sum_imb_loaded=st.sum_imb_loaded + jnp.where(all_in, 0.0, w * imb),
            steps_loaded=st.steps_loaded + (any_active & ~all_in).astype(jnp.int32),
            sum_running=st.sum_running + w * jnp.sum(n_act),
            sum_running_loaded=st.sum_running_loaded + jnp.where(all_in, 0.0, w * jnp.sum(n_act)),
            kv_step_s=st.kv_step_s + w * kv_part,
            busy_s=st.busy_s + jnp.where(any_active, per_worker, 0.0),
            barrier_s=st.barrier_s + dt,
            kv_overflow=st.kv_overflow | too_big | jnp.any(blocks_after > self.n_blocks),
            all_admitted_t=jnp.where(first_all_in, st.t, st.all_admitted_t),
            tokens_loaded=jnp.where(first_all_in, st.tokens_out, st.tokens_loaded),
            trace_kv=st.trace_kv.at[ti].set(load, mode="drop"),
            trace_t=st.trace_t.at[ti].set(st.t, mode="drop"),
        )

    # ------------------------------------------------------------------ metrics

    def metrics(self, st: DecodeState, wl: DecodeWorkload, params: DecodeParams) -> dict[str, jax.Array]:
        steps = jnp.maximum(st.steps, 1).astype(jnp.float32)
        done = st.done
        tpot = (st.finish_t - st.admit_t) / st.output.astype(jnp.float32)
        makespan = jnp.max(jnp.where(done, st.finish_t, 0.0))
        running = st.slot_req >= 0
        in_flight = (jnp.sum(st.pool >= 0) + jnp.sum(st.q_len) + jnp.sum(running)).astype(jnp.int32)
        req_err = jnp.abs(st.next_in - (jnp.sum(done).astype(jnp.int32) + in_flight))
        out_done = jnp.sum(jnp.where(done, st.output, 0))
        is_running = jnp.zeros((self.n_requests,), bool).at[jnp.where(running, st.slot_req, self.n_requests)].set(
            True, mode="drop")
        waiting_gen = jnp.sum(jnp.where(~done & ~is_running, st.req_gen, 0))  # preempted, waiting to resume
        tok_err = jnp.abs(st.tokens_out - (out_done + jnp.sum(st.slot_gen) + waiting_gen))
        incomplete = ~jnp.all(done)
        util = st.busy_s / jnp.maximum(st.barrier_s, 1e-12)
        use = self.in_use(params)
        loaded_t = jnp.where(st.all_admitted_t > 0, st.all_admitted_t, makespan)
        loaded_tok = jnp.where(st.all_admitted_t > 0, st.tokens_loaded, st.tokens_out)
        loaded_steps = jnp.where(st.all_admitted_t > 0, st.steps_loaded, st.steps)
        done_loaded = done & (st.finish_t <= loaded_t)
        out = {
            "imbalance_tokens": st.sum_imb / steps,
            "barrier_idle_tokens": st.sum_idle / steps,
            "imbalance_loaded_tokens": st.sum_imb_loaded / jnp.maximum(st.steps_loaded, 1).astype(jnp.float32),
            "mean_load_tokens": st.sum_load / steps,
            # concurrency and the step's make-up, from the run: requests running per rank in use (mean over
            # barrier steps; loaded: until the last request is admitted), the share of slots they fill, and the
            # share of decode time that scales with KV (the barrier's KV-proportional seconds over all step seconds)
            "running_per_worker": st.sum_running / (steps * self.n_in_use(params)),
            "running_per_worker_loaded": st.sum_running_loaded
            / (jnp.maximum(st.steps_loaded, 1).astype(jnp.float32) * self.n_in_use(params)),
            "slots_in_use": st.sum_running / (steps * self.n_in_use(params) * self.slots),
            "kv_share_of_step": st.kv_step_s / jnp.maximum(st.barrier_s, 1e-12),
            "tpot_p95_s": metrics.masked_quantile(tpot, done, 0.95),
            "tpot_mean_s": metrics.masked_mean(tpot, done),
            "tpot_p90_s": metrics.masked_quantile(tpot, done, 0.9),
            # from the request's arrival at the pool (its prefill done) to its first token
            "ttft_p90_s": metrics.masked_quantile(jnp.where(done, st.first_t - st.arrival_t, 0.0), done, 0.9),
            "tpot_p95_loaded_s": metrics.masked_quantile(tpot, done_loaded, 0.95),  # over requests done by then
            "completed_loaded": jnp.sum(done_loaded).astype(jnp.int32),
            "tokens_per_step": st.tokens_out.astype(jnp.float32) / steps,
            "tokens_per_step_loaded": loaded_tok.astype(jnp.float32) / jnp.maximum(loaded_steps, 1).astype(jnp.float32),
            "preemptions": st.preemptions,
            "recomputed_tokens": st.recomputed_tokens,
            "throughput_tok_s": st.tokens_out.astype(jnp.float32) / jnp.maximum(makespan, 1e-9),
            "throughput_loaded_tok_s": loaded_tok.astype(jnp.float32) / jnp.maximum(loaded_t, 1e-9),
            "makespan_s": makespan,
            "steps": st.steps,
            "mean_step_s": st.barrier_s / steps,
            "util_mean": jnp.sum(jnp.where(use, util, 0.0)) / self.n_in_use(params),
            "util_min": jnp.min(jnp.where(use, util, jnp.inf)),
            "worker_util": util,
            "completed": jnp.sum(done).astype(jnp.int32),
            "overflow_kv": st.kv_overflow,
            "overflow_steps": incomplete,
            "overflow": st.kv_overflow | incomplete,
            "conservation_error": (req_err + tok_err).astype(jnp.int32),
            "request_worker": st.worker_of,
            "request_admit_s": st.admit_t,
            "request_finish_s": jnp.where(done, st.finish_t, -1.0),
            "request_first_s": jnp.where(done, st.first_t, -1.0),
            "trace_kv": st.trace_kv,
            "trace_t": st.trace_t,
            "prefill_tokens": st.prefill_tok,
            "hit_rate": st.hit_tok.astype(jnp.float32) / jnp.maximum(st.first_prompt_tok, 1).astype(jnp.float32),
            "cache_evictions": st.cache_evictions,
        }
        return out


def compact(ids: jax.Array) -> jax.Array:
    """Move the valid (>= 0) entries of ids [..., P] to the front, keeping their order."""
    valid = ids >= 0
    dest = jnp.where(valid, jnp.cumsum(valid, axis=-1) - 1, ids.shape[-1])
    out = jnp.full(ids.shape, -1, ids.dtype)
    if ids.ndim == 1:
        return out.at[dest].set(ids, mode="drop")
    rows = jnp.arange(ids.shape[0])[:, None]
    return out.at[rows, dest].set(ids, mode="drop")


# --------------------------------------------------------------------------- sizing helpers


def step_budget(req: DecodeRequests, n_workers: int, slots: int, r_max: int, arrival: str,
                rate: float = 1.0, min_step_s: float = 1e-3, slack: float = 1.1) -> int:
    """A static upper bound on the events one run needs (runs that exceed it flag overflow_steps).

    Saturated: loaded steps (total tokens / all slots, widened for the busiest worker of a random
    spread) plus admission-limited steps plus the longest request (the drain), with slack.
    Poisson/trace: also the arrival span divided by the shortest possible step; capped by the
    all-serial bound (one request at a time, plus one idle jump per request).
    """
    out = np.asarray(req.output_tokens)
    span = 0.0 if arrival == "saturated" else (float(req.arrival_s[-1]) if arrival == "trace"
                                               else len(out) / max(rate, 1e-9) * 1.5)
    return step_bound(out, n_workers, slots, r_max, span, min_step_s, slack)


def step_bound(output_tokens, n_workers: int, slots: int, r_max: int, span_s: float = 0.0, min_step_s: float = 1e-3,
               slack: float = 1.1) -> int:
    """`step_budget` from the output lengths and the span over which requests arrive (0 = all at once)."""
    out = np.asarray(output_tokens)
    n = len(out)
    # a router that spreads requests at random loads its busiest worker above the mean by about sqrt(G / n)
    # of it (binomial counts): three of those keep a small run's busiest worker inside the bound
    spread = 1 + 3 * math.sqrt(n_workers / max(n, 1))
    loaded = spread * out.sum() / (n_workers * slots) + n / (n_workers * r_max)
    bound = slack * (loaded + out.max()) + 64 + span_s / min_step_s
    return int(min(bound, out.sum() + 2 * n + 64))
