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
# Requests/s on the 8-replica cluster: light, medium, near saturation for least-loaded routing
# (calibrated with this script's --rates on the same cluster; see the README's table).
LADDER = {"shared-prefix": (20.0, 40.0, 60.0), "toolbench": (20.0, 40.0, 60.0), "mooncake": (1.0, 2.0, 3.0)}
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
    ap.add_argument("--seeds", type=int, default=8, help="seeds per row (default 8)")
    ap.add_argument("--requests", type=int, default=1000, help="requests per run (default 1000)")
    ap.add_argument("--replicas", type=int, default=8, help="replicas (default 8)")
    ap.add_argument("--workloads", default=",".join(LADDER), help=f"comma-separated (default {','.join(LADDER)})")
    ap.add_argument("--routers", default=",".join(ROUTERS), help="comma-separated policies (default: all production)")
    ap.add_argument("--out", default="results/production_routers.json", help="JSON path (PNG beside it)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    use_all_cpu_cores()
    seeds, requests = (2, 200) if args.quick else (args.seeds, args.requests)
    routers = tuple(args.routers.split(","))
    out = {"cluster": dict(CLUSTER, replicas=args.replicas), "seeds": seeds, "requests": requests, "workloads": {}}
    panels = {}
    for name in args.workloads.split(","):
        rates = LADDER[name][:2] if args.quick else LADDER[name]
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
        out["workloads"][name] = {"rates": list(rates), "elapsed_s": elapsed,
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
