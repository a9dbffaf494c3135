"""Model-allocation optimizers for compound systems, each a pure function of (key, world, params).

Optimizers (names are the `policy` of a result row):
- `llmselector` (Chen et al. 2025, Algorithm 1, as in the authors' open-source optimizer):
  modules are nominated round robin (round r optimizes module r mod L). For each candidate
  model k of that module the system runs on the training questions; each question scores
  candidate k as  diagnoser judgment + gamma * end-to-end correctness  (minus an optional
  cost penalty lambda * price_k / max price, exercise 7). The diagnoser says whether the
  nominated module caused the error: a correctly answered question is always "no error";
  on a wrong one it gives the true verdict with probability q (`diagnoser_accuracy`) and
  the opposite one otherwise. Aggregation counts, over questions, every tied-best
  candidate; the most common candidate wins, ties broken by first occurrence (scanning
  questions in order, candidates in model order: what `Counter.most_common` does).
  It stops when the last L + 1 allocations, counting the initial one, are identical.
  Budget: K allocations evaluated per round.
- `greedy`: the same round-robin loop and stopping rule, but each round keeps the candidate
  with the best end-to-end training accuracy (the current model is kept unless strictly
  beaten; otherwise the lowest index wins ties). K allocations per round.
- `random_search`: as many allocations as `llmselector` evaluates with the same key, drawn
  uniformly from the K^L allocations; keeps the best on the training set.
- `exhaustive`: all K^L allocations (K^L <= MAX_EXHAUSTIVE); first best on the training set.
- `best_single`: the best allocation that uses one model for every module (K evaluated).
- `llmselector_downgrade` (exercise 7, not in the default set): llmselector, then one pass
  over the modules that moves each to the cheapest model whose allocation keeps the training
  accuracy within `downgrade_tolerance` of the converged one (K more evaluations per module).

A search loop that reaches `max_rounds` without meeting its stopping rule reports
`overflow = True` (the CLI refuses to print such a table without --allow-overflow).

`run_one(optimizer, key, world, params, config)` solves one world; `batch_fn(optimizer, config)`
returns the (cached) `fn(key, worlds, params)` that solves P stacked pools, for
`sim.run_batch_fn` (configs x seeds in one compiled call per optimizer).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute.errors import JaxrouteError
from jaxroute.selector.names import EXTRA_OPTIMIZERS, OPTIMIZERS
from jaxroute.selector.world import Questions, World

MAX_EXHAUSTIVE = 10**6  # K^L allocations; K <= 10 and L <= 6 on a GPU


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SelectorParams:
    """Traced settings of one run (sweeps vmap over them)."""

    start: jax.Array  # [L] int32: initial allocation; -1 in any entry draws a random one
    price: jax.Array  # [K] float32: cost per call of each model (exercise 7)
    diagnoser_accuracy: jax.Array | float = 1.0  # q: P(diagnoser verdict on a wrong answer is right)
    gamma: jax.Array | float = 1.0  # weight of end-to-end correctness in the module score
    cost_lambda: jax.Array | float = 0.0  # weight of price_k / max price subtracted from the score
    blind_spot: jax.Array | float = 1.0  # self-refine: catch-probability factor when critic == generator
    downgrade_tolerance: jax.Array | float = 0.0  # llmselector_downgrade: allowed train-accuracy drop


def make_params(n_models: int, n_modules: int, start=None, price=None, **kw) -> SelectorParams:
    start = np.full(n_modules, -1, np.int32) if start is None else np.asarray(start, np.int32)
    price = np.ones(n_models, np.float32) if price is None else np.asarray(price, np.float32)
    kw = {k: jnp.float32(v) for k, v in kw.items()}
    return SelectorParams(start=jnp.asarray(start), price=jnp.asarray(price), **kw)


@dataclasses.dataclass(frozen=True)
class SelectorConfig:
    """Static configuration: the system (L, S), pool size K, and the round cap of search loops."""

    system: object
    n_models: int
    max_rounds: int = 400
    exhaustive_batch: int = 4096  # allocations evaluated per lax.map step in exhaustive search


# ----------------------------------------------------------------------------- evaluation


def accuracy(system, alloc, ability, questions: Questions, params: SelectorParams) -> jax.Array:
    """End-to-end accuracy of one allocation on a question set (a scalar in [0, 1])."""
    correct, _ = system.outcome(alloc, ability, questions, params.blind_spot)
    return jnp.mean(correct.astype(jnp.float32))


def all_allocations(n_models: int, n_modules: int) -> jax.Array:
    """Every allocation in lexicographic order (index i -> base-K digits, module 0 most significant).

    [K^L, L] int32
    """
    idx = jnp.arange(n_models**n_modules, dtype=jnp.int32)
    powers = n_models ** jnp.arange(n_modules - 1, -1, -1, dtype=jnp.int32)
    return (idx[:, None] // powers[None, :]) % n_models


def accuracy_table(system, allocs, ability, questions, params, batch_size: int = 4096) -> jax.Array:
    """Accuracy of many allocations [A, L] -> [A], evaluated as one (batched) map over a vmap."""
    fn = lambda a: accuracy(system, a, ability, questions, params)
    return jax.lax.map(fn, allocs, batch_size=min(batch_size, allocs.shape[0]))


def check_exhaustive(n_models: int, n_modules: int) -> None:
    if n_models**n_modules > MAX_EXHAUSTIVE:
        raise JaxrouteError(f"exhaustive search over {n_models}^{n_modules} = {n_models**n_modules:,} "
                            f"allocations is too large (limit {MAX_EXHAUSTIVE:,}); use fewer models or "
                            "leave exhaustive out of --optimizers")


# ----------------------------------------------------------------------------- round-robin search


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SearchState:
    round: jax.Array  # [] int32: rounds done
    alloc: jax.Array  # [L] int32: current allocation
    history: jax.Array  # [L+1, L] int32: the last L+1 allocations (oldest first)
    n_history: jax.Array  # [] int32: allocations recorded so far, counting the initial one
    evaluated: jax.Array  # [] int32: allocations evaluated


def converged(history: jax.Array, n_history: jax.Array) -> jax.Array:
    """The stopping rule: the last L+1 allocations (counting the initial one) are identical."""
    return (n_history >= history.shape[0]) & jnp.all(history == history[-1])


def candidates(alloc: jax.Array, module: jax.Array, n_models: int) -> jax.Array:
    """Allocation `alloc` with module `module` set to each model in turn. [K, L] int32"""
    onehot = jnp.arange(alloc.shape[0]) == module
    return jnp.where(onehot[None, :], jnp.arange(n_models, dtype=jnp.int32)[:, None], alloc[None, :])


def aggregate_tied_best(score: jax.Array) -> jax.Array:
    """LLMSelector's aggregation: score [K, N] -> chosen candidate index.

    Count, over questions, every candidate tied for the best score; the most common wins,
    ties broken by first occurrence (question order, then candidate order).
    """
    n_cand, n_q = score.shape
    tied = score == jnp.max(score, axis=0, keepdims=True)
    counts = jnp.sum(tied, axis=1)
    order = jnp.arange(n_q)[None, :] * n_cand + jnp.arange(n_cand)[:, None]
    first = jnp.min(jnp.where(tied, order, n_q * n_cand), axis=1)
    eligible = counts == jnp.max(counts)
    return jnp.argmin(jnp.where(eligible, first, n_q * n_cand + 1))


def module_scores(key, correct, module_ok, module, params: SelectorParams) -> jax.Array:
    """Per-question module scores of K candidates: diagnoser judgment + gamma * correctness - cost.

    correct [K, N] bool, module_ok [K, L, N] bool -> [K, N] float32
    """
    truly_erred = ~correct & ~module_ok[:, module, :]
    lie = jax.random.uniform(key, correct.shape) >= params.diagnoser_accuracy
    judged_erred = jnp.where(correct, False, truly_erred ^ lie)
    cost = params.cost_lambda * params.price / jnp.max(params.price)
    return (1.0 - judged_erred) + params.gamma * correct - cost[:, None]


def _initial_allocation(key, params: SelectorParams, n_models: int) -> jax.Array:
    rand = jax.random.randint(key, params.start.shape, 0, n_models, dtype=jnp.int32)
    return jnp.where(jnp.any(params.start < 0), rand, params.start).astype(jnp.int32)


def _round_robin(key, world: World, params: SelectorParams, config: SelectorConfig, choose):
    """The loop shared by llmselector and greedy. choose(key, cands, module, alloc) -> new allocation."""
    n_models, n_modules = config.n_models, config.system.n_modules
    k_init, k_loop = jax.random.split(key)
    alloc = _initial_allocation(k_init, params, n_models)
    init = SearchState(round=jnp.int32(0), alloc=alloc, history=jnp.tile(alloc, (n_modules + 1, 1)),
                       n_history=jnp.int32(1), evaluated=jnp.int32(0))

    def cond(s: SearchState):
        return ~converged(s.history, s.n_history) & (s.round < config.max_rounds)

    def body(s: SearchState):
        module = s.round % n_modules
        cands = candidates(s.alloc, module, n_models)
        new = choose(jax.random.fold_in(k_loop, s.round), cands, module, s.alloc)
        history = jnp.concatenate([s.history[1:], new[None, :]])
        return SearchState(round=s.round + 1, alloc=new, history=history, n_history=s.n_history + 1,
                           evaluated=s.evaluated + n_models)

    final = jax.lax.while_loop(cond, body, init)
    return final.alloc, final.evaluated, final.round, ~converged(final.history, final.n_history)


def _outcomes(system, cands, world: World, params: SelectorParams):
    return jax.vmap(lambda a: system.outcome(a, world.ability, world.train, params.blind_spot))(cands)


def llmselector(key, world: World, params: SelectorParams, config: SelectorConfig):
    system = config.system

    def choose(k, cands, module, alloc):
        correct, module_ok = _outcomes(system, cands, world, params)
        return cands[aggregate_tied_best(module_scores(k, correct, module_ok, module, params))]

    return _round_robin(key, world, params, config, choose)


def greedy(key, world: World, params: SelectorParams, config: SelectorConfig):
    system = config.system

    def choose(k, cands, module, alloc):
        correct, _ = _outcomes(system, cands, world, params)
        acc = jnp.mean(correct.astype(jnp.float32), axis=1)
        keep = acc[alloc[module]] >= jnp.max(acc)
        return jnp.where(keep, alloc, cands[jnp.argmax(acc)])

    return _round_robin(key, world, params, config, choose)


def random_search(key, world: World, params: SelectorParams, config: SelectorConfig):
    """Uniform samples with llmselector's budget (the same key gives the same budget), K per step."""
    system, n_models, n_modules = config.system, config.n_models, config.system.n_modules
    _, budget, rounds, capped = llmselector(key, world, params, config)
    k_sample = jax.random.fold_in(key, 1)

    def body(carry):
        i, best_alloc, best_acc = carry
        cands = jax.random.randint(jax.random.fold_in(k_sample, i), (n_models, n_modules), 0, n_models,
                                   dtype=jnp.int32)
        acc = jax.vmap(lambda a: accuracy(system, a, world.ability, world.train, params))(cands)
        j = jnp.argmax(acc)
        better = acc[j] > best_acc
        return i + 1, jnp.where(better, cands[j], best_alloc), jnp.where(better, acc[j], best_acc)

    init = (jnp.int32(0), jnp.zeros(n_modules, jnp.int32), jnp.float32(-1.0))
    _, alloc, _ = jax.lax.while_loop(lambda c: c[0] * n_models < budget, body, init)
    return alloc, budget, rounds, capped


