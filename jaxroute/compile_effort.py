"""How hard XLA works on a program: a small job compiles fast, a long one compiles for speed.

On CPU most of a small simulation's time is XLA compiling it. XLA's older CPU emitters
(`xla_cpu_use_fusion_emitters=False`) compile a model's program in 20-40 % less time, and may run it up
to ~30 % slower. So a program whose whole job is small (rows x events, `work`) is compiled with them,
and a long job keeps the default. Either way the results are the same (the suite's exact-match tests
run on both). `scripts/calibrate_compile_effort.py` measures the break-even per model; `FAST_MAX_WORK`
sits below the smallest. Other backends (GPU) always get the default.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax

from jaxroute.errors import JaxrouteError

EFFORTS = ("auto", "fast", "optimized")
# Row-events a program may have to run and still compile fast. The calibration script measured the break-even
# at 6.9 M (dispatch), 7.0 M (the replica cluster) and never (decode: both ran as fast); at 2 M the slower run
# costs at most ~30 % of the compile seconds saved.
FAST_MAX_WORK = 2_000_000
FAST_OPTIONS = {"xla_cpu_use_fusion_emitters": False}
_EFFORT = ["auto"]


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


def is_fast(work: int) -> bool:
    """Whether a program whose job is `work` row-events compiles fast (on CPU)."""
    effort = _EFFORT[0]
    if effort == "auto":
        effort = "fast" if work <= FAST_MAX_WORK else "optimized"
    return effort == "fast" and jax.default_backend() == "cpu"


def options(fast: bool) -> dict | None:
    """`jax.jit(compiler_options=...)` of a program compiled fast or not."""
    return dict(FAST_OPTIONS) if fast else None
