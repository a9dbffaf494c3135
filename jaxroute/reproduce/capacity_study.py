"""Capacity study: the largest request rate each production router sustains under a TTFT-p90 and a TPOT-p90 SLO,
at 4, 8 and 16 replicas, on shared-prefix and the Mooncake trace; then llm-d's scorer weights tuned for the
same workload (`jaxroute.experiments.tune`, CMA-ES from evosax) and the tuned capacity beside the default's.

Deployment: replicas of Llama-3.1-70B on four H200 each (TP 4, roofline cost model, as in pd_study), chunked
prefill 512, 64 running. Every router x replica count of a workload is searched at once
(`experiments.capacity`): each round is one compiled batch per model shape (routers that run on part of a
cluster share one model with a traced count; sglang_cache_aware and preble get one per count). Each capacity
section counts the configurations x seeds simulated and the wall time, beside the time the same runs would take
at the pure-Python reference's speed (`tests/reference_replicas.py`, timed here on one run).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np

from jaxroute import report
from jaxroute.clusters import replicas
from jaxroute.experiments import capacity as cap
from jaxroute.experiments.cluster import build_workload
from jaxroute.metrics import Summary, summarize
from jaxroute.reproduce.document import (
    Claim,
    Context,
    Experiment,
    Section,
    fmt,
    gain_verdict,
    load_part,
    markdown_table,
)

SOURCE = "production-routers"
ONE_WORKER = True  # capacity_mooncake and capacity_tuned read capacity_shared_prefix's part: one worker, in order
ROUTERS = ("rr", "least_load", "sglang_cache_aware", "llmd_precise", "dynamo_kv", "preble")
LOAD_ONLY = ("rr", "least_load")
CACHE_AWARE = ("sglang_cache_aware", "llmd_precise", "dynamo_kv", "preble")
REPLICAS = (4, 8, 16)
GPU, MODEL, TP = "H200", "Llama-3.1-70B", 4
# per workload: (SLO, rate range searched in req/s)
WORKLOADS = {"shared-prefix": ("ttft_p90_s<=0.5,tpot_p90_s<=0.03", (1.0, 400.0)),
             "mooncake": ("ttft_p90_s<=5,tpot_p90_s<=0.05", (0.2, 60.0))}
# --quick per workload: a Mooncake run costs ~20x a shared-prefix one of the same length (long prompts)
# (its trace replay makes every seed the same: 2 suffice; shared-prefix runs are cheap: 3 seeds tighten the CIs)
QUICK = {"shared-prefix": dict(requests=80, seeds=3, points=4, rounds=5),
         "mooncake": dict(requests=20, seeds=2, points=3, rounds=3)}
# Full size per workload, over sizes()'s: Mooncake's 10k-40k-token prompts make one run ~20x a shared-prefix one,
# so it gets fewer requests, seeds and rounds (300 x 4 seeds x 6 rounds would take hours on 2 CPU cores).
FULL = {"shared-prefix": dict(rounds=8), "mooncake": dict(requests=120, seeds=3, points=4, rounds=5)}
SP = dict(groups=8, prompts_per_group=16, system_tokens=2000, question_tokens=300, output_tokens=400)
TUNED_ROUTER = "llmd_precise"


def sizes(ctx: Context) -> dict:
    """Routers, replica counts, search and CMA-ES sizes (full: the original script's defaults; the capacity
    experiments apply FULL / QUICK per workload over them)."""
    if ctx.quick:
        routers, counts = ("rr", "sglang_cache_aware", "llmd_precise"), (2, 4)
        size = dict(tol=0.1) | QUICK["shared-prefix"]
        es = dict(population=4, generations=2)
    else:
        routers, counts = ROUTERS, REPLICAS
        size = dict(requests=300, seeds=4, points=5, rounds=6, tol=0.03)
        es = dict(population=12, generations=8)
    if ctx.seeds:
        size["seeds"] = ctx.seeds
    return dict(routers=routers, counts=counts, size=size, es=es)


def workload_size(ctx: Context, name: str) -> dict:
    """The capacity search's sizes for one workload: sizes()'s, then FULL / QUICK's, then the --seeds override."""
    size = sizes(ctx)["size"] | (QUICK if ctx.quick else FULL)[name]
    if ctx.seeds:
        size["seeds"] = ctx.seeds
    return size


def _workload(name: str, requests: int):
    return build_workload(name, requests, None, shared_prefix=SP if name == "shared-prefix" else None)


