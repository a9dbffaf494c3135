"""BalanceRoute in its own deployment (issue 36): 4P1D through the pd pipeline, calibrated on the baselines only.

The paper's topology (`deployment.PD_PAPER`: 4 prefill instances of 16 Ascend 910C dies, one decode tier of
G = 8 DP ranks x TP 4 stepping as DP attention + EP, DeepSeek-V3 W8A8) runs the two datasets' lengths with every
request queued at t = 0, so the prefill tier paces the decode tier. Four free terms are fitted to the paper's
eight baseline numbers per dataset (throughput and TPOT P95 of random, rr, p2c, jsq; `calibrate.fit`, every
evaluation one batched pd run): the prefill tier's seconds per prompt token (it sets the rate requests reach
decode), and the decode step's fixed overhead, seconds per token and seconds per cached KV token read. The
all-to-all is not a separate term: its latency is a fixed cost per step (the same column of the Jacobian as the
overhead, so the two cannot be told apart from these numbers) and its bandwidth part scales with the busiest
rank's tokens (as the per-token term does); both are folded into those two. Throughput and TPOT P95 are the
decode tier's over its loaded phase (until its last request is admitted). The BalanceRoute rows (BR-0, oracle
BR-H, deployed BR-H with the survival and exact-match predictors) are then predicted with those terms, not
refitted, and compared with the paper's: gains against the best baseline (paired per draw), TPOT P95 and imbalance. Concurrency per decode rank, slots in use and the KV share of a step
come out of the runs.

The paper's imbalance unit is not stated in the seed; we compare relative changes of our mean per-step max - min
KV load (tokens) with the relative changes of the paper's imbalance column (the unit cancels if it is any fixed
multiple of ours). ExactMatch matches on the dataset's prompt keys (synthetic-prod's templates; the Azure-2024
lengths have none, so there it falls back to survival, as in the `main` section).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxroute import calibrate, report
from jaxroute.deployment import PD_PAPER, Deployment
from jaxroute.errors import JaxrouteError
from jaxroute.experiments import pd
from jaxroute.experiments.cluster import lengths_workload
from jaxroute.metrics import Summary, summarize
from jaxroute.reproduce.balanceroute import (
    PAPER_MAIN,
    PAPER_NAMES,
    PAPER_SIZES,
    ROW_NAMES,
    SOURCE,
    paper_changes,
)
from jaxroute.reproduce.document import (
    Claim,
    Context,
    Experiment,
    Section,
    fmt,
    gain_verdict,
    holds_verdict,
    markdown_table,
)
from jaxroute.routers import balance

ONE_WORKER = True  # `regime` reads `calibrated`'s part: one worker runs them in order
PREFILL_ROUTER = "rr"  # prompts are private: the prefill router only spreads load
BASELINES = balance.PAPER_BASELINES  # random, rr, p2c, jsq (immediate dispatch)
PREDICTED = ("br0", "brh[oracle]", "brh[survival]", "brh[exact]")
DEPLOYED = ("oracle", "survival", "exact")  # BR-H's predictors, one row each
GAIN_TOLERANCE = 1.3  # as the other BalanceRoute sections
FIT_SIZE = 1000  # requests per dataset in the full run (see `settings`)
OVERHEAD_GUESS = 0.8  # the decode overhead's first guess, as a share of the paper's mean baseline TPOT P95
# The decode tier's loaded phase (until its last request is admitted): the steady state the paper's 8,000- and
# 10,000-request runs mostly are, without our shorter runs' drain of the longest outputs. Per (row, seed).
TPUT, TPOT, IMBALANCE = "throughput_loaded_tok_s", "tpot_p95_loaded_s", "imbalance_loaded_tokens"
RUNNING, SHARE = "running_per_worker_loaded", "kv_share_of_step"
HIGHER_IS_BETTER = {TPUT: True, TPOT: False, IMBALANCE: False}


def settings(quick: bool, seeds: int | None) -> dict:
    if quick:
        return dict(sizes={"synthetic-prod": 40}, fit_seeds=1, seeds=seeds or 2, iterations=0)  # fit: unit tests
    # FIT_SIZE requests, not the paper's 8,000 / 10,000: paced at the paper's ~0.7 req/s, 1,000 requests are
    # ~1,400 simulated seconds of ~90 ms barrier steps, and a fit evaluation (20 rows) takes about a minute on 2
    # CPU cores; the paper's sizes are 8-10x the simulated time and about 7 evaluations per dataset
    return dict(sizes={w: FIT_SIZE for w in PAPER_SIZES}, fit_seeds=1, seeds=seeds or 3, iterations=3)


def targets(workload: str) -> np.ndarray:
    """The paper's baseline rows: throughput (tok/s) of random, rr, p2c, jsq, then their TPOT P95 (s)."""
    paper = PAPER_MAIN[workload]
    return np.array([paper[b][2] for b in BASELINES] + [paper[b][1] / 1000 for b in BASELINES], np.float64)


