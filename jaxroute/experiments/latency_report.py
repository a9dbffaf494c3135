"""The trained latency model's fit to measured runs, reported: per run and target, in sample, held out by model,
beside today's roofline (`jaxroute fit-latency`)."""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path

import numpy as np

from jaxroute import latency_params, real_runs
from jaxroute.errors import JaxrouteError
from jaxroute.experiments import fit_latency as fl
from jaxroute.latency_params import LatencyParams
from jaxroute.report import text_table

SHORT = {"ttft_mean": "TTFT mean", "ttft_p90": "TTFT p90", "e2e_mean": "E2E mean", "e2e_p90": "E2E p90",
         "itl": "ITL"}


def commit() -> str:
    """The package's git commit (with '+dirty' when its tree has changes), or 'unknown'."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "jaxroute"], cwd=root, capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + ("+dirty" if dirty else "")) if head else "unknown"


def _cells(rows: dict[str, dict], *tables: dict[str, dict]) -> list[list[str]]:
    out = []
    for run, v in rows.items():
        cells = [run[16:] if run[:8].isdigit() else run, "overloaded" if v["overloaded"] else v["model"]]
        for k in real_runs.TARGETS:
            errs = [t[run]["error_pct"][k] for t in tables if run in t]
            cells.append(" / ".join(f"{e:+.1f}" for e in errs))
        out.append(cells)
    return out


def _median_cells(label: str, *tables: dict[str, dict]) -> list[str]:
    meds = [fl.medians(t) for t in tables]
    return [label, "median |err|"] + [" / ".join(f"{m[k]:.1f}" for m in meds) for k in real_runs.TARGETS]


def fit_and_report(stages, fitted, *, requests: int, rounds: int, seed: int, start: LatencyParams | None,
                   cv: bool, folders) -> dict:
    """Fit to `fitted` (a subset of `stages`), print the tables, return them (and the params) as a document."""
    rest = [s for s in stages if s not in fitted]
    print(f"fit-latency: {len(stages)} stages of {len({s.run for s in stages})} runs ({len(fitted)} stages fitted, "
          f"{len(rest)} overloaded reported apart; {requests} requests simulated per stage that keeps up)")
    groups = fl.prepare(fitted, requests, seed)
    say = lambda i, cur, lp: print(f"  round {i}: loss {cur:.4g}", flush=True)
    result = fl.fit(fitted, start=start, rounds=rounds, groups=groups, progress=say)
    rest_results = fl.simulate(rest, result.params, fl.prepare(rest, requests, seed)) if rest else []
    order = fitted + rest
    trained = fl.run_errors(order, list(result.results) + rest_results, result.params)
    roofline = fl.run_errors(order, fl.simulate(order, None, fl.prepare(order, requests, seed, "roofline")), None)
    head = ["run", "model"] + [f"{SHORT[k]} % fit / roofline" for k in real_runs.TARGETS]
    rows = _cells(trained, trained, roofline) + [_median_cells("in sample", trained, roofline)]
    print("\nerror of the whole-run means and p90s, simulated vs measured (fit / today's roofline), in sample:")
    print(text_table(head, rows))
    doc = {"command": "fit-latency", "n_stages": len(stages), "fitted_stages": len(fitted), "requests": requests,
           "rounds": rounds, "seed": seed, "loss": list(result.loss), "best_round": result.best_round,
           "params": result.params, "std": dict(zip(latency_params.BASIS + latency_params.ALPHA, result.std,
                                                    strict=True)),
           "in_sample": {"runs": trained, "medians": fl.medians(trained)},
           "roofline": {"runs": roofline, "medians": fl.medians(roofline)},
           "stages": fl.stage_errors(order, list(result.results) + rest_results, result.params),
           "cross_validation": None}
    print("\ncoefficients (standard error):")
    for name, v, sd in zip(latency_params.BASIS + latency_params.ALPHA, result.params.beta + result.params.alpha,
                           result.std, strict=True):
        print(f"  {name:20s} {v:12.5g}  ({sd:.2g})")
    families = {real_runs.model_family(s.model) for s in fitted}
    if cv and len(families) >= 2:
        say_cv = lambda fam, i, cur, lp: print(f"  held out {fam}: round {i}: loss {cur:.4g}", flush=True)
        folds = fl.cross_validate(fitted, groups, rounds=rounds, start=start, progress=say_cv)
        held = {run: v for f in folds.values() for run, v in f["runs"].items()}
        print("\nleave one model out (each model's runs under coefficients fitted to the other models):")
        print(text_table(["run", "model"] + [f"{SHORT[k]} %" for k in real_runs.TARGETS],
                         _cells(held, held) + [_median_cells("held out", held)]))
        doc["cross_validation"] = {"runs": held, "medians": fl.medians(held),
                                   "folds": {k: v["params"] for k, v in folds.items()}}
    prov = {"fitted_to": sorted({s.run for s in fitted}), "gpus": sorted({s.gpu for s in fitted}), "data": sorted({str(Path(f).parent) for f in folders}),
            "stages": len(fitted), "requests_per_stage": requests, "rounds": rounds, "commit": commit(),
            "date": datetime.date.today().isoformat(), "in_sample_median_abs_error_pct": fl.medians(trained),
            "leave_one_model_out_median_abs_error_pct": doc["cross_validation"]["medians"]
            if doc["cross_validation"] else None,
            "std": doc["std"]}
    doc["params"] = LatencyParams(result.params.beta, result.params.alpha, prov)
    return doc


def jsonable(doc: dict) -> dict:
    """The report document with its LatencyParams as JSON."""
    def conv(x):
        if isinstance(x, LatencyParams):
            return x.as_json()
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [conv(v) for v in x]
        if isinstance(x, np.generic):
            return x.item()
        return x
    return conv(doc)


# --------------------------------------------------------------------------- one measured run, compared

COMPARED = ("ttft", "itl", "tpot_reported", "e2e")
STATS = ("mean", "p90", "p99")


def _measured_rows(s: real_runs.Stage) -> dict[str, dict[str, float]]:
    m = s.measured
    return {"ttft": {"mean": m["ttft_mean"], "p90": m["ttft_p90"], "p99": m["ttft_p99"]},
            "itl": {"mean": m["itl"]}, "tpot_reported": {"mean": m["reported_tpot"]},
            "e2e": {"mean": m["e2e_mean"], "p90": m["e2e_p90"], "p99": m["e2e_p99"]}}


def _simulated_rows(p: dict, output_len: int) -> dict[str, dict[str, float]]:
    # the client of these runs counted every streamed token twice (real_runs docstring): its TPOT is the per-token
    # time x (n - 1) / (2 n - 1)
    n = output_len
    return {"ttft": {"mean": p["ttft_mean"], "p90": p["ttft_p90"], "p99": p["ttft_p99"]}, "itl": {"mean": p["itl"]},
            "tpot_reported": {"mean": p["itl"] * (n - 1) / max(2 * n - 1, 1)},
            "e2e": {"mean": p["e2e_mean"], "p90": p["e2e_p90"], "p99": p["e2e_p99"]}}


def compare_run(stages: list[real_runs.Stage], lp: LatencyParams | None, *, requests: int, seed: int) -> dict:
    """Every stage of one run simulated under `lp` (None: the roofline): measured and simulated statistics, their
    errors, the failed shares, and whether each came out overloaded (more than 10 % of requests timed out)."""
    paced = [s for s in stages if not s.client_bound]
    if not paced:
        raise JaxrouteError(f"{stages[0].run}: every stage is client-bound (sent slower than its rate asked): "
                            "nothing to simulate")
    groups = fl.prepare(paced, requests, seed, "trained" if lp else "roofline")
    results = dict(zip((s.index for s in paced), fl.simulate(paced, lp, groups), strict=True))
    rows = []
    for s in stages:
        if s.client_bound:
            rows.append({"stage": s.index, "rate": s.rate, "achieved_rate": s.achieved_rate, "requests": s.requests,
                         "client_bound": True, "measured": _measured_rows(s), "simulated": None, "error_pct": None})
            continue
        r = results[s.index]
        p = fl.predictions(r, lp, s.timeout_s)
        meas, sim = _measured_rows(s), _simulated_rows(p, s.output_len)
        err = {k: {st: 100 * (sim[k][st] / v - 1) for st, v in meas[k].items() if v > 0} for k in meas}
        rows.append({"stage": s.index, "rate": s.rate, "achieved_rate": s.achieved_rate, "requests": s.requests,
                     "client_bound": False, "simulated_requests": len(r.output),
                     "measured": meas, "simulated": sim, "error_pct": err,
                     "measured_failed_pct": 100 * s.failures / s.requests, "simulated_failed_pct": 100 * p["failed"],
                     "measured_overloaded": s.overloaded,
                     "simulated_overloaded": p["failed"] > real_runs.OVERLOAD_FAILURES,
                     "preemptions": r.preemptions})
    whole = fl.run_errors(paced, [results[s.index] for s in paced], lp)[stages[0].run]
    return {"name": stages[0].run, "model": stages[0].model, "tp": stages[0].tp, "gpu": stages[0].gpu,
            "latency_model": "trained" if lp else "roofline", "latency_params": lp, "stages": rows, "run": whole}


def format_run(doc: dict) -> str:
    head = ["stage", "req/s", "metric"] + [f"{st} meas / sim ms (err %)" for st in STATS] + ["failed % meas / sim"]
    lines = []
    for row in doc["stages"]:
        for k in COMPARED:
            cells = [str(row["stage"]), f"{row['rate']:g}", k]
            for st in STATS:
                m = row["measured"][k].get(st)
                if m is None:
                    cells.append("")
                    continue
                if row["client_bound"]:
                    cells.append(f"{m * 1e3:.4g} / client-bound")
                    continue
                sv = row["simulated"][k][st]
                cells.append(f"{m * 1e3:.4g} / {sv * 1e3:.4g} ({row['error_pct'][k].get(st, float('nan')):+.1f})")
            cells.append(f"{row['measured_failed_pct']:.1f} / {row['simulated_failed_pct']:.1f}"
                         if k == "ttft" and not row["client_bound"] else "")
            lines.append(cells)
    w = doc["run"]
    for k in real_runs.TARGETS:
        lines.append(["run", "", k, f"{w['measured'][k] * 1e3:.4g} / {w['simulated'][k] * 1e3:.4g} "
                      f"({w['error_pct'][k]:+.1f})", "", "", ""])
    return text_table(head, lines)


def plot_run(doc: dict, path) -> Path:
    """Measured against simulated per stage: one panel per metric (mean and p90)."""
    from jaxroute import report

    rows = [r for r in doc["stages"] if not r["client_bound"]]
    x = list(range(len(rows)))
    panels = {}
    for k in ("ttft", "itl", "e2e"):
        for st in ("mean", "p90"):
            if st not in rows[0]["measured"][k]:
                continue
            m = [r["measured"][k][st] * 1e3 for r in rows]
            s = [r["simulated"][k][st] * 1e3 for r in rows]
            panels[f"{k} {st} (ms)"] = [{"x": x, "y": m, "label": "measured", "marker": "o", "ls": "none"},
                                        {"x": x, "y": s, "label": f"simulated ({doc['latency_model']})",
                                         "marker": "x", "ls": "none"}]
    labels = [f"{r['stage']}: {r['rate']:g}/s" for r in rows]
    return report.line_plot(panels, path, xlabel="stage", ylabel="ms", title=f"{doc['name']}: measured vs simulated",
                            xticks=(x, labels))
