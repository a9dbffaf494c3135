"""The routers people run (llm-d, Dynamo, SGLang gateway, vLLM production-stack, AIBrix) on one cluster.

8 replicas of Qwen3-32B, each on 2 x H100 (TP 2; KV capacity from memory at 90 %), behind every
production router, on three workloads (inference-perf's shared-prefix, toolbench, the Mooncake trace
in ../shared/data) at a ladder of arrival rates. Every (router, rate) pair of a workload is one row
of ONE compiled grid, run on the same seeds. Prints a table per workload and rate (means with 95 %
CIs over seeds) and writes JSON and a PNG of TTFT p90 and output tokens/s against load.

    python scripts/compare_production_routers.py [--quick] [--out results/production_routers.json]

The Mooncake trace replays the same requests on every seed (its CIs are zero-width); `--rate`
rescales its recorded times to each rate of the ladder.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from jaxroute import report
from jaxroute.cli import use_all_cpu_cores
from jaxroute.experiments.cluster import build_workload, policy_rows, run_cluster

ROUTERS = ("random", "llmd_precise", "llmd_approx", "llmd_load", "llmd_load_aware", "dynamo_kv",
           "sglang_cache_aware", "sglang_power_of_two", "vllm_prefixaware", "vllm_session", "vllm_kvaware",
           "aibrix_prefix_cache", "aibrix_least_request")
# Per workload: a rate ladder (requests/s on the 8-replica cluster) from light load to past least_load's
# knee (where its queue starts to grow: ~700 req/s for shared-prefix, which max_running = 64 bounds;
# ~150 for toolbench; ~8 for Mooncake's 10k-40k-token prompts), and the run size (Mooncake replays one
# trace, so its seeds differ only in the routers' coin flips, and each request is costly to simulate).
LADDER = {"shared-prefix": dict(rates=(150.0, 400.0, 650.0, 800.0), requests=1000, seeds=8),
          "toolbench": dict(rates=(40.0, 90.0, 130.0, 160.0), requests=1000, seeds=8),
          "mooncake": dict(rates=(2.0, 5.0, 8.0), requests=300, seeds=2)}
COLS = ("ttft_p90_s", "output_tokens_per_s", "mean_latency_s", "hit_rate", "queue_mean", "kv_usage_mean",
        "preemptions", "max_replica_share")
CLUSTER = dict(gpu="h100", model_name="qwen3-32b", tp=2)


def run_workload(name, rates, routers, *, replicas, requests, seeds, progress):
    wl = build_workload(name, requests)
    rows = []
    for rate in rates:
        rows += [(f"{p}@{rate:g}", params) for p, params in policy_rows(routers, rate=rate, **CLUSTER)]
    start = time.perf_counter()
    res = run_cluster(rows, wl, replicas_n=replicas, seeds=seeds, progress=progress)
    return res, time.perf_counter() - start


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small run (CI smoke: 2 seeds x 200 requests, 2 rates)")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per row (default: per workload, see LADDER)")
    ap.add_argument("--requests", type=int, default=None, help="requests per run (default: per workload)")
    ap.add_argument("--replicas", type=int, default=8, help="replicas (default 8)")
    ap.add_argument("--workloads", default=",".join(LADDER), help=f"comma-separated (default {','.join(LADDER)})")
    ap.add_argument("--routers", default=",".join(ROUTERS), help="comma-separated policies (default: all production)")
    ap.add_argument("--out", default="results/production_routers.json", help="JSON path (PNG beside it)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    use_all_cpu_cores()
    routers = tuple(args.routers.split(","))
    out = {"cluster": dict(CLUSTER, replicas=args.replicas), "workloads": {}}
    panels = {}
    for name in args.workloads.split(","):
        size = LADDER[name]
        seeds = 2 if args.quick else args.seeds or size["seeds"]
        requests = min(200, size["requests"]) if args.quick else args.requests or size["requests"]
        rates = size["rates"][:2] if args.quick else size["rates"]
        res, elapsed = run_workload(name, rates, routers, replicas=args.replicas, requests=requests, seeds=seeds,
                                    progress=not args.no_progress)
        n_sim = len(res.records) * seeds * requests
        print(f"\n== {name}: {args.replicas} x Qwen3-32B on 2 x H100 (KV {res.records[0].params['kv_capacity']:,} "
              f"tokens), {seeds} seeds x {requests} requests; {n_sim:,} requests in {elapsed:.1f} s "
              f"({n_sim / elapsed:,.0f} simulated requests/s, compilation included)")
        for rate in rates:
            recs = [r for r in res.records if r.policy.endswith(f"@{rate:g}")]
            print(f"-- {rate:g} requests/s")
            print(report.format_table(recs, COLS, label=lambda r: r.policy.split("@")[0]))
        out["workloads"][name] = {"rates": list(rates), "seeds": seeds, "requests": requests, "elapsed_s": elapsed,
                                  "records": [r.as_json() for r in res.records]}
        for metric, title in (("ttft_p90_s", "TTFT p90 (s)"), ("output_tokens_per_s", "output tokens/s")):
            lines = []
            for p in routers:
                s = [next(r for r in res.records if r.policy == f"{p}@{rate:g}").metrics[metric] for rate in rates]
                lines.append(dict(x=list(rates), y=[v.mean for v in s], lo=[v.lo for v in s], hi=[v.hi for v in s],
                                  label=p, marker="o", ms=3))
            panels[f"{name}: {title}"] = lines
    path = report.write_json(args.out, out)
    png = report.line_plot(panels, Path(args.out).with_suffix(".png"), xlabel="arrival rate (requests/s)",
                           ylabel="mean with 95 % CI over seeds", title="production routers, 8 x Qwen3-32B (TP 2, H100)")
    print(f"\nwrote {path} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
