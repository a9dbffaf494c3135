"""NVIDIA Dynamo's KV router (ai-dynamo/dynamo `lib/kv-router/src/scheduling/selector.rs`, version
01690d42 as stored; `lib/kv-router/src/scheduling/config.rs` 0243c51b; the active-sequence tracker
`lib/kv-router/src/sequences/single.rs` 04df1c42).

Rule (`dynamo_kv`), per worker g, lower is better:

    cost_g = w x (P_g + prompt - ov_g x B) / B  +  A_g + new_g

- ov_g: the worker's cached prefix in blocks, from the KV-event indexer = floor(view.cached_match / B).
- P_g: active prefill tokens the router tracks on g: every dispatched request adds its uncached tokens
  (prompt - ov x B on its worker) (`single.rs` `add_request_with_prefill_tracking`) and they are
  removed at the request's first token (`mark_prefill_completed`; the model's `on_first_token` hook),
  at the latest when it is freed (`free`).
- A_g: unique active prompt blocks on g (blocks of dispatched, unfinished requests, a block shared by
  several counted once: `BlockTracker` with `router_assume_kv_reuse = true`, config.rs default), full
  blocks only (the sequence hashes of full blocks); new_g: this prompt's full blocks not active on g
  (`WorkerLoadProjection.potential_decode_blocks = active_decode_blocks + additional_active_blocks`).
  Added on dispatch, removed when the request finishes (`free`); output blocks are not tracked
  (`router_track_output_blocks = false`, config.rs default).
- w = `dyn_overlap_weight` (default 1.0): the classic `overlap_score_weight` (`logit = overlap_weight x
  potential_prefill_block + decode_block`, lib/llm/src/kv_router/scheduler.rs in releases before the
  kv-router crate). The stored selector.rs writes the same cost as `prefill_load_scale x
  max(0, (P + prompt) / B - overlap_score_credit x ov) + decode_blocks + decode_active_request_weight x
  active_requests`; with its defaults (credit 1.0, scale 1.0, config.rs `KvRouterConfig::default`) and
  the deprecated weight mapped to the scale (`apply_deprecated_overlap_score_weight_override`) it is
  this formula (the max(0) never binds: ov x B <= prompt). The per-request term is not modeled.

Picker (`selector.rs` `select_worker`): temperature 0 (config.rs default `router_temperature: 0.0`):
the lowest cost, ties uniformly at random (reservoir sampling over tied minima) = `parts.random_among_ties`
on -cost. Temperature T > 0 (`softmax_sample_entries`): uniform when all costs are equal, else
p_g proportional to exp(-(cost_g - min) / ((max - min) x T)) (costs min-max scaled before the softmax).
Older versions broke exact ties by the smallest radix-tree size and compared with a 1e-5 epsilon.
On a partial cluster (`view.active`) the min, max, argmin and both draws are over the active workers
only; inactive workers are never chosen and the picks equal a cluster of the active workers' (`parts.py`).

B = `dyn_block_tokens` (default 16, vLLM's default `--block-size`; Dynamo takes the engine's).

Segment granularity: a segment id fixes its position in every prompt (`RequestTable.seg_depth`), so the
full blocks whose last token falls in a segment are the same for every prompt holding it; a block is
active on g when its segment belongs to an unfinished request dispatched to g.

Differs from the source: no router queue (`router_queue_threshold`), no
per-request active-request term, no host/disk tiers, no expiry of stale requests (1 h). Per-request
prefill tokens are kept in a table of `SLOTS` entries keyed by request id mod SLOTS; a live entry
overwritten (more than SLOTS requests apart, both unfinished) raises `dyn_slot_overflow`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxroute.errors import JaxrouteError
from jaxroute.in_place import after
from jaxroute.loops import for_each
from jaxroute.routers import parts
from jaxroute.routers.spec import RouterModule
from jaxroute.routers.view import Request, RouterStatic, RouterView

SLOTS = 4096  # per-request prefill-token table (request id mod SLOTS)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Params:
    dyn_overlap_weight: jax.Array  # [] float32 weight of the prefill blocks against the decode blocks
    dyn_temperature: jax.Array  # [] float32 router temperature (0 = argmin, random among ties)
    dyn_block_tokens: jax.Array  # [] int32 tokens per KV block
    dyn_host_weight: jax.Array  # [] float32 credit of a block held in a replica's CPU offload tier (device: 1)
    dyn_disk_weight: jax.Array  # [] float32 credit of a block held in the shared (external) tier


def make_params(dyn_overlap_weight=1.0, dyn_temperature=0.0, dyn_block_tokens=16, dyn_host_weight=0.75,
                dyn_disk_weight=0.25) -> Params:
    if not dyn_overlap_weight >= 0:
        raise JaxrouteError(f"dyn_overlap_weight must be >= 0, got {dyn_overlap_weight}")
    if not dyn_temperature >= 0:
        raise JaxrouteError(f"dyn_temperature must be >= 0, got {dyn_temperature}")
    if not (dyn_block_tokens >= 1 and float(dyn_block_tokens).is_integer()):
        raise JaxrouteError(f"dyn_block_tokens must be a whole number >= 1, got {dyn_block_tokens}")
    if not (0 <= dyn_host_weight <= 1 and 0 <= dyn_disk_weight <= 1):
        raise JaxrouteError(f"dyn_host_weight and dyn_disk_weight must be in [0, 1], got {dyn_host_weight} and "
                            f"{dyn_disk_weight}")
    return Params(jnp.float32(dyn_overlap_weight), jnp.float32(dyn_temperature), jnp.int32(int(dyn_block_tokens)),
                  jnp.float32(dyn_host_weight), jnp.float32(dyn_disk_weight))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    count: jax.Array  # [G, M+1] int32 unfinished requests on each worker whose prompt holds the segment
    seg_blocks: jax.Array  # [M+1] int32 full blocks ending in each segment (set when first seen)
    active: jax.Array  # [G] int32 A_g: unique active prompt blocks
    prefill: jax.Array  # [G] int32 P_g: active prefill tokens
    slot_rid: jax.Array  # [SLOTS] int32 request holding the slot (-1 = free)
    slot_tok: jax.Array  # [SLOTS] int32 its prefill tokens
    overflow: jax.Array  # [] bool a live slot was overwritten


def init(static: RouterStatic) -> State:
    G, m1 = static.n_replicas, static.n_segments
    z = lambda shape: jnp.zeros(shape, jnp.int32)
    return State(z((G, m1)), z((m1,)), z((G,)), z((G,)), jnp.full((SLOTS,), -1, jnp.int32), z((SLOTS,)),
                 jnp.bool_(False))


def full_blocks(tok: jax.Array, B: jax.Array) -> jax.Array:
    """[..., S] full blocks whose last token falls in each segment."""
    tok = tok.astype(jnp.int32)
    end = jnp.cumsum(tok, axis=-1)
    return jnp.where(tok > 0, end // B - (end - tok) // B, 0)


def _new_tokens(view: RouterView, req: Request, B: jax.Array) -> jax.Array:
    """[G] prompt tokens not in each worker's cached block prefix."""
    return req.prompt - (view.cached_match.astype(jnp.int32) // B) * B


def costs(s: State, view: RouterView, req: Request, p: Params) -> jax.Array:
    """[G] float32 cost (see the module docstring)."""
    B = p.dyn_block_tokens
    prefill_blocks = (s.prefill + _new_tokens(view, req, B)).astype(jnp.float32) / B.astype(jnp.float32)
    if view.cpu_match is not None:  # lower-tier blocks past the device prefix earn a partial credit
        dev, host, ext = (x.astype(jnp.int32) // B for x in (view.cached_match, view.cpu_match, view.shared_match))
        credit = p.dyn_host_weight * (host - dev).astype(jnp.float32) + p.dyn_disk_weight * (ext - host).astype(jnp.float32)
        prefill_blocks = jnp.maximum(prefill_blocks - credit, 0.0)
    nb = full_blocks(req.tok, B)
    added = jnp.sum(jnp.where(s.count[:, req.segs] == 0, nb[None, :], 0), axis=1)
    decode_blocks = (s.active + added).astype(jnp.float32)
    return p.dyn_overlap_weight * prefill_blocks + decode_blocks


def pick(cost: jax.Array, key: jax.Array, temperature: jax.Array, active: jax.Array | None = None) -> jax.Array:
    """Dynamo's selection: T = 0 -> lowest cost, ties at random; T > 0 -> softmax on min-max scaled costs.
    `active` [G] bool: only those workers (min, max and both draws over them; None = all); the draws
    then equal a cluster of the active workers' (`parts.py`)."""
    lo, hi = parts.masked_min(cost, active), parts.masked_max(cost, active)
    span = jnp.where(hi > lo, hi - lo, 1.0)
    t = jnp.where(temperature > 0, temperature, 1.0)
    logits = parts.keep(jnp.where(hi > lo, -((cost - lo) / (span * t)), 0.0), active)
    hot = jax.random.categorical(key, logits).astype(jnp.int32)
    return jnp.where(temperature > 0, hot, parts.random_among_ties(parts.keep(-cost, active), key))


def choose(s: State, view: RouterView, req: Request, p, key) -> jax.Array:
    return pick(costs(s, view, req, p), key, p.dyn_temperature, view.active)


def on_dispatch(s: State, view: RouterView, req: Request, g: jax.Array, active: jax.Array, p: Params) -> State:
    """Add the request's prompt blocks and prefill tokens to worker g."""
    B = p.dyn_block_tokens
    nb = full_blocks(req.tok, B)
    real = req.tok > 0
    segs = req.segs
    row_old = s.count[g, segs]
    added = jnp.sum(jnp.where(active & real & (row_old == 0), nb, 0))
    count = s.count.at[g, after(segs, added)].add((active & real).astype(jnp.int32))  # after the reads: in place
    seg_blocks = s.seg_blocks.at[segs].set(jnp.where(active & real, nb, s.seg_blocks[segs]))
    tok = _new_tokens(view, req, B)[g]
    slot = req.id % SLOTS
    clash = active & (s.slot_rid[slot] >= 0)
    return State(count, seg_blocks, s.active.at[g].add(added), s.prefill.at[g].add(jnp.where(active, tok, 0)),
                 s.slot_rid.at[slot].set(jnp.where(active, req.id, s.slot_rid[slot])),
                 s.slot_tok.at[slot].set(jnp.where(active, tok, s.slot_tok[slot])), s.overflow | clash)


def on_first_token(s: State, view: RouterView, g: jax.Array, rids: jax.Array, first: jax.Array, p: Params) -> State:
    """Prefill done (`mark_prefill_completed`): release the requests' prefill tokens on worker g."""
    rid = jnp.maximum(rids, 0)
    slot = rid % SLOTS
    mine = first & (s.slot_rid[slot] == rid)
    nowhere = SLOTS
    return dataclasses.replace(
        s, prefill=s.prefill.at[g].add(-jnp.sum(jnp.where(mine, s.slot_tok[slot], 0))),
        slot_rid=s.slot_rid.at[jnp.where(mine, slot, nowhere)].set(-1, mode="drop"))


def on_finish(s: State, view: RouterView, g: jax.Array, rids: jax.Array, finished: jax.Array, p: Params) -> State:
    """Free the finished requests' blocks and prefill tokens on worker g: a loop over the finished requests,
    O(S) each (a segment whose count reaches 0 takes its blocks off the worker's active blocks)."""
    rid = jnp.maximum(rids, 0)

    def free_one(b, c):
        count, active = c
        segs, tok = view.table.seg_ids[rid[b]], view.table.seg_tok[rid[b]]
        real = tok > 0
        count = count.at[g, segs].add(-real.astype(jnp.int32))
        gone = real & (count[g, segs] == 0)
        return count, active - jnp.sum(jnp.where(gone, s.seg_blocks[segs], 0))

    count, active = for_each(finished, free_one, (s.count, s.active[g]))
    slot = rid % SLOTS
    mine = finished & (s.slot_rid[slot] == rid)
    freed_tok = jnp.sum(jnp.where(mine, s.slot_tok[slot], 0))
    nowhere = SLOTS  # out of range: no update
    return dataclasses.replace(
        s, count=count, active=s.active.at[g].set(active),
        prefill=s.prefill.at[g].add(-freed_tok),
        slot_rid=s.slot_rid.at[jnp.where(mine, slot, nowhere)].set(-1, mode="drop"))


def flags(s: State) -> dict[str, jax.Array]:
    """dyn_slot_overflow: a request's prefill-token entry was overwritten before it finished."""
    return {"dyn_slot_overflow": s.overflow}


# The contract the cluster calls (hooks as typed fields: routers/spec.py)
MODULE = RouterModule(init=init,
                      make_params=make_params,
                      on_dispatch=on_dispatch,
                      on_first_token=on_first_token,
                      on_finish=on_finish,
                      flags=flags)
