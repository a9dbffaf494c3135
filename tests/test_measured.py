"""Readers of measured per-request results (jaxroute/measured.py): fixtures in each tool's own layout, failed
requests, the arrival rebuild rule, format detection, stage summaries and every bad case's one-line message."""

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from jaxroute.errors import JaxrouteError
from jaxroute.measured import (
    JAXROUTE_COLUMNS,
    mape,
    read_inference_perf_requests,
    read_inference_perf_stage_summaries,
    read_jaxroute_requests,
    read_measured,
    read_vllm_bench_serve,
    summary,
)

KUBECON = Path(__file__).resolve().parent / "fixtures" / "inference_perf_kubecon_na_2025_vllm"
TRACEBACK = "Traceback (most recent call last):\n  File \"x.py\", line 1\naiohttp.ClientConnectorError: boom\n"

# ----------------------------------------------------------------------------- vLLM

# One RequestFuncOutput per request as vLLM v0.34.0 fills it (vllm/benchmarks/lib/endpoint_request_func.py:89-107,
# 244-316): start_time = perf_counter at send, ttft, itl (gaps), latency = last chunk - start; a failed request keeps
# ttft 0, itl [], latency 0 and an error string. r2 is sent before r1 (a --max-concurrency wait can reorder sends).
REQS = [
    dict(prompt_len=10, out=4, ttft=0.05, itl=[0.01, 0.01, 0.02], start=1000.0, error=""),
    dict(prompt_len=12, out=0, ttft=0.0, itl=[], start=1000.5, error=TRACEBACK),
    dict(prompt_len=7, out=1, ttft=0.1, itl=[], start=1000.4, error=""),
    dict(prompt_len=20, out=2, ttft=0.2, itl=[0.05], start=1001.0, error=""),
]


def _vllm_result(version="0.34.0", reqs=REQS, **run):
    """The dict `vllm bench serve --save-result --save-detailed` dumps: run fields (v0.34.0 serve.py:2306-2330),
    then the benchmark result (serve.py:1319-1341; output_lens 0 for a failure, serve.py:666-667). v0.16.0 adds
    start_times (serve.py:961 there), v0.30.0 latencies and queue_times (serve.py:1300-1302 there); v0.8.5
    benchmarks/benchmark_serving.py:430-435 has neither."""
    lat = [r["ttft"] + sum(r["itl"]) if not r["error"] else 0.0 for r in reqs]
    d = {"date": "20260101-120000", "endpoint_type": "openai", "backend": "openai", "label": None,
         "model_id": "meta-llama/Llama-3.1-8B-Instruct", "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct",
         "num_prompts": len(reqs), "request_rate": "inf", "burstiness": 1.0, "max_concurrency": None}
    d.update(run)
    d.update({"duration": 1.5, "completed": 3, "failed": 1, "total_input_tokens": 37, "total_output_tokens": 7,
              "request_throughput": 2.0, "request_goodput": None, "output_throughput": 4.6,
              "total_token_throughput": 29.3,
              "input_lens": [r["prompt_len"] for r in reqs], "output_lens": [r["out"] for r in reqs],
              "ttfts": [r["ttft"] for r in reqs], "itls": [r["itl"] for r in reqs]})
    major, minor = (int(x) for x in version.split(".")[:2])
    if (major, minor) >= (0, 30):
        d["latencies"] = lat
    if (major, minor) >= (0, 16):
        d["start_times"] = [r["start"] for r in reqs]
    if (major, minor) >= (0, 30):
        d["queue_times"] = [0.0] * len(reqs)
    d["generated_texts"] = ["x" * r["out"] for r in reqs]
    d["errors"] = [r["error"] for r in reqs]
    d.update({"max_output_tokens_per_s": 7.0, "max_concurrent_requests": 3, "rtfx": 0.0,
              "mean_ttft_ms": 116.7, "median_ttft_ms": 100.0, "std_ttft_ms": 62.4, "p99_ttft_ms": 198.0})
    return d


def _dump(tmp_path, name, obj):
    p = tmp_path / name
    with p.open("w", encoding="utf-8") as f:
        json.dump(obj, f)  # vLLM v0.34.0 serve.py:2457
    return p


def test_vllm_with_start_times_and_latencies(tmp_path):
    run = read_vllm_bench_serve(_dump(tmp_path, "vllm-infqps.json", _vllm_result()))
    assert run.source == "vllm-bench-serve" and run.name == "vllm-infqps" and len(run) == 4
    assert run.arrivals_recorded
    np.testing.assert_allclose(run.arrival_s, [0.0, 0.4, 0.5, 1.0])  # sorted: r0, r2, r1, r3
    assert run.prompt_tokens.tolist() == [10, 7, 12, 20] and run.output_tokens.tolist() == [4, 1, 0, 2]
    assert run.ok.tolist() == [True, True, False, True]
    np.testing.assert_allclose(run.ttft_s, [0.05, 0.1, np.nan, 0.2])
    np.testing.assert_allclose(run.e2e_s, [0.09, 0.1, np.nan, 0.25])
    np.testing.assert_allclose(run.tpot_s, [0.04 / 3, np.nan, np.nan, 0.05])  # vLLM: (latency - ttft) / (out - 1)
    assert run.stage.tolist() == [0, 0, 0, 0] and run.arrival_s.dtype == np.float64
    assert run.prompt_tokens.dtype == np.int64 and run.ok.dtype == bool


