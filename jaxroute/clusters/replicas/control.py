"""The control plane around the router: replica autoscaling and gateway admission (`ReplicaModel.control`).

Lifecycle of a replica (`ControlState.status` [G]): OFF -> PROVISIONING (billed from the scale-up; ready
`provision_s` later: model load, node start) -> READY (the router sees it: `RouterView.active`) -> DRAINING
(no new requests; its queued and running requests finish) -> OFF when it is empty, its cache cleared, so
a replica that comes back is cold. Billing runs from the scale-up to the leave (replica-seconds).

Control events are a third event kind besides arrivals and iterations (ties: control first, so a replica
ready at t takes an arrival at t). Each is the earliest of: a transition of one replica (a provisioning
replica becoming ready at `ready_at`, a drained one leaving at `leave_at`; ties: lowest index) and an
autoscaler tick every `interval_s` (from t = interval_s; transitions first on ties). A drained replica's
`leave_at` is the end of the iteration that emptied it (or the tick that drained an idle one).

At a tick the autoscaler sets a desired count d from what it observes, clamped to [min, max]:
- `fixed`: d = current (the initial count throughout).
- `hpa`, Kubernetes' HorizontalPodAutoscaler (pkg/controller/podautoscaler; citations in docs/control.md):
  the metric (waiting, running, KV usage or requests in flight per ready replica, instantaneous at the
  tick) averaged over the ready replicas, ratio = average / target; within the tolerance (0.1) the
  recommendation is the current count, else ceil(ratio x ready). Scale-down is stabilised: d = the
  highest recommendation of the last `down_window_s` (300 s), this tick's included; a scale-up is
  limited to max(2 x current, current + 4) per tick (the default policies, 100 % or 4 pods per 15 s).
- `kpa`, Knative's pod autoscaler (pkg/autoscaler/scaling/autoscaler.go, AIBrix's KPA): the total
  requests in flight sampled at each tick (every 2 s), averaged over the stable window (60 s) and the
  panic window (6 s); desired stable / panic = ceil(average / target), each kept within the rate
  limits [floor(ready / 2), ceil(1000 x ready)]. Panic starts (or is extended) when the unlimited panic
  count / ready >= panic_threshold (2.0) and ends once a stable window has passed since the last time it
  was over; in panic the count is the highest max(stable, panic) seen in this panic (never lower).
- `sla`, Dynamo's SLA planner (constant load predictor): the arrival rate of the last interval divided by
  `capacity_rps`, a replica's sustainable rate at the SLO (`jaxroute capacity` measures it), rounded up.
Scaling up provisions OFF replicas, lowest index first; scaling down removes provisioning replicas
first, then drains ready ones, highest index first (ready never drops to 0: d >= min >= 1). A scale-up
that finds no OFF replica (all slots provisioning, ready or draining) sets `replica_slots_full`.

Gateway admission, at each arrival (shed requests never reach the router; BLIS sim/admission.go): every
request has a class (GAIE's priorities: critical 4, standard 3, batch -1, sheddable -2, background -3;
sheddable = negative) and a tenant, from the trace's columns (`workloads.traces`) or drawn from `class_mix` /
`tenant_mix`:
- `none`: admit all. `token_bucket`: a request costs its prompt tokens from a bucket of
  `bucket_tokens` refilled at `bucket_refill` tokens/s (full at the start); refused when short.
- `tier_shed`: when the largest in-flight count over the ready replicas exceeds `tier_threshold`,
  classes with priority < `min_priority` are shed.
- `saturation` (GAIE's utilization detector, llm-d's legacy admission): saturation = mean over the ready
  replicas of max(waiting / qd_threshold, KV usage / kv_threshold); sheddable classes are shed at >= 1.
- A tenant budget (any policy; `tenant_budget` > 0): a sheddable request of a tenant whose in-flight
  requests exceed budget x (max_running x ready replicas) is shed first (BLIS TenantBudgetAdmission).
Shed requests are counted, never lost: arrived = completed + shed + dropped + in flight.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute.clusters.names import (
    CLASS_PRIORITY,
    CONTROL_DEFAULTS,
    FAIRNESS,
    GATES,
    SCALE_METRICS,
    SCALER_INTERVAL_S,
    SCALERS,
)
from jaxroute.errors import JaxrouteError

OFF, PROVISIONING, READY, DRAINING = 0, 1, 2, 3
INF = jnp.inf
TENANTS = 8  # tenants a mix may name (a fixed shape: every mix shares one compiled program)
_CLASS_TAG, _TENANT_TAG = 0xC1A5, 0x7E4A  # fold_in tags of the class and tenant draws

DEFAULTS, INTERVAL_S = CONTROL_DEFAULTS, SCALER_INTERVAL_S  # each default defined once (clusters/names.py)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ControlParams:
    """Traced settings of the autoscaler and the gateway (one row of a grid)."""

    scaler: jax.Array  # [] int32 id in SCALERS
    min_replicas: jax.Array  # [] int32
    max_replicas: jax.Array  # [] int32 (<= the model's n_replicas)
    initial: jax.Array  # [] int32 replicas ready at t = 0
    interval_s: jax.Array  # [] float32 time between ticks
    metric: jax.Array  # [] int32 HPA metric id in SCALE_METRICS
    target: jax.Array  # [] float32 HPA metric target / KPA requests in flight per replica
    tolerance: jax.Array  # [] float32 HPA tolerance
    down_window_s: jax.Array  # [] float32 HPA scale-down stabilisation window
    stable_window_s: jax.Array  # [] float32 KPA stable window
    panic_window_s: jax.Array  # [] float32 KPA panic window
    panic_threshold: jax.Array  # [] float32 KPA panic threshold (desired / ready)
    max_up_rate: jax.Array  # [] float32 KPA
    max_down_rate: jax.Array  # [] float32 KPA
    capacity_rps: jax.Array  # [] float32 SLA planner: requests/s one replica sustains within the SLO
    provision_s: jax.Array  # [] float32 scale-up to ready
    gate: jax.Array  # [] int32 id in GATES
    bucket_tokens: jax.Array  # [] float32 token bucket capacity (prompt tokens)
    bucket_refill: jax.Array  # [] float32 tokens per second
    tier_threshold: jax.Array  # [] float32 tier_shed: overload when max in-flight per ready replica exceeds it
    min_priority: jax.Array  # [] int32 tier_shed: lowest priority admitted under overload
    qd_threshold: jax.Array  # [] float32 saturation: waiting requests per replica at saturation 1
    kv_threshold: jax.Array  # [] float32 saturation: KV usage at saturation 1
    tenant_budget: jax.Array  # [] float32 share of the in-flight slots a tenant may hold (0 = no budget)
    class_mix: jax.Array  # [5] float32 class probabilities (CLASSES order)
    tenant_mix: jax.Array  # [TENANTS] float32 tenant probabilities (zero-padded)
    slo_ttft_s: jax.Array  # [] float32 per-request SLO for goodput and attainment (inf = none)
    slo_tpot_s: jax.Array  # [] float32
    gpu_price: jax.Array  # [] float32 price of one GPU-hour (cost = GPU-hours x price; 1 = in GPU-hours)
    band_ceiling: jax.Array  # [] float32 flow_control: the gateway dispatches while saturation < this
    fairness: jax.Array  # [] int32 flow_control: id in FAIRNESS (how a band picks among its tenants)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ControlState:
    status: jax.Array  # [G] int32 OFF / PROVISIONING / READY / DRAINING
    ready_at: jax.Array  # [G] float32 when a provisioning replica becomes ready (inf otherwise)
    leave_at: jax.Array  # [G] float32 when a drained replica leaves (inf: not drained yet)
    up_since: jax.Array  # [G] float32 start of the replica's billing
    billed_s: jax.Array  # [] float32 replica-seconds of replicas that left
    ready_area: jax.Array  # [] float32 integral of the ready count over time
    next_tick: jax.Array  # [] float32
    ticks: jax.Array  # [] int32 ticks done
    hist_t: jax.Array  # [K] float32 tick times (ring; -inf = empty)
    hist_sample: jax.Array  # [K] float32 KPA: requests in flight at the tick
    hist_rec: jax.Array  # [K] int32 HPA: recommendation at the tick
    last_arrivals: jax.Array  # [] int32 arrivals counted at the last tick (SLA planner)
    panic_until: jax.Array  # [] float32 KPA: panic lasts while now < panic_until (-inf: not in panic)
    panic_max: jax.Array  # [] int32 KPA: highest panic desired count in this panic
    ups: jax.Array  # [] int32 replicas added
    downs: jax.Array  # [] int32 replicas removed
    slots_full: jax.Array  # [] bool a scale-up found no OFF replica
    log_t: jax.Array  # [E] float32 time of each change of the ready / billed counts
    log_ready: jax.Array  # [E] int32
    log_billed: jax.Array  # [E] int32
    log_n: jax.Array  # [] int32 entries written (more than E: `scale_log_full`)
    bucket: jax.Array  # [] float32 token bucket level
    bucket_t: jax.Array  # [] float32 its last refill
    tenant_inflight: jax.Array  # [TENANTS] int32 dispatched, unfinished requests per tenant
    shed: jax.Array  # [] int32 requests shed at the gateway


def make(n_replicas: int, **kw) -> ControlParams:
    """Traced control settings from names and numbers (defaults: `DEFAULTS`); bad values get one line."""
    unknown = sorted(set(kw) - set(DEFAULTS))
    if unknown:
        raise JaxrouteError(f"unknown control setting '{unknown[0]}'; choose from: {', '.join(DEFAULTS)}")
    v = {**DEFAULTS, **{k: x for k, x in kw.items() if x is not None}}
    for name, choices in (("scaler", SCALERS), ("metric", SCALE_METRICS), ("gate", GATES), ("fairness", FAIRNESS)):
        if v[name] not in choices:
            raise JaxrouteError(f"unknown {name} '{v[name]}'; choose from: {', '.join(choices)}")
    v["max_replicas"] = n_replicas if v["max_replicas"] is None else v["max_replicas"]
    v["initial"] = v["min_replicas"] if v["initial"] is None else v["initial"]
    v["interval_s"] = INTERVAL_S[v["scaler"]] if v["interval_s"] is None else v["interval_s"]
    mn, mx, ini = v["min_replicas"], v["max_replicas"], v["initial"]
    for name in ("min_replicas", "max_replicas", "initial", "min_priority"):
        if not float(v[name]).is_integer():
            raise JaxrouteError(f"{name} must be a whole number, got {v[name]}")
    if not 1 <= mn <= ini <= mx <= n_replicas:
        raise JaxrouteError(f"replica counts need 1 <= min ({mn}) <= initial ({ini}) <= max ({mx}) <= the model's "
                            f"replica slots ({n_replicas})")
    positive = ("interval_s", "target", "panic_threshold", "max_up_rate", "max_down_rate", "capacity_rps",
                "bucket_tokens", "bucket_refill", "qd_threshold", "band_ceiling")
    for name in positive:
        if not (np.isfinite(v[name]) and v[name] > 0):
            raise JaxrouteError(f"{name} must be a positive number, got {v[name]}")
    for name in ("tolerance", "down_window_s", "stable_window_s", "panic_window_s", "provision_s", "tier_threshold"):
        if not (np.isfinite(v[name]) and v[name] >= 0):
            raise JaxrouteError(f"{name} must be a number >= 0, got {v[name]}")
    if not 0 < v["kv_threshold"] <= 1:
        raise JaxrouteError(f"kv_threshold must be in (0, 1], got {v['kv_threshold']}")
    if not 0 <= v["tenant_budget"] <= 1:
        raise JaxrouteError(f"tenant_budget must be in [0, 1] (a share of the in-flight slots), got {v['tenant_budget']}")
    if not (np.isfinite(v["gpu_price"]) and v["gpu_price"] >= 0):
        raise JaxrouteError(f"gpu_price must be a number >= 0 (per GPU-hour), got {v['gpu_price']}")
    for name in ("slo_ttft_s", "slo_tpot_s"):
        if not v[name] > 0:
            raise JaxrouteError(f"{name} must be > 0 seconds, got {v[name]}")
    mixes = {}
    for name, size in (("class_mix", len(CLASS_PRIORITY)), ("tenant_mix", None)):
        mix = np.asarray(v[name], np.float64).reshape(-1)
        if (size is not None and mix.size != size) or not 0 < mix.size <= TENANTS:
            raise JaxrouteError(f"{name} needs {size or f'1 to {TENANTS}'} shares, got {mix.size}")
        if not (np.all(np.isfinite(mix)) and np.all(mix >= 0) and mix.sum() > 0):
            raise JaxrouteError(f"{name} shares must be >= 0 with a positive sum, got {list(mix)}")
        mixes[name] = jnp.asarray(np.pad(mix / mix.sum(), (0, (size or TENANTS) - mix.size)), jnp.float32)
    i32, f32 = jnp.int32, jnp.float32
    return ControlParams(
        scaler=i32(SCALERS.index(v["scaler"])), min_replicas=i32(mn), max_replicas=i32(mx), initial=i32(ini),
        interval_s=f32(v["interval_s"]), metric=i32(SCALE_METRICS.index(v["metric"])), target=f32(v["target"]),
        tolerance=f32(v["tolerance"]), down_window_s=f32(v["down_window_s"]),
        stable_window_s=f32(v["stable_window_s"]), panic_window_s=f32(v["panic_window_s"]),
        panic_threshold=f32(v["panic_threshold"]), max_up_rate=f32(v["max_up_rate"]),
        max_down_rate=f32(v["max_down_rate"]), capacity_rps=f32(v["capacity_rps"]), provision_s=f32(v["provision_s"]),
        gate=i32(GATES.index(v["gate"])), bucket_tokens=f32(v["bucket_tokens"]), bucket_refill=f32(v["bucket_refill"]),
        tier_threshold=f32(v["tier_threshold"]), min_priority=i32(v["min_priority"]),
        qd_threshold=f32(v["qd_threshold"]), kv_threshold=f32(v["kv_threshold"]),
        tenant_budget=f32(v["tenant_budget"]), class_mix=mixes["class_mix"], tenant_mix=mixes["tenant_mix"],
        slo_ttft_s=f32(v["slo_ttft_s"]), slo_tpot_s=f32(v["slo_tpot_s"]), gpu_price=f32(v["gpu_price"]),
        band_ceiling=f32(v["band_ceiling"]), fairness=i32(FAIRNESS.index(v["fairness"])))


def check(p: ControlParams, n_replicas: int, history: int) -> None:
    """Refuse, before tracing, rows the static sizes cannot run (one line each)."""
    mx = int(np.max(np.asarray(p.max_replicas)))
    if mx > n_replicas:
        raise JaxrouteError(f"max_replicas={mx} exceeds the model's replica slots ({n_replicas}); build it with "
                            f"n_replicas >= max_replicas")
    scaler = np.asarray(p.scaler)
    window = np.where(scaler == SCALERS.index("hpa"), np.asarray(p.down_window_s),
                      np.where(scaler == SCALERS.index("kpa"), np.asarray(p.stable_window_s), 0.0))
    windows = window / np.asarray(p.interval_s)
    if np.max(windows) >= history:
        raise JaxrouteError(f"a window of {float(np.max(windows)):.0f} ticks does not fit the autoscaler's history of "
                            f"{history} ticks; lengthen interval_s or build the model with a larger control_history")


def with_classes(key: jax.Array, p: ControlParams, req):
    """The realised `RequestTable` with each request's class and tenant: the trace's, or drawn from the mixes
    (kept in the table, which no event rewrites, so an event never touches an [N] array)."""
    n = req.arrival_s.shape[0]
    klass = req.klass if req.klass is not None else jax.random.categorical(
        jax.random.fold_in(key, _CLASS_TAG), jnp.log(p.class_mix), shape=(n,))
    tenant = req.tenant if req.tenant is not None else jax.random.categorical(
        jax.random.fold_in(key, _TENANT_TAG), jnp.log(p.tenant_mix), shape=(n,))
    return dataclasses.replace(req, klass=klass.astype(jnp.int32), tenant=tenant.astype(jnp.int32))


def init(p: ControlParams, G: int, history: int, log_len: int) -> ControlState:
    """The state at t = 0: `initial` replicas ready, the first tick one interval on."""
    f = lambda shape, x: jnp.full(shape, x, jnp.float32)
    i = lambda shape, x: jnp.full(shape, x, jnp.int32)
    status = jnp.where(jnp.arange(G) < p.initial, READY, OFF).astype(jnp.int32)
    return ControlState(
        status=status, ready_at=f((G,), INF), leave_at=f((G,), INF), up_since=f((G,), 0.0), billed_s=f((), 0.0),
        ready_area=f((), 0.0), next_tick=p.interval_s, ticks=i((), 0), hist_t=f((history,), -INF),
        hist_sample=f((history,), 0.0), hist_rec=i((history,), 0), last_arrivals=i((), 0), panic_until=f((), -INF),
        panic_max=i((), 0), ups=i((), 0), downs=i((), 0), slots_full=jnp.bool_(False),
        log_t=f((log_len,), 0.0).at[0].set(0.0), log_ready=i((log_len,), 0).at[0].set(p.initial),
        log_billed=i((log_len,), 0).at[0].set(p.initial), log_n=i((), 1), bucket=p.bucket_tokens, bucket_t=f((), 0.0),
        tenant_inflight=i(p.tenant_mix.shape, 0), shed=i((), 0))


def transitions(c: ControlState) -> jax.Array:
    """[G] time of each replica's next transition (inf: none)."""
    return jnp.where(c.status == PROVISIONING, c.ready_at, jnp.where(c.status == DRAINING, c.leave_at, INF))


