"""Per-event cost bounded by what a replica holds, not by the trace: the cache slot table (`cache_slots`)
and the local queue ring. With the tightest slot bound the jitted model still matches the radix-tree
reference request by request; a table that is too small is flagged and regrown, never silent."""

import jax
import numpy as np
import pytest

from jaxroute.bench.blis import unique_workload
from jaxroute.clusters import replicas as R
from jaxroute.experiments.cluster import (
    ACCOUNTING,
    policy_rows,
    run_cluster,
    unfinished_records,
)
from jaxroute.metrics import summarize
from jaxroute.report import Record
from tests.test_replicas import CASES, _compare


def test_slot_bound_is_the_most_segments_that_fit():
    assert R.slot_bound(np.array([0, 5, 3, 10]), 8) == 2  # 3 + 5 fit, 3 + 5 + 10 do not; 0 = padding
    assert R.slot_bound(np.array([0, 5, 3, 10]), 18) == 3
    assert R.slot_bound(np.array([7]), 3) == 1  # at least one slot


@pytest.mark.parametrize("case, policy, admission, local", [
    ("toolbench", "least_load", "reserve", "fcfs"),
    ("toolbench", "threshold", "reserve", "lpm"),
    ("toolbench", "cache_guard", "on-demand", "fcfs"),
    ("shared-prefix", "rr", "reserve", "fcfs"),
])
def test_tight_slot_bound_matches_reference(case, policy, admission, local):
    make, cap, _ = CASES[case]
    wl = make()
    assert R.slot_bound(wl.segment_lengths(), cap) < wl.n_segments  # the bound bites
    _compare(case, policy, admission=admission, local=local, slots="bound")


def test_unique_block_trace_with_few_slots_matches_reference():
    """BLIS's unique-prompt trace (4 fresh 512-token blocks per request): a few dozen slots serve a trace of
    hundreds of segment ids while every admission evicts."""
    wl = unique_workload(40)
    cap = 12_000  # 6 requests' prompts: the cache turns over all the time
    slots = R.slot_bound(wl.segment_lengths(), cap)
    assert slots * 4 < wl.n_segments
    _, m = _compare("toolbench", "least_load", workload=wl, cap=cap, slots="bound", G=2)
    assert float(m["hit_rate"]) == 0.0


def test_too_small_table_is_flagged_and_regrown(capsys):
    make, cap, rate = CASES["shared-prefix"]  # slot bound 8: 2 slots fill at once, 4 probably, 8 never
    wl = make()
    model = R.ReplicaModel(n_replicas=2, max_queue=64, cache_slots=2, router_modules=())  # least_load keeps none
    p = R.make_params("least_load", rate=rate, kv_capacity=cap)
    m = model.metrics(R.run_single(model, jax.random.key(0), wl, p), wl, p)
    assert bool(m["cache_full"]) and bool(m["overflow"])
    res = run_cluster(policy_rows(["least_load"], rate=rate, kv_capacity=cap), wl, replicas_n=2, seeds=2,
                      capacities={"cache_slots": 2}, max_tries=3)
    assert "capacity cache_slots = 2 overflowed (cache_full)" in capsys.readouterr().err
    assert not res.grid.overflow.any()


def test_every_request_is_accounted_for_when_a_queue_overflows():
    """A queue that overflows drops requests: each run says how many it completed, left in flight, dropped and
    never admitted, and they add up to the trace (the table `cluster --allow-overflow` prints)."""
    make, cap, _ = CASES["toolbench"]
    wl = make()
    model = R.ReplicaModel(n_replicas=2, max_queue=1, max_running=1, router_modules=())
    p = R.make_params("rr", rate=500.0, kv_capacity=cap)  # all at once: one runs and one waits per replica
    m = model.metrics(R.run_single(model, jax.random.key(0), wl, p), wl, p)
    counts = {k: int(m[k]) for k in ACCOUNTING}
    assert counts["dropped"] > 0 and bool(m["queue_overflow"]) and sum(counts.values()) == wl.n_requests, counts
    assert counts["in_flight_end"] == counts["not_arrived"] == 0  # run to completion: nothing left over
    record = Record("rr", {}, True, {k: summarize(np.array([v, v])) for k, v in counts.items()})
    assert unfinished_records([record]) == [record]
    done = Record("rr", {}, False, {k: summarize(np.array([0.0, 0.0])) for k in ACCOUNTING[1:]})
    assert unfinished_records([done]) == []
