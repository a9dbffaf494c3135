"""The BLIS scenario and the trace-length scaling, beside BLIS's own figures.

BLIS (inference-sim/inference-sim) is the fastest peer measured so far. Its scenario
(../shared/tools/blis/run.sh): 4 replicas of Llama-3.1-8B, one H100 each, Poisson 48 requests/s,
2,000-token prompts, 200 output tokens, round robin. Two workloads:

- unique prompts, as a Mooncake-style request table built in memory: each request has 4 hash ids
  never used by another request (3 full 512-token blocks and one of 464 tokens), turned into segments
  by `workloads.prefix.from_mooncake` exactly as a Mooncake trace is;
- 256 shared 1,500-token prefixes: issue 8's `shared-prefix` workload with groups = 256, one prompt per
  group, a 1,500-token system prompt and a private 500-token question per request (BLIS's `prefix-rr`:
  prefix + 500 unique tokens). Groups come in a per-seed shuffled cycle, BLIS draws them at random.

The trace section times the unique-prompt table at growing lengths (rr, one seed): a simulator whose
cost per event does not depend on the trace length keeps requests/s flat.
"""

from __future__ import annotations

import functools
import json
import math
import os
import statistics
import subprocess

import numpy as np

from jaxroute.bench.config import BLIS_SCENARIO, TRACE_FLAT_MAX, BenchConfig
from jaxroute.bench.measure import RunOut, Scenario, error_record, measure, say
from jaxroute.errors import JaxrouteError

# BLIS's figures, as measured in ../shared/tools/blis/README.md (2-core machine, one core, 3 repeats).
BLIS_SOURCE = "../shared/tools/blis/README.md"
BLIS_RR_FAST = {2000: 3030.0, 10_000: 3413.0}  # round robin, CACHE_DELAY_US=0, simulated requests/s, one core
BLIS_RR_DEFAULT = (229.0, 297.0)  # round robin with BLIS's default 50 ms cache snapshots
BLIS_PREFIX_WEIGHTED = (1905.0, 2242.0)  # prefix-weighted router (precise-prefix-cache:2, queue-depth:1, kv:1)
BLIS_RR_METRICS_2000 = {"ttft_mean_s": 0.0556, "ttft_p99_s": 0.0912, "itl_mean_s": 0.0103, "e2e_mean_s": 2.107}
BLIS_CORES = 1
METRICS_SHOWN = ("ttft_mean_s", "ttft_p99_s", "tpot_mean_s", "mean_latency_s", "hit_rate")


def blis_figures() -> dict:
    return {"source": BLIS_SOURCE, "cores": BLIS_CORES, "rr_cache_delay_0_requests_per_s": BLIS_RR_FAST,
            "rr_default_snapshots_requests_per_s": list(BLIS_RR_DEFAULT),
            "prefix_weighted_requests_per_s": list(BLIS_PREFIX_WEIGHTED), "rr_metrics_2000_requests": BLIS_RR_METRICS_2000}


def blis_rate_for(requests: int) -> tuple[int, float]:
    """BLIS's round-robin figure at the nearest request count it was measured at."""
    n = min(BLIS_RR_FAST, key=lambda k: abs(math.log(k / requests)))
    return n, BLIS_RR_FAST[n]


# --------------------------------------------------------------------------- BLIS timed live

# The scenario of BLIS's run script that matches each of our workloads (run.sh's header): `rr`, every prompt
# unique; `prefix-rr`, 256 shared 1,500-token prefixes + 500 unique tokens, round robin.
BLIS_RUN_SCENARIOS = {"unique": "rr", "shared-prefix": "prefix-rr"}


def parse_blis_output(text: str) -> dict:
    """The RESULT line and the cluster metrics block that BLIS's run script prints."""
    result = next((line for line in text.splitlines() if line.startswith("RESULT ")), None)
    if result is None:
        raise JaxrouteError("BLIS's run script printed no RESULT line")
    fields = dict(kv.split("=", 1) for kv in result.split()[1:] if "=" in kv)
    start = text.find("{", text.find("=== Simulation Metrics ==="))
    cluster = json.JSONDecoder().raw_decode(text[start:])[0] if start >= 0 else {}
    return {"requests": int(fields["requests"]), "completed": int(fields["completed"]),
            "wall_s": float(fields["wall_s"]),
            "metrics": {"ttft_mean_s": cluster.get("ttft_mean_ms", math.nan) / 1e3,
                        "ttft_p99_s": cluster.get("ttft_p99_ms", math.nan) / 1e3,
                        "itl_mean_s": cluster.get("itl_mean_ms", math.nan) / 1e3,
                        "e2e_mean_s": cluster.get("e2e_mean_ms", math.nan) / 1e3}}


