"""Routers for decode data-parallel workers behind a barrier (BalanceRoute, arXiv 2605.06113).

Baselines (as production routers do them, one decision per request):
  random, rr (round robin), p2c and jsq on the worker's request count (running + queued),
  and least_kv (fewest KV tokens; a stronger baseline the paper lacks, reported apart).
BalanceRoute:
  br0  F_g(Q) = Δs(Q) - G (Δs(Q) - m_g)_+ with margins m_g = M - L_g.
  brh  F_g(Q) = α (1ᵀd) Δs(Q) - β ((Δs(Q) 1 - m_g)_+)ᵀ d over predicted loads L_g(k+h), h = 0..H,
       d = (1, γ, ..., γ^H). br0 is brh with α = 1, β = G, d = (1, 0, ..., 0), so both run
       through one scorer (`score`: cost_models.brh_score on a worker's margins less what it took).
Cache-aware (CACHE_POLICIES; they need ranks with prefix caches, `DecodeModel.prefix_cache_tokens`):
  br_cache  BR-0's F_g(Q) - w Σ_{i in Q} miss_{i,g}: miss_{i,g} = the prompt tokens rank g would
            prefill for i (prompt - leading cached tokens on g, at most prompt - 1 cached), w the
            traced `cache_weight`; pooled like br0 (immediate: choose_worker on the penalised singles).
            miss is read on the caches at the step's start (a step's bindings do not see each other's
            insertions). The worker order of both stages is br0's, so the penalty changes which
            requests a worker takes, not which worker goes next; w = 0 is br0 exactly.
  cache     cache-only routing on arrival: the rank with the most cached leading prompt tokens
            (ties: fewest requests, running + queued, then lowest index).

Pooled two-stage dispatch (`balance_dispatch`, one barrier step):
  Stage rule: stage 1 when capacity is ample, i.e. the free slots this step
  (Σ_g min(S - active_g, R_max)) can take every waiting request; stage 2 otherwise.
  Stage 1: repeatedly, the worker with the most free slots (ties: larger margin m_{g,0},
  then lower index) takes the single waiting request with the highest F (ties: oldest).
  Stage 2: workers in priority order (most free slots, then larger margin m_{g,0}); each
  picks Q* ⊆ the W oldest waiting requests, |Q*| <= its free slots, maximising F over all
  2^W subsets (fixed-shape enumeration); if the best score is <= 0 it takes the best
  single request instead, so nothing starves. Loads and margins are updated after
  every binding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute import cost_models
from jaxroute.registry import PolicyRegistry
from jaxroute.routers.names import DECODE_POLICIES, DISPATCH_MODES

POLICIES = DECODE_POLICIES  # run on every decode model (routers/names.py)
# Appended after POLICIES (existing ids unchanged); kept out of POLICIES, which callers iterate as "every
# policy a model runs", because these need per-rank prefix caches (check_params refuses them otherwise).
CACHE_POLICIES = ("br_cache", "cache")
ALL_POLICIES = POLICIES + CACHE_POLICIES
REGISTRY = PolicyRegistry("decode", ALL_POLICIES)
PAPER_BASELINES = ("random", "rr", "p2c", "jsq")
RANDOM, RR, P2C, JSQ, LEAST_KV, BR0, BRH, BR_CACHE, CACHE = range(len(ALL_POLICIES))
CACHE_IDS = (BR_CACHE, CACHE)
IMMEDIATE, POOLED = 0, 1
DISPATCH_REGISTRY = PolicyRegistry("decode", DISPATCH_MODES, what="dispatch mode")


def policy_id(name: str) -> int:
    """The traced id of a decode policy (a JaxrouteError naming the choices when unknown)."""
    return REGISTRY.id(name)


def default_dispatch(policy: str) -> int:
    """BalanceRoute binds from the prompt pool; baselines send on arrival (vLLM router / engine DP balancers)."""
    return POOLED if policy in ("br0", "brh", "br_cache") else IMMEDIATE


def subset_matrix(window: int) -> np.ndarray:
    """[2^W, W] bool: row r is the subset whose members are the set bits of r."""
    r = np.arange(2**window)[:, None]
    return ((r >> np.arange(window)[None, :]) & 1).astype(bool)


# --------------------------------------------------------------------------- F-score


def score_weights(policy: jax.Array, alpha, beta, gamma, n_workers: int, horizon: int):
    """(α, β, d [H+1]) for the BalanceRoute scorer: br0 and br_cache use (1, G, e_0) (G may be traced: the ranks
    in use), brh its traced α, β, γ."""
    h = jnp.arange(horizon + 1, dtype=jnp.float32)
    d_brh = jnp.power(jnp.asarray(gamma, jnp.float32), h)
    is_br0 = (policy == BR0) | (policy == BR_CACHE)
    d = jnp.where(is_br0, (h == 0).astype(jnp.float32), d_brh)
    a = jnp.where(is_br0, 1.0, jnp.asarray(alpha, jnp.float32))
    b = jnp.where(is_br0, jnp.asarray(n_workers, jnp.float32), jnp.asarray(beta, jnp.float32))
    return a, b, d


def score(x: jax.Array, margins: jax.Array, d: jax.Array, g, shift, alpha, beta) -> jax.Array:
    """F_g(x) = α (1ᵀd) x - β Σ_h d_h (x - (m_{g,h} - shift))_+ for an array of Δs values x.

    margins [G, H+1]; `shift` is the load worker g already took in this step (its margins drop by
    that much): `cost_models.brh_score` on worker g's lowered margins (one [..., H+1] pass).
    """
    return cost_models.brh_score(x, margins[g] - shift, alpha, beta, d)


def margins_of(loads_h: jax.Array) -> jax.Array:
    """[G, H+1] predicted loads -> margins m_{g,h} = max_g' L_g'(k+h) - L_g(k+h)."""
    return jnp.max(loads_h, axis=0, keepdims=True) - loads_h


def first_positions(mask: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    """Indices of the first n True entries of mask [P] (in order) and whether each exists."""
    rank = jnp.cumsum(mask) - 1
    hit = mask[None, :] & (rank[None, :] == jnp.arange(n)[:, None])  # [n, P]
    return jnp.argmax(hit, axis=1), jnp.any(hit, axis=1)


# --------------------------------------------------------------------------- one-request decisions


def choose_worker(policy, key, counts, kv, rr_next, eligible, single_scores, cached=None) -> jax.Array:
    """Pick a worker for one request among `eligible` [G] (at least one must be eligible).

    counts [G]: running + queued requests; kv [G]: KV tokens (running + queued prompts);
    single_scores [G]: F_g({i}) for br0/brh/br_cache (br_cache's already less its miss penalty);
    cached [G]: the request's leading prompt tokens cached on each worker (`cache`; None = none cached).
    Ties: lowest index, except random and p2c draws; `cache` breaks ties on the fewest requests first.
    """
    g = counts.shape[0]
    idx = jnp.arange(g)
    inf = jnp.float32(jnp.inf)

    def rand(_):
        u = jax.random.uniform(key, (g,))
        return jnp.argmax(jnp.where(eligible, u, -1.0))

    def rr(_):
        dist = (idx - rr_next) % g
        return jnp.argmin(jnp.where(eligible, dist, g + 1))

    def p2c(_):
        u = jax.random.uniform(key, (g,))
        u = jnp.where(eligible, u, -1.0)
        first = jnp.argmax(u)
        second = jnp.argmax(jnp.where(idx == first, -1.0, u))
        second = jnp.where(u[second] < 0, first, second)  # a single eligible worker
        return jnp.where(counts[second] < counts[first], second, first)

    def jsq(_):
        return jnp.argmin(jnp.where(eligible, counts, inf))

    def least_kv(_):
        return jnp.argmin(jnp.where(eligible, kv, inf))

    def balance(_):
        return jnp.argmax(jnp.where(eligible, single_scores, -inf))

    def cache(_):
        hit = jnp.zeros((g,), jnp.float32) if cached is None else jnp.asarray(cached, jnp.float32)
        hit = jnp.where(eligible, hit, -inf)
        cand = eligible & (hit == jnp.max(hit))
        return jnp.argmin(jnp.where(cand, counts, inf))

    rules = [rand, rr, p2c, jsq, least_kv, balance, balance, balance, cache]
    return REGISTRY.switch_shared(policy, rules, lambda rule: rule, None).astype(jnp.int32)


# --------------------------------------------------------------------------- pooled dispatch


def balance_dispatch(pool_s, pool_valid, loads_h, free, kv_room, alpha, beta, d, window: int, max_iters: int,
                     pool_need=None, miss=None, miss_weight=1.0):
    """BalanceRoute's two-stage binding of pool entries to workers for one barrier step.

    pool_s [P] float: prompt tokens of pool entries (oldest first); pool_valid [P] bool;
    loads_h [G, H+1]: predicted loads (h = 0 is the current load); free [G] int: slots this
    worker may still take this step (min(S - active, R_max)); kv_room [G]: KV tokens left;
    pool_need [P]: KV room each entry takes (default its prompt; whole blocks in the paged model);
    miss [P, G] (br_cache; None = no penalty): prompt tokens worker g would prefill for entry i; a
    single's score is less miss_weight * miss[i, g], a subset's less miss_weight * its members' sum.
    Margins are measured against the envelope M_h at the start of the step; a worker's own
    bindings in this step lower its margins by what it took.
    Returns assign [P] int32 (worker, or -1 when the entry stays in the pool).
    """
    n_pool = pool_s.shape[0]
    n_workers = loads_h.shape[0]
    need = pool_s if pool_need is None else pool_need
    margins = margins_of(loads_h)
    m0 = margins[:, 0]
    subsets = jnp.asarray(subset_matrix(window))  # [2^W, W]
    sizes = jnp.sum(subsets, axis=1)
    ninf = jnp.float32(-jnp.inf)
    assign0 = jnp.full((n_pool,), -1, jnp.int32)
    zeros_g = jnp.zeros((n_workers,), jnp.float32)
    stage1 = jnp.sum(free) >= jnp.sum(pool_valid)

    def pick_worker(free_, took, allowed):
        """Most free slots first, then the largest current margin, then the lowest index."""
        top = jnp.max(jnp.where(allowed, free_, -1))
        cand = allowed & (free_ == top)
        return jnp.argmax(jnp.where(cand, m0 - took, ninf)), top

    # ---- stage 1: greedy singles for the worker with the most free slots
    def s1_cond(c):
        it, assign, free_, room, took, blocked = c
        return (it < max_iters) & jnp.any(pool_valid & (assign < 0)) & jnp.any((free_ > 0) & ~blocked)

    def s1_body(c):
        it, assign, free_, room, took, blocked = c
        g, _ = pick_worker(free_, took, (free_ > 0) & ~blocked)
        ok = pool_valid & (assign < 0) & (need <= room[g])
        f = score(pool_s, margins, d, g, took[g], alpha, beta)
        if miss is not None:
            f = f - miss_weight * miss[:, g]
        f = jnp.where(ok, f, ninf)
        best = jnp.argmax(f)
        found = ok[best]
        s = jnp.where(found, pool_s[best], 0.0)
        assign = jnp.where((jnp.arange(n_pool) == best) & found, g, assign)
        blocked = blocked.at[g].set(blocked[g] | ~found)  # nothing fits this worker
        return (it + 1, assign, free_.at[g].add(-found.astype(free_.dtype)),
                room.at[g].add(-jnp.where(found, need[best], 0.0)), took.at[g].add(s), blocked)

    # ---- stage 2: subset choice per worker in priority order
    def s2_body(_, c):
        assign, free_, room, took, done = c
        g, top = pick_worker(free_, took, (free_ > 0) & ~done)
        waiting = pool_valid & (assign < 0)
        pos, w_ok = first_positions(waiting, window)  # the W oldest waiting entries
        w_s = jnp.where(w_ok, pool_s[pos], 0.0)
        ds = subsets.astype(jnp.float32) @ w_s
        dn = subsets.astype(jnp.float32) @ jnp.where(w_ok, need[pos], 0.0)
        uses_missing = jnp.any(subsets & ~w_ok[None, :], axis=1)
        feasible = ~uses_missing & (sizes <= free_[g]) & (dn <= room[g])
        f = score(ds, margins, d, g, took[g], alpha, beta)
        if miss is not None:
            f = f - miss_weight * (subsets.astype(jnp.float32) @ jnp.where(w_ok, miss[pos, g], 0.0))
        f = jnp.where(feasible, f, ninf)
        best = jnp.argmax(f)
        single = jnp.argmax(jnp.where(feasible & (sizes == 1), f, ninf))
        use = jnp.where(f[best] > 0, best, single)
        use_ok = feasible[use] & (sizes[use] > 0) & (top > 0)
        members = subsets[use] & use_ok & w_ok  # [W]
        chosen = jnp.zeros((n_pool,), bool).at[pos].max(members)
        s = jnp.sum(jnp.where(members, w_s, 0.0))
        used = jnp.sum(jnp.where(members, need[pos], 0.0))
        assign = jnp.where(chosen, g, assign)
        return (assign, free_.at[g].add(-jnp.sum(members).astype(free_.dtype)), room.at[g].add(-used),
                took.at[g].add(s), done.at[g].set(True))

    none_blocked = jnp.zeros((n_workers,), bool)

    def run_stage1(_):
        out = jax.lax.while_loop(s1_cond, s1_body, (jnp.int32(0), assign0, free, kv_room, zeros_g, none_blocked))
        return out[1]

    def s2_cond(c):
        """Another worker's turn can change the assignment: some entry waits and some worker not yet served
        has a free slot (a turn without either changes nothing; under `vmap` the loop then stops once no row
        needs it, e.g. every row in stage 1)."""
        i, assign, free_, _, _, done = c
        return ((i < n_workers) & ~stage1 & jnp.any(pool_valid & (assign < 0))
                & jnp.any((free_ > 0) & ~done))

    def run_stage2(_):
        body = lambda c: (c[0] + 1, *s2_body(c[0], c[1:]))  # noqa: E731
        return jax.lax.while_loop(s2_cond, body, (jnp.int32(0), assign0, free, kv_room, zeros_g, none_blocked))[1]

    return jax.lax.cond(stage1, run_stage1, run_stage2, None)


def fifo_dispatch(policy, key, pool_s, pool_valid, counts, kv, rr_next, free, kv_room, max_iters: int,
                  pool_need=None, cached=None):
    """A baseline in pooled mode: the oldest waiting request goes to the worker the baseline picks
    among those with a free slot this step (and KV room for pool_need, default its prompt), repeated
    while possible. cached [P, G]: each entry's leading cached prompt tokens per worker (`cache`).

    Returns (assign [P] int32, rr_next).
    """
    n_pool = pool_s.shape[0]
    zeros = jnp.zeros(counts.shape, jnp.float32)
    need = pool_s if pool_need is None else pool_need

    def cond(c):
        it, assign, counts_, kv_, free_, room, rr, k = c
        waiting = pool_valid & (assign < 0)
        head = jnp.argmax(waiting)
        elig = (free_ > 0) & (need[head] <= room)
        return (it < max_iters) & jnp.any(waiting) & jnp.any(elig)

    def body(c):
        it, assign, counts_, kv_, free_, room, rr, k = c
        k, sub = jax.random.split(k)
        waiting = pool_valid & (assign < 0)
        head = jnp.argmax(waiting)
        s = pool_s[head]
        elig = (free_ > 0) & (need[head] <= room)
        g = choose_worker(policy, sub, counts_, kv_, rr, elig, zeros, None if cached is None else cached[head])
        assign = assign.at[head].set(g)
        return (it + 1, assign, counts_.at[g].add(1), kv_.at[g].add(s), free_.at[g].add(-1),
                room.at[g].add(-need[head]),
                (g + 1) % counts.shape[0], k)

    init = (jnp.int32(0), jnp.full((n_pool,), -1, jnp.int32), counts, kv, free, kv_room, rr_next, key)
    out = jax.lax.while_loop(cond, body, init)
    return out[1], out[6]
