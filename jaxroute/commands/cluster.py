"""`jaxroute cluster`: replicas with prefix caches behind cache-aware routers, many seeds, one compilation."""

from __future__ import annotations

import argparse
import math
import textwrap
import time
from pathlib import Path

from jaxroute import catalog
from jaxroute.clusters.names import (
    ADMISSIONS,
    DEFAULT_CHUNK,
    DEFAULT_MAX_RUNNING,
    LOCAL_ORDERS,
    REPLICA_GPU,
    REPLICA_MODEL,
)
from jaxroute.commands._common import (
    add_control_args,
    add_grid_args,
    add_latency_args,
    add_lora_args,
    add_model_args,
    add_server_arg,
    add_shared_prefix_args,
    add_tier_args,
    apply_server,
    at_least,
    check_conservation,
    check_overflow,
    choose,
    control_settings,
    control_variants,
    csv_list,
    key_values,
    latency_choice,
    list_of,
    lora_rows,
    non_negative_float,
    non_negative_int,
    off_or,
    on_off,
    positive_float,
    positive_int,
    probability,
    rate_stages,
    requests_held,
    save_outputs,
    shared_prefix_settings,
    show_progress,
    tier_rows,
    warn,
    warn_extrapolation,
)
from jaxroute.errors import JaxrouteError
from jaxroute.experiments.names import (
    CLUSTER_WORKLOADS,
    check_cluster_workload,
    check_input_file,
)
from jaxroute.routers import spec as router_spec
from jaxroute.routers.names import (
    DEFAULT_E2_TH_BAL,
    DEFAULT_E2_WINDOW_S,
    DEFAULT_THETA,
    PREFIX_POLICIES,
    SCORERS,
    check_router_settings,
    router_setting_names,
)
from jaxroute.workloads.names import SP_DEFAULTS, TRACE_WORKLOADS

