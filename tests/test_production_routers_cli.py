"""`jaxroute cluster` with the production routers: every router in one compiled grid, weight vectors
from the CLI, module settings, and refusals; scripts/compare_production_routers.py (the reproduction's wrapper)."""

import json
import re
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxroute import sim
from jaxroute.cli import main
from jaxroute.clusters import replicas as R
from jaxroute.experiments.cluster import policy_rows, run_cluster
from jaxroute.routers.prefix import PREFIX_POLICIES
from jaxroute.workloads import prefix as W
from tests.cli_helpers import SCRIPTS, cli, resume_from


def test_every_router_runs_in_one_grid_and_conserves_requests():
    """All presets side by side (one lax.switch over the policy id), 8 replicas of Qwen3-32B on 2 x H100."""
    wl = W.synthetic("shared-prefix", 120)
    rows = policy_rows(PREFIX_POLICIES, rate=40.0, gpu="h100", model_name="qwen3-32b", tp=2)
    sim.clear_compiled(R.ReplicaModel)
    res = run_cluster(rows, wl, replicas_n=8, seeds=2, max_tries=1)
    m = res.grid.metrics
    assert not res.grid.overflow.any()
    assert (m["conservation_error"] == 0).all() and (m["completed"] == 120).all()
    assert sim.compile_count(R.ReplicaModel, "advance") == 1
    share = dict(zip(res.labels, m["max_replica_share"].mean(1), strict=True))
    # the routers differ: prefix-pinned routing herds, load-only routing spreads
    assert share["vllm_prefixaware"] > share["least_load"]
    assert np.all(m["output_tokens_per_s"] > 0)


def test_weight_vectors_are_rows_of_one_grid(tmp_path, capsys):
    out = tmp_path / "w.json"
    rc = main(["cluster", "--workload", "toolbench", "--requests", "60", "--seeds", "2", "--rate", "20",
               "--policies", "llmd_precise,llmd_approx,rr", "--weights", "prefix=3,kv=2,queue=2",
               "--weights", "prefix=1,queue=1", "--router-set", "llmd_block_tokens=16", "--out", str(out)])
    assert rc == 0
    assert "llmd_approx[prefix=1,queue=1]" in capsys.readouterr().out
    res = json.loads(out.read_text())
    labels = [r["policy"] for r in res["results"]]
    assert labels == ["llmd_precise[prefix=3,kv=2,queue=2]", "llmd_precise[prefix=1,queue=1]",
                      "llmd_approx[prefix=3,kv=2,queue=2]", "llmd_approx[prefix=1,queue=1]", "rr"]
    assert res["results"][1]["params"]["weights"] == {"prefix": 1.0, "queue": 1.0}
    assert "weights" not in res["results"][4]["params"]
    assert res["config"]["router_set"] == {"llmd_block_tokens": 16.0}


@pytest.mark.parametrize("argv, message", [
    (["--policies", "llmd_precise", "--weights", "prefx=1"], "unknown scorer"),
    (["--policies", "rr", "--weights", "prefix=1"], "weighted presets"),
    (["--policies", "dynamo_kv", "--router-set", "dyn_overlap_weigt=2"], "unknown router setting"),
    (["--policies", "dynamo_kv", "--router-set", "dyn_temperature=-1"], "dyn_temperature"),
])
def test_bad_router_settings_are_refused(argv, message, capsys):
    assert cli(["cluster", "--requests", "20", "--seeds", "2", *argv]) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_malformed_weights_are_usage_errors(capsys):
    assert cli(["cluster", "--policies", "llmd_precise", "--weights", "prefix=three"]) == 2
    assert "name=number" in capsys.readouterr().err


def run_wrapper(script: str, argv, monkeypatch) -> int:
    """Run scripts/<script>.py as `python scripts/<script>.py argv` in this process; its exit code."""
    monkeypatch.setattr(sys, "argv", [str(SCRIPTS / f"{script}.py"), *argv])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(SCRIPTS / f"{script}.py"), run_name="__main__")
    return done.value.code


def check_report(out: Path, title: str) -> str:
    """report.md holds the section, its claims table and only PNGs that exist; the text."""
    text = (out / "report.md").read_text()
    assert "QUICK RUN" in text and f"## {title}" in text and "**Claims**" in text
    assert "| claim | where | source | ours (95 % CI) | verdict | reason |" in text
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert links and all((out / f).stat().st_size > 5000 for f in links)
    return text


@pytest.mark.slow
def test_wrapper_quick_shared_prefix(tmp_path, monkeypatch, quick_report):
    """The wrapper's quick run of one workload: the report, and what must hold of its numbers."""
    resume_from(quick_report, tmp_path, ["production-routers.routers_shared_prefix"])  # the suite's `reproduce all --quick` ran it; the wrapper resumes
    assert run_wrapper("compare_production_routers", ["--quick", "--only", "routers_shared_prefix", "--out",
                                                      str(tmp_path), "--no-progress"], monkeypatch) == 0
    text = check_report(tmp_path, "Production routers on shared-prefix")
    assert "routers_toolbench" not in text.split("## Verdicts")[1]  # --only ran one experiment
    data = json.loads((tmp_path / "results.json").read_text())
    exp = data["experiments"]["production-routers.routers_shared_prefix"]
    assert len(exp["records"]) == 13 * len(exp["rates"]) and exp["seeds"] == 2
    claims = [r for r in data["results"] if r["policy"] == "production-routers.routers_shared_prefix"]
    assert len(claims) == 10 and all(c["verdict"] in ("reproduced", "direction only", "differs") for c in claims)
    by = {r["policy"]: r["metrics"] for r in exp["records"]}
    for rate in exp["rates"]:
        def m(p, k, rate=rate):
            return by[f"{p}@{rate:g}"][k]["mean"]

        for p in ("random", "llmd_precise", "vllm_prefixaware"):
            assert 0 <= m(p, "hit_rate") <= 1 and 1 / 8 - 1e-6 <= m(p, "max_replica_share") <= 1
        # the shared prompts: routing on the cache hits more than routing blind to it
        assert m("llmd_precise", "hit_rate") > m("random", "hit_rate")
        assert m("sglang_cache_aware", "hit_rate") > m("sglang_power_of_two", "hit_rate")
