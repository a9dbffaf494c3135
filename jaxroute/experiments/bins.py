"""Balls into bins with d choices: max load per d over seeds, and the asymptotic formulas."""

from __future__ import annotations

import math

from jaxroute.clusters.bins import BinsModel, make_params
from jaxroute.experiments.comparison import Comparison, Results, Row

METRICS = ("max_load",)


def asymptotic_max_load(n: int, d: int) -> float:
    """Leading-order max load: ln n / ln ln n for d = 1, ln ln n / ln d for d >= 2."""
    if n < 16:
        return float("nan")
    return math.log(n) / math.log(math.log(n)) if d == 1 else math.log(math.log(n)) / math.log(d)


def run_bins(n: int, ds, seeds: int, seed: int = 0, progress: bool = False) -> Results:
    """Max load for each d over `seeds` runs, in one compiled grid."""
    rows = [Row(f"d={d}" + (" (random)" if d == 1 else ""), make_params(d), {"n": n, "d": d})
            for d in ds]
    return Comparison(BinsModel(n=n, max_d=max(ds)), rows, seeds, METRICS, seed=seed, chunk=max(1, n // 20),
                      progress="bins" if progress else False).run()
