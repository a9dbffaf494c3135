"""Decode data-parallel workers behind a barrier (BalanceRoute's setting), one barrier step per event.

G decode workers advance in lockstep. Worker g has S slots and a KV capacity; its load is
L_g(k) = Σ_{i active on g} (s_i + j_i) (prompt plus tokens generated so far). One step:

1. Intake. Requests whose prefill has completed (arrival time <= now) enter the proxy, oldest
   first, while fewer than P requests wait (back-pressure: the rest wait upstream, so nothing
   is dropped). *Immediate* dispatch routes each one on entry to a worker's local FCFS queue
   (`choose_worker`); *pooled* dispatch keeps it in the prompt pool (capacity P).
2. Admission (at most R_max new requests per worker per step, only into free slots, only if
   the prompt fits the worker's KV room). Immediate: each worker admits FCFS from its queue.
   Pooled: BalanceRoute's two-stage binding (br0/brh) or, for a baseline forced to pooled,
   oldest-first with the baseline's worker choice.
3. Decode. Every active request emits one token; its KV grows by one; it finishes when it has
   emitted its output length. Step time = max_g decode_step_time(batch_g, L_g) + collective
   overhead. When nothing is active the clock jumps to the next arrival (no barrier step).

Seeds: saturated and Poisson runs take the workload's requests in a per-seed random order
(trace replays keep the trace order), so every seed is a different replay.
Assignment is sticky (no migration). Metrics average over barrier steps: imbalance_tokens
(max - min load), barrier_idle_tokens (I = G*M - Σ L), and per request TPOT = (finish - admit) /
output tokens, i.e. the mean barrier-step time over the request's life.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute import cost_models, metrics, sim
from jaxroute.errors import JaxrouteError
from jaxroute.predictors import base as predictors
from jaxroute.registry import PolicyRegistry
from jaxroute.routers import balance
from jaxroute.workloads.decode import DecodeRequests

ARRIVALS = ("saturated", "poisson", "trace")
ARRIVAL_REGISTRY = PolicyRegistry("decode", ARRIVALS, what="arrival mode")
SATURATED, POISSON, TRACE = range(3)

# Documented default deployment: Llama-3-8B (dense, GQA, 128 KiB KV/token) on one H200 per DP
# worker, 64 slots. A loaded worker (64 x ~5.7k tokens) steps in ~17 ms, of which ~60 % is KV
# reads, so the barrier pays for KV imbalance as in the paper (whose steps take ~60 ms).
DEFAULT_GPU = "H200"
DEFAULT_MODEL = "Llama-3-8B"
DEFAULT_TP = 1
DEFAULT_SLOTS = 64
DEFAULT_POOL = 32
DEFAULT_WINDOW = 8
DEFAULT_HORIZON = 80
DEFAULT_R_MAX = 4
DEFAULT_COLLECTIVE_S = 1.0e-3  # per-step DP synchronisation / collective overhead
# BR-H weights. α = 1 keeps the gain in tokens; β = G makes the h = 0 term exactly BR-0's
# penalty; γ = 0.95 halves the weight of a step ~14 steps ahead (predictions far ahead count less).
DEFAULT_ALPHA = 1.0
DEFAULT_GAMMA = 0.95


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeWorkload:
    """Requests and deployment, broadcast to every (config, seed) row."""

    prompt: jax.Array  # [N] int32 prompt tokens s_i (KV on admission)
    output: jax.Array  # [N] int32 output tokens (decode steps)
    arrival_s: jax.Array  # [N] float32 trace arrival times (used with arrival=trace)
    key_id: jax.Array  # [N] int32 prompt key for predictors (-1 unknown)
    cost: cost_models.CostParams  # per-worker step-time model
    collective_s: jax.Array  # [] float32 fixed per-step barrier overhead
    bank: tuple = ()  # fitted predictor tables (predictors.base), one per registered deployable kind


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeParams:
    """Traced per-row settings (vmapped over for comparisons and sweeps)."""

    policy: jax.Array  # [] int32 id in balance.REGISTRY
    dispatch: jax.Array  # [] int32 id in balance.DISPATCH_REGISTRY (0 immediate, 1 pooled)
    predictor: jax.Array  # [] int32 predictor kind id (predictors.base.kind_names(); BR-H only)
    alpha: jax.Array  # [] float32 BR-H gain weight
    beta: jax.Array  # [] float32 BR-H overflow penalty
    gamma: jax.Array  # [] float32 BR-H discount
    arrival: jax.Array  # [] int32 id in ARRIVAL_REGISTRY (0 saturated, 1 poisson, 2 trace)
    rate: jax.Array  # [] float32 Poisson rate (requests/s)


def make_params(policy: str, *, n_workers: int, dispatch: str | None = None, predictor: int = 1,
                alpha: float = DEFAULT_ALPHA, beta: float | None = None, gamma: float = DEFAULT_GAMMA,
                arrival: str = "saturated", rate: float = 1.0) -> DecodeParams:
    """Params for one row; beta defaults to G; dispatch defaults to the policy's own mode.

    predictor is a kind id (`predictors.base.kind_id(name)`); whether the workload's bank has
    its fitted table is checked where params and workload meet (`DecodeModel.check_params`).
    """
    pid = balance.policy_id(policy)
    if dispatch is not None:
        balance.DISPATCH_REGISTRY.id(dispatch)
    ARRIVAL_REGISTRY.id(arrival)
    predictors.check_kind_ids(predictor)
    if arrival == "poisson" and not (math.isfinite(rate) and rate > 0):
        raise JaxrouteError(f"Poisson arrival rate must be positive and finite, got {rate}")
    for name, v in (("alpha", alpha), ("beta", beta), ("gamma", gamma)):
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise JaxrouteError(f"BR-H {name} must be a finite non-negative number, got {v}")
    disp = balance.default_dispatch(policy) if dispatch is None else balance.DISPATCH_MODES.index(dispatch)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    i32 = lambda x: jnp.asarray(x, jnp.int32)
    return DecodeParams(i32(pid), i32(disp), i32(predictor), f32(alpha),
                        f32(n_workers if beta is None else beta), f32(gamma), i32(ARRIVALS.index(arrival)), f32(rate))


def make_workload(req: DecodeRequests, cost: cost_models.CostParams, collective_s: float = DEFAULT_COLLECTIVE_S,
                  bank: tuple = ()) -> DecodeWorkload:
    return DecodeWorkload(
        prompt=jnp.asarray(req.prompt_tokens, jnp.int32),
        output=jnp.asarray(req.output_tokens, jnp.int32),
        arrival_s=jnp.asarray(req.arrival_s, jnp.float32),
        key_id=jnp.asarray(req.key_id, jnp.int32),
        cost=cost,
        collective_s=jnp.asarray(collective_s, jnp.float32),
        bank=tuple(bank),
    )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
    key: jax.Array  # PRNG key for router coin flips
    t: jax.Array  # [] float32 clock (s)
    event: jax.Array  # [] int32 events processed (scan iterations that did something)
    steps: jax.Array  # [] int32 barrier steps
    arrival_t: jax.Array  # [N] float32 when each request's prefill completes
    prompt: jax.Array  # [N] int32 prompt tokens, in this run's arrival order
    output: jax.Array  # [N] int32 output tokens, same order
    key_id: jax.Array  # [N] int32 prompt keys, same order
    next_in: jax.Array  # [] int32 requests taken in by the proxy (a prefix of arrival order)
    pool: jax.Array  # [P] int32 request ids waiting in the prompt pool, oldest first, -1 empty
    queue: jax.Array  # [G, P] int32 local FCFS queues (immediate), oldest first, -1 empty
    rr_next: jax.Array  # [] int32 round-robin pointer
    slot_req: jax.Array  # [G, S] int32 request in each slot, -1 free
    slot_gen: jax.Array  # [G, S] int32 tokens generated so far by that request
    admit_t: jax.Array  # [N] float32 start of the request's first decode step
    finish_t: jax.Array  # [N] float32 end of its last decode step
    done: jax.Array  # [N] bool
    worker_of: jax.Array  # [N] int32 worker the request was bound to, -1 before
    tokens_out: jax.Array  # [] int32 tokens emitted
    sum_imb: jax.Array  # [] float32 Σ over steps of max - min load
    sum_idle: jax.Array  # [] float32 Σ over steps of I(k) = G M - Σ L
    sum_load: jax.Array  # [] float32 Σ over steps of mean load
    sum_imb_loaded: jax.Array  # [] float32 Σ of max - min over the loaded phase (requests still to admit)
    steps_loaded: jax.Array  # [] int32 barrier steps in the loaded phase
    busy_s: jax.Array  # [G] float32 Σ of each worker's own compute time
    barrier_s: jax.Array  # [] float32 Σ of barrier step times
    kv_overflow: jax.Array  # [] bool a worker's KV grew beyond its capacity
    all_admitted_t: jax.Array  # [] float32 time the last request was admitted (end of the loaded phase)
    tokens_loaded: jax.Array  # [] int32 tokens emitted up to then
    trace_kv: jax.Array  # [T, G] float32 sampled per-worker loads
    trace_t: jax.Array  # [T] float32 sample times


@dataclasses.dataclass(frozen=True)
class DecodeModel(sim.Model):
    """Static configuration (shapes) of the decode DP barrier simulator."""

    n_workers: int
    n_requests: int
    max_steps: int
    slots: int = DEFAULT_SLOTS
    pool: int = DEFAULT_POOL
    window: int = DEFAULT_WINDOW
    horizon: int = DEFAULT_HORIZON
    r_max: int = DEFAULT_R_MAX
    kv_capacity: int = 10**9  # KV tokens per worker
    trace_points: int = 128

    def __post_init__(self):
        for name in ("n_workers", "n_requests", "max_steps", "slots", "pool", "window", "r_max", "trace_points"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise JaxrouteError(f"{name.replace('_', ' ')} must be a positive integer, got {v!r}")
        if not isinstance(self.horizon, int) or self.horizon < 0:
            raise JaxrouteError(f"horizon must be a non-negative integer, got {self.horizon!r}")
        if self.window > 12:
            raise JaxrouteError(f"candidate window W={self.window} enumerates 2^W subsets; use W <= 12")
        if self.window > self.pool:
            raise JaxrouteError(f"candidate window W={self.window} exceeds the pool capacity P={self.pool}")
        if self.kv_capacity < 1:
            raise JaxrouteError(f"KV capacity must be positive, got {self.kv_capacity}")

    @property
    def trace_stride(self) -> int:
        return max(1, math.ceil(self.max_steps / self.trace_points))

    def num_steps(self, workload) -> int:
        return self.max_steps

    def is_done(self, st: DecodeState) -> jax.Array:
        """Every request has finished (`step` is then a no-op)."""
        return jnp.all(st.done)

    def check_params(self, params: DecodeParams, workload: DecodeWorkload | None = None) -> None:
        """Refuse ids that `lax.switch` / `lax.cond` would clamp or misread, before tracing.

        Policy, dispatch mode and arrival mode ids must name an entry; a predictor id must
        name a predictor whose fitted table is in the workload's bank (a `learned` id with a
        bank that lacks the learned slot would otherwise run the last fitted predictor).
        """
        balance.REGISTRY.check_id(params.policy)
        balance.DISPATCH_REGISTRY.check_id(params.dispatch)
        ARRIVAL_REGISTRY.check_id(params.arrival)
        predictors.check_kind_ids(params.predictor, None if workload is None else workload.bank)

    # ------------------------------------------------------------------ init

    def init(self, key, wl: DecodeWorkload, params: DecodeParams) -> DecodeState:
        n, g, s, p = self.n_requests, self.n_workers, self.slots, self.pool
        key, k_arr, k_perm = jax.random.split(key, 3)
        # Per-seed variation: saturated and Poisson runs take the requests in a random order;
        # trace replays keep the trace's order and timestamps.
        perm = jnp.where(params.arrival == TRACE, jnp.arange(n), jax.random.permutation(k_perm, n))
        gaps = jax.random.exponential(k_arr, (n,)) / jnp.maximum(params.rate, 1e-12)
        poisson_t = jnp.cumsum(gaps) - gaps[0]
        arrival_t = jnp.select([params.arrival == SATURATED, params.arrival == POISSON],
                               [jnp.zeros((n,), jnp.float32), poisson_t], wl.arrival_s).astype(jnp.float32)
        f0, i0 = jnp.float32(0.0), jnp.int32(0)
        return DecodeState(
            key=key, t=f0, event=i0, steps=i0, arrival_t=arrival_t, next_in=i0,
            prompt=wl.prompt[perm], output=wl.output[perm], key_id=wl.key_id[perm],
            pool=jnp.full((p,), -1, jnp.int32), queue=jnp.full((g, p), -1, jnp.int32), rr_next=i0,
            slot_req=jnp.full((g, s), -1, jnp.int32), slot_gen=jnp.zeros((g, s), jnp.int32),
            admit_t=jnp.zeros((n,), jnp.float32), finish_t=jnp.zeros((n,), jnp.float32),
            done=jnp.zeros((n,), bool), worker_of=jnp.full((n,), -1, jnp.int32), tokens_out=i0,
            sum_imb=f0, sum_idle=f0, sum_load=f0, sum_imb_loaded=f0, steps_loaded=i0,
            busy_s=jnp.zeros((g,), jnp.float32), barrier_s=f0,
            kv_overflow=jnp.bool_(False), all_admitted_t=f0, tokens_loaded=i0,
            trace_kv=jnp.zeros((self.trace_points, g), jnp.float32),
            trace_t=jnp.zeros((self.trace_points,), jnp.float32),
        )

    # ------------------------------------------------------------------ helpers

    def loads(self, st: DecodeState, wl: DecodeWorkload) -> jax.Array:
        """[G] float32 KV load of the active requests: Σ (s_i + j_i)."""
        active = st.slot_req >= 0
        ctx = st.prompt[jnp.maximum(st.slot_req, 0)] + st.slot_gen
        return jnp.sum(jnp.where(active, ctx, 0), axis=1).astype(jnp.float32)

    def predicted_loads(self, st: DecodeState, wl: DecodeWorkload, params: DecodeParams) -> jax.Array:
        """[G, H+1] BR-H's predicted loads L_g(k+h) of the active requests.

        A request contributes (c_i + h), c_i = s_i + j_i, times its predicted presence: 1 at h = 0,
        and (1 - p_fin) + p_fin * clip(mu_rem - h, 0, 1) for h >= 1 (it stays beyond H unless it
        ends, and then for mu_rem steps); the sum of the presence over h = 0..H-1 is
        c_hat = (1 - p_fin) H + p_fin mu_rem. Computed with per-worker bins over h (O(G S + G H)).
        """
        hzn, g = self.horizon, self.n_workers
        rid = jnp.maximum(st.slot_req, 0).reshape(-1)
        active = (st.slot_req >= 0).reshape(-1)
        gen = st.slot_gen.reshape(-1)
        feats = predictors.RequestFeatures(prompt_len=st.prompt[rid], generated=gen, key_id=st.key_id[rid],
                                           remaining=st.output[rid] - gen)
        p_fin, mu = predictors.predict(wl.bank, params.predictor, feats, hzn)
        act = active.astype(jnp.float32)
        p_fin = jnp.clip(p_fin, 0.0, 1.0) * act
        mu = jnp.maximum(mu, 0.0)
        c = (st.prompt[rid] + gen).astype(jnp.float32) * act
        worker = jnp.repeat(jnp.arange(g), self.slots)
        q = jnp.minimum(jnp.floor(mu), hzn + 1).astype(jnp.int32)  # presence 1 for h < q
        frac = jnp.where(q <= hzn, mu - jnp.floor(mu), 0.0)  # presence frac at h = q
        h = jnp.arange(hzn + 1, dtype=jnp.float32)
        zeros = jnp.zeros((g, hzn + 2), jnp.float32)
        p_bin = zeros.at[worker, q].add(p_fin)
        pc_bin = zeros.at[worker, q].add(p_fin * c)
        alive_p = (jnp.cumsum(p_bin[:, ::-1], axis=1)[:, ::-1])[:, 1:]  # Σ_{q_i > h} p_i, h = 0..H
        alive_pc = (jnp.cumsum(pc_bin[:, ::-1], axis=1)[:, ::-1])[:, 1:]
        f_p = zeros.at[worker, q].add(p_fin * frac)[:, : hzn + 1]
        f_pc = zeros.at[worker, q].add(p_fin * frac * c)[:, : hzn + 1]
        stay = zeros[:, 0].at[worker].add(act - p_fin)  # Σ (1 - p_i) over active
        stay_c = zeros[:, 0].at[worker].add((act - p_fin) * c)
        future = stay_c[:, None] + stay[:, None] * h + alive_pc + alive_p * h + f_pc + f_p * h
        now = zeros[:, 0].at[worker].add(c)
        return jnp.where(h[None, :] == 0, now[:, None], future)

    def place(self, st: DecodeState, ids: jax.Array, workers: jax.Array) -> DecodeState:
        """Put requests ids [K] into free slots of workers [K] (-1 = skip), in the given order."""
        g = self.n_workers
        onehot = (workers[:, None] == jnp.arange(g)[None, :]) & (ids[:, None] >= 0)  # [K, G]
        rank = jnp.sum(jnp.cumsum(onehot, axis=0) * onehot, axis=1) - 1  # k-th request for its worker
        ok = jnp.any(onehot, axis=1)
        w = jnp.where(ok, workers, 0)
        free = st.slot_req[w] < 0  # [K, S] free slots of each request's worker
        hit = free & (jnp.cumsum(free, axis=1) - 1 == rank[:, None])
        slot = jnp.argmax(hit, axis=1)  # the rank-th free slot
        w_drop = jnp.where(ok, workers, g)  # out of range -> dropped by the scatter
        rid = jnp.where(ok, ids, self.n_requests)
        return dataclasses.replace(
            st,
            slot_req=st.slot_req.at[w_drop, slot].set(ids, mode="drop"),
            slot_gen=st.slot_gen.at[w_drop, slot].set(0, mode="drop"),
            admit_t=st.admit_t.at[rid].set(st.t, mode="drop"),
            worker_of=st.worker_of.at[rid].set(workers, mode="drop"),
        )

    # ------------------------------------------------------------------ step

    def step(self, st: DecodeState, wl: DecodeWorkload, params: DecodeParams) -> DecodeState:
        finished = self.is_done(st)  # a no-op once done, so chunked runs that stop early equal full runs
        new = self._step(st, wl, params)
        return jax.tree.map(lambda a, b: jnp.where(finished, a, b), st, new)

    def _step(self, st: DecodeState, wl: DecodeWorkload, params: DecodeParams) -> DecodeState:
        g, p, n = self.n_workers, self.pool, self.n_requests
        key, k_in, k_out = jax.random.split(st.key, 3)
        st = dataclasses.replace(st, key=key)
        pooled = params.dispatch == balance.POOLED
        n_arrived = jnp.sum(st.arrival_t <= st.t).astype(jnp.int32)
        a, b, d = balance.score_weights(params.policy, params.alpha, params.beta, params.gamma, g, self.horizon)
        sum_d = jnp.sum(d)
        active = st.slot_req >= 0
        n_active = jnp.sum(active, axis=1)
        load = self.loads(st, wl)
        loads_h = self.predicted_loads(st, wl, params)

        # ---- 1. intake
        n_waiting = jnp.sum(st.pool >= 0) + jnp.sum(st.queue >= 0)
        take = jnp.clip(jnp.minimum(n_arrived - st.next_in, p - n_waiting), 0, p)

        def intake_pooled(st):
            n_pool = jnp.sum(st.pool >= 0)
            j = jnp.arange(p)
            new_ids = st.next_in + j - n_pool
            pool = jnp.where((j >= n_pool) & (j < n_pool + take), new_ids, st.pool)
            return dataclasses.replace(st, pool=pool, next_in=st.next_in + take)

        def intake_immediate(st):
            q_prompt = jnp.where(st.queue >= 0, st.prompt[jnp.maximum(st.queue, 0)], 0)
            q_load = jnp.sum(q_prompt, axis=1).astype(jnp.float32)
            counts0 = (n_active + jnp.sum(st.queue >= 0, axis=1)).astype(jnp.float32)
            table = balance.penalty_tables(balance.margins_of(loads_h + q_load[:, None]), d)
            qlen0 = jnp.sum(st.queue >= 0, axis=1)
            everyone = jnp.ones((g,), bool)

            def body(c):
                i, queue, qlen, counts, kv, took, rr, k = c
                k, sub = jax.random.split(k)
                rid = st.next_in + i
                s_i = st.prompt[rid].astype(jnp.float32)
                single = jax.vmap(lambda gg: balance.score(s_i, table, gg, took[gg], a, b, sum_d))(jnp.arange(g))
                gi = balance.choose_worker(params.policy, sub, counts, kv, rr, everyone, single)
                queue = queue.at[gi, qlen[gi]].set(rid)
                return (i + 1, queue, qlen.at[gi].add(1), counts.at[gi].add(1.0), kv.at[gi].add(s_i),
                        took.at[gi].add(s_i), (gi + 1) % g, k)

            init = (jnp.int32(0), st.queue, qlen0, counts0, load + q_load, jnp.zeros((g,), jnp.float32),
                    st.rr_next, k_in)
            out = jax.lax.while_loop(lambda c: c[0] < take, body, init)
            return dataclasses.replace(st, queue=out[1], rr_next=out[6], next_in=st.next_in + take)

        st = jax.lax.cond(pooled, intake_pooled, intake_immediate, st)

        # ---- 2. admission
        free = jnp.minimum(self.slots - n_active, self.r_max)
        room = self.kv_capacity - load

        def admit_pooled(st):
            valid = st.pool >= 0
            pool_s = jnp.where(valid, st.prompt[jnp.maximum(st.pool, 0)], 0).astype(jnp.float32)
            is_br = (params.policy == balance.BR0) | (params.policy == balance.BRH)
            counts = n_active.astype(jnp.float32)

            def br(_):
                return balance.balance_dispatch(pool_s, valid, loads_h, free, room, a, b, d, self.window,
                                                g * self.r_max), st.rr_next

            def fifo(_):
                return balance.fifo_dispatch(params.policy, k_out, pool_s, valid, counts, load, st.rr_next, free,
                                             room, g * self.r_max)

            assign, rr = jax.lax.cond(is_br, br, fifo, None)
            st = self.place(st, jnp.where(assign >= 0, st.pool, -1), assign)
            left = jnp.where(assign >= 0, -1, st.pool)
            return dataclasses.replace(st, pool=compact(left), rr_next=rr)

        def admit_immediate(st):
            head = st.queue[:, : self.r_max]  # [G, R]
            h_s = jnp.where(head >= 0, st.prompt[jnp.maximum(head, 0)], 0)
            j = jnp.arange(self.r_max)[None, :]
            fits = jnp.cumsum(h_s, axis=1) <= room[:, None]
            ok = (head >= 0) & (j < free[:, None]) & jnp.cumprod(fits, axis=1).astype(bool)  # FCFS prefix
            workers = jnp.where(ok, jnp.arange(g)[:, None], -1)
            st = self.place(st, jnp.where(ok, head, -1).reshape(-1), workers.reshape(-1))
            n_ok = jnp.sum(ok, axis=1)
            col = jnp.arange(p)[None, :] + n_ok[:, None]
            queue = jnp.where(col < p, jnp.take_along_axis(st.queue, jnp.minimum(col, p - 1), axis=1), -1)
            return dataclasses.replace(st, queue=queue)

        st = jax.lax.cond(pooled, admit_pooled, admit_immediate, st)

        # ---- 3. one decode step (or a jump to the next arrival when idle)
        active = st.slot_req >= 0
        n_act = jnp.sum(active, axis=1)
        load = self.loads(st, wl)
        any_active = jnp.any(active)
        per_worker = jax.vmap(lambda nb, ld: cost_models.decode_step_time(wl.cost, nb, ld / jnp.maximum(nb, 1)))(
            n_act.astype(jnp.float32), load)
        dt = jnp.where(any_active, jnp.max(per_worker) + wl.collective_s, 0.0)
        t_end = st.t + dt
        gen = st.slot_gen + active
        out_len = st.output[jnp.maximum(st.slot_req, 0)]
        fin = active & (gen >= out_len)
        fin_ids = jnp.where(fin, st.slot_req, n).reshape(-1)
        m_load = jnp.max(load)
        imb = m_load - jnp.min(load)
        idle = g * m_load - jnp.sum(load)
        kv_after = self.loads(dataclasses.replace(st, slot_gen=gen), wl)
        emitted = jnp.sum(active).astype(jnp.int32)

        # idle jump: the next request not yet in the proxy
        next_t = st.arrival_t[jnp.minimum(st.next_in, n - 1)]
        nothing_waiting = (jnp.sum(st.pool >= 0) + jnp.sum(st.queue >= 0)) == 0
        jump = ~any_active & nothing_waiting & (st.next_in < n)
        t_new = jnp.where(any_active, t_end, jnp.where(jump, jnp.maximum(st.t, next_t), st.t))

        all_in = (st.next_in >= n) & nothing_waiting
        first_all_in = all_in & (st.all_admitted_t == 0) & (st.tokens_loaded == 0)
        stride = self.trace_stride
        rec = any_active & (st.steps % stride == 0) & (st.steps // stride < self.trace_points)
        ti = jnp.where(rec, st.steps // stride, self.trace_points)
        w = any_active.astype(jnp.float32)
        return dataclasses.replace(
            st,
            t=t_new,
            event=st.event + 1,
            steps=st.steps + any_active.astype(jnp.int32),
            slot_gen=jnp.where(fin, 0, gen),
            slot_req=jnp.where(fin, -1, st.slot_req),
            finish_t=st.finish_t.at[fin_ids].set(t_end, mode="drop"),
            done=st.done.at[fin_ids].set(True, mode="drop"),
            tokens_out=st.tokens_out + emitted,
            sum_imb=st.sum_imb + w * imb,
            sum_idle=st.sum_idle + w * idle,
            sum_load=st.sum_load + w * jnp.mean(load),
            sum_imb_loaded=st.sum_imb_loaded + jnp.where(all_in, 0.0, w * imb),
            steps_loaded=st.steps_loaded + (any_active & ~all_in).astype(jnp.int32),
            busy_s=st.busy_s + jnp.where(any_active, per_worker, 0.0),
            barrier_s=st.barrier_s + dt,
            kv_overflow=st.kv_overflow | jnp.any(kv_after > self.kv_capacity),
            all_admitted_t=jnp.where(first_all_in, st.t, st.all_admitted_t),
            tokens_loaded=jnp.where(first_all_in, st.tokens_out, st.tokens_loaded),
            trace_kv=st.trace_kv.at[ti].set(load, mode="drop"),
            trace_t=st.trace_t.at[ti].set(st.t, mode="drop"),
        )

    # ------------------------------------------------------------------ metrics

    def metrics(self, st: DecodeState, wl: DecodeWorkload, params: DecodeParams) -> dict[str, jax.Array]:
        steps = jnp.maximum(st.steps, 1).astype(jnp.float32)
        done = st.done
        tpot = (st.finish_t - st.admit_t) / st.output.astype(jnp.float32)
        makespan = jnp.max(jnp.where(done, st.finish_t, 0.0))
        in_flight = (jnp.sum(st.pool >= 0) + jnp.sum(st.queue >= 0) + jnp.sum(st.slot_req >= 0)).astype(jnp.int32)
        req_err = jnp.abs(st.next_in - (jnp.sum(done).astype(jnp.int32) + in_flight))
        out_done = jnp.sum(jnp.where(done, st.output, 0))
        tok_err = jnp.abs(st.tokens_out - (out_done + jnp.sum(st.slot_gen)))
        incomplete = ~jnp.all(done)
        util = st.busy_s / jnp.maximum(st.barrier_s, 1e-12)
        loaded_t = jnp.where(st.all_admitted_t > 0, st.all_admitted_t, makespan)
        loaded_tok = jnp.where(st.all_admitted_t > 0, st.tokens_loaded, st.tokens_out)
        out = {
            "imbalance_tokens": st.sum_imb / steps,
            "barrier_idle_tokens": st.sum_idle / steps,
            "imbalance_loaded_tokens": st.sum_imb_loaded / jnp.maximum(st.steps_loaded, 1).astype(jnp.float32),
            "mean_load_tokens": st.sum_load / steps,
            "tpot_p95_s": metrics.masked_quantile(tpot, done, 0.95),
            "tpot_mean_s": metrics.masked_mean(tpot, done),
            "throughput_tok_s": st.tokens_out.astype(jnp.float32) / jnp.maximum(makespan, 1e-9),
            "throughput_loaded_tok_s": loaded_tok.astype(jnp.float32) / jnp.maximum(loaded_t, 1e-9),
            "makespan_s": makespan,
            "steps": st.steps,
            "mean_step_s": st.barrier_s / steps,
            "util_mean": jnp.mean(util),
            "util_min": jnp.min(util),
            "worker_util": util,
            "completed": jnp.sum(done).astype(jnp.int32),
            "overflow_kv": st.kv_overflow,
            "overflow_steps": incomplete,
            "overflow": st.kv_overflow | incomplete,
            "conservation_error": (req_err + tok_err).astype(jnp.int32),
            "request_worker": st.worker_of,
            "request_admit_s": st.admit_t,
            "request_finish_s": jnp.where(done, st.finish_t, -1.0),
            "trace_kv": st.trace_kv,
            "trace_t": st.trace_t,
        }
        return out


# Old name, kept while the commands and scripts move to the new one (removed at the end of issue 9).


def compact(ids: jax.Array) -> jax.Array:
    """Move the valid (>= 0) entries of ids [..., P] to the front, keeping their order."""
    valid = ids >= 0
    dest = jnp.where(valid, jnp.cumsum(valid, axis=-1) - 1, ids.shape[-1])
    out = jnp.full(ids.shape, -1, ids.dtype)
    if ids.ndim == 1:
        return out.at[dest].set(ids, mode="drop")
    rows = jnp.arange(ids.shape[0])[:, None]
    return out.at[rows, dest].set(ids, mode="drop")


# --------------------------------------------------------------------------- sizing helpers


def step_budget(req: DecodeRequests, n_workers: int, slots: int, r_max: int, arrival: str,
                rate: float = 1.0, min_step_s: float = 1e-3, slack: float = 1.1) -> int:
    """A static upper bound on the events one run needs (runs that exceed it flag overflow_steps).

    Saturated: loaded steps (total tokens / all slots) plus admission-limited steps plus the
    longest request (the drain), with slack. Poisson/trace: also the arrival span divided by the
    shortest possible step; capped by the all-serial bound (one request at a time, plus one idle
    jump per request).
    """
    out = np.asarray(req.output_tokens)
    n = len(out)
    loaded = out.sum() / (n_workers * slots) + n / (n_workers * r_max)
    bound = slack * (loaded + out.max()) + 64
    if arrival != "saturated":
        span = float(req.arrival_s[-1]) if arrival == "trace" else n / max(rate, 1e-9) * 1.5
        bound += span / min_step_s
    return int(min(bound, out.sum() + 2 * n + 64))
