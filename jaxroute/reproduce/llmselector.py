"""The lecture's §4 LLMSelector items (code 04 demos 1-4, exercises 6(b) and 7) in jaxroute's toy world.

- constructed_case (04.1): the constructed five-model case: 5x5 train table, C+C a local optimum, greedy vs
  LLMSelector from C+C (q = 1 and 0.8), failures over all 25 starts
- random_pools (04.2): random pools of 5 models, three systems: mixing vs best single, greedy vs LLMSelector,
  random search on the same budget
- noisy_diagnoser (04.3): debate with a noisy diagnoser, q = 1.0 ... 0.6: budget and accuracy
- monotonicity (04.4): monotonicity violations: self-critique blind spot (self-refine) and answer diversity
  (debate), from exhaustive search on every pool
- cost (exercise 7): prices A 5, B 3, C 1, D 0.5, E 0.2; a lambda-penalised LLMSelector and a downgrade pass,
  each swept in one compilation, beside the exact train-set Pareto frontier

The lecture's numbers come from its own toy world (numpy, one draw), not this one: most verdicts compare the
shape (who wins, signs, rough sizes), not digits. Every optimizer run is one compiled call over configs x seeds x
pools; a pool is one draw of questions (constructed case) or of models and questions (random pools), and every CI
is over pools (the optimizer seeds of a pool averaged first).
"""

from __future__ import annotations

from collections import Counter

import jax
import numpy as np

from jaxroute import output_paths, report, sim
from jaxroute.metrics import Summary, summarize
from jaxroute.reproduce.document import (
    Claim,
    Context,
    Experiment,
    Section,
    fmt,
    gain_verdict,
    holds_verdict,
    markdown_table,
    value_verdict,
)
from jaxroute.selector import optimizers as opt
from jaxroute.selector import world as wl
from jaxroute.selector.systems import Debate, LocateSolve, SelfRefine

SOURCE = "llmselector"
A, B, C = 0, 1, 2
ROOT_SEED = 0
MAX_ROUNDS = 400  # round cap of llmselector / greedy
POOLS, QUICK_POOLS = 10, 4  # pools (random) / question draws (constructed case)
SEEDS = 2  # optimizer seeds per pool (quick too: a CI needs two)
DIAGNOSER_Q = (1.0, 0.9, 0.8, 0.7, 0.6)
LAMBDAS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 3.0)
TOLERANCES = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)


# --------------------------------------------------------------------------- shared helpers


def _sizes(ctx: Context) -> tuple[int, int]:
    return (QUICK_POOLS if ctx.quick else POOLS), (ctx.seeds or SEEDS)


def _pools(x) -> Summary:
    """Mean and 95 % CI over pools of x: [S, P] (seeds averaged within a pool) or [P]."""
    x = np.asarray(x, np.float64)
    return summarize(x.T if x.ndim == 2 else x)


def _claim(claim, where, source, ours: Summary, verdict_reason, unit="") -> Claim:
    verdict, reason = verdict_reason
    return Claim(claim, where, source, fmt(ours, unit), verdict, reason, ours.as_json())


def _share_verdict(frac: float, what: str, unit: str = "runs") -> tuple[str, str]:
    """A claim that something happens every time: reproduced when it does, direction only for a majority."""
    if frac >= 1.0:
        return "reproduced", ""
    if frac > 0.5:
        return "direction only", f"{what} in {frac:.0%} of {unit}, not all"
    return "differs", f"{what} in only {frac:.0%} of {unit}"


def _order_verdict(lead: Summary, what: str) -> tuple[str, str]:
    """An ordering the source states without a number: reproduced when our CI clears 0."""
    if lead.lo > 0:
        return "reproduced", ""
    if lead.mean > 0:
        return "direction only", f"{what}: right sign, but our CI includes 0"
    return "differs", f"{what}: ours has the other sign"


def _range_verdict(gains: dict[str, Summary], lo: float, hi: float, factor: float = 1.3) -> tuple[str, str]:
    """Per-system gains against the source's range over its systems (signs first, then sizes)."""
    unclear = [n for n, s in gains.items() if s.lo <= 0]
    if unclear:
        return "differs", f"our CI includes 0 or a loss on {', '.join(unclear)}"
    outside = [n for n, s in gains.items() if not lo / factor <= s.mean <= hi * factor]
    if outside:
        return "direction only", "gains on every system, but " + ", ".join(
            f"{n} {gains[n].mean:+.1f}" for n in outside) + f" pts is outside {lo:+.1f} to {hi:+.1f}"
    return "reproduced", ""


def _per_system(gains: dict[str, Summary], unit: str = "pts") -> str:
    return "; ".join(f"{n} {fmt(s)}" for n, s in gains.items()) + f" {unit}"


def pools_tables(system, worlds, params, n_models):
    """Train and test accuracy of every allocation on every pool: (allocs [K^L, L], [P, K^L], [P, K^L])."""
    allocs = opt.all_allocations(n_models, system.n_modules)

    @jax.jit
    def both(ws):
        def one(w):
            return (opt.accuracy_table(system, allocs, w.ability, w.train, params),
                    opt.accuracy_table(system, allocs, w.ability, w.test, params))
        return jax.lax.map(one, ws)

    tr, te = both(worlds)
    return np.asarray(allocs), np.asarray(tr), np.asarray(te)


