"""A loop over the set entries of a mask, inside a compiled run."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def for_each(mask: jax.Array, body: Callable, carry, *, live: bool = False):
    """`body(i, carry) -> carry` for each i where `mask` [K] is True, in increasing i: a while loop of as many
    trips as set entries (under `vmap`, as many as the row with the most), so work proportional to the entries
    that need it rather than to K. live=True calls `body(i, live, carry)`: `live` is False on the trips a
    vmapped row makes after its own entries are done (their results are discarded; a body with an inner
    loop masks it with `live` so such a row does not add trips to it)."""

    def step(c):
        todo, carry = c
        i = jnp.argmax(todo)
        out = body(i, todo[i], carry) if live else body(i, carry)
        return todo.at[i].set(False), out

    return jax.lax.while_loop(lambda c: jnp.any(c[0]), step, (mask, carry))[1]
