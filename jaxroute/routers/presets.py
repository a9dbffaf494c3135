"""Stateless replica-cluster routers: each one is a choice of parts (`parts.py`) and traced weights.

Signature: `preset(view, request, params, key) -> replica` (int32). Register a new one in
`prefix.REGISTRY`. Tie rules are stated per preset; `argmax` ties go to the lowest index.

Partial clusters (`view.active`, the first n_active replicas): every preset here except `cache_guard`
honours the mask (`prefix.PARTIAL_OK`) and decides exactly as a cluster of n_active replicas would
(same ties, normalisations and random draws: see `parts.py`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxroute.routers import parts


def rr(view, req, p, key) -> jax.Array:
    """Round robin over routed requests (the lecture's load-only baseline)."""
    return parts.argmax(parts.turn(view, req))


def least_load(view, req, p, key) -> jax.Array:
    """Fewest requests in flight (SGLang's shortest-queue fallback, `cache_aware.rs`; llm-d queue-scorer)."""
    return parts.argmax(parts.keep(parts.fewest_requests(view, req), view.active))


def least_tokens(view, req, p, key) -> jax.Array:
    """Fewest prompt + output tokens in flight."""
    return parts.argmax(parts.keep(parts.fewest_tokens(view, req), view.active))


def affinity(view, req, p, key) -> jax.Array:
    """Longest match on the router's record; ties -> fewest requests, then lowest index."""
    return parts.argmax(parts.keep(parts.prefix_tokens(view, req), view.active), tie=parts.fewest_requests(view, req))


def threshold(view, req, p, key) -> jax.Array:
    """Longest match if it reaches theta x the prompt, else least load (Preble E2's exploit/explore split
    at theta = 0.5, lecture 3.2): the match scorer gated at theta; ties (all gated to 0) -> least load."""
    return parts.argmax(parts.keep(parts.prefix_above(view, req, p.theta), view.active),
                        tie=parts.fewest_requests(view, req))


def cache_guard(view, req, p, key) -> jax.Array:
    """threshold, but least load when in-flight counts are imbalanced (max - min > guard_abs and max >
    guard_rel x min): a balance guard that zeroes the match scorer (SGLang's guard on `threshold`)."""
    guard = parts.imbalanced(view.inflight, p.guard_abs, p.guard_rel)
    score = parts.prefix_above(view, req, p.theta) * ~guard
    return parts.argmax(score, tie=parts.fewest_requests(view, req))


def weighted(view, req, p, key) -> jax.Array:
    """llm-d-style scheduling profile (`llm-d/llm-d-inference-scheduler`: filters -> weighted scorers ->
    picker): score = sum_k weights[k] x scorer_k, the scorers of `parts.SCORERS`, each in [0, 1], the
    prefix scorer on the router's record (insert on dispatch); the picker is `p.picker` (argmax, random
    among ties, softmax at `p.temperature`). Weights are traced (default prefix 3, inflight 2, tokens 2)."""
    scores = parts.score_matrix(view, req, view.match_tokens, p.load_threshold)
    return parts.pick(p.picker, parts.keep(parts.weighted_sum(p.weights, scores), view.active), key, p.temperature)


def random(view, req, p, key) -> jax.Array:
    """Uniformly random replica (SGLang `policies/random.rs`: `random_range(0..healthy.len())`; the
    same stateless rule as any uniform dispatcher): one `jax.random.randint` draw on the decision's key,
    over the active replicas (a traced maxval draws what a static one does)."""
    return jax.random.randint(key, (), 0, parts.n_active(view)).astype(jnp.int32)
