"""Preble E2 (WukLab/preble `preble/global_scheduler_with_time.py`; lecture 3.2-3.4).

Rule: cached = longest match on the router's record, missed = prompt - cached. cached > missed ->
exploit: the lowest load cost L + M + P among the replicas holding the longest match; else explore:
the lowest L + M + P overall. Then post-hoc rebalancing: if the chosen replica's window load L >
e2_th_bal x the lightest replica's L, the lightest. Two more rules, each a traced switch (the
`preble` preset turns both on; `preble_e2` has both off):

- Prefill/decode pairing (`e2_pairing`; Preble's `runtime_id_with_highest_hit_rate`,
  preble/model_runtime_manager.py:422-427 and simulator.py:354-359, used in the explore branch of
  `runtime_selector`, global_scheduler_with_time.py:329-330, before the load-cost comparison): each
  replica reports its windowed hit ratio, the cached / prompt tokens of the requests it admitted in
  the last `e2_pair_window_s` = 30 s (sglang model_rpc.py `update_hit_trace`/`get_hit_ratio`,
  server_args.py:57; one entry per admitting batch, old entries dropped when a batch is added). A
  replica whose ratio is the highest and >= `e2_pair_hit` = 0.7 is decode-heavy (its requests are
  almost all cached: "decode units", idle compute); an exploring request (cached <= missed: a
  "prefill unit") goes to it. No rebalancing override of that choice. The lecture (3.4) defines the
  units per request (almost all cached = decode unit; long uncached prompt with a short output =
  prefill unit, "too many decode units" on a replica); the code's units are a replica's 30 s hit
  ratio and every explore request, whatever its output length, and that is what is modeled.
- Autoscaling of hot prefixes (`e2_autoscale`; Preble's overload detector,
  preble/ttft_overload_detector.py, used in global_scheduler_with_time.py:419-429): each replica
  keeps the TTFTs of its requests over the last `e2_overload_window_s` (3 min), keyed by the request's
  important segment (Preble's `get_important_node`: the deepest prompt segment longer than all
  segments before it together, :255-264). A prefix is overloaded on a replica when its TTFTs in the
  window's second half average >= 2x those of its first half (both halves non-empty). An exploit
  request whose chosen replica is overloaded for its prefix replicates the prefix onto the lightest
  replica (lowest L) not yet holding or allocated it (`gpu_allocations[node].add(smaller_device)`)
  and clears that detector key (`delete_after_allocation`). Later exploit requests of the prefix
  choose by load cost among the longest-match holders and the replicas it was scaled onto
  (`calculate_min_load_cost` over the node's allocation): its traffic is split by load.
  Differences from the code: Preble checks the detector only inside node stealing, when the busiest
  GPU holds a single heavy node and is >= 1.5x the lightest (:393-424); here post-hoc rebalancing
  already sends such requests to the lightest, so the detector is checked on every exploit
  decision. A data point is stamped at the request's first token (Preble: at its finish).

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
from jaxroute.loops import for_each
from jaxroute.routers import parts
from jaxroute.routers.names import DEFAULT_E2_TH_BAL, DEFAULT_E2_WINDOW_S
from jaxroute.routers.spec import RouterModule
from jaxroute.routers.view import Request, RouterStatic, RouterView

INF = jnp.inf


OVERLOAD_FACTOR = 2.0  # second-half mean TTFT >= 2 x first-half mean (ttft_overload_detector.py:63)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Params:
    e2_window_s: jax.Array  # [] float32 load window H (seconds)
    e2_th_bal: jax.Array  # [] float32 rebalancing threshold Th_bal (inf = no rebalancing)
    e2_pairing: jax.Array  # [] bool prefill/decode pairing on
    e2_autoscale: jax.Array  # [] bool autoscaling of hot prefixes on
    e2_pair_hit: jax.Array  # [] float32 windowed hit ratio that makes a replica decode-heavy
    e2_pair_window_s: jax.Array  # [] float32 the hit ratio's window (seconds)
    e2_overload_window_s: jax.Array  # [] float32 the overload detector's window (seconds)


def make_params(e2_window_s=DEFAULT_E2_WINDOW_S, e2_th_bal=DEFAULT_E2_TH_BAL, e2_pairing=False, e2_autoscale=False, e2_pair_hit=0.7,
                e2_pair_window_s=30.0, e2_overload_window_s=180.0) -> Params:
    if not e2_window_s > 0:
        raise JaxrouteError(f"the Preble E2 window must be > 0 seconds, got {e2_window_s}")
    if not e2_th_bal >= 1:
        raise JaxrouteError(f"the Preble E2 rebalancing threshold must be >= 1, got {e2_th_bal}")
    if not 0 <= e2_pair_hit <= 1:
        raise JaxrouteError(f"the pairing hit ratio must be in [0, 1], got {e2_pair_hit}")
    if not e2_pair_window_s > 0:
        raise JaxrouteError(f"the pairing window must be > 0 seconds, got {e2_pair_window_s}")
    if not e2_overload_window_s > 0:
        raise JaxrouteError(f"the overload detector's window must be > 0 seconds, got {e2_overload_window_s}")
    return Params(jnp.float32(e2_window_s), jnp.float32(e2_th_bal), jnp.bool_(e2_pairing), jnp.bool_(e2_autoscale),
                  jnp.float32(e2_pair_hit), jnp.float32(e2_pair_window_s), jnp.float32(e2_overload_window_s))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Window:
    """Per-replica ring of timestamped entries with running sums (`vals`, `sums`: one array per field)."""

    time: jax.Array  # [G, K] float32
    vals: tuple  # of [G, K] arrays
    sums: tuple  # of [G] arrays (the sums over the live entries)
    head: jax.Array  # [G] int32 oldest entry
    count: jax.Array  # [G] int32 live entries

    @classmethod
    def empty(cls, G: int, K: int, dtypes) -> Window:
        return cls(jnp.full((G, K), -INF, jnp.float32), tuple(jnp.zeros((G, K), d) for d in dtypes),
                   tuple(jnp.zeros((G,), d) for d in dtypes), jnp.zeros((G,), jnp.int32), jnp.zeros((G,), jnp.int32))

    def live(self, g) -> jax.Array:  # [K] bool entries of replica g in the window
        K = self.time.shape[1]
        return (jnp.arange(K) - self.head[g]) % K < self.count[g]

    def _pop(self, g, when) -> Window:
        h = self.head[g]
        sums = tuple(x.at[g].add(jnp.where(when, -v[g, h], 0)) for x, v in zip(self.sums, self.vals, strict=True))
        return dataclasses.replace(self, sums=sums, head=self.head.at[g].set(jnp.where(when, (h + 1) % self.time.shape[1], h)),
                                   count=self.count.at[g].add(-when.astype(jnp.int32)))

    def push(self, g, t, values, active, older_than) -> tuple[Window, jax.Array]:
        """(window, a live entry was dropped): drop g's entries with t - time > older_than, then add one
        (a full ring first drops its oldest live entry)."""
        def stale(w):
            return active & (w.count[g] > 0) & (t - w.time[g, w.head[g]] > older_than)

        w = jax.lax.while_loop(stale, lambda w: w._pop(g, stale(w)), self)
        full = active & (w.count[g] == w.time.shape[1])
        w = w._pop(g, full)
        slot = (w.head[g] + w.count[g]) % w.time.shape[1]
        put = lambda x, v: x.at[g, slot].set(jnp.where(active, v, x[g, slot]))
        return dataclasses.replace(
            w, time=put(w.time, t), vals=tuple(put(x, v) for x, v in zip(w.vals, values, strict=True)),
            sums=tuple(x.at[g].add(jnp.where(active, v, 0)) for x, v in zip(w.sums, values, strict=True)),
            count=w.count.at[g].add(active.astype(jnp.int32))), full


def important_segment(segs: jax.Array, tok: jax.Array) -> jax.Array:
    """Preble's important node of a prompt (`get_important_node`): its deepest segment with more tokens
    than all the segments before it together (the first segment always qualifies)."""
    large = (tok > jnp.cumsum(tok) - tok) & (tok > 0)
    return segs[jnp.max(jnp.where(large, jnp.arange(tok.shape[0]), 0))]


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
    hit_trace: Window  # [G, K] per admitting batch: (cached tokens int32, prompt tokens int32) (pairing)
    ttft: Window  # [G, K] per first token: (TTFT float32, important segment int32) (overload detector)
    scaled: jax.Array  # [G, M+1] bool replicas a prefix was autoscaled onto
    tally: jax.Array  # [3] float32 sums over decisions of the replica-mean L, M and P (seconds)
    counts: jax.Array  # [5] int32 decisions, exploits, rebalanced, paired, autoscaled
    terms: jax.Array  # [3, G] float32 this arrival's L, M and P per replica (`on_arrival`)
    seg: jax.Array  # [] int32 this arrival's important segment (`on_arrival`)
    seg_scaled: jax.Array  # [G] bool replicas that segment was autoscaled onto (`scaled[:, seg]`, `on_arrival`)


def init(static: RouterStatic) -> State | None:
    """None when the ring is 0 (E2 not modeled: `check` refuses a preble_e2 row then)."""
    G, K, m1 = static.n_replicas, static.window, static.n_segments
    if K == 0:
        return None
    f = lambda shape, v: jnp.full(shape, v, jnp.float32)
    i = lambda shape, v: jnp.full(shape, v, jnp.int32)
    return State(f((G, K), -INF), f((G, K), 0.0), f((G, K), 0.0), i((G, K), 0), i((G, K), 0), i((G,), 0),
                 i((G,), 0), f((G,), 0.0), f((G,), 0.0), i((G,), 0), i((G, m1), 0), f((G, m1), -INF),
                 jnp.bool_(False), Window.empty(G, K, (jnp.int32, jnp.int32)), Window.empty(G, K, (jnp.float32, jnp.int32)),
                 jnp.zeros((G, m1), bool), f((3,), 0.0), i((len(COUNTS),), 0), f((3, G), 0.0), jnp.int32(0),
                 jnp.zeros((G,), bool))


COUNTS = ("e2_decisions", "e2_exploits", "e2_rebalanced", "e2_paired", "e2_autoscaled")


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


def _load(s: State) -> jax.Array:
    """[G] L: the window's prefill seconds + decode step seconds x the window's mean output length."""
    mean_out = jnp.sum(s.sum_out).astype(jnp.float32) / jnp.maximum(jnp.sum(s.count), 1).astype(jnp.float32)
    return s.sum_pre + s.sum_dec * mean_out


def costs(s: State, view: RouterView, req: Request) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(L [G], M [G], P [G]) for the request (see the module docstring)."""
    seg_len, cap = view.table.seg_len, view.kv_capacity
    p_cost = _prefill_missed(view, req)
    missed = req.prompt.astype(jnp.float32) - view.match_tokens
    in_req = jnp.zeros(seg_len.shape, bool).at[req.segs].set(True)
    evictable = view.record & ~view.locked & (seg_len > 0) & ~in_req
    deficit = jnp.sum(view.record * seg_len, axis=1).astype(jnp.float32) + missed - cap.astype(jnp.float32)
    if view.routing is not None:  # no eviction walk for a decision that is discarded (see RouterView.routing)
        deficit = jnp.where(view.routing, deficit, 0.0)

    def evict_cost(ev, last, hits, count, d):  # LRU order on the router's own dispatch times
        def value(k):  # the segment's prefill seconds x its hit rate in the window, at the victims only
            hit_rate = hits[k].astype(jnp.float32) / jnp.maximum(count, 1).astype(jnp.float32)
            return cost_models.prefill_time(view.cost, seg_len[k].astype(jnp.float32)) * hit_rate

        return evict_lru(ev, last, view.table.seg_depth, seg_len, d, value)[2]

    return _load(s), jax.vmap(evict_cost)(evictable, s.last, s.hits, s.count, deficit), p_cost


