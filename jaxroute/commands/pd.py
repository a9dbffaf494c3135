"""`jaxroute pd`: prefill/decode disaggregation (prefix-aware prefill tier, KV links, decode DP tier)."""

from __future__ import annotations

import argparse
import time

from jaxroute import cost_models as cm
from jaxroute import report
from jaxroute.commands._common import (
    add_grid_args,
    add_shared_prefix_args,
    check_conservation,
    choose,
    csv_list,
    list_of,
    non_negative_float,
    positive_float,
    positive_int,
    save_outputs,
    shared_prefix_settings,
    show_progress,
    warn,
)
from jaxroute.errors import JaxrouteError
from jaxroute.experiments import pd
from jaxroute.experiments.cluster import WORKLOADS, build_workload
from jaxroute.routers import balance
from jaxroute.routers.prefix import PARTIAL_OK, PREFIX_POLICIES
from jaxroute.workloads import prefix as wl_prefix

DEFAULT_REQUESTS = 400
TABLE = ("goodput_rps", "slo_attainment", "ttft_p90_s", "tpot_p90_s", "e2e_mean_s", "output_tokens_per_s",
         "prefill_hit_rate", "util_prefill", "util_decode", "util_link", "decode_imbalance_tokens")
SPLIT = ("ttft_mean_s", "prefill_queue_s", "prefill_s", "link_queue_s", "transfer_s", "decode_wait_s", "disagg_fraction")


def _ratios(text: str) -> list[tuple[int, int]]:
    """argparse type for --ratios (the message of a bad pair, as a usage error)."""
    try:
        return pd.parse_ratios(text)
    except JaxrouteError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


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
        "tier's hit rate, busy fractions of each tier and of the links, and the decode tier's mean "
        "max - min KV load per barrier step; a second table splits the mean TTFT into prefill queueing, "
        "prefill, link queueing, transfer (busy + latency) and the wait on the decode tier. Model: "
        "jaxroute/clusters/disagg.py.")
    p.add_argument("--rate", type=positive_float, default=None, metavar="REQ_PER_S",
                   help="Poisson arrival rate in requests/s (default 4); for traces it rescales the recorded times "
                   "to this mean rate (default: replay as recorded)")
    add_pd_args(p)
    add_grid_args(p, seeds=8, requests=DEFAULT_REQUESTS)
    p.set_defaults(func=run)