def test_vllm_without_latencies_sums_itls(tmp_path):
    run = read_vllm_bench_serve(_dump(tmp_path, "v016.json", _vllm_result("0.16.0")))
    assert run.arrivals_recorded
    np.testing.assert_allclose(run.e2e_s, [0.09, 0.1, np.nan, 0.25])


@pytest.mark.parametrize("run_fields, expected", [
    ({"request_rate": 2.0}, [0.0, 0.5, 1.0, 1.5]),  # evenly spaced at 1 / rate
    ({"request_rate": "inf"}, [0.0, 0.0, 0.0, 0.0]),  # all at once
    ({"request_rate": "inf", "ramp_up_strategy": "linear", "ramp_up_start_rps": 1, "ramp_up_end_rps": 4},
     [0.0, 1 / 2, 1 / 2 + 1 / 3, 1 / 2 + 1 / 3 + 1 / 4]),  # rate_i = 1 + 3 i / 3; gaps 1 / rate_i from the second
    ({"request_rate": "inf", "ramp_up_strategy": "exponential", "ramp_up_start_rps": 1, "ramp_up_end_rps": 8},
     np.cumsum([0.0, 1 / 2, 1 / 4, 1 / 8])),
])
def test_vllm_old_layout_rebuilds_arrivals(tmp_path, run_fields, expected):
    run = read_vllm_bench_serve(_dump(tmp_path, "old.json", _vllm_result("0.8.5", **run_fields)))
    assert not run.arrivals_recorded
    np.testing.assert_allclose(run.arrival_s, expected)
    assert run.ok.tolist() == [True, False, True, True]  # file order kept (no send times to sort by)
    np.testing.assert_allclose(run.e2e_s, [0.09, np.nan, 0.1, 0.25])


def _vllm_case(mutate):
    d = _vllm_result()
    mutate(d)
    return d


VLLM_BAD = [
    (lambda d: d.pop("ttfts"), "missing field(s) ttfts; save the run with `vllm bench serve --save-result --save-detailed`"),
    (lambda d: d["ttfts"].pop(), "per-request lists of different lengths: input_lens has 4 entries, ttfts has 3"),
    (lambda d: d.__setitem__("itls", {"a": 1}), "field 'itls' is a dict; expected a list"),
    (lambda d: d["ttfts"].__setitem__(2, -0.1), "'ttfts'[2] is -0.1; times must be finite and >= 0"),
    (lambda d: d["ttfts"].__setitem__(2, float("nan")), "'ttfts'[2] is nan; times must be finite and >= 0"),
    (lambda d: d["latencies"].__setitem__(0, "fast"), "'latencies'[0] is 'fast', not a number"),
    (lambda d: d["input_lens"].__setitem__(1, -3), "'input_lens'[1] is -3; token counts must be whole numbers >= 1"),
    (lambda d: d["output_lens"].__setitem__(0, 2.5), "'output_lens'[0] is 2.5; token counts must be whole numbers >= 0"),
    (lambda d: d["itls"].__setitem__(0, [0.1, None]), "'itls'[0][1] is None, not a number"),
    (lambda d: d["itls"].__setitem__(0, 0.1), "'itls'[0] is 0.1; expected a list of inter-token latencies"),
    (lambda d: d["errors"].__setitem__(0, 5), "'errors'[0] is 5; expected a string"),
    (lambda d: d["start_times"].__setitem__(3, float("inf")), "'start_times'[3] is inf; times must be finite"),
    (lambda d: d.update({k: [] for k in ("input_lens", "output_lens", "ttfts", "itls", "errors", "latencies",
                                         "start_times", "queue_times", "generated_texts")}),
     "contains no requests"),
    (lambda d: d.update(errors=[TRACEBACK] * 4),
     "no successful request (all 4 failed); first error: aiohttp.ClientConnectorError: boom"),
]


@pytest.mark.parametrize("mutate, needle", VLLM_BAD)
def test_vllm_bad_cases(tmp_path, mutate, needle):
    p = _dump(tmp_path, "bad.json", _vllm_case(mutate))
    with pytest.raises(JaxrouteError) as e:
        read_vllm_bench_serve(p)
    assert needle in str(e.value) and str(e.value).startswith("bad.json") and "\n" not in str(e.value)


def test_a_request_that_ends_before_its_first_token_is_refused(tmp_path):
    """E2E < TTFT would give a negative TPOT that pulls the mean down (issue: compare printed MAPE -50.97 %)."""
    d = _vllm_result()
    d["latencies"][0] = d["ttfts"][0] / 2
    with pytest.raises(JaxrouteError, match=r"^early: request 0: end-to-end latency .* is shorter than its TTFT") as e:
        read_vllm_bench_serve(_dump(tmp_path, "early.json", d))
    assert "\n" not in str(e.value)