def next_time(c: ControlState) -> jax.Array:
    return jnp.minimum(jnp.min(transitions(c)), c.next_tick)


@dataclasses.dataclass(frozen=True)
class Observed:
    """What the control plane reads from the cluster at an event ([G] each, over all replica slots)."""

    waiting: jax.Array  # [G] float32 requests in the local queue
    running: jax.Array  # [G] float32
    kv_usage: jax.Array  # [G] float32 KV in use / capacity
    inflight: jax.Array  # [G] float32 dispatched, unfinished
    arrivals: jax.Array  # [] int32 requests arrived so far


def _window_mean(c: ControlState, now, window, samples) -> jax.Array:
    """Mean of the samples of the ticks within (now - window, now]."""
    inside = c.hist_t > now - window
    return jnp.sum(jnp.where(inside, samples, 0.0)) / jnp.maximum(jnp.sum(inside), 1).astype(jnp.float32)


def _decide(c: ControlState, obs: Observed, p: ControlParams, now) -> tuple[jax.Array, ControlState]:
    """(desired count, state with this tick's history) at a tick; `lax.switch` over the policies."""
    ready = c.status == READY
    n_ready = jnp.sum(ready).astype(jnp.int32)
    current = jnp.sum((c.status == READY) | (c.status == PROVISIONING)).astype(jnp.int32)
    r_f = n_ready.astype(jnp.float32)
    slot = c.ticks % c.hist_t.shape[0]
    sample = jnp.sum(obs.inflight)
    c = dataclasses.replace(c, hist_t=c.hist_t.at[slot].set(now), hist_sample=c.hist_sample.at[slot].set(sample))

    def fixed(c):
        return current, c

    def hpa(c):
        per = jnp.stack([obs.waiting, obs.running, obs.kv_usage, obs.inflight])[p.metric]
        ratio = jnp.sum(jnp.where(ready, per, 0.0)) / r_f / p.target
        rec = jnp.where(jnp.abs(ratio - 1.0) <= p.tolerance, current, jnp.ceil(ratio * r_f).astype(jnp.int32))
        c = dataclasses.replace(c, hist_rec=c.hist_rec.at[slot].set(rec))
        inside = c.hist_t > now - p.down_window_s
        stable = jnp.max(jnp.where(inside, c.hist_rec, rec))
        return jnp.minimum(stable, jnp.maximum(2 * current, current + 4)), c

    def kpa(c):
        up, down = jnp.ceil(p.max_up_rate * r_f), jnp.floor(r_f / p.max_down_rate)
        stable = jnp.ceil(_window_mean(c, now, p.stable_window_s, c.hist_sample) / p.target)
        panic = jnp.ceil(_window_mean(c, now, p.panic_window_s, c.hist_sample) / p.target)
        over = panic / r_f >= p.panic_threshold  # on the unclipped panic count, as Knative
        until = jnp.where(over, now + p.stable_window_s, c.panic_until)
        panicking = now <= until
        stable_c, panic_c = (jnp.clip(x, down, up).astype(jnp.int32) for x in (stable, panic))
        pmax = jnp.where(panicking, jnp.maximum(c.panic_max, jnp.maximum(stable_c, panic_c)), 0)
        want = jnp.where(panicking, pmax, stable_c)
        return want, dataclasses.replace(c, panic_until=jnp.where(panicking, until, -INF), panic_max=pmax)

    def sla(c):
        rate = (obs.arrivals - c.last_arrivals).astype(jnp.float32) / p.interval_s
        return jnp.ceil(rate / p.capacity_rps).astype(jnp.int32), c

    want, c = jax.lax.switch(p.scaler, (fixed, hpa, kpa, sla), c)
    c = dataclasses.replace(c, ticks=c.ticks + 1, last_arrivals=obs.arrivals, next_tick=c.next_tick + p.interval_s)
    return jnp.clip(want, p.min_replicas, p.max_replicas), c


