"""`jaxroute eval-predictor`: survival, exact-match and learned horizon predictors side by side on held-out data."""

from __future__ import annotations

import argparse

from jaxroute.commands._common import (
    add_output_args,
    csv_list,
    non_negative_int,
    positive_int,
    warn,
)
from jaxroute.errors import JaxrouteError
from jaxroute.experiments.names import check_trace_flag
from jaxroute.routers.names import check_predictor_specs
from jaxroute.workloads.names import PREDICTOR_TRACE_WORKLOADS, PREDICTOR_WORKLOADS

EVAL_KINDS = ("survival", "exact", "learned")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "eval-predictor",
        help="compare survival, exact-match and learned horizon predictors on a held-out split",
        description="Fit survival and exact-match on the first 70% of a workload (by arrival), load the learned "
        "predictor from a checkpoint, and score all of them on the held-out last 15% (the split "
        "train-predictor never saw): auc = ROC AUC of p_fin for 'ends within H', mae = mean |mu_rem - "
        "remaining| over pairs that end within H, c_mae = mean |c - min(remaining, H)| over all pairs with "
        "c = (1 - p_fin) H + p_fin mu_rem (what BR-H consumes). Query points are (request, step) pairs, each active "
        "decode step of a request equally likely. The held-out split is cut into --folds contiguous folds "
        "whose scores give the 95% CI. The paper's numbers are printed alongside.",
    )
    p.add_argument("--workload", required=True, choices=PREDICTOR_WORKLOADS, help="requests to evaluate on")
    p.add_argument("--trace", metavar="PATH", help="trace file for azure-conv/azure-code (CSV) or mooncake (JSONL) "
                   "(default: ../shared/data/...)")
    p.add_argument("--requests", metavar="N", type=positive_int, default=None,
                   help="use the first N requests (default: 20000 for synthetic workloads, the whole trace "
                   "otherwise); use the same value and --seed as train-predictor so the splits line up")
    p.add_argument("--horizon", metavar="H", type=positive_int, default=80, help="prediction horizon H (default 80)")
    p.add_argument("--load", metavar="DIR", help="learned predictor checkpoint (from train-predictor --save); "
                   "without it only survival and exact are compared (default: none)")
    p.add_argument("--predictors", metavar="LIST", type=csv_list, default=None,
                   help=f"subset of {','.join(EVAL_KINDS)} to compare (default: all available)")
    p.add_argument("--pairs", metavar="N", type=positive_int, default=20000,
                   help="(request, step) pairs sampled per fold (default 20000)")
    p.add_argument("--folds", metavar="K", type=positive_int, default=8, help="contiguous folds of the held-out split (default 8)")
    p.add_argument("--seed", metavar="S", type=non_negative_int, default=0, help="seed of the synthetic workload and pair sampling (default 0)")
    add_output_args(p, plot=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    kinds = list(args.predictors) if args.predictors else [k for k in EVAL_KINDS if k != "learned" or args.load]
    for k in kinds:
        if k not in EVAL_KINDS:
            raise JaxrouteError(f"unknown predictor '{k}'; choose from: {', '.join(EVAL_KINDS)}")
    if "learned" in kinds and not args.load:
        raise JaxrouteError("predictor 'learned' needs --load DIR (a checkpoint from train-predictor --save)")
    if args.folds < 2:
        raise JaxrouteError("--folds must be >= 2 to give a confidence interval")
    check_trace_flag(args.workload, args.trace, PREDICTOR_TRACE_WORKLOADS)
    if args.load:
        check_predictor_specs([f"learned:{args.load}"])
    # the predictors, once the flags are checked
    import numpy as np

    from jaxroute.metrics import summarize
    from jaxroute.predictors import checkpoint, data
    from jaxroute.predictors.bank import build_bank, predict_pairs
    from jaxroute.predictors.evaluation import PAPER, PAPER_DATA, horizon_scores
    from jaxroute.report import Record, format_table, write_results

    reqs = data.load_lengths(args.workload, args.requests, args.seed, args.trace)
    train, _, test = data.temporal_split(reqs)
    if len(test) < args.folds:
        raise JaxrouteError(f"the held-out split has {len(test)} requests, fewer than --folds {args.folds}")
    specs = [k if k != "learned" else f"learned:{args.load}" for k in kinds]
    if args.load:
        cfg, _ = checkpoint.read_config(args.load)
        _warn_provenance(cfg.info, args, len(reqs))
    bank, names, ids = build_bank(specs, train, args.horizon)

    rng = np.random.default_rng(args.seed + 7)
    edges = np.linspace(0, len(test), args.folds + 1).astype(int)
    folds = [data.sample_pairs(test.slice(a, b), args.pairs, rng) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    per = {n: {"auc": [], "mae": [], "c_mae": []} for n in names}
    for pairs in folds:
        for name, kid in zip(names, ids, strict=True):
            p, mu = predict_pairs(bank, int(kid), pairs, args.horizon)
            sc = horizon_scores(p, mu, pairs.remaining, args.horizon)
            for m in per[name]:
                per[name][m].append(sc[m])
    if any(np.isnan(v).any() for d in per.values() for v in d.values()):
        raise JaxrouteError("a held-out fold has no pair that ends within H (or none that does not); "
                            "use more --requests, fewer --folds or a different --horizon")
    records = [Record(n, {"horizon": args.horizon}, False, {m: summarize(np.asarray(v)) for m, v in per[n].items()})
               for n in names]
    family = PAPER_DATA.get(args.workload)

    def paper(r):
        v = PAPER.get((family, r.policy))
        return f"{v[0]:.3f} / {v[1]:.1f} ({family})" if v else "-"

    print(f"{args.workload}: {len(train)} training requests, {len(test)} held out in {args.folds} folds x "
          f"{args.pairs} (request, step) pairs, H={args.horizon}")
    print(format_table(records, ["auc", "mae", "c_mae"], extra={"paper auc / mae": paper}))
    if args.out:
        config = {"workload": args.workload, "requests": len(reqs), "seed": args.seed, "horizon": args.horizon,
                  "folds": args.folds, "pairs_per_fold": args.pairs, "load": args.load,
                  "train_requests": len(train), "test_requests": len(test)}
        print(f"wrote {write_results(args.out, 'eval-predictor', config, records)}")
    return 0


def _warn_provenance(info: dict, args, n: int) -> None:
    """Warn when the checkpoint was trained on other data than this held-out split belongs to."""
    if info.get("workload") != args.workload:
        warn(f"checkpoint was trained on workload '{info.get('workload')}', evaluating on '{args.workload}'")
    elif info.get("requests") != n or (args.workload.startswith("synthetic") and info.get("seed") != args.seed):
        warn(f"checkpoint was trained on {info.get('requests')} requests with seed {info.get('seed')}; this "
             f"evaluation uses {n} with seed {args.seed}, so its held-out split may overlap the training data "
             "or (synthetic-prod) use different templates")
