"""Horizon predictors: survival closed forms, exact-match fallback, AUC/MAE by hand, bank + lax.switch, pairs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxroute.errors import JaxrouteError
from jaxroute.predictors import base, data
from jaxroute.predictors.bank import build_bank, parse_spec, predict_pairs
from jaxroute.predictors.evaluation import auc, horizon_scores, mae
from jaxroute.predictors.exact import fit_exact, predict_exact
from jaxroute.predictors.survival import (
    fit_survival,
    fit_survival_counts,
    predict_survival,
)


def feats(generated, key_id=None, prompt_len=None, remaining=None):
    g = jnp.asarray(generated, jnp.int32)
    n = g.shape[0]
    return base.RequestFeatures(
        prompt_len=jnp.asarray(prompt_len if prompt_len is not None else np.full(n, 100), jnp.int32),
        generated=g,
        key_id=jnp.asarray(key_id if key_id is not None else np.full(n, -1), jnp.int32),
        remaining=jnp.asarray(remaining if remaining is not None else np.ones(n), jnp.int32),
    )


def geometric_closed_form(q, horizon):
    r = 1.0 - q
    p = 1.0 - r**horizon
    mu = 1.0 / q - horizon * r**horizon / (1.0 - r**horizon)
    return p, mu


# ----------------------------------------------------------------------------- survival


@pytest.mark.parametrize("q,horizon", [(0.03, 20), (0.2, 5), (0.01, 80)])
def test_survival_matches_geometric_closed_form(q, horizon):
    lmax = 6000
    L = np.arange(lmax + 1)
    pmf = np.where(L >= 1, q * (1 - q) ** np.maximum(L - 1, 0), 0.0)
    table = fit_survival_counts(pmf * 1e12, horizon, min_survivors=1e3)  # exact law as counts
    j = np.arange(0, 400, 7)
    p, mu = predict_survival(table, feats(j), horizon)
    p_true, mu_true = geometric_closed_form(q, horizon)
    # memoryless: the same at every age j
    np.testing.assert_allclose(np.asarray(p), p_true, rtol=2e-4)
    np.testing.assert_allclose(np.asarray(mu), mu_true, rtol=2e-4)


def test_survival_from_geometric_samples():
    q, horizon = 0.05, 10
    lengths = np.random.default_rng(0).geometric(q, 200_000)
    table = fit_survival(lengths, horizon)
    p, mu = predict_survival(table, feats(np.arange(0, 40)), horizon)
    p_true, mu_true = geometric_closed_form(q, horizon)
    np.testing.assert_allclose(np.asarray(p), p_true, atol=0.02)
    np.testing.assert_allclose(np.asarray(mu), mu_true, atol=0.2)


def test_survival_hand_worked_table_and_tail():
    # lengths 1, 2, 2, 5 with H = 2
    t = fit_survival(np.array([1, 2, 2, 5]), 2, min_survivors=1)
    p, mu = predict_survival(t, feats([0, 1, 2, 3, 4, 10]), 2)
    np.testing.assert_allclose(np.asarray(p), [3 / 4, 2 / 3, 0.0, 1.0, 1.0, 1.0], rtol=1e-6)
    # j=2: nothing ends within H, mu carries the previous row forward; j=10 uses the last row
    np.testing.assert_allclose(np.asarray(mu), [5 / 3, 1.0, 1.0, 2.0, 1.0, 1.0], rtol=1e-6)
    # with min_survivors = 2, rows with one survivor carry row j=1 forward
    t2 = fit_survival(np.array([1, 2, 2, 5]), 2, min_survivors=2)
    p2, mu2 = predict_survival(t2, feats([2, 3, 4]), 2)
    np.testing.assert_allclose(np.asarray(p2), [2 / 3] * 3, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(mu2), [1.0] * 3, rtol=1e-6)


def test_survival_bad_input():
    with pytest.raises(JaxrouteError):
        fit_survival(np.array([0, 3]), 5)
    with pytest.raises(JaxrouteError):
        fit_survival(np.array([3, 4]), 5)  # fewer than the default 20 survivors
    with pytest.raises(JaxrouteError):
        fit_survival(np.array([3] * 50), 0)


# ----------------------------------------------------------------------------- exact match


def exact_setup(min_samples=2, max_samples=64):
    lengths = np.array([10, 10, 10, 50, 30, 30, 30] + [7] * 30)
    keys = np.array([7, 7, 7, 7, 9, 9, 9] + [-1] * 30)
    surv = fit_survival(lengths, 5)
    return fit_exact(lengths, keys, surv, max_samples=max_samples, min_samples=min_samples), surv


def test_exact_uses_key_law():
    table, _ = exact_setup()
    # key 7 at j=7: alive {10,10,10,50}; ending within 5 steps: the three 10s -> p = 3/4, mu = 3
    # key 9 at j=26: alive {30,30,30} all end -> p = 1, mu = 4
    p, mu = predict_exact(table, feats([7, 26], key_id=[7, 9]), 5)
    np.testing.assert_allclose(np.asarray(p), [0.75, 1.0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(mu), [3.0, 4.0], rtol=1e-6)


def test_exact_falls_back_to_survival_on_unseen_and_unknown_keys():
    table, surv = exact_setup()
    j = np.array([0, 3, 8, 20, 45])
    for key in (8, -1, 123456, 2**31 - 1):
        p, mu = predict_exact(table, feats(j, key_id=np.full(len(j), key)), 5)
        ps, mus = predict_survival(surv, feats(j), 5)
        np.testing.assert_array_equal(np.asarray(p), np.asarray(ps))
        np.testing.assert_array_equal(np.asarray(mu), np.asarray(mus))


def test_exact_falls_back_with_too_few_alive_samples():
    table, surv = exact_setup(min_samples=2)
    # key 7 at j=20: only the 50 is alive (1 < 2 samples) -> survival
    p, mu = predict_exact(table, feats([20], key_id=[7]), 5)
    ps, mus = predict_survival(surv, feats([20]), 5)
    assert float(p[0]) == float(ps[0]) and float(mu[0]) == float(mus[0])
    # with min_samples = 1 the lone sample decides: 50 does not end within 5 of 20
    table1, _ = exact_setup(min_samples=1)
    p1, _ = predict_exact(table1, feats([20, 46], key_id=[7, 7]), 5)
    np.testing.assert_allclose(np.asarray(p1), [0.0, 1.0])


def test_exact_keeps_most_recent_samples():
    lengths = np.array([100, 100, 100, 10, 10] + [5] * 30)
    keys = np.array([1, 1, 1, 1, 1] + [-1] * 30)
    table = fit_exact(lengths, keys, fit_survival(lengths, 5), max_samples=2, min_samples=1)
    assert sorted(np.asarray(table.lengths[0]).tolist()) == [10, 10]


def test_exact_without_keys_is_survival():
    lengths = np.arange(1, 60)
    surv = fit_survival(lengths, 5)
    table = fit_exact(lengths, np.full(len(lengths), -1), surv)
    p, _ = predict_exact(table, feats([0, 3], key_id=[0, 5]), 5)
    ps, _ = predict_survival(surv, feats([0, 3]), 5)
    np.testing.assert_array_equal(np.asarray(p), np.asarray(ps))


# ----------------------------------------------------------------------------- AUC and MAE


def test_auc_hand_worked():
    assert auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    # ties count one half: positives {0.5, 0.9} vs negatives {0.2, 0.5} -> (1 + 0.5 + 1 + 1) / 4
    assert auc([0.2, 0.5, 0.5, 0.9], [0, 1, 0, 1]) == pytest.approx(0.875)
    assert auc([0.5, 0.5], [1, 0]) == pytest.approx(0.5)
    assert auc([0.9, 0.1], [0, 1]) == pytest.approx(0.0)
    assert np.isnan(auc([0.1, 0.2], [1, 1]))


def test_auc_equals_pairwise_definition():
    rng = np.random.default_rng(3)
    s = rng.integers(0, 5, 200) / 4.0  # many ties
    y = rng.random(200) < 0.3
    pos, neg = s[y], s[~y]
    brute = np.mean((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :]))
    assert auc(s, y) == pytest.approx(brute, abs=1e-12)


def test_mae_hand_worked():
    assert mae([1, 2, 3], [2, 2, 5], [True, True, False]) == pytest.approx(0.5)
    assert mae([1, 2, 3], [2, 2, 5]) == pytest.approx(1.0)
    assert np.isnan(mae([1.0], [2.0], [False]))
    # stage 2 only looks at pairs that end within H: remaining 3 and 9 of 3, 9, 50 with H=10
    sc = horizon_scores(np.array([0.9, 0.6, 0.1]), np.array([4.0, 5.0, 7.0]), np.array([3, 9, 50]), 10)
    assert sc["auc"] == pytest.approx(1.0) and sc["mae"] == pytest.approx(2.5)
    # c = (1-p) H + p mu = 4.6, 7.0, 9.7 against min(r, H) = 3, 9, 10
    assert sc["c_mae"] == pytest.approx((1.6 + 2.0 + 0.3) / 3)


def test_oracle_scores_perfectly():
    d = data.LengthData("t", np.full(50, 10), np.arange(1, 51), np.full(50, -1))
    pairs = data.all_pairs(d)
    p, mu = base.predict_oracle(pairs.features(), 20)
    sc = horizon_scores(np.asarray(p), np.asarray(mu), pairs.remaining, 20)
    assert sc["auc"] == 1.0 and sc["mae"] == 0.0 and sc["c_mae"] == pytest.approx(0.0, abs=1e-5)


# ----------------------------------------------------------------------------- bank and switch


def small_lengths(n=400, seed=0):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 5, n)
    out = (20 * (keys + 1) * rng.uniform(0.9, 1.1, n)).astype(np.int64) + 1
    return data.LengthData("toy", rng.integers(10, 1000, n), out, keys)


def test_bank_switch_matches_each_predictor_in_one_compilation():
    train = small_lengths()
    bank, names, ids = build_bank(["none", "oracle", "survival", "exact"], train, 8)
    assert names == ["none", "oracle", "survival", "exact"]
    assert ids.tolist() == [base.kind_id(n) for n in names]
    f = feats([0, 15, 30, 55, 99], key_id=[0, 1, 2, 3, 77], remaining=[3, 40, 8, 2, 1])
    traces = []

    @jax.jit
    def run(kind):
        traces.append(1)
        return base.predict(bank, kind, f, 8)

    expected = [base.predict_none(f, 8), base.predict_oracle(f, 8), predict_survival(bank[0], f, 8),
                predict_exact(bank[1], f, 8)]
    for kid, (pe, me) in zip(ids, expected, strict=True):
        p, mu = run(jnp.int32(kid))
        np.testing.assert_array_equal(np.asarray(p), np.asarray(pe, np.float32))
        np.testing.assert_array_equal(np.asarray(mu), np.asarray(me, np.float32))
    assert len(traces) == 1


def test_bank_spec_errors():
    train = small_lengths()
    with pytest.raises(JaxrouteError, match="unknown predictor"):
        build_bank(["survival", "magic"], train, 8)
    with pytest.raises(JaxrouteError, match="learned:DIR"):
        parse_spec("learned")
    with pytest.raises(JaxrouteError, match="twice"):
        build_bank(["exact", "exact"], train, 8)
    with pytest.raises(JaxrouteError, match="no predictor checkpoint"):
        build_bank(["learned:/nonexistent/ckpt"], train, 8)
    bank, _, _ = build_bank(["oracle", "none"], None, 8)  # built-ins need no training data
    assert bank == ()


def test_predict_pairs_chunks_agree_with_one_call():
    train = small_lengths()
    bank, _, ids = build_bank(["exact"], train, 8)
    pairs = data.sample_pairs(small_lengths(seed=1), 1000, np.random.default_rng(0))
    p1, m1 = predict_pairs(bank, int(ids[0]), pairs, 8, chunk=300)
    p2, m2 = base.predict(bank, jnp.int32(ids[0]), pairs.features(), 8)
    np.testing.assert_allclose(p1, np.asarray(p2), rtol=1e-6)
    np.testing.assert_allclose(m1, np.asarray(m2), rtol=1e-6)


# ----------------------------------------------------------------------------- data


def test_pairs_weight_each_active_step_equally():
    d = data.LengthData("t", np.array([5, 6]), np.array([1, 3]), np.array([-1, 4]))
    allp = data.all_pairs(d)
    assert allp.generated.tolist() == [0, 0, 1, 2]
    assert allp.remaining.tolist() == [1, 3, 2, 1]
    assert allp.key_id.tolist() == [-1, 4, 4, 4]
    s = data.sample_pairs(d, 40_000, np.random.default_rng(0))
    assert np.mean(s.key_id == -1) == pytest.approx(0.25, abs=0.01)
    assert set(np.unique(s.generated[s.key_id == 4]).tolist()) == {0, 1, 2}
    assert np.all(s.remaining >= 1) and np.all(s.generated + s.remaining == np.where(s.key_id == 4, 3, 1))


def test_temporal_split_and_mooncake_keys():
    d = data.LengthData("t", np.arange(100) + 1, np.arange(100) + 1, np.full(100, -1))
    tr, va, te = data.temporal_split(d)
    assert (len(tr), len(va), len(te)) == (70, 15, 15)
    assert tr.output_tokens[-1] < va.output_tokens[0] < te.output_tokens[0]
    with pytest.raises(JaxrouteError):
        data.temporal_split(d.slice(0, 5))
    keys = data.mooncake_keys([np.array([5, 6]), np.array([5, 9, 1]), np.array([7]), np.array([], np.int64)])
    assert keys[0] == keys[1] != keys[2] and keys[3] == -1 and np.all(keys[:3] >= 0) and np.all(keys < 2**31)


def test_unknown_workload():
    with pytest.raises(JaxrouteError, match="unknown workload"):
        data.load_lengths("nope")


def test_training_requests_for_simulation_are_distinct_and_same_population():
    from jaxroute.workloads.decode import make_decode_requests

    sim = make_decode_requests("synthetic-prod", 300, seed=5)
    tr = data.training_requests_for_simulation("synthetic-prod", 300, seed=5, n_train=500)
    assert len(tr) == 500
    # the training requests are the ones after the simulated positions of one longer draw with the same seed
    longer = make_decode_requests("synthetic-prod", 800, seed=5)
    for field in ("prompt_tokens", "output_tokens", "key_id"):
        np.testing.assert_array_equal(getattr(tr, field), getattr(longer, field)[300:])

    def rows(r, mask):
        return set(zip(r.prompt_tokens[mask].tolist(), r.output_tokens[mask].tolist(), strict=True))

    # No copied requests. Templated requests repeat a template's output exactly (zero jitter) and its prompt up to a
    # +-5 % jitter, so (prompt, output) coincidences among them are expected by chance; one-off requests draw both
    # lengths from wide global laws, so a one-off row that reappears on the other side can only be a copy.
    sim_one, tr_one = sim.key_id >= 200, tr.key_id >= 200
    assert sim_one.sum() >= 30 and tr_one.sum() >= 30  # enough one-off rows for the check to bite
    assert not rows(sim, sim_one) & rows(tr, np.ones(len(tr), bool))
    assert not rows(tr, tr_one) & rows(sim, np.ones(len(sim), bool))
    # the same template table: templates seen in both have similar typical outputs
    shared = sorted(set(sim.key_id[sim.key_id < 200].tolist()) & set(tr.key_id[tr.key_id < 200].tolist()))
    assert len(shared) >= 10
    for k in shared[:10]:
        a = np.median(sim.output_tokens[sim.key_id == k])
        b = np.median(tr.output_tokens[tr.key_id == k])
        assert abs(np.log(a / b)) < 0.5
    # one-off keys never collide with the simulated ones
    assert not (set(tr.key_id[tr.key_id >= 200].tolist()) & set(sim.key_id[sim.key_id >= 200].tolist()))


def test_training_requests_for_trace_simulation_follow_the_simulated_ones():
    from data_paths import AZURE_CONV, require

    from jaxroute.workloads.decode import make_decode_requests

    path = require(AZURE_CONV)
    tr = data.training_requests_for_simulation("azure-conv", 1000, trace_path=path, n_train=600)
    full = make_decode_requests("azure-conv", 1600, trace_path=path)
    np.testing.assert_array_equal(tr.output_tokens, full.output_tokens[1000:])
    with pytest.raises(JaxrouteError, match="simulate at most"):
        data.training_requests_for_simulation("azure-conv", data.trace_size("azure-conv", path) - 10, trace_path=path)


def test_bank_for_simulation_fits_on_distinct_requests():
    from jaxroute.predictors.bank import bank_for_simulation

    bank, names, ids = bank_for_simulation(["oracle", "survival", "exact"], "synthetic-prod", 200, 1, None, 16,
                                           n_train=800)
    assert names == ["oracle", "survival", "exact"] and len(bank) == 2
    tr = data.training_requests_for_simulation("synthetic-prod", 200, 1, None, 800)
    ref = fit_survival(tr.output_tokens, 16)
    np.testing.assert_array_equal(np.asarray(bank[0].p_fin), np.asarray(ref.p_fin))
    assert bank_for_simulation(["oracle", "none"], "synthetic-prod", 200, 1, None, 16)[0] == ()
