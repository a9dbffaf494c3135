"""LLMSelector toy world: systems vs a plain-Python reference, optimizers, stopping rule, budgets, CLI errors."""

import functools
import itertools
import math
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxroute import sim
from jaxroute.cli import main
from jaxroute.errors import JaxrouteError
from jaxroute.selector import optimizers as opt
from jaxroute.selector import world as wl
from jaxroute.selector.systems import Debate, LocateSolve, SelfRefine, get_system

# ----------------------------------------------------------------------------- plain-Python reference


def ref_success(world, q, k, s, n, factor=1.0):
    x = float(world.ability[k, s]) - float(q.difficulty[n]) + float(q.luck[k, n])
    return float(q.uniform[k, n]) < factor / (1.0 + math.exp(-x))


def ref_plurality(a, b, c):
    if a == b or a == c:
        return a
    if b == c:
        return b
    return a


def ref_correct(system_name, world, q, alloc, blind_spot=1.0):
    """End-to-end correctness per question, written question by question."""
    out = []
    for n in range(len(q.difficulty)):
        if system_name == "locate-solve":
            ok = ref_success(world, q, alloc[0], 0, n) and ref_success(world, q, alloc[1], 1, n)
        elif system_name == "self-refine":
            draft = ref_success(world, q, alloc[0], 0, n)
            factor = blind_spot if alloc[1] == alloc[0] else 1.0
            catch = ref_success(world, q, alloc[1], 1, n, factor)
            ok = draft or (catch and ref_success(world, q, alloc[2], 2, n))
        else:
            answers = [0 if ref_success(world, q, alloc[j], 0, n) else int(q.wrong_answer[alloc[j], n])
                       for j in range(3)]
            herd = ref_plurality(*answers)
            picks = [0 if (ref_success(world, q, alloc[3 + d], 1, n) and 0 in answers) else herd for d in range(3)]
            ok = ref_plurality(*picks) == 0
        out.append(ok)
    return np.array(out)


def small_world(system, n_models=3, seed=0, n_q=40):
    return wl.pool(wl.random_worlds(jax.random.key(seed), 1, n_models, system.n_skills, n_q, n_q), 0)


def host(world):
    return jax.tree.map(np.asarray, world)


# ----------------------------------------------------------------------------- systems


@pytest.mark.parametrize("system", [LocateSolve(), SelfRefine(), Debate()], ids=lambda s: s.name)
def test_accuracy_table_matches_reference(system):
    K = 3
    world = small_world(system, K, n_q=40 if system.n_modules <= 3 else 16)
    params = opt.make_params(K, system.n_modules, blind_spot=0.3)
    allocs = opt.all_allocations(K, system.n_modules)
    table = np.asarray(opt.accuracy_table(system, allocs, world.ability, world.train, params, batch_size=7))
    hw = host(world)
    ref = [ref_correct(system.name, hw, hw.train, list(a), 0.3).mean() for a in np.asarray(allocs)]
    np.testing.assert_allclose(table, ref, atol=1e-6)
    assert len(set(np.round(table, 6))) > 3  # the allocations really differ


def test_all_allocations_enumerates_every_allocation_once():
    a = np.asarray(opt.all_allocations(3, 3))
    assert a.shape == (27, 3)
    assert sorted(map(tuple, a)) == list(itertools.product(range(3), repeat=3))
    assert tuple(a[5]) == (0, 1, 2)  # base-K digits, module 0 most significant


def test_debate_identical_wrong_generators_cannot_be_rescued():
    """Three copies of a model give the same wrong answer; a perfect debater can only pick among them."""
    system = Debate()
    q = wl.Questions(difficulty=jnp.zeros(1), luck=jnp.zeros((2, 1)), uniform=jnp.full((2, 1), 0.5),
                     wrong_answer=jnp.array([[3], [2]], jnp.int32))
    ability = jnp.array([[-5.0, -5.0], [5.0, 5.0]])  # model 0 always wrong, model 1 always right
    correct, ok = system.outcome(jnp.array([0, 0, 0, 1, 1, 1]), ability, q)
    assert not bool(correct[0])
    correct, ok = system.outcome(jnp.array([0, 0, 1, 1, 1, 1]), ability, q)  # one right answer among three
    assert bool(correct[0]) and ok[:, 0].tolist() == [False, False, True, True, True, True]
    correct, _ = system.outcome(jnp.array([0, 0, 1, 0, 0, 1]), ability, q)  # two weak debaters follow the herd
    assert not bool(correct[0])


