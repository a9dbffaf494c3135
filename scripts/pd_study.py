"""Prefill/decode disaggregation study: colocated against every P:D ratio, prefill and decode routers, two SLOs.

Deployment: 8 groups of Llama-3.1-70B on 4 H200 each (TP 4), KV over one 400 Gb/s NIC per GPU (0.1 ms per
transfer). Two workloads with opposite shapes:
- Mooncake (the public synthetic trace in ../shared/data: prompts ~15k tokens, outputs ~150; prefill-heavy),
  rescaled to 4 req/s (its own rate is 3.9);
- shared-prefix (8 system prompts of 2,000 tokens x 16 questions of 300, outputs of 400; decode-heavy and
  mostly cached), Poisson at 40 req/s.
Rows per workload: every P:D in 1:7 ... 7:1, prefill router llmd_precise or random, decode router jsq, br0 or brh
(the oracle predictor), plus the same 8 groups colocated (one replica cluster, each prefill router). All
disaggregated rows are one compiled grid per tier (P and D are traced). Each SLO pair (tight and loose, per
workload) is applied to the same runs' per-request records.

A third part puts the cache-aware BalanceRoute (no peer has it) beside BR-0, cache-only routing and JSQ on the
same 8 groups run as decode DP ranks with colocated prefill and a prefix cache each (SGLang DP attention):
shared-prefix, Poisson at 40 req/s and saturated (every request waiting at t = 0).

Published claims checked (DistServe, OSDI'24; Splitwise, ISCA'24):
1. Disaggregation wins (goodput within SLO) when both the TTFT and the TPOT SLO are tight; colocation is
   competitive when they are loose (DistServe §2-3: prefill-decode interference inflates TPOT; Splitwise §3).
2. The best P:D ratio depends on the prompt and output lengths (DistServe §4 placement; Splitwise's
   machine pools): prefill-heavy traffic wants more prefill groups.

    python scripts/pd_study.py [--quick] [--out results/pd_study.json]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from jaxroute import report
from jaxroute.cli import use_all_cpu_cores
from jaxroute.experiments import pd
from jaxroute.experiments.cluster import build_workload

GROUPS = 8
RATIOS = [(p, GROUPS - p) for p in range(1, GROUPS)]
PREFILL_ROUTERS = ("llmd_precise", "random")
DECODE_ROUTERS = ("jsq", "br0", "brh")
DEP = pd.Deployment(gpu="H200", model="Llama-3.1-70B", tp=4)
SP = dict(groups=8, prompts_per_group=16, system_tokens=2000, question_tokens=300, output_tokens=400)
# per workload: (rate req/s, tight (TTFT s, TPOT s), loose (TTFT s, TPOT s))
WORKLOADS = {"mooncake": (4.0, (3.0, 0.02), (10.0, 0.1)), "shared-prefix": (40.0, (0.2, 0.015), (2.0, 0.1))}
TABLE = ("goodput_rps", "slo_attainment", "ttft_p90_s", "tpot_p90_s", "prefill_hit_rate", "util_prefill",
         "util_decode", "decode_imbalance_tokens")


def _best(results, rows, colocated: bool) -> pd.PDRow:
    cands = [r for r in rows if r.colocated == colocated]
    return max(cands, key=lambda r: results.record(r.label).metrics["goodput_rps"].mean)


def _mean(results, row, metric) -> float:
    return float(results.record(row.label).metrics[metric].mean)


def study(name: str, scale: dict, plots: Path, progress: bool) -> dict:
    rate, tight, loose = WORKLOADS[name]
    ratios = RATIOS if not scale["quick"] else [(2, 6), (4, 4), (6, 2)]
    decode = DECODE_ROUTERS if not scale["quick"] else ("jsq", "br0")
    rows = pd.rows_for(PREFILL_ROUTERS, decode, ratios, colocated=True)
    workload = build_workload(name, scale["requests"], None, shared_prefix=SP if name == "shared-prefix" else None)
    start = time.perf_counter()
    _, raw = pd.run_pd(rows, workload, rate=rate, seeds=scale["seeds"], dep=DEP, slo_ttft=tight[0], slo_tpot=tight[1],
                       progress=progress)
    wall = time.perf_counter() - start
    out = {"rate": rate, "rows": len(rows), "wall_s": wall, "slos": {}}
    info = dict(rate=rate, gpu=DEP.gpu, model=DEP.model, tp=DEP.tp, workload=name)
    for kind, (ttft, tpot) in (("tight", tight), ("loose", loose)):
        res = pd.summarize(rows, raw, scale["seeds"], ttft, tpot, info)
        title = f"{name} at {rate:g} req/s, SLO {kind}: TTFT {ttft:g} s, TPOT {tpot * 1e3:g} ms ({scale['seeds']} seeds x {scale['requests']} requests)"
        print(f"\n[{name}, {kind} SLOs] {title}")
        print(report.format_table(res.records, TABLE))
        best_d, best_c = _best(res, rows, False), _best(res, rows, True)
        g_d, g_c = _mean(res, best_d, "goodput_rps"), _mean(res, best_c, "goodput_rps")
        print(f"best disaggregated: {best_d.label} ({g_d:.3g} req/s); best colocated: {best_c.label} ({g_c:.3g} req/s); "
              f"ratio {g_d / max(g_c, 1e-9):.2f}x")
        plot = plots / f"pd_{name}_{kind}.png"
        pd.ratio_plot(res, rows, plot, title)
        out["slos"][kind] = {"ttft_s": ttft, "tpot_s": tpot, "best_disaggregated": best_d.label,
                             "best_colocated": best_c.label, "goodput_disaggregated": g_d, "goodput_colocated": g_c,
                             "plot": str(plot), "records": [r.as_json() for r in res.records]}
    # routers at the best ratio (tight SLOs): prefill llmd_precise vs random, decode jsq vs br0 vs brh
    res = pd.summarize(rows, raw, scale["seeds"], tight[0], tight[1], info)
    best = _best(res, rows, False)
    at = [r for r in rows if not r.colocated and (r.n_prefill, r.n_decode) == (best.n_prefill, best.n_decode)]
    print(f"[{name}] routers at {best.n_prefill}:{best.n_decode}:")
    print(report.format_table([res.record(r.label) for r in at], ("goodput_rps", "ttft_p90_s", "tpot_p90_s",
                                                                   "prefill_hit_rate", "decode_imbalance_tokens")))
    out["routers_at_best"] = [res.record(r.label).as_json() for r in at]
    return out


CACHE_POLICIES = ("jsq", "br0", "br_cache", "cache")


def cache_aware(scale: dict, progress: bool) -> dict:
    """br_cache against br0, cache-only and jsq on colocated DP ranks with prefix caches."""
    workload = build_workload("shared-prefix", scale["requests"], None, shared_prefix=SP)
    out = {}
    for arrival in ("poisson", "saturated"):
        start = time.perf_counter()
        res = pd.run_cache_aware_dp(workload, CACHE_POLICIES, ranks=GROUPS, rate=WORKLOADS["shared-prefix"][0],
                                    seeds=scale["seeds"], dep=DEP, arrival=arrival, progress=progress)
        print(f"\n[cache-aware DP, {arrival}] shared-prefix on {GROUPS} DP ranks ({DEP.model}, TP {DEP.tp}), colocated "
              f"prefill, prefix cache of {res.records[0].params['cache_tokens']:,} tokens per rank")
        print(report.format_table(res.records, pd.CACHE_DP_METRICS))
        out[arrival] = {"wall_s": time.perf_counter() - start, "records": [r.as_json() for r in res.records]}
    return out


def verdicts(out: dict) -> list[str]:
    """The two published claims against our numbers."""
    lines = []
    for name, o in out["workloads"].items():
        t, lo = o["slos"]["tight"], o["slos"]["loose"]
        gain_t = t["goodput_disaggregated"] / max(t["goodput_colocated"], 1e-9)
        gain_l = lo["goodput_disaggregated"] / max(lo["goodput_colocated"], 1e-9)
        verdict = "agrees" if gain_t > 1.0 and gain_t >= gain_l else "differs"
        lines.append(f"claim 1 on {name}: disaggregated / colocated goodput {gain_t:.2f}x at tight SLOs, {gain_l:.2f}x "
                     f"at loose ones -> {verdict}")
    best = {name: o["slos"]["tight"]["best_disaggregated"].split()[0] for name, o in out["workloads"].items()}
    if len(best) == 2:
        p = {k: int(v.split(":")[0]) for k, v in best.items()}
        agree = p.get("mooncake", 0) > p.get("shared-prefix", 0)
        lines.append(f"claim 2: best P:D at tight SLOs {best}; prefill-heavy Mooncake "
                     f"{'wants more' if agree else 'does not want more'} prefill groups -> {'agrees' if agree else 'differs'}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small run, same code paths (2 seeds x 48 requests, 3 ratios)")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per row (default 4; quick 2)")
    ap.add_argument("--requests", type=int, default=None, help="requests per run (default 300; quick 48)")
    parts = (*WORKLOADS, "cache-aware")
    ap.add_argument("--parts", default=",".join(parts), help=f"which parts to run (default {','.join(parts)})")
    ap.add_argument("--out", default="results/pd_study.json", help="JSON output path; PNGs go beside it")
    ap.add_argument("--progress", action="store_true", help="show progress bars")
    args = ap.parse_args(argv)
    chosen = [w.strip() for w in args.parts.split(",") if w.strip()]
    if unknown := [w for w in chosen if w not in parts]:
        ap.error(f"unknown part(s) {unknown}; choose from: {', '.join(parts)}")
    names = [w for w in chosen if w in WORKLOADS]
    use_all_cpu_cores()
    scale = {"seeds": args.seeds or (2 if args.quick else 4), "requests": args.requests or (48 if args.quick else 300),
             "quick": args.quick}
    plots = Path(args.out).parent
    plots.mkdir(parents=True, exist_ok=True)
    out = {"command": "pd_study", "config": dict(scale, deployment=DEP.__dict__, groups=GROUPS, shared_prefix=SP,
                                                  workloads={k: WORKLOADS[k] for k in names}), "workloads": {}}
    start = time.perf_counter()
    for name in names:
        out["workloads"][name] = study(name, scale, plots, args.progress)
    if "cache-aware" in chosen:
        out["cache_aware"] = cache_aware(scale, args.progress)
    out["verdicts"] = verdicts(out)
    print("\n" + "\n".join(out["verdicts"]))
    out["elapsed_s"] = time.perf_counter() - start
    path = report.write_json(args.out, out)
    print(f"\nwrote {path} ({out['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
