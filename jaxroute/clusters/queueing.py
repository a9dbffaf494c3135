"""Classic dispatch: N FCFS servers behind one router (`DispatchModel`).

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

Conservation: every arrival is counted three ways that are updated independently:
the arrival counter, the per-request record of the router's decision (`server_of`),
and the per-server assignment counters (updated from the routing one-hot). Since
each departure time is fixed on arrival (FCFS), a request is either completed or in
flight at the end, and both are recorded servers; a lost or duplicated routing update
shows as `conservation_error` > 0.

Balls into bins, the zero-departure special case, is `jaxroute.clusters.bins`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute import metrics as metrics_lib
from jaxroute import sim
from jaxroute.errors import JaxrouteError
from jaxroute.routers import classic
from jaxroute.workloads import service as service_lib

# The unit of every time metric of this model (mean_response, p99_response): the mean service time is 1.
TIME_UNIT = "mean service time"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DispatchParams:
    """Traced configuration of one dispatch run (vmapped over in sweeps)."""

    policy: jax.Array  # [] int32 id in classic.REGISTRY
    load: jax.Array  # [] float32 utilisation rho = arrival rate / (N * service rate)
    service: jax.Array  # [] int32 id in service.REGISTRY
    stale: jax.Array  # [] float32 board refresh interval T in service times (0 = fresh)
    d: jax.Array  # [] int32 choices for power-of-d (1 <= d <= model.max_d)


def make_params(policy: str = "jsq", load: float = 0.9, service: str = "exp", stale: float = 0.0,
                d: int = 2) -> DispatchParams:
    """Build DispatchParams from names (validated; `DispatchModel.check_params` checks d <= max_d)."""
    policy_id = classic.REGISTRY.id(policy)
    service_id = service_lib.REGISTRY.id(service)
    if not load > 0:
        raise JaxrouteError(f"load must be > 0, got {load}")
    if not stale >= 0:
        raise JaxrouteError(f"stale refresh interval must be >= 0, got {stale}")
    if d < 1:
        raise JaxrouteError(f"d must be >= 1, got {d}")
    return DispatchParams(
        policy=jnp.int32(policy_id),
        load=jnp.float32(load),
        service=jnp.int32(service_id),
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
class DispatchState:
    """Times are relative to the start of the current block of arrivals (rebased once per block)."""

    key: jax.Array  # [] PRNG key of this seed
    block: jax.Array  # [] int32 blocks of arrivals processed (= scan step)
    arrivals: jax.Array  # [] int32 requests routed so far
    free: jax.Array  # [N] float32 time each server becomes free (may be < 0: idle)
    ring: jax.Array  # [K, N] float32 departure times of the last K jobs sent to each server
    assigned: jax.Array  # [N] int32 jobs sent to each server
    cursor: jax.Array  # [N] int32 ring slot the next job of each server goes to (assigned mod K)
    board: jax.Array  # [N] int32 stale queue-length snapshot
    board_age: jax.Array  # [] float32 time since the last board refresh
    draws: RequestDraws  # [B] the random inputs of the block the next step routes (drawn one step ahead)
    response: jax.Array  # [R / B, B] float32 response time of each request
    server_of: jax.Array  # [R / B, B] int32 server each request went to (-1 before routing)
    overflow: jax.Array  # [] bool a ring that the policy reads was overrun
    tails: jax.Array  # [I] float32 sum over arrivals of the fraction of servers with >= i jobs


@dataclasses.dataclass(frozen=True)
class DispatchModel(sim.Model):
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
    block: int = 8  # B: arrivals per scan step (one vectorised draw, one ring pass, one rebase)

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

    def is_done(self, state: DispatchState) -> jax.Array:
        return state.block >= self.n_blocks

    def check_params(self, params: DispatchParams, workload=None) -> None:
        """Refuse traced values this static configuration would silently clamp (before tracing)."""
        classic.REGISTRY.check_id(params.policy)
        service_lib.REGISTRY.check_id(params.service)
        classic.check_d(params.d, self.max_d, "the samples drawn per request")

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

    def init(self, key: jax.Array, workload, params: DispatchParams) -> DispatchState:
        n, k = self.n_servers, self.ring
        return DispatchState(
            key=key,
            block=jnp.int32(0),
            arrivals=jnp.int32(0),
            free=jnp.zeros(n, jnp.float32),
            ring=jnp.zeros((k, n), jnp.float32),
            assigned=jnp.zeros(n, jnp.int32),
            cursor=jnp.zeros(n, jnp.int32),
            board=jnp.zeros(n, jnp.int32),
            board_age=jnp.float32(0.0),
            draws=self.block_draws(key, jnp.int32(0), params),
            response=jnp.zeros((self.n_blocks, self.block), jnp.float32),
            server_of=jnp.full((self.n_blocks, self.block), -1, jnp.int32),
            overflow=jnp.bool_(False),
            tails=jnp.zeros(self.tail_levels, jnp.float32),
        )

    def _times(self, carry: dict, gap: jax.Array, index: jax.Array, params: DispatchParams):
        """Arrival times of one block and the instants their queue lengths are read at.

        Arrival times depend only on the gaps, so the whole block's clock and board-refresh
        bookkeeping runs before any routing. Returns (carry, now [B], thr [B], crossed [B], active [B]).
        """
        active = index < self.n_requests  # [B] padded arrivals past the end change nothing
        gap = jnp.where(active, gap, 0.0)
        stale = params.stale > 0
        period = jnp.where(stale, params.stale, 1.0)
        now, age = carry["now"], carry["age"]
        nows, thrs, crossed_all = [], [], []
        for j in range(self.block):  # scalar recurrences, in arrival order (float rounding as one by one)
            now = now + gap[j]
            # Board refresh: boundaries at multiples of T; the last one in (t_prev, t] is `age` before now.
            age = age + gap[j]
            crossed = active[j] & stale & (age >= period)
            age = jnp.where(crossed, jax.lax.rem(jnp.where(crossed, age, 0.0), period), age)  # fmod only where used
            # Queue lengths are read at the refresh instant (stale) or now (fresh).
            thrs.append(jnp.where(crossed, jnp.maximum(now - age, now - gap[j]), now))
            nows.append(now)
            crossed_all.append(crossed)
        carry = dict(carry, now=now, age=age)
        return carry, jnp.stack(nows), jnp.stack(thrs), jnp.stack(crossed_all), active

    def _block(self, carry: dict, dr: RequestDraws, first: jax.Array, params: DispatchParams):
        """Route the B arrivals of one block (arrival indices first .. first + B - 1).

        Queue lengths: jobs of the block-start ring still in system at the reading instant
        (one [B, K, N] count for the whole block) plus the block's own earlier jobs still in
        system. While no ring is overrun this equals counting the ring as it is after each
        write; the ring itself is written once at the end of the block (one pass over [K, N]).
        """
        n, k, nb = self.n_servers, self.ring, self.block
        index = first + jnp.arange(nb, dtype=jnp.int32)
        carry, now, thr, crossed, active = self._times(carry, dr.gap, index, params)
        ring0 = carry["ring"]
        # With B <= K no slot is written twice in a block, so the job an arrival overwrites is
        # the block-start ring's; otherwise (and for the tail statistics) count fresh lengths.
        need_fresh = bool(self.tail_levels) or nb > k
        instants = jnp.concatenate([thr, now]) if need_fresh else thr
        counts = jnp.sum(ring0[None] > instants[:, None, None], axis=1, dtype=jnp.int32)  # [B or 2B, N]
        if nb <= k:  # oldest[m, s]: the ring entry in slot cursor[s] + m (mod K) at the block start
            slots = carry["cursor"][None, :] + jnp.arange(nb, dtype=jnp.int32)[:, None]  # [B, N]
            slots = jnp.where(slots >= k, slots - k, slots)
            hit = jnp.arange(k, dtype=jnp.int32)[None, :, None] == slots[:, None, :]  # [B, K, N]
            oldest = jnp.max(jnp.where(hit, ring0[None], -jnp.inf), axis=1)  # [B, N]
        levels = jnp.arange(1, self.tail_levels + 1, dtype=jnp.int32)
        stale = params.stale > 0
        servers_n = jnp.arange(n, dtype=jnp.int32)
        free, board, cursor, tails = carry["free"], carry["board"], carry["cursor"], carry["tails"]
        overrun = carry["overrun"]
        codes, servers, ends, responses = [], [], [], []
        for j in range(nb):  # unrolled: B arrivals
            # Plus the block's earlier jobs (server servers[i], departing at ends[i]) still in system.
            counted = counts[j]
            for i in range(j):
                counted = counted + ((servers_n == servers[i]) & (ends[i] > thr[j])).astype(jnp.int32)
            board = jnp.where(crossed[j], counted, board)
            view = classic.RouterView(queue=jnp.where(stale, board, counted), work=jnp.maximum(free - now[j], 0.0),
                                      picks=dr.picks[j], d=params.d, rr_index=index[j] % n,
                                      tie_offset=dr.picks[j, 0])
            server = classic.route(params.policy, view)
            c = (servers_n == server) & active[j]  # [N] (none when the router names no server)
            routed = active[j] & (server >= 0) & (server < n)  # = any(c), without a reduction
            # Per-server vector (no cross-server reduction): the finish time if the job went there.
            finish = jnp.maximum(free, now[j]) + dr.service[j]  # [N]
            end = jnp.take(finish, server, mode="fill", fill_value=-jnp.inf)
            if need_fresh:
                fresh = counts[nb + j]
                for i in range(j):
                    fresh = fresh + ((servers_n == servers[i]) & (ends[i] > now[j])).astype(jnp.int32)
            if nb > k:  # a server whose K ring slots all hold jobs in system has its oldest one overwritten
                overrun = overrun | (routed & (jnp.take(fresh, server, mode="fill", fill_value=0) >= k))
            else:  # the slot the job goes to holds the block-start ring's job, still in system or not
                # This block's m-th job for the server overwrites the block-start ring's slot cursor + m.
                m = sum(((servers[i] == server).astype(jnp.int32) for i in range(j)), jnp.int32(0))
                evicted = oldest.at[m, server].get(mode="fill", fill_value=-jnp.inf)
                overrun = overrun | (routed & (evicted > now[j]))
            if self.tail_levels:
                frac = jnp.mean((fresh[:, None] >= levels[None, :]).astype(jnp.float32), axis=0)
                tails = tails + jnp.where(active[j] & (index[j] >= self.warmup), frac, 0.0)
            codes.append(jnp.where(c, cursor, k))  # [N] the ring slot written per server, K: none
            cursor = jnp.where(c, jnp.where(cursor + 1 == k, 0, cursor + 1), cursor)
            free = jnp.where(c, finish, free)
            servers.append(jnp.where(active[j], server, -1))
            ends.append(end)
            # The response at the chosen server (a router that names no server routed nothing: 0).
            responses.append(jnp.where(routed, end - now[j], 0.0))
        # The block's writes into the ring, in order, in one elementwise pass over [K, N].
        ring = ring0
        rows = jnp.arange(k, dtype=jnp.int32)[:, None]
        for j in range(nb):
            ring = jnp.where(rows == codes[j][None, :], ends[j], ring)
        servers = jnp.stack(servers)  # [B]
        last = carry["now"]
        carry = dict(
            now=jnp.float32(0.0),
            age=carry["age"],
            free=free - last,  # rebase to the next block's start
            ring=ring - last,
            assigned=carry["assigned"] + jnp.sum(servers[:, None] == servers_n[None, :], axis=0, dtype=jnp.int32),
            cursor=cursor,
            board=board,
            overrun=overrun,
            tails=tails,
            arrivals=carry["arrivals"] + jnp.sum(active, dtype=jnp.int32),
        )
        return carry, jnp.stack(responses), servers

    def step(self, state: DispatchState, workload, params: DispatchParams) -> DispatchState:
        carry = dict(now=jnp.float32(0.0), age=state.board_age, free=state.free, ring=state.ring,
                     assigned=state.assigned, cursor=state.cursor, board=state.board, tails=state.tails,
                     arrivals=state.arrivals, overrun=jnp.bool_(False))
        carry, responses, servers = self._block(carry, state.draws, state.block * self.block, params)
        overrun = carry["overrun"]
        if not self.tail_levels:  # the tail statistics read the ring whatever the policy
            overrun = overrun & jnp.asarray(classic.USES_QUEUE_LENGTH)[params.policy]
        row = jnp.minimum(state.block, self.n_blocks - 1)
        done = state.block >= self.n_blocks
        response = jax.lax.dynamic_update_slice(
            state.response, jnp.where(done, state.response[row], responses)[None], (row, 0))
        server_of = jax.lax.dynamic_update_slice(
            state.server_of, jnp.where(done, state.server_of[row], servers)[None], (row, 0))
        return DispatchState(
            key=state.key,
            block=jnp.where(done, state.block, state.block + 1),  # a done state stays as it is (the engine's contract)
            arrivals=carry["arrivals"],
            free=carry["free"],
            ring=carry["ring"],
            assigned=carry["assigned"],
            cursor=carry["cursor"],
            board=carry["board"],
            board_age=carry["age"],
            # Drawn a step ahead: the routing loop then reads the draws from memory (drawn in the
            # same step, XLA fuses the uniform-to-draw arithmetic into every per-arrival kernel).
            draws=jax.tree.map(lambda a, b: jnp.where(done, a, b), state.draws,
                               self.block_draws(state.key, state.block + 1, params)),
            response=response,
            server_of=server_of,
            overflow=state.overflow | overrun,
            tails=carry["tails"],
        )

    def conservation_error(self, state: DispatchState) -> jax.Array:
        """[] int32: how far independent counts of the routed requests disagree (0 when conserved).

        arrived = the arrival counter; recorded = the router's decisions, one per request
        (each request is completed or in flight at the end: its departure time was fixed on
        arrival); every decision must name a server, and per server the decisions must equal
        the server's own counter (updated from the routing one-hot); a finished run must have
        routed every request.
        """
        n = self.n_servers
        server_of = state.server_of.reshape(-1)[: self.n_requests]
        recorded = server_of >= 0
        per_server = jnp.zeros(n, jnp.int32).at[jnp.where(recorded, server_of, n)].add(1, mode="drop")
        n_recorded = jnp.sum(recorded, dtype=jnp.int32)
        missing = jnp.where(self.is_done(state), self.n_requests - state.arrivals, 0)
        return (jnp.abs(state.arrivals - n_recorded) + jnp.abs(n_recorded - jnp.sum(per_server))
                + jnp.sum(jnp.abs(per_server - state.assigned)) + jnp.abs(missing)).astype(jnp.int32)

    def metrics(self, state: DispatchState, workload, params: DispatchParams) -> dict[str, jax.Array]:
        response = state.response.reshape(-1)
        index = jnp.arange(response.shape[0])
        mask = (index >= self.warmup) & (index < self.n_requests)
        out = {
            "mean_response": metrics_lib.masked_mean(response, mask),
            "p99_response": upper_quantile(response[self.warmup: self.n_requests], 0.99),
            "overflow": state.overflow,
            "conservation_error": self.conservation_error(state),
        }
        counted = jnp.maximum(state.arrivals - self.warmup, 1)
        for level in range(1, self.tail_levels + 1):
            out[f"frac_ge_{level}"] = state.tails[level - 1] / counted
        return out


def upper_quantile(x: jax.Array, q: float) -> jax.Array:
    """`metrics.masked_quantile_select(x, all-true mask, q)` (same value) for q near 1, from a top-k.

    The order statistics around the quantile are among the few largest values, so one
    partial sort replaces 32 counting passes over x (the mask is all-true: x is the
    slice of recorded requests, its length static).
    """
    n = x.shape[0]
    pos = np.float32(q) * np.float32(max(n - 1, 0))  # as masked_quantile_select computes it, in float32
    rank = int(np.floor(pos))  # 0-based order statistic below the quantile
    k = n - rank  # x_(rank) is the k-th largest
    if n == 0 or 4 * (k + 1) > n:  # a large top-k would cost more than counting
        return metrics_lib.masked_quantile_select(x, jnp.ones(n, bool), q)
    # The k largest, descending. The barrier keeps XLA's TopK kernel: reading single elements of
    # its result otherwise turns it back into a full sort of x (several times slower on CPU).
    top = jax.lax.optimization_barrier(jax.lax.top_k(x.astype(jnp.float32), k)[0])
    x_lo = top[k - 1]
    x_hi = top[k - 2] if k >= 2 else x_lo  # x_(rank + 1), or x_lo when rank is the largest
    return x_lo + (x_hi - x_lo) * np.float32(pos - np.float32(rank))


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