def hit_ratios(s: State) -> jax.Array:
    """[G] each replica's windowed hit ratio (cached / prompt tokens of its recent admissions; 0 if none)."""
    hit, prompt = s.hit_trace.sums
    return jnp.where(prompt > 0, hit.astype(jnp.float32) / jnp.maximum(prompt, 1).astype(jnp.float32), 0.0)


def rule(load, extra, match, prompt, p: Params, ratios=None, scaled=None) -> tuple[jax.Array, dict]:
    """E2's decision from its costs: L [G], M + P [G], match tokens [G], prompt tokens []; with pairing,
    the replicas' windowed hit ratios [G]; with autoscaling, the replicas the prefix was scaled onto [G].
    Explore: the decode-heavy replica (highest ratio, if >= e2_pair_hit, pairing on), else the lowest
    L + M + P; exploit: the lowest L + M + P among the longest-match holders and the scaled-onto
    replicas. The picker is argmax of -(L + M + P) (ties -> lowest index); rebalancing then overrides a
    cost choice with the lightest L (ties -> lowest index). Returns (replica, what happened)."""
    G = load.shape[0]
    ratios = jnp.zeros((G,)) if ratios is None else ratios
    scaled = jnp.zeros((G,), bool) if scaled is None else scaled
    cost = load + extra
    cached = jnp.max(match)
    exploit = cached > prompt - cached
    holders = (match == cached) | (scaled & p.e2_autoscale)
    g = parts.argmax(parts.keep(-cost, holders | ~exploit))
    lightest = parts.argmax(-load)
    moved = load[g] > p.e2_th_bal * load[lightest]
    g = jnp.where(moved, lightest, g)
    heavy = jnp.argmax(ratios)
    paired = p.e2_pairing & ~exploit & (ratios[heavy] >= p.e2_pair_hit)
    return jnp.where(paired, heavy, g), dict(exploit=exploit, moved=moved & ~paired, paired=paired, lightest=lightest)