DEFAULT_POLICIES = "rr,least_load,affinity,threshold,cache_guard,sglang_cache_aware"
CONTROL_POLICIES = "rr,least_load,affinity,llmd_precise,dynamo_kv"  # the default under an autoscaler or gateway
DEFAULT_REQUESTS = 2000
PLOT_METRICS = ("mean_latency_s", "p99_latency_s", "hit_rate", "max_replica_share")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "cluster",
        help="replicas with prefix caches: should the router follow the cache or the load?",
        description=textwrap.fill("Simulate G replicas of one model (continuous batching, chunked prefill, KV memory "
        "limit, per-replica LRU prefix cache at segment granularity) behind a router, and compare "
        "routers on the same seeds in one compiled program. The table gives means with 95 % CIs over "
        "seeds: latency, TTFT and TPOT in seconds, output tokens/s of completed requests over the makespan "
        "(first arrival to last finish), hit rate (cached prompt tokens / prompt tokens), "
        "replication factor (sum of cached tokens over replicas / unique cached tokens, averaged over "
        "time), the largest share of requests sent to one replica, queue_mean (requests waiting in a "
        "replica's local queue) and kv_usage_mean (KV in use / capacity: locked cached + private tokens), "
        "both averaged over time and replicas, and preemptions (on-demand admission only).", 100),
        epilog="routers (--policies; docs/routers.md has what each follows, its partial-cluster support and "
        "tunable settings):\n" + router_spec.help_lines(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--workload", default=None, metavar="NAME",
                   help=f"one of: {', '.join(CLUSTER_WORKLOADS)} (default longdoc). The synthetic ones are "
                   "documented in jaxroute/workloads/prefix/synthetic.py; mooncake, azure-conv and burstgpt read --trace")
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="trace file for mooncake (JSONL), azure-conv or burstgpt (CSV) "
                   "(default: ../shared/data/<the public trace>)")
    p.add_argument("--inference-perf", default=None, metavar="CONFIG_PATH",
                   help="the workload of an inference-perf config.yml, read as it is: its data section (shared_prefix, "
                   "random, synthetic lengths) and load section (constant or poisson stages of rate and duration; "
                   "int(rate x duration) requests each) (jaxroute/workloads/inference_perf.py has the mapping and what "
                   "differs). Not with --workload, --rate, --rate-stages, --requests or --sp-* (default: none)")
    p.add_argument("--replicas", type=positive_int, default=4, metavar="G", help="number of replicas (default 4)")
    p.add_argument("--rate", type=positive_float, default=None, metavar="REQ_PER_S",
                   help="Poisson arrival rate in requests/s (default 1.0); for traces it rescales the "
                   "recorded times to this mean rate (default: replay as recorded)")
    p.add_argument("--policies", default=None, metavar="LIST",
                   help=f"comma-separated routers from: {', '.join(PREFIX_POLICIES)} (default: {DEFAULT_POLICIES}; "
                   f"with --autoscaler or --gate: {CONTROL_POLICIES}). "
                   "preble_e2 is Preble's E2 (exploit the longest match when cached > missed tokens, else explore; "
                   "lowest load cost L+M+P in GPU seconds; post-hoc rebalancing); preble adds prefill/decode pairing "
                   "and autoscaling of hot prefixes (use it with --local priority for Preble complete): see "
                   "jaxroute/routers/preble.py and jaxroute/clusters/replicas/")
    p.add_argument("--theta", type=probability, default=DEFAULT_THETA, metavar="F",
                   help=f"match ratio needed by threshold and cache_guard (default {DEFAULT_THETA:g})")
    p.add_argument("--e2-window", type=positive_float, default=DEFAULT_E2_WINDOW_S, metavar="SECONDS",
                   help="Preble presets: load window H in seconds (Preble's default 3 minutes) "
                   f"(default {DEFAULT_E2_WINDOW_S:g})")
    p.add_argument("--e2-th-bal", type=off_or(at_least(1.0)), default=DEFAULT_E2_TH_BAL, metavar="F",
                   help="Preble presets: rebalancing threshold Th_bal >= 1: when the chosen replica's window load "
                   "exceeds F x the lightest replica's, send to the lightest; 'off' disables "
                   f"(default {DEFAULT_E2_TH_BAL:g})")
    p.add_argument("--e2-pairing", type=list_of(on_off), default=None, metavar="on|off[,...]",
                   help="Preble presets: prefill/decode pairing (an exploring request goes to the replica whose "
                   "hit ratio over its last 30 s of admissions is the highest and >= 0.7). Both values (on,off) "
                   "give one row each, in the same compiled grid (default: the preset's, on for preble, off for "
                   "preble_e2)")
    p.add_argument("--e2-autoscale", type=list_of(on_off), default=None, metavar="on|off[,...]",
                   help="Preble presets: autoscaling of hot prefixes (when a prefix's TTFTs on its replica double "
                   "between the halves of the detector's window (3 minutes; set e2_overload_window_s with --router-set), "
                   "replicate it onto the lightest replica and split its traffic by load). Both values give one row each (default: on for preble, off for preble_e2)")
    p.add_argument("--weights", type=key_values, action="append", default=None, metavar="NAME=W,...",
                   help="scorer weights of the weighted presets (llmd_precise, llmd_approx, llmd_load, "
                   f"llmd_load_aware, weighted), over the scorers {', '.join(SCORERS)}; unnamed scorers weigh 0, "
                   "e.g. prefix=3,kv=2,queue=2. Repeat the flag to compare several vectors in one compiled grid "
                   "(rows preset[prefix=3,...]) (default: each preset's own weights; see jaxroute/routers/prefix.py)")
    p.add_argument("--router-set", type=key_values, default=None, metavar="NAME=V,...",
                   help="router module settings for every row, e.g. dyn_overlap_weight=2,llmd_block_tokens=16 "
                   "(names: the keywords of make_params in jaxroute/routers/{sglang,preble,llmd,dynamo,vllm_stack,"
                   "aibrix}.py; unknown names are refused) (default: the sources' defaults)")
    p.add_argument("--params-json", default=None, metavar="PATH.json",
                   help="add a row running the router and settings of this file (as `jaxroute tune --params-out` "
                   "writes: {\"router\": NAME, \"settings\": {\"weights\": {...}, \"theta\": ..., ...}}), labelled "
                   "ROUTER[tuned]; settings it leaves out come from the flags (--theta, --e2-*, --router-set) and the "
                   "preset; an unknown router or setting is refused (default: none)")
    p.add_argument("--hot-tool", type=probability, default=0.0, metavar="SHARE",
                   help="toolbench only: share of traffic on one hot tool, e.g. 0.4 (default 0: Zipf only)")
    p.add_argument("--local", default="fcfs", metavar="ORDER",
                   help="local queue order on each replica: fcfs, lpm (longest prefix match first) or priority "
                   "(Preble's priority groups: a request joins group ceil(hit ratio x P) - 1 when dispatched; "
                   "each batch admits from the next non-empty group downwards, at most (group + 1) x 10 requests, "
                   "so over a round of P batches the groups get 10, 9, ..., 1 parts) (default fcfs)")
    p.add_argument("--priority-groups", type=positive_int, default=10, metavar="P",
                   help="--local priority: number of priority groups (default 10, Preble's)")
    p.add_argument("--admission", default="reserve", metavar="MODE",
                   help="KV admission on each replica: reserve (a request waits until its uncached prompt and its "
                   "whole output fit; never preempts) or on-demand (vLLM V1: KV is taken step by step for the "
                   "tokens computed; when a running request's tokens do not fit, the last admitted request is "
                   "preempted, its KV freed, and it recomputes its prompt and output when readmitted; counted as "
                   "preemptions) (default reserve)")
    p.add_argument("--stale", type=non_negative_float, default=0.0, metavar="T",
                   help="the router's view (loads and replica caches) is a snapshot refreshed every T seconds; "
                   "its own dispatches are always known (default 0: fresh)")
    add_latency_args(p)
    p.add_argument("--gpu", default=REPLICA_GPU, metavar="NAME",
                   help=f"GPU of every replica: {', '.join(catalog.GPUS)} (or h100, a100; any case) (default {REPLICA_GPU})")
    add_model_args(p, default=REPLICA_MODEL,
                   help=f"model served: {', '.join(catalog.MODELS)} (any case) (default {REPLICA_MODEL})")
    p.add_argument("--tp", type=positive_int, default=1, metavar="T",
                   help="tensor-parallel GPUs per replica: they split the weights and the KV heads; refused when "
                   "the weights do not fit or T does not split the heads (default 1)")
    p.add_argument("--cost-params", default=None, metavar="PATH.json",
                   help="the roofline's factors fitted to a measured run (`jaxroute compare --fit --cost-params-out`): "
                   "effective compute and memory shares of peak and the fixed time of an iteration (default: the "
                   "catalog's, jaxroute/cost_models.py)")
    p.add_argument("--kv-capacity", type=positive_int, default=None, metavar="TOKENS",
                   help="KV tokens per replica (default: from GPU memory x tp at 90%% minus the weights; "
                   f"{catalog.kv_capacity_tokens('A6000', 'Mistral-7B'):,} for Mistral-7B on A6000, "
                   f"{catalog.kv_capacity_tokens('H100-SXM', 'Qwen3-32B', 2):,} for Qwen3-32B on 2 H100)")
    p.add_argument("--rate-stages", type=rate_stages, default=None, metavar="RATE:SECONDS,...",
                   help="staged Poisson load for synthetic workloads, like inference-perf's load stages, e.g. "
                   "10:60,20:60,40:60: the rate is piecewise constant over the stages and stays at the last "
                   "stage's rate after it. --requests defaults to the expected stage total round(sum rate x "
                   "seconds); fewer end the run early. A trace's recorded arrivals are time-warped to the stages (its burstiness kept, scaled). Not with --rate. A staged run prints a table per router with a row per "
                   "stage (the requests that arrived in it) and --plot also draws them against the stage rate in "
                   "PATH-stages.png (default: one --rate)")
    add_shared_prefix_args(p)
    p.add_argument("--chunk", type=positive_int, default=DEFAULT_CHUNK, metavar="TOKENS",
                   help=f"prefill tokens per iteration (default {DEFAULT_CHUNK})")
    p.add_argument("--max-running", type=positive_int, default=DEFAULT_MAX_RUNNING, metavar="B",
                   help="max running requests per replica, like SGLang's --max-running-requests: requests wait "
                   f"for a slot (reported as running_full in the JSON) (default {DEFAULT_MAX_RUNNING})")
    p.add_argument("--max-queue", type=positive_int, default=None, metavar="Q",
                   help="local queue capacity per replica (default: 4 x requests / replicas, at least 64, at most "
                   "the requests; doubled and rerun while it overflows, up to 3 times)")
    p.add_argument("--cache-slots", type=non_negative_int, default=None, metavar="C",
                   help="segments each replica's cache table holds (default: the most its KV capacity can hold, "
                   "from the workload's shortest segments, so it never fills; 0 = one slot per segment id of the "
                   "trace, slower on long traces; a table that fills is doubled and rerun)")
    p.add_argument("--e2-ring", type=positive_int, default=None, metavar="K",
                   help="Preble presets: entries per replica of the load window's ring, also of the pairing hit trace's "
                   "and the overload detector's (default: 4 x rate x window / replicas, at least 64, at most the "
                   "requests; doubled and rerun while one overflows)")
    add_grid_args(p, seeds=16, requests=DEFAULT_REQUESTS, seeds_help="independent runs per policy")
    p.add_argument("--requests-out", metavar="PATH", default=None,
                   help="write every request's record per router and seed (CSV, or JSONL for a .jsonl path): "
                   "arrival, replica, admission, first token and finish times, prompt, cached and output tokens, TTFT, "
                   "E2E, TPOT and load stage (columns: jaxroute/experiments/requests.py; `jaxroute compare` reads it) "
                   "(default: none)")
    add_control_args(p)
    add_tier_args(p)
    add_lora_args(p)
    add_server_arg(p)  # last: it records the defaults of the flags it sets
    p.set_defaults(func=run, requests=None)  # None: DEFAULT_REQUESTS, or the stage total with --rate-stages


