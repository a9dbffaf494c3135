"""KV offload tiers under the replicas' GPU caches: a CPU tier per replica and one tier shared by all (LMCache-style).

Rules (their sources, file and line: docs/tiers.md):
- Down: a segment evicted from a replica's GPU cache is written, with its LRU stamp, to that replica's CPU tier
  and to the shared tier (LMCache stores to every backend it has). The segments one iteration evicts enter
  together; then each tier evicts in LRU order (`prefix_cache.lru_victim`) down to its capacity, and its victims
  are gone. A tier of capacity 0 holds nothing. A tier keeps its copy when the segment is loaded back
  (inclusive), so evicting it again moves nothing (it is touched).
- Up: at admission the leading match runs over the GPU cache and the tiers together. The segments after the
  GPU's own prefix are loaded, from the CPU tier where it holds them, else from the shared tier, and touched
  there at the admission time. Loaded tokens are held privately, as computed ones are, and enter the GPU cache
  at the end of the iteration, as completed segments do. The load blocks: the admitting iteration takes
  `load_time` longer (LMCache's retrieve runs before the forward pass).
- Stores are asynchronous (not charged); `offloaded` counts the tokens written to a tier, `loaded` those read.

Shapes: G replicas, M+1 segment ids, C2 CPU-tier slots per replica, C3 shared-tier slots, A admissions per
iteration, S segments per prompt.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxroute import cost_models
from jaxroute.clusters.names import TIER_DEFAULTS
from jaxroute.clusters.prefix_cache import leading_run
from jaxroute.clusters.replicas.cache import SlotTable, empty_table, insert
from jaxroute.errors import JaxrouteError
from jaxroute.loops import for_each

GIB = 2**30


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TierParams:
    """Traced tier settings of one row (`make`)."""

    cpu_tokens: jax.Array  # [] int32 CPU tier per replica, in KV tokens (0 = none)
    cpu_s_per_token: jax.Array  # [] float32 load time per token from the CPU tier
    shared_tokens: jax.Array  # [] int32 the shared tier, in KV tokens (0 = none)
    shared_s_per_token: jax.Array  # [] float32 load time per token from the shared tier
    shared_latency_s: jax.Array  # [] float32 latency of one load from the shared tier
    bytes_per_token: jax.Array  # [] float32 KV bytes per token of the replica (for the bytes moved)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Tiers:
    """The tiers' state."""

    cpu: SlotTable  # every field with a leading [G] axis: [G, C2] (tokens [G])
    cpu_index: jax.Array  # [G, M+1] int32 slot of each segment in each replica's CPU tier (believed as cache.py's)
    shared: SlotTable  # fields [C3] (tokens [])
    shared_index: jax.Array  # [1, M+1] int32 slot of each segment in the shared tier
    loaded: jax.Array  # [2] float32 tokens loaded from the CPU and the shared tier
    offloaded: jax.Array  # [2] float32 tokens written to the CPU and the shared tier
    full: jax.Array  # [] bool a tier's slot table was full (grow cpu_slots / shared_slots)


