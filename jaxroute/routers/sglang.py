"""SGLang's cache-aware router (sgl-project/sglang `sgl-router/src/policies/cache_aware.rs`).

Rule: imbalanced (max - min in-flight > balance_abs and max > balance_rel x min) -> shortest queue;
else match the prompt on its own approximate tree: match ratio > cache_threshold -> the worker with
the longest match (ties -> fewest requests, then lowest index), else the worker with the smallest tree
(ties -> lowest index). The tree is the router's own: it inserts a request's segments on dispatch and
is never told of evictions (the real router prunes it by size on a timer; not modeled).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxroute.clusters.prefix_cache import leading_match
from jaxroute.routers import parts
from jaxroute.routers.view import Request, RouterStatic, RouterView


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Params:
    sgl_cache_threshold: jax.Array  # [] float32 --cache-threshold
    sgl_balance_abs: jax.Array  # [] float32 --balance-abs-threshold
    sgl_balance_rel: jax.Array  # [] float32 --balance-rel-threshold


def make_params(sgl_cache_threshold=0.3, sgl_balance_abs=64.0, sgl_balance_rel=1.5) -> Params:
    f = lambda x: jnp.asarray(x, jnp.float32)
    return Params(f(sgl_cache_threshold), f(sgl_balance_abs), f(sgl_balance_rel))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    tree: jax.Array  # [G, M+1] bool segment inserted in the approximate tree of each worker
    size: jax.Array  # [G] float32 tokens in each worker's tree


def init(static: RouterStatic) -> State:
    G, m1 = static.n_replicas, static.n_segments
    return State(jnp.zeros((G, m1), bool), jnp.zeros((G,), jnp.float32))


def choose(state: State, view: RouterView, req: Request, p: Params, key) -> jax.Array:
    _, tmatch = leading_match(state.tree[:, req.segs], jnp.arange(req.segs.shape[0]), req.tok)
    tmatch = tmatch.astype(jnp.float32)
    b = parts.argmax(tmatch, tie=parts.fewest_requests(view, req))
    ratio = tmatch[b] / jnp.maximum(req.prompt.astype(jnp.float32), 1.0)
    cached = jnp.where(ratio > p.sgl_cache_threshold, b, parts.argmax(-state.size))
    guard = parts.imbalanced(view.inflight, p.sgl_balance_abs, p.sgl_balance_rel)
    return jnp.where(guard, parts.argmax(parts.fewest_requests(view, req)), cached)


def on_dispatch(state: State, view: RouterView, req: Request, g: jax.Array, active: jax.Array, p: Params) -> State:
    """Insert the request's segments (and its kept output) into worker g's tree."""
    segs = req.all_segs
    real = segs < state.tree.shape[1] - 1
    new = ~state.tree[g, segs] & real & active
    added = jnp.sum(new * view.table.seg_len[segs]).astype(jnp.float32)
    return State(state.tree.at[g, segs].set(state.tree[g, segs] | (real & active)), state.size.at[g].add(added))
