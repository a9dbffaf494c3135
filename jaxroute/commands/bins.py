"""`jaxroute bins`: balls into bins with d choices (the zero-departure case of dispatch)."""

from __future__ import annotations

import math
import time

from jaxroute.commands._common import (
    add_grid_args,
    check_conservation,
    list_of,
    positive_int,
    save_outputs,
    show_progress,
)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bins",
        help="balls into bins: max load with d random choices (Azar et al. 1994)",
        description="Throw n balls into n bins; each ball looks at d bins chosen uniformly at random (with "
        "replacement) and joins the least loaded (ties: the first sampled). Prints the mean max load with a "
        "95% CI over seeds, beside the asymptotic formulas ln n / ln ln n (d = 1) and ln ln n / ln d.",
    )
    p.add_argument("--n", type=positive_int, default=100000, metavar="N", help="balls = bins (default 100000)")
    p.add_argument("--d", type=list_of(positive_int), default=[1, 2, 3], metavar="LIST",
                   help="comma-separated choices per ball (default 1,2,3)")
    add_grid_args(p, seeds=64, seeds_help="independent runs per d")
    p.set_defaults(func=run)


def run(args) -> int:
    from jaxroute import report
    from jaxroute.experiments.bins import METRICS, asymptotic_max_load, run_bins

    n, ds, seeds = args.n, args.d, args.seeds
    start = time.perf_counter()
    results = run_bins(n, ds, seeds, args.seed, progress=show_progress(args))
    check_conservation(results)
    records = results.records
    print(f"bins: {n} balls into {n} bins, {seeds} seeds; max load, mean ± 95% CI")
    print(report.format_table(records, METRICS, extra={
        "asymptotic": lambda r: _formula(asymptotic_max_load(n, r.params['d'])),
        "range over seeds": lambda r: f"{min(r.metrics['max_load'].per_seed):.0f}-"
                                      f"{max(r.metrics['max_load'].per_seed):.0f}",
    }))
    print(f"({len(ds)} values of d x {seeds} seeds in one compiled grid, {time.perf_counter() - start:.1f} s)")
    save_outputs(args, "bins", dict(n=n, d=ds, seeds=seeds, seed=args.seed), records,
                 lambda path: report.bar_plot(records, METRICS, path, f"{n} balls into {n} bins",
                                              ylabel="max load (balls)"))
    return 0


def _formula(value: float) -> str:
    """A leading-order formula's value, or "-" where it means nothing (n < 16: ln ln n is below 1)."""
    return f"{value:.2f}" if math.isfinite(value) else "-"