def on_arrival(s: State | None, view: RouterView, req: Request, active: jax.Array, p: Params) -> State | None:
    """The request's costs (L, M, P), important segment and the replicas it was scaled onto, kept for `choose`
    and `on_dispatch` (so the decision reads no [G, M+1] table: one inside the policy switch is copied whole)."""
    if s is None:
        return None
    seg = important_segment(req.segs, req.tok)
    return dataclasses.replace(s, terms=jnp.stack(costs(s, view, req)), seg=seg, seg_scaled=s.scaled[:, seg])


def _decide(s: State, view: RouterView, req: Request, p):
    """E2's decision on the costs `on_arrival` kept: (replica, what happened)."""
    load, evict, pre = s.terms
    return rule(load, evict + pre, view.match_tokens, req.prompt.astype(jnp.float32), p, hit_ratios(s),
                s.seg_scaled)


def choose(s: State | None, view: RouterView, req: Request, p, key) -> jax.Array:
    if s is None:  # not modeled: refused on the host (`check`) and flagged in the run
        return parts.argmax(parts.fewest_requests(view, req))
    return _decide(s, view, req, p)[0]


def overloaded(s: State, g: jax.Array, seg: jax.Array, now: jax.Array, p: Params) -> jax.Array:
    """The overload detector on replica g for prefix `seg`: mean TTFT over the window's second half >=
    OVERLOAD_FACTOR x over its first half, both halves non-empty."""
    w = s.ttft
    ttft, key = w.vals
    mine = w.live(g) & (key[g] == seg) & (now - w.time[g] <= p.e2_overload_window_s)
    late = now - w.time[g] <= 0.5 * p.e2_overload_window_s
    n1, n2 = jnp.sum(mine & ~late), jnp.sum(mine & late)
    m1 = jnp.sum(jnp.where(mine & ~late, ttft[g], 0.0)) / jnp.maximum(n1, 1).astype(jnp.float32)
    m2 = jnp.sum(jnp.where(mine & late, ttft[g], 0.0)) / jnp.maximum(n2, 1).astype(jnp.float32)
    return (n1 > 0) & (n2 > 0) & (m2 >= OVERLOAD_FACTOR * m1)


