"""Test set-up: four simulated CPU devices, so sharding is exercised on any machine; no compile cache."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAXROUTE_NO_PROGRESS", "1")
os.environ["JAXROUTE_NO_COMPILE_CACHE"] = "1"  # the CLI under test must not write to the user's cache

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_enable_x64", False)



import pytest  # noqa: E402

MAP_BUDGET = 30_000  # memory mappings this process may hold before compiled programs are dropped


def _mappings() -> int:
    try:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)
    except OSError:  # not Linux: no such limit to guard
        return 0


@pytest.fixture(autouse=True)
def _release_compiled_programs():
    """Drop every compiled program once the process holds many memory mappings. XLA's CPU executables
    each hold mappings (a grid program ~2,000), the suite compiles hundreds, and the kernel's limit
    (vm.max_map_count, 65,530 by default) then aborts a later compilation ("Fatal Python error:
    Aborted"). Tests that count compilations start from `sim.clear_compiled` anyway."""
    yield
    if _mappings() > MAP_BUDGET:
        from jaxroute import sim
        from jaxroute.clusters.replicas import model as replica_model

        sim.clear_compiled()
        replica_model._SINGLE.clear()
        jax.clear_caches()


@pytest.fixture(scope="session")
def quick_report(tmp_path_factory):
    """`jaxroute reproduce all --quick` run once per session, in a fresh process (as a user would): its folder.

    The wrapper tests of scripts/ resume from its parts (cli_helpers.resume_from), so each experiment runs once per
    suite. JAXROUTE_TEST_QUICK_REPORT=DIR reuses a finished `reproduce all --quick --out DIR` instead (development)."""
    import subprocess
    import sys
    from pathlib import Path

    if os.environ.get("JAXROUTE_TEST_QUICK_REPORT"):
        return Path(os.environ["JAXROUTE_TEST_QUICK_REPORT"])
    out = tmp_path_factory.mktemp("reproduce") / "all"
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_")}
    env |= {"JAX_PLATFORMS": "cpu", "JAXROUTE_NO_COMPILE_CACHE": "1"}
    res = subprocess.run([sys.executable, "-m", "jaxroute", "reproduce", "all", "--quick", "--out", str(out),
                          "--no-progress"], capture_output=True, text=True, env=env, timeout=3600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (out / "stdout.txt").write_text(res.stdout)
    return out

