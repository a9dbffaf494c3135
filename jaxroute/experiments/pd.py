"""Prefill/decode disaggregation experiments: rows of (prefill router, decode router, P:D) and colocated rows.

`run_pd` runs every disaggregated row in three compiled grids (prefill tier, KV handoff, decode tier;
`clusters/disagg.py`) and the colocated rows (the same GPUs as one replica cluster, no disaggregation)
in one more, then computes the per-request metrics on the host (`request_metrics`), so SLOs can be
changed without rerunning. Seed s is the same workload realisation in every row (common random numbers).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute import cost_models, report, sim
from jaxroute.clusters import disagg, replicas
from jaxroute.clusters import dp_decode as dd
from jaxroute.deployment import PD, Deployment
from jaxroute.errors import JaxrouteError
from jaxroute.experiments.cluster import build_workload, initial_capacities
from jaxroute.experiments.comparison import Results, Row, run_with_retry
from jaxroute.experiments.names import (  # noqa: F401  (pd.DEFAULT_*, pd.parse_ratios, ...: the command line's)
    DECODE_TIERS,
    DEFAULT_LINK_GBPS,
    DEFAULT_LINK_LATENCY_MS,
    DEFAULT_SLO_TPOT_S,
    DEFAULT_SLO_TTFT_S,
    LENGTH_WORKLOADS,
    decode_routers,
    parse_ratios,
)
from jaxroute.routers import prefix as prefix_routers
from jaxroute.workloads import prefix as wl_prefix

# The KV link and SLO defaults (DEFAULT_LINK_GBPS: one ConnectX-7 NIC per GPU, ...) are in experiments/names.py.
METRICS = ("goodput_rps", "slo_attainment", "ttft_mean_s", "ttft_p90_s", "ttft_p99_s", "tpot_mean_s", "tpot_p90_s",
           "tpot_p95_s", "e2e_mean_s", "e2e_p99_s", "output_tokens_per_s", "prefill_queue_s", "prefill_s",
           "link_queue_s", "transfer_s", "decode_wait_s", "prefill_hit_rate", "util_prefill", "util_decode",
           "util_link", "decode_imbalance_tokens", "decode_running_per_group", "decode_slots_in_use",
           "decode_kv_share", "disagg_fraction", "completed")


@dataclasses.dataclass(frozen=True)
class PDRow:
    """One configuration. colocated: the same n_prefill + n_decode groups as one cluster, routed by prefill_router."""

    prefill_router: str
    decode_router: str
    n_prefill: int
    n_decode: int
    threshold: float = 0.0  # P/D decider: disaggregate when the uncached prompt >= threshold tokens (0 = always)
    colocated: bool = False
    # cost-model terms of this row replacing the deployment's: ("prefill.<CostParams field>" or "decode.<field>",
    # value), e.g. a calibration's (`calibrate.py`); traced, so rows that differ only here share a compilation
    cost_terms: tuple[tuple[str, float], ...] = ()
    predictor: int | None = None  # BR-H's predictor kind id (its table in the deployment's bank); None: the deployment's
    gamma: float = dd.DEFAULT_GAMMA  # BR-H's discount (DP decode tier)

    @property
    def label(self) -> str:
        if self.colocated:
            return f"colocated[{self.n_prefill + self.n_decode}] {self.prefill_router}"
        pd = f"{self.n_prefill}:{self.n_decode}"
        th = f" th={self.threshold:g}" if self.threshold > 0 else ""
        kind = ""
        if self.predictor is not None:
            from jaxroute.predictors.base import kind_names

            kind = f"[{kind_names()[self.predictor]}]"
        g = f" gamma={self.gamma:g}" if self.gamma != dd.DEFAULT_GAMMA else ""
        return f"{pd} {self.prefill_router} > {self.decode_router}{kind}{th}{g}"




def _check_partial(router: str, size: int, tier_size: int, what: str) -> None:
    if size < tier_size and router not in prefix_routers.PARTIAL_OK:
        raise JaxrouteError(f"{what} router '{router}' cannot run on {size} of {tier_size} replicas (a traced count); "
                            f"run its P:D ratios one at a time, or choose from: {', '.join(prefix_routers.PARTIAL_OK)}")


def check_rows(rows: list[PDRow], decode_tier: str = "dp", dep: Deployment | None = None) -> None:
    """Refuse unknown routers and replica routers that cannot run on part of their tier, and row sets the
    deployment cannot hold, before anything runs."""
    if not rows:
        raise JaxrouteError("no rows to run")
    _check_terms(rows)
    if dep is not None:
        _check_deployment(rows, dep)
    allowed = decode_routers(decode_tier)
    dis = [r for r in rows if not r.colocated]
    p_max = max((r.n_prefill for r in dis), default=0)
    d_max = max((r.n_decode for r in dis), default=0)
    g_max = max(r.n_prefill + r.n_decode for r in rows)
    for r in rows:
        prefix_routers.REGISTRY.id(r.prefill_router)
        if r.colocated:
            _check_partial(r.prefill_router, r.n_prefill + r.n_decode, g_max, "colocated")
            continue
        if r.decode_router not in allowed:
            raise JaxrouteError(f"unknown decode router '{r.decode_router}' for the {decode_tier} decode tier; "
                                f"choose from: {', '.join(allowed)}")
        _check_partial(r.prefill_router, r.n_prefill, p_max, "prefill")
        if decode_tier == "replicas":
            _check_partial(r.decode_router, r.n_decode, d_max, "decode")
        if not (math.isfinite(r.threshold) and r.threshold >= 0):
            raise JaxrouteError(f"the P/D threshold must be a finite number of tokens >= 0, got {r.threshold}")


COST_TIERS = ("prefill", "decode")


def with_terms(cost: cost_models.CostParams, row: PDRow, tier: str) -> cost_models.CostParams:
    """`cost` with the row's terms for `tier` in place of its own."""
    given = {k.split(".", 1)[1]: v for k, v in row.cost_terms if k.split(".", 1)[0] == tier}
    return dataclasses.replace(cost, **{k: jnp.asarray(v, jnp.float32) for k, v in given.items()})