def make(gpu: str, model: str, tp: int = 1, **settings) -> TierParams:
    """Tier settings of one row from `TIER_DEFAULTS`' names (cpu_gib per replica, shared_gib for the cluster,
    cpu_gbps and shared_gbps per GPU, shared_latency_ms per load). Each of a replica's tp GPUs holds and
    moves its own share of a token's KV over its own link."""
    unknown = sorted(set(settings) - set(TIER_DEFAULTS))
    if unknown:
        raise JaxrouteError(f"unknown tier setting '{unknown[0]}'; choose from: {', '.join(TIER_DEFAULTS)}")
    d = dict(TIER_DEFAULTS, **settings)
    if d["cpu_gbps"] is None:
        d["cpu_gbps"] = cost_models.get_gpu(gpu).host_bw / 1e9
    for k, v in d.items():
        if not (float(v) >= 0 and float(v) < float("inf")):
            raise JaxrouteError(f"tier setting {k} must be a finite number >= 0, got {v}")
    for k in ("cpu_gbps", "shared_gbps"):
        if float(d[k]) <= 0:
            raise JaxrouteError(f"tier setting {k} must be > 0 GB/s, got {d[k]}")
    per_gpu = float(cost_models.cost_params(gpu, model, tp).kv_bytes_per_token_gpu)  # bytes of a token per GPU
    tokens = lambda gib: int(float(gib) * GIB // (per_gpu * tp))
    f32 = lambda x: jnp.float32(x)
    return TierParams(jnp.int32(tokens(d["cpu_gib"])), f32(per_gpu / (float(d["cpu_gbps"]) * 1e9)),
                      jnp.int32(tokens(d["shared_gib"])), f32(per_gpu / (float(d["shared_gbps"]) * 1e9)),
                      f32(float(d["shared_latency_ms"]) / 1e3), f32(per_gpu * tp))


def init(n_replicas: int, cpu_slots: int, shared_slots: int, n_segments: int) -> Tiers:
    cpu = jax.tree.map(lambda x: jnp.broadcast_to(x, (n_replicas, *x.shape)), empty_table(cpu_slots))
    return Tiers(cpu, jnp.full((n_replicas, n_segments), -1, jnp.int32), empty_table(shared_slots),
                 jnp.full((1, n_segments), -1, jnp.int32), jnp.zeros(2, jnp.float32), jnp.zeros(2, jnp.float32),
                 jnp.bool_(False))


def cpu_row(tiers: Tiers, g: jax.Array) -> SlotTable:
    return jax.tree.map(lambda x: x[g], tiers.cpu)


def loads(tiers: Tiers, g: jax.Array, segs: jax.Array, tok: jax.Array, on_gpu: jax.Array) -> tuple[jax.Array, jax.Array]:
    """([S] bool from the CPU tier, [S] bool from the shared tier): the prompt's segments after its GPU prefix
    that the leading match over every tier covers, each from the nearest tier holding it."""
    in_cpu = cpu_row(tiers, g).present(tiers.cpu_index, g, segs)
    in_shared = tiers.shared.present(tiers.shared_index, jnp.int32(0), segs)
    n_gpu, _ = leading_run(on_gpu, tok)
    n_all, _ = leading_run(on_gpu | in_cpu | in_shared, tok)
    pos = jnp.arange(segs.shape[0])
    loaded = (pos >= n_gpu) & (pos < n_all) & (tok > 0)
    return loaded & in_cpu, loaded & ~in_cpu


def load_time(p: TierParams, cpu_tok: jax.Array, shared_tok: jax.Array) -> jax.Array:
    """Seconds to load `cpu_tok` tokens from the CPU tier and `shared_tok` from the shared tier (float32)."""
    shared = p.shared_latency_s + shared_tok.astype(jnp.float32) * p.shared_s_per_token
    return cpu_tok.astype(jnp.float32) * p.cpu_s_per_token + jnp.where(shared_tok > 0, shared, 0.0)


def _enter(tab: SlotTable, index: jax.Array, g: jax.Array, segs: jax.Array, last: jax.Array, mask: jax.Array,
           capacity: jax.Array, seg_len: jax.Array, depth: jax.Array):
    """The masked segments ([E], with their LRU stamps) enter the table together, then it evicts in LRU order
    down to `capacity` tokens: (table, index, tokens written and kept, table was full)."""
    new = mask & ~tab.present(index, g, segs)
    tab, index, _, full = insert(tab, index, g, None, segs, mask, seg_len)
    tab = tab.touch(index, g, segs, mask, last)
    tab, _ = tab.evict(tab.tokens - capacity, tab.tokens, seg_len, depth)
    kept = new & tab.present(index, g, segs)  # a segment evicted at once was never stored
    written = jnp.sum(jnp.where(kept, seg_len[segs], 0)).astype(jnp.float32)
    return tab, index, written, full


def after_iteration(tiers: Tiers, p: TierParams, g: jax.Array, t: jax.Array, adm: dict, evicted: jax.Array,
                    evicted_last: jax.Array, seg_ids: jax.Array, seg_tok: jax.Array, seg_len: jax.Array,
                    depth: jax.Array, active: jax.Array) -> Tiers:
    """Replica g's iteration at t (`active`; else nothing changes): the admissions' loaded segments are touched
    in their tiers (`adm`: go [A], id [A], n_gpu [A] and n_all [A] leading segments on the GPU and over every
    tier, cpu_tok [A] and shared_tok [A] loaded), then the GPU's victims (`evicted` [C] segments, -1 = none, with
    their stamps) are written to both tiers."""
    cpu = cpu_row(tiers, g)
    pos = jnp.arange(seg_ids.shape[1])
    go = adm["go"] & active

    def touch(k, c):
        cpu, shared = c
        q = adm["id"][k]
        segs = seg_ids[q]
        loaded = (pos >= adm["n_gpu"][k]) & (pos < adm["n_all"][k]) & (seg_tok[q] > 0)
        in_cpu = cpu.present(tiers.cpu_index, g, segs)
        return (cpu.touch(tiers.cpu_index, g, segs, loaded & in_cpu, t),
                shared.touch(tiers.shared_index, jnp.int32(0), segs, loaded & ~in_cpu, t))

    cpu, shared = for_each(go & (adm["n_all"] > adm["n_gpu"]), touch, (cpu, tiers.shared))
    loaded = tiers.loaded + jnp.stack([jnp.sum(jnp.where(go, adm["cpu_tok"], 0)),
                                       jnp.sum(jnp.where(go, adm["shared_tok"], 0))]).astype(jnp.float32)
    down = (evicted >= 0) & active
    segs = jnp.maximum(evicted, 0)
    cpu, cpu_index, to_cpu, full_c = _enter(cpu, tiers.cpu_index, g, segs, evicted_last, down, p.cpu_tokens, seg_len,
                                            depth)
    shared, shared_index, to_shared, full_s = _enter(shared, tiers.shared_index, jnp.int32(0), segs, evicted_last, down,
                                                     p.shared_tokens, seg_len, depth)
    offloaded = tiers.offloaded + jnp.stack([to_cpu, to_shared])
    return Tiers(jax.tree.map(lambda x, v: x.at[g].set(v), tiers.cpu, cpu), cpu_index, shared, shared_index,
                 loaded, offloaded, tiers.full | full_c | full_s)


def clear_cpu(tiers: Tiers, g: jax.Array, when: jax.Array) -> Tiers:
    """Where `when`: replica g's CPU tier emptied (the replica left; the shared tier keeps its segments)."""
    cpu = cpu_row(tiers, g)
    cpu = jax.tree.map(lambda e, x: jnp.where(when, e, x), empty_table(cpu.seg.shape[0]), cpu)
    return dataclasses.replace(tiers, cpu=jax.tree.map(lambda x, v: x.at[g].set(v), tiers.cpu, cpu))


def metrics(tiers: Tiers, p: TierParams, cached: jax.Array, rec_tier: jax.Array, prompt: jax.Array,
            done: jax.Array) -> dict[str, jax.Array]:
    """Hit rates per tier (prompt tokens of completed requests found there at admission), and bytes moved."""
    total = jnp.maximum(jnp.sum(jnp.where(done, prompt, 0)), 1).astype(jnp.float32)
    hits = lambda x: jnp.sum(jnp.where(done, x, 0)).astype(jnp.float32) / total
    gb = lambda tok: tok * p.bytes_per_token / 1e9
    return {"hit_rate_cpu": hits(rec_tier[:, 0]), "hit_rate_shared": hits(rec_tier[:, 1]),
            "hit_rate_all": hits(cached + rec_tier[:, 0] + rec_tier[:, 1]),
            "kv_loaded_gb": gb(jnp.sum(tiers.loaded)), "kv_offloaded_gb": gb(jnp.sum(tiers.offloaded)),
            "kv_loaded_cpu_gb": gb(tiers.loaded[0]), "kv_loaded_shared_gb": gb(tiers.loaded[1])}
