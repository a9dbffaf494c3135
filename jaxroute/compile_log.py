"""Every XLA program this process gets, as a record: name, seconds, persistent-cache key, hit or compiled.

JAX reports each backend compilation as a duration event (`/jax/core/compile/backend_compile_duration`,
which also covers a load from the persistent cache) and, when the persistent cache is on, logs the
program's cache key with "hit" or "MISS" just before. `watch(callback)` joins the two into one record per
program: `{"program", "s", "key", "hit", "t"}` (key is None when the persistent cache is off; t is the wall
clock when the program was ready). The test suite's compile profile and `JAXROUTE_COMPILE_LOG=FILE` (one JSON
line per program, and a `mark` line when a grid's first step is launched: `sim.run_grid`) are built on it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
LOG_ENV = "JAXROUTE_COMPILE_LOG"
TAG_ENV = "JAXROUTE_COMPILE_LOG_TAG"  # copied into each line of the log (the test suite names the test here)
_BASE_TAG_ENV = "_JAXROUTE_COMPILE_LOG_BASE_TAG"  # the tag this process started with, kept by `tag_programs`
_KEY = re.compile(r"(?P<kind>hit|MISS) for '(?P<name>[^']*)' with key '(?P<key>[^']*)'")

_callbacks: list[Callable[[dict], None]] = []
_pending: dict[str, object] = {}  # the cache lookup of the program being compiled now
_logged_to: set[str] = set()


class _CacheKeyHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        m = _KEY.search(record.getMessage())
        if m:
            _pending.update(key=m["key"], hit=m["kind"] == "hit")


def _on_duration(event: str, seconds: float, **kwargs) -> None:
    if event != BACKEND_COMPILE:
        return
    rec = {"program": str(kwargs.get("fun_name", "?")), "s": seconds, "key": _pending.get("key"),
           "hit": bool(_pending.get("hit", False)), "t": time.time()}
    _pending.clear()
    for cb in _callbacks:
        cb(rec)


def watch(callback: Callable[[dict], None]) -> None:
    """Call `callback(record)` for every program this process compiles or loads from the cache from now on."""
    if not _callbacks:
        from jax import monitoring

        monitoring.register_event_duration_secs_listener(_on_duration)
        logger = logging.getLogger("jax._src.compiler")
        logger.addHandler(_CacheKeyHandler(logging.DEBUG))
        logger.setLevel(logging.DEBUG)
    _callbacks.append(callback)


def mark(event: str) -> None:
    """Write `{"mark": event, "t": now}` to the logs of `log_to` (none: nothing), e.g. the first simulated step."""
    for path in _logged_to:
        with open(path, "a") as f:
            f.write(json.dumps({"mark": event, "t": time.time(), "pid": os.getpid()}) + "\n")


def tag_programs(tag: str) -> None:
    """Name what this process does from now on in its log lines (`TAG_ENV`), after any tag it was started with."""
    base = os.environ.get(_BASE_TAG_ENV, os.environ.get(TAG_ENV) or "")
    os.environ[_BASE_TAG_ENV] = base
    os.environ[TAG_ENV] = f"{base} {tag}".strip()


def log_from_env() -> None:
    """`log_to` the file named by `JAXROUTE_COMPILE_LOG`, when it is set (the CLI and its worker processes)."""
    if os.environ.get(LOG_ENV):
        log_to(os.environ[LOG_ENV])


def log_to(path: str) -> None:
    """Append one JSON line per program (with the command that asked for it) to `path`; once per process."""
    if path in _logged_to:
        return
    _logged_to.add(path)
    argv = sys.argv[1:3]

    def write(rec: dict) -> None:
        with open(path, "a") as f:
            f.write(json.dumps({"argv": argv, "pid": os.getpid(), "tag": os.environ.get(TAG_ENV), **rec}) + "\n")

    watch(write)
