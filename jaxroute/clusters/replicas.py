"""Replicas with prefix caches: G replicas of one model behind a cache-aware router.

Event loop (one `step` = one event, DESIGN.md): if the next arrival is no later than the
earliest replica clock, route it; otherwise run one iteration on the replica with the earliest
clock (ties -> lowest index). An idle replica's clock is +inf until a request is routed to it.

One iteration on replica g at time t (continuous batching with chunked prefill):
1. Admission, at most `max_admit` requests, in local order (fcfs = arrival order; lpm = most
   cached prompt tokens first, ties by arrival). It stops at the first request that does not
   fit, when the running set is full, or once the running requests' remaining prefill reaches
   `chunk`. A request fits when (prompt - cached prefix) + output <= free KV + tokens of
   unlocked cached segments. Segments are evicted in LRU order (last use, then deeper first, then
   id) until the request fits. Its matched segments are locked and touched at t.
2. The batch: prefilling requests in admission order share `chunk` new tokens; every request
   whose prefill was complete before the iteration decodes one token. The time comes from
   `cost_models.step_time`; the iteration ends at t + dt.
3. At t + dt: a segment whose tokens are all computed enters the cache (locked; the request's
   private copy is released), and the prefix up to it is touched. A request whose prefill ends
   gets its first token; a request with all output tokens finishes, unlocks its segments,
   touches them, and leaves its output in the cache when the workload keeps it (multi-turn).

Memory: cached segments + private tokens of running requests (uncached prompt + output
reservation) <= kv_capacity. The cache is `cached[G, n_segments]` with `last_use`/`refcnt`;
the matched prefix is the cumulative product of the leading segments' cached flags.

Speed: one `step` touches one replica's row only (both event kinds are computed on that row and
the right one kept, so a vmapped step is O(row)), and a replica leaps over iterations in which
nothing but token counts change (see `_iterate_row`); both keep events identical to the plain loop
(tests/reference_replicas.py is a radix-tree reference that the tests match exactly).

Capacities: the local queue (`max_queue`; the CLI sizes it to the number of requests) sets
`overflow` when full; `max_running` is a modeled engine limit (SGLang's max_running_requests):
requests wait for a slot and `running_full` reports that it bound. Segments per prompt are sized
from the workload. Routing is instantaneous, so a request's dispatch time is its arrival time.

Router view: in-flight requests and tokens per replica, and the router's record of which
replica should hold which segment: the replica's cache plus the segments of requests dispatched
to it and not finished (insert on dispatch). With `stale_s` = T > 0 the loads and the replica
caches are snapshots refreshed every T seconds; dispatches since the snapshot are added at once.
`sglang_cache_aware` keeps its own approximate tree instead (insert on dispatch, never evicted).

Preble E2's load cost (`preble_e2`, only when `e2_ring` > 0; `_preble_costs`), in GPU seconds from
the cost model, per replica i, for an arriving request:
- L_i: over the requests dispatched to i in the last `e2_window_s` seconds (a ring of `e2_ring`
  recent dispatches per replica; a live entry overwritten sets `overflow`), the prefill time of
  their missed tokens (fixed at dispatch) + single-request decode time at their prompt length x
  the window's mean output length (Preble's estimate; the mean is over the window's dispatched
  requests' true output lengths, where Preble uses measured ones).
- M_i: eviction cost on the router's record of i (cached + dispatched segments). Capacity model:
  the record's tokens + this request's missed tokens on i must fit `kv_capacity` (running
  requests' private KV and output reservations are ignored). Evictable: recorded segments that no
  unfinished request dispatched to i contains and that are not in this prompt, in order of the
  router's last dispatch of the segment to i (then deeper first, then id), whole segments until
  the deficit is covered. Each costs its prefill time (no context) x its hit rate: the share of
  i's window requests whose prompt contains it.
- P_i: prefill time of this request's missed part on i (on top of its match there).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute import cost_models
from jaxroute import metrics as mlib
from jaxroute.errors import JaxrouteError
from jaxroute.routers import prefix as routers
from jaxroute.workloads.prefix import RequestTable

INF = jnp.inf
METRICS = ("mean_latency_s", "p99_latency_s", "ttft_mean_s", "ttft_p99_s", "tpot_mean_s", "hit_rate",
           "replication_factor", "max_replica_share")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ReplicaParams:
    """Traced configuration of one run (every field vmappable)."""

    policy: jax.Array  # [] int32 index into routers.PREFIX_POLICIES
    rate: jax.Array  # [] float32 requests/s (traces: <= 0 replays recorded times)
    stale_s: jax.Array  # [] float32 router view refresh period (0 = always fresh)
    kv_capacity: jax.Array  # [] int32 KV tokens per replica
    router: routers.RouterParams
    cost: cost_models.CostParams


def make_params(policy: str = "rr", rate: float = 1.0, stale_s: float = 0.0, kv_capacity: int | None = None,
                gpu: str = "a6000", model: str = "mistral-7b", cost_model: str = "roofline",
                **router_kw) -> ReplicaParams:
    if policy not in routers.PREFIX_POLICIES:
        raise JaxrouteError(f"unknown policy '{policy}'; choose from: {', '.join(routers.PREFIX_POLICIES)}")
    if stale_s < 0:
        raise JaxrouteError(f"staleness must be >= 0 seconds, got {stale_s}")
    if not router_kw.get("e2_window_s", 1.0) > 0:
        raise JaxrouteError(f"the Preble E2 window must be > 0 seconds, got {router_kw['e2_window_s']}")
    if not router_kw.get("e2_th_bal", 1.0) >= 1:
        raise JaxrouteError(f"the Preble E2 rebalancing threshold must be >= 1, got {router_kw['e2_th_bal']}")
    cap = cost_models.kv_capacity_tokens(gpu, model) if kv_capacity is None else int(kv_capacity)
    if cap < 1:
        raise JaxrouteError(f"kv capacity must be >= 1 token, got {cap}")
    return ReplicaParams(jnp.int32(routers.policy_id(policy)), jnp.float32(rate), jnp.float32(stale_s),
                         jnp.int32(cap), routers.router_params(**router_kw),
                         cost_models.cost_params(gpu, model, kind=cost_model))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Replica:
    """One replica's local state (a row of the cluster arrays)."""

    cached: jax.Array  # [M+1] bool segment in the cache
    refcnt: jax.Array  # [M+1] int32 running requests locking the segment
    last_use: jax.Array  # [M+1] float32 LRU stamp
    pending: jax.Array  # [M+1] int32 unfinished requests dispatched here that contain the segment
    tree: jax.Array  # [M+1] bool SGLang approximate tree (insert on dispatch, never evicted)
    queue: jax.Array  # [Q] int32 request ids waiting locally (-1 = empty)
    run_req: jax.Array  # [B] int32 running request ids (-1 = empty slot)
    run_pos: jax.Array  # [B] int32 prompt tokens already in KV (cached + computed)
    run_gen: jax.Array  # [B] int32 output tokens generated
    run_nseg: jax.Array  # [B] int32 leading prompt segments locked in the cache
    run_res: jax.Array  # [B] int32 private KV tokens held (prompt not yet in the cache + output)
    run_seq: jax.Array  # [B] int32 admission stamp (prefill budget order)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ReplicaState:
    req: RequestTable  # this seed's requests
    rep: Replica  # every field with a leading [G] axis
    next_req: jax.Array  # [] int32 index of the next arrival (= requests routed, the rr counter)
    now: jax.Array  # [] float32 time of the last event
    clock: jax.Array  # [G] float32 when each replica starts its next iteration (+inf = idle)
    n_admitted: jax.Array  # [] int32
    inflight: jax.Array  # [G] float32 requests dispatched and unfinished
    inflight_tok: jax.Array  # [G] float32 their prompt + output tokens
    tree_size: jax.Array  # [G] float32 tokens in SGLang's tree per replica
    copies: jax.Array  # [M+1] int32 replicas caching each segment
    cache_tok: jax.Array  # [G] int32 cached tokens per replica
    unique_tok: jax.Array  # [] int32 tokens of segments cached somewhere
    view_present: jax.Array  # [G, M+1] bool stale router record (only with stale_view)
    view_inflight: jax.Array  # [G] float32 stale loads (only with stale_view)
    view_tokens: jax.Array  # [G] float32
    view_time: jax.Array  # [] float32 time of the last snapshot
    e2_time: jax.Array  # [G, K] float32 Preble window ring: dispatch time (-inf = empty)
    e2_pre: jax.Array  # [G, K] float32 prefill seconds of the missed tokens
    e2_dec: jax.Array  # [G, K] float32 single-request decode step seconds at the prompt length
    e2_out: jax.Array  # [G, K] int32 output tokens
    e2_req: jax.Array  # [G, K] int32 request id (-1 = empty)
    e2_last: jax.Array  # [G, M+1] float32 router's last dispatch of each segment to each replica (E2 eviction order)
    rec_replica: jax.Array  # [N] int32 (-1 = not routed)
    rec_admit: jax.Array  # [N] float32 (inf = not yet)
    rec_first: jax.Array  # [N] float32 first-token time
    rec_finish: jax.Array  # [N] float32
    rec_cached: jax.Array  # [N] int32 prompt tokens found in the cache at admission
    rep_area: jax.Array  # [] float32 integral of the replication factor over time
    rep_time: jax.Array  # [] float32 time with a non-empty cache
    running_full: jax.Array  # [] bool admission ever waited only for a running slot (max_running)
    overflow: jax.Array  # [] bool a fixed capacity was exceeded (local queue)