def test_self_critique_blind_spot():
    system = SelfRefine()
    q = wl.Questions(difficulty=jnp.zeros(1), luck=jnp.zeros((2, 1)), uniform=jnp.full((2, 1), 0.5),
                     wrong_answer=jnp.ones((2, 1), jnp.int32))
    # model 0: drafts wrong (skill 0), critiques with p = sigmoid(1) = 0.73, refines well
    ability = jnp.array([[-3.0, 1.0, 3.0], [-3.0, 1.0, 3.0]])
    same, _ = system.outcome(jnp.array([0, 0, 0]), ability, q, blind_spot=1.0)
    blind, _ = system.outcome(jnp.array([0, 0, 0]), ability, q, blind_spot=0.3)  # 0.3 * 0.73 < 0.5
    other, _ = system.outcome(jnp.array([0, 1, 0]), ability, q, blind_spot=0.3)
    assert bool(same[0]) and not bool(blind[0]) and bool(other[0])


# ----------------------------------------------------------------------------- aggregation and stopping


def ref_aggregate(score):
    """The authors' rule: Counter over every tied-best candidate of every question, most_common(1)."""
    freq = Counter()
    for n in range(score.shape[1]):
        col = score[:, n]
        for k in range(score.shape[0]):
            if col[k] == col.max():
                freq[k] += 1
    return freq.most_common(1)[0][0]


@pytest.mark.parametrize("score, expected", [
    ([[2, 1, 0, 1], [2, 1, 1, 0], [0, 0, 1, 1]], 0),  # counts 3, 3, 2: tie -> first seen (question 0, model 0)
    ([[0, 2, 2], [1, 0, 0], [1, 2, 2]], 2),  # counts 2, 1, 3
    ([[0, 1], [1, 0], [1, 0]], 1),  # counts 1, 1, 1: model 1 is seen first (question 0), not model 0
])
def test_tie_aggregation_hand_cases(score, expected):
    s = np.array(score, np.float32)
    assert int(opt.aggregate_tied_best(jnp.asarray(s))) == expected == ref_aggregate(s)


def test_tie_aggregation_matches_counter_on_random_scores():
    rng = np.random.default_rng(0)
    agg = jax.jit(opt.aggregate_tied_best)
    for _ in range(200):
        s = rng.integers(0, 3, size=(4, 6)).astype(np.float32)
        assert int(agg(jnp.asarray(s))) == ref_aggregate(s)


def test_stopping_rule_hand_cases():
    C, A, B = 2, 0, 1
    hist = lambda *xs: jnp.array(xs, jnp.int32)
    # exercise 6(b): C+C -> A+C -> A+B -> A+B -> A+B stops (the last L+1 = 3 are identical)
    assert bool(opt.converged(hist([A, B], [A, B], [A, B]), jnp.int32(5)))
    assert not bool(opt.converged(hist([A, C], [A, B], [A, B]), jnp.int32(4)))
    # the initial allocation counts, but fewer than L+1 recorded allocations never stop
    assert not bool(opt.converged(hist([C, C], [C, C], [C, C]), jnp.int32(2)))
    assert bool(opt.converged(hist([C, C], [C, C], [C, C]), jnp.int32(3)))


# ----------------------------------------------------------------------------- optimizers


LS = LocateSolve()
LECTURE = wl.lecture_worlds(jax.random.key(0), 3)
CONFIG = opt.SelectorConfig(LS, 5, max_rounds=50)
A_B = [0, 1]


@functools.cache
def _jitted(name, config):
    return jax.jit(lambda k, w, p: opt.run_one(name, k, w, p, config))


def run_on(name, world, params, key=1, config=CONFIG):
    return jax.tree.map(np.asarray, _jitted(name, config)(jax.random.key(key), world, params))


def test_lecture_case_cc_is_a_local_optimum_and_ab_is_best():
    for p in range(3):
        w = wl.pool(LECTURE, p)
        acc = np.asarray(opt.accuracy_table(LS, opt.all_allocations(5, 2), w.ability, w.train,
                                            opt.make_params(5, 2))).reshape(5, 5)
        cc = acc[2, 2]
        assert 0.3 < cc < 0.6
        assert acc[:, 2].max() <= cc and acc[2, :].max() <= cc  # no single swap helps
        assert np.unravel_index(acc.argmax(), acc.shape) == (0, 1) and acc[0, 1] > 0.9


