"""Service-time laws for the classic dispatch model, all with mean 1 (time is in mean service times).

Each law maps one uniform u in [0, 1) to a service time by its inverse CDF, so a
single uniform per request drives every law (common random numbers across laws).

| law        | definition                                             | mean | CV    |
|------------|--------------------------------------------------------|------|-------|
| exp        | Exponential(1)                                         | 1    | 1     |
| pareto     | bounded Pareto, alpha = 1.5, H / L = 1e4, L = 0.3367   | 1    | 5.72  |
| lognormal  | exp(N(mu, sigma^2)), sigma^2 = ln(1 + 3^2), mu = -sigma^2/2 | 1 | 3     |
| det        | always 1                                               | 1    | 0     |
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.scipy.special import ndtri

from jaxroute.registry import PolicyRegistry
from jaxroute.workloads.names import SERVICE_LAWS

REGISTRY = PolicyRegistry("service", SERVICE_LAWS, what="service law")
EXP, PARETO, LOGNORMAL, DET = range(4)

# Bounded Pareto on [L, H]: shape alpha, range ratio H / L; L is chosen so the mean is 1.
PARETO_ALPHA = 1.5
PARETO_RATIO = 1e4
# Lognormal with mean 1 and coefficient of variation 3.
LOGNORMAL_CV = 3.0
LOGNORMAL_SIGMA = math.sqrt(math.log(1.0 + LOGNORMAL_CV**2))
LOGNORMAL_MU = -(LOGNORMAL_SIGMA**2) / 2


def _bounded_pareto_moment(k: int, alpha: float, lo: float, hi: float) -> float:
    c = alpha * lo**alpha / (1.0 - (lo / hi) ** alpha)
    if k == alpha:
        return c * math.log(hi / lo)
    return c * (hi ** (k - alpha) - lo ** (k - alpha)) / (k - alpha)


PARETO_LOW = 1.0 / _bounded_pareto_moment(1, PARETO_ALPHA, 1.0, PARETO_RATIO)
PARETO_HIGH = PARETO_LOW * PARETO_RATIO


def law_moments(law: str) -> tuple[float, float]:
    """(mean, coefficient of variation) of a law, from its closed form."""
    if law == "exp":
        return 1.0, 1.0
    if law == "det":
        return 1.0, 0.0
    if law == "lognormal":
        return 1.0, math.sqrt(math.exp(LOGNORMAL_SIGMA**2) - 1.0)
    if law == "pareto":
        m1 = _bounded_pareto_moment(1, PARETO_ALPHA, PARETO_LOW, PARETO_HIGH)
        m2 = _bounded_pareto_moment(2, PARETO_ALPHA, PARETO_LOW, PARETO_HIGH)
        return m1, math.sqrt(m2 / m1**2 - 1.0)
    raise ValueError(f"unknown service law {law!r}")


def _pareto(u: jax.Array) -> jax.Array:
    shrink = 1.0 - (PARETO_LOW / PARETO_HIGH) ** PARETO_ALPHA
    return PARETO_LOW * (1.0 - u * shrink) ** (-1.0 / PARETO_ALPHA)


def service_time(law: jax.Array, u: jax.Array) -> jax.Array:
    """Service time (mean 1) of law id `law` (traced int) from a uniform u in [0, 1)."""
    branches = (
        lambda u: -jnp.log1p(-u),
        _pareto,
        lambda u: jnp.exp(LOGNORMAL_MU + LOGNORMAL_SIGMA * ndtri(u)),
        lambda u: jnp.ones_like(u),
    )
    return REGISTRY.switch(law, branches, u)
