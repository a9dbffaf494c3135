"""`jaxroute compare`: jaxroute's own records round-trip exactly, and the roofline's factors are recovered by the fit."""

import json

import numpy as np
import pytest

from jaxroute.errors import JaxrouteError
from jaxroute.experiments import fit_roofline
from tests.cli_helpers import cli

TRUTH = {"eta_compute": 0.45, "eta_memory": 0.6, "overhead_s": 0.003}  # the catalog's: 0.70, 0.795, 0.7 ms
DEPLOYMENT = ["--gpu", "h100", "--model", "llama-3.1-8b", "--admission", "on-demand", "--chunk", "2048",
              "--max-running", "256"]


def test_records_round_trip_and_the_fit_recovers_the_factors_they_were_made_with(tmp_path, capsys):
    truth = tmp_path / "truth.json"
    truth.write_text(json.dumps({"cost_factors": TRUTH}))
    records = tmp_path / "req.jsonl"
    assert cli(["cluster", "--workload", "synthetic-prod", "--requests", "30", "--rate", "1", "--replicas", "1",
                "--seeds", "1", "--policies", "least_load", "--cost-params", str(truth), "--requests-out", str(records),
                "--no-progress", *DEPLOYMENT]) == 0
    # the replay of jaxroute's own records on the same deployment and factors is the same run
    same = tmp_path / "same.json"
    assert cli(["compare", str(records), "--cost-params", str(truth), "--out", str(same), *DEPLOYMENT[:4]]) == 0
    for metric, c in json.loads(same.read_text())["comparison"].items():
        assert c["pairs"] == 30 and c["mape_pct"] < 1e-3, (metric, c)
    # from the catalog's factors, the fit finds the ones the records were made with
    out, fitted = tmp_path / "cmp.json", tmp_path / "fit.json"
    assert cli(["compare", str(records), "--fit", "--fit-steps", "60", "--cost-params-out", str(fitted),
                "--fit-plot", str(tmp_path / "fit.png"), "--out", str(out), *DEPLOYMENT[:4]]) == 0
    text = capsys.readouterr().out
    assert "fitted (" in text and "quality" in text
    res = json.loads(out.read_text())
    got = fit_roofline.load(fitted)
    # tolerances: compute from the prefills; memory and the fixed time trade off along the decode step
    # (overhead + weights / (eta_memory x bandwidth)), only the KV reads part them, so they are pinned less
    assert abs(got.eta_compute / TRUTH["eta_compute"] - 1) < 0.05, got
    assert abs(got.eta_memory / TRUTH["eta_memory"] - 1) < 0.10, got
    assert abs(got.overhead_s / TRUTH["overhead_s"] - 1) < 0.20, got
    before, after = res["comparison"], res["fit"]["comparison"]
    for metric in ("ttft", "tpot", "e2e"):
        assert before[metric]["mape_pct"] > 30 and after[metric]["mape_pct"] < 5, (metric, before, after)
    loss = res["fit"]["loss"]
    assert min(loss) < loss[0] / 50 and (tmp_path / "fit.png").stat().st_size > 1000


@pytest.mark.parametrize("doc, message", [
    ({"cost_factors": {"eta_compute": 0.5}}, "expected cost_factors with exactly eta_compute, eta_memory, overhead_s"),
    ({"cost_factors": {"eta_compute": 1.5, "eta_memory": 0.6, "overhead_s": 0.001}}, "eta_compute = 1.5; expected"),
    ({"cost_factors": {"eta_compute": 0.5, "eta_memory": "x", "overhead_s": 0.001}}, "eta_memory = 'x'"),
    ([1, 2], "expected a mapping with cost_factors"),
])
def test_bad_cost_params_are_refused(tmp_path, doc, message):
    path = tmp_path / "f.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(JaxrouteError, match=message):
        fit_roofline.load(path)


def test_compare_refuses_bad_input(tmp_path, capsys):
    assert cli(["compare", str(tmp_path / "none.json")]) == 2
    (tmp_path / "r.json").write_text(json.dumps({"ttfts": [0.1]}))
    assert cli(["compare", str(tmp_path / "r.json")]) == 2
    assert cli(["compare", str(tmp_path / "r.json"), "--router", "nope"]) == 2
    assert cli(["compare", str(tmp_path / "r.json"), "--fit-plot", "x.png"]) == 2
    err = capsys.readouterr().err
    assert err.count("jaxroute compare: error:") == 4 and "unknown router 'nope'" in err and "go with --fit" in err
    assert np.isfinite(fit_roofline.DEFAULT_LR)


def test_a_published_per_stage_measurement_is_replayed_stage_by_stage(tmp_path, capsys):
    """inference-perf's KubeCon NA 2025 demo (vLLM, Llama-3.1-8B, one H100; tests/fixtures/.../SOURCE.md): its
    first stage (1 req/s) replayed, and a stage its client paced (achieved 106 of 123 req/s) reported, not run."""
    import shutil
    from pathlib import Path

    fixture = Path(__file__).resolve().parent / "fixtures" / "inference_perf_kubecon_na_2025_vllm"
    folder = tmp_path / "results"
    folder.mkdir()
    for name in ("stage_0_lifecycle_metrics.json", "stage_4_lifecycle_metrics.json"):
        shutil.copy(fixture / name, folder / name)
    out = tmp_path / "stages.json"
    assert cli(["compare", str(folder), "--config", str(fixture / "config.yaml"), "--seeds", "2", "--max-running", "128",
                "--out", str(out), *DEPLOYMENT[:4]]) == 0
    assert "client-bound" in capsys.readouterr().out
    first, paced = json.loads(out.read_text())["stages"]
    assert (first["stage"], first["requests"], first["client_bound"]) == (0, 60, False)
    assert (paced["stage"], paced["client_bound"], paced["simulated"]) == (4, True, None)
    assert first["measured"]["ttft_mean_s"] == pytest.approx(0.03112733216257766)
    sim = first["simulated"]
    assert len(sim["ttft_mean_s"]["per_seed"]) == 2 and 0 < sim["ttft_mean_s"]["mean"] < sim["e2e_mean_s"]["mean"]
    # 63 output tokens at a few ms each: the simulated E2E is the measured one's order of magnitude
    assert 0.2 < sim["e2e_mean_s"]["mean"] / first["measured"]["e2e_mean_s"] < 2
    assert cli(["compare", str(folder)]) == 2 and "needs --config" in capsys.readouterr().err
