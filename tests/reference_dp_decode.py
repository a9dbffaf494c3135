"""Slow, plain-Python reference of the decode DP barrier simulator and its routers.

It follows the rules in jaxroute/clusters/dp_decode.py and jaxroute/routers/balance.py
step by step with Python lists, so the jitted model can be checked against it exactly on
small cases. Random draws (router coin flips, Poisson gaps) come from the same JAX keys;
time is accumulated in float32 like the model; per-worker step times come from the shared
cost model. BR-0/BR-H scores are computed directly from their definitions. Per-rank prefix caches
are a dict per rank (segment id -> last use), LRU by (last use, segment id).
"""

from __future__ import annotations

import jax
import numpy as np

from jaxroute import cost_models
from jaxroute.routers import balance

F32 = np.float32
# The library's KV share of a step, jitted once: called eagerly every step its jax.jvp retraces (slow), and it is
# the quantity the reference sums, not part of the rules it checks
_KV_STEP_FRACTION = jax.jit(cost_models.kv_step_fraction)


def _score(x, margins_g, took_g, alpha, beta, d):
    """F = α (1ᵀd) x - β Σ_h d_h (x - (m_{g,h} - took_g))_+ (definition, with this step's own bindings)."""
    pen = sum(dh * max(x - (m - took_g), 0.0) for m, dh in zip(margins_g, d, strict=True))
    return alpha * sum(d) * x - beta * pen


def _choose(policy, key, counts, kv, rr_next, eligible, single, draw_width=None, cached=None):
    g = len(counts)
    if policy in (balance.RANDOM, balance.P2C):
        u = np.asarray(jax.random.uniform(key, (draw_width or g,)))[:g]  # a model with more ranks than in use
        u = [float(u[i]) if eligible[i] else -1.0 for i in range(g)]
        first = int(np.argmax(u))
        if policy == balance.RANDOM:
            return first
        u2 = [(-1.0 if i == first else u[i]) for i in range(g)]
        second = int(np.argmax(u2))
        if u[second] < 0:
            second = first
        return second if counts[second] < counts[first] else first
    elig = [i for i in range(g) if eligible[i]]
    if policy == balance.RR:
        return min(elig, key=lambda i: (i - rr_next) % g)
    if policy == balance.JSQ:
        return min(elig, key=lambda i: (counts[i], i))
    if policy == balance.LEAST_KV:
        return min(elig, key=lambda i: (kv[i], i))
    if policy == balance.CACHE:  # most cached leading tokens, then fewest requests, then lowest index
        hit = [0.0] * g if cached is None else cached
        return min(elig, key=lambda i: (-hit[i], counts[i], i))
    best = max(single[i] for i in elig)
    return min(i for i in elig if single[i] == best)


def _pick_worker(free, took, m0, allowed):
    cands = [g for g in range(len(free)) if allowed[g]]
    if not cands:
        return None
    top = max(free[g] for g in cands)
    cands = [g for g in cands if free[g] == top]
    best = max(m0[g] - took[g] for g in cands)
    return min(g for g in cands if m0[g] - took[g] == best)


