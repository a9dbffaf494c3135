"""Engine: run one pure simulation over a grid of seeds x configurations in one compilation.

A cluster model is a frozen (hashable) dataclass that holds the *static*
configuration (anything that sets a shape) and subclasses the abstract `Model`:

    init(key, workload, params)      -> state     (fixed-shape pytree)
    step(state, workload, params)    -> state     (one event; `held_step` keeps a done state as it is)
    metrics(state, workload, params) -> dict[str, scalar array]
    num_steps(workload)              -> int       (static upper bound on events)
    is_done(state)                   -> bool      (every event done: a run stops early)
    check_params(params, workload)   -> None      (optional: refuse, before tracing, params the static
                                                   config would silently clamp or ignore)

Three kinds of configuration are kept apart: static fields on the model (shapes;
changing one recompiles), traced `XParams` (vmapped: policy ids, rates, weights),
and the `XState` pytree that `step` advances.

`params` is a traced pytree (rates, thresholds, the policy id). The grid runner
vmaps one single-instance run over a flat batch axis (configs x seeds), shards
that axis over `jax.devices()` (each device runs its own rows; on a CPU in groups,
`rows_together`; over several processes joined by `distributed.join`, every process's
devices, the results gathered once), and runs the scan in chunks when the host shows a progress bar
between them (else as one program). Metrics named `overflow` (bool: a fixed capacity filled) and
`conservation_error` (int: requests neither completed, in flight nor dropped by a full capacity) are
conventional: a grid whose conservation error is not 0 is refused (`errors.LostRequests`), always.
`compile_count(model, kind)` says how many programs the runner compiled for a model
(tests assert one per multi-policy grid); the chunk step donates its state buffers.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import math
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxroute import (
    compile_effort,
    compile_log,
    executables,
    fast_prng,  # noqa: F401  (unrolled Threefry on CPU for every program built here)
)
from jaxroute import metrics as metrics_lib
from jaxroute.errors import JaxrouteError, LostRequests

PyTree = Any

def _count_trace(cache_key: tuple) -> None:
    """Called while tracing a cached jitted function: one trace is one compilation."""
    _TRACES[cache_key] = _TRACES.get(cache_key, 0) + 1
    _LAST_TRACED[0] = cache_key


def last_traced_program() -> str:
    """A short label of the grid program traced last ("ModelClass#hash.kind"), for compile profiles."""
    key = _LAST_TRACED[0]
    if key is None:
        return "?"
    model, kind, chunk, _, together, fast = key
    name = model.fn.__qualname__ if isinstance(model, _FnModel) else type(model).__name__
    return f"{name}#{hash(model) & 0xFFFF:04x}.{kind}" + (f"[{chunk}]" if chunk else "") + f" x{together}" + (" fast" if fast else "")


class Model(abc.ABC):
    """A single-instance cluster simulation; static config lives on the (frozen dataclass) subclass."""

    # Rows a CPU device advances together (None: all of its rows). A model whose step has data-dependent loops
    # or branches, where a vmapped step pays for every branch and for the busiest row, sets
    # `CPU_ROWS_TOGETHER`; a model whose step is the same work in every row keeps None (wider is faster).
    cpu_rows_together: ClassVar[int | None] = None
    # Whether `step` already leaves a done state unchanged (its events masked by their own flags, O(row), as
    # the replica and dispatch models' are). False: the engine holds a done state itself (`held_step`: one
    # select over the state per event), so the model's step need not.
    holds_when_done: ClassVar[bool] = True

    @abc.abstractmethod
    def init(self, key: jax.Array, workload: PyTree, params: PyTree) -> PyTree:
        """Initial state of one run."""

    @abc.abstractmethod
    def step(self, state: PyTree, workload: PyTree, params: PyTree) -> PyTree:
        """One event (if `holds_when_done`, it must leave a done state unchanged)."""

    @abc.abstractmethod
    def metrics(self, state: PyTree, workload: PyTree, params: PyTree) -> dict[str, jax.Array]:
        """Scalar metrics of a finished run (plus `overflow` and `conservation_error`)."""

    @abc.abstractmethod
    def num_steps(self, workload: PyTree) -> int:
        """Static upper bound on the events of one run."""

    @abc.abstractmethod
    def is_done(self, state: PyTree) -> jax.Array:
        """True once every event has happened (later steps are no-ops)."""

    def check_params(self, params: PyTree, workload: PyTree = None) -> None:
        """Refuse, on the host and before tracing, params this static configuration cannot honour.

        `params` may carry a leading batch axis. Raise `JaxrouteError` naming the offending
        values (e.g. a traced d above the static max_d, a policy id out of range). The
        default accepts everything; `run_grid` calls it before compiling.
        """
        del params, workload  # nothing to check by default

    def run(self, key: jax.Array, workload: PyTree, params: PyTree) -> dict[str, jax.Array]:
        """One simulation: init, scan over all events, metrics. Pure and jittable."""
        return run(self, key, workload, params)


def held_step(model: Model, state: PyTree, workload: PyTree, params: PyTree) -> PyTree:
    """One event of `model`, a no-op once the run is done (so chunked runs that stop early equal full runs):
    the one place that holds a done state, for models whose step does not (`Model.holds_when_done`)."""
    new = model.step(state, workload, params)
    if model.holds_when_done:
        return new
    done = model.is_done(state)
    return jax.tree.map(lambda a, b: jnp.where(done, a, b), state, new)


def scan_steps(model: Model, state: PyTree, workload: PyTree, params: PyTree, length: int) -> PyTree:
    """Advance one instance by `length` events with `lax.scan`."""

    def body(carry, _):
        return held_step(model, carry, workload, params), None

    state, _ = jax.lax.scan(body, state, None, length=length)
    return state


DONE_CHECK_EVERY = 16  # events between two checks of `is_done` in `advance` (at most this many no-op events)


def advance(step: Callable[[PyTree], PyTree], is_done: Callable[[PyTree], jax.Array], state: PyTree,
            length: int) -> PyTree:
    """At least `length` events of `step` (rounded up to whole blocks of `DONE_CHECK_EVERY`), stopping early
    once `is_done(state)`: blocks of events in a while loop, so the program holds one copy of the step (a
    remainder block would trace and compile a second one). Equal to `length` events whenever the extra
    events are no-ops (the `Model.step` contract: `length` is a bound on a run's events, or a chunk of a run
    that goes on), at a fraction of the cost when the bound is loose (a replica run's `num_steps` can be 10x
    its events). `step` and `is_done` may be batched (vmapped): the loop then goes on while any row runs, so
    its condition is one boolean for the whole batch."""
    blocks = -(-int(length) // DONE_CHECK_EVERY)

    def go_on(carry):
        i, s = carry
        return (i < blocks) & ~jnp.all(is_done(s))

    def block(carry):
        i, s = carry
        return i + 1, jax.lax.scan(lambda c, _: (step(c), None), s, None, length=DONE_CHECK_EVERY)[0]

    return jax.lax.while_loop(go_on, block, (jnp.int32(0), state))[1] if blocks else state


def run(model: Model, key: jax.Array, workload: PyTree, params: PyTree) -> dict[str, jax.Array]:
    """One simulation: init, every event (`advance`: stops once done), metrics. Pure and jittable."""
    state = model.init(key, workload, params)
    state = advance(lambda s: held_step(model, s, workload, params), model.is_done, state, model.num_steps(workload))
    return model.metrics(state, workload, params)


# --------------------------------------------------------------------------- batching


def stack_params(rows: Sequence[PyTree]) -> PyTree:
    """Stack a list of params pytrees into one pytree with a leading axis."""
    if not rows:
        raise ValueError("stack_params needs at least one params row")
    return jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *rows)


def batch_size(params_batch: PyTree) -> int:
    leaves = jax.tree.leaves(params_batch)
    if not leaves:
        raise ValueError("params batch has no leaves")
    return int(np.shape(leaves[0])[0])


def _mesh(devices: Sequence[jax.Device] | None) -> Mesh:
    devs = list(devices) if devices is not None else jax.devices()[:1] if _RECORDING else jax.devices()
    return Mesh(np.array(devs), ("batch",))


def _pad_leading(tree: PyTree, target: int) -> PyTree:
    def pad(x):
        x = jnp.asarray(x)
        extra = target - x.shape[0]
        if extra == 0:
            return x
        return jnp.concatenate([x, jnp.repeat(x[-1:], extra, axis=0)], axis=0)

    return jax.tree.map(pad, tree)


def _flat_grid(key: jax.Array, params_batch: PyTree, n_seeds: int) -> tuple[jax.Array, PyTree]:
    """Keys and params for a flat (config-major) batch of C * S rows.

    Seed s uses the same key in every configuration (common random numbers),
    so differences between policies are paired comparisons.
    """
    n_configs = batch_size(params_batch)
    seed_keys = jax.random.split(key, n_seeds)
    keys = jnp.tile(seed_keys, (n_configs, 1)) if seed_keys.ndim == 2 else jnp.tile(seed_keys, n_configs)
    flat_params = jax.tree.map(lambda x: jnp.repeat(jnp.asarray(x), n_seeds, axis=0), params_batch)
    return keys, flat_params


@dataclasses.dataclass
class GridResult:
    """Metrics of a grid run: every leaf has leading axes (configs, seeds)."""

    metrics: dict[str, np.ndarray]  # name -> [C, S, ...]
    n_configs: int
    n_seeds: int

    @property
    def overflow(self) -> np.ndarray:  # [C] bool: any seed of that config overflowed
        if "overflow" not in self.metrics:
            return np.zeros(self.n_configs, dtype=bool)
        ov = np.asarray(self.metrics["overflow"]).reshape(self.n_configs, self.n_seeds, -1)
        return ov.any(axis=(1, 2))

    def lost_rows(self) -> list[int]:
        """Configs where some seed broke conservation (its `conservation_error` is not 0)."""
        if "conservation_error" not in self.metrics:
            return []
        err = np.asarray(self.metrics["conservation_error"]).reshape(self.n_configs, self.n_seeds, -1)
        return [c for c in range(self.n_configs) if np.any(err[c] != 0)]

    def check_conserved(self, what: str) -> None:
        """Raise `LostRequests` when some config lost or invented a request."""
        bad = self.lost_rows()
        if bad:
            err = np.asarray(self.metrics["conservation_error"])
            raise LostRequests(what, bad, int(np.max(np.abs(err))))

    def summary(self, name: str) -> list[metrics_lib.Summary]:
        """Mean and 95 % CI over seeds for each configuration."""
        values = np.asarray(self.metrics[name], dtype=np.float64)
        return [metrics_lib.summarize(values[c]) for c in range(self.n_configs)]

    def row(self, c: int) -> dict[str, np.ndarray]:
        return {k: v[c] for k, v in self.metrics.items()}


# Rows a CPU device advances together (vmapped): under `vmap` a step runs every branch of its conds and switches
# (the routers of a grid) and each loop as often as the busiest row needs, so a device runs its rows as a
# sequence of groups of this size (the README's benchmark table: before and after; measure another size with
# ROWS_TOGETHER_ENV). An accelerator advances all its rows together (wide steps).
CPU_ROWS_TOGETHER = 16
# A device holding at most this many rows runs them one at a time, unbatched: conds, switches and loops then
# branch for real (a grid of routers at one seed runs one router per row, not all of them). So does a small job
# (compiled fast, `compile_effort`) of such a model on a CPU, at any size: its program holds one unbatched step,
# which XLA compiles in ~25 % less time than a vmapped one (a vmapped scatter becomes a loop), and its rows then
# run about as fast (docs/scan_step.md has the figures).
UNBATCHED_MAX_ROWS = 2
ROWS_TOGETHER_ENV = "JAXROUTE_CPU_ROWS_TOGETHER"  # set: every CPU grid in groups of this many rows (0: all, 1: one at a time)


def rows_together(local_rows: int, platform: str, limit: int | None, fast: bool = False) -> int:
    """How many of a device's `local_rows` rows it advances together (1: unbatched, one at a time): all of them on
    an accelerator or without a `limit` (the model's `cpu_rows_together`); on a CPU one at a time for a job
    compiled `fast` or of at most `limit` rows a device (the Mooncake job of `jaxroute bench --only jobs`, six
    routers at one seed, 800 requests: 56.0 s in one group, 29.6 s one at a time), else groups of at most
    `limit`, as equal as possible."""
    if _RECORDING:  # a profile counts the launches of rows that advance together
        return local_rows
    if platform == "cpu" and os.environ.get(ROWS_TOGETHER_ENV, "").strip():  # a measurement's override
        k = int(os.environ[ROWS_TOGETHER_ENV])
        return local_rows if k <= 0 else min(k, local_rows)
    if local_rows <= UNBATCHED_MAX_ROWS:
        return 1
    if platform != "cpu" or limit is None:
        return local_rows
    if fast or local_rows <= limit:  # no more than one group: one at a time (a grid of routers at a few seeds)
        return 1
    groups = -(-local_rows // limit)
    return -(-local_rows // groups)


def row_bucket(rows: int) -> int:
    """The smallest of 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, ... (4, 5, 6 x a power of two) >= rows: a
    compile-bound grid runs this many rows a device, so grids of nearby sizes reuse one compiled program."""
    if rows <= 4:
        return max(rows, 1)
    p = 1 << (rows.bit_length() - 3)  # rows in [4p, 8p)
    return next(m * p for m in (4, 5, 6, 8) if m * p >= rows)


def _jitted(model: Model, kind: str, mesh: Mesh, together: int, chunk: int = 0, fast: bool = False) -> Callable:
    """Jitted grid functions, cached per (model, kind, chunk, mesh, rows together, fast) so a grid compiles once.

    Each device runs its own rows (`shard_map`: no communication), in groups of `together` rows vmapped
    (1: unbatched, one row at a time) one group after another. The chunk step donates its state buffers: the
    loop only keeps the newest state. `fast`: compiled with `compile_effort.FAST_OPTIONS` (a small job).
    """
    cache_key = (model, kind, chunk, mesh, together, fast)
    fn = _JIT_CACHE.get(cache_key)
    if fn is not None:
        return fn
    lift = jax.vmap if together > 1 else (lambda f: f)  # a group's functions, batched or for one row

    def advance_rows(state, workload, params, length):
        """`advance` for a group of rows: one loop around the (vmapped) step, until every row is done."""
        step = lift(lambda s, p: held_step(model, s, workload, p))
        return advance(lambda s: step(s, params), lift(model.is_done), state, length)

    def group(rows, workload):
        """The kind's function on one group of rows (a tuple of row-major pytrees)."""
        if kind == "run":
            keys, params = rows
            state = lift(lambda k, p: model.init(k, workload, p))(keys, params)
            state = advance_rows(state, workload, params, model.num_steps(workload))
            return lift(lambda s, p: model.metrics(s, workload, p))(state, params)
        if kind == "init":
            keys, params = rows
            return lift(lambda k, p: model.init(k, workload, p))(keys, params)
        if kind == "chunk":
            state, params = rows
            return advance_rows(state, workload, params, chunk)
        if kind == "metrics":
            state, params = rows
            return lift(lambda s, p: model.metrics(s, workload, p))(state, params)
        (state,) = rows
        return lift(model.is_done)(state)

    def grid_rows(*args):
        _count_trace(cache_key)
        rows, workload = (args, None) if kind == "done" else ((args[0], args[2]), args[1])
        if together > 1 and together == jax.tree.leaves(rows)[0].shape[0]:
            return group(rows, workload)  # one group: the device's rows all at once
        return _one_by_one(rows, workload)

    def _one_by_one(rows, workload):
        """Groups of `together` rows, one after another (a scan; 1: each row unbatched). Sizes are spelled out:
        a state may hold zero-size leaves."""
        local = jax.tree.leaves(rows)[0].shape[0]
        group_shape = (local // together, together) if together > 1 else (local,)
        grouped = jax.tree.map(lambda x: x.reshape(group_shape + x.shape[1:]), rows)
        out = jax.lax.map(lambda g: group(g, workload), grouped)
        return jax.tree.map(lambda x: x.reshape((local,) + x.shape[len(group_shape):]), out)

    if kind not in KINDS:  # pragma: no cover - internal
        raise ValueError(kind)
    specs = (P("batch"),) if kind == "done" else (P("batch"), P(), P("batch"))
    sharded = jax.shard_map(grid_rows, mesh=mesh, in_specs=specs, out_specs=P("batch"), check_vma=False)
    fn = jax.jit(sharded, donate_argnums=(0,) if kind == "chunk" else (),
                 compiler_options=compile_effort.options(fast))
    _JIT_CACHE[cache_key] = fn
    return fn


@contextlib.contextmanager
def collecting_grids():
    """Within the block, every grid `run_grid` returns is appended to the yielded list (a reproduction's claim
    records take their overflow flags from it), except those `discard_grid` drops."""
    grids: list[GridResult] = []
    _COLLECTING.append(grids)
    try:
        yield grids
    finally:
        _COLLECTING.remove(grids)


def discard_grid(metrics: dict) -> None:
    """The grid whose metrics these are was superseded (rerun with a larger capacity): the open
    `collecting_grids` blocks forget it."""
    for grids in _COLLECTING:
        grids[:] = [g for g in grids if g.metrics is not metrics]


_COLLECTING: list[list[GridResult]] = []
_JIT_CACHE: dict[tuple, Callable] = {}
_TRACES: dict[tuple, int] = {}  # traces (= compilations) of each cached jitted function
_LAST_TRACED: list[tuple | None] = [None]  # cache key of the newest trace (compile profiles)
KINDS = ("run", "init", "chunk", "metrics", "done")
_RECORDING: list[list] = []  # open `recording_programs` blocks


@contextlib.contextmanager
def recording_programs():
    """Within the block, every grid program that advances rows (kinds run and chunk) is appended, once per
    grid, as (jitted function, abstract arguments), so its compiled text can be read (the bench's cost profile);
    grids run on the first device only (unless given devices), so a profile counts one device's executions."""
    launched: list = []
    _RECORDING.append(launched)
    try:
        yield launched
    finally:
        _RECORDING.remove(launched)


def _launch(fn: Callable, program: tuple, *args):
    """`fn(*args)` through the executable store (`executables`): a warm run loads the program without tracing
    it. `program`: (model, kind, mesh, rows together, chunk, fast), what `_jitted` built `fn` from."""
    if _RECORDING:  # a cost profile counts the launches of traced programs
        return fn(*args)
    model, kind, mesh, together, chunk, fast = program
    devices = [(d.platform, d.device_kind, d.id) for d in mesh.devices.flat]
    return executables.call(fn, f"{model!r}|{kind}|{chunk}|{together}|{fast}|{devices}", *args)


def _record(fn: Callable, *args) -> None:
    if _RECORDING:
        spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), args)
        for launched in _RECORDING:
            launched.append((fn, spec))


