"""`jaxroute cluster`: replicas with prefix caches behind cache-aware routers, many seeds, one compilation."""

from __future__ import annotations

import math
import time

import jax
import numpy as np

from jaxroute import report, sim
from jaxroute.clusters import replicas
from jaxroute.commands._common import add_output_args, check_overflow, choose, csv_list, show_progress, warn
from jaxroute.errors import JaxrouteError
from jaxroute.routers.prefix import PREFIX_POLICIES, policy_id
from jaxroute.workloads import prefix as wl_prefix
from jaxroute.workloads import traces

WORKLOADS = wl_prefix.PREFIX_WORKLOADS + wl_prefix.TRACE_WORKLOADS
METRICS = replicas.METRICS
DEFAULT_POLICIES = "rr,least_load,affinity,threshold,cache_guard,sglang_cache_aware"


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
                   "documented in jaxroute/workloads/prefix.py; mooncake and azure-conv read --trace")
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="trace file for mooncake (JSONL) or azure-conv (CSV) "
                   "(default: ../shared/data/<the public trace>)")
    p.add_argument("--replicas", default="4", metavar="G", help="number of replicas (default 4)")
    p.add_argument("--rate", default=None, metavar="REQ_PER_S",
                   help="Poisson arrival rate in requests/s (default 1.0); for traces it rescales the "
                   "recorded times to this mean rate (default: replay as recorded)")
    p.add_argument("--policies", default=DEFAULT_POLICIES, metavar="LIST",
                   help=f"comma-separated routers from: {', '.join(PREFIX_POLICIES)} (default: {DEFAULT_POLICIES}). "
                   "preble_e2 is Preble's E2 (exploit the longest match when cached > missed tokens, else explore; "
                   "lowest load cost L+M+P in GPU seconds; post-hoc rebalancing; no autoscaling, no prefill/decode "
                   "pairing): see jaxroute/routers/prefix.py and jaxroute/clusters/replicas.py")
    p.add_argument("--seeds", default="16", metavar="S", help="independent runs per policy (default 16)")
    p.add_argument("--requests", default="2000", metavar="R", help="requests per run (default 2000)")
    p.add_argument("--theta", default="0.5", metavar="F",
                   help="match ratio needed by threshold and cache_guard (default 0.5)")
    p.add_argument("--e2-window", default="180", metavar="SECONDS",
                   help="preble_e2: load window H in seconds (Preble's default 3 minutes) (default 180)")
    p.add_argument("--e2-th-bal", default="1.5", metavar="F",
                   help="preble_e2: rebalancing threshold Th_bal >= 1: when the chosen replica's window load "
                   "exceeds F x the lightest replica's, send to the lightest; 'off' disables (default 1.5)")
    p.add_argument("--hot-tool", default="0", metavar="SHARE",
                   help="toolbench only: share of traffic on one hot tool, e.g. 0.4 (default 0: Zipf only)")
    p.add_argument("--local", default="fcfs", metavar="ORDER",
                   help="local queue order on each replica: fcfs or lpm (longest prefix match first) (default fcfs)")
    p.add_argument("--stale", default="0", metavar="T",
                   help="the router's view (loads and replica caches) is a snapshot refreshed every T seconds; "
                   "its own dispatches are always known (default 0: fresh)")
    p.add_argument("--cost-model", default="roofline", metavar="KIND",
                   help="iteration time: roofline or preble (Preble's fitted A6000 equations) (default roofline)")
    p.add_argument("--gpu", default="a6000", help="GPU of every replica (default a6000)")
    p.add_argument("--model", default="mistral-7b", help="model served (default mistral-7b)")
    p.add_argument("--kv-capacity", default=None, metavar="TOKENS",
                   help="KV tokens per replica (default: from GPU and model at 90%% memory; 219,089 for "
                   "Mistral-7B on A6000)")
    p.add_argument("--chunk", default="512", metavar="TOKENS", help="prefill tokens per iteration (default 512)")
    p.add_argument("--max-running", default="64", metavar="B",
                   help="max running requests per replica, like SGLang's --max-running-requests: requests wait "
                   "for a slot (reported as running_full in the JSON) (default 64)")
    p.add_argument("--seed", default="0", metavar="INT", help="base PRNG seed (default 0)")
    add_output_args(p)
    p.set_defaults(func=run)


