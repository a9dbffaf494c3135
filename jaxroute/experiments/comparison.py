"""One comparison: rows of (label, params) on common seeds in one compiled grid, with paired CIs.

`sim.run_grid` gives seed s the same PRNG key in every row (common random numbers), so the
per-seed difference between two rows is a paired comparison; `paired_difference` summarises
it with the same Student-t interval as `metrics.summarize`. `run_with_retry` reruns a
comparison with larger fixed capacities while one of them overflowed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxroute import report, sim
from jaxroute.errors import JaxrouteError, LostRequests
from jaxroute.metrics import Summary, summarize

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Row:
    """One configuration: a label, its traced params and a JSON description (the record's params)."""

    label: str
    params: PyTree
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def as_row(row: Row | tuple) -> Row:
    """A Row from a Row, a (label, params) pair or a (label, params, info) triple."""
    return row if isinstance(row, Row) else Row(*row)


@dataclasses.dataclass
class Results:
    """A comparison's outcome: one Record per row (mean, 95 % CI over seeds) and the raw grid."""

    rows: list[Row]
    grid: sim.GridResult
    records: list[report.Record]
    model: Any

    @property
    def metrics(self) -> dict[str, np.ndarray]:
        """Per-seed metrics, name -> [rows, seeds, ...]."""
        return self.grid.metrics

    @property
    def labels(self) -> list[str]:
        return [r.label for r in self.rows]

    def index(self, label: str | int) -> int:
        """Row index of a label (an int is returned as is)."""
        if isinstance(label, (int, np.integer)):
            return int(label)
        try:
            return self.labels.index(label)
        except ValueError:
            raise JaxrouteError(f"no row '{label}'; rows: {', '.join(self.labels)}") from None

    def record(self, label: str | int) -> report.Record:
        return self.records[self.index(label)]


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Rows of (label, params) run by `model` on the same `seeds` seeds in one compiled grid.

    metrics: names summarised into each record; chunk: events per compiled scan chunk
    (None: one scan); progress: a tqdm bar (a string names it).
    """

    model: sim.Model
    rows: Sequence[Row | tuple]
    seeds: int
    metrics: Sequence[str]
    workload: PyTree = None
    seed: int = 0
    chunk: int | None = None
    progress: bool | str = False

    def run(self) -> Results:
        rows = [as_row(r) for r in self.rows]
        if not rows:
            raise JaxrouteError("a comparison needs at least one row")
        params = sim.stack_params([r.params for r in rows])
        try:
            grid = sim.run_grid(self.model, jax.random.key(self.seed), self.workload, params, self.seeds,
                                chunk=self.chunk, progress=self.progress)
        except LostRequests as e:  # name the rows by their labels
            raise LostRequests(e.what, [rows[c].label for c in e.rows], e.worst) from None
        records = report.records_from_grid(grid, [(r.label, dict(r.info)) for r in rows], self.metrics)
        return Results(rows, grid, records, self.model)


def _per_seed(source: Results | sim.GridResult, metric: str, row: str | int) -> np.ndarray:
    """[S] values of one row (extra axes averaged, as `summarize` does)."""
    grid = source.grid if isinstance(source, Results) else source
    if isinstance(row, str) and not isinstance(source, Results):
        raise JaxrouteError(f"row '{row}' is a label: pass the comparison's Results, not a bare grid")
    c = source.index(row) if isinstance(source, Results) else int(row)
    v = np.asarray(grid.metrics[metric][c], dtype=np.float64)
    return v.reshape(len(v), -1).mean(axis=1)


def paired_difference(source: Results | sim.GridResult, metric: str, row_a: str | int, row_b: str | int, *,
                      relative: bool = False, seeds: slice | None = None) -> Summary:
    """Mean and 95 % t interval of the per-seed difference a - b (common seeds, so paired).

    relative: the per-seed change 100 * (a / b - 1) in percent instead. seeds: a subset of seeds.
    Rows are labels (with Results) or indices.
    """
    a, b = _per_seed(source, metric, row_a), _per_seed(source, metric, row_b)
    if seeds is not None:
        a, b = a[seeds], b[seeds]
    if not relative:
        return summarize(a - b)
    return summarize(100.0 * (a / np.where(b == 0, 1e-12, b) - 1.0))


def _flag_set(result: Any, metric: str) -> bool:
    metrics = result.metrics
    if metric not in metrics:
        raise JaxrouteError(f"run_with_retry: the result has no overflow metric '{metric}'")
    return bool(np.any(np.asarray(metrics[metric])))


def run_with_retry(run: Callable[[dict[str, int]], Any], capacities: Mapping[str, int], flags: Mapping[str, str],
                   max_tries: int = 4, *, growth: float = 2.0, strict: bool = False) -> tuple[Any, dict[str, int]]:
    """Run `run(capacities)`, growing each capacity whose overflow flag is set, up to max_tries runs.

    flags maps a capacity name to the bool metric that says it overflowed (in any row or seed);
    each overflowed capacity is multiplied by `growth` (2: doubled) before the next run. After
    max_tries the last result comes back with its overflow flag still set and a warning (or a
    JaxrouteError with strict). Returns (result, final capacities). The result needs `.metrics`.
    """
    if max_tries < 1:
        raise ValueError(f"max_tries must be >= 1, got {max_tries}")
    caps = dict(capacities)
    for attempt in range(1, max_tries + 1):
        result = run(dict(caps))
        full = [name for name, flag in flags.items() if _flag_set(result, flag)]
        if not full:
            return result, caps
        if attempt == max_tries:
            break
        sim.discard_grid(result.metrics)  # superseded by the rerun
        for name in full:
            grown = max(caps[name] + 1, int(caps[name] * growth))
            report.warn(f"capacity {name} = {caps[name]} overflowed ({flags[name]}); rerunning with {grown}")
            caps[name] = grown
    msg = (f"capacity {', '.join(f'{n} = {caps[n]}' for n in full)} still overflowed after {max_tries} "
           f"{'try' if max_tries == 1 else 'tries'}; the results are flagged as overflow")
    if strict:
        raise JaxrouteError(msg)
    if max_tries > 1:
        report.warn(msg)
    return result, caps


def conservation_failures(results: Results | sim.GridResult, labels: Sequence[str] | None = None) -> list[str]:
    """Labels (or indices) of rows where some seed lost or invented requests: arrived != completed + in flight
    + dropped by a full capacity (each model counts the requests a full capacity refused, so an overflowed seed
    is checked like any other: a lost request is never excused as an overflow)."""
    grid = results.grid if isinstance(results, Results) else results
    if labels is None:
        labels = results.labels if isinstance(results, Results) else [str(c) for c in range(grid.n_configs)]
    return [labels[c] for c in grid.lost_rows()]
