"""`jaxroute compare MEASURED`: a measured run replayed through the simulator, compared, optionally calibrated."""

from __future__ import annotations

import argparse
import dataclasses
import textwrap
from pathlib import Path

from jaxroute import catalog
from jaxroute.commands._common import (
    add_model_args,
    add_save_spec,
    non_negative_int,
    positive_float,
    positive_int,
    warn,
)
from jaxroute.deployment import REPLAY
from jaxroute.errors import JaxrouteError
from jaxroute.routers.names import PREFIX_POLICIES

DEFAULT_MODEL = REPLAY.model
FORMATS = ("auto", "vllm-bench-serve", "inference-perf", "jaxroute")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "compare",
        help="replay a measured benchmark run through the simulator and report the error (and fit the roofline)",
        description=textwrap.fill(
            "Read the per-request results of a real benchmark run (vLLM `bench serve --save-result --save-detailed` "
            "JSON, inference-perf's per_request_lifecycle_metrics.json, or jaxroute's own --requests-out file), "
            "replay its send times and prompt and output lengths (as private prompts: no file says which prompts "
            "share a prefix) on the deployment given, and report per metric (TTFT, TPOT, E2E) the measured and "
            "simulated mean, p50, p90 and p99 and the request-level MAPE, Pearson r, bias and quality, as BLIS's "
            "`calibrate` does. --fit first fits the roofline's factors (effective compute and memory shares of "
            "peak, the fixed time of an iteration) to the run by gradient descent through the jitted simulator "
            "(optax Adam on forward-mode derivatives of every request's times), reports the comparison before and "
            "after, and writes the factors for --cost-params (here and in `jaxroute cluster`).", 100),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("measured", metavar="MEASURED_PATH",
                   help="the measured run's per-request results file, or an inference-perf report folder of "
                   "stage_N_lifecycle_metrics.json (per-stage summaries: each stage replayed on its own, as "
                   "inference-perf drains a stage before the next; needs --config)")
    p.add_argument("--config", default=None, metavar="PATH",
                   help="a report folder's inference-perf config.yml: its data section gives the prompts (default: none)")
    p.add_argument("--seeds", type=positive_int, default=4, metavar="S",
                   help="a report folder: draws of each stage's arrivals and prompts (default 4)")
    p.add_argument("--format", default="auto", choices=FORMATS, help="its format (default auto: from its content)")
    p.add_argument("--measured-router", default=None, metavar="LABEL",
                   help="a jaxroute records file: the router whose records to read (default: the only one)")
    p.add_argument("--measured-seed", type=non_negative_int, default=None, metavar="S",
                   help="a jaxroute records file: the seed whose records to read (default: the only one)")
    p.add_argument("--router", default="least_load", metavar="NAME",
                   help=f"the router of the replay, from: {', '.join(PREFIX_POLICIES)} (default least_load)")
    p.add_argument("--replicas", type=positive_int, default=1, metavar="G", help="replicas behind it (default 1)")
    p.add_argument("--gpu", default=REPLAY.gpu, metavar="NAME", help=f"GPU: {', '.join(catalog.GPUS)} (default {REPLAY.gpu})")
    add_model_args(p, default=None, help=f"model: {', '.join(catalog.MODELS)} (default {DEFAULT_MODEL}; a run "
                   "folder: the served model's config.json in a model_configs/ folder beside the runs, else the "
                   "server file's model as a catalog name)")
    p.add_argument("--server", default=None, metavar="FILE",
                   help="vLLM's serve arguments (YAML: model, tensor_parallel_size, max_num_batched_tokens, "
                   "max_num_seqs, gpu_memory_utilization, block_size, ...) of a run folder or report folder "
                   "(default: the run folder's exp-config.yaml or server.yaml); the KV cache is sized as vLLM sizes it")
    p.add_argument("--latency-model", default="trained", choices=("trained", "roofline"),
                   help="a run folder's step time: the fitted trained model (default) or today's roofline")
    p.add_argument("--latency-params", default=None, metavar="PATH.json",
                   help="the trained model's coefficients (`jaxroute fit-latency --params-out`; default: shipped)")
    p.add_argument("--requests", type=positive_int, default=400, metavar="N",
                   help="a run folder: requests simulated per stage that keeps up (default 400; a stage whose "
                   "queue grew is simulated whole)")
    p.add_argument("--plot", default=None, metavar="PATH.png",
                   help="a run folder: measured against simulated per stage, as a PNG (default: none)")
    p.add_argument("--tp", type=positive_int, default=REPLAY.tp, metavar="T", help=f"GPUs per replica (default {REPLAY.tp})")
    p.add_argument("--admission", default=REPLAY.admission, choices=("reserve", "on-demand"),
                   help=f"KV admission (default {REPLAY.admission}: vLLM V1's)")
    p.add_argument("--max-running", type=positive_int, default=REPLAY.max_running, metavar="B",
                   help=f"running requests per replica (default {REPLAY.max_running}: vLLM's max_num_seqs)")
    p.add_argument("--chunk", type=positive_int, default=REPLAY.chunk, metavar="TOKENS",
                   help=f"prefill tokens per iteration (default {REPLAY.chunk}: vLLM's max_num_batched_tokens floor, "
                   "DEFAULT_MAX_NUM_BATCHED_TOKENS; a server file gives a deployment's own)")
    p.add_argument("--kv-capacity", type=positive_int, default=None, metavar="TOKENS",
                   help="KV tokens per replica (default: from GPU memory at 90 %% less the weights)")
    p.add_argument("--cost-params", default=None, metavar="PATH.json",
                   help="the roofline's factors from a fit (`--fit --cost-params-out`) (default: the catalog's)")
    p.add_argument("--fit", action="store_true", help="fit the roofline's factors to the run first (default: off)")
    p.add_argument("--fit-steps", type=positive_int, default=None, metavar="N", help="Adam steps (default 150)")
    p.add_argument("--fit-lr", type=positive_float, default=None, metavar="LR", help="Adam's first step size, cosine-decayed (default 0.1)")
    p.add_argument("--cost-params-out", default=None, metavar="PATH.json", help="with --fit: write the fitted factors as JSON (default: none)")
    p.add_argument("--fit-plot", default=None, metavar="PATH.png", help="with --fit: the loss curve as a PNG (default: none)")
    p.add_argument("--out", default=None, metavar="PATH.json", help="write the comparison as JSON (default: none)")
    add_save_spec(p)
    p.set_defaults(func=run)


