"""Build a predictor bank from specs: what a BR-H comparison passes to `base.predict`.

A spec is `none`, `oracle`, `survival`, `exact` or `learned:DIR` (a checkpoint
written by `jaxroute train-predictor --save DIR`). The bank holds one fitted table
per registered deployable kind, in registration order (survival, exact, learned):
survival and exact are always fitted when any deployable spec is given (they are
cheap and exact falls back on survival); the learned slot exists only when a
`learned:DIR` spec is given (at most one per comparison).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute import fast_prng  # noqa: F401  (unrolled Threefry on CPU; this module jits without jaxroute.sim)
from jaxroute.errors import JaxrouteError
from jaxroute.predictors import base, learned
from jaxroute.predictors.data import LengthData, Pairs, from_requests
from jaxroute.predictors.exact import fit_exact
from jaxroute.predictors.survival import fit_survival
from jaxroute.routers.names import PREDICTOR_SPEC_HELP

SPEC_HELP = PREDICTOR_SPEC_HELP


def parse_spec(spec: str) -> tuple[str, str | None]:
    """('learned', 'DIR') for 'learned:DIR'; (name, None) otherwise."""
    spec = spec.strip()
    name, sep, arg = spec.partition(":")
    name = name.lower()
    if name == "learned":
        if not sep or not arg:
            raise JaxrouteError("predictor 'learned' needs a checkpoint directory: learned:DIR")
        return name, arg
    if sep:
        raise JaxrouteError(f"predictor '{name}' takes no argument (got '{spec}'); choose from: {SPEC_HELP}")
    if name not in base.kind_names():
        raise JaxrouteError(f"unknown predictor '{spec}'; choose from: {SPEC_HELP}")
    return name, None


def build_bank(specs, train_requests, horizon: int) -> tuple[tuple, list[str], np.ndarray]:
    """(bank, names, kind ids [len(specs)] int32) for `base.predict`.

    train_requests: the split the tables are fitted on (LengthData or anything with
    prompt_tokens/output_tokens/key_id arrays); it must be distinct from the requests
    the predictors are evaluated or simulated on.
    """
    parsed = [parse_spec(s) for s in specs]
    if not parsed:
        raise JaxrouteError(f"no predictor given; choose from: {SPEC_HELP}")
    names = [n for n, _ in parsed]
    if len(set(names)) != len(names):
        raise JaxrouteError(f"predictor listed twice in {list(specs)}")
    dirs = [a for n, a in parsed if n == "learned"]
    bank: tuple = ()
    if any(n not in base.BUILTIN for n in names):
        if train_requests is None:
            raise JaxrouteError("deployable predictors need a training split to fit on")
        train = train_requests if isinstance(train_requests, LengthData) else from_requests(train_requests)
        surv = fit_survival(train.output_tokens, horizon)
        bank = (surv, fit_exact(train.output_tokens, train.key_id, surv))
        if dirs:
            from jaxroute.predictors import checkpoint

            bank += (checkpoint.load_table(dirs[0], horizon, learned.feature_set(train.has_keys)),)
    ids = np.asarray([base.kind_id(n) for n in names], np.int32)
    return bank, names, ids


_predict_jit = jax.jit(base.predict, static_argnums=(3,))


def predict_pairs(bank: tuple, kind: int, pairs: Pairs, horizon: int, chunk: int = 1 << 16):
    """Host arrays (p_fin, mu_rem) for every pair, predicted in jitted fixed-size chunks."""
    base.check_kind_ids(kind, bank)  # before tracing: lax.switch would clamp a missing slot
    fn = _predict_jit
    n = len(pairs)
    p_out = np.empty(n, np.float32)
    mu_out = np.empty(n, np.float32)
    size = min(chunk, max(n, 1))
    for start in range(0, n, size):
        idx = np.arange(start, start + size) % n  # pad the last chunk by wrapping (one compiled shape)
        p, mu = fn(bank, jnp.int32(kind), pairs.take(idx).features(), horizon)
        m = min(size, n - start)
        p_out[start:start + m] = np.asarray(p)[:m]
        mu_out[start:start + m] = np.asarray(mu)[:m]
    return p_out, mu_out


def bank_for_simulation(specs, workload: str, n_sim: int, seed: int, trace_path, horizon: int,
                        n_train: int | None = None) -> tuple[tuple, list[str], np.ndarray]:
    """`build_bank` for a decode simulation of `make_decode_requests(workload, n_sim, seed)`.

    Survival and exact are fitted on requests distinct from the simulated ones
    (`data.training_requests_for_simulation`); a learned checkpoint is checked against
    the horizon and feature set, and a warning names a workload or seed it was not trained on.
    """
    from jaxroute.predictors.data import training_requests_for_simulation

    parsed = [parse_spec(s) for s in specs]
    if all(n in base.BUILTIN for n, _ in parsed):
        return build_bank(specs, None, horizon)
    train = training_requests_for_simulation(workload, n_sim, seed, trace_path, n_train)
    for name, arg in parsed:
        if name == "learned":
            _warn_learned_provenance(arg, workload, seed)
    return build_bank(specs, train, horizon)


def _warn_learned_provenance(directory: str, workload: str, seed: int) -> None:
    from jaxroute.predictors import checkpoint
    from jaxroute.report import warn

    info = checkpoint.read_config(directory)[0].info
    if info.get("workload") != workload:
        warn(f"learned predictor {directory} was trained on '{info.get('workload')}', used on '{workload}'")
    elif workload == "synthetic-prod" and info.get("seed") != seed:
        warn(f"learned predictor {directory} was trained with seed {info.get('seed')}, the simulation uses "
             f"seed {seed}: synthetic-prod's template table depends on the seed, so its key embeddings will not match")


def train_learned_for_simulation(save_dir, workload: str, n_sim: int, seed: int, trace_path, horizon: int,
                                 settings=None, n_train: int | None = None, progress: bool = False) -> str:
    """Train and save a learned predictor on the same requests `bank_for_simulation` fits on.

    The training requests (distinct from the simulated ones) are split by arrival: the
    first 80 % train, the last 20 % early-stop. Returns the spec 'learned:DIR'.
    """
    from jaxroute.predictors import checkpoint
    from jaxroute.predictors.data import training_requests_for_simulation
    from jaxroute.predictors.training import TrainSettings, train

    reqs = training_requests_for_simulation(workload, n_sim, seed, trace_path, n_train)
    cut = int(0.8 * len(reqs))
    info = {"workload": workload, "requests": len(reqs), "seed": seed, "trace": str(trace_path) if trace_path else None,
            "split": f"training_requests_for_simulation(n_sim={n_sim})"}
    res = train(reqs.slice(0, cut), reqs.slice(cut, len(reqs)), horizon, settings or TrainSettings(seed=seed),
                progress=progress, info=info)
    checkpoint.save(save_dir, res.params, res.opt_state, res.config, res.best_step)
    return f"learned:{save_dir}"