def _matches(model: Model | type | Callable) -> Callable[[Model], bool]:
    """Which cached models `model` names: itself, every instance of a Model class, or a plain run function."""
    if isinstance(model, type):
        return lambda m: isinstance(m, model)
    model = model if isinstance(model, Model) else _FnModel(model)
    return lambda m: m == model


def compile_count(model: Model | type | Callable, kind: str = "run") -> int:
    """How many programs the grid runner has compiled for `model`'s batched `kind` function.

    `model` is a Model, a Model class (all its instances, e.g. when a command builds the
    model), or a plain function given to `run_batch_fn`. kind is one of
    run / init / chunk / metrics / done ("chunk" sums over chunk sizes), or "advance": the programs that
    advance rows, run and chunk (a grid has one of them, chunked or not as its progress bar asks). Each distinct
    set of argument shapes compiles once; policies and other traced params never add one.
    Each trace of a cached jitted function is one compilation (a jit cache miss). Counts
    belong to the cached functions, so they do not depend on what other tests ran before
    when a test starts from `clear_compiled(model)`.
    """
    if kind not in (*KINDS, "advance"):
        raise ValueError(f"kind must be one of {KINDS} or advance, got {kind!r}")
    kinds = ("run", "chunk") if kind == "advance" else (kind,)
    match = _matches(model)
    return sum(n for (m, k, *_), n in _TRACES.items() if k in kinds and match(m))


