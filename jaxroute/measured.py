"""Readers of per-request benchmark results into one host-array record (`MeasuredRun`), for comparing the simulator
with a measured run (TTFT, TPOT, E2E). Pure numpy/json/csv: no JAX here.

Formats (each field's meaning is taken from the tool's own source, cited as file:line of the version named):

- vLLM `vllm bench serve --save-result --save-detailed` JSON: `read_vllm_bench_serve`.
- inference-perf `per_request_lifecycle_metrics.json` (`report.request_lifecycle.per_request: true`):
  `read_inference_perf_requests`; its per-stage summaries `stage_N_lifecycle_metrics.json`:
  `read_inference_perf_stage_summaries`.
- jaxroute's own per-request records (CSV or JSONL, `--requests-out`): `read_jaxroute_requests`.
- `read_measured` picks one of the three per-request readers from the file's content.

Every bad input gets a one-line `JaxrouteError` naming the file, the field and the problem.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from jaxroute.errors import JaxrouteError, warn
from jaxroute.workloads.names import MAX_COUNT
from jaxroute.workloads.traces import _check_sorted, _open_nonempty, jsonl_objects

SOURCES = ("vllm-bench-serve", "inference-perf", "jaxroute")
METRICS = ("ttft", "tpot", "e2e")

# vLLM v0.34.0 vllm/benchmarks/serve.py:1329-1337: the per-request lists of the saved result (one entry per request,
# in the order the requests were dispatched). serve.py:2428-2444 deletes all but `latencies`/`queue_times` unless
# --save-detailed is given.
VLLM_FIELDS = ("input_lens", "output_lens", "ttfts", "itls", "errors")
VLLM_OPTIONAL = ("start_times", "latencies", "queue_times", "generated_texts")

# inference-perf reportgen/base.py:827-838 (HEAD 7de5ef2; the same since v0.2.0): one record per request.
IPERF_KEYS = ("start_time", "end_time", "info", "error")
IPERF_STAGE_FILE = re.compile(r"^stage_(\d+)_lifecycle_metrics\.json$")

JAXROUTE_COLUMNS = ("router", "seed", "request", "arrival_s", "replica", "admit_s", "first_token_s", "finish_s",
                    "prompt_tokens", "cached_tokens", "output_tokens", "preemptions", "ttft_s", "e2e_s", "tpot_s",
                    "stage")
# the columns read (the others are optional: a writer may leave out preemptions, say)
JAXROUTE_REQUIRED = ("router", "seed", "request", "arrival_s", "prompt_tokens", "output_tokens", "ttft_s", "e2e_s",
                     "stage")
_JAXROUTE_TIMES = ("admit_s", "first_token_s", "finish_s", "ttft_s", "e2e_s", "tpot_s")  # empty / null: unknown

_FORMATS_TEXT = ("vllm-bench-serve (the JSON of `vllm bench serve --save-result --save-detailed`, a dict with "
                 "'ttfts'), inference-perf (per_request_lifecycle_metrics.json, a list of records with start_time, "
                 "end_time, info, error), jaxroute (--requests-out CSV or JSONL with columns "
                 f"{','.join(JAXROUTE_COLUMNS[:4])},...)")


@dataclasses.dataclass(frozen=True)
class MeasuredRun:
    """Per-request results of one benchmark run (or one router x seed of a jaxroute run), in arrival order.

    ttft_s / e2e_s are NaN for failed requests (ok False) and ttft_s also where the tool saw no first token time
    (a non-streamed request). tpot_s is (e2e - ttft) / (output - 1) for every source (vLLM's own definition, v0.34.0
    vllm/benchmarks/serve.py:654-657), NaN when output <= 1, ttft is unknown or the request failed.
    prompt_tokens is >= 1 except for a failed inference-perf request whose prompt length was never recorded (0).
    """

    source: str  # "vllm-bench-serve" | "inference-perf" | "jaxroute"
    name: str  # file stem (plus router/seed for jaxroute)
    arrival_s: np.ndarray  # [N] float64, seconds since the first request was sent (sorted)
    prompt_tokens: np.ndarray  # [N] int64 >= 1
    output_tokens: np.ndarray  # [N] int64 >= 0 (0 only for failed requests)
    ttft_s: np.ndarray  # [N] float64, NaN where unknown or failed
    e2e_s: np.ndarray  # [N] float64, NaN where failed
    tpot_s: np.ndarray  # [N] float64: (e2e - ttft) / (output - 1), NaN when output <= 1 or failed
    ok: np.ndarray  # [N] bool: the request succeeded
    stage: np.ndarray  # [N] int64 load-stage index (0 when the format has no stages)
    arrivals_recorded: bool  # False when the format gives no per-request send times (arrival_s was rebuilt)

    def __len__(self) -> int:
        return len(self.arrival_s)


# ----------------------------------------------------------------------------- shared helpers


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _one_line(text: str, limit: int = 120) -> str:
    """The last non-empty line of a (traceback) message, shortened: errors stay one line."""
    lines = [s.strip() for s in str(text).splitlines() if s.strip()]
    s = lines[-1] if lines else ""
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _floats(p: Path, values: list, where: Callable[[int], str], what: str = "times", *, nonneg: bool = True,
            nullable: bool = False) -> np.ndarray:
    """Finite numbers (>= 0 unless nonneg is False); None -> NaN where nullable."""
    out = np.empty(len(values), dtype=np.float64)
    for i, v in enumerate(values):
        if v is None and nullable:
            out[i] = math.nan
            continue
        if not _is_num(v):
            raise JaxrouteError(f"{p.name}: {where(i)} is {v!r}, not a number")
        f = float(v)
        if not math.isfinite(f) or (nonneg and f < 0):
            raise JaxrouteError(f"{p.name}: {where(i)} is {v!r}; {what} must be finite{' and >= 0' if nonneg else ''}")
        out[i] = f
    return out


def _ints(p: Path, values: list, where: Callable[[int], str], minimum: int) -> np.ndarray:
    """Whole numbers in minimum .. MAX_COUNT (token counts, request ids)."""
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        if not _is_num(v):
            raise JaxrouteError(f"{p.name}: {where(i)} is {v!r}, not a number")
        f = float(v)
        if not math.isfinite(f) or f < minimum or f != int(f):
            raise JaxrouteError(f"{p.name}: {where(i)} is {v!r}; token counts must be whole numbers >= {minimum}")
        if f > MAX_COUNT:
            raise JaxrouteError(f"{p.name}: {where(i)} is {v!r}; at most {MAX_COUNT:,} (an int32 count)")
        out[i] = int(f)
    return out


def _load_json(p: Path) -> Any:
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise JaxrouteError(f"{p.name}: not a UTF-8 text file") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data" and text.lstrip().startswith("{"):
            raise JaxrouteError(f"{p.name}: holds several JSON documents (line {e.lineno} starts another); "
                                "`vllm bench serve --append-result` appends one result per run: split it into one "
                                "file per run") from None
        raise JaxrouteError(f"{p.name}: not valid JSON ({e.msg} at line {e.lineno})") from None


def _tpot(e2e: np.ndarray, ttft: np.ndarray, output: np.ndarray, ok: np.ndarray) -> np.ndarray:
    good = ok & (output > 1) & np.isfinite(ttft) & np.isfinite(e2e)
    return np.where(good, (e2e - ttft) / np.maximum(output - 1, 1), np.nan)


def _require_success(p: Path, ok: np.ndarray, first_error: str = "") -> None:
    if not ok.any():
        why = f"; first error: {first_error}" if first_error else ""
        raise JaxrouteError(f"{p.name}: no successful request (all {len(ok)} failed){why}")


def _sorted_run(source: str, name: str, arrival: np.ndarray, prompt: np.ndarray, output: np.ndarray,
                ttft: np.ndarray, e2e: np.ndarray, ok: np.ndarray, stage: np.ndarray, recorded: bool) -> MeasuredRun:
    """Order by arrival (stable: ties keep the file's order) and shift so the first arrival is 0. A successful
    request that ended before its first token is refused (its TPOT would be negative)."""
    early = np.flatnonzero(ok & np.isfinite(ttft) & np.isfinite(e2e) & (e2e < ttft))
    if len(early):
        i = int(early[0])
        raise JaxrouteError(f"{name}: request {i}: end-to-end latency {e2e[i]:.6g} s is shorter than its TTFT "
                            f"{ttft[i]:.6g} s ({len(early)} such request(s))")
    order = np.argsort(arrival, kind="stable")
    arrival, prompt, output, ttft, e2e, ok, stage = (a[order] for a in (arrival, prompt, output, ttft, e2e, ok, stage))
    ttft = np.where(ok, ttft, np.nan)
    e2e = np.where(ok, e2e, np.nan)
    return MeasuredRun(source, name, arrival - arrival[0], prompt, output, ttft, e2e, _tpot(e2e, ttft, output, ok),
                       ok.astype(bool), stage.astype(np.int64), recorded)


# ----------------------------------------------------------------------------- vLLM


def _vllm_rebuilt_arrivals(p: Path, d: dict, n: int) -> np.ndarray:
    """Send times for a vLLM result without `start_times` (before v0.16.0): the benchmark's own schedule in its
    burstiness -> inf limit (v0.34.0 vllm/benchmarks/serve.py:497-526, get_request).

    - request_rate "inf" (serve.py:2326-2328 saves inf as the string "inf"): every request at 0.
    - a finite rate and no ramp-up: evenly spaced, request i at i / rate. vLLM draws gamma(burstiness) gaps and
      rescales them to a total of n / rate (serve.py:504-526); their mean spacing is 1 / rate, but the draws depend
      on the global numpy state left by the dataset sampling and cannot be replayed, so the rebuilt arrivals have
      the run's mean rate with no burstiness (exact only for --burstiness inf).
    - ramp-up (`ramp_up_strategy`, `ramp_up_start_rps`, `ramp_up_end_rps` saved, serve.py:2332-2335): request i
      runs at vLLM's rate_i (serve.py:406-428, linear or exponential in i / (n - 1)) and arrives at
      sum_{j=1..i} 1 / rate_j (serve.py:511-512, the cumulative delays, without a rescale).
    A --max-concurrency cap (saved as `max_concurrency`) delays sends further; these are the offered times.
    """
    strategy = d.get("ramp_up_strategy")
    if strategy is not None:
        lo, hi = d.get("ramp_up_start_rps"), d.get("ramp_up_end_rps")
        if not (_is_num(lo) and _is_num(hi) and lo > 0 and hi > 0):
            raise JaxrouteError(f"{p.name}: ramp_up_strategy {strategy!r} needs positive ramp_up_start_rps and "
                                f"ramp_up_end_rps, got {lo!r} and {hi!r}")
        progress = np.arange(n) / max(n - 1, 1)
        if strategy == "linear":
            rates = lo + (hi - lo) * progress
        elif strategy == "exponential":
            rates = lo * (hi / lo) ** progress
        else:
            raise JaxrouteError(f"{p.name}: unknown ramp_up_strategy {strategy!r}; vLLM knows linear, exponential")
        gaps = 1.0 / rates
        gaps[0] = 0.0
        return np.cumsum(gaps)
    if "request_rate" not in d:
        raise JaxrouteError(f"{p.name}: no start_times and no request_rate field; cannot rebuild the arrivals")
    rate = d["request_rate"]
    if rate == "inf" or (_is_num(rate) and math.isinf(rate) and rate > 0):
        return np.zeros(n)
    if not _is_num(rate) or not math.isfinite(rate) or rate <= 0:
        raise JaxrouteError(f"{p.name}: field 'request_rate' is {rate!r}; expected a positive number or \"inf\"")
    return np.arange(n, dtype=np.float64) / float(rate)


def _vllm_from_dict(p: Path, d: Any) -> MeasuredRun:
    if not isinstance(d, dict):
        raise JaxrouteError(f"{p.name}: expected a JSON object (a vllm bench serve result), got a {type(d).__name__}")
    missing = [k for k in VLLM_FIELDS if k not in d]
    if missing:
        raise JaxrouteError(f"{p.name}: missing field(s) {', '.join(missing)}; save the run with `vllm bench serve "
                            "--save-result --save-detailed` (without --save-detailed vLLM drops the per-request lists)")
    lists = {k: d[k] for k in VLLM_FIELDS + VLLM_OPTIONAL if k in d and d[k] is not None}
    for k, v in lists.items():
        if not isinstance(v, list):
            raise JaxrouteError(f"{p.name}: field '{k}' is a {type(v).__name__}; expected a list (one entry per request)")
    n = len(d["input_lens"])
    odd = [f"{k} has {len(v)}" for k, v in lists.items() if len(v) != n]
    if odd:
        raise JaxrouteError(f"{p.name}: per-request lists of different lengths: input_lens has {n} entries, "
                            f"{', '.join(odd)}")
    if n == 0:
        raise JaxrouteError(f"{p.name}: contains no requests (the per-request lists are empty)")

    def at(field: str) -> Callable[[int], str]:
        return lambda i: f"'{field}'[{i}]"

    errors = d["errors"]
    for i, e in enumerate(errors):
        if e is not None and not isinstance(e, str):
            raise JaxrouteError(f"{p.name}: 'errors'[{i}] is {e!r}; expected a string ('' for success)")
    prompt = _ints(p, d["input_lens"], at("input_lens"), 1)
    output = _ints(p, d["output_lens"], at("output_lens"), 0)
    ttft = _floats(p, d["ttfts"], at("ttfts"))
    itl_sum = np.empty(n)
    for i, itl in enumerate(d["itls"]):
        if not isinstance(itl, list):
            raise JaxrouteError(f"{p.name}: 'itls'[{i}] is {itl!r}; expected a list of inter-token latencies")
        itl_sum[i] = _floats(p, itl, lambda j, i=i: f"'itls'[{i}][{j}]").sum()
    # latencies: v0.30.0+ (serve.py:1333 in v0.34.0); before, e2e = ttft + sum(itls), the same number: the request
    # function sets ttft = first chunk - st, each itl = chunk - previous chunk and latency = last chunk - st
    # (vllm/benchmarks/lib/endpoint_request_func.py:248-313).
    e2e = _floats(p, d["latencies"], at("latencies")) if "latencies" in lists else ttft + itl_sum
    # A failed request has a non-empty error, ttft 0 and output_lens 0 (serve.py:666-667); vLLM counts a success by
    # RequestFuncOutput.success, which is not saved (endpoint_request_func.py:301-316).
    ok = np.array([not e for e in errors]) & (ttft > 0) & (output >= 1)
    first_error = next((_one_line(e) for e in errors if e), "")
    _require_success(p, ok, first_error)
    if "start_times" in lists:
        # v0.16.0+ (serve.py:1334 in v0.34.0): time.perf_counter() when the request was sent, after any
        # --max-concurrency wait (endpoint_request_func.py:248-249, serve.py:1014-1016).
        arrival, recorded = _floats(p, d["start_times"], at("start_times"), nonneg=False), True
    else:
        arrival, recorded = _vllm_rebuilt_arrivals(p, d, n), False
    return _sorted_run("vllm-bench-serve", p.stem, arrival, prompt, output, ttft, e2e, ok, np.zeros(n, np.int64),
                       recorded)


def read_vllm_bench_serve(path: str | Path) -> MeasuredRun:
    """Read the JSON written by `vllm bench serve --save-result --save-detailed` (v0.34.0
    vllm/benchmarks/serve.py:2306-2338 run fields, 1319-1341 results, 2457 `json.dump`; older releases:
    benchmarks/benchmark_serving.py, e.g. v0.8.5 lines 430-435).

    Fields used: `input_lens` (prompt tokens; the server's usage.prompt_tokens when it reports one,
    endpoint_request_func.py:299-300), `output_lens` (serve.py:636-652: the server's completion_tokens, else the
    tokenized text; 0 for a failed request, serve.py:666-667), `ttfts` (s), `itls` (s, one list per request),
    `errors` ('' for success), `latencies` (s, v0.30.0+), `start_times` (s, perf_counter, v0.16.0+),
    `request_rate`, `ramp_up_*` (to rebuild arrivals without start_times, see `_vllm_rebuilt_arrivals`).
    ok: no error, ttft > 0 and output_lens >= 1. With start_times, arrival_s = start_times - their minimum (sorted
    stably: a --max-concurrency wait can reorder sends); without, arrivals are rebuilt and arrivals_recorded is False.
    """
    p = _open_nonempty(path, "measured file")
    return _vllm_from_dict(p, _load_json(p))


# ----------------------------------------------------------------------------- inference-perf


def _iperf_tokens_and_first(info: dict) -> tuple[Any, Any, list]:
    """(input tokens, output tokens, chunk times) from a record's `info` in any of inference-perf's layouts
    (apis/base.py): v0.2.0-v0.4.0 flat `input_tokens`, `output_tokens`, `output_token_times`; v0.5.0
    `input_tokens` + `response_info`; v0.6.0+ (HEAD 7de5ef2 lines 24-56) `request_metrics.text.input_tokens`
    (`input_tokens` kept as a deprecated mirror) + `response_metrics` {output_tokens, server_usage, chunk_times,
    output_token_times}. Output tokens: the server's usage.completion_tokens when reported (an exact count of decode
    steps), else the client's re-tokenized count (reportgen/base.py:248-275 uses the same order)."""
    rm = info.get("request_metrics")
    prompt = None
    if isinstance(rm, dict) and isinstance(rm.get("text"), dict):
        prompt = rm["text"].get("input_tokens")
    if prompt is None:
        prompt = info.get("input_tokens")
    resp = info.get("response_metrics", info.get("response_info"))
    if not isinstance(resp, dict):
        resp = info if "output_tokens" in info else {}
    usage = resp.get("server_usage")
    output = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if output is None:
        output = resp.get("output_tokens")
    # chunk_times: content-bearing SSE events only (apis/streaming_parser.py:89-108); output_token_times may be
    # re-expanded to one entry per token by the summary (reportgen/base.py:519-553), its first entry is the same.
    times = resp.get("chunk_times") or resp.get("output_token_times") or []
    return prompt, output, times


