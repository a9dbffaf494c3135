"""One replica's prefix cache as a slot table bounded by what the replica can hold, not by the trace.

A replica caches at most C segments (C = `ReplicaModel.cache_slots`, from the KV capacity and the
shortest segments: `slot_bound`). Its cache is a `SlotTable` ([C] rows: segment, locks, LRU stamp, and
a stack of free slots) plus the cluster-wide index `index[G, M+1]` (the slot each segment was last put
in on each replica). The index is only read and written at points, and a slot is believed only when it
still holds the segment (`find`), so an eviction never touches the index. An event therefore costs
O(C + the segments it touches), never O(M): a longer trace (more distinct segments) does not make an
event dearer, and the loops of one iteration carry only the [C] table.

The rules are those of `clusters.prefix_cache` (leading match; LRU order: least recently used first,
deeper first on ties, then lowest segment id), so a run with C slots is, event for event, the run
with one flag per segment id. Inserting into a full table sets the `full` flag (the run overflowed).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute.clusters.prefix_cache import lru_victim
from jaxroute.in_place import after


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SlotTable:
    """Replica g's cache table (a row of the cluster's [G, C] arrays)."""

    seg: jax.Array  # [C] int32 segment in each slot (-1 = free)
    free: jax.Array  # [C] int32 stack of free slots, free[:n_free] (pushed on eviction, popped on insertion)
    n_free: jax.Array  # [] int32
    ref: jax.Array  # [C] int32 running requests locking the slot's segment
    last: jax.Array  # [C] float32 LRU stamp
    tokens: jax.Array  # [] int32 tokens cached

    # ------------------------------------------------------------------ reads

    def find(self, index: jax.Array, g: jax.Array, segs: jax.Array) -> jax.Array:
        """Slot of each segment ([...] int32; -1 = not cached): the index's slot if it still holds it."""
        sl = index[g, segs]
        return jnp.where((sl >= 0) & (self.seg[jnp.maximum(sl, 0)] == segs), sl, -1)

    def present(self, index: jax.Array, g: jax.Array, segs: jax.Array) -> jax.Array:
        return self.find(index, g, segs) >= 0

    def refs(self, index: jax.Array, g: jax.Array, segs: jax.Array) -> jax.Array:
        """Locks on each segment (0 when not cached)."""
        sl = self.find(index, g, segs)
        return jnp.where(sl >= 0, self.ref[jnp.maximum(sl, 0)], 0)

    def locked_tokens(self, seg_len: jax.Array) -> jax.Array:
        """Tokens of the cached segments that running requests lock (O(C))."""
        held = (self.seg >= 0) & (self.ref > 0)
        return jnp.sum(jnp.where(held, seg_len[jnp.maximum(self.seg, 0)], 0))

    # ------------------------------------------------------------------ point updates

    def _at(self, index, g, segs, mask) -> jax.Array:
        """Slots of the masked, cached segments; C (dropped by scatters) elsewhere."""
        sl = self.find(index, g, segs)
        return jnp.where(mask & (sl >= 0), sl, self.seg.shape[0])

    def lock(self, index, g, segs: jax.Array, mask: jax.Array, delta: int) -> SlotTable:
        """Add `delta` locks to every masked cached segment (duplicates count twice)."""
        d = jnp.full(segs.shape, delta, jnp.int32)
        return dataclasses.replace(self, ref=self.ref.at[self._at(index, g, segs, mask)].add(d, mode="drop"))

    def stamp(self, index, g, segs: jax.Array, mask: jax.Array, t: jax.Array) -> SlotTable:
        """Set the LRU stamp of the masked cached segments to t."""
        return dataclasses.replace(self, last=self.last.at[self._at(index, g, segs, mask)].set(t, mode="drop"))

    def touch(self, index, g, segs: jax.Array, mask: jax.Array, t: jax.Array) -> SlotTable:
        """Raise the LRU stamp of the masked cached segments to at least t."""
        return dataclasses.replace(self, last=self.last.at[self._at(index, g, segs, mask)].max(t, mode="drop"))

    def lock_and_touch(self, index, g, segs: jax.Array, delta: jax.Array, mask: jax.Array, t: jax.Array) -> SlotTable:
        """`lock` by a delta per entry ([S] int32; 0 = none), then `touch` the masked entries at t."""
        sl = self.find(index, g, segs)
        C = self.seg.shape[0]
        ref = self.ref.at[jnp.where((delta != 0) & (sl >= 0), sl, C)].add(delta, mode="drop")
        last = self.last.at[jnp.where(mask & (sl >= 0), sl, C)].max(t, mode="drop")
        return dataclasses.replace(self, ref=ref, last=last)

    def evict(self, deficit: jax.Array, available: jax.Array, seg_len: jax.Array, depth: jax.Array) -> tuple[SlotTable, jax.Array]:
        """(table, tokens freed): evict unlocked segments in LRU order until `deficit` tokens are freed.
        `available` is the caller's count of unlocked cached tokens (the loop stops when they are gone), so a
        call with deficit <= 0 costs nothing; one loop step, O(C), per evicted segment. The caller settles
        the replication accounting afterwards (`settle_evictions`)."""

        def body(c):
            tab, freed = c
            ok = (tab.seg >= 0) & (tab.ref == 0)
            k = lru_victim(ok, tab.last, depth[jnp.maximum(tab.seg, 0)], ids=tab.seg)
            n = seg_len[tab.seg[k]]
            tab = dataclasses.replace(tab, seg=tab.seg.at[k].set(-1), free=tab.free.at[tab.n_free].set(k),
                                      n_free=tab.n_free + 1, tokens=tab.tokens - n)
            return tab, freed + n

        def cond(c):
            return (c[1] < deficit) & (c[1] < available)

        return jax.lax.while_loop(cond, body, (self, jnp.int32(0)))