def clear_compiled(model: Model | type | Callable | None = None) -> None:
    """Forget the jitted functions of `model` (as in `compile_count`; all when None): the next grid recompiles."""
    executables.forget()
    if model is None:
        _JIT_CACHE.clear()
        _TRACES.clear()
        return
    match = _matches(model)
    for cache_key in [k for k in _JIT_CACHE if match(k[0])]:
        del _JIT_CACHE[cache_key]
        _TRACES.pop(cache_key, None)


def run_grid(
    model: Model,
    key: jax.Array,
    workload: PyTree,
    params_batch: PyTree,
    n_seeds: int,
    *,
    chunk: int | None = None,
    progress: bool | str = False,
    devices: Sequence[jax.Device] | None = None,
) -> GridResult:
    """Run `model` for every (config, seed) pair in one compiled, sharded batch.

    params_batch: params pytree with a leading config axis C (policies, sweeps).
    chunk: events per compiled scan chunk, for a progress bar between chunks; None, or no `progress`, runs the
    whole scan as one program (init, every event, metrics: one compilation instead of four; either way a row
    stops once done). A cost profile (`recording_programs`) keeps the chunks: it counts a chunk's launches.
    progress: show a tqdm bar between chunks (a string sets its description).
    Before anything is traced, `model.check_params(params_batch, workload)` refuses params
    the static configuration cannot honour (a JaxrouteError).
    """
    if n_seeds < 1:
        raise ValueError(f"n_seeds must be >= 1, got {n_seeds}")
    if not isinstance(model, Model):
        raise TypeError(f"{type(model).__name__} does not subclass jaxroute.sim.Model")
    model.check_params(params_batch, workload)
    n_configs = batch_size(params_batch)
    keys, flat_params = _flat_grid(key, params_batch, n_seeds)
    n_rows = n_configs * n_seeds

    mesh = _mesh(devices)
    n_dev = mesh.devices.size
    local = math.ceil(n_rows / n_dev)
    total = int(model.num_steps(workload))
    fast = compile_effort.is_fast(n_dev * local * total)
    together = rows_together(local, mesh.devices.flat[0].platform, model.cpu_rows_together, fast)
    padded = n_dev * together * math.ceil(local / together)
    if together == 1 and fast:  # compile-bound: nearby row counts share one program (at most 1/4 rows wasted)
        padded = n_dev * row_bucket(local)
    if padded * total > MEMORY_CHECK_ROW_STEPS:  # smaller grids hold little state: no shape tracing for them
        check_memory(model, workload, jax.tree.map(lambda x: x[0], flat_params), padded, mesh)
    row_sharding = NamedSharding(mesh, P("batch"))
    keys = _put(_pad_leading(keys, padded), row_sharding)
    flat_params = _put(_pad_leading(flat_params, padded), row_sharding)
    workload = _put(workload, NamedSharding(mesh, P()))
    progress = progress if jax.process_index() == 0 else False  # one bar, on the first process

    if chunk is None or chunk >= total or not (progress or _RECORDING):
        run_fn = _jitted(model, "run", mesh, together, fast=fast)
        _record(run_fn, keys, workload, flat_params)
        out = _launch(run_fn, (model, "run", mesh, together, 0, fast), keys, workload, flat_params)
        compile_log.mark("first_step")
        if progress:
            _bar(total, progress).update(total)
    else:
        n_chunks = math.ceil(total / chunk)
        state = _launch(_jitted(model, "init", mesh, together, fast=fast), (model, "init", mesh, together, 0, fast),
                        keys, workload, flat_params)
        step_chunk = _jitted(model, "chunk", mesh, together, chunk, fast=fast)
        _record(step_chunk, state, workload, flat_params)
        bar = _bar(n_chunks * chunk, progress) if progress else None
        # Early exit once every row is done (num_steps can be a loose upper bound: the
        # remaining steps would be no-ops, so the result equals the full run).
        done_fn = _jitted(model, "done", mesh, together, fast=fast)
        for i in range(n_chunks):
            with warnings.catch_warnings():
                # Backends without buffer donation (older CPU runtimes) warn and copy instead.
                warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
                state = _launch(step_chunk, (model, "chunk", mesh, together, chunk, fast), state, workload, flat_params)
            if i == 0:
                compile_log.mark("first_step")  # compiled (or loaded) and launched
            if bar is not None:
                jax.block_until_ready(state)
                bar.update(chunk)
            if bool(np.all(_host(_launch(done_fn, (model, "done", mesh, together, 0, fast), state)))):
                break
        if bar is not None:
            bar.close()
        out = _launch(_jitted(model, "metrics", mesh, together, fast=fast), (model, "metrics", mesh, together, 0, fast),
                      state, workload, flat_params)

    host = jax.tree.map(lambda x: _host(x)[:n_rows], out)
    shaped = {k: v.reshape((n_configs, n_seeds) + v.shape[1:]) for k, v in host.items()}
    result = GridResult(metrics=shaped, n_configs=n_configs, n_seeds=n_seeds)
    result.check_conserved(type(model).__name__)
    for grids in _COLLECTING:
        grids.append(result)
    return result


