"""`jaxroute pd`: prefill/decode disaggregation (prefix-aware prefill tier, KV links, decode DP tier)."""

from __future__ import annotations

import math
import time

from jaxroute.commands._common import (
    PD_DEFAULT_REQUESTS,
    add_grid_args,
    add_pd_args,
    check_conservation,
    pd_setup,
    rate_or_max,
    requests_held,
    save_outputs,
    shared_prefix_settings,
    show_progress,
    warn,
)
from jaxroute.experiments.names import LENGTH_WORKLOADS
from jaxroute.workloads.names import SP_DEFAULTS, TRACE_WORKLOADS

DEFAULT_REQUESTS = PD_DEFAULT_REQUESTS
TABLE = ("goodput_rps", "slo_attainment", "ttft_p90_s", "tpot_p90_s", "e2e_mean_s", "output_tokens_per_s",
         "prefill_hit_rate", "util_prefill", "util_decode", "util_link")
DECODE = ("tpot_p95_s", "output_tokens_per_s", "decode_imbalance_tokens", "decode_running_per_group",
          "decode_slots_in_use", "decode_kv_share")
SPLIT = ("ttft_mean_s", "prefill_queue_s", "prefill_s", "link_queue_s", "transfer_s", "decode_wait_s", "disagg_fraction")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "pd",
        help="prefill/decode disaggregation: P:D ratios, prefill and decode routers, KV transfer, SLO goodput",
        description="Simulate a disaggregated cluster in one run: a prefill tier of P replicas with chunked "
        "prefill and per-replica prefix caches behind a prefix router; KV transfer over one link per prefill "
        "replica (FIFO, bytes = KV bytes per token per TP rank x prompt tokens); a decode tier of D data-parallel "
        "ranks behind a barrier behind a decode router (BalanceRoute BR-0/BR-H or a baseline). Every "
        "prefill router x decode router x P:D ratio x P/D threshold is a row; P and D are traced, so the whole "
        "grid is one compilation per tier. --colocated adds rows for the same GPUs as one replica cluster. "
        "The table gives means with 95 %% CIs over seeds: goodput (requests meeting both SLOs per second, "
        "first arrival to last finish), SLO attainment, TTFT p90 (arrival to the decode tier's first token), "
        "TPOT p90 ((finish - first token) / (output - 1)), end-to-end mean, output tokens/s, the prefill "
        "tier's hit rate and busy fractions of each tier and of the links; a second table splits the mean TTFT "
        "into prefill queueing, prefill, link queueing, transfer (busy + latency) and the wait on the decode "
        "tier; a third gives the decode tier's TPOT p95, output tokens/s, mean max - min KV load per barrier step, "
        "requests running per decode group (Little's law over the run), the share of its slots they fill and the "
        "share of a step that scales with KV (DP ranks; 0 for other tiers). --deployment paper is BalanceRoute's "
        "4P1D: `jaxroute pd --deployment paper --workload synthetic-prod --rate max --decode-router "
        "random,rr,p2c,jsq,br0,brh`. Model: jaxroute/clusters/disagg.py.")
    p.add_argument("--rate", type=rate_or_max, default=None, metavar="REQ_PER_S",
                   help="Poisson arrival rate in requests/s (default 4); for traces and synthetic-prod / "
                   "synthetic-azure24 it rescales their arrival times to this mean rate (default: as recorded, "
                   "2 req/s for those two); max: every request at t = 0, so the prefill tier paces the decode tier")
    add_pd_args(p)
    add_grid_args(p, seeds=8, requests=DEFAULT_REQUESTS)
    p.set_defaults(func=run)


def run(args) -> int:
    name, rows, workload, dep = pd_setup(args)
    requests = requests_held(workload, args)
    from jaxroute import report
    from jaxroute.experiments import pd

    tier, gpu, model = dep.decode_tier, dep.gpu, dep.model
    is_trace = name in TRACE_WORKLOADS or name in LENGTH_WORKLOADS  # replayed: the same requests on every seed
    rate = args.rate if args.rate is not None else (0.0 if is_trace else 4.0)
    if is_trace and args.seeds > 1:
        warn("trace workloads replay the same requests on every seed: the CIs are zero-width")
    start = time.perf_counter()
    results, _ = pd.run_pd(rows, workload, rate=rate, seeds=args.seeds, dep=dep, slo_ttft=args.slo_ttft,
                           slo_tpot=args.slo_tpot, seed=args.seed, progress=show_progress(args),
                           allow_overflow=args.allow_overflow)
    elapsed = time.perf_counter() - start
    check_conservation(results)
    rate_txt = "recorded times" if rate <= 0 else "all at t = 0" if math.isinf(rate) else f"{rate:g} req/s"
    groups = f"{dep.tp}x{gpu}" if dep.prefill_group_tp == dep.tp else f"{dep.prefill_group_tp}x{gpu} (prefill), {dep.tp}x{gpu} (decode, {dep.parallel})"
    title = (f"pd: {name}, {rate_txt}, decode tier {tier}, {model} on {groups} per group, KV link {args.kv_link_gbps:g} Gb/s + "
             f"{args.kv_link_latency_ms:g} ms; SLOs TTFT {args.slo_ttft:g} s, TPOT {args.slo_tpot:g} s; "
             f"{args.seeds} seeds x {requests} requests")
    print(title)
    print(report.format_table(results.records, TABLE))
    print("TTFT split (means, s): prefill queueing + prefill + link queueing + transfer + decode wait = TTFT")
    print(report.format_table(results.records, SPLIT))
    print("decode tier: running per group = request-seconds from decode admission to finish / (groups x span)")
    print(report.format_table(results.records, DECODE))
    n_sim = len(rows) * args.seeds * requests
    print(f"simulated {n_sim:,} requests in {elapsed:.1f} s ({n_sim / elapsed:,.0f} requests/s, compilation included)")
    config = {"workload": name, "trace": args.trace, "rate": rate, "seeds": args.seeds, "requests": requests,
              "requests_asked": args.requests,
              "ratios": list(dict.fromkeys(f"{r.n_prefill}:{r.n_decode}" for r in rows if not r.colocated)),
              "prefill_routers": list(dict.fromkeys(r.prefill_router for r in rows)),
              "decode_routers": list(dict.fromkeys(r.decode_router for r in rows if not r.colocated)), "decode_tier": tier, "predictor": args.predictor, "pd_thresholds": args.pd_threshold, "colocated": args.colocated,
              "deployment": args.deployment, "gpu": gpu, "model": model, "tp": dep.tp,
              "prefill_tp": dep.prefill_group_tp, "decode_parallel": dep.parallel, "cost_model": dep.cost_model,
              "chunk": dep.chunk,
              "max_running": args.max_running, "decode_slots": args.decode_slots, "kv_link_gbps": args.kv_link_gbps,
              "kv_link_latency_ms": args.kv_link_latency_ms, "slo_ttft_s": args.slo_ttft, "slo_tpot_s": args.slo_tpot,
              "seed": args.seed, "elapsed_s": elapsed}
    if name == "shared-prefix":
        config["shared_prefix"] = {**SP_DEFAULTS, **shared_prefix_settings(args)}
    save_outputs(args, "pd", config, results.records, lambda path: pd.ratio_plot(results, rows, path, title))
    return 0