def pareto(cost, acc):
    """Indices of allocations on the (cost low, accuracy high) frontier, by increasing cost."""
    order = np.lexsort((-acc, cost))
    front, best = [], -1.0
    for i in order:
        if acc[i] > best:
            front.append(i)
            best = acc[i]
    return front


def _is_ab(alloc):
    return (alloc[..., 0] == A) & (alloc[..., 1] == B)


# --------------------------------------------------------------------------- 04.1


def constructed_case(ctx: Context) -> Section:
    pools, seeds = _sizes(ctx)
    key = jax.random.key(ROOT_SEED)
    where = "lecture §4.4 (code 04 demo 1)"
    system = LocateSolve()
    worlds = wl.lecture_worlds(jax.random.fold_in(key, 41), pools)
    allocs, train, _ = pools_tables(system, worlds, opt.make_params(5, 2), 5)
    ctx.advance("train tables")
    t0 = train[0].reshape(5, 5)
    tab = train.reshape(-1, 5, 5)
    cc, ac, cb, ab = tab[:, C, C], tab[:, A, C], tab[:, C, B], tab[:, A, B]
    local_opt = (tab[:, :, C].max(axis=1) <= cc) & (tab[:, C, :].max(axis=1) <= cc)
    strict = (np.delete(tab[:, :, C], C, axis=1).max(axis=1) < cc) & (np.delete(tab[:, C, :], C, axis=1).max(axis=1) < cc)
    best_is_ab = train.argmax(axis=1) == A * 5 + B

    # every start x q in {1, 0.8}: one compiled call per optimizer
    qs = (1.0, 0.8)
    rows = [(q, s) for q in qs for s in allocs]
    batch = sim.stack_params([opt.make_params(5, 2, start=s, diagnoser_accuracy=q) for q, s in rows])
    config = opt.SelectorConfig(system, 5, max_rounds=MAX_ROUNDS)
    grids = opt.run_optimizers(config, jax.random.fold_in(key, 410), worlds, batch, seeds, ("llmselector", "greedy"))
    ctx.advance("greedy, llmselector")
    out = {"pools": pools, "seeds": seeds, "train_table_pool0": t0, "cc_train": cc.mean(), "ac_train": ac.mean(),
           "cb_train": cb.mean(), "ab_train": ab.mean(), "cc_local_optimum_pools": int(local_opt.sum()),
           "cc_strict_local_optimum_pools": int(strict.sum()), "ab_best_pools": int(best_is_ab.sum())}
    cc_row = {q: next(i for i, (qq, s) in enumerate(rows) if qq == q and tuple(s) == (C, C)) for q in qs}
    runs = {}  # (optimizer, q) -> from-C+C results
    run_rows, fail_rows = [], []
    lectures = {"greedy": "stays at C+C, test 0.51", "llmselector": "reaches A+B, test 0.99; 20 evaluated (ex. 6b)"}
    for name in ("greedy", "llmselector"):
        g = grids[name]
        for q in (qs[:1] if name == "greedy" else qs):
            r = cc_row[q]
            alloc = g.metrics["allocation"][r]  # [S, P, L]
            reach, stay = _is_ab(alloc), (alloc[..., 0] == C) & (alloc[..., 1] == C)
            te = _pools(g.metrics["test_accuracy"][r])
            ev = _pools(g.metrics["allocations_evaluated"][r])
            runs[(name, q)] = {"test_accuracy": te, "reach_ab": reach.mean(), "stay_cc": stay.mean(),
                               "allocations_evaluated": ev}
            run_rows.append([name, q if name == "llmselector" else "-", fmt(te), f"{reach.mean():.0%}",
                             f"{stay.mean():.0%}", fmt(ev), lectures[name]])
            out[f"from_cc_{name}_q{q}"] = {"test_accuracy": te.as_json(), "reach_ab": reach.mean(),
                                           "stay_cc": stay.mean(), "allocations_evaluated": ev.as_json()}
            idx = [i for i, (qq, _) in enumerate(rows) if qq == q]
            per_run = (~_is_ab(g.metrics["allocation"][idx])).sum(axis=0)  # [S, P] failures out of 25 starts
            fails = _pools(per_run)
            runs[(name, q)]["fails"] = fails
            runs[(name, q)]["fails_max"] = int(per_run.max())
            fail_rows.append([name, q if name == "llmselector" else "-", fmt(fails), f"{per_run.min()}-{per_run.max()}",
                              8 if name == "greedy" else 0])
            out[f"fails_of_25_{name}_q{q}"] = {"mean": per_run.mean(), "min": per_run.min(), "max": per_run.max(),
                                              "summary": fails.as_json(), "per_pool_seed": per_run}
    ctx.log(f"C+C train {cc.mean():.2f} (lecture 0.45), a local optimum in {local_opt.sum()}/{pools} pools; "
            f"greedy from C+C stays in {runs[('greedy', 1.0)]['stay_cc']:.0%} of runs, llmselector reaches A+B in "
            f"{runs[('llmselector', 1.0)]['reach_ab']:.0%}")

    gr, ls, ls8 = runs[("greedy", 1.0)], runs[("llmselector", 1.0)], runs[("llmselector", 0.8)]
    frac_local = float(local_opt.mean())
    claims = [
        _claim("C+C's train accuracy is 0.45", where, "0.45 (one draw)", _pools(cc), value_verdict(_pools(cc), 0.45)),
        Claim("C+C is a local optimum: swapping either module alone is no better (A+C 0.44, C+B 0.44)", where,
              "A+C 0.44, C+B 0.44 <= C+C 0.45",
              f"local optimum in {local_opt.sum()}/{pools} pools (strictly in {strict.sum()}); A+C {ac.mean():.2f}, "
              f"C+B {cb.mean():.2f}, C+C {cc.mean():.2f}",
              *_share_verdict(frac_local, "C+C is a local optimum", "pools")),
        Claim("from C+C, greedy stays at C+C", where, "stays", f"stays in {gr['stay_cc']:.0%} of {pools * seeds} runs",
              *_share_verdict(gr["stay_cc"], "greedy stays at C+C")),
        _claim("greedy from C+C: test accuracy 0.51", where, "0.51", gr["test_accuracy"],
               value_verdict(gr["test_accuracy"], 0.51)),
        Claim("from C+C, LLMSelector reaches A+B", where, "reaches A+B",
              f"reaches A+B in {ls['reach_ab']:.0%} of {pools * seeds} runs",
              *_share_verdict(ls["reach_ab"], "LLMSelector reaches A+B")),
        _claim("LLMSelector from C+C: test accuracy 0.99", where, "0.99", ls["test_accuracy"],
               value_verdict(ls["test_accuracy"], 0.99)),
        Claim("with diagnoser accuracy 0.8 LLMSelector still finds A+B", where, "finds it",
              f"reaches A+B in {ls8['reach_ab']:.0%} of runs (q = 0.8)",
              *_share_verdict(ls8["reach_ab"], "LLMSelector (q = 0.8) reaches A+B")),
        _claim("LLMSelector from C+C evaluates 20 allocations (4 rounds x 5)", "lecture exercise 6(b)", "20",
               ls["allocations_evaluated"], value_verdict(ls["allocations_evaluated"], 20.0), "allocations"),
        _claim("from all 25 starts, greedy fails to reach A+B 8 times", where, "8 of 25 (one draw)", gr["fails"],
               value_verdict(gr["fails"], 8.0), "of 25 starts"),
        Claim("from all 25 starts, LLMSelector always reaches A+B", where, "0 of 25 fail",
              f"{fmt(ls['fails'])} of 25 fail (at most {ls['fails_max']} in one run)",
              *holds_verdict(ls["fails_max"] == 0, f"LLMSelector fails from up to {ls['fails_max']} starts in a run"),
              ls["fails"].as_json()),
    ]
    train_rows = [[wl.model_name(i)] + [f"{t0[i, j]:.2f}" for j in range(5)] for i in range(5)]
    key_rows = [[n, fmt(_pools(v)), lec] for n, v, lec in
                (("C+C", cc, 0.45), ("A+C", ac, 0.44), ("C+B", cb, 0.44), ("A+B", ab, "-"))]
    return Section(SOURCE, "constructed_case", "Lecture §4.4 (04.1): the constructed five-model case, greedy stuck "
                                               "at C+C, LLMSelector escapes",
                   intro=f"Locate-solve with the lecture's five models (A locates, B solves, C middling at both), "
                         f"{pools} question draws (pools) of 100 train + 100 test questions, {seeds} optimizer seeds "
                         f"each, round cap {MAX_ROUNDS}. Both optimizers start from every one of the 25 allocations "
                         "at diagnoser accuracy q = 1 and 0.8 in one compiled call per optimizer. CIs are over "
                         f"pools. A+B is the train optimum in {best_is_ab.sum()}/{pools} pools.",
                   claims=claims,
                   tables=[("train accuracy, pool 0 (rows = locate model, columns = solve model)",
                            markdown_table(["locate \\ solve"] + [wl.model_name(j) for j in range(5)], train_rows)),
                           ("train accuracy of the key allocations (mean over pools)",
                            markdown_table(["allocation", "ours", "lecture"], key_rows)),
                           ("runs from C+C", markdown_table(
                               ["optimizer", "q", "test accuracy", "ends at A+B", "stays at C+C",
                                "allocations evaluated", "lecture"], run_rows)),
                           ("failures to reach A+B over the 25 starts (per run = pool x seed)", markdown_table(
                               ["optimizer", "q", "failures of 25 (mean)", "range over runs", "lecture"], fail_rows))],
                   data=out, seeds=seeds)