def balance_dispatch_ref(pool_s, loads_h, free, room, alpha, beta, d, window, max_iters, needs=None, miss=None,
                         weight=0.0):
    """Two-stage BalanceRoute binding. pool_s: list of prompt sizes (oldest first); needs: KV room each
    takes (default its size); miss[i][g]: prefill tokens g would compute for entry i (br_cache's penalty,
    weight per token, summed over a subset). Returns assign list."""
    needs = list(pool_s) if needs is None else list(needs)
    miss = [[0.0] * len(loads_h) for _ in pool_s] if miss is None else miss
    g_n = len(loads_h)
    hzn = len(d)
    env = [max(loads_h[g][h] for g in range(g_n)) for h in range(hzn)]
    margins = [[env[h] - loads_h[g][h] for h in range(hzn)] for g in range(g_n)]
    m0 = [margins[g][0] for g in range(g_n)]
    free, room = list(free), list(room)
    took = [0.0] * g_n
    assign = [-1] * len(pool_s)
    if sum(free) >= len(pool_s):  # stage 1
        blocked = [False] * g_n
        it = 0
        while it < max_iters and any(a < 0 for a in assign) and any(free[g] > 0 and not blocked[g] for g in range(g_n)):
            g = _pick_worker(free, took, m0, [free[i] > 0 and not blocked[i] for i in range(g_n)])
            best, best_f = None, -np.inf
            for i, s in enumerate(pool_s):
                if assign[i] < 0 and needs[i] <= room[g]:
                    f = _score(s, margins[g], took[g], alpha, beta, d) - weight * miss[i][g]
                    if f > best_f:
                        best, best_f = i, f
            if best is None:
                blocked[g] = True
            else:
                assign[best] = g
                free[g] -= 1
                room[g] -= needs[best]
                took[g] += pool_s[best]
            it += 1
        return assign
    done = [False] * g_n
    for _ in range(g_n):  # stage 2
        g = _pick_worker(free, took, m0, [free[i] > 0 and not done[i] for i in range(g_n)])
        if g is None:
            break
        waiting = [i for i in range(len(pool_s)) if assign[i] < 0][:window]
        best, best_f, single, single_f = (), -np.inf, None, -np.inf
        for r in range(2 ** window):  # subsets in bitmask order, first maximum wins
            members = [waiting[j] for j in range(window) if (r >> j) & 1 and j < len(waiting)]
            if any((r >> j) & 1 for j in range(len(waiting), window)):
                continue
            ds = sum(pool_s[i] for i in members)
            if len(members) > free[g] or sum(needs[i] for i in members) > room[g]:
                continue
            f = _score(ds, margins[g], took[g], alpha, beta, d) - weight * sum(miss[i][g] for i in members)
            if f > best_f:
                best, best_f = tuple(members), f
            if len(members) == 1 and f > single_f:
                single, single_f = members[0], f
        chosen = list(best) if best_f > 0 else ([single] if single is not None else [])
        for i in chosen:
            assign[i] = g
            free[g] -= 1
            room[g] -= needs[i]
            took[g] += pool_s[i]
        done[g] = True
    return assign


def predicted_loads_ref(slots, gen, prompt, output, horizon, predictor):
    """Direct L_g(k+h) = Σ (s + j + h) * presence(h); oracle or none predictor only."""
    out = []
    for g in range(len(slots)):
        row = []
        for h in range(horizon + 1):
            tot = 0.0
            for r, j in zip(slots[g], gen[g], strict=True):
                if r is None:
                    continue
                rem = output[r] - j
                if h == 0:
                    pres = 1.0
                elif predictor == 0:  # none: p_fin = 0
                    pres = 1.0
                else:  # oracle: p_fin = [rem <= H], mu = rem
                    p = 1.0 if rem <= horizon else 0.0
                    mu = rem if rem <= horizon else 0.0
                    pres = (1 - p) + p * min(max(mu - h, 0.0), 1.0)
                tot += (prompt[r] + j + h) * pres
            row.append(tot)
        out.append(row)
    return out