def test_pearson_r_of_constant_values_is_undefined_not_nan():
    from jaxroute.experiments import replay

    assert math.isnan(replay._pearson(np.ones(5), np.arange(5.0))) and replay.quality(0.01, math.nan) == "n/a"
    table = replay.format_comparison({"ttft": {"pairs": 5, "measured": dict.fromkeys(replay.STATS, 0.1),
                                               "simulated": dict.fromkeys(replay.STATS, 0.1), "mape_pct": 0.0,
                                               "pearson_r": math.nan, "bias": "neutral", "quality": "n/a"}})
    assert "undefined" in table and "nan" not in table


@pytest.mark.parametrize("run_fields, needle", [
    ({"request_rate": 0}, "field 'request_rate' is 0; expected a positive number or \"inf\""),
    ({"request_rate": "fast"}, "field 'request_rate' is 'fast'"),
    ({"ramp_up_strategy": "step", "ramp_up_start_rps": 1, "ramp_up_end_rps": 2}, "unknown ramp_up_strategy 'step'"),
    ({"ramp_up_strategy": "linear", "ramp_up_start_rps": None, "ramp_up_end_rps": 2},
     "needs positive ramp_up_start_rps and ramp_up_end_rps"),
])
def test_vllm_bad_rebuild_fields(tmp_path, run_fields, needle):
    with pytest.raises(JaxrouteError, match="old.json") as e:
        read_vllm_bench_serve(_dump(tmp_path, "old.json", _vllm_result("0.8.5", **run_fields)))
    assert needle in str(e.value)


def test_vllm_missing_rate(tmp_path):
    d = _vllm_result("0.8.5")
    del d["request_rate"]
    with pytest.raises(JaxrouteError, match="no start_times and no request_rate field"):
        read_vllm_bench_serve(_dump(tmp_path, "old.json", d))