def _check_terms(rows: list[PDRow]) -> None:
    fields = {f.name for f in dataclasses.fields(cost_models.CostParams)} - {"kind", "parallel", "beta", "alpha"}
    for r in rows:
        for key, value in r.cost_terms:
            tier, _, field = key.partition(".")
            if tier not in COST_TIERS or field not in fields:
                raise JaxrouteError(f"unknown cost term '{key}': expected prefill.<field> or decode.<field> of "
                                    f"CostParams ({', '.join(sorted(fields))})")
            if not (math.isfinite(value) and value >= 0):
                raise JaxrouteError(f"cost term {key} must be a finite number >= 0, got {value}")
        if r.cost_terms and r.colocated:
            raise JaxrouteError(f"row {r.label}: cost terms are per tier; a colocated row has none")


def _check_deployment(rows: list[PDRow], dep: Deployment) -> None:
    if dep.parallel not in ("independent", "dp_ep"):
        raise JaxrouteError(f"unknown decode parallel mode '{dep.parallel}'; choose from: independent, dp_ep")
    dis = {r.n_decode for r in rows if not r.colocated}
    if dep.parallel == "dp_ep":
        if dep.decode_tier != "dp":
            raise JaxrouteError("dp_ep (DP attention + expert parallelism) is a step of DP ranks: use --decode-tier dp")
        if len(dis) > 1:
            raise JaxrouteError(f"a dp_ep decode tier's KV capacity and expert spread depend on its size: run one "
                                f"decode size at a time, not {', '.join(map(str, sorted(dis)))}")
        for d in dis:
            cost_models.cost_params(dep.gpu, dep.model, dep.tp, parallel="dp_ep", dp_ranks=d)  # its own errors
    if dep.prefill_group_tp != dep.tp and any(r.colocated for r in rows):
        raise JaxrouteError(f"colocated rows run one group size; prefill groups of {dep.prefill_group_tp} and "
                            f"decode groups of {dep.tp} GPUs have none")


def _replica_model(dep: Deployment, workload, params: list[replicas.ReplicaParams],
                   max_running: int | None = None) -> replicas.ReplicaModel:
    """A tier of replicas sized so that no capacity can overflow: a local queue of every request, a cache
    table of the most segments the KV can hold, Preble's ring as `jaxroute cluster` sizes it."""
    n_replicas = max(int(p.n_active) for p in params)
    caps = initial_capacities(workload, params, n_replicas)
    names = {prefix_routers.REGISTRY.name(int(p.policy)) for p in params}
    return replicas.ReplicaModel(n_replicas=n_replicas, chunk=dep.chunk, max_running=max_running or dep.max_running,
                                 max_queue=workload.n_requests, cache_slots=caps["cache_slots"],
                                 router_window=caps["router_window"], router_policies=tuple(sorted(names)))


def _overflowed(m: dict, rows: list[PDRow], tier: str, allow: bool, n_seeds: int) -> np.ndarray:
    """[rows] bool: a row whose run overflowed a fixed capacity in some seed (an error unless `allow`)."""
    bad = np.asarray(m["overflow"]).reshape(len(rows), n_seeds, -1).any(axis=(1, 2))
    if bad.any() and not allow:
        raise JaxrouteError(f"the {tier} overflowed a fixed capacity in rows: {', '.join(r.label for r, b in zip(rows, bad, strict=True) if b)} "
                            "(pass --allow-overflow to print the table anyway)")
    return bad