def reference_seconds_per_run(workload, requests: int) -> float | None:
    """Wall seconds of one run of the pure-Python reference (rr, 4 replicas) on this workload, or None."""
    from jaxroute.bench.references import time_replica_reference

    p = replicas.make_params("rr", rate=1.0, gpu=GPU, model=MODEL, tp=TP)
    r = time_replica_reference(workload, p, replicas=4, max_running=64, max_queue=requests, policy="rr")
    return r.get("seconds")


# --------------------------------------------------------------------------- the capacity search


def capacity_part(ctx: Context, name: str, routers, counts, *, requests: int, seeds: int, points: int, rounds: int,
                  tol: float) -> tuple[dict, object]:
    """Every router x count of one workload searched at once; (the part's JSON-able record, the workload)."""
    slo_text, (lo, hi) = WORKLOADS[name]
    wl = _workload(name, requests)
    rows = [(p, g) for p in routers for g in counts]
    ev = cap.ClusterEvaluator(rows, wl, seeds=seeds, gpu=GPU, model_name=MODEL, tp=TP, progress=False)

    def on_round(r, n):
        ctx.log(f"  {name} round {r}: {n} brackets open")
        ctx.advance(f"{name} round {r}")

    start = time.perf_counter()
    res = cap.search(ev, len(rows), lo, hi, cap.parse_slo(slo_text), tol=tol, points=points, max_rounds=rounds,
                     on_round=on_round)
    wall = time.perf_counter() - start
    table, per_seed = {}, {}
    for i, ((p, g), c) in enumerate(zip(rows, res.capacity, strict=True)):
        known = np.isfinite(c)
        key = f"{p}@{g}"
        table[key] = {"router": p, "replicas": g, "known": int(known.sum()),
                      **(summarize(c[known]).as_json() if known.any() else {"mean": None})}
        # per seed (aligned, for paired comparisons): the capacity, the bracket and why a seed is unknown
        per_seed[key] = {"capacity": c, "ok": res.ok[i], "fail": res.fail[i], "overflowed": res.overflowed[i],
                         "status": [_status(res.ok[i, s], res.fail[i, s], res.overflowed[i, s])
                                    for s in range(c.shape[0])]}
    part = {"workload": name, "slo": slo_text, "rate_range": [lo, hi], "requests": requests, "seeds": seeds,
            "rounds": res.rounds, "batches": res.batches, "runs": res.evaluations, "wall_s": wall, "rows": table,
            "per_seed": per_seed, "curves": {f"{p}@{g}": cv for (p, g), cv in zip(rows, res.curve, strict=True)}}
    return part, wl


def _status(ok: float, fail: float, over: bool) -> str:
    if over:
        return "overflowed"
    if np.isfinite(ok) and np.isfinite(fail):
        return "known"
    if np.isfinite(ok):
        return "above"  # no miss up to the highest rate tried: capacity >= ok
    if np.isfinite(fail):
        return "below"  # no success (or a success above a miss): capacity below the lowest rate tried
    return "none"


WHY = {"overflowed": "overflowed", "above": "met the SLO at every rate tried", "below": "missed it at every rate tried",
       "none": "no bracket"}


def _why_unknown(cell: dict) -> str:
    counts: dict[str, int] = {}
    for s in cell["status"]:
        if s != "known":
            counts[s] = counts.get(s, 0) + 1
    return ", ".join(f"{n} seed(s) {WHY[s]}" + (f" (>= {_top(cell):.0f} req/s)" if s == "above" else "")
                     for s, n in counts.items())


def _top(cell: dict) -> float:
    ok = np.asarray([np.nan if x is None else x for x in cell["ok"]], np.float64)
    return float(np.nanmax(np.where(np.isfinite(ok), ok, np.nan)))


def _arr(x) -> np.ndarray:
    """A per-seed list from a part (None = NaN / unknown) as float64."""
    return np.asarray([np.nan if v is None else v for v in x], np.float64)


def _lower(cell: dict) -> np.ndarray:
    """Per seed: the capacity where known, the highest rate that met the SLO where no rate missed (a lower
    bound), else NaN."""
    c, ok = _arr(cell["capacity"]), _arr(cell["ok"])
    above = np.asarray([s == "above" for s in cell["status"]])
    return np.where(np.isfinite(c), c, np.where(above, ok, np.nan))