def _tuned_row(args, rate: float, cost_model: str, factors=None) -> tuple:
    """(ROUTER[tuned], params) of --params-json: its settings over the flags' (`policy_rows`)."""
    from jaxroute.experiments.cluster import policy_rows
    from jaxroute.experiments.tune import load_params

    router, settings = load_params(args.params_json)
    rest = dict(settings)
    weights = rest.pop("weights", None)
    given = {k: rest.pop(k) for k in ("theta", "e2_window_s", "e2_th_bal") if k in rest}
    (_, params), = policy_rows([router], rate=rate, stale=args.stale, kv_capacity=args.kv_capacity, gpu=args.gpu,
                               model_name=args.model, cost_model=cost_model, theta=given.get("theta", args.theta),
                               e2_window_s=given.get("e2_window_s", args.e2_window),
                               e2_th_bal=given.get("e2_th_bal", args.e2_th_bal), tp=args.tp,
                               weights=[weights] if weights else None, router={**(args.router_set or {}), **rest},
                               cost_factors=factors)
    return f"{router}[tuned]", params


def _inference_perf(args):
    """The load of --inference-perf (`workloads.inference_perf.load`), refusing the flags it replaces; None without it."""
    if not args.inference_perf:
        return None
    given = [f for f, v in (("--workload", args.workload), ("--rate", args.rate), ("--rate-stages", args.rate_stages),
                            ("--requests", args.requests), ("--trace", args.trace),
                            ("--hot-tool", args.hot_tool or None)) if v is not None]
    given += ["--sp-*"] if shared_prefix_settings(args) else []
    if given:
        raise JaxrouteError(f"--inference-perf sets the workload; drop {', '.join(given)}")
    from jaxroute.workloads import inference_perf

    load = inference_perf.load(args.inference_perf, seed=args.seed)
    for note in load.notes:
        warn(f"inference-perf: {note}")
    return load