def free_terms(workload: str, prompt_mean: float, output_mean: float, n_prefill: int) -> list[calibrate.Term]:
    """The four terms with first guesses: the prefill term from the paper's mean baseline throughput (requests/s
    = tok/s / mean output, each prefill instance serving 1 / (token_s x mean prompt) of them); the overhead at
    OVERHEAD_GUESS of the paper's mean baseline TPOT P95 (our roofline step at the paper's concurrency is a
    fraction of it); the per-token and KV terms at zero."""
    paper = targets(workload)
    rate = float(np.mean(paper[: len(BASELINES)])) / output_mean
    prefill_s = n_prefill / (rate * prompt_mean)
    overhead = OVERHEAD_GUESS * float(np.mean(paper[len(BASELINES):]))
    return [calibrate.Term("prefill.token_s", prefill_s, prefill_s),
            calibrate.Term("decode.overhead_s", overhead, 0.01),
            calibrate.Term("decode.token_s", 0.0, 1e-3),
            calibrate.Term("decode.kv_token_s", 0.0, 1e-7)]


def run_rows(workload, rows: list[pd.PDRow], seeds: int, dep: Deployment) -> dict[str, np.ndarray]:
    """The decode tier's metrics [rows, seeds] of every row on the same seeds, all requests at t = 0 (the prefill
    tier paces the decode tier), plus the whole run's output tokens/s."""
    res, raw = pd.run_pd(rows, workload, rate=math.inf, seeds=seeds, dep=dep)
    rec = raw["disaggregated"]
    out = {k: np.asarray(rec[k], np.float64) for k in (TPUT, TPOT, IMBALANCE, RUNNING, SHARE)}
    return out | {"output_tokens_per_s": np.asarray(res.grid.metrics["output_tokens_per_s"], np.float64)}


def run_draws(name: str, n: int, rows: list[pd.PDRow], draws: int, dep: Deployment) -> dict[str, np.ndarray]:
    """`run_rows` on `draws` independent draws of the dataset's lengths (numpy seeds 0, 1, ...; one router seed
    each): metrics [rows, draws], so a CI spans workload draws, not only the routers' coins."""
    loads = [lengths_workload(name, n, seed=d) for d in range(draws)]
    # One compilation for every draw: their static metadata made equal. The union of the draws' (prompt, output,
    # count) shapes bounds each draw's steps (a larger step budget, not a different run); native_rate only
    # rescales arrivals, and every request arrives at t = 0 here (rate inf).
    shapes = tuple(sorted({x for wl in loads for x in wl.request_shapes}))
    loads = [dataclasses.replace(wl, request_shapes=shapes, native_rate=1.0) for wl in loads]
    runs = [run_rows(wl, rows, 1, dep) for wl in loads]
    return {k: np.concatenate([r[k] for r in runs], axis=1) for k in runs[0]}


TRAIN_SEED = 1000  # numpy seed of the lengths deployed predictors are fitted on (no simulated draw uses it)


def _rows(policies, terms: tuple, dep: Deployment) -> list[pd.PDRow]:
    p, d = dep.ratio
    return [pd.PDRow(PREFILL_ROUTER, b, p, d, cost_terms=terms) for b in policies]


def evaluator(workload, names: list[str], seeds: int, dep: Deployment, log):
    """points [K, T] -> [K, 8]: the baselines' throughput and TPOT P95 under each point (one pd grid)."""
    def evaluate(points: np.ndarray) -> np.ndarray:
        rows = [r for p in points for r in _rows(BASELINES, tuple(zip(names, map(float, p), strict=True)), dep)]
        m = run_rows(workload, rows, seeds, dep)
        tput = m[TPUT].mean(axis=1).reshape(len(points), len(BASELINES))
        tpot = m[TPOT].mean(axis=1).reshape(len(points), len(BASELINES))
        log(f"    evaluated {len(points)} points ({len(rows)} rows)")
        return np.concatenate([tput, tpot], axis=1)

    return evaluate