def test_vllm_file_level_errors(tmp_path):
    with pytest.raises(JaxrouteError, match="not found"):
        read_vllm_bench_serve(tmp_path / "nope.json")
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(JaxrouteError, match="empty"):
        read_vllm_bench_serve(tmp_path / "empty.json")
    (tmp_path / "bad.json").write_text('{"ttfts": [0.1,')
    with pytest.raises(JaxrouteError, match=r"bad.json: not valid JSON \(Expecting value at line 1\)"):
        read_vllm_bench_serve(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(JaxrouteError, match="expected a JSON object .* got a list"):
        read_vllm_bench_serve(tmp_path / "list.json")
    # --append-result writes "\n" and another json.dump per run (serve.py:2451-2457)
    text = json.dumps(_vllm_result()) + "\n" + json.dumps(_vllm_result())
    (tmp_path / "appended.json").write_text(text)
    with pytest.raises(JaxrouteError, match="several JSON documents .*--append-result"):
        read_vllm_bench_serve(tmp_path / "appended.json")
    # Without --save-detailed vLLM deletes the per-request lists (serve.py:2428-2444)
    d = {k: v for k, v in _vllm_result().items() if k in ("duration", "latencies", "queue_times", "request_rate")}
    with pytest.raises(JaxrouteError, match="missing field.*--save-detailed"):
        read_vllm_bench_serve(_dump(tmp_path, "summary_only.json", d))


# ----------------------------------------------------------------------------- inference-perf


def _iperf_head(start, end, prompt, out, chunk_times, error=None, streamed=True):
    """One record of per_request_lifecycle_metrics.json at HEAD 7de5ef2: reportgen/base.py:829-836 with
    info = InferenceInfo.model_dump() (apis/base.py:24-56, payloads/__init__.py:90-96; `input_tokens` is the
    deprecated computed mirror) filled as apis/completion.py:88-99 (streamed) / 113-117 (unary)."""
    if error is not None:
        info = {"request_metrics": {"text": {"input_tokens": 0}, "image": None, "video": None, "audio": None},
                "response_metrics": None, "extra_info": {}, "lora_adapter": None, "labels": {}, "input_tokens": 0}
        return {"start_time": start, "end_time": end, "request": '{"prompt": "hi"}', "response": "", "info": info,
                "error": {"error_type": error[0], "error_msg": error[1]}}
    usage = {"prompt_tokens": prompt, "total_tokens": prompt + out, "completion_tokens": out}
    if streamed:
        resp = {"output_tokens": out + 1, "server_usage": usage, "response_chunks": ['{"choices": []}'] * len(chunk_times),
                "chunk_times": chunk_times, "output_token_times": chunk_times}
    else:
        resp = {"output_tokens": out, "server_usage": usage}
    info = {"request_metrics": {"text": {"input_tokens": prompt}, "image": None, "video": None, "audio": None},
            "response_metrics": resp, "extra_info": {"raw_response": "data: ..."}, "lora_adapter": None, "labels": {},
            "input_tokens": prompt}
    return {"start_time": start, "end_time": end, "request": '{"prompt": "hi"}', "response": "data: ...",
            "info": info, "error": None}


def _write_iperf(folder, records, name="per_request_lifecycle_metrics.json"):
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_text(json.dumps(records, indent=2))  # client/filestorage/local.py:41
    return p


# Completion order, not send order (metrics are recorded when a request finishes, request_collector/local.py:27-28).
IPERF_RECORDS = [
    _iperf_head(500.2, 500.9, 200, 64, [500.25, 500.3, 500.9]),
    _iperf_head(500.0, 501.0, 100, 5, [500.5, 501.0]),
    _iperf_head(500.6, 501.2, 0, 0, [], error=("ClientConnectorError", "Cannot connect\nto host")),
    _iperf_head(500.4, 501.4, 50, 1, [], streamed=False),
]


def test_inference_perf_head_layout(tmp_path):
    run = read_inference_perf_requests(_write_iperf(tmp_path / "r", IPERF_RECORDS))
    assert run.source == "inference-perf" and run.arrivals_recorded and len(run) == 4
    np.testing.assert_allclose(run.arrival_s, [0.0, 0.2, 0.4, 0.6])
    assert run.prompt_tokens.tolist() == [100, 200, 50, 0]  # failed: the tool recorded input_tokens 0
    assert run.output_tokens.tolist() == [5, 64, 1, 0]  # server usage.completion_tokens, not the client count
    assert run.ok.tolist() == [True, True, True, False]
    np.testing.assert_allclose(run.ttft_s, [0.5, 0.05, np.nan, np.nan])  # unary request: no first token time
    np.testing.assert_allclose(run.e2e_s, [1.0, 0.7, 1.0, np.nan])
    np.testing.assert_allclose(run.tpot_s, [0.5 / 4, 0.65 / 63, np.nan, np.nan])
    assert run.stage.tolist() == [0, 0, 0, 0]


def test_inference_perf_older_layouts(tmp_path):
    # v0.2.0-v0.4.0 (apis/base.py:23-26 at 7ff8150): flat info; v0.5.0 (apis/base.py:23-39): response_info
    old = {"start_time": 10.0, "end_time": 10.5, "request": "{}", "response": "",
           "info": {"input_tokens": 30, "output_tokens": 9, "output_token_times": [10.1, 10.1001, 10.2]},
           "error": None}
    v05 = {"start_time": 11.0, "end_time": 11.4, "request": "{}", "response": "",
           "info": {"input_tokens": 40, "extra_info": {}, "lora_adapter": None,
                    "response_info": {"response_chunks": [], "chunk_times": [11.2, 11.4], "output_tokens": 3,
                                      "output_token_times": [11.2, 11.4], "server_usage": None}},
           "error": None}
    run = read_inference_perf_requests(_write_iperf(tmp_path, [v05, old]))
    assert run.prompt_tokens.tolist() == [30, 40] and run.output_tokens.tolist() == [9, 3]
    np.testing.assert_allclose(run.ttft_s, [0.1, 0.2])
    np.testing.assert_allclose(run.e2e_s, [0.5, 0.4])
    np.testing.assert_allclose(run.arrival_s, [0.0, 1.0])


def _stage_file(rate, count, successes=None, ttft_mean=0.03, streamed=True, prompt_key="prompt_len"):
    """A stage_N_lifecycle_metrics.json in the layout of 7ff8150 reportgen/base.py:38-55 (summarize) and 122-189
    (summarize_requests), the layout of the published kubecon demo."""
    successes = count if successes is None else successes

    def s(mean, scale=1.0):
        return {"mean": mean, "min": mean * 0.5, "p0.1": mean * 0.5, "p1": mean * 0.6, "p5": mean * 0.7,
                "p10": mean * 0.8, "p25": mean * 0.9, "median": mean * scale, "p75": mean * 1.1, "p90": mean * 1.2,
                "p95": mean * 1.3, "p99": mean * 1.5, "p99.9": mean * 1.6, "max": mean * 1.7}

    return {"load_summary": {"count": count, "schedule_delay": s(0.001), "send_duration": count / rate,
                             "requested_rate": rate, "achieved_rate": rate},
            "successes": {"count": successes,
                          "latency": {"request_latency": s(0.5), "normalized_time_per_output_token": s(0.008),
                                      "time_per_output_token": s(0.0035) if streamed else None,
                                      "time_to_first_token": s(ttft_mean) if streamed else None,
                                      "inter_token_latency": s(0.0035) if streamed else None},
                          "throughput": {"input_tokens_per_sec": 200.0 * rate, "output_tokens_per_sec": 64.0 * rate,
                                         "total_tokens_per_sec": 264.0 * rate, "requests_per_sec": rate},
                          prompt_key: s(204.0), "output_len": s(64.0)},
            "failures": {"count": count - successes, "request_latency": None, prompt_key: None}}


def _write_stage(folder, i, obj):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"stage_{i}_lifecycle_metrics.json").write_text(json.dumps(obj, indent=2))