def _blocks(tokens, block_size):
    return -(-int(tokens) // block_size)


def preempt_rank(running, queue, gen, prompt, n_blocks, block_size):
    """One rank's preemption (vLLM): its running requests, oldest first, keep the blocks for their next token
    while they fit; the rest go back to the front of its queue, oldest first. -> (running, queue, evicted)."""
    total, keep = 0, []
    for r in running:
        total += _blocks(prompt[r] + gen[r] + 1, block_size)
        if total > n_blocks:
            break
        keep.append(r)
    evicted = running[len(keep):]
    return keep, evicted + queue, len(evicted)


def admit_rank(running, queue, gen, prompt, preempted, n_blocks, block_size, slots, r_max):
    """One rank's FCFS admission with head-of-line blocking: at most r_max, into free slots (none after a
    preemption), while the blocks for the prompt, the tokens generated before a preemption and the next token
    fit. -> (admitted, slots left for pooled binding, blocks left)."""
    fb = n_blocks - sum(_blocks(prompt[r] + gen[r] + 1, block_size) for r in running)
    fr = 0 if preempted else min(slots - len(running), r_max)
    admitted = []
    for rid in queue[:r_max]:
        need = _blocks(prompt[rid] + gen[rid] + 1, block_size)
        if len(admitted) >= fr or need > fb:
            break
        fb -= need
        admitted.append(rid)
    return admitted, fr - len(admitted), fb


def _rank_times(cost, batch, kv, prefill):
    """Per-rank busy times and the barrier (the shared cost model, one rank at a time)."""
    barrier, per = cost_models.dp_step_times(cost, np.asarray(batch, F32), np.asarray(kv, F32),
                                             np.asarray(prefill, F32))
    return F32(barrier), [F32(x) for x in np.asarray(per)]


def simulate(key, prompt, output, trace_arrival, *, n_workers, slots, pool, window, horizon, r_max, kv_capacity,
             max_steps, cost, collective_s, policy, dispatch, predictor=1, alpha=1.0, beta=None, gamma=0.95,
             arrival=0, rate=1.0, block_size=128, preempt=True, cap_immediate=False, local=None, draw_width=None,
             segs=None, seg_len=None, cache_tokens=0, cache_weight=1.0):
    """Run the reference; returns per-request (worker, admit_t, finish_t, done) and metrics.

    One step: intake (pooled: fill the pool up to P; immediate: route every arrived request to a
    local queue), running requests take the blocks for their next token (newest preempted to the
    queue front when a rank runs out), FCFS head-of-line admission from the local queue (none on a
    rank that just preempted), pooled binding into what is left, one decode step.
    local[i]: request i is prefilled by its rank at its first admission (a prefill in that step).
    draw_width: the model's rank count when it has more ranks than n_workers in use (random draws span it).
    segs[i]: request i's prompt segments [(segment id, tokens), ...] in prompt order; seg_len[id] their
    lengths; cache_tokens > 0: per-rank prefix caches of that budget. A local request's first admission
    on rank g prefills prompt - hit (hit: leading cached tokens on g, at most prompt - 1), read on the
    cache at the step's start; after binding its segments are inserted (last use = the step's start),
    then each rank evicts LRU (last use, then segment id), sparing this step's, while over its budget.
    cache_weight: br_cache's weight on those missed tokens.
    """
    local = [False] * len(prompt) if local is None else list(local)
    caching = cache_tokens > 0
    segs = [[] for _ in prompt] if segs is None else [list(x) for x in segs]
    n, g_n = len(prompt), n_workers
    n_blocks = kv_capacity // block_size
    beta = float(n_workers) if beta is None else beta
    key, k_arr, k_perm = jax.random.split(key, 3)
    if arrival != 2:  # saturated / Poisson: this seed's random order of the requests
        perm = np.asarray(jax.random.permutation(k_perm, n))
        prompt = [prompt[i] for i in perm]
        output = [output[i] for i in perm]
        local = [local[i] for i in perm]
        segs = [segs[i] for i in perm]
    gaps = jax.random.exponential(k_arr, (n,)) / max(rate, 1e-12)
    poisson_t = np.asarray(jax.numpy.cumsum(gaps) - gaps[0], np.float32)
    arr = [F32(0.0)] * n if arrival == 0 else ([F32(x) for x in poisson_t] if arrival == 1 else
                                               [F32(x) for x in trace_arrival])
    if policy in (balance.BR0, balance.BR_CACHE):
        a, b, d = 1.0, float(n_workers), [1.0] + [0.0] * horizon
    else:
        a, b, d = alpha, beta, [float(F32(gamma) ** F32(h)) for h in range(horizon + 1)]
    t = F32(0.0)
    next_in, rr = 0, 0
    pool_ids: list[int] = []
    queues: list[list[int]] = [[] for _ in range(g_n)]
    running: list[list[int]] = [[] for _ in range(g_n)]  # request ids, oldest admission first
    gen = [0] * n  # tokens generated so far (kept across a preemption)
    admit_t, finish_t, first_t = [0.0] * n, [0.0] * n, [0.0] * n
    done, worker_of = [False] * n, [-1] * n
    tokens_out = steps = preemptions = recomputed = 0
    sum_imb = sum_idle = 0.0
    sum_running, kv_seconds, step_seconds = 0, 0.0, 0.0
    kv_overflow = False
    pooled = dispatch == balance.POOLED
    w_cache = float(F32(cache_weight)) if policy == balance.BR_CACHE else 0.0
    cache: list[dict[int, float]] = [{} for _ in range(g_n)]  # segment id -> last use, per rank
    prefill_tokens = hit_tokens = first_prompt = evictions = 0

    def hit(r, g):
        """Leading cached prompt tokens of r on g (at most prompt - 1)."""
        tok = 0
        for sid, k in segs[r]:
            if k == 0:
                continue
            if sid not in cache[g]:
                break
            tok += k
        return min(tok, max(prompt[r] - 1, 0))

    def admit_first(r, g):
        """r's first admission on g, prefilled there: its uncached prompt joins g's prefill work this step."""
        nonlocal hit_tokens, first_prompt
        h = hit(r, g) if caching else 0
        prefill[g] += prompt[r] - h
        hit_tokens += h
        first_prompt += prompt[r]
        inserts.append((r, g))

    def miss(r, g):
        return float(prompt[r] - hit(r, g)) if (local[r] and worker_of[r] < 0) else 0.0

    def loads():
        return [float(sum(prompt[r] + gen[r] for r in running[g])) for g in range(g_n)]

    def slot_view():
        """Slots as the model holds them (order does not matter to the predicted loads)."""
        return [running[g] + [None] * (slots - len(running[g])) for g in range(g_n)], \
            [[gen[r] for r in running[g]] + [0] * (slots - len(running[g])) for g in range(g_n)]

    def place(ids, workers):
        for rid, w in zip(ids, workers, strict=True):
            running[w].append(rid)
            if worker_of[rid] < 0:
                admit_t[rid], worker_of[rid] = float(t), w

    for _ in range(max_steps):
        if all(done):
            break
        key, k_in, k_out = jax.random.split(key, 3)
        n_arrived = sum(1 for x in arr if x <= t)
        n_act = [len(running[g]) for g in range(g_n)]
        load = loads()
        sv, gv = slot_view()
        lh = predicted_loads_ref(sv, gv, prompt, output, horizon, predictor)
        backlog = max(0, n_arrived - next_in)
        if pooled or cap_immediate:
            take = max(0, min(backlog, pool - len(pool_ids) - (sum(map(len, queues)) if cap_immediate else 0)))
        else:
            take = backlog
        if pooled:
            pool_ids += list(range(next_in, next_in + take))
        else:
            q_load = [float(sum(prompt[r] for r in queues[g])) for g in range(g_n)]
            lhq = [[lh[g][h] + q_load[g] for h in range(horizon + 1)] for g in range(g_n)]
            env = [max(lhq[g][h] for g in range(g_n)) for h in range(horizon + 1)]
            margins = [[env[h] - lhq[g][h] for h in range(horizon + 1)] for g in range(g_n)]
            counts = [n_act[g] + len(queues[g]) for g in range(g_n)]
            kv = [load[g] + q_load[g] for g in range(g_n)]
            took = [0.0] * g_n
            k = k_in
            for i in range(take):
                k, sub = jax.random.split(k)
                rid = next_in + i
                s = float(prompt[rid])
                single = [_score(s, margins[g], took[g], a, b, d) for g in range(g_n)]
                cached = None
                if caching:
                    single = [single[g] - w_cache * miss(rid, g) for g in range(g_n)]
                    cached = [float(hit(rid, g)) for g in range(g_n)]
                gi = _choose(policy, sub, counts, kv, rr, [True] * g_n, single, draw_width, cached)
                queues[gi].append(rid)
                counts[gi] += 1
                kv[gi] += s
                took[gi] += s
                rr = (gi + 1) % g_n
        next_in += take
        # running requests first: blocks for the next token, newest preempted when they run out
        preempted = [False] * g_n
        if preempt:
            for g in range(g_n):
                running[g], queues[g], n_evicted = preempt_rank(running[g], queues[g], gen, prompt, n_blocks,
                                                                block_size)
                preempted[g] = n_evicted > 0
                preemptions += n_evicted
        # FCFS admission from the local queue (head-of-line blocking)
        recompute = [0] * g_n
        prefill = [0] * g_n  # first admissions prefilled on their rank (local)
        inserts = []  # (request, rank) first local admissions: their segments enter the rank's cache
        free = []
        free_blocks = []
        for g in range(g_n):
            admitted, fr, fb = admit_rank(running[g], queues[g], gen, prompt, preempted[g], n_blocks, block_size,
                                          slots, r_max)
            for rid in admitted:
                if gen[rid] > 0:
                    recompute[g] += prompt[rid] + gen[rid]
                elif local[rid] and worker_of[rid] < 0:
                    admit_first(rid, g)
            if queues[g] and _blocks(prompt[queues[g][0]] + gen[queues[g][0]] + 1, block_size) > n_blocks:
                kv_overflow = True
            recomputed += recompute[g]
            place(admitted, [g] * len(admitted))
            queues[g] = queues[g][len(admitted):]
            free.append(fr)
            free_blocks.append(fb)
        if any(_blocks(prompt[r] + 1, block_size) > n_blocks for r in pool_ids):
            kv_overflow = True
        if pooled:
            free = [free[g] if (not queues[g] and not preempted[g]) else 0 for g in range(g_n)]
            room = [float(fb * block_size) for fb in free_blocks]
            sizes = [float(prompt[r]) for r in pool_ids]
            needs = [float(_blocks(prompt[r] + 1, block_size) * block_size) for r in pool_ids]
            pool_miss = [[miss(r, g) for g in range(g_n)] for r in pool_ids] if caching else None
            if policy in (balance.BR0, balance.BRH, balance.BR_CACHE):
                assign = balance_dispatch_ref(sizes, lh, free, room, a, b, d, window, g_n * r_max, needs, pool_miss,
                                              w_cache)
            else:
                assign = [-1] * len(pool_ids)
                counts = [float(len(running[g])) for g in range(g_n)]
                kv = loads()
                k, it = k_out, 0
                while it < g_n * r_max and any(x < 0 for x in assign):
                    head = assign.index(-1)
                    elig = [free[g] > 0 and needs[head] <= room[g] for g in range(g_n)]
                    if not any(elig):
                        break
                    k, sub = jax.random.split(k)
                    cached = [float(hit(pool_ids[head], g)) for g in range(g_n)] if caching else None
                    gi = _choose(policy, sub, counts, kv, rr, elig, [0.0] * g_n, draw_width, cached)
                    assign[head] = gi
                    counts[gi] += 1
                    kv[gi] += sizes[head]
                    free[gi] -= 1
                    room[gi] -= needs[head]
                    rr = (gi + 1) % g_n
                    it += 1
            chosen = [(r, w) for r, w in zip(pool_ids, assign, strict=True) if w >= 0]
            for r, w in chosen:
                if local[r] and worker_of[r] < 0:
                    admit_first(r, w)
            place([r for r, _ in chosen], [w for _, w in chosen])
            pool_ids = [r for r, w in zip(pool_ids, assign, strict=True) if w < 0]
        prefill_tokens += sum(prefill)
        if caching:  # insert this step's admissions, then LRU eviction to the budget (sparing this step's)
            new = [set() for _ in range(g_n)]
            for r, g in inserts:
                for sid, k in segs[r]:
                    if k > 0:
                        cache[g][sid] = float(t)
                        new[g].add(sid)
            for g in range(g_n):
                while sum(seg_len[s] for s in cache[g]) > cache_tokens:
                    cands = [s for s in cache[g] if s not in new[g]]
                    if not cands:
                        break
                    del cache[g][min(cands, key=lambda s, g=g: (cache[g][s], s))]
                    evictions += 1
        # decode
        n_act = [len(running[g]) for g in range(g_n)]
        load = loads()
        any_active = sum(n_act) > 0
        waiting = len(pool_ids) + sum(map(len, queues))
        if any_active:
            barrier, _ = _rank_times(cost, n_act, load, [x + y for x, y in zip(recompute, prefill, strict=True)])
            dt = F32(barrier + F32(collective_s))
            t_end = F32(t + dt)
            m = max(load)
            sum_imb += m - min(load)
            sum_idle += g_n * m - sum(load)
            sum_running += sum(n_act)
            prefill_all = [x + y for x, y in zip(recompute, prefill, strict=True)]
            kv_seconds += float(_KV_STEP_FRACTION(cost, np.asarray(n_act, F32), np.asarray(load, F32),
                                                  np.asarray(prefill_all, F32))) * float(barrier)
            step_seconds += float(dt)
            steps += 1
            for g in range(g_n):
                keep = []
                for r in running[g]:
                    if gen[r] == 0:
                        first_t[r] = float(t_end)
                    gen[r] += 1
                    tokens_out += 1
                    if gen[r] >= output[r]:
                        finish_t[r], done[r] = float(t_end), True
                    else:
                        keep.append(r)
                held = sum(_blocks(prompt[r] + gen[r], block_size) for r in running[g])
                kv_overflow |= held > n_blocks
                running[g] = keep
            t = t_end
        elif waiting == 0 and next_in < n:
            t = max(t, arr[next_in])
    tp = np.array([(finish_t[i] - admit_t[i]) / output[i] for i in range(n) if done[i]])
    makespan = max([finish_t[i] for i in range(n) if done[i]], default=0.0)
    return {
        "worker": np.array(worker_of), "admit_t": np.array(admit_t), "finish_t": np.array(finish_t),
        "first_t": np.array(first_t),
        "done": np.array(done), "imbalance_tokens": sum_imb / max(steps, 1),
        "barrier_idle_tokens": sum_idle / max(steps, 1), "steps": steps, "tokens_out": tokens_out,
        "running_per_worker": sum_running / max(steps, 1) / g_n, "kv_share_of_step": kv_seconds / max(step_seconds, 1e-12),
        "tpot_p95_s": float(np.percentile(tp, 95)) if len(tp) else 0.0,
        "throughput_tok_s": tokens_out / max(makespan, 1e-9), "kv_overflow": kv_overflow,
        "preemptions": preemptions, "recomputed_tokens": recomputed,
        "prefill_tokens": prefill_tokens, "hit_rate": hit_tokens / max(first_prompt, 1),
        "cache_evictions": evictions,
    }


def subsets(window):
    """All subsets of range(window) in bitmask order (for tests)."""
    return [tuple(j for j in range(window) if (r >> j) & 1) for r in range(2 ** window)]

