"""Horizon-predictor interface for BR-H.

A predictor is a pure batched function of per-request features returning
(p_fin, mu_rem): the probability that each active request ends within the next H
steps, and its expected remaining steps given that it does. Deployable
predictors (survival, exact-match, learned) carry fitted fixed-shape tables in a
`bank` (a tuple of pytrees, one per registered kind) so that several predictors
are compared in ONE compilation: the predictor id is traced and selected with
`lax.switch`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class RequestFeatures:
    """What a predictor may see about each active request (fixed size N, masked by the caller)."""

    prompt_len: jax.Array  # [N] int32, prompt tokens
    generated: jax.Array  # [N] int32, tokens generated so far (j)
    key_id: jax.Array  # [N] int32, prompt key (template id / hashed prefix), -1 when unknown
    remaining: jax.Array  # [N] int32, true remaining steps: read ONLY by the oracle


PredictFn = Callable[[PyTree, RequestFeatures, int], tuple[jax.Array, jax.Array]]


@dataclasses.dataclass(frozen=True)
class PredictorKind:
    """A deployable predictor: its name and its pure predict(table, features, horizon)."""

    name: str
    predict: PredictFn


def predict_none(feats: RequestFeatures, horizon: int) -> tuple[jax.Array, jax.Array]:
    """No prediction: nothing ends within H, so every request contributes H."""
    zeros = jnp.zeros(feats.generated.shape, jnp.float32)
    return zeros, zeros


def predict_oracle(feats: RequestFeatures, horizon: int) -> tuple[jax.Array, jax.Array]:
    """The true remaining length: p_fin is 0/1 and mu_rem is exact."""
    rem = feats.remaining.astype(jnp.float32)
    ends = rem <= horizon
    return ends.astype(jnp.float32), jnp.where(ends, rem, 0.0)


BUILTIN = ("none", "oracle")
_DEPLOYABLE: list[PredictorKind] = []


def register(kind: PredictorKind) -> None:
    """Register a deployable predictor kind (idempotent by name)."""
    if kind.name in BUILTIN or any(k.name == kind.name for k in _DEPLOYABLE):
        return
    _DEPLOYABLE.append(kind)


def kind_names() -> tuple[str, ...]:
    """All predictor names in switch order: none, oracle, then registered kinds."""
    return BUILTIN + tuple(k.name for k in _DEPLOYABLE)


def kind_id(name: str) -> int:
    names = kind_names()
    if name not in names:
        from jaxroute.errors import JaxrouteError

        raise JaxrouteError(f"unknown predictor '{name}'; choose from: {', '.join(names)}")
    return names.index(name)


def predict(bank: tuple, kind: jax.Array, feats: RequestFeatures, horizon: int) -> tuple[jax.Array, jax.Array]:
    """(p_fin [N], mu_rem [N]) from the predictor with traced id `kind`.

    bank[i] is the fitted table of the i-th registered deployable kind.
    """
    branches = [lambda b, f: predict_none(f, horizon), lambda b, f: predict_oracle(f, horizon)]
    for i, k in enumerate(_DEPLOYABLE[: len(bank)]):
        branches.append(lambda b, f, i=i, k=k: k.predict(b[i], f, horizon))
    p, mu = jax.lax.switch(kind, branches, bank, feats)
    return p.astype(jnp.float32), mu.astype(jnp.float32)


def expected_contribution(p_fin: jax.Array, mu_rem: jax.Array, horizon: int) -> jax.Array:
    """BR-H's predicted per-request horizon contribution c = (1 - p_fin) * H + p_fin * mu_rem."""
    return (1.0 - p_fin) * horizon + p_fin * mu_rem
