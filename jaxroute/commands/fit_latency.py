"""`jaxroute fit-latency DATA`: the trained latency model fitted to measured vLLM runs, with its errors."""

from __future__ import annotations

import argparse
import textwrap

from jaxroute.commands._common import positive_int, warn
from jaxroute.errors import JaxrouteError
from jaxroute.latency_params import FIT_REQUESTS as DEFAULT_REQUESTS
from jaxroute.latency_params import FIT_ROUNDS as DEFAULT_ROUNDS


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "fit-latency",
        help="fit the trained latency model's coefficients to measured vLLM runs (inference-perf) and report errors",
        description=textwrap.fill(
            "Read measured runs (folders with vLLM's exp-config.yaml, inference-perf's results/config.yaml and "
            "stage_N_lifecycle_metrics.json; the models' config.json found in a model_configs/ folder beside the "
            "runs), simulate every stage in one compiled program, and fit the trained step time's coefficients "
            "(prefill and decode compute and KV traffic, weight reads, TP all-reduce, per-layer, per-request, per-"
            "step and per-MoE-layer costs) and the request-level costs (before the first token, per prompt token, "
            "per output token) by damped Gauss-Newton rounds on the stages' TTFT mean and p90, E2E mean and p90 and "
            "per-token time, with exact Jacobians through the simulator (jax.jvp). Prints per-run errors of the "
            "fit and of today's roofline, leave-one-model-out cross-validation, and the coefficients with their "
            "standard errors; --params-out writes them for --latency-params.", 100),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("data", metavar="DATA_DIR", nargs="+",
                   help="folders of run folders (or their runs/), or run folders (a server file, exp-config.yaml or "
                   "server.yaml, an inference-perf config and its stage reports), e.g. "
                   "shared/data/vllm-h100-inference-perf tests/fixtures/inference_perf_kubecon_na_2025_vllm")
    p.add_argument("--runs", default=None, metavar="TEXT[,TEXT...]",
                   help="only runs whose folder name contains one of these (default: all)")
    p.add_argument("--include-overloaded", action="store_true",
                   help="fit to overloaded runs too (>10 %% of requests failed; default: report them apart)")
    p.add_argument("--requests", type=positive_int, default=DEFAULT_REQUESTS, metavar="N",
                   help=f"requests simulated per stage that keeps up (default {DEFAULT_REQUESTS}; a stage whose "
                   "queue grew is simulated whole)")
    p.add_argument("--rounds", type=positive_int, default=DEFAULT_ROUNDS, metavar="R",
                   help=f"Gauss-Newton rounds (default {DEFAULT_ROUNDS})")
    p.add_argument("--no-cv", action="store_true", help="skip leave-one-model-out cross-validation (default: run it)")
    p.add_argument("--start", default=None, metavar="PATH.json",
                   help="coefficients to start from (default: BLIS's published trained-physics coefficients on this "
                   "basis, jaxroute/data/latency/blis_start.json)")
    p.add_argument("--seed", type=int, default=0, help="arrivals and prompts of the simulated stages (default 0)")
    p.add_argument("--params-out", default=None, metavar="PATH.json",
                   help="write the fitted coefficients with their provenance (default: none)")
    p.add_argument("--out", default=None, metavar="PATH.json", help="write every table as JSON (default: none)")
    p.set_defaults(func=run)


def run(args) -> int:
    from jaxroute import latency_params, real_runs

    wanted = [w for w in (args.runs or "").split(",") if w]
    folders = [f for d in args.data for f in real_runs.discover(d) if not wanted or any(w in f.name for w in wanted)]
    if not folders:
        raise JaxrouteError(f"no run folder under {' '.join(args.data)} matches --runs {args.runs}")
    start = latency_params.load(args.start) if args.start else None
    read = [s for f in folders for s in real_runs.read_run(f)]
    stages = [s for s in read if not s.client_bound]
    if len(stages) < len(read):
        print(f"fit-latency: {len(read) - len(stages)} client-bound stage(s) left out (sent slower than asked: the "
              "client's concurrency cap, a closed loop): " + ", ".join(s.label for s in read if s.client_bound))
    fitted = [s for s in stages if args.include_overloaded or not s.overloaded]
    if not fitted:
        raise JaxrouteError("every run is overloaded; pass --include-overloaded to fit to them")
    from jaxroute.experiments import latency_report

    doc = latency_report.fit_and_report(stages, fitted, requests=args.requests, rounds=args.rounds, seed=args.seed,
                                        start=start, cv=not args.no_cv, folders=folders)
    if doc["cross_validation"] is None and not args.no_cv:
        warn("leave-one-model-out needs runs of two models or more: skipped")
    if args.params_out:
        print(f"wrote {latency_params.save(args.params_out, doc['params'])}")
    if args.out:
        from jaxroute import report

        print(f"wrote {report.write_json(args.out, latency_report.jsonable(doc))}")
    return 0
