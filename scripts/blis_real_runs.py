"""BLIS (inference-sim/inference-sim, Go) with its default trained-physics latency model on the 16 real vLLM
runs of /work/shared/data/vllm-h100-inference-perf (inference-sim/training's default_args: 4 models x 4 workloads
on H100 SXM), and its errors against the measurements.

    python scripts/blis_real_runs.py [--blis-bin /tmp/blis/blis] [--data DIR] [--out results/blis_real_runs.json]

BLIS is built with /work/shared/tools/blis/build.sh (binary $BLIS_HOME/blis, sources in $BLIS_HOME/src; BLIS
reads defaults.yaml, the trained coefficients, and hardware_config.json from there). One BLIS process at a time.

How each run is given to BLIS (`blis run`, one simulated vLLM instance):
  * model: the run's HF config.json (--model-config-folder data/model_configs/<name>), --tp, --hardware H100
    (BLIS's bundled entry: 989.5 TFLOP/s dense BF16, 3.35 TB/s, 80 GiB, as in datasheets/h100-sxm.json),
    --max-num-seqs, --max-num-batched-tokens, --max-model-len from exp-config.yaml. KV blocks: BLIS's own
    auto-calculation (gpu_memory_utilization 0.9, block 16, llm-d capacity-planner activation budgets), as vLLM
    sizes them; the value is recorded. Prefix caching is always on in BLIS's KV cache, as in vLLM's default.
    Chunked prefill: the max-num-batched-tokens budget (vLLM's default, no long-prefill threshold).
    Latency model: trained-physics with the coefficients of BLIS's defaults.yaml (no --alpha/--beta flags).
    Request timeout: --timeout 300, the client's (every failed request timed out at 300-301 s); timed-out
    requests count as failures on both sides. --cache-signal-delay 0: same output, 10-20x less CPU.
  * workload: results/config.yaml (inference-perf's own record; profile.yaml disagrees), through BLIS's own
    `inference_perf` workload-spec block: num_groups system prompts of system_prompt_len tokens, each shared by
    num_prompts_per_group clients whose question is fresh random tokens on every request; output_len tokens
    (ignore_eos). The question length is the measured mean prompt length (inference-perf's prompt_len, which
    counts the tokens vLLM received, BOS and re-tokenization included) minus system_prompt_len.
    Each constant-rate stage is one BLIS simulation of rate x duration requests: BLIS's single-stage expansion
    draws inference-perf's arrival process (exponential gaps normalised to the stage duration, exact count);
    its multi-stage expansion would draw plain Poisson arrivals with a random count.
  * variant `prompt-pool` (sensitivity): inference-perf (at the runs' date, commit e60b98d,
    inference_perf/datagen/shared_prefix_datagen.py:98 `i = data.data_index % len(self.prompts)`) does not send
    a fresh question per request: it cycles through the num_groups x num_prompts_per_group fixed prompts, so
    after the first pass vLLM's prefix cache holds whole prompts. Modelled as that many BLIS prefix groups,
    each the whole prompt but its last token, plus one fresh token.
  * variant `as-trained` (diagnostic): the workload exactly as inference-sim/training's runner
    (run_blis_and_compute_loss.py, write_workload_spec) gave these runs to BLIS for the fit: profile.yaml's
    shared_prefix (multi-turn chat on, so closed-loop BLIS sessions) and all stages in one spec; requests are
    assigned to stages by arrival time, as that runner does (it also set --total-kv-blocks and CPU-offload
    flags from each run's vllm.log, which this data set does not have).

Measured vs BLIS, per run and stage and for the whole run: TTFT mean and p90, E2E mean and p90, and the
per-token time. inference-perf's reported TPOT/ITL of these runs count every one-token stream chunk as two
tokens (fixed later, inference-perf reportgen/base.py, #564), so the measured per-token time is derived as
(E2E mean - TTFT mean) / (output_len - 1); BLIS's is computed the same way from its own requests. Errors are
(BLIS - measured) / measured in percent; medians of |error| over the 13 active runs (the reasoning runs of
Llama-2-7B, Llama-2-70B and Mixtral, with over 10 % failed requests, are reported separately).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

DEFAULT_BLIS = Path(os.environ.get("BLIS_HOME", os.path.join(os.environ.get("TMPDIR", "/tmp"), "blis"))) / "blis"
DEFAULT_DATA = Path("/work/shared/data/vllm-h100-inference-perf")
BLIS_MIRROR = Path("/work/.mirror/inference-sim+inference-sim/repo")
VARIANTS = ("unique-question", "prompt-pool", "as-trained")
METRICS = ("ttft_mean", "ttft_p90", "e2e_mean", "e2e_p90", "itl")
OVERLOAD_FAILED_FRACTION = 0.10


def fail(msg: str) -> None:
    print(f"blis_real_runs: {msg}", file=sys.stderr)
    sys.exit(2)


# ----------------------------------------------------------------------------------------------- measured side


def latency_stats(metrics: dict, output_len: int) -> dict:
    """Measured stats (ms) of one inference-perf lifecycle-metrics file (a stage or the summary)."""
    lat = metrics["successes"]["latency"]
    ttft, e2e = lat["time_to_first_token"], lat["request_latency"]
    return {
        "ttft_mean": 1e3 * ttft["mean"], "ttft_p90": 1e3 * ttft["p90"],
        "e2e_mean": 1e3 * e2e["mean"], "e2e_p90": 1e3 * e2e["p90"],
        "itl": 1e3 * (e2e["mean"] - ttft["mean"]) / (output_len - 1),
        "itl_reported_by_inference_perf": 1e3 * lat["inter_token_latency"]["mean"],
        "completed": metrics["successes"]["count"],
        "failed": metrics.get("failures", {}).get("count", 0),
        "prompt_len_mean": metrics["successes"]["prompt_len"]["mean"],
    }


def load_run(run_dir: Path, data: Path) -> dict:
    exp = yaml.safe_load((run_dir / "exp-config.yaml").read_text())
    cfg = yaml.safe_load((run_dir / "results" / "config.yaml").read_text())
    sp = cfg["data"]["shared_prefix"]
    assert cfg["data"]["type"] == "shared_prefix" and cfg["load"]["type"] == "constant", run_dir
    assert cfg["server"]["ignore_eos"], run_dir
    stages = cfg["load"]["stages"]
    out_len = int(sp["output_len"])
    measured = [latency_stats(json.loads((run_dir / "results" / f"stage_{i}_lifecycle_metrics.json").read_text()),
                              out_len) for i in range(len(stages))]
    summary = latency_stats(json.loads((run_dir / "results" / "summary_lifecycle_metrics.json").read_text()), out_len)
    configs = {p.name.lower(): p for p in (data / "model_configs").iterdir()}
    model_dir = configs.get(exp["model"].split("/")[-1].lower())
    if model_dir is None:
        fail(f"no model config for {exp['model']} under {data / 'model_configs'}")
    sent = sum(m["completed"] + m["failed"] for m in measured)
    profile = json.loads((run_dir / "profile.yaml").read_text())
    return {
        "run": run_dir.name, "model": exp["model"], "model_config": model_dir, "tp": exp["tensor_parallelism"],
        "max_model_len": exp["max_model_len"], "max_num_batched_tokens": exp["max_num_batched_tokens"],
        "max_num_seqs": exp["max_num_seqs"], "shared_prefix": sp, "output_len": out_len,
        "stages": [{"rate": float(s["rate"]), "duration": int(s["duration"])} for s in stages],
        "measured": measured, "measured_summary": summary, "profile": profile,
        "overloaded": sum(m["failed"] for m in measured) > OVERLOAD_FAILED_FRACTION * sent,
    }


# --------------------------------------------------------------------------------------------------- BLIS side


def workload_spec(run: dict, stage: dict, prompt_len: int, variant: str, seed: int) -> dict:
    """BLIS workload spec (its `inference_perf` block) for one constant-rate stage ("as-trained": all stages)."""
    if variant == "as-trained":  # inference-sim/training's runner: profile.yaml as it is, all stages in one spec
        prof = run["profile"]
        stages = [{"rate": float(s["rate"]), "duration": int(s["duration"])} for s in prof["load"]["stages"]]
        return {"version": "2", "seed": seed, "num_requests": sum(round(s["rate"] * s["duration"]) for s in stages),
                "inference_perf": {"stages": stages, "shared_prefix": prof["data"]["shared_prefix"]}}
    sp = run["shared_prefix"]
    if variant == "unique-question":
        shared = {"num_unique_system_prompts": sp["num_groups"],
                  "num_users_per_system_prompt": sp["num_prompts_per_group"],
                  "system_prompt_len": sp["system_prompt_len"],
                  "question_len": prompt_len - sp["system_prompt_len"]}
    else:  # prompt-pool: every one of the fixed prompts is its own prefix group, one fresh token after it
        shared = {"num_unique_system_prompts": sp["num_groups"] * sp["num_prompts_per_group"],
                  "num_users_per_system_prompt": 1, "system_prompt_len": prompt_len - 1, "question_len": 1}
    shared.update(output_len=run["output_len"], enable_multi_turn_chat=False)
    n = int(stage["rate"] * stage["duration"])
    return {"version": "2", "seed": seed, "num_requests": n,
            "inference_perf": {"stages": [stage], "shared_prefix": shared}}


def blis_command(blis: Path, run: dict, spec: Path, metrics: Path, seed: int) -> list[str]:
    return [str(blis), "run",
            "--model", run["model"].lower(), "--model-config-folder", str(run["model_config"]),
            "--latency-model", "trained-physics", "--hardware", "H100", "--tp", str(run["tp"]),
            "--max-num-seqs", str(run["max_num_seqs"]),
            "--max-num-batched-tokens", str(run["max_num_batched_tokens"]),
            "--max-model-len", str(run["max_model_len"]),
            "--workload-spec", str(spec), "--seed", str(seed), "--metrics-path", str(metrics), "--log", "info",
            # the client's 300 s timeout; BLIS applies none to a workload spec's clients unless this flag is given
            "--timeout", "300",
            # one instance, so no routing: live cache signals give byte-identical output, 10-20x faster
            "--cache-signal-delay", "0"]


def blis_stats(requests: list[dict], output_len: int) -> dict:
    """BLIS stats (ms) over its completed requests, the same definitions as the measured side."""
    done = [r for r in requests if r["e2e_ms"] > 0]
    ttft = np.array([r["ttft_ms"] for r in done])
    e2e = np.array([r["e2e_ms"] for r in done])
    return {
        "ttft_mean": float(ttft.mean()), "ttft_p90": float(np.percentile(ttft, 90)),
        "e2e_mean": float(e2e.mean()), "e2e_p90": float(np.percentile(e2e, 90)),
        "itl": float((e2e.mean() - ttft.mean()) / (output_len - 1)),
        "itl_per_request_mean": float(np.mean([r["itl_ms"] for r in done])),
        "completed": len(done), "not_completed": len(requests) - len(done),
        "arrival_span_s": float(max(r["arrived_at"] for r in requests) - min(r["arrived_at"] for r in requests)),
    }


def run_blis(blis: Path, blis_src: Path, run: dict, stage: dict, prompt_len: int, variant: str, seed: int,
             tmp: Path) -> dict:
    spec_path, metrics_path = tmp / "spec.yaml", tmp / "metrics.json"
    spec = workload_spec(run, stage, prompt_len, variant, seed)
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    cmd = blis_command(blis, run, spec_path, metrics_path, seed)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=blis_src, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    print(f"  {variant:<15} {run['run']:<48} {spec['num_requests']:>6} requests  {wall:6.1f} s", file=sys.stderr,
          flush=True)
    if proc.returncode != 0:
        fail(f"BLIS failed on {run['run']} ({variant}): {proc.stderr.strip().splitlines()[-1:]}")
    out = json.loads(metrics_path.read_text())
    kv = re.search(r"total-kv-blocks=(\d+)", proc.stderr)
    sim = {"timed_out": out.get("timed_out_requests", 0), "preemptions": out.get("preemption_count", 0),
           "cache_hit_rate": out.get("cache_hit_rate"), "total_kv_blocks": int(kv.group(1)) if kv else None,
           "wall_s": round(wall, 3)}
    return {"sim": sim, "requests": out["requests"], "spec": spec,
            "flags": [c if not c.startswith("/") else Path(c).name for c in cmd[1:]]}


def simulate_run(blis: Path, blis_src: Path, run: dict, variant: str, seed: int, tmp: Path) -> list[dict]:
    """BLIS results per stage of one run: one simulation per stage, or ("as-trained") one for all stages with
    the requests split by arrival time at the stage boundaries, as inference-sim/training's runner does."""
    if variant != "as-trained":
        return [run_blis(blis, blis_src, run, stage, round(meas["prompt_len_mean"]), variant, seed, tmp)
                for stage, meas in zip(run["stages"], run["measured"], strict=True)]
    res = run_blis(blis, blis_src, run, run["stages"][0], 0, variant, seed, tmp)
    ends = np.cumsum([s["duration"] for s in res["spec"]["inference_perf"]["stages"]])
    buckets = [[] for _ in ends]
    for r in res["requests"]:
        buckets[min(int(np.searchsorted(ends, r["arrived_at"])), len(ends) - 1)].append(r)
    return [dict(res, requests=b) for b in buckets]


