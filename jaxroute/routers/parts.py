"""Parts replica-cluster routers are built from: filters, scorers, weights, pickers.

A scorer returns `[G]` float32 (higher is better); a filter returns a `[G]` bool mask; a picker turns
scores into one replica index. Weights are traced (`RouterParams.weights`), so a sweep over them
is one compilation. Every picker states its tie rule.

Partial clusters (`RouterView.active`, the first n_active of G replicas; None = all): a router that
supports one (`prefix.PARTIAL_OK`) gives inactive replicas -inf with `keep(score, view.active)` before
its picker and takes every normalisation over the active replicas only (`spread(x, view.active)`,
`masked_max` / `masked_min`, `n_active`). With `active` None these helpers compute exactly what they did
before the mask existed. The random pickers then draw what a cluster of n_active replicas draws: with
JAX's partitionable Threefry (`jax_threefry_partitionable`, the default since JAX 0.5) the first k
entries of `uniform(key, (G,))` / `gumbel(key, (G,))` are `uniform(key, (k,))` / `gumbel(key, (k,))`,
so `random_among_ties` and `softmax` (and `jax.random.categorical`) over [G] with -inf on the inactive
replicas pick what they pick over [k] (tests/test_replicas_active.py checks the prefix property).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxroute.routers.names import SCORERS  # noqa: F401  (parts.SCORERS: the weighted presets' scorers, in weight order)
from jaxroute.routers.view import Request, RouterView

# ----------------------------------------------------------------------------- filters


def keep(score: jax.Array, mask: jax.Array | None) -> jax.Array:
    """Filter: replicas outside `mask` can never be picked (None = keep all: `score` unchanged)."""
    return score if mask is None else jnp.where(mask, score, -jnp.inf)


def among(mask: jax.Array, active: jax.Array | None) -> jax.Array:
    """`mask` restricted to the active replicas (None = all)."""
    return mask if active is None else mask & active


def n_active(view: RouterView) -> jax.Array | int:
    """Replicas the router may choose: G (static) or the traced count of `view.active`."""
    return view.inflight.shape[0] if view.active is None else jnp.sum(view.active, dtype=jnp.int32)


def masked_max(x: jax.Array, active: jax.Array | None) -> jax.Array:
    """max of `x` over the active replicas (None = all)."""
    return jnp.max(x) if active is None else jnp.max(jnp.where(active, x, -jnp.inf))


def masked_min(x: jax.Array, active: jax.Array | None) -> jax.Array:
    """min of `x` over the active replicas (None = all)."""
    return jnp.min(x) if active is None else jnp.min(jnp.where(active, x, jnp.inf))


def imbalanced(load: jax.Array, abs_thr: jax.Array, rel_thr: jax.Array) -> jax.Array:
    """Balance guard (SGLang's rule): max - min > abs_thr and max > rel_thr * min."""
    hi, lo = jnp.max(load), jnp.min(load)
    return (hi - lo > abs_thr) & (hi > rel_thr * lo)


# ----------------------------------------------------------------------------- scorers


def turn(view: RouterView, req: Request) -> jax.Array:
    """1 for the replica whose turn it is (round robin over routed requests and the active replicas: the k-th
    active one, k = request id mod their count), else 0."""
    G = view.inflight.shape[0]
    if view.active is None:
        return (jnp.arange(G) == req.id % G).astype(jnp.float32)
    rank = jnp.cumsum(view.active) - 1
    return (view.active & (rank == req.id % n_active(view))).astype(jnp.float32)


def fewest_requests(view: RouterView, req: Request) -> jax.Array:
    return -view.inflight


def fewest_tokens(view: RouterView, req: Request) -> jax.Array:
    return -view.tokens


def prefix_tokens(view: RouterView, req: Request) -> jax.Array:
    """Leading prompt tokens the router's record places on each replica."""
    return view.match_tokens


def prefix_above(view: RouterView, req: Request, theta: jax.Array) -> jax.Array:
    """prefix_tokens where they reach theta x the prompt, else 0."""
    m = view.match_tokens
    return jnp.where(m >= theta * req.prompt.astype(jnp.float32), m, 0.0)


def spread(x: jax.Array, active: jax.Array | None = None) -> jax.Array:
    """(max - x) / (max - min) in [0, 1] (1 everywhere when all equal): llm-d's queue-scorer normalisation.
    max and min over the `active` replicas (None = all); inactive entries are left unnormalised (mask them)."""
    hi, lo = masked_max(x, active), masked_min(x, active)
    return jnp.where(hi > lo, (hi - x) / jnp.where(hi > lo, hi - lo, 1.0), 1.0)


def load_aware(waiting: jax.Array, threshold: jax.Array) -> jax.Array:
    """llm-d's load-aware scorer: 0.5 at an empty queue, falling linearly to 0 at `threshold` waiting
    requests, 0 beyond (llm-d-inference-scheduler `pkg/plugins/scorer/load_aware.go`)."""
    return jnp.where(waiting == 0, 0.5, jnp.where(waiting > threshold, 0.0,
                                                   0.5 * (1.0 - waiting / jnp.maximum(threshold, 1e-9))))


def lora_affinity(view: RouterView, req: Request) -> jax.Array:
    """llm-d's lora-affinity scorer (llm-d-router `pkg/epp/framework/plugins/scheduling/scorer/loraaffinity/
    lora_affinity.go` L83-109): 1 where the request's adapter runs, else 0.8 where running + waiting adapters
    < max_lora, else 0.6 where it only waits, else 0. A base-model request, or a run without adapters: 1."""
    if view.lora_running is None:
        return jnp.ones_like(view.inflight)
    score = jnp.where(view.lora_running, 1.0, jnp.where(view.lora_room, 0.8, jnp.where(view.lora_waiting, 0.6, 0.0)))
    return jnp.where(req.adapter >= 0, score, 1.0)


def score_matrix(view: RouterView, req: Request, prefix_match: jax.Array, load_threshold: jax.Array) -> jax.Array:
    """[len(SCORERS), G] scores in [0, 1]: prefix match ratio (on the preset's own prefix source,
    `prefix_match` tokens), few requests in flight, few tokens in flight (router-side counters), short
    waiting queue (llm-d's queue scorer: min-max normalised), free KV (llm-d's kv-cache-utilization
    scorer: 1 - usage), load-aware (llm-d), LoRA affinity (llm-d). Min-max normalisations over the active
    replicas (`view.active`); the scores of inactive ones are meaningless: `keep` the total."""
    ratio = prefix_match / jnp.maximum(req.prompt.astype(jnp.float32), 1.0)
    a = view.active
    return jnp.stack([ratio, spread(view.inflight, a), spread(view.tokens, a), spread(view.waiting, a),
                      1.0 - view.kv_usage, load_aware(view.waiting, load_threshold), lora_affinity(view, req)])


def weighted_sum(weights: jax.Array, scores: jax.Array) -> jax.Array:
    """sum_k weights[k] * scores[k], added in SCORERS order (the reference adds the same way)."""
    total = weights[0] * scores[0]
    for k in range(1, scores.shape[0]):
        total = total + weights[k] * scores[k]
    return total


# ----------------------------------------------------------------------------- pickers


def argmax(score: jax.Array, tie: jax.Array | None = None) -> jax.Array:
    """Highest score; ties -> highest `tie` score, then the lowest index."""
    if tie is None:
        return jnp.argmax(score).astype(jnp.int32)
    best = score == jnp.max(score)
    return jnp.argmax(jnp.where(best, tie, -jnp.inf)).astype(jnp.int32)


def random_among_ties(score: jax.Array, key: jax.Array) -> jax.Array:
    """Highest score; ties -> uniformly at random among them."""
    best = score == jnp.max(score)
    return jnp.argmax(jnp.where(best, jax.random.uniform(key, score.shape), -1.0)).astype(jnp.int32)


def softmax(score: jax.Array, key: jax.Array, temperature: jax.Array) -> jax.Array:
    """Sample with probability proportional to exp(score / T); T <= 0 is `argmax`."""
    hot = temperature > 0
    logits = score / jnp.where(hot, temperature, 1.0)
    return jnp.where(hot, jax.random.categorical(key, logits), argmax(score)).astype(jnp.int32)


PICKERS = ("argmax", "random", "softmax")


def pick(picker: jax.Array, score: jax.Array, key: jax.Array, temperature: jax.Array) -> jax.Array:
    """The picker with traced id `picker` (an index into PICKERS)."""
    branches = (lambda s, k, t: argmax(s), lambda s, k, t: random_among_ties(s, k), softmax)
    return jax.lax.switch(picker, branches, score, key, temperature)