def blis_once(run_sh: str, scenario: str, requests: int, **env) -> dict:
    """One run of BLIS's script (CACHE_DELAY_US=0, as its README's figures; `env`: more of its settings)."""
    env = dict(os.environ, CACHE_DELAY_US="0", N=str(requests), **{k: str(v) for k, v in env.items()})
    proc = subprocess.run(["bash", run_sh, scenario], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise JaxrouteError(f"BLIS ({run_sh} {scenario}) failed: {tail}")
    run = parse_blis_output(proc.stdout)
    if run["completed"] != requests:
        raise JaxrouteError(f"BLIS completed {run['completed']} of {requests} requests")
    return run


def time_blis(run_sh: str, kind: str, requests: int, repeats: int) -> dict:
    """BLIS on the workload's scenario, `repeats` times, one core: simulated requests per second of the whole
    process, median run."""
    scenario = BLIS_RUN_SCENARIOS[kind]
    runs = [blis_once(run_sh, scenario, requests) for _ in range(repeats)]
    wall = statistics.median(r["wall_s"] for r in runs)
    median_run = min(runs, key=lambda r: abs(r["wall_s"] - wall))
    say(f"    BLIS {scenario}: {requests / wall:,.0f} requests/s (median of {repeats}, one core)")
    return {"scenario": scenario, "requests": requests, "repeats": repeats, "wall_s": [r["wall_s"] for r in runs],
            "requests_per_s": requests / wall, "cores": BLIS_CORES, "metrics": median_run["metrics"]}


# Our metric beside each of BLIS's (BLIS's ITL is the mean gap between a request's tokens, our TPOT the same).
FIDELITY_METRICS = {"ttft_mean_s": "ttft_mean_s", "tpot_mean_s": "itl_mean_s", "mean_latency_s": "e2e_mean_s"}


def run_fidelity(cfg: BenchConfig) -> dict:
    """Ours and BLIS on the unique-prompt scenario at each of `blis_rates`, `blis_repeats` arrival draws each
    (ours: trace seeds 0, 1, ...; BLIS: SEED 42, 43, ...): TTFT, TPOT (BLIS: ITL) and E2E means, and our
    relative difference. One draw says little: BLIS's own E2E moves by several % from one seed to the next."""
    from jaxroute.experiments.cluster import policy_rows, run_cluster

    s, n = BLIS_SCENARIO, cfg.blis_requests[0]
    rows = []
    for rate in cfg.blis_rates:
        ours, theirs = [], []
        for i in range(cfg.blis_repeats):
            res = run_cluster(policy_rows([s["policy"]], rate=rate, gpu=s["gpu"], model_name=s["model"]),
                              unique_workload(n, rate, i), replicas_n=s["replicas"], seeds=1, progress=False)
            ours.append({k: float(np.mean(res.metrics[k])) for k in FIDELITY_METRICS})
            theirs.append(blis_once(cfg.blis_run, "rr", n, RATE=rate, SEED=42 + i)["metrics"])
        mine = {k: float(np.mean([o[k] for o in ours])) for k in FIDELITY_METRICS}
        blis_mean = {v: float(np.mean([t[v] for t in theirs])) for v in FIDELITY_METRICS.values()}
        diff = {k: mine[k] / blis_mean[v] - 1.0 for k, v in FIDELITY_METRICS.items()}
        rows.append({"rate": rate, "ours": mine, "blis": blis_mean, "relative_difference": diff,
                     "blis_e2e_per_draw": [t["e2e_mean_s"] for t in theirs]})
        say(f"  rate {rate:g}: E2E ours {mine['mean_latency_s']:.3f} s, BLIS {blis_mean['e2e_mean_s']:.3f} s "
            f"({diff['mean_latency_s']:+.1%})")
    return {"requests": n, "draws": cfg.blis_repeats, "policy": s["policy"], "rows": rows}


# --------------------------------------------------------------------------- workloads


def unique_prompt_trace(n: int, *, rate: float, prompt: int, output: int, seed: int = 0):
    """A Mooncake-style trace: Poisson arrivals, every prompt made of its own ceil(prompt / 512) hash ids."""
    from jaxroute.workloads.traces import MOONCAKE_BLOCK_TOKENS, Trace

    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, n)
    arrival = np.cumsum(gaps) - gaps[0]
    nb = math.ceil(prompt / MOONCAKE_BLOCK_TOKENS)
    blocks = [np.arange(nb * i, nb * (i + 1), dtype=np.int64) for i in range(n)]
    return Trace("blis-unique", arrival, np.full(n, prompt, np.int64), np.full(n, output, np.int64), blocks)


@functools.lru_cache(maxsize=8)
def unique_workload(n: int, rate: float = BLIS_SCENARIO["rate"], seed: int = 0):
    from jaxroute.workloads import prefix

    s = BLIS_SCENARIO
    return prefix.from_mooncake(unique_prompt_trace(n, rate=rate, prompt=s["prompt_tokens"],
                                                    output=s["output_tokens"], seed=seed))


@functools.lru_cache(maxsize=8)
def shared_prefix_workload(n: int):
    from jaxroute.workloads import prefix

    s = BLIS_SCENARIO
    return prefix.shared_prefix(n, groups=s["prefix_groups"], prompts_per_group=1, system_tokens=s["prefix_tokens"],
                                question_tokens=s["prompt_tokens"] - s["prefix_tokens"],
                                output_tokens=s["output_tokens"], private_questions=True)