def _sibling_stage_counts(p: Path) -> list[tuple[int, int]] | None:
    """(stage, request count) from the stage_N_lifecycle_metrics.json next to a per-request file, or None."""
    found = []
    for f in p.parent.iterdir():
        m = IPERF_STAGE_FILE.match(f.name)
        if m and f.is_file():
            d = _load_json(f)
            count = d.get("load_summary", {}).get("count") if isinstance(d, dict) else None
            if not _is_num(count) or count < 0:
                raise JaxrouteError(f"{f.name}: missing or bad load_summary.count ({count!r})")
            found.append((int(m.group(1)), int(count)))
    return sorted(found) or None


def _iperf_from_list(p: Path, recs: Any) -> MeasuredRun:
    if not isinstance(recs, list):
        hint = (" (this is a stage or summary report; use read_inference_perf_stage_summaries on its folder)"
                if isinstance(recs, dict) and "load_summary" in recs else "")
        raise JaxrouteError(f"{p.name}: expected a JSON list of per-request records, got a {type(recs).__name__}{hint}")
    if not recs:
        raise JaxrouteError(f"{p.name}: contains no requests (an empty list)")
    n = len(recs)
    prompts, outputs, firsts, errors = [], [], [], []
    for i, r in enumerate(recs):
        if not isinstance(r, dict):
            raise JaxrouteError(f"{p.name}: record {i} is {type(r).__name__}; expected an object")
        missing = [k for k in IPERF_KEYS if k not in r]
        if missing:
            raise JaxrouteError(f"{p.name}: record {i} is missing field(s) {', '.join(missing)}")
        info = r["info"] or {}
        if not isinstance(info, dict):
            raise JaxrouteError(f"{p.name}: record {i}: 'info' is {type(info).__name__}; expected an object")
        prompt, output, times = _iperf_tokens_and_first(info)
        if not isinstance(times, list):
            raise JaxrouteError(f"{p.name}: record {i}: chunk times are {type(times).__name__}; expected a list")
        prompts.append(0 if prompt is None else prompt)
        outputs.append(0 if output is None else output)
        firsts.append(times[0] if times else None)
        e = r["error"]
        if e is not None and not isinstance(e, dict):
            raise JaxrouteError(f"{p.name}: record {i}: 'error' is {e!r}; expected null or {{error_type, error_msg}}")
        errors.append(e)

    def rec(field: str) -> Callable[[int], str]:
        return lambda i: f"record {i}: '{field}'"

    # start_time / end_time: time.perf_counter() around the request (client/modelserver/openai_client.py:413, 537).
    start = _floats(p, [r["start_time"] for r in recs], rec("start_time"), nonneg=False)
    end = _floats(p, [r["end_time"] for r in recs], rec("end_time"), nonneg=False)
    first = _floats(p, firsts, rec("chunk_times[0]"), nonneg=False, nullable=True)
    back = np.nonzero(end < start)[0]
    if len(back):
        i = int(back[0])
        raise JaxrouteError(f"{p.name}: record {i}: end_time {end[i]} is before start_time {start[i]}")
    early = np.nonzero(first < start)[0]
    if len(early):
        i = int(early[0])
        raise JaxrouteError(f"{p.name}: record {i}: first chunk time {first[i]} is before start_time {start[i]}")
    prompt = _ints(p, prompts, rec("input_tokens"), 0)
    output = _ints(p, outputs, rec("output_tokens"), 0)
    # Success as inference-perf counts it (reportgen/base.py:472, error is None), with at least one output token.
    ok = np.array([e is None for e in errors]) & (output >= 1)
    first_error = next((_one_line(f"{e.get('error_type', '')}: {e.get('error_msg', '')}") for e in errors if e), "")
    _require_success(p, ok, first_error)
    short = np.nonzero(ok & (prompt < 1))[0]
    if len(short):
        raise JaxrouteError(f"{p.name}: record {int(short[0])}: 'input_tokens' is 0 for a successful request")
    ttft = first - start  # reportgen/base.py:571; NaN for a non-streamed request
    e2e = end - start  # reportgen/base.py:511
    stage = np.zeros(n, np.int64)
    counts = _sibling_stage_counts(p)
    if counts is not None:
        total = sum(c for _, c in counts)
        if total == n:
            # Stages run one after another: run_stage waits for all its requests before the next stage starts
            # (loadgen/load_generator.py:803), so in send order the first count_0 requests are stage 0, and so on.
            order = np.argsort(start, kind="stable")
            stage[order] = np.repeat([s for s, _ in counts], [c for _, c in counts])
        else:
            warn(f"{p.name}: the stage files next to it count {total} requests, this file has {n}; stage set to 0")
    return _sorted_run("inference-perf", p.stem, start, prompt, output, ttft, e2e, ok, stage, True)