def on_dispatch(s: State | None, view: RouterView, req: Request, g: jax.Array, active: jax.Array,
                p: Params) -> State | None:
    """Add the dispatch to replica g's window (a full ring first drops its oldest entry: overflow);
    count the decision; autoscale its prefix when g is overloaded for it."""
    if s is None:
        return None
    _, what = _decide(s, view, req, p)
    terms, seg = s.terms, s.seg
    target = parts.argmax(parts.keep(-_load(s), ~(s.seg_scaled | (view.match_tokens >= jnp.max(view.match_tokens)))))
    grow = (active & p.e2_autoscale & what["exploit"] & overloaded(s, g, seg, view.now, p)
            & ~s.seg_scaled[target] & (view.match_tokens[target] < jnp.max(view.match_tokens)))
    ttft, key = s.ttft.vals
    cleared = jnp.where(grow & s.ttft.live(g) & (key[g] == seg), -1, key[g])  # delete_after_allocation
    s = dataclasses.replace(
        s, scaled=s.scaled.at[target, seg].max(grow),
        ttft=dataclasses.replace(s.ttft, vals=(ttft, key.at[g].set(cleared))),
        tally=s.tally + jnp.where(active, jnp.mean(terms, axis=1), 0.0),
        counts=s.counts + (active & jnp.stack([jnp.bool_(True), what["exploit"], what["moved"], what["paired"], grow])))
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


