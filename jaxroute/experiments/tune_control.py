"""Tune an autoscaler's traced settings with CMA-ES for the least cost that meets an SLO.

The search is `tune.tune` (CMA-ES in the unit box, common seeds per generation, the defaults as member 0 of
generation 0, fresh-seed re-evaluation with paired gains) with a control-plane evaluator: each generation is
ONE compiled grid of (router + autoscaler) rows x seeds, the candidates differing only in traced
`ControlParams` fields, so the whole search compiles once.

Objective `cost` (minimised): GPU-hours per run, plus a penalty where the run's SLO attainment (requests with
TTFT <= slo_ttft_s and TPOT <= slo_tpot_s, shed requests missing) falls short of `min_attainment`:
shortfall x the GPU-hours of every replica slot for the whole run, so a candidate that misses the target
ranks behind any that meets it unless it misses by a hair.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxroute import sim
from jaxroute.clusters import replicas
from jaxroute.clusters.names import CONTROL_DEFAULTS, SCALER_INTERVAL_S
from jaxroute.clusters.replicas import control as ctl_lib
from jaxroute.errors import JaxrouteError
from jaxroute.experiments import control as ctl_exp
from jaxroute.experiments import tune as tn
from jaxroute.experiments.cluster import initial_capacities
from jaxroute.experiments.knobs import CONTROL_KNOBS
from jaxroute.workloads import prefix as wl_prefix


@dataclasses.dataclass(frozen=True)
class ControlSpace(tn.DefaultsSpace):
    """An autoscaler's knobs (`knobs.CONTROL_KNOBS[scaler]`); the defaults are the sources' (`control.DEFAULTS`)
    over `base` (the settings the search starts from)."""

    scaler: str = "hpa"
    base: tuple = ()  # (name, value) control settings every candidate has

    @classmethod
    def of(cls, router: str, scaler: str, base: dict, names=None) -> ControlSpace:  # type: ignore[override]
        if scaler not in CONTROL_KNOBS:
            raise JaxrouteError(f"autoscaler '{scaler}' has no tunable settings; choose from: {', '.join(CONTROL_KNOBS)}")
        table = {k.name: k for k in CONTROL_KNOBS[scaler]}
        knobs = tuple(table.values()) if names is None else tn.pick_knobs(table, names, scaler)
        return cls(f"{router}+{scaler}", knobs, scaler, tuple(sorted(base.items())))

    def defaults(self) -> dict[str, Any]:
        """The control settings (`control.make` keywords) a candidate's knobs go over."""
        interval = {"interval_s": SCALER_INTERVAL_S[self.scaler]}
        return {**CONTROL_DEFAULTS, **interval, **dict(self.base), "scaler": self.scaler}


@dataclasses.dataclass(frozen=True)
class ControlSetup:
    """The cluster an autoscaler is tuned on: `tune.Setup`'s deployment, the router and the replica slots."""

    cluster: tn.Setup
    router: str = "least_load"
    slots: int = 5
    min_attainment: float = 0.9

    def params(self, settings: dict) -> replicas.ReplicaParams:
        return self.cluster.params(self.router, {"control": ctl_lib.make(self.slots, **settings)})


def objective(min_attainment: float) -> tn.Objective:
    if not 0 < min_attainment <= 1:
        raise JaxrouteError(f"--min-attainment must be in (0, 1], got {min_attainment}")
    return tn.Objective("cost", False)


def scores_of(m: dict, setup: ControlSetup) -> np.ndarray:
    """[C, S] GPU-hours plus the shortfall penalty (NaN where a run overflowed)."""
    cost = np.asarray(m["gpu_hours"], np.float64)
    bound = setup.slots * np.asarray(m["end_s"], np.float64) * setup.cluster.tp / 3600.0
    short = np.maximum(setup.min_attainment - np.asarray(m["slo_attainment"], np.float64), 0.0)
    over = np.asarray(m["overflow"], bool).reshape(cost.shape[0], cost.shape[1], -1).any(axis=2)
    return np.where(over, np.nan, cost + short * bound)


def control_model(space: ControlSpace, setup: ControlSetup) -> replicas.ReplicaModel:
    """One model for every candidate (static sizes for the whole box)."""
    probe = [setup.params(space.settings(space.from_unit(np.full(len(space.knobs), u)))) for u in (0, 1)]
    probe.append(setup.params(space.settings(space.default_values())))
    wl = setup.cluster.workload
    wl_prefix.check_fits(wl, int(np.asarray(probe[0].kv_capacity)))
    caps = initial_capacities(wl, probe, setup.slots)
    c = setup.cluster
    return replicas.ReplicaModel(
        n_replicas=setup.slots, chunk=c.chunk, max_running=c.max_running, max_queue=wl.n_requests,
        cache_slots=caps["cache_slots"], router_policies=(setup.router,), local_order=c.local, admission=c.admission,
        control=True, **ctl_exp.sizes(wl, probe))


def control_evaluator(space: ControlSpace, setup: ControlSetup, *, seeds: int, seed: int) -> tn.Evaluate:
    import jax

    model = control_model(space, setup)
    key = jax.random.key(seed)

    def evaluate(settings: list[dict]) -> tn.Batch:
        params = sim.stack_params([setup.params(s) for s in settings])
        m = sim.run_grid(model, key, setup.cluster.workload, params, seeds).metrics
        return tn.Batch(scores_of(m, setup), len(settings) * seeds)

    return evaluate


def tune(space: ControlSpace, setup: ControlSetup, **kw) -> tn.TuneResult:
    """`tune.tune` over the autoscaler's settings (same keywords: population, generations, seeds, ...)."""
    obj = objective(setup.min_attainment)
    return tn.tune(space, obj, None, make_evaluator=lambda n, s: control_evaluator(space, setup, seeds=n, seed=s), **kw)
