"""Learned predictor training: loss falls, and p_fin / mu_rem approach a known answer."""

import numpy as np
import pytest

from jaxroute.errors import JaxrouteError
from jaxroute.predictors import data, learned
from jaxroute.predictors.base import RequestFeatures
from jaxroute.predictors.training import TrainSettings, train

H = 10
Q_SHORT, Q_LONG = 0.1, 0.01  # geometric stop probability per step for short / long prompts


def two_class_geometric(n, seed):
    """Short prompts (100) stop w.p. 0.1 per step, long prompts (10000) w.p. 0.01: memoryless, so
    P(ends within H | j) = 1 - (1-q)^H and E[rem | rem <= H] are known and independent of j."""
    rng = np.random.default_rng(seed)
    long = rng.random(n) < 0.5
    out = np.where(long, rng.geometric(Q_LONG, n), rng.geometric(Q_SHORT, n))
    return data.LengthData("two-class", np.where(long, 10000, 100), out, np.full(n, -1))


def truth(q):
    r = 1 - q
    return 1 - r**H, 1 / q - H * r**H / (1 - r**H)


@pytest.mark.slow
def test_training_reduces_loss_and_recovers_true_conditional_probability():
    s = TrainSettings(steps=600, batch=256, lr=1e-2, hidden=(16, 16), eval_every=100, patience=10,
                      train_pairs=1 << 15, val_pairs=1 << 13, seed=0)
    res = train(two_class_geometric(3000, 0), two_class_geometric(1000, 1), H, s)
    assert res.config.features == ("log_prompt", "log_generated")
    v0, vbest = res.history[0]["val_loss"], min(h["val_loss"] for h in res.history)
    assert vbest < 0.8 * v0
    table = learned.make_table(res.params, res.config)
    # ages where the training data has plenty of pairs (P(L > j) >= 0.2 for the class)
    for prompt, q, j in ((100, Q_SHORT, [0, 3, 6, 10, 15]), (10000, Q_LONG, [0, 10, 40, 90, 150])):
        j = np.asarray(j, np.int32)
        f = RequestFeatures(np.full(5, prompt, np.int32), j, np.full(5, -1, np.int32), np.ones(5, np.int32))
        p, mu = learned.predict_learned(table, f, H)
        p_true, mu_true = truth(q)
        np.testing.assert_allclose(np.asarray(p), p_true, atol=0.06)
        np.testing.assert_allclose(np.asarray(mu), mu_true, atol=0.6)


def test_training_rejects_bad_settings():
    d = two_class_geometric(100, 0)
    with pytest.raises(JaxrouteError):
        train(d, d, 0, TrainSettings(steps=1))
    with pytest.raises(JaxrouteError):
        train(d, d, H, TrainSettings(steps=0))


def test_key_embedding_feature_follows_the_data():
    assert learned.feature_set(True) == ("log_prompt", "log_generated", "key_embedding")
    assert learned.feature_set(False) == ("log_prompt", "log_generated")
    b = learned.key_bucket(np.array([-1, 0, 5, 2**31 - 1], np.int32), 64)
    assert int(b[0]) == 0 and np.all(np.asarray(b[1:]) >= 1) and np.all(np.asarray(b) <= 64)


def test_unseen_keys_predict_like_unknown_keys():
    """Embeddings start at zero and only trained buckets move, so a key no training key hashes to
    gives exactly the 'unknown key' prediction."""
    rng = np.random.default_rng(0)
    n = 400
    keys = rng.integers(0, 3, n)
    d = data.LengthData("k", np.full(n, 100), (10 * (keys + 1)).astype(np.int64), keys)
    res = train(d, d, H, TrainSettings(steps=30, batch=64, eval_every=10, hidden=(8,), key_buckets=4096,
                                       key_dim=4, train_pairs=2048, val_pairs=512))
    assert res.config.uses_keys
    buckets = set(np.asarray(learned.key_bucket(np.arange(3, dtype=np.int32), 4096)).tolist())
    unseen = next(k for k in range(100, 10_000) if int(learned.key_bucket(np.int32(k), 4096)) not in buckets)
    j = np.array([0, 5, 9], np.int32)
    table = learned.make_table(res.params, res.config)

    def run(key):
        f = RequestFeatures(np.full(3, 100, np.int32), j, np.full(3, key, np.int32), np.ones(3, np.int32))
        return learned.predict_learned(table, f, H)

    for a, b in zip(run(-1), run(unseen), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.allclose(np.asarray(run(0)[0]), np.asarray(run(-1)[0]))  # a trained key does differ
