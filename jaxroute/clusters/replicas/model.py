"""Replicas with prefix caches: G replicas of one model behind a router (docs/architecture.md).

Event loop (one `step` = one event): if the next arrival is no later than the earliest replica
clock, route it; otherwise run one iteration (`iteration.py`) on the replica with the earliest clock
(ties -> lowest index). An idle replica's clock is +inf until a request is routed to it.

Memory: cached segments + private tokens of running requests <= kv_capacity. Each replica's cache is a
slot table of `cache_slots` (C) segments with locks and LRU stamps, found through the cluster-wide
index `cache_index[G, M+1]` (`cache.py`; the rules are `clusters/prefix_cache.py`'s); its local queue
is a ring in `queue[G, Q]` (`local_queue.py`). `admission` (static) says
how private KV is taken (`iteration.py`): "reserve" (default) reserves the uncached prompt + the whole
output at admission and never preempts; "on-demand" is vLLM V1's rule: KV is allocated step by step
for the tokens computed, and a running request that cannot get its tokens preempts the last admitted
one (recompute; it waits at the front of its local queue; `preemptions` counts them).

Speed: one `step` touches one replica's row only (both event kinds are computed on that row and
the right one kept), and the arrays sized by the trace (`cache_index`, `pending`, `copies` [M+1]) and
by the queue (`queue` [G, Q]) only at points: a step costs O(B + C + touched segments), not O(M) or
O(Q) (an "lpm" admission scans its queue). Writes that would follow a read of the same array in the
same event are logged and made at the next event's start, so XLA updates those arrays in place
instead of copying them each event. A replica leaps over iterations in which nothing but token
counts change. All of it keeps events identical to the plain loop (tests/reference_replicas.py is a
radix-tree reference that the tests match exactly).

Router: the model builds a `RouterView` (in-flight requests and tokens per replica, and the record
of which replica should hold which segment: its cache plus the segments of requests dispatched to it
and not finished, i.e. insert on dispatch) and calls the router's hooks (`routers/prefix.py`):
`on_refresh`, `on_arrival` and `choose` at an arrival, `on_dispatch` after it, `on_admit`, `on_first_token` and `on_finish` after an iteration. The
router's state is one opaque field. With `stale_s` = T > 0 (needs `stale_view`) the loads and the
record are snapshots refreshed every T seconds; dispatches since the snapshot are added at once.
Routing is instantaneous, so a request's dispatch time is its arrival time.

Active replicas: `params.n_active` (traced, <= the static n_replicas; None = all) keeps only the first
n_active replicas in use, so a sweep over replica counts is one compilation. The router sees
`RouterView.active` and never chooses an inactive replica (no requests, its clock stays +inf); only the
routers of `routers.prefix.PARTIAL_OK` support it (`check_params` refuses the others), each deciding
exactly as on a cluster of n_active replicas, so records equal a run with n_replicas = n_active.

Control plane (`control=True`, `params.control`; `control.py` states its rules): an autoscaler changes the
ready replicas at its ticks (scale-ups ready after a provisioning delay, scale-downs drain, a replica that
leaves is cleared and comes back cold) and a gateway may shed an arrival. Control events are a third event
kind (first on ties); the router sees the ready replicas as `RouterView.active` (the routers of `PARTIAL_OK`
only); a leap stops before the next control event; conservation counts the shed requests.

Capacities (each one has its own bool metric, OR-ed into `overflow`; grow it and rerun):
- `max_queue` (Q), the local queue per replica: `queue_overflow` (also when a preempted request finds
  it full; with "lpm", holes left inside the ring count until its head passes them); `default_max_queue`
  sizes it.
- `cache_slots` (C), the cache table per replica: `cache_full` when a segment found no free slot (0 =
  one slot per segment id; `cache.slot_bound` gives the most segments the KV capacity can hold, so a
  table of that size never fills).
- `router_window`, the dispatch-window ring per replica of routers that keep one: the
  router module's own flag; the router module sizes it.
  0 = no window: a router that needs one is refused by `check_params`.
- with `control`: `n_replicas` (the replica slots: a scale-up that finds none free sets `replica_slots_full`),
  `control_log` (`scale_log_full`) and `control_ticks` (a run that needs more ticks is `unfinished`).
- `max_running` (B) is a modeled engine limit (SGLang's max_running_requests), not a capacity:
  requests wait for a slot and `running_full` reports that it bound.

Metrics over the makespan [first arrival, last finish]: `output_tokens_per_s` (output tokens of
completed requests / makespan), `queue_mean` (requests waiting in a local queue, time average per
replica in use) and `kv_usage_mean` (KV in use: locked cached segments + private tokens, / kv_capacity, time
average over the replicas in use; KV is integrated exactly, iteration by iteration, leaped ones included),
and `preemptions` (count).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute import compile_effort, cost_models, sim
from jaxroute import metrics as mlib
from jaxroute.clusters.names import (
    ADMISSIONS,
    CLASSES,
    DEFAULT_CHUNK,
    DEFAULT_MAX_RUNNING,
    GATES,
    LOCAL_ORDERS,
    REPLICA_GPU,
    REPLICA_METRICS,
    REPLICA_MODEL,
)
from jaxroute.clusters.prefix_cache import leading_run
from jaxroute.clusters.replicas import adapters as lora_lib
from jaxroute.clusters.replicas import control as ctl_lib
from jaxroute.clusters.replicas import tiers as tier_lib
from jaxroute.clusters.replicas.cache import (
    Replication,
    SlotTable,
    cached_at,
    cached_mask,
    empty_table,
)
from jaxroute.clusters.replicas.gateway import Gateway
from jaxroute.clusters.replicas.iteration import iterate_row, priority_group
from jaxroute.clusters.replicas.local_queue import Entries, QueueLog, Ring, apply_log
from jaxroute.clusters.replicas.types import (
    NO_SEGMENT_END,
    Replica,
    ReplicaParams,
    ReplicaState,
    Snapshot,
)
from jaxroute.errors import JaxrouteError
from jaxroute.loops import for_each
from jaxroute.routers import prefix as routers
from jaxroute.routers.view import Request, RouterStatic, RouterView
from jaxroute.workloads.prefix.types import trace_adapters

INF = jnp.inf
METRICS = REPLICA_METRICS
_ROUTER_KEY = 0x7E57  # fold_in tag: the router's coin flips never reuse the workload's draws


def make_params(policy: str = "rr", rate: float = 1.0, stale_s: float = 0.0, kv_capacity: int | None = None,
                gpu: str = REPLICA_GPU, model: str = REPLICA_MODEL, cost_model: str = "roofline", tp: int = 1,
                n_active: int | None = None, cost_factors: cost_models.CostFactors | None = None,
                control: ctl_lib.ControlParams | None = None, tiers: tier_lib.TierParams | None = None,
                lora: lora_lib.LoraParams | None = None, latency=None, **router_kw) -> ReplicaParams:
    """Traced params of one row; router settings (`router_kw`) go to the router.

    Each replica is `tp` GPUs (tensor parallel). The KV capacity follows from GPU memory, tp and 90 %
    utilisation unless `kv_capacity` overrides it; either way the weights must fit on the tp GPUs.
    `n_active`: replicas in use, the first n_active of the model's n_replicas (None = all; checked
    against the model by `ReplicaModel.check_params`). Rows stacked into one batch must all set it or
    all leave it None. `cost_factors`: the roofline's fitted factors (`cost_models.CostFactors`; None: the defaults).
    `control`: the autoscaler and gateway settings (`control.make`; a model built with control=True).
    `tiers`: the KV offload tiers (`tiers.make`; a model built with kv_tiers=True).
    `lora`: the LoRA adapters (`adapters.make`; a model built with lora_slots > 0).
    `latency`: the trained latency model's coefficients (`latency_params.LatencyParams`; None: the shipped ones
    when cost_model is "trained").
    """
    pid = routers.REGISTRY.id(policy)
    if stale_s < 0:
        raise JaxrouteError(f"staleness must be >= 0 seconds, got {stale_s}")
    fits = cost_models.kv_capacity_tokens(gpu, model, tp)  # refuses weights that do not fit, tp that cannot split
    cap = fits if kv_capacity is None else int(kv_capacity)
    if cap < 1:
        raise JaxrouteError(f"kv capacity must be >= 1 token, got {cap}")
    if n_active is not None and not (float(n_active).is_integer() and n_active >= 1):
        raise JaxrouteError(f"n_active (replicas in use) must be a whole number >= 1, got {n_active}")
    cost = cost_models.cost_params(gpu, model, tp, kind=cost_model)
    if latency is not None:  # the trained model's own coefficients (`latency_params.LatencyParams`)
        cost = cost_models.with_latency_params(cost, latency)
    if cost_factors is not None:
        cost = cost_models.with_factors(cost, cost_factors)
    return ReplicaParams(jnp.int32(pid), jnp.float32(rate), jnp.float32(stale_s), jnp.int32(cap),
                         routers.router_params(policy, **router_kw), cost,
                         None if n_active is None else jnp.int32(int(n_active)), control, tiers, lora)


def default_max_queue(n_requests: int, n_replicas: int) -> int:
    """Local queue slots per replica to start from: 4 x an even share of the requests, at least 64,
    at most all of them (a run that overflows it sets `queue_overflow`: double it and rerun)."""
    return int(min(n_requests, max(64, 4 * math.ceil(n_requests / n_replicas))))


@dataclasses.dataclass(frozen=True)
class ReplicaModel(sim.Model):
    """Static configuration (shapes); see the module docstring for the model."""

    cpu_rows_together: ClassVar[int | None] = sim.CPU_ROWS_TOGETHER  # branches and loops: rows in groups

    n_replicas: int = 4
    chunk: int = DEFAULT_CHUNK  # prefill tokens per iteration
    max_running: int = DEFAULT_MAX_RUNNING  # B: running requests per replica (a real limit)
    max_queue: int = 256  # Q: local queue per replica (overflow -> queue_overflow)
    max_admit: int = 4  # admissions per iteration
    local_order: str = "fcfs"  # or "lpm", or "priority" (Preble's priority groups)
    priority_groups: int = 10  # P: groups of local order "priority" (Preble's 10)
    stale_view: bool = False  # keep a router snapshot refreshed every params.stale_s seconds
    router_window: int = 0  # dispatch-window ring per replica for routers that keep one (0 = none)
    router_modules: tuple[str, ...] | None = None  # stateful router modules kept (None = router_policies' or all)
    router_policies: tuple[str, ...] | None = None  # presets rows may run (None = all; fewer = a smaller step)
    leap: int = 32  # pure-decode iterations a replica may take in one step (0 = none; exact either way)
    cache_slots: int = 0  # C: segments a replica's cache table holds (0 = every segment id; cache.slot_bound)
    admission: str = "reserve"  # KV admission: "reserve" (prompt + whole output) or "on-demand" (vLLM V1)
    request_records: bool = False  # metrics carry every request's record ("req.<field>", [N] each; `records`)
    control: bool = False  # the control plane: autoscaler and gateway (control.py; params.control)
    control_ticks: int = 4096  # autoscaler ticks a run may take (more: `unfinished`)
    control_history: int = 256  # K: ticks the autoscaler remembers (its windows must fit)
    control_log: int = 512  # E: changes of the ready count recorded ("scale.log_*"; more: `scale_log_full`)
    gateway_queue: int = 0  # requests each (band, tenant) queue of the flow-control gateway holds (0 = no gateway
    #                         queue: gate flow_control is refused; full: `gateway_full`; gateway.py)
    kv_tiers: bool = False  # KV offload tiers under the GPU caches (tiers.py; params.tiers)
    cpu_slots: int = 0  # C2: segments each replica's CPU tier table holds (0 = every segment id; full: `tier_full`)
    shared_slots: int = 0  # C3: segments the shared tier's table holds (0 = every segment id; full: `tier_full`)
    lora_slots: int = 0  # L: LoRA adapters a replica holds at once (vLLM's max_loras; 0 = no adapters; adapters.py)
    adapter_ids: int = 0  # K: adapter ids the run may draw or a trace may name (ids >= K: refused)

    def __post_init__(self):
        if self.n_replicas < 1 or self.chunk < 1 or self.max_running < 1 or self.max_queue < 1 or self.max_admit < 1:
            raise JaxrouteError("replicas, chunk, max_running, max_queue and max_admit must all be >= 1")
        if self.cache_slots < 0:
            raise JaxrouteError(f"cache_slots must be >= 0 (0 = one per segment id), got {self.cache_slots}")
        if self.router_window < 0:
            raise JaxrouteError(f"router_window must be >= 0, got {self.router_window}")
        if self.local_order not in LOCAL_ORDERS:
            raise JaxrouteError(f"unknown local order '{self.local_order}'; choose from: {', '.join(LOCAL_ORDERS)}")
        if self.priority_groups < 1:
            raise JaxrouteError(f"priority groups must be >= 1, got {self.priority_groups}")
        if min(self.control_ticks, self.control_history, self.control_log) < 1:
            raise JaxrouteError("control_ticks, control_history and control_log must all be >= 1")
        if self.lora_slots < 0 or self.adapter_ids < 0 or (self.lora_slots > 0) != (self.adapter_ids > 0):
            raise JaxrouteError("lora_slots and adapter_ids must both be >= 1 (LoRA adapters) or both 0")
        if self.cpu_slots < 0 or self.shared_slots < 0:
            raise JaxrouteError("cpu_slots and shared_slots must be >= 0 (0 = one per segment id)")
        if self.gateway_queue < 0 or (self.gateway_queue and not self.control):
            raise JaxrouteError("gateway_queue needs control=True and must be >= 0")
        if self.admission not in ADMISSIONS:
            raise JaxrouteError(f"unknown admission '{self.admission}'; choose from: {', '.join(ADMISSIONS)}")
        for name in self.router_policies or ():
            routers.REGISTRY.id(name)  # an unknown router: a JaxrouteError naming the choices

    def router_static(self, n_segments: int) -> RouterStatic:
        modules = self.router_modules
        if modules is None and self.router_policies is not None:
            modules = routers.modules_for(self.router_policies)  # the modules its routers need, no others
        return RouterStatic(self.n_replicas, n_segments, self.router_window, modules, self.router_policies)

    # ------------------------------------------------------------------ protocol

    def check_params(self, params: ReplicaParams, workload=None) -> None:
        """Refuse, before tracing: unknown policy ids, a policy the static sizes cannot run (a window
        router with router_window = 0), stale_s > 0 without stale_view (it would be ignored), n_active
        outside 1..n_replicas, and a partial cluster (n_active < n_replicas) for a router that does not
        support one (not in `routers.PARTIAL_OK`)."""
        ids = np.asarray(params.policy).reshape(-1)
        routers.REGISTRY.check_id(ids)
        routers.check(self.router_static(1), {routers.REGISTRY.name(int(i)) for i in ids})
        if self.control != (params.control is not None):
            raise JaxrouteError("control settings need a model built with control=True, and such a model needs them"
                                if params.control is not None else "a model built with control=True needs control "
                                "settings (params.control: control.make)")
        if self.control:
            if params.n_active is not None:
                raise JaxrouteError("n_active and an autoscaler both set the replicas in use; use one")
            if refused := sorted({routers.REGISTRY.name(int(i)) for i in ids} - set(routers.PARTIAL_OK)):
                raise JaxrouteError(f"router '{refused[0]}' cannot run with an autoscaler (its own per-replica state "
                                    f"would outlive a replica that leaves); use one of: {', '.join(routers.PARTIAL_OK)}")
            ctl_lib.check(params.control, self.n_replicas, self.control_history)
            if not self.gateway_queue and np.any(np.asarray(params.control.gate) == GATES.index("flow_control")):
                raise JaxrouteError("gate flow_control needs a model built with gateway_queue > 0 (its queues' size)")
        if self.kv_tiers != (params.tiers is not None):
            raise JaxrouteError("KV tier settings need a model built with kv_tiers=True, and such a model needs them"
                                if params.tiers is not None else "a model built with kv_tiers=True needs tier settings "
                                "(params.tiers: tiers.make)")
        lora = self.lora_slots > 0
        if lora != (params.lora is not None):
            raise JaxrouteError("adapter settings need a model built with lora_slots > 0, and such a model needs them"
                                if params.lora is not None else "a model built with lora_slots > 0 needs adapter "
                                "settings (params.lora: adapters.make)")
        if lora:
            named = None if workload is None else trace_adapters(workload)  # a trace's own adapter column
            most = named if named is not None else int(np.max(np.asarray(params.lora.n_adapters)))
            if most > self.adapter_ids:
                raise JaxrouteError(f"the run names {most} adapters but the model tracks adapter_ids="
                                    f"{self.adapter_ids}; build it with adapter_ids >= {most}")
        if self.kv_tiers and self.stale_view:
            raise JaxrouteError("KV offload tiers with a stale router view are not modelled; use a fresh view (stale 0)")
        if not self.stale_view and np.any(np.asarray(params.stale_s) > 0):
            raise JaxrouteError("stale_s > 0 needs a model built with stale_view=True "
                                "(the router view would silently stay fresh)")
        if params.n_active is not None:
            G = self.n_replicas
            n_act = np.asarray(params.n_active).reshape(-1)
            if n_act.size and (n_act.min() < 1 or n_act.max() > G):
                bad = int(n_act.max()) if n_act.max() > G else int(n_act.min())
                raise JaxrouteError(f"n_active={bad} needs 1 <= n_active <= n_replicas={G} "
                                    f"(build the model with n_replicas >= the largest replica count swept)")
            ids_b, n_b = np.broadcast_arrays(ids, n_act)
            partial = {routers.REGISTRY.name(int(i)) for i in ids_b[n_b < G]}
            if refused := sorted(partial - set(routers.PARTIAL_OK)):
                raise JaxrouteError(f"router '{refused[0]}' cannot run on a partial cluster (n_active < "
                                    f"n_replicas={G}); use n_replicas=n_active instead, or a router that supports "
                                    f"it: {', '.join(routers.PARTIAL_OK)}")

    def num_steps(self, workload) -> int:
        # Also a bound with on-demand admission: every iteration advances its replica's oldest running
        # request, which is never preempted (victims are the last admitted; alone it fits, check_fits),
        # and a readmitted request's steps (recompute chunks + the rest of its output) are no more.
        extra = self.control_ticks * (1 + 2 * self.n_replicas) if self.control else 0  # ticks and transitions
        return int(workload.step_bound(self.chunk)) + extra

    def init(self, key, workload, params: ReplicaParams) -> ReplicaState:
        req = workload.realize(key, params.rate)
        req = dataclasses.replace(req, seg_end=jnp.cumsum(req.seg_tok, axis=1, dtype=jnp.int32))
        if self.control:  # each request's class and tenant (the gateway's)
            req = ctl_lib.with_classes(key, params.control, req)
        if self.lora_slots:  # each request's adapter
            req = dataclasses.replace(req, adapter=lora_lib.draw(key, params.lora, req.adapter,
                                                                 req.arrival_s.shape[0], self.adapter_ids))
        n, m1 = req.arrival_s.shape[0], req.seg_len.shape[0]
        G, B, Q = self.n_replicas, self.max_running, self.max_queue
        C = m1 if self.cache_slots == 0 else min(self.cache_slots, m1)
        q_pre = Q if self.admission == "on-demand" else 1  # preemption fields: unused without preemption
        f = lambda shape, v: jnp.full(shape, v, jnp.float32)
        i = lambda shape, v: jnp.full(shape, v, jnp.int32)
        b = lambda shape: jnp.zeros(shape, bool)
        stack = jnp.broadcast_to(jnp.arange(C - 1, -1, -1, dtype=jnp.int32), (G, C))  # slot 0 on top
        rep = Replica(slot_seg=i((G, C), -1), slot_ref=i((G, C), 0), slot_free=stack, n_free=i((G,), C),
                      slot_last=f((G, C), 0.0), q_head=i((G,), 0), q_span=i((G,), 0), q_count=i((G,), 0),
                      run_req=i((G, B), -1), run_pos=i((G, B), 0), run_gen=i((G, B), 0), run_nseg=i((G, B), 0),
                      run_nend=i((G, B), NO_SEGMENT_END),
                      run_res=i((G, B), 0), run_seq=i((G, B), 0), run_tgt=i((G, B), 0), n_preempt=i((G,), 0),
                      q_cursor=i((G,), self.priority_groups - 1))
        m_snap = m1 if self.stale_view else 1
        view = Snapshot(b((G, m_snap)), f((G,), 0.0), f((G,), 0.0), jnp.float32(-INF), b((G, m_snap)), f((G,), 0.0),
                        f((G,), 0.0), f((G,), 0.0))
        return ReplicaState(
            req=req, rep=rep, router=routers.init(self.router_static(m1)), key=jax.random.fold_in(key, _ROUTER_KEY),
            next_req=jnp.int32(0), now=jnp.float32(0), clock=f((G,), INF), n_admitted=jnp.int32(0),
            kv_used=i((G,), 0), queue_area=jnp.float32(0),
            kv_area=jnp.float32(0), busy_s=f((G,), 0.0),
            inflight=f((G,), 0.0), inflight_tok=f((G,), 0.0), view=view,
            cache_index=i((G, m1), -1), pending=i((G, m1), 0), pending_g=jnp.int32(0),
            pending_req=i((B,), n), pending_add=jnp.int32(0),
            cache_full=jnp.bool_(False), queue=i((G, Q), -1), queue_gen=i((G, q_pre), 0),
            queue_front=i((G, q_pre), 0), queue_log=QueueLog.empty(self._log_len, Q),
            copies=i((m1,), 0), cache_tok=i((G,), 0), unique_tok=jnp.int32(0),
            rec_replica=i((n,), -1), rec_admit=f((n,), INF), rec_first=f((n,), INF), rec_finish=f((n,), INF),
            rec_preempt=i((n,), 0),
            rec_cached=i((n,), 0), rec_group=i((n if self.local_order == "priority" else 1,), 0), rep_area=jnp.float32(0), rep_time=jnp.float32(0), running_full=jnp.bool_(False),
            dropped=jnp.int32(0),
            ctl=ctl_lib.init(params.control, G, self.control_history, self.control_log) if self.control else None,
            gw=Gateway.empty(ctl_lib.TENANTS, self.gateway_queue) if self.gateway_queue else None,
            tiers=tier_lib.init(G, self._slots(self.cpu_slots, m1), self._slots(self.shared_slots, m1), m1)
            if self.kv_tiers else None,
            rec_tier=i((n, 2), 0) if self.kv_tiers else None,
            lora=lora_lib.init(G, self.lora_slots, self.adapter_ids) if self.lora_slots else None)

    @staticmethod
    def _slots(slots: int, m1: int) -> int:
        return m1 if slots == 0 else min(slots, m1)

    @property
    def _log_len(self) -> int:  # local-queue writes one event can make: preemptions, admissions or one dispatch
        return max(self.max_running, self.max_admit)

    def is_done(self, state: ReplicaState) -> jax.Array:
        done = (state.next_req >= state.req.arrival_s.shape[0]) & jnp.all(jnp.isinf(state.clock))
        return done & (state.gw.waiting == 0) if self.gateway_queue else done

    def _view(self, s: ReplicaState, pending, params: ReplicaParams, a, is_route, req: Request):
        """(router view, the snapshot to keep) for a request arriving at `a` (`pending`: the counts now)."""
        cached = cached_mask(s.cache_index, s.rep.slot_seg)  # [G, M+1]: only routers that read it whole materialise these
        record = cached | (pending > 0)
        fresh = Snapshot(record, s.inflight, s.inflight_tok, a, cached, s.rep.q_count.astype(jnp.float32),
                         jnp.sum(s.rep.run_req >= 0, axis=1).astype(jnp.float32),
                         s.kv_used.astype(jnp.float32) / params.kv_capacity.astype(jnp.float32))
        snap = s.view
        if self.stale_view:
            refresh = is_route & (a >= s.view.time + params.stale_s)
            snap = jax.tree.map(lambda new, old: jnp.where(refresh, new, old), fresh, s.view)
            seen = snap
            present, held = seen.present[:, req.segs], seen.cached[:, req.segs]
        else:
            seen = fresh
            held = cached_at(s.cache_index, s.rep.slot_seg, req.segs)  # at the request's segments: O(G x S)
            present = held | (pending[:, req.segs] > 0)
        _, match = leading_run(present, req.tok)
        _, cached_match = leading_run(held, req.tok)
        cpu_match = shared_match = None
        if self.kv_tiers:  # the replicas' caches and offload tiers as their KV events report them (fresh view only)
            in_cpu = held | cached_at(s.tiers.cpu_index, s.tiers.cpu.seg, req.segs)
            in_shared = in_cpu | cached_at(s.tiers.shared_index, s.tiers.shared.seg[None, :], req.segs)
            cpu_match = leading_run(in_cpu, req.tok)[1].astype(jnp.float32)
            shared_match = leading_run(in_shared, req.tok)[1].astype(jnp.float32)
        # replicas the router may choose (None = all: the routers compute what they did without the mask)
        active = None if params.n_active is None else jnp.arange(self.n_replicas) < params.n_active
        if self.control:
            active = s.ctl.status == ctl_lib.READY
        lora_signals = (None, None, None)
        if self.lora_slots:  # the replicas' adapters as vLLM's lora_requests_info metric reports them (fresh)
            lora_signals = lora_lib.view_signals(s.lora, req.adapter, self.lora_slots)
        view = RouterView(now=a, inflight=seen.inflight, tokens=seen.tokens, record=seen.present,
                          locked=pending > 0, match_tokens=match.astype(jnp.float32), cached=seen.cached,
                          cached_match=cached_match.astype(jnp.float32), waiting=seen.waiting, running=seen.running,
                          kv_usage=seen.kv_usage, kv_capacity=params.kv_capacity, cost=params.cost, table=s.req,
                          active=active, routing=is_route, cpu_match=cpu_match,
                          shared_match=shared_match, lora_running=lora_signals[0], lora_waiting=lora_signals[1],
                          lora_room=lora_signals[2])
        return view, snap

    def step(self, state: ReplicaState, workload, params: ReplicaParams) -> ReplicaState:
        """One event. Both kinds are computed on one replica's row and the right one is kept, so a
        batched (vmapped) step costs O(row), not O(whole state)."""
        s, r = state, state.req
        n = r.arrival_s.shape[0]
        i = jnp.minimum(s.next_req, n - 1)
        a = jnp.where(s.next_req < n, r.arrival_s[i], INF)
        m = jnp.min(s.clock)
        t = jnp.minimum(a, m)
        live = jnp.isfinite(t)
        is_route = live & (a <= m)
        is_iter = live & ~is_route
        ctl, gw, is_ctl, req = s.ctl, s.gw, jnp.bool_(False), Request.of(r, i)
        arrive, next_event = is_route, a  # a leap takes only iterations that start before the next other event
        i_route, a_route, gw_refused = i, a, jnp.bool_(False)  # the request routed and when (a gateway release: later)
        if self.control:  # events: control, then a gateway release, then arrival, then iteration, on ties
            obs = self._observed(s, params)
            fc = params.control.gate == GATES.index("flow_control")
            rel_t = INF
            if self.gateway_queue:  # the gateway dispatches now while it holds requests and the pool is unsaturated
                releasable = fc & (gw.waiting > 0) & (ctl_lib.saturation(ctl, obs, params.control)
                                                      < params.control.band_ceiling)
                rel_t = jnp.where(releasable, s.now, INF)
            pending_any = live | jnp.isfinite(rel_t)
            c_t = ctl_lib.next_time(ctl)
            next_event = jnp.minimum(a, c_t)
            if self.gateway_queue:  # an iteration may let the gateway dispatch at its start: then no leap
                next_event = jnp.where(fc & (gw.waiting > 0), m, next_event)
            is_ctl = (c_t <= jnp.minimum(t, rel_t)) & pending_any  # none once the run is done: a done state holds
            is_rel = ~is_ctl & (rel_t <= t) & pending_any
            is_route, is_iter = is_route & ~is_ctl & ~is_rel, is_iter & ~is_ctl & ~is_rel
            t = jnp.minimum(jnp.minimum(t, c_t), rel_t)
            live = pending_any
            ctl = ctl_lib.advance(ctl, jnp.where(live, t - s.now, 0.0))
            arrive = is_route
            ctl, admitted_gw = ctl_lib.admit(ctl, r, i, a, obs, params.control, arrive, self.max_running)
            is_route = arrive & admitted_gw
            empty = (s.rep.q_count == 0) & jnp.all(s.rep.run_req < 0, axis=1)
            ctl, g_leave = ctl_lib.control_event(ctl, t, obs, empty, params.control, is_ctl)
            if self.gateway_queue:  # flow control: an arrival waits at the gateway; a release routes the next one
                gw, j = gw.pop(params.control.fairness, is_rel)
                gw, gw_refused = gw.push(i, r.klass[i], r.tenant[i], is_route & fc)
                is_route = (is_route & ~fc) | is_rel
                i_route, a_route = jnp.where(is_rel, j, i), jnp.where(is_rel, t, a)
                req = Request.of(r, i_route)

        # time-averaged replication factor over [now, t)
        has = s.unique_tok > 0
        dt_ev = jnp.where(live, t - s.now, 0.0)
        ratio = jnp.sum(s.cache_tok) / jnp.maximum(s.unique_tok, 1)
        rep_area = s.rep_area + jnp.where(has, ratio * dt_ev, 0.0)
        rep_time = s.rep_time + jnp.where(has, dt_ev, 0.0)
        queue_area = s.queue_area + jnp.sum(s.rep.q_count).astype(jnp.float32) * dt_ev  # waiting requests over [now, t)

        # ---- routing decision for request i (used only if is_route)
        # the previous event's pending changes, applied before anything reads the counts (so the scatter is
        # their only user and updates them in place: no copy of the [G, M+1] array per event)
        pending = apply_pending(s.pending, s.pending_g, s.pending_req, s.pending_add, r)
        view, snap = self._view(s, pending, params, a_route, is_route, req)
        router = routers.on_refresh(s.router, view, is_route, params.router)
        router = routers.on_arrival(router, view, req, is_route, params.router)
        g_route = routers.choose(router, view, req, params.policy, params.router, jax.random.fold_in(s.key, i_route),
                                 self.router_policies)
        g = jnp.where(is_route, g_route, jnp.argmin(s.clock))
        if self.control:  # a replica leaving: its row (its cache is cleared below)
            g = jnp.where(is_ctl, jnp.minimum(g_leave, self.n_replicas - 1), g)
        row = jax.tree.map(lambda x: x[g], s.rep)
        router = routers.on_dispatch(router, view, req, g, is_route, params.router)

        # ---- the local queue: the last event's writes first (in place), then this event's reads
        on_demand = self.admission == "on-demand"
        queue, queue_gen, queue_front = apply_log(s.queue, s.queue_gen, s.queue_front, s.queue_log, on_demand)
        entries = Entries(queue, queue_gen, queue_front, g)
        ring = Ring(row.q_head, row.q_span, row.q_count, self.max_queue, QueueLog.empty(self._log_len, self.max_queue, g))

        # ---- route: enqueue; the record counts the request's segments at once (insert on dispatch)
        all_segs = req.all_segs
        ring_route, q_ok = ring.push_back(i_route, is_route)

        # ---- iterate (an inactive iteration leaves the cache and the queue as they are); its loops carry
        # the running set, the ring's counters and the [C] cache table only
        table = SlotTable(row.slot_seg, row.slot_free, row.n_free, row.slot_ref, row.slot_last, s.cache_tok[g])
        run = dataclasses.replace(row, slot_seg=None, slot_free=None, n_free=None, slot_ref=None, slot_last=None,
                                  q_head=None, q_span=None, q_count=None)
        it, ring_iter, table, index, acct, table_full, side = iterate_row(
            self, run, ring, entries, table, s.cache_index, g, Replication(s.copies, s.unique_tok), r, m, params,
            s.n_admitted, next_event, is_iter, s.rec_group, s.tiers,
            lora_lib.row(s.lora, g) if self.lora_slots else None)
        # this event's pending changes (dispatch: +1 on the request's segments; iteration: -1 on the finished
        # requests' segments) go to the log
        no_req = jnp.full(side["rid"].shape, n, jnp.int32)
        log_req = jnp.where(is_route, no_req.at[0].set(i_route), jnp.where(is_iter & side["finished"], side["rid"], no_req))
        log_add = jnp.where(is_route, 1, -1).astype(jnp.int32)
        adm_new = is_iter & side["adm_go"] & side["adm_new"]
        router = routers.on_admit(router, dataclasses.replace(view, now=m), g, side["adm_id"], adm_new,
                                  side["adm_tok"], params.router)
        after = dataclasses.replace(view, now=side["t_end"])
        router = routers.on_first_token(router, after, g, side["rid"], is_iter & side["first"], params.router)
        router = routers.on_finish(router, after, g, side["rid"], is_iter & side["finished"], params.router)

        pick = lambda x0, xr, xi: jnp.where(is_route, xr, jnp.where(is_iter, xi, x0))
        ring = jax.tree.map(lambda xr, xi: jnp.where(is_route, xr, xi), ring_route, ring_iter)
        new_row = dataclasses.replace(jax.tree.map(lambda x0, xi: jnp.where(is_iter, xi, x0), run, it),
                                      slot_seg=table.seg, slot_free=table.free, n_free=table.n_free,
                                      slot_ref=table.ref, slot_last=table.last, q_head=ring.head, q_span=ring.span,
                                      q_count=ring.count)
        tiers, rec_tier, lora = s.tiers, s.rec_tier, s.lora
        if self.lora_slots:  # the iteration's adapter row; a dispatch and the finishes change the in-flight counts
            lrow = side["lora"]
            K = self.adapter_ids
            ad_route = jnp.where(is_route & (req.adapter >= 0), req.adapter, K)
            done_a = jnp.where(is_iter & side["finished"], r.adapter[side["rid"]], K)
            inflight_g = lora.inflight[g].at[ad_route].add(1, mode="drop").at[done_a].add(-1, mode="drop")
            slot, last, running = (x.at[g].set(jnp.where(is_iter, v, x[g]))
                                   for x, v in ((lora.slot, lrow.slot), (lora.last, lrow.last), (lora.running, lrow.running)))
            count = lambda total, k: total + jnp.where(is_iter, side[k], 0)
            lora = lora_lib.LoraState(slot, last, running, lora.inflight.at[g].set(inflight_g),
                                      count(lora.loads, "lora_loads"), count(lora.hits, "lora_hits"),
                                      count(lora.asks, "lora_asks"))
        if self.kv_tiers:  # the admissions' loads touched in their tiers, the GPU's victims moved down
            adm = dict(go=side["adm_go"], id=side["adm_id"], n_gpu=side["adm_ngpu"], n_all=side["adm_nall"],
                       cpu_tok=side["adm_cpu"], shared_tok=side["adm_shared"])
            tiers = tier_lib.after_iteration(tiers, params.tiers, g, m, adm, side["evicted"], side["evicted_last"],
                                             r.seg_ids, r.seg_tok, r.seg_len, r.seg_depth, is_iter)
            first_adm = jnp.where(is_iter & side["adm_go"] & side["adm_new"], side["adm_id"], n)
            rec_tier = rec_tier.at[first_adm].set(jnp.stack([side["adm_cpu"], side["adm_shared"]], 1), mode="drop")
        if self.control:
            leaving = is_ctl & (g_leave < self.n_replicas)
            if self.kv_tiers:
                tiers = tier_lib.clear_cpu(tiers, g, leaving)
            if self.lora_slots:  # it comes back with no adapter loaded (none runs on a drained replica)
                lora = dataclasses.replace(lora, slot=lora.slot.at[g].set(jnp.where(leaving, -1, lora.slot[g])),
                                           last=lora.last.at[g].set(jnp.where(leaving, -jnp.inf, lora.last[g])))
            table, acct = clear_cache(table, acct, r.seg_len, leaving)
            new_row = dataclasses.replace(new_row, slot_seg=table.seg, slot_free=table.free, n_free=table.n_free,
                                          slot_ref=table.ref, slot_last=table.last)
            empty_after = (ring.count == 0) & jnp.all(new_row.run_req < 0)
            ctl = ctl_lib.drained(ctl, g, empty_after, side["t_end"], is_iter)
            ctl = ctl_lib.finished(ctl, r, side["rid"], is_iter & side["finished"])
        rep = jax.tree.map(lambda x, v: x.at[g].set(v), s.rep, new_row)
        cache_tok = s.cache_tok.at[g].set(table.tokens)

        # replica-level vectors
        size = (req.prompt + req.out).astype(jnp.float32)
        clock_r = jnp.where(jnp.isinf(s.clock[g]), a_route, s.clock[g])
        clock = s.clock.at[g].set(pick(s.clock[g], clock_r, side["clock"]))
        d_inf = jnp.where(is_route, 1.0, jnp.where(is_iter, -side["n_fin"], 0.0))
        d_tok = jnp.where(is_route, size, jnp.where(is_iter, -side["tok_fin"], 0.0))
        if self.stale_view:  # the router knows its own dispatches at once
            snap = dataclasses.replace(snap, present=snap.present.at[g, all_segs].set(snap.present[g, all_segs] | is_route),
                                       inflight=snap.inflight.at[g].add(jnp.where(is_route, 1.0, 0.0)),
                                       tokens=snap.tokens.at[g].add(jnp.where(is_route, size, 0.0)))
        # waiting requests (both kinds of event); KV in use integrated over the iteration(s)
        kv_used = s.kv_used.at[g].set(table.locked_tokens(r.seg_len) + jnp.sum(new_row.run_res))
        kv_area = s.kv_area + jnp.where(is_iter, side["kv_area"], 0.0)
        busy_s = s.busy_s.at[g].add(jnp.where(is_iter, side["t_end"] - m, 0.0))
        # per-request records: point updates (out-of-range index n = no update); a readmission after a
        # preemption keeps the first admission's time and cached tokens
        nowhere = n
        admitted = jnp.where(is_iter & side["adm_go"] & side["adm_new"], side["adm_id"], nowhere)
        rec_group = s.rec_group
        if self.local_order == "priority":  # the group at dispatch, on g's cache (= at its next iteration's start)
            _, hit = leading_run(cached_at(s.cache_index, s.rep.slot_seg, req.segs)[g], req.tok)
            group = priority_group(hit, req.prompt, self.priority_groups)
            rec_group = rec_group.at[jnp.where(is_route, i_route, nowhere)].set(group, mode="drop")
        return dataclasses.replace(
            s, rep=rep, router=router, view=snap, rec_group=rec_group, now=jnp.where(live, t, s.now), clock=clock, copies=acct.copies,
            unique_tok=acct.unique_tok, cache_tok=cache_tok, cache_index=index, pending=pending,
            pending_g=g, pending_req=log_req, pending_add=log_add,
            cache_full=s.cache_full | table_full, queue=queue, queue_gen=queue_gen, queue_front=queue_front,
            queue_log=ring.log, rep_area=rep_area, rep_time=rep_time,
            next_req=s.next_req + arrive, n_admitted=jnp.where(is_iter, side["n_admitted"], s.n_admitted),
            inflight=s.inflight.at[g].add(d_inf), inflight_tok=s.inflight_tok.at[g].add(d_tok),
            dropped=s.dropped + (is_route & ~q_ok) + jnp.where(is_iter, side["q_refused"], 0) + gw_refused,
            kv_used=kv_used, queue_area=queue_area, kv_area=kv_area, busy_s=busy_s,
            running_full=s.running_full | (is_iter & side["full"]),
            rec_replica=s.rec_replica.at[jnp.where(is_route, i_route, nowhere)].set(g, mode="drop"),
            rec_admit=s.rec_admit.at[admitted].set(m, mode="drop"),
            rec_cached=s.rec_cached.at[admitted].set(side["adm_tok"], mode="drop"),
            rec_first=s.rec_first.at[jnp.where(is_iter & side["first"], side["rid"], nowhere)].set(
                side["t_end"], mode="drop"),
            rec_finish=s.rec_finish.at[jnp.where(is_iter & side["finished"], side["rid"], nowhere)].set(
                side["t_end"], mode="drop"),
            rec_preempt=s.rec_preempt.at[jnp.where(is_iter & (side["preempted"] >= 0), side["preempted"], nowhere)].add(
                1, mode="drop"),
            ctl=ctl, gw=gw, tiers=tiers, rec_tier=rec_tier, lora=lora,
        )

    def _observed(self, s: ReplicaState, params: ReplicaParams) -> ctl_lib.Observed:
        return ctl_lib.Observed(waiting=s.rep.q_count.astype(jnp.float32),
                                running=jnp.sum(s.rep.run_req >= 0, axis=1).astype(jnp.float32),
                                kv_usage=s.kv_used.astype(jnp.float32) / params.kv_capacity.astype(jnp.float32),
                                inflight=s.inflight, arrivals=s.next_req)

    # ------------------------------------------------------------------ results

    def metrics(self, state: ReplicaState, workload, params: ReplicaParams) -> dict[str, jax.Array]:
        r = state.req
        done = jnp.isfinite(state.rec_finish)
        prompt = r.prompt_tok
        first, finish = cost_models.client_times(params.cost, state.rec_first, state.rec_finish, prompt, r.out_tok)
        lat = finish - r.arrival_s
        ttft = first - r.arrival_s
        multi = done & (r.out_tok > 1)
        tpot = (finish - first) / jnp.maximum(r.out_tok - 1, 1)
        arrived = state.next_req
        in_queue = jnp.sum(state.rep.q_count)
        at_gateway = state.gw.waiting if self.gateway_queue else 0  # waiting in the flow-control gateway
        running = jnp.sum(state.rep.run_req >= 0)
        in_flight = in_queue + running + at_gateway  # queued, running, or waiting at the gateway
        completed = jnp.sum(done)
        routed = jnp.maximum(jnp.sum(state.rec_replica >= 0), 1)
        share = jnp.max(jnp.sum(state.rec_replica[None, :] == jnp.arange(self.n_replicas)[:, None], axis=1)) / routed
        fin = lambda x: jnp.where(jnp.isfinite(x), x, 0.0)
        # capacities that filled (each a flag; `unfinished`: the run's event budget ran out); a request lost
        # otherwise shows in conservation_error, never as an overflow
        flags = {"queue_overflow": state.dropped > 0, "cache_full": state.cache_full,
                 "unfinished": ~self.is_done(state), **routers.flags(state.router, params.policy)}
        overflow = jnp.bool_(False)
        # throughput and time averages over [first arrival, last finish]
        span = jnp.max(jnp.where(done, state.rec_finish, -INF)) - jnp.min(r.arrival_s)
        span = jnp.where(completed > 0, span, 0.0)
        per_s = lambda x: jnp.where(span > 0, x / jnp.where(span > 0, span, 1.0), 0.0)
        out_done = jnp.sum(jnp.where(done, r.out_tok, 0)).astype(jnp.float32)
        # per-replica averages over the replicas in use (with an autoscaler: the mean ready count)
        n_rep = self.n_replicas if params.n_active is None else params.n_active.astype(jnp.float32)
        if self.control:
            end = _run_end(state, done)
            n_rep = ctl_lib.advance(state.ctl, end - state.now).ready_area / jnp.maximum(end, 1e-30)
        shed = jnp.int32(0)
        control = {}
        if self.control:
            ctl = state.ctl
            flags.update(replica_slots_full=ctl.slots_full, scale_log_full=ctl.log_n > self.control_log)
            if self.gateway_queue:
                flags["gateway_full"] = state.gw.full
            shed = ctl.shed
            control = self._control_metrics(state, params, done, fin(ttft), fin(tpot), span)
        if self.lora_slots:
            control.update(lora_lib.metrics(state.lora, r.adapter, done, fin(ttft), self.adapter_ids))
        if self.kv_tiers:
            flags["tier_full"] = state.tiers.full
            control.update(tier_lib.metrics(state.tiers, params.tiers, state.rec_cached, state.rec_tier, prompt, done))
        for v in flags.values():
            overflow = overflow | v
        return {
            "mean_latency_s": mlib.masked_mean(fin(lat), done),
            "p99_latency_s": mlib.masked_quantile(fin(lat), done, 0.99),
            # requests that found under half their prompt cached at admission (Preble's low-priority groups)
            "p99_latency_low_hit_s": mlib.masked_quantile(fin(lat), done & (2 * state.rec_cached < prompt), 0.99),
            "ttft_mean_s": mlib.masked_mean(fin(ttft), done),
            "ttft_p99_s": mlib.masked_quantile(fin(ttft), done, 0.99),
            "tpot_mean_s": mlib.masked_mean(fin(tpot), multi),
            "tpot_p90_s": mlib.masked_quantile(fin(tpot), multi, 0.9),
            "hit_rate": jnp.sum(state.rec_cached * done) / jnp.maximum(jnp.sum(prompt * done), 1),
            "replication_factor": jnp.where(state.rep_time > 0, state.rep_area / jnp.maximum(state.rep_time, 1e-30), 1.0),
            "max_replica_share": share,
            "output_tokens_per_s": per_s(out_done),
            "ttft_p90_s": mlib.masked_quantile(fin(ttft), done, 0.9),
            "queue_mean": per_s(state.queue_area / n_rep),
            "kv_usage_mean": per_s(state.kv_area / (n_rep * params.kv_capacity.astype(jnp.float32))),
            "preemptions": jnp.sum(state.rep.n_preempt),
            "completed": completed,
            "running_full": state.running_full,
            **flags,
            **routers.stats(state.router, params.policy),
            "overflow": overflow,
            "dropped": state.dropped,
            # every request is completed, in flight at the end (queued, running, at the gateway), dropped by a full
            # queue, shed by a gate, or not arrived (a run whose event budget ran out): the run's accounting
            "in_flight_end": in_flight,
            "not_arrived": r.arrival_s.shape[0] - arrived,
            "conservation_error": jnp.abs(arrived - (completed + in_flight + state.dropped + shed)),
            **control,
            **({f"req.{k}": v for k, v in request_fields(state, params.cost).items()} if self.request_records else {}),
        }




    def _control_metrics(self, state: ReplicaState, params: ReplicaParams, done, ttft, tpot, span) -> dict:
        """Cost, scaling and per-class metrics of the control plane (`control.py`)."""
        ctl, p, r = state.ctl, params.control, state.req
        n = r.arrival_s.shape[0]
        arrived_mask = jnp.arange(n) < state.next_req
        shed_mask = arrived_mask & (state.rec_replica < 0)
        end = _run_end(state, done)
        seconds = ctl_lib.replica_seconds(ctl, end)
        gpu_hours = seconds * params.cost.tp / 3600.0
        ok = done & (ttft <= p.slo_ttft_s) & ((tpot <= p.slo_tpot_s) | (r.out_tok <= 1))
        per_s = lambda x: jnp.where(span > 0, x / jnp.where(span > 0, span, 1.0), 0.0)
        frac = lambda x, of: jnp.sum(x) / jnp.maximum(jnp.sum(of), 1)
        out = {"shed": ctl.shed, "shed_fraction": frac(shed_mask, arrived_mask),
               "slo_attainment": frac(ok, arrived_mask), "goodput_rps": per_s(jnp.sum(ok).astype(jnp.float32)),
               "replica_seconds": seconds, "gpu_hours": gpu_hours, "cost": gpu_hours * p.gpu_price,
               "mean_ready": ctl_lib.advance(ctl, end - state.now).ready_area / jnp.maximum(end, 1e-30),
               "peak_ready": jnp.max(jnp.where(jnp.arange(ctl.log_ready.shape[0]) < ctl.log_n, ctl.log_ready, 0)),
               "scale_ups": ctl.ups, "scale_downs": ctl.downs, "end_s": end,
               "scale.log_t": ctl.log_t, "scale.log_ready": ctl.log_ready, "scale.log_billed": ctl.log_billed,
               "scale.log_n": ctl.log_n}
        for k, name in enumerate(CLASSES):
            mine = arrived_mask & (r.klass == k)
            out.update({f"class.{name}.arrived": jnp.sum(mine), f"class.{name}.shed_fraction": frac(shed_mask & mine, mine),
                        f"class.{name}.ttft_p90_s": mlib.masked_quantile(ttft, done & mine, 0.9),
                        f"class.{name}.slo_attainment": frac(ok & mine, mine),
                        f"class.{name}.goodput_rps": per_s(jnp.sum(ok & mine).astype(jnp.float32))})
        return out


def _run_end(state: ReplicaState, done) -> jax.Array:
    """The end of the run's last event (a leaped iteration ends after its event's time)."""
    return jnp.maximum(state.now, jnp.max(jnp.where(done, state.rec_finish, 0.0)))


def clear_cache(table: SlotTable, acct: Replication, seg_len: jax.Array, when) -> tuple[SlotTable, Replication]:
    """Where `when`: the replica's cache emptied (it left; it comes back cold) and the cluster's segment copies
    and unique tokens updated. The index keeps stale entries, never believed once their slot is free."""
    segs = table.seg
    held = when & (segs >= 0)
    at = jnp.where(held, segs, 0)
    copies = acct.copies.at[jnp.where(held, segs, acct.copies.shape[0])].add(-1, mode="drop")
    gone = held & (copies[at] == 0)
    unique = acct.unique_tok - jnp.sum(jnp.where(gone, seg_len[at], 0))
    table = jax.tree.map(lambda e, x: jnp.where(when, e, x), empty_table(segs.shape[0]), table)
    return table, Replication(copies, unique)


def apply_pending(pending: jax.Array, g: jax.Array, reqs: jax.Array, add: jax.Array, table) -> jax.Array:
    """`pending` [G, M+1] with `add` on replica g at every segment (prompt and output, padding included) of each
    request in `reqs` [B] (N = none): a loop over the requests given, O(S) each, never O(B x S)."""
    n = table.arrival_s.shape[0]

    def one(k, p):
        q = jnp.minimum(reqs[k], n - 1)
        return p.at[g, jnp.concatenate([table.seg_ids[q], table.out_seg[q][None]])].add(add, mode="drop")

    return for_each(reqs < n, one, pending)


def run_single(model: ReplicaModel, key, workload, params: ReplicaParams) -> ReplicaState:
    """One run to completion with a while loop (for tests and per-request records); compiled once per model."""
    model.check_params(params, workload)
    fast = compile_effort.is_fast(model.num_steps(workload))
    go = _SINGLE.get((model, fast))
    if go is None:

        def run(key, workload, params):
            state = model.init(key, workload, params)
            return jax.lax.while_loop(lambda s: ~model.is_done(s), lambda s: model.step(s, workload, params), state)

        go = _SINGLE[model, fast] = jax.jit(run, compiler_options=compile_effort.options(fast))
    return go(key, workload, params)


_SINGLE: dict[tuple[ReplicaModel, bool], object] = {}


def request_fields(state: ReplicaState, cost: cost_models.CostParams | None = None) -> dict[str, jax.Array]:
    """Per-request records, [N] each (times in seconds; unfinished: inf; replica -1: never dispatched). With `cost`,
    the first token and the end as the client sees them (`cost_models.client_times`); without, the engine's."""
    r = state.req
    first, finish = state.rec_first, state.rec_finish
    if cost is not None:
        first, finish = cost_models.client_times(cost, first, finish, r.seg_tok.sum(1), r.out_tok)
    return {"arrival_s": r.arrival_s, "replica": state.rec_replica, "admit_s": state.rec_admit,
            "first_token_s": first, "finish_s": finish, "cached_tokens": state.rec_cached,
            "preemptions": state.rec_preempt,
            "prompt_tokens": r.seg_tok.sum(1), "output_tokens": r.out_tok,
            **({} if state.rec_tier is None else {"cpu_tier_tokens": state.rec_tier[:, 0],
                                                  "shared_tier_tokens": state.rec_tier[:, 1]})}


def records(state: ReplicaState) -> dict[str, np.ndarray]:
    """Per-request records as host arrays (`request_fields`, and dispatch_s: the router dispatches on arrival)."""
    out = {k: np.asarray(v) for k, v in request_fields(state).items()}
    return dict(out, dispatch_s=out["arrival_s"])
