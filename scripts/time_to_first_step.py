"""Seconds from starting a `jaxroute` command to its first simulated step, cold and warm.

Runs the command twice in fresh processes that share a new, empty compile cache (the first run compiles and
fills it, the second loads from it) and reads each run's compile log (`jaxroute.compile_log`): the seconds
XLA spent compiling, the seconds spent loading programs from the cache, and when the first grid launched its
first step (`sim.run_grid` marks it), counted from the process start.

    python scripts/time_to_first_step.py                      # jaxroute dispatch (the README's main command)
    python scripts/time_to_first_step.py --json t.json cluster --requests 400
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_run(command: list[str], cache: Path, log: Path) -> dict:
    """Run `jaxroute command` once; its compile and load seconds and its first step, from the process start."""
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache), "JAXROUTE_COMPILE_LOG": str(log)}
    env.pop("JAXROUTE_NO_COMPILE_CACHE", None)
    start = time.time()
    res = subprocess.run([sys.executable, "-m", "jaxroute", *command, "--no-progress"], env=env,
                         capture_output=True, text=True)
    wall = time.time() - start
    if res.returncode != 0:
        raise SystemExit(f"jaxroute {' '.join(command)} failed:\n{res.stderr[-2000:]}")
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    marks = [r["t"] for r in recs if r.get("mark") == "first_step"]
    programs = [r for r in recs if "program" in r]
    return {"first_step_s": (marks[0] - start) if marks else None, "wall_s": wall,
            "compile_s": sum(r["s"] for r in programs if not r["hit"]),
            "compiled": sum(not r["hit"] for r in programs),
            "load_s": sum(r["s"] for r in programs if r["hit"]), "loaded": sum(r["hit"] for r in programs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON (default: print only)")
    ap.add_argument("command", nargs=argparse.REMAINDER,
                    help="the jaxroute command and its arguments, after the options (default: dispatch)")
    args = ap.parse_args(argv)
    args.command = [a for a in args.command if a != "--"] or ["dispatch"]
    with tempfile.TemporaryDirectory(prefix="jaxroute-first-step-") as tmp:
        cache = Path(tmp) / "cache"
        runs = {name: one_run(args.command, cache, Path(tmp) / f"{name}.jsonl") for name in ("cold", "warm")}
    print(f"jaxroute {' '.join(args.command)}  (load average {os.getloadavg()[0]:.2f})")
    for name, r in runs.items():
        print(f"  {name}: first step after {r['first_step_s']:.2f} s; compiled {r['compiled']} programs in "
              f"{r['compile_s']:.2f} s, loaded {r['loaded']} from the cache in {r['load_s']:.2f} s; "
              f"whole run {r['wall_s']:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"command": args.command, **runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
