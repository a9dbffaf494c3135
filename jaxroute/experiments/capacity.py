"""Capacity search: the largest arrival rate at which an SLO holds, for every row and seed, in a few batches.

A round evaluates K rates per row, all rows and rates in one compiled batch on common seeds (the
batch has the same shape every round, so every round reuses one compilation). Per (row, seed) the
search keeps the largest rate seen to meet the SLO (`ok`) below the smallest rate seen to miss it
(`fail`); the next round places K points evenly inside each row's union of unconverged brackets. A
(row, seed) has converged when fail / ok - 1 <= tol. Its capacity is `ok`; it is unknown (NaN) when a
run in its bracket overflowed a fixed capacity, when even the lowest rate misses the SLO, or when the
highest rate still meets it. Assumes the SLO metric is monotone in the rate (noise can break it: a miss
below a success keeps the lower `fail`).

Overload is a normal outcome: a run whose queues grow without bound misses the SLO. A run that overflowed
a fixed buffer (the dispatch ring, a cache table, a step budget) says nothing; when such a run lies below
every known miss of its (row, seed), the evaluator's `grow()` enlarges the buffers and the round is rerun
(a new compilation); once nothing can grow, that (row, seed) is unknown.

Evaluators (one per model, each a callable `(rows [K], rates [K]) -> {metric: [K, S]}` with `grow()`):
`DispatchEvaluator` (load per server), `ClusterEvaluator`, `PDEvaluator`, `DecodeEvaluator` (req/s).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable

import jax
import numpy as np

from jaxroute import cost_models, sim
from jaxroute.clusters import dp_decode as dd
from jaxroute.clusters import replicas
from jaxroute.clusters.names import (
    DEFAULT_CHUNK,
    DEFAULT_MAX_RUNNING,
    REPLICA_GPU,
    REPLICA_MODEL,
)
from jaxroute.clusters.queueing import DispatchModel, make_params
from jaxroute.deployment import DECODE
from jaxroute.errors import JaxrouteError
from jaxroute.experiments import pd
from jaxroute.experiments.cluster import CAPACITY_FLAGS, initial_capacities
from jaxroute.experiments.comparison import run_with_retry
from jaxroute.experiments.dispatch import CLI_POLICIES
from jaxroute.experiments.names import Bound, parse_slo  # noqa: F401  (capacity.parse_slo: SLO clauses)
from jaxroute.routers import prefix as routers


@dataclasses.dataclass
class Capacity:
    """capacity [R, S] (NaN = unknown), ok / fail brackets [R, S], the evaluated curve per row."""

    capacity: np.ndarray
    ok: np.ndarray
    fail: np.ndarray
    overflowed: np.ndarray  # [R, S] an overflowed run inside the bracket left it unknown
    curve: list[list[tuple[float, dict[str, float]]]]  # per row: (rate, SLO metrics' means over seeds) per run
    rounds: int
    evaluations: int  # configurations x seeds simulated (reruns after growing a buffer included)
    batches: int  # compiled batches run


class Evaluator(abc.ABC):
    """`evaluate(rows [K], rates [K]) -> {metric: [K, S]}` (plus 'overflow' [K, S]) for one batch."""

    @abc.abstractmethod
    def __call__(self, rows: np.ndarray, rates: np.ndarray) -> dict[str, np.ndarray]:
        """One compiled batch: row indices and their rates -> per-run metrics."""

    def grow(self) -> bool:
        """Enlarge the fixed buffers the last batch overflowed; False when nothing can grow."""
        return False


def _misses(rows, rates, m, slo, fail):
    """Fold one batch's misses into `fail` (in place); returns (meets, overflowed, the overflowed runs that lie
    below every known miss of their (row, seed))."""
    meets = np.ones(np.shape(m[slo[0].metric]), bool)
    for b in slo:
        meets &= b.holds(np.asarray(m[b.metric], np.float64))
    flow = np.asarray(m.get("overflow", np.zeros_like(meets)), bool)
    for k, (r, x) in enumerate(zip(rows, rates, strict=True)):  # misses first: a success counts below them
        fail[r] = np.where(~meets[k] & ~flow[k], np.minimum(fail[r], x), fail[r])
    relevant = np.stack([flow[k] & (x < fail[r]) for k, (r, x) in enumerate(zip(rows, rates, strict=True))])
    return meets, flow, relevant


def search(evaluate: Evaluator | Callable, n_rows: int, lo: float, hi: float, slo: tuple[Bound, ...], *,
           tol: float = 0.02, points: int = 8, max_rounds: int = 10, on_round: Callable | None = None) -> Capacity:
    """Capacity of every (row, seed) in [lo, hi] (see the module docstring); on_round(round, open brackets) after each."""
    if not 0 < lo < hi:
        raise JaxrouteError(f"the rate range needs 0 < lo < hi, got {lo}, {hi}")
    if points < 2:
        raise JaxrouteError(f"a round needs at least 2 rates per row, got {points}")
    rows = np.repeat(np.arange(n_rows), points)
    rates = np.tile(np.geomspace(lo, hi, points), n_rows)
    ok = fail = over = None
    curve: list[list] = [[] for _ in range(n_rows)]
    evaluations = batches = 0
    grow = getattr(evaluate, "grow", lambda: False)
    for rnd in range(max_rounds):
        while True:
            m = evaluate(rows, rates)
            batches += 1
            for b in slo:
                if b.metric not in m:
                    raise JaxrouteError(f"unknown SLO metric '{b.metric}'; the model reports: "
                                        f"{', '.join(sorted(k for k in m if k != 'overflow'))}")
            n_seeds = np.asarray(m[slo[0].metric]).shape[1]
            evaluations += len(rows) * n_seeds
            if ok is None:
                ok = np.full((n_rows, n_seeds), -np.inf)
                fail = np.full((n_rows, n_seeds), np.inf)
                over = np.zeros((n_rows, n_seeds), bool)
            keep_fail = fail.copy()
            meets, flow, relevant = _misses(rows, rates, m, slo, fail)
            if not relevant.any() or not grow():
                break
            fail = keep_fail  # the round reruns with larger buffers
        for k, (r, x) in enumerate(zip(rows, rates, strict=True)):
            curve[r].append((float(x), {b.metric: float(np.mean(m[b.metric][k])) for b in slo}))
            ok[r] = np.where(meets[k] & ~flow[k] & (x < fail[r]), np.maximum(ok[r], x), ok[r])
        for k, (r, x) in enumerate(zip(rows, rates, strict=True)):
            over[r] |= flow[k] & (x > ok[r]) & (x < fail[r])
        ok = np.where(ok >= fail, -np.inf, ok)  # a success above a miss: not monotone there, keep the miss
        done = np.isfinite(ok) & np.isfinite(fail) & (fail / np.where(ok > 0, ok, 1) - 1 <= tol)
        open_ = ~done & ~over & (np.isfinite(ok) | np.isfinite(fail))
        if on_round is not None:
            on_round(rnd + 1, int(open_.sum()))
        if not open_.any() or rnd == max_rounds - 1:
            break
        new_rows, new_rates = [], []
        for r in range(n_rows):
            sel = open_[r]
            new_rows += [r] * points
            if not sel.any():  # converged: repeat a known point so that the batch keeps its shape
                new_rates += [float(np.where(np.isfinite(ok[r]), ok[r], lo).max())] * points
                continue
            a = np.where(np.isfinite(ok[r][sel]), ok[r][sel], lo / 2).min()
            z = np.where(np.isfinite(fail[r][sel]), fail[r][sel], hi * 2).max()
            new_rates += list(np.linspace(a, z, points + 2)[1:-1])
        rows, rates = np.asarray(new_rows), np.asarray(new_rates)
    known = np.isfinite(ok) & np.isfinite(fail) & ~over
    cap = np.where(known, ok, np.nan)
    return Capacity(cap, ok, fail, over, curve, rnd + 1, evaluations, batches)


def _per_run(metrics: dict, n_configs: int) -> dict[str, np.ndarray]:
    """The scalar metrics of a grid ([C, S] each) as float64, overflow as bool."""
    out = {}
    for k, v in metrics.items():
        v = np.asarray(v)
        if v.ndim == 2 and v.shape[0] == n_configs:
            out[k] = v.astype(bool) if k == "overflow" else v.astype(np.float64)
    return out


class DispatchEvaluator(Evaluator):
    """Classic dispatch: rows are policies (CLI names), rates are loads per server. The ring that JSQ / p2c
    read doubles (up to `max_ring`) when a run below a known miss overran it."""

    def __init__(self, policies, *, servers: int, seeds: int, requests: int = 20_000, warmup: float = 0.2,
                 service: str = "exp", seed: int = 0, ring: int = 256, max_ring: int = 8192, progress: bool = False):
        self.policies = [CLI_POLICIES[p] for p in policies]
        self.servers, self.seeds, self.requests, self.service, self.seed = servers, seeds, requests, service, seed
        self.warmup, self.ring, self.max_ring, self.progress = int(warmup * requests), ring, max_ring, progress

    def __call__(self, rows, rates):
        model = DispatchModel(n_servers=self.servers, n_requests=self.requests, warmup=self.warmup, ring=self.ring,
                              max_d=2)
        params = sim.stack_params([make_params(self.policies[r], float(x), self.service)
                                   for r, x in zip(rows, rates, strict=True)])
        grid = sim.run_grid(model, jax.random.key(self.seed), None, params, self.seeds,
                            progress="capacity batch" if self.progress else False)
        return _per_run(grid.metrics, len(rows))

    def grow(self) -> bool:
        if self.ring >= self.max_ring:
            return False
        self.ring *= 2
        return True


def dispatch_evaluator(policies, **kw) -> DispatchEvaluator:
    return DispatchEvaluator(policies, **kw)


class ClusterEvaluator(Evaluator):
    """Prefix-cache replica cluster: rows are (router preset, replicas) or (preset, replicas, router settings dict,
    e.g. {"weights": {...}, "dyn_overlap_weight": 2.0}); rates in req/s.

    Routers that run on part of a cluster (`routers.prefix.PARTIAL_OK`) share one model of the largest count
    with a traced count in use (`n_active`); the others get one model per replica count. The queue, cache
    table and Preble ring start from `initial_capacities` and double when a run overflowed them."""

    def __init__(self, rows, workload, *, seeds: int, gpu: str = REPLICA_GPU, model_name: str = REPLICA_MODEL, tp: int = 1,
                 chunk: int = DEFAULT_CHUNK, max_running: int = DEFAULT_MAX_RUNNING, seed: int = 0, local: str = "fcfs", admission: str = "reserve",
                 cost_model: str = "roofline", kv_capacity: int | None = None, stale_s: float = 0.0, max_grow: int = 3,
                 progress: bool = False, latency=None):
        self.rows = [(r[0], int(r[1]), dict(r[2]) if len(r) > 2 else {}) for r in rows]
        for p, _, _ in self.rows:
            routers.REGISTRY.id(p)
        self.workload, self.seeds, self.seed, self.progress, self.grows_left = workload, seeds, seed, progress, max_grow
        self.overflowed_grids: list[dict] = []  # grids of this round that filled a capacity
        self.kw = dict(gpu=gpu, model=model_name, tp=tp, cost_model=cost_model, kv_capacity=kv_capacity, stale_s=stale_s,
                       latency=latency)
        self.static = dict(chunk=chunk, max_running=max_running, local_order=local, admission=admission,
                           stale_view=stale_s > 0)
        self.group = ["partial" if p in routers.PARTIAL_OK else k for p, k, _ in self.rows]
        self.groups: dict = {}
        for g in dict.fromkeys(self.group):
            members = [i for i, x in enumerate(self.group) if x == g]
            size = max(self.rows[i][1] for i in members) if g == "partial" else g
            probe = [self.params(i, 1.0) for i in members]
            caps = initial_capacities(workload, probe, size)
            caps["max_queue"] = workload.n_requests
            self.groups[g] = {"size": size, "caps": caps, "full": set(),
                              "policies": tuple(sorted({self.rows[i][0] for i in members}))}

    def params(self, row: int, rate: float) -> replicas.ReplicaParams:
        p, k, kw = self.rows[row]
        return replicas.make_params(p, rate=float(rate), n_active=k if self.group[row] == "partial" else None,
                                    **self.kw, **kw)

    def __call__(self, idx, rates):
        idx = np.asarray(idx)
        parts, keys = [], None
        for g, info in self.groups.items():
            sel = np.flatnonzero([self.group[i] == g for i in idx])
            if not len(sel):
                continue
            caps = info["caps"]
            model = replicas.ReplicaModel(n_replicas=info["size"], max_queue=caps["max_queue"],
                                          cache_slots=caps["cache_slots"], router_window=caps["router_window"],
                                          router_policies=info["policies"],
                                          **self.static)
            params = sim.stack_params([self.params(int(idx[k]), rates[k]) for k in sel])
            grid = sim.run_grid(model, jax.random.key(self.seed), self.workload, params, self.seeds, chunk=2000,
                                progress="capacity batch" if self.progress else False)
            m = _per_run(grid.metrics, len(sel))
            info["full"] = {name for name, flag in CAPACITY_FLAGS.items() if caps[name] > 0 and np.any(m.get(flag, False))}
            if info["full"]:
                self.overflowed_grids.append(grid.metrics)  # superseded if `grow` reruns them
            parts.append((sel, m))
            keys = set(m) if keys is None else keys & set(m)
        out = {k: np.zeros((len(idx), self.seeds), bool if k == "overflow" else np.float64) for k in keys}
        for sel, m in parts:
            for k in keys:
                out[k][sel] = m[k]
        return out

    def grow(self) -> bool:
        full = [(info, name) for info in self.groups.values() for name in info["full"]]
        if not full or self.grows_left <= 0:
            return False
        self.grows_left -= 1
        for info, name in full:
            info["caps"][name] *= 2
        for metrics in self.overflowed_grids:
            sim.discard_grid(metrics)
        self.overflowed_grids.clear()
        return True


def cluster_evaluator(rows, workload, **kw) -> ClusterEvaluator:
    return ClusterEvaluator(rows, workload, **kw)


class PDEvaluator(Evaluator):
    """Prefill/decode disaggregation (`experiments.pd`): rows are `PDRow`s, rates in req/s. Metrics are
    `pd.request_metrics`' (TTFT / TPOT percentiles, goodput and SLO attainment at the per-request
    thresholds slo_ttft / slo_tpot). The DP decode tier's step budget grows inside `run_disaggregated`."""

    def __init__(self, rows, workload, *, seeds: int, dep, slo_ttft: float, slo_tpot: float, seed: int = 0,
                 progress: bool = False):
        pd.check_rows(rows, dep.decode_tier, dep)
        pd.check_slos(slo_ttft, slo_tpot)
        self.rows, self.workload, self.seeds, self.dep, self.seed, self.progress = rows, workload, seeds, dep, seed, progress
        self.slo_ttft, self.slo_tpot = slo_ttft, slo_tpot

    def __call__(self, idx, rates):
        idx = np.asarray(idx)
        out: dict[str, np.ndarray] = {}
        for colocated in (False, True):
            sel = np.flatnonzero([self.rows[i].colocated == colocated for i in idx])
            if not len(sel):
                continue
            sub = [self.rows[int(idx[k])] for k in sel]
            run = pd.run_colocated if colocated else pd.run_disaggregated
            raw = run(sub, self.workload, rate=[float(rates[k]) for k in sel], seeds=self.seeds, dep=self.dep,
                      seed=self.seed, progress=self.progress, allow_overflow=True)
            for c, k in enumerate(sel):
                for s in range(self.seeds):
                    m = pd.request_metrics(raw, c, s, self.slo_ttft, self.slo_tpot, colocated)
                    for name, v in m.items():
                        out.setdefault(name, np.zeros((len(idx), self.seeds), bool if name == "overflow" else np.float64))
                        out[name][k, s] = v
        return out


