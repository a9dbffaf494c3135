"""LoRA adapters on the replicas: adapter slots per replica, loads, the batch's cost, the routers' signals.

Rules (sources, file and line: docs/adapters.md):
- A request carries an adapter id (-1 = the base model): a trace's `adapter_id` column, or drawn per seed with
  Zipf popularity over `n_adapters` adapters (P(k) proportional to (k + 1)^-s, k = 0 the most popular) and a
  `base_share` of base-model requests.
- A replica holds at most L = `ReplicaModel.lora_slots` adapters (vLLM's `max_loras`) in GPU slots, an LRU over
  their last use. A waiting request is admissible when its adapter already runs on the replica or fewer than L
  distinct adapters run there; otherwise admission passes over it to the next waiting request (vLLM's scheduler
  skips it; it keeps its place). Admitting a request whose adapter is not in a slot loads it into the least
  recently used slot whose adapter has no running request (an empty one first): the load blocks the iteration,
  which takes `load_s` longer per load (vLLM activates adapters synchronously in the step).
- The batch's step time is multiplied by 1 + `step_overhead` x (distinct adapters among the running requests)
  (BLIS's fitted LoRA overhead per distinct adapter), leaped iterations included.
- A slot's stamp is its adapter's last admission or finish.

Shapes: G replicas, L adapter slots per replica, K adapter ids (static), B running slots, Q queue slots.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxroute import cost_models
from jaxroute import metrics as mlib
from jaxroute.clusters.names import LORA_DEFAULTS
from jaxroute.errors import JaxrouteError

_ADAPTER_TAG = 0xADA7  # fold_in tag: adapter draws never reuse the workload's or the router's


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LoraParams:
    """Traced adapter settings of one row (`make`)."""

    n_adapters: jax.Array  # [] int32 adapters the synthetic draw spreads requests over (<= the model's K)
    zipf_s: jax.Array  # [] float32 popularity exponent (0 = uniform)
    base_share: jax.Array  # [] float32 share of requests on the base model
    load_s: jax.Array  # [] float32 time to load one adapter into a slot
    step_overhead: jax.Array  # [] float32 step time x (1 + this x distinct adapters in the batch)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LoraState:
    slot: jax.Array  # [G, L] int32 adapter in each slot (-1 = empty)
    last: jax.Array  # [G, L] float32 LRU stamp (-inf = empty)
    running: jax.Array  # [G, K] int32 running requests of each adapter on each replica
    inflight: jax.Array  # [G, K] int32 requests of each adapter dispatched to each replica and not finished
    loads: jax.Array  # [] int32 adapter loads
    hits: jax.Array  # [] int32 admissions whose adapter was already in a slot
    asks: jax.Array  # [] int32 admissions of requests with an adapter


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Row:
    """One replica's adapter slots and running counts (a row of `LoraState`)."""

    slot: jax.Array  # [L] int32
    last: jax.Array  # [L] float32
    running: jax.Array  # [K] int32


def adapter_bytes(model: str, tp: int, rank: int) -> float:
    """Bytes one TP rank holds of a rank-`rank` bf16 adapter on the attention projections (q, k, v, o):
    rank x (d_in + d_out) per projection, per layer."""
    m = cost_models.get_model(model)
    q, kv, v = m.n_heads * m.head_dim_qk, m.n_kv_heads * m.head_dim_qk, m.n_kv_heads * m.head_dim_v
    per_layer = (m.hidden + q) + (m.hidden + kv) + (m.hidden + v) + (m.n_heads * m.head_dim_v + m.hidden)
    return rank * per_layer * m.n_layers * 2 / tp


def make(gpu: str, model: str, tp: int = 1, **settings) -> LoraParams:
    """Adapter settings of one row by `LORA_DEFAULTS`' names: n_adapters, zipf_s, base_share, rank, load_ms
    (None: base latency + the adapter's bytes per TP rank over the GPU's host link), step_overhead."""
    if unknown := sorted(set(settings) - set(LORA_DEFAULTS)):
        raise JaxrouteError(f"unknown adapter setting '{unknown[0]}'; choose from: {', '.join(LORA_DEFAULTS)}")
    d = dict(LORA_DEFAULTS, **settings)
    if not (float(d["n_adapters"]).is_integer() and d["n_adapters"] >= 1):
        raise JaxrouteError(f"n_adapters must be a whole number >= 1, got {d['n_adapters']}")
    if not (float(d["rank"]).is_integer() and d["rank"] >= 1):
        raise JaxrouteError(f"the adapter rank must be a whole number >= 1, got {d['rank']}")
    for k in ("zipf_s", "step_overhead", "base_latency_ms"):
        if not 0 <= float(d[k]) < float("inf"):
            raise JaxrouteError(f"adapter setting {k} must be a finite number >= 0, got {d[k]}")
    if not 0 <= float(d["base_share"]) < 1:
        raise JaxrouteError(f"base_share must be in [0, 1), got {d['base_share']}")
    load_ms = d["load_ms"]
    if load_ms is None:
        bw = cost_models.get_gpu(gpu).host_bw
        load_ms = float(d["base_latency_ms"]) + adapter_bytes(model, tp, int(d["rank"])) / bw * 1e3
    if not 0 <= float(load_ms) < float("inf"):
        raise JaxrouteError(f"load_ms must be a finite number >= 0, got {load_ms}")
    f32 = jnp.float32
    return LoraParams(jnp.int32(int(d["n_adapters"])), f32(d["zipf_s"]), f32(d["base_share"]), f32(float(load_ms) / 1e3),
                      f32(d["step_overhead"]))


