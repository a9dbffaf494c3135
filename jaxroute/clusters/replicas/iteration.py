"""One replica iteration (continuous batching with chunked prefill) and the exact event leap.

One iteration on replica g at time t:
1. Admission, at most `max_admit` requests, in local order (fcfs = arrival order; lpm = most
   cached prompt tokens first, ties by arrival). It stops at the first request that does not
   fit, when the running set is full, or once the running requests' remaining prefill reaches
   `chunk`. A request fits when (prompt - cached prefix) + output <= free KV + tokens of
   unlocked cached segments. Segments are evicted in LRU order (`prefix_cache.evict_lru`) until the
   request fits. Its matched segments are locked and touched at t.
2. The batch: prefilling requests in admission order share `chunk` new tokens; every request
   whose prefill was complete before the iteration decodes one token. The time comes from
   `cost_models.step_time`; the iteration ends at t + dt.
3. At t + dt: a segment whose tokens are all computed enters the cache (locked; the request's
   private copy is released), and the prefix up to it is touched. A request whose prefill ends
   gets its first token; a request with all output tokens finishes, unlocks its segments,
   touches them, and leaves its output in the cache when the workload keeps it (multi-turn).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxroute import cost_models
from jaxroute.clusters.prefix_cache import evict_lru, leading_match
from jaxroute.clusters.replicas.types import Replica, ReplicaParams
from jaxroute.workloads.prefix import RequestTable

INF = jnp.inf


def iterate_row(model, row: Replica, r: RequestTable, t: jax.Array, params: ReplicaParams,
                n_admitted: jax.Array, next_arrival: jax.Array):
    """One iteration of replica `row` starting at time t: (new row, side outputs). `model` gives the
    static sizes (chunk, max_admit, local_order, leap).

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
    A = model.max_admit
    cache_tok = jnp.sum(row.cached * seg_len)
    unlocked_tok = jnp.sum((row.cached & (row.refcnt == 0)) * seg_len)

    def admit(k, c):
        rw = c["row"]
        running = rw.run_req >= 0
        rid = jnp.maximum(rw.run_req, 0)
        remaining = jnp.where(running, r.prompt_tok[rid] - rw.run_pos, 0)
        qv = rw.queue >= 0
        qid = jnp.maximum(rw.queue, 0)
        if model.local_order == "lpm":
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
        budget = jnp.sum(remaining) < model.chunk
        go = ~c["stop"] & has & budget & has_slot & fits
        full = ~c["stop"] & has & budget & fits & ~has_slot
        blocked = ~c["stop"] & has & budget & (~fits | ~has_slot)
        lock = in_prefix & go
        refcnt = rw.refcnt.at[segs].add(lock.astype(jnp.int32))
        deficit = jnp.where(go, jnp.maximum(need - free, 0), 0)
        evict, freed, _ = evict_lru(rw.cached & (refcnt == 0), rw.last_use, r.seg_depth, seg_len, deficit)
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
    alloc = jnp.clip(model.chunk - before, 0, rem)
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
    if model.leap > 0:
        big = jnp.iinfo(jnp.int32).max
        left = jnp.where(decoding, out - new_gen, big)  # iterations until each decoder finishes
        first_fin = jnp.min(left)
        pre = running & (new_pos < prompt)  # still prefilling
        has_f = jnp.any(pre)
        f = jnp.argmin(jnp.where(pre, rw.run_seq, big))  # the one that gets the whole chunk
        rem_f = prompt[f] - new_pos[f]
        bound = jnp.min(jnp.where((seg_end[f] > new_pos[f]) & (tok[f] > 0), seg_end[f], big))
        j_seg = (bound - new_pos[f] + model.chunk - 1) // model.chunk  # iteration completing a segment
        eventless = (~jnp.any(first) & jnp.all(completed_segments(new_pos) == rw.run_nseg)
                     & (first_fin > 0))
        # admission stays impossible: the chunk is full (rem_f > chunk), or the queue is empty or
        # blocked by memory/slots (which only a finish can free)
        quiet = eventless & (has_f | (jnp.any(decoding) & (~jnp.any(rw.queue >= 0) | c["blocked"])))
        j = jnp.arange(1, model.leap + 1)
        is_f = (jnp.arange(pos.shape[0]) == f) & has_f
        ctx = (prompt + new_gen).astype(jnp.float32)
        alloc_f = jnp.where(is_f, model.chunk, 0).astype(jnp.float32)

        def dt_j(jj):
            shift = (jj - 1).astype(jnp.float32)
            return cost_models.step_time(params.cost, alloc_f, new_pos.astype(jnp.float32) + shift * alloc_f,
                                         alloc_f > 0, ctx + shift, decoding)

        dts = jax.vmap(dt_j)(j)
        ends = t_end + jnp.cumsum(dts)
        prefill_ok = ~has_f | ((rem_f - (j - 1) * model.chunk > model.chunk) & (j <= j_seg))
        ok = quiet & (j <= first_fin) & (ends - dts < next_arrival) & prefill_ok
        k = jnp.sum(ok)  # ok is a prefix of j
        t_end = jnp.where(k > 0, ends[jnp.maximum(k - 1, 0)], t_end)
        new_gen = new_gen + jnp.where(decoding, k, 0)
        new_pos = new_pos + jnp.where(is_f, k * model.chunk, 0)

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
