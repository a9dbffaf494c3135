"""Where a test run's time went, from the files `JAXROUTE_TEST_PROFILE=FILE` wrote (one per xdist worker).

Sums the per-test and per-program tables of tests/compile_profile.py: programs compiled and seconds compiling, in
the test processes and in the subprocesses they started (the background `reproduce all --quick` among them), the
tests' wall seconds, and the rest of it (wall - compile - load: mostly running), by test module and by kind of
grid program. Give two runs to set them side by side (before, after).

    python scripts/suite_profile.py /tmp/prof.json [/tmp/prof_after.json] [--top 15]
"""

from __future__ import annotations

import argparse
import glob
import json
import re
from collections import defaultdict

KIND = re.compile(r"^(\w+)#[0-9a-f]+\.(\w+)")  # sim.last_traced_program: "Model#hash.kind[chunk] xN fast"


def load(path: str) -> list[dict]:
    files = sorted(glob.glob(f"{path}.gw*")) or [path]
    out = []
    for f in files:
        with open(f) as fh:
            out.append(json.load(fh))
    if not out:
        raise SystemExit(f"no profile at {path} (nor {path}.gw*)")
    return out


def summary(path: str) -> dict:
    """Totals, per test module and per grid program kind, of one run."""
    totals = defaultdict(float)
    modules = defaultdict(lambda: defaultdict(float))
    kinds = defaultdict(lambda: defaultdict(float))
    for part in load(path):
        for test, row in part["tests"].items():
            module = test.split("::")[0]
            for key in ("compile_s", "compiles", "load_s", "wall_s"):
                totals[f"tests_{key}"] += row.get(key, 0.0)
                modules[module][key] += row.get(key, 0.0)
        for row in part["subprocesses"].values():
            totals["subprocess_compile_s"] += row.get("compile_s", 0.0)
            totals["subprocess_compiles"] += row.get("compiles", 0.0)
        for label, row in part["programs"].items():
            m = KIND.match(label)
            kind = f"{m.group(1)}.{m.group(2)}" if m else ("jit(run) (run_single)" if label == "jit(run)" else
                                                          "other jitted functions")
            kinds[kind]["compile_s"] += row.get("compile_s", 0.0)
            kinds[kind]["compiles"] += row.get("compiles", 0.0)
        totals["guard_fired"] += part.get("guard_fired", 0)
        totals["module_releases"] += part.get("module_releases", 0)
        totals["compiled_twice"] += len(part.get("compiled_twice", []))
    return {"totals": dict(totals), "modules": modules, "kinds": kinds}


def _table(name: str, runs: list[dict], key: str, top: int) -> None:
    rows = sorted({k for r in runs for k in r[key]}, key=lambda k: -runs[-1][key].get(k, {}).get("compile_s", 0.0))
    heads = " | ".join(f"run {i + 1}: compiled, compile s" + (", wall s" if key == "modules" else "")
                       for i in range(len(runs)))
    print(f"\n| {name} | {heads} |\n|---|" + "---|" * len(runs))
    for k in rows[:top]:
        cells = []
        for r in runs:
            row = r[key].get(k, {})
            cell = f"{row.get('compiles', 0):.0f}, {row.get('compile_s', 0):.1f}"
            cells.append(cell + (f", {row.get('wall_s', 0):.1f}" if key == "modules" else ""))
        print(f"| {k} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profiles", nargs="+", help="the JAXROUTE_TEST_PROFILE path of each run (its .gw* files are read)")
    ap.add_argument("--top", type=int, default=15, help="rows of the per-module and per-kind tables (default 15)")
    args = ap.parse_args(argv)
    runs = [summary(p) for p in args.profiles]
    print("| | " + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " |\n|---|" + "---|" * len(runs))
    for key, label in (("tests_compiles", "programs compiled in the test processes"),
                       ("tests_compile_s", "seconds compiling in the test processes"),
                       ("tests_load_s", "seconds loading from the persistent cache"),
                       ("subprocess_compiles", "programs compiled in subprocesses (quick report included)"),
                       ("subprocess_compile_s", "seconds compiling in subprocesses"),
                       ("tests_wall_s", "tests' wall seconds, summed over workers"),
                       ("guard_fired", "memory-mapping guard fired"), ("module_releases", "module releases"),
                       ("compiled_twice", "programs compiled twice")):
        print(f"| {label} | " + " | ".join(f"{r['totals'].get(key, 0):,.0f}" for r in runs) + " |")
    running = [r["totals"].get("tests_wall_s", 0) - r["totals"].get("tests_compile_s", 0)
               - r["totals"].get("tests_load_s", 0) for r in runs]
    print("| tests' wall - compile - load (mostly running, and waiting for the quick report) | "
          + " | ".join(f"{x:,.0f}" for x in running) + " |")
    _table("test module", runs, "modules", args.top)
    _table("program (model.kind)", runs, "kinds", args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