def run(args) -> int:
    if not Path(args.measured).exists():
        raise JaxrouteError(f"measured file or run folder not found: {args.measured}")
    if args.router not in PREFIX_POLICIES:
        raise JaxrouteError(f"unknown router '{args.router}'; choose from: {', '.join(PREFIX_POLICIES)}")
    if not args.fit and (args.cost_params_out or args.fit_plot or args.fit_steps or args.fit_lr):
        raise JaxrouteError("--cost-params-out, --fit-plot, --fit-steps and --fit-lr go with --fit")
    if _is_run_folder(args):
        return _run_folder(args)
    if args.server or args.latency_params or args.plot or args.latency_model != "trained":
        raise JaxrouteError("--server, --latency-model, --latency-params and --plot go with a run folder "
                            "(exp-config.yaml and results/ with stage_N_lifecycle_metrics.json)")
    gpu, model = catalog.get_gpu(args.gpu).name, catalog.model_ref(args.model or DEFAULT_MODEL)
    from jaxroute import measured as measured_lib

    run_ = None if Path(args.measured).is_dir() else measured_lib.read_measured(
        args.measured, args.format, router=args.measured_router, seed=args.measured_seed)  # read before JAX loads
    from jaxroute.experiments import fit_roofline, replay

    dep = dataclasses.replace(REPLAY, replicas=args.replicas, gpu=gpu, model=model, tp=args.tp,
                              admission=args.admission, max_running=args.max_running, chunk=args.chunk,
                              kv_capacity=args.kv_capacity)
    start = fit_roofline.load(args.cost_params) if args.cost_params else None
    if run_ is None:
        return _stages(args, dep, start)
    skipped = int((~replay.replayable(run_)).sum())
    print(f"compare: {run_.name} ({run_.source}, {len(run_):,} requests"
          f"{f', {skipped} without a prompt or output not replayed' if skipped else ''}"
          f"{'' if run_.arrivals_recorded else ', send times rebuilt: the file has none'}) replayed on "
          f"{args.replicas} x {model} on {args.tp} x {gpu} behind {args.router}")
    if not run_.arrivals_recorded:
        warn("the measured file records no send times; the replay sends at times rebuilt from its request rate")
    before = replay.compare(run_, replay.simulated(run_, dep, args.router, start))
    print(f"\ncost factors: {_factors_text(start)}")
    print(replay.format_comparison(before))
    out = {"command": "compare", "measured": args.measured, "source": run_.source, "deployment": _deployment_json(dep, args.router),
           "cost_factors": (start or fit_roofline.CostFactors())._asdict(), "comparison": before}
    if args.fit:
        kw = {k: v for k, v in (("steps", args.fit_steps), ("lr", args.fit_lr)) if v is not None}
        result = fit_roofline.fit(run_, dep, start=start, router=args.router, **kw)
        after = replay.compare(run_, replay.simulated(run_, dep, args.router, result.factors))
        print(f"\nfitted ({len(result.loss)} Adam steps on {result.requests:,} requests, loss "
              f"{result.loss[0]:.4g} -> {min(result.loss):.4g} at step {result.best_step}): {_factors_text(result.factors)}")
        print(replay.format_comparison(after))
        out["fit"] = dict(result.as_json(), comparison=after)
        if args.cost_params_out:
            print(f"wrote {fit_roofline.save(args.cost_params_out, result, dep, args.measured)}")
        if args.fit_plot:
            print(f"wrote {fit_roofline.loss_plot(result, args.fit_plot, f'roofline fit to {run_.name}')}")
    if args.out:
        from jaxroute import report

        print(f"wrote {report.write_json(args.out, out)}")
    return 0


