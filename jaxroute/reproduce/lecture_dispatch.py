"""The lecture's §1 (code 01): queueing theory, balls into bins, five policies on 16 servers, stale information.

Where the lecture prints a number it stands beside ours; its demo-2 and demo-3 tables are not in our copy of
the text, so for those its stated claims are checked. Every cell is a mean with a 95 % CI over seeds; all
policies of a table run in one compiled grid.
"""

from __future__ import annotations

import math

import numpy as np

from jaxroute import report
from jaxroute.clusters.queueing import DispatchModel, make_params
from jaxroute.experiments import Comparison, paired_difference
from jaxroute.experiments.bins import asymptotic_max_load, run_bins
from jaxroute.experiments.dispatch import run_dispatch
from jaxroute.metrics import summarize
from jaxroute.reproduce.document import (
    Claim,
    Context,
    Experiment,
    Section,
    fmt,
    gain_verdict,
    holds_verdict,
    markdown_table,
    records_table,
    value_verdict,
)

SOURCE = "lecture"
POLICIES = ["random", "rr", "jsq", "p2c", "lwl"]
LECTURE_BINS = {(1_000, 1): 5.4, (1_000, 2): 3.0, (100_000, 1): 8.2, (100_000, 2): 3.4}  # §1.2, exercise 1
STALE_T = (0.0, 0.5, 1.0, 2.0, 4.0)


def _claim(claim, where, source, ours_summary, verdict_reason, unit="") -> Claim:
    verdict, reason = verdict_reason
    return Claim(claim, where, source, fmt(ours_summary, unit), verdict, reason, ours_summary.as_json())


def _ratio(a, b):
    """Per-seed ratio a / b of two Summaries on common seeds, summarised."""
    return summarize(np.asarray(a.per_seed) / np.asarray(b.per_seed))


