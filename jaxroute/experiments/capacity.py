"""Capacity search: the largest arrival rate at which an SLO holds, for every row and seed, in a few batches.

WORK IN PROGRESS (branch wip/capacity, issue 15): the search engine and the dispatch evaluator only.

A round evaluates K rates per row, all rows and rates in one compiled batch on common seeds (the
batch has the same shape every round, so every round reuses one compilation). Per (row, seed) the
search keeps the largest rate seen to meet the SLO (`ok`) below the smallest rate seen to miss it
(`fail`); the next round places K points evenly inside each row's union of unconverged brackets. A
(row, seed) has converged when fail / ok - 1 <= tol. Its capacity is `ok`; it is unknown (NaN) when a
run in its bracket overflowed a fixed capacity, when even the lowest rate misses the SLO, or when the
highest rate still meets it. Assumes the SLO metric is monotone in the rate (noise can break it: a miss
below a success keeps the lower `fail`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

import numpy as np

from jaxroute.errors import JaxrouteError

_BOUND = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=)\s*([-+0-9.eE]+)\s*$")


@dataclasses.dataclass(frozen=True)
class Bound:
    """One SLO clause: metric op value (op '<=' or '>=')."""

    metric: str
    op: str
    value: float

    def holds(self, x: np.ndarray) -> np.ndarray:
        return x <= self.value if self.op == "<=" else x >= self.value


def parse_slo(text: str) -> tuple[Bound, ...]:
    """'ttft_p90_s<=2,tpot_p90_s<=0.1' -> the clauses (all must hold)."""
    out = []
    for part in (p for p in text.split(",") if p.strip()):
        m = _BOUND.match(part)
        if not m:
            raise JaxrouteError(f"an SLO clause is METRIC<=VALUE or METRIC>=VALUE, got '{part.strip()}'")
        value = float(m.group(3))
        if not math.isfinite(value):
            raise JaxrouteError(f"an SLO bound must be a finite number, got '{part.strip()}'")
        out.append(Bound(m.group(1), m.group(2), value))
    if not out:
        raise JaxrouteError("the SLO is empty; give METRIC<=VALUE[,...]")
    return tuple(out)


@dataclasses.dataclass
class Capacity:
    """capacity [R, S] (NaN = unknown), ok / fail brackets [R, S], the evaluated curve per row."""

    capacity: np.ndarray
    ok: np.ndarray
    fail: np.ndarray
    overflowed: np.ndarray
    curve: list[list[tuple[float, dict[str, float]]]]
    rounds: int
    evaluations: int  # configurations x seeds simulated


Evaluate = Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]]


def search(evaluate: Evaluate, n_rows: int, lo: float, hi: float, slo: tuple[Bound, ...], *, tol: float = 0.02,
           points: int = 8, max_rounds: int = 10) -> Capacity:
    """evaluate(rows [K], rates [K]) -> {metric: [K, S]} (plus optional 'overflow' [K, S]) for one batch."""
    if not 0 < lo < hi:
        raise JaxrouteError(f"the rate range needs 0 < lo < hi, got {lo}, {hi}")
    rows = np.repeat(np.arange(n_rows), points)
    rates = np.tile(np.geomspace(lo, hi, points), n_rows)
    ok = fail = over = None
    curve: list[list] = [[] for _ in range(n_rows)]
    evaluations = 0
    for rnd in range(max_rounds):
        m = evaluate(rows, rates)
        for b in slo:
            if b.metric not in m:
                raise JaxrouteError(f"unknown SLO metric '{b.metric}'; the model reports: {', '.join(sorted(m))}")
        n_seeds = np.asarray(m[slo[0].metric]).shape[1]
        evaluations += len(rows) * n_seeds
        if ok is None:
            ok = np.full((n_rows, n_seeds), -np.inf)
            fail = np.full((n_rows, n_seeds), np.inf)
            over = np.zeros((n_rows, n_seeds), bool)
        meets = np.ones((len(rows), n_seeds), bool)
        for b in slo:
            meets &= b.holds(np.asarray(m[b.metric], np.float64))
        flow = np.asarray(m.get("overflow", np.zeros_like(meets)), bool)
        for k, (r, x) in enumerate(zip(rows, rates, strict=True)):  # misses first: a success counts below them
            curve[r].append((float(x), {b.metric: float(np.mean(m[b.metric][k])) for b in slo}))
            fail[r] = np.where(~meets[k] & ~flow[k], np.minimum(fail[r], x), fail[r])
        for k, (r, x) in enumerate(zip(rows, rates, strict=True)):
            ok[r] = np.where(meets[k] & ~flow[k] & (x < fail[r]), np.maximum(ok[r], x), ok[r])
        for k, (r, x) in enumerate(zip(rows, rates, strict=True)):
            over[r] |= flow[k] & (x > ok[r]) & (x < fail[r])
        ok = np.where(ok >= fail, -np.inf, ok)  # a success above a miss: not monotone there, keep the miss
        done = np.isfinite(ok) & np.isfinite(fail) & (fail / np.where(ok > 0, ok, 1) - 1 <= tol)
        open_ = ~done & ~over & (np.isfinite(ok) | np.isfinite(fail))
        if not open_.any() or rnd == max_rounds - 1:
            break
        new_rows, new_rates = [], []
        for r in range(n_rows):
            sel = open_[r]
            if not sel.any():
                new_rows += [r] * points
                new_rates += [float(np.where(np.isfinite(ok[r]), ok[r], lo).max())] * points  # keeps the shape
                continue
            a = np.where(np.isfinite(ok[r][sel]), ok[r][sel], lo / 2).min()
            z = np.where(np.isfinite(fail[r][sel]), fail[r][sel], hi * 2).max()
            new_rows += [r] * points
            new_rates += list(np.linspace(a, z, points + 2)[1:-1])
        rows, rates = np.asarray(new_rows), np.asarray(new_rates)
    known = np.isfinite(ok) & np.isfinite(fail) & ~over
    cap = np.where(known, ok, np.nan)
    return Capacity(cap, ok, fail, over, curve, rnd + 1, evaluations)


def dispatch_evaluator(policies, *, servers: int, seeds: int, requests: int = 20_000, warmup: float = 0.2,
                       service: str = "exp", seed: int = 0) -> Evaluate:
    """Evaluate for the classic dispatch model: rows are policies (CLI names), rates are loads per server."""
    import jax

    from jaxroute import sim
    from jaxroute.clusters.queueing import DispatchModel, make_params
    from jaxroute.experiments.dispatch import CLI_POLICIES

    model = DispatchModel(n_servers=servers, n_requests=requests, warmup=int(warmup * requests), ring=256, max_d=2)

    def evaluate(rows, rates):
        params = sim.stack_params([make_params(CLI_POLICIES[policies[r]], float(x), service) for r, x in zip(rows, rates,
                                                                                                        strict=True)])
        return sim.run_grid(model, jax.random.key(seed), None, params, seeds).metrics

    return evaluate


def cluster_evaluator(rows, workload, *, seeds: int, gpu: str = "a6000", model_name: str = "mistral-7b", tp: int = 1,
                      chunk: int = 512, max_running: int = 64, seed: int = 0) -> Evaluate:
    """Evaluate for the prefix-cache replica cluster: rows are (router preset, replicas in use); rates in req/s.
    The replica count is traced (`n_active`), so every row and rate runs in one compiled batch."""
    import jax

    from jaxroute import sim
    from jaxroute.clusters import replicas
    from jaxroute.experiments.cluster import initial_capacities
    from jaxroute.routers import prefix as routers

    g_max = max(k for _, k in rows)
    probe = [replicas.make_params(p, rate=1.0, gpu=gpu, model=model_name, tp=tp, n_active=k) for p, k in rows]
    caps = initial_capacities(workload, probe, g_max)
    model = replicas.ReplicaModel(n_replicas=g_max, chunk=chunk, max_running=max_running, max_queue=workload.n_requests,
                                  cache_slots=caps["cache_slots"], router_window=caps["router_window"],
                                  router_modules=routers.modules_for({p for p, _ in rows}))

    def evaluate(idx, rates):
        params = sim.stack_params([replicas.make_params(rows[r][0], rate=float(x), gpu=gpu, model=model_name, tp=tp,
                                                        n_active=rows[r][1]) for r, x in zip(idx, rates, strict=True)])
        return sim.run_grid(model, jax.random.key(seed), workload, params, seeds, chunk=2000).metrics

    return evaluate


def min_replicas(capacity: Capacity, rows, rate: float) -> dict[str, int | None]:
    """Per router: the fewest replicas whose capacity (mean over seeds, every seed known) reaches `rate`."""
    out: dict[str, int | None] = {}
    for (policy, k), c in zip(rows, capacity.capacity, strict=True):
        enough = bool(np.all(np.isfinite(c)) and np.mean(c) >= rate)
        if enough and (out.get(policy) is None or k < out[policy]):
            out[policy] = k
        out.setdefault(policy, None)
    return out
