"""`jaxroute tune`: search a router's traced settings with CMA-ES (evosax), then check the gain on fresh seeds."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from jaxroute import catalog
from jaxroute.clusters import names as dd  # dp_decode's defaults, dd.DEFAULT_*
from jaxroute.clusters.names import (
    ADMISSIONS,
    DEFAULT_CHUNK,
    DEFAULT_MAX_RUNNING,
    LOCAL_ORDERS,
    REPLICA_GPU,
    REPLICA_METRICS,
    REPLICA_MODEL,
)
from jaxroute.commands._common import (
    add_control_args,
    add_latency_args,
    add_model_args,
    add_save_spec,
    add_shared_prefix_args,
    choose,
    control_settings,
    csv_list,
    latency_choice,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    probability,
    rate_range,
    rate_stages,
    shared_prefix_settings,
    show_progress,
    slo_clauses,
    warn,
    warn_extrapolation,
)
from jaxroute.deployment import DECODE_PRESETS
from jaxroute.errors import JaxrouteError
from jaxroute.experiments.knobs import DECODE_KNOBS, TUNABLE, TUNABLE_ROUTERS
from jaxroute.experiments.names import (
    CLUSTER_WORKLOADS,
    DECODE_DEPLOYMENTS,
    DECODE_OBJECTIVES,
    DEFAULT_DECODE_OBJECTIVE,
    DEFAULT_SLO_TPOT_S,
    DEFAULT_SLO_TTFT_S,
    parse_slo,
)
from jaxroute.workloads.names import DECODE_WORKLOADS, TRACE_WORKLOADS

if TYPE_CHECKING:
    from jaxroute.experiments import tune as tn

MODELS = ("cluster", "control", "decode")
DECODE_REQUESTS = 500
DEFAULT_SLO = f"ttft_p90_s<={DEFAULT_SLO_TTFT_S:g},tpot_p90_s<={DEFAULT_SLO_TPOT_S:g}"


def _knob_table() -> str:
    return "; ".join(f"{r}: {', '.join(k.name for k in ks)}" for r, ks in TUNABLE.items())


def register(subparsers) -> None:
    top = subparsers.add_parser(
        "tune", help="search a router's settings (CMA-ES) for goodput, capacity or a metric, with the gain's CI",
        description="Search a router's traced settings with CMA-ES (evosax): `jaxroute tune cluster` tunes a "
        "prefix-cache cluster router, `jaxroute tune decode` BalanceRoute BR-H's weights in the decode model. "
        "See `jaxroute tune cluster --help` and `jaxroute tune decode --help`.")
    models = top.add_subparsers(dest="sim_model", metavar="model", required=True,
                                help="which simulation: cluster (replicas with prefix caches) or decode (decode DP "
                                "workers behind a barrier, BR-H)")
    _register_cluster(models)
    _register_control(models)
    _register_decode(models)


def _register_cluster(models) -> None:
    p = models.add_parser(
        "cluster", help="tune a cluster router's settings (replicas with prefix caches)",
        description="Search a router's traced settings with CMA-ES (evosax) in a normalised box (log-scale where a "
        "setting spans decades), starting from the preset's defaults. Each generation runs population x seeds in one "
        "compiled batch on common seeds (the same seeds every generation; generation 0 holds the defaults). The "
        "best-ever candidate, the best of the last generation and the CMA-ES mean are then rerun with the defaults "
        "on fresh seeds: means with 95 % CIs and the gain over the defaults (+ = better), paired per seed. "
        f"Tunable settings (their defaults are the preset's): {_knob_table()}; the weighted presets also take "
        "any w_<scorer>.")
    p.add_argument("--router", required=True, metavar="NAME", help=f"router to tune: {', '.join(TUNABLE_ROUTERS)}")
    p.add_argument("--params", default=None, metavar="NAME,...",
                   help="settings to tune, e.g. w_prefix,w_queue (default: all tunable ones of the router; the others "
                   "keep the preset's values)")
    p.add_argument("--objective", default="goodput", metavar="NAME",
                   help="goodput (requests per second meeting the SLO's TTFT and TPOT bounds, maximised), capacity "
                   "(the largest rate at which the SLO holds, maximised), slo_attainment, or a metric of the model "
                   f"({', '.join(REPLICA_METRICS)}, e2e_mean_s, e2e_p99_s): output_tokens_per_s and hit_rate "
                   "are maximised, the others minimised (default goodput)")
    p.add_argument("--slo", type=slo_clauses, default=None, metavar="METRIC<=V,...",
                   help="goodput / slo_attainment: per-request bounds ttft_*<=S,tpot_*<=S (the quantile in the name "
                   f"is ignored: each request must meet them) (default {DEFAULT_SLO}); capacity: clauses on the "
                   "model's metrics that must all hold, e.g. ttft_p90_s<=1 (required)")
    p.add_argument("--rate", type=positive_float, default=None, metavar="REQ_PER_S",
                   help="Poisson arrival rate (default 1.0; traces: replay the recorded times unless given); not "
                   "with --objective capacity")
    p.add_argument("--rate-range", type=rate_range, default=None, metavar="LO:HI",
                   help="capacity: rates searched in req/s (default 0.5:100)")
    p.add_argument("--tol", type=positive_float, default=0.05, metavar="F",
                   help="capacity: relative width of a known bracket (default 0.05)")
    p.add_argument("--points", type=positive_int, default=4, metavar="K", help="capacity: rates per candidate per round (default 4)")
    p.add_argument("--max-rounds", type=positive_int, default=6, metavar="N", help="capacity: rounds at most per generation (default 6)")
    _add_cluster_args(p)
    _add_search_args(p)
    p.add_argument("--params-out", metavar="PATH.json",
                   help="write the best candidate's settings for `jaxroute cluster --params-json` (default: none)")
    p.set_defaults(func=run)


def _add_cluster_args(p) -> None:
    """The workload and deployment flags of `tune cluster` and `tune control` (as `jaxroute cluster` has them)."""
    p.add_argument("--workload", default="toolbench", metavar="NAME", help=f"one of {', '.join(CLUSTER_WORKLOADS)} (default toolbench)")
    p.add_argument("--trace", default=None, metavar="PATH", help="trace file for mooncake / azure-conv (default: the public trace)")
    p.add_argument("--hot-tool", type=probability, default=0.0, metavar="SHARE",
                   help="toolbench only: share of traffic on one hot tool (default 0)")
    add_shared_prefix_args(p)
    p.add_argument("--requests", type=positive_int, default=300, metavar="N", help="requests per run (default 300)")
    p.add_argument("--replicas", type=positive_int, default=4, metavar="G", help="number of replicas (default 4)")
    p.add_argument("--gpu", default=REPLICA_GPU, metavar="NAME", help=f"GPU of every replica: {', '.join(catalog.GPUS)} (default {REPLICA_GPU})")
    add_model_args(p, default=REPLICA_MODEL, help=f"model served: {', '.join(catalog.MODELS)} (default {REPLICA_MODEL})")
    p.add_argument("--tp", type=positive_int, default=1, metavar="T", help="tensor-parallel GPUs per replica (default 1)")
    p.add_argument("--kv-capacity", type=positive_int, default=None, metavar="TOKENS",
                   help="KV tokens per replica (default: from GPU memory, as jaxroute cluster)")
    add_latency_args(p)
    p.add_argument("--stale", type=non_negative_float, default=0.0, metavar="T",
                   help="the router's view is refreshed every T seconds (default 0: fresh)")
    p.add_argument("--local", default="fcfs", metavar="ORDER", help=f"local queue order: {', '.join(LOCAL_ORDERS)} (default fcfs)")
    p.add_argument("--admission", default="reserve", metavar="MODE", help=f"KV admission: {', '.join(ADMISSIONS)} (default reserve)")
    p.add_argument("--chunk", type=positive_int, default=DEFAULT_CHUNK, metavar="TOKENS",
                   help=f"prefill tokens per iteration (default {DEFAULT_CHUNK})")
    p.add_argument("--max-running", type=positive_int, default=DEFAULT_MAX_RUNNING, metavar="B",
                   help=f"max running requests per replica (default {DEFAULT_MAX_RUNNING})")


def _register_control(models) -> None:
    from jaxroute.experiments.knobs import CONTROL_KNOBS

    knobs = "; ".join(f"{s}: " + ", ".join(f"{k.name} in [{k.lo:g}, {k.hi:g}]" for k in ks)
                      for s, ks in CONTROL_KNOBS.items())
    p = models.add_parser(
        "control", help="tune an autoscaler's settings for the least cost (GPU-hours) that meets an SLO",
        description="Search an autoscaler's traced settings (jaxroute/clusters/replicas/control.py) with CMA-ES "
        "(evosax) for the least GPU-hours whose SLO attainment reaches --min-attainment (a shortfall adds its share "
        "of every replica slot's GPU-hours: jaxroute/experiments/tune_control.py). Every candidate is a row of one "
        "compiled grid; the final candidates and the defaults (the sources': docs/control.md) are rerun on fresh "
        f"seeds with 95 %% CIs and the cost saved (+ = cheaper), paired per seed. Tunable settings: {knobs}. The SLO is "
        "--control-set slo_ttft_s=S,slo_tpot_s=S. --replicas is the most replicas; use --rate-stages for a load that "
        "steps up and down.")
    p.add_argument("--router", default="least_load", metavar="NAME",
                   help="the router (one that runs under an autoscaler: routers.prefix.PARTIAL_OK) (default least_load)")
    p.add_argument("--params", default=None, metavar="NAME,...",
                   help="settings to tune (default: all tunable ones of the autoscaler)")
    p.add_argument("--min-attainment", type=probability, default=0.9, metavar="F",
                   help="SLO attainment a candidate must reach (default 0.9)")
    p.add_argument("--rate", type=positive_float, default=None, metavar="REQ_PER_S",
                   help="Poisson arrival rate (default 1.0; traces: replay the recorded times unless given)")
    p.add_argument("--rate-stages", type=rate_stages, default=None, metavar="RATE:SECONDS,...",
                   help="staged load, as jaxroute cluster (default: one --rate)")
    _add_cluster_args(p)
    add_control_args(p)
    _add_search_args(p)
    p.set_defaults(func=run_control, requests=None)


def _register_decode(models) -> None:
    knobs = "; ".join(f"{k.name} in [{k.lo:g}, {k.hi:g}]{' (log scale)' if k.log else ''}" for k in DECODE_KNOBS)
    p = models.add_parser(
        "decode", help="tune BalanceRoute BR-H's weights beta, gamma, alpha (decode DP workers behind a barrier)",
        description="Search BR-H's traced weights in the decode model (as `jaxroute decode` runs it, saturated "
        "arrivals) with CMA-ES (evosax) in a normalised box, starting from the defaults (beta = G, the number of "
        f"workers; gamma {dd.DEFAULT_GAMMA:g}; alpha {dd.DEFAULT_ALPHA:g}): {knobs} (beta's range reaches 2 G when "
        "G > 32). Each generation is one compiled run_comparison grid of BR-H rows x seeds on common seeds (the "
        "same seeds every generation; generation 0 holds the defaults); the final candidates and the defaults are "
        "rerun on fresh seeds with 95 % CIs and the gain over the defaults (+ = better), paired per seed. The "
        "horizon H (--horizon) is a static shape of the compiled model, not a traced weight: it stays fixed and "
        "is not tuned.")
    p.add_argument("--params", default=None, metavar="NAME,...",
                   help="settings to tune, from beta, gamma, alpha (default: all three; the others keep their defaults)")
    p.add_argument("--objective", default=DEFAULT_DECODE_OBJECTIVE, metavar="NAME",
                   help=f"a metric of the decode model: {', '.join(DECODE_OBJECTIVES)}; throughput_*, tokens_per_step* "
                   f"and util_* are maximised, the others minimised (default {DEFAULT_DECODE_OBJECTIVE})")
    p.add_argument("--workload", default="synthetic-prod", metavar="NAME",
                   help=f"one of {', '.join(DECODE_WORKLOADS)} (default synthetic-prod)")
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="Azure trace CSV for azure-conv / azure-code (default ../shared/data/azure_llm_2023_*.csv)")
    p.add_argument("--requests", type=positive_int, default=DECODE_REQUESTS, metavar="N",
                   help=f"requests per run (default {DECODE_REQUESTS})")
    p.add_argument("--workers", type=positive_int, default=8, metavar="G", help="decode DP workers (default 8)")
    p.add_argument("--predictor", default="oracle", metavar="NAME",
                   help="BR-H horizon predictor, one of: none, oracle, survival, exact, learned:DIR (deployable ones "
                   "are fitted on requests distinct from the simulated ones) (default oracle)")
    p.add_argument("--deployment", default="default", metavar="NAME",
                   help=f"{' or '.join(DECODE_DEPLOYMENTS)}, as jaxroute decode has them (default default)")
    p.add_argument("--horizon", type=non_negative_int, default=dd.DEFAULT_HORIZON, metavar="H",
                   help=f"BR-H horizon H: a static shape, fixed during the search (default {dd.DEFAULT_HORIZON})")
    p.add_argument("--slots", type=positive_int, default=dd.DEFAULT_SLOTS, metavar="S",
                   help=f"slots per worker (default {dd.DEFAULT_SLOTS})")
    p.add_argument("--pool", type=positive_int, default=dd.DEFAULT_POOL, metavar="P",
                   help=f"prompt pool of BR-H's pooled dispatch (default {dd.DEFAULT_POOL})")
    p.add_argument("--window", type=positive_int, default=dd.DEFAULT_WINDOW, metavar="W",
                   help=f"BR stage-2 candidate window, 2^W subsets (default {dd.DEFAULT_WINDOW})")
    p.add_argument("--r-max", type=positive_int, default=dd.DEFAULT_R_MAX, metavar="R",
                   help=f"new requests per worker per step (default {dd.DEFAULT_R_MAX})")
    _add_search_args(p)
    p.set_defaults(func=run_decode)


def _add_search_args(p) -> None:
    """The CMA-ES, seed and output flags of every `tune` model."""
    p.add_argument("--population", type=positive_int, default=8, metavar="P", help="CMA-ES population per generation (default 8)")
    p.add_argument("--generations", type=positive_int, default=10, metavar="N", help="CMA-ES generations (default 10)")
    p.add_argument("--std-init", type=positive_float, default=0.2, metavar="F",
                   help="CMA-ES initial step size in the normalised box [0, 1]^d (default 0.2)")
    p.add_argument("--seeds", type=positive_int, default=4, metavar="S", help="search seeds per candidate, common to all (default 4)")
    p.add_argument("--final-seeds", type=positive_int, default=8, metavar="S",
                   help="fresh seeds of the final re-evaluation against the defaults (default 8)")
    p.add_argument("--seed", type=non_negative_int, default=0, metavar="INT", help="base PRNG seed (default 0)")
    p.add_argument("--out", metavar="PATH.json", help="write the results JSON: curve, candidates, CIs (default: none)")
    p.add_argument("--plot", metavar="PATH.png", help="write the search curve as a PNG (default: none)")
    p.add_argument("--no-progress", action="store_true",
                   help="print the generations' lines after the search instead of as each one ends (default: as it ends)")
    add_save_spec(p)


def _objective(args) -> tn.Objective:
    from jaxroute.experiments import tune as tn

    name = args.objective.strip().lower()
    search = tn.CapacitySearch(*(args.rate_range or (0.5, 100.0)), tol=args.tol, points=args.points,
                               max_rounds=args.max_rounds)
    if name == "capacity" and args.rate is not None:
        raise JaxrouteError("--rate does not apply to --objective capacity: it searches the rate (see --rate-range)")
    if name != "capacity" and args.rate_range is not None:
        raise JaxrouteError("--rate-range applies to --objective capacity")
    slo = args.slo
    if slo is None and name in ("goodput", "goodput_rps", "slo_attainment"):
        slo = parse_slo(DEFAULT_SLO)
    return tn.objective(name, slo or (), search)


def _setup(args, workload) -> tn.Setup:
    from jaxroute.experiments import tune as tn

    is_trace = args.workload in TRACE_WORKLOADS
    cost_model, latency = latency_choice(args)
    warn_extrapolation(args, cost_model, latency)
    rate = args.rate if args.rate is not None else (0.0 if is_trace else 1.0)
    return tn.Setup(workload, replicas=args.replicas, rate=rate, gpu=args.gpu, model_name=args.model, tp=args.tp,
                    cost_model=cost_model, latency=latency, kv_capacity=args.kv_capacity, stale_s=args.stale, chunk=args.chunk, max_running=args.max_running,
                    local=choose([args.local], LOCAL_ORDERS, "local order")[0],
                    admission=choose([args.admission], ADMISSIONS, "admission")[0])


def _print_generation(g: tn.Generation) -> None:
    over = f", {g.overflowed} overflowed" if g.overflowed else ""
    print(f"  generation {g.index}: best {_fmt(g.best)}, mean {_fmt(g.mean)}, best so far {_fmt(g.best_ever)}{over}",
          flush=True)


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _table(res: tn.TuneResult) -> str:
    from jaxroute import report

    names = res.space.names
    w = {n: max(10, len(n)) for n in names}
    head = f"  {'candidate':<10} " + " ".join(f"{n:>{w[n]}}" for n in names) + f" {res.objective.metric + ' (fresh seeds)':>26} {'gain (+ = better)':>22} {'gain %':>8}"
    lines = [head]
    for c in res.candidates:
        vals = " ".join(f"{_fmt(c.values[n]):>{w[n]}}" for n in names)
        gain = report.fmt_ci(c.gain) if c.gain else "-"
        pct = f"{c.gain_pct:+.1f}" if c.gain_pct is not None else "-"
        mark = " *" if c is res.best else ""
        lines.append(f"  {c.label:<10} {vals} {report.fmt_ci(c.final):>26} {gain:>22} {pct:>8}{mark}")
    return "\n".join(lines)


def _plot(res: tn.TuneResult, path: str, title: str) -> None:
    from jaxroute import report

    x = [g.index for g in res.generations]
    lines = [dict(x=x, y=[g.best for g in res.generations], marker="o", label="best of generation"),
             dict(x=x, y=[g.mean for g in res.generations], marker=".", label="generation mean"),
             dict(x=x, y=[g.best_ever for g in res.generations], ls=":", label="best so far")]
    if math.isfinite(res.start_score):
        lines.append(dict(x=[x[0], x[-1]], y=[res.start_score] * 2, ls="--", color="grey", label="defaults"))
    ticks = (x, [str(i) for i in x]) if len(x) <= 20 else None
    report.line_plot({f"{res.space.router}: {res.objective.metric} on the search seeds": lines}, path,
                     xlabel="generation", ylabel=res.objective.metric, title=title, xticks=ticks)


def _search(args, title: str, run_tune) -> tn.TuneResult:
    """Print the title, run the search (`run_tune(on_generation)`) and print its curve."""
    if args.final_seeds < 2:
        warn("one seed gives no confidence interval")
    print(title)
    print(f"CMA-ES (evosax): population {args.population} x {args.generations} generations x {args.seeds} seeds; "
          f"final: {args.final_seeds} fresh seeds")
    live = show_progress(args)
    res = run_tune(_print_generation if live else None)
    if not live:  # the curve, printed once the search is done
        for g in res.generations:
            _print_generation(g)
    return res


def _report(res: tn.TuneResult) -> None:
    from jaxroute import report

    print(f"defaults on the search seeds: {_fmt(res.start_score)}; best found: {_fmt(res.generations[-1].best_ever)}")
    print(_table(res))
    print(f"best (*): {res.best.label}, settings {report.jsonable(res.best.settings)}")
    if res.best.label == "defaults":
        warn("no tuned candidate beat the defaults on the fresh seeds: try more --seeds or --generations")
    print(f"simulated {res.runs:,} configurations x seeds in {res.elapsed_s:.1f} s (compilation included)")


def _write(res: tn.TuneResult, args, title: str, config: dict) -> None:
    from jaxroute import report

    if args.out:
        print(f"wrote {report.write_json(args.out, {'command': 'tune', 'config': config, **res.as_json()})}")
    if args.plot:
        _plot(res, args.plot, title.replace("; ", "\n", 1))
        print(f"wrote {args.plot}")


def _search_kw(args) -> dict:
    return dict(population=args.population, generations=args.generations, seeds=args.seeds,
                final_seeds=args.final_seeds, seed=args.seed, std_init=args.std_init)


def run(args) -> int:
    router = choose([args.router], TUNABLE_ROUTERS, "tunable router")[0]
    name = choose([args.workload], CLUSTER_WORKLOADS, "workload")[0]
    # the models, once the flags are checked
    from jaxroute import report
    from jaxroute.experiments import tune as tn
    from jaxroute.experiments.cluster import build_workload

    space = tn.Space.of(router, csv_list(args.params) if args.params is not None else None)
    obj = _objective(args)
    args.workload = name
    workload = build_workload(name, args.requests, args.trace, args.hot_tool, shared_prefix=shared_prefix_settings(args))
    setup = _setup(args, workload)
    where = (f"rates {obj.search.lo:g}-{obj.search.hi:g} req/s" if obj.metric == "capacity" else
             "recorded times" if setup.rate <= 0 else f"{setup.rate:g} req/s")
    slo = f" under {obj.slo_text}" if obj.slo else ""
    title = (f"tune {router} ({', '.join(space.names)}): {'max' if obj.maximise else 'min'} {obj.metric}{slo}; "
             f"{name}, {args.requests} requests, {args.replicas} replicas ({args.model} on {args.gpu}), {where}")
    res = _search(args, title, lambda on_gen: tn.tune(space, obj, setup, **_search_kw(args), on_generation=on_gen))
    _report(res)
    config = {"model": args.model, "gpu": args.gpu, "tp": args.tp, "workload": name, "trace": args.trace,
              "requests": args.requests, "replicas": args.replicas, "rate": setup.rate, "seed": args.seed,
              "kv_capacity": args.kv_capacity, "cost_model": setup.cost_model, "stale_s": args.stale,
              "local": setup.local, "admission": setup.admission, "chunk": args.chunk, "max_running": args.max_running}
    _write(res, args, title, config)
    if args.params_out:
        about = {"command": "tune", **config}
        print(f"wrote {report.write_json(args.params_out, res.params_json(about))} "
              f"(rerun: jaxroute cluster --params-json {args.params_out})")
    return 0


def run_control(args) -> int:
    from jaxroute.routers.names import PARTIAL_OK

    router = choose([args.router], PARTIAL_OK, "router under an autoscaler")[0]
    name = choose([args.workload], CLUSTER_WORKLOADS, "workload")[0]
    got = control_settings(args, args.replicas)
    if got is None or len(got[0]) != 1 or got[0][0] == "fixed":
        raise JaxrouteError("give one autoscaler to tune: --autoscaler hpa, kpa or sla")
    scalers, gates, base, slots = got
    if len(gates) != 1:
        raise JaxrouteError("give at most one --gate: every candidate runs it")
    if not (math.isfinite(base.get("slo_ttft_s", math.inf)) or math.isfinite(base.get("slo_tpot_s", math.inf))):
        raise JaxrouteError("tune control needs an SLO: --control-set slo_ttft_s=S (and/or slo_tpot_s=S)")
    if args.rate is not None and args.rate_stages:
        raise JaxrouteError("--rate and --rate-stages are mutually exclusive: give one rate or the stages")
    # the models, once the flags are checked
    from jaxroute.experiments import tune_control as tc
    from jaxroute.experiments.cluster import build_workload

    stages = args.rate_stages
    requests = args.requests or (round(sum(r * d for r, d in stages)) if stages else 300)
    workload = build_workload(name, requests, args.trace, args.hot_tool, shared_prefix=shared_prefix_settings(args),
                              rate_stages=stages)
    args.requests, args.workload = requests, name
    setup = _setup(args, workload)
    if stages:
        setup = dataclasses.replace(setup, rate=workload.stage_mean_rate)
    base = {k: v for k, v in base.items() if v is not None}
    base["gate"] = gates[0]
    space = tc.ControlSpace.of(router, scalers[0], base, csv_list(args.params) if args.params is not None else None)
    csetup = tc.ControlSetup(setup, router=router, slots=slots, min_attainment=args.min_attainment)
    slo = ", ".join(f"{k.removeprefix('slo_').removesuffix('_s').upper()} <= {base[k]:g} s"
                    for k in ("slo_ttft_s", "slo_tpot_s") if math.isfinite(base.get(k, math.inf)))
    load = ("stages " + ",".join(f"{r:g}:{d:g}" for r, d in stages) if stages else
            "recorded times" if setup.rate <= 0 else f"{setup.rate:g} req/s")
    title = (f"tune {scalers[0]} ({', '.join(space.names)}) for {router}: min GPU-hours with SLO attainment >= "
             f"{args.min_attainment:g} ({slo}); {name}, {requests} requests, up to {args.replicas} replicas "
             f"({args.model} on {args.gpu}), {load}")
    res = _search(args, title, lambda on_gen: tc.tune(space, csetup, **_search_kw(args), on_generation=on_gen))
    _report(res)
    from jaxroute import report

    config = {"router": router, "autoscaler": scalers[0], "gate": gates[0], "control": report.jsonable(base),
              "min_attainment": args.min_attainment, "workload": name, "requests": requests, "replicas": args.replicas,
              "replica_slots": slots, "rate": setup.rate, "rate_stages": stages, "model": args.model, "gpu": args.gpu,
              "tp": args.tp, "seed": args.seed}
    _write(res, args, title, config)
    return 0


def run_decode(args) -> int:
    if args.population < 2:
        raise JaxrouteError(f"CMA-ES needs a population of at least 2, got {args.population}")
    workload = choose([args.workload], DECODE_WORKLOADS, "decode workload")[0]
    deployment = choose([args.deployment], DECODE_DEPLOYMENTS, "deployment")[0]
    # the models, once the flags are checked
    from jaxroute.experiments import tune_decode as td
    from jaxroute.predictors import bank as bank_lib  # registers the deployable kinds
    from jaxroute.workloads.decode import make_decode_requests

    obj = td.objective(args.objective)
    space = td.DecodeSpace.of(args.workers, csv_list(args.params) if args.params is not None else None)
    specs = csv_list(args.predictor)
    if len(specs) != 1:
        raise JaxrouteError(f"give one predictor, e.g. --predictor oracle; choose from: {bank_lib.SPEC_HELP}")
    predictor = bank_lib.parse_spec(specs[0])[0]
    base = DECODE_PRESETS[deployment]
    dep = dataclasses.replace(base, slots=args.slots, pool=args.pool, window=args.window, horizon=args.horizon,
                              r_max=args.r_max)
    req = make_decode_requests(workload, args.requests, seed=args.seed, trace_path=args.trace)
    bank, _, _ = bank_lib.bank_for_simulation(specs, workload, args.requests, args.seed, args.trace, dep.horizon)
    setup = td.DecodeSetup(req, workers=args.workers, predictor=predictor, dep=dep, bank=bank)
    title = (f"tune brh[{predictor}] ({', '.join(space.names)}): {'max' if obj.maximise else 'min'} {obj.metric}; "
             f"{workload}, {len(req)} requests, G={args.workers} workers x {dep.slots} slots ({dep.model} on "
             f"{dep.tp}x{dep.gpu}), saturated, H={dep.horizon} fixed")
    res = _search(args, title, lambda on_gen: td.tune(space, obj, setup, **_search_kw(args), on_generation=on_gen))
    _report(res)
    config = {"workload": workload, "trace": args.trace, "requests": len(req), "workers": args.workers,
              "predictor": specs[0], "deployment": args.deployment, **dataclasses.asdict(dep), "seed": args.seed,
              "defaults": space.defaults()}
    _write(res, args, title, config)
    return 0