def _tier_params(dep: Deployment, router: str, rate: float, n_active: int, tp: int) -> replicas.ReplicaParams:
    return replicas.make_params(router, rate=rate, gpu=dep.gpu, model=dep.model, tp=tp,
                                cost_model=dep.cost_model, n_active=n_active)


# ----------------------------------------------------------------------------- colocated rows


@dataclasses.dataclass(frozen=True)
class ColocatedStage(sim.Model):
    """The same GPUs without disaggregation: one replica cluster; metrics are its per-request records."""

    cpu_rows_together: ClassVar[int | None] = sim.CPU_ROWS_TOGETHER  # branches and loops: rows in groups

    tier: replicas.ReplicaModel

    def check_params(self, params, workload=None):
        self.tier.check_params(params, workload)

    def num_steps(self, workload):
        return self.tier.num_steps(workload)

    def init(self, key, workload, params):
        return self.tier.init(key, workload, params)

    def is_done(self, state):
        return self.tier.is_done(state)

    def step(self, state, workload, params):
        return self.tier.step(state, workload, params)

    def metrics(self, state, workload, params):
        m = self.tier.metrics(state, workload, params)
        r = state.req
        return {"arrival_s": r.arrival_s, "prompt": r.prompt_tok, "output": r.out_tok, "admit_s": state.rec_admit,
                "first_token_s": state.rec_first, "finish_s": state.rec_finish, "cached": state.rec_cached,
                "busy_s": state.busy_s,
                "overflow": m["overflow"], "conservation_error": m["conservation_error"],
                "queue_overflow": m["queue_overflow"], "cache_full": m["cache_full"]}


# ----------------------------------------------------------------------------- the run


@functools.partial(jax.jit, static_argnames="n_links")
def _transfers(ready, replica, prompt, sent, bytes_per_token, link_bps, latency, *, n_links: int):
    """Every row's KV transfers (vmapped `disagg.transfer`), one link per prefill replica."""
    one = lambda r, g, p, s: disagg.transfer(jnp.where(s, r, jnp.inf), g, p, n_links, bytes_per_token, link_bps, latency)
    return jax.vmap(one)(ready, replica, prompt, sent)


@jax.jit
def _dp_handoff(arrival, prompt, output, sent, delivered, cost, collective_s, bank, key_id):
    """Every row's decode workload (`disagg.decode_handoff`, vmapped; cost [rows]: each row's step model)."""
    one = lambda a, p, o, s, d, c, k: disagg.decode_handoff(a, p, o, s, d, collective_s, c, bank, k)
    return jax.vmap(one)(arrival, prompt, output, sent, delivered, cost, key_id)


@jax.jit
def _replica_handoff(table: wl_prefix.RequestTable, sent, delivered):
    return jax.vmap(disagg.landed_table)(table, sent, delivered)


def _decode_dp(rows, a, delivered, dep: Deployment, key, progress, max_tries):
    """Stage 3 on DP ranks behind a barrier: metrics [C*S, 1, ...]; the step budget doubles while a run is unfinished."""
    C, S, N = a["arrival_s"].shape
    flat = lambda x: np.asarray(x).reshape((C * S,) + np.shape(x)[2:])
    d_max = max(r.n_decode for r in rows)
    base = dep.cost(d_max)
    costs = jax.tree.map(lambda x: jnp.repeat(x, S, axis=0), sim.stack_params([with_terms(base, r, "decode") for r in rows]))
    wl, order = _dp_handoff(flat(a["arrival_s"]), flat(a["prompt"]), flat(a["output"]), flat(a["disagg"]), delivered,
                            costs, jnp.float32(dep.collective_s), dep.bank, flat(a["key_id"]))
    last = float(np.max(np.where(np.isfinite(np.asarray(wl.arrival_s)), np.asarray(wl.arrival_s), 0.0)))
    bound = dd.step_bound(flat(a["output"])[0], min(r.n_decode for r in rows), dep.slots, dep.r_max,
                          span_s=last)
    dec_rows = [dd.make_params(r.decode_router, n_workers=d_max, n_active=r.n_decode, arrival="trace", gamma=r.gamma,
                               predictor=dep.predictor if r.predictor is None else r.predictor) for r in rows]
    dec_flat = jax.tree.map(lambda x: jnp.repeat(x, S, axis=0), sim.stack_params(dec_rows))
    params = disagg.DecodeStageParams(decode=dec_flat, seed=jnp.tile(jnp.arange(S, dtype=jnp.int32), C), wl=wl,
                                      order=order)

    def run(caps):
        model = disagg.DecodeStage(dd.DecodeModel(
            n_workers=d_max, n_requests=N, max_steps=caps["max_steps"], slots=dep.slots, pool=dep.pool,
            window=dep.window, horizon=dep.horizon, r_max=dep.r_max, kv_capacity=dep.decode_kv_capacity(d_max),
            block_size=dep.block_size, trace_points=8))
        return sim.run_grid(model, jax.random.fold_in(key, 1), None, params, 1, chunk=2000,
                            progress="decode tier" if progress else False)

    grid, _ = run_with_retry(run, {"max_steps": bound}, {"max_steps": "overflow_steps"}, max_tries=max_tries)
    return grid.metrics


