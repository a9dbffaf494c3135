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
os.environ.pop("JAXROUTE_NO_COMPILE_CACHE", None)
os.environ["JAX_COMPILATION_CACHE_DIR"] = str(TEST_COMPILE_CACHE)  # the CLI's cache, in-process and in subprocesses
os.environ["JAXROUTE_CPU_DEVICES"] = str(TEST_DEVICES)  # subprocesses compile the suite's programs
# Every program of the suite goes to the cache, not only those the CLI keeps (cli.CACHE_MIN_COMPILE_S): the
# suite compiles the same small programs in many tests (a reference's jitted helper, a fresh lambda per call).
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
SESSION_LOG = TEST_COMPILE_CACHE.parent / f"session-{os.getpid()}.jsonl"
os.environ["JAXROUTE_COMPILE_LOG"] = str(SESSION_LOG)

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", TEST_DEVICES)
jax.config.update("jax_enable_x64", False)

import pytest  # noqa: E402

from jaxroute import cli  # noqa: E402
from tests.compile_profile import CompileProfile  # noqa: E402

MAP_BUDGET = 30_000  # memory mappings this process may hold before compiled programs are dropped


def pytest_configure(config):
    TEST_COMPILE_CACHE.mkdir(parents=True, exist_ok=True)
    cli.use_compile_cache()
    config.pluginmanager.register(CompileProfile(SESSION_LOG), "jaxroute_compile_profile")


def _mappings() -> int:
    try:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)
    except OSError:  # not Linux: no such limit to guard
        return 0


@pytest.fixture(autouse=True)
def _release_compiled_programs(request):
    """Drop every compiled program once the process holds many memory mappings. XLA's CPU executables
    each hold mappings (a grid program's kernels ~600), the suite compiles hundreds, and the kernel's limit
    (vm.max_map_count, 65,530 by default) then aborts a later compilation ("Fatal Python error:
    Aborted"). Programs dropped here come back from the persistent cache, not from XLA; the compile
    profile counts how often this fires. Tests that count compilations start from `sim.clear_compiled`."""
    yield
    if _mappings() > MAP_BUDGET:
        from jaxroute import sim
        from jaxroute.clusters.replicas import model as replica_model

        sim.clear_compiled()
        replica_model._SINGLE.clear()
        jax.clear_caches()
        request.config.pluginmanager.get_plugin("jaxroute_compile_profile").guard_fired += 1


QUICK_REPORT_TIMEOUT_S = 3600
_quick_report: dict = {}  # the background `reproduce all --quick`: its process, folder and log


def pytest_collection_modifyitems(session, config, items):
    """When a collected test needs `quick_report`, start it now in a background process and run its tests
    last: the report compiles and simulates on one core while the other tests use the other."""
    needs = [item for item in items if "quick_report" in getattr(item, "fixturenames", ())]
    if not needs or os.environ.get("JAXROUTE_TEST_QUICK_REPORT"):
        return
    items[:] = [item for item in items if item not in needs] + needs
    import subprocess
    import sys

    out = config._tmp_path_factory.mktemp("reproduce") / "all"
    log = out.parent / "stdout.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_")} | {"JAX_PLATFORMS": "cpu"}
    with open(log, "w") as stdout, open(log.with_name("stderr.txt"), "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "jaxroute", "reproduce", "all", "--quick", "--out", str(out),
                                 "--no-progress"], stdout=stdout, stderr=stderr, env=env)
    _quick_report.update(proc=proc, out=out, log=log)


def pytest_unconfigure(config):
    SESSION_LOG.unlink(missing_ok=True)
    proc = _quick_report.get("proc")
    if proc is not None and proc.poll() is None:  # the session ended before a test waited for it
        proc.kill()


@pytest.fixture(scope="session")
def quick_report():
    """`jaxroute reproduce all --quick`, run once per session in a fresh process (as a user would): its folder.

    It starts in the background at collection (`pytest_collection_modifyitems`) and shares the suite's compile
    cache and devices. The wrapper tests of scripts/ resume from its parts (cli_helpers.resume_from), so each
    experiment runs once per suite. JAXROUTE_TEST_QUICK_REPORT=DIR reuses a finished
    `reproduce all --quick --out DIR` instead (development)."""
    if os.environ.get("JAXROUTE_TEST_QUICK_REPORT"):
        return Path(os.environ["JAXROUTE_TEST_QUICK_REPORT"])
    proc, out, log = _quick_report["proc"], _quick_report["out"], _quick_report["log"]
    code = proc.wait(timeout=QUICK_REPORT_TIMEOUT_S)
    text = log.read_text()
    assert code == 0, text[-3000:] + log.with_name("stderr.txt").read_text()[-3000:]
    (out / "stdout.txt").write_text(text)
    return out