def _nth(mask: jax.Array, k: jax.Array, from_top: bool) -> jax.Array:
    """The first k replicas of `mask` by index (or the last k)."""
    m = mask[::-1] if from_top else mask
    pick = m & (jnp.cumsum(m) <= k)
    return pick[::-1] if from_top else pick


def _scale(c: ControlState, want, now, empty: jax.Array, p: ControlParams) -> ControlState:
    """Provision or remove replicas to reach `want` (ready + provisioning)."""
    prov, ready, off = c.status == PROVISIONING, c.status == READY, c.status == OFF
    current = jnp.sum(prov | ready)
    add = _nth(off, jnp.maximum(want - current, 0), from_top=False)
    k = jnp.maximum(current - want, 0)
    cut_p = _nth(prov, k, from_top=True)
    cut_r = _nth(ready, k - jnp.sum(cut_p), from_top=True)
    cut = cut_p | cut_r
    status = jnp.where(add, PROVISIONING, jnp.where(cut, DRAINING, c.status)).astype(jnp.int32)
    return dataclasses.replace(
        c, status=status, ready_at=jnp.where(add, now + p.provision_s, jnp.where(cut_p, INF, c.ready_at)),
        up_since=jnp.where(add, now, c.up_since),
        leave_at=jnp.where(cut & (cut_p | empty), now, c.leave_at),
        ups=c.ups + jnp.sum(add), downs=c.downs + jnp.sum(cut),
        slots_full=c.slots_full | (jnp.sum(add) < want - current))