# --------------------------------------------------------------------------- 04.2


def random_pools(ctx: Context) -> Section:
    pools, seeds = _sizes(ctx)
    key = jax.random.key(ROOT_SEED)
    where = "lecture §4.4 (code 04 demo 2)"
    out, rows, per = {}, [], {}
    for system in (LocateSolve(), SelfRefine(), Debate()):
        worlds = wl.random_worlds(jax.random.fold_in(key, 42), pools, 5, system.n_skills, 100, 100)
        config = opt.SelectorConfig(system, 5, max_rounds=MAX_ROUNDS)
        batch = sim.stack_params([opt.make_params(5, system.n_modules)])
        grids = opt.run_optimizers(config, jax.random.fold_in(key, 420), worlds, batch, seeds)
        ctx.advance(system.name)
        te = {n: np.asarray(g.metrics["test_accuracy"][0], np.float64) for n, g in grids.items()}  # [S, P]
        ev = {n: g.metrics["allocations_evaluated"][0].mean() for n, g in grids.items()}

        def pts(a, b, te=te):
            return _pools(100 * (te[a] - te[b]))

        per[system.name] = {"te": te, "llm_single": pts("llmselector", "best_single"),
                            "exh_single": pts("exhaustive", "best_single"),
                            "greedy_llm": pts("greedy", "llmselector"), "random_llm": pts("random_search", "llmselector")}
        p = per[system.name]
        rows += [[system.name, n, fmt(_pools(te[n])), f"{ev[n]:.1f}"] for n in opt.OPTIMIZERS]
        out[system.name] = {"test_accuracy": {n: _pools(v).as_json() for n, v in te.items()},
                            "allocations_evaluated": ev,
                            "llmselector_minus_best_single_pts": p["llm_single"].as_json(),
                            "exhaustive_minus_best_single_pts": p["exh_single"].as_json(),
                            "greedy_minus_llmselector_pts": p["greedy_llm"].as_json(),
                            "random_minus_llmselector_pts": p["random_llm"].as_json()}
        ctx.log(f"{system.name}: llmselector - best single {p['llm_single'].mean:+.1f} pts, exhaustive - best single "
                f"{p['exh_single'].mean:+.1f}, greedy - llmselector {p['greedy_llm'].mean:+.1f}, random search - "
                f"llmselector {p['random_llm'].mean:+.1f}")
    llm = {n: p["llm_single"] for n, p in per.items()}
    exh = {n: p["exh_single"] for n, p in per.items()}
    grd = {n: p["greedy_llm"] for n, p in per.items()}
    near = {n: s for n, s in grd.items() if not (s.lo <= 0 <= s.hi or abs(s.mean) <= 2.0)}
    # llmselector's lead over random search, averaged over the three systems pool by pool
    lead = _pools(np.mean([100 * (p["te"]["llmselector"] - p["te"]["random_search"]) for p in per.values()], axis=0))
    claims = [
        Claim("mixing models beats the best single model: LLMSelector +1.6 to +7.5 pts", where,
              "+1.6 to +7.5 (over its systems)", _per_system(llm), *_range_verdict(llm, 1.6, 7.5)),
        Claim("exhaustive search beats the best single model by +2.6 to +8.4 pts", where,
              "+2.6 to +8.4 (over its systems)", _per_system(exh), *_range_verdict(exh, 2.6, 8.4)),
        Claim("on random pools greedy and LLMSelector are about equal", where, "about equal",
              _per_system(grd, "pts (greedy - llmselector)"),
              *holds_verdict(not near, "greedy and LLMSelector differ by over 2 pts (CI clear of 0) on "
                                       + ", ".join(near))),
        _claim("random search with the same budget is worse than LLMSelector", where, "worse (no number)", lead,
               _order_verdict(lead, "LLMSelector's lead over random search"), "pts (llmselector - random, 3-system mean)"),
    ]
    return Section(SOURCE, "random_pools", "Lecture §4.4 (04.2): random pools of five models, three systems",
                   intro=f"{pools} random pools of 5 models (ability = general level + per-skill specialty), 100 train "
                         f"+ 100 test questions each, {seeds} optimizer seeds per pool, on locate-solve, self-refine "
                         "and debate (6 modules, 5^6 = 15,625 allocations for exhaustive search). Gains are paired "
                         "per pool, in test-accuracy points; CIs are over pools.",
                   claims=claims,
                   tables=[("test accuracy (mean over pools) and allocations evaluated", markdown_table(
                               ["system", "optimizer", "test accuracy", "allocations evaluated"], rows)),
                           ("paired differences (test-accuracy points)", markdown_table(
                               ["system", "llmselector - best single", "exhaustive - best single",
                                "greedy - llmselector", "random search - llmselector"],
                               [[n, fmt(p["llm_single"]), fmt(p["exh_single"]), fmt(p["greedy_llm"]),
                                 fmt(p["random_llm"])] for n, p in per.items()]))],
                   data=out, seeds=seeds)


