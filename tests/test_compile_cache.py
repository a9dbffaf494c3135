"""The persistent compile cache across processes, and the compile log it is measured with."""

import json

from tests.cli_helpers import load_script


def test_a_second_run_loads_every_program_from_the_cache(tmp_path, capsys):
    """scripts/time_to_first_step.py: the cold run compiles, the warm run (same command, same cache, new process)
    compiles nothing and loads every program; both mark their first simulated step."""
    out = tmp_path / "first_step.json"
    assert load_script("time_to_first_step").main(["--json", str(out), "dispatch", "--seeds", "2",
                                                     "--requests", "300", "--servers", "4"]) == 0
    res = json.loads(out.read_text())
    cold, warm = res["cold"], res["warm"]
    assert cold["compiled"] > 0 and cold["loaded"] == 0 and cold["compile_s"] > 0
    assert warm["compiled"] == 0 and warm["loaded"] == cold["compiled"]
    for run in (cold, warm):
        assert 0 < run["first_step_s"] < run["wall_s"]
    assert "cold: first step after" in capsys.readouterr().out


def test_the_session_guard_names_a_program_compiled_twice(tmp_path):
    """compile_profile fails the session for a program compiled again after its first compilation finished
    (a process that ignored the cache), not for two processes racing on it, nor for tiny programs."""
    from tests.compile_profile import GUARD_MIN_S, CompileProfile

    prof = CompileProfile(tmp_path / "session.jsonl")

    def rec(key, start, seconds, test, hit=False):
        return {"key": key, "t": start + seconds, "s": seconds, "hit": hit, "label": f"prog-{key}", "test": test}

    prof.records = [rec("a", 0, 5.0, "t1"), rec("a", 10, 5.0, "t2"),  # compiled again later: flagged
                    rec("b", 0, 5.0, "t1"), rec("b", 1, 5.0, "t2"),  # a race: both started before either finished
                    rec("c", 0, GUARD_MIN_S / 2, "t1"), rec("c", 10, GUARD_MIN_S / 2, "t2"),  # too small to matter
                    rec("d", 0, 5.0, "t1"), rec("d", 10, 0.1, "t2", hit=True)]  # loaded from the cache: fine
    (tmp_path / "session.jsonl").write_text(json.dumps({"program": "x", "key": "a", "t": 30.0, "s": 5.0, "hit": False,
                                                        "pid": -1, "tag": "t3", "argv": ["cluster"]}) + "\n")
    twice = prof.compiled_twice()
    assert len(twice) == 1 and twice[0].startswith("prog-a (5.0 s, first in t1) compiled 2 more time(s)")


def test_suite_profile_sums_the_workers_files_side_by_side(tmp_path, capsys):
    """scripts/suite_profile.py reads FILE.gw0, FILE.gw1 (one per xdist worker) and sets two runs side by side."""

    def worker(compile_s, wall_s, label):
        return {"tests": {"tests/test_a.py::t": {"compile_s": compile_s, "compiles": 2.0, "wall_s": wall_s}},
                "programs": {label: {"compile_s": compile_s, "compiles": 2.0}, "jit(run)": {"compile_s": 1.0}},
                "subprocesses": {"x (subprocess reproduce all)": {"compile_s": 5.0, "compiles": 3.0}},
                "guard_fired": 0, "module_releases": 1, "compiled_twice": []}

    for run, scale in (("before", 2.0), ("after", 1.0)):
        for w in ("gw0", "gw1"):
            (tmp_path / f"{run}.json.{w}").write_text(json.dumps(worker(10.0 * scale, 30.0, "ReplicaModel#1a2b.run x4 fast")))
    assert load_script("suite_profile").main([str(tmp_path / "before.json"), str(tmp_path / "after.json")]) == 0
    out = capsys.readouterr().out
    assert "| seconds compiling in the test processes | 40 | 20 |" in out  # both workers' files summed
    assert "| programs compiled in subprocesses (quick report included) | 6 | 6 |" in out
    assert "| tests' wall - compile - load (mostly running, and waiting for the quick report) | 20 | 40 |" in out
    assert "| ReplicaModel.run | 4, 40.0 | 4, 20.0 |" in out and "| jit(run) (run_single) |" in out
    assert "| tests/test_a.py | 4, 40.0, 60.0 | 4, 20.0, 60.0 |" in out
