"""Tuning BR-H's traced weights (beta, gamma, alpha) in the decode model (experiments/tune_decode.py, `jaxroute tune decode`)."""

import argparse
import json

import numpy as np
import pytest

from jaxroute import sim
from jaxroute.cli import build_parser
from jaxroute.clusters import dp_decode as dd
from jaxroute.deployment import Deployment
from jaxroute.errors import JaxrouteError
from jaxroute.experiments import decode as dx
from jaxroute.experiments import tune as T
from jaxroute.experiments import tune_decode as TD
from jaxroute.workloads.decode import make_decode_requests
from tests.cli_helpers import cli

WORKERS = 4
DEP = Deployment(slots=4, pool=8, window=3, horizon=6)
SMALL = ["--workload", "synthetic-prod", "--requests", "40", "--workers", str(WORKERS), "--slots", "4", "--pool", "8",
         "--window", "3", "--horizon", "6", "--no-progress"]


def test_space_defaults_objectives_and_refusals():
    space = TD.DecodeSpace.of(WORKERS)
    assert space.names == ("beta", "gamma", "alpha") and space.router == "brh"
    np.testing.assert_allclose(space.default_values(), [WORKERS, dd.DEFAULT_GAMMA, dd.DEFAULT_ALPHA])
    np.testing.assert_allclose(space.from_unit(space.to_unit(space.default_values())), space.default_values())
    assert space.knobs[0].log and space.knobs[0].from_unit(0.5) == pytest.approx(np.sqrt(0.5 * 64))
    assert TD.DecodeSpace.of(40).knobs[0].hi == 80.0  # beta = G stays inside the box
    only = TD.DecodeSpace.of(WORKERS, ["gamma"])
    assert only.settings([0.9]) == {"beta": WORKERS, "gamma": 0.9, "alpha": dd.DEFAULT_ALPHA}
    assert TD.objective("throughput_tok_s").maximise and not TD.objective("tpot_p95_s").maximise
    assert not TD.objective("imbalance_tokens").maximise and TD.objective("tpot_p95_s").sign == -1.0
    for call, msg in [(lambda: TD.objective("goodput"), "unknown objective 'goodput'"),
                      (lambda: TD.DecodeSpace.of(WORKERS, ["horizon"]), "not a tunable setting of brh"),
                      (lambda: TD.DecodeSpace.of(WORKERS, ["beta", "beta"]), "twice")]:
        with pytest.raises(JaxrouteError, match=msg):
            call()
    over = {"tpot_p95_s": np.ones((2, 3)), "overflow": np.array([[False, True, False], [False] * 3])}
    s = TD.scores_of(over, TD.objective("tpot_p95_s"))
    assert np.isnan(s[0, 1]) and np.isfinite(s).sum() == 5


@pytest.fixture(scope="module")
def tuned():
    """One small search, recording every run_comparison call (its rows, seeds, base seed and scores)."""
    calls, counts = [], []
    real = dx.run_comparison

    def recording(req, rows, **kw):
        res = real(req, rows, **kw)
        calls.append((list(rows), kw["seeds"], kw["seed"], np.asarray(res.grid.metrics["throughput_tok_s"])))
        return res

    req = make_decode_requests("synthetic-prod", 40, seed=0)
    setup = TD.DecodeSetup(req, workers=WORKERS, dep=DEP)
    sim.clear_compiled(dd.DecodeModel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dx, "run_comparison", recording)
        res = TD.tune(TD.DecodeSpace.of(WORKERS), TD.objective("throughput_tok_s"), setup, population=3,
                      generations=2, seeds=2, final_seeds=3,
                      on_generation=lambda g: counts.append(sim.compile_count(dd.DecodeModel, "advance")))
    return res, calls, counts


