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
import numpy as np

from jaxroute.errors import JaxrouteError
from jaxroute.registry import PolicyRegistry

PyTree = Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
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
    """The id of a registered predictor (JaxrouteError naming the choices when unknown)."""
    return registry().id(name)


def registry(bank: tuple | None = None) -> PolicyRegistry:
    """The predictors a bank can run, in switch order (all registered kinds when bank is None).

    bank[i] is the fitted table of the i-th deployable kind, so a bank of length k serves
    the built-ins and the first k deployable kinds.
    """
    deployable = _DEPLOYABLE if bank is None else _DEPLOYABLE[: len(bank)]
    return PolicyRegistry("predictor", BUILTIN + tuple(k.name for k in deployable), what="predictor")


def check_kind_ids(kind: Any, bank: tuple | None = None) -> None:
    """JaxrouteError when a host-side predictor id (or array of ids) names no predictor of `bank`.

    `lax.switch` clamps an out-of-range index: without this check, a `learned` id with a bank
    that lacks the learned table would silently run the last fitted predictor (`exact`).
    """
    if isinstance(kind, jax.core.Tracer):
        return
    ids = np.asarray(kind)
    if not ids.size:
        return
    every, usable = kind_names(), registry(bank).names
    for i in np.unique(ids).tolist():
        if not 0 <= i < len(every):
            raise JaxrouteError(f"predictor id {i} is out of range 0..{len(every) - 1} ({', '.join(every)})")
        if i >= len(usable):
            raise JaxrouteError(f"predictor '{every[i]}' (id {i}) has no fitted table in the predictor bank, "
                                f"which serves only: {', '.join(usable)}; build the bank with a '{every[i]}' "
                                "spec (predictors.bank.build_bank)")


def predict(bank: tuple, kind: jax.Array, feats: RequestFeatures, horizon: int) -> tuple[jax.Array, jax.Array]:
    """(p_fin [N], mu_rem [N]) from the predictor with traced id `kind`.

    bank[i] is the fitted table of the i-th registered deployable kind. A concrete `kind`
    is checked against the bank here; a traced one must be checked on the host before
    tracing (`check_kind_ids`, which `DecodeModel.check_params` calls).
    """
    check_kind_ids(kind, bank)
    branches = [lambda b, f: predict_none(f, horizon), lambda b, f: predict_oracle(f, horizon)]
    for i, k in enumerate(_DEPLOYABLE[: len(bank)]):
        branches.append(lambda b, f, i=i, k=k: k.predict(b[i], f, horizon))
    p, mu = registry(bank).switch(kind, branches, bank, feats)
    return p.astype(jnp.float32), mu.astype(jnp.float32)


def expected_contribution(p_fin: jax.Array, mu_rem: jax.Array, horizon: int) -> jax.Array:
    """BR-H's predicted per-request horizon contribution c = (1 - p_fin) * H + p_fin * mu_rem."""
    return (1.0 - p_fin) * horizon + p_fin * mu_rem