def theory(ctx: Context) -> Section:
    seeds = ctx.seeds or (4 if ctx.quick else 16)
    n_req = 20_000 if ctx.quick else 40_000
    model = DispatchModel(n_servers=4, n_requests=n_req, warmup=n_req // 10, ring=8)
    rows = [("random", 0.5, "exp"), ("random", 0.8, "exp"), ("random", 0.8, "det")]
    res = Comparison(model, [(f"{p} rho={rho} {law}", make_params(p, rho, law)) for p, rho, law in rows],
                     seeds, ("mean_response", "p99_response"), seed=0).run()
    ctx.advance("M/M/1, M/D/1")
    claims, table = [], []
    for c, (_, rho, law) in enumerate(rows):
        mean = res.records[c].metrics["mean_response"]
        if law == "exp":
            t_mean = 1 / (1 - rho)
            claims.append(_claim(f"random dispatch is M/M/1 per server: mean response 1/(1-rho), rho={rho}",
                                 "§1.2 point 1", f"{t_mean:.3f}", mean, value_verdict(mean, t_mean, 0.05), "service times"))
            p99 = res.records[c].metrics["p99_response"]
            table.append([f"M/M/1 rho={rho}", fmt(mean), f"{t_mean:.3f}", fmt(p99), f"{math.log(100) / (1 - rho):.3f}"])
        else:
            t_mean = 1 + rho / (2 * (1 - rho))
            claims.append(_claim(f"M/D/1 (deterministic service), rho={rho}: Pollaczek-Khinchine mean",
                                 "queueing theory (not in the lecture's tables)", f"{t_mean:.3f}", mean,
                                 value_verdict(mean, t_mean, 0.05), "service times"))
            table.append([f"M/D/1 rho={rho}", fmt(mean), f"{t_mean:.3f}", "", ""])
    levels = 5
    model = DispatchModel(n_servers=100, n_requests=n_req, warmup=n_req // 5, ring=32, max_d=3, tail_levels=levels)
    sm = Comparison(model, [(f"d={d}", make_params("pod", 0.9, d=d)) for d in (2, 3)], 2 if ctx.quick else 4,
                    [f"frac_ge_{i}" for i in range(1, levels + 1)], seed=1).run()
    ctx.advance("supermarket")
    tail_rows, curves = [], {}
    for c, d in enumerate((2, 3)):
        got = [sm.records[c].metrics[f"frac_ge_{i}"] for i in range(1, levels + 1)]
        want = [0.9 ** ((d**i - 1) / (d - 1)) for i in range(1, levels + 1)]
        tail_rows += [[f"d={d}", i + 1, fmt(g), f"{w:.4f}"] for i, (g, w) in enumerate(zip(got, want, strict=True))]
        curves[d] = (got, want)
        worst = max(abs(g.mean - w) for g, w in zip(got, want, strict=True))
        claims.append(Claim(f"supermarket model, d={d}, load 0.9: fraction of servers with >= i jobs is "
                            "rho^((d^i-1)/(d-1))", "§1.2 (Mitzenmacher; DESIGN reference facts)",
                            " / ".join(f"{w:.3f}" for w in want[:3]) + " (i=1..3)",
                            " / ".join(f"{g.mean:.3f}" for g in got[:3]) + f"; max |diff| {worst:.3f} over i=1..{levels}",
                            *holds_verdict(worst <= 0.03, f"100 servers is not the large-N limit: max |diff| {worst:.3f}")))
    fig, file = ctx.figure(SOURCE, "supermarket")
    report.line_plot({"power-of-d, 100 servers, load 0.9": [
        line for d, (got, want) in curves.items() for line in (
            dict(x=list(range(1, levels + 1)), y=[max(g.mean, 1e-6) for g in got], marker="o", label=f"ours d={d}"),
            dict(x=list(range(1, levels + 1)), y=want, ls="--", label=f"large-N theory d={d}"))]},
        fig, xlabel="queue length i (jobs)", ylabel="fraction of servers with >= i jobs",
        ylog=("power-of-d, 100 servers, load 0.9",))
    return Section(SOURCE, "theory", "Lecture §1: queueing theory checks (M/M/1, M/D/1, supermarket model)",
                   intro=f"Random dispatch on 4 servers, {seeds} seeds x {n_req:,} requests (10 % warm-up); "
                         "power-of-d on 100 servers at load 0.9. Times are in mean service times.",
                   claims=claims,
                   tables=[("random dispatch against theory (service times)",
                            markdown_table(["case", "mean (ours)", "mean (theory)", "P99 (ours)", "P99 (theory ln(100)/(1-rho))"], table)),
                           ("supermarket model: fraction of servers with >= i jobs",
                            markdown_table(["d", "i", "ours", "large-N theory"], tail_rows))],
                   figures=[("power-of-d queue-length tail against the large-N theory (log scale)", file)],
                   data={"mm1": [r.as_json() for r in res.records], "supermarket": [r.as_json() for r in sm.records]},
                   seeds=seeds)


def poisson_max_load(n: int) -> float:
    """E[max load] for random placement, with bin loads approximated as iid Poisson(1)."""
    tail = lambda k: 1 - sum(math.exp(-1) / math.factorial(j) for j in range(k))
    return sum(1 - (1 - tail(k)) ** n for k in range(1, 30))


def bins(ctx: Context) -> Section:
    seeds = ctx.seeds or (8 if ctx.quick else 32)
    ns = (1_000, 10_000, 100_000)
    table, claims, recs, by = [], [], [], {}
    for n in ns:
        for r in run_bins(n, [1, 2], seeds).records:
            d = r.params["d"]
            by[(n, d)] = r.metrics["max_load"]
            lec = LECTURE_BINS.get((n, d))
            table.append([f"{n:,}", d, fmt(r.metrics["max_load"]), "" if lec is None else lec,
                          f"{poisson_max_load(n):.2f}" if d == 1 else "", f"{asymptotic_max_load(n, d):.2f}"])
            recs.append(r.as_json() | {"lecture": lec})
            if lec is not None:
                claims.append(_claim(f"max load, n = {n:,} balls into n bins, d = {d}", "§1.2 code 01 demo 1, exercise 1",
                                     f"{lec} (one run)", r.metrics["max_load"], value_verdict(r.metrics["max_load"], lec, 0.1),
                                     "balls"))
        ctx.advance(f"n={n}")
    grow = {d: summarize(np.asarray(by[(100_000, d)].per_seed) - np.asarray(by[(1_000, d)].per_seed)) for d in (1, 2)}
    claims.append(_claim("growth from n = 1e3 to 1e5: random 5.4 -> 8.2, two choices only 3.0 -> 3.4", "exercise 1 (b)",
                         "+2.8 (d=1), +0.4 (d=2)", grow[1], gain_verdict(grow[1], 2.8), "balls (d=1)"))
    claims.append(Claim("two choices grow by under 1 ball over the same range", "exercise 1 (b)", "+0.4",
                        fmt(grow[2], "balls (d=2)"), *holds_verdict(grow[2].hi < 1.0, "two choices grow by a ball or more"),
                        grow[2].as_json()))
    for c in claims[:4]:
        if c.verdict == "differs" and "d = 1" in c.claim:
            c.reason += "; the lecture's number is one run, and single runs range over whole integers (see per-seed)"
    fig, file = ctx.figure(SOURCE, "bins")
    report.line_plot({"balls into bins, max load": [
        dict(x=list(ns), y=[by[(n, d)].mean for n in ns], lo=[by[(n, d)].lo for n in ns], hi=[by[(n, d)].hi for n in ns],
             marker="o", label=f"ours d={d}") for d in (1, 2)] + [
        dict(x=[1_000, 100_000], y=[LECTURE_BINS[(1_000, d)], LECTURE_BINS[(100_000, d)]], ls="none", marker="x",
             ms=9, label=f"lecture d={d}") for d in (1, 2)]},
        fig, xlabel="n (balls = bins)", ylabel="max load (balls)", xlog=True)
    return Section(SOURCE, "bins", "Lecture §1.2: balls into bins",
                   intro=f"n balls into n bins, random (d=1) and two choices (d=2), {seeds} seeds per n.",
                   claims=claims,
                   tables=[("max load (mean ± 95 % CI)", markdown_table(
                       ["n", "d", "ours", "lecture (one run)", "Poisson approx.", "asymptotic"], table))],
                   figures=[("max load against n, ours with 95 % CI bands beside the lecture's single runs", file)],
                   data={"bins": recs}, seeds=seeds)


def servers16(ctx: Context) -> Section:
    claims, tables, data = [], [], {}
    seeds = ctx.seeds or (8 if ctx.quick else 32)
    for law in ("exp", "pareto", "lognormal"):
        requests = 10_000 if ctx.quick else (50_000 if law == "exp" else 20_000)
        res = run_dispatch(POLICIES, servers=16, load=0.9, service=law, seeds=seeds, requests=requests)
        ctx.advance(law)
        by = {r.policy: r for r in res.records}
        rnd, rr = by["random"].metrics["mean_response"], by["rr"].metrics["mean_response"]
        tables.append((f"16 FCFS servers, load 0.9, {law} service, {seeds} seeds x {requests:,} requests (service times)",
                       records_table(res.records, ["mean_response", "p99_response"])))
        data[law] = [r.as_json() for r in res.records]
        ratio = _ratio(rnd, rr)
        if law == "exp":
            claims.append(_claim("random dispatch at load 0.9: about 10 service times (M/M/1); the lecture's run gave 11.56",
                                 "§1.2 point 1, exercise 2", "10 (theory); 11.56 (one run)", rnd,
                                 value_verdict(rnd, 10.0, 0.1), "service times"))
            claims.append(_claim("round robin is about 2x better than random under exponential service",
                                 "§1.2 point 2", "2x", ratio, value_verdict(ratio, 2.0, 0.2), "x (random / rr)"))
            jsq = by["jsq"].metrics["mean_response"]
            claims.append(Claim("JSQ pools the servers into one shared queue: almost no queueing",
                                "§1.2 point 1", "~1 service time", fmt(jsq, "service times"),
                                *holds_verdict(jsq.mean < 1.5, "JSQ's mean is 1.5 service times or more"), jsq.as_json()))
        else:
            diff = paired_difference(res, "mean_response", "random", "rr", relative=True)
            claims.append(Claim(f"heavy tails ({law}): round robin's gain over random shrinks to within noise (8 seeds)",
                                "§1.2 point 2", "within noise", fmt(diff, "% (random vs rr)"),
                                *holds_verdict(abs(diff.mean) < 25, f"random is {diff.mean:.0f} % slower than rr"),
                                diff.as_json()))
            p99 = paired_difference(res, "p99_response", "jsq", "lwl", relative=True)
            claims.append(_claim(f"heavy tails ({law}): JSQ's P99 is clearly worse than least work left's",
                                 "§1.2 point 3", "worse (no number)", p99, gain_verdict(p99, None), "% (jsq vs lwl P99)"))
    return Section(SOURCE, "servers16", "Lecture §1.2: five policies on 16 FCFS servers at load 0.9",
                   intro="random, rr, jsq, p2c, lwl in one compiled grid per service law. Heavy tails: Pareto and "
                         "log-normal service with mean 1.",
                   claims=claims, tables=tables, data=data, seeds=seeds)


def stale(ctx: Context) -> Section:
    seeds, requests = (ctx.seeds or 8, 10_000) if ctx.quick else (ctx.seeds or 16, 20_000)
    table = {}
    for t in STALE_T:
        recs = run_dispatch(["random", "jsq", "p2c"], servers=16, load=0.9, service="exp", seeds=seeds,
                            requests=requests, stale=t).records
        table[t] = {r.policy: r.metrics["mean_response"] for r in recs}
        ctx.advance(f"T={t}")
    rows = [[t, fmt(m["random"]), fmt(m["jsq"]), fmt(m["p2c"]), f"{m['jsq'].mean / m['random'].mean:.2f}",
             f"{m['p2c'].mean / table[0.0]['p2c'].mean:.2f}"] for t, m in table.items()]
    last = table[STALE_T[-1]]
    worse = summarize(np.asarray(last["jsq"].per_seed) - np.asarray(last["random"].per_seed))
    p2c_move = _ratio(last["p2c"], table[0.0]["p2c"])
    claims = [
        _claim("with the board refreshed every 4 service times, JSQ is already worse than random (herding)",
               "§1.3", "jsq > random at T = 4", worse, gain_verdict(worse, None), "service times (jsq - random, T=4)"),
        Claim("power-of-two barely moves with stale information", "§1.3", "barely moves",
              fmt(p2c_move, "x (p2c at T=4 / T=0)"),
              *(("reproduced", "") if p2c_move.mean < 1.25 else
                ("direction only", f"p2c degrades {p2c_move.mean:.2f}x, far less than JSQ's "
                                   f"{last['jsq'].mean / table[0.0]['jsq'].mean:.1f}x, but not 'barely'")),
              p2c_move.as_json()),
    ]
    fig, file = ctx.figure(SOURCE, "stale")
    report.line_plot({"16 servers, load 0.9, exponential service": [
        dict(x=list(STALE_T), y=[table[t][p].mean for t in STALE_T], lo=[table[t][p].lo for t in STALE_T],
             hi=[table[t][p].hi for t in STALE_T], marker="o", label=p) for p in ("random", "jsq", "p2c")]},
        fig, xlabel="board refresh interval T (service times)", ylabel="mean response (service times, log)",
        ylog=("16 servers, load 0.9, exponential service",))
    return Section(SOURCE, "stale", "Lecture §1.3: stale load information and herding",
                   intro=f"A queue-length board refreshed every T service times (Mitzenmacher 2000); {seeds} seeds x "
                         f"{requests:,} requests. random ignores the board, so its column shows only seed noise.",
                   claims=claims,
                   tables=[("mean response (service times)", markdown_table(
                       ["T", "random", "jsq", "p2c", "jsq / random", "p2c / p2c(T=0)"], rows))],
                   figures=[("mean response against the refresh interval, 95 % CI bands", file)],
                   data={str(t): {p: s.as_json() for p, s in m.items()} for t, m in table.items()}, seeds=seeds)


EXPERIMENTS = [
    Experiment(SOURCE, "theory", "queueing theory checks", theory, lambda q: 2),
    Experiment(SOURCE, "bins", "balls into bins", bins, lambda q: 3),
    Experiment(SOURCE, "servers16", "five policies on 16 servers", servers16, lambda q: 3),
    Experiment(SOURCE, "stale", "stale information", stale, lambda q: len(STALE_T)),
]
