"""The routers people run (llm-d, Dynamo, SGLang gateway, vLLM production-stack, AIBrix) on one cluster.

8 replicas of Qwen3-32B, each on 2 x H100 (TP 2; KV capacity from memory at 90 %), behind every production
router, on three workloads (inference-perf's shared-prefix, toolbench, the Mooncake trace in ../shared/data) at
a ladder of arrival rates: one experiment per workload. Every (router, rate) pair of a workload is one row of
ONE compiled grid, run on the same seeds, so router differences are paired. The claims are the routers' own
(docs, blogs) and the lecture's (§2, §6, §7), checked at the top rung of each ladder (past least-load's knee).

The Mooncake trace replays the same requests on every seed (its CIs come only from the routers' coin flips);
`rate` rescales its recorded times to each rung of the ladder.
"""

from __future__ import annotations

import time

import numpy as np

from jaxroute import report
from jaxroute.experiments import paired_difference
from jaxroute.experiments.cluster import build_workload, policy_rows, run_cluster
from jaxroute.metrics import Summary, summarize
from jaxroute.reproduce.document import (
    Claim,
    Context,
    Experiment,
    Section,
    fmt,
    holds_verdict,
    markdown_table,
    records_table,
)

SOURCE = "production-routers"
ROUTERS = ("random", "llmd_precise", "llmd_approx", "llmd_load", "llmd_load_aware", "dynamo_kv",
           "sglang_cache_aware", "sglang_power_of_two", "vllm_prefixaware", "vllm_session", "vllm_kvaware",
           "aibrix_prefix_cache", "aibrix_least_request")
# Per workload: a rate ladder (requests/s on the 8-replica cluster) from light load to past least_load's
# knee (where its queue starts to grow: ~700 req/s for shared-prefix, which max_running = 64 bounds;
# ~150 for toolbench; ~8 for Mooncake's 10k-40k-token prompts), and the run size (Mooncake replays one
# trace, so its seeds differ only in the routers' coin flips, and each request is costly to simulate).
LADDER = {"shared-prefix": dict(rates=(150.0, 400.0, 650.0, 800.0), requests=1000, seeds=8),
          "toolbench": dict(rates=(40.0, 90.0, 130.0, 160.0), requests=1000, seeds=8),
          "mooncake": dict(rates=(2.0, 5.0, 8.0), requests=300, seeds=2)}
# --quick: 2 seeds, the ladder's first and last rung, fewer requests (Mooncake's 10k-40k-token prompts are slow)
QUICK_REQUESTS = {"shared-prefix": 200, "toolbench": 200, "mooncake": 20}
COLS = ("ttft_p90_s", "output_tokens_per_s", "mean_latency_s", "hit_rate", "queue_mean", "kv_usage_mean",
        "preemptions", "max_replica_share")
CLUSTER = dict(gpu="h100", model_name="qwen3-32b", tp=2)
REPLICAS = 8
# each project's cache-aware router beside its own cache-blind one (Dynamo's other modes are random / round robin)
PAIRS = {"llm-d": ("llmd_precise", "llmd_load"), "SGLang": ("sglang_cache_aware", "sglang_power_of_two"),
         "AIBrix": ("aibrix_prefix_cache", "aibrix_least_request"), "Dynamo": ("dynamo_kv", "random")}
GUARDED = ("llmd_precise", "dynamo_kv", "sglang_cache_aware", "aibrix_prefix_cache")  # cache-aware + a load term
DESCRIPTION = {"shared-prefix": "inference-perf's shared-prefix defaults: 10 groups x 10 prompts, 100 + 50 tokens, 50 out",
               "toolbench": "toolbench: 500 tools, Zipf 1.1, ~1,900-token prompts",
               "mooncake": "the Mooncake trace's first requests: 10k-40k-token prompts, its arrival times rescaled"}


def run_workload(name, rates, routers, *, replicas, requests, seeds, progress=False, capacities=None):
    """Every (router, rate) row of one workload in one compiled grid: (Results, wall seconds)."""
    wl = build_workload(name, requests)
    rows = []
    for rate in rates:
        rows += [(f"{p}@{rate:g}", params) for p, params in policy_rows(routers, rate=rate, **CLUSTER)]
    start = time.perf_counter()
    res = run_cluster(rows, wl, replicas_n=replicas, seeds=seeds, progress=progress, capacities=capacities)
    return res, time.perf_counter() - start