def test_llmselector_reaches_ab_from_cc_greedy_stays():
    w = wl.pool(LECTURE, 0)
    params = opt.make_params(5, 2, start=[2, 2], diagnoser_accuracy=1.0)
    r = run_on("llmselector", w, params)
    assert r["allocation"].tolist() == A_B
    # exercise 6(b): C+C -> A+C -> A+B -> A+B -> A+B: 4 rounds x 5 models = 20 allocations
    assert int(r["rounds"]) == 4 and int(r["allocations_evaluated"]) == 20 and not r["overflow"]
    g = run_on("greedy", w, params)
    assert g["allocation"].tolist() == [2, 2] and int(g["allocations_evaluated"]) == 10


def test_llmselector_q1_reaches_ab_from_every_start_in_one_compiled_call():
    starts = np.asarray(opt.all_allocations(5, 2))
    batch = sim.stack_params([opt.make_params(5, 2, start=s) for s in starts])
    fn = opt.batch_fn("llmselector", CONFIG)
    sim.clear_compiled(fn)
    grid = sim.run_batch_fn(fn, jax.random.key(2), LECTURE, batch, 2)
    assert sim.compile_count(fn, "run") == 1
    alloc = grid.metrics["allocation"]  # [25, 2, 3, 2]
    assert (alloc[..., 0] == 0).all() and (alloc[..., 1] == 1).all()
    assert not grid.overflow.any()


def test_exhaustive_is_the_true_optimum_and_beats_every_optimizer():
    for system in (SelfRefine(), Debate()):
        K = 3
        world = small_world(system, K, seed=3, n_q=60 if system.n_modules == 3 else 20)
        params = opt.make_params(K, system.n_modules)
        config = opt.SelectorConfig(system, K, max_rounds=100)
        hw = host(world)
        ref = {a: ref_correct(system.name, hw, hw.train, list(a)).mean()
               for a in itertools.product(range(K), repeat=system.n_modules)}
        best = max(ref.values())
        ex = run_on("exhaustive", world, params, config=config)
        assert ref[tuple(ex["allocation"].tolist())] == best
        assert np.isclose(ex["train_accuracy"], best) and int(ex["allocations_evaluated"]) == K**system.n_modules
        others = ("llmselector", "greedy", "random_search", "best_single") if system.n_modules == 3 else ()
        for name in others:
            assert run_on(name, world, params, config=config)["train_accuracy"] <= best + 1e-6


def test_budget_accounting():
    w = wl.pool(LECTURE, 1)
    params = opt.make_params(5, 2, diagnoser_accuracy=0.7)  # random start, noisy diagnoser
    for key in range(4):
        llm = run_on("llmselector", w, params, key)
        assert int(llm["allocations_evaluated"]) == 5 * int(llm["rounds"]) >= 5 * 2
        evaluated = int(run_on("random_search", w, params, key)["allocations_evaluated"])
        assert evaluated == int(llm["allocations_evaluated"])
        g = run_on("greedy", w, params, key)
        assert int(g["allocations_evaluated"]) == 5 * int(g["rounds"])
    assert int(run_on("best_single", w, params)["allocations_evaluated"]) == 5
    # started at the optimum, it still needs L rounds to record L+1 identical allocations
    at_opt = run_on("llmselector", w, opt.make_params(5, 2, start=A_B))
    assert int(at_opt["rounds"]) == 2 and int(at_opt["allocations_evaluated"]) == 10


def test_round_cap_is_flagged():
    w = wl.pool(LECTURE, 0)
    tiny = opt.SelectorConfig(LS, 5, max_rounds=2)
    r = run_on("llmselector", w, opt.make_params(5, 2, start=[2, 2]), config=tiny)
    assert bool(r["overflow"]) and int(r["rounds"]) == 2


def test_cost_penalty_picks_cheaper_allocations():
    w = wl.pool(LECTURE, 0)
    price = wl.LECTURE_PRICES
    free = run_on("llmselector", w, opt.make_params(5, 2, start=[2, 2], price=price))
    costly = run_on("llmselector", w, opt.make_params(5, 2, start=[2, 2], price=price, cost_lambda=3.0))
    assert float(free["cost_per_question"]) == 8.0
    assert float(costly["cost_per_question"]) < 8.0