def control_event(c: ControlState, now, obs: Observed, empty: jax.Array, p: ControlParams, go
                  ) -> tuple[ControlState, jax.Array]:
    """One control event at `now` (applied where `go`): (state, the replica that leaves: its cache is cleared;
    G = none). `empty` [G]: replicas with no queued or running request."""
    G = c.status.shape[0]
    trans = transitions(c)
    g = jnp.argmin(trans)
    is_trans = trans[g] <= c.next_tick
    # a transition: ready, or leave (billing ends)
    becomes = jnp.where(c.status[g] == PROVISIONING, READY, OFF)
    leaves = is_trans & (c.status[g] == DRAINING)
    moved = dataclasses.replace(
        c, status=c.status.at[g].set(becomes), ready_at=c.ready_at.at[g].set(INF), leave_at=c.leave_at.at[g].set(INF),
        billed_s=c.billed_s + jnp.where(leaves, c.leave_at[g] - c.up_since[g], 0.0))
    want, ticked = _decide(c, obs, p, now)
    ticked = _scale(ticked, want, now, empty, p)
    new = jax.tree.map(lambda a, b: jnp.where(is_trans, a, b), moved, ticked)
    changed = jnp.any(new.status != c.status)
    new = _log(new, now, changed)
    out = jax.tree.map(lambda a, b: jnp.where(go, a, b), new, c)
    return out, jnp.where(go & leaves, g, G).astype(jnp.int32)


