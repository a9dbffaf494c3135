"""Loaders for public LLM request traces, with validation that names the problem.

- Azure LLM inference trace 2023 (Splitwise, ISCA 2024; CC-BY 4.0): CSV with columns
  `TIMESTAMP,ContextTokens,GeneratedTokens`. Conversation and code variants.
- Mooncake FAST'25 trace (Apache-2.0): JSONL with `timestamp` (ms), `input_length`,
  `output_length`, `hash_ids` (one id per 512-token prompt block; the last may be partial).
- BurstGPT (HPMLL/BurstGPT, KDD'25; CC-BY 4.0): CSV with columns
  `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type` (BurstGPT_3 adds `Session ID`,
  `Elapsed time`); failed requests are recorded with 0 response tokens.

Optional columns (CSV) or keys (JSONL) in any of them: `slo_class` (one of `clusters.names.CLASSES`: critical,
standard, batch, sheddable, background; BLIS's SLOClass) and `tenant_id` (any text; at most 8 tenants), which
the control plane's gateway reads (`clusters/replicas/control.py`) instead of drawing them from its mixes, and
`adapter_id` (the LoRA adapter a request names, any text; `base` = the base model), which the replicas' adapter
slots read (`clusters/replicas/adapters.py`) instead of drawing adapters.

The files are not bundled: pass a path (the repo's CI reads them from ../shared/data).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import datetime as dt
import gzip
import json
import math
import re
from pathlib import Path

import numpy as np

from jaxroute.errors import JaxrouteError, warn
from jaxroute.workloads.names import MAX_COUNT

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
# the BurstGPT columns read (`Total tokens`, `Log Type` and BurstGPT_3's `Session ID`, `Elapsed time` are not)
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
MOONCAKE_BLOCK_TOKENS = 512
OPTIONAL_COLUMNS = ("slo_class", "tenant_id", "adapter_id")  # class, tenant and LoRA adapter, where a trace has them
BASE_MODEL = "base"  # the adapter_id of a request on the base model
MAX_TENANTS = 8  # clusters/replicas/control.TENANTS


@dataclasses.dataclass(frozen=True)
class Trace:
    """A request trace as host arrays (one entry per request, in arrival order)."""

    name: str
    arrival_s: np.ndarray  # [N] float64, seconds since the first request
    prompt_tokens: np.ndarray  # [N] int64, > 0
    output_tokens: np.ndarray  # [N] int64, > 0
    block_ids: list[np.ndarray] | None = None  # N arrays of int64 prompt-block ids (Mooncake), else None
    model: np.ndarray | None = None  # [N] str, the model each request called (BurstGPT), else None
    slo_class: np.ndarray | None = None  # [N] int64 index in clusters.names.CLASSES (column slo_class), else None
    tenant: np.ndarray | None = None  # [N] int64 tenant index (column tenant_id, in order of first appearance)
    tenant_names: tuple[str, ...] = ()  # the tenant ids, by index
    adapter: np.ndarray | None = None  # [N] int64 LoRA adapter index (column adapter_id, by first appearance; -1 = base)
    adapter_names: tuple[str, ...] = ()  # the adapter ids, by index

    def __len__(self) -> int:
        return len(self.arrival_s)

    def head(self, n: int) -> Trace:
        """The first n requests."""
        if n < 1:
            raise JaxrouteError(f"need at least 1 request, got {n}")
        cut = lambda x: None if x is None else x[:n]
        return dataclasses.replace(self, arrival_s=self.arrival_s[:n], prompt_tokens=self.prompt_tokens[:n],
                                   output_tokens=self.output_tokens[:n], block_ids=cut(self.block_ids),
                                   model=cut(self.model), slo_class=cut(self.slo_class), tenant=cut(self.tenant),
                                   adapter=cut(self.adapter))


def _classes_and_tenants(values: dict[str, list | None], p: Path, lines: list[int]) -> dict:
    """Trace fields of the optional columns (`OPTIONAL_COLUMNS`: a list of the values, or None when absent):
    classes by name, tenants by first appearance; one line naming a bad value."""
    from jaxroute.clusters.names import CLASSES

    out: dict = {}
    if values.get("slo_class") is not None:
        idx = np.empty(len(lines), np.int64)
        for k, (v, line) in enumerate(zip(values["slo_class"], lines, strict=True)):
            name = str(v).strip().lower()
            if name not in CLASSES:
                raise JaxrouteError(f"{p.name} line {line}: slo_class {v!r} is not one of {', '.join(CLASSES)}")
            idx[k] = CLASSES.index(name)
        out["slo_class"] = idx
    if values.get("tenant_id") is not None:
        names = list(dict.fromkeys(str(v).strip() for v in values["tenant_id"]))
        if len(names) > MAX_TENANTS:
            raise JaxrouteError(f"{p.name}: {len(names)} tenants in column tenant_id; the gateway tells at most "
                                f"{MAX_TENANTS} apart")
        where = {n: i for i, n in enumerate(names)}
        out["tenant"] = np.array([where[str(v).strip()] for v in values["tenant_id"]], np.int64)
        out["tenant_names"] = tuple(names)
    if values.get("adapter_id") is not None:
        ids = [str(v).strip() for v in values["adapter_id"]]
        names = [n for n in dict.fromkeys(ids) if n != BASE_MODEL]
        where = {n: i for i, n in enumerate(names)}
        out["adapter"] = np.array([where.get(v, -1) for v in ids], np.int64)
        out["adapter_names"] = tuple(names)
    return out


def _optional_csv(rows: list[dict[str, str]], p: Path) -> dict:
    """`_classes_and_tenants` of a CSV's optional columns (an empty cell: an error naming its line)."""
    values = {}
    for c in OPTIONAL_COLUMNS:
        if c in rows[0]:
            empty = next((i for i, r in enumerate(rows) if not (r.get(c) or "").strip()), None)
            if empty is not None:
                raise JaxrouteError(f"{p.name} line {empty + 2}: empty value in column {c}")
            values[c] = [r[c] for r in rows]
    return _classes_and_tenants(values, p, list(range(2, len(rows) + 2)))