def test_inference_perf_stages_from_sibling_stage_files(tmp_path, capsys):
    folder = tmp_path / "report"
    _write_stage(folder, 0, _stage_file(1.0, 2))
    _write_stage(folder, 1, _stage_file(2.0, 2, successes=1))
    p = _write_iperf(folder, IPERF_RECORDS)
    assert read_inference_perf_requests(p).stage.tolist() == [0, 0, 1, 1]
    _write_stage(folder, 2, _stage_file(3.0, 5))  # now the counts (9) do not match the 4 records
    assert read_inference_perf_requests(p).stage.tolist() == [0, 0, 0, 0]
    assert "count 9 requests, this file has 4; stage set to 0" in capsys.readouterr().err


def _iperf_case(mutate):
    recs = json.loads(json.dumps(IPERF_RECORDS))
    mutate(recs)
    return recs


IPERF_BAD = [
    (lambda r: r[0].pop("end_time"), "record 0 is missing field(s) end_time"),
    (lambda r: r[1].__setitem__("start_time", None), "record 1: 'start_time' is None, not a number"),
    (lambda r: r[1].__setitem__("start_time", float("nan")), "record 1: 'start_time' is nan; times must be finite"),
    (lambda r: r[0].__setitem__("end_time", 400.0), "record 0: end_time 400.0 is before start_time 500.2"),
    (lambda r: r[0]["info"]["response_metrics"]["chunk_times"].__setitem__(0, 499.0),
     "record 0: first chunk time 499.0 is before start_time 500.2"),
    (lambda r: r[0]["info"]["response_metrics"]["server_usage"].__setitem__("completion_tokens", -1),
     "record 0: 'output_tokens' is -1; token counts must be whole numbers >= 0"),
    (lambda r: r[0]["info"]["request_metrics"]["text"].__setitem__("input_tokens", 0),
     "record 0: 'input_tokens' is 0 for a successful request"),
    (lambda r: r[0].__setitem__("info", [1]), "record 0: 'info' is list; expected an object"),
    (lambda r: r[0].__setitem__("error", "boom"), "record 0: 'error' is 'boom'; expected null"),
    (lambda r: r.__setitem__(slice(None), [r[2], r[2]]),
     "no successful request (all 2 failed); first error: to host"),
    (lambda r: r.clear(), "contains no requests (an empty list)"),
    (lambda r: r.__setitem__(0, 3), "record 0 is int; expected an object"),
]


@pytest.mark.parametrize("mutate, needle", IPERF_BAD)
def test_inference_perf_bad_cases(tmp_path, mutate, needle):
    p = _write_iperf(tmp_path, _iperf_case(mutate), name="per_request.json")
    with pytest.raises(JaxrouteError) as e:
        read_inference_perf_requests(p)
    assert needle in str(e.value) and str(e.value).startswith("per_request.json") and "\n" not in str(e.value)


def test_inference_perf_summary_file_is_not_per_request(tmp_path):
    p = tmp_path / "summary_lifecycle_metrics.json"
    p.write_text(json.dumps(_stage_file(1.0, 3)))
    with pytest.raises(JaxrouteError, match="expected a JSON list .* use read_inference_perf_stage_summaries"):
        read_inference_perf_requests(p)


def test_stage_summaries_fixture(tmp_path):
    folder = tmp_path / "results"
    _write_stage(folder, 1, _stage_file(30.0, 1800, ttft_mean=0.05, prompt_key="prompt_tokens"))
    _write_stage(folder, 0, _stage_file(1.0, 60, streamed=False))
    _write_stage(folder, 10, _stage_file(90.0, 5400, successes=5000))
    (folder / "summary_lifecycle_metrics.json").write_text(json.dumps(_stage_file(5.0, 7260)))
    (folder / "adapter_a_stage_0_lifecycle_metrics.json").write_text("{}")  # per-adapter files are ignored
    rows = read_inference_perf_stage_summaries(folder)
    assert [r["stage"] for r in rows] == [0, 1, 10] and [r["rate"] for r in rows] == [1.0, 30.0, 90.0]
    r0, r1, r10 = rows
    assert math.isnan(r0["ttft_mean_s"]) and math.isnan(r0["tpot_p99_s"]) and r0["e2e_mean_s"] == 0.5
    assert r1["ttft_mean_s"] == 0.05 and r1["ttft_p50_s"] == 0.05 and r1["ttft_p90_s"] == pytest.approx(0.06)
    assert r1["ttft_p99_s"] == pytest.approx(0.075) and r1["prompt_len_mean"] == 204.0
    assert r1["output_tok_s"] == 64.0 * 30 and r1["requests_per_s"] == 30.0 and r1["send_duration_s"] == 60.0
    assert r1["tpot_from_means_s"] == pytest.approx((0.5 - 0.05) / 63)
    assert (r10["requests"], r10["successes"], r10["failures"]) == (5400, 5000, 400) and r10["concurrency"] is None
    assert set(r1) >= {f"{m}_{s}_s" for m in ("ttft", "tpot", "itl", "e2e", "ntpot") for s in ("mean", "p50", "p90", "p99")}


