"""The data plane under the router: KV offload tiers and LoRA adapters.

1. KV tiers on the long-prompt shared-prefix job (inference-perf's shared_prefix, 150 groups x 5 prompts, a
   6,000-token system prompt, a 1,200-token question, 1,000 output tokens; 8 x Qwen3-32B on 2 x H100, vLLM's
   on-demand admission) and on the Mooncake trace (its recorded arrivals; 8 x Llama-3.1-8B on one H100 each).
   Rows: a cache-aware router that sees the tiers (llm-d precise: CPU blocks weigh 0.8; Dynamo: host 0.75,
   shared 0.25) and a load-only one (llm-d queue + KV), each on the GPU caches alone, with a CPU tier per
   replica, a shared tier, and both; one compiled grid per workload. Tier sizes: `CPU_GIB` per replica (half the
   host memory of an H100 pair in MLCommons' 8-GPU systems: 2 TB for 8), `SHARED_GIB` for the cluster.
2. LoRA adapters on toolbench (4 x Mistral-7B on an A6000, `LORA_SLOTS` adapter slots each, vLLM's skip rule):
   adapter counts x Zipf skews x three routers (llm-d's lora-affinity preset, llm-d's load profile, llm-d's
   precise prefix profile), one compiled grid.
"""

from __future__ import annotations

import time

import numpy as np

from jaxroute.experiments.cluster import (
    LORA_METRICS,
    build_workload,
    lora_variants,
    policy_rows,
    run_cluster,
    tier_variants,
)
from jaxroute.experiments.comparison import paired_difference
from jaxroute.metrics import summarize
from jaxroute.reproduce.document import (
    Claim,
    Context,
    Experiment,
    Section,
    fmt,
    holds_verdict,
    records_table,
)

SOURCE = "production-routers"
CPU_GIB, SHARED_GIB = 256.0, 2048.0
TIER_ROUTERS = ("llmd_precise", "dynamo_kv", "llmd_load")
LONG_PROMPT = {"groups": 150, "prompts_per_group": 5, "system_tokens": 6000, "question_tokens": 1200,
               "output_tokens": 1000}
TIER_JOBS = {  # workload, deployment, rate (0: the trace's recorded times), sizes (full, quick)
    "long_prompt": dict(workload="shared-prefix", deployment=dict(gpu="h100", model_name="qwen3-32b", tp=2),
                        admission="on-demand", rate=10.0, requests=(1500, 200), seeds=(4, 2)),
    "mooncake": dict(workload="mooncake", deployment=dict(gpu="h100", model_name="llama-3.1-8b", tp=1),
                     admission="reserve", rate=0.0, requests=(3993, 300), seeds=(2, 1)),
}
TIER_REPLICAS = 8
TIER_TABLE = ("hit_rate", "hit_rate_all", "hit_rate_cpu", "hit_rate_shared", "ttft_mean_s", "ttft_p90_s",
              "kv_loaded_gb", "kv_offloaded_gb")
LORA_ROUTERS = ("llmd_lora", "llmd_load", "llmd_precise")
LORA_COUNTS, LORA_SKEWS = (8, 32, 128), (0.5, 1.0, 1.5)
LORA_SLOTS, LORA_REPLICAS, LORA_RATE = 4, 4, 20.0
LORA_SIZES = {"requests": (1000, 150), "seeds": (4, 2)}


def _size(ctx: Context, pair) -> int:
    return pair[1] if ctx.quick else pair[0]


def _seeds(ctx: Context, pair) -> int:
    return ctx.seeds or _size(ctx, pair)


def _label(router: str, tier: str) -> str:
    return f"{router}+{tier}"


