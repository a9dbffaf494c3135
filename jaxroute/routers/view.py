"""What a replica-cluster router is given: static sizes, the view of the cluster, the request."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxroute import cost_models
from jaxroute.workloads.prefix import RequestTable


@dataclasses.dataclass(frozen=True)
class RouterStatic:
    """Static sizes a router's state may depend on (hashable; changing one recompiles)."""

    n_replicas: int  # G
    n_segments: int  # M + 1 (the workload's segment ids + the padding dummy)
    window: int = 0  # dispatch-window ring entries per replica (routers that keep a window; 0 = none)
    modules: tuple[str, ...] | None = None  # stateful router modules to keep (None = all; fewer = a faster step)
    policies: tuple[str, ...] | None = None  # presets a row may run (None = all; fewer = a smaller, faster step)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Request:
    """The arriving request."""

    id: jax.Array  # [] int32 index in the request table (= requests routed before it)
    segs: jax.Array  # [S] int32 segment ids in prompt order (pad = dummy)
    tok: jax.Array  # [S] int32 tokens per segment (0 = pad)
    prompt: jax.Array  # [] int32 prompt tokens
    out: jax.Array  # [] int32 output tokens
    out_seg: jax.Array  # [] int32 segment its output becomes in the cache (dummy = not kept)
    session: jax.Array  # [] int32 session id (-1 = none)
    adapter: jax.Array | None = None  # [] int32 LoRA adapter (-1 = the base model; None = no adapters)

    @classmethod
    def of(cls, table: RequestTable, i: jax.Array) -> Request:
        return cls(i, table.seg_ids[i], table.seg_tok[i], table.prompt_tok[i], table.out_tok[i], table.out_seg[i],
                   table.session[i], None if table.adapter is None else table.adapter[i])

    @property
    def all_segs(self) -> jax.Array:  # [S + 1] the prompt's segments and the output's
        return jnp.concatenate([self.segs, self.out_seg[None]])


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RouterView:
    """What the router can know about the cluster when a request arrives (possibly stale: see the model)."""

    now: jax.Array  # [] float32 time of the decision
    inflight: jax.Array  # [G] float32 requests dispatched and not finished
    tokens: jax.Array  # [G] float32 prompt + output tokens of those requests
    record: jax.Array  # [G, M+1] bool where the router places each segment: cache + dispatched (insert on dispatch)
    locked: jax.Array  # [G, M+1] bool segments of unfinished requests dispatched to each replica
    match_tokens: jax.Array  # [G] float32 leading prompt tokens of this request on `record`
    cached: jax.Array  # [G, M+1] bool the replicas' caches as their KV events report them (precise prefix)
    cached_match: jax.Array  # [G] float32 leading prompt tokens of this request on `cached`
    waiting: jax.Array  # [G] float32 requests in each replica's local queue (scraped metric)
    running: jax.Array  # [G] float32 requests running on each replica (scraped metric)
    kv_usage: jax.Array  # [G] float32 fraction of KV in use, Replica.kv_in_use / capacity (scraped metric)
    kv_capacity: jax.Array  # [] int32 KV tokens per replica
    cost: cost_models.CostParams  # the replicas' cost model (routers that estimate GPU time use it)
    table: RequestTable  # segment catalogue (seg_len, seg_depth); rows of requests the router dispatched
    active: jax.Array | None = None  # [G] bool replicas the router may choose (None = all); the first n_active
    #                                 of a partial cluster: only the routers of `prefix.PARTIAL_OK` honour it
    cpu_match: jax.Array | None = None  # [G] float32 leading prompt tokens on each replica's cache and CPU offload
    #                                    tier together, as KV events report them (None = no tiers: `cached_match`)
    shared_match: jax.Array | None = None  # [G] float32 the same over the shared tier too (None = no tiers)
    lora_running: jax.Array | None = None  # [G] bool the request's adapter runs on the replica (None = no adapters)
    lora_waiting: jax.Array | None = None  # [G] bool it only waits there
    lora_room: jax.Array | None = None  # [G] bool running + waiting adapters there < the replica's adapter slots
    routing: jax.Array | None = None  # [] bool the decision is used (None = always); False where a batched step
    #                                   computes the routing branch of an event that is not an arrival: routers
    #                                   with data-dependent loops skip them (their trips would set the batch's)
