"""Trace adapters: recorded traces in segment form.

Mooncake JSONL: each hash id is a 512-token block, the last one partial; ids are re-numbered by
their full path so equal ids always share ancestors. Azure and BurstGPT CSVs: one private segment per
request (no sharing). Trace timestamps are replayed as recorded, or rescaled to a given mean rate.
"""

from __future__ import annotations

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute.errors import JaxrouteError
from jaxroute.workloads.names import TRACE_WORKLOADS  # noqa: F401  (prefix.TRACE_WORKLOADS)
from jaxroute.workloads.prefix.types import (
    RequestTable,
    check_stages,
    request_steps,
    stage_mean_rate,
)
from jaxroute.workloads.traces import MOONCAKE_BLOCK_TOKENS, Trace

DEFAULT_TRACE_PATHS = {
    "mooncake": "../shared/data/mooncake_synthetic_trace.jsonl",
    "azure-conv": "../shared/data/azure_llm_2023_conv.csv",
    "burstgpt": "../shared/data/BurstGPT_without_fails_1.csv",
}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TracePrefixWorkload:
    """A recorded trace in segment form; every seed replays the same requests (no randomness)."""

    table: RequestTable
    name: str = dataclasses.field(metadata=dict(static=True), default="trace")
    native_rate: float = dataclasses.field(metadata=dict(static=True), default=1.0)  # requests/s as recorded
    n_segments: int = dataclasses.field(metadata=dict(static=True), default=0)
    # distinct (prompt tokens, output tokens, count) of the requests: static, for step_bound and check_fits
    request_shapes: tuple[tuple[int, int, int], ...] = dataclasses.field(metadata=dict(static=True), default=())
    # the load stages its arrivals were warped to (`warp_to_stages`); () = as recorded
    rate_stages: tuple[tuple[float, float], ...] = dataclasses.field(metadata=dict(static=True), default=())

    @property
    def stage_mean_rate(self) -> float | None:
        """Time-averaged rate of the stages: the `rate` that replays the warped arrivals as they are; None without."""
        return stage_mean_rate(self.rate_stages)

    @property
    def n_requests(self) -> int:
        return int(self.table.arrival_s.shape[0])

    @property
    def max_segments(self) -> int:
        return int(self.table.seg_ids.shape[1])

    def segment_lengths(self) -> np.ndarray:
        """Tokens of every segment id (bounds how many a replica can cache)."""
        return np.asarray(self.table.seg_len)[:-1]

    def step_bound(self, chunk: int) -> int:
        """Upper bound on events: per request, its arrival + its (prefill chunks + output - 1)."""
        return sum(c * (1 + request_steps(p, o, chunk)) for p, o, c in self.request_shapes)

    def max_request_tokens(self) -> int:
        """KV tokens (prompt + output) of the largest request."""
        return max(p + o for p, o, _ in self.request_shapes)

    def realize(self, key: jax.Array, rate: jax.Array) -> RequestTable:
        """Replay the trace; rate > 0 rescales time so the mean rate becomes `rate` requests/s."""
        scale = jnp.where(rate > 0, self.native_rate / jnp.where(rate > 0, rate, 1.0), 1.0)
        return dataclasses.replace(self.table, arrival_s=self.table.arrival_s * scale)


def warp_to_stages(workload: TracePrefixWorkload, stages) -> TracePrefixWorkload:
    """The trace with its arrivals time-warped to load stages [(requests/s, seconds), ...]: request i's recorded
    time t_i, as the expected count u_i = (t_i - t_0) x the trace's mean rate, arrives when the stages'
    cumulative count reaches u_i (after the last stage its rate continues). The trace's burstiness around its
    mean is kept, scaled by each stage's rate; every seed replays the same arrivals. Realize it at
    `stage_mean_rate` (the CLI does) to replay them as warped."""
    stages = check_stages(stages)
    rates = np.array([r for r, _ in stages])
    secs = np.array([d for _, d in stages])
    count_at = np.concatenate([[0.0], np.cumsum(rates * secs)])  # expected arrivals at each stage start
    t_at = np.concatenate([[0.0], np.cumsum(secs)])
    t = np.asarray(workload.table.arrival_s, np.float64)
    u = (t - t[0]) * workload.native_rate
    k = np.minimum(np.searchsorted(count_at, u, side="right") - 1, len(stages) - 1)
    warped = t_at[k] + (u - count_at[k]) / rates[k]
    table = dataclasses.replace(workload.table, arrival_s=jnp.asarray(warped, jnp.float32))
    return dataclasses.replace(workload, table=table, native_rate=stage_mean_rate(stages), rate_stages=stages)