def tiers_study(job: str):
    spec = TIER_JOBS[job]

    def run(ctx: Context) -> Section:
        seeds, n = _seeds(ctx, spec["seeds"]), _size(ctx, spec["requests"])
        dep = spec["deployment"]
        start = time.perf_counter()
        wl = build_workload(spec["workload"], n, shared_prefix=LONG_PROMPT if job == "long_prompt" else None)
        tiers = tier_variants([0.0, CPU_GIB], [0.0, SHARED_GIB], dep["gpu"], dep["model_name"], dep["tp"])
        rows = policy_rows(list(TIER_ROUTERS), rate=spec["rate"], tiers=tiers, **dep)
        res = run_cluster(rows, wl, replicas_n=TIER_REPLICAS, seeds=seeds, admission=spec["admission"])
        ctx.advance(f"tiers on {job}")
        wall = time.perf_counter() - start
        claims = _tier_claims(res)
        conserved = all(int(np.max(res.grid.metrics["conservation_error"][c])) == 0 for c in range(len(res.labels)))
        cpu_label, shared_label = f"cpu{CPU_GIB:g}G", f"shared{SHARED_GIB:g}G"
        return Section(
            SOURCE, f"tiers_{job}", f"KV offload tiers on the {job.replace('_', '-')} job",
            intro=f"{TIER_REPLICAS} x {dep['model_name']} on {dep['tp']} x {dep['gpu']}, {spec['admission']} admission; "
                  + ("inference-perf's shared_prefix (150 groups x 5 prompts, 6,000-token system prompts: 900k "
                     f"tokens of shared prefixes against a GPU cache of {int(res.records[0].params['kv_capacity']):,} "
                     f"tokens per replica) at {spec['rate']:g} req/s" if job == "long_prompt" else
                     "the Mooncake trace at its recorded times")
                  + f", {seeds} seeds x {wl.n_requests} requests. Tiers ({cpu_label}: a CPU tier of {CPU_GIB:g} GiB per "
                  f"replica over PCIe Gen5, {shared_label}: one shared tier of {SHARED_GIB:g} GiB at 25 GB/s + 1 ms "
                  "per load): a GPU eviction is written to both, a hit past the GPU prefix is loaded back before the "
                  f"step (docs/tiers.md). {len(rows)} rows in one compiled grid ({wall:.0f} s). Every run conserves "
                  f"requests: {'yes' if conserved else 'NO'}.",
            claims=claims, tables=[("prefix hit rates (GPU, all tiers, CPU, shared), TTFT (s) and KV moved (GB)",
                                    records_table(res.records, TIER_TABLE))],
            data={"job": job, "seeds": seeds, "requests": int(wl.n_requests), "wall_s": wall,
                  "records": [r.as_json() for r in res.records]}, seeds=seeds)

    return run


def _gain(res, router: str, tier: str, metric: str, relative: bool = False):
    return paired_difference(res, metric, _label(router, tier), _label(router, "gpu-only"), relative=relative)


def _tier_claims(res) -> list[Claim]:
    cpu, shared, both = f"cpu{CPU_GIB:g}G", f"shared{SHARED_GIB:g}G", f"cpu{CPU_GIB:g}G+shared{SHARED_GIB:g}G"
    load, aware = "llmd_load", "llmd_precise"
    claims = []
    hit = _gain(res, load, cpu, "hit_rate_all")
    ttft = _gain(res, load, cpu, "ttft_mean_s", relative=True)
    claims.append(Claim("a CPU offload tier turns GPU evictions into hits: a higher prefix hit rate and a lower TTFT for "
                        "a load-only router", "vLLM KV offloading connector / LMCache docs (CPU offloading raises the "
                        "hit rate, cuts TTFT)", "higher hit rate, lower TTFT (no number)",
                        f"hit rate (all tiers) {fmt(hit)}; TTFT {fmt(ttft, '%')}",
                        *holds_verdict(hit.lo > 0 and ttft.hi < 0, f"hit rate change {hit.mean:+.3f}, TTFT change "
                                       f"{ttft.mean:+.1f} %"), hit.as_json()))
    per_seed = lambda r, t: res.records[res.labels.index(_label(r, t))].metrics["hit_rate_all"].per_seed
    gap = summarize(np.asarray(per_seed(load, both)) - np.asarray(per_seed(load, "gpu-only"))
                    - (np.asarray(per_seed(aware, both)) - np.asarray(per_seed(aware, "gpu-only"))))
    claims.append(Claim("cache-aware routing gains less from the tiers than load-only routing: it already keeps each "
                        "prefix on few replicas", "llm-d / LMCache (offloading complements prefix-aware routing)",
                        "smaller gain (no number)",
                        f"hit-rate gain of {load} minus that of {aware}, both tiers: {fmt(gap)}",
                        *holds_verdict(gap.lo > 0, f"difference {gap.mean:+.3f}"), gap.as_json()))
    sh = _gain(res, load, shared, "hit_rate_all")
    shared_hits = res.records[res.labels.index(_label(load, shared))].metrics["hit_rate_shared"]
    claims.append(Claim("a shared tier (LMCache-style store) lets a replica reuse prefixes another replica computed",
                        "LMCache docs (KV sharing across instances)", "hits from the shared tier (no number)",
                        f"{load}: hit rate from the shared tier {fmt(shared_hits)}; hit rate (all tiers) {fmt(sh)} over "
                        "the GPU alone", *holds_verdict(shared_hits.lo > 0 and sh.lo > 0,
                                                         f"shared hits {shared_hits.mean:.3f}"), sh.as_json()))
    return claims


