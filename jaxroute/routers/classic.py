"""Classic dispatch policies as pure functions of what the router sees.

Every policy has the same signature, `score(view) -> [N] float32`: the router
sends the request to the lowest-scoring server, breaking ties by scanning
cyclically from a random start (the first sampled server). A comparison selects
among policies with `REGISTRY.switch(policy_id, SCORES, view)`: one compiled program
for all of them. Arrays are dense and small (one entry per server), built with
masks instead of gathers or scatters.

Tie rules: JSQ and LWL take, among tied servers, the first at or after a
random start index; power-of-d picks among its tied samples the same way, so for
d = 2 a tie goes to the first sample.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute.errors import JaxrouteError
from jaxroute.registry import PolicyRegistry

POLICY_NAMES: tuple[str, ...] = ("random", "rr", "jsq", "pod", "lwl")
REGISTRY = PolicyRegistry("dispatch", POLICY_NAMES)
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

    Two plain integer min-reductions (no variadic argmin), which vectorise well on CPU:
    float scores are first mapped to int32 keys with the same order and ties.
    """
    n = values.shape[0]
    shifted = jnp.arange(n, dtype=jnp.int32) - tie_offset  # rank = shifted mod n, without a division
    rank = jnp.where(shifted < 0, shifted + n, shifted)
    keys = ordered_key(values)
    first = jnp.min(jnp.where(keys == jnp.min(keys), rank, n)) + tie_offset
    return jnp.where(first >= n, first - n, first).astype(jnp.int32)


def ordered_key(values: jax.Array) -> jax.Array:
    """int32 keys ordered as the float32 `values` (-0 and +0 tie; NaN excluded); ints pass through."""
    if not jnp.issubdtype(values.dtype, jnp.floating):
        return values.astype(jnp.int32)
    bits = jax.lax.bitcast_convert_type(values.astype(jnp.float32) + 0.0, jnp.int32)  # + 0.0: -0 becomes +0
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negatives: flip the magnitude so larger |x| sorts lower


def best_of_sampled(values_at_picks: jax.Array, d: jax.Array) -> jax.Array:
    """Position j < d of the smallest sampled value; ties go to the earliest sample."""
    n_picks = values_at_picks.shape[0]
    j = jnp.arange(n_picks, dtype=jnp.int32)
    big = jnp.iinfo(jnp.int32).max // 2
    key = jnp.where(j < d, values_at_picks.astype(jnp.int32) * n_picks + j, big)
    return jnp.argmin(key).astype(jnp.int32)


# Each policy scores every server; the router takes the lowest score, ties broken from a random
# start index. Scoring (cheap, elementwise) is what `lax.switch` selects, so a batch that mixes
# policies pays for one argmin, not five.


def random_score(v: RouterView) -> jax.Array:
    return (_servers(v) != v.picks[0]).astype(jnp.float32)


def round_robin_score(v: RouterView) -> jax.Array:
    return (_servers(v) != v.rr_index).astype(jnp.float32)


def shortest_queue_score(v: RouterView) -> jax.Array:
    return v.queue.astype(jnp.float32)


def power_of_d_score(v: RouterView) -> jax.Array:
    """Queue length at the first d sampled servers; the others are never chosen."""
    used = jnp.arange(v.picks.shape[0], dtype=jnp.int32)[:, None] < v.d  # [D, 1]
    sampled = jnp.any((v.picks[:, None] == _servers(v)[None, :]) & used, axis=0)  # [N]
    return jnp.where(sampled, v.queue.astype(jnp.float32), jnp.inf)


def least_work_score(v: RouterView) -> jax.Array:
    return v.work


def _servers(v: RouterView) -> jax.Array:
    return jnp.arange(v.queue.shape[0], dtype=jnp.int32)


SCORES = (random_score, round_robin_score, shortest_queue_score, power_of_d_score, least_work_score)


def route(policy: jax.Array, view: RouterView) -> jax.Array:
    """The server chosen by policy id `policy` (traced int32): the lowest score, random ties."""
    return argmin_random_tie(REGISTRY.switch(policy, SCORES, view), view.tie_offset)


def check_d(d, max_d: int, what: str) -> None:
    """Refuse, on the host, a power-of-d `d` outside 1..max_d: a traced d above the static max_d
    would silently compare only the max_d samples drawn (`what` names those samples)."""
    if isinstance(d, jax.core.Tracer):
        return
    d = np.asarray(d)
    if d.size and (d.min() < 1 or d.max() > max_d):
        bad = int(d.max()) if d.max() > max_d else int(d.min())
        raise JaxrouteError(f"power-of-d d={bad} needs 1 <= d <= max_d={max_d} ({what}); "
                            f"build the model with max_d >= {bad}")
