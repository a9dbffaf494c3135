"""Compiled grid programs kept on disk by what determines them, so a warm run skips tracing.

JAX's persistent cache (`runtime.use_compile_cache`) is keyed by the lowered program: finding a program there
still costs its trace and lowering (1-2 s for a replica grid, several times the load). This store keys a grid
program by its inputs instead: the package's source, the jax and jaxlib versions, JAX's configuration and
`XLA_FLAGS`, the program's description (model, kind, chunk, rows together, compile effort) and its arguments'
tree structure (with the static fields of workloads and params), shapes, dtypes and shardings (devices
included). A hit loads the executable without tracing. A description that names an object's address (a
closure) is never stored, nor is a program JAX loaded from its own cache: on XLA:CPU (jaxlib 0.10) such an
executable serialized again loses kernels ("Function broadcast.7_kernel not found" when run), so only programs
compiled here are stored. The store lives in the compile cache's folder and is off with it, or with
`JAXROUTE_NO_EXECUTABLE_CACHE=1` (the test suite, whose checks count traces).
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path

import jax

from jaxroute import runtime

STORE_DIR = "jaxroute-executables"
OFF_ENV = "JAXROUTE_NO_EXECUTABLE_CACHE"
# The store's size bound: past it, the programs used least recently go (a replica grid's program is 2-3 MB, and
# every edit of the package stores its programs anew).
MAX_STORE_BYTES = 2 * 1024**3
_loaded: dict[str, Callable] = {}  # key -> executable, this process's
_jax_cache_hits = [0, False]  # programs JAX loaded from its persistent cache; whether that is counted


def _count_jax_cache_hits() -> int:
    if not _jax_cache_hits[1]:
        from jax import monitoring

        def on_event(event: str, **kwargs) -> None:
            if event == "/jax/compilation_cache/cache_hits":
                _jax_cache_hits[0] += 1

        monitoring.register_event_listener(on_event)
        _jax_cache_hits[1] = True
    return _jax_cache_hits[0]


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """sha256 of the package's Python source (any edit makes every stored program a miss)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def store_dir() -> Path | None:
    """The store's folder: inside JAX's compilation cache folder; None when either is off."""
    if runtime.env_flag(OFF_ENV):
        return None
    folder = jax.config.jax_compilation_cache_dir
    if not folder or not jax.config.jax_enable_compilation_cache:
        return None
    return Path(folder) / STORE_DIR


def key(description: str, args: tuple) -> str | None:
    """The stored program's name for `description` called on `args`; None when it cannot be named safely."""
    if " at 0x" in description:  # an object's address: a new key in every process
        return None
    leaves, tree = jax.tree.flatten(args)
    signature = [(tuple(x.shape), str(x.dtype), str(getattr(x, "sharding", None)), bool(getattr(x, "weak_type", False)))
                 for x in leaves]
    config = sorted((k, repr(v)) for k, v in jax.config.values.items())
    import jaxlib

    parts = (source_digest(), jax.__version__, jaxlib.__version__, repr(config), os.environ.get("XLA_FLAGS", ""),
             description, str(tree), repr(signature))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _load(path: Path) -> Callable | None:
    from jax.experimental import serialize_executable

    try:
        payload, in_tree, out_tree = pickle.loads(path.read_bytes())
        compiled = serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
        os.utime(path)  # used now: the last to go when the store is trimmed
        return compiled
    except FileNotFoundError:
        return None
    except Exception:  # unreadable (cut short, another jaxlib): compiled again and rewritten
        path.unlink(missing_ok=True)
        return None


def _save(compiled, path: Path) -> None:
    from jax.experimental import serialize_executable

    try:
        blob = pickle.dumps(serialize_executable.serialize(compiled))
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".part") as f:
            f.write(blob)
        os.replace(f.name, path)  # whole or absent: a reader never sees half a file
        trim(path.parent)
    except Exception:  # a program that cannot be serialized, or a full disk: the run goes on, unstored
        pass


def trim(folder: Path, max_bytes: int | None = None) -> None:
    """Delete the least recently used programs until the store holds at most `max_bytes` (`MAX_STORE_BYTES`)."""
    limit = MAX_STORE_BYTES if max_bytes is None else max_bytes
    stats = sorted(((p.stat(), p) for p in folder.glob("*.pkl")), key=lambda sp: sp[0].st_mtime, reverse=True)
    total = 0
    for st, path in stats:  # newest first: those past the bound go
        total += st.st_size
        if total > limit:
            path.unlink(missing_ok=True)


def call(fn, description: str, *args):
    """`fn(*args)` for a jitted `fn`, its executable loaded from the store when it is there (no trace), else
    compiled (traced as usual) and stored."""
    folder = store_dir()
    name = None if folder is None else key(description, args)
    if name is None:
        return fn(*args)
    compiled = _loaded.get(name)
    if compiled is None:
        path = folder / f"{name}.pkl"
        compiled = _load(path)
        if compiled is None:
            hits = _count_jax_cache_hits()
            compiled = fn.lower(*args).compile()
            if _count_jax_cache_hits() == hits:  # compiled here, not loaded from JAX's cache (see above)
                _save(compiled, path)
        _loaded[name] = compiled
    return compiled(*args)


def forget() -> None:
    """Drop this process's loaded executables (they come back from the store)."""
    _loaded.clear()
