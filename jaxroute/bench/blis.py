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
import math

import numpy as np

from jaxroute.bench.config import BLIS_SCENARIO, TRACE_FLAT_MAX, BenchConfig
from jaxroute.bench.measure import RunOut, Scenario, error_record, measure, say

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
def unique_workload(n: int):
    from jaxroute.workloads import prefix

    s = BLIS_SCENARIO
    return prefix.from_mooncake(unique_prompt_trace(n, rate=s["rate"], prompt=s["prompt_tokens"],
                                                    output=s["output_tokens"]))


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
    """Both workloads at every `blis_requests` size, `blis_seeds` seeds, beside BLIS's figures."""
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
            ref_n, ref_rate = blis_rate_for(n)
            row.update(workload=kind, blis_requests=ref_n, blis_requests_per_s_per_core=ref_rate / BLIS_CORES,
                       ratio_per_core=row["requests_per_s_per_core"] / (ref_rate / BLIS_CORES))
            out["runs"].append(row)
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
