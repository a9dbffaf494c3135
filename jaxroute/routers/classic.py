"""Classic dispatch policies as pure functions of what the router sees.

Every policy has the same signature, `policy(view) -> server index`, so a
comparison selects among them with `lax.switch(policy_id, POLICIES, view)`:
one compiled program for all of them. Arrays are dense and small (one entry
per server), and choices are made with one-hot masks instead of gathers.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

POLICY_NAMES: tuple[str, ...] = ("random", "rr", "jsq", "pod", "lwl")
RANDOM, ROUND_ROBIN, JSQ, POWER_OF_D, LEAST_WORK_LEFT = range(5)
# Policies whose decision reads queue lengths (and so depends on the ring of finish times).
USES_QUEUE_LENGTH: tuple[bool, ...] = (False, False, True, True, False)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RouterView:
    """What the dispatcher sees when one request arrives."""

    queue: jax.Array  # [N] int32 queue lengths (fresh, or the stale snapshot)
    work: jax.Array  # [N] float32 work left per server (time until it is free)
    picks: jax.Array  # [D] int32 servers sampled uniformly with replacement
    d: jax.Array  # () int32 number of sampled servers power-of-d compares (1 <= d <= D)
    rr_index: jax.Array  # () int32 round-robin position (arrival count mod N)
    tie_offset: jax.Array  # () int32 random start index for breaking ties


def argmin_random_tie(values: jax.Array, tie_offset: jax.Array) -> jax.Array:
    """Index of the minimum; among ties, the first index at or after `tie_offset` (cyclically).

    Two plain min-reductions (no variadic argmin), which vectorise well on CPU.
    """
    n = values.shape[0]
    rank = (jnp.arange(n, dtype=jnp.int32) - tie_offset) % n
    first = jnp.min(jnp.where(values == jnp.min(values), rank, n))
    return ((first + tie_offset) % n).astype(jnp.int32)


def best_of_sampled(values_at_picks: jax.Array, d: jax.Array) -> jax.Array:
    """Position j < d of the smallest sampled value; ties go to the earliest sample."""
    n_picks = values_at_picks.shape[0]
    j = jnp.arange(n_picks, dtype=jnp.int32)
    big = jnp.iinfo(jnp.int32).max // 2
    key = jnp.where(j < d, values_at_picks.astype(jnp.int32) * n_picks + j, big)
    return jnp.argmin(key).astype(jnp.int32)


def random_policy(v: RouterView) -> jax.Array:
    return v.picks[0]


def round_robin(v: RouterView) -> jax.Array:
    return v.rr_index


def join_shortest_queue(v: RouterView) -> jax.Array:
    return argmin_random_tie(v.queue, v.tie_offset)


def power_of_d(v: RouterView) -> jax.Array:
    n = v.queue.shape[0]
    hit = v.picks[:, None] == jnp.arange(n, dtype=jnp.int32)[None, :]  # [D, N]
    sampled = jnp.sum(jnp.where(hit, v.queue[None, :], 0), axis=1)  # [D]
    j = best_of_sampled(sampled, v.d)
    return jnp.sum(jnp.where(jnp.arange(v.picks.shape[0]) == j, v.picks, 0)).astype(jnp.int32)


def least_work_left(v: RouterView) -> jax.Array:
    return argmin_random_tie(v.work, v.tie_offset)


POLICIES = (random_policy, round_robin, join_shortest_queue, power_of_d, least_work_left)


def route(policy: jax.Array, view: RouterView) -> jax.Array:
    """The server chosen by policy id `policy` (traced int32)."""
    return jax.lax.switch(policy, POLICIES, view)
