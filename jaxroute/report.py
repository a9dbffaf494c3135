"""Results convention (docs/architecture.md): one JSON object per command, a CSV beside it, a printed table, PNG plots."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxroute import output_paths
from jaxroute.errors import warn  # noqa: F401  (report.warn)
from jaxroute.metrics import Summary, summarize


@dataclasses.dataclass
class Record:
    """One result row: a policy under one traced configuration, summarised over seeds."""

    policy: str
    params: dict[str, Any]
    overflow: bool
    metrics: dict[str, Summary]

    def as_json(self) -> dict:
        return {
            "policy": self.policy,
            "params": jsonable(self.params),
            "overflow": bool(self.overflow),
            "metrics": {k: v.as_json() for k, v in self.metrics.items()},
        }


def records_from_grid(grid, labels: Sequence[tuple[str, dict]], metric_names: Sequence[str]) -> list[Record]:
    """Build one Record per config row of a `sim.GridResult`; labels[c] = (policy, params)."""
    out = []
    for c, (policy, params) in enumerate(labels):
        ms = {m: summarize(np.asarray(grid.metrics[m][c], dtype=np.float64)) for m in metric_names}
        out.append(Record(policy, dict(params), bool(grid.overflow[c]), ms))
    return out


def jsonable(x: Any) -> Any:
    """Plain-Python copy of x for JSON: arrays to lists, numpy scalars to Python, NaN/inf to None."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        f = float(x)
        return f if math.isfinite(f) else None
    if isinstance(x, np.bool_):
        return bool(x)
    if hasattr(x, "item") and callable(x.item) and np.ndim(x) == 0:
        return jsonable(x.item())
    return x


def write_json(path: str | Path, obj: Any) -> Path:
    """Write any results object as indented JSON (parents created); returns the path."""
    return output_paths.write_text(path, json.dumps(jsonable(obj), indent=1))


def results_json(command: str, config: dict, records: Sequence[Record], extra: Mapping[str, Any] | None = None) -> dict:
    """The convention's object; `extra`: a command's further keys after the results (curves, ...)."""
    return {"command": command, "config": jsonable(config), "results": [r.as_json() for r in records],
            **jsonable(dict(extra or {}))}


