"""One replica iteration (continuous batching with chunked prefill) and the exact event leap.

One iteration on replica g at time t, in phases (`iterate_row` calls each in turn: `_allocate_running` (on-demand),
`_priority_turn`, `_admit_queued`, `_run_batch`, `_leap`, `_complete_segments`):
1. Admission, at most `max_admit` requests, in local order (fcfs = arrival order; lpm = most
   cached prompt tokens first, ties by arrival; priority = Preble's priority groups, below). It
   stops at the first request that does not fit, when the running set is full, or once the
   running requests' remaining prefill reaches `chunk`. A request fits when its KV need <= free KV + tokens of unlocked cached segments.
   Segments are evicted in LRU order (`prefix_cache.evict_lru`) until the request fits. Its
   matched segments are locked and touched at t. A fully cached prompt still computes its last
   token (as vLLM does: its logits give the first output token).
2. The batch: prefilling requests in admission order share `chunk` new tokens; every request
   whose prefill was complete before the iteration decodes one token. The time comes from
   `cost_models.step_time`; the iteration ends at t + dt.
3. At t + dt: a segment whose tokens are all computed enters the cache (locked; the request's
   private copy is released), and the prefix up to it is touched. A request whose prefill ends
   gets its first token; a request with all output tokens finishes, unlocks its segments,
   touches them, and leaves its output in the cache when the workload keeps it (multi-turn).

KV admission (`ReplicaModel.admission`, static):
- "reserve": a request's need is its uncached prompt + its whole output, reserved at admission
  (SGLang-like; no preemption ever).
- "on-demand" (vLLM V1, vllm/v1/core/sched/scheduler.py `Scheduler.schedule` and
  vllm/v1/core/kv_cache_manager.py `allocate_slots`; line numbers below are vLLM v0.33.0): KV is
  allocated step by step for the tokens a request computes, and a running request that cannot get
  its tokens preempts the last admitted one. Before admission, the running requests, in admission
  order, each allocate this step's tokens (`_allocate_running`); a request whose tokens do not fit
  (free + evictable tokens) preempts the running request admitted last (recompute mode: its private
  KV is freed, its segments unlocked, and it waits at the front of the local queue), possibly
  itself. Admission is skipped in an iteration that preempted; otherwise a waiting request needs
  room only for the tokens it computes in this iteration (its share of `chunk`). A readmitted
  request recomputes its prompt (minus the cached prefix) and the output tokens it had generated,
  then goes on decoding; its admit time and cached tokens stay those of its first admission.

  Our model differs from vLLM where segments and our batch rules differ:
  - KV is counted in tokens, not blocks (block_size = 1 for private KV; the cache still holds
    whole segments), and there is no watermark (vLLM's default `watermark=0.0`,
    kv_cache_manager.py:148) and no `scheduler_reserve_full_isl` admission gate.
  - A step allocates the KV of the tokens it computes *and* of the token it samples (vLLM
    allocates the sampled token's slot one step later, as the next step's input): a request holds
    at most one token more than in vLLM, and at its finish exactly what "reserve" would have
    reserved, so leaving its output in the cache never exceeds the capacity.
  - Decode tokens do not use the `chunk` budget (as in "reserve"; vLLM counts them in
    `max_num_batched_tokens`).
  - The running requests' allocations evict LRU segments once, after the preemptions are decided
    (vLLM evicts block by block while allocating). The decisions are the same, as they only count
    free + evictable tokens; a preempted request's segments are touched at t, so they are evicted
    after every segment used before t (vLLM appends freed blocks at the free queue's tail).
  - A preempted request's partial segment and its output are not cached (vLLM caches their full
    blocks): on readmission only its whole cached prompt segments are hits.
  - With lpm, preempted requests still wait at the front (latest preemption first), ahead of the
    lpm order (vLLM has no lpm).

Priority groups (`local_order="priority"`, the `fcfs-mpq` local scheduler of Preble's engine fork,
WukLab/preble `srt/managers/router/model_rpc.py:470-493`, `get_schedule_group` at :790-801): a
request joins group `priority_group(cached, prompt, P)` of P (its hit ratio on the replica's cache
when it is dispatched, fixed from then on: model_rpc.py:473-479 groups a request once, when it
enters the scheduler). An iteration that can admit (a request waits, the chunk has room, a slot is
free, nothing was preempted) takes the replica's group cursor (`Replica.q_cursor`, starting at
the top group P - 1): the first non-empty group at or below it, cyclically, and moves the cursor
one group down. It admits from that group only, in arrival order, at most (group + 1) x
`PRIORITY_QUOTA` requests (model_rpc.py:484-486, k = 10) and `max_admit`. Over a round of P
admitting iterations, group j gets up to (j + 1) x 10 admissions: 10, 9, ..., 1 parts of 55 (the
lecture's exercise 5). Differences from Preble's code: a request that does not fit stops the
admission (Preble's `schedule_within_group` skips it and tries the next); a preempted request
(on-demand) is readmitted first, as with lpm.

Event leaping (exact; see `iterate_row`) runs in both modes; in "on-demand" a leaped iteration must
also find its tokens in free KV (no eviction, no preemption), so the leap stops before one that
would need either.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxroute import cost_models
from jaxroute.clusters.prefix_cache import leading_run
from jaxroute.clusters.replicas import adapters as lora_lib
from jaxroute.clusters.replicas import tiers as tier_lib
from jaxroute.clusters.replicas.cache import (
    Replication,
    SlotTable,
    evicted,
    insert,
    settle_evictions,
)
from jaxroute.clusters.replicas.local_queue import Entries, Ring
from jaxroute.clusters.replicas.tiers import Tiers
from jaxroute.clusters.replicas.types import NO_SEGMENT_END, Replica, ReplicaParams
from jaxroute.loops import for_each
from jaxroute.workloads.prefix import RequestTable

INF = jnp.inf
PRIORITY_QUOTA = 10  # Preble's k: group j admits up to (j + 1) x k requests in its turn (model_rpc.py:484)


def priority_group(cached: jax.Array, prompt: jax.Array, n_groups: int) -> jax.Array:
    """Preble's group of a request with `cached` of `prompt` tokens hit: 0 with no hit, else
    ceil(hit ratio x P) - 1 (model_rpc.py:474-478; 63 of 100 cached, P = 10 -> 6), in integers."""
    return jnp.where(cached > 0, (cached * n_groups + prompt - 1) // prompt - 1, 0).astype(jnp.int32)


def next_segment_end(r: RequestTable, q: jax.Array, nseg: jax.Array) -> jax.Array:
    """Prompt tokens at the end of request q's segment `nseg` (its first not completed; [] or [B]), or
    NO_SEGMENT_END when its prompt has no such segment."""
    S = r.seg_tok.shape[1]
    k = jnp.minimum(nseg, S - 1)
    return jnp.where((nseg < S) & (r.seg_tok[q, k] > 0), r.seg_end[q, k], NO_SEGMENT_END)


def _allocate_running(model, row: Replica, ring: Ring, cache: SlotTable, index: jax.Array, g: jax.Array,
                      r: RequestTable, t: jax.Array, cap: jax.Array, active: jax.Array):
    """On-demand admission, step 1 (vLLM's RUNNING loop, scheduler.py:794-1036): every running
    request allocates this iteration's tokens, in admission order, preempting from the tail.

    A request computes its share of `chunk` (prefill) or one token (decode), scheduler.py:839-848,
    plus the token it samples. When it does not fit, the running request admitted last is preempted
    (FCFS: `self.running[-1]`/`pop()`, scheduler.py:938/970), until it fits or it preempted itself
    (scheduler.py:978-980). Preemption (scheduler.py:1799-1843, recompute): its KV is freed
    (1817), its progress reset (1822), and it is put at the front of the waiting queue (1842).

    In closed form: requests 1..k of the admission order keep running, k the largest with
    a_1 + ... + a_k <= avail + freed(k+1..n). The loop below preempts from the tail while the
    survivors' tokens exceed the available tokens (one loop step per preemption, usually none).
    Returns (row, ring, cache, number preempted, preempted requests the full local queue refused, [B] the
    preempted requests' ids, -1 elsewhere). An inactive
    row (its result is discarded) preempts and evicts nothing, so a batched loop runs only for rows that
    need it."""
    seg_len = r.seg_len
    running = row.run_req >= 0
    rid = jnp.maximum(row.run_req, 0)
    rem = jnp.where(running, row.run_tgt - row.run_pos, 0)
    prefilling = running & (rem > 0)
    earlier = row.run_seq[None, :] < row.run_seq[:, None]
    before = jnp.sum(earlier * jnp.where(prefilling, rem, 0)[None, :], axis=1)
    share = jnp.clip(model.chunk - before, 0, rem)
    # prefill: its share (+ the first/next token when it completes); decode: one token
    a = jnp.where(prefilling, share + (share == rem), running.astype(jnp.int32))
    spos = jnp.arange(r.seg_ids.shape[1])
    unlocked_tok = cache.tokens - cache.locked_tokens(seg_len)
    # vLLM's free blocks include the evictable cached ones (kv_cache_manager.py:584-588)
    avail = cap - cache.tokens - jnp.sum(row.run_res) + unlocked_tok

    def cond(c):
        _, _, _, alive, avail, _, _ = c
        return active & jnp.any(alive) & (jnp.sum(jnp.where(alive, a, 0)) > avail)

    def body(c):
        rw, rg, ch, alive, avail, unlocked, refused = c
        v = jnp.argmax(jnp.where(alive, rw.run_seq, -1))  # admitted last
        sv, tv = r.seg_ids[rid[v]], r.seg_tok[rid[v]]
        lock = (spos < rw.run_nseg[v]) & (tv > 0)
        ch = ch.lock(index, g, sv, lock, -1)
        freed = jnp.sum(jnp.where(lock & (ch.refs(index, g, sv) == 0), tv, 0))
        ch = ch.stamp(index, g, sv, lock, t)
        stamp, res_v = rw.n_preempt + 1, rw.run_res[v]
        rg, ok = rg.push_front(rw.run_req[v], rw.run_gen[v], stamp, True)
        clear = lambda x: x.at[v].set(0)
        rw = dataclasses.replace(
            rw, n_preempt=stamp, run_req=rw.run_req.at[v].set(-1), run_pos=clear(rw.run_pos),
            run_gen=clear(rw.run_gen), run_nseg=clear(rw.run_nseg), run_res=clear(rw.run_res),
            run_tgt=clear(rw.run_tgt))
        return rw, rg, ch, alive.at[v].set(False), avail + res_v + freed, unlocked + freed, refused + ~ok

    init = (row, ring, cache, running, avail, unlocked_tok, jnp.int32(0))
    rw, ring, cache, alive, _, unlocked_tok, refused = jax.lax.while_loop(cond, body, init)
    run_res = rw.run_res + jnp.where(alive, a, 0)
    deficit = jnp.where(active, cache.tokens + jnp.sum(run_res) - cap, 0)  # an inactive row keeps its cache
    cache, _ = cache.evict(deficit, unlocked_tok, seg_len, r.seg_depth)
    rw = dataclasses.replace(rw, run_res=run_res)
    preempted = jnp.where(running & ~alive, row.run_req, -1)
    return rw, ring, cache, rw.n_preempt - row.n_preempt, refused, preempted


def iterate_row(model, row: Replica, ring: Ring, entries: Entries, cache: SlotTable, index: jax.Array,
                g: jax.Array, acct: Replication, r: RequestTable, t: jax.Array, params: ReplicaParams,
                n_admitted: jax.Array, next_arrival: jax.Array, active: jax.Array, groups: jax.Array,
                tiers: Tiers | None = None, lora: lora_lib.Row | None = None):
    """One iteration of replica g (`row`: its running set; `ring`, `entries`: its local queue, `groups` [N]
    each request's priority group (read with local order "priority" only); `cache` its
    cache table; `index` [G, M+1] the cluster's cache index, `acct` its replication counts) starting at
    time t: (new row, ring, cache, index, acct, a cache table was full,
    side outputs; side["rid"] [B] and side["finished"] [B] say which requests finished, whose segments the
    caller takes off the pending counts).
    `model` gives the static sizes (chunk, max_admit, local_order, admission, leap). `active` False: the
    caller discards the row (a routing event): the admission and preemption loops stop at once (under
    `vmap` they then run only as many times as the rows that do iterate need), and the cache and
    accounting come back unchanged, so the caller keeps them without a select.

    Event leaping (exact): after this iteration, if it had no event (no prefill completed, no
    segment completed, no finish, no preemption) and the next iterations cannot admit anything (a
    prefilling request still fills the whole chunk, or the queue is empty or blocked by
    memory/slots, which only a finish frees), up to `leap` further iterations run in this step. They
    stop at the first one that completes a segment or finishes a request (included), never start at
    or after the next arrival, and (on-demand) never need more KV than is free, so the events are
    exactly those of stepping one by one.

    side["kv_area"] is the integral of this row's `kv_in_use` over the iteration(s): KV is taken at
    an iteration's start (admission, allocation) and released at its end, so it is constant within one.

    `tiers` (the KV offload tiers, read only; `tiers.py`): admissions also match segments held in the tiers and
    load them (the iteration takes the load time longer); side["evicted"] [C] (-1 = none) and
    side["evicted_last"] [C] are the segments the GPU cache evicted and their stamps, for the caller to move down.

    `lora` (the replica's adapter slots and running counts; `adapters.py`): admission passes over requests whose
    adapter is not admissible, loads missing adapters (the iteration takes their load time longer), and the
    step time grows with the distinct adapters in the batch; side["lora"] is the row after the iteration.
    """
    seg_len = r.seg_len
    on_demand = model.admission == "on-demand"
    cache0 = cache
    if model.local_order in ("lpm", "priority") or lora is not None:  # before a preempted request is put in front
        ring = ring.skip_holes(entries)
    if on_demand:
        row, ring, cache, n_pre, q_refused, preempted = _allocate_running(model, row, ring, cache, index, g, r, t,
                                                                          params.kv_capacity, active)
    else:
        n_pre, q_refused, preempted = jnp.int32(0), jnp.int32(0), jnp.full(row.run_req.shape, -1, jnp.int32)
    if lora is not None and on_demand:  # preempted requests leave the running set
        lora = lora_lib.release(lora, r.adapter[jnp.maximum(preempted, 0)], preempted >= 0, t)
    row, turn = _priority_turn(model, row, ring, entries, groups, n_pre, active)
    adm = _admit_queued(model, row, ring, entries, cache, index, g, r, t, params, n_admitted, n_pre, active, groups,
                        turn, tiers, lora)
    rw, ring, cache = adm["row"], adm["ring"], adm["cache"]
    acct = settle_evictions(cache0, cache, acct, seg_len)  # evictions only so far; insertions below
    if tiers is not None:  # the GPU's victims and their stamps (a freed slot keeps its stamp), for the tiers
        adm["evicted"], adm["evicted_last"] = jnp.where(evicted(cache0, cache), cache0.seg, -1), cache.last
    kv_start = (cache.tokens - adm["unlocked_tok"] + jnp.sum(rw.run_res)).astype(jnp.float32)  # locked + private
    factor = None
    if lora is not None:  # the batch's LoRA cost: per distinct adapter among the running requests
        factor = 1.0 + params.lora.step_overhead * lora_lib.distinct(adm["lora"]).astype(jnp.float32)
    b = _run_batch(model, rw, r, t, params, active, kv_start, adm.get("load_s"), factor)
    if model.leap > 0:
        blocked = adm["blocked"]
        if tiers is not None and on_demand:  # another replica's eviction from the shared tier can shrink a waiting
            blocked = blocked & (params.tiers.shared_tokens == 0)  # request's need (it computes what it loaded)
        b = _leap(model, b, rw, ring, cache, params, blocked, n_pre, next_arrival, kv_start, factor)
    out = _complete_segments(rw, ring, cache, index, acct, g, r, b, adm, n_pre, q_refused, preempted)
    if lora is not None:  # finished requests leave the running set at the iteration's end
        side = out[-1]
        side["lora"] = lora_lib.release(adm["lora"], r.adapter[side["rid"]], side["finished"], b.t_end)
        side.update(lora_loads=adm["lora_loads"], lora_hits=adm["lora_hits"], lora_asks=adm["lora_asks"])
    return out


class PriorityTurn(NamedTuple):
    """Preble's priority groups: which group admits in this iteration, and how many it may admit."""

    group: jax.Array | None  # [] int32 the group whose turn it is (None: not local order "priority")
    quota: jax.Array  # [] int32 admissions allowed this iteration


def _priority_turn(model, row: Replica, ring: Ring, entries: Entries, groups: jax.Array, n_pre: jax.Array,
                   active: jax.Array) -> tuple[Replica, PriorityTurn]:
    """With local order "priority", this iteration's group: the first non-empty one at or below the cursor,
    cyclically (else every request may be admitted, up to max_admit)."""
    A = model.max_admit
    if model.local_order != "priority":
        return row, PriorityTurn(None, jnp.int32(A))
    P = model.priority_groups
    ids = entries.row()
    waiting = ring.in_span() & (ids >= 0)
    group_of = groups[jnp.maximum(ids, 0)]  # [Q]
    nonempty = jnp.zeros((P,), bool).at[group_of].max(waiting)
    order = (row.q_cursor - jnp.arange(P)) % P
    chosen_group = order[jnp.argmax(nonempty[order])]
    remaining0 = jnp.where(row.run_req >= 0, row.run_tgt - row.run_pos, 0)
    attempt = (active & (n_pre == 0) & jnp.any(nonempty) & (jnp.sum(remaining0) < model.chunk)
               & jnp.any(row.run_req < 0))
    row = dataclasses.replace(row, q_cursor=jnp.where(attempt, (chosen_group - 1) % P, row.q_cursor))
    quota = jnp.minimum(A, (chosen_group + 1) * PRIORITY_QUOTA)
    return row, PriorityTurn(chosen_group, quota)


def _admit_queued(model, row: Replica, ring: Ring, entries: Entries, cache: SlotTable, index: jax.Array,
                  g: jax.Array, r: RequestTable, t: jax.Array, params: ReplicaParams, n_admitted: jax.Array,
                  n_pre: jax.Array, active: jax.Array, groups: jax.Array, turn: PriorityTurn,
                  tiers: Tiers | None, lora: lora_lib.Row | None) -> dict:
    """Admission from the local queue (vLLM's WAITING loop; "reserve": the whole prompt and output at once),
    one request a trip while one can be admitted: its cached prefix is locked and stamped, evictions make room.
    Returns the loop's carry (row, ring, cache, admissions made, whether the queue was blocked or full, ...)."""
    seg_len = r.seg_len
    cap = params.kv_capacity
    A = model.max_admit
    on_demand = model.admission == "on-demand"
    priority = model.local_order == "priority"
    quota, chosen_group = turn.quota, turn.group
    unlocked_tok = cache.tokens - cache.locked_tokens(seg_len)

    def may_admit(c):
        """Another admission is possible: not stopped, a request waits, the chunk has room (cheap,
        so the loop body runs only while some row can admit)."""
        rw = c["row"]
        remaining = jnp.where(rw.run_req >= 0, rw.run_tgt - rw.run_pos, 0)
        return (c["k"] < quota) & ~c["stop"] & (c["ring"].count > 0) & (jnp.sum(remaining) < model.chunk)

    def admit(c):
        rw, rg, ch, k = c["row"], c["ring"], c["cache"], c["k"]
        running = rw.run_req >= 0
        remaining = jnp.where(running, rw.run_tgt - rw.run_pos, 0)
        # fcfs: the ring's head (arrival order; preempted requests wait in front of it, the latest first,
        # scheduler.py:1842); lpm: the most cached prompt tokens, ties by arrival, preempted ones first
        qpos, has = rg.head, rg.count > 0
        if model.local_order in ("lpm", "priority") or lora is not None:
            ids = entries.row()  # [Q]
            qv = rg.in_span() & (ids >= 0) & jnp.all(jnp.arange(rg.size)[:, None] != c["taken"][None, :], axis=1)
            big = jnp.iinfo(jnp.int32).max
            if lora is not None:  # requests whose adapter cannot run now are passed over (vLLM's skip)
                qv = qv & lora_lib.admissible(c["lora"], r.adapter[jnp.maximum(ids, 0)])
            if priority:  # arrival order within the chosen group
                best = qv & (groups[jnp.maximum(ids, 0)] == chosen_group)
            elif model.local_order == "lpm":
                qid = jnp.maximum(ids, 0)
                _, qmatch = leading_run(ch.present(index, g, r.seg_ids[qid]), r.seg_tok[qid])  # [Q]
                best = qv & (qmatch == jnp.max(jnp.where(qv, qmatch, -1)))
            else:  # fcfs: the admissible request nearest the head
                best = qv
                ids = (jnp.arange(rg.size) - rg.head) % rg.size
            pick_pos = jnp.argmin(jnp.where(best, ids, big))
            front_first = entries.preempted(rg.head)[1] > 0 if on_demand else jnp.bool_(False)
            if lora is not None:
                front_first = front_first & lora_lib.admissible(c["lora"], r.adapter[jnp.maximum(entries.at(rg.head), 0)])
            qpos = jnp.where(front_first, rg.head, pick_pos)
            if priority or lora is not None:
                has = has & (front_first | jnp.any(best))
        cand = jnp.maximum(entries.at(qpos), 0)
        if on_demand:
            gen0, stamp0 = entries.preempted(qpos)
            resumed = stamp0 > 0
        else:  # nothing is ever preempted
            gen0, resumed = jnp.int32(0), jnp.bool_(False)
        tgt = r.prompt_tok[cand] + gen0  # a resumed request recomputes its output too (scheduler.py:1306)
        segs, tok = r.seg_ids[cand], r.seg_tok[cand]
        on_gpu = ch.present(index, g, segs)
        nmatch, mtok = leading_run(on_gpu, tok)
        load_tok = cpu_tok = shared_tok = n_all = jnp.int32(0)
        if tiers is not None:  # segments after the GPU prefix found in the offload tiers are loaded (tiers.py)
            from_cpu, from_shared = tier_lib.loads(tiers, g, segs, tok, on_gpu)
            cpu_tok, shared_tok = jnp.sum(from_cpu * tok), jnp.sum(from_shared * tok)
            load_tok, n_all = cpu_tok + shared_tok, nmatch + jnp.sum(from_cpu | from_shared)
        # a fully cached prompt still computes its last token, whose logits give the first output token
        # (vLLM kv_cache_manager.get_computed_blocks: at most num_tokens - 1 tokens come from the cache)
        start = jnp.minimum(mtok + load_tok, tgt - 1)
        if r.landed is not None:  # KV transferred in (held privately, as an uncached prompt would be)
            if on_demand:
                raise ValueError("requests whose KV lands with them need admission 'reserve'")
            start = jnp.where(r.landed[cand] & ~resumed, tgt - 1, start)
        if on_demand:
            # room for this step's tokens only (scheduler.py:1346; allocate_slots at 1435-1452); a request
            # that does not fit blocks the queue (1454-1461), as in "reserve"
            share = jnp.minimum(tgt - start, model.chunk - jnp.sum(remaining))
            need = share + (share == tgt - start) + (start - mtok)  # + the loaded tokens, held privately
        else:
            need = r.prompt_tok[cand] - mtok + r.out_tok[cand]
        free = cap - ch.tokens - jnp.sum(rw.run_res)
        pos = jnp.arange(segs.shape[0])
        in_prefix = pos < nmatch
        prefix_unlocked = in_prefix & (ch.refs(index, g, segs) == 0)
        evictable_tok = c["unlocked_tok"] - jnp.sum(prefix_unlocked * tok)
        fits = need <= free + evictable_tok
        free_slot = ~running
        has_slot = jnp.any(free_slot)
        budget = jnp.sum(remaining) < model.chunk
        go = ~c["stop"] & has & budget & has_slot & fits
        full = ~c["stop"] & has & budget & fits & ~has_slot
        blocked = ~c["stop"] & has & budget & (~fits | ~has_slot)
        lock = in_prefix & go
        ch = ch.lock(index, g, segs, lock, 1)
        deficit = jnp.where(go, jnp.maximum(need - free, 0), 0)
        # `fits`: the unlocked tokens outside the request's prefix cover the deficit
        ch, freed = ch.evict(deficit, evictable_tok, seg_len, r.seg_depth)
        ch = ch.stamp(index, g, segs, lock, t)
        slot = jnp.argmax(free_slot)
        upd = lambda x, v: x.at[slot].set(jnp.where(go, v, x[slot]))
        rg = rg.take(qpos, go)
        load_s = c.get("load_s")
        if tiers is not None:  # the loads before the step: KV from the tiers, then a missing adapter
            load_s = load_s + jnp.where(go, tier_lib.load_time(params.tiers, cpu_tok, shared_tok), 0.0)
        adapter_carry = {}
        if lora is not None:
            adapter_carry = _acquire_adapter(c, load_s, r.adapter[cand], t, go, params.lora.load_s)
            load_s = adapter_carry.pop("load_s")
        rw = dataclasses.replace(
            rw, run_req=upd(rw.run_req, cand), run_pos=upd(rw.run_pos, start), run_gen=upd(rw.run_gen, gen0),
            run_nseg=upd(rw.run_nseg, nmatch), run_nend=upd(rw.run_nend, next_segment_end(r, cand, nmatch)),
            run_res=upd(rw.run_res, need),
            run_seq=upd(rw.run_seq, c["n_admitted"]), run_tgt=upd(rw.run_tgt, tgt))
        return dict(row=rw, ring=rg, taken=c["taken"].at[k].set(jnp.where(go, qpos, rg.size)), cache=ch, k=k + 1,
                    n_admitted=c["n_admitted"] + go, stop=c["stop"] | ~go,
                    blocked=c["blocked"] | blocked, full=c["full"] | full,
                    unlocked_tok=c["unlocked_tok"] - freed - jnp.sum(jnp.where(go, prefix_unlocked * tok, 0)),
                    adm_go=c["adm_go"].at[k].set(go), adm_id=c["adm_id"].at[k].set(cand),
                    adm_tok=c["adm_tok"].at[k].set(mtok), adm_new=c["adm_new"].at[k].set(~resumed),
                    **({} if tiers is None else dict(
                        adm_ngpu=c["adm_ngpu"].at[k].set(nmatch), adm_nall=c["adm_nall"].at[k].set(n_all),
                        adm_cpu=c["adm_cpu"].at[k].set(cpu_tok), adm_shared=c["adm_shared"].at[k].set(shared_tok))),
                    **({} if load_s is None else dict(load_s=load_s)), **adapter_carry)

    # no admission in an iteration that preempted (scheduler.py:1050 `if not preempted_reqs`)
    c0 = dict(row=row, ring=ring, taken=jnp.full((A,), ring.size, jnp.int32), cache=cache, k=jnp.int32(0), n_admitted=n_admitted, stop=(n_pre > 0) | ~active,
              blocked=jnp.bool_(False), full=jnp.bool_(False), unlocked_tok=unlocked_tok,
              adm_go=jnp.zeros(A, bool), adm_id=jnp.zeros(A, jnp.int32), adm_tok=jnp.zeros(A, jnp.int32),
              adm_new=jnp.zeros(A, bool))
    if tiers is not None or lora is not None:
        c0.update(load_s=jnp.float32(0))
    if tiers is not None:
        z = jnp.zeros(A, jnp.int32)
        c0.update(adm_ngpu=z, adm_nall=z, adm_cpu=z, adm_shared=z)
    if lora is not None:
        c0.update(lora=lora, lora_loads=jnp.int32(0), lora_hits=jnp.int32(0), lora_asks=jnp.int32(0))
    return jax.lax.while_loop(may_admit, admit, c0)


def _acquire_adapter(c: dict, load_s: jax.Array, adapter: jax.Array, t: jax.Array, go: jax.Array,
                     adapter_load_s: jax.Array) -> dict:
    """The carry's adapter row after admitting a request of `adapter` (where `go`), its load time added to the
    iteration's `load_s`."""
    row, loaded, hit = lora_lib.acquire(c["lora"], adapter, t, go)
    return dict(lora=row, load_s=load_s + jnp.where(loaded, adapter_load_s, 0.0), lora_loads=c["lora_loads"] + loaded,
                lora_hits=c["lora_hits"] + hit, lora_asks=c["lora_asks"] + (go & (adapter >= 0)))


class Batch(NamedTuple):
    """One iteration's batch (and the iterations leaped after it): [B] per running-set slot."""

    running: jax.Array  # [B] bool a request runs in the slot (and the row iterates)
    rid: jax.Array  # [B] int32 its request (0 where none)
    prompt: jax.Array  # [B] int32 its prompt tokens
    tgt: jax.Array  # [B] int32 its prefill target (0 where none runs)
    decoding: jax.Array  # [B] bool it decodes (its prefill was done before the iteration)
    done_pre: jax.Array  # [B] bool its prefill (or recompute) completes in the iteration: a token is sampled
    first: jax.Array  # [B] bool that token is its first
    out: jax.Array  # [B] int32 its output tokens
    new_pos: jax.Array  # [B] int32 prompt tokens computed after the iteration(s)
    new_gen: jax.Array  # [B] int32 output tokens after the iteration(s)
    run_res: jax.Array  # [B] int32 private KV held (on-demand grows with the leaped iterations)
    t_end: jax.Array  # [] float32 when the iteration(s) end
    kv_area: jax.Array  # [] float32 integral of the KV in use over the iteration(s)


def _run_batch(model, rw: Replica, r: RequestTable, t: jax.Array, params: ReplicaParams, active: jax.Array,
               kv_start: jax.Array, load_s: jax.Array | None = None, factor: jax.Array | None = None) -> Batch:
    """The batch: prefill chunks in admission order share `chunk`; finished prefills decode. An inactive row
    runs nothing, so its cache comes back unchanged. `load_s`: the loads before it (KV from the offload tiers,
    adapters); `factor`: the step time's LoRA factor."""
    running = (rw.run_req >= 0) & active
    rid = jnp.maximum(rw.run_req, 0)
    prompt = jnp.where(running, r.prompt_tok[rid], 0)
    tgt = jnp.where(running, rw.run_tgt, 0)  # = prompt unless recomputing after a preemption
    pos, gen = rw.run_pos, rw.run_gen
    remaining = tgt - pos
    prefilling = running & (remaining > 0)
    decoding = running & (remaining == 0)
    rem = jnp.where(prefilling, remaining, 0)
    earlier = rw.run_seq[None, :] < rw.run_seq[:, None]  # [B, B]: j admitted before i
    before = jnp.sum(earlier * rem[None, :], axis=1)
    alloc = jnp.clip(model.chunk - before, 0, rem)
    dt = cost_models.step_time(params.cost, alloc.astype(jnp.float32), pos.astype(jnp.float32), alloc > 0,
                               (prompt + gen).astype(jnp.float32), decoding)
    if factor is not None:
        dt = dt * factor
    if load_s is not None:
        dt = dt + load_s
    t_end = t + dt
    kv_area = kv_start * dt
    new_pos = pos + alloc
    done_pre = prefilling & (new_pos >= tgt)  # prefill (or recompute) complete: a token is sampled
    first = done_pre & (gen == 0)
    new_gen = gen + (done_pre | decoding)
    out = r.out_tok[rid]
    run_res = rw.run_res
    return Batch(running=running, rid=rid, prompt=prompt, tgt=tgt, decoding=decoding, done_pre=done_pre, first=first, out=out,
                 new_pos=new_pos, new_gen=new_gen, run_res=run_res, t_end=t_end, kv_area=kv_area)


def _leap(model, b: Batch, rw: Replica, ring: Ring, cache: SlotTable, params: ReplicaParams, queue_blocked: jax.Array,
          n_pre: jax.Array, next_arrival: jax.Array, kv_start: jax.Array, factor: jax.Array | None = None) -> Batch:
    """Event leap: up to `model.leap` further iterations in which nothing but token counts change (see
    `iterate_row`)."""
    on_demand = model.admission == "on-demand"
    cap = params.kv_capacity
    running, decoding, done_pre, out, prompt = b.running, b.decoding, b.done_pre, b.out, b.prompt
    new_pos, new_gen, run_res, t_end, kv_area = b.new_pos, b.new_gen, b.run_res, b.t_end, b.kv_area
    pos, tgt = rw.run_pos, b.tgt
    nend = rw.run_nend  # a running request completes a segment when its prefill reaches this
    big = jnp.iinfo(jnp.int32).max
    left = jnp.where(decoding, out - new_gen, big)  # iterations until each decoder finishes
    first_fin = jnp.min(left)
    pre = running & (new_pos < tgt)  # still prefilling
    has_f = jnp.any(pre)
    f = jnp.argmin(jnp.where(pre, rw.run_seq, big))  # the one that gets the whole chunk
    rem_f = tgt[f] - new_pos[f]
    # f's next segment end (none when recomputing output tokens); used only when f completed none
    j_seg = jnp.where(nend[f] < NO_SEGMENT_END, (nend[f] - new_pos[f] + model.chunk - 1) // model.chunk,
                      model.leap + 1)  # iteration completing a segment
    eventless = (~jnp.any(done_pre) & ~jnp.any(running & (new_pos >= nend))
                 & (first_fin > 0) & (n_pre == 0))
    # admission stays impossible: the chunk is full (rem_f > chunk), or the queue is empty or
    # blocked by memory/slots (which only a finish can free)
    # (priority: a blocked group leaves the others to the next iteration's turn, so only an empty queue)
    blocked = queue_blocked & (model.local_order != "priority")
    quiet = eventless & (has_f | (jnp.any(decoding) & ((ring.count == 0) | blocked)))
    j = jnp.arange(1, model.leap + 1)
    is_f = (jnp.arange(pos.shape[0]) == f) & has_f
    # leaped iteration jj: f's chunk on a context grown by (jj - 1) chunks, every decoder one token longer
    dec_ctx = jnp.sum(jnp.where(decoding, prompt + new_gen, 0)).astype(jnp.float32)
    stats = cost_models.leap_stats(model.chunk, new_pos[f], has_f, dec_ctx, jnp.sum(decoding), j - 1)
    dts = jax.vmap(lambda st: cost_models.time_from_stats(params.cost, st))(stats)
    if factor is not None:
        dts = dts * factor
    ends = t_end + jnp.cumsum(dts)
    prefill_ok = ~has_f | ((rem_f - (j - 1) * model.chunk > model.chunk) & (j <= j_seg))
    ok = quiet & (j <= first_fin) & (ends - dts < next_arrival) & prefill_ok
    if on_demand:  # each leaped iteration takes its tokens from free KV: no eviction, no preemption
        per_it = jnp.sum(decoding) + jnp.where(has_f, model.chunk, 0)
        ok = ok & (j * per_it <= cap - cache.tokens - jnp.sum(rw.run_res))
    else:
        per_it = jnp.int32(0)
    k = jnp.sum(ok)  # ok is a prefix of j
    t_end = jnp.where(k > 0, ends[jnp.maximum(k - 1, 0)], t_end)
    kv_area = kv_area + jnp.sum(jnp.where(ok, (kv_start + (j * per_it).astype(jnp.float32)) * dts, 0.0))
    new_gen = new_gen + jnp.where(decoding, k, 0)
    new_pos = new_pos + jnp.where(is_f, k * model.chunk, 0)
    if on_demand:
        run_res = run_res + jnp.where(decoding, k, 0) + jnp.where(is_f, k * model.chunk, 0)
    return b._replace(new_pos=new_pos, new_gen=new_gen, run_res=run_res, t_end=t_end, kv_area=kv_area)


def _complete_segments(rw: Replica, ring: Ring, cache: SlotTable, index: jax.Array, acct: Replication,
                       g: jax.Array, r: RequestTable, b: Batch, c: dict, n_pre: jax.Array, q_refused: jax.Array,
                       preempted: jax.Array):
    """Segments completed by the iteration(s) enter the cache (locked), their prefix touched; a finished
    request unlocks and touches its segments and leaves its output in the cache when the workload keeps it.
    Returns what `iterate_row` returns."""
    seg_len = r.seg_len
    m1 = seg_len.shape[0]
    running, rid, prompt, first, out = b.running, b.rid, b.prompt, b.first, b.out
    new_pos, new_gen, run_res, t_end, kv_area = b.new_pos, b.new_gen, b.run_res, b.t_end, b.kv_area
    nend = rw.run_nend
    completes = running & (new_pos >= nend)
    finished = running & (new_gen >= out)
    spos = jnp.arange(r.seg_ids.shape[1])

    def insert_completed(b, carry):
        cache, index, acct, full, nseg, nend, run_res = carry
        segs, tok, end = r.seg_ids[rid[b]], r.seg_tok[rid[b]], r.seg_end[rid[b]]
        n_b = jnp.sum((end <= new_pos[b]) & (tok > 0))
        newly = (spos >= rw.run_nseg[b]) & (spos < n_b)
        cache, index, acct, full_b = insert(cache, index, g, acct, segs, newly, seg_len)
        return (cache, index, acct, full | full_b, nseg.at[b].set(n_b), nend.at[b].set(next_segment_end(r, rid[b], n_b)),
                run_res.at[b].add(-jnp.sum(newly * tok)))

    cache, index, acct, table_full, nseg_new, nend, run_res = for_each(
        completes, insert_completed, (cache, index, acct, jnp.bool_(False), rw.run_nseg, nend, run_res))
    out_seg = r.out_seg[rid]
    keep_out = finished & (out_seg < m1 - 1)
    cache, index, acct, full_out = insert(cache, index, g, acct, out_seg, keep_out, seg_len)

    def lock_and_touch(b, cache):
        segs, tok = r.seg_ids[rid[b]], r.seg_tok[rid[b]]
        newly = (spos >= rw.run_nseg[b]) & (spos < nseg_new[b])
        fin = finished[b] & (tok > 0)
        prefix = completes[b] & (spos < nseg_new[b])  # the prefix up to the new segments
        delta = newly.astype(jnp.int32) - fin.astype(jnp.int32)
        return cache.lock_and_touch(index, g, segs, delta, prefix | fin, t_end)

    cache = for_each(completes | finished, lock_and_touch, cache)
    cache = cache.touch(index, g, out_seg, keep_out, t_end)
    run_req = jnp.where(finished, -1, rw.run_req)
    busy = jnp.any(run_req >= 0) | (ring.count > 0)
    new_row = dataclasses.replace(
        rw, run_req=run_req, run_pos=new_pos, run_gen=new_gen, run_nseg=nseg_new, run_nend=nend,
        run_res=jnp.where(finished, 0, run_res))
    side = dict(clock=jnp.where(busy, t_end, INF), t_end=t_end, n_admitted=c["n_admitted"],
                full=c["full"], adm_go=c["adm_go"], adm_id=c["adm_id"], adm_tok=c["adm_tok"],
                adm_new=c["adm_new"], n_pre=n_pre, q_refused=q_refused, preempted=preempted, kv_area=kv_area,
                rid=rid, first=first, finished=finished, n_fin=jnp.sum(finished).astype(jnp.float32),
                tok_fin=jnp.sum(jnp.where(finished, prompt + out, 0)).astype(jnp.float32),
                **{k: c[k] for k in ("adm_ngpu", "adm_nall", "adm_cpu", "adm_shared", "evicted", "evicted_last")
                   if k in c})
    return new_row, ring, cache, index, acct, table_full | full_out, side
