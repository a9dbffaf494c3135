"""Capacity study: the largest request rate each production router sustains under a TTFT-p90 and a TPOT-p90 SLO,
at 4, 8 and 16 replicas, on shared-prefix and the Mooncake trace; then llm-d's scorer weights tuned for the
same workload (`jaxroute.experiments.tune`, CMA-ES from evosax) and the tuned capacity beside the default's.

Deployment: replicas of Llama-3.1-70B on four H200 each (TP 4, roofline cost model, as in pd_study), chunked prefill 512, 64 running.
Every router x replica count of a workload is searched at once (`experiments.capacity`): each round is one
compiled batch per model shape (routers that run on part of a cluster share one model with a traced count;
sglang_cache_aware and preble get one per count). The script prints how many configurations x seeds were
simulated and the wall time, beside the time the same runs would take at the pure-Python reference's speed
(`tests/reference_replicas.py`, timed here on one run).

    python scripts/capacity_study.py [--quick] [--out results/capacity_study.json]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from jaxroute import report
from jaxroute.cli import use_all_cpu_cores
from jaxroute.clusters import replicas
from jaxroute.experiments import capacity as cap
from jaxroute.experiments.cluster import build_workload
from jaxroute.metrics import summarize

ROUTERS = ("rr", "least_load", "sglang_cache_aware", "llmd_precise", "dynamo_kv", "preble")
REPLICAS = (4, 8, 16)
GPU, MODEL, TP = "H200", "Llama-3.1-70B", 4
# per workload: (SLO, rate range searched in req/s)
WORKLOADS = {"shared-prefix": ("ttft_p90_s<=0.5,tpot_p90_s<=0.03", (1.0, 400.0)),
             "mooncake": ("ttft_p90_s<=5,tpot_p90_s<=0.05", (0.2, 60.0))}
SP = dict(groups=8, prompts_per_group=16, system_tokens=2000, question_tokens=300, output_tokens=400)


def reference_seconds_per_run(workload, requests: int) -> float | None:
    """Wall seconds of one run of the pure-Python reference (rr, 4 replicas) on this workload, or None."""
    from jaxroute.bench.references import time_replica_reference

    p = replicas.make_params("rr", rate=1.0, gpu=GPU, model=MODEL, tp=TP)
    r = time_replica_reference(workload, p, replicas=4, max_running=64, max_queue=requests, policy="rr")
    return r.get("seconds")


def capacity_part(name: str, routers, counts, *, requests: int, seeds: int, points: int, rounds: int, tol: float,
                  trace: str | None, progress: bool) -> dict:
    slo_text, (lo, hi) = WORKLOADS[name]
    wl = build_workload(name, requests, trace, shared_prefix=SP if name == "shared-prefix" else None)
    rows = [(p, g) for p in routers for g in counts]
    ev = cap.ClusterEvaluator(rows, wl, seeds=seeds, gpu=GPU, model_name=MODEL, tp=TP, progress=progress)
    start = time.perf_counter()
    res = cap.search(ev, len(rows), lo, hi, cap.parse_slo(slo_text), tol=tol, points=points, max_rounds=rounds,
                     on_round=lambda r, n: print(f"  {name} round {r}: {n} brackets open", flush=True))
    wall = time.perf_counter() - start
    table = {}
    for (p, g), c in zip(rows, res.capacity, strict=True):
        known = np.isfinite(c)
        table[f"{p}@{g}"] = {"router": p, "replicas": g, "known": int(known.sum()),
                             **(summarize(c[known]).as_json() if known.any() else {"mean": None})}
    return {"workload": name, "slo": slo_text, "rate_range": [lo, hi], "requests": requests, "seeds": seeds,
            "rounds": res.rounds, "batches": res.batches, "runs": res.evaluations, "wall_s": wall, "rows": table,
            "curves": {f"{p}@{g}": cv for (p, g), cv in zip(rows, res.curve, strict=True)}, "workload_obj": wl}


def print_capacity(part: dict, routers, counts) -> None:
    print(f"\n{part['workload']}: capacity (req/s, mean ± 95 % CI over {part['seeds']} seeds) under {part['slo']}")
    print("| router | " + " | ".join(f"{g} replicas" for g in counts) + " |")
    print("|---|" + "---|" * len(counts))
    for p in routers:
        cells = []
        for g in counts:
            r = part["rows"][f"{p}@{g}"]
            cells.append("unknown" if r["mean"] is None else f"{r['mean']:.2f} ± {(r['ci95'][1] - r['ci95'][0]) / 2:.2f}")
        print(f"| {p} | " + " | ".join(cells) + " |")
    print(f"{part['runs']:,} runs (configurations x seeds) in {part['batches']} batches, {part['rounds']} rounds, "
          f"{part['wall_s']:.1f} s")


def plot_capacity(parts: list[dict], routers, counts, path: Path) -> None:
    panels = {}
    for part in parts:
        series = []
        for p in routers:
            means = [part["rows"][f"{p}@{g}"]["mean"] for g in counts]
            ok = [i for i, m in enumerate(means) if m is not None]
            lo = [part["rows"][f"{p}@{counts[i]}"]["ci95"][0] for i in ok]
            hi = [part["rows"][f"{p}@{counts[i]}"]["ci95"][1] for i in ok]
            series.append(dict(x=[counts[i] for i in ok], y=[means[i] for i in ok], lo=lo, hi=hi, marker="o", label=p))
        panels[f"{part['workload']} ({part['slo']})"] = series
    report.line_plot(panels, path, xlabel="replicas", ylabel="capacity (req/s)", title="capacity under the SLO")


def tune_part(part: dict, replicas_n: int, *, requests: int, seeds: int, population: int, generations: int,
              points: int, rounds: int, tol: float, trace: str | None, progress: bool) -> dict:
    """llm-d's scorer weights tuned for goodput at the default's capacity (CMA-ES), then the capacity of the
    tuned weights beside the defaults' on fresh seeds."""
    from jaxroute.experiments import tune

    name, slo = part["workload"], cap.parse_slo(part["slo"])
    lo, hi = part["rate_range"]
    wl = build_workload(name, requests, trace, shared_prefix=SP if name == "shared-prefix" else None)
    default_cap = part["rows"][f"llmd_precise@{replicas_n}"]["mean"] or float(np.sqrt(lo * hi))
    setup = tune.Setup(workload=wl, replicas=replicas_n, rate=default_cap, gpu=GPU, model_name=MODEL, tp=TP)
    space = tune.Space.of("llmd_precise")
    print(f"\ntuning llmd_precise {', '.join(space.names)} for goodput at {default_cap:.2f} req/s ({name}, "
          f"{replicas_n} replicas; per-request bounds of {part['slo']})")
    res = tune.tune(space, tune.objective("goodput", slo), setup, population=population, generations=generations,
                    seeds=seeds, final_seeds=2 * seeds,
                    on_generation=lambda g: print(f"  generation {g.index}: best {g.best:.3f}, mean {g.mean:.3f}, "
                                                  f"best so far {g.best_ever:.3f} req/s", flush=True))
    for c in res.candidates:
        gain = "" if c.gain is None else f", gain {c.gain.mean:+.3f} ± {c.gain.half_width:.3f} ({c.gain_pct:+.1f} %)"
        print(f"  {c.label:<10} {c.values}: goodput {c.final.mean:.3f} ± {c.final.half_width:.3f} req/s on fresh seeds{gain}")
    tuned = next((c for c in res.candidates if c.label != "defaults"), res.candidates[0])  # best-ever unless = defaults
    rows = [("llmd_precise", replicas_n, {}), ("llmd_precise", replicas_n, tuned.settings)]
    ev = cap.ClusterEvaluator(rows, wl, seeds=2 * seeds, gpu=GPU, model_name=MODEL, tp=TP, seed=tune.FRESH_SEED,
                              progress=progress)
    c = cap.search(ev, 2, lo, hi, slo, tol=tol, points=points, max_rounds=rounds)
    caps = {}
    for label, row in zip(("default", "tuned"), c.capacity, strict=True):
        known = np.isfinite(row)
        caps[label] = summarize(row[known]).as_json() if known.any() else {"mean": None}
    both = np.isfinite(c.capacity).all(axis=0)
    gain = summarize(c.capacity[1, both] - c.capacity[0, both]).as_json() if both.sum() else None
    fmt = lambda x: "unknown" if x["mean"] is None else f"{x['mean']:.2f} [{x['ci95'][0]:.2f}, {x['ci95'][1]:.2f}]"
    print(f"  capacity under {part['slo']} on {2 * seeds} fresh seeds (req/s, 95 % CI): default {fmt(caps['default'])}, "
          f"tuned ({tuned.label}) {fmt(caps['tuned'])}")
    if gain:
        print(f"  tuned - default capacity (paired per seed): {gain['mean']:+.2f} req/s, 95 % CI "
              f"[{gain['ci95'][0]:+.2f}, {gain['ci95'][1]:+.2f}]")
    return {"workload": name, "replicas": replicas_n, "rate": default_cap, "tuned_label": tuned.label, "tune": res.as_json(),
            "tuned_settings": tuned.settings, "capacity": caps, "capacity_gain": gain, "runs": res.runs + c.evaluations}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (same code paths), a few minutes on 2 cores")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: shared-prefix,mooncake")
    ap.add_argument("--trace", default=None, help="Mooncake trace (default ../shared/data/mooncake_synthetic_trace.jsonl)")
    ap.add_argument("--out", default="results/capacity_study.json", help="results JSON (the PNG goes beside it)")
    ap.add_argument("--no-tune", action="store_true", help="skip the llm-d weight tuning part")
    ap.add_argument("--no-progress", action="store_true", help="hide the batches' progress bars")
    args = ap.parse_args(argv)
    use_all_cpu_cores()
    if args.quick:
        routers, counts = ("rr", "sglang_cache_aware", "llmd_precise"), (2, 4)
        size = dict(requests=80, seeds=2, points=4, rounds=4, tol=0.1)
        es = dict(population=4, generations=2)
    else:
        routers, counts = ROUTERS, REPLICAS
        size = dict(requests=300, seeds=4, points=5, rounds=6, tol=0.03)
        es = dict(population=12, generations=8)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    parts, speed = [], []
    for name in [w.strip() for w in args.workloads.split(",") if w.strip()]:
        if name not in WORKLOADS:
            raise SystemExit(f"unknown workload '{name}'; choose from: {', '.join(WORKLOADS)}")
        part = capacity_part(name, routers, counts, trace=args.trace, progress=not args.no_progress, **size)
        print_capacity(part, routers, counts)
        ref = reference_seconds_per_run(part.pop("workload_obj"), size["requests"])
        if ref:
            est = ref * part["runs"]
            print(f"the pure-Python reference takes {ref:.2f} s per run: {part['runs']:,} runs would take {est:,.0f} s "
                  f"({est / part['wall_s']:.0f}x this search's {part['wall_s']:.1f} s, compilation included)")
            speed.append({"workload": name, "runs": part["runs"], "wall_s": part["wall_s"], "reference_s_per_run": ref,
                          "reference_estimate_s": est, "speedup": est / part["wall_s"]})
        parts.append(part)
    tuned = None
    if not args.no_tune and parts:
        tuned = tune_part(parts[0], counts[0], trace=args.trace, progress=not args.no_progress, **size, **es)
    png = out.with_suffix(".png")
    plot_capacity(parts, routers, counts, png)
    print(f"wrote {png}")
    if speed:
        runs, wall, est = (sum(x[k] for x in speed) for k in ("runs", "wall_s", "reference_estimate_s"))
        print(f"\nin all: {runs:,} runs in {wall:.0f} s; at the reference's speed {est:,.0f} s ({est / wall:.0f}x)")
    result = {"quick": args.quick, "gpu": GPU, "model": MODEL, "tp": TP, "routers": list(routers), "replicas": list(counts),
              "capacity": parts, "speed": speed, "tuned": tuned}
    print(f"wrote {report.write_json(out, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