def _paired(a: np.ndarray, b: np.ndarray) -> Summary | None:
    """Summary of a - b on the seeds where both are finite (None under 2 such seeds: no CI)."""
    both = np.isfinite(a) & np.isfinite(b)
    return summarize(a[both] - b[both]) if both.sum() >= 2 else None


def _cell_text(part: dict, key: str) -> str:
    r, cell = part["rows"][key], part["per_seed"][key]
    if r["mean"] is None:
        return f"unknown ({_why_unknown(cell)})"
    s = Summary(r["mean"], r["ci95"][0], r["ci95"][1], tuple(r["per_seed"]))
    extra = "" if r["known"] == part["seeds"] else f" ({r['known']}/{part['seeds']} seeds; {_why_unknown(cell)})"
    return fmt(s) + extra


def capacity_table(part: dict, routers, counts) -> str:
    return markdown_table(["router"] + [f"{g} replicas" for g in counts],
                          [[p] + [_cell_text(part, f"{p}@{g}") for g in counts] for p in routers])


def plot_capacity(part: dict, routers, counts, path) -> None:
    series = []
    for p in routers:
        ok = [g for g in counts if part["rows"][f"{p}@{g}"]["mean"] is not None]
        rows = [part["rows"][f"{p}@{g}"] for g in ok]
        series.append(dict(x=ok, y=[r["mean"] for r in rows], lo=[max(r["ci95"][0], 0.0) for r in rows],
                           hi=[r["ci95"][1] for r in rows], marker="o", label=p))
    means = [part["rows"][f"{p}@{g}"]["mean"] for p in routers for g in counts]
    means = [m for m in means if m]
    log = bool(means) and max(means) / min(means) > 30
    title = f"{part['workload']} ({part['slo']})"
    if log:  # a band's lower end at 0 cannot be drawn on a log axis
        for line in series:
            line["lo"] = [max(x, min(means) / 10) for x in line["lo"]]
    report.line_plot({title: series}, path, xlabel="replicas", ylabel="capacity (req/s)" + (", log" if log else ""),
                     title="capacity under the SLO (95 % CI bands, cut at 0; unknown points left out)",
                     xticks=(list(counts), [str(g) for g in counts]), ylog=(title,) if log else ())


# --------------------------------------------------------------------------- claims


def _signed(s: Summary) -> str:
    return ("+" if s.mean >= 0 else "") + fmt(s)


def _rank(verdict: str) -> int:
    return {"differs": 0, "direction only": 1, "reproduced": 2}[verdict]


def growth_claim(part: dict, router: str, counts) -> Claim:
    """Capacity grows with replicas: each step's paired increase (the larger count's lower bound minus the
    smaller count's capacity, per seed) has its CI above 0."""
    steps, unmeasured, bad = [], [], []
    for a, b in zip(counts, counts[1:], strict=False):
        lo_cell, hi_cell = part["per_seed"][f"{router}@{a}"], part["per_seed"][f"{router}@{b}"]
        d = _paired(_lower(hi_cell), _arr(lo_cell["capacity"]))
        if d is None:
            why = "; ".join(f"{g}: {_why_unknown(part['per_seed'][f'{router}@{g}'])}" for g in (a, b)
                            if _why_unknown(part["per_seed"][f"{router}@{g}"]))
            unmeasured.append(f"{a}->{b} replicas ({why or 'under 2 common seeds'})")
            continue
        censored = any(s == "above" for s in hi_cell["status"])
        steps.append((a, b, d, censored))
        if d.lo <= 0:
            bad.append(f"{a}->{b} replicas: {fmt(d)} req/s")
    ours = "; ".join(f"{a}->{b}: {'>= ' if c else ''}{_signed(d)}" for a, b, d, c in steps) or "not measured"
    ours += " req/s (paired increase per step)" if steps else ""
    if not steps:
        verdict, reason = "differs", "capacity not measured: " + "; ".join(unmeasured)
    elif bad:
        verdict, reason = "differs", "an increase's CI includes 0 or is negative: " + "; ".join(bad)
    elif unmeasured:
        verdict, reason = "direction only", "grows at every measured step; not measured: " + "; ".join(unmeasured)
    else:
        verdict, reason = "reproduced", ""
    value = {"steps": [{"from": a, "to": b, "censored": c, **d.as_json()} for a, b, d, c in steps]} if steps else None
    return Claim(f"{router}: capacity under the SLO grows with the replica count ({part['workload']})",
                 "lecture §2.4 (capacity grows with cluster size)", "grows (no number)", ours, verdict, reason, value)