def _decode_replicas(rows, a, delivered, dep: Deployment, key, progress, workload, rates):
    """Stage 3 on independent replicas (the replica engine with landed KV): metrics [C*S, 1, ...]."""
    C, S, N = a["arrival_s"].shape
    flat = lambda x: jnp.asarray(np.asarray(x).reshape((C * S,) + np.shape(x)[2:]))
    table = wl_prefix.RequestTable(
        arrival_s=flat(a["arrival_s"]), seg_ids=flat(a["seg_ids"]), seg_tok=flat(a["seg_tok"]), out_tok=flat(a["output"]),
        out_seg=flat(a["out_seg"]), seg_len=flat(a["seg_len"]), seg_depth=flat(a["seg_depth"]), prompt_tok=flat(a["prompt"]),
        session=flat(a["session"]))
    landed, order = _replica_handoff(table, flat(a["disagg"]), delivered)
    tier = [_tier_params(dep, r.decode_router, x, r.n_decode, dep.tp) for r, x in zip(rows, rates, strict=True)]
    tier = [dataclasses.replace(t, cost=with_terms(t.cost, r, "decode")) for t, r in zip(tier, rows, strict=True)]
    model = disagg.DecodeReplicasStage(_replica_model(dep, workload, tier, max_running=dep.slots),
                                       bound=int(workload.step_bound(dep.chunk)))
    params = disagg.DecodeReplicasParams(
        tier=jax.tree.map(lambda x: jnp.repeat(x, S, axis=0), sim.stack_params(tier)),
        seed=jnp.tile(jnp.arange(S, dtype=jnp.int32), C), table=landed, order=order)
    return sim.run_grid(model, jax.random.fold_in(key, 1), None, params, 1, chunk=2000,
                        progress="decode tier" if progress else False).metrics


def predictor_bank(spec: str, train, horizon: int = dd.DEFAULT_HORIZON) -> tuple[tuple, int]:
    """(bank, kind id) for BR-H's predictor `spec` (none, oracle, survival, exact, learned:DIR); deployable ones are
    fitted on `train` (`train_lengths`: requests distinct from the simulated ones). Prefix workloads carry no
    prompt keys (there `exact` predicts as `survival` does); the lengths workloads carry their dataset's. Several
    predictors in one grid: `predictor_banks`."""
    bank, ids = predictor_banks([spec], train, horizon)
    return bank, ids[0]


def predictor_banks(specs, train, horizon: int = dd.DEFAULT_HORIZON) -> tuple[tuple, list[int]]:
    """(one bank holding every predictor of `specs`, their kind ids) for rows with their own `PDRow.predictor`."""
    from jaxroute.predictors import bank as bank_lib

    bank, _, ids = bank_lib.build_bank(list(specs), train, horizon)
    return bank, [int(i) for i in ids]


def train_lengths(name: str, requests: int, trace: str | None = None, shared_prefix: dict | None = None,
                  seed: int = 0):
    """Prompt and output lengths to fit BR-H's predictors on, distinct from the simulated requests: a trace's
    next `requests` rows, another realisation of a synthetic workload (a key no simulated seed uses), or for
    the decode workloads' lengths, numpy seed `seed` + 1."""
    from jaxroute.predictors.data import LengthData
    from jaxroute.workloads import traces

    if name in wl_prefix.TRACE_WORKLOADS:
        path = trace or wl_prefix.DEFAULT_TRACE_PATHS[name]
        t = traces.load_named(name, path)
        if len(t) < 2 * requests:
            raise JaxrouteError(f"the trace has {len(t)} requests: too few to fit a predictor on requests other than "
                                f"the {requests} simulated; use --requests {len(t) // 2} or fewer")
        prompt, out = t.prompt_tokens[requests:2 * requests], t.output_tokens[requests:2 * requests]
    elif name in LENGTH_WORKLOADS:  # the simulated draw is numpy seed 0 (`cluster.lengths_workload`)
        from jaxroute.workloads.decode import make_decode_requests

        req = make_decode_requests(name, requests, seed=seed + 1)
        return LengthData(f"{name}-train", req.prompt_tokens, req.output_tokens, req.key_id)
    else:
        wl = build_workload(name, requests, None, shared_prefix=shared_prefix)
        table = wl.realize(jax.random.fold_in(jax.random.key(seed), 0x7A11), jnp.float32(1.0))
        prompt, out = np.asarray(table.prompt_tok), np.asarray(table.out_tok)
    n = len(out)
    return LengthData(f"{name}-train", np.asarray(prompt, np.int64), np.asarray(out, np.int64), np.full(n, -1, np.int64))