def ratio_verdict(ours: Summary, source: float, factor: float = 1.3, what: str = "") -> tuple[str, str]:
    """A claimed ratio (source > 1: a gain, < 1: a cut) against per-seed ratios: reproduced when the source's
    lies in our CI or within `factor` of our mean; direction only when our CI is clear of 1 on its side."""
    clear = ours.lo > 1 if source > 1 else ours.hi < 1
    if not clear:
        return "differs", f"our ratio {ours.mean:.3g}x: its CI reaches 1 or the other side{what}"
    if ours.lo <= source <= ours.hi or 1 / factor <= ours.mean / source <= factor:
        return "reproduced", ""
    return "direction only", f"same direction, ours {ours.mean:.3g}x against {source:g}x{what}"


def _ratio(res, metric, a, b) -> Summary:
    """Per-seed a / b of one metric (rows on common seeds)."""
    m = res.metrics[metric]
    return summarize(m[res.index(a)] / np.maximum(m[res.index(b)], 1e-12))


def _pairs_verdict(diffs: dict[str, Summary], sign: float, what: str) -> tuple[str, str]:
    """Several paired changes that should all have `sign`: reproduced when every CI is clear of 0 on that side,
    direction only when every mean is but some CI is not, differs when some mean is on the other side."""
    wrong = [k for k, d in diffs.items() if d.mean * sign < 0]
    flat = [k for k, d in diffs.items() if d.mean == 0]
    noisy = [k for k, d in diffs.items() if not (d.lo > 0 if sign > 0 else d.hi < 0)]
    if wrong or flat:
        return "differs", "; ".join(([f"{what} goes the other way for {', '.join(wrong)}"] if wrong else [])
                                    + ([f"{what} does not move for {', '.join(flat)}"] if flat else []))
    if noisy:
        return "direction only", f"right direction, but within noise for {', '.join(noisy)}"
    return "reproduced", ""


