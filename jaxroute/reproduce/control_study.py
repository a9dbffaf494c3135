"""The control plane around the router: replica autoscaling under a stepped load, and gateway admission in overload.

Deployment: Mistral-7B on A6000 replicas (the lecture's; the roofline's anchors), router llm-d precise prefix.
A replica takes `PROVISION_S` = 30 s from the scale-up to ready (an assumption: the 14.5 GB of weights read at
~1 GB/s plus the engine's start; no source states one for this pair). SLO per request: TTFT <= 2 s and TPOT <=
0.1 s; attainment counts shed requests as misses, goodput is requests within the SLO per second.

1. Autoscaling on toolbench stepped 10 -> 40 -> 10 req/s (120 s, 180 s, 300 s; Poisson within each stage): the
   capacity of one replica is searched first (`experiments.capacity`, TTFT p90 <= 2 s), and sizes the SLA
   planner (Dynamo's rule: ceil(rate / one replica's rate)) and the fixed rows (minimum 1, maximum 8). Rows:
   fixed minimum, fixed maximum, HPA on waiting requests (target 4 per replica; Kubernetes' defaults: 15 s
   sync, tolerance 0.1, 300 s scale-down window), HPA with a 60 s window, KPA (Knative's 2 s tick, 60 s / 6 s
   windows, panic at 2x; target: one replica's requests in flight at its capacity, by Little's law), KPA with
   its panic mode off, and the SLA planner (30 s interval). One compiled grid.
2. The same on the Mooncake trace (its recorded arrivals time-warped to the same 10 -> 40 -> 10 profile, scaled to
   its prompts: `traces` keep their burstiness within a stage), on H100 replicas of Llama-3.1-8B.
3. Overload with priority bands: 4 fixed replicas at twice their capacity, 30 % critical and 70 % batch requests
   (GAIE priorities 4 and -1: batch is sheddable); gateways none, saturation (GAIE's detector, llm-d's legacy
   admission), tier_shed (BLIS) and flow_control (llm-d's flow-control queue: requests wait by band).
"""

from __future__ import annotations

import math
import time

import numpy as np

from jaxroute.errors import JaxrouteError
from jaxroute.experiments import capacity as cap_lib
from jaxroute.experiments import control as ctl_exp
from jaxroute.experiments.cluster import build_workload, policy_rows, run_cluster
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
ROUTER = "llmd_precise"
PROVISION_S = 30.0
SLO_TTFT_S, SLO_TPOT_S = 2.0, 0.1
STAGES = [(10.0, 120.0), (40.0, 180.0), (10.0, 300.0)]  # toolbench's; a trace takes the same multiples of capacity
QUICK_STAGES = [(10.0, 20.0), (40.0, 30.0), (10.0, 40.0)]
TOOLBENCH_CAPACITY = 9.3  # req/s of one replica on toolbench at TTFT p90 <= 2 s (this study's search, full size)
MAX_REPLICAS = 8
SIZES = {"seeds": 8, "capacity_requests": 1200}
QUICK = {"seeds": 2}
# one replica's capacity and requests in flight there, as the full run's search found them (a quick run's)
QUICK_CAPACITY = {"toolbench": (9.29, 25.5), "mooncake": (0.964, 2.45)}
SLO = dict(slo_ttft_s=SLO_TTFT_S, slo_tpot_s=SLO_TPOT_S)
# per workload: deployment (gpu, model) and the trace's rate scale: toolbench is synthetic (rates as given)
DEPLOYMENTS = {"toolbench": ("a6000", "mistral-7b"), "mooncake": ("h100", "llama-3.1-8b")}
TRACE_REQUESTS = 3993  # the Mooncake trace's requests (all of them)
TABLE = ("slo_attainment", "goodput_rps", "ttft_p90_s", "mean_ready", "peak_ready", "gpu_hours", "scale_ups",
         "scale_downs")


def _seeds(ctx: Context) -> int:
    return ctx.seeds or (QUICK if ctx.quick else SIZES)["seeds"]


