"""One grid over two processes (jax.distributed on the loopback address, gloo collectives): `jaxroute cluster`
and `jaxroute decode` write the same per-seed records as one process, process 1 prints and writes nothing, a
killed process ends the other's run with an error and no table, a process whose peers never join ends in one line
after --join-timeout, and bad flags (an address JAX cannot use among them) are one-line errors."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from jaxroute.cli import main
from jaxroute.distributed import JOIN_FAILED
from tests.cli_helpers import cli

pytestmark = pytest.mark.xdist_group("distributed")  # the two processes share the machine's cores
CLUSTER = ["cluster", "--workload", "toolbench", "--requests", "120", "--rate", "20", "--seeds", "3", "--replicas",
           "3", "--kv-capacity", "6000", "--policies", "rr,least_load,dynamo_kv", "--no-progress"]
DECODE = ["decode", "--workload", "synthetic-prod", "--requests", "200", "--seeds", "3", "--workers", "4", "--slots",
          "8", "--policies", "jsq,br0", "--no-progress"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(argv, port: int, rank: int, out=None, env=None):
    flags = ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(rank)]
    return subprocess.Popen([sys.executable, "-m", "jaxroute", *flags, *argv, *(["--out", str(out)] if out else [])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _two_processes(argv, out, timeout=300):
    port = _port()
    procs = [_start(argv, port, rank, out if rank == 0 else out.with_name("rank1.json")) for rank in (0, 1)]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    return outs


def _results(path):
    return json.loads(path.read_text())["results"]


@pytest.mark.parametrize("argv", [CLUSTER, DECODE], ids=["cluster", "decode"])
def test_two_processes_write_the_records_of_one(argv, tmp_path, capsys):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert main([*argv, "--out", str(one)]) == 0
    capsys.readouterr()
    outs = _two_processes(argv, two)
    assert json.dumps(_results(two), sort_keys=True) == json.dumps(_results(one), sort_keys=True)
    # process 0 printed the tables; process 1 printed nothing and wrote nothing
    assert "wrote" in outs[0][0] and outs[1][0] == "" and not (tmp_path / "rank1.json").exists()


def _joined(proc, deadline_s: float = 240) -> None:
    """Wait until `proc` says it joined the run (its stderr's "joined:" line), or fail."""
    lines = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True).start()
    end = time.monotonic() + deadline_s
    while not any(line.startswith("joined:") for line in lines):
        assert proc.poll() is None and time.monotonic() < end, "".join(lines)[-2000:]
        time.sleep(0.1)


def test_a_killed_process_ends_the_run_without_a_table(tmp_path):
    env = dict(os.environ, JAXROUTE_HEARTBEAT_S="3")
    argv = [*CLUSTER[:4], "3000", *CLUSTER[5:]]  # long enough to be killed mid-run
    port, out = _port(), tmp_path / "r.json"
    procs = [_start(argv, port, rank, out if rank == 0 else None, env) for rank in (0, 1)]
    try:
        _joined(procs[1])  # killed once joined: before that, the join's deadline is what ends process 0
        time.sleep(2)
        procs[1].send_signal(signal.SIGKILL)
        _, err = procs[0].communicate(timeout=120)
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode != 0 and not out.exists()
    assert "unhealthy" in err or "died" in err or "error" in err.lower(), err[-2000:]


@pytest.mark.parametrize("rank, waits_for", [(0, "the other processes"), (1, "the coordinator (process 0)")])
def test_a_process_whose_peers_never_come_ends_in_one_line(rank, waits_for, tmp_path):
    out = tmp_path / "r.json"
    proc = _start(["--join-timeout", "3", *CLUSTER], _port(), rank, out)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == JOIN_FAILED and not out.exists()
    assert err.strip().splitlines() == [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert f"process {rank} waited 3 s for {waits_for} to join" in err and "--join-timeout" in err


@pytest.mark.parametrize("argv, msg", [
    (["--coordinator", "127.0.0.1:1"], "needs --coordinator, --num-processes and --process-id"),
    (["--coordinator", "127.0.0.1:1", "--num-processes", "2", "--process-id", "2"], "--process-id must be in 0 .. 1"),
    (["--distributed", "auto", "reproduce", "lecture"], "`jaxroute reproduce` runs in one process"),
    (["--coordinator", "localhost:abc", "--num-processes", "2", "--process-id", "0"], "a port in 1 .. 65535, got"),
    (["--coordinator", "localhost:70000", "--num-processes", "2", "--process-id", "1"], "a port in 1 .. 65535"),
    (["--coordinator", "no-such-host.invalid:1234", "--num-processes", "2", "--process-id", "0"],
     "host 'no-such-host.invalid' does not resolve"),
    (["--coordinator", "127.0.0.1:1", "--num-processes", "2", "--process-id", "0", "--join-timeout", "0"],
     "--join-timeout (JAXROUTE_JOIN_TIMEOUT_S) must be seconds in (0, 86400), got 0"),
])
def test_bad_process_flags(argv, msg, capsys):
    if "reproduce" not in argv:
        argv = [*argv, "cluster", "--requests", "5", "--seeds", "1"]
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err