MEMORY_ENV = "JAXROUTE_MEMORY_BYTES"  # bytes a grid may hold (default: what the machine or its devices have free)
# Grids of more row-steps than this have their state's memory checked before compiling (`check_memory`; tracing
# `init` costs ~0.1 s). Below it a grid holds some hundred bytes per request and row: megabytes, never the machine.
MEMORY_CHECK_ROW_STEPS = 10_000_000


def state_bytes(model: Model, workload: PyTree, params: PyTree) -> int:
    """Bytes of one row's state: the leaves of `jax.eval_shape(model.init, key, workload, params)` (no compile)."""
    shapes = jax.eval_shape(model.init, jax.random.key(0), workload, params)
    return tree_bytes(shapes)


def tree_bytes(tree: PyTree) -> int:
    """Bytes of a pytree's array leaves (shapes and dtypes; a PRNG key counts 8 B)."""
    def size(x) -> int:
        dtype = x.dtype
        item = 8 if jnp.issubdtype(dtype, jax.dtypes.prng_key) else np.dtype(dtype).itemsize
        return math.prod(x.shape) * item
    return int(sum(size(x) for x in jax.tree.leaves(tree) if hasattr(x, "shape")))


def free_bytes(mesh: Mesh) -> int | None:
    """Memory a grid on `mesh` may use: `JAXROUTE_MEMORY_BYTES`, else the accelerators' limit, else the host's
    available memory (Linux's MemAvailable); None when unknown."""
    if os.environ.get(MEMORY_ENV):
        return int(float(os.environ[MEMORY_ENV]))
    devices = list(mesh.devices.flat)
    if devices[0].platform != "cpu":
        stats = [d.memory_stats() or {} for d in devices]
        limits = [s.get("bytes_limit", 0) - s.get("bytes_in_use", 0) for s in stats]
        return sum(limits) if all(x > 0 for x in limits) else None
    try:
        with open("/proc/meminfo") as f:
            kb = {line.split(":")[0]: int(line.split()[1]) for line in f if line.split()[1:2]}
        return kb["MemAvailable"] * 1024
    except (OSError, KeyError, ValueError):
        return None