def cache_aware_claim(part: dict, router: str, counts, baselines) -> tuple[Claim, list]:
    """The router's capacity minus the better load-only router's, per seed, at each count: the verdict is the
    largest measured count's gain_verdict, lowered to 'direction only' when a smaller count is within noise."""
    gains, rows = [], []
    for g in counts:
        base = functools.reduce(np.fmax, [_arr(part["per_seed"][f"{b}@{g}"]["capacity"]) for b in baselines])
        cell = part["per_seed"][f"{router}@{g}"]
        d = _paired(_lower(cell), base)
        censored = any(s == "above" for s in cell["status"])
        if d is not None:
            gains.append((g, d, censored, gain_verdict(d, None)))
        rows.append([router, g, "not measured" if d is None else ("≥ " if censored else "") + fmt(d),
                     "" if d is None else f"{100 * d.mean / np.nanmean(base):+.0f} %"])
    ours = "; ".join(f"{g}: {'>= ' if c else ''}{_signed(d)}" for g, d, c, _ in gains) or "not measured"
    ours += " req/s over the better load-only router" if gains else ""
    if not gains:
        verdict, reason = "differs", "not measured at any replica count (capacity unknown)"
    else:
        g, d, _, (verdict, reason) = gains[-1]
        reason = f"at {g} replicas: {reason}" if reason else ""
        noisy = [x for x in gains[:-1] if _rank(x[3][0]) < _rank(verdict)]
        if verdict != "differs" and noisy:
            verdict = "direction only"
            reason = (reason + "; " if reason else "") + "within noise at " + ", ".join(
                f"{x[0]} replicas" for x in noisy)
        if len(gains) < len(counts):
            missing = sorted(set(counts) - {x[0] for x in gains})
            reason = (reason + "; " if reason else "") + "not measured at " + ", ".join(f"{m}" for m in missing) \
                + " replicas"
            verdict = "direction only" if verdict == "reproduced" else verdict
    value = {"gains": [{"replicas": g, "censored": c, **d.as_json()} for g, d, c, _ in gains]}
    claim = Claim(f"{router} (cache-aware) sustains a higher rate than {' / '.join(baselines)} under the SLO "
                  f"({part['workload']})", "lecture §2.3-2.4, §6 (production cache-aware routers)",
                  "higher (no number)", ours, verdict, reason, value)
    return claim, rows


def speed_row(part: dict, ref: float | None) -> dict:
    est = ref * part["runs"] if ref else None
    return {"workload": part["workload"], "runs": part["runs"], "batches": part["batches"], "rounds": part["rounds"],
            "wall_s": part["wall_s"], "reference_s_per_run": ref, "reference_estimate_s": est,
            "speedup": est / part["wall_s"] if est else None}


def speed_table(speed: list[dict]) -> str:
    rows = [[s["workload"], f"{s['runs']:,}", s.get("batches", ""), s.get("rounds", ""), f"{s['wall_s']:.1f}",
             f"{s['reference_s_per_run']:.2f}" if s["reference_s_per_run"] else
             ("" if s["reference_estimate_s"] else "unavailable"),
             "" if not s["reference_estimate_s"] else f"{s['reference_estimate_s']:,.0f}",
             "" if not s["speedup"] else f"{s['speedup']:.0f}x"] for s in speed]
    return markdown_table(["workload", "runs (configurations x seeds)", "batches", "rounds", "wall s (compilation included)",
                           "reference s per run", "reference estimate s", "speed-up"], rows)


# --------------------------------------------------------------------------- the experiments