def _claims(res, rates) -> tuple[list[Claim], list[list]]:
    """The sources' claims at the top rung, and a per-router table of the changes they rest on."""
    top, low = rates[-1], rates[0]
    at = lambda p, rate=top: f"{p}@{rate:g}"
    rec = lambda p, rate=top: res.record(at(p, rate)).metrics
    diff = lambda metric, a, b, rel=False, rate=top: paired_difference(res, metric, at(a, rate), at(b, rate),
                                                                        relative=rel)
    claims = []
    fair = 2.0 / REPLICAS
    top_hit = max(rec(p)["hit_rate"].mean for p in ROUTERS)

    def bare(verdict: tuple[str, str]) -> tuple[str, str]:
        """A cache claim's verdict, its reason noting when the requests share (almost) no prefix to act on."""
        if verdict[0] == "reproduced" or top_hit >= 0.05:
            return verdict
        return verdict[0], verdict[1] + f"; the requests share almost no prefix here (best hit rate {top_hit:.3f})"

    hits = {k: diff("hit_rate", a, b) for k, (a, b) in PAIRS.items()}
    claims.append(Claim(
        "prefix/KV-aware routing raises the cache hit rate over load-only routing at the same load",
        "lecture §6; llm-d precise-prefix guide; SGLang v0.4 blog; AIBrix, Dynamo router docs", "higher (no number)",
        "; ".join(f"{k} {a} - {b}: {fmt(hits[k])}" for k, (a, b) in PAIRS.items()),
        *bare(_pairs_verdict(hits, +1, "the hit rate"))))
    ttft = {k: diff("ttft_p90_s", a, b, True) for k, (a, b) in PAIRS.items()}
    claims.append(Claim(
        f"... and so cuts TTFT against load-only or random routing at the same load ({top:g} req/s)",
        "lecture §6; Dynamo router docs (cache reuse improves TTFT); llm-d blog", "lower (no number)",
        "; ".join(f"{k}: {fmt(ttft[k], '%')}" for k in PAIRS), *bare(_pairs_verdict(ttft, -1, "TTFT p90"))))
    why = " ('up to', on SGLang's own testbed)"
    hr = _ratio(res, "hit_rate", at("sglang_cache_aware"), at("random"))
    claims.append(Claim("SGLang's cache-aware load balancer: 3.8x higher cache hit rate (ours: against random)",
                        "SGLang v0.4 blog (Dec 2024)", "up to 3.8x", fmt(hr, "x"), *bare(ratio_verdict(hr, 3.8, what=why)),
                        hr.as_json()))
    tp = _ratio(res, "output_tokens_per_s", at("sglang_cache_aware"), at("random"))
    claims.append(Claim("... and up to 1.9x throughput (ours: output tokens/s against random)", "SGLang v0.4 blog",
                        "up to 1.9x", fmt(tp, "x"), *ratio_verdict(tp, 1.9, what=why), tp.as_json()))
    fast = _ratio(res, "ttft_p90_s", at("random"), at("llmd_precise"))
    claims.append(Claim("llm-d precise prefix-cache-aware scheduling: 57x faster responses than cache-blind scheduling "
                        "(ours: TTFT p90 of random / llmd_precise)", "llm-d blog 'KV-Cache Wins You Can See'",
                        "57x", fmt(fast, "x"),
                        *ratio_verdict(fast, 57.0, what=" (llm-d's figure is from its own benchmark and load)"),
                        fast.as_json()))
    tp = _ratio(res, "output_tokens_per_s", at("llmd_precise"), at("random"))
    claims.append(Claim("... and double the throughput on identical hardware (ours: output tokens/s against random)",
                        "llm-d blog 'KV-Cache Wins You Can See'", "2x", fmt(tp, "x"),
                        *ratio_verdict(tp, 2.0, what="; the output rate follows the offered load while both keep up"),
                        tp.as_json()))
    pa = diff("hit_rate", "llmd_precise", "llmd_approx")
    claims.append(Claim("precise scoring (the replicas' KV events) hits more than the approximate (router-side) index",
                        "llm-d blog 'KV-Cache Wins You Can See'", "higher (no number)", fmt(pa, "hit rate"),
                        *bare(holds_verdict(pa.lo > 0, f"precise - approximate hit rate {pa.mean:+.3f}, CI reaches 0")),
                        pa.as_json()))
    share = rec("vllm_prefixaware")["max_replica_share"]
    if share.mean >= 0.9:
        herd = ("reproduced", "")
    elif share.lo > fair:
        herd = ("direction only", f"it herds (share {share.mean:.2f} against a fair {1 / REPLICAS:.3f}) but not "
                                  "every request lands on one replica")
    else:
        herd = ("differs", f"its busiest replica's share {share.mean:.2f}: the CI reaches 2x fair ({fair:.2f})")
    claims.append(Claim("pure affinity (no threshold, no load term: production-stack prefix-aware) herds: a shared "
                        "system prompt draws every request to one replica", "lecture §2, §8 pitfall 3",
                        "share 1.0 (all on one)", fmt(share, "busiest replica's share"), *bare(herd), share.as_json()))
    lb, lb_low = diff("ttft_p90_s", "llmd_load", "random", True), diff("ttft_p90_s", "llmd_load", "random", True, low)
    claims.append(Claim(f"load-aware routing beats random past the knee (TTFT p90, llmd_load vs random, {top:g} req/s)",
                        "lecture §1, §7 point 1", "lower (no number)",
                        fmt(lb, "%") + f" (at {low:g} req/s: {fmt(lb_low, '%')})",
                        *holds_verdict(lb.hi < 0, f"llmd_load's TTFT p90 differs by {lb.mean:+.0f} % from random's, CI reaches 0"),
                        lb.as_json()))
    shares = {p: rec(p)["max_replica_share"] for p in GUARDED}
    over = [p for p, s in shares.items() if s.mean >= fair]
    claims.append(Claim("cache affinity with a load guard keeps both: the hits (first claim) and replica shares "
                        "near even",
                        "lecture §6 (SGLang's router), §7 point 2", f"share < {fair:.2f} (2x fair)",
                        "; ".join(f"{p} {fmt(s)}" for p, s in shares.items()),
                        *holds_verdict(not over, f"{', '.join(over)} take {fair:.2f} or more of the requests")))
    table = []
    for p in ROUTERS:
        hit = diff("hit_rate", p, "random") if p != "random" else None
        t = diff("ttft_p90_s", p, "random", True) if p != "random" else None
        table.append([p, fmt(rec(p)["hit_rate"]), "" if hit is None else fmt(hit), fmt(rec(p)["ttft_p90_s"], "s"),
                      "" if t is None else fmt(t, "%"), fmt(rec(p)["max_replica_share"])])
    return claims, table


