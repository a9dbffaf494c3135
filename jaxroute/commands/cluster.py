"""`jaxroute cluster`: replicas with prefix caches behind cache-aware routers, many seeds, one compilation."""

from __future__ import annotations

import math
import time

from jaxroute import report
from jaxroute.commands._common import (
    add_grid_args,
    at_least,
    check_conservation,
    check_overflow,
    choose,
    csv_list,
    non_negative_float,
    off_or,
    positive_float,
    positive_int,
    probability,
    save_outputs,
    show_progress,
    warn,
)
from jaxroute.experiments.cluster import (
    METRICS,
    WORKLOADS,
    build_workload,
    policy_rows,
    run_cluster,
)
from jaxroute.routers.prefix import PREFIX_POLICIES
from jaxroute.workloads import prefix as wl_prefix

DEFAULT_POLICIES = "rr,least_load,affinity,threshold,cache_guard,sglang_cache_aware"
PLOT_METRICS = ("mean_latency_s", "p99_latency_s", "hit_rate", "max_replica_share")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "cluster",
        help="replicas with prefix caches: should the router follow the cache or the load?",
        description="Simulate G replicas of one model (continuous batching, chunked prefill, KV memory "
        "limit, per-replica LRU prefix cache at segment granularity) behind a router, and compare "
        "routers on the same seeds in one compiled program. The table gives means with 95%% CIs over "
        "seeds: latency, TTFT and TPOT in seconds, hit rate (cached prompt tokens / prompt tokens), "
        "replication factor (sum of cached tokens over replicas / unique cached tokens, averaged over "
        "time) and the largest share of requests sent to one replica.",
    )
    p.add_argument("--workload", default="longdoc", metavar="NAME",
                   help=f"one of: {', '.join(WORKLOADS)} (default longdoc). The synthetic ones are "
                   "documented in jaxroute/workloads/prefix/synthetic.py; mooncake and azure-conv read --trace")
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="trace file for mooncake (JSONL) or azure-conv (CSV) "
                   "(default: ../shared/data/<the public trace>)")
    p.add_argument("--replicas", type=positive_int, default=4, metavar="G", help="number of replicas (default 4)")
    p.add_argument("--rate", type=positive_float, default=None, metavar="REQ_PER_S",
                   help="Poisson arrival rate in requests/s (default 1.0); for traces it rescales the "
                   "recorded times to this mean rate (default: replay as recorded)")
    p.add_argument("--policies", default=DEFAULT_POLICIES, metavar="LIST",
                   help=f"comma-separated routers from: {', '.join(PREFIX_POLICIES)} (default: {DEFAULT_POLICIES}). "
                   "preble_e2 is Preble's E2 (exploit the longest match when cached > missed tokens, else explore; "
                   "lowest load cost L+M+P in GPU seconds; post-hoc rebalancing; no autoscaling, no prefill/decode "
                   "pairing): see jaxroute/routers/preble.py and jaxroute/clusters/replicas/")
    p.add_argument("--theta", type=probability, default=0.5, metavar="F",
                   help="match ratio needed by threshold and cache_guard (default 0.5)")
    p.add_argument("--e2-window", type=positive_float, default=180.0, metavar="SECONDS",
                   help="preble_e2: load window H in seconds (Preble's default 3 minutes) (default 180)")
    p.add_argument("--e2-th-bal", type=off_or(at_least(1.0)), default=1.5, metavar="F",
                   help="preble_e2: rebalancing threshold Th_bal >= 1: when the chosen replica's window load "
                   "exceeds F x the lightest replica's, send to the lightest; 'off' disables (default 1.5)")
    p.add_argument("--hot-tool", type=probability, default=0.0, metavar="SHARE",
                   help="toolbench only: share of traffic on one hot tool, e.g. 0.4 (default 0: Zipf only)")
    p.add_argument("--local", default="fcfs", metavar="ORDER",
                   help="local queue order on each replica: fcfs or lpm (longest prefix match first) (default fcfs)")
    p.add_argument("--stale", type=non_negative_float, default=0.0, metavar="T",
                   help="the router's view (loads and replica caches) is a snapshot refreshed every T seconds; "
                   "its own dispatches are always known (default 0: fresh)")
    p.add_argument("--cost-model", default="roofline", metavar="KIND",
                   help="iteration time: roofline or preble (Preble's fitted A6000 equations) (default roofline)")
    p.add_argument("--gpu", default="a6000", metavar="NAME", help="GPU of every replica (default a6000)")
    p.add_argument("--model", default="mistral-7b", metavar="NAME", help="model served (default mistral-7b)")
    p.add_argument("--kv-capacity", type=positive_int, default=None, metavar="TOKENS",
                   help="KV tokens per replica (default: from GPU and model at 90%% memory; 219,089 for "
                   "Mistral-7B on A6000)")
    p.add_argument("--chunk", type=positive_int, default=512, metavar="TOKENS", help="prefill tokens per iteration (default 512)")
    p.add_argument("--max-running", type=positive_int, default=64, metavar="B",
                   help="max running requests per replica, like SGLang's --max-running-requests: requests wait "
                   "for a slot (reported as running_full in the JSON) (default 64)")
    p.add_argument("--max-queue", type=positive_int, default=None, metavar="Q",
                   help="local queue capacity per replica (default: 4 x requests / replicas, at least 64, at most "
                   "the requests; doubled and rerun while it overflows, up to 3 times)")
    p.add_argument("--e2-ring", type=positive_int, default=None, metavar="K",
                   help="preble_e2: dispatches remembered per replica for the load window (default: 4 x rate x window "
                   "/ replicas, at least 64, at most the requests; doubled and rerun while it overflows)")
    add_grid_args(p, seeds=16, requests=2000, seeds_help="independent runs per policy")
    p.set_defaults(func=run)