def _capacity_experiment(ctx: Context, name: str) -> Section:
    z = sizes(ctx)
    routers, counts, size = z["routers"], z["counts"], workload_size(ctx, name)
    part, wl = capacity_part(ctx, name, routers, counts, **size)
    ctx.log(f"{name}: capacity (req/s, mean ± 95 % CI over {part['seeds']} seeds) under {part['slo']}")
    table = capacity_table(part, routers, counts)
    ctx.log(table)
    ctx.log(f"{part['runs']:,} runs (configurations x seeds) in {part['batches']} batches, {part['rounds']} rounds, "
            f"{part['wall_s']:.1f} s")
    ref = reference_seconds_per_run(wl, size["requests"])
    ctx.advance("reference timing")
    speed = speed_row(part, ref)
    if ref:
        ctx.log(f"the pure-Python reference takes {ref:.2f} s per run: {part['runs']:,} runs would take "
                f"{speed['reference_estimate_s']:,.0f} s ({speed['speedup']:.0f}x this search's {part['wall_s']:.1f} s, "
                "compilation included)")
    part["speed"] = speed
    claims = [growth_claim(part, p, counts) for p in routers]
    tables = [(f"capacity (req/s, mean ± 95 % CI over {part['seeds']} seeds) under {part['slo']}", table)]
    if name == "shared-prefix":
        baselines = [p for p in routers if p in LOAD_ONLY]
        gain_rows = []
        for p in (p for p in routers if p in CACHE_AWARE):
            c, rows = cache_aware_claim(part, p, counts, baselines)
            claims.append(c)
            gain_rows += rows
        tables.append((f"cache-aware capacity minus the better of {' / '.join(baselines)} (req/s, paired per seed, "
                       "95 % CI; ≥: a seed met the SLO at every rate tried, so its capacity is a lower bound)",
                       markdown_table(["router", "replicas", "gain (req/s)", "gain (% of load-only)"], gain_rows)))
    speed_rows = [speed]
    other = load_part(ctx.out_dir, SOURCE, "capacity_shared_prefix", ctx.quick) if name == "mooncake" else None
    if other is not None and other.data.get("speed"):  # both workloads' searches, and their total
        speed_rows = [other.data["speed"], speed]
        runs, wall = sum(x["runs"] for x in speed_rows), sum(x["wall_s"] for x in speed_rows)
        ests = [x["reference_estimate_s"] for x in speed_rows]
        est = sum(ests) if all(ests) else None
        if est:
            ctx.log(f"in all: {runs:,} runs in {wall:.0f} s; at the reference's speed {est:,.0f} s ({est / wall:.0f}x)")
        speed_rows.append({"workload": "in all", "runs": runs, "wall_s": wall, "reference_s_per_run": None,
                           "reference_estimate_s": est, "speedup": est / wall if est else None})
    tables.append(("speed: the capacity search against the pure-Python reference's speed (rr, 4 replicas, one run "
                   "timed on one core, times the runs)", speed_table(speed_rows)))
    spread = [np.ptp(_arr(c["capacity"])[np.isfinite(_arr(c["capacity"]))]) for c in part["per_seed"].values()
              if np.isfinite(_arr(c["capacity"])).sum() >= 2]
    same = bool(spread) and max(spread) == 0
    fig, file = ctx.figure(SOURCE, f"capacity_{name.replace('-', '_')}")
    plot_capacity(part, routers, counts, fig)
    return Section(SOURCE, f"capacity_{name.replace('-', '_')}", f"Capacity under the SLO: {name}",
                   intro=(f"{len(routers)} routers x replicas {', '.join(map(str, counts))} of {MODEL} on {TP} x {GPU} "
                          f"each (TP {TP}, roofline), {size['requests']} requests, {part['seeds']} seeds; the largest "
                          f"rate under {part['slo']} searched in {part['rate_range'][0]}-{part['rate_range'][1]} req/s "
                          f"(the search may go to twice the top), {size['points']} rates per row and round, up to "
                          f"{size['rounds']} rounds, tolerance {size['tol']:.0%}. Unknown: a seed whose bracket did "
                          "not close (every rate met or missed the SLO) or held an overflowed run.")
                   + (" Every seed gave the same capacity, so the CIs are 0 wide" if same else "")
                   + (": the trace replays its recorded arrivals (rescaled to the rate) and nothing else in the "
                      "model is random." if same and name == "mooncake" else "." if same else ""),
                   claims=claims, tables=tables,
                   figures=[(f"{name}: capacity against replicas, 95 % CI bands over seeds", file)],
                   data=part, seeds=part["seeds"])


def capacity_shared_prefix(ctx: Context) -> Section:
    return _capacity_experiment(ctx, "shared-prefix")


def capacity_mooncake(ctx: Context) -> Section:
    return _capacity_experiment(ctx, "mooncake")