# --------------------------------------------------------------------------- 04.3


def noisy_diagnoser(ctx: Context) -> Section:
    pools, seeds = _sizes(ctx)
    key = jax.random.key(ROOT_SEED)
    where = "lecture §4.4 (code 04 demo 3)"
    system = Debate()
    worlds = wl.random_worlds(jax.random.fold_in(key, 42), pools, 5, system.n_skills, 100, 100)
    config = opt.SelectorConfig(system, 5, max_rounds=MAX_ROUNDS)
    batch = sim.stack_params([opt.make_params(5, 6, diagnoser_accuracy=q) for q in DIAGNOSER_Q])
    g = opt.run_optimizers(config, jax.random.fold_in(key, 430), worlds, batch, seeds, ("llmselector",))["llmselector"]
    ctx.advance("q sweep")
    ev_raw = np.asarray(g.metrics["allocations_evaluated"], np.float64)  # [Q, S, P]
    te_raw = np.asarray(g.metrics["test_accuracy"], np.float64)
    ev = [_pools(x) for x in ev_raw]
    te = [_pools(x) for x in te_raw]
    capped = g.metrics["overflow"].mean(axis=(1, 2))
    rise = _pools(ev_raw[-1] - ev_raw[0])
    drop = _pools(100 * (te_raw[0] - te_raw[-1]))
    means = [s.mean for s in te]
    steps = np.diff(means)
    monotone = bool(np.all(steps >= 0) or np.all(steps <= 0))
    if drop.mean >= 5.0:
        slowly = ("differs", f"accuracy falls {drop.mean:.1f} pts from q = 1 to 0.6: not slowly")
    elif drop.mean >= 0:
        slowly = ("reproduced", "")
    else:
        slowly = ("direction only", f"accuracy does not fall at all: it rises {-drop.mean:.1f} pts from q = 1 to 0.6")
    claims = [
        _claim("debate, exact diagnoser (q = 1): LLMSelector evaluates 68 allocations", where, "68", ev[0],
               value_verdict(ev[0], 68.0), "allocations"),
        _claim("as q falls from 1.0 to 0.6 the allocations evaluated grow from 68 to 633", where, "+565 (68 -> 633)",
               rise, gain_verdict(rise, 633.0 - 68.0), "allocations (q = 0.6 minus q = 1)"),
        _claim("accuracy degrades slowly as the diagnoser gets noisier", where, "slowly (no number)", drop, slowly,
               "pts (test accuracy at q = 1 minus q = 0.6)"),
        Claim("... and not monotonically in q", where, "not monotone",
              " / ".join(f"{m:.3f}" for m in means) + " (q = " + ", ".join(map(str, DIAGNOSER_Q)) + ")",
              *holds_verdict(not monotone, "our mean test accuracy is monotone in q")),
    ]
    rows = [[q, fmt(e), fmt(t), f"{c:.0%}"] for q, e, t, c in zip(DIAGNOSER_Q, ev, te, capped, strict=True)]
    ctx.log("evaluated " + ", ".join(f"{s.mean:.0f}" for s in ev) + " (lecture 68 -> 633); test accuracy "
            + ", ".join(f"{m:.3f}" for m in means))
    fig, file = ctx.figure(SOURCE, "noisy_diagnoser")
    x = list(DIAGNOSER_Q)
    band = lambda ss: dict(y=[s.mean for s in ss], lo=[s.lo for s in ss], hi=[s.hi for s in ss])  # noqa: E731
    report.line_plot({
        "budget: allocations evaluated (log)": [
            dict(x=x, **band(ev), marker="o", label="ours (95 % CI over pools)"),
            dict(x=[1.0, 0.6], y=[68, 633], ls="none", marker="x", ms=9, color="black", label="lecture (one run)")],
        "test accuracy (fraction of questions)": [dict(x=x, **band(te), marker="o", label="ours (95 % CI over pools)")]},
        fig, xlabel="diagnoser accuracy q (P(correct verdict on a wrong answer))",
        ylabel="allocations evaluated (log)", ylog=("budget: allocations evaluated (log)",))
    return Section(SOURCE, "noisy_diagnoser", "Lecture §4.4 (04.3): debate with a noisy diagnoser",
                   intro=f"LLMSelector on debate (3 generators + 3 debaters), {pools} random pools x {seeds} seeds, the "
                         f"diagnoser right with probability q on a wrong answer; all {len(DIAGNOSER_Q)} q values in one "
                         f"compiled call, round cap {MAX_ROUNDS}. CIs are over pools.",
                   claims=claims,
                   tables=[("LLMSelector against diagnoser accuracy q", markdown_table(
                       ["q", "allocations evaluated", "test accuracy", f"runs hitting the {MAX_ROUNDS}-round cap"], rows))],
                   figures=[("LLMSelector's budget and test accuracy against the diagnoser accuracy q, 95 % CI bands "
                             "over pools; crosses: the lecture's endpoints", file)],
                   data={"q": DIAGNOSER_Q, "allocations_evaluated": [s.as_json() for s in ev],
                         "test_accuracy": [s.as_json() for s in te], "hit_round_cap_fraction": capped},
                   seeds=seeds)


