"""How hard XLA works on a program: a small job compiles fast, a long one compiles for speed.

On CPU most of a small simulation's time is XLA compiling it. Three levels, by the job's work (rows x events):
- `minimal`: LLVM at -O0 (`xla_backend_optimization_level=0`) and the older emitters: about half the backend
  compile time of `fast`, a run ~10x slower than `optimized`. Only a tiny job, below its model's
  `minimal_max_work` (calibrated per model: a step's cost differs); a model without one never gets it.
- `fast`: XLA's older CPU emitters (`xla_cpu_use_fusion_emitters=False`): 20-40 % less compile time, a run up to
  ~30 % slower. A job of at most `FAST_MAX_WORK`.
- `optimized`: XLA's default. Longer jobs, and every GPU program.
Either way the per-request results are the same (the suite's exact-match tests run on the lower levels,
`tests/test_compile_effort.py` holds the optimized program to them; at minimal a float statistic, a mean or an
interpolated quantile, may differ in its last bits).
`scripts/calibrate_compile_effort.py` measures the break-even per model and level.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import jax

from jaxroute.errors import JaxrouteError

EFFORTS = ("auto", "minimal", "fast", "optimized")
LEVELS = EFFORTS[1:]  # what a program is compiled at, least effort first
# Row-events a program may have to run and still compile fast. The calibration script measured the break-even of
# one cold run at 6.9 M (dispatch), 7.0 M (the replica cluster) and never (decode: both ran as fast), on one noisy
# 2-core machine; at 2 M the slower run costs ~30 % of the compile seconds saved. A program loaded from the
# persistent cache saves nothing and still runs slower: reproductions, which are rerun, compile optimized
# (`reproduce.REPRODUCE_EFFORT`), as does `jaxroute bench` (one effort at every size).
FAST_MAX_WORK = 2_000_000
FAST_OPTIONS = {"xla_cpu_use_fusion_emitters": False}
MINIMAL_OPTIONS = {**FAST_OPTIONS, "xla_backend_optimization_level": 0}
_OPTIONS = {"minimal": MINIMAL_OPTIONS, "fast": FAST_OPTIONS, "optimized": None}
ENV = "JAXROUTE_COMPILE_EFFORT"  # a process-wide effort (default auto): e.g. optimized for a timing run
_EFFORT: list[str | None] = [None]  # forced within a `forced` block


@contextlib.contextmanager
def forced(effort: str) -> Iterator[None]:
    """Within the block, every program compiles at `effort` (one of `LEVELS`, or "auto": by work)."""
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


def level(work: int, minimal_max_work: int = 0) -> str:
    """The level a program whose job is `work` row-events compiles at, on this backend: under auto, minimal up to
    its model's `minimal_max_work`, fast up to `FAST_MAX_WORK`, else optimized; a forced effort applies as is
    (minimal and fast only on a CPU)."""
    chosen = effort()
    if chosen == "auto":
        chosen = "minimal" if work <= minimal_max_work else "fast" if work <= FAST_MAX_WORK else "optimized"
    return chosen if jax.default_backend() == "cpu" else "optimized"


def options(level_: str) -> dict | None:
    """`jax.jit(compiler_options=...)` of a program compiled at `level_` (one of `LEVELS`)."""
    opts = _OPTIONS[level_]
    return None if opts is None else dict(opts)