def leading_match(present: jax.Array, seg_ids: jax.Array, seg_tok: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(segments, tokens) of the longest prefix whose segments are all present. present [..., M+1]."""
    ok = present[..., seg_ids] | (seg_tok == 0)
    lead = jnp.cumprod(ok.astype(jnp.int32), axis=-1)
    return jnp.sum(lead * (seg_tok > 0), axis=-1), jnp.sum(lead * seg_tok, axis=-1)


def _evict_lru(evictable: jax.Array, last_use: jax.Array, depth: jax.Array, seg_len: jax.Array,
               deficit: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(mask, tokens) of segments to evict: least recently used first, deeper first on ties (leaves
    before their parents, which are touched whenever a child is), then lowest id; until `deficit`."""

    def body(c):
        ev, out, freed = c
        lu = jnp.where(ev, last_use, INF)
        cand = ev & (lu == jnp.min(lu))
        cand &= depth == jnp.max(jnp.where(cand, depth, -1))
        k = jnp.argmax(cand)
        return ev.at[k].set(False), out.at[k].set(True), freed + seg_len[k]

    def cond(c):
        return (c[2] < deficit) & jnp.any(c[0])

    _, out, freed = jax.lax.while_loop(cond, body, (evictable, jnp.zeros_like(evictable), jnp.int32(0)))
    return out, freed


@dataclasses.dataclass(frozen=True)
class ReplicaCluster:
    """Static configuration (shapes); see the module docstring for the model."""

    n_replicas: int = 4
    chunk: int = 512  # prefill tokens per iteration
    max_running: int = 64  # B: running requests per replica (SGLang's max_running_requests; a real limit)
    max_queue: int = 256  # Q: local queue per replica
    max_admit: int = 4  # admissions per iteration
    local_order: str = "fcfs"  # or "lpm"
    stale_view: bool = False  # keep a router snapshot refreshed every params.stale_s seconds
    e2_ring: int = 0  # Preble E2 window ring per replica (0 = E2's cost not modeled; preble_e2 then overflows)
    leap: int = 32  # pure-decode iterations a replica may take in one step (0 = none; exact either way)

    def __post_init__(self):
        if self.n_replicas < 1 or self.chunk < 1 or self.max_running < 1 or self.max_queue < 1 or self.max_admit < 1:
            raise JaxrouteError("replicas, chunk, max_running, max_queue and max_admit must all be >= 1")
        if self.e2_ring < 0:
            raise JaxrouteError(f"e2_ring must be >= 0, got {self.e2_ring}")
        if self.local_order not in ("fcfs", "lpm"):
            raise JaxrouteError(f"unknown local order '{self.local_order}'; choose from: fcfs, lpm")

    # ------------------------------------------------------------------ protocol

    def num_steps(self, workload) -> int:
        return int(workload.step_bound(self.chunk))

    def init(self, key, workload, params: ReplicaParams) -> ReplicaState:
        req = workload.realize(key, params.rate)
        n, m1 = req.arrival_s.shape[0], req.seg_len.shape[0]
        G, B, Q = self.n_replicas, self.max_running, self.max_queue
        f = lambda shape, v: jnp.full(shape, v, jnp.float32)
        i = lambda shape, v: jnp.full(shape, v, jnp.int32)
        b = lambda shape: jnp.zeros(shape, bool)
        vm1 = m1 if self.stale_view else 1
        K = max(self.e2_ring, 1)
        rep = Replica(cached=b((G, m1)), refcnt=i((G, m1), 0), last_use=f((G, m1), 0.0), pending=i((G, m1), 0),
                      tree=b((G, m1)), queue=i((G, Q), -1), run_req=i((G, B), -1), run_pos=i((G, B), 0),
                      run_gen=i((G, B), 0), run_nseg=i((G, B), 0), run_res=i((G, B), 0), run_seq=i((G, B), 0))
        return ReplicaState(
            req=req, rep=rep, next_req=jnp.int32(0), now=jnp.float32(0), clock=f((G,), INF),
            n_admitted=jnp.int32(0), inflight=f((G,), 0.0), inflight_tok=f((G,), 0.0), tree_size=f((G,), 0.0),
            copies=i((m1,), 0), cache_tok=i((G,), 0), unique_tok=jnp.int32(0),
            view_present=b((G, vm1)), view_inflight=f((G,), 0.0), view_tokens=f((G,), 0.0),
            view_time=jnp.float32(-INF),
            e2_time=f((G, K), -INF), e2_pre=f((G, K), 0.0), e2_dec=f((G, K), 0.0), e2_out=i((G, K), 0),
            e2_req=i((G, K), -1), e2_last=f((G, m1 if self.e2_ring else 1), -INF),
            rec_replica=i((n,), -1), rec_admit=f((n,), INF), rec_first=f((n,), INF), rec_finish=f((n,), INF),
            rec_cached=i((n,), 0), rep_area=jnp.float32(0), rep_time=jnp.float32(0), running_full=jnp.bool_(False),
            overflow=jnp.bool_(False))

    def is_done(self, state: ReplicaState) -> jax.Array:
        return (state.next_req >= state.req.arrival_s.shape[0]) & jnp.all(jnp.isinf(state.clock))

    def step(self, state: ReplicaState, workload, params: ReplicaParams) -> ReplicaState:
        """One event. Both kinds are computed on one replica's row and the right one is kept, so a
        batched (vmapped) step costs O(row), not O(whole state)."""
        s, r = state, state.req
        n = r.arrival_s.shape[0]
        i = jnp.minimum(s.next_req, n - 1)
        a = jnp.where(s.next_req < n, r.arrival_s[i], INF)
        m = jnp.min(s.clock)
        t = jnp.minimum(a, m)
        live = jnp.isfinite(t)
        is_route = live & (a <= m)
        is_iter = live & ~is_route

        # time-averaged replication factor over [now, t)
        has = s.unique_tok > 0
        dt_ev = jnp.where(live, t - s.now, 0.0)
        ratio = jnp.sum(s.cache_tok) / jnp.maximum(s.unique_tok, 1)
        rep_area = s.rep_area + jnp.where(has, ratio * dt_ev, 0.0)
        rep_time = s.rep_time + jnp.where(has, dt_ev, 0.0)

        # ---- routing decision for request i (used only if is_route)
        segs, tok = r.seg_ids[i], r.seg_tok[i]
        prompt = r.prompt_tok[i]
        size = (prompt + r.out_tok[i]).astype(jnp.float32)
        all_segs = jnp.concatenate([segs, r.out_seg[i][None]])
        if self.stale_view:
            refresh = is_route & (a >= s.view_time + params.stale_s)
            v_present = jnp.where(refresh, s.rep.cached | (s.rep.pending > 0), s.view_present)
            v_inf = jnp.where(refresh, s.inflight, s.view_inflight)
            v_tok = jnp.where(refresh, s.inflight_tok, s.view_tokens)
            record = v_present
        else:
            v_inf, v_tok = s.inflight, s.inflight_tok
            record = s.rep.cached | (s.rep.pending > 0)
        present = record[:, segs]
        _, match = leading_match(present, jnp.arange(segs.shape[0]), tok)
        _, tmatch = leading_match(s.rep.tree[:, segs], jnp.arange(segs.shape[0]), tok)
        if self.e2_ring:
            e2_load, e2_extra, e2_p = self._preble_costs(s, r, params, a, segs, prompt, record, match)
        else:
            e2_load = e2_extra = e2_p = jnp.zeros(self.n_replicas, jnp.float32)
        view = routers.RouterView(v_inf, v_tok, match.astype(jnp.float32), tmatch.astype(jnp.float32),
                                  s.tree_size, prompt.astype(jnp.float32), s.next_req, e2_load, e2_extra)
        g_route = routers.route(params.policy, view, params.router)
        g = jnp.where(is_route, g_route, jnp.argmin(s.clock))
        row = jax.tree.map(lambda x: x[g], s.rep)

        # ---- route: enqueue + insert on dispatch
        free_q = row.queue < 0
        q_ok = jnp.any(free_q)
        qslot = jnp.argmax(free_q)
        new_tree = ~row.tree[all_segs] & (all_segs < r.seg_len.shape[0] - 1)
        routed = dataclasses.replace(
            row, queue=row.queue.at[qslot].set(jnp.where(q_ok, i, row.queue[qslot])),
            pending=row.pending.at[all_segs].add(1), tree=row.tree.at[all_segs].set(True))

        # ---- iterate
        it, side = self._iterate_row(row, r, m, params, s.n_admitted, a)

        pick = lambda x0, xr, xi: jnp.where(is_route, xr, jnp.where(is_iter, xi, x0))
        new_row = jax.tree.map(pick, row, routed, it)
        rep = jax.tree.map(lambda x, v: x.at[g].set(v), s.rep, new_row)

        # cache accounting for the replication factor
        d = new_row.cached.astype(jnp.int32) - row.cached.astype(jnp.int32)
        copies = s.copies + d
        unique_tok = s.unique_tok + jnp.sum(((copies > 0).astype(jnp.int32) - (s.copies > 0)) * r.seg_len)
        cache_tok = s.cache_tok.at[g].add(jnp.sum(d * r.seg_len))

        # replica-level vectors
        clock_r = jnp.where(jnp.isinf(s.clock[g]), a, s.clock[g])
        clock = s.clock.at[g].set(pick(s.clock[g], clock_r, side["clock"]))
        d_inf = jnp.where(is_route, 1.0, jnp.where(is_iter, -side["n_fin"], 0.0))
        d_tok = jnp.where(is_route, size, jnp.where(is_iter, -side["tok_fin"], 0.0))
        tree_add = jnp.where(is_route, jnp.sum(new_tree * r.seg_len[all_segs]).astype(jnp.float32), 0.0)
        out = dict(
            rep=rep, now=jnp.where(live, t, s.now), clock=clock, copies=copies, unique_tok=unique_tok,
            cache_tok=cache_tok, rep_area=rep_area, rep_time=rep_time,
            next_req=s.next_req + is_route, n_admitted=jnp.where(is_iter, side["n_admitted"], s.n_admitted),
            inflight=s.inflight.at[g].add(d_inf), inflight_tok=s.inflight_tok.at[g].add(d_tok),
            tree_size=s.tree_size.at[g].add(tree_add),
            overflow=s.overflow | (is_route & ~q_ok),
            running_full=s.running_full | (is_iter & side["full"]),
        )
        is_e2 = params.policy == routers.policy_id("preble_e2")
        if self.e2_ring:  # record the dispatch in replica g's window ring (oldest entry replaced)
            slot = jnp.argmin(s.e2_time[g])
            live_lost = (s.e2_req[g, slot] >= 0) & (a - s.e2_time[g, slot] < params.router.e2_window_s)
            put = lambda x, v: x.at[g, slot].set(jnp.where(is_route, v, x[g, slot]))
            dec = cost_models.decode_step_time(params.cost, 1.0, prompt.astype(jnp.float32))
            out.update(e2_time=put(s.e2_time, a), e2_pre=put(s.e2_pre, e2_p[g]), e2_dec=put(s.e2_dec, dec),
                       e2_out=put(s.e2_out, r.out_tok[i]), e2_req=put(s.e2_req, i),
                       e2_last=s.e2_last.at[g, all_segs].set(jnp.where(is_route, a, s.e2_last[g, all_segs])))
            out["overflow"] = out["overflow"] | (is_route & is_e2 & live_lost)
        else:  # preble_e2 without its window: the costs were not computed
            out["overflow"] = out["overflow"] | (is_route & is_e2)
        if self.stale_view:
            vp = v_present.at[g, all_segs].set(v_present[g, all_segs] | is_route)
            out.update(view_present=vp, view_inflight=v_inf.at[g].add(jnp.where(is_route, 1.0, 0.0)),
                       view_tokens=v_tok.at[g].add(jnp.where(is_route, size, 0.0)),
                       view_time=jnp.where(refresh, a, s.view_time))
        # per-request records: point updates (out-of-range index n = no update)
        nowhere = n
        out.update(
            rec_replica=s.rec_replica.at[jnp.where(is_route, i, nowhere)].set(g, mode="drop"),
            rec_admit=s.rec_admit.at[jnp.where(is_iter & side["adm_go"], side["adm_id"], nowhere)].set(m, mode="drop"),
            rec_cached=s.rec_cached.at[jnp.where(is_iter & side["adm_go"], side["adm_id"], nowhere)].set(
                side["adm_tok"], mode="drop"),
            rec_first=s.rec_first.at[jnp.where(is_iter & side["first"], side["rid"], nowhere)].set(
                side["t_end"], mode="drop"),
            rec_finish=s.rec_finish.at[jnp.where(is_iter & side["finished"], side["rid"], nowhere)].set(
                side["t_end"], mode="drop"),
        )
        return dataclasses.replace(s, **out)

    def _preble_costs(self, s: ReplicaState, r: RequestTable, params: ReplicaParams, a, segs, prompt, record,
                      match):
        """Preble E2's (L [G], M + P [G], P [G]) for a request arriving at `a` (see the module docstring)."""
        cp, G = params.cost, self.n_replicas
        seg_len = r.seg_len
        valid = (s.e2_req >= 0) & (a - s.e2_time < params.router.e2_window_s)  # [G, K]
        n_g = jnp.sum(valid, axis=1)
        mean_out = (jnp.sum(jnp.where(valid, s.e2_out, 0)).astype(jnp.float32)
                    / jnp.maximum(jnp.sum(n_g), 1).astype(jnp.float32))
        load = jnp.sum(jnp.where(valid, s.e2_pre + s.e2_dec * mean_out, 0.0), axis=1)
        match_f = match.astype(jnp.float32)
        missed = prompt.astype(jnp.float32) - match_f
        p_cost = jax.vmap(lambda n, c: cost_models.prefill_time(cp, n, c))(missed, match_f)
        # eviction on the router's record
        rid = jnp.maximum(s.e2_req, 0)
        used = valid[:, :, None] & (r.seg_tok[rid] > 0)  # [G, K, S]
        hits = jnp.zeros(record.shape, jnp.int32).at[
            jnp.broadcast_to(jnp.arange(G)[:, None, None], used.shape), r.seg_ids[rid]].add(used.astype(jnp.int32))
        hit_rate = hits.astype(jnp.float32) / jnp.maximum(n_g, 1).astype(jnp.float32)[:, None]
        seg_cost = jax.vmap(lambda n: cost_models.prefill_time(cp, n))(seg_len.astype(jnp.float32))
        in_req = jnp.zeros(seg_len.shape, bool).at[segs].set(True)
        evictable = record & (s.rep.pending == 0) & (seg_len > 0) & ~in_req
        deficit = jnp.sum(record * seg_len, axis=1).astype(jnp.float32) + missed - params.kv_capacity.astype(
            jnp.float32)
        ids = jnp.arange(seg_len.shape[0])

        def evict_cost(ev, last, hr, d):
            order = jnp.lexsort((ids, -r.seg_depth, jnp.where(ev, last, INF)))
            tok = (seg_len[order] * ev[order]).astype(jnp.float32)
            gone = ev[order] & (jnp.cumsum(tok) - tok < d)
            return jnp.sum(jnp.where(gone, seg_cost[order] * hr[order], 0.0))

        m_cost = jax.vmap(evict_cost)(evictable, s.e2_last, hit_rate, deficit)
        return load, m_cost + p_cost, p_cost

    def _iterate_row(self, row: Replica, r: RequestTable, t: jax.Array, params: ReplicaParams,
                     n_admitted: jax.Array, next_arrival: jax.Array):
        """One iteration of one replica starting at time t: (new row, side outputs).

        Event leaping (exact): after this iteration, if it had no event (no first token, no segment
        completed, no finish) and the next iterations cannot admit anything (a prefilling request
        still fills the whole chunk, or the queue is empty or blocked by memory/slots, which only a
        finish frees), up to `leap` further iterations run in this step. They stop at the first
        one that completes a segment or finishes a request (included), and never start at or after
        the next arrival, so the events are exactly those of stepping one by one.
        """
        m1 = r.seg_len.shape[0]
        seg_len = r.seg_len
        cap = params.kv_capacity
        A = self.max_admit
        cache_tok = jnp.sum(row.cached * seg_len)
        unlocked_tok = jnp.sum((row.cached & (row.refcnt == 0)) * seg_len)

        def admit(k, c):
            rw = c["row"]
            running = rw.run_req >= 0
            rid = jnp.maximum(rw.run_req, 0)
            remaining = jnp.where(running, r.prompt_tok[rid] - rw.run_pos, 0)
            qv = rw.queue >= 0
            qid = jnp.maximum(rw.queue, 0)
            if self.local_order == "lpm":
                _, qmatch = leading_match(rw.cached, r.seg_ids[qid], r.seg_tok[qid])  # [Q]
                best = qv & (qmatch == jnp.max(jnp.where(qv, qmatch, -1)))
                qslot = jnp.argmin(jnp.where(best, rw.queue, jnp.iinfo(jnp.int32).max))
            else:
                qslot = jnp.argmin(jnp.where(qv, rw.queue, jnp.iinfo(jnp.int32).max))
            has = jnp.any(qv)
            cand = qid[qslot]
            segs, tok = r.seg_ids[cand], r.seg_tok[cand]
            nmatch, mtok = leading_match(rw.cached, segs, tok)
            need = r.prompt_tok[cand] - mtok + r.out_tok[cand]
            free = cap - c["cache_tok"] - jnp.sum(rw.run_res)
            pos = jnp.arange(segs.shape[0])
            in_prefix = pos < nmatch
            prefix_unlocked = in_prefix & (rw.refcnt[segs] == 0)
            evictable_tok = c["unlocked_tok"] - jnp.sum(prefix_unlocked * tok)
            fits = need <= free + evictable_tok
            free_slot = ~running
            has_slot = jnp.any(free_slot)
            budget = jnp.sum(remaining) < self.chunk
            go = ~c["stop"] & has & budget & has_slot & fits
            full = ~c["stop"] & has & budget & fits & ~has_slot
            blocked = ~c["stop"] & has & budget & (~fits | ~has_slot)
            lock = in_prefix & go
            refcnt = rw.refcnt.at[segs].add(lock.astype(jnp.int32))
            deficit = jnp.where(go, jnp.maximum(need - free, 0), 0)
            evict, freed = _evict_lru(rw.cached & (refcnt == 0), rw.last_use, r.seg_depth, seg_len, deficit)
            slot = jnp.argmax(free_slot)
            upd = lambda x, v: x.at[slot].set(jnp.where(go, v, x[slot]))
            rw = dataclasses.replace(
                rw, cached=rw.cached & ~evict, refcnt=refcnt,
                last_use=rw.last_use.at[segs].set(jnp.where(lock, t, rw.last_use[segs])),
                queue=rw.queue.at[qslot].set(jnp.where(go, -1, rw.queue[qslot])),
                run_req=upd(rw.run_req, cand), run_pos=upd(rw.run_pos, mtok), run_gen=upd(rw.run_gen, 0),
                run_nseg=upd(rw.run_nseg, nmatch), run_res=upd(rw.run_res, need),
                run_seq=upd(rw.run_seq, c["n_admitted"]))
            return dict(row=rw, n_admitted=c["n_admitted"] + go, stop=c["stop"] | ~go,
                        blocked=c["blocked"] | blocked, full=c["full"] | full,
                        cache_tok=c["cache_tok"] - freed,
                        unlocked_tok=c["unlocked_tok"] - freed - jnp.sum(jnp.where(go, prefix_unlocked * tok, 0)),
                        adm_go=c["adm_go"].at[k].set(go), adm_id=c["adm_id"].at[k].set(cand),
                        adm_tok=c["adm_tok"].at[k].set(mtok))

        c0 = dict(row=row, n_admitted=n_admitted, stop=jnp.bool_(False), blocked=jnp.bool_(False),
                  full=jnp.bool_(False), cache_tok=cache_tok, unlocked_tok=unlocked_tok,
                  adm_go=jnp.zeros(A, bool), adm_id=jnp.zeros(A, jnp.int32), adm_tok=jnp.zeros(A, jnp.int32))
        c = jax.lax.fori_loop(0, A, admit, c0)
        rw = c["row"]

        # ---- the batch: prefill chunks in admission order share `chunk`; finished prefills decode
        running = rw.run_req >= 0
        rid = jnp.maximum(rw.run_req, 0)
        prompt = jnp.where(running, r.prompt_tok[rid], 0)
        pos, gen = rw.run_pos, rw.run_gen
        remaining = prompt - pos
        prefilling = running & (remaining > 0)
        decoding = running & (remaining == 0)
        rem = jnp.where(prefilling, remaining, 0)
        earlier = rw.run_seq[None, :] < rw.run_seq[:, None]  # [B, B]: j admitted before i
        before = jnp.sum(earlier * rem[None, :], axis=1)
        alloc = jnp.clip(self.chunk - before, 0, rem)
        dt = cost_models.step_time(params.cost, alloc.astype(jnp.float32), pos.astype(jnp.float32), alloc > 0,
                                   (prompt + gen).astype(jnp.float32), decoding)
        t_end = t + dt
        new_pos = pos + alloc
        first = prefilling & (new_pos >= prompt)
        new_gen = gen + (first | decoding)
        out = r.out_tok[rid]

        segs, tok = r.seg_ids[rid], r.seg_tok[rid]  # [B, S]
        seg_end = jnp.cumsum(tok, axis=1)
        spos = jnp.arange(segs.shape[1])[None, :]

        def completed_segments(p):
            return jnp.where(running, jnp.sum((seg_end <= p[:, None]) & (tok > 0), axis=1), 0)

        # ---- event leap: further iterations in which nothing but token counts change
        if self.leap > 0:
            big = jnp.iinfo(jnp.int32).max
            left = jnp.where(decoding, out - new_gen, big)  # iterations until each decoder finishes
            first_fin = jnp.min(left)
            pre = running & (new_pos < prompt)  # still prefilling
            has_f = jnp.any(pre)
            f = jnp.argmin(jnp.where(pre, rw.run_seq, big))  # the one that gets the whole chunk
            rem_f = prompt[f] - new_pos[f]
            bound = jnp.min(jnp.where((seg_end[f] > new_pos[f]) & (tok[f] > 0), seg_end[f], big))
            j_seg = (bound - new_pos[f] + self.chunk - 1) // self.chunk  # iteration completing a segment
            eventless = (~jnp.any(first) & jnp.all(completed_segments(new_pos) == rw.run_nseg)
                         & (first_fin > 0))
            # admission stays impossible: the chunk is full (rem_f > chunk), or the queue is empty or
            # blocked by memory/slots (which only a finish can free)
            quiet = eventless & (has_f | (jnp.any(decoding) & (~jnp.any(rw.queue >= 0) | c["blocked"])))
            j = jnp.arange(1, self.leap + 1)
            is_f = (jnp.arange(pos.shape[0]) == f) & has_f
            ctx = (prompt + new_gen).astype(jnp.float32)
            alloc_f = jnp.where(is_f, self.chunk, 0).astype(jnp.float32)

            def dt_j(jj):
                shift = (jj - 1).astype(jnp.float32)
                return cost_models.step_time(params.cost, alloc_f, new_pos.astype(jnp.float32) + shift * alloc_f,
                                             alloc_f > 0, ctx + shift, decoding)

            dts = jax.vmap(dt_j)(j)
            ends = t_end + jnp.cumsum(dts)
            prefill_ok = ~has_f | ((rem_f - (j - 1) * self.chunk > self.chunk) & (j <= j_seg))
            ok = quiet & (j <= first_fin) & (ends - dts < next_arrival) & prefill_ok
            k = jnp.sum(ok)  # ok is a prefix of j
            t_end = jnp.where(k > 0, ends[jnp.maximum(k - 1, 0)], t_end)
            new_gen = new_gen + jnp.where(decoding, k, 0)
            new_pos = new_pos + jnp.where(is_f, k * self.chunk, 0)

        # ---- segments completed by this iteration enter the cache (locked), prefix touched
        nseg_new = completed_segments(new_pos)
        newly = (spos >= rw.run_nseg[:, None]) & (spos < nseg_new[:, None]) & running[:, None]
        touch = (spos < nseg_new[:, None]) & jnp.any(newly, axis=1, keepdims=True)
        cached = rw.cached.at[segs].max(newly)
        refcnt = rw.refcnt.at[segs].add(newly.astype(jnp.int32))
        run_res = rw.run_res - jnp.sum(newly * tok, axis=1)
        last_use = rw.last_use.at[segs].max(jnp.where(touch, t_end, -INF))

        # ---- finishes
        finished = running & (new_gen >= out)
        fin_seg = finished[:, None] & (tok > 0)
        refcnt = refcnt.at[segs].add(-fin_seg.astype(jnp.int32))
        last_use = last_use.at[segs].max(jnp.where(fin_seg, t_end, -INF))
        out_seg = r.out_seg[rid]
        keep_out = finished & (out_seg < m1 - 1)
        cached = cached.at[out_seg].max(keep_out)
        last_use = last_use.at[out_seg].max(jnp.where(keep_out, t_end, -INF))
        all_segs = jnp.concatenate([segs, out_seg[:, None]], axis=1)
        pending = rw.pending.at[all_segs].add(-jnp.broadcast_to(finished[:, None], all_segs.shape).astype(jnp.int32))
        run_req = jnp.where(finished, -1, rw.run_req)
        busy = jnp.any(run_req >= 0) | jnp.any(rw.queue >= 0)
        new_row = dataclasses.replace(
            rw, cached=cached, refcnt=refcnt, last_use=last_use, pending=pending, run_req=run_req,
            run_pos=new_pos, run_gen=new_gen, run_nseg=nseg_new, run_res=jnp.where(finished, 0, run_res))
        side = dict(clock=jnp.where(busy, t_end, INF), t_end=t_end, n_admitted=c["n_admitted"],
                    full=c["full"], adm_go=c["adm_go"], adm_id=c["adm_id"], adm_tok=c["adm_tok"],
                    rid=rid, first=first, finished=finished, n_fin=jnp.sum(finished).astype(jnp.float32),
                    tok_fin=jnp.sum(jnp.where(finished, prompt + out, 0)).astype(jnp.float32))
        return new_row, side

    # ------------------------------------------------------------------ results

    def metrics(self, state: ReplicaState, workload, params: ReplicaParams) -> dict[str, jax.Array]:
        r = state.req
        n = r.arrival_s.shape[0]
        done = jnp.isfinite(state.rec_finish)
        prompt = r.prompt_tok
        lat = state.rec_finish - r.arrival_s
        ttft = state.rec_first - r.arrival_s
        multi = done & (r.out_tok > 1)
        tpot = (state.rec_finish - state.rec_first) / jnp.maximum(r.out_tok - 1, 1)
        arrived = state.next_req
        in_queue = jnp.sum(state.rep.queue >= 0)
        running = jnp.sum(state.rep.run_req >= 0)
        completed = jnp.sum(done)
        routed = jnp.maximum(jnp.sum(state.rec_replica >= 0), 1)
        share = jnp.max(jnp.sum(state.rec_replica[None, :] == jnp.arange(self.n_replicas)[:, None], axis=1)) / routed
        fin = lambda x: jnp.where(jnp.isfinite(x), x, 0.0)
        return {
            "mean_latency_s": mlib.masked_mean(fin(lat), done),
            "p99_latency_s": mlib.masked_quantile(fin(lat), done, 0.99),
            "ttft_mean_s": mlib.masked_mean(fin(ttft), done),
            "ttft_p99_s": mlib.masked_quantile(fin(ttft), done, 0.99),
            "tpot_mean_s": mlib.masked_mean(fin(tpot), multi),
            "hit_rate": jnp.sum(state.rec_cached * done) / jnp.maximum(jnp.sum(prompt * done), 1),
            "replication_factor": jnp.where(state.rep_time > 0, state.rep_area / jnp.maximum(state.rep_time, 1e-30), 1.0),
            "max_replica_share": share,
            "completed": completed,
            "running_full": state.running_full,
            "overflow": state.overflow | (completed < n),
            "conservation_error": jnp.abs(arrived - (completed + in_queue + running)),
        }


def run_single(model: ReplicaCluster, key, workload, params: ReplicaParams) -> ReplicaState:
    """One run to completion with a while loop (for tests and per-request records); compiled once per model."""
    go = _SINGLE.get(model)
    if go is None:

        def run(key, workload, params):
            state = model.init(key, workload, params)
            return jax.lax.while_loop(lambda s: ~model.is_done(s), lambda s: model.step(s, workload, params), state)

        go = _SINGLE[model] = jax.jit(run)
    return go(key, workload, params)


_SINGLE: dict[ReplicaCluster, object] = {}


def records(state: ReplicaState) -> dict[str, np.ndarray]:
    """Per-request records as host arrays."""
    r = state.req
    return {"arrival_s": np.asarray(r.arrival_s), "replica": np.asarray(state.rec_replica),
            "dispatch_s": np.asarray(r.arrival_s), "admit_s": np.asarray(state.rec_admit),
            "first_token_s": np.asarray(state.rec_first), "finish_s": np.asarray(state.rec_finish),
            "cached_tokens": np.asarray(state.rec_cached), "prompt_tokens": np.asarray(r.seg_tok.sum(1)),
            "output_tokens": np.asarray(r.out_tok)}