def row_rates(rate, rows: list) -> list[float]:
    """One arrival rate per row: a number for all of them, or one per row (a capacity search's batch)."""
    rates = [float(rate)] * len(rows) if np.ndim(rate) == 0 else [float(x) for x in rate]
    if len(rates) != len(rows):
        raise JaxrouteError(f"{len(rates)} rates for {len(rows)} rows")
    return rates


def run_disaggregated(rows: list[PDRow], workload, *, rate, seeds: int, dep: Deployment, seed: int = 0,
                      progress: bool = False, allow_overflow: bool = False, max_tries: int = 3) -> dict[str, np.ndarray]:
    """Per-request arrays [rows, seeds, N] (and per-row scalars [rows, seeds]) of the disaggregated rows (`rate`:
    req/s, one for all rows or one per row).
    A DP decode tier's step budget is doubled (the tier rerun) while a run did not finish, up to max_tries."""
    p_max = max(r.n_prefill for r in rows)
    wl_prefix.check_fits(workload, dep.prefill_kv_capacity())
    rates = row_rates(rate, rows)
    tier = [_tier_params(dep, r.prefill_router, x, r.n_prefill, dep.prefill_group_tp) for r, x in zip(rows, rates, strict=True)]
    tier = [dataclasses.replace(t, cost=with_terms(t.cost, r, "prefill")) for t, r in zip(tier, rows, strict=True)]
    pre_model = disagg.PrefillStage(_replica_model(dep, workload, tier))
    pre_params = sim.stack_params([disagg.PrefillStageParams(p, jnp.float32(r.threshold)) for p, r in zip(tier, rows, strict=True)])
    key = jax.random.key(seed)
    a = sim.run_grid(pre_model, key, workload, pre_params, seeds, chunk=1000,
                     progress="prefill tier" if progress else False).metrics
    _overflowed(a, rows, "prefill tier", allow_overflow, seeds)
    C, S, N = a["arrival_s"].shape
    flat = lambda x: np.asarray(x).reshape((C * S,) + np.shape(x)[2:])
    cost = dep.cost(max(r.n_decode for r in rows))  # the decode side's KV bytes per device
    start, busy, delivered = _transfers(flat(a["prefill_done_s"]), flat(a["prefill_replica"]), flat(a["prompt"]),
                                        flat(a["disagg"]), cost.kv_bytes_per_token_gpu, jnp.float32(dep.link_gbps * 1e9 / 8),
                                        jnp.float32(dep.link_latency_ms * 1e-3), n_links=p_max)
    if dep.decode_tier == "dp":
        b = _decode_dp(rows, a, delivered, dep, key, progress, max_tries)
    else:
        b = _decode_replicas(rows, a, delivered, dep, key, progress, workload, rates)
    shape = lambda x: np.asarray(x).reshape((C, S) + np.shape(x)[2:])  # [C*S, 1, ...] -> [C, S, ...]
    _overflowed({"overflow": shape(b["overflow"])}, rows, "decode tier", allow_overflow, S)
    rows_cs = lambda x: np.asarray(x).reshape((C, S) + np.shape(x)[1:])  # [C*S, N] -> [C, S, N]
    return {**a, "link_start_s": rows_cs(start), "link_busy_s": rows_cs(busy), "delivered_s": rows_cs(delivered),
            **{k: shape(v) for k, v in b.items()}, "prefill_conservation_error": a["conservation_error"],
            # [C, S]: a capacity of either tier overflowed in this run (the one overflow fact the books read)
            "overflow": np.asarray(a["overflow"]).reshape(C, S) | shape(b["overflow"]).reshape(C, S),
            "n_prefill": np.array([[r.n_prefill] * S for r in rows]), "slots": np.full((C, S), dep.slots),
            "n_decode": np.array([[r.n_decode] * S for r in rows])}


def run_colocated(rows: list[PDRow], workload, *, rate, seeds: int, dep: Deployment, seed: int = 0,
                  progress: bool = False, allow_overflow: bool = False) -> dict[str, np.ndarray]:
    """Per-request records [rows, seeds, N] of the colocated rows (one replica cluster of P + D groups each)."""
    wl_prefix.check_fits(workload, dep.prefill_kv_capacity())
    tier = [_tier_params(dep, r.prefill_router, x, r.n_prefill + r.n_decode, dep.tp)
            for r, x in zip(rows, row_rates(rate, rows), strict=True)]
    model = ColocatedStage(_replica_model(dep, workload, tier))
    m = sim.run_grid(model, jax.random.key(seed), workload, sim.stack_params(tier), seeds, chunk=1000,
                     progress="colocated" if progress else False).metrics
    S = m["arrival_s"].shape[1]
    _overflowed(m, rows, "colocated cluster", allow_overflow, S)
    m["n_groups"] = np.array([[r.n_prefill + r.n_decode] * S for r in rows])
    m["slots"] = np.full(np.shape(m["n_groups"]), dep.max_running)
    return m


