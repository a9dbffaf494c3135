"""One grid over several processes and hosts with JAX's own multi-controller runtime (`jax.distributed`).

Every process runs the same command. `start` joins them (`jax.distributed.initialize`; on CPUs the
collectives go over gloo); from then on `jax.devices()` lists every process's devices, `sim.run_grid` lays the
grid's batch axis over all of them (each process places and runs the rows its own devices hold) and gathers the
results once at the end, so every process holds the whole grid and process 0 alone prints and writes: the same
tables and JSON as one process, per-seed records bit for bit (a row's keys and params do not depend on where it
runs). A process that fails or is killed ends the others' run with an error before anything is written (the
coordination service's heartbeat, `JAXROUTE_HEARTBEAT_S` seconds). The coordinator's address is checked before
JAX sees it (a port that is not a number crashes the runtime, a host that does not resolve stalls it), and joining
has a deadline (`--join-timeout`): a process that never comes ends the others' wait with one line, not a hang.

Launch (README, "Several processes and hosts"): one command per process with `--coordinator HOST:PORT --num-processes N
--process-id I` (or the environment variables of `ENV`), or `--distributed auto` under SLURM or Open MPI, where
JAX reads the process layout from the launcher. From Python: `join(...)` first, then any grid API
(`sim.run_grid`, `experiments.cluster.run_cluster`, the capacity search, tuning) as in one process.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

from jaxroute.errors import JaxrouteError

ENV = {"coordinator": "JAXROUTE_COORDINATOR", "num_processes": "JAXROUTE_NUM_PROCESSES",
       "process_id": "JAXROUTE_PROCESS_ID"}
HEARTBEAT_ENV = "JAXROUTE_HEARTBEAT_S"  # seconds without a heartbeat before a process counts as failed
JOIN_TIMEOUT_ENV = "JAXROUTE_JOIN_TIMEOUT_S"
JOIN_TIMEOUT_S = 120  # seconds for every process to join (JAX's own default, 300 s, ends in a C++ abort)
JOIN_FAILED = 2  # exit code of a process whose run's processes did not all join in time
OUTPUTS = ("out", "plot", "requests_out", "stage_plot", "save_spec", "params_out", "readme")  # process 0 writes these
# commands that run their own worker processes or write checkpoints from every process: one process only
SINGLE_PROCESS = ("reproduce", "train-predictor", "eval-predictor")


def add_args(parser) -> None:
    """The root parser's flags for a run over several processes."""
    g = parser.add_argument_group("several processes (jax.distributed; jaxroute/distributed.py)")
    g.add_argument("--coordinator", default=os.environ.get(ENV["coordinator"]), metavar="HOST:PORT",
                   help=f"process 0's address, the same for every process (also {ENV['coordinator']}; default: one "
                   "process)")
    g.add_argument("--num-processes", type=int, default=_env_int("num_processes"), metavar="N",
                   help=f"processes in the run (also {ENV['num_processes']}; default: one)")
    g.add_argument("--process-id", type=int, default=_env_int("process_id"), metavar="I",
                   help=f"this process, 0 .. N-1; process 0 prints and writes (also {ENV['process_id']}; default: "
                   "none)")
    g.add_argument("--join-timeout", type=float, default=None, metavar="S", help=f"seconds for every process to join before the run ends with an error (also "
                   f"{JOIN_TIMEOUT_ENV}; default: {JOIN_TIMEOUT_S})")
    g.add_argument("--distributed", choices=("auto",), default=None,
                   help="join the processes a SLURM or Open MPI launch started (JAX reads their layout; default: "
                   "off)")


def _env_int(name: str) -> int | None:
    v = os.environ.get(ENV[name])
    return int(v) if v not in (None, "") and v.strip().lstrip("-").isdigit() else None


