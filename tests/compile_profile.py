"""Where the suite's time goes, and a guard against compiling one program twice.

A pytest plugin (conftest registers it). Through `jaxroute.compile_log` it sees every XLA program the
suite gets, in this process and in the subprocesses it starts (they append to the session's log,
`JAXROUTE_COMPILE_LOG`), and attributes each to the running test and to the program: the engine's grid
programs by model and kind (`sim.last_traced_program`), the rest by JAX's name.

- The guard: every program is written to the persistent cache (`runtime.CACHE_MIN_COMPILE_S` is 0), so
  compiling one key a second time anywhere in the session means some process did not share the cache
  (or a program JAX does not cache, e.g. one with host callbacks, was built twice). Programs that took
  under `GUARD_MIN_S` are not worth failing for. The session then fails, naming the programs.
- `JAXROUTE_TEST_PROFILE=FILE` writes per-test and per-program tables (seconds compiling, seconds loading
  from the cache, wall seconds) as JSON at the end of the session.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter, defaultdict
from pathlib import Path

from jaxroute import compile_log, sim

GUARD_MIN_S = 0.5  # programs that compiled faster are not reported as compiled twice


def _count(row: dict, rec: dict) -> None:
    """Add one program record to a table row: seconds and count, as a compilation or a load from the cache."""
    kind = "load" if rec["hit"] else "compile"
    row[f"{kind}_s"] += rec["s"]
    row[f"{kind}s"] += 1


class CompileProfile:
    def __init__(self, session_log: Path) -> None:
        self.session_log = session_log
        self.test = "<collection>"
        self.guard_fired = 0  # times the memory-mapping guard dropped every compiled program after a test
        self.module_releases = 0  # times a finished module's programs were dropped (conftest.MODULE_BUDGET)
        self.per_test: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.per_program: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.records: list[dict] = []  # this process's programs, with the test that asked
        compile_log.watch(self._on_program)

    def _on_program(self, rec: dict) -> None:
        label = sim.last_traced_program() if "grid_rows" in rec["program"] else rec["program"]
        for row in (self.per_test[self.test], self.per_program[label]):
            _count(row, rec)
        self.records.append({**rec, "label": label, "test": self.test, "pid": os.getpid()})

    def pytest_runtest_protocol(self, item, nextitem):
        self.test = item.nodeid
        os.environ[compile_log.TAG_ENV] = item.nodeid  # subprocesses started by this test log under its name
        self._t0 = time.perf_counter()

    def pytest_runtest_logfinish(self, nodeid, location):
        if self.test != nodeid:  # xdist's controller hears of tests its workers ran
            return
        self.per_test[nodeid]["wall_s"] += time.perf_counter() - self._t0
        self.test = "<between tests>"

    def _all_records(self) -> list[dict]:
        """This process's records and the subprocesses' (the session log holds both; keep each once)."""
        others = []
        if self.session_log.exists():
            for line in self.session_log.read_text().splitlines():
                rec = json.loads(line)
                if "program" in rec and rec.get("pid") != os.getpid():
                    others.append({**rec, "label": rec["program"], "test": f"{rec['tag']} (subprocess {' '.join(rec['argv'])})"})
        return self.records + others

    def compiled_twice(self) -> list[str]:
        """Programs the session compiled again after a first compilation had finished (and so was in the cache).

        Two processes that compile one program at the same time (xdist workers, the background report) both
        miss the cache; that is a race, not a process that ignores the cache, and is not reported."""
        first_done: dict[str, dict] = {}
        again: Counter = Counter()
        for rec in sorted(self._all_records(), key=lambda r: r["t"]):
            if rec["key"] is None or rec["hit"]:
                continue
            first = first_done.setdefault(rec["key"], rec)
            if first is not rec and rec["t"] - rec["s"] > first["t"]:
                again[rec["key"]] += 1
        return [f"{first_done[k]['label']} ({first_done[k]['s']:.1f} s, first in {first_done[k]['test']}) compiled "
                f"{n} more time(s)" for k, n in again.items() if first_done[k]["s"] >= GUARD_MIN_S]

    def pytest_sessionfinish(self, session, exitstatus):
        twice = self.compiled_twice()
        if twice:
            session.exitstatus = 1
            tr = session.config.pluginmanager.get_plugin("terminalreporter")
            if tr is not None:
                tr.write_line("compiled twice in one session (the persistent cache was not shared):", red=True)
                for line in twice:
                    tr.write_line("  " + line, red=True)
        path = os.environ.get("JAXROUTE_TEST_PROFILE")
        if path and os.environ.get("PYTEST_XDIST_WORKER"):
            path = f"{path}.{os.environ['PYTEST_XDIST_WORKER']}"  # one file per worker
        if path:
            sub = defaultdict(lambda: defaultdict(float))
            for rec in self._all_records()[len(self.records):]:
                _count(sub[rec["test"]], rec)
            Path(path).write_text(json.dumps({"tests": self.per_test, "programs": self.per_program,
                                              "subprocesses": sub, "guard_fired": self.guard_fired,
                                              "module_releases": self.module_releases,
                                              "compiled_twice": twice}, indent=1))