def _pct(x: np.ndarray, mask: np.ndarray, q: float) -> float:
    return float(np.quantile(x[mask], q)) if np.any(mask) else 0.0


def _mean(x: np.ndarray, mask: np.ndarray) -> float:
    return float(np.mean(x[mask])) if np.any(mask) else 0.0


def _concurrency(start: np.ndarray, finish: np.ndarray, done: np.ndarray, groups: float, span: float,
                 slots) -> dict[str, float]:
    """Requests running per decode group (time average from start to finish, by Little's law: request-seconds
    over group-seconds) and the share of its slots they fill."""
    running = float(np.sum((finish - start)[done])) / max(groups * span, 1e-30)
    return {"decode_running_per_group": running, "decode_slots_in_use": running / float(slots)}


def request_metrics(rec: dict[str, np.ndarray], c: int, s: int, slo_ttft: float, slo_tpot: float,
                    colocated: bool) -> dict[str, float]:
    """Metrics of one (row, seed) from its per-request records (see the module docstring)."""
    with np.errstate(invalid="ignore"):  # inf - inf of requests a stage never saw: masked out below
        return _request_metrics(rec, c, s, slo_ttft, slo_tpot, colocated)


def _request_metrics(rec, c, s, slo_ttft, slo_tpot, colocated) -> dict[str, float]:
    g = lambda k: np.asarray(rec[k][c, s], np.float64)
    arrival, out, prompt = g("arrival_s"), g("output"), g("prompt")
    first, finish = g("first_token_s"), g("finish_s")
    done = np.isfinite(finish) & (finish >= 0)
    ttft, e2e = first - arrival, finish - arrival
    tpot = np.where(out > 1, (finish - first) / np.maximum(out - 1, 1), 0.0)
    ok = done & (ttft <= slo_ttft) & (tpot <= slo_tpot)
    span = (np.max(finish[done]) - np.min(arrival)) if np.any(done) else 0.0
    per_s = (lambda x: x / span) if span > 0 else (lambda x: 0.0)
    multi = done & (out > 1)
    overflowed = bool(np.any(rec["overflow"][c, s]))  # a capacity overflowed in this run (this seed's, any tier)
    m = {"overflow": overflowed, "goodput_rps": per_s(float(np.sum(ok))), "slo_attainment": float(np.mean(ok)),
         "ttft_mean_s": _mean(ttft, done), "ttft_p90_s": _pct(ttft, done, 0.9), "ttft_p99_s": _pct(ttft, done, 0.99),
         "tpot_mean_s": _mean(tpot, multi), "tpot_p90_s": _pct(tpot, multi, 0.9), "tpot_p95_s": _pct(tpot, multi, 0.95),
         "e2e_mean_s": _mean(e2e, done), "e2e_p99_s": _pct(e2e, done, 0.99),
         "output_tokens_per_s": per_s(float(np.sum(out[done]))), "completed": float(np.sum(done)),
         # every stage's books: arrived = completed + in flight + dropped by a full capacity (prefill tier, decode
         # tier), and every request done unless a capacity overflowed (then the stages' books say where it is)
         "conservation_error": float(rec["conservation_error"][c, s] + (0 if overflowed else np.sum(~done))
                                     + (rec["prefill_conservation_error"][c, s] if "prefill_conservation_error" in rec else 0))}
    if colocated:
        admit = g("admit_s")
        groups = float(rec["n_groups"][c, s])
        util = float(np.sum(g("busy_s"))) / max(groups * span, 1e-30)
        m.update(prefill_queue_s=_mean(admit - arrival, done), prefill_s=_mean(first - admit, done), link_queue_s=0.0,
                 transfer_s=0.0, decode_wait_s=0.0, prefill_hit_rate=float(np.sum(g("cached")[done]) / max(np.sum(prompt[done]), 1)),
                 util_prefill=util, util_decode=util, util_link=0.0, decode_imbalance_tokens=0.0, disagg_fraction=0.0,
                 decode_kv_share=0.0)
        m.update(_concurrency(admit, finish, done, groups, span, rec["slots"][c, s]))
        return m
    dis = g("disagg").astype(bool) & done
    n_p, n_d = float(rec["n_prefill"][c, s]), float(rec["n_decode"][c, s])
    admit, ready, start, delivered = g("prefill_admit_s"), g("prefill_done_s"), g("link_start_s"), g("delivered_s")
    landed = np.where(g("disagg").astype(bool), delivered, arrival)
    m.update(prefill_queue_s=_mean(admit - arrival, dis), prefill_s=_mean(ready - admit, dis),
             link_queue_s=_mean(start - ready, dis), transfer_s=_mean(delivered - start, dis),
             decode_wait_s=_mean(first - landed, done),
             prefill_hit_rate=float(np.sum(g("prefill_cached")[dis]) / max(np.sum(prompt[dis]), 1)),
             util_prefill=float(np.sum(g("prefill_busy_s"))) / max(n_p * span, 1e-30),
             util_decode=float(np.sum(g("decode_busy_s"))) / max(n_d * span, 1e-30),
             util_link=float(np.sum(g("link_busy_s")[dis])) / max(n_p * span, 1e-30),
             decode_imbalance_tokens=float(rec["imbalance_tokens"][c, s]), disagg_fraction=float(np.mean(dis)),
             decode_kv_share=float(rec["kv_share_of_step"][c, s]) if "kv_share_of_step" in rec else 0.0)
    m.update(_concurrency(g("decode_admit_s"), finish, done, n_d, span, rec["slots"][c, s]))
    return m


