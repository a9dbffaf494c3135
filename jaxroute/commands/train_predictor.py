"""`jaxroute train-predictor`: train the learned BR-H horizon predictor and save an orbax checkpoint."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from jaxroute.commands._common import (
    non_negative_int,
    positive_float,
    positive_int,
    show_progress,
)
from jaxroute.errors import JaxrouteError
from jaxroute.experiments.names import check_trace_flag
from jaxroute.workloads.names import PREDICTOR_TRACE_WORKLOADS, PREDICTOR_WORKLOADS


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train-predictor",
        help="train the learned horizon predictor (termination classifier + remaining-steps regressor)",
        description="Train the learned BR-H horizon predictor on the first 70% of a workload (by arrival), "
        "early-stop on the next 15%, and save params, optimiser state and config with orbax. "
        "The last 15% stays held out for `jaxroute eval-predictor`. Writes loss_curve.png into the "
        "checkpoint directory and prints the validation AUC (ends within H) and MAE (remaining steps).",
    )
    p.add_argument("--workload", required=True, choices=PREDICTOR_WORKLOADS, help="requests to learn output lengths from")
    p.add_argument("--trace", metavar="PATH", help="trace file for azure-conv/azure-code (CSV) or mooncake "
                   "(JSONL); default: ../shared/data/...")
    p.add_argument("--requests", metavar="N", type=positive_int, default=None,
                   help="use the first N requests (default: 20000 for synthetic workloads, the whole trace otherwise)")
    p.add_argument("--horizon", metavar="H", type=positive_int, default=80, help="prediction horizon H in decode steps (default 80)")
    p.add_argument("--save", required=True, metavar="DIR", help="checkpoint directory (created; older steps replaced)")
    p.add_argument("--steps", metavar="N", type=positive_int, default=2000, help="optimiser steps at most (default 2000)")
    p.add_argument("--batch", metavar="B", type=positive_int, default=512, help="minibatch size in (request, step) pairs (default 512)")
    p.add_argument("--lr", metavar="LR", type=positive_float, default=3e-3, help="peak AdamW learning rate (default 3e-3)")
    p.add_argument("--patience", metavar="K", type=positive_int, default=5,
                   help="stop after this many validation checks (every 100 steps) without improvement (default 5)")
    p.add_argument("--seed", metavar="S", type=non_negative_int, default=0, help="seed of the synthetic workload, pair sampling and init (default 0)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar (default: shown)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_trace_flag(args.workload, args.trace, PREDICTOR_TRACE_WORKLOADS)
    import numpy as np

    from jaxroute.predictors import checkpoint, data, learned
    from jaxroute.predictors.bank import build_bank, predict_pairs
    from jaxroute.predictors.evaluation import horizon_scores
    from jaxroute.predictors.training import TrainSettings, train

    reqs = data.load_lengths(args.workload, args.requests, args.seed, args.trace)
    tr, va, _ = data.temporal_split(reqs)
    if len(tr) < 20 or len(va) < 5:
        raise JaxrouteError(f"{len(reqs)} requests are too few to train on (70% train, 15% validation); "
                            "use --requests 200 or more")
    settings = TrainSettings(steps=args.steps, batch=args.batch, lr=args.lr, patience=args.patience, seed=args.seed)
    info = {"workload": args.workload, "requests": len(reqs), "seed": args.seed,
            "trace": str(args.trace) if args.trace else None}
    t0 = time.perf_counter()
    res = train(tr, va, args.horizon, settings, progress=show_progress(args), info=info)
    train_s = time.perf_counter() - t0
    steps_done = res.history[-1]["step"]

    # Validation accuracy of the best parameters, with survival as the reference.
    bank, names, ids = build_bank(["survival", "exact"], tr, args.horizon)
    bank += (learned.make_table(res.params, res.config),)
    pairs = data.sample_pairs(va, 1 << 15, np.random.default_rng(args.seed + 1))
    scores = {}
    for name in ("survival", "exact", "learned"):
        from jaxroute.predictors.base import kind_id

        p, mu = predict_pairs(bank, kind_id(name), pairs, args.horizon)
        scores[name] = horizon_scores(p, mu, pairs.remaining, args.horizon)
    cfg = res.config
    cfg.info.update({"val_auc": scores["learned"]["auc"], "val_mae": scores["learned"]["mae"],
                     "best_step": res.best_step, "steps_run": steps_done, "train_seconds": train_s})
    out = checkpoint.save(args.save, res.params, res.opt_state, cfg, res.best_step)
    png = _plot_losses(res.history, Path(out) / "loss_curve.png", res.best_step)

    print(f"trained on {len(tr)} requests of {args.workload} ({len(va)} for validation), H={args.horizon}, "
          f"features {list(cfg.features)}")
    print(f"{steps_done} steps in {train_s:.1f} s ({steps_done / max(train_s, 1e-9):.0f} steps/s, incl. compile); "
          f"best validation loss at step {res.best_step}" + ("; stopped early" if res.stopped_early else ""))
    print("validation (32768 (request, step) pairs):")
    for name, sc in scores.items():
        print(f"  {name:9s} auc {sc['auc']:.3f}  mae {sc['mae']:.1f}")
    print(f"checkpoint: {out}\nloss curve: {png}")
    return 0


def _plot_losses(history: list[dict], path: Path, best_step: int) -> Path:
    from jaxroute import report

    steps = [h["step"] for h in history]
    lines = []
    tr = [(h["step"], h["train_loss"]) for h in history if h["train_loss"] is not None]
    if tr:
        x, y = zip(*tr, strict=True)
        lines.append({"x": x, "y": y, "marker": ".", "label": "train (chunk mean)"})
    lines += [{"x": steps, "y": [h["val_loss"] for h in history], "marker": ".", "label": "validation"},
              {"x": steps, "y": [h["val_bce"] for h in history], "ls": "--", "label": "validation BCE (termination)"},
              {"x": steps, "y": [h["val_mse"] for h in history], "ls": ":", "label": "validation MSE of mu/H"},
              {"vline": best_step, "label": f"best step {best_step}"}]
    return report.line_plot({"horizon predictor training": lines}, path, xlabel="optimiser step", ylabel="loss")
