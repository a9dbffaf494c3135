"""`jaxroute select`: which model should each module of a compound AI system use (LLMSelector, lecture §4)."""

from __future__ import annotations

from collections import Counter

from jaxroute.commands._common import (
    add_grid_args,
    check_overflow,
    choose,
    csv_list,
    list_of,
    non_negative_float,
    positive_float,
    positive_int,
    probability,
    save_outputs,
    show_progress,
)
from jaxroute.errors import JaxrouteError
from jaxroute.selector.names import EXTRA_OPTIMIZERS, OPTIMIZERS, SYSTEMS

METRICS = ("test_accuracy", "train_accuracy", "allocations_evaluated")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "select",
        help="model selection for compound AI systems: LLMSelector vs greedy, random, exhaustive, best single",
        description="Choose a model for every module of a compound AI system in LLMSelector's toy world "
        "(lecture §4): K models with a general level and a per-skill specialty, questions with a "
        "difficulty, per-(model, question) luck shared across skills. Every optimizer runs on all pools "
        "and seeds in one compiled call. Rows: mean over pools, 95 % CI over seeds.",
    )
    p.add_argument("--system", default="locate-solve", metavar="NAME",
                   help=f"compound system: {', '.join(SYSTEMS)} (default locate-solve)")
    p.add_argument("--world", default="lecture", metavar="KIND",
                   help="lecture: the constructed five-model locate-solve case (A locates, B solves, C is a "
                   "middling generalist; C+C is a local optimum); random: random pools (default lecture)")
    p.add_argument("--start", metavar="X,Y,...",
                   help="initial allocation, one model letter per module (e.g. C,C); default: random per run")
    p.add_argument("--models", type=positive_int, default=5, metavar="K",
                   help="models per random pool (the lecture world always has 5) (default 5)")
    p.add_argument("--pools", type=positive_int, default=10, metavar="P",
                   help="independent worlds (random pools, or question draws of the lecture world) (default 10)")
    p.add_argument("--diagnoser-accuracy", type=probability, default=1.0, metavar="Q",
                   help="probability that the diagnoser's verdict on a wrong answer is right (default 1.0)")
    p.add_argument("--gamma", type=non_negative_float, default=1.0, metavar="G",
                   help="weight of end-to-end correctness in LLMSelector's module score (default 1.0)")
    p.add_argument("--blind-spot", type=probability, default=1.0, metavar="F",
                   help="self-refine: the critic's catch probability is multiplied by F when it is the "
                   "generator's model (0.3 = the lecture's blind spot; default 1.0 = none)")
    p.add_argument("--prices", type=list_of(positive_float, unique=False), metavar="P1,P2,...",
                   help="price per call of each model (default: A 5, B 3, C 1, D 0.5, E 0.2 for the lecture "
                   "world, 1 each for random pools); reported as cost_per_question")
    p.add_argument("--cost-lambda", type=non_negative_float, default=0.0, metavar="L",
                   help="LLMSelector subtracts L * price / max price from each candidate's score (exercise 7) (default 0)")
    p.add_argument("--optimizers", default=",".join(OPTIMIZERS), metavar="LIST",
                   help=f"comma list from: {', '.join(OPTIMIZERS + EXTRA_OPTIMIZERS)} (default: "
                   f"{', '.join(OPTIMIZERS)}; llmselector_downgrade then moves modules to cheaper models, "
                   "exercise 7)")
    p.add_argument("--downgrade-tolerance", type=non_negative_float, default=0.0, metavar="T",
                   help="llmselector_downgrade: largest train-accuracy drop accepted for a cheaper model (default 0)")
    p.add_argument("--train", type=positive_int, default=100, metavar="N", help="training questions (default 100)")
    p.add_argument("--test", type=positive_int, default=100, metavar="N", help="test questions (default 100)")
    p.add_argument("--threshold", action="store_true",
                   help="deterministic success (ability - difficulty + luck > 0) instead of the sigmoid draw (default: the sigmoid draw)")
    p.add_argument("--max-rounds", type=positive_int, default=400, metavar="R",
                   help="cap on LLMSelector / greedy rounds; a run that hits it is flagged as overflow (default 400)")
    add_grid_args(p, seeds=4, seeds_help="optimizer seeds: random start, diagnoser errors, random-search draws")
    p.set_defaults(func=run)


