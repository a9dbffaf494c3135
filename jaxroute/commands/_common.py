"""Argument helpers shared by the CLI commands."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence

from jaxroute.errors import JaxrouteError


def csv_list(text: str) -> list[str]:
    """Split `a,b, c` into ['a', 'b', 'c'] (empty items dropped)."""
    return [t.strip() for t in text.split(",") if t.strip()]


def choose(names: Sequence[str], allowed: Sequence[str], what: str) -> list[str]:
    """Lower-case and validate a list of names against the allowed ones."""
    out = []
    for n in names:
        key = n.lower()
        if key not in allowed:
            raise JaxrouteError(f"unknown {what} '{n}'; choose from: {', '.join(allowed)}")
        out.append(key)
    if not out:
        raise JaxrouteError(f"no {what} given; choose from: {', '.join(allowed)}")
    return out


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def int_arg(text, flag: str, minimum: int) -> int:
    """Parse an integer flag value, or raise a JaxrouteError naming the flag."""
    try:
        v = int(text)
    except (TypeError, ValueError):
        raise JaxrouteError(f"{flag} expects an integer, got '{text}'") from None
    if v < minimum:
        raise JaxrouteError(f"{flag} must be >= {minimum}, got {v}")
    return v


def float_arg(text, flag: str, minimum: float = -math.inf) -> float:
    """Parse a finite number flag value (>= minimum), or raise a JaxrouteError naming the flag."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise JaxrouteError(f"{flag} expects a number, got '{text}'") from None
    if not math.isfinite(v) or v < minimum:
        bound = "" if minimum == -math.inf else f" >= {minimum}"
        raise JaxrouteError(f"{flag} must be a finite number{bound}, got '{text}'")
    return v


def add_output_args(p: argparse.ArgumentParser, plot: bool = True) -> None:
    p.add_argument("--out", metavar="PATH.json", help="write results JSON (and a CSV beside it)")
    if plot:
        p.add_argument("--plot", metavar="PATH.png", help="write a PNG plot")
    p.add_argument("--allow-overflow", action="store_true",
                   help="print tables even when a fixed capacity overflowed (default: refuse with an error)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def show_progress(args) -> bool:
    return not getattr(args, "no_progress", False) and os.environ.get("JAXROUTE_NO_PROGRESS") != "1"


def check_overflow(records, args, hint: str) -> None:
    """Refuse (error) when any record overflowed, unless --allow-overflow."""
    bad = [r.policy for r in records if r.overflow]
    if bad and not getattr(args, "allow_overflow", False):
        raise JaxrouteError(f"a fixed capacity overflowed in: {', '.join(bad)}. {hint} "
                            "(or pass --allow-overflow to print anyway)")


def warn(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr)