# --------------------------------------------------------------------------- 04.4


def monotonicity(ctx: Context) -> Section:
    pools, seeds = _sizes(ctx)
    key = jax.random.key(ROOT_SEED)
    where = "lecture §4.5 (code 04 demo 4)"
    # (a) self-critique blind spot
    system = SelfRefine()
    worlds = wl.random_worlds(jax.random.fold_in(key, 42), pools, 5, system.n_skills, 100, 100)
    params = opt.make_params(5, 3, blind_spot=0.3)
    allocs, train, test = pools_tables(system, worlds, params, 5)
    best = train.argmax(axis=1)
    same = allocs[:, 0] == allocs[:, 1]
    best_same = np.where(same[None, :], train, -1).argmax(axis=1)
    p = np.arange(len(best))
    differ = allocs[best, 0] != allocs[best, 1]
    gain_bs = _pools(100 * (test[p, best] - test[p, best_same]))
    config = opt.SelectorConfig(system, 5, max_rounds=MAX_ROUNDS)
    g = opt.run_optimizers(config, jax.random.fold_in(key, 440), worlds, sim.stack_params([params]), seeds,
                           ("llmselector",))["llmselector"]
    la = g.metrics["allocation"][0]  # [S, P, 3]
    llm_differ = float((la[..., 0] != la[..., 1]).mean())
    ctx.advance("self-refine blind spot")
    # (b) debate diversity
    system = Debate()
    worlds = wl.random_worlds(jax.random.fold_in(key, 42), pools, 5, system.n_skills, 100, 100)
    allocs_d, train_d, test_d = pools_tables(system, worlds, opt.make_params(5, 6), 5)
    best_d = train_d.argmax(axis=1)
    n_distinct = np.array([len(set(allocs_d[b, :3].tolist())) for b in best_d])
    identical = (allocs_d[:, 0] == allocs_d[:, 1]) & (allocs_d[:, 1] == allocs_d[:, 2])
    best_ident = np.where(identical[None, :], train_d, -1).argmax(axis=1)
    gain_dv = _pools(100 * (test_d[p, best_d] - test_d[p, best_ident]))
    mixed = _pools((n_distinct >= 2).astype(float))
    ctx.advance("debate diversity")
    ctx.log(f"blind spot: optimum critic != generator in {differ.sum()}/{pools} pools, +{gain_bs.mean:.1f} pts; "
            f"debate: optimum mixes generators in {(n_distinct >= 2).sum()}/{pools} pools, +{gain_dv.mean:.1f} pts")
    mixed_verdict = value_verdict(mixed, 0.6)
    if mixed_verdict[0] == "differs" and mixed.mean >= 0.5:
        mixed_verdict = ("direction only", f"the optimum mixes generators in most pools, but in {mixed.mean:.0%} "
                                           "of ours against 6/10 of the lecture's")
    claims = [
        Claim("blind spot (same-model critic catches x0.3): every pool's optimum uses a critic different from the "
              "generator", where, "10/10 pools", f"{differ.sum()}/{pools} pools",
              *_share_verdict(float(differ.mean()), "the optimum's critic differs from its generator", "pools")),
        _claim("... and beats the best same-model-critic allocation by 7.7 pts", where, "+7.7", gain_bs,
               gain_verdict(gain_bs, 7.7), "pts (test)"),
        Claim("LLMSelector finds that structure (critic != generator) every time", where, "10/10",
              f"{llm_differ:.0%} of {pools * seeds} runs",
              *_share_verdict(llm_differ, "LLMSelector ends with critic != generator")),
        _claim("debate: 6/10 pools' optimum uses 2-3 distinct generator models", where, "0.6 (6/10 pools)", mixed,
               mixed_verdict, "(fraction of pools)"),
        _claim("... beating the best allocation with three identical generators by 2.6 pts", where, "+2.6", gain_dv,
               gain_verdict(gain_dv, 2.6), "pts (test)"),
    ]
    return Section(SOURCE, "monotonicity", "Lecture §4.5 (04.4): when monotonicity fails (blind spot, diversity)",
                   intro=f"Exhaustive search (train set) on {pools} random pools of 5 models: self-refine with a "
                         "self-critique blind spot (catch probability x0.3 when critic == generator; 125 allocations) "
                         "and debate, where a wrong model always gives the same wrong answer (15,625 allocations); "
                         f"LLMSelector on the blind-spot pools with {seeds} seeds. Gains are test-accuracy points, "
                         "CIs over pools.",
                   claims=claims,
                   tables=[("per pool", markdown_table(
                       ["pool", "blind spot: optimum", "critic != generator", "gain over same critic (pts)",
                        "debate: optimum", "distinct generators", "gain over identical generators (pts)"],
                       [[i, wl.allocation_name(allocs[best[i]]), bool(differ[i]),
                         f"{100 * (test[i, best[i]] - test[i, best_same[i]]):+.1f}",
                         wl.allocation_name(allocs_d[best_d[i]]), int(n_distinct[i]),
                         f"{100 * (test_d[i, best_d[i]] - test_d[i, best_ident[i]]):+.1f}"] for i in p]))],
                   data={"self_refine_blind_spot": {"best_differs_pools": int(differ.sum()), "gain_pts": gain_bs.as_json(),
                                                    "llmselector_differs_fraction": llm_differ},
                         "debate_diversity": {"distinct_generators_per_pool": n_distinct,
                                              "pools_2_or_3": int((n_distinct >= 2).sum()),
                                              "gain_pts": gain_dv.as_json()}},
                   seeds=seeds)