def run_pd(rows: list[PDRow], workload, *, rate: float, seeds: int, dep: Deployment = PD,
           slo_ttft: float = DEFAULT_SLO_TTFT_S, slo_tpot: float = DEFAULT_SLO_TPOT_S, seed: int = 0,
           progress: bool = False, allow_overflow: bool = False) -> tuple[Results, dict[str, dict[str, np.ndarray]]]:
    """Every row on the same seeds: (Results with a record per row, the raw per-request records by kind)."""
    check_rows(rows, dep.decode_tier, dep)
    check_slos(slo_ttft, slo_tpot)
    raw = {}
    for kind, sub in _by_kind(rows).items():
        run = run_colocated if kind == "colocated" else run_disaggregated
        raw[kind] = run(sub, workload, rate=rate, seeds=seeds, dep=dep, seed=seed, progress=progress,
                        allow_overflow=allow_overflow)
    info = dict(rate=rate, gpu=dep.gpu, model=dep.model, tp=dep.tp, decode_tier=dep.decode_tier, link_gbps=dep.link_gbps,
                link_latency_ms=dep.link_latency_ms)
    return summarize(rows, raw, seeds, slo_ttft, slo_tpot, info), raw


def check_slos(slo_ttft: float, slo_tpot: float) -> None:
    if not (slo_ttft > 0 and slo_tpot > 0):
        raise JaxrouteError(f"SLOs must be positive seconds, got ttft {slo_ttft}, tpot {slo_tpot}")


def _by_kind(rows: list[PDRow]) -> dict[str, list[PDRow]]:
    kinds = {"disaggregated": [r for r in rows if not r.colocated], "colocated": [r for r in rows if r.colocated]}
    return {k: v for k, v in kinds.items() if v}


def summarize(rows: list[PDRow], raw: dict, seeds: int, slo_ttft: float, slo_tpot: float, info: dict) -> Results:
    """Records (means, 95 % CIs over seeds) of every row from the raw per-request records, under these SLOs
    (the SLOs enter only here: other SLOs need no rerun)."""
    check_slos(slo_ttft, slo_tpot)
    per_row = {}
    for kind, sub in _by_kind(rows).items():
        rec = raw[kind]
        for c, r in enumerate(sub):
            ms = [request_metrics(rec, c, s, slo_ttft, slo_tpot, kind == "colocated") for s in range(seeds)]
            per_row[r] = {k: np.array([m[k] for m in ms]) for k in (*METRICS, "overflow", "conservation_error")}
    grid = sim.GridResult(metrics={k: np.stack([per_row[r][k] for r in rows]) for k in (*METRICS, "overflow",
                                                                                          "conservation_error")},
                          n_configs=len(rows), n_seeds=seeds)
    infos = [dict(dataclasses.asdict(r), slo_ttft_s=slo_ttft, slo_tpot_s=slo_tpot, **info) for r in rows]
    records = report.records_from_grid(grid, [(r.label, i) for r, i in zip(rows, infos, strict=True)], METRICS)
    return Results([Row(r.label, None, i) for r, i in zip(rows, infos, strict=True)], grid, records, None)


def rows_for(prefill_routers, decode_routers, ratios, *, thresholds=(0.0,), colocated: bool = False) -> list[PDRow]:
    """Every (prefill router, decode router, P:D, threshold) combination, then a colocated row per prefill router
    and distinct group count when asked."""
    rows = [PDRow(p, d, a, b, th) for p in prefill_routers for d in decode_routers for a, b in ratios for th in thresholds]
    if colocated:
        for total in sorted({a + b for a, b in ratios}):
            rows += [PDRow(p, "-", total, 0, colocated=True) for p in prefill_routers]
    return rows