def read_inference_perf_requests(path: str | Path) -> MeasuredRun:
    """Read inference-perf's `per_request_lifecycle_metrics.json` (`report.request_lifecycle.per_request: true`,
    config/reportgen/config.py:23; written by reportgen/base.py:825-840 through ReportFile `{name}.json`,
    utils/report_file.py:27-28, client/filestorage/local.py:41; HEAD 7de5ef2).

    A JSON list, one record per request in completion order: `start_time`, `end_time` (s, perf_counter),
    `request`, `response` (bodies, unused), `info` (token counts and chunk times, see `_iperf_tokens_and_first`),
    `error` (null or {error_type, error_msg}). Used: arrival_s = start_time - the first start_time (sorted; the
    records are not in send order); e2e = end_time - start_time; ttft = first chunk time - start_time (NaN for a
    non-streamed request); ok = error is null and output tokens >= 1.
    The records carry no stage id (the scheduled time and stage_id of RequestLifecycleMetric, apis/base.py:64-75,
    are not written): when the folder also holds stage_N_lifecycle_metrics.json whose load_summary.count sum to
    the number of records, the requests are given stages in send order by those counts (exact when every stage
    ran to the end); otherwise stage is 0.
    """
    p = _open_nonempty(path, "measured file")
    return _iperf_from_list(p, _load_json(p))


