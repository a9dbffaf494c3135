"""`jaxroute dispatch` and `jaxroute bins`: output, results JSON, plot, one compilation, bad input."""

import json

import pytest

from jaxroute import sim
from jaxroute.cli import main
from jaxroute.clusters.queueing import DispatchModel
from jaxroute.experiments.dispatch import policy_label
from tests.cli_helpers import cli, leak

SMALL = ["--servers", "4", "--load", "0.8", "--seeds", "3", "--requests", "400"]


def test_dispatch_table_json_plot_and_one_compilation(tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    sim.clear_compiled(DispatchModel)
    assert main(["dispatch", *SMALL, "--out", str(out), "--plot", str(png)]) == 0
    assert sim.compile_count(DispatchModel, "advance") == 1  # five policies, one compilation
    text = capsys.readouterr().out
    for name in ("random", "rr", "jsq", "p2c", "lwl", "mean_response", "p99_response", "1/(1-rho) = 5"):
        assert name in text
    data = json.loads(out.read_text())
    assert data["command"] == "dispatch" and data["config"]["servers"] == 4
    assert data["config"]["time_unit"] == "mean service time"
    assert [r["policy"] for r in data["results"]] == ["random", "rr", "jsq", "p2c", "lwl"]
    for r in data["results"]:
        assert r["overflow"] is False
        for m in ("mean_response", "p99_response"):
            s = r["metrics"][m]
            assert len(s["per_seed"]) == 3 and s["ci95"][0] <= s["mean"] <= s["ci95"][1] and s["mean"] > 0
    assert out.with_suffix(".csv").exists()
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_dispatch_stale_board_runs_from_the_same_compilation(capsys):
    sim.clear_compiled(DispatchModel)
    assert main(["dispatch", *SMALL, "--stale", "1"]) == 0  # five policies, still one compilation
    text = capsys.readouterr().out
    assert "stale board T=1.0" in text
    assert sim.compile_count(DispatchModel, "advance") == 1


def test_policy_labels():
    assert policy_label("p2c", 2) == "p2c" and policy_label("pod", 2) == "p2c"
    assert policy_label("p2c", 3) == "po3c" and policy_label("jsq", 3) == "jsq"


@pytest.mark.parametrize("flags,message", [
    (["--servers", "0"], "--servers"),
    (["--servers", "x"], "--servers"),
    (["--load", "-0.5"], "--load"),
    (["--load", "nan"], "--load"),
    (["--seeds", "0"], "--seeds"),
    (["--requests", "0"], "--requests"),
    (["--policies", "random,jsk"], "unknown policy 'jsk'"),
    (["--policies", "jsq,jsq"], "twice"),
    (["--service", "weibull"], "unknown service law"),
    (["--warmup", "1"], "--warmup"),
    (["--stale", "-1"], "--stale"),
    (["--d", "0"], "--d"),
])
def test_dispatch_bad_input_is_a_clear_error(flags, message, capsys):
    assert cli(["dispatch", *SMALL, *flags]) == 2
    err = capsys.readouterr().err
    assert "jaxroute dispatch: error:" in err and message in err and "Traceback" not in err


def test_unstable_load_is_refused_at_once_or_run_once_as_unstable(tmp_path, capsys):
    sim.clear_compiled(DispatchModel)
    assert cli(["dispatch", *SMALL, "--load", "1.2"]) == 2  # known before any run: no ring suffices
    err = capsys.readouterr().err
    assert "load 1.2 >= 1 is unstable" in err and "--allow-unstable" in err
    assert sim.compile_count(DispatchModel, "advance") == 0
    out = tmp_path / "u.json"  # allowed: one run (no ring doubling), reported as unstable, not refused as overflow
    assert main(["dispatch", *SMALL, "--load", "1.2", "--policies", "jsq", "--ring", "2", "--allow-unstable",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "UNSTABLE: load 1.2 >= 1" in text and "outgrew the ring of 2 in jsq" in text
    data = json.loads(out.read_text())
    assert data["config"]["unstable"] is True and data["results"][0]["overflow"] is True


def test_overflowed_ring_is_refused_unless_allowed(capsys):
    args = ["dispatch", *SMALL, "--load", "0.95", "--policies", "jsq", "--stale", "4", "--ring", "2"]
    assert main(args) == 2
    assert "ring capacity 2" in capsys.readouterr().err
    assert main([*args, "--allow-overflow"]) == 0
    assert "OVERFLOW" in capsys.readouterr().out


def test_bins_table_and_json(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bins", "--n", "500", "--d", "1,2", "--seeds", "4", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "d=1 (random)" in text and "max_load" in text and "asymptotic" in text
    data = json.loads(out.read_text())
    loads = [r["metrics"]["max_load"]["mean"] for r in data["results"]]
    assert data["command"] == "bins" and loads[0] > loads[1] >= 2


@pytest.mark.parametrize("flags", [["--d", "0"], ["--n", "0"], ["--seeds", "-1"], ["--d", "1,1"]])
def test_bins_bad_input(flags, capsys):
    assert cli(["bins", "--n", "100", "--seeds", "2", *flags]) == 2
    err = capsys.readouterr().err
    assert "jaxroute bins: error: argument" in err and flags[0] in err


def test_broken_conservation_is_refused_even_with_allow_overflow(monkeypatch, capsys):
    from jaxroute.experiments import dispatch as experiment

    leak(monkeypatch, experiment, "run_dispatch", row=1, seed=0, amount=3)  # row 'rr', seed 0 (the command imports it when it runs)
    assert main(["dispatch", *SMALL, "--policies", "random,rr", "--allow-overflow"]) == 2
    captured = capsys.readouterr()
    assert "conservation failed" in captured.err and "in: rr;" in captured.err
    assert "mean_response" not in captured.out


def test_a_dispatch_run_saves_a_spec_that_reruns_to_the_same_numbers(tmp_path, capsys):
    """--save-spec on another comparison command than cluster (same shapes as the test above: one program)."""
    import yaml

    first, again, spec = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "specs" / "d.yaml"
    assert main(["dispatch", *SMALL, "--policies", "jsq,p2c", "--out", str(first), "--save-spec", str(spec)]) == 0
    doc = yaml.safe_load(spec.read_text())
    assert doc["command"] == "dispatch" and doc["run"]["seeds"] == 3 and doc["workload"]["requests"] == 400
    assert main(["run", str(spec), "--out", str(again)]) == 0
    per_seed = lambda p: [(r["policy"], r["metrics"]["mean_response"]["per_seed"]) for r in json.loads(p.read_text())["results"]]
    assert per_seed(first) == per_seed(again) and len(per_seed(first)) == 2
