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


def test_train_save_load_decode_end_to_end(ckpt, tmp_path, capsys):
    """The checkpoint drives deployed BR-H in the decode simulator, next to oracle BR-H, in one table."""
    out = tmp_path / "d.json"
    rc = main(["decode", "--workload", "synthetic-prod", "--requests", "16", "--seeds", "2", "--workers", "2",
               "--slots", "4", "--pool", "6", "--window", "3", "--horizon", "40", "--seed", "3", "--no-progress",
               "--policies", "jsq,br0,brh", "--predictor", f"survival,exact,learned:{ckpt},oracle",
               "--out", str(out)])
    assert rc == 0
    captured = capsys.readouterr()
    assert "brh[learned]" in captured.out and "brh[oracle]" in captured.out
    assert "trained with seed" not in captured.err  # same workload and seed as the checkpoint: no warning
    res = json.loads(out.read_text())
    brh = [r for r in res["results"] if r["policy"] == "brh"]
    assert [r["params"]["predictor"] for r in brh] == ["survival", "exact", "learned", "oracle"]
    for r in res["results"]:
        assert r["overflow"] is False and r["metrics"]["throughput_tok_s"]["mean"] > 0


def test_decode_with_mismatched_checkpoint_is_a_clear_error(ckpt, capsys):
    rc = main(["decode", "--workload", "synthetic-prod", "--requests", "40", "--seeds", "2", "--workers", "2",
               "--slots", "4", "--pool", "6", "--window", "3", "--horizon", "6", "--no-progress",
               "--policies", "brh", "--predictor", f"learned:{ckpt}"])
    assert rc == 2 and "H=40" in capsys.readouterr().err
