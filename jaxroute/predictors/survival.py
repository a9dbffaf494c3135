"""Survival predictor: the empirical output-length law of a training split, conditioned on age.

For a request that has generated j tokens (so its length L > j):

    p_fin(j)  = P(L <= j + H | L > j)
    mu_rem(j) = E[L - j | j < L <= j + H]

Both are tabulated once on the host for j = 0 .. J-1 (J = the longest training
output, at most MAX_TABLE), so prediction is one gather and jittable. Where fewer
than `min_survivors` training requests are still alive at age j, the estimate is
too noisy (and at the tail undefined); the table then carries the last well-estimated
row forward. A request older than the table uses its last row.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute.errors import JaxrouteError
from jaxroute.predictors.base import RequestFeatures

MAX_TABLE = 1 << 16  # longest age tabulated (rows); older requests use the last row
MIN_SURVIVORS = 20  # rows with fewer surviving training requests carry the previous row forward


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SurvivalTable:
    p_fin: jax.Array  # [J] float32, P(L <= j+H | L > j) at age j
    mu_rem: jax.Array  # [J] float32, E[L - j | j < L <= j+H] at age j


def fit_survival_counts(counts: np.ndarray, horizon: int, min_survivors: float = MIN_SURVIVORS) -> SurvivalTable:
    """Tabulate from counts[L] = (possibly fractional) number of requests of length L (counts[0] unused)."""
    counts = np.asarray(counts, np.float64).copy()
    if counts.ndim != 1 or len(counts) < 2 or np.any(counts < 0) or not np.all(np.isfinite(counts)):
        raise JaxrouteError("survival fit needs a 1-D array of non-negative finite counts over lengths 0..Lmax")
    if horizon < 1:
        raise JaxrouteError(f"horizon must be >= 1, got {horizon}")
    counts[0] = 0.0
    if counts.sum() <= 0:
        raise JaxrouteError("survival fit needs at least one request with output length >= 1")
    lmax = len(counts) - 1
    lengths = np.arange(lmax + 1, dtype=np.float64)
    c = np.concatenate([[0.0], np.cumsum(counts)])  # c[x + 1] = #(L <= x)
    s = np.concatenate([[0.0], np.cumsum(counts * lengths)])
    n_rows = min(lmax, MAX_TABLE)
    j = np.arange(n_rows)
    hi = np.minimum(j + horizon, lmax)
    le_j = c[j + 1]  # #(L <= j)
    le_hi = c[hi + 1]  # #(L <= j+H)
    surv = c[-1] - le_j
    fin = le_hi - le_j
    mass = s[hi + 1] - s[j + 1]  # sum of L over j < L <= j+H
    good = surv >= min_survivors
    if not good[0]:
        raise JaxrouteError(f"survival fit needs at least {min_survivors} training requests, got {c[-1]:.0f}")
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(good, fin / np.maximum(surv, 1e-300), np.nan)
        mu = np.where(good & (fin > 0), mass / np.maximum(fin, 1e-300) - j, np.nan)
    p = _carry_forward(p)
    mu = _carry_forward(mu, fill=float(horizon))  # rows where nothing ends within H: previous row
    return SurvivalTable(jnp.asarray(p, jnp.float32), jnp.asarray(mu, jnp.float32))


def _carry_forward(x: np.ndarray, fill: float = 0.0) -> np.ndarray:
    """Replace NaNs by the last finite value before them (`fill` before the first)."""
    idx = np.where(np.isnan(x), 0, np.arange(len(x)))
    np.maximum.accumulate(idx, out=idx)
    out = x[idx]
    return np.where(np.isnan(out), fill, out)


def fit_survival(lengths: np.ndarray, horizon: int, min_survivors: float = MIN_SURVIVORS) -> SurvivalTable:
    """Tabulate from a training split's output lengths (each >= 1)."""
    lengths = np.asarray(lengths, np.int64)
    if lengths.size == 0 or lengths.min() < 1:
        raise JaxrouteError("survival fit needs output lengths >= 1")
    return fit_survival_counts(np.bincount(lengths), horizon, min_survivors)


def predict_survival(table: SurvivalTable, feats: RequestFeatures, horizon: int) -> tuple[jax.Array, jax.Array]:
    j = jnp.clip(feats.generated, 0, table.p_fin.shape[0] - 1)
    return table.p_fin[j], table.mu_rem[j]
