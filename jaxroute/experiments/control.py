"""Control-plane rows of a cluster comparison: autoscalers and gateways as rows of one compiled grid, the model's
static sizes for them, their summary metrics and the plot of ready replicas over time (clusters/replicas/control.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from jaxroute import output_paths, report
from jaxroute.clusters.names import CLASSES, GATES, check_control_names
from jaxroute.clusters.replicas import control as ctl_lib

# summarised into every record of a control-plane comparison
METRICS = ("mean_ready", "peak_ready", "gpu_hours", "cost", "scale_ups", "scale_downs", "shed_fraction",
           "slo_attainment", "goodput_rps")
CLASS_METRICS = ("arrived", "shed_fraction", "ttft_p90_s", "slo_attainment", "goodput_rps")


def class_metric_names(classes: Sequence[str] = CLASSES) -> tuple[str, ...]:
    return tuple(f"class.{c}.{m}" for c in classes for m in CLASS_METRICS)


def variants(scalers: Sequence[str], gates: Sequence[str], n_slots: int, settings: dict) -> list[tuple[str, object]]:
    """(label suffix, ControlParams) for every autoscaler x gate, all with `settings` (control.DEFAULTS' names)."""
    check_control_names(scalers, gates)
    out = []
    for s in scalers:
        for g in gates:
            label = s if len(gates) == 1 and g == "none" else f"{s}+{g}"
            out.append((label, ctl_lib.make(n_slots, scaler=s, gate=g, **settings)))
    return out


def sizes(workload, params: Sequence, spare: float = 3.0) -> dict[str, int]:
    """Static sizes for control rows: ticks (the arrival horizon x `spare`, for the drain, over the shortest
    interval), history (the longest window in ticks), and the scale log (grown on `scale_log_full`)."""
    horizon = 0.0
    for p in params:
        rate = float(np.asarray(p.rate))
        span = workload.n_requests / rate if rate > 0 else float(np.max(np.asarray(workload.table.arrival_s)))
        horizon = max(horizon, span)
    interval = min(float(np.asarray(p.control.interval_s)) for p in params)
    window = max(max(float(np.asarray(p.control.down_window_s)), float(np.asarray(p.control.stable_window_s)))
                 / float(np.asarray(p.control.interval_s)) for p in params)
    return {"control_ticks": int(math.ceil(spare * horizon / interval)) + 64,
            "control_history": int(math.ceil(window)) + 2, "control_log": 256}


def gateway_size(workload, params: Sequence) -> int:
    """Requests each flow-control queue holds: every request (none when no row runs gate flow_control)."""
    flow = GATES.index("flow_control")
    return workload.n_requests if any(int(np.asarray(p.control.gate)) == flow for p in params) else 0


def uses_classes(params: Sequence, workload=None) -> list[str]:
    """The classes of the requests: the trace's column, else those some row draws (a class table is printed
    when there are several)."""
    klass = getattr(getattr(workload, "table", None), "klass", None)
    if klass is not None:
        present = set(np.asarray(klass).tolist())
        return [c for i, c in enumerate(CLASSES) if i in present]
    mix = np.max(np.stack([np.asarray(p.control.class_mix) for p in params]), axis=0)
    return [c for c, share in zip(CLASSES, mix, strict=True) if share > 0]


def ready_plot(results, path: str | Path, title: str, seed: int = 0, stages=None) -> Path:
    """PNG, one panel per row: ready replicas (solid) and billed ones (dotted: provisioning and draining too) over
    time for one seed (the scale log), the load stages' boundaries dashed."""
    from jaxroute.report import _pyplot

    plt = _pyplot()
    m = results.grid.metrics
    labels = list(results.labels)
    cols = 2 if len(labels) > 1 else 1
    rows = -(-len(labels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 1.9 * rows + 0.6), sharex=True, sharey=True,
                             squeeze=False)
    top = max(int(np.max(m["scale.log_billed"])), 1)
    for ax, (c, label) in zip(axes.flat, enumerate(labels), strict=False):  # extra panels are hidden
        n = int(m["scale.log_n"][c, seed])
        t = np.asarray(m["scale.log_t"][c, seed][:n], float)
        t = np.append(t, max(float(m["end_s"][c, seed]), t[-1]))
        for key, style, color in (("scale.log_billed", ":", "tab:grey"), ("scale.log_ready", "-", "tab:blue")):
            y = np.asarray(m[key][c, seed][:n])
            ax.step(t, np.append(y, y[-1]), where="post", linestyle=style, color=color)
        for edge in np.cumsum([d for _, d in stages or []])[:-1]:
            ax.axvline(edge, color="tab:red", linestyle="--", linewidth=0.8)
        ax.set_title(label, fontsize=8)
        ax.set_ylim(0, top + 0.5)
    for ax in axes.flat[len(labels):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("time (s)")
    for ax in axes[:, 0]:
        ax.set_ylabel("replicas")
    fig.suptitle(title + f" (seed {seed}; solid: ready, dotted: billed, dashed: load stages)", fontsize=9)
    fig.tight_layout()
    output_paths.save_figure(fig, path, dpi=110)
    plt.close(fig)
    return Path(path)


def format_tables(records, classes: Sequence[str]) -> str:
    """The control-plane table, and a table per class when the rows draw several."""
    out = ["control plane: mean and peak ready replicas, GPU-hours and their cost, scale events, shed share, "
           "SLO attainment (shed requests miss it) and goodput (requests/s within the SLO)",
           report.format_table(records, METRICS)]
    if len(classes) > 1:
        for c in classes:
            out.append(f"class {c}")
            out.append(report.format_table(records, [f"class.{c}.{m}" for m in CLASS_METRICS]))
    return "\n".join(out)