def _replica_capacity(name: str, ctx: Context, gpu: str, model: str) -> tuple[float, float]:
    """(req/s one replica sustains at TTFT p90 <= 2 s, requests in flight there by Little's law); a quick run
    takes the full run's (`QUICK_CAPACITY`: the search's code paths are the capacity study's)."""
    if ctx.quick:
        return QUICK_CAPACITY[name]
    n = SIZES["capacity_requests"]
    wl = build_workload(name, n)
    ev = cap_lib.cluster_evaluator([(ROUTER, 1)], wl, seeds=4, gpu=gpu, model_name=model)
    res = cap_lib.search(ev, 1, 0.2, 60.0, cap_lib.parse_slo(f"ttft_p90_s<={SLO_TTFT_S:g}"), max_rounds=6)
    rate = float(np.nanmean(res.capacity))
    if not math.isfinite(rate):
        raise JaxrouteError(f"the capacity search on {name} found no rate meeting TTFT p90 <= {SLO_TTFT_S:g} s")
    (_, p), = policy_rows([ROUTER], rate=rate, gpu=gpu, model_name=model)
    one = run_cluster([("one", p)], wl, replicas_n=1, seeds=2, extra_metrics=())
    in_flight = rate * one.records[0].metrics["mean_latency_s"].mean
    return rate, in_flight


def _rows(per_replica: float, in_flight: float, gpu: str, model: str, rate: float):
    """(label, settings) of the autoscaling rows."""
    hpa = dict(scaler="hpa", metric="waiting", target=4.0)
    kpa = dict(scaler="kpa", target=max(in_flight, 1.0))
    variants = [("fixed-min", dict(scaler="fixed", initial=1)),
                ("fixed-max", dict(scaler="fixed", min_replicas=MAX_REPLICAS)),
                ("hpa", hpa), ("hpa-60s", dict(hpa, down_window_s=60.0)),
                ("kpa", kpa), ("kpa-no-panic", dict(kpa, panic_threshold=1e6)),
                ("sla", dict(scaler="sla", capacity_rps=per_replica, interval_s=30.0))]
    out = []
    for label, s in variants:
        c = ctl_exp.variants([s.pop("scaler")], ["none"], MAX_REPLICAS + 2,
                             dict(SLO, max_replicas=MAX_REPLICAS, provision_s=PROVISION_S, **s))[0][1]
        (_, p), = policy_rows([ROUTER], rate=rate, gpu=gpu, model_name=model, control=[(label, c)])
        out.append((label, p))
    return out