def paired_change(grid_metrics: dict, metric: str, row: int, base: int) -> Summary:
    """Per-seed % change of `row` against `base` on `metric`, summarised with its 95 % CI."""
    x = np.asarray(grid_metrics[metric], np.float64)
    return summarize(100 * (x[row] / np.maximum(x[base], 1e-30) - 1))


def best_baseline(grid_metrics: dict, labels: list[str], metric: str) -> int:
    means = np.asarray(grid_metrics[metric], np.float64).mean(axis=1)
    idx = [labels.index(b) for b in BASELINES]
    pick = max if HIGHER_IS_BETTER[metric] else min
    return pick(idx, key=lambda i: means[i])


def predict(name: str, fitted: tuple, s: dict, dep: Deployment, ctx: Context) -> tuple[dict, list[str]]:
    """Baselines, BR-0 and BR-H with each of DEPLOYED in one grid with the fitted terms, on `seeds` draws of the
    dataset (the deployed tables fitted on another draw): ({metric: [rows, draws]}, labels)."""
    n = s["sizes"][name]
    bank, kinds = pd.predictor_banks(DEPLOYED, pd.train_lengths(name, n, seed=TRAIN_SEED))
    rows = _rows((*BASELINES, "br0"), fitted, dep) + [dataclasses.replace(r, predictor=k) for k in kinds
                                                      for r in _rows(("brh",), fitted, dep)]
    m = run_draws(name, n, rows, s["seeds"], dataclasses.replace(dep, bank=bank))
    ctx.advance(f"{name}: predicted")
    return m, [*BASELINES, *PREDICTED]


def _claims(name: str, m: dict, labels: list[str], dep: Deployment) -> tuple[list[Claim], list[list[str]]]:
    claims, table = [], []
    paper = PAPER_MAIN[name]
    where = "write-up §10 (main table)"
    b_tput = best_baseline(m, labels, TPUT)
    for lab in labels:
        i = labels.index(lab)
        mean = lambda k: float(np.mean(m[k][i]))  # noqa: B023
        row = [lab, f"{paper[lab][2]:,}", f"{mean(TPUT):,.0f}", f"{mean('output_tokens_per_s'):,.0f}",
               f"{paper[lab][1]:.1f}", f"{1000 * mean(TPOT):.1f}", f"{paper[lab][0]:,}", f"{mean(IMBALANCE):,.0f}",
               f"{mean(RUNNING):.1f}", f"{mean(RUNNING) / dep.slots:.0%}", f"{mean(SHARE):.0%}"]
        table.append(row)
        if lab in BASELINES:
            continue
        for metric, col, what in ((TPUT, 0, "throughput"), (TPOT, 1, "TPOT P95"), (IMBALANCE, 2, "imbalance")):
            base = best_baseline(m, labels, metric) if metric != TPUT else b_tput
            ours = paired_change(m, metric, i, base)
            pc = paper_changes(name)[lab][col]
            verdict, reason = gain_verdict(ours, pc, GAIN_TOLERANCE)
            if verdict != "reproduced" and metric == TPUT:
                reason += (f"; decode runs {mean(RUNNING):.1f} requests per rank "
                           f"({mean(RUNNING) / dep.slots:.0%} of slots) and {mean(SHARE):.0%} of its "
                           "step scales with KV in this calibrated run")
            claims.append(Claim(f"{ROW_NAMES[lab]}: {what} change against the best baseline, {PAPER_NAMES[name]}, "
                                "calibrated 4P1D (predicted, not fitted)", where, f"{pc:+.1f} %",
                                fmt(ours, "% vs best baseline"), verdict, reason, ours.as_json()))
    # the horizon: oracle BR-H's throughput gain minus BR-0's, paired per seed
    o, z = labels.index("brh[oracle]"), labels.index("br0")
    x = m[TPUT]
    diff = summarize(100 * (x[o] - x[z]) / x[b_tput])
    pd_diff = paper_changes(name)["brh[oracle]"][0] - paper_changes(name)["br0"][0]
    claims.append(Claim(f"the horizon pays: oracle BR-H's throughput gain minus BR-0's, {PAPER_NAMES[name]}, "
                        "calibrated 4P1D", "write-up §10", f"{pd_diff:+.1f} points", fmt(diff, "points"),
                        *gain_verdict(diff, pd_diff, GAIN_TOLERANCE), diff.as_json()))
    return claims, table