# --------------------------------------------------------------------------- exercise 7


def cost(ctx: Context) -> Section:
    pools, seeds = _sizes(ctx)
    key = jax.random.key(ROOT_SEED)
    where = "lecture exercise 7"
    system = LocateSolve()
    worlds = wl.lecture_worlds(jax.random.fold_in(key, 41), pools)
    price = wl.LECTURE_PRICES
    config = opt.SelectorConfig(system, 5, max_rounds=MAX_ROUNDS)
    sweeps, tables = {}, []

    def sweep(label, optimizer, field, values, note):
        rows = [opt.make_params(5, 2, start=[C, C], price=price, **{field: v}) for v in values]
        sim.clear_compiled(opt.batch_fn(optimizer, config))
        g = opt.run_optimizers(config, jax.random.fold_in(key, 70), worlds, sim.stack_params(rows), seeds,
                               (optimizer,))[optimizer]
        compiles = sim.compile_count(opt.batch_fn(optimizer, config), "run")
        ctx.advance(optimizer)
        m = {k: [_pools(x) for x in np.asarray(g.metrics[k], np.float64)]
             for k in ("test_accuracy", "train_accuracy", "cost_per_question")}
        modes = [Counter(wl.allocation_name(a) for a in g.metrics["allocation"][i].reshape(-1, 2)).most_common(2)
                 for i in range(len(values))]
        tables.append((f"{label} from C+C: {len(values)} settings in {compiles} compilation(s) ({note})",
                       markdown_table([field, "cost per question", "train accuracy", "test accuracy",
                                       f"most common allocations (of {pools * seeds} runs)"],
                                      [[v, fmt(c), fmt(tr), fmt(te), ", ".join(f"{n} x{k}" for n, k in md)]
                                       for v, c, tr, te, md in zip(values, m["cost_per_question"], m["train_accuracy"],
                                                                   m["test_accuracy"], modes, strict=True)])))
        sweeps[optimizer] = {field: values, **{k: [s.as_json() for s in v] for k, v in m.items()},
                             "most_common_allocations": modes, "compilations": compiles}
        return m

    lam = sweep("(c1) lambda-penalised llmselector: score - lambda * price / max price", "llmselector", "cost_lambda",
                LAMBDAS, "scores move in steps of 1, so lambda < 1 only breaks ties")
    down = sweep("(c2) llmselector, then downgrade each module to the cheapest model within a train-accuracy "
                 "tolerance", "llmselector_downgrade", "downgrade_tolerance", TOLERANCES,
                 "tolerance = allowed train-accuracy drop")
    allocs, train, test = pools_tables(system, worlds, opt.make_params(5, 2, price=price), 5)
    ctx.advance("Pareto frontier")
    costs = price[allocs].sum(axis=1)
    front = pareto(costs, train[0])
    ab, cc = A * 5 + B, C * 5 + C
    d_pool = 100 * (test[:, ab] - test[:, cc])  # [P]
    d_pts = _pools(d_pool)
    per_pt = _pools((costs[ab] - costs[cc]) / d_pool)
    ctx.log(f"A+B - C+C = {d_pts.mean:+.1f} test pts for {costs[ab] - costs[cc]:.0f} more: "
            f"{(costs[ab] - costs[cc]) / d_pts.mean:.3f} per point (lecture 0.125)")

    pp = value_verdict(per_pt, 0.125)
    if pp[0] != "reproduced":
        pp = (("direction only", f"same decision (stay at C+C), but ours is {per_pt.mean:.3f} per point")
              if per_pt.mean > 0.1 else
              ("differs", f"the decision flips: ours is {per_pt.mean:.3f} per point, under 0.1, so A+B is worth it"))

    def falls(m):
        c = [s.mean for s in m["cost_per_question"]]
        return bool(np.all(np.diff(c) <= 1e-6) and c[-1] < c[0]), c

    lam_ok, lam_c = falls(lam)
    down_ok, down_c = falls(down)
    # (a), A+B costs 8 per question and C+C 2, is the exercise's prices added up: a setting (the table below
    # shows it), not a claim, since nothing simulated enters it
    claims = [
        _claim("(b) A+B beats C+C by 0.99 - 0.51 = 48 test pts", where, "+48", d_pts, gain_verdict(d_pts, 48.0),
               "pts (test)"),
        _claim("(b) that is 0.125 per point, above the 0.1 limit, so stay at C+C", where, "0.125 > 0.1", per_pt, pp,
               "per point"),
        Claim("(c) a lambda-penalised LLMSelector swept over lambda traces a cost-accuracy curve", where,
              "cost falls as lambda grows", f"cost {lam_c[0]:.2f} -> {lam_c[-1]:.2f} over lambda "
                                            f"{LAMBDAS[0]} -> {LAMBDAS[-1]}",
              *holds_verdict(lam_ok, "our cost does not fall monotonically with lambda")),
        Claim("(c) or downgrade modules after convergence while accuracy drops at most a threshold", where,
              "cheaper as the threshold grows", f"cost {down_c[0]:.2f} -> {down_c[-1]:.2f} over tolerance "
                                                f"{TOLERANCES[0]} -> {TOLERANCES[-1]}",
              *holds_verdict(down_ok, "our cost does not fall monotonically with the tolerance")),
    ]
    fig, file = ctx.figure(SOURCE, "pareto")
    _pareto_figure(fig, costs, train, test, allocs, lam, down)
    front_rows = [[wl.allocation_name(allocs[i]), f"{costs[i]:.1f}", f"{train[0, i]:.2f}", f"{test[0, i]:.2f}"]
                  for i in front]
    return Section(SOURCE, "cost", "Lecture exercise 7: cost (prices A 5, B 3, C 1, D 0.5, E 0.2)",
                   intro=f"The constructed locate-solve case with the exercise's prices, {pools} question draws x "
                         f"{seeds} seeds, starting from C+C. Two ways to put cost into LLMSelector (c), each swept in "
                         "one compiled call, beside the exact train-set Pareto frontier of all 25 allocations. CIs are "
                         "over pools. Exercise 7 (a), A+B at 8 per question against C+C at 2, is the prices added up "
                         "(the table's first row): a setting, not a claim.",
                   claims=claims,
                   tables=tables + [
                       ("exact train-set Pareto frontier, pool 0", markdown_table(
                           ["allocation", "cost per question", "train accuracy", "test accuracy"], front_rows)),
                       ("A+B against C+C (exercise 7 a, b)", markdown_table(
                           ["quantity", "ours", "lecture"],
                           [["cost A+B / C+C", f"{costs[ab]:.1f} / {costs[cc]:.1f} ({costs[ab] / costs[cc]:.1f}x)",
                             "8 / 2 (4x)"],
                            ["test accuracy A+B - C+C (pts)", fmt(d_pts), "+48"],
                            ["extra cost per point (ratio of means)",
                             f"{(costs[ab] - costs[cc]) / d_pts.mean:.3f}", "0.125"]]))],
                   figures=[("cost against accuracy: every allocation (grey, mean over pools), the exact frontier and "
                             "the two cost-aware LLMSelector sweeps (one point per setting, settings that converge alike coincide; error bars: "
                             "95 % CI over pools, clipped to [0, 1])", file)],
                   data={**sweeps,
                         "frontier_pool0": [{"allocation": wl.allocation_name(allocs[i]), "cost": costs[i],
                                             "train_accuracy": train[0, i], "test_accuracy": test[0, i]}
                                            for i in front],
                         "ab_minus_cc_test_pts": d_pts.as_json(), "cost_per_point": per_pt.as_json()},
                   seeds=seeds)


