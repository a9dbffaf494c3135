"""CLI plumbing shared by the commands: typed flag converters, the common flags, refusals, output."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Sequence

from jaxroute import report
from jaxroute.errors import JaxrouteError
from jaxroute.report import warn

__all__ = [
    "add_grid_args", "add_output_args", "add_shared_prefix_args", "shared_prefix_settings", "at_least", "check_conservation", "check_overflow", "choose", "csv_list",
    "finite_float", "fraction", "key_values", "list_of", "non_negative_float", "non_negative_int", "off_or", "positive_float",
    "positive_fraction", "positive_int", "probability", "rate_stages", "save_outputs", "show_progress", "warn",
]

# --------------------------------------------------------------------------- typed converters (argparse type=)
# Each raises argparse.ArgumentTypeError; argparse then exits with code 2 and
# "jaxroute CMD: error: argument --flag: expected ..., got 'VALUE'".


def _parse(text: str, kind: type, what: str):
    try:
        v = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {what}, got '{text}'") from None
    if kind is float and not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected {what}, got '{text}'")
    return v


def _checked(kind: type, what: str, ok: Callable[[float], bool]) -> Callable[[str], float]:
    def convert(text: str):
        v = _parse(text, kind, what)
        if not ok(v):
            raise argparse.ArgumentTypeError(f"expected {what}, got '{text}'")
        return v

    return convert


positive_int = _checked(int, "a positive integer", lambda v: v >= 1)
non_negative_int = _checked(int, "an integer >= 0", lambda v: v >= 0)
finite_float = _checked(float, "a finite number", lambda v: True)
positive_float = _checked(float, "a finite number > 0", lambda v: v > 0)
non_negative_float = _checked(float, "a finite number >= 0", lambda v: v >= 0)
probability = _checked(float, "a probability in [0, 1]", lambda v: 0.0 <= v <= 1.0)
fraction = _checked(float, "a fraction in [0, 1)", lambda v: 0.0 <= v < 1.0)
positive_fraction = _checked(float, "a fraction in (0, 1]", lambda v: 0.0 < v <= 1.0)


def at_least(minimum: float) -> Callable[[str], float]:
    """Converter for a finite number >= minimum."""
    return _checked(float, f"a finite number >= {minimum:g}", lambda v: v >= minimum)


def off_or(convert: Callable[[str], float]) -> Callable[[str], float]:
    """Converter that maps 'off' to +inf and anything else through `convert`."""

    def off_or_value(text: str) -> float:
        return math.inf if text.strip().lower() == "off" else convert(text)

    return off_or_value


def on_off(text: str) -> bool:
    """Converter for a switch: 'on' -> True, 'off' -> False."""
    key = text.strip().lower()
    if key not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got '{text}'")
    return key == "on"


def list_of(convert: Callable[[str], object], unique: bool = True) -> Callable[[str], list]:
    """Converter for a comma-separated list of values, each through `convert` (no repeats if unique)."""

    def values(text: str) -> list:
        items = [convert(t) for t in csv_list(text)]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got '{text}'")
        if unique and len(set(items)) != len(items):
            raise argparse.ArgumentTypeError(f"lists a value twice: '{text}'")
        return items

    return values


def key_values(text: str) -> dict[str, float]:
    """'name=number,...' -> {name: number} (e.g. router weights `prefix=3,kv=2,queue=2`)."""
    out = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or not key or not math.isfinite(number):
            raise argparse.ArgumentTypeError(f"expected name=number,... (e.g. prefix=3,kv=2), got '{text}'")
        if key in out:
            raise argparse.ArgumentTypeError(f"names '{key}' twice: '{text}'")
        out[key] = number
    return out


def rate_stages(text: str) -> list[tuple[float, float]]:
    """argparse type: 'RATE:SECONDS,...' (each > 0) -> [(rate, seconds), ...]."""
    stages = []
    for item in text.split(","):
        parts = item.strip().split(":")
        try:
            r, d = (float(x) for x in parts) if len(parts) == 2 else (math.nan, math.nan)
        except ValueError:
            r = d = math.nan
        if not (math.isfinite(r) and math.isfinite(d) and r > 0 and d > 0):
            raise argparse.ArgumentTypeError(f"expected RATE:SECONDS,... with each rate and duration > 0, got '{text}'")
        stages.append((r, d))
    return stages


def csv_list(text: str) -> list[str]:
    """Split `a,b, c` into ['a', 'b', 'c'] (empty items dropped)."""
    return [t.strip() for t in text.split(",") if t.strip()]


def choose(names: Sequence[str], allowed: Sequence[str], what: str) -> list[str]:
    """Lower-case and validate a list of names against the allowed ones (no repeats)."""
    out = []
    for n in names:
        key = n.lower()
        if key not in allowed:
            raise JaxrouteError(f"unknown {what} '{n}'; choose from: {', '.join(allowed)}")
        out.append(key)
    if not out:
        raise JaxrouteError(f"no {what} given; choose from: {', '.join(allowed)}")
    if len(set(out)) != len(out):
        raise JaxrouteError(f"a {what} is listed twice: {', '.join(names)}")
    return out


# --------------------------------------------------------------------------- common flags


def add_output_args(p: argparse.ArgumentParser, plot: bool = True) -> None:
    """--out, --plot, --allow-overflow and --no-progress."""
    p.add_argument("--out", metavar="PATH.json", help="write results JSON (and a CSV beside it) (default: none)")
    if plot:
        p.add_argument("--plot", metavar="PATH.png", help="write a PNG plot (default: none)")
    p.add_argument("--allow-overflow", action="store_true",
                   help="print tables even when a fixed capacity overflowed (default: refuse with an error)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar (default: shown)")


def add_grid_args(p: argparse.ArgumentParser, *, seeds: int, requests: int | None = None,
                  seeds_help: str = "independent runs per row", requests_flag: str = "--requests") -> None:
    """The flags of every grid command: --seeds, --requests (when given a default), --seed and the outputs."""
    p.add_argument("--seeds", type=positive_int, default=seeds, metavar="S", help=f"{seeds_help} (default {seeds})")
    if requests is not None:
        p.add_argument(requests_flag, dest="requests", type=positive_int, default=requests, metavar="N",
                       help=f"requests per run (default {requests})")
    p.add_argument("--seed", type=non_negative_int, default=0, metavar="INT", help="base PRNG seed (default 0)")
    add_output_args(p)


# --sp-* flag (dest) -> shared-prefix setting (defaults: inference-perf's, `workloads.prefix.SP_DEFAULTS`)
SP_FLAGS = {"sp_groups": ("groups", "shared system prompts (groups)"),
            "sp_prompts_per_group": ("prompts_per_group", "questions per group"),
            "sp_system_len": ("system_tokens", "system prompt tokens"),
            "sp_question_len": ("question_tokens", "question tokens"),
            "sp_output_len": ("output_tokens", "output tokens")}


def add_shared_prefix_args(p: argparse.ArgumentParser) -> None:
    """The --sp-* flags of the shared-prefix workload."""
    from jaxroute.workloads.prefix import SP_DEFAULTS

    for dest, (key, what) in SP_FLAGS.items():
        p.add_argument("--" + dest.replace("_", "-"), type=positive_int, default=None, metavar="N",
                       help=f"shared-prefix only: {what} (default {SP_DEFAULTS[key]}, inference-perf's)")


def shared_prefix_settings(args) -> dict:
    """{shared-prefix setting: value} of the --sp-* flags given."""
    return {key: getattr(args, dest) for dest, (key, _) in SP_FLAGS.items() if getattr(args, dest, None) is not None}


def show_progress(args) -> bool:
    return not getattr(args, "no_progress", False) and os.environ.get("JAXROUTE_NO_PROGRESS") != "1"


# --------------------------------------------------------------------------- refusals and output


def check_overflow(records, args, hint: str) -> None:
    """Refuse (error) when any record overflowed, unless --allow-overflow."""
    bad = [r.policy for r in records if r.overflow]
    if bad and not getattr(args, "allow_overflow", False):
        raise JaxrouteError(f"a fixed capacity overflowed in: {', '.join(bad)}. {hint} "
                            "(or pass --allow-overflow to print anyway)")


def check_conservation(results, labels: Sequence[str] | None = None) -> None:
    """Refuse (error, always) when some row lost or invented requests: arrived != completed + in flight."""
    from jaxroute.experiments import conservation_failures

    bad = conservation_failures(results, labels)
    if bad:
        raise JaxrouteError(f"conservation failed (arrived != completed + in flight) in: {', '.join(bad)}; "
                            "this is a simulator bug, please report it")


def save_outputs(args, command: str, config: dict, records, plot: Callable[[str], object] | None = None) -> None:
    """Write --out (JSON and CSV) and --plot (plot(path) draws it) when asked, and say so."""
    if getattr(args, "out", None):
        path = report.write_results(args.out, command, config, records)
        print(f"wrote {path} and {path.with_suffix('.csv')}")
    if plot is not None and getattr(args, "plot", None):
        plot(args.plot)
        print(f"wrote {args.plot}")
