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

Router view: in-flight requests and tokens per replica, and the router's record of which
replica should hold which segment: the replica's cache plus the segments of requests dispatched
to it and not finished (insert on dispatch). With `stale_s` = T > 0 the loads and the replica
caches are snapshots refreshed every T seconds; dispatches since the snapshot are added at once.
`sglang_cache_aware` keeps its own approximate tree instead (insert on dispatch, never evicted).
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
    cap = cost_models.kv_capacity_tokens(gpu, model) if kv_capacity is None else int(kv_capacity)
    if cap < 1:
        raise JaxrouteError(f"kv capacity must be >= 1 token, got {cap}")
    return ReplicaParams(jnp.int32(routers.policy_id(policy)), jnp.float32(rate), jnp.float32(stale_s),
                         jnp.int32(cap), routers.router_params(**router_kw),
                         cost_models.cost_params(gpu, model, kind=cost_model))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ReplicaState:
    req: RequestTable  # this seed's requests
    next_req: jax.Array  # [] int32 index of the next arrival
    now: jax.Array  # [] float32 time of the last event
    clock: jax.Array  # [G] float32 when each replica starts its next iteration (+inf = idle)
    queue: jax.Array  # [G, Q] int32 request ids waiting locally (-1 = empty)
    run_req: jax.Array  # [G, B] int32 running request ids (-1 = empty slot)
    run_pos: jax.Array  # [G, B] int32 prompt tokens already in KV (cached + computed)
    run_gen: jax.Array  # [G, B] int32 output tokens generated
    run_nseg: jax.Array  # [G, B] int32 leading prompt segments locked in the cache
    run_res: jax.Array  # [G, B] int32 private KV tokens held (uncomputed-into-cache prompt + output)
    run_seq: jax.Array  # [G, B] int32 admission stamp (prefill budget order)
    n_admitted: jax.Array  # [] int32
    cached: jax.Array  # [G, M+1] bool segment in replica g's cache
    refcnt: jax.Array  # [G, M+1] int32 running requests locking the segment
    last_use: jax.Array  # [G, M+1] float32 LRU stamp
    pending: jax.Array  # [G, M+1] int32 unfinished requests dispatched to g that contain the segment
    view_present: jax.Array  # [G, M+1] bool router's record (snapshot + dispatches since)
    view_inflight: jax.Array  # [G] float32
    view_tokens: jax.Array  # [G] float32
    view_time: jax.Array  # [] float32 time of the last snapshot
    inflight: jax.Array  # [G] float32 live requests in flight
    inflight_tok: jax.Array  # [G] float32 live prompt + output tokens in flight
    tree: jax.Array  # [G, M+1] bool SGLang approximate tree (insert on dispatch)
    tree_size: jax.Array  # [G] float32 tokens in the tree per replica
    rec_replica: jax.Array  # [N] int32 (-1 = not routed)
    rec_admit: jax.Array  # [N] float32 (inf = not yet)
    rec_first: jax.Array  # [N] float32 first-token time
    rec_finish: jax.Array  # [N] float32
    rec_cached: jax.Array  # [N] int32 prompt tokens found in the cache at admission
    rep_area: jax.Array  # [] float32 integral of the replication factor over time
    rep_time: jax.Array  # [] float32 time with a non-empty cache
    overflow: jax.Array  # [] bool a fixed capacity was exceeded