def write_results(path: str | Path, command: str, config: dict, records: Sequence[Record],
                  extra: Mapping[str, Any] | None = None) -> Path:
    """Write the results JSON and a long-format CSV (one row per result x metric) beside it."""
    path = Path(path)
    with output_paths.atomic(path) as f:
        json.dump(results_json(command, config, records, extra), f, indent=1)
    with output_paths.atomic(path.with_suffix(".csv"), newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", "params", "overflow", "metric", "mean", "ci95_lo", "ci95_hi", "n_seeds"])
        for r in records:
            for name, s in r.metrics.items():
                w.writerow([r.policy, json.dumps(jsonable(r.params)), r.overflow, name, s.mean, s.lo, s.hi, len(s.per_seed)])
    return path


def fmt_ci(s: Summary, digits: int = 3) -> str:
    """`mean ± half-width` with a sensible number of significant digits; "–" when no seed has a value, and the
    seeds it is over when some have none (`metrics.summarize_present`)."""
    if not math.isfinite(s.mean):
        return "–"
    if s.seeds < len(s.per_seed):
        return f"{fmt_ci(dataclasses.replace(s, per_seed=()), digits)} ({s.seeds}/{len(s.per_seed)} seeds)"
    if s.mean == 0 and s.half_width == 0:
        return "0 ± 0"
    mag = max(abs(s.mean), abs(s.half_width), 1e-12)
    if mag >= 1000:
        return f"{s.mean:,.0f} ± {s.half_width:,.0f}"
    decimals = max(0, digits - 1 - int(math.floor(math.log10(mag))))
    return f"{s.mean:.{decimals}f} ± {s.half_width:.{decimals}f}"


def format_table(records: Sequence[Record], metric_names: Sequence[str], label=None, extra: dict | None = None) -> str:
    """A fixed-width table: one row per record, `mean ± CI95 half-width` per metric.

    label(record) -> str names the row (default: policy). extra maps a column title to
    a function record -> str for additional columns (e.g. relative gains).
    """
    label = label or (lambda r: r.policy)
    extra = extra or {}
    header = ["policy"] + list(metric_names) + list(extra)
    rows = []
    for r in records:
        cells = [label(r) + (" (OVERFLOW)" if r.overflow else "")]
        cells += [fmt_ci(r.metrics[m]) for m in metric_names]
        cells += [fn(r) for fn in extra.values()]
        rows.append(cells)
    return text_table(header, rows)


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A fixed-width, left-aligned text table: the header, a rule, then the rows (cells already formatted)."""
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def log_scale(ax, axis: str = "y") -> None:
    """A log axis labelled in plain numbers (2, 5, 10, 20 rather than 2x10^0): minor ticks at 2, 3 and 5 x 10^k
    are labelled when the axis spans under 30x, and every minor tick under 3x, so a narrow log range still shows
    its values."""
    from matplotlib.ticker import FuncFormatter

    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    scale_axis = ax.yaxis if axis == "y" else ax.xaxis
    limits = ax.get_ylim if axis == "y" else ax.get_xlim

    def minor(value: float, _pos) -> str:
        lo, hi = sorted(limits())
        if lo <= 0 or value <= 0:
            return ""
        if hi / lo < 3:  # under half a decade the locator steps by 0.01 x 10^k: label each step
            return f"{value:.3g}"
        mantissa = round(value / 10 ** np.floor(np.log10(value)), 6)
        return f"{value:g}" if hi / lo < 30 and mantissa in (2, 3, 5) else ""

    scale_axis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    scale_axis.set_minor_formatter(FuncFormatter(minor))


def ci_band(summaries: Sequence[Summary], *, log: bool = False) -> dict[str, list[float]]:
    """y, lo and hi of a line through per-point Summaries of a metric that cannot be negative: the band's lower
    end is cut at 0, or on a log axis at half the mean (a t interval over few seeds can cross 0)."""
    return dict(y=[s.mean for s in summaries], hi=[s.hi for s in summaries],
                lo=[max(s.lo, s.mean / 2 if log else 0.0) for s in summaries])


def bar_plot(records: Sequence[Record], metric_names: Sequence[str], path: str | Path, title: str, *,
             ylabel: str | Mapping[str, str] | None = None, log_if_spread: bool = True,
             ylim: tuple[float, float] | None = None, label=None) -> Path:
    """PNG bar chart: one panel per metric, one bar per record with its 95 % CI as an error bar.

    ylabel: one label for every panel, or {metric: label}; log_if_spread: a log y axis when a panel's positive
    means span more than 20x; label(record) -> str names the bars (default: policy). A metric whose per-seed
    values are all >= 0 has its error bars cut at 0 (a t interval over few seeds can cross it).
    """
    plt = _pyplot()
    label = label or (lambda r: r.policy)
    n = len(metric_names)
    fig, axes = plt.subplots(1, n, figsize=(max(4.2 * n, 5.0), 3.8), squeeze=False)
    names = [label(r) for r in records]
    for ax, metric in zip(axes[0], metric_names, strict=True):
        sums = [r.metrics[metric] for r in records]
        means = [s.mean for s in sums]
        nonneg = all(min(s.per_seed, default=s.mean) >= 0 for s in sums)
        low = [min(s.half_width, s.mean) if nonneg else s.half_width for s in sums]
        ax.bar(range(len(names)), means, yerr=[low, [s.half_width for s in sums]], capsize=3, color="tab:blue")
        ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
        ax.set_title(metric, fontsize=9)
        text = ylabel.get(metric) if isinstance(ylabel, Mapping) else ylabel
        if text:
            ax.set_ylabel(text)
        if ylim is not None:
            ax.set_ylim(*ylim)
        positive = [m for m in means if m > 0]
        if log_if_spread and positive and min(means) > 0 and max(positive) > 20 * min(positive):
            log_scale(ax)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    output_paths.save_figure(fig, path, dpi=120)
    plt.close(fig)
    return Path(path)


PANELS_PER_ROW = 3  # more panels side by side shrink below reading size where a report shows the PNG


def line_plot(panels: Mapping[str, Sequence[dict]], path: str | Path, *, xlabel: str,
              ylabel: str | Mapping[str, str], title: str | None = None, sharey: bool = False,
              xticks: tuple | None = None, ylog=(), xlog: bool = False) -> Path:
    """PNG line chart: one panel per title, PANELS_PER_ROW to a row; each line is a dict of `ax.plot` keywords
    plus x and y. ylabel: one label (on each row's first panel) or {panel title: label}; xticks: (positions, labels) for every panel
    (e.g. categorical x values); ylog: titles of panels on a log y axis; xlog: every panel on a log x axis.

    A line with `vline` instead of x and y is a vertical marker at that x; one with `lo` and `hi`
    also shades that band (e.g. a 95 % CI) in its colour, or draws error bars where a panel has more
    than 6 such lines (overlapping bands hide each other). When the panels label the same lines, or a
    panel labels more than 6, one legend beside the panels replaces the per-panel legends.
    """
    plt = _pyplot()
    cols = min(len(panels), PANELS_PER_ROW)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.8 * rows), sharey=sharey, squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    label_sets = [[line["label"] for line in lines if "label" in line] for lines in panels.values()]
    shared = any(len(labels) > 6 for labels in label_sets) or (
        len(panels) > 1 and len({tuple(labels) for labels in label_sets if labels}) == 1)
    handles: dict[str, Any] = {}
    for ax, (name, lines) in zip(axes.flat, panels.items(), strict=False):
        banded = sum(1 for line in lines if "lo" in line and "hi" in line)
        for line in lines:
            kw = dict(line)
            if "vline" in kw:
                ax.axvline(kw.pop("vline"), color=kw.pop("color", "grey"), lw=kw.pop("lw", 0.8), **kw)
                continue
            lo, hi = kw.pop("lo", None), kw.pop("hi", None)
            (drawn,) = ax.plot(kw["x"], kw["y"], **{k: v for k, v in kw.items() if k not in ("x", "y")})
            if lo is not None and hi is not None:
                if banded > 6:
                    ax.errorbar(kw["x"], kw["y"], yerr=[np.subtract(kw["y"], lo), np.subtract(hi, kw["y"])],
                                fmt="none", ecolor=drawn.get_color(), elinewidth=0.8, capsize=2)
                else:
                    ax.fill_between(kw["x"], lo, hi, color=drawn.get_color(), alpha=0.15, lw=0)
            if "label" in kw:
                handles.setdefault(kw["label"], drawn)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(xlabel)
        if isinstance(ylabel, Mapping):
            ax.set_ylabel(ylabel.get(name, ""))
        if xticks is not None:
            ax.set_xticks(*xticks)
        if name in ylog:
            log_scale(ax)
        if xlog:
            log_scale(ax, "x")
        if not shared and any("label" in line for line in lines):
            ax.legend(fontsize=8)
    if not isinstance(ylabel, Mapping):
        for row in axes:
            row[0].set_ylabel(ylabel)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    if shared and handles:
        fig.legend(list(handles.values()), list(handles), fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    output_paths.save_figure(fig, path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return Path(path)


def heatmap(panels: Mapping[str, tuple[np.ndarray, Sequence[Sequence[str]]]], path: str | Path, *,
            row_labels: Sequence[str], col_labels: Sequence[str], xlabel: str, ylabel: str, cbar_label: str,
            title: str | None = None, marked: tuple[int, int] | None = None) -> Path:
    """PNG heat maps on one diverging colour scale centred on 0: one panel per title, each (values [R, C], the
    text of every cell); `marked` (row, column) outlines one cell in every panel (e.g. a calibrated setting)."""
    plt = _pyplot()
    cols = min(len(panels), PANELS_PER_ROW)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.0 * len(col_labels) * cols + 3, 0.8 * len(row_labels) * rows + 1.6),
                             squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    finite = [v for vals, _ in panels.values() for v in np.ravel(vals) if np.isfinite(v)]
    lim = max([abs(v) for v in finite] + [0.5])  # a map of near-zero cells stays pale
    image = None
    for i, (ax, (name, (vals, text))) in enumerate(zip(axes.flat, panels.items(), strict=False)):
        first = i % cols == 0
        image = ax.imshow(np.asarray(vals, float), cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
        for r, row in enumerate(text):
            for c, cell in enumerate(row):
                ax.text(c, r, cell, ha="center", va="center", fontsize=7)
        if marked is not None:
            ax.add_patch(plt.Rectangle((marked[1] - 0.5, marked[0] - 0.5), 1, 1, fill=False, lw=2, ec="black"))
        ax.set_xticks(range(len(col_labels)), col_labels, fontsize=7)
        ax.set_yticks(range(len(row_labels)), row_labels if first else [], fontsize=7)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        if first:
            ax.set_ylabel(ylabel, fontsize=8)
    fig.colorbar(image, ax=axes.ravel().tolist(), label=cbar_label, shrink=0.8)
    if title:
        fig.suptitle(title, fontsize=10)
    path = Path(path)
    output_paths.save_figure(fig, path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
