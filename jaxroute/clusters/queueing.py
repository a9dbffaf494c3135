"""Classic dispatch: N FCFS servers behind one router, and balls into bins.

Time is measured in mean service times. Requests arrive as a Poisson process of
rate load * N; the router picks a server with one of the classic policies
(`jaxroute.routers.classic`); each server serves its queue first come, first
served. One `lax.scan` step is one arrival.

State per server (Lindley form, so float32 stays accurate over long runs):
- `work`: time until the server is free (the work left), which is also the
  response time a new job would see before its own service;
- `ring`: the time left until departure of the last K jobs sent to it. The
  queue length is the count of positive entries. Overwriting an entry that is
  still positive means the server held >= K jobs: the run sets `overflow` when
  the policy reads queue lengths (for random / rr / lwl the ring is never read).

Stale mode (Mitzenmacher 2000): a board of queue lengths is refreshed at times
0, T, 2T, ...; JSQ and power-of-d read the board instead of the true lengths.
T = 0 means fresh information. The board value at a refresh instant between two
arrivals is computed exactly from the ring.

Balls into bins (`BinsModel`) is the zero-departure special case: n balls, n
bins, each ball goes to the least loaded of d sampled bins. It uses gathers
instead of dense per-server passes because n is large.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxroute import metrics as metrics_lib
from jaxroute.errors import JaxrouteError
from jaxroute.routers import classic
from jaxroute.workloads import service as service_lib


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DispatchParams:
    """Traced configuration of one dispatch run (vmapped over in sweeps)."""

    policy: jax.Array  # () int32 index into classic.POLICY_NAMES
    load: jax.Array  # () float32 utilisation rho = arrival rate / (N * service rate)
    service: jax.Array  # () int32 index into service.SERVICE_LAWS
    stale: jax.Array  # () float32 board refresh interval T in service times (0 = fresh)
    d: jax.Array  # () int32 choices for power-of-d (1 <= d <= model.max_d)


def dispatch_params(policy: str = "jsq", load: float = 0.9, service: str = "exp", stale: float = 0.0,
                    d: int = 2) -> DispatchParams:
    """Build DispatchParams from names (validated)."""
    if policy not in classic.POLICY_NAMES:
        raise JaxrouteError(f"unknown policy '{policy}'; choose from: {', '.join(classic.POLICY_NAMES)}")
    if service not in service_lib.SERVICE_LAWS:
        raise JaxrouteError(f"unknown service law '{service}'; choose from: {', '.join(service_lib.SERVICE_LAWS)}")
    if not load > 0:
        raise JaxrouteError(f"load must be > 0, got {load}")
    if not stale >= 0:
        raise JaxrouteError(f"stale refresh interval must be >= 0, got {stale}")
    if d < 1:
        raise JaxrouteError(f"d must be >= 1, got {d}")
    return DispatchParams(
        policy=jnp.int32(classic.POLICY_NAMES.index(policy)),
        load=jnp.float32(load),
        service=jnp.int32(service_lib.SERVICE_LAWS.index(service)),
        stale=jnp.float32(stale),
        d=jnp.int32(d),
    )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RequestDraws:
    """The random inputs of one arrival (shared by the jitted model and the test reference)."""

    gap: jax.Array  # () float32 time since the previous arrival
    service: jax.Array  # () float32 service time of this request
    picks: jax.Array  # [D] int32 servers sampled uniformly with replacement


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QueueState:
    key: jax.Array  # () PRNG key of this seed
    arrivals: jax.Array  # () int32 requests routed so far (= step index)
    work: jax.Array  # [N] float32 time until each server is free
    ring: jax.Array  # [N, K] float32 time left until departure of the last K jobs per server
    assigned: jax.Array  # [N] int32 jobs sent to each server
    board: jax.Array  # [N] int32 stale queue-length snapshot
    board_age: jax.Array  # () float32 time since the last board refresh
    response: jax.Array  # [R] float32 response time of each request
    overflow: jax.Array  # () bool a ring that the policy reads was overrun
    tails: jax.Array  # [I] float32 sum over arrivals of the fraction of servers with >= i jobs


@dataclasses.dataclass(frozen=True)
class QueueingModel:
    """Static configuration: shapes and sizes (changing any of them recompiles)."""

    n_servers: int = 16
    n_requests: int = 50_000
    warmup: int = 0  # requests discarded from the metrics
    ring: int = 32  # K: ring capacity per server (max queue length the router can count)
    max_d: int = 2  # D: samples drawn per request (power-of-d uses the first d)
    tail_levels: int = 0  # I: record the fraction of servers with >= 1..I jobs (fresh lengths)

    def __post_init__(self):
        if self.n_servers < 1:
            raise JaxrouteError(f"servers must be >= 1, got {self.n_servers}")
        if self.n_requests < 1:
            raise JaxrouteError(f"requests must be >= 1, got {self.n_requests}")
        if not 0 <= self.warmup < self.n_requests:
            raise JaxrouteError(f"warmup must leave at least one request (warmup={self.warmup}, "
                                f"requests={self.n_requests})")
        if self.ring < 1 or self.max_d < 1:
            raise JaxrouteError("ring and max_d must be >= 1")

    def num_steps(self, workload=None) -> int:
        return self.n_requests

    def draws(self, key: jax.Array, index: jax.Array, params: DispatchParams) -> RequestDraws:
        """Random inputs of arrival `index`: one counter-based key per arrival."""
        u = jax.random.uniform(jax.random.fold_in(key, index), (2 + self.max_d,))
        rate = params.load * self.n_servers
        gap = -jnp.log1p(-u[0]) / rate
        svc = service_lib.service_time(params.service, u[1])
        picks = jnp.minimum((u[2:] * self.n_servers).astype(jnp.int32), self.n_servers - 1)
        return RequestDraws(gap=gap, service=svc, picks=picks)

    def init(self, key: jax.Array, workload, params: DispatchParams) -> QueueState:
        n, k = self.n_servers, self.ring
        return QueueState(
            key=key,
            arrivals=jnp.int32(0),
            work=jnp.zeros(n, jnp.float32),
            ring=jnp.zeros((n, k), jnp.float32),
            assigned=jnp.zeros(n, jnp.int32),
            board=jnp.zeros(n, jnp.int32),
            board_age=jnp.float32(0.0),
            response=jnp.zeros(self.n_requests, jnp.float32),
            overflow=jnp.bool_(False),
            tails=jnp.zeros(self.tail_levels, jnp.float32),
        )

    def step(self, state: QueueState, workload, params: DispatchParams) -> QueueState:
        n, k = self.n_servers, self.ring
        i = state.arrivals
        active = i < self.n_requests
        dr = self.draws(state.key, i, params)

        # Board refresh: boundaries at multiples of T; the last one in (t_prev, t] is `age` before now.
        stale = params.stale > 0
        period = jnp.where(stale, params.stale, 1.0)
        age = state.board_age + dr.gap
        crossed = stale & (age >= period)
        age = jnp.where(crossed, jax.lax.rem(age, period), age)
        # Queue lengths at the refresh instant (stale) or now (fresh): jobs departing after it.
        since_prev = jnp.where(crossed, jnp.maximum(dr.gap - age, 0.0), dr.gap)
        counted = jnp.sum(state.ring > since_prev, axis=1, dtype=jnp.int32)  # [N]
        board = jnp.where(crossed, counted, state.board)
        queue_view = jnp.where(stale, board, counted)

        work = jnp.maximum(state.work - dr.gap, 0.0)
        ring_left = state.ring - dr.gap
        view = classic.RouterView(queue=queue_view, work=work, picks=dr.picks, d=params.d,
                                  rr_index=i % n, tie_offset=dr.picks[0])
        server = classic.route(params.policy, view)

        chosen = jnp.arange(n, dtype=jnp.int32) == server  # [N]
        response = jnp.sum(jnp.where(chosen, work, 0.0)) + dr.service
        slot = state.assigned % k  # [N]
        write = chosen[:, None] & (jnp.arange(k, dtype=jnp.int32)[None, :] == slot[:, None])  # [N, K]
        overrun = jnp.any(write & (ring_left > 0.0))
        reads_queue = jnp.asarray(classic.USES_QUEUE_LENGTH)[params.policy]

        tails = state.tails
        if self.tail_levels:
            fresh = jnp.sum(state.ring > dr.gap, axis=1, dtype=jnp.int32)
            levels = jnp.arange(1, self.tail_levels + 1, dtype=jnp.int32)
            frac = jnp.mean((fresh[:, None] >= levels[None, :]).astype(jnp.float32), axis=0)
            tails = tails + jnp.where(active & (i >= self.warmup), frac, 0.0)

        def keep(new, old):
            return jnp.where(active, new, old)

        return QueueState(
            key=state.key,
            arrivals=keep(i + 1, i),
            work=keep(jnp.where(chosen, response, work), state.work),
            ring=keep(jnp.where(write, response, ring_left), state.ring),
            assigned=keep(state.assigned + chosen.astype(jnp.int32), state.assigned),
            board=keep(board, state.board),
            board_age=keep(age, state.board_age),
            response=state.response.at[i].set(response, mode="drop"),
            overflow=state.overflow | (active & overrun & reads_queue),
            tails=tails,
        )

    def metrics(self, state: QueueState, workload, params: DispatchParams) -> dict[str, jax.Array]:
        mask = jnp.arange(self.n_requests) >= self.warmup
        out = {
            "mean_response": metrics_lib.masked_mean(state.response, mask),
            "p99_response": metrics_lib.masked_quantile(state.response, mask, 0.99),
            "overflow": state.overflow,
            # Every arrival went to exactly one server (a lost one-hot update would show here).
            "conservation_error": jnp.minimum(state.arrivals, self.n_requests) - jnp.sum(state.assigned),
        }
        counted = jnp.maximum(jnp.minimum(state.arrivals, self.n_requests) - self.warmup, 1)
        for level in range(1, self.tail_levels + 1):
            out[f"frac_ge_{level}"] = state.tails[level - 1] / counted
        return out


def default_ring(n_servers: int, load: float, stale: float) -> int:
    """A ring capacity that fits the queues JSQ / power-of-d build, with room for stale herding.

    Fresh JSQ / P2C queues stay short at any load below 1; with a stale board one server can
    receive every arrival of a refresh interval (about load * N * T jobs), so the ring grows with T.
    """
    need = 24 + 2.0 * load * n_servers * stale
    k = 8
    while k < need:
        k *= 2
    return k


# --------------------------------------------------------------------------- balls into bins


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BinsParams:
    d: jax.Array  # () int32 bins sampled per ball (1 = random)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BinsState:
    key: jax.Array  # () PRNG key
    balls: jax.Array  # () int32 balls placed so far
    loads: jax.Array  # [n] int32 balls per bin


@dataclasses.dataclass(frozen=True)
class BinsModel:
    """n balls into n bins; each ball joins the least loaded of d uniform samples (no departures)."""

    n: int = 100_000
    max_d: int = 3

    def __post_init__(self):
        if self.n < 1:
            raise JaxrouteError(f"n must be >= 1, got {self.n}")

    def num_steps(self, workload=None) -> int:
        return self.n

    def draws(self, key: jax.Array, index: jax.Array) -> jax.Array:
        """[D] int32 bins sampled for ball `index`."""
        u = jax.random.uniform(jax.random.fold_in(key, index), (self.max_d,))
        return jnp.minimum((u * self.n).astype(jnp.int32), self.n - 1)

    def init(self, key, workload, params: BinsParams) -> BinsState:
        return BinsState(key=key, balls=jnp.int32(0), loads=jnp.zeros(self.n, jnp.int32))

    def step(self, state: BinsState, workload, params: BinsParams) -> BinsState:
        active = state.balls < self.n
        picks = self.draws(state.key, state.balls)
        j = classic.best_of_sampled(state.loads[picks], params.d)
        loads = state.loads.at[picks[j]].add(active.astype(jnp.int32))
        return BinsState(key=state.key, balls=state.balls + active.astype(jnp.int32), loads=loads)

    def metrics(self, state: BinsState, workload, params: BinsParams) -> dict[str, jax.Array]:
        return {
            "max_load": jnp.max(state.loads),
            "overflow": jnp.bool_(False),
            "conservation_error": state.balls - jnp.sum(state.loads),
        }
