"""Orbax checkpoints of the learned predictor: exact round trip, clear errors on mismatch."""

import json
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

from jaxroute.errors import JaxrouteError
from jaxroute.predictors import checkpoint, data, learned
from jaxroute.predictors.training import TrainSettings, train

H = 12


def keyed_lengths(n, seed):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 6, n)
    out = (5 * (keys + 1) * rng.uniform(0.8, 1.2, n)).astype(np.int64) + 1
    return data.LengthData("keyed", rng.integers(10, 500, n), out, keys)


@pytest.fixture(scope="module")
def trained():
    s = TrainSettings(steps=40, batch=64, eval_every=20, hidden=(8,), key_buckets=32, key_dim=4,
                      train_pairs=4096, val_pairs=1024, seed=1)
    return train(keyed_lengths(300, 0), keyed_lengths(100, 1), H, s, info={"workload": "keyed"})


def test_round_trip_gives_identical_predictions_and_state(trained, tmp_path):
    d = checkpoint.save(tmp_path / "ck", trained.params, trained.opt_state, trained.config, trained.best_step)
    ck = checkpoint.load(d, horizon=H, features=trained.config.features)
    assert ck.config == trained.config and ck.step == trained.best_step
    for a, b in zip(jax.tree_util.tree_leaves(trained.params), jax.tree_util.tree_leaves(ck.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # optimiser state comes back with its optax types (restored against an abstract target)
    assert jax.tree_util.tree_structure(ck.opt_state) == jax.tree_util.tree_structure(trained.opt_state)
    assert isinstance(ck.opt_state[1][0], optax.ScaleByAdamState)
    pairs = data.sample_pairs(keyed_lengths(50, 2), 500, np.random.default_rng(0)).features()
    p0, m0 = learned.predict_learned(learned.make_table(trained.params, trained.config), pairs, H)
    p1, m1 = learned.predict_learned(checkpoint.load_table(d, H, trained.config.features), pairs, H)
    np.testing.assert_array_equal(np.asarray(p0), np.asarray(p1))
    np.testing.assert_array_equal(np.asarray(m0), np.asarray(m1))


def test_mismatched_horizon_or_features_is_a_clear_error(trained, tmp_path):
    d = checkpoint.save(tmp_path / "ck", trained.params, trained.opt_state, trained.config, 3)
    with pytest.raises(JaxrouteError, match="horizon H=12.*H=80"):
        checkpoint.load(d, horizon=80)
    with pytest.raises(JaxrouteError, match="features"):
        checkpoint.load(d, horizon=H, features=learned.feature_set(False))


def test_config_disagreeing_with_arrays_is_a_clear_error(trained, tmp_path):
    d = checkpoint.save(tmp_path / "ck", trained.params, trained.opt_state, trained.config, 5)
    cfg_files = [p for p in Path(d).rglob("*") if p.is_file() and p.parent.name == "config"]
    assert cfg_files, "the JSON config item should be a file under <step>/config/"
    for p in cfg_files:
        try:
            obj = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(obj, dict) and "hidden" in obj:
            obj["hidden"] = [16]  # claims a wider layer than the stored arrays
            p.write_text(json.dumps(obj))
    with pytest.raises(JaxrouteError, match="do not match its config"):
        checkpoint.load(d, horizon=H)


def test_missing_or_empty_checkpoint_dir(tmp_path):
    with pytest.raises(JaxrouteError, match="no predictor checkpoint"):
        checkpoint.load(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(JaxrouteError, match="no predictor checkpoint"):
        checkpoint.load(tmp_path / "empty")