def calibrated(ctx: Context) -> Section:
    s = settings(ctx.quick, ctx.seeds)
    dep = PD_PAPER
    claims, tables, data, intro = [], [], {}, []
    for name, n in s["sizes"].items():
        workload = lengths_workload(name, n)
        prompt = np.asarray(workload.table.prompt_tok, np.float64)
        out = np.asarray(workload.table.out_tok, np.float64)
        terms = free_terms(name, float(prompt.mean()), float(out.mean()), dep.ratio[0])
        names = [t.name for t in terms]
        ctx.log(f"{name}: fitting {', '.join(names)} to the paper's 8 baseline numbers ({n:,} requests)")
        f = calibrate.fit(evaluator(workload, names, s["fit_seeds"], dep, ctx.log), terms, targets(name),
                          iterations=s["iterations"], log=ctx.log)
        ctx.advance(f"{name}: fitted")
        fitted = tuple(zip(names, map(float, f.values), strict=True))
        m, labels = predict(name, fitted, s, dep, ctx)
        c, table = _claims(name, m, labels, dep)
        claims += c
        tables.append((f"{name} ({PAPER_NAMES[name]}): the fitted terms (± 1.96 sigma, linearised; condition number "
                       f"of J^T J {f.condition:.3g})",
                       markdown_table(["term", "fitted", "± 95 %"],
                                      [[t, f"{v:.4g}", f"{1.96 * e:.3g}"] for t, v, e in zip(names, f.values, f.std,
                                                                                            strict=True)])))
        fit_rows = [[f"{b} {what}", f"{tg:.4g}", f"{pr:.4g}", f"{100 * r:+.1f} %"]
                    for (b, what), tg, pr, r in zip([(b, "tok/s") for b in BASELINES] + [(b, "TPOT P95 s")
                                                                                         for b in BASELINES],
                                                    f.targets, f.predicted, f.residuals, strict=True)]
        tables.append((f"{name}: the eight fitted numbers (RMS residual {100 * f.rms_residual():.1f} %)",
                       markdown_table(["baseline number", "paper", "fitted model", "residual"], fit_rows)))
        tables.append((f"{name}: every row with the fitted terms ({s['seeds']} draws of the dataset; BalanceRoute rows "
                       "predicted)",
                       markdown_table(["row", "paper tok/s", "ours loaded tok/s", "ours whole-run tok/s",
                                       "paper TPOT P95 ms", "ours loaded TPOT P95 ms", "paper imbalance",
                                       "ours loaded imbalance (tok)", "running per rank (loaded)", "slots in use",
                                       "KV share of a step"], table)))
        intro.append(f"**{name}**: {n:,} requests (mean prompt {prompt.mean():,.0f}, output {out.mean():,.0f}); "
                     f"fit RMS residual {100 * f.rms_residual():.1f} % after {f.evaluations} batched runs")
        data[name] = {"fit": f.as_json(), "labels": labels,
                      "metrics": {k: v.tolist() for k, v in m.items()}}
    return Section(
        SOURCE, "calibrated", "BalanceRoute in 4P1D: the step calibrated on the baselines, the BalanceRoute rows "
        "predicted",
        intro=(f"`deployment.PD_PAPER` ({dep.ratio[0]} prefill instances of {dep.prefill_group_tp} x {dep.gpu}, "
               f"{dep.ratio[1]} decode DP ranks of {dep.tp} x {dep.gpu} as DP attention + EP, {dep.model}), every "
               "request at t = 0 so the prefill tier paces decode; prefill router rr. Four terms fitted "
               "(Levenberg-Marquardt, `jaxroute/calibrate.py`) to the paper's baseline throughput and TPOT P95 only, "
               "both measured over the decode tier's loaded phase (until its last request is admitted: the steady "
               f"state; our {FIT_SIZE:,}-request runs would otherwise be dominated by the drain of the longest "
               "outputs, which the paper's 8,000 / 10,000 are not); the BalanceRoute rows use them unchanged and "
               "are compared on the same loaded-phase metrics. The fit runs on draw 0 of each dataset's lengths; "
               f"the predictions on {s['seeds']} draws (0 included; numpy seeds 0, 1, ...), so their CIs span "
               "workload draws. " + "; ".join(intro) + "."),
        claims=claims, tables=tables, data={"settings": s, **data}, seeds=s["seeds"])