def leading_match(present: jax.Array, seg_ids: jax.Array, seg_tok: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(segments, tokens) of the longest prefix whose segments are all present. present [..., M+1]."""
    ok = present[..., seg_ids] | (seg_tok == 0)
    lead = jnp.cumprod(ok.astype(jnp.int32), axis=-1)
    return jnp.sum(lead * (seg_tok > 0), axis=-1), jnp.sum(lead * seg_tok, axis=-1)


def _set_row(x, g, row):
    return x.at[g].set(row)


@dataclasses.dataclass(frozen=True)
class ReplicaCluster:
    """Static configuration (shapes); see the module docstring for the model."""

    n_replicas: int = 4
    chunk: int = 512  # prefill tokens per iteration
    max_running: int = 64  # B: running requests per replica
    max_queue: int = 256  # Q: local queue per replica
    max_admit: int = 4  # admissions per iteration
    local_order: str = "fcfs"  # or "lpm"

    def __post_init__(self):
        if self.n_replicas < 1 or self.chunk < 1 or self.max_running < 1 or self.max_queue < 1 or self.max_admit < 1:
            raise JaxrouteError("replicas, chunk, max_running, max_queue and max_admit must all be >= 1")
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
        return ReplicaState(
            req=req, next_req=jnp.int32(0), now=jnp.float32(0), clock=f((G,), INF), queue=i((G, Q), -1),
            run_req=i((G, B), -1), run_pos=i((G, B), 0), run_gen=i((G, B), 0), run_nseg=i((G, B), 0),
            run_res=i((G, B), 0), run_seq=i((G, B), 0), n_admitted=jnp.int32(0),
            cached=b((G, m1)), refcnt=i((G, m1), 0), last_use=f((G, m1), 0.0), pending=i((G, m1), 0),
            view_present=b((G, m1)), view_inflight=f((G,), 0.0), view_tokens=f((G,), 0.0),
            view_time=jnp.float32(-INF), inflight=f((G,), 0.0), inflight_tok=f((G,), 0.0),
            tree=b((G, m1)), tree_size=f((G,), 0.0),
            rec_replica=i((n,), -1), rec_admit=f((n,), INF), rec_first=f((n,), INF), rec_finish=f((n,), INF),
            rec_cached=i((n,), 0), rep_area=jnp.float32(0), rep_time=jnp.float32(0), overflow=jnp.bool_(False))

    def is_done(self, state: ReplicaState) -> jax.Array:
        return (state.next_req >= state.req.arrival_s.shape[0]) & jnp.all(jnp.isinf(state.clock))

    def step(self, state: ReplicaState, workload, params: ReplicaParams) -> ReplicaState:
        n = state.req.arrival_s.shape[0]
        a = jnp.where(state.next_req < n, state.req.arrival_s[jnp.minimum(state.next_req, n - 1)], INF)
        m = jnp.min(state.clock)
        t = jnp.minimum(a, m)
        branch = jnp.where(jnp.isinf(t), 0, jnp.where(a <= m, 1, 2))
        state = self._account(state, t)
        return jax.lax.switch(branch, [lambda s: s, lambda s: self._route(s, params, a),
                                       lambda s: self._iterate(s, params)], state)

    # ------------------------------------------------------------------ events

    def _account(self, s: ReplicaState, t: jax.Array) -> ReplicaState:
        """Integrate the replication factor up to event time t (no-op when the run is done)."""
        tok = s.cached * s.req.seg_len[None, :]
        total = jnp.sum(tok)
        unique = jnp.sum(jnp.any(s.cached, axis=0) * s.req.seg_len)
        dt = jnp.where(jnp.isinf(t), 0.0, t - s.now)
        has = unique > 0
        ratio = total / jnp.maximum(unique, 1)
        return dataclasses.replace(
            s, now=jnp.where(jnp.isinf(t), s.now, t),
            rep_area=s.rep_area + jnp.where(has, ratio * dt, 0.0), rep_time=s.rep_time + jnp.where(has, dt, 0.0))

    def _route(self, s: ReplicaState, params: ReplicaParams, t: jax.Array) -> ReplicaState:
        r = s.req
        i = s.next_req
        segs, tok = r.seg_ids[i], r.seg_tok[i]
        prompt = jnp.sum(tok)
        size = (prompt + r.out_tok[i]).astype(jnp.float32)
        out_seg = r.out_seg[i]
        refresh = t >= s.view_time + params.stale_s
        present = jnp.where(refresh, s.cached | (s.pending > 0), s.view_present)
        v_inf = jnp.where(refresh, s.inflight, s.view_inflight)
        v_tok = jnp.where(refresh, s.inflight_tok, s.view_tokens)
        v_time = jnp.where(refresh, t, s.view_time)
        _, match = leading_match(present, segs, tok)
        _, tmatch = leading_match(s.tree, segs, tok)
        view = routers.RouterView(v_inf, v_tok, match.astype(jnp.float32), tmatch.astype(jnp.float32),
                                  s.tree_size, prompt.astype(jnp.float32), i)
        g = routers.route(params.policy, view, params.router)
        # dispatch: local queue, loads, insert on dispatch into the router's records
        q = s.queue[g]
        free = q < 0
        slot = jnp.argmax(free)
        ok = jnp.any(free)
        queue = s.queue.at[g, slot].set(jnp.where(ok, i, q[slot]))
        all_segs = jnp.concatenate([segs, out_seg[None]])
        new_tree = ~s.tree[g, all_segs] & (all_segs < r.seg_len.shape[0] - 1)
        return dataclasses.replace(
            s, next_req=i + 1, queue=queue, overflow=s.overflow | ~ok,
            clock=s.clock.at[g].set(jnp.where(jnp.isinf(s.clock[g]), t, s.clock[g])),
            inflight=s.inflight.at[g].add(1.0), inflight_tok=s.inflight_tok.at[g].add(size),
            pending=s.pending.at[g, all_segs].add(1),
            view_present=present.at[g, all_segs].set(True), view_inflight=v_inf.at[g].add(1.0),
            view_tokens=v_tok.at[g].add(size), view_time=v_time,
            tree=s.tree.at[g, all_segs].set(True),
            tree_size=s.tree_size.at[g].add(jnp.sum(new_tree * r.seg_len[all_segs]).astype(jnp.float32)),
            rec_replica=s.rec_replica.at[i].set(g))

    def _iterate(self, s: ReplicaState, params: ReplicaParams) -> ReplicaState:
        r = s.req
        g = jnp.argmin(s.clock)
        t = s.clock[g]
        m1 = r.seg_len.shape[0]
        seg_len = r.seg_len
        prompt_all = jnp.sum(r.seg_tok, axis=1)  # [N]
        cap = params.kv_capacity
        # LRU eviction order of this replica (valid for the whole admission phase: admissions only
        # lock segments, and locked segments are never evictable).
        ids = jnp.arange(m1)
        order = jnp.lexsort((ids, -r.seg_depth, s.last_use[g]))

        row = dict(cached=s.cached[g], refcnt=s.refcnt[g], last_use=s.last_use[g], queue=s.queue[g],
                   run_req=s.run_req[g], run_pos=s.run_pos[g], run_gen=s.run_gen[g], run_nseg=s.run_nseg[g],
                   run_res=s.run_res[g], run_seq=s.run_seq[g], n_admitted=s.n_admitted, stop=jnp.bool_(False),
                   overflow=s.overflow, rec_admit=s.rec_admit, rec_cached=s.rec_cached)

        def admit(_, c):
            running = c["run_req"] >= 0
            rid = jnp.maximum(c["run_req"], 0)
            remaining = jnp.where(running, prompt_all[rid] - c["run_pos"], 0)
            qv = c["queue"] >= 0
            qid = jnp.maximum(c["queue"], 0)
            if self.local_order == "lpm":
                _, qmatch = leading_match(c["cached"], r.seg_ids[qid], r.seg_tok[qid])  # [Q]
                best = qv & (qmatch == jnp.max(jnp.where(qv, qmatch, -1)))
                qslot = jnp.argmin(jnp.where(best, c["queue"], jnp.iinfo(jnp.int32).max))
            else:
                qslot = jnp.argmin(jnp.where(qv, c["queue"], jnp.iinfo(jnp.int32).max))
            has = jnp.any(qv)
            cand = qid[qslot]
            segs, tok = r.seg_ids[cand], r.seg_tok[cand]
            nmatch, mtok = leading_match(c["cached"], segs, tok)
            need = prompt_all[cand] - mtok + r.out_tok[cand]
            used = jnp.sum(c["cached"] * seg_len) + jnp.sum(c["run_res"])
            free = cap - used
            pos = jnp.arange(segs.shape[0])
            in_prefix = jnp.zeros(m1, bool).at[segs].max(pos < nmatch)
            evictable = c["cached"] & (c["refcnt"] == 0) & ~in_prefix
            fits = need <= free + jnp.sum(evictable * seg_len)
            free_slot = ~running
            has_slot = jnp.any(free_slot)
            budget = jnp.sum(remaining) < self.chunk
            go = ~c["stop"] & has & budget & has_slot & fits
            full = ~c["stop"] & has & budget & fits & ~has_slot
            # evict LRU (leaves first) until the request fits
            deficit = jnp.maximum(need - free, 0)
            ev_sorted = evictable[order]
            len_sorted = seg_len[order] * ev_sorted
            before = jnp.cumsum(len_sorted) - len_sorted
            evict = jnp.zeros(m1, bool).at[order].set(ev_sorted & (before < deficit)) & go
            lock = (pos < nmatch) & go
            slot = jnp.argmax(free_slot)
            upd = lambda x, v: x.at[slot].set(jnp.where(go, v, x[slot]))
            return dict(
                cached=c["cached"] & ~evict,
                refcnt=c["refcnt"].at[segs].add(lock.astype(jnp.int32)),
                last_use=c["last_use"].at[segs].set(jnp.where(lock, t, c["last_use"][segs])),
                queue=c["queue"].at[qslot].set(jnp.where(go, -1, c["queue"][qslot])),
                run_req=upd(c["run_req"], cand), run_pos=upd(c["run_pos"], mtok), run_gen=upd(c["run_gen"], 0),
                run_nseg=upd(c["run_nseg"], nmatch), run_res=upd(c["run_res"], need),
                run_seq=upd(c["run_seq"], c["n_admitted"]), n_admitted=c["n_admitted"] + go,
                stop=c["stop"] | ~go, overflow=c["overflow"] | full,
                rec_admit=c["rec_admit"].at[cand].set(jnp.where(go, t, c["rec_admit"][cand])),
                rec_cached=c["rec_cached"].at[cand].set(jnp.where(go, mtok, c["rec_cached"][cand])))

        c = jax.lax.fori_loop(0, self.max_admit, admit, row)

        # ---- the batch
        running = c["run_req"] >= 0
        rid = jnp.maximum(c["run_req"], 0)
        prompt = jnp.where(running, prompt_all[rid], 0)
        pos, gen = c["run_pos"], c["run_gen"]
        remaining = prompt - pos
        prefilling = running & (remaining > 0)
        decoding = running & (remaining == 0)
        rank = jnp.argsort(jnp.where(prefilling, c["run_seq"], jnp.iinfo(jnp.int32).max))
        rem_sorted = jnp.where(prefilling, remaining, 0)[rank]
        before = jnp.cumsum(rem_sorted) - rem_sorted
        alloc = jnp.zeros_like(pos).at[rank].set(jnp.clip(self.chunk - before, 0, rem_sorted))
        dt = cost_models.step_time(params.cost, alloc.astype(jnp.float32), pos.astype(jnp.float32), alloc > 0,
                                   (prompt + gen).astype(jnp.float32), decoding)
        t_end = t + dt
        new_pos = pos + alloc

        # ---- segments completed by this iteration enter the cache
        segs = r.seg_ids[rid]  # [B, S]
        tok = r.seg_tok[rid]
        seg_end = jnp.cumsum(tok, axis=1)
        spos = jnp.arange(segs.shape[1])[None, :]
        nseg_new = jnp.where(running, jnp.sum((seg_end <= new_pos[:, None]) & (tok > 0), axis=1), 0)
        newly = (spos >= c["run_nseg"][:, None]) & (spos < nseg_new[:, None]) & running[:, None]
        touch_ins = (spos < nseg_new[:, None]) & jnp.any(newly, axis=1, keepdims=True)
        cached = c["cached"].at[segs].max(newly)
        refcnt = c["refcnt"].at[segs].add(newly.astype(jnp.int32))
        run_res = c["run_res"] - jnp.sum(newly * tok, axis=1)
        last_use = c["last_use"].at[segs].max(jnp.where(touch_ins, t_end, -INF))

        # ---- tokens and finishes
        first = prefilling & (new_pos >= prompt)
        new_gen = gen + (first | decoding)
        out = r.out_tok[rid]
        finished = running & (new_gen >= out)
        fin_seg = finished[:, None] & (tok > 0)
        refcnt = refcnt.at[segs].add(-fin_seg.astype(jnp.int32))
        last_use = last_use.at[segs].max(jnp.where(fin_seg, t_end, -INF))
        out_seg = r.out_seg[rid]
        keep_out = finished & (out_seg < m1 - 1)
        cached = cached.at[out_seg].max(keep_out)
        last_use = last_use.at[out_seg].max(jnp.where(keep_out, t_end, -INF))
        run_res = jnp.where(finished, 0, run_res)
        safe = jnp.where(running, c["run_req"], r.arrival_s.shape[0])  # out-of-range ids are dropped
        rec_first = s.rec_first.at[jnp.where(first, safe, r.arrival_s.shape[0])].set(t_end, mode="drop")
        rec_finish = s.rec_finish.at[jnp.where(finished, safe, r.arrival_s.shape[0])].set(t_end, mode="drop")
        # router-side bookkeeping of finished requests
        all_segs = jnp.concatenate([segs, out_seg[:, None]], axis=1)
        fin_all = jnp.concatenate([fin_seg | (finished[:, None] & (tok == 0)), finished[:, None]], axis=1)
        pending_g = s.pending[g].at[all_segs].add(-fin_all.astype(jnp.int32))
        n_fin = jnp.sum(finished).astype(jnp.float32)
        tok_fin = jnp.sum(jnp.where(finished, prompt + out, 0)).astype(jnp.float32)

        run_req = jnp.where(finished, -1, c["run_req"])
        busy = jnp.any(run_req >= 0) | jnp.any(c["queue"] >= 0)
        return dataclasses.replace(
            s, clock=s.clock.at[g].set(jnp.where(busy, t_end, INF)),
            queue=_set_row(s.queue, g, c["queue"]),
            run_req=_set_row(s.run_req, g, run_req), run_pos=_set_row(s.run_pos, g, new_pos),
            run_gen=_set_row(s.run_gen, g, new_gen), run_nseg=_set_row(s.run_nseg, g, nseg_new),
            run_res=_set_row(s.run_res, g, run_res), run_seq=_set_row(s.run_seq, g, c["run_seq"]),
            n_admitted=c["n_admitted"], cached=_set_row(s.cached, g, cached),
            refcnt=_set_row(s.refcnt, g, refcnt), last_use=_set_row(s.last_use, g, last_use),
            pending=_set_row(s.pending, g, pending_g),
            inflight=s.inflight.at[g].add(-n_fin), inflight_tok=s.inflight_tok.at[g].add(-tok_fin),
            rec_admit=c["rec_admit"], rec_cached=c["rec_cached"], rec_first=rec_first, rec_finish=rec_finish,
            overflow=c["overflow"])

    # ------------------------------------------------------------------ results

    def metrics(self, state: ReplicaState, workload, params: ReplicaParams) -> dict[str, jax.Array]:
        r = state.req
        n = r.arrival_s.shape[0]
        done = jnp.isfinite(state.rec_finish)
        prompt = jnp.sum(r.seg_tok, axis=1)
        lat = state.rec_finish - r.arrival_s
        ttft = state.rec_first - r.arrival_s
        multi = done & (r.out_tok > 1)
        tpot = (state.rec_finish - state.rec_first) / jnp.maximum(r.out_tok - 1, 1)
        arrived = state.next_req
        in_queue = jnp.sum(state.queue >= 0)
        running = jnp.sum(state.run_req >= 0)
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
            "overflow": state.overflow | (completed < n),
            "conservation_error": jnp.abs(arrived - (completed + in_queue + running)),
        }


def run_single(model: ReplicaCluster, key, workload, params: ReplicaParams) -> ReplicaState:
    """One run to completion with a while loop (for tests and per-request records)."""

    @jax.jit
    def go(key, workload, params):
        state = model.init(key, workload, params)
        return jax.lax.while_loop(lambda s: ~model.is_done(s), lambda s: model.step(s, workload, params), state)

    return go(key, workload, params)


def records(state: ReplicaState) -> dict[str, np.ndarray]:
    """Per-request records as host arrays."""
    r = state.req
    return {"arrival_s": np.asarray(r.arrival_s), "replica": np.asarray(state.rec_replica),
            "dispatch_s": np.asarray(r.arrival_s), "admit_s": np.asarray(state.rec_admit),
            "first_token_s": np.asarray(state.rec_first), "finish_s": np.asarray(state.rec_finish),
            "cached_tokens": np.asarray(state.rec_cached), "prompt_tokens": np.asarray(r.seg_tok.sum(1)),
            "output_tokens": np.asarray(r.out_tok)}

