"""Reproduce the lecture's code-01 dispatch demos (lecture 11, section 1; exercises 1-2) with jaxroute.

0. Theory checks: M/M/1 and M/D/1 under random dispatch, the supermarket model.
1. Balls into bins, n = 1e3 .. 1e5, d = 1 and 2.
2. 16 FCFS servers at load 0.9, five policies, exponential and heavy-tailed service.
3. Stale queue-length board, refresh interval T in {0, 0.5, 1, 2, 4}: JSQ vs P2C.

Where the lecture prints a number it is shown beside ours. The lecture's tables for
demos 2 and 3 are not in our copy of the text, so for those we check its stated
claims instead. Every cell is a mean with a 95 % CI over seeds; all policies of a
table run in one compiled grid.

    python scripts/reproduce_lecture_dispatch.py [--quick] [--out results/lecture_dispatch.json]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from jaxroute import report
from jaxroute.clusters.queueing import DispatchModel, make_params
from jaxroute.experiments import Comparison, paired_difference
from jaxroute.experiments.bins import asymptotic_max_load, run_bins
from jaxroute.experiments.dispatch import run_dispatch

POLICIES = ["random", "rr", "jsq", "p2c", "lwl"]
LECTURE_BINS = {(1_000, 1): 5.4, (1_000, 2): 3.0, (100_000, 1): 8.2, (100_000, 2): 3.4}  # exercise 1


def poisson_max_load(n: int) -> float:
    """E[max load] for random placement, with bin loads approximated as iid Poisson(1)."""
    tail = lambda k: 1 - sum(math.exp(-1) / math.factorial(j) for j in range(k))
    return sum(1 - (1 - tail(k)) ** n for k in range(1, 30))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer seeds and requests (a smoke run)")
    ap.add_argument("--out", default=None, help="write all tables as one JSON file")
    args = ap.parse_args()
    q = args.quick
    out = {}
    t0 = time.perf_counter()

    # ---------------------------------------------------------------- 0. queueing theory
    print("== 0. theory checks (not in the lecture's tables) ==")
    seeds = 4 if q else 16
    model = DispatchModel(n_servers=4, n_requests=40_000, warmup=4_000, ring=8)
    rows = [("random", 0.5, "exp"), ("random", 0.8, "exp"), ("random", 0.8, "det")]
    res = Comparison(model, [(f"{p} rho={rho} {law}", make_params(p, rho, law)) for p, rho, law in rows],
                     seeds, ("mean_response", "p99_response"), seed=0).run()
    print(f"random dispatch, 4 servers, {seeds} seeds x 40000 requests (10% warm-up):")
    theory = []
    for c, (_, rho, law) in enumerate(rows):
        mean, p99 = res.records[c].metrics["mean_response"], res.records[c].metrics["p99_response"]
        if law == "exp":
            t_mean, t_p99 = 1 / (1 - rho), math.log(100) / (1 - rho)
            print(f"  M/M/1 rho={rho}: mean {report.fmt_ci(mean)} (theory {t_mean:.3f}), "
                  f"P99 {report.fmt_ci(p99)} (theory ln(100)/(1-rho) = {t_p99:.3f})")
        else:
            t_mean, t_p99 = 1 + rho / (2 * (1 - rho)), None
            print(f"  M/D/1 rho={rho}: mean {report.fmt_ci(mean)} (Pollaczek-Khinchine {t_mean:.3f})")
        theory.append(dict(rho=rho, service=law, mean=mean.as_json(), theory_mean=t_mean, theory_p99=t_p99))
    levels = 5
    model = DispatchModel(n_servers=100, n_requests=40_000, warmup=8_000, ring=32, max_d=3, tail_levels=levels)
    res = Comparison(model, [(f"d={d}", make_params("pod", 0.9, d=d)) for d in (2, 3)], 2 if q else 4,
                     [f"frac_ge_{i}" for i in range(1, levels + 1)], seed=1).run()
    print("supermarket model, 100 servers, load 0.9: fraction of servers with >= i jobs (ours / large-N theory)")
    for c, d in enumerate((2, 3)):
        cells = []
        for i in range(1, levels + 1):
            got = res.records[c].metrics[f"frac_ge_{i}"].mean
            cells.append(f"i={i}: {got:.3f}/{0.9 ** ((d**i - 1) / (d - 1)):.3f}")
            theory.append(dict(d=d, i=i, ours=got, theory=0.9 ** ((d**i - 1) / (d - 1))))
        print(f"  d={d}: " + "  ".join(cells))
    out["theory"] = theory
    print()

    # ---------------------------------------------------------------- 1. balls into bins
    seeds = 8 if q else 32
    print(f"== 1. balls into bins: n balls into n bins, max load ({seeds} seeds) ==")
    print(f"{'n':>7s} {'d':>2s}  {'ours':>12s}  {'lecture':>7s}  {'Poisson approx':>14s}  {'asymptotic':>10s}")
    rows = []
    for n in (1_000, 10_000, 100_000):
        for r in run_bins(n, [1, 2], seeds).records:
            d = r.params["d"]
            lec = LECTURE_BINS.get((n, d))
            approx = poisson_max_load(n) if d == 1 else float("nan")
            print(f"{n:7d} {d:2d}  {report.fmt_ci(r.metrics['max_load']):>12s}  "
                  f"{'' if lec is None else lec:>7}  {approx:14.2f}  {asymptotic_max_load(n, d):10.2f}")
            rows.append(r.as_json() | {"lecture": lec})
    out["bins"] = rows
    print("note: the lecture's 8.2 at n = 1e5 is one run; single runs range over whole integers (7-9 here), "
          "and the mean is ~7.8, as the Poisson approximation predicts. Growth 1e3 -> 1e5 matches: random "
          "grows by ~2.5, two choices by < 1.\n")

    # ---------------------------------------------------------------- 2. 16 servers, load 0.9
    for law in ("exp", "pareto", "lognormal"):
        # exp: the lecture's run length (50,000 requests), to set its single 11.56 against many runs.
        seeds, requests = (16, 20_000) if q else ((32, 50_000) if law == "exp" else (32, 20_000))
        res = run_dispatch(POLICIES, servers=16, load=0.9, service=law, seeds=seeds, requests=requests)
        recs = res.records
        print(f"== 2. 16 FCFS servers, load 0.9, {law} service, {seeds} seeds x {requests} requests ==")
        by = {r.policy: r for r in recs}
        lecture = {"random": "11.56 (1 run); theory 10"} if law == "exp" else {}
        print(report.format_table(recs, ["mean_response", "p99_response"],
                                  extra={"lecture (mean)": lambda r, lec=lecture: lec.get(r.policy, "")}))
        rnd, rr = by["random"].metrics["mean_response"], by["rr"].metrics["mean_response"]
        if law == "exp":
            per = np.asarray(rnd.per_seed)
            print(f"check: random vs M/M/1 theory 10: {report.fmt_ci(rnd)}; single runs of {requests} requests "
                  f"range {per.min():.2f}-{per.max():.2f} (the lecture's 11.56 is one such run)")
            print(f"check: RR about 2x better than random: random / rr = {rnd.mean / rr.mean:.2f}")
        else:
            diff = paired_difference(res, "mean_response", "random", "rr")
            diff8 = paired_difference(res, "mean_response", "random", "rr", seeds=slice(0, 8))
            print(f"check: RR vs random under heavy tails: random - rr = {report.fmt_ci(diff)} over {seeds} seeds, "
                  f"{report.fmt_ci(diff8)} over the first 8 (the lecture's 8 seeds: 'within noise'); "
                  f"random / rr = {rnd.mean / rr.mean:.2f} (exp: about 2)")
            diff = paired_difference(res, "p99_response", "jsq", "lwl")
            print(f"check: JSQ P99 worse than LWL: jsq - lwl P99 = {report.fmt_ci(diff)}")
            print("note: heavy tails shrink RR's gain over random from ~1.8x to a few per cent; over 8 seeds "
                  "that sits at the edge of the noise (the lecture: 'within noise'), with more seeds it is "
                  "still detectable.")
        print()
        out[f"servers16_{law}"] = [r.as_json() for r in recs]

    # ---------------------------------------------------------------- 3. stale information
    seeds, requests = (8, 10_000) if q else (16, 20_000)
    print(f"== 3. stale board (Mitzenmacher 2000): 16 servers, load 0.9, exp, {seeds} seeds x {requests} "
          "requests; mean response ==")
    table = {}
    for stale in (0.0, 0.5, 1.0, 2.0, 4.0):
        recs = run_dispatch(["random", "jsq", "p2c"], servers=16, load=0.9, service="exp", seeds=seeds,
                            requests=requests, stale=stale).records
        table[stale] = {r.policy: r for r in recs}
        out[f"stale_{stale}"] = [r.as_json() for r in recs]
    print(f"{'T':>4s}  {'random':>12s}  {'jsq':>12s}  {'p2c':>12s}  {'jsq/random':>10s}  {'p2c/p2c(T=0)':>12s}")
    for stale, by in table.items():
        m = {k: v.metrics["mean_response"] for k, v in by.items()}
        print(f"{stale:4.1f}  {report.fmt_ci(m['random']):>12s}  {report.fmt_ci(m['jsq']):>12s}  "
              f"{report.fmt_ci(m['p2c']):>12s}  {m['jsq'].mean / m['random'].mean:10.2f}  "
              f"{m['p2c'].mean / table[0.0]['p2c'].metrics['mean_response'].mean:12.2f}")
    print("lecture: at T = 4 JSQ is already worse than random; P2C barely moves. Ours: JSQ degrades ~10x and "
          "crosses random near T = 2; P2C degrades by about a third. (random ignores the board: its column "
          "only shows seed noise.)")
    print(f"\n(total {time.perf_counter() - t0:.0f} s)")
    if args.out:
        report.write_json(args.out, {"command": "reproduce_lecture_dispatch", "quick": q, "results": out})
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
