"""Fit a simulator's free terms to measured numbers (least squares on relative residuals).

`fit(evaluate, terms, targets)` runs Levenberg-Marquardt in units of each term's `scale`, bounded below. Every
evaluation is a batch: `evaluate(points [K, T]) -> predictions [K, M]`, so a caller runs the K parameter vectors
as rows of ONE grid (traced terms, one compilation). Each iteration evaluates two batches of T + 1 points: the
point and its forward-difference neighbours (the Jacobian), then T + 1 damped steps (damping factors spread
over DAMPINGS); the best step is taken if it lowers the cost, otherwise the fit stops. The uncertainty is the
linearised one at the end: covariance = s^2 (J^T J)^+ with s^2 = |r|^2 / (M - T) (a pseudo-inverse, so
directions the targets do not constrain show as large errors and a large condition number, not a crash).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from jaxroute.errors import JaxrouteError

DAMPINGS = (1e-4, 1e-2, 1.0, 1e2, 1e4)  # Levenberg-Marquardt damping factors tried per iteration (padded/cut to T+1)
REL_STEP = 0.05  # forward-difference step, in units of a term's scale


@dataclasses.dataclass(frozen=True)
class Term:
    """One free term: its name, first guess, typical size (the fit's unit) and lower bound."""

    name: str
    start: float
    scale: float
    lower: float = 0.0


@dataclasses.dataclass
class Fit:
    """A finished fit: values with 1-sigma errors, the fitted numbers and their relative residuals."""

    names: list[str]
    values: np.ndarray  # [T]
    std: np.ndarray  # [T] 1-sigma (linearised; inf for a term that does not move the targets)
    correlation: np.ndarray  # [T, T]
    condition: float  # of J^T J in scaled units
    targets: np.ndarray  # [M]
    predicted: np.ndarray  # [M] at the fitted values
    residuals: np.ndarray  # [M] (predicted - target) / target
    cost_history: list[float]  # 0.5 |r|^2 per accepted iterate
    evaluations: int  # batches evaluated

    def rms_residual(self) -> float:
        return float(np.sqrt(np.mean(self.residuals ** 2)))

    def as_json(self) -> dict:
        return {"terms": {n: {"value": float(v), "std": float(s)} for n, v, s in zip(self.names, self.values, self.std,
                                                                                      strict=True)},
                "correlation": self.correlation.tolist(), "condition": self.condition,
                "targets": self.targets.tolist(), "predicted": self.predicted.tolist(),
                "residuals": self.residuals.tolist(), "cost_history": self.cost_history,
                "evaluations": self.evaluations}


def _check(terms: Sequence[Term], targets: np.ndarray) -> None:
    if not terms:
        raise JaxrouteError("nothing to fit: no terms")
    if targets.ndim != 1 or targets.size < len(terms):
        raise JaxrouteError(f"{targets.size} targets cannot fit {len(terms)} terms")
    if not np.all(np.isfinite(targets)) or np.any(targets == 0):
        raise JaxrouteError("targets must be finite and nonzero (residuals are relative)")
    for t in terms:
        if not (math.isfinite(t.start) and math.isfinite(t.scale) and t.scale > 0 and t.start >= t.lower):
            raise JaxrouteError(f"term {t.name}: start {t.start} must be >= its lower bound {t.lower} and its scale "
                                f"{t.scale} positive")


def fit(evaluate: Callable[[np.ndarray], np.ndarray], terms: Sequence[Term], targets, *, iterations: int = 5,
        tol: float = 1e-4, log: Callable[[str], None] | None = None) -> Fit:
    """Fit `terms` so that `evaluate` matches `targets` (see the module docstring)."""
    targets = np.asarray(targets, np.float64)
    _check(terms, targets)
    n_terms = len(terms)
    scale = np.array([t.scale for t in terms])
    lower = np.array([t.lower for t in terms])
    count = [0]

    def run(points: np.ndarray) -> np.ndarray:
        out = np.asarray(evaluate(points), np.float64)
        count[0] += 1
        if out.shape != (len(points), targets.size) or not np.all(np.isfinite(out)):
            raise JaxrouteError(f"the evaluation gave {out.shape} (expected {(len(points), targets.size)}) or "
                                "non-finite predictions")
        return out

    def jacobian(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(relative residuals at x [M], their Jacobian in scaled units [M, T])."""
        h = REL_STEP * scale
        pred = run(np.vstack([x, x + np.diag(h)]))
        r = (pred[0] - targets) / np.abs(targets)
        jac = ((pred[1:] - pred[0]) / np.abs(targets)).T / REL_STEP
        return r, jac

    x = np.array([t.start for t in terms], np.float64)
    r, jac = jacobian(x)
    history = [0.5 * float(r @ r)]
    for it in range(iterations):
        jtj, g = jac.T @ jac, jac.T @ r
        diag = np.maximum(np.diag(jtj), 1e-12)
        damp = (list(DAMPINGS) * (n_terms + 1))[: n_terms + 1]
        steps = [np.linalg.solve(jtj + lam * np.diag(diag), -g) for lam in damp]
        cand = np.maximum(x + np.array(steps) * scale, lower)
        pred = run(cand)
        res = (pred - targets) / np.abs(targets)
        costs = 0.5 * np.sum(res ** 2, axis=1)
        best = int(np.argmin(costs))
        if log:
            log(f"  fit iteration {it + 1}: cost {history[-1]:.4g} -> {costs[best]:.4g} (damping {damp[best]:g})")
        if costs[best] >= history[-1]:
            break
        improved = history[-1] - costs[best]
        x = cand[best]
        r, jac = jacobian(x)
        history.append(0.5 * float(r @ r))
        if improved <= tol * max(history[-2], 1e-30):
            break
    jtj = jac.T @ jac
    dof = targets.size - n_terms
    s2 = float(r @ r) / dof if dof > 0 else float("nan")
    cov = s2 * np.linalg.pinv(jtj)
    ev = np.linalg.eigvalsh(jtj)
    condition = float(ev[-1] / ev[0]) if ev[0] > 0 else float("inf")
    var = np.diag(cov)
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = cov / np.sqrt(np.outer(var, var))
    std = np.sqrt(np.maximum(var, 0.0)) * scale
    std[np.linalg.norm(jac, axis=0) == 0] = np.inf  # a term the targets do not move at all
    return Fit([t.name for t in terms], x, std, np.nan_to_num(corr), condition, targets,
               targets + r * np.abs(targets), r, history, count[0])
