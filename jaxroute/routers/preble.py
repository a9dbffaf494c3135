"""Preble E2 (WukLab/preble `preble/global_scheduler_with_time.py`; lecture 3.2-3.4).

Rule: cached = longest match on the router's record, missed = prompt - cached. cached > missed ->
exploit: the lowest load cost L + M + P among the replicas holding the longest match; else explore:
the lowest L + M + P overall. Then post-hoc rebalancing: if the chosen replica's window load L >
e2_th_bal x the lightest replica's L, the lightest. Autoscaling and the prefill/decode pairing rule
are not modeled.

Load cost, in GPU seconds from the cost model, per replica i:
- L_i: over the requests dispatched to i in the last `e2_window_s` seconds, the prefill time of their
  missed tokens (fixed at dispatch) + single-request decode time at their prompt length x the window's
  mean output length (Preble's estimate; the mean is over the window's dispatched requests' true
  output lengths, where Preble uses measured ones). Kept incrementally: a ring of recent dispatches per
  replica (`RouterStatic.window` entries) with running sums, added on dispatch and subtracted when an
  entry leaves the window (`on_refresh`); a full ring drops its oldest live entry and sets
  `e2_ring_overflow`. Size it with `default_window`.
- M_i: eviction cost on the router's record of i (cached + dispatched segments). Capacity model: the
  record's tokens + this request's missed tokens on i must fit `kv_capacity` (running requests'
  private KV and output reservations are ignored). Evictable: recorded segments that no unfinished
  request dispatched to i contains and that are not in this prompt, in order of the router's last
  dispatch of the segment to i (then deeper first, then id), whole segments until the deficit is
  covered (`clusters.prefix_cache.evict_lru`: one step per evicted segment, no sort). Each costs its
  prefill time (no context) x its hit rate: the share of i's window requests whose prompt contains it
  (hit counts per (replica, segment) kept incrementally with the ring).
- P_i: prefill time of this request's missed part on i (on top of its match there).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from jaxroute import cost_models
from jaxroute.clusters.prefix_cache import evict_lru
from jaxroute.errors import JaxrouteError
from jaxroute.routers import parts
from jaxroute.routers.view import Request, RouterStatic, RouterView

INF = jnp.inf


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Params:
    e2_window_s: jax.Array  # [] float32 load window H (seconds)
    e2_th_bal: jax.Array  # [] float32 rebalancing threshold Th_bal (inf = no rebalancing)


def make_params(e2_window_s=180.0, e2_th_bal=1.5) -> Params:
    if not e2_window_s > 0:
        raise JaxrouteError(f"the Preble E2 window must be > 0 seconds, got {e2_window_s}")
    if not e2_th_bal >= 1:
        raise JaxrouteError(f"the Preble E2 rebalancing threshold must be >= 1, got {e2_th_bal}")
    return Params(jnp.float32(e2_window_s), jnp.float32(e2_th_bal))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    time: jax.Array  # [G, K] float32 dispatch time of each ring entry
    pre: jax.Array  # [G, K] float32 prefill seconds of its missed tokens
    dec: jax.Array  # [G, K] float32 single-request decode step seconds at its prompt length
    out: jax.Array  # [G, K] int32 its output tokens
    rid: jax.Array  # [G, K] int32 its request id
    head: jax.Array  # [G] int32 oldest entry
    count: jax.Array  # [G] int32 entries in the window
    sum_pre: jax.Array  # [G] float32 sum of `pre` over the window
    sum_dec: jax.Array  # [G] float32 sum of `dec` over the window
    sum_out: jax.Array  # [G] int32 sum of `out` over the window
    hits: jax.Array  # [G, M+1] int32 window requests whose prompt contains the segment
    last: jax.Array  # [G, M+1] float32 last dispatch of the segment to the replica (eviction order)
    overflow: jax.Array  # [] bool a live entry was dropped from a full ring


def init(static: RouterStatic) -> State | None:
    """None when the ring is 0 (E2 not modeled: `check` refuses a preble_e2 row then)."""
    G, K, m1 = static.n_replicas, static.window, static.n_segments
    if K == 0:
        return None
    f = lambda shape, v: jnp.full(shape, v, jnp.float32)
    i = lambda shape, v: jnp.full(shape, v, jnp.int32)
    return State(f((G, K), -INF), f((G, K), 0.0), f((G, K), 0.0), i((G, K), 0), i((G, K), 0), i((G,), 0),
                 i((G,), 0), f((G,), 0.0), f((G,), 0.0), i((G,), 0), i((G, m1), 0), f((G, m1), -INF),
                 jnp.bool_(False))


def default_window(rate: float, window_s: float, n_replicas: int, n_requests: int) -> int:
    """Window entries per replica to start from: 4 x the requests an even share gets in one window at
    `rate` (traces replaying recorded times pass rate <= 0: all requests), at least 64, at most all
    requests (`e2_ring_overflow` says when it was too small: double it and rerun)."""
    if rate <= 0 or not math.isfinite(window_s):
        return int(n_requests)
    return int(min(n_requests, max(64, 4 * math.ceil(rate * window_s / n_replicas))))


def check(static: RouterStatic) -> None:
    if static.window < 1:
        raise JaxrouteError("preble_e2 needs its window ring: build the model with router_window >= 1 "
                            "(see routers.preble.default_window)")


def _pop(s: State, pop: jax.Array, view: RouterView) -> State:
    """Remove the oldest entry of every replica in `pop` [G] from the window."""
    ar = jnp.arange(pop.shape[0])
    h = s.head
    rid = s.rid[ar, h]
    segs, tok = view.table.seg_ids[rid], view.table.seg_tok[rid]  # [G, S]
    hits = s.hits.at[ar[:, None], segs].add(-(pop[:, None] & (tok > 0)).astype(jnp.int32))
    count = s.count - pop
    empty = count == 0  # an empty window sums to exactly 0 (no rounding residue)
    sum_pre = jnp.where(empty, 0.0, s.sum_pre - jnp.where(pop, s.pre[ar, h], 0.0))
    sum_dec = jnp.where(empty, 0.0, s.sum_dec - jnp.where(pop, s.dec[ar, h], 0.0))
    return dataclasses.replace(s, hits=hits, count=count, sum_pre=sum_pre, sum_dec=sum_dec,
                               sum_out=s.sum_out - jnp.where(pop, s.out[ar, h], 0),
                               head=jnp.where(pop, (h + 1) % s.time.shape[1], h))


def on_refresh(s: State | None, view: RouterView, active: jax.Array, p: Params) -> State | None:
    """Expire the entries that left the window by `view.now` (only when `active`)."""
    if s is None:
        return None
    ar = jnp.arange(s.count.shape[0])

    def expired(s):
        return active & (s.count > 0) & (view.now - s.time[ar, s.head] >= p.e2_window_s)

    return jax.lax.while_loop(lambda s: jnp.any(expired(s)), lambda s: _pop(s, expired(s), view), s)


def _prefill_missed(view: RouterView, req: Request) -> jax.Array:
    """[G] prefill seconds of the request's missed part on each replica (P)."""
    match = view.match_tokens
    missed = req.prompt.astype(jnp.float32) - match
    return jax.vmap(lambda n, c: cost_models.prefill_time(view.cost, n, c))(missed, match)


