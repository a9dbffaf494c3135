"""The routers' names, defined once and importable without JAX (the command line lists and checks them).

`prefix.py` and `balance.py` build their registries from these; the parsers of `jaxroute` read them
without importing the routers, so `jaxroute --help` and argument errors need no JAX.
"""

from __future__ import annotations

from jaxroute.routers.spec import SPECS

# Router settings every layer (params, experiment API, command line) reads from here
DEFAULT_THETA = 0.5  # match ratio threshold and cache_guard need (Preble E2's split at 0.5, lecture 3.2)
DEFAULT_E2_WINDOW_S = 180.0  # Preble's load window H (its default: 3 minutes)
DEFAULT_E2_TH_BAL = 1.5  # Preble's rebalancing threshold Th_bal

# Replica-cluster routers, in traced-id order, and those that run on part of a cluster: read from their specs
# (`spec.SPECS`, one declaration per router); the model refuses the others on a partial cluster
PREFIX_POLICIES: tuple[str, ...] = tuple(s.name for s in SPECS)
PARTIAL_OK: tuple[str, ...] = tuple(s.name for s in SPECS if s.partial_ok)
# Named scorers of the weighted presets, each in [0, 1] (higher is better); `RouterParams.weights`
# holds one weight per name, in this order, and `--weights name=w,...` sets them.
SCORERS: tuple[str, ...] = ("prefix", "inflight", "tokens", "queue", "kv", "load_aware", "lora")

# Decode data-parallel routers (`balance.py`), in traced-id order: run on every decode model
DECODE_POLICIES: tuple[str, ...] = ("random", "rr", "p2c", "jsq", "least_kv", "br0", "brh")
def router_setting_names() -> frozenset[str]:
    """The settings --router-set may name: the keywords of each stateful router module's `make_params`, read from
    its source without importing it, so a wrong name is refused before JAX loads (tests/test_router_spec.py checks
    they are the modules' own `RouterModule.settings`)."""
    import ast
    from pathlib import Path

    names: set[str] = set()
    for module in sorted({s.module for s in SPECS if s.module}):
        tree = ast.parse((Path(__file__).parent / f"{module}.py").read_text())
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "make_params")
        names |= {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    return frozenset(names)


def check_router_settings(given, known) -> None:
    """Refuse router settings that no module takes (one line naming them)."""
    from jaxroute.errors import JaxrouteError

    if unknown := set(given or ()) - set(known):
        raise JaxrouteError(f"unknown router setting(s) {sorted(unknown)}; choose from: {', '.join(sorted(known))}")


# BR-H's horizon predictors (`predictors/`) as --predictor names them; learned:DIR reads a checkpoint folder
PREDICTOR_SPEC_HELP = "none, oracle, survival, exact, learned:DIR"


def check_predictor_specs(specs) -> None:
    """Refuse, without JAX, a --predictor spec that names no predictor or a checkpoint folder that is not there
    (`predictors.bank.parse_spec` checks them again against the registered kinds)."""
    from pathlib import Path

    from jaxroute.errors import JaxrouteError

    known = [k.split(":")[0] for k in PREDICTOR_SPEC_HELP.split(", ")]
    for spec in specs:
        name, sep, arg = spec.strip().partition(":")
        if name.lower() not in known:
            raise JaxrouteError(f"unknown predictor '{spec}'; choose from: {PREDICTOR_SPEC_HELP}")
        if name.lower() == "learned" and arg and not Path(arg).is_dir():
            raise JaxrouteError(f"predictor checkpoint folder not found: {arg} (write one with jaxroute "
                                "train-predictor --save DIR)")
DISPATCH_MODES: tuple[str, ...] = ("immediate", "pooled")  # decode dispatch: bind at once, or from a prompt pool