def check_memory(model: Model, workload: PyTree, one_row: PyTree, rows: int, mesh: Mesh) -> None:
    """Refuse a grid whose state alone cannot fit, before anything compiles (a JaxrouteError with the estimate):
    `rows` rows of `state_bytes` plus a copy of the workload per device. It is a lower bound: the compiled step
    also holds temporaries, so a grid that passes may still need more."""
    free = free_bytes(mesh)
    if free is None:
        return
    per_row = state_bytes(model, workload, one_row)
    need = rows * per_row + mesh.devices.size * tree_bytes(workload)
    if need > free:
        gib = 2.0**30
        raise JaxrouteError(f"the grid needs at least {need / gib:,.1f} GiB ({rows:,} rows x {per_row / gib:,.2f} GiB "
                            f"of state, and the workload on each of {mesh.devices.size} devices); "
                            f"{free / gib:,.1f} GiB is free: run fewer requests, seeds or rows")


def _put(tree: PyTree, sharding: NamedSharding) -> PyTree:
    """`tree` (the same host values on every process) as global arrays laid out by `sharding`: `device_put` in one
    process; over several (`jax.distributed`), each process places the shards its devices hold."""
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)

    def one(x):
        if jnp.issubdtype(jnp.asarray(x).dtype, jax.dtypes.prng_key):
            data = np.asarray(jax.random.key_data(x))
            glob = jax.make_array_from_callback(data.shape, sharding, lambda idx: data[idx])
            return jax.random.wrap_key_data(glob, impl=jax.random.key_impl(x))
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])

    return jax.tree.map(one, tree)


