"""How hard XLA works on a program: a small job compiles fast, a long one compiles for speed.

On CPU most of a small simulation's time is XLA compiling it. XLA's older CPU emitters
(`xla_cpu_use_fusion_emitters=False`) compile a model's program in 20-40 % less time, and may run it up
to ~30 % slower. So a program whose whole job is small (rows x events, `work`) is compiled with them,
and a long job keeps the default. A small job of a model with branches and loops also runs a device's rows
one at a time, unbatched (`sim.rows_together`): one unbatched step compiles in ~25 % less time. Either way the
per-request results are the same (the suite's exact-match tests run on both; a float mean may differ in its
last bits). `scripts/calibrate_compile_effort.py` measures the break-even per model; `FAST_MAX_WORK` sits below the smallest. Other backends (GPU) always get the default.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import jax

from jaxroute.errors import JaxrouteError

EFFORTS = ("auto", "fast", "optimized")
# Row-events a program may have to run and still compile fast. The calibration script measured the break-even of
# one cold run at 6.9 M (dispatch), 7.0 M (the replica cluster) and never (decode: both ran as fast), on one noisy
# 2-core machine; at 2 M the slower run costs ~30 % of the compile seconds saved. `jaxroute bench` compiles
# optimized at every size (per-request costs compare); reproductions follow the job (the README has the figures).
FAST_MAX_WORK = 2_000_000
FAST_OPTIONS = {"xla_cpu_use_fusion_emitters": False}
# Not used: LLVM -O0 (`xla_backend_optimization_level=0`) halves a small program's backend compile, but its runs are
# 9-19x slower and it rounds differently from -O2 (an unfused multiply-add), which flips a Preble decision against
# its reference (tests/test_replicas.py::test_preble_e2_window_expiry_matches_reference).
ENV = "JAXROUTE_COMPILE_EFFORT"  # a process-wide effort (default auto): e.g. optimized for a timing run
_EFFORT: list[str | None] = [None]  # forced within a `forced` block


@contextlib.contextmanager
def forced(effort: str) -> Iterator[None]:
    """Within the block, every program compiles at `effort` ("fast", "optimized", or "auto" by work)."""
    if effort not in EFFORTS:
        raise JaxrouteError(f"unknown compile effort '{effort}'; choose from: {', '.join(EFFORTS)}")
    before, _EFFORT[0] = _EFFORT[0], effort
    try:
        yield
    finally:
        _EFFORT[0] = before


def effort() -> str:
    """The effort in force: a `forced` block's, else $JAXROUTE_COMPILE_EFFORT's, else auto."""
    chosen = _EFFORT[0] or os.environ.get(ENV) or "auto"
    if chosen not in EFFORTS:
        raise JaxrouteError(f"{ENV}={chosen!r} is not a compile effort; choose from: {', '.join(EFFORTS)}")
    return chosen


def is_fast(work: int) -> bool:
    """Whether a program whose job is `work` row-events compiles fast (on CPU)."""
    chosen = effort()
    if chosen == "auto":
        chosen = "fast" if work <= FAST_MAX_WORK else "optimized"
    return chosen == "fast" and jax.default_backend() == "cpu"


def options(fast: bool) -> dict | None:
    """`jax.jit(compiler_options=...)` of a program compiled fast or not."""
    return dict(FAST_OPTIONS) if fast else None
