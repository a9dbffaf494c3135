"""Prefix-cache rules shared by the replicas and by routers that estimate them: the leading match
and the LRU eviction order, defined once.

The matched prefix is the cumulative product of the leading segments' present flags (`leading_match`,
`leading_run`). LRU order (`lru_victim`): least recently used first, deeper first on ties (leaves before
their parents, which are touched whenever a child is), then lowest id. `evict_lru` takes whole segments
in that order until the freed tokens reach the deficit (routers estimate eviction costs with it on their
own records); `evict_cache` does it in place on a flag array; the replicas' slot tables
(`clusters/replicas/cache.py`) pick their victims with `lru_victim`. This module imports no model or
router, so both sides can use it.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def leading_match(present: jax.Array, seg_ids: jax.Array, seg_tok: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(segments, tokens) of the longest prefix whose segments are all present. present [..., M+1]."""
    return leading_run(present[..., seg_ids], seg_tok)


def leading_run(flags: jax.Array, seg_tok: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`leading_match` on the prompt's own present flags ([..., S], gathered by the caller)."""
    ok = flags | (seg_tok == 0)
    # the run's length: the first entry not ok (argmin finds the first False), or all of them
    run = jnp.where(jnp.all(ok, axis=-1), ok.shape[-1], jnp.argmin(ok, axis=-1))
    lead = jnp.arange(ok.shape[-1]) < run[..., None]
    return jnp.sum(lead & (seg_tok > 0), axis=-1), jnp.sum(jnp.where(lead, seg_tok, 0), axis=-1)


def evict_lru(evictable: jax.Array, last_use: jax.Array, depth: jax.Array, seg_len: jax.Array,
              deficit: jax.Array, value: Callable[[jax.Array], jax.Array] | None = None
              ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(mask [M+1], tokens, value) of the segments to evict in LRU order until `deficit` tokens are
    freed; `value(k)` (optional, a float32 scalar per segment id k) is summed over them in eviction order
    and evaluated at the victims only. One segment per loop step, so the cost follows the number evicted
    (usually a few), not a sort of all M+1."""

    def body(c):
        ev, out, freed, total = c
        k = lru_victim(ev, last_use, depth)
        gain = jnp.float32(0) if value is None else value(k)
        return ev.at[k].set(False), out.at[k].set(True), freed + seg_len[k], total + gain

    def cond(c):
        return (c[2] < deficit) & jnp.any(c[0])

    init = (evictable, jnp.zeros_like(evictable), jnp.int32(0), jnp.float32(0))
    _, out, freed, total = jax.lax.while_loop(cond, body, init)
    return out, freed, total


def lru_victim(evictable: jax.Array, last_use: jax.Array, depth: jax.Array, ids: jax.Array | None = None) -> jax.Array:
    """Index of the first entry in LRU order among `evictable` (least recent, deepest, lowest segment id;
    `ids` gives each entry's segment id when entries are not indexed by it, as in a slot table)."""
    lu = jnp.where(evictable, last_use, jnp.inf)
    cand = evictable & (lu == jnp.min(lu))
    cand &= depth == jnp.max(jnp.where(cand, depth, -1))
    if ids is None:
        return jnp.argmax(cand)
    return jnp.argmin(jnp.where(cand, ids, jnp.iinfo(jnp.int32).max))


def evict_cache(cached: jax.Array, evictable: Callable[[jax.Array], jax.Array], last_use: jax.Array,
                depth: jax.Array, seg_len: jax.Array, deficit: jax.Array,
                available: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(cached, tokens freed): `evict_lru` applied to `cached` in place; `evictable(cached)` is the mask of
    segments that may go (formed inside the loop). `available` is the caller's count of evictable tokens
    (the loop stops once they are all gone), so a call with deficit <= 0 makes no pass over the M+1
    segments; the segments evicted and their order are those of `evict_lru`."""

    def body(c):
        cached, freed = c
        k = lru_victim(evictable(cached), last_use, depth)
        return cached.at[k].set(False), freed + seg_len[k]

    def cond(c):
        return (c[1] < deficit) & (c[1] < available)

    return jax.lax.while_loop(cond, body, (cached, jnp.zeros((), seg_len.dtype)))