def _host(x: jax.Array) -> np.ndarray:
    """A global array's values on this host (over several processes: gathered from all of them)."""
    if jax.process_count() == 1 or x.is_fully_addressable:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _bar(total: int, progress: bool | str):
    from tqdm.auto import tqdm

    desc = progress if isinstance(progress, str) else "simulating"
    return tqdm(total=total, desc=desc, unit="step", leave=False, dynamic_ncols=True)


def run_batch_fn(
    fn: Callable[[jax.Array, PyTree, PyTree], dict[str, jax.Array]],
    key: jax.Array,
    workload: PyTree,
    params_batch: PyTree,
    n_seeds: int,
    *,
    devices: Sequence[jax.Device] | None = None,
) -> GridResult:
    """Grid runner for a plain `run(key, workload, params)` function (no chunking)."""
    return run_grid(_FnModel(fn), key, workload, params_batch, n_seeds, devices=devices)


@dataclasses.dataclass(frozen=True)
class _FnModel(Model):
    """Adapts a plain run function to the Model protocol (one 'step' does everything)."""

    fn: Callable

    def init(self, key, workload, params):
        return self.fn(key, workload, params)

    def step(self, state, workload, params):
        return state

    def metrics(self, state, workload, params):
        return state

    def num_steps(self, workload):
        return 0

    def is_done(self, state):
        return jnp.bool_(True)