def test_stage_summaries_bad_cases(tmp_path):
    with pytest.raises(JaxrouteError, match="report folder not found"):
        read_inference_perf_stage_summaries(tmp_path / "nope")
    (tmp_path / "f.json").write_text("{}")
    with pytest.raises(JaxrouteError, match="expected an inference-perf report folder, got a file"):
        read_inference_perf_stage_summaries(tmp_path / "f.json")
    with pytest.raises(JaxrouteError, match="no stage_N_lifecycle_metrics.json files"):
        read_inference_perf_stage_summaries(tmp_path)
    bad = _stage_file(1.0, 60)
    del bad["load_summary"]
    _write_stage(tmp_path / "a", 0, bad)
    with pytest.raises(JaxrouteError, match="stage_0_lifecycle_metrics.json: missing field.*load_summary"):
        read_inference_perf_stage_summaries(tmp_path / "a")
    bad = _stage_file(1.0, 60)
    bad["successes"]["latency"]["time_to_first_token"]["p90"] = -1.0
    _write_stage(tmp_path / "b", 0, bad)
    with pytest.raises(JaxrouteError, match=r"successes.latency.time_to_first_token.p90 is -1.0"):
        read_inference_perf_stage_summaries(tmp_path / "b")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "stage_0_lifecycle_metrics.json").write_text("")
    with pytest.raises(JaxrouteError, match="empty"):
        read_inference_perf_stage_summaries(tmp_path / "c")


def test_stage_summaries_real_kubecon_demo():
    """The published demos/kubecon-na-2025/vllm/results (tests/fixtures/..., SOURCE.md there)."""
    folder = KUBECON
    rows = read_inference_perf_stage_summaries(folder)
    r0 = rows[0]
    assert (r0["stage"], r0["rate"], r0["requests"], r0["successes"], r0["failures"]) == (0, 1.0, 60, 60, 0)
    assert r0["ttft_mean_s"] == pytest.approx(0.03112733216257766)
    assert r0["ttft_p50_s"] == pytest.approx(0.031026913959067315)
    assert r0["e2e_mean_s"] == pytest.approx(0.48048226445680486)
    assert r0["tpot_mean_s"] == pytest.approx(0.0034734172405264745)
    assert r0["output_tok_s"] == pytest.approx(64.23350089997027)
    # the demo's TPOT counts two stamps per token (see read_inference_perf_stage_summaries): the derived one is ~2x
    assert r0["tpot_from_means_s"] == pytest.approx(0.00721, rel=0.01)
    assert [r["stage"] for r in rows] == list(range(7))
    assert all(b["rate"] > a["rate"] for a, b in zip(rows, rows[1:], strict=False))
    assert rows[4]["ttft_mean_s"] > 1.0 > rows[3]["ttft_mean_s"]  # saturated from stage 4 (~106 req/s achieved)


# ----------------------------------------------------------------------------- jaxroute

def _jx_row(router, seed, request, arrival, prompt=100, output=10, first=None, finish=None, stage=0):
    """One --requests-out record (columns from the brief; times from the run's first arrival, None if unknown)."""
    ttft = None if first is None else first - arrival
    e2e = None if finish is None else finish - arrival
    tpot = None if (finish is None or first is None or output <= 1) else (finish - first) / (output - 1)
    return {"router": router, "seed": seed, "request": request, "arrival_s": arrival, "replica": 0,
            "admit_s": arrival if first is not None else None, "first_token_s": first, "finish_s": finish,
            "prompt_tokens": prompt, "cached_tokens": 0, "output_tokens": output, "preemptions": 0,
            "ttft_s": ttft, "e2e_s": e2e, "tpot_s": tpot, "stage": stage}


def _jx_rows(routers=("rr", "jsq"), seeds=(0, 1)):
    rows = []
    for r in routers:
        for s in seeds:
            rows += [_jx_row(r, s, 0, 0.0, 100, 10, 0.2, 1.1),
                     _jx_row(r, s, 1, 0.5, 50, 1, 0.6, 0.6, stage=1),
                     _jx_row(r, s, 2, 0.75, 80, 5, 1.0 + s, None, stage=1),  # first token, unfinished
                     _jx_row(r, s, 3, 1.0, 70, 4, None, None, stage=2)]  # still queued
    return rows


