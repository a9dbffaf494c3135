"""`jaxroute bench`: the JSON has every model with sane figures; flags are checked; gpu_check.sh parses.

Compilation dominates a bench run (each model and size is its own program, ~5-20 s each on two
cores), so one slow test runs every part at one size (`--quick --seeds 4`, 1 seed more on dispatch for seed
scaling) and checks every part's figures from that one run; request scaling and the cost count, one more program
per model each, are checked on dispatch.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxroute.bench import BenchConfig, jobs, references
from jaxroute.bench.config import JOBS, PROFILE_ROWS
from jaxroute.errors import JaxrouteError
from tests.cli_helpers import cli

ROOT = Path(__file__).resolve().parent.parent
# The quick bench runs on one worker, in this order: the in-process run compiles the quick preset's programs, and
# the wrapper scripts' and gpu_check's runs (the same sizes, in subprocesses) load them from the compile cache.
BENCH_GROUP = "bench"
TOP_LEVEL = ("command", "config", "device", "n_devices", "cores", "jax_version", "load_average", "date", "models",
             "blis", "trace", "decision", "errors")


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _check(res: dict, models: set[str]) -> None:
    for key in TOP_LEVEL:
        assert key in res, key
    assert res["command"] == "bench" and res["partial"] is False
    assert {"kind", "platform"} <= set(res["device"])
    assert res["cores"]["os_cpu_count"] >= 1 and res["cores"]["used"] >= 1
    assert len(res["load_average"]["before"]) == 3 and len(res["load_average"]["after"]) == 3
    assert res["errors"] == []
    assert {m["model"] for m in res["models"]} == models
    for m in res["models"]:
        assert m["sizes"] and m["failed"] is None
        assert m["reference"]["available"], m["reference"]
        assert _positive(m["reference"]["requests_per_s_per_core"])
        for s in m["sizes"]:
            for k in ("requests_per_s", "requests_per_s_per_core", "first_run_s", "steady_s", "memory_per_row_bytes",
                      "ratio_vs_reference"):
                assert _positive(s[k]), (m["model"], k, s[k])
            assert s["compile_s"] >= 0 and s["overflow"] is False and s["conserved"] is True
    blis = res["blis"]
    assert {r["workload"] for r in blis["runs"]} == {"unique", "shared-prefix"}
    for r in blis["runs"]:
        assert _positive(r["requests_per_s"]) and _positive(r["ratio_per_core"])
        assert r["blis_requests_per_s_per_core"] == 3030.0
    assert all(_positive(r["requests_per_s"]) for r in res["trace"]["sizes"])
    for v in list(res["decision"]["decisions"].values()) + [res["decision"]["brh_predicted_loads"]]:
        assert _positive(v["p50_ms"]) and v["p99_ms"] >= v["p50_ms"]


@pytest.mark.slow
@pytest.mark.xdist_group(BENCH_GROUP)
def test_bench_quick_every_model_and_scaling(tmp_path, capsys):
    # Every part at the quick preset's sizes (4 seeds, 32 BLIS requests, traces of 32 and 64, shared with the
    # wrapper scripts and gpu_check's quick stages through the compile cache), the separate preble_e2 grid and, on
    # dispatch, 1 seed for seed scaling (the harness is the same for every model; each more seed count or request
    # count is one more program per model: request scaling and the cost count are checked on dispatch below).
    out = tmp_path / "bench.json"
    assert cli(["bench", "--quick", "--seeds", "4", "--dispatch-seeds", "1,4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    res = json.loads(out.read_text())
    _check(res, {"dispatch", "cluster/toolbench", "cluster/toolbench/preble_e2", "decode"})
    assert res["config"]["preset"] == "quick" and res["config"]["dispatch_seeds"] == [1, 4]
    assert res["config"]["compile_effort"] == "auto" and "compile effort auto" in printed  # a smoke run
    assert BenchConfig().compile_effort == "optimized"  # measurements: one effort at every size
    assert BenchConfig().cost_profile and not BenchConfig.quick().cost_profile  # counted unless a smoke run
    assert res["trace"]["sizes"][0]["reused_from"] == "blis"
    for line in ("model", "dispatch", "cluster/toolbench", "decode", "BLIS scenario", "trace-length scaling",
                 "BR decision latency", "ratio"):
        assert line in printed
    for m in res["models"]:
        if m["model"] == "dispatch":
            assert [s["seeds"] for s in m["sizes"]] == [1, 4]
            assert m["seed_scaling"]["from_seeds"] == 1 and m["seed_scaling"]["to_seeds"] == 4
            assert isinstance(m["seed_scaling"]["flat_or_rising"], bool)
        else:
            assert [s["seeds"] for s in m["sizes"]] == [4] and not m["seed_scaling"]
    assert _positive(res["trace"]["max_over_min"]) and isinstance(res["trace"]["flat"], bool)
    runs = {r["job"]: r for r in res["jobs"]["runs"]}
    assert set(runs) == set(JOBS) and "user jobs" in printed
    for name, r in runs.items():
        if not r["ran"]:  # only a job that reads a file may be left out, and it says which
            assert name == "mooncake" and "no file at" in r["why"], r
            continue
        assert r["requests"] == 16 and r["simulated_requests"] == 16 * len(r["routers"]) and not r["overflow"]
        assert _positive(r["wall_s"]) and r["wall_s"] >= r["compile_s"] >= 0 and _positive(r["requests_per_s"])
        assert set(r["mean_latency_s"]) == set(r["routers"]) and all(map(_positive, r["mean_latency_s"].values()))


@pytest.mark.xdist_group(BENCH_GROUP)
def test_bench_request_scaling_and_the_cost_per_simulated_request(tmp_path, capsys):
    # each runs one more program per model (2x requests; a profiled, chunked run): on dispatch here, the harness is
    # the same for every model (tests/test_program_cost.py checks the counts' exactness on each model's programs)
    out = tmp_path / "bench.json"
    assert cli(["bench", "--quick", "--only", "dispatch", "--seeds", "4", "--request-scaling", "--cost-profile",
                "--out", str(out)]) == 0
    assert "cost per simulated request (counted, not timed)" in capsys.readouterr().out
    (m,) = json.loads(out.read_text())["models"]
    rq = m["request_scaling"]
    assert rq["requests_per_seed"][1] == 2 * rq["requests_per_seed"][0] and _positive(rq["per_request_cost_ratio"])
    cost = m["cost"]  # counted on a profiled run of PROFILE_ROWS rows
    assert cost["available"] and cost["profiled_seeds"] * m["rows"] >= PROFILE_ROWS, cost
    assert _positive(cost["scan_steps_per_request"]) and cost["launches_per_step"] >= cost["compiled_ops_per_step"] > 0
    assert _positive(cost["projection"]["requests_per_s"])


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "0,4"], "argument --seeds: expected a positive integer, got '0'"),
    (["--seeds", "1,x"], "argument --seeds: expected a positive integer, got 'x'"),
    (["--seeds", "4,4"], "argument --seeds: lists a value twice"),
    (["--only", "dispatch,nope"], "unknown bench part 'nope'"),
    (["--policies", "rr,nope"], "unknown router 'nope'"),
    (["--quick", "--gpu-sizes"], "not allowed with argument"),
])
def test_bad_flags_exit_2_with_a_clear_message(argv, message, tmp_path, capsys):
    assert cli(["bench", *argv, "--out", str(tmp_path / "x.json")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_each_job_is_the_cluster_command_it_prints():
    # the JSON's command is what a user reruns: parsed by the CLI, it names the job's grid and settings
    from jaxroute.cli import build_parser
    from jaxroute.commands._common import shared_prefix_settings

    for job in jobs.jobs().values():
        argv = job.command.split()
        assert argv[:2] == ["jaxroute", "cluster"]
        args = build_parser().parse_args(argv[1:])
        assert tuple(args.policies.split(",")) == job.routers and args.replicas == job.replicas
        assert args.admission == job.admission and args.seeds == 1
        assert (args.gpu, args.model, args.tp) == (jobs.DEPLOYMENT["gpu"], jobs.DEPLOYMENT["model_name"],
                                                   jobs.DEPLOYMENT["tp"])
        if job.name == "long-prompt":
            assert shared_prefix_settings(args) == jobs.LONG_PROMPT
            assert tuple(args.rate_stages) == jobs.LONG_PROMPT_STAGES
        else:
            assert args.workload == "mooncake" and args.requests == 3993


def test_a_failed_job_is_an_error_of_the_run(monkeypatch):
    from jaxroute.bench import run_bench

    def broken(job, requests):
        raise ValueError(f"{job.name} broke")

    monkeypatch.setattr(jobs, "run_job", broken)
    res = run_bench(BenchConfig.quick(parts=("jobs",), jobs=("long-prompt",)))
    assert res["jobs"]["runs"][0]["ran"] is False
    assert [(e["part"], e["detail"]) for e in res["errors"]] == [("jobs/long-prompt", "long-prompt broke")]


def test_config_refuses_bad_sizes():
    with pytest.raises(JaxrouteError, match="unknown bench job"):
        BenchConfig(jobs=("nope",))
    with pytest.raises(JaxrouteError, match="dispatch seeds must be positive integers"):
        BenchConfig(dispatch_seeds=(0,))
    with pytest.raises(JaxrouteError, match="give a cluster rate"):
        BenchConfig(cluster_workloads=("agent",))
    assert BenchConfig.quick(trace_sizes=(8,)).trace_sizes == (8,)


# What BLIS's run script (../shared/tools/blis/run.sh) prints: the cluster metrics block, then its RESULT line.
FAKE_BLIS = """#!/bin/bash
[ "$1" = rr ] || {{ echo "unknown scenario $1" >&2; exit 2; }}
echo '=== Simulation Metrics ==='
echo '{{"instance_id": "cluster", "e2e_mean_ms": 2106.7, "ttft_mean_ms": 55.6,'
echo ' "ttft_p99_ms": 91.2, "itl_mean_ms": 10.3}}'
echo "RESULT scenario=$1 requests=$N rate=48 completed={done} wall_s=0.$((RANDOM % 9 + 1)) cache_hit_rate=NA"
[ "$CACHE_DELAY_US" = 0 ]
"""


def test_blis_timed_live_from_its_script(tmp_path):
    from jaxroute.bench import blis

    run_sh = tmp_path / "run.sh"
    run_sh.write_text(FAKE_BLIS.format(done="$N"))
    live = blis.time_blis(str(run_sh), "unique", 2000, 3)
    assert live["scenario"] == "rr" and live["repeats"] == 3 and len(live["wall_s"]) == 3
    assert live["requests_per_s"] == pytest.approx(2000 / sorted(live["wall_s"])[1])
    assert live["metrics"] == pytest.approx({"ttft_mean_s": 0.0556, "ttft_p99_s": 0.0912, "itl_mean_s": 0.0103,
                                             "e2e_mean_s": 2.1067})
    with pytest.raises(JaxrouteError, match="BLIS .*prefix-rr.* failed: unknown scenario prefix-rr"):
        blis.time_blis(str(run_sh), "shared-prefix", 2000, 1)
    run_sh.write_text(FAKE_BLIS.format(done=1999))
    with pytest.raises(JaxrouteError, match="BLIS completed 1999 of 2000 requests"):
        blis.time_blis(str(run_sh), "unique", 2000, 1)
    run_sh.write_text("echo nothing\n")
    with pytest.raises(JaxrouteError, match="printed no RESULT line"):
        blis.time_blis(str(run_sh), "unique", 2000, 1)
    with pytest.raises(JaxrouteError, match="BLIS's run script not found: .*nope.sh"):
        BenchConfig(blis_run=str(tmp_path / "nope.sh"))
    with pytest.raises(JaxrouteError, match="blis rates must be > 0"):
        BenchConfig(blis_rates=(48.0, 0.0))


@pytest.mark.xdist_group(BENCH_GROUP)
def test_blis_fidelity_sweep_compares_like_with_like(tmp_path):
    from jaxroute.bench import blis

    run_sh = tmp_path / "run.sh"
    run_sh.write_text(FAKE_BLIS.format(done="$N"))
    cfg = BenchConfig.quick(blis_run=str(run_sh), blis_rates=(30.0, 48.0), blis_repeats=2)
    fid = blis.run_fidelity(cfg)
    assert fid["requests"] == cfg.blis_requests[0] and [r["rate"] for r in fid["rows"]] == [30.0, 48.0]
    for r in fid["rows"]:
        assert r["blis"]["e2e_mean_s"] == pytest.approx(2.1067) and len(r["blis_e2e_per_draw"]) == 2
        for ours, theirs in blis.FIDELITY_METRICS.items():
            assert _positive(r["ours"][ours])
            assert r["relative_difference"][ours] == pytest.approx(r["ours"][ours] / r["blis"][theirs] - 1)
    # a lower arrival rate queues less: our E2E falls with it (BLIS's figures here are the fake's constants)
    assert fid["rows"][0]["ours"]["mean_latency_s"] < fid["rows"][1]["ours"]["mean_latency_s"]


def test_references_unavailable_outside_a_checkout(monkeypatch, tmp_path):
    monkeypatch.setattr(references, "repo_root", lambda: tmp_path)
    mod, why = references.load_reference("reference_replicas")
    assert mod is None and "not found" in why
    res = references.time_replica_reference(None, None, replicas=4, max_running=64, max_queue=64, policy="rr")
    assert res["available"] is False and "source checkout" in res["reason"]


def test_python_jsq_is_stable_and_seeded():
    a = references.python_jsq(4, 2000, 0.5, seed=1)
    assert a == references.python_jsq(4, 2000, 0.5, seed=1)
    assert 0.9 < sum(a) / len(a) < 1.5  # JSQ at load 0.5 on 4 servers: close to one service time


def test_gpu_check_script_parses_and_is_executable():
    script = ROOT / "scripts" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    assert script.stat().st_mode & 0o111


@pytest.mark.parametrize("name", ["bench_dispatch", "bench_cluster", "bench_dispatch_latency"])
def test_wrapper_scripts_show_help(name):
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / f"{name}.py"), "--help"], capture_output=True, text=True,
                         cwd=ROOT)
    assert res.returncode == 0 and "jaxroute bench" in res.stdout


@pytest.mark.slow
@pytest.mark.xdist_group(BENCH_GROUP)
@pytest.mark.parametrize("name,model", [("bench_dispatch", "dispatch"), ("bench_cluster", "cluster/toolbench"),
                                        ("bench_dispatch_latency", "decode")])
def test_wrapper_scripts_run_quick(name, model, tmp_path):
    out = tmp_path / f"{name}.json"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / f"{name}.py"), "--quick", "--out", str(out)],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(out.read_text())
    assert data["config"]["preset"] == "quick" and not data["errors"]
    assert data["models"] and all(m["model"].startswith(model) for m in data["models"])
    assert all(_positive(s["requests_per_s"]) for m in data["models"] for s in m["sizes"])


@pytest.mark.slow
@pytest.mark.xdist_group(BENCH_GROUP)
def test_gpu_check_quick_runs_every_stage_on_cpu(tmp_path):
    # the stage limits size the GPU run's 10 minutes; on a CPU shared with other jobs a 130 s stage ran 131 s,
    # so the test scales them (no wall-clock threshold in a test)
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "JAX_PLATFORMS": "cpu", "LIMIT_SCALE": "6"}
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--quick"], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=3600)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log
    for stage in ("bench dispatch", "bench cluster", "bench blis, trace, decode, decision", "train-predictor, default device",
                  "train-predictor, JAX_PLATFORMS=cpu", "pytest"):
        assert f"=== {stage}" in log and "TIMED OUT" not in log
    merged = json.loads((tmp_path / "bench.json").read_text())
    assert {m["model"] for m in merged["models"]} >= {"dispatch", "cluster/toolbench", "decode"}
    assert (tmp_path / "ckpt_gpu").is_dir() and (tmp_path / "ckpt_cpu").is_dir() and (tmp_path / "gpu_check.log").exists()
    assert subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--bogus"], capture_output=True,
                          cwd=ROOT).returncode == 2
    bad = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--quick"], capture_output=True, text=True,
                         cwd=ROOT, env={**env, "LIMIT_SCALE": "0.5"})
    assert bad.returncode == 2 and "LIMIT_SCALE must be a positive whole number" in bad.stderr


@pytest.mark.xdist_group(BENCH_GROUP)
def test_xdist_groups_are_honoured(request):
    """Under pytest 9, xdist 3.8 ignored every xdist_group (pyproject pins pytest < 9): a grouped test's node id
    carries its group on an xdist worker run with --dist loadgroup."""
    if getattr(request.config.option, "loadgroup", False):
        assert request.node.nodeid.endswith(f"@{BENCH_GROUP}"), request.node.nodeid
