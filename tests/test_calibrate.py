"""calibrate.fit (Levenberg-Marquardt on batched evaluations) and the pd pipeline's per-row cost terms it fits."""

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
import pytest

from jaxroute import calibrate, cost_models
from jaxroute.deployment import PD, PD_PAPER
from jaxroute.errors import JaxrouteError
from jaxroute.experiments import pd
from jaxroute.experiments.cluster import build_workload

XS = np.linspace(0.0, 1.0, 8)


def _curve(p):
    return p[0] + p[1] * XS + 0.3 * p[1] ** 2


def _batched(points):
    return np.stack([_curve(p) for p in points])


def test_fit_recovers_the_terms_of_a_noiseless_model():
    truth = np.array([2.0, 0.5])
    f = calibrate.fit(_batched, [calibrate.Term("a", 1.0, 1.0), calibrate.Term("b", 0.0, 1.0)], _curve(truth),
                      iterations=12)
    np.testing.assert_allclose(f.values, truth, rtol=1e-3)
    assert f.rms_residual() < 1e-4 and f.cost_history[-1] < f.cost_history[0]
    assert f.evaluations >= 3  # every evaluation is one batch of T + 1 points


def test_fit_uncertainty_covers_the_truth_under_noise():
    truth = np.array([2.0, 0.5])
    noisy = _curve(truth) * (1 + 0.01 * np.sin(np.arange(8) * 2.3))
    f = calibrate.fit(_batched, [calibrate.Term("a", 1.0, 1.0), calibrate.Term("b", 0.1, 1.0)], noisy, iterations=12)
    assert np.all(np.abs(f.values - truth) < 3 * f.std) and np.all(f.std > 0)
    np.testing.assert_allclose(f.predicted, _curve(f.values), rtol=1e-9)
    assert f.correlation.shape == (2, 2) and math.isfinite(f.condition)


def test_fit_keeps_its_lower_bounds_and_flags_a_term_that_moves_nothing():
    f = calibrate.fit(lambda p: np.stack([_curve(q[:2]) for q in p]),
                      [calibrate.Term("a", 1.0, 1.0), calibrate.Term("b", 0.0, 1.0, lower=0.0),
                       calibrate.Term("unused", 1.0, 1.0)], _curve(np.array([2.0, 0.0])), iterations=6)
    assert f.values[1] >= 0.0 and f.std[2] == np.inf


@pytest.mark.parametrize("terms, targets, evaluate, match", [
    ([], [1.0], _batched, "no terms"),
    ([calibrate.Term("a", 1.0, 1.0)] * 3, [1.0, 2.0], _batched, "cannot fit"),
    ([calibrate.Term("a", 1.0, 1.0)], [1.0, 0.0], _batched, "nonzero"),
    ([calibrate.Term("a", -1.0, 1.0)], [1.0, 2.0], _batched, "lower bound"),
    ([calibrate.Term("a", 1.0, 1.0)], [1.0, 2.0], lambda p: np.full((len(p), 2), np.nan), "non-finite"),
])
def test_fit_refuses_bad_input(terms, targets, evaluate, match):
    with pytest.raises(JaxrouteError, match=match):
        calibrate.fit(evaluate, terms, targets)


def test_the_calibration_terms_add_to_an_iteration_and_to_a_dp_step():
    cp = cost_models.cost_params("H200", "Llama-3-8B", 1)
    base = float(cost_models.prefill_time(cp, 1000, 200))
    more = float(cost_models.prefill_time(dataclasses.replace(cp, token_s=jnp.float32(1e-5),
                                                              kv_token_s=jnp.float32(1e-7)), 1000, 200))
    assert more - base == pytest.approx(1e-5 * 1000 + 1e-7 * 200, rel=1e-3)
    ep = cost_models.cost_params("Ascend-910C", "DeepSeek-V3-W8A8", 4, parallel="dp_ep", dp_ranks=8)
    batch, kv = jnp.full(8, 6.0), jnp.linspace(1e4, 8e4, 8)
    b0, _ = cost_models.dp_step_times(ep, batch, kv)
    b1, _ = cost_models.dp_step_times(dataclasses.replace(ep, token_s=jnp.float32(1e-3),
                                                          kv_token_s=jnp.float32(1e-7)), batch, kv)
    assert float(b1 - b0) == pytest.approx(1e-3 * 6 + 1e-7 * 8e4, rel=1e-3)  # the busiest rank gets both
    assert float(cost_models.kv_step_fraction(dataclasses.replace(ep, kv_token_s=jnp.float32(1e-7)), batch, kv)) > \
        float(cost_models.kv_step_fraction(ep, batch, kv))


SMALL_DEP = dataclasses.replace(PD, model="Llama-3-8B", tp=1)


def test_pd_rows_carry_their_own_cost_terms_in_one_grid():
    wl = build_workload("synthetic-prod", 30)
    plain = pd.PDRow("rr", "jsq", 2, 2)
    slow_prefill = dataclasses.replace(plain, cost_terms=(("prefill.token_s", 1e-4),))
    kv_bound = dataclasses.replace(plain, cost_terms=(("decode.kv_token_s", 2e-7),))
    res, raw = pd.run_pd([plain, slow_prefill, kv_bound], wl, rate=0.05, seeds=1, dep=SMALL_DEP)
    rec = raw["disaggregated"]
    prefill_s = np.asarray(rec["prefill_done_s"] - rec["prefill_admit_s"])[:, 0]  # [rows, N]
    prompt = np.asarray(rec["prompt"])[0, 0]
    # 0.05 req/s: each prompt is prefilled alone, so the term adds exactly token_s x its prompt tokens
    np.testing.assert_allclose(prefill_s[1] - prefill_s[0], 1e-4 * prompt, rtol=2e-3)
    m = {k: np.asarray(v)[:, 0] for k, v in res.grid.metrics.items()}
    assert m["tpot_p95_s"][2] > m["tpot_p95_s"][0] and m["decode_kv_share"][2] > m["decode_kv_share"][0] > 0
    assert np.all(m["decode_slots_in_use"] <= 1) and np.all(m["decode_running_per_group"] > 0)
    np.testing.assert_array_equal(m["conservation_error"], 0)