EXPERIMENTS = [Experiment(SOURCE, "calibrated", "4P1D calibrated on the baselines", calibrated,
                          lambda q: 2 * len(settings(q, None)["sizes"]))]


# --------------------------------------------------------------------------- the regime map

REGIME_GAMMAS = (0.9, 0.95, 0.99, 1.0)
REGIME_KV_S = (0.0, 8e-7)  # decode.kv_token_s levels besides the calibrated one (s per cached token read)


def regime_settings(quick: bool, seeds: int | None) -> dict:
    if quick:
        return dict(requests=16, slots=(4,), kv=(0.0,), gammas=(0.9, 1.0), seeds=seeds or 2)
    return dict(requests=REGIME_SIZE, slots=(8, 16, 48), kv=REGIME_KV_S, gammas=REGIME_GAMMAS, seeds=seeds or 2)


# requests per cell (synthetic-prod, G = 8): over 3x the most slots (8 x 48), so that saturated arrivals keep a
# loaded phase (requests waiting for a slot) to measure
REGIME_SIZE = 1200


def calibrated_terms(ctx: Context) -> dict[str, float]:
    """synthetic-prod's fitted terms from this run's `calibrated` part (it runs first)."""
    from jaxroute.reproduce.document import load_part

    part = load_part(ctx.out_dir, SOURCE, "calibrated", ctx.quick)
    if part is None or "synthetic-prod" not in part.data:
        raise JaxrouteError("the regime map starts from the calibrated terms: run the 'calibrated' experiment first "
                            "(jaxroute reproduce balanceroute --only calibrated,regime)")
    return {k: v["value"] for k, v in part.data["synthetic-prod"]["fit"]["terms"].items()}