def run(args) -> int:
    name = choose([args.workload], WORKLOADS, "workload")[0]
    local = choose([args.local], ("fcfs", "lpm"), "local order")[0]
    cost_model = choose([args.cost_model], ("roofline", "preble"), "cost model")[0]
    policies = choose(csv_list(args.policies), PREFIX_POLICIES, "policy")
    G, seeds, requests, stale = args.replicas, args.seeds, args.requests, args.stale
    is_trace = name in wl_prefix.TRACE_WORKLOADS
    rate = args.rate if args.rate is not None else (0.0 if is_trace else 1.0)  # 0: replay recorded times
    if seeds < 2:
        warn("one seed gives no confidence interval")
    workload = build_workload(name, requests, args.trace, args.hot_tool)
    if is_trace and seeds > 1:
        warn("trace workloads replay the same requests on every seed: the CIs are zero-width")
    rows = policy_rows(policies, rate=rate, stale=stale, kv_capacity=args.kv_capacity, gpu=args.gpu,
                       model_name=args.model, cost_model=cost_model, theta=args.theta,
                       e2_window_s=args.e2_window, e2_th_bal=args.e2_th_bal)

    start = time.perf_counter()
    results = run_cluster(rows, workload, replicas_n=G, seeds=seeds, local=local, chunk=args.chunk,
                          max_running=args.max_running, seed=args.seed, progress=show_progress(args),
                          capacities={"max_queue": args.max_queue, "router_window": args.e2_ring})
    elapsed = time.perf_counter() - start
    records = results.records
    check_conservation(results)
    check_overflow(records, args, "A replica's local queue was full or a run did not finish")
    cap = records[0].params["kv_capacity"]
    rate_txt = "recorded times" if rate <= 0 else f"{rate:g} req/s"
    title = (f"cluster: {name}, {G} replicas ({args.model} on {args.gpu}, KV {cap:,} tokens, {cost_model}), "
             f"{rate_txt}, local {local}, theta {args.theta:g}, "
             f"{'stale view T=' + str(stale) if stale > 0 else 'fresh view'}; {seeds} seeds x {requests} requests")
    print(title)
    print(report.format_table(records, METRICS))
    print(f"simulated {len(records) * seeds * requests:,} requests in {elapsed:.1f} s "
          f"({len(records) * seeds * requests / elapsed:,.0f} requests/s, compilation included)")
    config = {"workload": name, "trace": args.trace, "replicas": G, "rate": rate, "seeds": seeds,
              "requests": requests, "local": local, "stale_s": stale, "cost_model": cost_model, "gpu": args.gpu,
              "model": args.model, "kv_capacity": cap, "chunk": args.chunk, "max_running": args.max_running,
              "max_queue": results.model.max_queue, "e2_ring": results.model.router_window,
              "hot_tool": args.hot_tool, "seed": args.seed, "elapsed_s": elapsed}
    if "preble_e2" in policies:
        th = args.e2_th_bal
        config.update(e2_window_s=args.e2_window, e2_th_bal=th if math.isfinite(th) else None)
    save_outputs(args, "cluster", config, records,
                 lambda path: report.bar_plot(records, PLOT_METRICS, path, title))
    return 0
