"""SGLang's router / model gateway (sgl-project/sglang `sgl-router/src/policies/cache_aware.rs`, later
`sgl-model-gateway/src/policies/cache_aware.rs`, `power_of_two.rs`, `random.rs`).

Cache-aware rule: imbalanced (max - min in-flight > balance_abs and max > balance_rel x min) -> shortest
queue (`select_worker_min_load`: `min_by_key(load)`, ties -> lowest index); else match the prompt on its
own approximate tree: match ratio > cache_threshold -> the worker with the longest match (ties -> fewest
requests, then lowest index), else the miss rule: `sgl_miss_rule` 0 = the worker with the smallest tree
(sgl-router `tree.get_smallest_tenant()`, ties -> lowest index), 1 = the least-loaded worker (newer
sgl-model-gateway cache_aware.rs: on a miss `min_by_key(|idx| workers[idx].load())`). The tree is the
router's own: it inserts a request's segments (and its kept output) on dispatch and is never told of
evictions.

Size pruning (`sgl_evict_interval_s` > 0): every `eviction_interval_secs` a background thread runs
`tree.evict_tenant_by_size(max_tree_size)`: for each worker whose tree holds more than max_tree_size,
its least recently used leaves are removed until it fits (the sgl-router per-tenant rule, `tenant
char count > max_size`). Modeled exactly at segment granularity: ticks at k x interval from t = 0;
pruning is idempotent between dispatches, so it runs lazily before the first decision after a tick
(`on_refresh`). Last access = the router's last insert of the segment for that worker (a dispatch
touches its whole path, so a parent is never older than its child and LRU-then-deeper order picks a
leaf); the source also refreshes the matched tenant's path on a `prefix_match` (not modeled). Sizes are
in tokens where the source counts characters (no characters-per-token factor is modeled).

Defaults. Two sets exist in the code and differ:
- the CLI / Python `RouterArgs` (`sgl-router/py_src/sglang_router/router_args.py`): cache_threshold 0.3,
  balance_abs 64, balance_rel 1.5, eviction_interval 120 s (60 s in later versions), max_tree_size
  2**26: preset `sglang_cache_aware` (pruning off: 2**26 is never reached in practice; bit-identical to
  the earlier module) and `sglang_gateway` (the same + the gateway's least-load miss rule);
- the Rust `impl Default for CacheAwareConfig` (`sgl-model-gateway/src/policies/mod.rs`, also
  `sgl-router/src/policies/mod.rs`): cache_threshold 0.5, balance_abs 32, balance_rel 1.1,
  eviction_interval_secs 30, max_tree_size 10000: preset `sglang_cache_aware_rs` (pruning on).
The docs describe max_tree_size as "maximum nodes per tree"; the code compares it with the tenant's
character count (tree.rs `evict_tenant_by_size`); newer gateway versions compare a tree-wide total.

power_of_two (`power_of_two.rs`): two distinct workers drawn uniformly (idx1 uniform, idx2 = idx1 + 1 +
uniform[0, G-1) mod G); the one with the lower load, `load1 <= load2` -> the first. The load is the
token load the LoadMonitor scraped (`cached_loads`, via `update_loads`) when both workers have one, else
the router's request count: modeled as the scraped KV tokens in use (`view.kv_usage`, all replicas share
one capacity, so fractions order as tokens do).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxroute.clusters.prefix_cache import evict_cache, leading_match
from jaxroute.errors import JaxrouteError
from jaxroute.routers import parts
from jaxroute.routers.spec import RouterModule
from jaxroute.routers.view import Request, RouterStatic, RouterView

MISS_RULES = ("smallest_tree", "least_load")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Params:
    sgl_cache_threshold: jax.Array  # [] float32 --cache-threshold
    sgl_balance_abs: jax.Array  # [] float32 --balance-abs-threshold
    sgl_balance_rel: jax.Array  # [] float32 --balance-rel-threshold
    sgl_miss_rule: jax.Array  # [] int32 index into MISS_RULES
    sgl_evict_interval_s: jax.Array  # [] float32 --eviction-interval-secs (0 = no pruning)
    sgl_max_tree_tokens: jax.Array  # [] float32 --max-tree-size (tokens per worker tree)


def make_params(sgl_cache_threshold=0.3, sgl_balance_abs=64.0, sgl_balance_rel=1.5, sgl_miss_rule="smallest_tree",
                sgl_evict_interval_s=0.0, sgl_max_tree_tokens=float(2**26)) -> Params:
    if isinstance(sgl_miss_rule, str):
        if sgl_miss_rule not in MISS_RULES:
            raise JaxrouteError(f"unknown sgl_miss_rule '{sgl_miss_rule}'; choose from: {', '.join(MISS_RULES)}")
        sgl_miss_rule = MISS_RULES.index(sgl_miss_rule)
    if not sgl_evict_interval_s >= 0:
        raise JaxrouteError(f"sgl_evict_interval_s must be >= 0 (0 = no pruning), got {sgl_evict_interval_s}")
    f = lambda x: jnp.asarray(x, jnp.float32)
    return Params(f(sgl_cache_threshold), f(sgl_balance_abs), f(sgl_balance_rel), jnp.asarray(sgl_miss_rule, jnp.int32),
                  f(sgl_evict_interval_s), f(sgl_max_tree_tokens))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    tree: jax.Array  # [G, M+1] bool segment inserted in the approximate tree of each worker
    size: jax.Array  # [G] float32 tokens in each worker's tree
    last: jax.Array  # [G, M+1] float32 the router's last insert of the segment for the worker (LRU pruning)
    tick: jax.Array  # [] float32 index of the last pruning tick applied (ticks at k x interval)


def init(static: RouterStatic) -> State:
    G, m1 = static.n_replicas, static.n_segments
    return State(jnp.zeros((G, m1), bool), jnp.zeros((G,), jnp.float32), jnp.zeros((G, m1), jnp.float32),
                 jnp.float32(0))


def on_refresh(state: State, view: RouterView, active: jax.Array, p: Params) -> State:
    """Apply the size pruning of the ticks passed since the last one (no-op with interval 0)."""
    interval = p.sgl_evict_interval_s
    n = jnp.floor(view.now / jnp.where(interval > 0, interval, 1.0))
    due = active & (interval > 0) & (n > state.tick)
    m1 = state.tree.shape[1]
    real = jnp.arange(m1) < m1 - 1
    seg_len, depth = view.table.seg_len, view.table.seg_depth
    deficit = jnp.where(due, state.size - p.sgl_max_tree_tokens, 0.0)  # evict while freed < deficit

    def one(tree_g, last_g, d, size_g):  # in place: no pass over the tree unless a tick is due
        return evict_cache(tree_g, lambda x: x & real, last_g, depth, seg_len, d, size_g)

    tree, freed = jax.vmap(one)(state.tree, state.last, deficit, state.size)
    return State(tree, state.size - freed.astype(jnp.float32), state.last, jnp.where(due, n, state.tick))


def choose(state: State, view: RouterView, req: Request, p, key) -> jax.Array:
    _, tmatch = leading_match(state.tree[:, req.segs], jnp.arange(req.segs.shape[0]), req.tok)
    tmatch = tmatch.astype(jnp.float32)
    b = parts.argmax(tmatch, tie=parts.fewest_requests(view, req))
    ratio = tmatch[b] / jnp.maximum(req.prompt.astype(jnp.float32), 1.0)
    least = parts.argmax(parts.fewest_requests(view, req))
    miss = jnp.where(p.sgl_miss_rule == 1, least, parts.argmax(-state.size))
    cached = jnp.where(ratio > p.sgl_cache_threshold, b, miss)
    guard = parts.imbalanced(view.inflight, p.sgl_balance_abs, p.sgl_balance_rel)
    return jnp.where(guard, least, cached)


def on_dispatch(state: State, view: RouterView, req: Request, g: jax.Array, active: jax.Array, p: Params) -> State:
    """Insert the request's segments (and its kept output) into worker g's tree; touch them (LRU)."""
    segs = req.all_segs
    real = segs < state.tree.shape[1] - 1
    new = ~state.tree[g, segs] & real & active
    added = jnp.sum(new * view.table.seg_len[segs]).astype(jnp.float32)
    touch = real & active
    return State(state.tree.at[g, segs].set(state.tree[g, segs] | touch), state.size.at[g].add(added),
                 state.last.at[g, segs].set(jnp.where(touch, view.now, state.last[g, segs])), state.tick)


def power_of_two(view: RouterView, req: Request, p, key) -> jax.Array:
    """Two distinct uniformly drawn workers; the lower scraped token load, ties -> the first draw."""
    G = view.inflight.shape[0]
    if G == 1:
        return jnp.int32(0)
    k1, k2 = jax.random.split(key)
    i1 = jax.random.randint(k1, (), 0, G)
    i2 = (i1 + 1 + jax.random.randint(k2, (), 0, G - 1)) % G
    load = view.kv_usage
    return jnp.where(load[i1] <= load[i2], i1, i2).astype(jnp.int32)


# The contract the cluster calls (hooks as typed fields: routers/spec.py)
MODULE = RouterModule(init=init,
                      make_params=make_params,
                      on_refresh=on_refresh,
                      on_dispatch=on_dispatch)
