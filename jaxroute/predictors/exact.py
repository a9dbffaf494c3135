"""Exact-match predictor: an empirical output-length law per prompt key, survival on a miss.

For each prompt key seen in training (a template id, a hash of a prompt prefix) the
table keeps up to `max_samples` of its most recent training output lengths. A request
of that key at age j uses the samples still alive at j:

    p_fin  = #(j < L <= j+H) / #(L > j)
    mu_rem = mean(L - j  over j < L <= j+H)

It falls back to the survival table when the key is unknown (-1), was never seen in
training, or has fewer than `min_samples` samples alive at age j (mu_rem also falls
back when no alive sample ends within H). Keys are looked up by binary search in a
sorted key array, so everything is fixed-shape and jittable.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute.errors import JaxrouteError
from jaxroute.predictors.base import RequestFeatures
from jaxroute.predictors.survival import SurvivalTable, predict_survival

MAX_SAMPLES = 64  # most recent training samples kept per key
MIN_SAMPLES = 4  # alive samples needed at age j to trust a key's own law
_NO_KEY = np.iinfo(np.int32).max  # padding for an empty key table (never matches a real key)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ExactTable:
    keys: jax.Array  # [K] int32, sorted prompt keys seen in training
    lengths: jax.Array  # [K, M] int32, training output lengths per key, 0 = empty slot
    min_samples: jax.Array  # [] int32, alive samples needed to use a key's own law
    fallback: SurvivalTable  # used on a miss


def fit_exact(lengths: np.ndarray, keys: np.ndarray, fallback: SurvivalTable,
              max_samples: int = MAX_SAMPLES, min_samples: int = MIN_SAMPLES) -> ExactTable:
    """Group training output lengths by key (keys < 0 are unknown and ignored), keep the most recent."""
    lengths = np.asarray(lengths, np.int64)
    keys = np.asarray(keys, np.int64)
    if lengths.shape != keys.shape:
        raise JaxrouteError("exact-match fit needs one key per output length")
    if max_samples < 1 or min_samples < 1:
        raise JaxrouteError("exact-match max_samples and min_samples must be >= 1")
    known = keys >= 0
    if np.any(keys[known] > _NO_KEY - 1):
        raise JaxrouteError("prompt keys must fit in 31 bits")
    uniq, inverse = np.unique(keys[known], return_inverse=True)
    if len(uniq) == 0:  # no keys in this workload: a one-slot table that never matches
        return ExactTable(jnp.full((1,), _NO_KEY, jnp.int32), jnp.zeros((1, 1), jnp.int32),
                          jnp.asarray(min_samples, jnp.int32), fallback)
    per_key = np.bincount(inverse, minlength=len(uniq))
    m = int(min(per_key.max(), max_samples))
    table = np.zeros((len(uniq), m), np.int32)
    fill = np.zeros(len(uniq), np.int64)
    # Walk newest to oldest so each key keeps its most recent samples.
    for k, L in zip(inverse[::-1], lengths[known][::-1], strict=True):
        if fill[k] < m:
            table[k, fill[k]] = min(L, _NO_KEY)
            fill[k] += 1
    return ExactTable(jnp.asarray(uniq, jnp.int32), jnp.asarray(table), jnp.asarray(min_samples, jnp.int32),
                      fallback)


def predict_exact(table: ExactTable, feats: RequestFeatures, horizon: int) -> tuple[jax.Array, jax.Array]:
    key = feats.key_id.astype(jnp.int32)
    idx = jnp.clip(jnp.searchsorted(table.keys, key), 0, table.keys.shape[0] - 1)
    hit = (key >= 0) & (table.keys[idx] == key)
    L = table.lengths[idx]  # [N, M]
    j = feats.generated[:, None]
    alive = (L > j) & (L > 0)
    ends = alive & (L <= j + horizon)
    n_alive = jnp.sum(alive, axis=1)
    n_ends = jnp.sum(ends, axis=1)
    p_own = n_ends / jnp.maximum(n_alive, 1)
    mu_own = jnp.sum(jnp.where(ends, L - j, 0), axis=1) / jnp.maximum(n_ends, 1)
    p_surv, mu_surv = predict_survival(table.fallback, feats, horizon)
    use = hit & (n_alive >= table.min_samples)
    p = jnp.where(use, p_own, p_surv)
    mu = jnp.where(use & (n_ends > 0), mu_own, mu_surv)
    return p, mu