def adapters_study(ctx: Context) -> Section:
    """Adapter affinity against load-only and cache-aware routing across adapter counts and skews."""
    seeds, n = _seeds(ctx, LORA_SIZES["seeds"]), _size(ctx, LORA_SIZES["requests"])
    dep = dict(gpu="a6000", model_name="mistral-7b", tp=1)
    start = time.perf_counter()
    wl = build_workload("toolbench", n)
    lora = lora_variants(LORA_COUNTS, LORA_SKEWS, dep["gpu"], dep["model_name"], dep["tp"])
    rows = policy_rows(list(LORA_ROUTERS), rate=LORA_RATE, lora=lora, **dep)
    res = run_cluster(rows, wl, replicas_n=LORA_REPLICAS, seeds=seeds, lora_slots=LORA_SLOTS)
    ctx.advance("adapters")
    wall = time.perf_counter() - start
    variant = lambda k, s: f"{k}ad-zipf{s:g}"
    lab = lambda r, k, s: f"{r}+{variant(k, s)}"
    claims = []
    mid = (32, 1.0)
    fewer = paired_difference(res, "adapter_loads", lab("llmd_lora", *mid), lab("llmd_load", *mid), relative=True)
    every = [paired_difference(res, "adapter_loads", lab("llmd_lora", k, s), lab("llmd_load", k, s)).mean
             for k in LORA_COUNTS for s in LORA_SKEWS]
    claims.append(Claim("adapter-affinity routing loads fewer adapters than load-only routing (llm-d's lora-affinity "
                        "scorer: prefer pods where the adapter runs)", "llm-d-router scorer/loraaffinity/"
                        "lora_affinity.go; BLIS lora-affinity", "fewer loads (no number)",
                        f"loads at {mid[0]} adapters, zipf {mid[1]:g}: {fmt(fewer, '%')}; fewer in "
                        f"{sum(d < 0 for d in every)} of {len(every)} (count, skew) cells",
                        *holds_verdict(fewer.hi < 0, f"change {fewer.mean:+.1f} %: the scorer's 0.8 for a replica "
                                       "with room for another adapter spreads new adapters as much as load does"),
                        fewer.as_json()))
    hard = (max(LORA_COUNTS), min(LORA_SKEWS))
    ttft = paired_difference(res, "ttft_mean_s", lab("llmd_lora", *hard), lab("llmd_load", *hard), relative=True)
    claims.append(Claim("where adapters outnumber the slots, affinity routing serves faster than load-only routing",
                        "llm-d / AIBrix LoRA-aware routing (their purpose)", "lower TTFT (no number)",
                        f"TTFT at {hard[0]} adapters, zipf {hard[1]:g}: {fmt(ttft, '%')}",
                        *holds_verdict(ttft.hi < 0, f"change {ttft.mean:+.1f} %"), ttft.as_json()))
    grow = paired_difference(res, "adapter_loads", lab("llmd_load", max(LORA_COUNTS), min(LORA_SKEWS)),
                             lab("llmd_load", min(LORA_COUNTS), max(LORA_SKEWS)))
    claims.append(Claim("more adapters and a flatter popularity mean more adapter loads (S-LoRA: serving thousands of "
                        "adapters is bound by their swapping)", "S-LoRA (Sheng et al., 2023) section 1 and 7",
                        "more loads (no number)",
                        f"llmd_load loads at {max(LORA_COUNTS)} adapters, zipf {min(LORA_SKEWS):g} minus at "
                        f"{min(LORA_COUNTS)}, zipf {max(LORA_SKEWS):g}: {fmt(grow)}",
                        *holds_verdict(grow.lo > 0, f"difference {grow.mean:+.1f}"), grow.as_json()))
    conserved = all(int(np.max(res.grid.metrics["conservation_error"][c])) == 0 for c in range(len(res.labels)))
    return Section(
        SOURCE, "lora_adapters", "LoRA adapters: affinity, load-only and cache-aware routing",
        intro=f"toolbench at {LORA_RATE:g} req/s on {LORA_REPLICAS} x {dep['model_name']} on {dep['gpu']}, "
              f"{LORA_SLOTS} adapter slots per replica (vLLM's max_loras; a request whose adapter cannot join waits), "
              f"rank-16 adapters (2.35 ms to load over PCIe, BLIS's 3.5 % step overhead per distinct adapter); "
              f"adapters {', '.join(map(str, LORA_COUNTS))} x Zipf exponents {', '.join(f'{s:g}' for s in LORA_SKEWS)} "
              f"x routers {', '.join(LORA_ROUTERS)}: {len(rows)} rows in one compiled grid, {seeds} seeds x {n} "
              f"requests ({wall:.0f} s; docs/adapters.md). Every run conserves requests: "
              f"{'yes' if conserved else 'NO'}.",
        claims=claims, tables=[("adapter loads, hit rate, TTFT (s) of the hot and cold adapters' requests",
                                records_table(res.records, LORA_METRICS + ("ttft_mean_s",)))],
        data={"seeds": seeds, "requests": n, "wall_s": wall, "records": [r.as_json() for r in res.records]},
        seeds=seeds)


EXPERIMENTS = [Experiment(SOURCE, f"tiers_{job}", f"KV offload tiers on {job}", tiers_study(job), lambda q: 1)
               for job in TIER_JOBS] + [
    Experiment(SOURCE, "lora_adapters", "LoRA adapters across counts and skews", adapters_study, lambda q: 1)]