def _stat(f: str, d: Any, where: str, key: str) -> float:
    v = d.get(key) if isinstance(d, dict) else None
    if v is None:
        return math.nan
    if not _is_num(v) or not math.isfinite(v) or v < 0:
        raise JaxrouteError(f"{f}: {where}.{key} is {v!r}; expected a finite number >= 0")
    return float(v)


def _stage_summary(f: Path, d: Any, stage: int) -> dict:
    if not isinstance(d, dict):
        raise JaxrouteError(f"{f.name}: expected a JSON object (a stage lifecycle report), got a {type(d).__name__}")
    missing = [k for k in ("load_summary", "successes", "failures") if not isinstance(d.get(k), dict)]
    if missing:
        raise JaxrouteError(f"{f.name}: missing field(s) {', '.join(missing)}; not an inference-perf lifecycle report")
    load, succ, fail = d["load_summary"], d["successes"], d["failures"]
    for where, obj, key in (("load_summary", load, "count"), ("successes", succ, "count"), ("failures", fail, "count")):
        if not _is_num(obj.get(key)):
            raise JaxrouteError(f"{f.name}: missing field {where}.{key}")
    lat = succ.get("latency")
    if not isinstance(lat, dict):
        raise JaxrouteError(f"{f.name}: missing field successes.latency")
    conc = load.get("concurrency")
    out = {"stage": stage, "file": f.name,
           "rate": _stat(f.name, load, "load_summary", "requested_rate"),
           "achieved_rate": _stat(f.name, load, "load_summary", "achieved_rate"),
           "concurrency": int(conc) if _is_num(conc) else None,
           "send_duration_s": _stat(f.name, load, "load_summary", "send_duration"),
           "requests": int(load["count"]), "successes": int(succ["count"]), "failures": int(fail["count"])}
    names = {"ttft": "time_to_first_token", "tpot": "time_per_output_token", "itl": "inter_token_latency",
             "e2e": "request_latency", "ntpot": "normalized_time_per_output_token"}
    for short, long in names.items():
        s = lat.get(long)
        for stat, key in (("mean", "mean"), ("p50", "median"), ("p90", "p90"), ("p99", "p99")):
            out[f"{short}_{stat}_s"] = _stat(f.name, s, f"successes.latency.{long}", key)
    thr = succ.get("throughput")
    out["input_tok_s"] = _stat(f.name, thr, "successes.throughput", "input_tokens_per_sec")
    out["output_tok_s"] = _stat(f.name, thr, "successes.throughput", "output_tokens_per_sec")
    out["requests_per_s"] = _stat(f.name, thr, "successes.throughput", "requests_per_sec")
    plen = "prompt_len" if "prompt_len" in succ else "prompt_tokens"
    out["prompt_len_mean"] = _stat(f.name, succ.get(plen), f"successes.{plen}", "mean")
    out["output_len_mean"] = _stat(f.name, succ.get("output_len"), "successes.output_len", "mean")
    n_out = out["output_len_mean"]
    out["tpot_from_means_s"] = ((out["e2e_mean_s"] - out["ttft_mean_s"]) / (n_out - 1)
                                if n_out > 1 else math.nan)
    return out