def draw(key: jax.Array, p: LoraParams, adapter: jax.Array | None, n: int, n_ids: int) -> jax.Array:
    """[N] int32 each request's adapter: the trace's, or Zipf over the first p.n_adapters of n_ids ids, -1 (base)
    with probability base_share."""
    if adapter is not None:
        return adapter.astype(jnp.int32)
    k = jnp.arange(n_ids)
    logits = jnp.where(k < p.n_adapters, -p.zipf_s * jnp.log1p(k.astype(jnp.float32)), -jnp.inf)
    key = jax.random.fold_in(key, _ADAPTER_TAG)
    pick = jax.random.categorical(key, logits, shape=(n,))
    base = jax.random.uniform(jax.random.fold_in(key, 1), (n,)) < p.base_share
    return jnp.where(base, -1, pick).astype(jnp.int32)


def init(n_replicas: int, slots: int, n_ids: int) -> LoraState:
    z = lambda shape: jnp.zeros(shape, jnp.int32)
    return LoraState(jnp.full((n_replicas, slots), -1, jnp.int32), jnp.full((n_replicas, slots), -jnp.inf, jnp.float32),
                     z((n_replicas, n_ids)), z((n_replicas, n_ids)), z(()), z(()), z(()))


def row(s: LoraState, g: jax.Array) -> Row:
    return Row(s.slot[g], s.last[g], s.running[g])


def admissible(r: Row, adapter: jax.Array) -> jax.Array:
    """[...] bool: a request of `adapter` may be admitted (base model, its adapter running, or a slot to spare)."""
    n_running = jnp.sum(r.running > 0)
    a = jnp.maximum(adapter, 0)
    return (adapter < 0) | (r.running[a] > 0) | (n_running < r.slot.shape[0])


def acquire(r: Row, adapter: jax.Array, t: jax.Array, go: jax.Array) -> tuple[Row, jax.Array, jax.Array]:
    """(row, loaded, hit): admit a request of `adapter` at t where `go` (its adapter admissible): a hit stamps
    its slot, a miss loads it into the LRU slot without running requests; the adapter's running count + 1."""
    use = go & (adapter >= 0)
    a = jnp.maximum(adapter, 0)
    at = r.slot == adapter
    hit = use & jnp.any(at)
    free = jnp.where(r.slot >= 0, r.running[jnp.maximum(r.slot, 0)] == 0, True)
    victim = jnp.argmin(jnp.where(free, r.last, jnp.inf))
    k = jnp.where(jnp.any(at), jnp.argmax(at), victim)
    L = r.slot.shape[0]
    k = jnp.where(use, k, L)  # out of range: dropped
    return (Row(r.slot.at[k].set(adapter, mode="drop"), r.last.at[k].set(t, mode="drop"),
                r.running.at[jnp.where(use, a, r.running.shape[0])].add(1, mode="drop")),
            use & ~hit, hit)


def release(r: Row, adapters: jax.Array, mask: jax.Array, t: jax.Array) -> Row:
    """The masked requests ([B] adapters) leave the running set at t: counts - 1, their slots stamped t."""
    use = mask & (adapters >= 0)
    K = r.running.shape[0]
    running = r.running.at[jnp.where(use, adapters, K)].add(-1, mode="drop")
    held = jnp.any((r.slot[:, None] == adapters[None, :]) & use[None, :], axis=1)
    return Row(r.slot, jnp.where(held, jnp.maximum(r.last, t), r.last), running)


def distinct(r: Row) -> jax.Array:
    """[] int32 distinct adapters among the running requests."""
    return jnp.sum(r.running > 0).astype(jnp.int32)


def view_signals(s: LoraState, adapter: jax.Array, slots: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """([G] the adapter runs there, [G] it only waits there, [G] running + waiting adapters < slots): the
    scraped `vllm:lora_requests_info` labels llm-d's lora-affinity scorer reads."""
    a = jnp.maximum(adapter, 0)
    waiting = s.inflight - s.running
    n = jnp.sum(s.running > 0, axis=1) + jnp.sum(waiting > 0, axis=1)
    return s.running[:, a] > 0, (s.running[:, a] == 0) & (waiting[:, a] > 0), n < slots


def metrics(s: LoraState, adapter: jax.Array, done: jax.Array, ttft: jax.Array, n_ids: int) -> dict[str, jax.Array]:
    """Adapter loads, the share of adapter admissions that found it in a slot, and TTFT by popularity: the
    requests of the hot adapters (the most requested ones that together carry half of the adapter requests,
    at least one) against the others'."""
    has = adapter >= 0
    counts = jnp.zeros(n_ids, jnp.int32).at[jnp.where(has, adapter, n_ids)].add(1, mode="drop")
    order = jnp.argsort(-counts, stable=True)
    covered = jnp.cumsum(counts[order]) - counts[order]  # requests of the more popular adapters
    hot_ids = jnp.zeros(n_ids, bool).at[order].set(covered < jnp.maximum(jnp.sum(counts), 1) / 2)
    hot = has & hot_ids[jnp.maximum(adapter, 0)]
    cold = has & ~hot
    return {"adapter_loads": s.loads, "adapter_hit_rate": s.hits / jnp.maximum(s.asks, 1),
            "ttft_mean_hot_s": mlib.masked_mean(ttft, done & hot), "ttft_mean_cold_s": mlib.masked_mean(ttft, done & cold),
            "ttft_p90_hot_s": mlib.masked_quantile(ttft, done & hot, 0.9),
            "ttft_p90_cold_s": mlib.masked_quantile(ttft, done & cold, 0.9)}
