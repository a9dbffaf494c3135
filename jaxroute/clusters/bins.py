"""Balls into bins: n balls, n bins, each ball joins the least loaded of d sampled bins.

The zero-departure special case of classic dispatch (Azar et al. 1994): with d = 1 the
max load grows like ln n / ln ln n, with d >= 2 like ln ln n / ln d. One scan step
places one ball; it uses gathers instead of dense per-bin passes because n is large.

Conservation: the balls thrown (a counter), the per-ball record of the bin each ball
went to, and the bin loads are kept independently; `conservation_error` is how far they
disagree (the record's counts per bin must equal the loads).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxroute import sim
from jaxroute.errors import JaxrouteError
from jaxroute.routers import classic


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BinsParams:
    """Traced configuration of one run."""

    d: jax.Array  # [] int32 bins sampled per ball (1 = random; 1 <= d <= model.max_d)


def make_params(d: int = 2) -> BinsParams:
    """BinsParams for d choices (validated; `BinsModel.check_params` checks d <= max_d)."""
    if int(d) != d or d < 1:
        raise JaxrouteError(f"d must be an integer >= 1, got {d}")
    return BinsParams(d=jnp.int32(d))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BinsState:
    key: jax.Array  # [] PRNG key
    balls: jax.Array  # [] int32 balls thrown so far
    loads: jax.Array  # [n] int32 balls per bin
    placed: jax.Array  # [n] int32 bin each ball went to (-1 before it is thrown)


@dataclasses.dataclass(frozen=True)
class BinsModel(sim.Model):
    """Static configuration: n balls into n bins, at most max_d samples per ball (no departures)."""

    n: int = 100_000
    max_d: int = 3

    def __post_init__(self):
        if self.n < 1:
            raise JaxrouteError(f"n must be >= 1, got {self.n}")
        if self.max_d < 1:
            raise JaxrouteError(f"max_d must be >= 1, got {self.max_d}")

    def num_steps(self, workload=None) -> int:
        return self.n

    def is_done(self, state: BinsState) -> jax.Array:
        return state.balls >= self.n

    def check_params(self, params: BinsParams, workload=None) -> None:
        """A traced d above the static max_d would silently compare only max_d samples: refuse it."""
        classic.check_d(params.d, self.max_d, "the bins sampled per ball")

    def draws(self, key: jax.Array, index: jax.Array) -> jax.Array:
        """[D] int32 bins sampled for ball `index`."""
        return jax.random.randint(jax.random.fold_in(key, index), (self.max_d,), 0, self.n, dtype=jnp.int32)

    def init(self, key, workload, params: BinsParams) -> BinsState:
        return BinsState(key=key, balls=jnp.int32(0), loads=jnp.zeros(self.n, jnp.int32),
                         placed=jnp.full(self.n, -1, jnp.int32))

    def step(self, state: BinsState, workload, params: BinsParams) -> BinsState:
        active = state.balls < self.n
        picks = self.draws(state.key, state.balls)
        target = picks[classic.best_of_sampled(state.loads[picks], params.d)]
        loads = state.loads.at[target].add(active.astype(jnp.int32))
        row = jnp.minimum(state.balls, self.n - 1)
        placed = state.placed.at[row].set(jnp.where(active, target, state.placed[row]))
        return BinsState(key=state.key, balls=state.balls + active.astype(jnp.int32), loads=loads, placed=placed)

    def conservation_error(self, state: BinsState) -> jax.Array:
        """[] int32: |thrown - recorded| + |thrown - Σ loads| + Σ_b |recorded in b - load of b|."""
        recorded = state.placed >= 0
        per_bin = jnp.zeros(self.n, jnp.int32).at[jnp.where(recorded, state.placed, self.n)].add(1, mode="drop")
        return (jnp.abs(state.balls - jnp.sum(recorded, dtype=jnp.int32))
                + jnp.abs(state.balls - jnp.sum(state.loads))
                + jnp.sum(jnp.abs(per_bin - state.loads))).astype(jnp.int32)

    def metrics(self, state: BinsState, workload, params: BinsParams) -> dict[str, jax.Array]:
        return {
            "max_load": jnp.max(state.loads),
            "overflow": jnp.bool_(False),
            "conservation_error": self.conservation_error(state),
        }