def build(args):
    """Validate the arguments; return (system, config, worlds, params) for the run."""
    system_name = choose([args.system], SYSTEMS, "system")[0]
    world_kind = choose([args.world], ("lecture", "random"), "world")[0]
    optimizers = choose(csv_list(args.optimizers), OPTIMIZERS + EXTRA_OPTIMIZERS, "optimizer")
    # the models, once the flags are checked
    import jax
    import numpy as np

    from jaxroute.selector import optimizers as opt
    from jaxroute.selector import world as wl
    from jaxroute.selector.systems import get_system

    system = get_system(system_name)
    if world_kind == "lecture":
        if system.name != "locate-solve":
            raise JaxrouteError(f"--world lecture is the constructed locate-solve case; use --world random "
                                f"for {system.name}")
        if args.models != 5:
            raise JaxrouteError("--world lecture always has 5 models (A-E); --models applies to --world random")
        n_models, default_prices = 5, wl.LECTURE_PRICES
    else:
        if not 2 <= args.models <= len(wl.MODEL_NAMES):
            raise JaxrouteError(f"--models must be between 2 and {len(wl.MODEL_NAMES)}, got {args.models}")
        n_models, default_prices = args.models, np.ones(args.models, np.float32)
    if "exhaustive" in optimizers:
        opt.check_exhaustive(n_models, system.n_modules)
    start = None if args.start is None else wl.parse_allocation(args.start, n_models, system.n_modules)
    prices = default_prices
    if args.prices is not None:
        prices = np.array(args.prices, np.float32)
        if prices.shape != (n_models,):
            raise JaxrouteError(f"--prices needs {n_models} positive numbers (one per model), got {len(prices)}")
    params = opt.make_params(n_models, system.n_modules, start=start, price=prices,
                             diagnoser_accuracy=args.diagnoser_accuracy, gamma=args.gamma,
                             cost_lambda=args.cost_lambda, blind_spot=args.blind_spot,
                             downgrade_tolerance=args.downgrade_tolerance)
    config = opt.SelectorConfig(system, n_models, max_rounds=args.max_rounds)
    key_world = jax.random.fold_in(jax.random.key(args.seed), 0)
    if world_kind == "lecture":
        worlds = wl.lecture_worlds(key_world, args.pools, args.train, args.test, threshold=args.threshold)
    else:
        worlds = wl.random_worlds(key_world, args.pools, n_models, system.n_skills, args.train, args.test,
                                  threshold=args.threshold)
    return system, config, worlds, params, optimizers


def most_common_allocation(grid) -> str:
    """The final allocation found most often over seeds and pools, with its share."""
    import numpy as np

    from jaxroute.selector import world as wl

    allocs = np.asarray(grid.metrics["allocation"]).reshape(-1, grid.metrics["allocation"].shape[-1])
    counts = Counter(wl.allocation_name(a) for a in allocs)
    name, n = counts.most_common(1)[0]
    return f"{name} ({n}/{len(allocs)})"


def run(args) -> int:
    system, config, worlds, params, optimizers = build(args)
    import jax
    import numpy as np

    from jaxroute import report, sim
    from jaxroute.selector import optimizers as opt

    key = jax.random.fold_in(jax.random.key(args.seed), 1)
    grids = opt.run_optimizers(config, key, worlds, sim.stack_params([params]), args.seeds, optimizers,
                               progress=show_progress(args))
    param_row = {"start": args.start or "random", "diagnoser_accuracy": args.diagnoser_accuracy,
                 "gamma": args.gamma, "blind_spot": args.blind_spot, "cost_lambda": args.cost_lambda,
                 "downgrade_tolerance": args.downgrade_tolerance}
    records, modes = [], {}
    for name, grid in grids.items():
        (rec,) = report.records_from_grid(grid, [(name, param_row)], list(METRICS) + ["cost_per_question", "rounds"])
        records.append(rec)
        modes[name] = most_common_allocation(grid)
    check_overflow(records, args, f"a search hit --max-rounds {args.max_rounds}; raise it")
    print(f"{system.name} ({', '.join(system.module_names)}), world {args.world}, "
          f"{config.n_models} models, {args.pools} pools x {args.seeds} seeds, q = {args.diagnoser_accuracy}")
    priced = args.world.lower() == "lecture" or args.prices is not None
    print(report.format_table(records, list(METRICS) + (["cost_per_question"] if priced else []),
                              extra={"most common allocation": lambda r: modes[r.policy]}))
    config_json = {"system": system.name, "world": args.world, "models": config.n_models, "pools": args.pools,
                   "seeds": args.seeds, "train_questions": args.train, "test_questions": args.test,
                   "threshold": args.threshold, "max_rounds": args.max_rounds, "seed": args.seed,
                   "prices": np.asarray(params.price).tolist(),
                   "most_common_allocation": modes,
                   "ci": "mean over pools per seed; 95% Student-t CI over seeds"}
    save_outputs(args, "select", config_json, records,
                 lambda path: report.bar_plot(records, ["test_accuracy"], path, f"{system.name}, world {args.world}",
                                              ylabel="test accuracy", ylim=(0, 1), log_if_spread=False))
    return 0
