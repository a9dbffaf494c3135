"""`run_bench(config)`: every selected part in one run, one JSON object, one printed table."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from jaxroute import compile_effort
from jaxroute.bench import blis, decision, jobs, models, program_cost
from jaxroute.bench.config import PARTS, PROFILE_ROWS, BenchConfig
from jaxroute.bench.measure import error_record, load_average, machine_info, say, sweep


def _with_reference(result: dict, ref: dict | None) -> dict:
    """Attach the reference and each size's ratio (our requests/s per core over the reference's)."""
    result["reference"] = ref
    ref_rate = ref.get("requests_per_s_per_core") if ref and ref.get("available") else None
    for row in result["sizes"]:
        row["reference_per_core"] = ref_rate
        row["ratio_vs_reference"] = row["requests_per_s_per_core"] / ref_rate if ref_rate else None
    return result


def _model(cfg: BenchConfig, scenario, seeds, reference, on_size=None) -> dict:
    say(f"{scenario.name}:")
    ref = None
    if cfg.references:
        try:
            ref = reference()
        except Exception as e:
            ref = {"available": False, **error_record(e)}
            say(f"  reference failed: {ref['error']} {ref['detail']}")
    res = sweep(scenario, seeds, max_repeat_s=cfg.max_repeat_s, request_scaling=cfg.request_scaling,
                on_size=None if on_size is None else lambda partial: on_size(_with_reference(partial, ref)))
    if cfg.cost_profile and res["sizes"]:
        res["cost"] = _cost(scenario, res)
    return _with_reference(res, ref)


def _cost(scenario, res: dict) -> dict:
    """The hardware-independent figures (`program_cost`) of one more run of at least `PROFILE_ROWS` rows, and
    the launch-bound projection at the largest size that fit."""
    seeds, large = -(-PROFILE_ROWS // scenario.rows), res["sizes"][-1]
    say(f"  {scenario.name}: counting steps and launches ({seeds} seed(s) on one device, profiled) ...")
    try:
        fig = program_cost.profile(lambda: scenario.run(seeds, scenario.requests, 2), scenario.requests)
    except Exception as e:  # the profiler is a diagnostic: its failure does not fail the model
        return {"available": False, **error_record(e)}
    if fig.get("available"):
        fig["profiled_seeds"] = seeds
        fig["projection"] = program_cost.projection(fig, scenario.rows * large["seeds"], scenario.requests)
        say(f"    {fig['scan_steps_per_request']:.2f} scan steps and {fig['launches_per_request']:,.0f} launches per "
            f"request; {fig['launches_per_step']:,.0f} launches per step ({fig['compiled_ops_per_step']} compiled ops)")
    return fig


def run_bench(cfg: BenchConfig, checkpoint: Callable[[dict], object] | None = None) -> dict:
    """Run the parts of `cfg` in order (dispatch, cluster, blis, trace, decode, decision); returns the JSON.

    checkpoint(partial_result) is called after every model and part (e.g. to write the JSON so far, so a
    run stopped by a time limit keeps what it measured)."""
    start = time.perf_counter()
    out = {"command": "bench", "config": dataclasses.asdict(cfg), **machine_info(),
           "load_average": {"before": load_average()}, "models": [], "errors": []}
    memo: dict = {}  # (requests, seeds) -> BLIS unique-prompt measurement, reused by the trace section

    def save(model_so_far: dict | None = None) -> None:
        if checkpoint is not None:
            models = out["models"] + ([dict(model_so_far, partial=True)] if model_so_far else [])
            checkpoint(dict(out, models=models, partial=True, elapsed_s=time.perf_counter() - start))

    def guarded(part: str, fn):
        try:
            return fn()
        except Exception as e:  # a broken part is reported; the others still run
            out["errors"].append({"part": part, **error_record(e)})
            say(f"{part} failed: {out['errors'][-1]['error']} {out['errors'][-1]['detail']}")
            return None

    with compile_effort.forced(cfg.compile_effort):
        for part in (p for p in PARTS if p in cfg.parts):
            if part == "dispatch":
                r = guarded(part, lambda: _model(cfg, models.dispatch_scenario(cfg), cfg.dispatch_seeds,
                                                 lambda: models.dispatch_reference(cfg), save))
                out["models"] += [r] if r else []
            elif part == "cluster":
                grids = [cfg.policies] + [(p,) for p in cfg.separate]
                for wl in cfg.cluster_workloads:
                    for pols in grids:
                        r = guarded(part, lambda wl=wl, pols=pols: _model(
                            cfg, models.cluster_scenario(cfg, wl, pols), cfg.cluster_seeds,
                            lambda: models.cluster_reference(cfg, wl, pols), save))
                        out["models"] += [r] if r else []
                        save()
            elif part == "decode":
                r = guarded(part, lambda: _model(cfg, models.decode_scenario(cfg), cfg.decode_seeds,
                                                 lambda: models.decode_reference(cfg), save))
                out["models"] += [r] if r else []
            elif part == "blis":
                say("BLIS scenario:")
                out["blis"] = guarded(part, lambda: blis.run_blis(cfg, memo))
            elif part == "trace":
                say("trace-length scaling (unique prompts, rr, 1 seed):")
                out["trace"] = guarded(part, lambda: blis.run_trace(cfg, memo))
            elif part == "jobs":
                say("user jobs (one grid each, timed with compilation):")
                out["jobs"] = guarded(part, lambda: jobs.run_jobs(cfg))
                out["errors"] += [{"part": f"jobs/{r['job']}", "error": r["error"], "detail": r["detail"]}
                                  for r in (out["jobs"] or {"runs": []})["runs"] if "error" in r]
            elif part == "decision":
                say(f"BR decision latency ({cfg.decision_calls} calls each):")
                out["decision"] = guarded(part, lambda: decision.run_decision(cfg.decision_calls))
            save()
    out["partial"] = False
    out["load_average"]["after"] = load_average()
    out["elapsed_s"] = time.perf_counter() - start
    out["errors"] += [{"part": m["model"], "seeds": m["failed"]["seeds"], **m["failed"]}
                      for m in out["models"] if m.get("failed") and not m["failed"]["out_of_memory"]]
    return out


# --------------------------------------------------------------------------- printing


def _num(x, fmt: str = ",.0f") -> str:
    return "-" if x is None else format(x, fmt)


def _bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"  # pragma: no cover


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))  # noqa: E731
    return [line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in rows]


def format_report(res: dict) -> str:
    """The printed summary: one table of every model and size, then BLIS, trace and decision lines."""
    per = res["cores"]["per"]
    lines = [f"jaxroute bench ({res['config']['preset']}): {res['n_devices']} x {res['device']['kind']} "
             f"({res['device']['platform']}), {res['cores']['used']} {per}(s) used of {res['cores']['os_cpu_count']} "
             f"cores; jax {res['jax_version']}; load average {res['load_average']['before']} -> "
             f"{res['load_average']['after']}; compile effort {res['config'].get('compile_effort', 'optimized')}", ""]
    rows = []
    for m in res["models"]:
        for s in m["sizes"]:
            rows.append([m["model"], str(s["seeds"]), _num(s["requests_per_s"]), _num(s["requests_per_s_per_core"]),
                         _num(s.get("reference_per_core")), _num(s.get("ratio_vs_reference"), ".2f"),
                         _num(s["first_run_s"], ".1f"), _num(s["compile_s"], ".1f"), _bytes(s["memory_per_row_bytes"])
                         + ("  OVERFLOW" if s["overflow"] else "")])
        if m.get("failed"):
            rows.append([m["model"], str(m["failed"]["seeds"]), m["failed"]["error"]] + [""] * 6)
    lines += _table(["model", "seeds", "requests/s", f"per {per}", "ref per core", "ratio", "first run s",
                     "compile s", "memory/row"], rows)
    lines.append("(requests/s: simulated requests of all rows and seeds per second of a steady run; ratio: per "
                 f"{per} over the pure-Python reference's per core; a 1-seed row on several devices includes padding)")
    for m in res["models"]:
        bits = []
        if m.get("seed_scaling"):
            s = m["seed_scaling"]
            bits.append(f"{s['from_seeds']}->{s['to_seeds']} seeds x{s['ratio']:.2f} "
                        f"({'flat or rising' if s['flat_or_rising'] else 'FALLING'})")
        rq = m.get("request_scaling")
        if rq and "per_request_cost_ratio" in rq:
            bits.append(f"{rq['requests_per_seed'][0]:,}->{rq['requests_per_seed'][1]:,} requests/seed: time per "
                        f"request x{rq['per_request_cost_ratio']:.2f} ({'linear' if rq['linear'] else 'NOT linear'})")
        elif rq:
            bits.append(f"2x requests failed: {rq.get('error')}")
        ref = m.get("reference")
        if ref and not ref.get("available"):
            bits.append(f"reference unavailable: {ref.get('reason') or ref.get('error')}")
        if bits:
            lines.append(f"  {m['model']}: " + "; ".join(bits))
    lines += _cost_lines(res["models"])
    lines += _blis_lines(res.get("blis")) + _trace_lines(res.get("trace")) + _decision_lines(res.get("decision"))
    lines += _job_lines(res.get("jobs"))
    for e in res["errors"]:
        lines.append(f"ERROR in {e['part']}: {e['error']} {e['detail']}")
    lines.append(f"({res['elapsed_s']:.0f} s in all)")
    return "\n".join(lines)


def _cost_lines(models: list[dict]) -> list[str]:
    """What one simulated request costs in steps and launches, and the launch-bound projection."""
    rows = []
    for m in models:
        c = m.get("cost")
        if not c:
            continue
        if not c.get("available"):
            rows.append([m["model"], f"not counted: {c.get('why') or c.get('error')}"] + [""] * 6)
            continue
        top = next((loop for loop in c["nested_loops"] if loop["trips"]), None)
        loop = f"{top['trips_per_step']:.1f} x {top['ops_per_trip']}" if top else "-"
        p = c["projection"]
        rows.append([m["model"], _num(c["scan_steps_per_request"], ".2f"), _num(c["launches_per_step"]),
                     str(c["compiled_ops_per_step"]), loop, _num(c["launches_per_request"]),
                     f"{_num(p['requests_per_s'])} @ {p['rows_in_parallel']:,} rows"])
    if not rows:
        return []
    us = next(m["cost"]["projection"]["assumed_us_per_launch"] for m in models if m.get("cost", {}).get("available"))
    return ["", "cost per simulated request (counted, not timed):"] + _table(
        ["model", "steps/request", "launches/step", "compiled ops/step", "top loop (trips/step x ops)",
         "launches/request", f"launch-bound req/s at {us:g} us/launch"], rows)


def _blis_lines(b: dict | None) -> list[str]:
    if not b:
        return []
    s = b["scenario"]
    live = any("blis_measured" in r for r in b["runs"])
    source = "timed in this run" if live else f"figures from {b['blis']['source']}"
    out = ["", f"BLIS scenario: {s['replicas']} x {s['model']} on {s['gpu']}, Poisson {s['rate']:g} req/s, prompt "
           f"{s['prompt_tokens']:,}, output {s['output_tokens']}, {s['policy']}, {b['seeds']} seed(s); BLIS "
           f"{source} (one core)"]
    for r in b["runs"]:
        if "requests_per_s" not in r:
            out.append(f"  {r['workload']:<14} {r['requests_per_seed']:>6,} requests: failed ({r['error']})")
            continue
        blis_run = r.get("blis_measured")
        how = (f"{blis_run['scenario']}, median of {blis_run['repeats']}" if blis_run
               else f"rr (CACHE_DELAY_US=0, {r['blis_requests']:,} requests)")
        out.append(f"  {r['workload']:<14} {r['requests_per_seed']:>6,} requests: ours {r['requests_per_s']:,.0f} "
                   f"req/s = {r['requests_per_s_per_core']:,.0f} per core; BLIS {how} "
                   f"{r['blis_requests_per_s_per_core']:,.0f} per core -> ratio {r['ratio_per_core']:.3f}")
        m = r["metrics"]
        out.append(f"      TTFT mean {m['ttft_mean_s'] * 1e3:.1f} ms, p99 {m['ttft_p99_s'] * 1e3:.1f} ms, TPOT mean "
                   f"{m['tpot_mean_s'] * 1e3:.1f} ms, E2E mean {m['mean_latency_s']:.3f} s, hit rate {m['hit_rate']:.2f}")
        if blis_run:
            out.append("      BLIS: " + _blis_metrics(blis_run["metrics"]))
    if not live:
        out.append(f"  BLIS: rr with default 50 ms snapshots {_range(b, 'rr_default_snapshots_requests_per_s')} req/s; "
                   f"prefix-weighted {_range(b, 'prefix_weighted_requests_per_s')} req/s; rr at 2,000 requests: "
                   + _blis_metrics(b["blis"]["rr_metrics_2000_requests"]))
    return out + _fidelity_lines(b.get("fidelity"))


def _fidelity_lines(f: dict | None) -> list[str]:
    if not f:
        return []
    ms = lambda x: f"{x * 1e3:.1f}"  # noqa: E731
    rows = [[f"{r['rate']:g}", ms(r["ours"]["ttft_mean_s"]), ms(r["blis"]["ttft_mean_s"]),
             f"{r['relative_difference']['ttft_mean_s']:+.1%}", ms(r["ours"]["tpot_mean_s"]),
             ms(r["blis"]["itl_mean_s"]), f"{r['relative_difference']['tpot_mean_s']:+.1%}",
             f"{r['ours']['mean_latency_s']:.3f}", f"{r['blis']['e2e_mean_s']:.3f}",
             f"{r['relative_difference']['mean_latency_s']:+.1%}"] for r in f["rows"]]
    return ["", f"Fidelity beside BLIS: unique prompts, {f['policy']}, {f['requests']:,} requests, means over "
            f"{f['draws']} arrival draws each (ours and BLIS draw their own arrivals)"] + _table(
        ["req/s", "TTFT ms", "BLIS", "diff", "TPOT ms", "BLIS ITL", "diff", "E2E s", "BLIS", "diff"], rows)


def _blis_metrics(m: dict) -> str:
    return (f"TTFT mean {m['ttft_mean_s'] * 1e3:.1f} ms, p99 {m['ttft_p99_s'] * 1e3:.1f} ms, ITL mean "
            f"{m['itl_mean_s'] * 1e3:.1f} ms, E2E mean {m['e2e_mean_s']:.3f} s")


def _range(b: dict, key: str) -> str:
    lo, hi = b["blis"][key]
    return f"{lo:,.0f}-{hi:,.0f}"


def _trace_lines(t: dict | None) -> list[str]:
    if not t:
        return []
    cells = []
    for r in t["sizes"]:
        n = r["requests_per_seed"]
        if "requests_per_s" in r:
            cells.append(f"{n:,}: {r['requests_per_s']:,.0f} req/s")
        else:
            cells.append(f"{n:,}: {'interrupted' if r.get('interrupted') else r.get('error', 'failed')}")
    ratio = t["max_over_min"]
    verdict = "-" if ratio is None else f"max/min {ratio:.2f} ({'flat' if t['flat'] else 'NOT flat'}; target <= " \
                                        f"{t['target_max_over_min']:g})"
    return ["", "trace-length scaling (unique prompts, rr, 1 seed): " + "; ".join(cells) + f" -> {verdict}"]


def _job_lines(j: dict | None) -> list[str]:
    if not j:
        return []
    lines = ["", "user jobs (one grid, one seed; wall time includes compilation):"]
    rows = [[r["job"], f"{r['requests']:,} x {len(r['routers'])}", _num(r["wall_s"], ".1f"), _num(r["compile_s"], ".1f"),
             _num(r["requests_per_s"]), f"{r['target_wall_s']:.0f} s: {'met' if r['within_target'] else 'MISSED'}"
             + ("  OVERFLOW" if r["overflow"] else "")] if r.get("ran") else
            [r["job"], "not run", r.get("why") or f"{r.get('error')} {r.get('detail')}", "", "", ""]
            for r in j["runs"]]
    return lines + _table(["job", "requests x routers", "wall s", "compile s", "requests/s", "target"], rows)


def _decision_lines(d: dict | None) -> list[str]:
    if not d:
        return []
    out = ["", f"BR decision latency, G={d['G']}, pool {d['pool']}, W={d['W']}, H={d['H']} (target P50 <= "
           f"{d['target_p50_ms']:g} ms; BalanceRoute's Python proxy: P50 {d['paper_python_proxy_ms']['p50']} ms, "
           f"P99 {d['paper_python_proxy_ms']['p99']} ms):"]
    for k, v in list(d["decisions"].items()) + [("brh predicted loads", d["brh_predicted_loads"])]:
        out.append(f"  {k:<20} P50 {v['p50_ms']:.3f} ms  P99 {v['p99_ms']:.3f} ms"
                   f"{'' if v['meets_target'] else '  (above target)'}")
    return out