def on_admit(s: State | None, view: RouterView, g: jax.Array, rids: jax.Array, admitted: jax.Array,
             cached: jax.Array, p: Params) -> State | None:
    """Replica g admitted `rids[admitted]` at `view.now` with `cached` prompt tokens hit: one hit-trace entry."""
    if s is None:
        return None
    prompt = jnp.sum(jnp.where(admitted, view.table.prompt_tok[rids], 0))
    hit = jnp.sum(jnp.where(admitted, cached, 0))
    trace, full = s.hit_trace.push(g, view.now, (hit, prompt), jnp.any(admitted), p.e2_pair_window_s)
    return dataclasses.replace(s, hit_trace=trace, overflow=s.overflow | full)


def on_first_token(s: State | None, view: RouterView, g: jax.Array, rids: jax.Array, first: jax.Array,
                   p: Params) -> State | None:
    """Requests `rids[first]` got their first token at `view.now`: TTFT data points (slot order)."""
    if s is None:
        return None

    def body(k, live, c):
        w, full = c
        rid = rids[k]
        seg = important_segment(view.table.seg_ids[rid], view.table.seg_tok[rid])
        # active only while this row's loop runs: under vmap a finished row's push must not pop its window (its
        # result is discarded, but its stale-entry loop would still set the batched loop's trip count)
        w, f = w.push(g, view.now, (view.now - view.table.arrival_s[rid], seg), live, p.e2_overload_window_s)
        return w, full | f

    w, full = for_each(first, body, (s.ttft, jnp.bool_(False)), live=True)
    return dataclasses.replace(s, ttft=w, overflow=s.overflow | full)


def flags(s: State | None) -> dict[str, jax.Array]:
    """e2_ring_overflow: a live entry was dropped from a full ring (the dispatch window, the hit trace or
    the TTFT window, all `RouterStatic.window` entries per replica), or the ring is 0 (E2 could not run)."""
    return {"e2_ring_overflow": jnp.bool_(True) if s is None else s.overflow}


def stats(s: State | None) -> dict[str, jax.Array]:
    """Decision counts and the mean cost terms (seconds; each the mean over replicas, averaged over decisions)."""
    if s is None:
        return {**{k: jnp.int32(0) for k in COUNTS}, "e2_mean_L_s": jnp.float32(0), "e2_mean_M_s": jnp.float32(0),
                "e2_mean_P_s": jnp.float32(0)}
    n = jnp.maximum(s.counts[0], 1).astype(jnp.float32)
    return {**{k: s.counts[j] for j, k in enumerate(COUNTS)}, "e2_mean_L_s": s.tally[0] / n,
            "e2_mean_M_s": s.tally[1] / n, "e2_mean_P_s": s.tally[2] / n}


# The contract the cluster calls (hooks as typed fields: routers/spec.py)
MODULE = RouterModule(init=init,
                      make_params=make_params,
                      on_refresh=on_refresh,
                      on_arrival=on_arrival,
                      on_dispatch=on_dispatch,
                      on_admit=on_admit,
                      on_first_token=on_first_token,
                      check=check,
                      flags=flags,
                      stats=stats)
