"""Timing one model at several sizes: first run (with compilation), steady run, memory, scaling.

A `Scenario` says how to run one model at (seeds, requests per seed, base seed) through the
experiments API; `measure` times it twice (the second run with other seeds, results fetched to
the host), and `sweep` does that over the seed counts, stopping at the first size that does not fit
(an out-of-memory is recorded and the smaller sizes are kept), then adds the two scaling checks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import jax

from jaxroute import sim
from jaxroute.bench.config import LINEAR_MAX, SEED_SCALING_MIN

# jax.monitoring events whose durations make up a compilation (tracing, lowering, XLA compile).
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")


# --------------------------------------------------------------------------- the machine


def cores_used() -> int:
    """Cores a batched run keeps busy: one per JAX CPU device (at most the cores there are); on an
    accelerator, the number of devices (figures "per core" are then per device)."""
    n_dev = len(jax.devices())
    if jax.default_backend() != "cpu":
        return n_dev
    return max(1, min(n_dev, os.cpu_count() or 1))


def machine_info() -> dict:
    dev = jax.devices()[0]
    return {"device": {"kind": dev.device_kind, "platform": dev.platform}, "n_devices": len(jax.devices()),
            "cores": {"os_cpu_count": os.cpu_count(), "used": cores_used(),
                      "per": "core" if dev.platform == "cpu" else "device"},
            "jax_version": jax.__version__, "python_version": platform.python_version(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on this platform
        return None


def say(msg: str) -> None:
    """One progress line per measurement, flushed at once (long runs print before they start)."""
    print(msg, flush=True)


# --------------------------------------------------------------------------- timers


class CompileTimer:
    """Seconds JAX spent tracing, lowering and compiling while active (jax.monitoring events)."""

    def __init__(self):
        self.seconds = 0.0

    def _listen(self, event: str, duration: float, **_) -> None:
        if event in COMPILE_EVENTS:
            self.seconds += float(duration)

    def __enter__(self) -> CompileTimer:
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc) -> None:
        jax.monitoring.unregister_event_duration_listener(self._listen)


@contextlib.contextmanager
def clock():
    """Wall and process-CPU seconds of the block: `with clock() as c: ...; c['wall'], c['cpu']`."""
    out: dict[str, float] = {}
    w, c = time.perf_counter(), time.process_time()
    try:
        yield out
    finally:
        out["wall"] = time.perf_counter() - w
        out["cpu"] = time.process_time() - c


def is_out_of_memory(err: BaseException) -> bool:
    text = f"{type(err).__name__}: {err}".lower()
    return isinstance(err, MemoryError) or "resource_exhausted" in text or "out of memory" in text


def error_record(err: BaseException) -> dict:
    oom = is_out_of_memory(err)
    return {"error": "out of memory" if oom else type(err).__name__, "out_of_memory": oom,
            "detail": str(err).strip().splitlines()[0][:300] if str(err).strip() else "",
            **({} if oom else {"traceback": traceback.format_exc(limit=3)[-1500:]})}


# --------------------------------------------------------------------------- one model


@dataclasses.dataclass
class RunOut:
    """One run's outcome: the experiments' Results, the workload it ran on, what it simulated."""

    results: Any
    workload: Any
    requests: float  # requests simulated (all rows and seeds)
    overflow: bool
    extra: dict = dataclasses.field(default_factory=dict)  # e.g. decode tokens, latency metrics


@dataclasses.dataclass
class Scenario:
    """How to run one model: `run(seeds, requests_per_seed, base_seed) -> RunOut`."""

    name: str
    kind: str
    rows: int  # configurations per grid
    requests: int  # requests per seed (the default size)
    run: Callable[[int, int, int], RunOut]
    info: dict = dataclasses.field(default_factory=dict)


def measure(scn: Scenario, seeds: int, requests: int, max_repeat_s: float) -> dict:
    """First run (seed 0, compilation included) and steady run (seed 1) of one size."""
    say(f"  {scn.name}: {seeds} seed{'s' if seeds > 1 else ''} x {requests:,} requests ...")
    with CompileTimer() as ct, clock() as first:
        out = scn.run(seeds, requests, 0)
    row: dict[str, Any] = {"seeds": seeds, "requests_per_seed": requests, "rows": scn.rows,
                           "first_run_s": first["wall"], "compile_s": ct.seconds}
    if first["wall"] > max_repeat_s:  # long run: compilation is small beside it; do not run it twice
        steady = {"wall": max(first["wall"] - ct.seconds, 1e-9), "cpu": max(first["cpu"] - ct.seconds, 1e-9)}
        row["steady_from"] = "first run minus compile time (first run > max_repeat_s)"
    else:
        with clock() as steady:
            out = scn.run(seeds, requests, 1)
        row["steady_from"] = "second run, other seeds"
    cores = cores_used()
    rps = out.requests / steady["wall"]
    row.update(steady_s=steady["wall"], steady_cpu_s=steady["cpu"], busy_cores=steady["cpu"] / steady["wall"],
               first_minus_steady_s=first["wall"] - steady["wall"], simulated_requests=out.requests,
               requests_per_s=rps, cores_used=cores, requests_per_s_per_core=rps / cores, overflow=out.overflow,
               memory_per_row_bytes=memory_of(out), **out.extra)
    for k, v in out.extra.items():  # rates of extra counts (e.g. decode tokens)
        if k.endswith("_simulated"):
            row[k.replace("_simulated", "_per_s")] = v / steady["wall"]
    say(f"    {rps:,.0f} requests/s ({rps / cores:,.0f} per core), first run {first['wall']:.1f} s "
        f"(compile {ct.seconds:.1f} s), steady {steady['wall']:.2f} s{'  OVERFLOW' if out.overflow else ''}")
    return row


def memory_of(out: RunOut) -> int | None:
    res = out.results
    try:
        return sim.state_bytes(res.model, out.workload, res.rows[0].params)
    except Exception as e:  # pragma: no cover - a model whose init cannot be shape-evaluated
        print(f"warning: memory per row not measured: {e}", file=sys.stderr)
        return None


def sweep(scn: Scenario, seed_counts, *, max_repeat_s: float, request_scaling: bool,
          on_size: Callable[[dict], object] | None = None) -> dict:
    """Every seed count (smallest first, stopping at the first that fails), then the scaling checks.
    on_size(result so far) is called after each size (to save partial results)."""
    sizes, failed = [], None

    def result() -> dict:
        return {"model": scn.name, "kind": scn.kind, "rows": scn.rows, "info": scn.info, "sizes": sizes,
                "failed": failed, "largest_seeds_that_fit": sizes[-1]["seeds"] if sizes else None,
                "seed_scaling": seed_scaling(sizes)}

    for s in sorted(seed_counts):
        try:
            sizes.append(measure(scn, s, scn.requests, max_repeat_s))
        except Exception as e:  # an out-of-memory (or any failure) keeps the smaller sizes
            failed = {"seeds": s, **error_record(e)}
            say(f"    {s} seeds failed: {failed['error']} {failed['detail']}")
            gc.collect()
            break
        if on_size is not None:
            on_size(result())
    out = result()
    if request_scaling and sizes:
        out["request_scaling"] = request_scaling_check(scn, sizes[0], max_repeat_s)
    return out


def seed_scaling(sizes: list[dict]) -> dict | None:
    """Requests/s at the largest seed count against the next smaller one: flat or rising?"""
    if len(sizes) < 2:
        return None
    a, b = sizes[-2], sizes[-1]
    ratio = b["requests_per_s"] / a["requests_per_s"]
    return {"from_seeds": a["seeds"], "to_seeds": b["seeds"], "ratio": ratio, "threshold": SEED_SCALING_MIN,
            "flat_or_rising": bool(ratio >= SEED_SCALING_MIN)}


def request_scaling_check(scn: Scenario, base: dict, max_repeat_s: float) -> dict:
    """Time per request at twice the requests per seed (same seeds): linear when it grows < LINEAR_MAX x."""
    try:
        big = measure(scn, base["seeds"], 2 * base["requests_per_seed"], max_repeat_s)
    except Exception as e:
        return {"seeds": base["seeds"], "requests_per_seed": [base["requests_per_seed"]], **error_record(e)}
    per = [base["steady_s"] / base["simulated_requests"], big["steady_s"] / big["simulated_requests"]]
    ratio = per[1] / per[0]
    return {"seeds": base["seeds"], "requests_per_seed": [base["requests_per_seed"], big["requests_per_seed"]],
            "steady_s": [base["steady_s"], big["steady_s"]], "seconds_per_request": per,
            "requests_per_s": [base["requests_per_s"], big["requests_per_s"]],
            "per_request_cost_ratio": ratio, "threshold": LINEAR_MAX, "linear": bool(ratio <= LINEAR_MAX),
            "first_run_s": big["first_run_s"], "memory_per_row_bytes": big["memory_per_row_bytes"]}
