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
