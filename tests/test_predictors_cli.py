"""Tiny end to end: train-predictor -> orbax checkpoint -> eval-predictor (and errors as CLI messages)."""

import json

import pytest

from jaxroute.cli import main


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("pred") / "ck"
    rc = main(["train-predictor", "--workload", "synthetic-prod", "--requests", "600", "--horizon", "40",
               "--save", str(d), "--steps", "60", "--batch", "128", "--seed", "3"])
    assert rc == 0
    return d


def test_train_writes_checkpoint_and_loss_curve(ckpt, capsys):
    assert (ckpt / "loss_curve.png").stat().st_size > 1000
    steps = [p for p in ckpt.iterdir() if p.is_dir() and p.name.isdigit()]
    assert len(steps) == 1


def test_eval_compares_three_predictors(ckpt, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["eval-predictor", "--workload", "synthetic-prod", "--requests", "600", "--horizon", "40",
               "--load", str(ckpt), "--seed", "3", "--pairs", "2000", "--folds", "3", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "0.700 / 20.1 (production)" in text and "learned" in text
    res = json.loads(out.read_text())
    assert res["command"] == "eval-predictor"
    assert [r["policy"] for r in res["results"]] == ["survival", "exact", "learned"]
    for r in res["results"]:
        auc, mae = r["metrics"]["auc"]["mean"], r["metrics"]["mae"]["mean"]
        assert 0.5 < auc <= 1.0 and 0.0 < mae < 40
        assert len(r["metrics"]["auc"]["per_seed"]) == 3
    # templated workload: exact-match separates ending requests better than survival
    by = {r["policy"]: r["metrics"]["auc"]["mean"] for r in res["results"]}
    assert by["exact"] > by["survival"]


def test_eval_with_wrong_horizon_is_a_clear_cli_error(ckpt, capsys):
    rc = main(["eval-predictor", "--workload", "synthetic-prod", "--requests", "600", "--horizon", "80",
               "--load", str(ckpt), "--seed", "3", "--pairs", "500", "--folds", "2"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "error:" in err and "H=40" in err and "Traceback" not in err


def test_eval_feature_mismatch_and_missing_load(ckpt, capsys):
    rc = main(["eval-predictor", "--workload", "synthetic-azure24", "--requests", "300", "--horizon", "40",
               "--load", str(ckpt), "--pairs", "500", "--folds", "2"])
    assert rc == 2 and "features" in capsys.readouterr().err
    rc = main(["eval-predictor", "--workload", "synthetic-azure24", "--requests", "300", "--horizon", "40",
               "--predictors", "learned", "--pairs", "500", "--folds", "2"])
    assert rc == 2 and "--load" in capsys.readouterr().err