def _plot(res, rates, name: str, path, seeds: int, requests: int) -> None:
    panels = {}
    for k, (metric, title) in enumerate((("ttft_p90_s", "TTFT p90 (s, log)"), ("output_tokens_per_s", "output tokens/s"))):
        lines = []
        for i, p in enumerate(ROUTERS):
            s = [res.record(f"{p}@{rate:g}").metrics[metric] for rate in rates]
            style = dict(color=f"C{i % 10}", ls="-" if i < 10 else "--", marker="o", ms=3)
            lines.append(dict(x=list(rates), **report.ci_band(s, log=k == 0), **style,
                              **({"label": p} if k == 0 else {})))
        panels[f"{name}: {title}"] = lines
    report.line_plot(panels, path, xlabel="arrival rate (requests/s)",
                     ylabel={f"{name}: TTFT p90 (s, log)": "TTFT p90 (s), 95 % CI",
                             f"{name}: output tokens/s": "output tokens/s, 95 % CI"}, ylog=(f"{name}: TTFT p90 (s, log)",),
                     title=f"production routers, {REPLICAS} x Qwen3-32B (TP 2, H100), {seeds} seeds x {requests} requests")


def study(name: str):
    """The experiment of one workload: every router at every rung, claims at the top rung, a PNG."""

    def run(ctx: Context) -> Section:
        size = LADDER[name]
        seeds = ctx.seeds or (2 if ctx.quick else size["seeds"])
        requests = QUICK_REQUESTS[name] if ctx.quick else size["requests"]
        rates = (size["rates"][0], size["rates"][-1]) if ctx.quick else size["rates"]
        # quick: local queues that hold every request from the start (a herding router overflows the default,
        # and the grid's rerun at twice the size would double the compile time; full size keeps the default)
        res, elapsed = run_workload(name, rates, ROUTERS, replicas=REPLICAS, requests=requests, seeds=seeds,
                                    capacities={"max_queue": requests} if ctx.quick else None)
        ctx.advance(name)
        kv = res.records[0].params["kv_capacity"]
        n_sim = len(res.records) * seeds * requests
        ctx.log(f"{name}: {REPLICAS} x Qwen3-32B on 2 x H100 (KV {kv:,} tokens), {seeds} seeds x {requests} requests; "
                f"{n_sim:,} requests in {elapsed:.1f} s ({n_sim / elapsed:,.0f} simulated requests/s, compilation "
                "included)")
        tables = []
        for rate in rates:
            recs = [r for r in res.records if r.policy.endswith(f"@{rate:g}")]
            tables.append((f"{name} at {rate:g} requests/s (means ± 95 % CI over {seeds} seeds)",
                           records_table(recs, COLS, label=lambda r: r.policy.split("@")[0])))
        claims, against = _claims(res, rates)
        tables.insert(0, (f"every router against random at {rates[-1]:g} requests/s (paired over seeds; the claims' "
                          "numbers)", markdown_table(["router", "hit rate", "hit rate - random's", "TTFT p90",
                                                      "TTFT p90 vs random", "busiest replica's share"], against)))
        fig, file = ctx.figure(SOURCE, f"routers_{name.replace('-', '_')}")
        _plot(res, rates, name, fig, seeds, requests)
        return Section(SOURCE, f"routers_{name.replace('-', '_')}", f"Production routers on {name}",
                       intro=f"{DESCRIPTION[name]}. {REPLICAS} replicas of Qwen3-32B, each on 2 x H100 (TP 2, {kv:,} "
                             f"KV tokens); rates {', '.join(f'{r:g}' for r in rates)} requests/s; {seeds} seeds x "
                             f"{requests} requests; all {len(res.records)} (router, rate) rows in one compiled grid "
                             f"({elapsed:.0f} s, compilation included). Formulas and defaults come from each project's "
                             "code (cited in jaxroute/routers/{llmd,dynamo,sglang,vllm_stack,aibrix}.py).",
                       claims=claims, tables=tables,
                       figures=[(f"{name}: TTFT p90 (log) and output tokens/s against the arrival rate, 95 % CI "
                                 "bands (cut at 0, and at half the mean on the log axis)", file)],
                       data={"cluster": dict(CLUSTER, replicas=REPLICAS), "rates": list(rates), "seeds": seeds,
                             "requests": requests, "elapsed_s": elapsed, "records": [r.as_json() for r in res.records]},
                       seeds=seeds)

    return run


EXPERIMENTS = [Experiment(SOURCE, f"routers_{w.replace('-', '_')}", f"every production router on {w}", study(w),
                          lambda q: 1) for w in LADDER]
