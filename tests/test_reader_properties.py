"""Property-based tests of the readers a user feeds files to (hypothesis generates malformed and extreme inputs):
the trace readers (Azure, Mooncake, BurstGPT), experiment specs, inference-perf configs, `vllm bench serve`
results and jaxroute's per-request records. Each input is either read correctly (the result's invariants hold) or
refused with one `JaxrouteError` line; never a traceback from inside numpy, YAML or pydantic. Examples are bounded
so the whole file runs in seconds; no JAX program is compiled."""

import datetime as dt
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxroute import measured, spec
from jaxroute.cli import build_parser
from jaxroute.errors import JaxrouteError
from jaxroute.measured import JAXROUTE_COLUMNS
from jaxroute.workloads import inference_perf as ip
from jaxroute.workloads import traces

BOUNDED = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                   derandomize=True)  # the same examples on every run: a failure reproduces

# numbers as a user's file may hold them: ordinary, zero, negative, huge, tiny, not finite
NUMBERS = st.one_of(st.integers(-5, 10**6), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0, 1, -1, 0.5, 1e308, 1e-300]))
CELLS = st.one_of(NUMBERS.map(str), st.text(max_size=8), st.just(""))
JSON_VALUES = st.recursive(st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=6)),
                           lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                   st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                           max_leaves=12)


def _refused_in_one_line(read, *args):
    """Call a reader: its result, or None when it refused in one line (anything else fails the test)."""
    try:
        return read(*args)
    except JaxrouteError as e:
        assert str(e) and "\n" not in str(e).strip(), repr(str(e))
        return None


def _file(text: str | bytes, suffix: str) -> Path:
    d = Path(tempfile.mkdtemp(prefix="jaxroute-prop-"))
    p = d / f"f{suffix}"
    (p.write_bytes if isinstance(text, bytes) else p.write_text)(text)
    return p


def _check_trace(t) -> None:
    if t is None:
        return
    n = len(t.arrival_s)
    assert n >= 1 and len(t.prompt_tokens) == len(t.output_tokens) == n
    assert np.all(np.isfinite(t.arrival_s)) and np.all(np.diff(t.arrival_s) >= 0) and t.arrival_s[0] >= 0
    assert np.all(t.prompt_tokens >= 1) and np.all(t.output_tokens >= 1)


def _or_junk(good):
    """A well-formed value, or (one time in four) anything a file may hold instead."""
    return st.one_of(good, good, good, CELLS)


def _corrupt_one(cells: list, data) -> list:
    """The cells of a well-formed file, half the time with one of them replaced by anything a file may hold."""
    if cells and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(cells) - 1))
        cells = [*cells[:i], data.draw(CELLS), *cells[i + 1:]]
    return cells


COUNTS = st.integers(1, 10**7)
GAPS = st.floats(0, 1e4, allow_nan=False)


@BOUNDED
@given(st.lists(st.tuples(GAPS, COUNTS, COUNTS), min_size=1, max_size=8), st.data())
def test_azure_csv(rows, data):
    t, cells = 1.7e9, []
    for gap, prompt, out in rows:
        t += gap
        cells += [dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f"), str(prompt), str(out)]
    cells = _corrupt_one(cells, data)
    lines = [",".join(traces.AZURE_COLUMNS)] + [",".join(cells[i:i + 3]) for i in range(0, len(cells), 3)]
    _check_trace(_refused_in_one_line(traces.load_azure_csv, _file("\n".join(lines) + "\n", ".csv")))


@BOUNDED
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 2000), COUNTS), min_size=1, max_size=6), st.data(),
       st.one_of(st.just(b""), st.binary(max_size=12)))