def test_deterministic_under_fixed_keys_and_batch_of_one():
    w = wl.pool(LECTURE, 2)
    params = opt.make_params(5, 2, diagnoser_accuracy=0.8)
    a, b = run_on("llmselector", w, params, 7), run_on("llmselector", w, params, 7)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    one = jax.tree.map(lambda x: x[None], w)
    batched = jax.jit(opt.batch_fn("llmselector", CONFIG))(jax.random.key(7), one, params)
    assert batched["allocation"].shape == (1, 2)
    k0 = jax.random.split(jax.random.key(7), 1)[0]
    direct = jax.tree.map(np.asarray, _jitted("llmselector", CONFIG)(k0, w, params))
    np.testing.assert_array_equal(np.asarray(batched["allocation"][0]), direct["allocation"])
    np.testing.assert_array_equal(np.asarray(batched["allocations_evaluated"][0]), direct["allocations_evaluated"])


def test_threshold_variant_is_deterministic_success():
    q = wl.draw_questions(jax.random.key(0), 2, 50, threshold=True)
    assert np.all(np.asarray(q.uniform) == 0.5)
    ability = jnp.array([[0.3, -0.2], [1.0, 0.0]])
    from jaxroute.selector.systems import success_prob

    succ = np.asarray(q.uniform[:, None, :] < success_prob(ability, q))
    margin = np.asarray(ability[:, :, None] - q.difficulty[None, None, :] + q.luck[:, None, :])
    np.testing.assert_array_equal(succ, margin > 0)


# ----------------------------------------------------------------------------- bad input


def test_bad_input_errors():
    with pytest.raises(JaxrouteError, match="unknown system"):
        get_system("chain-of-thought")
    with pytest.raises(JaxrouteError, match="too large"):
        opt.check_exhaustive(11, 6)
    opt.check_exhaustive(10, 6)  # 10^6 is allowed
    with pytest.raises(JaxrouteError, match="unknown optimizer"):
        opt.batch_fn("annealing", CONFIG)
    with pytest.raises(JaxrouteError, match="modules"):
        wl.parse_allocation("C", 5, 2)
    with pytest.raises(JaxrouteError, match="unknown model 'F'"):
        wl.parse_allocation("A,F", 5, 2)
    assert wl.parse_allocation("c+b", 5, 2) == [2, 1]


@pytest.mark.parametrize("argv, message", [
    (["--system", "tree-of-thought"], "unknown system"),
    (["--world", "mars"], "unknown world"),
    (["--start", "C,Z"], "unknown model 'Z'"),
    (["--start", "C,C,C"], "modules"),
    (["--system", "debate"], "constructed locate-solve"),
    (["--world", "random", "--system", "debate", "--models", "11"], "too large"),
    (["--diagnoser-accuracy", "1.5"], "--diagnoser-accuracy"),
    (["--prices", "1,2"], "--prices"),
    (["--optimizers", "llmselector,annealing"], "unknown optimizer"),
])
def test_cli_bad_input(capsys, argv, message):
    try:
        code = main(["select", *argv])
    except SystemExit as e:  # a malformed number is an argparse usage error (exit 2)
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert "jaxroute select: error:" in err and message in err and "Traceback" not in err


def test_cli_runs_and_writes_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = ["select", "--start", "C,C", "--pools", "2", "--seeds", "2", "--optimizers", "llmselector,greedy",
            "--diagnoser-accuracy", "0.8", "--out", str(out)]
    assert main(argv) == 0
    import json

    data = json.loads(out.read_text())
    rows = {r["policy"]: r for r in data["results"]}
    assert set(rows) == {"llmselector", "greedy"}
    assert set(rows["llmselector"]["metrics"]) >= {"test_accuracy", "train_accuracy", "allocations_evaluated"}
    assert rows["llmselector"]["metrics"]["test_accuracy"]["mean"] > 0.9
    assert rows["greedy"]["metrics"]["test_accuracy"]["mean"] < 0.6
    assert "A+B" in capsys.readouterr().out


def test_downgrade_after_convergence():
    w = wl.pool(LECTURE, 0)
    price = wl.LECTURE_PRICES
    keep = run_on("llmselector_downgrade", w, opt.make_params(5, 2, start=[2, 2], price=price))
    assert keep["allocation"].tolist() == A_B and int(keep["allocations_evaluated"]) == 20 + 5 * 2
    anything = run_on("llmselector_downgrade", w, opt.make_params(5, 2, start=[2, 2], price=price,
                                                                  downgrade_tolerance=1.0))
    assert anything["allocation"].tolist() == [4, 4]  # every model acceptable: the cheapest, E+E
