"""Test set-up: four simulated CPU devices (sharding is exercised on any machine) and one persistent
compile cache per checkout, shared by this process and every subprocess the tests start.

The cache lives in `.jax_cache/tests/` of the checkout (git ignores it): a clean clone starts cold, a
second local run starts warm, and nothing is written to the user's cache. Subprocesses get the same cache,
the same four devices (so their programs are the suite's) and the session's compile log, from which
`compile_profile` fails the session if one program is compiled twice.
"""

import os
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
TEST_COMPILE_CACHE = CHECKOUT / ".jax_cache" / "tests"
TEST_DEVICES = 4

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAXROUTE_NO_PROGRESS", "1")
# The executable store skips tracing on a warm run; the suite's compile-once checks count traces, so it is off
# here and in subprocesses (tests/test_executables.py turns it on).
os.environ["JAXROUTE_NO_EXECUTABLE_CACHE"] = "1"
os.environ.pop("JAXROUTE_NO_COMPILE_CACHE", None)
os.environ["JAX_COMPILATION_CACHE_DIR"] = str(TEST_COMPILE_CACHE)  # the CLI's cache, in-process and in subprocesses
os.environ["JAXROUTE_CPU_DEVICES"] = str(TEST_DEVICES)  # subprocesses compile the suite's programs
SESSION_LOG = TEST_COMPILE_CACHE.parent / f"session-{os.getpid()}.jsonl"
os.environ["JAXROUTE_COMPILE_LOG"] = str(SESSION_LOG)

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", TEST_DEVICES)
jax.config.update("jax_enable_x64", False)

import pytest  # noqa: E402

from jaxroute import compile_effort, runtime  # noqa: E402
from tests.compile_profile import CompileProfile  # noqa: E402

# Memory mappings this process may hold: past MODULE_BUDGET, a finished test module's compiled programs are dropped
# (routine: few programs outlive their module, and those come back from the persistent cache); past MAP_BUDGET,
# after any test (the guard: it should not fire in an ordinary run; the compile profile counts both).
MODULE_BUDGET = 20_000
MAP_BUDGET = 40_000


def pytest_configure(config):
    TEST_COMPILE_CACHE.mkdir(parents=True, exist_ok=True)
    runtime.use_compile_cache()
    config.pluginmanager.register(CompileProfile(SESSION_LOG), "jaxroute_compile_profile")


def _mappings() -> int:
    try:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)
    except OSError:  # not Linux: no such limit to guard
        return 0


def _release_compiled(config, counter: str) -> None:
    from jaxroute import sim
    from jaxroute.clusters.replicas import model as replica_model

    sim.clear_compiled()
    replica_model._SINGLE.clear()
    jax.clear_caches()
    profile = config.pluginmanager.get_plugin("jaxroute_compile_profile")
    setattr(profile, counter, getattr(profile, counter) + 1)


@pytest.fixture(autouse=True, scope="module")
def _release_programs_after_a_module(request):
    yield
    if _mappings() > MODULE_BUDGET:
        _release_compiled(request.config, "module_releases")


@pytest.fixture(autouse=True)
def _release_compiled_programs(request):
    """Drop every compiled program once the process holds many memory mappings. XLA's CPU executables
    each hold mappings (a grid program's kernels ~600), the suite compiles hundreds, and the kernel's limit
    (vm.max_map_count, 65,530 by default) then aborts a later compilation ("Fatal Python error:
    Aborted"). Programs dropped here come back from the persistent cache, not from XLA; the compile
    profile counts how often this fires. Tests that count compilations start from `sim.clear_compiled`."""
    yield
    if _mappings() > MAP_BUDGET:
        _release_compiled(request.config, "guard_fired")


QUICK_REPORT_TIMEOUT_S = 3600
QUICK_REPORT_GROUP = "quick_report"  # xdist group of the tests that read it: one worker runs them, last


def _quick_report_dir(config) -> Path:
    """One folder per session, shared by the xdist workers (each has its own basetemp below the session's)."""
    base = config._tmp_path_factory.getbasetemp()
    return (base.parent if hasattr(config, "workerinput") else base) / "reproduce-all-quick"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    """When a collected test needs `quick_report`, start `jaxroute reproduce all --quick` in a background
    process now (the first process of the session to get here starts it; the others find it started) and run
    its tests last, on one worker: the report compiles and simulates while the other tests run."""
    needs = [item for item in items if "quick_report" in getattr(item, "fixturenames", ())]
    if not needs or os.environ.get("JAXROUTE_TEST_QUICK_REPORT"):
        return
    for item in needs:
        item.add_marker(pytest.mark.xdist_group(QUICK_REPORT_GROUP))
    items[:] = [item for item in items if item not in needs] + needs
    folder = _quick_report_dir(config)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(folder / "started", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return  # another worker of this session started it
    import shlex
    import subprocess
    import sys

    # as a user runs it: the CLI's own device count (one per core), not the suite's simulated four: on two cores
    # shared with the test workers they only add threads (a replica grid's run took 2-3x as long on four as on one),
    # and the compile effort of each job (`jaxroute.compile_effort`), whatever the developer's environment says
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("XLA_") and k not in ("JAXROUTE_CPU_DEVICES", compile_effort.ENV)}
    env |= {"JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "jaxroute", "reproduce", "all", "--quick", "--out", str(folder / "all"), "--no-progress"]
    script = (f"{shlex.join(cmd)} > {shlex.quote(str(folder / 'stdout.txt'))} 2> {shlex.quote(str(folder / 'stderr.txt'))}; "
              f"echo $? > {shlex.quote(str(folder / 'rc.part'))} && mv {shlex.quote(str(folder / 'rc.part'))} "
              f"{shlex.quote(str(folder / 'rc'))}")
    config._jaxroute_quick_report = subprocess.Popen(["sh", "-c", script], env=env)


def _wait_for_quick_report(folder: Path) -> int:
    import time

    deadline = time.monotonic() + QUICK_REPORT_TIMEOUT_S
    while not (folder / "rc").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"reproduce all --quick did not finish in {QUICK_REPORT_TIMEOUT_S} s")
        time.sleep(1)
    return int((folder / "rc").read_text())


def pytest_unconfigure(config):
    SESSION_LOG.unlink(missing_ok=True)
    proc = getattr(config, "_jaxroute_quick_report", None)
    if proc is not None:  # the starter does not leave it behind: other workers' tests may still wait for it
        try:
            proc.wait(timeout=QUICK_REPORT_TIMEOUT_S)
        except BaseException:
            proc.kill()
            raise


@pytest.fixture(scope="session")
def quick_report(pytestconfig):
    """`jaxroute reproduce all --quick`, run once per session in a fresh process (as a user would): its folder.

    It starts in the background at collection (`pytest_collection_modifyitems`) and shares the suite's compile
    cache and devices. The wrapper tests of scripts/ resume from its parts (cli_helpers.resume_from), so each
    experiment runs once per suite. JAXROUTE_TEST_QUICK_REPORT=DIR reuses a finished
    `reproduce all --quick --out DIR` instead (development)."""
    if os.environ.get("JAXROUTE_TEST_QUICK_REPORT"):
        return Path(os.environ["JAXROUTE_TEST_QUICK_REPORT"])
    folder = _quick_report_dir(pytestconfig)
    code = _wait_for_quick_report(folder)
    out, text = folder / "all", (folder / "stdout.txt").read_text()
    assert code == 0, text[-3000:] + (folder / "stderr.txt").read_text()[-3000:]
    (out / "stdout.txt").write_text(text)
    return out