def read_inference_perf_stage_summaries(folder: str | Path) -> list[dict]:
    """Read every `stage_N_lifecycle_metrics.json` of an inference-perf report folder (per_stage: true, the
    default; reportgen/base.py:788-823, summarize_requests 462-720 at HEAD 7de5ef2; the published
    demos/kubecon-na-2025/*/results were written by the layout of commit 7ff8150, reportgen/base.py:122-189).

    One dict per stage, by stage index, with these keys (times in seconds, rates in requests/s, throughputs in
    tokens/s; NaN where the file has null, e.g. no successful or no streamed request):
      stage, file; rate (load_summary.requested_rate), achieved_rate (count / send_duration), concurrency (int or
      None, concurrent load only), send_duration_s (first to last send); requests (load_summary.count, sent),
      successes, failures (counts);
      {ttft,tpot,itl,e2e,ntpot}_{mean,p50,p90,p99}_s from successes.latency.{time_to_first_token,
      time_per_output_token, inter_token_latency, request_latency, normalized_time_per_output_token} (p50 is the
      file's "median"; numpy linear percentiles, reportgen/base.py:168-179);
      input_tok_s, output_tok_s, requests_per_s (successes.throughput: totals over the stage's first send to last
      end); prompt_len_mean, output_len_mean (successes.prompt_len, or prompt_tokens at HEAD, and output_len);
      tpot_from_means_s = (e2e_mean - ttft_mean) / (output_len_mean - 1), derived here.
    Caveat for the 7ff8150 layout (the kubecon demo): its streamed client stamped a time per SSE *line*
    (apis/completion.py:51-53 there: the data line and the blank line after it), so its TPOT and ITL count each
    token about twice (TPOT about half the real per-token time, ITL alternating ~0 and the real gap);
    tpot_from_means_s does not depend on those stamps. Output lengths there are client re-tokenizations with a BOS.
    """
    d = Path(folder)
    if not d.exists():
        raise JaxrouteError(f"inference-perf report folder not found: {d}")
    if not d.is_dir():
        raise JaxrouteError(f"expected an inference-perf report folder, got a file: {d}")
    files = sorted(((int(m.group(1)), f) for f in d.iterdir() if (m := IPERF_STAGE_FILE.match(f.name))),
                   key=lambda t: t[0])
    if not files:
        raise JaxrouteError(f"{d}: no stage_N_lifecycle_metrics.json files (run inference-perf with "
                            "report.request_lifecycle.per_stage: true)")
    return [_stage_summary(f, _load_json(_open_nonempty(f, "stage report")), s) for s, f in files]


