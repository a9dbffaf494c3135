"""Tune BalanceRoute BR-H's traced weights (beta, gamma, alpha) in the decode model with CMA-ES.

The search is `tune.tune` (CMA-ES in the unit box, common seeds per generation, the defaults as member 0
of generation 0, fresh-seed re-evaluation with paired gains) with a decode evaluator: each generation is
ONE `decode.run_comparison` grid of `DecodeRow("brh", predictor, alpha, beta, gamma)` rows x seeds. alpha,
beta and gamma are traced parameters, so every generation reuses one compiled program; the horizon H is a
static shape (`Deployment.horizon`) and stays fixed.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxroute.clusters import dp_decode as dd
from jaxroute.deployment import DECODE, Deployment
from jaxroute.errors import JaxrouteError
from jaxroute.experiments import decode as dx
from jaxroute.experiments import tune as tn
from jaxroute.experiments.knobs import DECODE_KNOBS
from jaxroute.experiments.names import DECODE_OBJECTIVES, DEFAULT_DECODE_OBJECTIVE
from jaxroute.workloads.decode import DecodeRequests

POLICY = "brh"
KNOBS = DECODE_KNOBS  # beta (log range), gamma, alpha: experiments/knobs.py
KNOB_NAMES = tuple(k.name for k in KNOBS)


def knobs(workers: int) -> tuple[tn.Knob, ...]:
    """The knobs for G workers: beta's range reaches 2 G when G > 32, so the default (G) is inside it."""
    beta = KNOBS[0] if 2 * workers <= KNOBS[0].hi else dataclasses.replace(KNOBS[0], hi=2.0 * workers)
    return (beta,) + KNOBS[1:]

# objectives: metrics of the decode model, one value per (row, seed); True = maximised (experiments/names.py)
OBJECTIVES = DECODE_OBJECTIVES
DEFAULT_OBJECTIVE = DEFAULT_DECODE_OBJECTIVE


def objective(name: str) -> tn.Objective:
    """The decode objective by name (throughput_*, tokens_per_step*, util_* maximised, the others minimised)."""
    key = name.strip().lower()
    if key not in OBJECTIVES:
        raise JaxrouteError(f"unknown objective '{name}'; choose from: {', '.join(OBJECTIVES)}")
    return tn.Objective(key, OBJECTIVES[key])


@dataclasses.dataclass(frozen=True)
class DecodeSpace(tn.DefaultsSpace):
    """BR-H's knobs: values are in the order of `knobs`; the defaults are beta = G, DEFAULT_GAMMA, DEFAULT_ALPHA."""

    workers: int = 8

    @classmethod
    def of(cls, workers: int, names=None) -> DecodeSpace:  # type: ignore[override]
        if workers < 1:
            raise JaxrouteError(f"--workers must be >= 1, got {workers}")
        table = {k.name: k for k in knobs(workers)}
        if names is None:
            return cls(POLICY, tuple(table.values()), workers)
        return cls(POLICY, tn.pick_knobs(table, names, "brh"), workers)

    def defaults(self) -> dict[str, float]:
        """alpha, beta and gamma of a BR-H row (`settings`: untuned ones keep these)."""
        return {"beta": float(self.workers), "gamma": float(dd.DEFAULT_GAMMA), "alpha": float(dd.DEFAULT_ALPHA)}


@dataclasses.dataclass(frozen=True)
class DecodeSetup:
    """The decode simulation BR-H is tuned on (as `jaxroute decode` sets it up)."""

    requests: DecodeRequests
    workers: int = 8
    predictor: str = "oracle"
    dep: Deployment = DECODE
    arrival: str = "saturated"
    rate: float = 1.0
    bank: tuple = ()


def scores_of(metrics: dict, obj: tn.Objective) -> np.ndarray:
    """[C, S] objective values of a decode grid (NaN where a run overflowed)."""
    if obj.metric not in metrics or np.ndim(metrics[obj.metric]) != 2:
        names = sorted(k for k, v in metrics.items() if np.ndim(v) == 2)
        raise JaxrouteError(f"unknown objective metric '{obj.metric}'; the model reports: {', '.join(names)}")
    val = np.asarray(metrics[obj.metric], np.float64)
    over = np.asarray(metrics["overflow"], bool).reshape(val.shape[0], val.shape[1], -1).any(axis=2)
    return np.where(over, np.nan, val)


def decode_evaluator(obj: tn.Objective, setup: DecodeSetup, *, seeds: int, seed: int) -> tn.Evaluate:
    """Evaluate a list of BR-H settings ({alpha, beta, gamma}) as one run_comparison grid on common seeds."""

    def evaluate(settings: list[dict]) -> tn.Batch:
        rows = [dx.DecodeRow(POLICY, setup.predictor, s["alpha"], s["beta"], s["gamma"]) for s in settings]
        res = dx.run_comparison(setup.requests, rows, workers=setup.workers, seeds=seeds, dep=setup.dep,
                                arrival=setup.arrival, rate=setup.rate, seed=seed, bank=setup.bank)
        return tn.Batch(scores_of(res.grid.metrics, obj), len(rows) * seeds)

    return evaluate


def tune(space: DecodeSpace, obj: tn.Objective, setup: DecodeSetup, **kw) -> tn.TuneResult:
    """`tune.tune` over BR-H's weights with the decode evaluator (same keywords: population, generations, ...)."""
    if space.workers != setup.workers:
        raise JaxrouteError(f"the space is for {space.workers} workers, the setup has {setup.workers}")
    return tn.tune(space, obj, None, make_evaluator=lambda seeds, seed: decode_evaluator(obj, setup, seeds=seeds, seed=seed),
                   **kw)