def _stages(args, dep, factors) -> int:
    """A report folder of per-stage summaries, each stage replayed on its own."""
    from jaxroute.experiments import stage_replay

    if not args.config:
        raise JaxrouteError("a report folder of stage summaries needs --config (the inference-perf config.yml of the run)")
    if args.fit:
        raise JaxrouteError("--fit needs per-request results; a report folder holds per-stage summaries only")
    print(f"compare: the stages of {args.measured} replayed one by one on {args.replicas} x {dep.model} on "
          f"{args.tp} x {dep.gpu} behind {args.router}, {args.seeds} seeds; cost factors: {_factors_text(factors)}")
    result = stage_replay.compare_stages(args.measured, args.config, dep, seeds=args.seeds, factors=factors,
                                          router=args.router)
    print(stage_replay.format_stages(result))
    if any(c.client_bound for c in result):
        print("client-bound: the stage's achieved rate fell short of its requested rate (the client's concurrency cap "
              "paced it, a closed loop not simulated)")
    if args.out:
        from jaxroute import report

        doc = {"command": "compare", "measured": args.measured, "config": args.config, "deployment": _deployment_json(dep, args.router),
               "seeds": args.seeds, "stages": [c.as_json() for c in result]}
        print(f"wrote {report.write_json(args.out, doc)}")
    return 0


def _deployment_json(dep, router: str) -> dict:
    """The replay's deployment as the JSON records it."""
    keys = ("gpu", "model", "tp", "replicas", "admission", "max_running", "chunk", "kv_capacity", "cost_model")
    return {"router": router, **{k: getattr(dep, k) for k in keys}}


def _factors_text(f) -> str:
    from jaxroute.cost_models import CostFactors

    f = f or CostFactors()
    return f"eta_compute {f.eta_compute:.4g}, eta_memory {f.eta_memory:.4g}, overhead {f.overhead_s * 1e3:.4g} ms"



def _is_run_folder(args) -> bool:
    d = Path(args.measured)
    from jaxroute.real_runs import is_run_folder

    return d.is_dir() and (args.server is not None or is_run_folder(d))


def _run_folder(args) -> int:
    """A measured run folder (vLLM's settings + inference-perf's config and stage metrics), every stage simulated
    under the latency model, measured and simulated side by side."""
    if args.fit:
        raise JaxrouteError("--fit applies to per-request files; fit a run folder with `jaxroute fit-latency`")
    from jaxroute import latency_params, real_runs

    model = args.model  # None: found beside the runs, or the server's model name
    if args.latency_model == "roofline" and args.latency_params:
        raise JaxrouteError("--latency-params sets the trained model's coefficients; drop --latency-model roofline")
    lp = None if args.latency_model == "roofline" else (
        latency_params.load(args.latency_params) if args.latency_params else latency_params.default())
    stages = real_runs.read_run(args.measured, server_file=args.server, config=args.config, model=model,
                                gpu=catalog.get_gpu(args.gpu).name)
    from jaxroute import server
    from jaxroute.experiments import latency_report

    s0 = stages[0]
    kv = server.kv_parts(s0.gpu, s0.model, s0.tp, s0.gpu_memory_utilization, s0.block_size)
    print(f"compare: {s0.run}: {catalog.get_model(s0.model).name} on {s0.tp} x {s0.gpu}, max_num_batched_tokens "
          f"{s0.chunk}, max_num_seqs {s0.max_running}, {len(stages)} stage(s), {args.latency_model} latency model")
    print(f"  {kv.text()}")
    if not s0.chunked_prefill:
        print(f"  {server.CHUNKED_PREFILL_NOTE}")
    doc = latency_report.compare_run(stages, lp, requests=args.requests, seed=0)
    print(latency_report.format_run(doc))
    print("itl: the per-token time, (E2E mean - TTFT mean) / (output tokens - 1); tpot_reported: inference-perf's "
          "TPOT, which counted every streamed token twice here (simulated: itl x (n - 1) / (2 n - 1))")
    for r in doc["stages"]:
        if r["client_bound"]:
            print(f"stage {r['stage']}: client-bound: sent at {r['achieved_rate']:.4g} of {r['rate']:g} req/s (the "
                  "client's concurrency cap held requests back, a closed loop): not simulated")
    over = [r for r in doc["stages"] if not r["client_bound"] and (r["simulated_overloaded"] or r["measured_overloaded"])]
    for r in over:
        print(f"stage {r['stage']}: overloaded: measured {r['measured_failed_pct']:.1f} % failed, simulated "
              f"{r['simulated_failed_pct']:.1f} % timed out (inference-perf's request timeout)")
    if args.plot:
        print(f"wrote {latency_report.plot_run(doc, args.plot)}")
    if args.out:
        from jaxroute import report

        print(f"wrote {report.write_json(args.out, latency_report.jsonable(doc))}")
    return 0