# ----------------------------------------------------------------------------- jaxroute


def _jaxroute_rows(p: Path, text: str) -> list[tuple[int, dict]]:
    """(line number, row) with '' / null -> None; CSV when the first line is not a JSON object, else JSONL."""
    first = text.lstrip()[:1]
    rows: list[tuple[int, dict]] = []
    if first == "{":
        rows = jsonl_objects(p, text.splitlines(), JAXROUTE_REQUIRED, "field(s)")
    else:
        reader = csv.DictReader(text.splitlines())
        header = [h.strip() for h in (reader.fieldnames or [])]
        missing = [c for c in JAXROUTE_REQUIRED if c not in header]
        if missing:
            raise JaxrouteError(f"{p.name}: missing column(s) {', '.join(missing)}; jaxroute request records need "
                                f"{','.join(JAXROUTE_REQUIRED)}")
        for r in reader:
            row = {k.strip(): (v.strip() if isinstance(v, str) else v) for k, v in r.items() if k is not None}
            rows.append((reader.line_num, {k: (None if v in ("", None) else v) for k, v in row.items()}))
    if not rows:
        raise JaxrouteError(f"{p.name}: has no request records")
    return rows


def _num(p: Path, line: int, col: str, v: Any) -> float:
    """A CSV string or JSON number as a float (None stays NaN; the caller decides whether that is allowed)."""
    if v is None:
        return math.nan
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            raise JaxrouteError(f"{p.name} line {line}: column '{col}' is not a number: {v!r}") from None
    if not _is_num(v):
        raise JaxrouteError(f"{p.name} line {line}: column '{col}' is {v!r}, not a number")
    return float(v)


