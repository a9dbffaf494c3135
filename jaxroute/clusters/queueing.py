"""Classic dispatch: N FCFS servers behind one router, and balls into bins.

Time is measured in mean service times. Requests arrive as a Poisson process of
rate load * N; the router picks a server with one of the classic policies
(`jaxroute.routers.classic`); each server serves its queue first come, first
served. One `lax.scan` step handles a block of B consecutive arrivals.

State per server:
- `free`: the time it becomes free; the work left is max(free - now, 0);
- `ring`: the departure times of the last K jobs sent to it. The queue length
  is the count of entries later than now. Overwriting an entry that is still
  in the future means the server held >= K jobs: the run sets `overflow` when
  the policy reads queue lengths (random / rr / lwl never read the ring) or
  tail statistics are recorded.
Times are kept relative to the start of the current block of B arrivals and
rebased once per block, so float32 stays accurate over long runs while each
arrival only reads the ring and writes one slot.

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
    """The random inputs of arrivals (shared by the jitted model and the test reference)."""

    gap: jax.Array  # [...] float32 time since the previous arrival
    service: jax.Array  # [...] float32 service time of the request
    picks: jax.Array  # [..., D] int32 servers sampled uniformly with replacement


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QueueState:
    """Times are relative to the start of the current block of arrivals (rebased once per block)."""

    key: jax.Array  # () PRNG key of this seed
    block: jax.Array  # () int32 blocks of arrivals processed (= scan step)
    arrivals: jax.Array  # () int32 requests routed so far
    free: jax.Array  # [N] float32 time each server becomes free (may be < 0: idle)
    ring: jax.Array  # [K, N] float32 departure times of the last K jobs sent to each server
    assigned: jax.Array  # [N] int32 jobs sent to each server
    cursor: jax.Array  # [N] int32 ring slot the next job of each server goes to (assigned mod K)
    board: jax.Array  # [N] int32 stale queue-length snapshot
    board_age: jax.Array  # () float32 time since the last board refresh
    response: jax.Array  # [R / B, B] float32 response time of each request
    overflow: jax.Array  # () bool a ring that the policy reads was overrun
    tails: jax.Array  # [I] float32 sum over arrivals of the fraction of servers with >= i jobs


@dataclasses.dataclass(frozen=True)
class QueueingModel:
    """Static configuration: shapes and sizes (changing any of them recompiles).

    One scan step handles a block of `block` consecutive arrivals: their random draws
    come from one vectorised call, and times are rebased once per block (so per-arrival
    work touches the ring read-only except for one slot).
    """

    n_servers: int = 16
    n_requests: int = 50_000
    warmup: int = 0  # requests discarded from the metrics
    ring: int = 16  # K: ring capacity per server (max queue length the router can count)
    max_d: int = 2  # D: samples drawn per request (power-of-d uses the first d)
    tail_levels: int = 0  # I: record the fraction of servers with >= 1..I jobs (fresh lengths)
    block: int = 8  # B: arrivals per scan step

    def __post_init__(self):
        if self.n_servers < 1:
            raise JaxrouteError(f"servers must be >= 1, got {self.n_servers}")
        if self.n_requests < 1:
            raise JaxrouteError(f"requests must be >= 1, got {self.n_requests}")
        if not 0 <= self.warmup < self.n_requests:
            raise JaxrouteError(f"warmup must leave at least one request (warmup={self.warmup}, "
                                f"requests={self.n_requests})")
        if self.ring < 1 or self.max_d < 1 or self.block < 1:
            raise JaxrouteError("ring, max_d and block must be >= 1")

    @property
    def n_blocks(self) -> int:
        return -(-self.n_requests // self.block)

    def num_steps(self, workload=None) -> int:
        return self.n_blocks

    def block_draws(self, key: jax.Array, block: jax.Array, params: DispatchParams) -> RequestDraws:
        """Random inputs of the B arrivals of block `block` (one counter-based key per block)."""
        u = jax.random.uniform(jax.random.fold_in(key, block), (self.block, 2 + self.max_d))
        rate = params.load * self.n_servers
        gap = -jnp.log1p(-u[:, 0]) / rate
        svc = service_lib.service_time(params.service, u[:, 1])
        picks = jnp.minimum((u[:, 2:] * self.n_servers).astype(jnp.int32), self.n_servers - 1)
        return RequestDraws(gap=gap, service=svc, picks=picks)

    def all_draws(self, key: jax.Array, params: DispatchParams) -> RequestDraws:
        """The draws of every arrival of a run, [R] leading axis (for references and tests)."""
        blocks = jax.vmap(lambda b: self.block_draws(key, b, params))(jnp.arange(self.n_blocks))
        return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:])[: self.n_requests], blocks)

    def init(self, key: jax.Array, workload, params: DispatchParams) -> QueueState:
        n, k = self.n_servers, self.ring
        return QueueState(
            key=key,
            block=jnp.int32(0),
            arrivals=jnp.int32(0),
            free=jnp.zeros(n, jnp.float32),
            ring=jnp.zeros((k, n), jnp.float32),
            assigned=jnp.zeros(n, jnp.int32),
            cursor=jnp.zeros(n, jnp.int32),
            board=jnp.zeros(n, jnp.int32),
            board_age=jnp.float32(0.0),
            response=jnp.zeros((self.n_blocks, self.block), jnp.float32),
            overflow=jnp.bool_(False),
            tails=jnp.zeros(self.tail_levels, jnp.float32),
        )

    def _arrival(self, carry: dict, gap, svc, picks, index, params: DispatchParams):
        """Route one arrival at block time carry['now'] + gap; returns (carry, response)."""
        n, k = self.n_servers, self.ring
        active = index < self.n_requests  # padded arrivals past the end change nothing
        gap = jnp.where(active, gap, 0.0)
        now = carry["now"] + gap

        # Board refresh: boundaries at multiples of T; the last one in (t_prev, t] is `age` before now.
        stale = params.stale > 0
        period = jnp.where(stale, params.stale, 1.0)
        age = carry["age"] + gap
        crossed = active & stale & (age >= period)
        age = jnp.where(crossed, jax.lax.rem(age, period), age)
        # Queue lengths at the refresh instant (stale) or now (fresh): jobs departing after it.
        instant = jnp.where(crossed, jnp.maximum(now - age, now - gap), now)
        ring = carry["ring"]
        counted = jnp.sum(ring > instant, axis=0, dtype=jnp.int32)  # [N]
        board = jnp.where(crossed, counted, carry["board"])
        free = carry["free"]
        view = classic.RouterView(queue=jnp.where(stale, board, counted), work=jnp.maximum(free - now, 0.0),
                                  picks=picks, d=params.d, rr_index=index % n, tie_offset=picks[0])
        server = classic.route(params.policy, view)

        chosen = (jnp.arange(n, dtype=jnp.int32) == server) & active  # [N]
        # Per-server vectors (no cross-server reduction): the finish time if the job went there.
        finish = jnp.maximum(free, now) + svc  # [N]
        slot = carry["cursor"]  # [N]
        write = (jnp.arange(k, dtype=jnp.int32)[:, None] == slot[None, :]) & chosen[None, :]  # [K, N]
        next_slot = jnp.where(slot + 1 == k, 0, slot + 1)
        evicted = jnp.sum(jnp.where(write, ring, 0.0), axis=0)  # [N] departure time in the reused slot

        tails = carry["tails"]
        if self.tail_levels:
            fresh = jnp.sum(ring > now, axis=0, dtype=jnp.int32)
            levels = jnp.arange(1, self.tail_levels + 1, dtype=jnp.int32)
            frac = jnp.mean((fresh[:, None] >= levels[None, :]).astype(jnp.float32), axis=0)
            tails = tails + jnp.where(active & (index >= self.warmup), frac, 0.0)

        carry = dict(
            now=now,
            age=age,
            free=jnp.where(chosen, finish, free),
            ring=jnp.where(write, finish[None, :], ring),
            assigned=carry["assigned"] + chosen.astype(jnp.int32),
            cursor=jnp.where(chosen, next_slot, slot),
            board=board,
            overrun=carry["overrun"] | (chosen & (evicted > now)),  # [N] a job still in system was dropped
            tails=tails,
            arrivals=carry["arrivals"] + active.astype(jnp.int32),
        )
        return carry, (chosen, finish - now)

    def step(self, state: QueueState, workload, params: DispatchParams) -> QueueState:
        dr = self.block_draws(state.key, state.block, params)
        carry = dict(now=jnp.float32(0.0), age=state.board_age, free=state.free, ring=state.ring,
                     assigned=state.assigned, cursor=state.cursor, board=state.board, tails=state.tails,
                     arrivals=state.arrivals, overrun=jnp.zeros(self.n_servers, bool))
        chosen, waits = [], []
        for j in range(self.block):  # unrolled: B arrivals per scan step
            carry, (c, w) = self._arrival(carry, dr.gap[j], dr.service[j], dr.picks[j],
                                          state.block * self.block + j, params)
            chosen.append(c)
            waits.append(w)
        now = carry["now"]
        # One reduction per block: each arrival's response at the server it chose.
        responses = jnp.sum(jnp.where(jnp.stack(chosen), jnp.stack(waits), 0.0), axis=1)  # [B]
        overrun = jnp.any(carry["overrun"])
        if not self.tail_levels:  # the tail statistics read the ring whatever the policy
            overrun = overrun & jnp.asarray(classic.USES_QUEUE_LENGTH)[params.policy]
        row = jnp.minimum(state.block, self.n_blocks - 1)
        done = state.block >= self.n_blocks
        response = jax.lax.dynamic_update_slice(
            state.response, jnp.where(done, state.response[row], responses)[None], (row, 0))
        return QueueState(
            key=state.key,
            block=state.block + 1,
            arrivals=carry["arrivals"],
            free=carry["free"] - now,  # rebase to the next block's start
            ring=carry["ring"] - now,
            assigned=carry["assigned"],
            cursor=carry["cursor"],
            board=carry["board"],
            board_age=carry["age"],
            response=response,
            overflow=state.overflow | overrun,
            tails=carry["tails"],
        )

    def metrics(self, state: QueueState, workload, params: DispatchParams) -> dict[str, jax.Array]:
        response = state.response.reshape(-1)
        index = jnp.arange(response.shape[0])
        mask = (index >= self.warmup) & (index < self.n_requests)
        out = {
            "mean_response": metrics_lib.masked_mean(response, mask),
            "p99_response": metrics_lib.masked_quantile_select(response, mask, 0.99),
            "overflow": state.overflow,
            # Every arrival went to exactly one server (a lost one-hot update would show here).
            "conservation_error": state.arrivals - jnp.sum(state.assigned),
        }
        counted = jnp.maximum(state.arrivals - self.warmup, 1)
        for level in range(1, self.tail_levels + 1):
            out[f"frac_ge_{level}"] = state.tails[level - 1] / counted
        return out


def default_ring(n_servers: int, load: float, stale: float) -> int:
    """A ring capacity that fits the queues JSQ / power-of-d build, with room for stale herding.

    Fresh JSQ / P2C queues stay short at any load below 1; with a stale board one server can
    receive every arrival of a refresh interval (about load * N * T jobs), so the ring grows with T.
    """
    need = 12 + 2.0 * load * n_servers * stale
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
        return jax.random.randint(jax.random.fold_in(key, index), (self.max_d,), 0, self.n, dtype=jnp.int32)

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