def add_pd_args(p) -> None:
    """The deployment, routing and SLO flags of `pd` (shared with `capacity pd`)."""
    p.add_argument("--workload", default="shared-prefix", metavar="NAME",
                   help=f"one of: {', '.join(WORKLOADS)} (default shared-prefix); mooncake and azure-conv read --trace")
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="trace file for mooncake (JSONL) or azure-conv (CSV) (default: ../shared/data/<the public trace>)")
    p.add_argument("--prefill", type=positive_int, default=4, metavar="P", help="prefill groups (default 4)")
    p.add_argument("--decode", type=positive_int, default=4, metavar="D", help="decode groups (default 4)")
    p.add_argument("--ratios", type=_ratios, default=None, metavar="P:D,...",
                   help="P:D ratios to compare in one grid, e.g. 2:6,3:5,4:4,5:3,6:2 (default: --prefill:--decode)")
    p.add_argument("--prefill-router", default="llmd_precise", metavar="LIST",
                   help=f"comma-separated prefix routers for the prefill tier from: {', '.join(PREFIX_POLICIES)}; with "
                   f"several ratios only those that run on part of a tier: {', '.join(PARTIAL_OK)} (default llmd_precise)")
    p.add_argument("--decode-tier", default="dp", metavar="KIND",
                   help="decode tier: dp (data-parallel ranks stepping behind a barrier, BalanceRoute's setting) or "
                   "replicas (independent replicas with continuous batching, the replica engine; landed KV is "
                   "cached there) (default dp)")
    p.add_argument("--decode-router", default=None, metavar="LIST",
                   help=f"comma-separated decode routers: for --decode-tier dp from {', '.join(balance.POLICIES)} "
                   "(br0/brh bind from a prompt pool; brh uses --predictor) (default br0); for "
                   f"replicas any prefix router, with several ratios one of {', '.join(PARTIAL_OK)} (default least_load)")
    p.add_argument("--predictor", default="oracle", metavar="SPEC",
                   help="BR-H's horizon predictor: none, oracle, survival, exact or learned:DIR (a checkpoint of "
                   "`jaxroute train-predictor`); survival and exact are fitted on requests other than the simulated "
                   "ones (a trace's next --requests rows, or another draw of a synthetic workload); without prompt "
                   "keys exact predicts as survival (default oracle)")
    p.add_argument("--pd-threshold", type=list_of(non_negative_float), default=[0.0], metavar="TOKENS[,...]",
                   help="llm-d's prefix-based P/D decider (nonCachedTokens): disaggregate only when the uncached prompt "
                   "is at least this many tokens, counting the decode side as holding none of it; shorter ones are "
                   "prefilled by their decode worker (0 = always disaggregate, llm-d's default; several values give "
                   "rows) (default 0)")
    p.add_argument("--colocated", action="store_true",
                   help="add rows for the same number of groups as one replica cluster without disaggregation, "
                   "routed by each prefill router (default: off)")
    p.add_argument("--kv-link-gbps", type=positive_float, default=pd.DEFAULT_LINK_GBPS, metavar="GBPS",
                   help=f"KV link bandwidth per GPU in Gb/s (default {pd.DEFAULT_LINK_GBPS:g}: one ConnectX-7 NIC per "
                   "GPU, NVIDIA's DGX H100/H200 design)")
    p.add_argument("--kv-link-latency-ms", type=non_negative_float, default=pd.DEFAULT_LINK_LATENCY_MS, metavar="MS",
                   help=f"fixed latency per KV transfer in ms (default {pd.DEFAULT_LINK_LATENCY_MS:g}, assumed)")
    p.add_argument("--slo-ttft", type=positive_float, default=pd.DEFAULT_SLO_TTFT_S, metavar="S",
                   help=f"TTFT SLO in seconds for goodput (default {pd.DEFAULT_SLO_TTFT_S:g})")
    p.add_argument("--slo-tpot", type=positive_float, default=pd.DEFAULT_SLO_TPOT_S, metavar="S",
                   help=f"TPOT SLO in seconds for goodput (default {pd.DEFAULT_SLO_TPOT_S:g})")
    p.add_argument("--gpu", default="H200", metavar="NAME", help=f"GPU: {', '.join(cm.GPUS)} (default H200)")
    p.add_argument("--model", default="Llama-3.1-70B", metavar="NAME",
                   help=f"model: {', '.join(cm.MODELS)} (default Llama-3.1-70B)")
    p.add_argument("--tp", type=positive_int, default=4, metavar="T", help="GPUs per group (tensor parallel) (default 4)")
    p.add_argument("--cost-model", default="roofline", metavar="KIND", help="iteration time: roofline or preble (default roofline)")
    p.add_argument("--chunk", type=positive_int, default=512, metavar="TOKENS",
                   help="prefill tokens per iteration on a prefill replica (default 512)")
    p.add_argument("--max-running", type=positive_int, default=64, metavar="B",
                   help="running requests per prefill replica (default 64)")
    p.add_argument("--decode-slots", type=positive_int, default=64, metavar="S",
                   help="running requests per decode rank (default 64)")
    add_shared_prefix_args(p)