def start(args) -> bool:
    """Join the run's processes when the flags ask for several (True), before any JAX computation."""
    manual = (args.coordinator, args.num_processes, args.process_id)
    if args.distributed is None and all(v is None for v in manual):
        return False
    if args.command in SINGLE_PROCESS:
        raise JaxrouteError(f"`jaxroute {args.command}` runs in one process (it starts its own workers or writes "
                            "checkpoints); drop --coordinator / --distributed")
    if args.distributed is None:
        if any(v is None for v in manual):
            raise JaxrouteError("a run over several processes needs --coordinator, --num-processes and --process-id "
                                "(or --distributed auto under SLURM / Open MPI)")
        n, i = args.num_processes, args.process_id
        if n < 1 or not 0 <= i < n:
            raise JaxrouteError(f"--process-id must be in 0 .. {n - 1} for --num-processes {n}, got {i}")
        if n == 1:
            return False
        check_coordinator(args.coordinator)
    join(args.coordinator, args.num_processes, args.process_id, _join_timeout(args.join_timeout))
    return True


def _join_timeout(flag: float | None) -> float:
    """--join-timeout, else JAXROUTE_JOIN_TIMEOUT_S, else the default: a positive number of seconds."""
    raw = flag if flag is not None else os.environ.get(JOIN_TIMEOUT_ENV, JOIN_TIMEOUT_S)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < 86_400:
        raise JaxrouteError(f"--join-timeout ({JOIN_TIMEOUT_ENV}) must be seconds in (0, 86400), got {raw}")
    return seconds


def check_coordinator(address: str) -> None:
    """A coordinator address JAX can use: HOST:PORT with a port in 1 .. 65535 and a host that resolves."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise JaxrouteError(f"--coordinator must be HOST:PORT with a port in 1 .. 65535, got {address!r}")
    try:
        socket.getaddrinfo(host.strip("[]"), int(port))
    except OSError as e:
        raise JaxrouteError(f"--coordinator host {host!r} does not resolve: {e.strerror or e}") from None


def join(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None,
         timeout_s: float = JOIN_TIMEOUT_S) -> None:
    """Join a run over several processes before any JAX computation (the library's entry; all None: SLURM or Open
    MPI's layout). `sim.run_grid` then lays every grid over all the processes' devices. A process that has not
    joined within `timeout_s` prints one line and exits with `JOIN_FAILED` (JAX's runtime cannot be interrupted
    while it waits, and its own deadline aborts the process with a C++ stack trace)."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices' collectives across processes
    heartbeat = int(os.environ.get(HEARTBEAT_ENV, "100"))
    where = coordinator or "the launcher's coordinator"
    me = "this process" if process_id is None else f"process {process_id}"
    others = "the coordinator (process 0)" if process_id else "the other processes"
    watchdog = threading.Timer(timeout_s, _give_up, (f"error: {me} waited {timeout_s:g} s for {others} to join at "
                                                     f"{where}; start every process, or raise --join-timeout",))
    watchdog.daemon = True
    watchdog.start()
    try:
        jax.distributed.initialize(coordinator, num_processes, process_id, heartbeat_timeout_seconds=heartbeat,
                                   initialization_timeout=int(timeout_s) + 60)  # the watchdog speaks first
    except Exception as e:  # noqa: BLE001 (the runtime's errors have no common type)
        raise JaxrouteError(f"could not join the run's processes at {where}: "
                            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    finally:
        watchdog.cancel()
    print(f"joined: process {jax.process_index()} of {jax.process_count()} at {where}, "
          f"{jax.device_count()} devices in all", file=sys.stderr, flush=True)


def _give_up(line: str) -> None:
    """The join's deadline: one line, then out (the runtime's wait holds the main thread)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    os._exit(JOIN_FAILED)


def is_main() -> bool:
    """This process prints and writes (process 0, or the only one)."""
    import jax

    return jax.process_index() == 0


def quiet_unless_main(args) -> None:
    """On every process but 0: no output files, nothing printed (the tables come from process 0)."""
    if is_main():
        return
    for dest in OUTPUTS:
        if getattr(args, dest, None) is not None:
            setattr(args, dest, None)
    sys.stdout.flush()
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the runtime's own lines (gloo's) too