@pytest.mark.slow
def test_generation_zero_holds_the_defaults_on_common_seeds(tuned):
    res, calls, counts = tuned
    assert len(calls) == 3  # two generations, then the final re-evaluation
    rows, seeds, seed, scores = calls[0]
    assert rows[0] == dx.DecodeRow("brh", "oracle", dd.DEFAULT_ALPHA, float(WORKERS), dd.DEFAULT_GAMMA)  # beta = G
    assert len(rows) == 3 and all(r.policy == "brh" and r.predictor == "oracle" for r in rows)
    assert [(c[1], c[2]) for c in calls[:2]] == [(2, 0), (2, 0)]  # common seeds every generation
    assert res.start_score == pytest.approx(scores[0].mean())
    assert res.generations[-1].best_ever >= res.start_score  # throughput: maximised
    assert counts == [1, 1]  # one compilation for the generations' grid shape


@pytest.mark.slow
def test_final_candidates_include_the_defaults_with_paired_gains_on_fresh_seeds(tuned):
    res, calls, _ = tuned
    rows, seeds, seed, scores = calls[-1]
    assert (seeds, seed) == (3, T.FRESH_SEED)
    assert rows[0] == dx.DecodeRow("brh", "oracle", dd.DEFAULT_ALPHA, float(WORKERS), dd.DEFAULT_GAMMA)
    first = res.candidates[0]
    assert first.label == "defaults" and first.gain is None
    assert first.values == {"beta": WORKERS, "gamma": dd.DEFAULT_GAMMA, "alpha": dd.DEFAULT_ALPHA}
    assert len(res.candidates) >= 2 and res.runs == 2 * 3 * 2 + len(res.candidates) * 3
    for c, sc in zip(res.candidates[1:], scores[1:], strict=True):
        assert len(c.final.per_seed) == 3
        np.testing.assert_allclose(c.gain.per_seed, sc - scores[0], rtol=1e-5)  # paired per fresh seed
        assert set(c.values) == {"beta", "gamma", "alpha"} and 0.5 <= c.values["beta"] <= 64


@pytest.mark.slow
def test_tune_decode_cli_writes_json_and_plot(tmp_path, capsys):
    out, png = tmp_path / "t.json", tmp_path / "t.png"
    rc = cli(["tune", "decode", *SMALL, "--objective", "tpot_p95_s", "--population", "3", "--generations", "2",
              "--seeds", "2", "--final-seeds", "2", "--out", str(out), "--plot", str(png)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "tune brh[oracle] (beta, gamma, alpha): min tpot_p95_s" in text and "H=6 fixed" in text
    assert "generation 1:" in text and "gain (+ = better)" in text
    res = json.loads(out.read_text())
    assert res["command"] == "tune" and res["router"] == "brh" and len(res["generations"]) == 2
    assert res["objective"] == {"metric": "tpot_p95_s", "maximise": False, "slo": ""}
    assert res["candidates"][0]["values"] == {"beta": 4.0, "gamma": dd.DEFAULT_GAMMA, "alpha": dd.DEFAULT_ALPHA}
    assert res["config"]["horizon"] == 6 and res["config"]["workers"] == WORKERS
    assert res["generations"][-1]["best_ever"] <= res["start_score"]  # minimised
    assert png.stat().st_size > 3000


@pytest.mark.parametrize("argv, msg", [
    (["--objective", "goodput"], "unknown objective 'goodput'"),
    (["--population", "1"], "population of at least 2, got 1"),
    (["--predictor", "nope"], "unknown predictor 'nope'"),
    (["--predictor", "oracle,none"], "give one predictor"),
    (["--params", "horizon"], "'horizon' is not a tunable setting of brh"),
    (["--deployment", "nope"], "unknown deployment 'nope'"),
    (["--workload", "toolbench"], "unknown decode workload 'toolbench'"),
])
def test_tune_decode_bad_input(argv, msg, capsys):
    assert cli(["tune", "decode", *SMALL, "--generations", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and "jaxroute tune decode: error:" in err


def test_tune_models_flags_name_their_defaults():
    """test_cli walks the top-level commands only: check `tune cluster`, `tune control` and `tune decode` here."""
    parser = build_parser()
    top = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["tune"]
    models = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(models) == {"cluster", "control", "decode"}
    for name, sub in models.items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help and action.help.strip(), f"tune {name} {action.option_strings}: no help"
            if not action.required:
                assert "default" in action.help.lower(), f"tune {name} {action.option_strings}: no default in help"
    assert "static shape" in models["decode"].description and "not tuned" in models["decode"].description
