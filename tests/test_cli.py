"""CLI-wide checks: every subcommand's --help is complete, and errors are short, not tracebacks."""

import argparse
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxroute.cli import build_parser, main
from jaxroute.commands import _common as common


def _subparsers():
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return parser, action.choices


def test_every_option_has_help_text():
    _, subs = _subparsers()
    assert subs, "no subcommands registered"
    for name, sub in subs.items():
        assert sub.description or sub.format_usage(), name
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help and action.help.strip(), f"jaxroute {name} {action.option_strings or action.dest}: no help"
            if not action.required:
                assert "default" in action.help.lower(), f"jaxroute {name} {action.option_strings}: no default in help"


def test_help_runs_for_every_subcommand(capsys):
    _, subs = _subparsers()
    for name in subs:
        with pytest.raises(SystemExit) as e:
            main([name, "--help"])
        assert e.value.code == 0
        assert "usage: jaxroute" in capsys.readouterr().out


def test_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["no-such-command"])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_counts_past_an_int32_are_one_line_usage_errors(capsys):
    """`--requests 99999999999999999999` failed inside numpy, `dispatch --requests 10000000000` inside JAX."""
    for argv in (["cluster", "--requests", "99999999999999999999"], ["dispatch", "--requests", "10000000000"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "argument --requests: expected a positive integer up to 2,147,483,647 (an int32 count)" in err


def test_bad_output_paths_are_refused_before_the_run(tmp_path, capsys):
    """Each of these ran the whole simulation, then died in a traceback; now one line before anything runs (the
    folder checks try to make a file: os.access says yes to root on /proc)."""
    folder = tmp_path / "d"
    folder.mkdir()
    cases = [(["cluster", "--out", str(folder)], f"output {folder} is a directory"),
             (["cluster", "--requests-out", "/proc/x.csv"], "output /proc/x.csv: cannot write in /proc"),
             (["cluster", "--save-spec", str(folder)], f"output {folder} is a directory"),
             (["cluster", "--plot", str(tmp_path / "p.xyz")], "matplotlib writes .png"),
             (["reproduce", "lecture", "--out", str(tmp_path / "f.txt")], None)]
    (tmp_path / "f.txt").write_text("x")
    cases[-1] = (cases[-1][0], f"output folder {tmp_path / 'f.txt'} is a file")
    for argv, needle in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert needle in err[-1] and len(err) == 1, err


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    """Ctrl-C during a run prints one line naming the command, no traceback, and exits as a shell reports SIGINT."""
    from jaxroute import spec

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(spec, "run_parsed", interrupted)
    assert main(["dispatch"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "jaxroute dispatch: interrupted" and "Traceback" not in err


def test_a_host_allocation_past_the_machine_is_one_line(monkeypatch, capsys):
    """numpy's MemoryError (e.g. building a billion-request workload) is one line with its size, exit 2."""
    from jaxroute import spec

    def too_big(*a, **k):
        raise MemoryError("Unable to allocate 7.45 GiB for an array with shape (1000000001,) and data type int64")

    monkeypatch.setattr(spec, "run_parsed", too_big)
    assert main(["cluster"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["jaxroute cluster: error: out of memory (Unable to allocate 7.45 GiB for an array with shape "
                   "(1000000001,) and data type int64); run fewer requests, seeds or rows"]


@pytest.mark.parametrize("convert,good,bad", [
    (common.positive_int, [("3", 3)], ["0", "-2", "1.5", "x"]),
    (common.non_negative_int, [("0", 0)], ["-1", "x"]),
    (common.positive_float, [("0.5", 0.5)], ["0", "-1", "nan", "inf", "x"]),
    (common.non_negative_float, [("0", 0.0)], ["-0.1", "nan"]),
    (common.probability, [("0", 0.0), ("1", 1.0)], ["1.01", "-0.1", "nan"]),
    (common.fraction, [("0", 0.0), ("0.5", 0.5)], ["1", "-0.1"]),
    (common.positive_fraction, [("1", 1.0)], ["0", "1.5"]),
    (common.at_least(1.0), [("1", 1.0)], ["0.9"]),
    (common.off_or(common.at_least(1.0)), [("off", math.inf), ("OFF", math.inf), ("2", 2.0)], ["0.5", "on"]),
    (common.list_of(common.positive_int), [("1, 2,3", [1, 2, 3])], ["1,1", "", "1,x"]),
    (common.list_of(common.positive_float, unique=False), [("1,1", [1.0, 1.0])], ["1,-1"]),
])
def test_number_converters(convert, good, bad):
    for text, value in good:
        assert convert(text) == value
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError, match="expected|twice"):
            convert(text)


def test_bad_number_is_a_usage_error_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bins", "--n", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "jaxroute bins: error: argument --n: expected a positive integer, got '0'" in err


# Building every parser and parsing arguments must import none of these: `jaxroute --help` and argument errors
# then take a fraction of a second (the commands import the models when they run).
HEAVY = ("jax", "jaxlib", "numpy", "matplotlib", "optax", "orbax", "evosax", "tqdm")
# the fewest arguments each command (and each model of capacity and tune) parses
MINIMAL_ARGV = {
    "bench": [[]], "bins": [[]], "cluster": [[]], "cost": [[]], "decode": [[]], "dispatch": [[]], "pd": [[]],
    "select": [[]], "reproduce": [["lecture"]], "run": [["job.yaml"], ["job.yaml", "--seeds", "4"]], "compare": [["measured.json"]],
    "capacity": [[model, "--slo", "mean_response<=5"] for model in ("dispatch", "cluster", "pd", "decode")],
    "tune": [["cluster", "--router", "threshold"], ["control", "--autoscaler", "hpa"], ["decode"]],
    "eval-predictor": [["--workload", "synthetic-prod"]],
    "train-predictor": [["--workload", "synthetic-prod", "--save", "DIR"]],
    "fit-latency": [["DATA"]],
}
PARSE_EVERYTHING = f"""
import argparse, sys
from jaxroute.cli import build_parser

parser = build_parser()
subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
assert sorted(subs) == {sorted(MINIMAL_ARGV)!r}, sorted(subs)  # a new command: add it to MINIMAL_ARGV
for name, argvs in {MINIMAL_ARGV!r}.items():
    for argv in argvs:
        parser.parse_args([name, *argv])
todo = [parser]
while todo:
    p = todo.pop()
    p.format_help()
    todo += [s for a in p._actions if isinstance(a, argparse._SubParsersAction) for s in a.choices.values()]
print(" ".join(m for m in {HEAVY!r} if m in sys.modules))
"""


def _python(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])


def test_parsers_and_their_help_import_no_jax():
    out = _python("-c", PARSE_EVERYTHING)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "", f"building the parsers imported {out.stdout.strip()}"


USAGE_ERROR = """
import sys
from jaxroute.cli import main

try:
    main(["dispatch", "--servers", "0"])
except SystemExit as e:
    print(e.code, *(m for m in {heavy!r} if m in sys.modules))
"""


def test_usage_error_exits_2_with_one_line_before_any_jax_import():
    out = _python("-c", USAGE_ERROR.format(heavy=HEAVY))
    assert out.stdout.split() == ["2"], f"exit code and modules imported: {out.stdout.strip()}"
    assert out.stderr.strip().splitlines() == [  # one line: no usage block above it
        "jaxroute dispatch: error: argument --servers: expected a positive integer, got '0' (see jaxroute dispatch "
        "--help)"]
    module = _python("-m", "jaxroute", "dispatch", "--servers", "0")
    assert module.returncode == 2 and module.stderr == out.stderr


# Bad flags and files of every command that need no simulation: each is one line naming the problem (and the command
# the user typed), exit 2, and JAX never imported (imports counted, not seconds). FILE: an existing text file,
# DIR: an existing folder, NOPE: a path that is not there.
BAD_FLAGS = [
    (["cluster", "--policies", "bogus"], "cluster: error: unknown policy 'bogus'"),
    (["cluster", "--workload", "bogus"], "cluster: error: unknown workload 'bogus'"),
    (["cluster", "--trace", "NOPE"], "--trace is for mooncake / azure-conv / burstgpt, not the synthetic workload"),
    (["cluster", "--workload", "mooncake", "--trace", "NOPE"], "trace file not found"),
    (["cluster", "--workload", "mooncake", "--trace", "DIR"], "is a folder; name a file"),
    (["cluster", "--model", "bogus"], "unknown model 'bogus'"),
    (["cluster", "--gpu", "bogus"], "unknown GPU 'bogus'"),
    (["cluster", "--params-json", "NOPE"], "--params-json file not found"),
    (["cluster", "--autoscaler", "bogus"], "unknown autoscaler 'bogus'"),
    (["cluster", "--gate", "bogus"], "unknown gate 'bogus'"),
    (["cluster", "--policies", "weighted", "--weights", "bogus=1"], "unknown scorer(s) ['bogus'] in --weights; choose from: prefix"),
    (["cluster", "--router-set", "bogus=1"], "unknown router setting(s) ['bogus']; choose from: aibrix_block_tokens"),
    (["cluster", "--latency-model", "bogus"], "unknown latency model 'bogus'"),
    (["cluster", "--latency-params", "NOPE"], "latency params file not found"),
    (["cluster", "--server", "NOPE"], "server file not found"),
    (["cluster", "--server", "FILE"], "expected a mapping of vLLM serve arguments"),
    (["cluster", "--inference-perf", "FILE"], "expected a mapping with `data` and `load` sections"),
    (["cluster", "--out", "DIR"], "is a directory; name a file"),
    (["cluster", "--plot", "x.bogus"], "matplotlib writes .png"),
    (["cluster", "--requests", "0"], "argument --requests: expected a positive integer"),
    (["dispatch", "--policies", "nope"], "dispatch: error: unknown policy 'nope'"),
    (["dispatch", "--load", "2"], "is unstable"),
    (["decode", "--policies", "nope"], "decode: error: unknown policy 'nope'"),
    (["decode", "--trace", "NOPE"], "--trace is for azure-conv / azure-code, not the synthetic workload"),
    (["decode", "--workload", "azure-conv", "--trace", "NOPE"], "trace file not found"),
    (["decode", "--predictor", "bogus"], "unknown predictor 'bogus'"),
    (["decode", "--predictor", "learned:NOPE"], "predictor checkpoint folder not found"),
    (["decode", "--model", "bogus"], "unknown model 'bogus'"),
    (["pd", "--prefill-router", "nope"], "pd: error: unknown prefill router 'nope'"),
    (["pd", "--trace", "NOPE"], "--trace is for mooncake / azure-conv / burstgpt"),
    (["capacity", "cluster", "--slo", "ttft_p90_s<=1", "--policies", "nope"], "capacity cluster: error: unknown router"),
    (["capacity", "decode", "--slo", "ttft_p90_s<=1", "--policies", "nope"], "capacity decode: error: unknown policy"),
    (["capacity", "dispatch", "--slo", "mean_response<=3", "--policies", "nope"], "capacity dispatch: error: unknown"),
    (["tune", "cluster", "--router", "nope"], "tune cluster: error: unknown tunable router 'nope'"),
    (["tune", "control", "--autoscaler", "nope"], "tune control: error: unknown autoscaler 'nope'"),
    (["cost", "--model", "nope"], "cost: error: unknown model 'nope'"),
    (["cost", "--latency-params", "NOPE"], "latency params file not found"),
    (["compare", "NOPE"], "measured file or run folder not found"),
    (["compare", "FILE"], "unknown measured-results format"),
    (["compare", "EMPTY"], "measured file is empty"),
    (["cluster", "--inference-perf", "DIR"], "is a folder; name the file"),
    (["cluster", "--autoscaler", "hpa", "--min-replicas", "5", "--replicas", "3"],
     "--min-replicas 5 is more than --replicas 3"),
    (["fit-latency", "NOPE"], "data folder not found"),
    (["fit-latency", "DIR"], "no run folders"),
    (["select", "--system", "bogus"], "select: error: unknown system 'bogus'"),
    (["run", "NOPE"], "spec file not found"),
    (["run", "FILE"], "expected a mapping with a `command`"),
    (["train-predictor", "--workload", "azure-conv", "--trace", "NOPE", "--save", "DIR"], "trace file not found"),
    (["train-predictor", "--workload", "synthetic-prod", "--trace", "FILE", "--save", "DIR"], "--trace is for"),
    (["eval-predictor", "--workload", "synthetic-prod", "--load", "NOPE"], "predictor checkpoint folder not found"),
    (["eval-predictor", "--workload", "synthetic-prod", "--predictors", "bogus"], "unknown predictor 'bogus'"),
    (["reproduce", "bogus"], "reproduce: error: argument source: invalid choice"),
    (["bench", "--only", "bogus"], "bench: error: unknown bench part 'bogus'"),
    (["bins", "--n", "0"], "bins: error: argument --n: expected a positive integer"),
    (["--coordinator", "localhost:abc", "--num-processes", "2", "--process-id", "0", "cluster"], "a port in 1 .. 65535"),
]
BAD_FLAGS_RUN = """
import contextlib, io, json, sys
from jaxroute.cli import main

out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    out.append([rc, err.getvalue(), [m for m in {heavy!r} if m in sys.modules]])
    if out[-1][2]:
        break  # the first case that imported JAX is named below; the others would be blamed for it
print(json.dumps(out))
"""


def test_every_command_refuses_bad_flags_and_files_in_one_line_without_jax(tmp_path):
    import json

    (tmp_path / "file.txt").write_text("just a line\n")
    (tmp_path / "dir").mkdir()
    (tmp_path / "empty.json").write_text("")
    subst = {"FILE": str(tmp_path / "file.txt"), "DIR": str(tmp_path / "dir"), "NOPE": str(tmp_path / "nope.csv"),
             "EMPTY": str(tmp_path / "empty.json")}
    argvs = [[subst.get(a, a) for a in argv] for argv, _ in BAD_FLAGS]
    env = {k: v for k, v in os.environ.items() if k != "JAXROUTE_COMPILE_LOG"}  # the suite's log watches JAX
    done = subprocess.run([sys.executable, "-c", BAD_FLAGS_RUN.format(heavy=HEAVY[:2]), json.dumps(argvs)],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1], env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    for (argv, needle), (rc, err, heavy) in zip(BAD_FLAGS, results, strict=False):
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and needle in lines[0], (argv, rc, lines)
        assert lines[0].startswith("jaxroute ") and ": error: " in lines[0], (argv, lines)
        assert not heavy, f"{' '.join(argv)} imported {heavy} before refusing"
    assert len(results) == len(BAD_FLAGS)


def _default(command: str, dest: str):
    _, subs = _subparsers()
    sub = subs[command]
    if command in ("capacity", "tune"):  # their models are subcommands of their own: the cluster one
        sub = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction)).choices["cluster"]
    return next(a.default for a in sub._actions if a.dest == dest)


def test_each_default_is_defined_once_and_every_layer_reads_it():
    """theta, Preble's window and threshold, the replicas' GPU and model: the CLI, the experiment API and the
    params all take their default from one definition (routers/names.py, clusters/names.py)."""
    import dataclasses
    import inspect

    from jaxroute.clusters import names as cluster_names
    from jaxroute.clusters.replicas import model as replica_model
    from jaxroute.experiments import capacity, cluster, tune
    from jaxroute.routers import names as router_names
    from jaxroute.routers import preble, prefix

    arg = lambda f, name: inspect.signature(f).parameters[name].default
    field = {f.name: f.default for f in dataclasses.fields(tune.Setup)}
    facts = {
        router_names.DEFAULT_THETA: [_default("cluster", "theta"), arg(cluster.policy_rows, "theta"),
                                     arg(prefix.router_params, "theta")],
        router_names.DEFAULT_E2_WINDOW_S: [_default("cluster", "e2_window"), arg(cluster.policy_rows, "e2_window_s"),
                                           arg(preble.make_params, "e2_window_s")],
        router_names.DEFAULT_E2_TH_BAL: [_default("cluster", "e2_th_bal"), arg(cluster.policy_rows, "e2_th_bal"),
                                         arg(preble.make_params, "e2_th_bal")],
        cluster_names.REPLICA_GPU: [_default(c, "gpu") for c in ("cluster", "capacity", "tune", "cost")]
        + [arg(cluster.policy_rows, "gpu"), arg(replica_model.make_params, "gpu"),
           arg(capacity.ClusterEvaluator.__init__, "gpu"), field["gpu"]],
        cluster_names.REPLICA_MODEL: [_default("cluster", "model"), _default("capacity", "model_name"),
                                      _default("tune", "model"), _default("cost", "model")]
        + [arg(cluster.policy_rows, "model_name"), arg(replica_model.make_params, "model"),
           arg(capacity.ClusterEvaluator.__init__, "model_name"), field["model_name"]],
    }
    for value, layers in facts.items():
        assert all(v == value for v in layers), (value, layers)
