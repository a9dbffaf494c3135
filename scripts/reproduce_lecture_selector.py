"""Reproduce the lecture's LLMSelector experiments (§4.4-4.5, exercise 7) in jaxroute's toy world.

Prints every item beside the lecture's figure and writes JSON:

  04.1  the constructed five-model case: 5x5 train table, C+C a local optimum, greedy vs
        LLMSelector from C+C (q = 1 and 0.8), failures over all 25 starts
  04.2  10 random pools of 5 models, three systems: mixing vs best single, greedy vs
        LLMSelector, random search on the same budget
  04.3  debate with a noisy diagnoser, q = 1.0 ... 0.6: budget and accuracy
  04.4  monotonicity violations: self-critique blind spot (self-refine) and answer
        diversity (debate), from exhaustive search on every pool
  ex 7  cost: prices A 5, B 3, C 1, D 0.5, E 0.2; a lambda-penalised LLMSelector swept over
        lambda in one compilation, beside the exact train-set Pareto frontier

The lecture's numbers come from its own toy world, not this one: compare the shape (who
wins, signs, rough sizes), not digits. Every optimizer run is one compiled call over
configs x seeds x pools.

    python scripts/reproduce_lecture_selector.py [--pools 10] [--seeds 2] [--out results/lecture_selector.json]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import jax
import numpy as np

from jaxroute import sim
from jaxroute.report import write_json
from jaxroute.selector import optimizers as opt
from jaxroute.selector import world as wl
from jaxroute.selector.systems import Debate, LocateSolve, SelfRefine

A, B, C = 0, 1, 2


def header(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 70 - len(title)))


def pools_tables(system, worlds, params, n_models):
    """Train and test accuracy of every allocation on every pool: ([P, K^L], [P, K^L])."""
    allocs = opt.all_allocations(n_models, system.n_modules)

    @jax.jit
    def both(ws):
        def one(w):
            return (opt.accuracy_table(system, allocs, w.ability, w.train, params),
                    opt.accuracy_table(system, allocs, w.ability, w.test, params))
        return jax.lax.map(one, ws)

    tr, te = both(worlds)
    return np.asarray(allocs), np.asarray(tr), np.asarray(te)


def item_041(args, key):
    header("04.1 constructed five-model case (locate-solve)")
    system = LocateSolve()
    worlds = wl.lecture_worlds(jax.random.fold_in(key, 41), args.pools)
    base = opt.make_params(5, 2)
    allocs, train, test = pools_tables(system, worlds, base, 5)
    t0 = train[0].reshape(5, 5)
    print("train accuracy, pool 0 (rows = locate model, columns = solve model):")
    print("      " + "  ".join(f"{wl.model_name(j):>5}" for j in range(5)))
    for i in range(5):
        print(f"  {wl.model_name(i)}   " + "  ".join(f"{t0[i, j]:5.2f}" for j in range(5)))
    tab = train.reshape(-1, 5, 5)
    cc, ac, cb, ab = tab[:, C, C], tab[:, A, C], tab[:, C, B], tab[:, A, B]
    local_opt = (tab[:, :, C].max(axis=1) <= cc) & (tab[:, C, :].max(axis=1) <= cc)
    strict = (np.delete(tab[:, :, C], C, axis=1).max(axis=1) < cc) & (np.delete(tab[:, C, :], C, axis=1).max(axis=1) < cc)
    best_is_ab = train.argmax(axis=1) == A * 5 + B
    print(f"C+C train {cc.mean():.2f} (lecture 0.45); A+C {ac.mean():.2f} (0.44); C+B {cb.mean():.2f} (0.44); "
          f"A+B {ab.mean():.2f} (pool means)")
    print(f"C+C is a local optimum (no single swap is better) in {local_opt.sum()}/{len(cc)} pools "
          f"(strictly: A+C < C+C in {(ac < cc).sum()}, C+B < C+C in {(cb < cc).sum()}, both in {strict.sum()}; "
          f"otherwise ties); A+B is the train optimum in {best_is_ab.sum()}/{len(cc)}")

    # every start x q in {1, 0.8}: one compiled call per optimizer
    qs = (1.0, 0.8)
    rows = [(q, s) for q in qs for s in allocs]
    batch = sim.stack_params([opt.make_params(5, 2, start=s, diagnoser_accuracy=q) for q, s in rows])
    config = opt.SelectorConfig(system, 5, max_rounds=args.max_rounds)
    grids = opt.run_optimizers(config, jax.random.fold_in(key, 410), worlds, batch, args.seeds,
                               ("llmselector", "greedy"))
    out = {"train_table_pool0": t0, "cc_train": cc.mean(), "ac_train": ac.mean(), "cb_train": cb.mean(),
           "ab_train": ab.mean(), "cc_local_optimum_pools": int(local_opt.sum()),
           "cc_strict_local_optimum_pools": int(strict.sum()), "ab_best_pools": int(best_is_ab.sum())}
    cc_row = {q: next(i for i, (qq, s) in enumerate(rows) if qq == q and tuple(s) == (C, C)) for q in qs}
    for name, lecture in (("greedy", "stays at C+C, test 0.51"), ("llmselector", "reaches A+B, test 0.99")):
        g = grids[name]
        for q in qs:
            r = cc_row[q]
            alloc = g.metrics["allocation"][r]  # [S, P, L]
            reach = ((alloc[..., 0] == A) & (alloc[..., 1] == B)).mean()
            stay = ((alloc[..., 0] == C) & (alloc[..., 1] == C)).mean()
            te = g.metrics["test_accuracy"][r].mean()
            ev = g.metrics["allocations_evaluated"][r].mean()
            if name == "greedy" and q != 1.0:
                continue
            qtxt = f", q = {q}" if name == "llmselector" else ""
            print(f"from C+C, {name}{qtxt}: test {te:.2f}, ends at A+B in {reach:.0%} / stays at C+C in {stay:.0%} "
                  f"of runs, {ev:.1f} allocations evaluated   (lecture: {lecture}"
                  f"{'; 20 evaluated (exercise 6b)' if name == 'llmselector' else ''})")
            out[f"from_cc_{name}_q{q}"] = {"test_accuracy": te, "reach_ab": reach, "stay_cc": stay,
                                           "allocations_evaluated": ev}
    for name, lecture in (("greedy", 8), ("llmselector", 0)):
        g = grids[name]
        for q in qs:
            if name == "greedy" and q != 1.0:
                continue
            idx = [i for i, (qq, _) in enumerate(rows) if qq == q]
            alloc = g.metrics["allocation"][idx]  # [25, S, P, L]
            fails = ~((alloc[..., 0] == A) & (alloc[..., 1] == B))
            per_run = fails.sum(axis=0)  # [S, P] failures out of 25 starts
            qtxt = f", q = {q}" if name == "llmselector" else ""
            print(f"{name}{qtxt}: fails to reach A+B from {per_run.mean():.1f} of 25 starts on average "
                  f"(range {per_run.min()}-{per_run.max()} over pools x seeds)   (lecture: {lecture} of 25)")
            out[f"fails_of_25_{name}_q{q}"] = {"mean": per_run.mean(), "min": per_run.min(), "max": per_run.max(),
                                              "per_pool_seed": per_run}
    return out


def item_042(args, key):
    header("04.2 random pools of 5 models (test accuracy, mean over pools)")
    out = {}
    print(f"{'system':<13}" + "".join(f"{n:>15}" for n in opt.OPTIMIZERS) + "   llmsel-single  exh-single")
    for system in (LocateSolve(), SelfRefine(), Debate()):
        worlds = wl.random_worlds(jax.random.fold_in(key, 42), args.pools, 5, system.n_skills, 100, 100)
        config = opt.SelectorConfig(system, 5, max_rounds=args.max_rounds)
        batch = sim.stack_params([opt.make_params(5, system.n_modules)])
        grids = opt.run_optimizers(config, jax.random.fold_in(key, 420), worlds, batch, args.seeds)
        te = {n: g.metrics["test_accuracy"][0].mean() for n, g in grids.items()}
        ev = {n: g.metrics["allocations_evaluated"][0].mean() for n, g in grids.items()}

        def gain(n, te=te):
            return 100 * (te[n] - te["best_single"])

        print(f"{system.name:<13}" + "".join(f"{te[n]:>15.3f}" for n in opt.OPTIMIZERS)
              + f"   {gain('llmselector'):+13.1f}  {gain('exhaustive'):+10.1f}")
        print(f"{'  evaluated':<13}" + "".join(f"{ev[n]:>15.1f}" for n in opt.OPTIMIZERS))
        out[system.name] = {"test_accuracy": te, "allocations_evaluated": ev,
                            "llmselector_minus_best_single_pts": gain("llmselector"),
                            "exhaustive_minus_best_single_pts": gain("exhaustive"),
                            "greedy_minus_llmselector_pts": 100 * (te["greedy"] - te["llmselector"]),
                            "random_minus_llmselector_pts": 100 * (te["random_search"] - te["llmselector"])}
    g_llm = [v["llmselector_minus_best_single_pts"] for v in out.values()]
    g_ex = [v["exhaustive_minus_best_single_pts"] for v in out.values()]
    g_gr = [v["greedy_minus_llmselector_pts"] for v in out.values()]
    g_rs = [v["random_minus_llmselector_pts"] for v in out.values()]
    print(f"mixing beats best single: llmselector {min(g_llm):+.1f} to {max(g_llm):+.1f} pts (lecture +1.6 to +7.5), "
          f"exhaustive {min(g_ex):+.1f} to {max(g_ex):+.1f} (lecture +2.6 to +8.4)")
    print(f"greedy - llmselector: {', '.join(f'{x:+.1f}' for x in g_gr)} pts (lecture: about equal)")
    print(f"random search - llmselector, same budget: {', '.join(f'{x:+.1f}' for x in g_rs)} pts (lecture: worse)")
    return out


def item_043(args, key):
    header("04.3 debate, noisy diagnoser (llmselector)")
    system = Debate()
    worlds = wl.random_worlds(jax.random.fold_in(key, 42), args.pools, 5, system.n_skills, 100, 100)
    qs = (1.0, 0.9, 0.8, 0.7, 0.6)
    config = opt.SelectorConfig(system, 5, max_rounds=args.max_rounds)
    batch = sim.stack_params([opt.make_params(5, 6, diagnoser_accuracy=q) for q in qs])
    g = opt.run_optimizers(config, jax.random.fold_in(key, 430), worlds, batch, args.seeds, ("llmselector",))["llmselector"]
    ev = g.metrics["allocations_evaluated"].mean(axis=(1, 2))
    te = g.metrics["test_accuracy"].mean(axis=(1, 2))
    capped = g.metrics["overflow"].mean(axis=(1, 2))
    print("q            " + "".join(f"{q:>8.1f}" for q in qs))
    print("evaluated    " + "".join(f"{x:>8.0f}" for x in ev) + "   (lecture: 68 -> 633)")
    print("test acc     " + "".join(f"{x:>8.3f}" for x in te) + "   (lecture: degrades slowly, not monotone)")
    print("hit cap      " + "".join(f"{x:>8.0%}" for x in capped) + f"   (runs reaching --max-rounds {args.max_rounds})")
    return {"q": qs, "allocations_evaluated": ev, "test_accuracy": te, "hit_round_cap_fraction": capped}


def item_044(args, key):
    header("04.4 monotonicity violations (exhaustive search on every pool)")
    out = {}
    # (a) self-critique blind spot
    system = SelfRefine()
    worlds = wl.random_worlds(jax.random.fold_in(key, 42), args.pools, 5, system.n_skills, 100, 100)
    params = opt.make_params(5, 3, blind_spot=0.3)
    allocs, train, test = pools_tables(system, worlds, params, 5)
    best = train.argmax(axis=1)
    same = allocs[:, 0] == allocs[:, 1]
    best_same = np.where(same[None, :], train, -1).argmax(axis=1)
    p = np.arange(len(best))
    differ = allocs[best, 0] != allocs[best, 1]
    gain = 100 * (test[p, best] - test[p, best_same])
    config = opt.SelectorConfig(system, 5, max_rounds=args.max_rounds)
    g = opt.run_optimizers(config, jax.random.fold_in(key, 440), worlds, sim.stack_params([params]), args.seeds,
                           ("llmselector",))["llmselector"]
    la = g.metrics["allocation"][0]  # [S, P, 3]
    llm_differ = (la[..., 0] != la[..., 1]).mean()
    print(f"blind spot x0.3: best allocation uses a different critic than generator in {differ.sum()}/{len(p)} pools "
          f"(lecture 10/10); best - best same-model critic = {gain.mean():+.1f} pts test (lecture +7.7); "
          f"llmselector ends with critic != generator in {llm_differ:.0%} of runs (lecture 10/10)")
    out["self_refine_blind_spot"] = {"best_differs_pools": int(differ.sum()), "gain_pts": gain.mean(),
                                     "gain_pts_per_pool": gain, "llmselector_differs_fraction": llm_differ}
    # (b) debate diversity
    system = Debate()
    worlds = wl.random_worlds(jax.random.fold_in(key, 42), args.pools, 5, system.n_skills, 100, 100)
    params = opt.make_params(5, 6)
    allocs, train, test = pools_tables(system, worlds, params, 5)
    best = train.argmax(axis=1)
    n_distinct = np.array([len(set(allocs[b, :3].tolist())) for b in best])
    identical = (allocs[:, 0] == allocs[:, 1]) & (allocs[:, 1] == allocs[:, 2])
    best_ident = np.where(identical[None, :], train, -1).argmax(axis=1)
    p = np.arange(len(best))
    gain = 100 * (test[p, best] - test[p, best_ident])
    print(f"debate: best allocation uses 2-3 distinct generator models in {(n_distinct >= 2).sum()}/{len(p)} pools "
          f"(lecture 6/10); best - best with three identical generators = {gain.mean():+.1f} pts test (lecture +2.6)")
    out["debate_diversity"] = {"distinct_generators_per_pool": n_distinct, "pools_2_or_3": int((n_distinct >= 2).sum()),
                               "gain_pts": gain.mean(), "gain_pts_per_pool": gain}
    return out


def pareto(cost, acc):
    """Indices of allocations on the (cost low, accuracy high) frontier, by increasing cost."""
    order = np.lexsort((-acc, cost))
    front, best = [], -1.0
    for i in order:
        if acc[i] > best:
            front.append(i)
            best = acc[i]
    return front


def item_ex7(args, key):
    header("exercise 7: cost (prices A 5, B 3, C 1, D 0.5, E 0.2)")
    system = LocateSolve()
    worlds = wl.lecture_worlds(jax.random.fold_in(key, 41), args.pools)
    price = wl.LECTURE_PRICES
    config = opt.SelectorConfig(system, 5, max_rounds=args.max_rounds)
    out = {}

    def sweep(label, optimizer, field, values, note):
        rows = [opt.make_params(5, 2, start=[C, C], price=price, **{field: v}) for v in values]
        sim.clear_compiled(opt.batch_fn(optimizer, config))
        g = opt.run_optimizers(config, jax.random.fold_in(key, 70), worlds, sim.stack_params(rows), args.seeds,
                               (optimizer,))[optimizer]
        compiles = sim.compile_count(opt.batch_fn(optimizer, config), "run")
        te = g.metrics["test_accuracy"].mean(axis=(1, 2))
        cost = g.metrics["cost_per_question"].mean(axis=(1, 2))
        modes = [Counter(wl.allocation_name(a) for a in g.metrics["allocation"][i].reshape(-1, 2)).most_common(2)
                 for i in range(len(values))]
        print(f"{label} from C+C, {len(values)} settings in {compiles} compilation(s) ({note}):")
        print(f"  {field:>19}   cost  test acc  most common allocations (of {args.pools * args.seeds} runs)")
        for v, c, a, m in zip(values, cost, te, modes, strict=True):
            print(f"  {v:19.2f} {c:6.2f}  {a:8.3f}  " + ", ".join(f"{n} x{k}" for n, k in m))
        out[optimizer] = {field: values, "test_accuracy": te, "cost_per_question": cost,
                          "most_common_allocations": modes, "compilations": compiles}

    sweep("(c1) lambda-penalised llmselector: score - lambda * price / max price", "llmselector", "cost_lambda",
          (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 3.0),
          "scores move in steps of 1, so lambda < 1 only breaks ties")
    sweep("(c2) llmselector, then downgrade each module to the cheapest model within a train-accuracy tolerance",
          "llmselector_downgrade", "downgrade_tolerance", (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6),
          "tolerance = allowed train-accuracy drop")
    allocs, train, test = pools_tables(system, worlds, opt.make_params(5, 2, price=price), 5)
    costs = price[allocs].sum(axis=1)
    front = pareto(costs, train[0])
    print("exact train-set Pareto frontier, pool 0 (cost, train acc, test acc):")
    print("  " + ", ".join(f"{wl.allocation_name(allocs[i])} {costs[i]:.1f}/{train[0, i]:.2f}/{test[0, i]:.2f}"
                           for i in front))
    ab, cc = A * 5 + B, C * 5 + C
    d_pts = 100 * (test[:, ab] - test[:, cc]).mean()
    per_pt = (costs[ab] - costs[cc]) / d_pts
    print(f"(a) A+B costs {costs[ab]:.0f} per question, C+C {costs[cc]:.0f}: {costs[ab] / costs[cc]:.0f}x "
          f"(lecture 8 vs 2, 4x)")
    print(f"(b) A+B - C+C = {d_pts:+.1f} test pts for {costs[ab] - costs[cc]:.0f} more: {per_pt:.3f} per point "
          f"(lecture 48 pts, 0.125 per point > 0.1 -> stay at C+C)")
    out.update({
            "frontier_pool0": [{"allocation": wl.allocation_name(allocs[i]), "cost": costs[i],
                                "train_accuracy": train[0, i], "test_accuracy": test[0, i]} for i in front],
            "ab_minus_cc_test_pts": d_pts, "cost_per_point": per_pt})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pools", type=int, default=10, help="pools (random) / question draws (lecture) (default 10)")
    ap.add_argument("--seeds", type=int, default=2, help="optimizer seeds per pool (default 2)")
    ap.add_argument("--max-rounds", type=int, default=400, help="round cap of llmselector / greedy (default 400)")
    ap.add_argument("--seed", type=int, default=0, help="root seed (default 0)")
    ap.add_argument("--out", default="results/lecture_selector.json", help="JSON output path")
    args = ap.parse_args(argv)
    key = jax.random.key(args.seed)
    t0 = time.time()
    print(f"jaxroute LLMSelector reproduction: {args.pools} pools x {args.seeds} seeds, device {jax.devices()[0].platform}")
    results = {"config": vars(args)}
    for name, fn in (("04.1", item_041), ("04.2", item_042), ("04.3", item_043), ("04.4", item_044),
                     ("exercise_7", item_ex7)):
        t = time.time()
        results[name] = fn(args, key)
        print(f"[{name}: {time.time() - t:.1f} s]")
    results["wall_s"] = time.time() - t0
    path = write_json(args.out, results)
    print(f"\nwrote {path} ({results['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