def autoscaling(name: str):
    def run(ctx: Context) -> Section:
        seeds = _seeds(ctx)
        gpu, model = DEPLOYMENTS[name]
        start = time.perf_counter()
        per_replica, in_flight = _replica_capacity(name, ctx, gpu, model)
        stages = QUICK_STAGES if ctx.quick else STAGES
        if name != "toolbench":  # the same profile in multiples of one replica's capacity
            stages = [(r * per_replica / TOOLBENCH_CAPACITY, d) for r, d in stages]
        ctx.advance("capacity of one replica")
        ctx.log(f"{name}: one replica sustains {per_replica:.3g} req/s at TTFT p90 <= {SLO_TTFT_S:g} s "
                f"({in_flight:.3g} requests in flight)")
        n = round(sum(r * d for r, d in stages))
        if name != "toolbench":
            n = min(n, TRACE_REQUESTS)
        wl = build_workload(name, n, rate_stages=stages)
        rows = _rows(per_replica, in_flight, gpu, model, wl.stage_mean_rate)
        res = run_cluster(rows, wl, replicas_n=MAX_REPLICAS + 2, seeds=seeds, request_records=True)
        ctx.advance(f"{name}: {len(rows)} rows")
        wall = time.perf_counter() - start
        from jaxroute.experiments import requests as req_lib

        per_stage = req_lib.stage_summaries(req_lib.request_table(res), stages)
        peak = {label: rows_[1]["ttft_p90_s"] for label, rows_ in zip(res.labels, per_stage, strict=True)}
        fig, file = ctx.figure(SOURCE, f"control_{name}")
        ctl_exp.ready_plot(res, fig, f"{name} stepped {' -> '.join(f'{r:.3g}' for r, _ in stages)} req/s: replicas "
                           f"over time ({ROUTER}, {model} on {gpu})", stages=stages)
        claims = _claims(res, peak)
        rec = {r.policy: r for r in res.records}
        tables = [(f"{name}, {seeds} seeds x {n} requests: SLO TTFT <= {SLO_TTFT_S:g} s and TPOT <= {SLO_TPOT_S:g} s "
                   f"(attainment, goodput req/s), TTFT p90 (s), ready replicas (time mean, peak), GPU-hours, scale "
                   "events", records_table(res.records, TABLE)),
                  ("TTFT p90 (s) per load stage", "| row | " + " | ".join(f"{r:.3g} req/s x {d:g} s" for r, d in stages)
                   + " |\n|---|" + "---|" * len(stages) + "\n" + "\n".join(
                       f"| {label} | " + " | ".join(fmt(s["ttft_p90_s"]) for s in rows_) + " |"
                       for label, rows_ in zip(res.labels, per_stage, strict=True)))]
        data = {"per_replica_rps": per_replica, "per_replica_in_flight": in_flight, "stages": stages,
                "seeds": seeds, "requests": n, "records": [r.as_json() for r in res.records],
                "peak_stage_ttft_p90_s": {k: v.as_json() for k, v in peak.items()}, "wall_s": wall}
        ctx.log(f"{name}: cost (GPU-hours) " + ", ".join(f"{k} {v.metrics['gpu_hours'].mean:.3g}" for k, v in rec.items()))
        return Section(SOURCE, f"control_{name}", f"Autoscaling a stepped load on {name}",
                       intro=f"{ROUTER} on up to {MAX_REPLICAS} replicas of {model} on {gpu}; {name} stepped "
                             f"{', '.join(f'{r:.3g} req/s for {d:g} s' for r, d in stages)}"
                             + ("" if name == "toolbench" else " (toolbench's profile in multiples of one replica's "
                                "capacity; the trace's recorded arrivals time-warped to it, so every seed replays the "
                                "same arrivals: its CIs are router randomness only)")
                             + f"; a scale-up is ready "
                             f"{PROVISION_S:g} s later, a scale-down drains. One replica sustains {per_replica:.3g} "
                             f"req/s at TTFT p90 <= {SLO_TTFT_S:g} s (capacity search), with {in_flight:.3g} requests "
                             f"in flight (KPA's target); the SLA planner divides the rate it measures by it. "
                             f"{len(rows)} rows in one compiled grid, {seeds} seeds ({wall:.0f} s with the search).",
                       claims=claims, tables=tables,
                       figures=[("ready (solid) and billed (dotted: provisioning and draining too) replicas over time, "
                                 "seed 0", file)], data=data, seeds=seeds)

    return run


def _direction(change, why: str) -> tuple[str, str]:
    """A claimed increase: reproduced when its CI is clear of 0, direction only when just its mean is positive."""
    if change.lo > 0:
        return "reproduced", ""
    if change.mean > 0:
        return "direction only", f"{why}; the 95 % CI reaches 0"
    return "differs", why