WORKLOADS = {"unique": unique_workload, "shared-prefix": shared_prefix_workload}


def blis_scenario(cfg: BenchConfig, kind: str, requests: int) -> Scenario:
    from jaxroute.experiments.cluster import policy_rows, run_cluster

    s = BLIS_SCENARIO
    rows = policy_rows([s["policy"]], rate=s["rate"], gpu=s["gpu"], model_name=s["model"])

    def run(seeds: int, n: int, seed: int) -> RunOut:
        wl = WORKLOADS[kind](n)
        res = run_cluster(rows, wl, replicas_n=s["replicas"], seeds=seeds, seed=seed, progress=cfg.progress)
        shown = {k: float(np.mean(res.metrics[k])) for k in METRICS_SHOWN}
        return RunOut(res, wl, float(seeds * n), bool(res.grid.overflow.any()), {"metrics": shown})

    info = dict(s, workload=kind, requests=requests)
    return Scenario(f"blis/{kind}", "blis", 1, requests, run, info)


# --------------------------------------------------------------------------- sections


def run_blis(cfg: BenchConfig, memo: dict) -> dict:
    """Both workloads at every `blis_requests` size, `blis_seeds` seeds, beside BLIS (timed in the same run
    when `blis_run` names its script, else its README's figures)."""
    out = {"scenario": BLIS_SCENARIO, "seeds": cfg.blis_seeds, "blis": blis_figures(), "runs": []}
    for kind in WORKLOADS:
        for n in cfg.blis_requests:
            try:
                row = measure(blis_scenario(cfg, kind, n), cfg.blis_seeds, n, cfg.max_repeat_s)
            except Exception as e:
                row = {"seeds": cfg.blis_seeds, "requests_per_seed": n, **error_record(e)}
                say(f"    failed: {row['error']} {row['detail']}")
                out["runs"].append({"workload": kind, **row})
                continue
            if kind == "unique":
                memo[(n, cfg.blis_seeds)] = row
            if cfg.blis_run:  # BLIS timed now, on this machine, on the same scenario and request count
                live = time_blis(cfg.blis_run, kind, n, cfg.blis_repeats)
                ref_n, ref_rate = n, live["requests_per_s"]
                row["blis_measured"] = live
            else:
                ref_n, ref_rate = blis_rate_for(n)
            row.update(workload=kind, blis_requests=ref_n, blis_requests_per_s_per_core=ref_rate / BLIS_CORES,
                       ratio_per_core=row["requests_per_s_per_core"] / (ref_rate / BLIS_CORES))
            out["runs"].append(row)
    if cfg.blis_run:
        out["fidelity"] = run_fidelity(cfg)
    return out


def run_trace(cfg: BenchConfig, memo: dict) -> dict:
    """Requests/s of the unique-prompt table at each trace size (rr, one seed), and max / min."""
    scenario = lambda n: blis_scenario(cfg, "unique", n)  # noqa: E731
    sizes, note = [], None
    for n in sorted(cfg.trace_sizes):
        if (n, 1) in memo:
            sizes.append(dict(memo[(n, 1)], reused_from="blis"))
            say(f"  trace {n:,} requests: reused from the BLIS section ({memo[(n, 1)]['requests_per_s']:,.0f} requests/s)")
            continue
        done = [r for r in sizes if "requests_per_s" in r]
        if len(done) >= 2:
            a, b = done[-2], done[-1]
            k = math.log(b["steady_s"] / a["steady_s"]) / math.log(b["requests_per_seed"] / a["requests_per_seed"])
            est = b["steady_s"] * (n / b["requests_per_seed"]) ** k
            say(f"  trace {n:,} requests: expect ~{est:,.0f} s (time has grown as requests^{k:.2f}); "
                "Ctrl-C skips the rest of the trace sizes")
        try:
            sizes.append(measure(scenario(n), 1, n, cfg.max_repeat_s))
        except KeyboardInterrupt:
            note = f"interrupted by the user at {n:,} requests; larger sizes not run"
            say(f"    {note}")
            sizes.append({"requests_per_seed": n, "interrupted": True})
            break
        except Exception as e:
            sizes.append({"requests_per_seed": n, **error_record(e)})
            say(f"    failed: {sizes[-1]['error']} {sizes[-1]['detail']}")
            break
    rates = [r["requests_per_s"] for r in sizes if "requests_per_s" in r]
    ratio = max(rates) / min(rates) if len(rates) >= 2 else None
    return {"policy": "rr", "seeds": 1, "workload": "unique (Mooncake-style)", "sizes": sizes, "note": note,
            "requests_per_s": {str(r["requests_per_seed"]): r["requests_per_s"] for r in sizes if "requests_per_s" in r},
            "max_over_min": ratio, "target_max_over_min": TRACE_FLAT_MAX,
            "flat": None if ratio is None else bool(ratio <= TRACE_FLAT_MAX)}