# ------------------------------------------------------------------------------------------------------ errors


def pct_errors(blis: dict, measured: dict) -> dict:
    return {m: 100.0 * (blis[m] - measured[m]) / measured[m] for m in METRICS}


def medians(rows: list[dict]) -> dict:
    """Median |error| and median signed error of each metric over rows (each row has an 'errors' dict)."""
    if not rows:
        return {}
    return {m: {"median_abs_pct": float(np.median([abs(r["errors"][m]) for r in rows])),
                "median_signed_pct": float(np.median([r["errors"][m] for r in rows])), "n": len(rows)}
            for m in METRICS}


def blis_commit(blis_src: Path) -> str:
    """The mirror's HEAD when the built source's defaults.yaml is that commit's (the source has no .git)."""
    try:
        head = subprocess.run(["git", f"--git-dir={BLIS_MIRROR}", "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        theirs = subprocess.run(["git", f"--git-dir={BLIS_MIRROR}", "show", "HEAD:defaults.yaml"],
                                capture_output=True, text=True, check=True).stdout
        ours = (blis_src / "defaults.yaml").read_text()
        return head if theirs == ours else f"unknown (defaults.yaml differs from mirror HEAD {head})"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# -------------------------------------------------------------------------------------------------------- main


def short(run_name: str) -> str:
    return re.sub(r"^\d{8}-\d{6}-", "", run_name).replace("-v0-1", "").replace("-hf", "")


def print_table(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(f"{'run':<30} {'st':>2} {'rate':>4} {'n meas/BLIS':>11} | {'TTFT mean ms':>15} {'err%':>7} "
          f"{'TTFTp90':>7} | {'E2E mean s':>13} {'err%':>6} {'E2Ep90':>6} | {'ITL ms':>11} {'err%':>6}")
    for r in rows:
        me, bl, er = r["measured"], r["blis"], r["errors"]
        print(f"{short(r['run']):<30} {str(r['stage']):>2} {r['rate'] or '':>4} "
              f"{me['completed']:>5}/{bl['completed']:<5} | "
              f"{me['ttft_mean']:>7.1f}/{bl['ttft_mean']:<7.1f} {er['ttft_mean']:>+7.1f} {er['ttft_p90']:>+7.1f} | "
              f"{me['e2e_mean'] / 1e3:>6.2f}/{bl['e2e_mean'] / 1e3:<6.2f} {er['e2e_mean']:>+6.1f} "
              f"{er['e2e_p90']:>+6.1f} | {me['itl']:>5.2f}/{bl['itl']:<5.2f} {er['itl']:>+6.1f}")


def print_medians(title: str, med: dict) -> None:
    if med:
        print(f"  {title} (n={med['ttft_mean']['n']}): " + ", ".join(
            f"{m} {med[m]['median_abs_pct']:.1f}% (signed {med[m]['median_signed_pct']:+.1f}%)" for m in METRICS))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blis-bin", type=Path, default=DEFAULT_BLIS, help="BLIS binary (default: %(default)s)")
    ap.add_argument("--blis-src", type=Path, default=None,
                    help="BLIS source dir with defaults.yaml and hardware_config.json (default: BIN's dir/src)")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="data set (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=Path("results/blis_real_runs.json"))
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma list of: " + ", ".join(VARIANTS))
    ap.add_argument("--only", default="", help="only runs whose name contains this string")
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()

    t_start = time.perf_counter()
    blis = args.blis_bin.resolve()
    if not (blis.is_file() and os.access(blis, os.X_OK)):
        fail(f"BLIS binary not found at {blis} (build it: /work/shared/tools/blis/build.sh SRC; or --blis-bin)")
    blis_src = (args.blis_src or blis.parent / "src").resolve()
    if not ((blis_src / "defaults.yaml").is_file() and (blis_src / "hardware_config.json").is_file()):
        fail(f"BLIS source dir {blis_src} lacks defaults.yaml/hardware_config.json (set --blis-src)")
    run_dirs = sorted(p for p in (args.data / "runs").glob("*") if (p / "exp-config.yaml").is_file())
    if not run_dirs or not (args.data / "model_configs").is_dir():
        fail(f"no runs under {args.data / 'runs'} (or no model_configs/); set --data")
    run_dirs = [p for p in run_dirs if args.only in p.name]
    variants = [v for v in args.variants.split(",") if v]
    if not variants or any(v not in VARIANTS for v in variants):
        fail(f"--variants must be a comma list of {', '.join(VARIANTS)}")

    coeffs = yaml.safe_load((blis_src / "defaults.yaml").read_text())["trained_physics_coefficients"]
    report = {
        "what": "BLIS trained-physics vs 16 real vLLM runs (H100, inference-perf); errors = (BLIS-meas)/meas %",
        "blis_commit": blis_commit(blis_src), "blis_coefficients": coeffs, "data": str(args.data),
        "itl_definition": "(E2E mean - TTFT mean) / (output_len - 1), ms, for both measured and BLIS "
                          "(inference-perf's reported TPOT/ITL of these runs count each chunk twice)",
        "primary_variant": variants[0], "variants": {},
    }
    runs = [load_run(p, args.data) for p in run_dirs]
    with tempfile.TemporaryDirectory() as td:
        for variant in variants:
            rows, run_rows = [], []
            for run in runs:
                all_requests = []
                results = simulate_run(blis, blis_src, run, variant, args.seed, Path(td))
                for i, (stage, meas, res) in enumerate(zip(run["stages"], run["measured"], results, strict=True)):
                    all_requests += res["requests"]
                    stats = dict(blis_stats(res["requests"], run["output_len"]), **res["sim"])
                    rows.append({"run": run["run"], "stage": i, "rate": stage["rate"],
                                 "duration_s": stage["duration"], "overloaded": run["overloaded"],
                                 "measured": meas, "blis": stats, "errors": pct_errors(stats, meas),
                                 "blis_flags": res["flags"], "blis_workload_spec": res["spec"]})
                whole = blis_stats(all_requests, run["output_len"])
                run_rows.append({"run": run["run"], "stage": "all", "rate": None, "overloaded": run["overloaded"],
                                 "model": run["model"], "tp": run["tp"], "measured": run["measured_summary"],
                                 "blis": whole, "errors": pct_errors(whole, run["measured_summary"])})
            active = [r for r in run_rows if not r["overloaded"]]
            report["variants"][variant] = {
                "stages": rows, "runs": run_rows,
                "medians_over_active_runs": medians(active),
                "medians_over_active_runs_without_codellama_reasoning": medians(
                    [r for r in active if "reasoning" not in r["run"]]),
                "medians_over_active_stages": medians([r for r in rows if not r["overloaded"]]),
                "medians_over_overloaded_runs": medians([r for r in run_rows if r["overloaded"]]),
                "active_runs": [r["run"] for r in active],
                "overloaded_runs": [r["run"] for r in run_rows if r["overloaded"]],
            }
            v = report["variants"][variant]
            print_table(f"== variant {variant}: per stage (measured/BLIS; err% = (BLIS-meas)/meas)", rows)
            print_table(f"== variant {variant}: whole run (measured = summary_lifecycle_metrics.json)", run_rows)
            print(f"medians of |error| ({variant}):")
            print_medians("active runs", v["medians_over_active_runs"])
            print_medians("active runs without CodeLlama reasoning", v["medians_over_active_runs_without_codellama_reasoning"])
            print_medians("active stages", v["medians_over_active_stages"])
            print_medians("overloaded runs", v["medians_over_overloaded_runs"])
    report["wall_s"] = round(time.perf_counter() - t_start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"\nBLIS commit {report['blis_commit']}; wrote {args.out}; wall {report['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
