"""Prefill/decode disaggregation: a prefix-cache prefill tier, KV transfer links, a decode tier of DP ranks.

One run is three batched programs, each compiled once per grid (P and D are traced counts under the
static maxima, so a sweep over P:D ratios is one compilation of each):

1. **Prefill tier** (`PrefillStage`): the replica engine of `clusters/replicas` (chunked prefill, a prefix
   cache per replica, any prefix router preset), with `n_active` = P of its `n_replicas` replicas in use.
   A replica runs prefill only: a request leaves it when its prompt's KV is complete (the end of the
   iteration that computes its last prompt chunk). Its output is not cached there (`out_seg` = none).
2. **KV transfer** (`transfer`): bytes = the KV bytes per token of one TP rank (`CostParams.
   kv_bytes_per_token_gpu`) x prompt tokens; rank i of the prefill group sends to rank i of the decode
   group over its own NIC, so a group's transfer takes bytes / bandwidth. Each prefill replica has one
   link (its ranks' NICs in parallel), FIFO in order of prefill completion (ties: request order):
   start = max(ready, link free), the link is busy bytes / bandwidth, and the KV lands `latency` after
   that (a fixed per-transfer latency that does not occupy the link).
3. **Decode tier**, D of its workers in use; a request arrives when its KV lands, and the first token the
   user sees is the decode worker's (vLLM's P/D connector: the prefill instance's own token is dropped).
   Either DP ranks behind a barrier (`DecodeStage`: `dp_decode.DecodeModel`, any decode policy: random, rr,
   p2c, jsq, least_kv, BR-0, BR-H), or independent replicas with continuous batching (`DecodeReplicasStage`:
   the replica engine again, any prefix router preset; `RequestTable.landed` marks the transferred KV, held
   privately until the request's last prompt token is computed, then cached like any prefill).

The P/D decision (`threshold`, traced): a request is disaggregated when its uncached prompt is at least
`threshold` tokens, as llm-d's prefix-based P/D decider rules (llm-d-inference-scheduler
`pkg/plugins/profile/prefix_based_pd_decider.go`, `decide`: threshold <= 0 always disaggregates; else
non-cached = prompt - the decode pod's matched prefix, and below the threshold the decode pod runs the
prefill itself). Below it the decode rank prefills the request at admission (a prefill in that barrier step,
`DecodeWorkload.local_prefill`). The decider measures "uncached" on the chosen decode pod's prefix index; the
pipeline decides before the decode tier runs, so it counts the decode side as holding none of the prompt
(non-cached = the whole prompt). threshold 0 = always disaggregate (llm-d's default).

Conservation: every request is in exactly one of the stages' books (`PrefillStage.metrics`,
`DecodeStage.metrics` report it); each stage's capacities raise their own flags.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute import sim
from jaxroute.clusters import dp_decode as dd
from jaxroute.clusters import replicas
from jaxroute.errors import JaxrouteError
from jaxroute.workloads.prefix import RequestTable

INF = jnp.inf


@dataclasses.dataclass(frozen=True)
class _Realized:
    """A workload whose realisation is already made (the replica engine calls `realize`)."""

    table: RequestTable

    def realize(self, key, rate) -> RequestTable:
        del key, rate
        return self.table


# ----------------------------------------------------------------------------- stage 1: the prefill tier


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PrefillStageParams:
    tier: replicas.ReplicaParams  # the prefill tier's router, rate, KV capacity, cost, n_active (= P)
    threshold: jax.Array  # [] float32 disaggregate when the uncached prompt >= this many tokens (0 = always)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PrefillStageState:
    tier: replicas.ReplicaState  # requests in prefill order: the disaggregated ones first, by arrival
    table: RequestTable  # this seed's requests in arrival order (what the decode tier gets)
    order: jax.Array  # [N] int32 request (arrival index) at each prefill-table position
    disagg: jax.Array  # [N] bool, by arrival index: sent to the prefill tier
    n_disagg: jax.Array  # [] int32


def prefill_table(table: RequestTable, disagg: jax.Array) -> tuple[RequestTable, jax.Array]:
    """The prefill tier's requests: the disaggregated ones first (in arrival order), one output token
    each, outputs not cached; the others last, never arriving (+inf). Returns (table, order)."""
    order = jnp.argsort(~disagg, stable=True).astype(jnp.int32)
    take = lambda x: x[order]
    dummy = table.seg_len.shape[0] - 1
    kept = disagg[order]
    return dataclasses.replace(
        table, arrival_s=jnp.where(kept, take(table.arrival_s), INF), seg_ids=take(table.seg_ids),
        seg_tok=take(table.seg_tok), out_tok=jnp.ones_like(table.out_tok), out_seg=jnp.full_like(table.out_seg, dummy),
        prompt_tok=take(table.prompt_tok), session=take(table.session),
        key_id=None if table.key_id is None else take(table.key_id)), order


@dataclasses.dataclass(frozen=True)
class PrefillStage(sim.Model):
    """The prefill tier of a disaggregated cluster (static: the replica engine's shapes)."""

    cpu_rows_together: ClassVar[int | None] = sim.CPU_ROWS_TOGETHER  # branches and loops: rows in groups
    holds_when_done: ClassVar[bool] = False  # a done state is held by the engine (sim.held_step)

    tier: replicas.ReplicaModel

    def check_params(self, params: PrefillStageParams, workload=None) -> None:
        self.tier.check_params(params.tier, workload)
        if np.any(~np.isfinite(np.asarray(params.threshold))) or np.any(np.asarray(params.threshold) < 0):
            raise JaxrouteError("the P/D threshold must be a finite number of tokens >= 0")

    def num_steps(self, workload) -> int:
        return self.tier.num_steps(workload)

    def init(self, key, workload, params: PrefillStageParams) -> PrefillStageState:
        table = workload.realize(key, params.tier.rate)
        disagg = table.prompt_tok.astype(jnp.float32) >= params.threshold
        ptable, order = prefill_table(table, disagg)
        tier = self.tier.init(key, _Realized(ptable), params.tier)
        return PrefillStageState(tier, table, order, disagg, jnp.sum(disagg).astype(jnp.int32))

    def is_done(self, state: PrefillStageState) -> jax.Array:
        return (state.tier.next_req >= state.n_disagg) & jnp.all(jnp.isinf(state.tier.clock))

    def step(self, state: PrefillStageState, workload, params: PrefillStageParams) -> PrefillStageState:
        return dataclasses.replace(state, tier=self.tier.step(state.tier, None, params.tier))

    def metrics(self, state: PrefillStageState, workload, params: PrefillStageParams) -> dict[str, jax.Array]:
        s = state.tier
        back = lambda x, fill: arrival_index(x, state.order, fill)
        done = jnp.isfinite(s.rec_finish)
        counts = self.tier.metrics(s, _Realized(s.req), params.tier)
        flags = {k: counts[k] for k in counts if k in ("queue_overflow", "cache_full") or k.endswith("_overflow")}
        flags["unfinished"] = ~self.is_done(state)
        completed = jnp.sum(done)
        overflow = jnp.bool_(False)
        for v in flags.values():
            overflow = overflow | v
        in_tier = jnp.sum(s.rep.q_count) + jnp.sum(s.rep.run_req >= 0)
        t = state.table
        return {
            "seg_ids": t.seg_ids, "seg_tok": t.seg_tok, "out_seg": t.out_seg, "session": t.session,
            "seg_len": t.seg_len, "seg_depth": t.seg_depth,
            "arrival_s": state.table.arrival_s, "prompt": state.table.prompt_tok, "output": state.table.out_tok,
            "key_id": jnp.full_like(t.out_tok, -1) if t.key_id is None else t.key_id,
            "disagg": state.disagg, "prefill_replica": back(s.rec_replica, -1),
            "prefill_admit_s": back(s.rec_admit, INF), "prefill_done_s": back(s.rec_finish, INF),
            "prefill_cached": back(s.rec_cached, 0),
            "prefill_busy_s": s.busy_s,
            **flags, "overflow": overflow,
            "dropped": s.dropped,
            "conservation_error": jnp.abs(s.next_req - (completed + in_tier + s.dropped)).astype(jnp.int32),
        }


# ----------------------------------------------------------------------------- stage 2: KV transfer


def arrival_index(x: jax.Array, order: jax.Array, fill=0) -> jax.Array:
    """x [N] indexed by stage position (order[k] = the request at position k) -> indexed by request (arrival order)."""
    return jnp.full(order.shape, fill, x.dtype).at[order].set(x)


def landing(arrival_s: jax.Array, disagg: jax.Array, delivered_s: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(landing time [N], decode order [N]): a disaggregated request reaches the decode tier when its KV lands,
    the others at their arrival. Ties: request order."""
    t = jnp.where(disagg, delivered_s, arrival_s)
    return t, jnp.argsort(t, stable=True).astype(jnp.int32)


def transfer(ready_s: jax.Array, replica: jax.Array, prompt: jax.Array, n_links: int, bytes_per_token: jax.Array,
             link_bytes_per_s: jax.Array, latency_s: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """FIFO KV transfers on one link per prefill replica, in order of readiness (ties: request order).

    ready_s [N] (+inf = not transferred), replica [N], prompt [N]. Returns (start [N], busy [N] link
    seconds, delivered [N]); +inf for requests not transferred."""
    order = jnp.argsort(ready_s, stable=True)
    busy = bytes_per_token * prompt.astype(jnp.float32) / link_bytes_per_s

    def one(free, i):
        r, g = ready_s[i], replica[i]
        go = jnp.isfinite(r)
        start = jnp.maximum(r, free[jnp.maximum(g, 0)])
        end = start + busy[i]
        free = jnp.where(go, free.at[jnp.maximum(g, 0)].set(end), free)
        return free, (jnp.where(go, start, INF), jnp.where(go, end + latency_s, INF))

    _, (start, delivered) = jax.lax.scan(one, jnp.zeros((n_links,), jnp.float32), order)
    place = lambda x: jnp.zeros_like(x).at[order].set(x)
    return place(start), busy, place(delivered)


# ----------------------------------------------------------------------------- stage 3: the decode tier


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeStageParams:
    decode: dd.DecodeParams  # the decode policy, n_active (= D); arrival = trace
    seed: jax.Array  # [] int32 the row's seed index (folded into the decode tier's coin flips)
    wl: dd.DecodeWorkload  # this row's requests in decode-arrival order (landed KV, or arrival if local)
    order: jax.Array  # [N] int32 request (arrival index) at each decode position


@dataclasses.dataclass(frozen=True)
class DecodeStage(sim.Model):
    """The decode tier: one row's handed-off requests (in its params) on the decode DP model."""

    cpu_rows_together: ClassVar[int | None] = sim.CPU_ROWS_TOGETHER  # branches and loops: rows in groups
    holds_when_done: ClassVar[bool] = dd.DecodeModel.holds_when_done  # its step is the decode model's

    tier: dd.DecodeModel

    def check_params(self, params: DecodeStageParams, workload=None) -> None:
        self.tier.check_params(params.decode, params.wl)

    def num_steps(self, workload) -> int:
        return self.tier.num_steps(workload)

    def init(self, key, workload, params: DecodeStageParams) -> dd.DecodeState:
        return self.tier.init(jax.random.fold_in(key, params.seed), params.wl, params.decode)

    def is_done(self, state) -> jax.Array:
        return self.tier.is_done(state)

    def step(self, state, workload, params: DecodeStageParams):
        return self.tier.step(state, params.wl, params.decode)

    def metrics(self, state, workload, params: DecodeStageParams) -> dict[str, jax.Array]:
        m = self.tier.metrics(state, params.wl, params.decode)
        back = lambda x: arrival_index(x, params.order)
        keep = ("imbalance_tokens", "imbalance_loaded_tokens", "barrier_idle_tokens", "preemptions",
                "recomputed_tokens", "steps", "mean_step_s", "overflow_kv", "overflow_steps", "overflow",
                "conservation_error", "completed", "running_per_worker", "running_per_worker_loaded", "slots_in_use",
                "kv_share_of_step", "throughput_loaded_tok_s", "tpot_p95_loaded_s")
        return {**{k: m[k] for k in keep}, "decode_worker": back(m["request_worker"]),
                "decode_admit_s": back(m["request_admit_s"]), "first_token_s": back(m["request_first_s"]),
                "finish_s": back(m["request_finish_s"]), "decode_busy_s": state.busy_s}


def decode_handoff(arrival_s, prompt, output, disagg, delivered_s, collective_s, cost, bank=(), key_id=None):
    """(DecodeWorkload in decode-arrival order, order): disaggregated requests arrive when their KV lands,
    the others at their arrival, to be prefilled by their rank. Ties: request order. key_id [N]: the prompts'
    keys for an exact-match predictor (None: unknown)."""
    t, order = landing(arrival_s, disagg, delivered_s)
    keys = jnp.full(t.shape, -1, jnp.int32) if key_id is None else key_id[order].astype(jnp.int32)
    wl = dd.DecodeWorkload(prompt=prompt[order].astype(jnp.int32), output=output[order].astype(jnp.int32),
                           arrival_s=t[order].astype(jnp.float32), key_id=keys, cost=cost,
                           collective_s=jnp.asarray(collective_s, jnp.float32), bank=tuple(bank),
                           local_prefill=~disagg[order])
    return wl, order


# ----------------------------------------------------------------------------- stage 3': independent decode replicas


def landed_table(table: RequestTable, disagg: jax.Array, delivered_s: jax.Array) -> tuple[RequestTable, jax.Array]:
    """(the decode replicas' requests in landing order, order): a disaggregated request arrives when its KV
    lands, with it (`landed`); the others at their arrival, to be prefilled there. Ties: request order."""
    t, order = landing(table.arrival_s, disagg, delivered_s)
    take = lambda x: x[order]
    return dataclasses.replace(table, arrival_s=take(t).astype(jnp.float32), seg_ids=take(table.seg_ids),
                               seg_tok=take(table.seg_tok), out_tok=take(table.out_tok), out_seg=take(table.out_seg),
                               prompt_tok=take(table.prompt_tok), session=take(table.session),
                               landed=take(disagg), key_id=None if table.key_id is None else take(table.key_id)), order


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeReplicasParams:
    tier: replicas.ReplicaParams  # the decode router, n_active (= D), KV capacity, cost
    seed: jax.Array  # [] int32 the row's seed index (folded into the router's coin flips)
    table: RequestTable  # this row's requests in landing order (`landed_table`)
    order: jax.Array  # [N] int32 request (arrival index) at each decode position


@dataclasses.dataclass(frozen=True)
class DecodeReplicasStage(sim.Model):
    """The decode tier as independent replicas: one row's landed requests (in its params) on the replica engine."""

    cpu_rows_together: ClassVar[int | None] = sim.CPU_ROWS_TOGETHER  # branches and loops: rows in groups

    tier: replicas.ReplicaModel
    bound: int  # events one run can need (the workload's step bound)

    def check_params(self, params: DecodeReplicasParams, workload=None) -> None:
        self.tier.check_params(params.tier, None)
        if self.tier.admission != "reserve":
            raise JaxrouteError("a decode tier of replicas needs admission 'reserve' (landed KV is held from admission)")

    def num_steps(self, workload) -> int:
        return self.bound

    def init(self, key, workload, params: DecodeReplicasParams) -> replicas.ReplicaState:
        return self.tier.init(jax.random.fold_in(key, params.seed), _Realized(params.table), params.tier)

    def is_done(self, state) -> jax.Array:
        return self.tier.is_done(state)

    def step(self, state, workload, params: DecodeReplicasParams):
        return self.tier.step(state, None, params.tier)

    def metrics(self, state, workload, params: DecodeReplicasParams) -> dict[str, jax.Array]:
        m = self.tier.metrics(state, None, params.tier)
        back = lambda x: arrival_index(x, params.order)
        done = jnp.isfinite(state.rec_finish)
        return {"imbalance_tokens": jnp.float32(0.0),  # a barrier tier's KV imbalance; none without a barrier
                "overflow": m["overflow"], "conservation_error": m["conservation_error"], "completed": jnp.sum(done),
                "decode_worker": back(state.rec_replica), "decode_admit_s": back(state.rec_admit),
                "first_token_s": back(state.rec_first), "finish_s": back(jnp.where(done, state.rec_finish, -1.0)),
                "decode_cached": back(state.rec_cached), "decode_busy_s": state.busy_s}
