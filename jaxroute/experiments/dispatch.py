"""Classic dispatch on N FCFS servers: every policy on the same seeds, with the ring sized and grown."""

from __future__ import annotations

from jaxroute.clusters.queueing import DispatchModel, default_ring, make_params
from jaxroute.errors import JaxrouteError
from jaxroute.experiments.comparison import Comparison, Results, Row, run_with_retry
from jaxroute.experiments.names import DISPATCH_POLICIES, check_load

# CLI policy names -> model policy ids; p2c is power-of-d with d = --d (2 unless changed) (experiments/names.py)
CLI_POLICIES = DISPATCH_POLICIES
METRICS = ("mean_response", "p99_response")
# Heavy tails: big jobs block servers and queues pile up elsewhere (ring sizes seen at load 0.9).
HEAVY_TAIL_RING = {"pareto": 256, "lognormal": 64}
QUEUE_READING = ("jsq", "pod")


def policy_label(name: str, d: int) -> str:
    """Table label of a CLI policy: power-of-d is 'p2c' for d = 2, else 'po<d>c'."""
    if CLI_POLICIES[name] != "pod":
        return name
    return "p2c" if d == 2 else f"po{d}c"


def initial_ring(policies, servers: int, load: float, service: str, stale: float) -> int:
    """Ring size to start from: sized from load, servers and staleness when a policy reads queue lengths."""
    if not any(CLI_POLICIES[p] in QUEUE_READING for p in policies):
        return 1  # nobody reads the ring: keep it tiny
    return max(default_ring(servers, min(load, 1.0), stale), HEAVY_TAIL_RING.get(service, 0))


def run_dispatch(policies, *, servers=16, load=0.9, service="exp", seeds=64, requests=20_000, warmup=0.1,
                 stale=0.0, d=2, ring=None, seed=0, progress=False, allow_unstable=False) -> Results:
    """Run every policy on the same seeds in one compiled grid.

    Without `ring`, the ring starts at `initial_ring` and is doubled (and the grid rerun) while a
    policy that reads queue lengths overflowed it; a given `ring` is used as is. A load >= 1 is refused
    (no ring suffices: the queues grow without bound) unless `allow_unstable`, which runs it once.
    """
    if not 0.0 <= warmup < 1.0:
        raise JaxrouteError(f"--warmup must be in [0, 1), got {warmup}")
    check_load(load, allow_unstable)
    rows = [Row(policy_label(p, d), make_params(CLI_POLICIES[p], load, service, stale, d),
                {"load": load, "service": service, "stale": stale, "d": d if CLI_POLICIES[p] == "pod" else None})
            for p in policies]

    def run(caps):
        model = DispatchModel(n_servers=servers, n_requests=requests, warmup=int(warmup * requests),
                              ring=caps["ring"], max_d=max(d, 2))
        return Comparison(model, rows, seeds, METRICS, seed=seed, chunk=max(1, model.num_steps() // 20),
                          progress="dispatch" if progress else False).run()

    start = ring or initial_ring(policies, servers, load, service, stale)
    once = ring is not None or load >= 1.0  # a growing queue overflows any ring: growing it cannot help
    results, _ = run_with_retry(run, {"ring": start}, {"ring": "overflow"}, max_tries=1 if once else 4)
    return results