def run(args) -> int:
    apply_server(args)
    ip_load = _inference_perf(args)
    name = "shared-prefix" if ip_load and ip_load.shared_prefix else (ip_load.data_type if ip_load else None)
    name = name or choose([args.workload or "longdoc"], CLUSTER_WORKLOADS, "workload")[0]
    local = choose([args.local], LOCAL_ORDERS, "local order")[0]
    if args.priority_groups != 10 and local != "priority":
        raise JaxrouteError("--priority-groups applies to --local priority")
    admission = choose([args.admission], ADMISSIONS, "admission")[0]
    cost_model, latency = latency_choice(args)
    G, seeds, requests, stale = args.replicas, args.seeds, args.requests, args.stale
    controlled = control_settings(args, G) is not None  # the flags checked here, without JAX
    policies = choose(csv_list(args.policies or (CONTROL_POLICIES if controlled else DEFAULT_POLICIES)),
                      PREFIX_POLICIES, "policy")
    stages = list(ip_load.stages) if ip_load else args.rate_stages
    if not ip_load:
        check_cluster_workload(name, args.trace, args.hot_tool, shared_prefix_settings(args), stages)
    if args.params_json:
        check_input_file(args.params_json, "--params-json file")
    for weights in args.weights or ():
        if unknown := sorted(set(weights) - set(SCORERS)):
            raise JaxrouteError(f"unknown scorer(s) {unknown} in --weights; choose from: {', '.join(SCORERS)}")
    check_router_settings(args.router_set, router_setting_names())
    control, slots = control_variants(args, G)
    tiers = tier_rows(args)
    if tiers and stale > 0:
        raise JaxrouteError("--cpu-tier / --shared-tier need a fresh router view (--stale 0)")
    is_trace = name in TRACE_WORKLOADS
    if ip_load:
        args.requests = ip_load.requests
    if stages and args.rate is not None:
        raise JaxrouteError("--rate and --rate-stages are mutually exclusive: give one rate or the stages")
    if args.requests is None:
        args.requests = round(sum(r * d for r, d in stages)) if stages else DEFAULT_REQUESTS
        if args.requests < 1:
            raise JaxrouteError("the load stages hold less than one request; give --requests")
    requests = args.requests
    rate = args.rate if args.rate is not None else (0.0 if is_trace else 1.0)  # 0: replay recorded times
    # the models, once the flags are checked
    from jaxroute import report
    from jaxroute.experiments.cluster import (
        ACCOUNTING,
        E2_METRICS,
        METRICS,
        PREBLE_PRESETS,
        build_workload,
        e2_variants,
        policy_rows,
        run_cluster,
        unfinished_records,
    )

    if ip_load:
        from jaxroute.workloads import inference_perf

        workload = inference_perf.workload(ip_load)
    else:
        workload = build_workload(name, requests, args.trace, args.hot_tool, shared_prefix=shared_prefix_settings(args),
                                  rate_stages=stages)
    requests = requests_held(workload, args)
    from jaxroute.workloads.prefix import trace_adapters

    lora = lora_rows(args, trace_adapters(workload))  # a trace's own adapters (column adapter_id)
    if stages:
        rate = workload.stage_mean_rate  # realize() runs the stages as given at their mean rate
    if is_trace and seeds > 1:
        warn("trace workloads replay the same requests on every seed: the CIs are zero-width")
    factors = None
    if args.cost_params:
        from jaxroute.experiments import fit_roofline

        if cost_model != "roofline":
            raise JaxrouteError(f"--cost-params holds the roofline's factors; it does not apply to --cost-model "
                                f"{cost_model}")
        factors = fit_roofline.load(args.cost_params)
    rows = policy_rows(policies, rate=rate, stale=stale, kv_capacity=args.kv_capacity, gpu=args.gpu,
                       model_name=args.model, cost_model=cost_model, theta=args.theta,
                       e2_window_s=args.e2_window, e2_th_bal=args.e2_th_bal, tp=args.tp,
                       weights=args.weights, router=args.router_set,
                       e2_switches=e2_variants(args.e2_pairing, args.e2_autoscale), cost_factors=factors,
                       control=control, tiers=tiers, lora=lora, latency=latency)
    if args.params_json and (control or tiers or lora):
        raise JaxrouteError("--params-json adds one row without control or tier settings; drop it or --autoscaler / "
                            "--gate / --cpu-tier / --shared-tier / --adapters")
    if args.params_json:
        rows.append(_tuned_row(args, rate, cost_model, factors))
    warn_extrapolation(args, cost_model, latency)

    start = time.perf_counter()
    keep_requests = bool(stages or args.requests_out)
    results = run_cluster(rows, workload, replicas_n=slots, seeds=seeds, local=local, chunk=args.chunk, request_records=keep_requests,
                          max_running=args.max_running, seed=args.seed, progress=show_progress(args),
                          capacities={"max_queue": args.max_queue, "router_window": args.e2_ring,
                                      "cache_slots": args.cache_slots},
                          admission=admission, priority_groups=args.priority_groups, lora_slots=args.lora_slots)
    elapsed = time.perf_counter() - start
    records = results.records
    check_conservation(results)
    check_overflow(records, args, "A replica's local queue or cache table was full or a run did not finish"
                   + (" (or the autoscaler's replica slots, scale log or ticks ran out)" if control else ""))
    cap = records[0].params["kv_capacity"]
    rate_txt = "recorded times" if rate <= 0 else f"{rate:g} req/s"
    if stages:
        rate_txt = "stages " + ",".join(f"{r:g}:{d:g}" for r, d in stages) + " (req/s:s)"
    gpus = f"{args.tp}x{args.gpu}" if args.tp > 1 else args.gpu
    title = (f"cluster: {name}, {G} replicas ({args.model} on {gpus}, KV {cap:,} tokens, {cost_model}), "
             f"{rate_txt}, local {local}{f' ({args.priority_groups} groups)' if local == 'priority' else ''}, {admission} admission, theta {args.theta:g}, "
             f"{'stale view T=' + str(stale) if stale > 0 else 'fresh view'}; {seeds} seeds x {requests} requests")
    print(title)
    print(report.format_table(records, METRICS))
    unfinished = unfinished_records(records)
    if unfinished:  # only with --allow-overflow: a run that overflowed is otherwise refused
        print(f"requests per seed (of {requests:,}): completed, in flight at the end, dropped by a full queue, "
              "never arrived (the run's event budget ran out)")
        print(report.format_table(unfinished, ACCOUNTING))
    if control:
        from jaxroute.experiments import control as ctl_exp

        classes = ctl_exp.uses_classes([p for _, p in rows], workload)
        print(ctl_exp.format_tables(records, classes))
    if lora:
        from jaxroute.experiments.cluster import LORA_METRICS

        print(f"LoRA adapters ({args.lora_slots} slots per replica): loads, admissions that found their adapter loaded, "
              "TTFT of the hot adapters' requests (the most requested, half of them) and of the others'")
        print(report.format_table(records, LORA_METRICS))
    if tiers:
        from jaxroute.experiments.cluster import TIER_METRICS

        print("KV offload tiers: prompt tokens found on the GPU and every tier (hit_rate_all), loaded from the CPU and "
              "the shared tier, and GB moved")
        print(report.format_table(records, TIER_METRICS))
    e2_rows = [r for r in records if r.policy.split("[")[0] in PREBLE_PRESETS]
    if e2_rows:
        print("Preble's decisions per run: mean load-cost terms L, M, P over replicas and decisions (GPU s); "
              "exploits, post-hoc rebalanced, paired (prefill/decode), prefixes autoscaled")
        print(report.format_table(e2_rows, E2_METRICS))
    extra, stage_rows, table = {}, None, None
    if keep_requests:
        from jaxroute.experiments import requests as req_lib

        table = req_lib.request_table(results)
    if stages:
        stage_rows = req_lib.stage_summaries(table, stages)
        for label, per in zip(results.labels, stage_rows, strict=True):
            print(req_lib.format_stage_table(label, stages, per))
        extra["stages"] = req_lib.stages_json(results.labels, stages, stage_rows)
    if ip_load:
        peak = req_lib.peak_in_flight(table)
        extra["peak_in_flight"] = peak
        if ip_load.concurrency_cap is not None and peak > ip_load.concurrency_cap:
            warn(f"up to {peak:,} requests were in flight at once; inference-perf's client holds at most "
                 f"{ip_load.concurrency_cap:,} (num_workers x worker_max_concurrency), so the measured run would queue "
                 "the rest at the client")
    print(f"simulated {len(records) * seeds * requests:,} requests in {elapsed:.1f} s "
          f"({len(records) * seeds * requests / elapsed:,.0f} requests/s, compilation included)")
    config = {"workload": name, "trace": args.trace, "replicas": G, "rate": rate, "seeds": seeds,
              "requests": requests, "requests_asked": args.requests, "local": local, "admission": admission, "stale_s": stale, "cost_model": cost_model, "gpu": args.gpu,
              "model": args.model, "tp": args.tp, "kv_capacity": cap, "chunk": args.chunk,
              "max_running": args.max_running,
              "max_queue": results.model.max_queue, "e2_ring": results.model.router_window,
              "cache_slots": results.model.cache_slots,
              "hot_tool": args.hot_tool, "seed": args.seed, "elapsed_s": elapsed,
              "weights": args.weights, "router_set": args.router_set, "params_json": args.params_json,
              "cost_params": args.cost_params, "cost_factors": factors._asdict() if factors else None}
    if stages:
        config["rate_stages"] = [{"rate": r, "seconds": d} for r, d in stages]
    if ip_load:
        config["inference_perf"] = {"config": args.inference_perf, "data_type": ip_load.data_type,
                                    "load_type": ip_load.load_type, "stage_requests": list(ip_load.stage_requests),
                                    "concurrency_cap": ip_load.concurrency_cap, "notes": list(ip_load.notes)}
        if ip_load.shared_prefix:
            config["shared_prefix"] = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in ip_load.shared_prefix.items()}
    elif name == "shared-prefix":
        config["shared_prefix"] = {**SP_DEFAULTS, **shared_prefix_settings(args)}
    if local == "priority":
        config["priority_groups"] = args.priority_groups
    if control:
        config.update(replica_slots=results.model.n_replicas, autoscalers=args.autoscaler or ["fixed"],
                      gates=args.gate or ["none"])
    if lora:
        config.update(adapters=args.adapters, adapter_zipf=args.adapter_zipf, lora_slots=args.lora_slots,
                      lora_set=args.lora_set, adapter_ids=results.model.adapter_ids)
    if tiers:
        config.update(cpu_tier_gib=args.cpu_tier or [0.0], shared_tier_gib=args.shared_tier or [0.0],
                      tier_set=args.tier_set, cpu_slots=results.model.cpu_slots, shared_slots=results.model.shared_slots)
    if set(policies) & set(PREBLE_PRESETS):
        th = args.e2_th_bal
        config.update(e2_window_s=args.e2_window, e2_th_bal=th if math.isfinite(th) else None,
                      e2_pairing=args.e2_pairing, e2_autoscale=args.e2_autoscale)
    def plot(path):
        report.bar_plot(records, PLOT_METRICS, path, title)
        if control:
            replicas_path = Path(path).with_name(Path(path).stem + "-replicas.png")
            ctl_exp.ready_plot(results, replicas_path, "replicas over time", stages=stages)
            print(f"wrote {replicas_path}")
        if stage_rows is not None:
            stage_path = Path(path).with_name(Path(path).stem + "-stages.png")
            req_lib.stage_plot(results.labels, stages, stage_rows, stage_path, title + ": per load stage")
            print(f"wrote {stage_path}")

    save_outputs(args, "cluster", config, records, plot, extra=extra)
    if args.requests_out:
        print(f"wrote {req_lib.write_requests(args.requests_out, results.labels, table, stages)}")
    return 0
