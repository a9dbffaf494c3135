"""Scatters that update their array in place.

XLA updates an array in place only when every read of it in the same step is an ancestor of the write;
otherwise it copies the whole array first, every step (a [G, M+1] router table costs O(G x M) per event).
A read inside a `lax.switch` branch, or one whose result feeds something else, is not an ancestor of a
scatter whose indices and updates do not depend on it. `after(index, *reads)` returns the scatter's index
unchanged but computed from the reads, so the write waits for them and happens in place.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def after(index: jax.Array, *reads: jax.Array) -> jax.Array:
    """`index`, made to depend on `reads` (values computed from the array being updated). The test is never
    true (`x | 1` is odd), so the index is unchanged; XLA cannot fold it."""
    never = jnp.bool_(False)
    for r in reads:
        never = never | ((jnp.max(jnp.asarray(r)).astype(jnp.int32) | 1) == 0)
    return jnp.where(never, jnp.zeros_like(index), index)