def _write_csv(path, rows):
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=JAXROUTE_COLUMNS)
        w.writeheader()
        w.writerows([{k: ("" if v is None else v) for k, v in r.items()} for r in rows])
    return path


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("writer, name", [(_write_csv, "req.csv"), (_write_jsonl, "req.jsonl")])
def test_jaxroute_records(tmp_path, writer, name):
    p = writer(tmp_path / name, _jx_rows())
    run = read_jaxroute_requests(p, router="jsq", seed=1)
    assert run.source == "jaxroute" and run.name == "req/jsq/seed1" and run.arrivals_recorded
    np.testing.assert_allclose(run.arrival_s, [0.0, 0.5, 0.75, 1.0])
    assert run.prompt_tokens.tolist() == [100, 50, 80, 70] and run.output_tokens.tolist() == [10, 1, 5, 4]
    assert run.ok.tolist() == [True, True, False, False] and run.stage.tolist() == [0, 1, 1, 2]
    np.testing.assert_allclose(run.ttft_s, [0.2, 0.1, np.nan, np.nan])
    np.testing.assert_allclose(run.e2e_s, [1.1, 0.1, np.nan, np.nan])
    np.testing.assert_allclose(run.tpot_s, [0.1, np.nan, np.nan, np.nan])
    one = writer(tmp_path / f"one{p.suffix}", _jx_rows(routers=("rr",), seeds=(3,)))
    assert read_jaxroute_requests(one).name == "one/rr/seed3"  # a single run needs no choice
    lean = [{k: v for k, v in r.items() if k not in ("preemptions", "replica", "admit_s")} for r in _jx_rows()]
    lean_path = tmp_path / f"lean{p.suffix}"
    if p.suffix == ".csv":
        with lean_path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(lean[0]))
            w.writeheader()
            w.writerows([{k: ("" if v is None else v) for k, v in r.items()} for r in lean])
    else:
        _write_jsonl(lean_path, lean)
    np.testing.assert_array_equal(read_jaxroute_requests(lean_path, "jsq", 1).e2e_s, run.e2e_s)  # optional columns
    assert read_jaxroute_requests(p, router="rr", seed=0).ok.sum() == 2


def _jx_error(tmp_path, rows, name="bad.csv", **sel):
    p = _write_csv(tmp_path / name, rows) if name.endswith(".csv") else _write_jsonl(tmp_path / name, rows)
    with pytest.raises(JaxrouteError) as e:
        read_jaxroute_requests(p, **sel)
    assert "\n" not in str(e.value) and str(e.value).startswith(name)
    return str(e.value)


def test_jaxroute_selection_errors(tmp_path):
    rows = _jx_rows()
    msg = _jx_error(tmp_path, rows)
    assert "holds 4 runs (rr (seed 0, 1); jsq (seed 0, 1)); choose one with router= and seed=" in msg
    assert "holds 2 runs (jsq (seed 0, 1))" in _jx_error(tmp_path, rows, router="jsq")
    assert "no records for router 'p2c'; the file holds rr (seed 0, 1); jsq (seed 0, 1)" in _jx_error(
        tmp_path, rows, router="p2c")
    assert "no records for router 'rr' and seed 7" in _jx_error(tmp_path, rows, router="rr", seed=7)