def costs(s: State, view: RouterView, req: Request) -> tuple[jax.Array, jax.Array]:
    """(L [G], M + P [G]) for the request (see the module docstring)."""
    seg_len, cap = view.table.seg_len, view.kv_capacity
    mean_out = jnp.sum(s.sum_out).astype(jnp.float32) / jnp.maximum(jnp.sum(s.count), 1).astype(jnp.float32)
    load = s.sum_pre + s.sum_dec * mean_out
    p_cost = _prefill_missed(view, req)
    missed = req.prompt.astype(jnp.float32) - view.match_tokens
    hit_rate = s.hits.astype(jnp.float32) / jnp.maximum(s.count, 1).astype(jnp.float32)[:, None]
    seg_cost = jax.vmap(lambda n: cost_models.prefill_time(view.cost, n))(seg_len.astype(jnp.float32))
    in_req = jnp.zeros(seg_len.shape, bool).at[req.segs].set(True)
    evictable = view.record & ~view.locked & (seg_len > 0) & ~in_req
    deficit = jnp.sum(view.record * seg_len, axis=1).astype(jnp.float32) + missed - cap.astype(jnp.float32)

    def evict_cost(ev, last, hr, d):  # LRU order on the router's own dispatch times
        return evict_lru(ev, last, view.table.seg_depth, seg_len, d, seg_cost * hr)[2]

    return load, jax.vmap(evict_cost)(evictable, s.last, hit_rate, deficit) + p_cost