def _claims(res, peak) -> list[Claim]:
    rec = {r.policy: r for r in res.records}
    att = {k: r.metrics["slo_attainment"] for k, r in rec.items()}
    cost = {k: r.metrics["gpu_hours"] for k, r in rec.items()}
    autos = ("hpa", "hpa-60s", "kpa", "sla")
    meets = [k for k in autos if att[k].mean >= att["fixed-max"].mean - 0.05]
    best = min(meets, key=lambda k: cost[k].mean) if meets else max(autos, key=lambda k: att[k].mean)
    saving = paired_difference(res, "gpu_hours", best, "fixed-max", relative=True)
    gap = paired_difference(res, "slo_attainment", best, "fixed-max")
    claims = [Claim(f"an autoscaler meets the SLO about as well as the fixed maximum at a lower cost (best here: {best})",
                    "Kubernetes HPA / Knative / Dynamo planner docs (the purpose of autoscaling)",
                    "lower cost, attainment within 0.05 (no number)",
                    f"GPU-hours {fmt(saving, '%')} against fixed-max; attainment {fmt(gap)}",
                    *holds_verdict(saving.hi < 0 and gap.mean >= -0.05,
                                   f"cost change {saving.mean:+.0f} %, attainment change {gap.mean:+.3f}"),
                    saving.as_json())]
    miss = paired_difference(res, "slo_attainment", "fixed-min", "fixed-max")
    claims.append(Claim("the fixed minimum misses the SLO at the peak", "capacity planning (no source number)",
                        "lower attainment", f"attainment fixed-min - fixed-max {fmt(miss)}; peak-stage TTFT p90 "
                        f"{fmt(peak['fixed-min'], 's')}", *holds_verdict(miss.hi < 0, f"change {miss.mean:+.3f}"),
                        miss.as_json()))
    panic = paired_difference(res, "slo_attainment", "kpa", "kpa-no-panic")
    ramp_panic, ramp_stable = peak["kpa"], peak["kpa-no-panic"]
    claims.append(Claim("Knative's panic mode reacts to a burst faster than the stable window alone (6 s against 60 s "
                        "averages): better SLO attainment through the step up", "Knative docs, autoscaling "
                        "(stable and panic modes)", "better (no number)",
                        f"attainment kpa - kpa-no-panic {fmt(panic)}; peak-stage TTFT p90 {fmt(ramp_panic, 's')} "
                        f"against {fmt(ramp_stable, 's')}",
                        *_direction(panic, f"attainment change {panic.mean:+.3f}"), panic.as_json()))
    extra = paired_difference(res, "gpu_hours", "hpa", "hpa-60s", relative=True)
    same = paired_difference(res, "slo_attainment", "hpa", "hpa-60s")
    events = paired_difference(res, "scale_downs", "hpa", "hpa-60s")
    claims.append(Claim("HPA's 300 s scale-down stabilisation (the highest recommendation of the window) keeps "
                        "replicas after a peak: more GPU-hours and fewer scale-downs than a 60 s window",
                        "Kubernetes HPA docs and horizontal.go (stabilization window, default 300 s)",
                        "higher cost, less flapping (no number)",
                        f"GPU-hours {fmt(extra, '%')}; scale-downs {fmt(events)}; attainment {fmt(same)}",
                        *_direction(extra, f"cost change {extra.mean:+.1f} %, scale-downs {events.mean:+.2f}"),
                        extra.as_json()))
    return claims