def setup(args) -> tuple[str, list[pd.PDRow], object, pd.Deployment]:
    """(workload name, rows, workload, deployment) from `add_pd_args`' flags, checked before anything runs."""
    name = choose([args.workload], WORKLOADS, "workload")[0]
    cost_model = choose([args.cost_model], ("roofline", "preble"), "cost model")[0]
    prefill_routers = choose(csv_list(args.prefill_router), PREFIX_POLICIES, "prefill router")
    tier = choose([args.decode_tier], pd.DECODE_TIERS, "decode tier")[0]
    default_decode = "br0" if tier == "dp" else "least_load"
    decode_routers = choose(csv_list(args.decode_router or default_decode), pd.decode_routers(tier), "decode router")
    ratios = args.ratios or [(args.prefill, args.decode)]
    if args.ratios and (args.prefill != 4 or args.decode != 4):
        raise JaxrouteError("give either --ratios or --prefill/--decode, not both")
    gpu, model = cm.get_gpu(args.gpu).name, cm.get_model(args.model).name
    bank, predictor = (), 1
    if "brh" in decode_routers and tier == "dp":
        train = pd.train_lengths(name, args.requests, args.trace, shared_prefix_settings(args), args.seed)
        bank, predictor = pd.predictor_bank(args.predictor, train)
    dep = pd.Deployment(predictor=predictor, bank=bank, gpu=gpu, model=model, tp=args.tp, cost_model=cost_model, chunk=args.chunk,
                        max_running=args.max_running, decode_slots=args.decode_slots, link_gbps=args.kv_link_gbps,
                        link_latency_ms=args.kv_link_latency_ms, decode_tier=tier)
    rows = pd.rows_for(prefill_routers, decode_routers, ratios, thresholds=args.pd_threshold, colocated=args.colocated)
    pd.check_rows(rows, tier)
    workload = build_workload(name, args.requests, args.trace, shared_prefix=shared_prefix_settings(args))
    return name, rows, workload, dep


def run(args) -> int:
    name, rows, workload, dep = setup(args)
    tier, gpu, model = dep.decode_tier, dep.gpu, dep.model
    is_trace = name in wl_prefix.TRACE_WORKLOADS
    rate = args.rate if args.rate is not None else (0.0 if is_trace else 4.0)
    if args.seeds < 2:
        warn("one seed gives no confidence interval")
    if is_trace and args.seeds > 1:
        warn("trace workloads replay the same requests on every seed: the CIs are zero-width")
    start = time.perf_counter()
    results, _ = pd.run_pd(rows, workload, rate=rate, seeds=args.seeds, dep=dep, slo_ttft=args.slo_ttft,
                           slo_tpot=args.slo_tpot, seed=args.seed, progress=show_progress(args),
                           allow_overflow=args.allow_overflow)
    elapsed = time.perf_counter() - start
    check_conservation(results)
    rate_txt = "recorded times" if rate <= 0 else f"{rate:g} req/s"
    title = (f"pd: {name}, {rate_txt}, decode tier {tier}, {model} on {args.tp}x{gpu} per group, KV link {args.kv_link_gbps:g} Gb/s + "
             f"{args.kv_link_latency_ms:g} ms; SLOs TTFT {args.slo_ttft:g} s, TPOT {args.slo_tpot:g} s; "
             f"{args.seeds} seeds x {args.requests} requests")
    print(title)
    print(report.format_table(results.records, TABLE))
    print("TTFT split (means, s): prefill queueing + prefill + link queueing + transfer + decode wait = TTFT")
    print(report.format_table(results.records, SPLIT))
    n_sim = len(rows) * args.seeds * args.requests
    print(f"simulated {n_sim:,} requests in {elapsed:.1f} s ({n_sim / elapsed:,.0f} requests/s, compilation included)")
    config = {"workload": name, "trace": args.trace, "rate": rate, "seeds": args.seeds, "requests": args.requests,
              "ratios": list(dict.fromkeys(f"{r.n_prefill}:{r.n_decode}" for r in rows if not r.colocated)),
              "prefill_routers": list(dict.fromkeys(r.prefill_router for r in rows)),
              "decode_routers": list(dict.fromkeys(r.decode_router for r in rows if not r.colocated)), "decode_tier": tier, "predictor": args.predictor, "pd_thresholds": args.pd_threshold, "colocated": args.colocated,
              "gpu": gpu, "model": model, "tp": args.tp, "cost_model": dep.cost_model, "chunk": args.chunk,
              "max_running": args.max_running, "decode_slots": args.decode_slots, "kv_link_gbps": args.kv_link_gbps,
              "kv_link_latency_ms": args.kv_link_latency_ms, "slo_ttft_s": args.slo_ttft, "slo_tpot_s": args.slo_tpot,
              "seed": args.seed, "elapsed_s": elapsed}
    if name == "shared-prefix":
        config["shared_prefix"] = {**wl_prefix.SP_DEFAULTS, **shared_prefix_settings(args)}
    save_outputs(args, "pd", config, results.records, lambda path: pd.ratio_plot(results, rows, path, title))
    return 0