def _runs_text(runs: list[tuple[str, int]]) -> str:
    by: dict[str, list[int]] = {}
    for r, s in runs:
        by.setdefault(r, []).append(s)
    return "; ".join(f"{r} (seed {', '.join(map(str, sorted(ss)))})" for r, ss in by.items())


def _jaxroute_from_rows(p: Path, rows: list[tuple[int, dict]], router: str | None, seed: int | None) -> MeasuredRun:
    keyed = []
    for line, r in rows:
        if r["router"] is None:
            raise JaxrouteError(f"{p.name} line {line}: empty value in column 'router'")
        s = _num(p, line, "seed", r["seed"])
        if not math.isfinite(s) or s != int(s):
            raise JaxrouteError(f"{p.name} line {line}: column 'seed' is {r['seed']!r}; expected a whole number")
        keyed.append((str(r["router"]), int(s), line, r))
    runs = list(dict.fromkeys((k[0], k[1]) for k in keyed))
    counts = collections.Counter((k[0], k[1]) for k in keyed)
    if len(set(counts.values())) > 1:  # jaxroute writes every router x seed run with the same requests
        (r0, s0), (r1, s1) = min(counts, key=counts.get), max(counts, key=counts.get)
        raise JaxrouteError(f"{p.name}: its runs hold different numbers of requests ({r0} seed {s0}: {counts[r0, s0]}, "
                            f"{r1} seed {s1}: {counts[r1, s1]}); a file cut short? rerun with --requests-out")
    chosen = [k for k in keyed if (router is None or k[0] == router) and (seed is None or k[1] == int(seed))]
    left = list(dict.fromkeys((k[0], k[1]) for k in chosen))
    if not left:
        want = " and ".join(x for x in (f"router {router!r}" if router is not None else "",
                                        f"seed {seed}" if seed is not None else "") if x)
        raise JaxrouteError(f"{p.name}: no records for {want}; the file holds {_runs_text(runs)}")
    if len(left) > 1:
        raise JaxrouteError(f"{p.name}: holds {len(left)} runs ({_runs_text(left)}); choose one with router= and "
                            "seed=")
    (rname, rseed), = left
    lines = np.array([k[2] for k in chosen])
    recs = [k[3] for k in chosen]

    def col(name: str) -> np.ndarray:
        return np.array([_num(p, ln, name, r[name]) for ln, r in zip(lines, recs, strict=True)])

    def where(name: str) -> Callable[[int], str]:
        return lambda i: f"line {lines[i]}: column '{name}'"

    for name in ("request", "arrival_s", "prompt_tokens", "output_tokens", "stage"):
        empty = [ln for ln, r in zip(lines, recs, strict=True) if r[name] is None]
        if empty:
            raise JaxrouteError(f"{p.name} line {empty[0]}: empty value in column '{name}'")
    arrival = col("arrival_s")
    if np.all(np.diff(lines) == 1):  # one contiguous block (how a run is written): line numbers are exact
        _check_sorted(arrival, p, int(lines[0]))
    else:
        bad = np.nonzero(~np.isfinite(arrival) | np.concatenate([[False], np.diff(arrival) < 0]))[0]
        if len(bad):
            raise JaxrouteError(f"{p.name} line {lines[bad[0]]}: arrival_s is not finite or not sorted "
                                f"({arrival[bad[0]]}); write each run's records in arrival order")
    if arrival[0] < 0:
        raise JaxrouteError(f"{p.name} line {lines[0]}: arrival_s is {arrival[0]}; times must be >= 0")
    request = _ints(p, col("request").tolist(), where("request"), 0)
    ids, seen = np.unique(request, return_counts=True)  # not bincount: an id may be large
    dup = ids[seen > 1]
    if len(dup):
        raise JaxrouteError(f"{p.name}: request {int(dup[0])} appears more than once in {rname} seed {rseed}")
    prompt = _ints(p, col("prompt_tokens").tolist(), where("prompt_tokens"), 1)
    output = _ints(p, col("output_tokens").tolist(), where("output_tokens"), 0)
    stage = _ints(p, col("stage").tolist(), where("stage"), 0)
    times = {}
    for name in _JAXROUTE_TIMES:  # empty / null / absent column is unknown; a written NaN is an error
        times[name] = _floats(p, [None if r.get(name) is None else _num(p, ln, name, r[name])
                                  for ln, r in zip(lines, recs, strict=True)], where(name), nullable=True)
    ok = np.isfinite(times["e2e_s"])  # e2e_s is given once a request finished
    _require_success(p, ok)
    return _sorted_run("jaxroute", f"{p.stem}/{rname}/seed{rseed}", arrival, prompt, output, times["ttft_s"],
                       times["e2e_s"], ok, stage, True)