def overload(ctx: Context) -> Section:
    """Priority bands in overload: the critical class inside its SLO while the batch class is shed."""
    seeds = _seeds(ctx)
    gpu, model = DEPLOYMENTS["toolbench"]
    start = time.perf_counter()
    per_replica, in_flight = _replica_capacity("toolbench", ctx, gpu, model)
    replicas = 4
    rate = 2.0 * replicas * per_replica
    n = 400 if ctx.quick else 4000
    wl = build_workload("toolbench", n)
    mix = dict(SLO, class_mix=(0.3, 0.0, 0.7, 0.0, 0.0), min_replicas=replicas,
               tier_threshold=round(in_flight))
    control = ctl_exp.variants(["fixed"], ["none", "saturation", "tier_shed", "flow_control"], replicas, mix)
    rows = policy_rows([ROUTER], rate=rate, gpu=gpu, model_name=model, control=control)
    res = run_cluster(rows, wl, replicas_n=replicas, seeds=seeds)
    ctx.advance("overload")
    wall = time.perf_counter() - start
    labels = res.labels
    none, sat, tier, flow = labels
    rec = {r.policy: r for r in res.records}
    crit = {k: rec[k].metrics["class.critical.ttft_p90_s"] for k in labels}
    shed_batch = {k: rec[k].metrics["class.batch.shed_fraction"] for k in labels}
    shed_crit = {k: rec[k].metrics["class.critical.shed_fraction"] for k in labels}
    claims = []
    for gate in (sat, tier):
        checks = {f"critical TTFT p90 {crit[gate].mean:.3g} s > {SLO_TTFT_S:g} s": crit[gate].mean > SLO_TTFT_S,
                  f"without a gate it is already inside ({crit[none].mean:.3g} s)": crit[none].mean <= SLO_TTFT_S,
                  "critical requests were shed": shed_crit[gate].mean > 0, "no batch request was shed":
                  shed_batch[gate].mean <= 0}
        failed = [k for k, bad in checks.items() if bad]
        ok = not failed
        claims.append(Claim(f"in overload, priority bands keep the high class inside its SLO while the low class is shed "
                            f"({gate.split('+')[-1]})", "llm-d flow control / GAIE (sheddable = negative priority); "
                            "BLIS tier-shed", f"critical TTFT p90 <= {SLO_TTFT_S:g} s; batch shed",
                            f"critical TTFT p90 {fmt(crit[gate], 's')} (no gate: {fmt(crit[none], 's')}); batch shed "
                            f"{fmt(shed_batch[gate])}; critical shed {fmt(shed_crit[gate])}",
                            *holds_verdict(ok, "; ".join(failed)), crit[gate].as_json()))
    batch_wait = {k: rec[k].metrics["class.batch.ttft_p90_s"] for k in labels}
    checks = {f"critical TTFT p90 {crit[flow].mean:.3g} s > {SLO_TTFT_S:g} s": crit[flow].mean > SLO_TTFT_S,
              "a request was shed": rec[flow].metrics["shed_fraction"].mean > 0,
              "batch requests did not wait longer than critical ones": batch_wait[flow].mean <= crit[flow].mean}
    failed = [k for k, bad in checks.items() if bad]
    claims.append(Claim("llm-d's flow control in overload: requests wait at the gateway by priority band, the critical "
                        "band dispatched first keeps its SLO, the batch band waits; nothing is shed",
                        "llm-d / GAIE flow control (pkg/epp/flowcontrol: bands, saturation ceiling)",
                        f"critical TTFT p90 <= {SLO_TTFT_S:g} s; nothing shed",
                        f"critical TTFT p90 {fmt(crit[flow], 's')}; batch TTFT p90 {fmt(batch_wait[flow], 's')}; shed "
                        f"{fmt(rec[flow].metrics['shed_fraction'])}", *holds_verdict(not failed, "; ".join(failed)),
                        crit[flow].as_json()))
    metrics = ("shed_fraction", "class.critical.ttft_p90_s", "class.critical.slo_attainment",
               "class.critical.shed_fraction", "class.batch.ttft_p90_s", "class.batch.shed_fraction",
               "goodput_rps")
    conserved = all(int(np.max(res.grid.metrics["conservation_error"][c])) == 0 for c in range(len(labels)))
    arrived = summarize(np.asarray(res.grid.metrics["completed"] + res.grid.metrics["shed"], float)[0])
    return Section(SOURCE, "control_overload", "Gateway admission in overload: priority bands",
                   intro=f"{ROUTER} on {replicas} fixed replicas of {model} on {gpu}; toolbench Poisson at {rate:.3g} "
                         f"req/s, twice the {replicas} replicas' capacity ({per_replica:.3g} req/s each); 30 % critical "
                         "(priority 4), 70 % batch (priority -1, sheddable). saturation: GAIE's detector (mean over "
                         "replicas of max(waiting / 5, KV / 0.8) >= 1 sheds sheddable classes); tier_shed: BLIS's "
                         f"(the busiest replica over {round(in_flight)} in flight sheds priorities below 3); "
                         "flow_control: llm-d's queue (every request waits by band and tenant, dispatched while "
                         f"saturation < 1, the highest band first; nothing shed). {seeds} "
                         f"seeds x {n} requests ({wall:.0f} s with the capacity search). Every run conserves requests "
                         f"(arrived = completed + shed + in flight): {'yes' if conserved else 'NO'}, "
                         f"{arrived.mean:.0f} of {n} accounted.",
                   claims=claims, tables=[("per class: shed share, TTFT p90 (s), SLO attainment; goodput (req/s)",
                                           records_table(res.records, metrics))],
                   data={"rate": rate, "per_replica_rps": per_replica, "records": [r.as_json() for r in res.records],
                         "wall_s": wall}, seeds=seeds)


EXPERIMENTS = [Experiment(SOURCE, f"control_{w}", f"autoscaling a stepped load on {w}", autoscaling(w), lambda q: 2)
               for w in DEPLOYMENTS] + [
    Experiment(SOURCE, "control_overload", "gateway admission in overload", overload, lambda q: 1)]
