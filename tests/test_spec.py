"""Experiment specs (`jaxroute run`, `--save-spec`), inference-perf configs run as they are, per-stage results and
per-request records: the same numbers by every route, and each bad field named in one line."""

import csv
import json
import os
from collections import defaultdict

import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from jaxroute import spec
from jaxroute.cli import build_parser
from jaxroute.errors import JaxrouteError
from jaxroute.experiments import requests as req_lib
from jaxroute.metrics import masked_quantile
from jaxroute.workloads import inference_perf as ip
from tests.cli_helpers import cli

CONFIG = {"load": {"type": "constant", "stages": [{"rate": 2, "duration": 10}, {"rate": 6, "duration": 5}],
                   "num_workers": 1, "worker_max_concurrency": 2},
          "api": {"type": "completion", "streaming": True}, "server": {"type": "vllm", "model_name": "x"},
          "data": {"type": "shared_prefix", "shared_prefix": {"num_unique_system_prompts": 3,
                                                              "num_users_per_system_prompt": 4,
                                                              "system_prompt_len": 2000, "question_len": 100,
                                                              "output_len": 30}}}
ROOT = build_parser()
COMMON = ["--replicas", "2", "--seeds", "2", "--policies", "rr,least_load"]


def _results(path):
    return [(r["policy"], {k: v["per_seed"] for k, v in r["metrics"].items()}) for r in json.loads(path.read_text())["results"]]