def test_mooncake_jsonl(rows, data, junk):
    t, cells = 0, []
    for gap, prompt, out in rows:
        t += gap
        cells += [t, prompt, out, list(range(-(-prompt // traces.MOONCAKE_BLOCK_TOKENS)))]
    cells = _corrupt_one(cells, data)
    keys = ("timestamp", "input_length", "output_length", "hash_ids")
    records = [dict(zip(keys, cells[i:i + 4], strict=True)) for i in range(0, len(cells), 4)]
    text = "\n".join(json.dumps(r) for r in records).encode() + (b"\n" + junk if junk else b"")
    _check_trace(_refused_in_one_line(traces.load_mooncake_jsonl, _file(text, ".jsonl")))


@BOUNDED
@given(st.lists(st.tuples(GAPS, COUNTS, COUNTS, st.sampled_from(["ChatGPT", "GPT-4"]),
                          st.sampled_from(["Conversation log", "API log"])), min_size=1, max_size=6), st.data())
def test_burstgpt_csv(rows, data):
    t, cells = 0.0, []
    for gap, prompt, out, model, kind in rows:
        t += gap
        cells += [repr(t), model, str(prompt), str(out), str(prompt + out), kind]
    cells = _corrupt_one(cells, data)
    lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    lines += [",".join(cells[i:i + 6]) for i in range(0, len(cells), 6)]
    _check_trace(_refused_in_one_line(traces.load_burstgpt_csv, _file("\n".join(lines) + "\n", ".csv")))


SHARED_PREFIX = st.fixed_dictionaries({}, optional={
    "num_groups": st.integers(1, 20), "num_prompts_per_group": st.integers(1, 20),
    "system_prompt_len": st.integers(1, 4000), "question_len": st.integers(1, 4000), "output_len": st.integers(1, 4000)})


@BOUNDED
@given(st.sampled_from(["shared_prefix", "shared_prefix", "shared_prefix", "mock", "shareGPT"]), SHARED_PREFIX,
       st.lists(st.tuples(st.floats(0.5, 500), st.integers(1, 120)), min_size=1, max_size=3),
       st.data())
def test_inference_perf_config(kind, shared, stages, data):
    values = _corrupt_one([x for stage in stages for x in stage] + list(shared.values()), data)
    rates = [{"rate": values[i], "duration": values[i + 1]} for i in range(0, 2 * len(stages), 2)]
    shared = dict(zip(shared, values[2 * len(stages):], strict=True))
    config = {"data": {"type": kind, **({"shared_prefix": shared} if shared else {})}, "load": {"stages": rates}}
    load = _refused_in_one_line(ip.load, config)
    if load is not None:
        assert load.requests >= 1 and all(r > 0 and d > 0 for r, d in load.stages)


@BOUNDED
@given(st.sampled_from(["cluster", "dispatch", "decode", "pd", "bogus"]),
       st.fixed_dictionaries({}, optional={
           "deployment": st.dictionaries(st.sampled_from(["replicas", "gpu", "model", "tp", "x"]),
                                         _or_junk(st.sampled_from([1, 2, 4, "h100", "qwen3-32b"])), max_size=3),
           "workload": st.dictionaries(st.sampled_from(["workload", "requests", "rate", "x"]),
                                       _or_junk(st.sampled_from(["toolbench", 100, 2.5, -1])), max_size=3),
           "run": st.dictionaries(st.sampled_from(["seeds", "seed", "x"]), _or_junk(st.integers(-1, 8)), max_size=2),
           "outputs": st.dictionaries(st.sampled_from(["out", "plot", "x"]), JSON_VALUES, max_size=2)}))
def test_spec_file(command, sections):
    path = _file(json.dumps({"command": command, **sections}), ".yaml")
    got = _refused_in_one_line(spec.read, path, build_parser())
    if got is not None:
        cmd, argv = got
        assert cmd == command and all(isinstance(a, str) for a in argv)


@BOUNDED
@given(st.lists(st.tuples(st.integers(1, 50), st.integers(0, 50), st.floats(0, 5), st.floats(0, 2), st.floats(0, 3),
                          st.sampled_from(["", "", "", "Traceback: boom"])), min_size=1, max_size=6),
       st.one_of(st.floats(0.1, 100), st.just("inf")), st.lists(st.sampled_from(
           ["input_lens", "output_lens", "ttfts", "itls", "start_times", "latencies", "errors"]), max_size=2),
       st.data())
def test_vllm_bench_serve_json(reqs, rate, dropped, data):
    d = {"input_lens": [r[0] for r in reqs], "output_lens": [r[1] for r in reqs], "ttfts": [r[2] for r in reqs],
         "itls": [[r[3] / max(r[1], 1)] * max(r[1] - 1, 0) for r in reqs], "start_times": [r[4] for r in reqs],
         "latencies": [r[2] + r[3] for r in reqs], "errors": [r[5] for r in reqs]}
    d = {k: v for k, v in d.items() if k not in dropped}
    if d and data.draw(st.booleans()):  # one list, or one entry of one, replaced by anything
        k = data.draw(st.sampled_from(sorted(d)))
        d[k] = _corrupt_one(d[k], data) if data.draw(st.booleans()) else data.draw(JSON_VALUES)
    d.update(request_rate=rate, duration=5.0, num_prompts=len(reqs), date="20260101-000000")
    run = _refused_in_one_line(measured.read_vllm_bench_serve, _file(json.dumps(d), ".json"))
    if run is not None:
        _check_run(run)


def _check_run(run) -> None:
    n = len(run)
    assert n >= 1 and run.ok.any()
    assert np.all(np.isfinite(run.arrival_s)) and np.all(np.diff(run.arrival_s) >= 0)
    ok = run.ok
    assert np.all(np.isfinite(run.e2e_s[ok])) and np.all(run.e2e_s[ok] >= 0)
    known = ok & np.isfinite(run.ttft_s)
    assert np.all(run.ttft_s[known] <= run.e2e_s[known])  # a request ends after its first token
    assert np.all(run.tpot_s[np.isfinite(run.tpot_s)] >= 0)


@BOUNDED
@given(st.lists(st.tuples(GAPS, st.integers(1, 100), st.integers(1, 20), st.floats(0, 3), st.floats(0, 9),
                          st.booleans()), min_size=1, max_size=6), st.data())
def test_jaxroute_records(rows, data):
    t, lines = 0.0, [",".join(JAXROUTE_COLUMNS)]
    for i, (gap, prompt, out, ttft, rest, finished) in enumerate(rows):
        t += gap
        rec = {"router": "rr", "seed": 0, "request": i, "arrival_s": t, "replica": 0, "admit_s": t,
               "first_token_s": t + ttft, "finish_s": t + ttft + rest if finished else "", "prompt_tokens": prompt,
               "cached_tokens": 0, "output_tokens": out, "preemptions": 0, "ttft_s": ttft,
               "e2e_s": ttft + rest if finished else "", "tpot_s": "", "stage": 0}
        lines.append([str(rec[c]) for c in JAXROUTE_COLUMNS])
    cells = _corrupt_one([c for line in lines[1:] for c in line], data)
    k = len(JAXROUTE_COLUMNS)
    lines = lines[:1] + [",".join(cells[i:i + k]) for i in range(0, len(cells), k)]
    run = _refused_in_one_line(measured.read_jaxroute_requests, _file("\n".join(lines) + "\n", ".csv"))
    if run is not None:
        _check_run(run)


@pytest.mark.parametrize("name", ["a.csv", "b.json", "c.jsonl"])
def test_any_bytes_are_read_or_refused_in_one_line(name):
    """A binary or truncated file in any format the detector accepts."""
    for blob in (b"\x00\xff" * 20, b"\x1f\x8b\x08\x00garbage", "é,ü\n".encode("latin-1"), b"{" * 50):
        run = _refused_in_one_line(measured.read_measured, _file(blob, Path(name).suffix))
        if run is not None:
            _check_run(run)
    assert math.isfinite(1.0)
