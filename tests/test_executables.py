"""The executable store: a warm grid loads its program without tracing it, and gets the same results."""

import jax
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache

from jaxroute import executables, sim
from tests.test_sim import ToyModel, _params


@pytest.fixture
def store(tmp_path, monkeypatch):
    """The store on (the suite turns it off), in a folder of its own, and JAX's persistent cache in an empty one:
    every program is compiled here, not loaded from the suite's cache (one that is is never stored)."""
    monkeypatch.delenv(executables.OFF_ENV, raising=False)
    folder = tmp_path / "store"
    monkeypatch.setattr(executables, "store_dir", lambda: folder)
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax"))
    compilation_cache.reset_cache()
    jax.clear_caches()
    executables.forget()
    yield folder
    executables.forget()
    jax.config.update("jax_compilation_cache_dir", before)
    compilation_cache.reset_cache()


def _grid(model, **kw):
    sim.clear_compiled(model)  # as a new process: no jitted function, nothing loaded
    out = sim.run_grid(model, jax.random.key(1), np.float32(1.0), _params([0, 1], scale=0.5), 3, **kw)
    return out.metrics["x"], sim.compile_count(model, "advance")


def test_a_warm_grid_loads_its_program_without_tracing_it(store, monkeypatch):
    model = ToyModel(n=7)
    cold, traced = _grid(model)
    assert traced == 1 and len(list(store.glob("*.pkl"))) == 1
    warm, traced = _grid(model)
    assert traced == 0  # loaded, not traced
    np.testing.assert_array_equal(warm, cold)
    # an edit of the package's source names another program: traced again (and found in JAX's cache, so not
    # stored: see the last test)
    monkeypatch.setattr(executables, "source_digest", lambda: "edited")
    hits = executables._count_jax_cache_hits()
    again, traced = _grid(model)
    assert traced == 1 and executables._count_jax_cache_hits() > hits and len(list(store.glob("*.pkl"))) == 1
    np.testing.assert_array_equal(again, cold)


def test_chunked_grids_load_every_program(store):
    model = ToyModel(n=9)
    whole, _ = _grid(model)
    cold, traced = _grid(model, chunk=4, progress="toy")
    assert traced == 1 and len(list(store.glob("*.pkl"))) == 5  # run; init, chunk, done, metrics
    warm, traced = _grid(model, chunk=4, progress="toy")
    assert traced == 0
    np.testing.assert_array_equal(warm, cold)
    np.testing.assert_array_equal(cold, whole)


def test_a_damaged_stored_program_is_compiled_again(store):
    model = ToyModel(n=5)
    cold, _ = _grid(model)
    (path,) = store.glob("*.pkl")
    path.write_bytes(b"cut short")
    again, traced = _grid(model)
    assert traced == 1 and not path.exists()  # dropped; compiled (here: from JAX's cache, so not stored again)
    np.testing.assert_array_equal(again, cold)


def test_what_is_never_stored(monkeypatch):
    args = (np.zeros(3, np.float32),)
    assert executables.key("Model(f=<function f at 0x7f00>)|run", args) is None  # a new address every process
    assert executables.key("Model(n=3)|run", args) != executables.key("Model(n=4)|run", args)
    assert executables.key("Model(n=3)|run", args) != executables.key("Model(n=3)|run", (np.zeros(4, np.float32),))
    monkeypatch.setenv(executables.OFF_ENV, "1")
    assert executables.store_dir() is None
    monkeypatch.setenv(executables.OFF_ENV, "0")
    assert executables.store_dir() == executables.Path(jax.config.jax_compilation_cache_dir) / executables.STORE_DIR
    jax.config.update("jax_enable_compilation_cache", False)  # --no-compile-cache: the store goes with the cache
    try:
        assert executables.store_dir() is None
    finally:
        jax.config.update("jax_enable_compilation_cache", True)


def test_a_program_from_jax_cache_runs_and_is_not_stored(store, monkeypatch):
    """XLA:CPU loses kernels when an executable JAX loaded from its persistent cache is serialized again (it then
    fails: "Function ... not found"): such a program runs as loaded and is left out of the store."""
    model = ToyModel(n=6)
    monkeypatch.setattr(executables, "store_dir", lambda: None)
    plain, _ = _grid(model)  # the store off: JAX compiles the program and keeps it in its cache
    jax.clear_caches()  # as a new process: the next compilation looks in JAX's persistent cache
    monkeypatch.setattr(executables, "store_dir", lambda: store)
    folder = store
    hits = executables._count_jax_cache_hits()
    got, traced = _grid(model)
    assert executables._count_jax_cache_hits() > hits  # loaded from JAX's cache ...
    assert traced == 1 and not list(folder.glob("*.pkl"))  # ... and not stored
    np.testing.assert_array_equal(got, plain)


def test_a_second_cli_run_loads_the_stored_program(tmp_path):
    """As a user runs it: the first `jaxroute bins` compiles and stores its grid, the second prints the same table
    and compiles nothing (the grid comes from the store, its helpers from JAX's cache)."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != executables.OFF_ENV}
    env |= {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache")}

    def run(n: int):
        log = tmp_path / f"log{n}.jsonl"  # its own log: the suite's counts programs compiled twice
        out = subprocess.run([sys.executable, "-m", "jaxroute", "bins", "--n", "10"], capture_output=True, text=True,
                             env=env | {"JAXROUTE_COMPILE_LOG": str(log)}, check=True).stdout
        records = [json.loads(line) for line in log.read_text().splitlines()]
        return out.splitlines()[:-1], [r for r in records if "program" in r and not r["hit"]]  # the table; compiled

    table, compiled = run(1)
    assert "nan" not in "\n".join(table) and " - " in table[3]  # n < 16: no asymptotic formula, not a NaN
    assert any(r["program"] == "jit(grid_rows)" for r in compiled)
    assert len(list((tmp_path / "cache" / executables.STORE_DIR).glob("*.pkl"))) == 1
    again, compiled = run(2)
    assert again == table and compiled == []


def test_the_store_keeps_the_programs_used_last_within_its_bound(tmp_path):
    import os

    for i, age in enumerate((30, 10, 20)):  # seconds since last use
        path = tmp_path / f"p{i}.pkl"
        path.write_bytes(b"x" * 100)
        os.utime(path, (path.stat().st_mtime - age, path.stat().st_mtime - age))
    executables.trim(tmp_path, max_bytes=250)
    assert sorted(p.name for p in tmp_path.glob("*.pkl")) == ["p1.pkl", "p2.pkl"]  # the least recent went
    executables.trim(tmp_path, max_bytes=100)
    assert [p.name for p in tmp_path.glob("*.pkl")] == ["p1.pkl"]