def _num(text, flag: str, kind=float, minimum=None):
    try:
        v = kind(text)
    except (TypeError, ValueError):
        raise JaxrouteError(f"{flag} expects {'an integer' if kind is int else 'a number'}, got '{text}'") from None
    if kind is float and not math.isfinite(v):
        raise JaxrouteError(f"{flag} must be finite, got '{text}'")
    if minimum is not None and v < minimum:
        raise JaxrouteError(f"{flag} must be >= {minimum}, got {text}")
    return v


def build_workload(name: str, requests: int, trace: str | None = None, hot_tool: float = 0.0):
    """A prefix workload by CLI name (synthetic, or a trace adapted to segment form)."""
    if name in wl_prefix.PREFIX_WORKLOADS:
        if trace is not None:
            raise JaxrouteError(f"--trace is for mooncake / azure-conv, not the synthetic workload '{name}'")
        if hot_tool and name != "toolbench":
            raise JaxrouteError("--hot-tool applies to --workload toolbench only")
        kw = {"hot_tool_share": hot_tool} if name == "toolbench" else {}
        return wl_prefix.synthetic(name, requests, **kw)
    path = trace or wl_prefix.DEFAULT_TRACE_PATHS[name]
    if name == "mooncake":
        return wl_prefix.from_mooncake(traces.load_mooncake_jsonl(path).head(requests))
    return wl_prefix.from_azure(traces.load_azure_csv(path).head(requests))


def run_cluster(policies, workload, *, replicas_n=4, rate=1.0, seeds=16, theta=0.5, local="fcfs", stale=0.0,
                cost_model="roofline", gpu="a6000", model_name="mistral-7b", kv_capacity=None, chunk=512,
                max_running=64, seed=0, progress=False, extra_rows=None, label_params=None, e2_window_s=180.0,
                e2_th_bal=1.5):
    """Run every policy (or explicit (label, params) rows) on the same seeds in one compiled grid.

    Returns (records, model, grid). `extra_rows` replaces `policies` with explicit rows.
    """
    if extra_rows is None:
        rows = [(p, replicas.make_params(p, rate=rate, stale_s=stale, kv_capacity=kv_capacity, gpu=gpu,
                                         model=model_name, cost_model=cost_model, theta=theta,
                                         e2_window_s=e2_window_s, e2_th_bal=e2_th_bal)) for p in policies]
    else:
        rows = extra_rows
    caps = {int(np.asarray(p.kv_capacity)) for _, p in rows}
    for cap in caps:
        wl_prefix.check_fits(workload, cap)
    e2 = any(int(np.asarray(p.policy)) == policy_id("preble_e2") for _, p in rows)
    model = replicas.ReplicaCluster(n_replicas=replicas_n, chunk=chunk, max_running=max_running,
                                    max_queue=workload.n_requests, local_order=local, stale_view=stale > 0,
                                    e2_ring=workload.n_requests if e2 else 0)
    params = sim.stack_params([p for _, p in rows])
    grid = sim.run_grid(model, jax.random.key(seed), workload, params, seeds, chunk=1000,
                        progress="cluster" if progress else False)
    labels = [(name, dict(label_params or {}, **_row_params(p))) for name, p in rows]
    return report.records_from_grid(grid, labels, METRICS), model, grid


def _row_params(p: replicas.ReplicaParams) -> dict:
    out = {"rate": float(p.rate), "theta": float(p.router.theta), "stale_s": float(p.stale_s),
           "kv_capacity": int(p.kv_capacity)}
    if int(np.asarray(p.policy)) == policy_id("preble_e2"):
        th = float(p.router.e2_th_bal)
        out.update(e2_window_s=float(p.router.e2_window_s), e2_th_bal=th if math.isfinite(th) else None)
    return out


