"""Traced params and state of the replica cluster (shapes: G replicas, M+1 segment ids, C cache slots per
replica, Q queue slots, B running slots, N requests)."""

from __future__ import annotations

import dataclasses

import jax

from jaxroute import cost_models
from jaxroute.clusters.replicas.adapters import LoraParams, LoraState
from jaxroute.clusters.replicas.control import ControlParams, ControlState
from jaxroute.clusters.replicas.gateway import Gateway
from jaxroute.clusters.replicas.local_queue import QueueLog
from jaxroute.clusters.replicas.tiers import TierParams, Tiers
from jaxroute.routers.prefix import RouterParams
from jaxroute.workloads.prefix import RequestTable

NO_SEGMENT_END = 2**31 - 1  # Replica.run_nend of a request with no segment left to complete (int32 max)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ReplicaParams:
    """Traced configuration of one run (every field vmappable)."""

    policy: jax.Array  # [] int32 router preset id (routers.prefix.REGISTRY)
    rate: jax.Array  # [] float32 requests/s (traces: <= 0 replays recorded times)
    stale_s: jax.Array  # [] float32 router view refresh period (0 = always fresh; > 0 needs stale_view)
    kv_capacity: jax.Array  # [] int32 KV tokens per replica
    router: RouterParams
    cost: cost_models.CostParams
    n_active: jax.Array | None = None  # [] int32 replicas in use (the first n_active; None = all n_replicas)
    control: ControlParams | None = None  # autoscaler and gateway (a model built with control=True; control.py)
    tiers: TierParams | None = None  # KV offload tiers (a model built with kv_tiers=True; tiers.py)
    lora: LoraParams | None = None  # LoRA adapters (a model built with lora_slots > 0; adapters.py)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Replica:
    """One replica's local state (a row of the cluster arrays)."""

    slot_seg: jax.Array  # [C] int32 segment cached in each slot (-1 = free); see replicas/cache.py
    slot_ref: jax.Array  # [C] int32 running requests locking the slot's segment
    slot_free: jax.Array  # [C] int32 stack of free slots (the first n_free entries)
    n_free: jax.Array  # [] int32 free slots
    slot_last: jax.Array  # [C] float32 LRU stamp of the slot's segment
    q_head: jax.Array  # [] int32 local queue (a ring, see replicas/local_queue.py): position of its front
    q_span: jax.Array  # [] int32 ring positions in use (holes left by "lpm" included)
    q_count: jax.Array  # [] int32 requests waiting locally
    run_req: jax.Array  # [B] int32 running request ids (-1 = empty slot)
    run_pos: jax.Array  # [B] int32 prefill tokens already in KV (cached + computed), up to run_tgt
    run_gen: jax.Array  # [B] int32 output tokens generated
    run_nseg: jax.Array  # [B] int32 leading prompt segments locked in the cache
    run_nend: jax.Array  # [B] int32 prompt tokens at the end of the first segment not yet completed (int32 max:
    #                     none left): the request completes a segment when its prefill reaches it
    run_res: jax.Array  # [B] int32 private KV tokens held (prompt not yet in the cache + output; "reserve"
    #                     holds the whole output from admission, "on-demand" only the tokens allocated so far)
    run_seq: jax.Array  # [B] int32 admission stamp (prefill budget order)
    run_tgt: jax.Array  # [B] int32 prefill target: prompt tokens (+ output tokens to recompute after a preemption)
    n_preempt: jax.Array  # [] int32 preemptions on this replica (on-demand admission only)
    q_cursor: jax.Array  # [] int32 local order "priority": the group whose turn is next (see iteration.py)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The stale router view (only with `stale_view`): refreshed every `stale_s` seconds. The router's
    own counters (record, in flight, tokens) add its dispatches at once; the scraped replica metrics
    (caches as KV events report them, queue, running, KV usage) change only at a refresh."""

    present: jax.Array  # [G, M+1] bool record (cache + dispatched) at the snapshot ([G, 1] when unused)
    inflight: jax.Array  # [G] float32 loads at the snapshot (+ dispatches since)
    tokens: jax.Array  # [G] float32
    time: jax.Array  # [] float32 time of the snapshot
    cached: jax.Array  # [G, M+1] bool replica caches at the snapshot ([G, 1] when unused)
    waiting: jax.Array  # [G] float32 local queue lengths at the snapshot
    running: jax.Array  # [G] float32 running requests at the snapshot
    kv_usage: jax.Array  # [G] float32 KV fraction in use at the snapshot


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ReplicaState:
    req: RequestTable  # this seed's requests
    rep: Replica  # every field with a leading [G] axis
    router: dict  # the router's own state (routers.prefix.init): the model never looks inside
    key: jax.Array  # [] the router's key (coin flips: fold_in the request id)
    next_req: jax.Array  # [] int32 index of the next arrival (= requests routed)
    now: jax.Array  # [] float32 time of the last event
    clock: jax.Array  # [G] float32 when each replica starts its next iteration (+inf = idle)
    n_admitted: jax.Array  # [] int32
    kv_used: jax.Array  # [G] int32 KV tokens in use per replica: locked cached segments + private tokens
    inflight: jax.Array  # [G] float32 requests dispatched and unfinished
    inflight_tok: jax.Array  # [G] float32 their prompt + output tokens
    view: Snapshot
    cache_index: jax.Array  # [G, M+1] int32 slot of each segment in each replica's cache (-1 = not cached)
    pending: jax.Array  # [G, M+1] int32 unfinished requests dispatched to each replica that contain the segment,
    #                     as of the previous event: the event's own changes wait in the log below
    pending_g: jax.Array  # [] int32 replica of the last event's pending changes
    pending_req: jax.Array  # [B] int32 the requests whose segments (prompt and output) change (N = none): the
    #                         one dispatched, or those finished; applied first thing in the next event
    pending_add: jax.Array  # [] int32 the change to each of their segments (+1 dispatched, -1 finished)
    cache_full: jax.Array  # [] bool a segment found its replica's slot table full (cache_slots)
    queue: jax.Array  # [G, Q] int32 local queue entries: request ids (-1 = empty or a hole)
    queue_gen: jax.Array  # [G, Q] ([G, 1] with admission "reserve") int32 output tokens a preempted request had generated
    queue_front: jax.Array  # [G, Q] ([G, 1]) int32 preemption stamp (0 = never preempted)
    queue_log: QueueLog  # the last event's writes to the queue arrays, made first thing in the next event
    copies: jax.Array  # [M+1] int32 replicas caching each segment
    cache_tok: jax.Array  # [G] int32 cached tokens per replica
    unique_tok: jax.Array  # [] int32 tokens of segments cached somewhere
    rec_replica: jax.Array  # [N] int32 (-1 = not routed)
    rec_admit: jax.Array  # [N] float32 (inf = not yet)
    rec_first: jax.Array  # [N] float32 first-token time
    rec_finish: jax.Array  # [N] float32
    rec_preempt: jax.Array  # [N] int32 times each request was preempted (on-demand admission)
    rec_cached: jax.Array  # [N] int32 prompt tokens found in the cache at admission
    rec_group: jax.Array  # [N] int32 priority group at dispatch (local order "priority"; [1] otherwise)
    rep_area: jax.Array  # [] float32 integral of the replication factor over time
    rep_time: jax.Array  # [] float32 time with a non-empty cache
    queue_area: jax.Array  # [] float32 integral over time of the requests waiting in local queues (all replicas)
    kv_area: jax.Array  # [] float32 integral over time of KV tokens in use (kv_in_use, all replicas)
    busy_s: jax.Array  # [G] float32 time each replica spent in iterations (leaped ones included)
    running_full: jax.Array  # [] bool admission ever waited only for a running slot (max_running)
    dropped: jax.Array  # [] int32 requests a full local queue refused (on dispatch or preemption): lost to that
    #                    capacity; `queue_overflow` (max_queue) is dropped > 0
    ctl: ControlState | None = None  # the control plane (control=True; control.py)
    gw: Gateway | None = None  # the flow-control gateway's queues (gateway_queue > 0; gateway.py)
    tiers: Tiers | None = None  # the KV offload tiers (kv_tiers=True; tiers.py)
    rec_tier: jax.Array | None = None  # [N, 2] int32 prompt tokens loaded from the CPU and the shared tier (kv_tiers)
    lora: LoraState | None = None  # adapter slots and counts (lora_slots > 0; adapters.py)
