"""Offline accuracy of horizon predictors, as the paper measures it.

- Stage 1, `auc`: ROC AUC of p_fin for the event "ends within the next H steps"
  (remaining <= H), over (request, step) query pairs.
- Stage 2, `mae`: mean |mu_rem - remaining| over the pairs that do end within H.
- `c_mae`: mean |c - min(remaining, H)| over all pairs, where c = (1 - p_fin) H +
  p_fin mu_rem is the horizon contribution BR-H actually consumes (an extra view:
  it weighs both stages the way the router does).

Both on host with NumPy (evaluation is not in a hot loop).
"""

from __future__ import annotations

import numpy as np

from jaxroute.errors import JaxrouteError

# The paper's offline accuracy (BalanceRoute write-up, section 12): (Stage-1 AUC, Stage-2 MAE).
PAPER = {
    ("azure", "survival"): (0.993, 5.4),
    ("azure", "exact"): (0.995, 5.4),
    ("production", "survival"): (0.700, 20.1),
    ("production", "exact"): (0.974, 2.9),
}
PAPER_DATA = {"synthetic-azure24": "azure", "azure-conv": "azure", "synthetic-prod": "production"}


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC = P(score of a random positive > score of a random negative), ties counting 1/2.

    Computed from average ranks (Mann-Whitney U). NaN when one class is absent.
    """
    scores = np.asarray(scores, np.float64)
    labels = np.asarray(labels).astype(bool)
    if scores.shape != labels.shape:
        raise JaxrouteError("auc needs one label per score")
    n_pos = int(labels.sum())
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s), np.float64)
    # average rank (1-based) within each run of tied scores
    starts = np.concatenate([[0], np.nonzero(np.diff(s))[0] + 1])
    ends = np.concatenate([starts[1:], [len(s)]])
    avg = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    u = ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def mae(pred: np.ndarray, target: np.ndarray, mask: np.ndarray | None = None) -> float:
    """Mean absolute error over mask (NaN when the mask is empty)."""
    pred = np.asarray(pred, np.float64)
    target = np.asarray(target, np.float64)
    mask = np.ones(pred.shape, bool) if mask is None else np.asarray(mask, bool)
    if not mask.any():
        return float("nan")
    return float(np.mean(np.abs(pred[mask] - target[mask])))


def horizon_scores(p_fin: np.ndarray, mu_rem: np.ndarray, remaining: np.ndarray, horizon: int) -> dict[str, float]:
    """{'auc', 'mae', 'c_mae'} of one predictor's outputs against the true remaining steps."""
    remaining = np.asarray(remaining)
    ends = remaining <= horizon
    p = np.asarray(p_fin, np.float64)
    c = (1.0 - p) * horizon + p * np.asarray(mu_rem, np.float64)
    return {"auc": auc(p, ends), "mae": mae(mu_rem, remaining, ends), "c_mae": mae(c, np.minimum(remaining, horizon))}
