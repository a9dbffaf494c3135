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
| preble_e2 | Preble E2 (lecture 3.2-3.4): cached = longest match, missed = prompt - cached; cached > missed -> exploit (lowest load cost L+M+P among the replicas holding the longest match), else explore (lowest L+M+P overall); then post-hoc rebalancing: if the chosen replica's window load L > e2_th_bal * the lightest replica's L, the lightest. The cost terms are computed by the cluster (`clusters/replicas.py`, `_preble_costs`). Autoscaling and the prefill/decode pairing rule are not modeled. |
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

PREFIX_POLICIES = ("rr", "least_load", "least_tokens", "affinity", "threshold", "cache_guard", "sglang_cache_aware",
                   "preble_e2")
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
    e2_window_s: jax.Array  # [] float32 Preble E2 load window H (seconds)
    e2_th_bal: jax.Array  # [] float32 Preble E2 rebalancing threshold Th_bal (inf = no rebalancing)


def router_params(theta=0.5, guard_abs=8.0, guard_rel=1.5, sgl_cache_threshold=0.3, sgl_balance_abs=64.0,
                  sgl_balance_rel=1.5, e2_window_s=180.0, e2_th_bal=1.5) -> RouterParams:
    f = lambda x: jnp.asarray(x, jnp.float32)
    return RouterParams(f(theta), f(guard_abs), f(guard_rel), f(sgl_cache_threshold), f(sgl_balance_abs),
                        f(sgl_balance_rel), f(e2_window_s), f(e2_th_bal))


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
    e2_load: jax.Array  # [G] float32 Preble L: GPU seconds dispatched to each replica in the window
    e2_extra: jax.Array  # [G] float32 Preble M + P: eviction cost + prefill time of this request's missed part


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


def _preble_e2(v, p):
    cached = jnp.max(v.match_tokens)
    cost = v.e2_load + v.e2_extra
    holders = v.match_tokens == cached
    exploit = cached > v.prompt_tokens - cached
    g = jnp.where(exploit, jnp.argmin(jnp.where(holders, cost, jnp.inf)), jnp.argmin(cost))
    lightest = jnp.argmin(v.e2_load)
    return jnp.where(v.e2_load[g] > p.e2_th_bal * v.e2_load[lightest], lightest, g)


_BRANCHES = (_rr, _least_load, _least_tokens, _affinity, _threshold, _cache_guard, _sglang, _preble_e2)
assert len(_BRANCHES) == len(PREFIX_POLICIES)


def route(policy: jax.Array, view: RouterView, params: RouterParams) -> jax.Array:
    """Replica index (int32) chosen by policy `policy` (an index into PREFIX_POLICIES)."""
    branches = [lambda v, p, f=f: jnp.asarray(f(v, p), jnp.int32) for f in _BRANCHES]
    return jax.lax.switch(policy, branches, view, params)