def plot(records, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.policy for r in records]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    for ax, m in zip(axes, ("mean_latency_s", "p99_latency_s", "hit_rate", "max_replica_share"), strict=True):
        means = [r.metrics[m].mean for r in records]
        errs = [r.metrics[m].half_width for r in records]
        ax.bar(range(len(names)), means, yerr=errs, capsize=3, color="tab:blue")
        ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
        ax.set_title(m)
        if m.endswith("latency_s") and max(means) > 20 * max(min(means), 1e-9):
            ax.set_yscale("log")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args) -> int:
    name = choose([args.workload], WORKLOADS, "workload")[0]
    G = _num(args.replicas, "--replicas", int, 1)
    seeds = _num(args.seeds, "--seeds", int, 1)
    requests = _num(args.requests, "--requests", int, 1)
    theta = _num(args.theta, "--theta")
    hot = _num(args.hot_tool, "--hot-tool")
    e2_window = _num(args.e2_window, "--e2-window")
    if e2_window <= 0:
        raise JaxrouteError(f"--e2-window must be > 0 seconds, got {args.e2_window}")
    e2_th_bal = math.inf if args.e2_th_bal.strip().lower() == "off" else _num(args.e2_th_bal, "--e2-th-bal", float, 1.0)
    stale = _num(args.stale, "--stale", float, 0.0)
    chunk = _num(args.chunk, "--chunk", int, 1)
    max_running = _num(args.max_running, "--max-running", int, 1)
    seed = _num(args.seed, "--seed", int, 0)
    kv = None if args.kv_capacity is None else _num(args.kv_capacity, "--kv-capacity", int, 1)
    is_trace = name in wl_prefix.TRACE_WORKLOADS
    rate = (0.0 if is_trace else 1.0) if args.rate is None else _num(args.rate, "--rate")
    if rate <= 0 and not (is_trace and args.rate is None):
        raise JaxrouteError(f"--rate must be > 0 requests/s, got {args.rate}")
    if not 0.0 <= theta <= 1.0:
        raise JaxrouteError(f"--theta must be in [0, 1], got {args.theta}")
    local = choose([args.local], ("fcfs", "lpm"), "local order")[0]
    cost_model = choose([args.cost_model], ("roofline", "preble"), "cost model")[0]
    policies = choose(csv_list(args.policies), PREFIX_POLICIES, "policy")
    if len(set(policies)) != len(policies):
        raise JaxrouteError(f"--policies lists a policy twice: {args.policies}")
    if seeds < 2:
        warn("one seed gives no confidence interval")
    workload = build_workload(name, requests, args.trace, hot)
    if is_trace and seeds > 1:
        warn("trace workloads replay the same requests on every seed: the CIs are zero-width")

    start = time.perf_counter()
    records, model, _ = run_cluster(policies, workload, replicas_n=G, rate=rate, seeds=seeds, theta=theta,
                                    local=local, stale=stale, cost_model=cost_model, gpu=args.gpu,
                                    model_name=args.model, kv_capacity=kv, chunk=chunk, max_running=max_running,
                                    seed=seed, progress=show_progress(args), e2_window_s=e2_window,
                                    e2_th_bal=e2_th_bal)
    elapsed = time.perf_counter() - start
    check_overflow(records, args, "A replica's local queue was full or a run did not finish")
    cap = records[0].params["kv_capacity"]
    rate_txt = "recorded times" if rate <= 0 else f"{rate:g} req/s"
    title = (f"cluster: {name}, {G} replicas ({args.model} on {args.gpu}, KV {cap:,} tokens, {cost_model}), "
             f"{rate_txt}, local {local}, theta {theta:g}, {'stale view T=' + str(stale) if stale > 0 else 'fresh view'}; "
             f"{seeds} seeds x {requests} requests")
    print(title)
    print(report.format_table(records, METRICS))
    print(f"simulated {len(records) * seeds * requests:,} requests in {elapsed:.1f} s "
          f"({len(records) * seeds * requests / elapsed:,.0f} requests/s, compilation included)")
    config = {"workload": name, "trace": args.trace, "replicas": G, "rate": rate, "seeds": seeds,
              "requests": requests, "local": local, "stale_s": stale, "cost_model": cost_model, "gpu": args.gpu,
              "model": args.model, "kv_capacity": cap, "chunk": chunk, "max_running": max_running,
              "hot_tool": hot, "seed": seed, "elapsed_s": elapsed}
    if "preble_e2" in policies:
        config.update(e2_window_s=e2_window, e2_th_bal=e2_th_bal if math.isfinite(e2_th_bal) else None)
    if args.out:
        report.write_results(args.out, "cluster", config, records)
        print(f"wrote {args.out}")
    if args.plot:
        plot(records, args.plot, title)
        print(f"wrote {args.plot}")
    return 0