def test_an_inference_perf_config_the_flag_form_and_the_saved_spec_give_the_same_numbers(tmp_path, capsys):
    cfg = tmp_path / "config.yml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    a, b, c = (tmp_path / f"{x}.json" for x in "abc")
    saved = tmp_path / "specs" / "job.yaml"
    rc = cli(["cluster", "--inference-perf", str(cfg), *COMMON, "--out", str(a), "--plot", str(tmp_path / "a.png"),
              "--requests-out", str(tmp_path / "req.csv"), "--save-spec", str(saved)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "rr, per load stage" in out.out and "0: 2 req/s x 10 s" in out.out and "1: 6 req/s x 5 s" in out.out
    assert "inference-perf: constant arrivals drawn as a Poisson process" in out.err
    assert "requests were in flight at once; inference-perf's client holds at most 2" in out.err
    assert (tmp_path / "a-stages.png").stat().st_size > 1000
    res = json.loads(a.read_text())
    assert res["config"]["inference_perf"]["stage_requests"] == [20, 30] and res["peak_in_flight"] > 2
    assert [len(v) for v in res["stages"].values()] == [2, 2]
    per_stage = res["stages"]["rr"]
    assert [s["rate"] for s in per_stage] == [2.0, 6.0]
    assert sum(np.array(s["metrics"]["requests"]["per_seed"]) for s in per_stage).tolist() == [50.0, 50.0]

    # the flag form of the same job
    flags = ip.load(CONFIG).flags()
    argv = ["cluster", "--workload", flags["workload"], "--rate-stages", "2:10,6:5", "--requests", str(flags["requests"])]
    for dest in ("sp_groups", "sp_prompts_per_group", "sp_system_len", "sp_question_len", "sp_output_len"):
        argv += ["--" + dest.replace("_", "-"), str(flags[dest])]
    assert cli(argv + COMMON + ["--out", str(b)]) == 0
    assert _results(a) == _results(b)

    # the saved spec: sections, a path relative to the spec, and the same numbers when run (outputs overridden)
    doc = yaml.safe_load(saved.read_text())
    assert doc["command"] == "cluster" and doc["deployment"] == {"replicas": 2}
    assert doc["workload"] == {"inference_perf": str(cfg)} and doc["routers"] == {"policies": "rr,least_load"}
    assert doc["run"] == {"seeds": 2} and doc["outputs"]["requests_out"] == str(tmp_path / "req.csv")
    assert cli(["run", str(saved), "--out", str(c)]) == 0
    assert _results(a) == _results(c)
    # the config itself is a spec (a cluster run with the cluster's defaults)
    assert spec.read(cfg, ROOT) == ("cluster", ["--inference-perf", str(cfg)])

    # per-stage values from the records file, recomputed by hand
    rows = list(csv.DictReader((tmp_path / "req.csv").open()))
    assert len(rows) == 2 * 2 * 50 and list(rows[0]) == list(req_lib.COLUMNS)
    ttft, count = defaultdict(list), defaultdict(int)
    for r in rows:
        key = (r["router"], int(r["seed"]), int(r["stage"]))
        count[key] += 1
        if r["finish_s"]:
            ttft[key].append(float(r["ttft_s"]))
    for j, stage in enumerate(res["stages"]["least_load"]):
        m = stage["metrics"]
        assert m["requests"]["per_seed"] == [count["least_load", s, j] for s in range(2)]
        assert np.allclose(m["ttft_mean_s"]["per_seed"], [np.mean(ttft["least_load", s, j]) for s in range(2)])
        assert np.allclose(m["ttft_p90_s"]["per_seed"], [np.quantile(ttft["least_load", s, j], 0.9) for s in range(2)])


def test_stage_of_and_the_quantile_follow_the_definitions():
    stages = [(1.0, 10.0), (2.0, 5.0), (4.0, 5.0)]
    assert req_lib.stage_of(np.array([0.0, 9.99, 10.0, 14.9, 15.0, 99.0]), stages).tolist() == [0, 0, 1, 1, 2, 2]
    rng = np.random.default_rng(0)
    x = rng.exponential(size=(3, 40)).astype(np.float32)
    mask = rng.random((3, 40)) < 0.6
    for q in (0.5, 0.9, 0.99):
        want = [float(masked_quantile(jnp.asarray(x[i]), jnp.asarray(mask[i]), q)) for i in range(3)]
        assert np.allclose(req_lib._quantile(x, mask, q), want, rtol=1e-6)
    assert np.isnan(req_lib._quantile(x, np.zeros_like(mask), 0.9)).all()  # over no requests: missing, not 0
    table = {"arrival_s": np.array([[[0.0, 1.0, 2.0]]]), "finish_s": np.array([[[5.0, np.inf, 2.5]]])}
    assert req_lib.peak_in_flight(table) == 3
    table["finish_s"] = np.array([[[1.0, np.inf, 2.5]]])  # a finish at an arrival's time leaves first
    assert req_lib.peak_in_flight(table) == 2


def test_a_saved_spec_reads_back_as_the_same_command_line(tmp_path):
    argv = ["--workload", "synthetic-prod", "--policies", "jsq,br0", "--workers", "4", "--seeds", "3", "--alpha", "0.5",
            "--out", "res/o.json", "--no-progress"]
    path = spec.save(tmp_path / "d.yaml", "decode", argv, ROOT)
    doc = yaml.safe_load(path.read_text())
    assert doc["options"]["alpha"] == 0.5 and doc["run"] == {"seeds": 3, "no_progress": True}
    assert doc["outputs"]["out"] == os.path.relpath(os.path.abspath("res/o.json"), tmp_path)  # relative to the spec
    command, back = spec.read(path, ROOT)
    assert command == "decode"
    given, again = spec.given_settings("decode", argv, ROOT), spec.given_settings("decode", back, ROOT)
    assert os.path.normpath(again.pop("out")) == os.path.abspath(given.pop("out")) and again == given
    nested = spec.save(tmp_path / "c.yaml", "capacity cluster", ["--slo", "ttft_p90_s<=2"], ROOT)
    assert spec.read(nested, ROOT) == ("capacity cluster", ["--slo", "ttft_p90_s<=2"])
    assert spec.split_command(["--no-compile-cache", "capacity", "cluster", "--seeds", "2"], "capacity", ROOT) == (
        "capacity cluster", ["--seeds", "2"])


@pytest.mark.parametrize("doc, message", [
    ({"command": "clusterr"}, "command: unknown command 'clusterr'; choose from:"),
    ({"command": "cluster", "deploymnt": {"tp": 2}}, "deploymnt: Extra inputs are not permitted"),
    ({"command": "cluster", "deployment": {"tpp": 2}}, "deployment.tpp: not a setting of `jaxroute cluster`"),
    ({"command": "cluster", "deployment": {"tp": 0}}, "deployment.tp: expected a positive integer, got '0'"),
    ({"command": "cluster", "run": {"seeds": "many"}}, "run.seeds: expected a positive integer, got 'many'"),
    ({"command": "cluster", "run": {"no_progress": "yes"}}, "run.no_progress: expected true or false, got 'yes'"),
    ({"command": "cluster", "workload": {"rate_stages": [[3, 80], [0, 5]]}}, "workload.rate_stages: expected RATE:SECONDS"),
    ({"command": "cluster", "deployment": {"tp": 2}, "options": {"tp": 4}}, "options.tp: also given in deployment"),
    ({"command": "cluster", "routers": {"weights": [{"prefix": "x"}]}}, "routers.weights: expected name=number"),
    ({"deployment": {"tp": 2}}, "command: Field required"),
])
def test_bad_specs_name_the_field_the_value_and_what_is_allowed(tmp_path, doc, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(JaxrouteError) as e:
        spec.read(path, ROOT)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_spec_runs_with_lists_and_pairs_and_bad_files_are_refused(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"command": "cluster", "workload": {"rate_stages": [[2, 3], {"rate": 4, "duration": 2}]},
                                    "routers": {"policies": ["rr", "least_load"], "weights": [{"prefix": 3, "queue": 2}]}}))
    _, argv = spec.read(path, ROOT)
    assert argv == ["--rate-stages", "2:3,4:2", "--policies", "rr,least_load", "--weights", "prefix=3,queue=2"]
    assert cli(["run", str(tmp_path / "none.yaml")]) == 2
    (tmp_path / "list.yaml").write_text("- 1\n")
    assert cli(["run", str(tmp_path / "list.yaml")]) == 2
    err = capsys.readouterr().err
    assert "spec file not found" in err and "expected a mapping with a `command`" in err


def test_the_example_spec_and_its_inference_perf_config_read():
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "examples" / "long-prompt"
    command, argv = spec.read(folder / "job.yaml", ROOT)
    assert command == "cluster" and argv[argv.index("--inference-perf") + 1] == str(folder / "inference-perf.yml")
    load = ip.load(folder / "inference-perf.yml")
    assert load.requests == 17_040 and load.flags()["sp_system_len"] == 6000 and len(load.stages) == 7


def test_flags_that_the_inference_perf_config_or_the_cost_params_rule_out_are_refused(tmp_path, capsys):
    cfg = tmp_path / "config.yml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    factors = tmp_path / "f.json"
    factors.write_text(json.dumps({"cost_factors": {"eta_compute": 0.5, "eta_memory": 0.6, "overhead_s": 0.001}}))
    for extra in (["--workload", "toolbench"], ["--hot-tool", "0.4"], ["--rate", "3"], ["--sp-groups", "2"]):
        assert cli(["cluster", "--inference-perf", str(cfg), *extra]) == 2
    assert cli(["cluster", "--cost-params", str(factors), "--cost-model", "preble", "--requests", "10"]) == 2
    err = capsys.readouterr().err
    for flag in ("drop --workload", "drop --hot-tool", "drop --rate", "drop --sp-*", "does not apply to --cost-model preble"):
        assert flag in err, flag