def empty_table(slots: int) -> SlotTable:
    """A table of `slots` free slots (slot 0 on top of the stack)."""
    return SlotTable(jnp.full((slots,), -1, jnp.int32), jnp.arange(slots - 1, -1, -1, dtype=jnp.int32),
                     jnp.int32(slots), jnp.zeros((slots,), jnp.int32), jnp.zeros((slots,), jnp.float32), jnp.int32(0))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Replication:
    """The cluster's replication accounting (for the replication factor)."""

    copies: jax.Array  # [M+1] int32 replicas caching each segment
    unique_tok: jax.Array  # [] int32 tokens of segments cached somewhere


def evicted(before: SlotTable, after: SlotTable) -> jax.Array:
    """[C] bool: the slots whose segment was evicted between `before` and `after` (no insertion in between)."""
    return (before.seg >= 0) & (after.seg != before.seg)


def settle_evictions(before: SlotTable, after: SlotTable, rep: Replication, seg_len: jax.Array) -> Replication:
    """Take the segments evicted between `before` and `after` (no insertion in between) off the counts: O(C)."""
    gone = evicted(before, after)
    segs = jnp.where(gone, before.seg, rep.copies.shape[0])
    copies = rep.copies.at[segs].add(-1, mode="drop")
    last_copy = gone & (copies[jnp.maximum(before.seg, 0)] == 0)
    return Replication(copies, rep.unique_tok - jnp.sum(jnp.where(last_copy, seg_len[jnp.maximum(before.seg, 0)], 0)))


def insert(tab: SlotTable, index: jax.Array, g: jax.Array, rep: Replication | None, segs: jax.Array, mask: jax.Array,
           seg_len: jax.Array) -> tuple[SlotTable, jax.Array, Replication | None, jax.Array]:
    """(table, index, replication, table was full): cache the masked segments ([E], duplicates allowed;
    cached ones stay as they are) in free slots, unlocked and unstamped (the caller locks and touches them).
    `rep` None: no replication accounting (the offload tiers' tables)."""
    E, C, m1 = segs.shape[0], tab.seg.shape[0], index.shape[1]
    need = mask & (tab.find(index, g, segs) < 0)
    e = jnp.arange(E, dtype=jnp.int32)
    # one winner per distinct segment (its first entry): claim with E - e through the index itself
    claimed = index.at[g, jnp.where(need, segs, m1)].set(-1, mode="drop")
    claimed = claimed.at[g, jnp.where(need, segs, m1)].max(E - e, mode="drop")
    win = need & (claimed[g, segs] == E - e)
    rank = jnp.cumsum(win) - 1  # winners pop the stack's top slots
    slot = jnp.where(win & (rank < tab.n_free), tab.free[jnp.clip(tab.n_free - 1 - rank, 0, C - 1)], C)
    placed = win & (slot < C)
    index = claimed.at[g, jnp.where(win, segs, m1)].set(jnp.where(placed, slot, -1), mode="drop")
    length = jnp.where(placed, seg_len[segs], 0)
    tab = dataclasses.replace(
        tab, seg=tab.seg.at[slot].set(segs, mode="drop"), ref=tab.ref.at[slot].set(0, mode="drop"),
        last=tab.last.at[slot].set(-jnp.inf, mode="drop"), n_free=tab.n_free - jnp.sum(placed),
        tokens=tab.tokens + jnp.sum(length))
    if rep is not None:
        # after the reads that computed unique_tok (settle_evictions): XLA updates the counts in place
        copies = rep.copies.at[after(jnp.where(placed, segs, m1), rep.unique_tok)].add(1, mode="drop")
        first_copy = placed & (copies[segs] == 1)  # read after the write
        rep = Replication(copies, rep.unique_tok + jnp.sum(jnp.where(first_copy, length, 0)))
    return tab, index, rep, jnp.any(win & ~placed)


def cached_mask(index: jax.Array, slot_seg: jax.Array) -> jax.Array:
    """[G, M+1] bool: which segments each replica caches (index [G, M+1], slot_seg [G, C]); O(G x M), so
    only for routers that read whole caches and for the stale view's snapshots. When the table has fewer
    slots than there are segments, the slots' segments are scattered (G x C writes); otherwise the index is
    read at every segment (G x (M+1) reads): on a CPU each costs about the same per element."""
    G, m1 = index.shape
    if slot_seg.shape[1] >= m1:
        return cached_at(index, slot_seg, jnp.arange(m1, dtype=index.dtype))
    held = jnp.where(slot_seg >= 0, slot_seg, m1)  # free slots: out of range, dropped
    return jnp.zeros((G, m1), bool).at[jnp.arange(G)[:, None], held].set(True, mode="drop")


def cached_at(index: jax.Array, slot_seg: jax.Array, segs: jax.Array) -> jax.Array:
    """[G, S] bool: `cached_mask` at the segments `segs` [S] only (O(G x S))."""
    sl = index[:, segs]
    held = jnp.take_along_axis(slot_seg, jnp.maximum(sl, 0), axis=1)
    return (sl >= 0) & (held == segs[None, :])


def slot_bound(seg_len: np.ndarray, kv_capacity: int) -> int:
    """Most segments a replica of `kv_capacity` KV tokens can cache at once: the largest k whose k shortest
    segments fit (segments of 0 tokens are padding and never cached); at least 1."""
    lengths = np.sort(np.asarray(seg_len, np.int64)[np.asarray(seg_len) > 0])
    return max(1, int(np.searchsorted(np.cumsum(lengths), int(kv_capacity), side="right")))