def rule(load: jax.Array, extra: jax.Array, match: jax.Array, prompt: jax.Array, p: Params) -> jax.Array:
    """E2's decision from its costs: L [G], M + P [G], match tokens [G], prompt tokens []. Exploit
    filters to the holders of the longest match; the picker is argmax of -(L + M + P) (ties -> lowest
    index); rebalancing then overrides it with the lightest L (ties -> lowest index)."""
    cost = load + extra
    cached = jnp.max(match)
    exploit = cached > prompt - cached
    g = parts.argmax(parts.keep(-cost, (match == cached) | ~exploit))
    lightest = parts.argmax(-load)
    return jnp.where(load[g] > p.e2_th_bal * load[lightest], lightest, g)


def choose(s: State | None, view: RouterView, req: Request, p, key) -> jax.Array:
    if s is None:  # not modeled: refused on the host (`check`) and flagged in the run
        return parts.argmax(parts.fewest_requests(view, req))
    load, extra = costs(s, view, req)
    return rule(load, extra, view.match_tokens, req.prompt.astype(jnp.float32), p)


def on_dispatch(s: State | None, view: RouterView, req: Request, g: jax.Array, active: jax.Array,
                p: Params) -> State | None:
    """Add the dispatch to replica g's window (a full ring first drops its oldest entry: overflow)."""
    if s is None:
        return None
    K = s.time.shape[1]
    full = active & (s.count[g] == K)
    s = _pop(s, jnp.zeros_like(s.count, bool).at[g].set(full), view)
    slot = (s.head[g] + s.count[g]) % K
    pre = _prefill_missed(view, req)[g]
    dec = cost_models.decode_step_time(view.cost, 1.0, req.prompt.astype(jnp.float32))
    put = lambda x, v: x.at[g, slot].set(jnp.where(active, v, x[g, slot]))
    add = lambda x, v: x.at[g].add(jnp.where(active, v, 0))
    segs, all_segs = req.segs, req.all_segs
    return dataclasses.replace(
        s, time=put(s.time, view.now), pre=put(s.pre, pre), dec=put(s.dec, dec), out=put(s.out, req.out),
        rid=put(s.rid, req.id), count=add(s.count, 1), sum_pre=add(s.sum_pre, pre), sum_dec=add(s.sum_dec, dec),
        sum_out=add(s.sum_out, req.out),
        hits=s.hits.at[g, segs].add((active & (req.tok > 0)).astype(jnp.int32)),
        last=s.last.at[g, all_segs].set(jnp.where(active, view.now, s.last[g, all_segs])),
        overflow=s.overflow | full)


def flags(s: State | None) -> dict[str, jax.Array]:
    """e2_ring_overflow: a live window entry was dropped (or the ring is 0: E2 could not run)."""
    return {"e2_ring_overflow": jnp.bool_(True) if s is None else s.overflow}