class DecodeEvaluator(Evaluator):
    """Decode DP ranks behind a barrier (`clusters.dp_decode`) under Poisson arrivals: rows are (policy, ranks in
    use), traced (`n_active`) under one model of the largest count; rates in req/s. The step budget is set for
    the lowest rate of the first round and doubles when a run did not finish (the search can go down to lo / 2)."""

    def __init__(self, rows, requests, *, seeds: int, dep=None, lo_rate: float, seed: int = 0, max_grow: int = 3,
                 progress: bool = False):
        dep = dep or DECODE
        self.rows = [(p, int(k)) for p, k in rows]
        self.g_max = max(k for _, k in self.rows)
        if dep.parallel != "independent" and len({k for _, k in self.rows}) > 1:
            raise JaxrouteError(f"the {dep.parallel} cost model depends on the rank count: search one count at a time")
        for p, k in self.rows:
            dd.make_params(p, n_workers=self.g_max, n_active=k, arrival="poisson", rate=1.0)  # refuses bad rows early
        cost = cost_models.cost_params(dep.gpu, dep.model, dep.tp, parallel=dep.parallel, dp_ranks=self.g_max)
        self.kv_cap = cost_models.kv_capacity_tokens(dep.gpu, dep.model, dep.tp, parallel=dep.parallel,
                                                     dp_ranks=self.g_max)
        self.wl = dd.make_workload(requests, cost, dep.collective_s, ())
        min_step = float(cost_models.decode_step_time(cost, 1.0, 1.0)) + dep.collective_s
        self.budget = dd.step_budget(requests, min(k for _, k in self.rows), dep.slots, dep.r_max, "poisson",
                                     rate=lo_rate, min_step_s=min_step)
        self.n, self.dep, self.seeds, self.seed, self.progress, self.max_grow = len(requests), dep, seeds, seed, progress, max_grow

    def __call__(self, idx, rates):
        dep = self.dep
        params = sim.stack_params([dd.make_params(self.rows[r][0], n_workers=self.g_max, n_active=self.rows[r][1],
                                                  arrival="poisson", rate=float(x)) for r, x in zip(idx, rates, strict=True)])

        def run(caps):
            model = dd.DecodeModel(n_workers=self.g_max, n_requests=self.n, max_steps=caps["max_steps"], slots=dep.slots,
                                   pool=dep.pool, window=dep.window, horizon=dep.horizon, r_max=dep.r_max,
                                   kv_capacity=self.kv_cap, block_size=dep.block_size, preempt=dep.preempt,
                                   cap_immediate=dep.cap_immediate)
            return sim.run_grid(model, jax.random.key(self.seed), self.wl, params, self.seeds,
                                chunk=max(1, caps["max_steps"] // 10),
                                progress="capacity batch" if self.progress else False)

        grid, caps = run_with_retry(run, {"max_steps": self.budget}, {"max_steps": "overflow_steps"},
                                    max_tries=self.max_grow + 1)
        self.budget = caps["max_steps"]  # the next batch starts from the budget that sufficed
        return _per_run(grid.metrics, len(idx))


def min_replicas(capacity: Capacity, rows, rate: float) -> dict[str, int | None]:
    """Per router: the fewest replicas whose capacity (mean over seeds, every seed known) reaches `rate`."""
    out: dict[str, int | None] = {}
    for row, c in zip(rows, capacity.capacity, strict=True):
        policy, k = row[0], row[1]
        enough = bool(np.all(np.isfinite(c)) and np.mean(c) >= rate)
        if enough and (out.get(policy) is None or k < out[policy]):
            out[policy] = k
        out.setdefault(policy, None)
    return out