def _open_nonempty(path: str | Path, what: str = "trace file") -> Path:
    """`path`, a file that is there and not empty (`what` it is names it in the error)."""
    p = Path(path)
    if not p.exists():
        raise JaxrouteError(f"{what} not found: {p}")
    if p.is_dir():
        raise JaxrouteError(f"{what} {p} is a folder; name a file")
    if p.stat().st_size == 0:
        raise JaxrouteError(f"{what} is empty: {p}")
    return p


GZIP_MAGIC = b"\x1f\x8b"


@contextlib.contextmanager
def _text(p: Path):
    """A trace file's lines, gzip-compressed or not (the public traces ship as .csv.gz; told by the magic bytes),
    with a file that is not UTF-8 text or not valid gzip refused in one line."""
    with p.open("rb") as raw:
        packed = raw.read(2) == GZIP_MAGIC
    try:
        with (gzip.open(p, "rt", newline="", encoding="utf-8") if packed else
              p.open(newline="", encoding="utf-8")) as f:
            yield f
    except UnicodeDecodeError:
        raise JaxrouteError(f"{p.name}: not a UTF-8 text file{' (after gunzip)' if packed else ''}") from None
    except (gzip.BadGzipFile, EOFError) as e:
        raise JaxrouteError(f"{p.name}: not a whole gzip file ({e})") from None


def _stem(p: Path) -> str:
    """The trace's name: the file name less its extensions (`conv.csv.gz` -> `conv`)."""
    name = p.name[:-3] if p.name.lower().endswith(".gz") else p.name
    return Path(name).stem


def _check_lengths(values: list, column: str, path: Path, first_line: int, minimum: int = 1) -> np.ndarray:
    """Lengths must be finite integers >= `minimum`: 1 (a zero-token prompt or output is not a request),
    or 0 for a loader that drops such rows itself."""
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
            raise JaxrouteError(f"{where}: column '{column}' is negative ({v}); lengths must be >= {minimum}")
        if f < minimum or f != int(f):
            raise JaxrouteError(f"{where}: column '{column}' is {v!r}; lengths must be whole numbers >= {minimum}")
        if f > MAX_COUNT:
            raise JaxrouteError(f"{where}: column '{column}' is {v!r}; at most {MAX_COUNT:,} tokens (an int32 count)")
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


_OFFSET = re.compile(r"Z$|([+-])(\d{2}):?(\d{2})$")