@pytest.mark.parametrize("row, match", [
    (pd.PDRow("rr", "jsq", 2, 2, cost_terms=(("decode.flopz", 1.0),)), "unknown cost term"),
    (pd.PDRow("rr", "jsq", 2, 2, cost_terms=(("middle.token_s", 1.0),)), "unknown cost term"),
    (pd.PDRow("rr", "jsq", 2, 2, cost_terms=(("decode.token_s", -1.0),)), ">= 0"),
    (pd.PDRow("rr", "-", 2, 2, colocated=True, cost_terms=(("decode.token_s", 1.0),)), "colocated"),
])
def test_bad_cost_terms_are_refused_before_running(row, match):
    with pytest.raises(JaxrouteError, match=match):
        pd.check_rows([row], "dp", SMALL_DEP)


def test_dp_ep_decode_tier_needs_one_size_and_dp_ranks():
    rows = [pd.PDRow("rr", "jsq", 4, 8), pd.PDRow("rr", "jsq", 4, 4)]
    with pytest.raises(JaxrouteError, match="one decode size"):
        pd.check_rows(rows, "dp", PD_PAPER)
    with pytest.raises(JaxrouteError, match="decode-tier dp"):
        pd.check_rows(rows[:1], "replicas", dataclasses.replace(PD_PAPER, decode_tier="replicas"))
    with pytest.raises(JaxrouteError, match="colocated"):
        pd.check_rows([pd.PDRow("rr", "-", 4, 8, colocated=True)], "dp", PD_PAPER)


def test_lengths_workloads_keep_the_decode_laws_and_train_apart():
    from jaxroute.workloads.decode import make_decode_requests

    wl = build_workload("synthetic-azure24", 50)
    req = make_decode_requests("synthetic-azure24", 50)
    np.testing.assert_array_equal(np.asarray(wl.table.prompt_tok), req.prompt_tokens)
    np.testing.assert_array_equal(np.asarray(wl.table.out_tok), req.output_tokens)
    assert wl.n_segments == 50  # one private segment per prompt
    assert float(np.asarray(wl.realize(None, jnp.float32(math.inf)).arrival_s).max()) == 0.0  # --rate max
    train = pd.train_lengths("synthetic-azure24", 50)
    assert not np.array_equal(train.output_tokens, req.output_tokens)
    with pytest.raises(JaxrouteError, match="do not apply"):
        build_workload("synthetic-prod", 10, rate_stages=[(1.0, 10.0)])


def test_the_regime_map_needs_the_calibrated_part_first(tmp_path):
    from jaxroute.reproduce import balanceroute_4p1d
    from jaxroute.reproduce.document import Context

    with pytest.raises(JaxrouteError, match="calibrated"):
        balanceroute_4p1d.calibrated_terms(Context(out_dir=tmp_path, quick=True))


def test_heatmap_writes_a_png(tmp_path):
    from jaxroute import report

    vals = np.array([[1.0, -2.0], [0.0, np.nan]])
    text = [["+1", "-2"], ["0", "n/a"]]
    path = report.heatmap({"a": (vals, text), "b": (-vals, text)}, tmp_path / "h.png", row_labels=["r1", "r2"],
                          col_labels=["c1", "c2"], xlabel="x", ylabel="y", cbar_label="z", marked=(0, 1))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_row_names_its_own_predictor_and_gamma():
    from jaxroute.predictors.base import kind_id

    row = pd.PDRow("rr", "brh", 4, 8, predictor=kind_id("survival"), gamma=0.9)
    assert row.label == "4:8 rr > brh[survival] gamma=0.9"
    assert pd.PDRow("rr", "brh", 4, 8).label == "4:8 rr > brh"


def test_prompt_keys_reach_the_decode_tier_in_its_order():
    from jaxroute.clusters import disagg
    from jaxroute.workloads.decode import make_decode_requests

    wl = build_workload("synthetic-prod", 40)
    req = make_decode_requests("synthetic-prod", 40)
    assert (req.key_id >= 0).any()  # synthetic-prod has prompt templates
    np.testing.assert_array_equal(np.asarray(wl.table.key_id), req.key_id)
    ptable, order = disagg.prefill_table(wl.table, jnp.ones(40, bool))
    np.testing.assert_array_equal(np.asarray(ptable.key_id), req.key_id[np.asarray(order)])
    delivered = jnp.asarray(np.linspace(5.0, 1.0, 40), jnp.float32)  # lands in reverse order
    cp = cost_models.cost_params("H200", "Llama-3-8B", 1)
    dwl, dorder = disagg.decode_handoff(wl.table.arrival_s, wl.table.prompt_tok, wl.table.out_tok, jnp.ones(40, bool),
                                        delivered, 0.0, cp, (), wl.table.key_id)
    np.testing.assert_array_equal(np.asarray(dwl.key_id), req.key_id[np.asarray(dorder)])
    assert np.asarray(dorder)[0] == 39
