"""Prompts as sequences of segments: the request table every prefix workload realises.

A segment is a radix-tree node: an id plus a token count (a system prompt, a document, a tool
description, a question, a 512-token Mooncake block). A segment id always has the same parent,
so "the leading segments that are present" is a prefix match (`clusters.prefix_cache.leading_match`). Each workload
declares its own id space of `n_segments` ids; id `n_segments` is a padding dummy of length 0.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from jaxroute.errors import JaxrouteError


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RequestTable:
    """One realised run's requests (sorted by arrival) and its segment catalogue."""

    arrival_s: jax.Array  # [N] float32 arrival time
    seg_ids: jax.Array  # [N, S] int32 segment ids in prompt order (pad = n_segments)
    seg_tok: jax.Array  # [N, S] int32 tokens per segment (0 = pad)
    out_tok: jax.Array  # [N] int32 output tokens (>= 1)
    out_seg: jax.Array  # [N] int32 segment id the output becomes in the cache (n_segments = not kept)
    seg_len: jax.Array  # [n_segments + 1] int32 tokens of each segment id (dummy last = 0)
    seg_depth: jax.Array  # [n_segments + 1] int32 position of each id in any prompt (tree depth)
    prompt_tok: jax.Array  # [N] int32 prompt tokens (sum of seg_tok)
    session: jax.Array  # [N] int32 session (conversation, agent run, sample group) id; -1 = none recorded
    landed: jax.Array | None = None  # [N] bool the prompt's KV arrives with the request (a disaggregated decode
    #                                 tier): only its last prompt token is computed (None = none)
    seg_end: jax.Array | None = None  # [N, S] int32 prompt tokens up to each segment's end (the running sum of
    #                                   seg_tok): derived once per run by the replica model's init (None before)
    key_id: jax.Array | None = None  # [N] int32 prompt key (template / hash id) a decode tier's exact-match
    #                                  predictor matches on; -1 = unknown (None: no keys recorded)
    klass: jax.Array | None = None  # [N] int32 request class (clusters.names.CLASSES) from a trace (None: the
    #                                 control plane draws it from its class_mix)
    tenant: jax.Array | None = None  # [N] int32 tenant from a trace (None: drawn from tenant_mix)
    adapter: jax.Array | None = None  # [N] int32 LoRA adapter id (-1 = the base model) from a trace (None: drawn
    #                                   by the replica model's adapters, or no adapters)


def trace_adapters(workload) -> int | None:
    """Adapter ids a trace's adapter_id column names (its largest + 1), or None without such a column."""
    table = getattr(workload, "table", None)
    if table is None or table.adapter is None:
        return None
    return int(np.max(np.asarray(table.adapter), initial=-1)) + 1


def request_steps(prompt_tok: int, out_tok: int, chunk: int) -> int:
    """Iterations one request can cause at most: its prefill chunks + its output tokens after the first."""
    return math.ceil(prompt_tok / chunk) + out_tok - 1


def check_fits(workload, kv_capacity: int) -> None:
    """Every request must fit alone (prompt + output <= KV capacity), else it could never be admitted."""
    worst = workload.max_request_tokens()
    if worst > kv_capacity:
        raise JaxrouteError(f"workload '{workload.name}' has a request needing {worst} KV tokens "
                            f"(prompt + output) but a replica holds only {kv_capacity}; "
                            "raise the capacity or shorten the requests")


def stage_mean_rate(stages) -> float | None:
    """Time-averaged rate of load stages ((requests/s, seconds), ...): the `rate` that reproduces them; None if none."""
    if not stages:
        return None
    return sum(r * d for r, d in stages) / sum(d for _, d in stages)


def stage_requests(stages) -> int | None:
    """Expected requests within the stages, round(sum rate x seconds); None without stages."""
    return round(sum(r * d for r, d in stages)) if stages else None


def check_stages(stages) -> tuple[tuple[float, float], ...]:
    """The stages as floats; one line naming a bad one."""
    import math

    stages = tuple((float(r), float(d)) for r, d in stages)
    if not stages:
        raise JaxrouteError("give at least one load stage RATE:SECONDS")
    for r, d in stages:
        if not (math.isfinite(r) and math.isfinite(d) and r > 0 and d > 0):
            raise JaxrouteError(f"a load stage needs a rate > 0 and seconds > 0, got {r:g}:{d:g}")
    return stages