def _log(c: ControlState, now, when) -> ControlState:
    E = c.log_t.shape[0]
    at = jnp.where(when, c.log_n, E)
    n_ready = jnp.sum(c.status == READY).astype(jnp.int32)
    billed = jnp.sum(c.status != OFF).astype(jnp.int32)
    return dataclasses.replace(c, log_t=c.log_t.at[at].set(now, mode="drop"),
                               log_ready=c.log_ready.at[at].set(n_ready, mode="drop"),
                               log_billed=c.log_billed.at[at].set(billed, mode="drop"), log_n=c.log_n + when)


def advance(c: ControlState, dt) -> ControlState:
    """Integrate the ready count over an interval of `dt` seconds with no control change."""
    return dataclasses.replace(c, ready_area=c.ready_area + jnp.sum(c.status == READY).astype(jnp.float32) * dt)


def drained(c: ControlState, g, empty_after, t_end, go) -> ControlState:
    """After an iteration on g ending at t_end: a draining replica left empty leaves at t_end."""
    hit = go & (c.status[g] == DRAINING) & empty_after & jnp.isinf(c.leave_at[g])
    return dataclasses.replace(c, leave_at=c.leave_at.at[g].set(jnp.where(hit, t_end, c.leave_at[g])))


def admit(c: ControlState, req, i, now, obs: Observed, p: ControlParams, go, max_running: int
          ) -> tuple[ControlState, jax.Array]:
    """The gateway's decision on request i of `req` (its table) arriving at `now` (where `go`): (state, admitted)."""
    ready = c.status == READY
    n_ready = jnp.sum(ready).astype(jnp.float32)
    prio = jnp.asarray(CLASS_PRIORITY, jnp.int32)[req.klass[i]]
    sheddable = prio < 0
    level = jnp.minimum(p.bucket_tokens, c.bucket + jnp.maximum(now - c.bucket_t, 0.0) * p.bucket_refill)
    cost = req.prompt_tok[i].astype(jnp.float32)
    overload = jnp.max(jnp.where(ready, obs.inflight, -INF)) > p.tier_threshold
    rule = jax.lax.switch(p.gate, (
        lambda: jnp.bool_(True),
        lambda: level >= cost,
        lambda: ~(overload & (prio < p.min_priority)),
        lambda: ~(sheddable & (saturation(c, obs, p) >= 1.0)),
        lambda: jnp.bool_(True),  # flow_control: every request waits at the gateway (gateway.py)
    ))
    t = req.tenant[i]
    limit = p.tenant_budget * (max_running * n_ready)
    over = (p.tenant_budget > 0) & sheddable & (c.tenant_inflight[t].astype(jnp.float32) > limit)
    ok = rule & ~over
    is_bucket = p.gate == GATES.index("token_bucket")
    spent = jnp.where(ok & is_bucket, level - cost, level)
    new = dataclasses.replace(
        c, bucket=jnp.where(go & is_bucket, spent, c.bucket), bucket_t=jnp.where(go & is_bucket, now, c.bucket_t),
        tenant_inflight=c.tenant_inflight.at[t].add(jnp.where(go & ok, 1, 0)), shed=c.shed + (go & ~ok))
    return new, ok