def exhaustive(key, world: World, params: SelectorParams, config: SelectorConfig):
    allocs = all_allocations(config.n_models, config.system.n_modules)
    acc = accuracy_table(config.system, allocs, world.ability, world.train, params, config.exhaustive_batch)
    return allocs[jnp.argmax(acc)], jnp.int32(allocs.shape[0]), jnp.int32(0), jnp.bool_(False)


def best_single(key, world: World, params: SelectorParams, config: SelectorConfig):
    allocs = jnp.tile(jnp.arange(config.n_models, dtype=jnp.int32)[:, None], (1, config.system.n_modules))
    acc = jax.vmap(lambda a: accuracy(config.system, a, world.ability, world.train, params))(allocs)
    return allocs[jnp.argmax(acc)], jnp.int32(config.n_models), jnp.int32(0), jnp.bool_(False)


def llmselector_downgrade(key, world: World, params: SelectorParams, config: SelectorConfig):
    system, n_models = config.system, config.n_models
    alloc, evaluated, rounds, capped = llmselector(key, world, params, config)
    acc_of = jax.vmap(lambda a: accuracy(system, a, world.ability, world.train, params))
    floor = accuracy(system, alloc, world.ability, world.train, params) - params.downgrade_tolerance - 1e-6

    def downgrade(module, alloc):
        cands = candidates(alloc, module, n_models)
        acceptable = acc_of(cands) >= floor  # the current model always is
        return cands[jnp.argmin(jnp.where(acceptable, params.price, jnp.inf))]

    alloc = jax.lax.fori_loop(0, system.n_modules, downgrade, alloc)
    return alloc, evaluated + n_models * system.n_modules, rounds, capped


