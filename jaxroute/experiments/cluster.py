"""Replica cluster with prefix caches: routers on the same seeds, workloads by name, capacities grown on overflow."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from jaxroute.clusters import replicas
from jaxroute.clusters.names import (
    DEFAULT_CHUNK,
    DEFAULT_MAX_RUNNING,
    LORA_DEFAULTS,
    LORA_SLOTS,
    REPLICA_GPU,
    REPLICA_MODEL,
)
from jaxroute.clusters.replicas import adapters as lora_lib
from jaxroute.clusters.replicas import tiers as tier_lib
from jaxroute.errors import JaxrouteError
from jaxroute.experiments.comparison import Comparison, Results, Row, run_with_retry
from jaxroute.experiments.names import (
    CLUSTER_WORKLOADS,
    LENGTH_WORKLOADS,
    check_cluster_workload,
)
from jaxroute.routers import preble
from jaxroute.routers.names import DEFAULT_E2_TH_BAL, DEFAULT_E2_WINDOW_S, DEFAULT_THETA
from jaxroute.routers.parts import SCORERS
from jaxroute.routers.prefix import PRESETS, REGISTRY
from jaxroute.workloads import prefix as wl_prefix
from jaxroute.workloads import traces

WORKLOADS = CLUSTER_WORKLOADS  # synthetic prefix workloads, then traces (experiments/names.py)
METRICS = replicas.METRICS
# Preble's decision statistics (routers/preble.py `stats`), summarised when a row runs a Preble preset
E2_METRICS = ("e2_mean_L_s", "e2_mean_M_s", "e2_mean_P_s", "e2_exploits", "e2_rebalanced", "e2_paired",
              "e2_autoscaled")
# Fixed capacities of the replica model and the bool metric that says each one overflowed.
# where every request ended, per seed: each record carries these (the JSON too); `unaccounted` picks the rows to show
ACCOUNTING = ("completed", "in_flight_end", "dropped", "not_arrived")
CAPACITY_FLAGS = {"max_queue": "queue_overflow", "router_window": "e2_ring_overflow", "cache_slots": "cache_full"}
TIER_FLAGS = {"cpu_slots": "tier_full", "shared_slots": "tier_full"}
# the offload tiers' metrics (clusters/replicas/tiers.py), summarised when the rows have tiers
TIER_METRICS = ("hit_rate_all", "hit_rate_cpu", "hit_rate_shared", "kv_loaded_gb", "kv_offloaded_gb")
# the adapters' metrics (clusters/replicas/adapters.py), summarised when the rows have adapters
LORA_METRICS = ("adapter_loads", "adapter_hit_rate", "ttft_mean_hot_s", "ttft_mean_cold_s", "ttft_p90_hot_s",
                "ttft_p90_cold_s")


def build_workload(name: str, requests: int, trace: str | None = None, hot_tool: float = 0.0, *,
                   shared_prefix: dict | None = None, rate_stages=None):
    """A prefix workload by CLI name (synthetic, or a trace adapted to segment form).

    shared_prefix: settings of the shared-prefix workload (keys of `wl_prefix.SP_DEFAULTS`; None or
    empty = inference-perf's defaults). rate_stages: [(requests/s, seconds), ...] for staged Poisson load
    (a trace's recorded arrivals are time-warped to them; realize at `workload.stage_mean_rate`).
    """
    check_cluster_workload(name, trace, hot_tool, shared_prefix, rate_stages)
    if name in wl_prefix.PREFIX_WORKLOADS:
        kw = {"hot_tool_share": hot_tool} if name == "toolbench" else dict(shared_prefix or {})
        unknown = set(kw) - ({"hot_tool_share"} | set(wl_prefix.SP_DEFAULTS))
        if unknown:
            raise JaxrouteError(f"unknown shared-prefix settings: {', '.join(sorted(unknown))}; "
                                f"choose from: {', '.join(wl_prefix.SP_DEFAULTS)}")
        wl = wl_prefix.synthetic(name, requests, **kw)
        return wl_prefix.with_rate_stages(wl, rate_stages) if rate_stages else wl
    if name in LENGTH_WORKLOADS:
        return lengths_workload(name, requests)
    path = trace or wl_prefix.DEFAULT_TRACE_PATHS[name]
    trace = traces.load_named(name, path).head(requests)
    wl = wl_prefix.from_mooncake(trace) if name == "mooncake" else wl_prefix.from_azure(trace, name=name)
    return wl_prefix.with_rate_stages(wl, rate_stages) if rate_stages else wl


def lengths_workload(name: str, requests: int, seed: int = 0) -> wl_prefix.TracePrefixWorkload:
    """A decode workload's lengths (numpy `seed`) as a replayed trace of private prompts: its Poisson arrivals
    at `workloads.decode.SYNTHETIC_RATE_PER_S`, rescaled by the run's rate (an infinite rate: all at once)."""
    from jaxroute.workloads.decode import make_decode_requests

    req = make_decode_requests(name, requests, seed=seed)
    wl = wl_prefix.from_azure(traces.Trace(name, req.arrival_s, req.prompt_tokens, req.output_tokens), name=name)
    return dataclasses.replace(wl, table=dataclasses.replace(wl.table, key_id=jnp.asarray(req.key_id, jnp.int32)))


def uses_weights(policy: str) -> bool:
    """Whether a preset scores with `RouterParams.weights` (llm-d's presets, weighted)."""
    return "weights" in PRESETS[policy].defaults


def weights_label(weights: dict) -> str:
    return ",".join(f"{k}={v:g}" for k, v in weights.items())


PREBLE_PRESETS = tuple(name for name, p in PRESETS.items() if p.spec.module == "preble")


def e2_variants(pairing=None, autoscale=None) -> list[dict]:
    """Preble rows' switch settings: the product of the pairing and autoscaling values given (lists of
    bools; None = the preset's own), as make_params keywords."""
    grid = [{}]
    for key, values in (("e2_pairing", pairing), ("e2_autoscale", autoscale)):
        if values:
            grid = [dict(v, **{key: bool(x)}) for v in grid for x in values]
    return grid


def e2_label(settings: dict) -> str:
    return ",".join(f"{k.removeprefix('e2_')}={'on' if v else 'off'}" for k, v in settings.items())


def policy_rows(policies, *, rate=1.0, stale=0.0, kv_capacity=None, gpu=REPLICA_GPU, model_name=REPLICA_MODEL,
                cost_model="roofline", theta=DEFAULT_THETA, e2_window_s=DEFAULT_E2_WINDOW_S,
                e2_th_bal=DEFAULT_E2_TH_BAL, tp=1,
                weights: list[dict] | None = None, router: dict | None = None,
                e2_switches: list[dict] | None = None, cost_factors=None,
                control: list[tuple[str, object]] | None = None,
                tiers: list[tuple[str, object]] | None = None,
                lora: list[tuple[str, object]] | None = None, latency=None) -> list[tuple]:
    """(label, params) rows, all with the same settings (each replica is tp GPUs). `weights`: scorer
    weight vectors ({scorer: w}, unnamed = 0) for the presets that use weights, one row per preset and
    vector (labelled `preset[prefix=3,kv=2]` when there are several); other presets get one row.
    `e2_switches`: Preble's switch settings (`e2_variants`), one row per preble preset and setting
    (labelled `preble[pairing=off,autoscale=on]` when there are several).
    `router`: more router settings for every row (module settings such as dyn_overlap_weight).
    `cost_factors`: the roofline's fitted factors for every row (`cost_models.CostFactors`; None: the defaults).
    `latency`: the trained latency model's coefficients for every row (None: the shipped ones).
    `control`: (label, ControlParams) autoscaler and gateway variants (`experiments.control.variants`): every
    router row runs each, labelled `router+variant`. `tiers`: (label, TierParams) KV offload tier variants
    (`tier_variants`), and `lora`: (label, LoraParams) adapter variants (`lora_variants`), crossed with the rest
    the same way."""
    if weights and not any(uses_weights(p) for p in policies):
        raise JaxrouteError("--weights applies to the weighted presets (" +
                            ", ".join(p for p in PRESETS if uses_weights(p)) + "); none is selected")
    if e2_switches and e2_switches != [{}] and not any(p in PREBLE_PRESETS for p in policies):
        raise JaxrouteError("--e2-pairing and --e2-autoscale apply to " + " and ".join(PREBLE_PRESETS) +
                            "; none is selected")
    rows = []
    for p in policies:
        if weights and uses_weights(p):
            variants = [{"weights": w} for w in weights]
        elif e2_switches and p in PREBLE_PRESETS:
            variants = list(e2_switches)
        else:
            variants = [{}]
        for v in variants:
            name = weights_label(v["weights"]) if "weights" in v else e2_label(v)
            label = p if not v or len(variants) == 1 else f"{p}[{name}]"
            kw = dict(router or {}, **v)
            for c_label, c_params in control or [(None, None)]:
                for t_label, t_params in tiers or [(None, None)]:
                    for a_label, a_params in lora or [(None, None)]:
                        name = "+".join(x for x in (label, c_label, t_label, a_label) if x is not None)
                        rows.append((name, replicas.make_params(
                            p, rate=rate, stale_s=stale, kv_capacity=kv_capacity, gpu=gpu, model=model_name,
                            cost_model=cost_model, tp=tp, theta=theta, e2_window_s=e2_window_s, e2_th_bal=e2_th_bal,
                            cost_factors=cost_factors, control=c_params, tiers=t_params, lora=a_params,
                            latency=latency, **kw)))
    return rows


def unfinished_records(records) -> list:
    """Records in which some seed left a request unfinished: in flight at the end, dropped or never arrived."""
    return [r for r in records if any(max(r.metrics[k].per_seed) > 0 for k in ACCOUNTING[1:] if k in r.metrics)]


def _is_e2(p: replicas.ReplicaParams) -> bool:
    return REGISTRY.name(int(np.asarray(p.policy))) in PREBLE_PRESETS


def row_info(p: replicas.ReplicaParams) -> dict:
    """The JSON description of a row's params."""
    out = {"rate": float(p.rate), "theta": float(p.router.theta), "stale_s": float(p.stale_s),
           "kv_capacity": int(p.kv_capacity)}
    name = REGISTRY.name(int(np.asarray(p.policy)))
    if uses_weights(name):
        w = np.asarray(p.router.weights)
        out["weights"] = {k: float(v) for k, v in zip(SCORERS, w, strict=True) if v != 0}
    if p.control is not None:
        out["control"] = control_info(p.control)
    for name in ("tiers", "lora"):
        if (part := getattr(p, name)) is not None:
            out[name] = {f: np.asarray(getattr(part, f)).item() for f in part.__dataclass_fields__}
    if _is_e2(p):
        th = float(p.router.e2_th_bal)
        out.update(e2_window_s=float(p.router.e2_window_s), e2_th_bal=th if math.isfinite(th) else None,
                   e2_pairing=bool(p.router.e2_pairing), e2_autoscale=bool(p.router.e2_autoscale))
    return out


def control_info(c) -> dict:
    """The JSON description of a row's control settings (names as `control.make` takes them)."""
    from jaxroute.clusters.names import CLASSES, FAIRNESS, GATES, SCALE_METRICS, SCALERS

    out = {}
    for field in c.__dataclass_fields__:
        v = np.asarray(getattr(c, field))
        names = {"scaler": SCALERS, "gate": GATES, "metric": SCALE_METRICS, "fairness": FAIRNESS}.get(field)
        if names is not None:
            out[field] = names[int(v)]
        elif field == "class_mix":
            out[field] = {k: float(x) for k, x in zip(CLASSES, v, strict=True) if x > 0}
        elif field == "tenant_mix":
            out[field] = [float(x) for x in np.trim_zeros(v, "b")]
        else:
            out[field] = v.item() if math.isfinite(float(v)) else None
    return out


def tier_slots(workload, params) -> dict[str, int]:
    """Slot tables of the offload tiers that never fill: a tier holds its capacity plus what one iteration moves
    down into it (the GPU's victims, at most the KV capacity)."""
    most = lambda field: max(int(np.asarray(getattr(p.tiers, field))) for p in params)
    kv, cpu, shared = max(int(np.asarray(p.kv_capacity)) for p in params), most("cpu_tokens"), most("shared_tokens")
    lengths = workload.segment_lengths()
    return {"cpu_slots": replicas.slot_bound(lengths, cpu + kv), "shared_slots": replicas.slot_bound(lengths, shared + kv)}


def tier_variants(cpu_gib, shared_gib, gpu: str, model: str, tp: int = 1, settings: dict | None = None) -> list[tuple]:
    """(label, TierParams) rows: every CPU tier size (GiB per replica) with every shared tier size (GiB), labelled
    `cpu64G`, `shared512G`, `cpu64G+shared512G`, or `gpu-only` (both 0)."""
    rows = []
    for c in cpu_gib or [0.0]:
        for s in shared_gib or [0.0]:
            label = "+".join(x for x, v in ((f"cpu{c:g}G", c), (f"shared{s:g}G", s)) if v) or "gpu-only"
            rows.append((label, tier_lib.make(gpu, model, tp, **dict(settings or {}, cpu_gib=c, shared_gib=s))))
    return rows


def lora_variants(counts, zipf, gpu: str, model: str, tp: int = 1, settings: dict | None = None,
                  label: bool = True) -> list[tuple]:
    """(label, LoraParams) rows: every adapter count with every popularity exponent, labelled `16ad-zipf1`
    (`label` False: a trace's own adapters, labelled `adapters`)."""
    rows = []
    settings = dict(settings or {})
    if "rank" in settings:
        settings["rank"] = int(settings["rank"])
    for k in counts:
        for s in zipf or [LORA_DEFAULTS["zipf_s"]]:
            rows.append((f"{k}ad-zipf{s:g}" if label else "adapters",
                         lora_lib.make(gpu, model, tp, **dict(settings, n_adapters=k, zipf_s=s))))
    return rows


def initial_capacities(workload, params, n_replicas: int) -> dict[str, int]:
    """Local queue, E2 ring and cache-table sizes to start from (E2's ring is 0 when no row runs a Preble preset;
    the cache table holds as many segments as the largest KV capacity can, so it never fills)."""
    n = workload.n_requests
    e2 = [p for p in params if _is_e2(p)]
    kv = max(int(np.asarray(p.kv_capacity)) for p in params)
    caps = {"max_queue": replicas.default_max_queue(n, n_replicas), "router_window": 0,
            "cache_slots": replicas.slot_bound(workload.segment_lengths(), kv)}
    if e2:
        rate = max(float(p.rate) for p in e2)
        window = max(float(p.router.e2_window_s) for p in e2)
        caps["router_window"] = preble.default_window(rate, window, n_replicas, n)
    return caps


def run_cluster(rows, workload, *, replicas_n=4, seeds=16, local="fcfs", chunk=DEFAULT_CHUNK,
                max_running=DEFAULT_MAX_RUNNING, seed=0, progress=False, label_params=None, max_tries=4,
                capacities: dict[str, int | None] | None = None, admission="reserve",
                priority_groups=10, extra_metrics=(), request_records: bool = False,
                lora_slots: int = LORA_SLOTS) -> Results:
    """Run (label, ReplicaParams) rows on the same seeds in one compiled grid (see `policy_rows`).

    The local queue and Preble E2's ring start from `initial_capacities` and are doubled (the
    grid rerun) while one overflowed; `capacities` overrides their starting sizes (None = default;
    an E2 ring only matters when some row runs a Preble preset). label_params is added to every record's params. The router
    keeps a stale view only when some row has stale_s > 0. admission: the replicas' KV admission,
    "reserve" or "on-demand" (vLLM V1 with preemption; see clusters/replicas/iteration.py). local: the
    replicas' local order, "fcfs", "lpm" or "priority" (Preble's `priority_groups` groups). extra_metrics:
    more of the model's metrics to summarise into the records (e.g. p99_latency_low_hit_s). request_records:
    keep every request's record in the metrics (`experiments.requests.request_table`). lora_slots: adapters a
    replica holds at once, when the rows have adapters (`lora_variants`).
    """
    params = [p for _, p in rows]
    stale_view = any(float(p.stale_s) > 0 for p in params)
    names = tuple(sorted({REGISTRY.name(int(np.asarray(p.policy))) for p in params}))
    for cap in {int(np.asarray(p.kv_capacity)) for p in params}:
        wl_prefix.check_fits(workload, cap)
    rows = [Row(name, p, dict(label_params or {}, **row_info(p))) for name, p in rows]
    caps = initial_capacities(workload, params, replicas_n)
    control = params[0].control is not None
    if any((p.control is not None) != control for p in params):
        raise JaxrouteError("either every row has control settings (an autoscaler or gateway) or none")
    kv_tiers = params[0].tiers is not None
    if any((p.tiers is not None) != kv_tiers for p in params):
        raise JaxrouteError("either every row has KV offload tiers or none")
    if kv_tiers:
        caps.update(tier_slots(workload, params))
    lora = params[0].lora is not None
    if any((p.lora is not None) != lora for p in params):
        raise JaxrouteError("either every row has LoRA adapters or none")
    adapter_ids = 0
    if lora:
        adapter_ids = max(wl_prefix.trace_adapters(workload) or 1, max(int(np.asarray(p.lora.n_adapters)) for p in params))
    if control:
        from jaxroute.experiments import control as ctl_exp

        # a replica may hold every request while the cluster is small: the local queue holds them all
        caps.update(ctl_exp.sizes(workload, params), replica_slots=replicas_n, max_queue=workload.n_requests,
                    gateway_queue=ctl_exp.gateway_size(workload, params))
        flags_control = {"control_ticks": "unfinished", "control_log": "scale_log_full",
                         "replica_slots": "replica_slots_full"}
    for name, size in (capacities or {}).items():
        if size is not None and (name != "router_window" or caps["router_window"] > 0):
            caps[name] = int(size)
    flags = {k: v for k, v in CAPACITY_FLAGS.items() if caps[k] > 0}
    if control:
        flags.update(flags_control)
    if kv_tiers:
        flags.update(TIER_FLAGS)

    def run(caps):
        model = replicas.ReplicaModel(
            n_replicas=caps.get("replica_slots", replicas_n), chunk=chunk, max_running=max_running, max_queue=caps["max_queue"],
            local_order=local, stale_view=stale_view, router_window=caps["router_window"],
            router_policies=names, admission=admission, cache_slots=caps["cache_slots"],
            priority_groups=priority_groups, request_records=request_records, control=control, kv_tiers=kv_tiers,
            lora_slots=lora_slots if lora else 0, adapter_ids=adapter_ids,
            **({k: caps[k] for k in TIER_FLAGS} if kv_tiers else {}),
            **({k: caps[k] for k in ("control_ticks", "control_history", "control_log", "gateway_queue")}
               if control else {}))
        metrics = (METRICS + ACCOUNTING + (E2_METRICS if any(_is_e2(p) for p in params) else ())
                   + tuple(extra_metrics))
        if control:
            metrics += ctl_exp.METRICS + ctl_exp.class_metric_names()
        if kv_tiers:
            metrics += TIER_METRICS
        if lora:
            metrics += LORA_METRICS
        return Comparison(model, rows, seeds, metrics, workload=workload, seed=seed, chunk=1000,
                          progress="cluster" if progress else False).run()

    results, _ = run_with_retry(run, caps, flags, max_tries=max_tries)
    return results