def regime(ctx: Context) -> Section:
    s = regime_settings(ctx.quick, ctx.seeds)
    cal = calibrated_terms(ctx)
    kv_levels = sorted({*s["kv"], cal["decode.kv_token_s"]})
    p, d = PD_PAPER.ratio
    arrivals = {"paced (calibrated prefill)": cal["prefill.token_s"], "saturated (roofline prefill)": 0.0}
    policies = [("br0", 1.0)] + [("brh", g) for g in s["gammas"]]  # BR-0 ignores gamma
    cells, row_labels, data = {}, [], []
    for slots in s["slots"]:
        dep = dataclasses.replace(PD_PAPER, slots=slots)
        rows, keys = [], []
        for arrival, prefill_s in arrivals.items():
            for kv in kv_levels:
                terms = (("prefill.token_s", prefill_s), ("decode.overhead_s", cal["decode.overhead_s"]),
                         ("decode.token_s", cal["decode.token_s"]), ("decode.kv_token_s", kv))
                for pol, g in policies:
                    rows.append(pd.PDRow(PREFILL_ROUTER, pol, p, d, cost_terms=terms, gamma=g))
                    keys.append((arrival, kv, pol, g))
        m = run_draws("synthetic-prod", s["requests"], rows, s["seeds"], dep)
        ctx.advance(f"{slots} slots per rank")
        loaded, running, share = m[TPUT], m[RUNNING], m[SHARE]  # [rows, draws]
        for arrival in arrivals:
            label = f"{arrival}, {slots} slots"
            row_labels.append(label)
            for kv in kv_levels:
                z = keys.index((arrival, kv, "br0", 1.0))
                for g in s["gammas"]:
                    h = keys.index((arrival, kv, "brh", g))
                    diff = summarize(100 * (loaded[h] - loaded[z]) / loaded[z])
                    cells[(label, kv, g)] = (diff, float(running[z].mean()), float(share[z].mean()))
                    data.append({"arrival": arrival, "slots": slots, "kv_token_s": kv, "gamma": g,
                                 "brh_minus_br0_loaded_pct": diff.as_json(),
                                 "running_per_rank_loaded": float(running[z].mean()),
                                 "kv_share": float(share[z].mean())})
    col_labels = [f"kv {kv:.2g} s/tok" + (" (calibrated)" if kv == cal["decode.kv_token_s"] else "")
                  for kv in kv_levels]
    panels = {}
    for g in s["gammas"]:
        vals = np.array([[cells[(r, kv, g)][0].mean for kv in kv_levels] for r in row_labels])
        text = [[f"{cells[(r, kv, g)][0].mean:+.1f}±{cells[(r, kv, g)][0].half_width:.1f}\n"
                 f"{cells[(r, kv, g)][1]:.0f}/rank, KV {cells[(r, kv, g)][2]:.0%}" for kv in kv_levels] for r in row_labels]
        panels[f"gamma = {g:g}"] = (vals, text)
    paper_row = row_labels.index(f"paced (calibrated prefill), {max(s['slots'])} slots")
    paper_col = kv_levels.index(cal["decode.kv_token_s"])
    path, file = ctx.figure(SOURCE, "regime")
    report.heatmap(panels, path, row_labels=row_labels, col_labels=col_labels, xlabel="KV term (share of a step "
                   "in each cell)", ylabel="arrivals, slots per rank", cbar_label="oracle BR-H - BR-0, loaded tput (%)",
                   title="when the horizon pays: oracle BR-H minus BR-0 (loaded-phase throughput, % of BR-0, 95 % CI)",
                   marked=(paper_row, paper_col))
    table = [[r, f"{kv:.2g}", f"{g:g}", f"{c[0].mean:+.2f} ± {c[0].half_width:.2f} %", f"{c[1]:.1f}", f"{c[2]:.0%}"]
             for (r, kv, g), c in cells.items()]
    here = cells[(row_labels[paper_row], cal["decode.kv_token_s"], 0.99 if 0.99 in s["gammas"] else s["gammas"][-1])]
    paper_horizon = paper_changes("synthetic-prod")["brh[oracle]"][0] - paper_changes("synthetic-prod")["br0"][0]
    by_kv = {kv: float(np.mean([c[0].mean for (_, k, _), c in cells.items() if k == kv])) for kv in kv_levels}
    lo_kv, hi_kv = kv_levels[0], kv_levels[-1]
    claims = [
        Claim("the horizon pays in the paper's setting: oracle BR-H's throughput over BR-0's (Proprietary Data; our "
              "calibrated cell, gamma 0.99)", "write-up §10 (main table)", f"{paper_horizon:+.1f} points",
              fmt(here[0], "% of BR-0"), *gain_verdict(here[0], paper_horizon, GAIN_TOLERANCE), here[0].as_json()),
        Claim("BalanceRoute suits deployments whose decode step is dominated by the KV workload: the horizon's gain "
              "grows with the KV share of the step", "write-up §15",
              "more where KV dominates", f"mean over cells {by_kv[hi_kv]:+.2f} % at KV term {hi_kv:.2g} s/token vs "
              f"{by_kv[lo_kv]:+.2f} % at {lo_kv:.2g}",
              *holds_verdict(len(kv_levels) > 1 and by_kv[hi_kv] > by_kv[lo_kv],
                             "the KV-heavy cells gain no more than the light ones" if len(kv_levels) > 1
                             else "one KV level only (quick run)")),
    ]
    return Section(
        SOURCE, "regime", "BalanceRoute: the regime map (when the horizon pays)",
        intro=(f"synthetic-prod, {s['requests']:,} requests per cell, G = 8, {s['seeds']} draws of the lengths (CIs "
               "over draws), the 4P1D pipeline with the calibrated decode overhead and per-token terms; one compiled "
               "pd grid per slot count (the draws share it) "
               f"({', '.join(map(str, s['slots']))}). Cells: oracle BR-H minus BR-0 in loaded-phase throughput "
               "(paired per draw, % of BR-0) over arrivals (paced by the calibrated prefill tier, or saturated by "
               "the roofline's), slots per rank (the concurrency cap) and the KV term (its measured share of a "
               "step in each cell), per gamma. The outlined cell is the paper's calibrated setting "
               f"(paced, {max(s['slots'])} slots, calibrated KV term): {here[0].mean:+.2f} ± {here[0].half_width:.2f} % "
               f"at {here[1]:.1f} requests per rank and a KV share of {here[2]:.0%} (gamma 0.99)."),
        claims=claims,
        tables=[("every cell", markdown_table(["arrivals, slots", "kv s/token", "gamma", "BR-H - BR-0 (loaded)",
                                               "running per rank (BR-0)", "KV share (BR-0)"], table))],
        figures=[("oracle BR-H minus BR-0 by regime; the outlined cell is the paper's calibrated setting", file)],
        data={"settings": s, "calibrated_terms": cal, "cells": data}, seeds=s["seeds"])


EXPERIMENTS.append(Experiment(SOURCE, "regime", "the regime map", regime,
                              lambda q: len(regime_settings(q, None)["slots"])))