_FUNCTIONS = {"llmselector": llmselector, "llmselector_downgrade": llmselector_downgrade, "greedy": greedy,
              "random_search": random_search, "exhaustive": exhaustive, "best_single": best_single}


def run_one(optimizer: str, key, world: World, params: SelectorParams, config: SelectorConfig) -> dict:
    """Solve one world with one optimizer; metrics of the chosen allocation. Pure and jittable."""
    alloc, evaluated, rounds, capped = _FUNCTIONS[optimizer](key, world, params, config)
    system = config.system
    return {
        "train_accuracy": accuracy(system, alloc, world.ability, world.train, params),
        "test_accuracy": accuracy(system, alloc, world.ability, world.test, params),
        "allocations_evaluated": evaluated,
        "rounds": rounds,
        "cost_per_question": jnp.sum(params.price[alloc]),
        "allocation": alloc,
        "overflow": capped,
    }


def check_optimizer(name: str) -> str:
    if name not in _FUNCTIONS:
        raise JaxrouteError(f"unknown optimizer '{name}'; choose from: {', '.join(OPTIMIZERS + EXTRA_OPTIMIZERS)}")
    return name


@functools.cache
def batch_fn(optimizer: str, config: SelectorConfig):
    """`fn(key, worlds, params)` solving P stacked pools (one key per pool), for sim.run_batch_fn.

    Cached per (optimizer, config) so a grid of configs x seeds compiles once per optimizer.
    """
    check_optimizer(optimizer)
    if optimizer == "exhaustive":
        check_exhaustive(config.n_models, config.system.n_modules)

    def fn(key, worlds, params):
        n_pools = jax.tree.leaves(worlds)[0].shape[0]
        keys = jax.random.split(key, n_pools)
        return jax.vmap(lambda k, w: run_one(optimizer, k, w, params, config))(keys, worlds)

    fn.__qualname__ = f"select.{optimizer}"
    return fn


# ----------------------------------------------------------------------------- grids


def run_optimizers(config: SelectorConfig, key, worlds: World, params_batch: SelectorParams, n_seeds: int,
                   optimizers=OPTIMIZERS, progress: bool = False) -> dict:
    """Run each optimizer on every (config row, seed, pool): {name: sim.GridResult with [C, S, P] metrics}.

    One compiled call per optimizer (pools are vmapped inside, configs x seeds by the engine).
    Seed s uses the same key for every optimizer, so rows are paired comparisons.
    """
    from jaxroute import sim

    fns = {name: batch_fn(check_optimizer(name), config) for name in optimizers}  # validates first
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(fns), desc="optimizers", unit="opt", leave=False)
    out = {}
    for name, fn in fns.items():
        out[name] = sim.run_batch_fn(fn, key, worlds, params_batch, n_seeds)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return out