def ratio_plot(results: Results, rows: list[PDRow], path, title: str) -> None:
    """Goodput, TTFT p90 and TPOT p90 against the P:D ratio (one line per router pair, 95 % CI bands);
    colocated rows as dashed horizontal lines."""
    panels = {"goodput (requests/s within both SLOs)": "goodput_rps", "TTFT p90 (s)": "ttft_p90_s",
              "TPOT p90 (s)": "tpot_p90_s"}
    out: dict[str, list[dict]] = {name: [] for name in panels}
    dis = [r for r in rows if not r.colocated]
    ratios = sorted({(r.n_prefill, r.n_decode) for r in dis})
    xs = list(range(len(ratios)))
    decoders = list(dict.fromkeys(r.decode_router for r in dis))
    for name, metric in panels.items():
        for key in dict.fromkeys((r.prefill_router, r.decode_router, r.threshold) for r in dis):
            pts = [(ratios.index((r.n_prefill, r.n_decode)), results.record(r.label).metrics[metric]) for r in dis
                   if (r.prefill_router, r.decode_router, r.threshold) == key]
            pts.sort(key=lambda p: p[0])
            th = f" th={key[2]:g}" if key[2] > 0 else ""
            # one marker per decode router, smaller each time, so that lines lying on each other all show
            k = decoders.index(key[1])
            out[name].append(dict(x=[p[0] for p in pts], **report.ci_band([p[1] for p in pts], log=metric == "ttft_p90_s"),
                                  marker="osx^"[k % 4], ms=7 - 2 * min(k, 2), label=f"{key[0]} > {key[1]}{th}"))
        for r in (r for r in rows if r.colocated):
            s = results.record(r.label).metrics[metric]
            out[name].append(dict(x=[xs[0], xs[-1]] if xs else [0, 1], y=[s.mean, s.mean], ls="--", label=r.label))
    report.line_plot(out, path, xlabel="prefill:decode groups", title=title,
                     ylabel={"goodput (requests/s within both SLOs)": "goodput (requests/s)",
                             "TTFT p90 (s)": "TTFT p90 (s, log)", "TPOT p90 (s)": "TPOT p90 (s)"},
                     xticks=(xs, [f"{a}:{b}" for a, b in ratios]), ylog=("TTFT p90 (s)",))


CACHE_DP_METRICS = ("tpot_p95_s", "tpot_mean_s", "hit_rate", "prefill_tokens", "imbalance_tokens",
                    "throughput_tok_s", "makespan_s", "cache_evictions")


def run_cache_aware_dp(workload, policies, *, ranks: int, rate: float, seeds: int, dep: Deployment = PD,
                       cache_tokens: int | None = None, cache_weight: float = 1.0, seed: int = 0,
                       arrival: str = "poisson", progress: bool = False) -> Results:
    """Decode DP ranks with colocated prefill and a prefix cache each (SGLang DP attention): every request is
    prefilled by the rank it is bound to, only its uncached part. Policies: decode policies (br0, br_cache =
    BR-0 minus cache_weight x the missed prefill tokens, cache = most cached prefix, jsq, ...), one grid.
    cache_tokens: per-rank cache budget (default: a quarter of the rank's KV). arrival: poisson at `rate`, or
    saturated (every request waiting at t = 0, in a per-seed order)."""
    from jaxroute.experiments.comparison import Comparison

    table = workload.realize(jax.random.key(seed), jnp.float32(rate))
    wl = dd.make_prefix_workload(table, dep.cost(ranks), collective_s=dep.collective_s)
    kv = dep.decode_kv_capacity(ranks)
    n = int(table.prompt_tok.shape[0])
    span = 0.0 if arrival == "saturated" else n / max(rate, 1e-9) * 1.5  # dp_decode.step_budget's Poisson span
    bound = dd.step_bound(np.asarray(table.out_tok), ranks, dep.slots, dep.r_max, span_s=span)
    model = dd.DecodeModel(n_workers=ranks, n_requests=n, max_steps=bound, slots=dep.slots, pool=dep.pool,
                           window=dep.window, horizon=dep.horizon, r_max=dep.r_max,
                           kv_capacity=kv, block_size=dep.block_size, trace_points=8,
                           prefix_cache_tokens=int(cache_tokens if cache_tokens is not None else kv // 4))
    rows = [(p, dd.make_params(p, n_workers=ranks, arrival=arrival, rate=rate, cache_weight=cache_weight),
             {"policy": p, "ranks": ranks, "rate": rate, "arrival": arrival, "cache_tokens": model.prefix_cache_tokens,
              "cache_weight": cache_weight}) for p in policies]
    return Comparison(model, rows, seeds, CACHE_DP_METRICS, workload=wl, seed=seed, chunk=2000,
                      progress="cache-aware DP" if progress else False).run()
