"""Scatters stay in place: no event copies a table as long as the trace (`jaxroute.in_place`, the replica step)."""

import re

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute.bench.program_cost import _reachable, parse_hlo
from jaxroute.clusters import replicas as R
from jaxroute.in_place import after
from jaxroute.workloads import prefix as W


def _copies_in_loop(text: str, dims: str) -> list[str]:
    """The copy instructions of shape [..dims] that run on every trip of the program's main while loop: in its
    body and the branches it calls, not in the loops nested in it (an eviction loop may copy its [C] table per
    evicted segment), from the optimized HLO text."""
    comps = parse_hlo(text)
    entry = re.search(r"^ENTRY %?([\w.\-]+)", text, re.M).group(1)
    loops = [i for i in comps[entry] if i.opcode == "while"]
    body = max((loop.calls[-1] for loop in loops), key=lambda b: len(_reachable(comps, b)[0]))  # the event loop
    inside, todo = set(), [body]
    while todo:
        c = todo.pop()
        if c not in inside and c in comps:
            inside.add(c)
            todo += [k for i in comps[c] if i.opcode in ("conditional", "call") for k in i.calls]
    lines, current = [], None
    for line in text.splitlines():
        head = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if head and not line.startswith(" "):
            current = head.group(1)
        elif current in inside and re.search(rf"= \w+\[{dims}\]\{{[^}}]*\}} copy\(", line):
            lines.append(line.strip())
    return lines


def test_after_keeps_a_scatter_in_place_and_changes_nothing():
    G, M = 4, 997

    def run(x, idx, ordered):
        def body(c):
            i, x, acc = c
            seen = jnp.sum(x[i % G, idx] == 0)  # a read of x whose result goes elsewhere
            at = after(idx, seen) if ordered else idx
            return i + 1, x.at[i % G, at].add(1), acc + seen

        return jax.lax.while_loop(lambda c: c[0] < 9, body, (0, x, 0))

    x, idx = jnp.zeros((G, M), jnp.int32), jnp.arange(50) * 7
    jitted = jax.jit(run, static_argnums=2)
    out = [jitted(x, idx, ordered) for ordered in (False, True)]
    for a, b in zip(out[0], out[1], strict=True):
        np.testing.assert_array_equal(a, b)
    assert _copies_in_loop(jitted.lower(x, idx, True).compile().as_text(), f"{G},{M}") == []


def test_a_replica_event_copies_no_segment_table():
    """The six production routers of the Mooncake job in one program: no [G, M+1] or [M+1] table (cache index,
    pending counts, routers' segment tables) is copied on every event (Dynamo's counts and AIBrix's index were)."""
    wl = W.toolbench(40, n_tools=30, tool_mean=900)
    m1 = int(wl.realize(jax.random.key(0), jnp.float32(10.0)).seg_len.shape[0])
    policies = ("llmd_precise", "dynamo_kv", "sglang_cache_aware", "vllm_prefixaware", "aibrix_prefix_cache",
                "llmd_load")
    model = R.ReplicaModel(n_replicas=3, max_running=8, max_queue=64, router_policies=policies)
    p = R.make_params("dynamo_kv", rate=10.0, kv_capacity=8000)

    def run(key, workload, params):
        state = model.init(key, workload, params)
        return jax.lax.while_loop(lambda s: ~model.is_done(s), lambda s: model.step(s, workload, params), state)

    text = jax.jit(run).lower(jax.random.key(0), wl, p).compile().as_text()
    assert m1 not in (3, 8, 64)  # its shapes are the segment tables'
    assert _copies_in_loop(text, rf"(?:\d+,)?{m1}") == []
