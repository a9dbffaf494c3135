"""Checkpoints of the learned predictor with orbax-checkpoint.

A checkpoint directory is managed by `ocp.CheckpointManager` and holds, per saved
step, two items: `state` (params + optimiser state, `StandardSave`) and `config`
(the `LearnedConfig` as JSON: features, H, normalisation, sizes, optimiser
settings). Restoring reads the config first, checks it against what the caller
needs (horizon, feature set) with a clear `JaxrouteError`, then restores the arrays
against an abstract target built from the config (`jax.eval_shape` of
init_params + optimiser init), so optax's NamedTuples come back as themselves and
any shape disagreement is reported as an error rather than a crash.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxroute.errors import JaxrouteError
from jaxroute.predictors import learned
from jaxroute.predictors.training import make_optimizer


@dataclasses.dataclass
class Checkpoint:
    params: Any
    opt_state: Any
    config: learned.LearnedConfig
    step: int


def _manager(directory: str | Path, create: bool) -> ocp.CheckpointManager:
    path = Path(directory).absolute()
    opts = ocp.CheckpointManagerOptions(max_to_keep=1, create=create, enable_async_checkpointing=False)
    handlers = {"state": ocp.StandardCheckpointHandler(), "config": ocp.JsonCheckpointHandler()}
    return ocp.CheckpointManager(path, options=opts, item_handlers=handlers)


def _leaf_name(path) -> str:
    parts = []
    for k in path:
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
    return ".".join(parts)


def _shape_mismatch(stored: Any, target: Any) -> str | None:
    """A short description of how stored array metadata differs from the target, or None."""
    want = {_leaf_name(p): (tuple(x.shape), str(x.dtype)) for p, x in jax.tree_util.tree_flatten_with_path(target)[0]}
    have = {}
    for leaf in jax.tree_util.tree_leaves(stored):
        name = getattr(leaf, "name", None)
        if name is None or not hasattr(leaf, "shape"):
            return "unreadable array metadata"
        have[name] = (tuple(leaf.shape), str(leaf.dtype))
    for name in sorted(set(want) | set(have)):
        if want.get(name) != have.get(name):
            return f"array '{name}' is {have.get(name)} in the checkpoint, config implies {want.get(name)}"
    return None


def save(directory: str | Path, params: Any, opt_state: Any, config: learned.LearnedConfig, step: int) -> Path:
    """Save one step (replacing older ones in that directory); returns the directory."""
    path = Path(directory).absolute()
    if path.exists() and not path.is_dir():
        raise JaxrouteError(f"checkpoint path exists and is not a directory: {path}")
    path.mkdir(parents=True, exist_ok=True)
    with _manager(path, create=True) as mngr:
        mngr.save(int(step), args=ocp.args.Composite(
            state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
            config=ocp.args.JsonSave(config.to_json())), force=True)
        mngr.wait_until_finished()
    return path


def abstract_state(config: learned.LearnedConfig) -> Any:
    """Shapes and dtypes of {'params', 'opt_state'} for this config, without allocating."""
    tx = make_optimizer(config.optimizer)

    def init():
        params = learned.init_params(jax.random.PRNGKey(0), config)
        return {"params": params, "opt_state": tx.init(params)}

    shapes = jax.eval_shape(init)
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), shapes)


def read_config(directory: str | Path) -> tuple[learned.LearnedConfig, int]:
    path = Path(directory).absolute()
    if not path.is_dir():
        raise JaxrouteError(f"no predictor checkpoint at {path} (not a directory); train one with "
                            "`jaxroute train-predictor --save DIR`")
    with _manager(path, create=False) as mngr:
        step = mngr.latest_step()
        if step is None:
            raise JaxrouteError(f"no predictor checkpoint in {path}; "
                                "train one with `jaxroute train-predictor --save DIR`")
        try:
            raw = mngr.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]
        except Exception as e:  # noqa: BLE001 - orbax raises many types for a damaged directory
            raise JaxrouteError(f"cannot read the predictor config in {path} (step {step}): {e}") from None
    return learned.LearnedConfig.from_json(raw, where=str(path)), int(step)


def load(directory: str | Path, horizon: int | None = None, features: tuple[str, ...] | None = None) -> Checkpoint:
    """Restore a checkpoint; `horizon` / `features`, when given, must match what it was trained with."""
    path = Path(directory).absolute()
    config, step = read_config(path)
    if horizon is not None and config.horizon != horizon:
        raise JaxrouteError(f"predictor checkpoint {path} was trained for horizon H={config.horizon}, "
                            f"but H={horizon} was requested; retrain with --horizon {horizon} or use "
                            f"--horizon {config.horizon}")
    if features is not None and tuple(features) != tuple(config.features):
        raise JaxrouteError(f"predictor checkpoint {path} uses features {list(config.features)}, but this "
                            f"workload provides {list(features)}; retrain it on this workload")
    target = abstract_state(config)
    with _manager(path, create=False) as mngr:
        try:
            stored = mngr.item_metadata(step)["state"]
        except Exception as e:  # noqa: BLE001
            raise JaxrouteError(f"predictor checkpoint {path}: cannot read array metadata: {e}") from None
        problem = _shape_mismatch(stored, target)
        if problem:
            raise JaxrouteError(f"predictor checkpoint {path}: stored arrays do not match its config "
                                f"(features {list(config.features)}, hidden {list(config.hidden)}): {problem}")
        try:
            state = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))["state"]
        except Exception as e:  # noqa: BLE001 - a shape/structure mismatch surfaces as various orbax errors
            raise JaxrouteError(f"predictor checkpoint {path}: stored arrays do not match its config "
                                f"(features {list(config.features)}, hidden {list(config.hidden)}): "
                                f"{str(e).splitlines()[0][:300]}") from None
    return Checkpoint(state["params"], state["opt_state"], config, step)


def load_table(directory: str | Path, horizon: int, features: tuple[str, ...] | None = None) -> learned.LearnedTable:
    """A bank entry from a checkpoint (checked against the horizon and feature set)."""
    ck = load(directory, horizon, features)
    return learned.make_table(ck.params, ck.config)