def default_capacity(ctx: Context, replicas_n: int) -> tuple[dict, str]:
    """llm-d's (default weights) shared-prefix capacity row at replicas_n: from the shared-prefix experiment's
    part when it ran at these sizes, else searched here (that row alone, same search)."""
    size = workload_size(ctx, "shared-prefix")
    done = load_part(ctx.out_dir, SOURCE, "capacity_shared_prefix", ctx.quick)
    key = f"{TUNED_ROUTER}@{replicas_n}"
    if done is not None and done.data.get("seeds") == size["seeds"] and key in done.data.get("rows", {}):
        return done.data, "the capacity_shared_prefix experiment's part"
    part, _ = capacity_part(ctx, "shared-prefix", (TUNED_ROUTER,), (replicas_n,), **size)
    return part, "searched here (the capacity_shared_prefix part was not there)"


def capacity_tuned(ctx: Context) -> Section:
    """llm-d's scorer weights tuned for goodput at the default's capacity (CMA-ES), then the capacity of the
    tuned weights beside the defaults' on fresh seeds."""
    from jaxroute.experiments import tune

    z = sizes(ctx)
    counts, size, es = z["counts"], z["size"], z["es"]
    requests, seeds, points, rounds, tol = (size[k] for k in ("requests", "seeds", "points", "rounds", "tol"))
    replicas_n = counts[0]
    part, origin = default_capacity(ctx, replicas_n)
    name, slo = part["workload"], cap.parse_slo(part["slo"])
    lo, hi = part["rate_range"]
    wl = _workload(name, requests)
    default_cap = part["rows"][f"{TUNED_ROUTER}@{replicas_n}"]["mean"] or float(np.sqrt(lo * hi))
    setup = tune.Setup(workload=wl, replicas=replicas_n, rate=default_cap, gpu=GPU, model_name=MODEL, tp=TP)
    space = tune.Space.of(TUNED_ROUTER)
    ctx.log(f"tuning {TUNED_ROUTER} {', '.join(space.names)} for goodput at {default_cap:.2f} req/s ({name}, "
            f"{replicas_n} replicas; per-request bounds of {part['slo']}); the default's capacity: {origin}")

    def on_generation(g):
        ctx.log(f"  generation {g.index}: best {g.best:.3f}, mean {g.mean:.3f}, best so far {g.best_ever:.3f} req/s")
        ctx.advance(f"generation {g.index}")

    res = tune.tune(space, tune.objective("goodput", slo), setup, population=es["population"],
                    generations=es["generations"], seeds=seeds, final_seeds=2 * seeds, on_generation=on_generation)
    cand_rows = []
    for c in res.candidates:
        gain = "" if c.gain is None else f", gain {c.gain.mean:+.3f} ± {c.gain.half_width:.3f} ({c.gain_pct:+.1f} %)"
        ctx.log(f"  {c.label:<10} {c.values}: goodput {c.final.mean:.3f} ± {c.final.half_width:.3f} req/s on fresh "
                f"seeds{gain}")
        cand_rows.append([c.label, ", ".join(f"{k} {v:.3g}" for k, v in c.values.items()),
                          "every run overflowed" if np.isnan(c.final.mean) else fmt(c.final),
                          "" if c.gain is None else fmt(c.gain), "" if c.gain_pct is None else f"{c.gain_pct:+.1f} %"])
    tuned = next((c for c in res.candidates if c.label != "defaults"), res.candidates[0])  # best-ever unless = defaults
    rows = [(TUNED_ROUTER, replicas_n, {}), (TUNED_ROUTER, replicas_n, tuned.settings)]
    ev = cap.ClusterEvaluator(rows, wl, seeds=2 * seeds, gpu=GPU, model_name=MODEL, tp=TP, seed=tune.FRESH_SEED,
                              progress=False)
    c = cap.search(ev, 2, lo, hi, slo, tol=tol, points=points, max_rounds=rounds,
                   on_round=lambda r, n: ctx.advance(f"capacity round {r}"))
    caps, per_seed = {}, {}
    for label, row in zip(("default", "tuned"), c.capacity, strict=True):
        known = np.isfinite(row)
        caps[label] = summarize(row[known]).as_json() if known.any() else {"mean": None}
        per_seed[label] = row
    both = np.isfinite(c.capacity).all(axis=0)
    gain_s = summarize(c.capacity[1, both] - c.capacity[0, both]) if both.sum() else None
    gain = gain_s.as_json() if gain_s else None
    show = lambda x: "unknown" if x["mean"] is None else f"{x['mean']:.2f} [{x['ci95'][0]:.2f}, {x['ci95'][1]:.2f}]"
    ctx.log(f"  capacity under {part['slo']} on {2 * seeds} fresh seeds (req/s, 95 % CI): default "
            f"{show(caps['default'])}, tuned ({tuned.label}) {show(caps['tuned'])}")
    if gain:
        ctx.log(f"  tuned - default capacity (paired per seed): {gain['mean']:+.2f} req/s, 95 % CI "
                f"[{gain['ci95'][0]:+.2f}, {gain['ci95'][1]:+.2f}]")
    if gain_s is None or both.sum() < 2:
        verdict, reason = "differs", (f"capacity known for both on {int(both.sum())} of {2 * seeds} fresh seeds: "
                                      "no paired CI")
        ours = "not measured"
    else:
        verdict, reason = gain_verdict(gain_s, None)
        ours = f"{fmt(gain_s)} req/s ({100 * gain_s.mean / caps['default']['mean']:+.1f} %; tuned - default, paired)"
    claims = [Claim(f"{TUNED_ROUTER}: scorer weights tuned for the workload (CMA-ES on goodput) sustain a higher rate "
                    "under the SLO than the default weights (shared-prefix)",
                    "lecture §6 (prefix-aware scoring gateways; llm-d's weights are deployment settings)",
                    "higher (no number)", ours, verdict, reason, gain)]
    gen_rows = [[g.index, f"{g.best:.3f}", f"{g.mean:.3f}", f"{g.best_ever:.3f}", g.overflowed] for g in res.generations]
    cap_rows = [[label + (f" ({tuned.label}: " + ", ".join(f"{k} {v:.3g}" for k, v in tuned.values.items()) + ")"
                          if label == "tuned" else ""), show(caps[label])] for label in ("default", "tuned")]
    cap_rows.append(["tuned - default (paired per seed)", "unknown" if not gain else
                     f"{gain['mean']:+.2f} [{gain['ci95'][0]:+.2f}, {gain['ci95'][1]:+.2f}]"])
    runs = res.runs + c.evaluations
    return Section(SOURCE, "capacity_tuned", f"llm-d's scorer weights tuned for shared-prefix ({replicas_n} replicas)",
                   intro=(f"CMA-ES (evosax) over {TUNED_ROUTER}'s {', '.join(space.names)}: population "
                          f"{es['population']}, {es['generations']} generations, {seeds} search seeds, goodput at "
                          f"the default's capacity {default_cap:.2f} req/s ({origin}); the candidates re-evaluated "
                          f"on {2 * seeds} fresh seeds; then the capacity of the default and of the tuned weights "
                          f"searched on those fresh seeds, {runs:,} runs in all."),
                   claims=claims,
                   tables=[("CMA-ES generations (goodput, req/s, mean over the search seeds)",
                            markdown_table(["generation", "best", "mean", "best so far", "overflowed members"], gen_rows)),
                           (f"candidates on {2 * seeds} fresh seeds (goodput, req/s, 95 % CI; gain paired per seed)",
                            markdown_table(["candidate", "values", "goodput", "gain over defaults", "gain %"],
                                           cand_rows)),
                           (f"capacity under {part['slo']} on {2 * seeds} fresh seeds (req/s, mean [95 % CI])",
                            markdown_table(["weights", "capacity"], cap_rows))],
                   data={"workload": name, "replicas": replicas_n, "rate": default_cap, "default_capacity_from": origin,
                         "tuned_label": tuned.label, "tune": res.as_json(), "tuned_settings": tuned.settings,
                         "capacity": caps, "capacity_per_seed": per_seed, "capacity_gain": gain, "runs": runs},
                   seeds=2 * seeds)


def _steps(name: str):
    """Progress ticks: one per search round (+ the reference timing); the tuning's: generations + its rounds."""
    def steps(quick: bool) -> int:
        ctx = Context(out_dir=Path("."), quick=quick)
        if name == "tuned":
            z = sizes(ctx)
            return z["es"]["generations"] + z["size"]["rounds"]
        return workload_size(ctx, name)["rounds"] + 1
    return steps


EXPERIMENTS = [
    Experiment(SOURCE, "capacity_shared_prefix", "capacity under the SLO, shared-prefix", capacity_shared_prefix,
               _steps("shared-prefix")),
    Experiment(SOURCE, "capacity_mooncake", "capacity under the SLO, Mooncake trace", capacity_mooncake,
               _steps("mooncake")),
    Experiment(SOURCE, "capacity_tuned", "llm-d's scorer weights tuned, capacity beside the defaults'", capacity_tuned,
               _steps("tuned")),
]
