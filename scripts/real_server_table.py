"""The README's "How close to a real server" tables, from `jaxroute fit-latency --out` and the BLIS script's JSON.

    jaxroute fit-latency ../shared/data/vllm-h100-inference-perf --out results/fit_latency.json \
        --params-out jaxroute/data/latency/trained.json
    python scripts/blis_real_runs.py --out results/blis_real_runs.json
    python scripts/real_server_table.py results/fit_latency.json results/blis_real_runs.json --stages kubecon

Per run and target: the absolute percent error of the whole-run mean (p90) of the fit in sample, leave one model out,
today's roofline and BLIS's trained-physics model (its `primary_variant`), and the medians over the active runs (and
over those every column has, when they differ). --stages TEXT: then the fit's per-stage errors of the runs whose
name contains TEXT.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

TARGETS = ("ttft_mean", "ttft_p90", "e2e_mean", "e2e_p90", "itl")
NAMES = {"ttft_mean": "TTFT mean", "ttft_p90": "TTFT p90", "e2e_mean": "E2E mean", "e2e_p90": "E2E p90", "itl": "ITL"}


def _load(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        sys.exit(f"real_server_table: error: {p} not found")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        sys.exit(f"real_server_table: error: {p}: not JSON ({e.msg})")


def _blis_errors(blis: dict) -> dict[str, dict[str, float]]:
    runs = blis["variants"][blis["primary_variant"]]["runs"]
    return {r["run"]: {k: 100 * (r["blis"][k] / r["measured"][k] - 1) for k in TARGETS} for r in runs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fit", help="jaxroute fit-latency --out JSON")
    ap.add_argument("blis", nargs="?", default=None, help="scripts/blis_real_runs.py --out JSON (optional)")
    ap.add_argument("--stages", default=None, metavar="TEXT",
                    help="also the per-stage errors of the runs whose name contains TEXT (default: none)")
    args = ap.parse_args(argv)
    fit = _load(args.fit)
    columns = {"fit": fit["in_sample"]["runs"], "roofline": fit["roofline"]["runs"]}
    if fit.get("cross_validation"):
        columns["held out"] = fit["cross_validation"]["runs"]
    if args.blis:
        columns["BLIS"] = {run: {"error_pct": e} for run, e in _blis_errors(_load(args.blis)).items()}
    runs = fit["in_sample"]["runs"]
    order = ["fit", "held out", "roofline", "BLIS"]
    cols = [c for c in order if c in columns]
    print("| run | " + " | ".join(f"{NAMES[k]} % ({' / '.join(cols)})" for k in TARGETS) + " |")
    print("|---|" + "---|" * len(TARGETS))
    active = [r for r, v in runs.items() if not v["overloaded"]]
    for run, v in runs.items():
        name = run.split("-", 2)[-1] + (" (overloaded)" if v["overloaded"] else "")
        cells = []
        for k in TARGETS:
            vals = [columns[c][run]["error_pct"][k] if run in columns[c] else None for c in cols]
            cells.append(" / ".join("–" if x is None else f"{x:+.1f}" for x in vals))
        print(f"| {name} | " + " | ".join(cells) + " |")
    common = [r for r in active if all(r in columns[c] for c in cols)]
    for label, use in ((f"{len(active)} active runs", active), (f"the {len(common)} active runs every column has", common)):
        if label.startswith("the") and len(common) == len(active):
            break
        cells = []
        for k in TARGETS:
            meds = []
            for c in cols:
                xs = [abs(columns[c][r]["error_pct"][k]) for r in use if r in columns[c]]
                meds.append(f"{statistics.median(xs):.1f}" if xs else "–")
            cells.append(" / ".join(meds))
        print(f"| **median \\|error\\|, {label}** | " + " | ".join(cells) + " |")
    if args.stages:
        print("\n| run / stage | req/s | " + " | ".join(f"{NAMES[k]} % (fit)" for k in TARGETS) + " |")
        print("|---|---|" + "---|" * len(TARGETS))
        for st in fit["stages"]:
            if args.stages in st["run"]:
                print(f"| {st['run']} / {st['stage']} | {st['rate']:g} | "
                      + " | ".join(f"{st['error_pct'][k]:+.1f}" for k in TARGETS) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