def _parse_azure_time(text: str) -> float:
    """Azure timestamps: 2023's `2023-11-16 18:15:46.6805900` (naive, read as UTC, 7 fractional digits) and
    2024's `2024-05-10 00:00:00.009930+00:00` (a UTC offset, 6 digits; the one-week traces of
    Azure/AzurePublicDataset's dataset-llm-2024 release, same columns)."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    m = _OFFSET.search(text)
    offset_s = 0.0
    if m:
        text = text[:m.start()]
        if m.group(0) != "Z":
            sign = -1.0 if m.group(1) == "-" else 1.0
            offset_s = sign * (int(m.group(2)) * 3600 + int(m.group(3)) * 60)
    base, _, frac = text.partition(".")
    try:
        t = dt.datetime.strptime(base, "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC).timestamp()
        f = float("0." + frac) if frac else 0.0
        if frac and not frac.isdigit():
            raise ValueError(frac)
    except ValueError:
        raise JaxrouteError(f"cannot parse timestamp {text!r}; expected 'YYYY-MM-DD HH:MM:SS.fffffff', "
                            "optionally with a UTC offset such as +00:00") from None
    return t + f - offset_s


def _read_csv(p: Path, columns: tuple[str, ...], kind: str) -> list[dict[str, str]]:
    """The rows of a CSV with a header holding `columns` (row i is on line i + 2), each with a value in every
    one of them; `kind` names the format in the error ("an Azure trace")."""
    with _text(p) as f:
        reader = csv.DictReader(f)
        header = [h.strip() for h in (reader.fieldnames or [])]
        missing = [c for c in columns if c not in header]
        if missing:
            raise JaxrouteError(f"{p.name}: missing column(s) {', '.join(missing)}; {kind} needs {','.join(columns)}")
        rows = [{k.strip(): v for k, v in r.items() if k is not None} for r in reader]
    if not rows:
        raise JaxrouteError(f"{p.name}: has a header but no requests")
    for i, r in enumerate(rows):
        empty = [c for c in columns if r.get(c) in (None, "")]
        if empty:
            raise JaxrouteError(f"{p.name} line {i + 2}: empty value in column(s) {', '.join(empty)}")
    return rows


def load_azure_csv(path: str | Path) -> Trace:
    """Load an Azure LLM 2023 CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`)."""
    p = _open_nonempty(path)
    rows = _read_csv(p, AZURE_COLUMNS, "an Azure trace")
    times = np.array([_parse_azure_time(r["TIMESTAMP"]) for r in rows], dtype=np.float64)
    _check_sorted(times, p, 2)
    prompt = _check_lengths([r["ContextTokens"] for r in rows], "ContextTokens", p, 2)
    output = _check_lengths([r["GeneratedTokens"] for r in rows], "GeneratedTokens", p, 2)
    return Trace(_stem(p), times - times[0], prompt, output, None, **_optional_csv(rows, p))


def jsonl_objects(p: Path, lines, required: tuple[str, ...], kind: str = "key(s)") -> list[tuple[int, dict]]:
    """(line number, object) of each non-blank JSON line, every one an object with the `required` keys."""
    recs = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise JaxrouteError(f"{p.name} line {i}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise JaxrouteError(f"{p.name} line {i}: expected a JSON object")
        missing = [k for k in required if k not in obj]
        if missing:
            raise JaxrouteError(f"{p.name} line {i}: missing {kind} {', '.join(missing)}")
        recs.append((i, obj))
    return recs


def _timestamp(p: Path, line: int, value) -> float:
    """A JSON record's timestamp as a float (None: NaN, refused as not finite by `_check_sorted`)."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise JaxrouteError(f"{p.name} line {line}: timestamp is {value!r}; expected a number (milliseconds)")
    return float(value)


def load_mooncake_jsonl(path: str | Path) -> Trace:
    """Load a Mooncake JSONL trace (`timestamp` ms, `input_length`, `output_length`, `hash_ids`)."""
    p = _open_nonempty(path)
    with _text(p) as f:
        recs = jsonl_objects(p, f, MOONCAKE_KEYS, "key(s)")
    if not recs:
        raise JaxrouteError(f"{p.name}: contains no requests")
    first = recs[0][0]
    times = np.array([_timestamp(p, i, o["timestamp"]) for i, o in recs]) / 1000.0
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
    values = {}
    for key in OPTIONAL_COLUMNS:
        have = [key in o for _, o in recs]
        if any(have) and not all(have):
            i = recs[have.index(False)][0]
            raise JaxrouteError(f"{p.name} line {i}: missing key {key} (other lines have it)")
        values[key] = [o[key] for _, o in recs] if all(have) else None
    return Trace(_stem(p), times - times[0], prompt, output, blocks, **_classes_and_tenants(values, p, [i for i, _ in recs]))


def load_burstgpt_csv(path: str | Path, model: str | None = None) -> Trace:
    """Load a BurstGPT CSV (HPMLL/BurstGPT: `data/BurstGPT_1.csv`, release files `BurstGPT_[without_fails_]N.csv`).

    Columns, from the repo's README.md "## Schema" (lines 39-48 @e92f533): `Timestamp` is the submission
    time in seconds from 0:00:00 of the first day (here made relative to the first request); `Model` is
    `ChatGPT` (GPT-3.5) or `GPT-4`; `Request tokens` / `Response tokens` are the prompt / output lengths;
    `Total tokens` (their sum), `Log Type` (`Conversation log` or `API log`) and BurstGPT_3's `Session ID`,
    `Elapsed time` are not read. README.md lines 25-35: the `BurstGPT_N.csv` files hold failed requests
    "with some failure that `Response tokens` are `0`s" (the `_without_fails_` files leave them out); among
    BurstGPT_1.csv's first 50 rows (Hugging Face copy lzzmm/BurstGPT) are failures with 0 request tokens too.

    A request with 0 response or 0 request tokens is dropped, with one warning giving the counts (no
    request is left: an error). `model` keeps only that model's requests (one of those present, else an
    error listing them). The model of each request is kept in `Trace.model`.
    """
    p = _open_nonempty(path)
    rows = _read_csv(p, BURSTGPT_COLUMNS, "a BurstGPT trace")
    times = np.empty(len(rows), dtype=np.float64)
    for i, r in enumerate(rows):
        try:
            times[i] = float(r["Timestamp"])
        except ValueError:
            raise JaxrouteError(f"{p.name} line {i + 2}: column 'Timestamp' is not a number: {r['Timestamp']!r}") from None
    _check_sorted(times, p, 2)
    prompt = _check_lengths([r["Request tokens"] for r in rows], "Request tokens", p, 2, minimum=0)
    output = _check_lengths([r["Response tokens"] for r in rows], "Response tokens", p, 2, minimum=0)
    models = np.array([r["Model"].strip() for r in rows])
    keep = np.ones(len(rows), dtype=bool)
    if model is not None:
        present = list(dict.fromkeys(models.tolist()))
        if model not in present:
            raise JaxrouteError(f"{p.name}: no requests of model '{model}'; the trace has: {', '.join(present)}")
        keep = models == model
    failed, empty = keep & (output == 0), keep & (output > 0) & (prompt == 0)
    if failed.any() or empty.any():
        of = f"{int(keep.sum())} requests" + ("" if model is None else f" of model '{model}'")
        why = f"{int(failed.sum())} failed (0 response tokens) and {int(empty.sum())} with 0 request tokens"
        keep &= ~(failed | empty)
        if not keep.any():
            raise JaxrouteError(f"{p.name}: nothing is left of its {of} once the {why} are dropped")
        warn(f"{p.name}: dropped {int((failed | empty).sum())} of its {of}: {why}")
    t = times[keep]
    extra = _optional_csv(rows, p)
    for k in ("slo_class", "tenant", "adapter"):
        if k in extra:
            extra[k] = extra[k][keep]
    return Trace(_stem(p), t - t[0], prompt[keep], output[keep], None, models[keep], **extra)


def _csv_loader(p: Path):
    """The loader of a CSV trace by its header: any Azure column -> Azure, any BurstGPT column -> BurstGPT
    (the loader then names the columns missing); neither -> an error naming both headers."""
    with _text(p) as f:
        header = {h.strip() for h in next(csv.reader(f), [])}
    if header & set(AZURE_COLUMNS):
        return load_azure_csv
    if header & set(BURSTGPT_COLUMNS):
        return load_burstgpt_csv
    raise JaxrouteError(f"{p.name}: the header is neither an Azure trace's ({','.join(AZURE_COLUMNS)}) nor a "
                        f"BurstGPT trace's ({','.join(BURSTGPT_COLUMNS)},...)")


def load_trace(path: str | Path) -> Trace:
    """Load a trace: `.jsonl` (Mooncake), or `.csv` (Azure or BurstGPT, told apart by the header), each also
    gzip-compressed (`.csv.gz`, `.jsonl.gz`)."""
    name = Path(path).name.lower()
    suffix = Path(name[:-3] if name.endswith(".gz") else name).suffix
    if suffix == ".csv":
        p = _open_nonempty(path)
        return _csv_loader(p)(p)
    if suffix in (".jsonl", ".json"):
        return load_mooncake_jsonl(path)
    raise JaxrouteError(f"unknown trace format '{suffix}' for {path}; expected .csv (Azure or BurstGPT) or "
                        ".jsonl (Mooncake), either optionally .gz")


def load_named(name: str, path: str | Path) -> Trace:
    """The trace of a trace workload (`workloads.names.TRACE_WORKLOADS`) from its file."""
    loaders = {"mooncake": load_mooncake_jsonl, "burstgpt": load_burstgpt_csv}
    return loaders.get(name, load_azure_csv)(path)