def saturation(c: ControlState, obs: Observed, p: ControlParams) -> jax.Array:
    """GAIE's pool saturation: the mean over the ready replicas of max(waiting / qd_threshold, KV usage /
    kv_threshold) (detector.go `Saturation`)."""
    ready = c.status == READY
    per = jnp.maximum(obs.waiting / p.qd_threshold, obs.kv_usage / p.kv_threshold)
    return jnp.sum(jnp.where(ready, per, 0.0)) / jnp.sum(ready).astype(jnp.float32)


def finished(c: ControlState, req, rids: jax.Array, done: jax.Array) -> ControlState:
    """Requests `rids` [B] of `req` finished where `done`: their tenants' in-flight counts drop."""
    n = req.tenant.shape[0]
    t = req.tenant[jnp.clip(rids, 0, n - 1)]
    return dataclasses.replace(c, tenant_inflight=c.tenant_inflight.at[t].add(-done.astype(jnp.int32)))


def replica_seconds(c: ControlState, end) -> jax.Array:
    """Billed replica-seconds up to `end` (the run's last event), replicas still up included."""
    stop = jnp.where((c.status == DRAINING) & jnp.isfinite(c.leave_at), c.leave_at, end)
    return c.billed_s + jnp.sum(jnp.where(c.status != OFF, stop - c.up_since, 0.0))