def test_jaxroute_bad_cases(tmp_path):
    one = _jx_rows(routers=("rr",), seeds=(0,))
    swapped = [one[1], one[0]] + one[2:]
    assert "line 3: timestamps are not sorted (0.000000 s comes after 0.500000 s)" in _jx_error(tmp_path, swapped)
    rows = [dict(r) for r in one]
    rows[2]["arrival_s"] = "soon"
    assert "line 4: column 'arrival_s' is not a number: 'soon'" in _jx_error(tmp_path, rows)
    rows = [dict(r) for r in one]
    rows[1]["prompt_tokens"] = 0
    assert "line 3: column 'prompt_tokens' is 0.0; token counts must be whole numbers >= 1" in _jx_error(tmp_path, rows)
    rows = [dict(r) for r in one]
    rows[0]["e2e_s"] = -1.0
    assert "line 2: column 'e2e_s' is -1.0; times must be finite and >= 0" in _jx_error(tmp_path, rows)
    rows = [dict(r) for r in one]
    rows[0]["ttft_s"] = float("nan")
    assert "line 1: column 'ttft_s' is nan; times must be finite" in _jx_error(tmp_path, rows, name="bad.jsonl")
    rows = [dict(r) for r in one]
    rows[0]["output_tokens"] = None
    assert "line 2: empty value in column 'output_tokens'" in _jx_error(tmp_path, rows)
    rows = [dict(r) for r in one]
    rows[3]["request"] = 1
    assert "request 1 appears more than once in rr seed 0" in _jx_error(tmp_path, rows)
    rows = [dict(r) for r in one]
    for r in rows:
        r["e2e_s"] = None
    assert "no successful request (all 4 failed)" in _jx_error(tmp_path, rows)
    rows = [{k: v for k, v in r.items() if k != "stage"} for r in one]
    (tmp_path / "nostage.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(JaxrouteError, match="nostage.jsonl line 1: missing field.s. stage"):
        read_jaxroute_requests(tmp_path / "nostage.jsonl")
    (tmp_path / "cols.csv").write_text("router,seed,arrival_s\nrr,0,0.0\n")
    with pytest.raises(JaxrouteError, match="cols.csv: missing column.s. request, prompt_tokens, output_tokens"):
        read_jaxroute_requests(tmp_path / "cols.csv")
    (tmp_path / "header.csv").write_text(",".join(JAXROUTE_COLUMNS) + "\n")
    with pytest.raises(JaxrouteError, match="header.csv: has no request records"):
        read_jaxroute_requests(tmp_path / "header.csv")
    (tmp_path / "broken.jsonl").write_text('{"router": "rr"\n')
    with pytest.raises(JaxrouteError, match="broken.jsonl line 1: not valid JSON"):
        read_jaxroute_requests(tmp_path / "broken.jsonl")


def test_a_records_file_cut_short_is_refused(tmp_path):
    """Runs of one file hold the same requests: a file whose last run is short was cut short (a killed writer),
    and is refused rather than read as a smaller run."""
    rows = _jx_rows()[:-2]  # jsq seed 1 lost its last two records
    msg = _jx_error(tmp_path, rows, router="jsq", seed=1)
    assert "its runs hold different numbers of requests (jsq seed 1: 2, rr seed 0: 4); a file cut short?" in msg


# ----------------------------------------------------------------------------- detection and summaries


def test_read_measured_detects_each_format(tmp_path):
    assert read_measured(_dump(tmp_path, "v.json", _vllm_result())).source == "vllm-bench-serve"
    assert read_measured(_write_iperf(tmp_path / "ip", IPERF_RECORDS)).source == "inference-perf"
    csv_path = _write_csv(tmp_path / "j.csv", _jx_rows())
    assert read_measured(csv_path, router="rr", seed=1).name == "j/rr/seed1"
    jsonl = _write_jsonl(tmp_path / "j.jsonl", _jx_rows())
    assert read_measured(jsonl, router="jsq", seed=0).source == "jaxroute"
    single = _write_jsonl(tmp_path / "single.jsonl", _jx_rows(routers=("rr",), seeds=(0,))[:1])  # one JSON object
    assert len(read_measured(single)) == 1
    assert read_measured(_dump(tmp_path, "v2.json", _vllm_result()), fmt="vllm-bench-serve").ok.sum() == 3


def test_read_measured_errors(tmp_path):
    with pytest.raises(JaxrouteError, match="unknown measured-results format 'guidellm'; expected auto, vllm"):
        read_measured(tmp_path / "x.json", fmt="guidellm")
    other = tmp_path / "other.csv"
    other.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3\n")
    with pytest.raises(JaxrouteError) as e:
        read_measured(other)
    assert "other.csv: unknown measured-results format; known formats: vllm-bench-serve" in str(e.value)
    assert "inference-perf (per_request_lifecycle_metrics.json" in str(e.value) and "jaxroute (" in str(e.value)
    with pytest.raises(JaxrouteError, match="o.json: unknown measured-results format"):
        read_measured(_dump(tmp_path, "o.json", {"ttft": [1]}))
    with pytest.raises(JaxrouteError, match="stage_0_lifecycle_metrics.json: an inference-perf summary report"):
        read_measured(_dump(tmp_path, "stage_0_lifecycle_metrics.json", _stage_file(1.0, 60)))
    with pytest.raises(JaxrouteError, match="router / seed select a run of a jaxroute file"):
        read_measured(_dump(tmp_path, "v.json", _vllm_result()), router="rr")
    with pytest.raises(JaxrouteError, match="router / seed select a run of a jaxroute file"):
        read_measured(tmp_path / "v.json", fmt="inference-perf", seed=1)
    appended = tmp_path / "app.json"
    appended.write_text(json.dumps(_vllm_result()) + "\n" + json.dumps(_vllm_result()))
    with pytest.raises(JaxrouteError, match="--append-result"):
        read_measured(appended)
    (tmp_path / "trunc.json").write_text('[{"start_time": 1')
    with pytest.raises(JaxrouteError, match="trunc.json: not valid JSON"):
        read_measured(tmp_path / "trunc.json")
    with pytest.raises(JaxrouteError, match="not found"):
        read_measured(tmp_path / "missing.json")
    (tmp_path / "e.csv").write_text("")
    with pytest.raises(JaxrouteError, match="empty"):
        read_measured(tmp_path / "e.csv")


def test_summary_and_mape(tmp_path):
    run = read_vllm_bench_serve(_dump(tmp_path, "v.json", _vllm_result()))
    s = summary(run, "e2e")
    x = np.array([0.09, 0.1, 0.25])
    assert s["mean"] == pytest.approx(x.mean()) and s["p50"] == pytest.approx(0.1)
    assert s["p90"] == pytest.approx(np.percentile(x, 90)) and s["p99"] == pytest.approx(0.1 + 0.98 * 0.15)
    assert summary(run, "tpot")["p50"] == pytest.approx((0.04 / 3 + 0.05) / 2)
    with pytest.raises(JaxrouteError, match="unknown metric 'itl'"):
        summary(run, "itl")
    assert mape([1.1, 2.0, np.nan], [1.0, 2.5, 3.0]) == pytest.approx(15.0)
    assert math.isnan(mape([1.0], [0.0]))
    assert mape({"mean": 2.0, "p50": 1.0}, {"mean": 1.0, "p50": 1.0, "p99": 4.0}) == pytest.approx(50.0)
