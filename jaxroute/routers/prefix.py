"""Prefix-cache-aware routers for the replica cluster, selected with `lax.switch`.

Every router reads the same `RouterView` (what a cluster router can know) and returns a
replica index. Ties always go to the lowest index, so runs are reproducible.

| policy | rule |
|---|---|
| rr | round robin |
| least_load | fewest requests in flight |
| least_tokens | fewest tokens (prompt + output) in flight |
| affinity | longest view match; ties -> least load |
| threshold | longest match if its ratio >= theta, else least load (Preble E2's split at theta = 0.5) |
| cache_guard | least load when max - min in-flight > guard_abs and max > guard_rel * min, else threshold |
| sglang_cache_aware | SGLang router (sgl-router `policies/cache_aware.rs`): imbalanced (max - min > balance_abs and max > balance_rel * min) -> shortest queue; else match on its own approximate tree (insert on dispatch, never told of evictions): ratio > cache_threshold -> the matching worker, else the worker with the smallest tree |
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

PREFIX_POLICIES = ("rr", "least_load", "least_tokens", "affinity", "threshold", "cache_guard", "sglang_cache_aware")
LOAD_ONLY = ("rr", "least_load", "least_tokens")


def policy_id(name: str) -> int:
    return PREFIX_POLICIES.index(name)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RouterParams:
    """Traced router settings (vmappable for sweeps)."""

    theta: jax.Array  # [] float32 match ratio needed by threshold / cache_guard
    guard_abs: jax.Array  # [] float32 cache_guard: in-flight spread that counts as imbalanced
    guard_rel: jax.Array  # [] float32 cache_guard: max / min ratio that counts as imbalanced
    sgl_cache_threshold: jax.Array  # [] float32 SGLang --cache-threshold
    sgl_balance_abs: jax.Array  # [] float32 SGLang --balance-abs-threshold
    sgl_balance_rel: jax.Array  # [] float32 SGLang --balance-rel-threshold


def router_params(theta=0.5, guard_abs=8.0, guard_rel=1.5, sgl_cache_threshold=0.3, sgl_balance_abs=64.0,
                  sgl_balance_rel=1.5) -> RouterParams:
    f = lambda x: jnp.asarray(x, jnp.float32)
    return RouterParams(f(theta), f(guard_abs), f(guard_rel), f(sgl_cache_threshold), f(sgl_balance_abs),
                        f(sgl_balance_rel))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RouterView:
    """What the router sees for one arriving request."""

    inflight: jax.Array  # [G] float32 requests dispatched and not finished
    tokens: jax.Array  # [G] float32 prompt + output tokens of those requests
    match_tokens: jax.Array  # [G] float32 leading prompt tokens the router's record places on each replica
    tree_match_tokens: jax.Array  # [G] float32 same on SGLang's approximate tree
    tree_size: jax.Array  # [G] float32 tokens in SGLang's approximate tree per replica
    prompt_tokens: jax.Array  # [] float32
    rr_counter: jax.Array  # [] int32 requests routed so far


def _least_load(v: RouterView, p: RouterParams) -> jax.Array:
    return jnp.argmin(v.inflight)


def _imbalanced(load: jax.Array, abs_thr: jax.Array, rel_thr: jax.Array) -> jax.Array:
    hi, lo = jnp.max(load), jnp.min(load)
    return (hi - lo > abs_thr) & (hi > rel_thr * lo)


def _best_match(match: jax.Array, load: jax.Array) -> jax.Array:
    """Replica with the longest match; ties -> least load, then lowest index."""
    best = match == jnp.max(match)
    return jnp.argmin(jnp.where(best, load, jnp.inf))


def _rr(v, p):
    return v.rr_counter % v.inflight.shape[0]


def _least_tokens(v, p):
    return jnp.argmin(v.tokens)


def _affinity(v, p):
    return _best_match(v.match_tokens, v.inflight)


def _threshold(v, p):
    b = _best_match(v.match_tokens, v.inflight)
    return jnp.where(v.match_tokens[b] >= p.theta * v.prompt_tokens, b, _least_load(v, p))


def _cache_guard(v, p):
    return jnp.where(_imbalanced(v.inflight, p.guard_abs, p.guard_rel), _least_load(v, p), _threshold(v, p))


def _sglang(v, p):
    b = _best_match(v.tree_match_tokens, v.inflight)
    ratio = v.tree_match_tokens[b] / jnp.maximum(v.prompt_tokens, 1.0)
    cached = jnp.where(ratio > p.sgl_cache_threshold, b, jnp.argmin(v.tree_size))
    return jnp.where(_imbalanced(v.inflight, p.sgl_balance_abs, p.sgl_balance_rel), _least_load(v, p), cached)


_BRANCHES = (_rr, _least_load, _least_tokens, _affinity, _threshold, _cache_guard, _sglang)
assert len(_BRANCHES) == len(PREFIX_POLICIES)


def route(policy: jax.Array, view: RouterView, params: RouterParams) -> jax.Array:
    """Replica index (int32) chosen by policy `policy` (an index into PREFIX_POLICIES)."""
    branches = [lambda v, p, f=f: jnp.asarray(f(v, p), jnp.int32) for f in _BRANCHES]
    return jax.lax.switch(policy, branches, view, params)