def read_jaxroute_requests(path: str | Path, router: str | None = None, seed: int | None = None) -> MeasuredRun:
    """Read jaxroute's per-request records (`--requests-out`, CSV or JSONL) for one router x seed.

    Columns (JAXROUTE_COLUMNS, of which JAXROUTE_REQUIRED must be there): times in seconds from the run's first
    arrival, empty (CSV) / null (JSONL) where unknown (an unfinished request). Used: arrival_s (sorted within a run), prompt_tokens (>= 1), output_tokens,
    ttft_s, e2e_s, stage; ok = e2e_s is given; tpot is recomputed as (e2e - ttft) / (output - 1) like the other
    sources. The other times (admit_s, first_token_s, finish_s, tpot_s) are checked (finite, >= 0 or empty) but
    not kept; replica, cached_tokens, preemptions are not read. When the file holds several router x seed runs, pass
    router and seed (an error lists the choices).
    """
    p = _open_nonempty(path, "measured file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise JaxrouteError(f"{p.name}: not a UTF-8 text file") from None
    return _jaxroute_from_rows(p, _jaxroute_rows(p, text), router, seed)


# ----------------------------------------------------------------------------- any format


def read_measured(path: str | Path, fmt: str = "auto", router: str | None = None,
                  seed: int | None = None) -> MeasuredRun:
    """Read per-request results in `fmt` (one of SOURCES), or detect it from the content with fmt="auto":
    a JSON object with 'ttfts' is vLLM's, a JSON list of records with start_time/end_time/info is inference-perf's,
    CSV or JSONL with jaxroute's columns is jaxroute's. router / seed select a jaxroute run."""
    if fmt not in SOURCES + ("auto",):
        raise JaxrouteError(f"unknown measured-results format {fmt!r}; expected auto, {', '.join(SOURCES)}")
    if (router is not None or seed is not None) and fmt not in ("auto", "jaxroute"):
        raise JaxrouteError(f"router / seed select a run of a jaxroute file, not of a {fmt} file")
    if fmt == "vllm-bench-serve":
        return read_vllm_bench_serve(path)
    if fmt == "inference-perf":
        return read_inference_perf_requests(path)
    if fmt == "jaxroute":
        return read_jaxroute_requests(path, router, seed)
    p = _open_nonempty(path, "measured file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise JaxrouteError(f"{p.name}: not a UTF-8 text file") from None
    head = text.lstrip()[:1]
    if head in ("{", "["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg != "Extra data" or head != "{":
                raise JaxrouteError(f"{p.name}: not valid JSON ({e.msg} at line {e.lineno})") from None
            data = None  # several JSON documents: JSONL
        if data is None:
            try:
                first = json.loads(text.lstrip().splitlines()[0])
            except json.JSONDecodeError as e:
                raise JaxrouteError(f"{p.name}: not valid JSON or JSONL ({e.msg} in its first record)") from None
            if isinstance(first, dict) and "router" in first and "arrival_s" in first:
                return _jaxroute_from_rows(p, _jaxroute_rows(p, text), router, seed)
            if isinstance(first, dict) and "ttfts" in first:
                _load_json(p)  # raises the --append-result message
        elif isinstance(data, dict) and "ttfts" in data:
            _no_selection(router, seed, "vllm-bench-serve")
            return _vllm_from_dict(p, data)
        elif isinstance(data, list) and data and isinstance(data[0], dict) and "start_time" in data[0] \
                and "info" in data[0]:
            _no_selection(router, seed, "inference-perf")
            return _iperf_from_list(p, data)
        elif isinstance(data, dict) and "load_summary" in data and "successes" in data:
            raise JaxrouteError(f"{p.name}: an inference-perf summary report, not per-request records; per-request "
                                "records are per_request_lifecycle_metrics.json (use read_inference_perf_stage_summaries "
                                "for the stage files)")
        elif isinstance(data, dict) and "router" in data and "arrival_s" in data:
            return _jaxroute_from_rows(p, _jaxroute_rows(p, text), router, seed)
    else:
        header = {h.strip() for h in text.splitlines()[0].split(",")}
        if {"router", "seed", "arrival_s"} <= header:
            return _jaxroute_from_rows(p, _jaxroute_rows(p, text), router, seed)
    raise JaxrouteError(f"{p.name}: unknown measured-results format; known formats: {_FORMATS_TEXT}")


def _no_selection(router: str | None, seed: int | None, fmt: str) -> None:
    if router is not None or seed is not None:
        raise JaxrouteError(f"router / seed select a run of a jaxroute file, not of a {fmt} file")


# ----------------------------------------------------------------------------- summaries


def summary(run: MeasuredRun, metric: str) -> dict:
    """mean, p50, p90, p99 (seconds) of metric ("ttft", "tpot", "e2e") over the ok requests where it is known.
    Percentiles are numpy's linear interpolation, as `jaxroute.metrics.masked_quantile`; NaN when none is known."""
    if metric not in METRICS:
        raise JaxrouteError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    x = getattr(run, f"{metric}_s")
    x = x[run.ok & np.isfinite(x)]
    if not len(x):
        return {"mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan}
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {"mean": float(np.mean(x)), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def mape(simulated: Any, measured: Any) -> float:
    """Mean absolute percentage error (in %) of simulated against measured, over pairs where both are finite and
    measured is not 0 (NaN when there is none). Scalars, arrays or equal-keyed `summary` dicts."""
    if isinstance(simulated, dict) and isinstance(measured, dict):
        keys = [k for k in measured if k in simulated]
        simulated, measured = [simulated[k] for k in keys], [measured[k] for k in keys]
    s = np.asarray(simulated, dtype=np.float64)
    m = np.asarray(measured, dtype=np.float64)
    use = np.isfinite(s) & np.isfinite(m) & (m != 0)
    if not use.any():
        return math.nan
    return float(np.mean(np.abs(s[use] - m[use]) / np.abs(m[use])) * 100.0)
