"""Loaders for public LLM request traces, with validation that names the problem.

- Azure LLM inference trace 2023 (Splitwise, ISCA 2024; CC-BY 4.0): CSV with columns
  `TIMESTAMP,ContextTokens,GeneratedTokens`. Conversation and code variants.
- Mooncake FAST'25 trace (Apache-2.0): JSONL with `timestamp` (ms), `input_length`,
  `output_length`, `hash_ids` (one id per 512-token prompt block; the last may be partial).

The files are not bundled: pass a path (the repo's CI reads them from ../shared/data).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import json
import math
from pathlib import Path

import numpy as np

from jaxroute.errors import JaxrouteError

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
MOONCAKE_BLOCK_TOKENS = 512


@dataclasses.dataclass(frozen=True)
class Trace:
    """A request trace as host arrays (one entry per request, in arrival order)."""

    name: str
    arrival_s: np.ndarray  # [N] float64, seconds since the first request
    prompt_tokens: np.ndarray  # [N] int64, > 0
    output_tokens: np.ndarray  # [N] int64, > 0
    block_ids: list[np.ndarray] | None = None  # N arrays of int64 prompt-block ids (Mooncake), else None

    def __len__(self) -> int:
        return len(self.arrival_s)

    def head(self, n: int) -> Trace:
        """The first n requests."""
        if n < 1:
            raise JaxrouteError(f"need at least 1 request, got {n}")
        blocks = None if self.block_ids is None else self.block_ids[:n]
        return Trace(self.name, self.arrival_s[:n], self.prompt_tokens[:n], self.output_tokens[:n], blocks)


def _open_nonempty(path: str | Path) -> Path:
    p = Path(path)
    if not p.exists():
        raise JaxrouteError(f"trace file not found: {p}")
    if p.is_dir():
        raise JaxrouteError(f"trace path is a directory, expected a file: {p}")
    if p.stat().st_size == 0:
        raise JaxrouteError(f"trace file is empty: {p}")
    return p


def _check_lengths(values: list, column: str, path: Path, first_line: int) -> np.ndarray:
    """Lengths must be finite integers >= 1 (a zero-token prompt or output is not a request)."""
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        where = f"{path.name} line {first_line + i}"
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise JaxrouteError(f"{where}: column '{column}' is not a number: {v!r}") from None
        if math.isnan(f) or math.isinf(f):
            raise JaxrouteError(f"{where}: column '{column}' is {v!r}; lengths must be finite")
        if f < 0:
            raise JaxrouteError(f"{where}: column '{column}' is negative ({v}); lengths must be >= 1")
        if f < 1 or f != int(f):
            raise JaxrouteError(f"{where}: column '{column}' is {v!r}; lengths must be whole numbers >= 1")
        out[i] = int(f)
    return out


def _check_sorted(t: np.ndarray, path: Path, first_line: int) -> None:
    if not np.all(np.isfinite(t)):
        bad = int(np.argmax(~np.isfinite(t)))
        raise JaxrouteError(f"{path.name} line {first_line + bad}: timestamp is not finite")
    dec = np.nonzero(np.diff(t) < 0)[0]
    if len(dec):
        i = int(dec[0]) + 1
        raise JaxrouteError(
            f"{path.name} line {first_line + i}: timestamps are not sorted "
            f"({t[i]:.6f} s comes after {t[i - 1]:.6f} s); sort the trace by time first"
        )


def _parse_azure_time(text: str) -> float:
    """Azure timestamps look like `2023-11-16 18:15:46.6805900` (7 fractional digits)."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    base, _, frac = text.partition(".")
    try:
        t = dt.datetime.strptime(base, "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC).timestamp()
    except ValueError:
        raise JaxrouteError(f"cannot parse timestamp {text!r}; expected 'YYYY-MM-DD HH:MM:SS.fffffff'") from None
    return t + (float("0." + frac) if frac else 0.0)


def load_azure_csv(path: str | Path) -> Trace:
    """Load an Azure LLM 2023 CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`)."""
    p = _open_nonempty(path)
    with p.open(newline="") as f:
        reader = csv.DictReader(f)
        header = [h.strip() for h in (reader.fieldnames or [])]
        missing = [c for c in AZURE_COLUMNS if c not in header]
        if missing:
            raise JaxrouteError(
                f"{p.name}: missing column(s) {', '.join(missing)}; an Azure trace needs {','.join(AZURE_COLUMNS)}"
            )
        rows = [{k.strip(): v for k, v in r.items() if k is not None} for r in reader]
    if not rows:
        raise JaxrouteError(f"{p.name}: has a header but no requests")
    for i, r in enumerate(rows):
        empty = [c for c in AZURE_COLUMNS if r.get(c) in (None, "")]
        if empty:
            raise JaxrouteError(f"{p.name} line {i + 2}: empty value in column(s) {', '.join(empty)}")
    times = np.array([_parse_azure_time(r["TIMESTAMP"]) for r in rows], dtype=np.float64)
    _check_sorted(times, p, 2)
    prompt = _check_lengths([r["ContextTokens"] for r in rows], "ContextTokens", p, 2)
    output = _check_lengths([r["GeneratedTokens"] for r in rows], "GeneratedTokens", p, 2)
    return Trace(p.stem, times - times[0], prompt, output, None)


def load_mooncake_jsonl(path: str | Path) -> Trace:
    """Load a Mooncake JSONL trace (`timestamp` ms, `input_length`, `output_length`, `hash_ids`)."""
    p = _open_nonempty(path)
    recs = []
    with p.open() as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise JaxrouteError(f"{p.name} line {i}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise JaxrouteError(f"{p.name} line {i}: expected a JSON object")
            missing = [k for k in MOONCAKE_KEYS if k not in obj]
            if missing:
                raise JaxrouteError(f"{p.name} line {i}: missing key(s) {', '.join(missing)}")
            recs.append((i, obj))
    if not recs:
        raise JaxrouteError(f"{p.name}: contains no requests")
    first = recs[0][0]
    times = np.array([float(o["timestamp"]) if o["timestamp"] is not None else math.nan for _, o in recs]) / 1000.0
    _check_sorted(times, p, first)
    prompt = _check_lengths([o["input_length"] for _, o in recs], "input_length", p, first)
    output = _check_lengths([o["output_length"] for _, o in recs], "output_length", p, first)
    blocks = []
    for (i, o), n_tok in zip(recs, prompt, strict=True):
        ids = o["hash_ids"]
        if not isinstance(ids, list) or not all(isinstance(h, int) and h >= 0 for h in ids):
            raise JaxrouteError(f"{p.name} line {i}: hash_ids must be a list of non-negative integers")
        need = math.ceil(n_tok / MOONCAKE_BLOCK_TOKENS)
        if len(ids) != need:
            raise JaxrouteError(
                f"{p.name} line {i}: {len(ids)} hash_ids for input_length {n_tok}; expected {need} "
                f"({MOONCAKE_BLOCK_TOKENS}-token blocks)"
            )
        blocks.append(np.asarray(ids, dtype=np.int64))
    return Trace(p.stem, times - times[0], prompt, output, blocks)


def load_trace(path: str | Path) -> Trace:
    """Load a trace by file extension: `.csv` (Azure) or `.jsonl` (Mooncake)."""
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        return load_azure_csv(path)
    if suffix in (".jsonl", ".json"):
        return load_mooncake_jsonl(path)
    raise JaxrouteError(f"unknown trace format '{suffix}' for {path}; expected .csv (Azure) or .jsonl (Mooncake)")
