"""`jaxroute bins`: balls into bins with d choices (the zero-departure case of dispatch)."""

from __future__ import annotations

import math
import time

import jax

from jaxroute import report, sim
from jaxroute.clusters.queueing import BinsModel, BinsParams
from jaxroute.commands._common import add_output_args, csv_list, int_arg, show_progress
from jaxroute.commands.dispatch import plot_records
from jaxroute.errors import JaxrouteError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bins",
        help="balls into bins: max load with d random choices (Azar et al. 1994)",
        description="Throw n balls into n bins; each ball looks at d bins chosen uniformly at random (with "
        "replacement) and joins the least loaded (ties: the first sampled). Prints the mean max load with a "
        "95% CI over seeds, beside the asymptotic formulas ln n / ln ln n (d = 1) and ln ln n / ln d.",
    )
    p.add_argument("--n", default="100000", metavar="N", help="balls = bins (default 100000)")
    p.add_argument("--d", default="1,2,3", metavar="LIST", help="comma-separated choices per ball (default 1,2,3)")
    p.add_argument("--seeds", default="64", metavar="S", help="independent runs per d (default 64)")
    p.add_argument("--seed", default="0", metavar="INT", help="base PRNG seed (default 0)")
    add_output_args(p)
    p.set_defaults(func=run)


def asymptotic_max_load(n: int, d: int) -> float:
    """Leading-order max load: ln n / ln ln n for d = 1, ln ln n / ln d for d >= 2."""
    if n < 16:
        return float("nan")
    return math.log(n) / math.log(math.log(n)) if d == 1 else math.log(math.log(n)) / math.log(d)


def run_bins(n: int, ds, seeds: int, seed: int = 0, progress: bool = False):
    """Max load for each d over `seeds` runs, one compiled grid; returns records."""
    model = BinsModel(n=n, max_d=max(ds))
    params = sim.stack_params([BinsParams(d=jax.numpy.int32(d)) for d in ds])
    grid = sim.run_grid(model, jax.random.key(seed), None, params, seeds, chunk=max(1, n // 20),
                        progress="bins" if progress else False)
    labels = [(f"d={d}" + (" (random)" if d == 1 else ""), {"n": n, "d": d}) for d in ds]
    return report.records_from_grid(grid, labels, ["max_load"]), grid


def run(args) -> int:
    n = int_arg(args.n, "--n", 1)
    seeds = int_arg(args.seeds, "--seeds", 1)
    seed = int_arg(args.seed, "--seed", 0)
    ds = [int_arg(x, "--d", 1) for x in csv_list(args.d)]
    if not ds:
        raise JaxrouteError("--d needs at least one value, e.g. --d 1,2")
    if len(set(ds)) != len(ds):
        raise JaxrouteError(f"--d lists a value twice: {args.d}")
    start = time.perf_counter()
    records, grid = run_bins(n, ds, seeds, seed, progress=show_progress(args))
    if grid.metrics["conservation_error"].any():  # pragma: no cover - an internal invariant
        raise JaxrouteError("balls were lost (conservation error); please report this bug")
    print(f"bins: {n} balls into {n} bins, {seeds} seeds; max load, mean ± 95% CI")
    print(report.format_table(records, ["max_load"], extra={
        "asymptotic": lambda r: f"{asymptotic_max_load(n, r.params['d']):.2f}",
        "range over seeds": lambda r: f"{min(r.metrics['max_load'].per_seed):.0f}-"
                                      f"{max(r.metrics['max_load'].per_seed):.0f}",
    }))
    print(f"({len(ds)} values of d x {seeds} seeds in one compiled grid, {time.perf_counter() - start:.1f} s)")
    if args.out:
        path = report.write_results(args.out, "bins", dict(n=n, d=ds, seeds=seeds, seed=seed), records)
        print(f"wrote {path} and {path.with_suffix('.csv')}")
    if args.plot:
        plot_records(records, ["max_load"], args.plot, f"{n} balls into {n} bins", ylabel="max load (balls)")
        print(f"wrote {args.plot}")
    return 0
