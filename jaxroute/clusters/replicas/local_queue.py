"""A replica's local queue as a ring (a deque) whose cost per event does not grow with its size Q.

The entries live in the cluster's `ids [G, Q]` arrays (with `gen`/`front` for on-demand admission's
preempted requests); a replica's row keeps only its ring's `head`, `span` (positions in use, holes
included) and `count` (requests waiting). New requests join at the tail, preempted ones at the front
(latest first), so the ring's order is the local order of "fcfs"; "lpm" takes from anywhere and leaves
a hole that the head skips later. Writes are not made at once: an event's writes (at most L) go to a
log that `apply_log` makes first thing in the next event, before anything reads the arrays, so XLA
updates them in place (a read before a write in the same event would copy the [G, Q] array each event).
Nothing reads an entry in the event that wrote it: a dispatch and an iteration are different events,
and an iteration that preempted admits nothing.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QueueLog:
    """One event's pending writes to replica g's ring (pos = Q: no write)."""

    g: jax.Array  # [] int32
    pos: jax.Array  # [L] int32
    ids: jax.Array  # [L] int32 (-1 = a hole)
    gen: jax.Array  # [L] int32 output tokens generated before a preemption
    front: jax.Array  # [L] int32 preemption stamp (0 = none)
    n: jax.Array  # [] int32 entries used

    @classmethod
    def empty(cls, length: int, q: int, g=0) -> QueueLog:
        z = jnp.zeros((length,), jnp.int32)
        return cls(jnp.asarray(g, jnp.int32), jnp.full((length,), q, jnp.int32), z - 1, z, z, jnp.int32(0))

    def add(self, pos, ids, gen=0, front=0, when=True) -> QueueLog:
        """Append one write (if `when`); the log has room for every write one event can make."""
        k = jnp.where(when, self.n, self.pos.shape[0])
        return dataclasses.replace(self, pos=self.pos.at[k].set(pos, mode="drop"), ids=self.ids.at[k].set(ids, mode="drop"),
                                   gen=self.gen.at[k].set(gen, mode="drop"), front=self.front.at[k].set(front, mode="drop"),
                                   n=self.n + jnp.where(when, 1, 0))


def apply_log(ids: jax.Array, gen: jax.Array, front: jax.Array, log: QueueLog, on_demand: bool):
    """(ids, gen, front) with the last event's writes made (the only user of the old arrays: in place)."""
    ids = ids.at[log.g, log.pos].set(log.ids, mode="drop")
    if on_demand:
        gen = gen.at[log.g, log.pos].set(log.gen, mode="drop")
        front = front.at[log.g, log.pos].set(log.front, mode="drop")
    return ids, gen, front


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Entries:
    """Replica g's entries, read-only within an event (as of its start): loops close over them, never carry them."""

    ids: jax.Array  # [G, Q] int32 request ids (-1 = hole or unused)
    gen: jax.Array  # [G, Q] ([G, 1] without on-demand admission) int32
    front: jax.Array  # [G, Q] ([G, 1]) int32
    g: jax.Array  # [] int32

    def at(self, p) -> jax.Array:
        return self.ids[self.g, p]

    def preempted(self, p) -> tuple[jax.Array, jax.Array]:
        """(output tokens generated, preemption stamp) of the entry at p (on-demand arrays only)."""
        return self.gen[self.g, p], self.front[self.g, p]

    def row(self) -> jax.Array:  # [Q] every entry of the ring ("lpm" looks at all of them)
        return self.ids[self.g]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Ring:
    """Replica g's ring counters and this event's writes (what loops carry: O(L), not O(Q))."""

    head: jax.Array  # [] int32 position of the front
    span: jax.Array  # [] int32 positions in use from head (holes included)
    count: jax.Array  # [] int32 requests waiting
    size: int = dataclasses.field(metadata=dict(static=True))  # Q
    log: QueueLog  # this event's writes so far

    def pos(self, k) -> jax.Array:
        """Ring position k places after the head."""
        return (self.head + k) % self.size

    def in_span(self) -> jax.Array:  # [Q] bool positions between the head and the tail
        return (jnp.arange(self.size) - self.head) % self.size < self.span

    def push_back(self, rid, when) -> tuple[Ring, jax.Array]:
        """(ring, fitted): `rid` joins at the tail (a full ring refuses it)."""
        ok = self.span < self.size
        go = when & ok
        log = self.log.add(self.pos(self.span), rid, when=go)
        return dataclasses.replace(self, span=self.span + go, count=self.count + go, log=log), ok

    def push_front(self, rid, gen, stamp, when) -> tuple[Ring, jax.Array]:
        """(ring, fitted): a preempted request waits at the front (a full ring refuses it)."""
        ok = self.span < self.size
        go = when & ok
        head = jnp.where(go, (self.head - 1) % self.size, self.head)
        log = self.log.add(head, rid, gen, stamp, when=go)
        return dataclasses.replace(self, head=head, span=self.span + go, count=self.count + go, log=log), ok

    def take(self, p, when) -> Ring:
        """Remove the entry at position p: from the head the ring shrinks, elsewhere a hole is left."""
        at_head = p == self.head
        log = self.log.add(p, -1, when=when & ~at_head)
        head = jnp.where(when & at_head, (self.head + 1) % self.size, self.head)
        return dataclasses.replace(self, head=head, span=self.span - (when & at_head), count=self.count - when, log=log)

    def skip_holes(self, entries: Entries) -> Ring:
        """Drop the holes at the head (left by takes of earlier events, already written)."""

        def cond(c):
            head, span = c
            return (span > 0) & (entries.at(head) < 0)

        head, span = jax.lax.while_loop(cond, lambda c: ((c[0] + 1) % self.size, c[1] - 1), (self.head, self.span))
        return dataclasses.replace(self, head=head, span=span)
