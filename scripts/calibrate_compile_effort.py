"""Where a fast compile stops paying: compile seconds saved vs run seconds lost, per model.

For each bench model (dispatch, the replica cluster on toolbench, decode DP) this compiles the same grid
at both efforts (`jaxroute.compile_effort`, persistent cache off) and times a second, compiled run of it.
The break-even work is the job (rows x events, as `compile_effort.is_fast` counts it) at which the slower
run eats the faster compilation; `compile_effort.FAST_MAX_WORK` should sit below the smallest.

    python scripts/calibrate_compile_effort.py [--out calibration.json]
"""

from __future__ import annotations

import argparse
import json
import time

import jax

from jaxroute import compile_effort, runtime, sim
from jaxroute.bench import models
from jaxroute.bench.config import BenchConfig
from jaxroute.bench.measure import CompileTimer

# (seeds, requests per seed) per model: runs of a few seconds each, so the run-time difference shows
SIZES = {"dispatch": (64, 20_000), "cluster/toolbench": (16, 500), "decode": (8, 1000)}


def _scenarios(cfg: BenchConfig):
    yield models.dispatch_scenario(cfg)
    yield models.cluster_scenario(cfg, "toolbench", cfg.policies)
    yield models.decode_scenario(cfg)


def measure(scn, seeds: int, requests: int, effort: str) -> dict:
    works: list[int] = []
    is_fast = compile_effort.is_fast

    def recording(work: int) -> bool:
        works.append(int(work))
        return is_fast(work)

    compile_effort.is_fast = recording
    try:
        with compile_effort.forced(effort):
            sim.clear_compiled()
            with CompileTimer() as timer:
                t0 = time.perf_counter()
                scn.run(seeds, requests, 0)
                first = time.perf_counter() - t0
            t0 = time.perf_counter()
            scn.run(seeds, requests, 1)
            second = time.perf_counter() - t0
    finally:
        compile_effort.is_fast = is_fast
    return {"compile_s": timer.seconds, "first_s": first, "run_s": second, "work": sum(works)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the table as JSON")
    args = ap.parse_args()
    runtime.use_all_cpu_cores()  # as the CLI runs (one device per core); no persistent cache: every compile is timed
    jax.config.update("jax_enable_compilation_cache", False)
    cfg = BenchConfig()
    rows = []
    for scn in _scenarios(cfg):
        seeds, requests = SIZES[scn.name]
        opt, fast = (measure(scn, seeds, requests, e) for e in ("optimized", "fast"))
        saved = opt["compile_s"] - fast["compile_s"]
        lost_per_work = (fast["run_s"] - opt["run_s"]) / opt["work"]
        breakeven = saved / lost_per_work if lost_per_work > 0 else float("inf")
        row = {"model": scn.name, "seeds": seeds, "requests": requests, "work": opt["work"],
               "compile_s": [round(opt["compile_s"], 2), round(fast["compile_s"], 2)],
               "run_s": [round(opt["run_s"], 3), round(fast["run_s"], 3)], "breakeven_work": breakeven}
        rows.append(row)
        print(f"{scn.name:18s} work {opt['work']:>11,}  compile {opt['compile_s']:6.2f} s -> {fast['compile_s']:6.2f} s"
              f"  run {opt['run_s']:7.3f} s -> {fast['run_s']:7.3f} s  break-even work {breakeven:>13,.0f}", flush=True)
    print(f"smallest break-even: {min(r['breakeven_work'] for r in rows):,.0f} row-events "
          f"(compile_effort.FAST_MAX_WORK = {compile_effort.FAST_MAX_WORK:,})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