def _trace_workload(name: str, trace: Trace, segs: list[list[tuple[int, int]]], n_seg: int,
                    depth: np.ndarray, seg_len: np.ndarray) -> TracePrefixWorkload:
    n = len(trace)
    n_s = max(len(s) for s in segs)
    ids = np.full((n, n_s), n_seg, np.int32)
    tok = np.zeros((n, n_s), np.int32)
    for i, s in enumerate(segs):
        ids[i, : len(s)] = [a for a, _ in s]
        tok[i, : len(s)] = [b for _, b in s]
    out = trace.output_tokens.astype(np.int32)
    span = float(trace.arrival_s[-1] - trace.arrival_s[0])
    native = (n - 1) / span if span > 0 and n > 1 else 1.0
    shapes = collections.Counter(zip(tok.sum(1).tolist(), out.tolist(), strict=True))
    table = RequestTable(jnp.asarray(trace.arrival_s, jnp.float32), jnp.asarray(ids), jnp.asarray(tok),
                         jnp.asarray(out), jnp.full((n,), n_seg, jnp.int32),
                         jnp.asarray(np.append(seg_len, 0), jnp.int32), jnp.asarray(np.append(depth, 0), jnp.int32),
                         jnp.asarray(tok.sum(1), jnp.int32), jnp.full((n,), -1, jnp.int32),
                         klass=None if trace.slo_class is None else jnp.asarray(trace.slo_class, jnp.int32),
                         tenant=None if trace.tenant is None else jnp.asarray(trace.tenant, jnp.int32),
                         adapter=None if trace.adapter is None else jnp.asarray(trace.adapter, jnp.int32))
    return TracePrefixWorkload(table, name=name, native_rate=native, n_segments=n_seg,
                               request_shapes=tuple(sorted((p, o, c) for (p, o), c in shapes.items())))


def from_mooncake(trace: Trace) -> TracePrefixWorkload:
    """Mooncake trace -> segments: one per hash id (512 tokens, the last one takes the remainder)."""
    if trace.block_ids is None:
        raise JaxrouteError(f"trace '{trace.name}' has no hash_ids; it is not a Mooncake trace")
    node: dict[tuple[int, int, int], int] = {}
    lens, depth, segs = [], [], []
    for i, (blocks, p) in enumerate(zip(trace.block_ids, trace.prompt_tokens, strict=True)):
        p, nb = int(p), len(blocks)
        if nb == 0 or not (MOONCAKE_BLOCK_TOKENS * (nb - 1) < p <= MOONCAKE_BLOCK_TOKENS * nb):
            raise JaxrouteError(f"{trace.name} request {i}: input_length {p} does not match {nb} hash ids "
                                f"of {MOONCAKE_BLOCK_TOKENS} tokens (the last one may be partial)")
        parent, s = -1, []
        for d, h in enumerate(blocks):
            t = MOONCAKE_BLOCK_TOKENS if d < nb - 1 else p - MOONCAKE_BLOCK_TOKENS * (nb - 1)
            k = (parent, int(h), t)
            if k not in node:
                node[k] = len(lens)
                lens.append(t)
                depth.append(d)
            parent = node[k]
            s.append((parent, t))
        segs.append(s)
    return _trace_workload("mooncake", trace, segs, len(lens), np.array(depth), np.array(lens))


def from_azure(trace: Trace, name: str = "azure-conv") -> TracePrefixWorkload:
    """Azure trace (or any lengths-only one) -> one private segment per request (no prefix sharing)."""
    p = trace.prompt_tokens.astype(np.int64)
    segs = [[(i, int(t))] for i, t in enumerate(p)]
    return _trace_workload(name, trace, segs, len(p), np.zeros(len(p), np.int64), p)