def _pareto_figure(path, costs, train, test, allocs, lam, down) -> None:
    """Two panels (train, test accuracy) against cost: all allocations, the frontier, the two sweeps."""
    plt = report._pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    front = pareto(costs, train.mean(axis=0))  # frontier of the pool-mean train accuracy
    for ax, acc, split in ((axes[0], train, "train"), (axes[1], test, "test")):
        mean = acc.mean(axis=0)
        ax.scatter(costs, mean, s=14, color="0.6", label="every allocation (pool mean)", zorder=1)
        ax.plot(costs[front], mean[front], color="black", drawstyle="steps-post" if split == "train" else "default",
                lw=1.2, label="exact train-set frontier", zorder=2)
        for i in front:
            ax.annotate(wl.allocation_name(allocs[i]), (costs[i], mean[i]), textcoords="offset points",
                        xytext=(4, -10), fontsize=7)
        for m, marker, color, name in ((lam, "o", "tab:blue", "lambda-penalised llmselector"),
                                       (down, "s", "tab:orange", "llmselector + downgrade")):
            c, a = m["cost_per_question"], m[f"{split}_accuracy"]
            ax.errorbar([s.mean for s in c], [s.mean for s in a], xerr=[s.half_width for s in c],
                        yerr=[s.half_width for s in a], ls="none", marker=marker, ms=5, capsize=2, color=color,
                        alpha=0.8, label=f"{name} (each setting)", zorder=3)
        report.log_scale(ax, "x")
        ax.set_ylim(-0.02, 1.05)  # accuracy is a fraction; a few-pool CI may reach past it
        ax.set_xlabel("cost per question (price units, log)")
        ax.set_title(f"{split} set", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy (fraction of questions)")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle("exercise 7: cost vs accuracy, locate-solve with prices A 5, B 3, C 1, D 0.5, E 0.2", fontsize=9)
    fig.tight_layout()
    output_paths.save_figure(fig, path, dpi=120)
    plt.close(fig)


EXPERIMENTS = [
    Experiment(SOURCE, "constructed_case", "04.1 the constructed five-model case", constructed_case, lambda q: 2),
    Experiment(SOURCE, "random_pools", "04.2 random pools, three systems", random_pools, lambda q: 3),
    Experiment(SOURCE, "noisy_diagnoser", "04.3 debate with a noisy diagnoser", noisy_diagnoser, lambda q: 1),
    Experiment(SOURCE, "monotonicity", "04.4 monotonicity violations", monotonicity, lambda q: 2),
    Experiment(SOURCE, "cost", "exercise 7: cost and the Pareto frontier", cost, lambda q: 3),
]
