"""Slow, obviously-correct reference of the replica cluster: a real radix tree + LRU per replica.

Plain Python objects and loops, one request at a time. It consumes a realised `RequestTable`
(same random draws as the jitted model) and uses `cost_models.step_time` for iteration times, so
per-request times can be compared exactly (float32 arithmetic, like the jitted model).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxroute import cost_models
from tests import reference_control, reference_gateways, reference_llmd_dynamo
from tests import reference_routers as rr_mod

F32 = np.float32
POLICIES = ("rr", "least_load", "least_tokens", "affinity", "threshold", "cache_guard", "sglang_cache_aware",
            "preble_e2", "weighted", "preble")
PREBLE = ("preble_e2", "preble")


@dataclasses.dataclass
class Node:
    seg: int
    tokens: int
    depth: int
    parent: Node | None
    children: dict = dataclasses.field(default_factory=dict)
    refcnt: int = 0
    last_use: float = 0.0


class RadixCache:
    """One replica's prefix cache: a tree of segments; LRU eviction of unlocked leaves."""

    def __init__(self):
        self.root = Node(-1, 0, -1, None)
        self.nodes: dict[int, Node] = {}
        self.n_evicted = 0
        self.victims: list[tuple[int, float]] = []  # (segment, LRU stamp) evicted since the caller cleared it

    def match(self, segs) -> list[Node]:
        path, node = [], self.root
        for sid, _ in segs:
            child = node.children.get(sid)
            if child is None:
                break
            path.append(child)
            node = child
        return path

    def insert(self, parent: Node, sid: int, tokens: int, depth: int) -> Node:
        node = parent.children.get(sid)
        if node is None:
            node = Node(sid, tokens, depth, parent)
            parent.children[sid] = node
            self.nodes[sid] = node
        return node

    def tokens(self) -> int:
        return sum(n.tokens for n in self.nodes.values())

    def evictable_tokens(self, exclude: set) -> int:
        return sum(n.tokens for n in self.nodes.values() if n.refcnt == 0 and n.seg not in exclude)

    def evict_one(self, exclude: set) -> None:
        leaves = [n for n in self.nodes.values() if n.refcnt == 0 and not n.children and n.seg not in exclude]
        victim = min(leaves, key=lambda n: (n.last_use, -n.depth, n.seg))
        del victim.parent.children[victim.seg]
        del self.nodes[victim.seg]
        self.n_evicted += 1
        self.victims.append((victim.seg, victim.last_use))

    def is_prefix_closed(self) -> bool:
        return all(n.parent is self.root or (n.parent.seg in self.nodes and self.nodes[n.parent.seg] is n.parent)
                   for n in self.nodes.values())


@dataclasses.dataclass
class Running:
    rid: int
    pos: int  # prompt tokens in KV
    gen: int = 0
    nseg: int = 0  # leading segments locked
    res: int = 0  # private tokens
    seq: int = 0
    tgt: int = 0  # prefill target: prompt (+ output tokens recomputed after a preemption)


def chunk_allocation(slots, chunk):
    """The batch's prefill tokens per slot: prefilling requests in admission order share `chunk`
    (decoding ones and empty slots get 0)."""
    alloc = np.zeros(len(slots), np.int64)
    budget = chunk
    for k in sorted([k for k, s in enumerate(slots) if s is not None and s.pos < s.tgt], key=lambda k: slots[k].seq):
        alloc[k] = min(budget, slots[k].tgt - slots[k].pos)
        budget -= alloc[k]
    return alloc


class Replica:
    def __init__(self, B, Q):
        self.cache = RadixCache()
        self.slots: list[Running | None] = [None] * B
        self.queue: list[int] = []  # request ids
        self.front: list[int] = []  # on-demand: preempted requests in `queue`, head first (vLLM's prepend)
        self.n_preempt = 0
        self.Q = Q
        self.clock = np.inf


def _route(policy, G, inflight, tokens, match, prompt, rr, rp, e2=None, stats=None):
    least = int(np.argmin(inflight))

    def best(m):
        mx = max(m)
        cands = [g for g in range(G) if m[g] == mx]
        return min(cands, key=lambda g: (inflight[g], g))

    def imbalanced(a, r):
        hi, lo = max(inflight), min(inflight)
        return hi - lo > a and hi > r * lo

    def threshold():
        b = best(match)
        return b if match[b] >= rp["theta"] * prompt else least

    if policy == "rr":
        return rr % G
    if policy == "least_load":
        return least
    if policy == "least_tokens":
        return int(np.argmin(tokens))
    if policy == "affinity":
        return best(match)
    if policy == "threshold":
        return threshold()
    if policy == "cache_guard":
        return least if imbalanced(rp["guard_abs"], rp["guard_rel"]) else threshold()
    if policy in PREBLE:
        load, extra, m_pos, ratios, scaled = e2
        cost = [F32(load[g] + extra[g]) for g in range(G)]
        cached = max(match)
        exploit = cached > prompt - cached
        holders = [g for g in range(G) if match[g] == cached or (rp["e2_autoscale"] and g in scaled)]
        cands = holders if exploit else list(range(G))
        g = min(cands, key=lambda g: (cost[g], g))
        lightest = min(range(G), key=lambda g: (load[g], g))
        moved = load[g] > F32(rp["e2_th_bal"]) * load[lightest]
        g = lightest if moved else g
        heavy = int(np.argmax(ratios))  # pairing: the decode-heavy replica takes an exploring request
        paired = bool(rp["e2_pairing"]) and not exploit and ratios[heavy] >= F32(rp["e2_pair_hit"])
        for k, hit in (("e2_exploit", exploit), ("e2_explore", not exploit), ("e2_rebalanced", moved and not paired),
                       ("e2_evict_cost", m_pos), ("e2_paired", paired)):
            stats[k] = stats.get(k, 0) + bool(hit)
        return heavy if paired else g
    raise ValueError(policy)


def preble_costs(window, last, record, locked, segs_i, match, prompt, a, cap, H, cp, seg_len, seg_depth, segs):
    """Preble E2's (L, M + P, P, M) per replica, written out with plain loops (see routers/preble.py)."""
    G = len(window)
    live = [[e for e in window[g] if F32(a - e["t"]) < H] for g in range(G)]
    n_all = sum(len(w) for w in live)
    mean_out = F32(F32(sum(e["out"] for w in live for e in w)) / F32(max(n_all, 1)))
    prefill = jax.jit(cost_models.prefill_time)
    load, extra, pcost, mcost = [], [], [], []
    in_req = {sid for sid, _ in segs_i}
    for g in range(G):
        pre, dec = F32(0), F32(0)
        for e in live[g]:  # in dispatch order
            pre, dec = F32(pre + e["pre"]), F32(dec + e["dec"])
        L = F32(pre + F32(dec * mean_out))
        missed = F32(prompt - match[g])
        P = F32(prefill(cp, missed, F32(match[g])))
        hits = {}
        for e in live[g]:
            for sid, _ in segs[e["rid"]]:
                hits[sid] = hits.get(sid, 0) + 1
        deficit = sum(int(seg_len[x]) for x in record[g]) + int(missed) - cap
        cands = sorted((x for x in record[g] if x not in locked[g] and x not in in_req and seg_len[x] > 0),
                       key=lambda x: (last[g][x], -int(seg_depth[x]), x))
        M, freed = F32(0), 0
        for x in cands:
            if freed >= deficit:
                break
            hit = F32(F32(hits.get(x, 0)) / F32(max(len(live[g]), 1)))
            M = F32(M + F32(F32(prefill(cp, F32(seg_len[x]))) * hit))
            freed += int(seg_len[x])
        load.append(L)
        extra.append(F32(M + P))
        pcost.append(P)
        mcost.append(M)
    return load, extra, pcost, mcost


def simulate(table, *, G, cap, policy, cost, chunk=512, B=64, Q=256, max_admit=4, local="fcfs",
             router=None, stale=0.0, check=None, router_key=None, admission="reserve", priority_groups=10,
             control=None, tiers=None, lora=None):
    """Run the reference; returns per-request records and a list of invariant violations.

    local: "fcfs", "lpm" or "priority" (Preble's priority groups: a request's group is fixed at
    dispatch from its hit ratio on the replica's cache, 0 if no hit else ceil(ratio x P) - 1; an
    iteration that can admit takes the first non-empty group at or below the replica's cursor,
    cyclically, moves the cursor below it, and admits from it in arrival order, at most
    (group + 1) x 10 and max_admit requests).

    admission: "reserve" (uncached prompt + whole output at admission) or "on-demand" (vLLM V1: each
    iteration the running requests, oldest first, take the KV of the tokens they compute and sample;
    one that does not fit preempts the last admitted, which frees its KV and waits at the queue's
    front; no admission after a preemption; a waiting request needs room for this step's tokens only;
    a readmitted one recomputes its prompt and generated output). rec["metrics"] has the
    throughput / time-average metrics, rec["preemptions"] the count.

    control: a `reference_control.Control` (autoscaler and gateway): control events come first on ties,
    the gateway may shed an arrival (never routed), the router (`reference_control.route`) sees the ready
    replicas only, and a replica that leaves comes back with an empty cache (and an empty CPU tier).

    tiers: KV offload tiers, a dict of cpu_tokens, cpu_s_per_token, shared_tokens, shared_s_per_token,
    shared_latency_s (float32 where they are times): each replica's GPU victims of an iteration are written
    together to its CPU tier and to the shared tier (segment -> stamp, the larger stamp kept); each tier then
    evicts in LRU order (stamp, deeper first, lowest id) down to its capacity (its victims are gone).
    An admission continues its GPU match into the tiers (CPU first, then shared), holds those tokens privately,
    touches them at t, and the iteration takes the load time longer. rec["tier"] [N, 2]: tokens loaded at the
    first admission; rec["loaded"], rec["offloaded"]: tokens read and written per tier (written = still held
    after the tier's eviction).

    lora: LoRA adapters, a dict of slots (per replica), load_s and step_overhead; each request's adapter is
    `table.adapter` (-1 = base). A waiting request is admissible when its adapter runs on the replica or fewer
    than `slots` distinct adapters run there; admission takes the first admissible request in the local order
    (preempted ones first) and passes over the others. A missing adapter is loaded into the least recently used
    slot without running requests (empty first; stamps: last admission or finish), the iteration taking load_s
    longer; the step time is multiplied by 1 + step_overhead x distinct running adapters. rec["lora"]: loads,
    hits, asks."""
    rp = dict(theta=0.5, guard_abs=8.0, guard_rel=1.5, e2_window_s=180.0, e2_th_bal=1.5, weights=None,
              e2_pairing=policy == "preble", e2_autoscale=policy == "preble", e2_pair_hit=0.7, e2_pair_window_s=30.0,
              e2_overload_window_s=180.0)
    rp.update(router or {})
    arrival = np.asarray(table.arrival_s, np.float32)
    landed = None if getattr(table, "landed", None) is None else np.asarray(table.landed)
    seg_ids, seg_tok = np.asarray(table.seg_ids), np.asarray(table.seg_tok)
    out_tok, out_seg = np.asarray(table.out_tok), np.asarray(table.out_seg)
    seg_len, seg_depth = np.asarray(table.seg_len), np.asarray(table.seg_depth)
    dummy = len(seg_len) - 1
    N = len(arrival)
    segs = [[(int(a), int(b)) for a, b in zip(seg_ids[i], seg_tok[i], strict=True) if b > 0] for i in range(N)]
    prompt = [sum(b for _, b in s) for s in segs]
    step_time = jax.jit(cost_models.step_time)
    world = rr_mod.World(G=G, segs=segs, prompt=prompt, out_tok=out_tok, out_seg=out_seg,
                         session=np.asarray(table.session), seg_len=seg_len, seg_depth=seg_depth, dummy=dummy, cap=cap,
                         cost=cost, rp=rp)
    routers = {**rr_mod.ROUTERS, **reference_llmd_dynamo.ROUTERS, **reference_gateways.ROUTERS}
    ref_router = routers[policy](world) if policy in routers else None
    run_key = None if router_key is None else jax.random.fold_in(router_key, rr_mod.ROUTER_KEY_TAG)

    reps = [Replica(B, Q) for _ in range(G)]
    adapter = None if lora is None else [int(x) for x in np.asarray(table.adapter)]
    for r_ in reps:  # adapter slots [adapter, stamp] and running / in-flight counts per adapter
        r_.lora_slots = [[-1, -np.inf] for _ in range(lora["slots"] if lora else 0)]
        r_.lora_run, r_.lora_inflight = {}, {}
    lora_rec = dict(loads=0, hits=0, asks=0)

    def admissible(rep, i):
        ad = adapter[i]
        return ad < 0 or rep.lora_run.get(ad, 0) > 0 or sum(1 for v in rep.lora_run.values() if v > 0) < lora["slots"]

    def lora_release(rep, i, t):
        ad = adapter[i]
        if ad >= 0:
            rep.lora_run[ad] -= 1
            for sl in rep.lora_slots:
                if sl[0] == ad:
                    sl[1] = max(sl[1], t)
    cpu_tier: list[dict[int, float]] = [dict() for _ in range(G)]  # segment -> LRU stamp
    shared_tier: dict[int, float] = {}
    rec_tier, moved = np.zeros((N, 2), np.int64), dict(loaded=[0, 0], offloaded=[0, 0])

    def enter(tier, items, capacity):
        """Items (segment, stamp) enter together; LRU evicts down to the capacity; returns the tokens written
        and kept."""
        new = [sid for sid, _ in items if sid not in tier]
        for sid, stamp in items:
            tier[sid] = max(tier.get(sid, -np.inf), stamp)
        while sum(int(seg_len[k]) for k in tier) > capacity:
            del tier[min(tier, key=lambda k: (tier[k], -int(seg_depth[k]), k))]
        return sum(int(seg_len[k]) for k in new if k in tier)
    P = priority_groups
    for rep in reps:
        rep.cursor = P - 1
    group = [0] * N  # priority group of each request, fixed at dispatch
    inflight = [0.0] * G
    tokens = [0.0] * G
    dispatched: list[dict[int, int]] = [dict() for _ in range(G)]  # insert-on-dispatch record (counts)
    rec = dict(replica=np.full(N, -1), admit=np.full(N, np.inf, F32), first=np.full(N, np.inf, F32),
               finish=np.full(N, np.inf, F32), cached=np.zeros(N, np.int64))
    violations, overflow, running_full = [], False, False
    stats = dict(evicted=0, blocked_by_memory=0)  # + e2_* counts of Preble E2's decisions
    snap = None  # stale router view: (present sets, inflight, tokens, time)
    window: list[list[dict]] = [[] for _ in range(G)]  # Preble E2: every dispatch (kept forever, filtered by time)
    last: list[dict[int, float]] = [dict() for _ in range(G)]  # router's last dispatch of a segment to a replica
    decode = jax.jit(cost_models.decode_step_time)
    nxt, rr, n_admitted = 0, 0, 0
    # Preble's pairing and autoscaling (routers/preble.py): per replica, the hit trace of admitted batches
    # [t, hit, prompt] and the TTFT data points [t, ttft, important segment]; prefixes scaled onto replicas
    hit_trace: list[list] = [[] for _ in range(G)]
    ttft_points: list[list] = [[] for _ in range(G)]
    scaled: dict[int, set] = {}
    H, H_pair = F32(rp["e2_overload_window_s"]), F32(rp["e2_pair_window_s"])
    e2_terms = [F32(0)] * 3  # sums of the replica-mean L, M, P over decisions

    def important(i):  # the deepest segment longer than all before it together
        before, best = 0, segs[i][0][0]
        for sid, tk in segs[i]:
            if tk > before:
                best = sid
            before += tk
        return best

    def push(points, g, t, entry, window):  # drop entries older than the window, then add
        points[g] = [e for e in points[g] if not F32(t - e[0]) > window] + [entry]

    def overloaded(g, seg, now):
        pts = [e for e in ttft_points[g] if e[2] == seg and F32(now - e[0]) <= H]
        late = [e[1] for e in pts if F32(now - e[0]) <= F32(F32(0.5) * H)]
        early = [e[1] for e in pts if not F32(now - e[0]) <= F32(F32(0.5) * H)]
        if not late or not early:
            return False
        m1 = F32(np.sum(np.asarray(early, F32), dtype=F32) / F32(len(early)))
        m2 = F32(np.sum(np.asarray(late, F32), dtype=F32) / F32(len(late)))
        return bool(m2 >= F32(2.0) * m1)

    def view_match(g, i, present):
        m = 0
        for sid, t in segs[i]:
            if not present(g, sid):
                break
            m += t
        return m

    def kv_in_use(rep):  # locked cached tokens + private tokens (Replica.kv_in_use)
        return sum(n.tokens for n in rep.cache.nodes.values() if n.refcnt > 0) + sum(s.res for s in rep.slots if s is not None)

    def used(rep):
        return rep.cache.tokens() + sum(s.res for s in rep.slots if s is not None)

    saved_gen = [0] * N  # output tokens a preempted request had generated
    times_preempted = np.zeros(N, np.int64)  # per request
    q_area, kv_area, t_prev = 0.0, 0.0, 0.0  # integrals of waiting requests and of KV in use

    def preempt(rep, s, t):
        """Recompute preemption: unlock and touch the prefix, free the private KV, back to the front."""
        nonlocal overflow
        node = rep.cache.root
        for sid, _ in segs[s.rid][:s.nseg]:
            node = node.children[sid]
            node.refcnt -= 1
            node.last_use = t
        saved_gen[s.rid] = s.gen
        if lora:
            lora_release(rep, s.rid, t)
        rep.slots[rep.slots.index(s)] = None
        rep.n_preempt += 1
        times_preempted[s.rid] += 1
        if len(rep.queue) >= Q:
            overflow = True
        else:
            rep.queue.append(s.rid)
            rep.front.insert(0, s.rid)

    def allocate_running(rep, t):
        """On-demand: the running requests, oldest first, take this step's tokens; preempt from the tail."""
        running = sorted((s for s in rep.slots if s is not None), key=lambda s: s.seq)
        budget, want = chunk, {}
        for s in running:
            if s.pos < s.tgt:  # prefill share, + the token sampled when it completes
                c = min(budget, s.tgt - s.pos)
                budget -= c
                want[s.rid] = c + (c == s.tgt - s.pos)
            else:  # one decode token
                want[s.rid] = 1
        taken, n_pre, k = 0, 0, 0
        while k < len(running):
            if taken + want[running[k].rid] <= cap - used(rep) + rep.cache.evictable_tokens(set()):
                taken += want[running[k].rid]
                k += 1
            else:
                preempt(rep, running.pop(), t)  # the last admitted (maybe running[k] itself)
                n_pre += 1
        for s in running:
            s.res += want[s.rid]
        while used(rep) > cap:
            rep.cache.evict_one(set())
        return n_pre

    def observed():
        return dict(waiting=[len(r.queue) for r in reps], running=[sum(s is not None for s in r.slots) for r in reps],
                    kv_usage=[F32(F32(kv_in_use(r)) / F32(cap)) for r in reps], inflight=list(inflight), arrivals=nxt)

    def empty(r):
        return not r.queue and all(s is None for s in r.slots)

    ready_area = 0.0
    while True:
        a = arrival[nxt] if nxt < N else np.inf
        gmin = int(np.argmin([r.clock for r in reps]))
        m = reps[gmin].clock
        rel = t_prev if control is not None and control.releasable(observed()) else np.inf  # the gateway dispatches now
        if a == np.inf and m == np.inf and rel == np.inf:
            break
        c = control.next_time() if control is not None else np.inf
        t_ev = F32(min(a, m, c, rel))
        q_area += sum(len(r.queue) for r in reps) * float(F32(t_ev - F32(t_prev)))
        if control is not None:
            ready_area += len(control.ready()) * float(F32(t_ev - F32(t_prev)))
        t_prev = t_ev
        if c <= min(a, m, rel):  # a control event
            g = control.event(F32(c), observed(), [empty(r) for r in reps])
            if g is not None:
                reps[g].cache = RadixCache()
                cpu_tier[g] = {}
                reps[g].lora_slots = [[-1, -np.inf] for _ in reps[g].lora_slots]
            continue
        releasing = rel <= min(a, m)
        if not releasing and a <= m and control is not None:
            if not control.admit(nxt, prompt[nxt], a, observed()):
                nxt += 1  # shed at the gateway
                continue
            if control.flow_control:  # it waits at the gateway
                control.push(nxt)
                nxt += 1
                continue
        if releasing or a <= m:  # route (a gateway release: the next request it dispatches, now)
            if releasing:
                i, a = control.pop(), F32(rel)
            else:
                i = nxt
            fresh = dict(present=[set(reps[g].cache.nodes) | {k for k, v in dispatched[g].items() if v > 0}
                                  for g in range(G)], inflight=list(inflight), tokens=list(tokens), time=a,
                         cached=[set(reps[g].cache.nodes) for g in range(G)],
                         waiting=[len(r.queue) for r in reps], running=[sum(s is not None for s in r.slots) for r in reps],
                         kv_usage=[F32(F32(kv_in_use(r)) / F32(cap)) for r in reps])
            if stale > 0:
                if snap is None or a >= snap["time"] + F32(stale):
                    snap = fresh
                seen = snap
            else:
                seen = fresh
            record = [set(seen["present"][g]) for g in range(G)]
            v_inf, v_tok = seen["inflight"], seen["tokens"]
            match = [view_match(g, i, lambda g, s, record=record: s in record[g]) for g in range(G)]
            locked = [{k for k, v in dispatched[g].items() if v > 0} for g in range(G)]
            e2_load, e2_extra, e2_p, e2_m = preble_costs(window, last, record, locked, segs[i], match, prompt[i], a, cap,
                                                   F32(rp["e2_window_s"]), cost, seg_len, seg_depth, segs)
            m_pos = any(x > 0 for x in e2_m)
            ctx = rr_mod.Ctx(i=i, now=a, key=None if router_key is None else jax.random.fold_in(run_key, i),
                             inflight=list(v_inf), tokens=list(v_tok), record=record, match=match,
                             cached=seen["cached"], cached_match=[rr_mod.leading_tokens(segs[i], c) for c in seen["cached"]],
                             waiting=seen["waiting"], running=seen["running"], kv_usage=seen["kv_usage"])
            if lora:  # the adapters as each replica's lora_requests_info metric reports them
                ad = adapter[i]
                ctx.adapter = ad
                ctx.lora_running = [reps[h].lora_run.get(ad, 0) > 0 for h in range(G)]
                ctx.lora_waiting = [reps[h].lora_run.get(ad, 0) == 0 and reps[h].lora_inflight.get(ad, 0) > 0
                                    for h in range(G)]
                ctx.lora_room = [sum(1 for v in reps[h].lora_run.values() if v > 0)
                                 + sum(1 for k, v in reps[h].lora_inflight.items() if v - reps[h].lora_run.get(k, 0) > 0)
                                 < lora["slots"] for h in range(G)]
            if tiers:  # the replicas' caches and offload tiers as their KV events report them
                ctx.cpu_match = [rr_mod.leading_tokens(segs[i], seen["cached"][g] | set(cpu_tier[g])) for g in range(G)]
                ctx.shared_match = [rr_mod.leading_tokens(segs[i], seen["cached"][g] | set(cpu_tier[g]) | set(shared_tier))
                                    for g in range(G)]
            if control is not None:
                g = reference_control.route(policy, control.ready(), i, v_inf, v_tok, match)
            elif ref_router is not None:
                g = ref_router.choose(ctx)
                ref_router.on_dispatch(ctx, g)
            else:
                ratios = []
                for tr in hit_trace:
                    h, n = sum(e[1] for e in tr), sum(e[2] for e in tr)
                    ratios.append(F32(F32(h) / F32(n)) if n > 0 else F32(0))
                seg = important(i)
                g = _route(policy, G, v_inf, v_tok, match, prompt[i], rr, rp,
                           (e2_load, e2_extra, m_pos, ratios, scaled.get(seg, set())), stats)
                if policy in PREBLE:
                    for k, x in enumerate((e2_load, e2_m, e2_p)):
                        e2_terms[k] = F32(e2_terms[k] + F32(np.mean(np.asarray(x, F32), dtype=F32)))
                    mx = max(match)
                    others = [r for r in range(G) if r not in scaled.get(seg, set()) and match[r] < mx]
                    if (rp["e2_autoscale"] and mx > prompt[i] - mx and others and overloaded(g, seg, a)):
                        scaled.setdefault(seg, set()).add(min(others, key=lambda r: (e2_load[r], r)))
                        for e in ttft_points[g]:  # delete_after_allocation
                            if e[2] == seg:
                                e[2] = -1
                        stats["e2_autoscaled"] = stats.get("e2_autoscaled", 0) + 1
            window[g].append(dict(t=a, pre=e2_p[g], dec=F32(decode(cost, F32(1.0), F32(prompt[i]))),
                                  out=int(out_tok[i]), rid=i))
            for sid in [s for s, _ in segs[i]] + ([int(out_seg[i])] if out_seg[i] != dummy else []):
                last[g][sid] = a
            if stale > 0:  # the router knows its own dispatches at once (not the scraped metrics)
                snap["present"][g].update(s for s, _ in segs[i])
                if out_seg[i] != dummy:
                    snap["present"][g].add(int(out_seg[i]))
                snap["inflight"][g] += 1
                snap["tokens"][g] += prompt[i] + int(out_tok[i])
            rep = reps[g]
            hit = sum(n.tokens for n in rep.cache.match(segs[i]))
            group[i] = 0 if hit == 0 else -(-hit * P // prompt[i]) - 1
            if len(rep.queue) >= Q:
                overflow = True
            else:
                rep.queue.append(i)
            if rep.clock == np.inf:
                rep.clock = a
            inflight[g] += 1
            if lora and adapter[i] >= 0:
                rep.lora_inflight[adapter[i]] = rep.lora_inflight.get(adapter[i], 0) + 1
            tokens[g] += prompt[i] + int(out_tok[i])
            for sid, _ in segs[i] + ([(int(out_seg[i]), 0)] if out_seg[i] != dummy else []):
                dispatched[g][sid] = dispatched[g].get(sid, 0) + 1
            rec["replica"][i] = g
            rr += 1
            nxt += 0 if releasing else 1
            continue

        # ---- one iteration on replica gmin
        g, rep, t = gmin, reps[gmin], F32(m)
        rep.cache.victims = []
        load_s = F32(0)
        preempted = allocate_running(rep, t) if admission == "on-demand" else 0
        quota, turn = max_admit, None
        if local == "priority" and rep.queue:
            nonempty = {group[i] for i in rep.queue}
            turn = next((rep.cursor - k) % P for k in range(P) if (rep.cursor - k) % P in nonempty)
            pending_prefill = sum(s.tgt - s.pos for s in rep.slots if s is not None)
            if not preempted and pending_prefill < chunk and None in rep.slots:
                rep.cursor = (turn - 1) % P
            quota = min(max_admit, (turn + 1) * 10)
        adm_hit, adm_prompt = 0, 0  # this batch's first admissions (Preble's hit trace)
        for _ in range(quota):
            if not rep.queue or preempted:
                break
            ok = (lambda i, rep=rep: admissible(rep, i)) if lora else (lambda i: True)  # adapters: pass over others
            queue = [i for i in rep.queue if ok(i)]
            if rep.front and ok(rep.front[0]):
                cand = rep.front[0]
            elif lora and not queue:
                break
            elif local == "lpm":
                cache = rep.cache
                cand = min(queue, key=lambda i: (-sum(n.tokens for n in cache.match(segs[i])), i))
            elif local == "priority":
                in_turn = [i for i in queue if group[i] == turn]
                if not in_turn:
                    break
                cand = min(in_turn)
            elif lora:  # fcfs: the first admissible, preempted ones first
                cand = next(i for i in rep.front + [i for i in rep.queue if i not in rep.front] if ok(i))
            else:  # fcfs: the earliest dispatched (a gateway may dispatch out of arrival order)
                cand = rep.queue[0]
            path = rep.cache.match(segs[cand])
            mtok = sum(n.tokens for n in path)
            tgt = prompt[cand] + saved_gen[cand]
            from_cpu, from_shared = [], []  # the match continued into the offload tiers
            for sid, tk in (segs[cand][len(path):] if tiers else []):
                if sid in cpu_tier[g]:
                    from_cpu.append((sid, tk))
                elif sid in shared_tier:
                    from_shared.append((sid, tk))
                else:
                    break
            cpu_tok, sh_tok = sum(tk for _, tk in from_cpu), sum(tk for _, tk in from_shared)
            start = min(mtok + cpu_tok + sh_tok, tgt - 1)  # a fully cached prompt recomputes its last token (vLLM)
            if landed is not None and landed[cand]:  # its KV was transferred in: only the last token is computed
                start = tgt - 1
            pending_prefill = sum(s.tgt - s.pos for s in rep.slots if s is not None)
            if pending_prefill >= chunk:
                break
            if admission == "on-demand":  # this step's share of the chunk (+ the token sampled if it completes)
                share = min(tgt - start, chunk - pending_prefill)
                need = share + (share == tgt - start) + (start - mtok)
            else:
                need = prompt[cand] - mtok + int(out_tok[cand])
            exclude = {n.seg for n in path}
            free = cap - used(rep)
            if need > free + rep.cache.evictable_tokens(exclude):
                stats["blocked_by_memory"] += 1
                break
            if all(s is not None for s in rep.slots):
                running_full = True
                break
            while cap - used(rep) < need:
                rep.cache.evict_one(exclude)
            for n in path:
                n.refcnt += 1
                n.last_use = t
            slot = rep.slots.index(None)
            rep.slots[slot] = Running(cand, start, saved_gen[cand], len(path), need, n_admitted, tgt)
            n_admitted += 1
            rep.queue.remove(cand)
            if cand in rep.front:
                rep.front.remove(cand)
            if tiers:
                for sid, _ in from_cpu:
                    cpu_tier[g][sid] = max(cpu_tier[g][sid], t)
                for sid, _ in from_shared:
                    shared_tier[sid] = max(shared_tier[sid], t)
                lat = F32(F32(tiers["shared_latency_s"]) + F32(F32(sh_tok) * F32(tiers["shared_s_per_token"])))
                load_s = F32(load_s + F32(F32(F32(cpu_tok) * F32(tiers["cpu_s_per_token"]))
                                          + (lat if sh_tok > 0 else F32(0))))
                moved["loaded"][0] += cpu_tok
                moved["loaded"][1] += sh_tok
            if lora and adapter[cand] >= 0:  # its adapter: a hit, or a load into the LRU free slot
                ad = adapter[cand]
                lora_rec["asks"] += 1
                held = [sl for sl in rep.lora_slots if sl[0] == ad]
                if held:
                    lora_rec["hits"] += 1
                    held[0][1] = t
                else:
                    free = [k for k, sl in enumerate(rep.lora_slots) if sl[0] < 0 or rep.lora_run.get(sl[0], 0) == 0]
                    k = min(free, key=lambda k: (rep.lora_slots[k][1], k))
                    rep.lora_slots[k] = [ad, t]
                    lora_rec["loads"] += 1
                    load_s = F32(load_s + F32(lora["load_s"]))
                rep.lora_run[ad] = rep.lora_run.get(ad, 0) + 1
            if np.isinf(rec["admit"][cand]):  # a readmission keeps the first admission's records
                rec["admit"][cand] = t
                rec["cached"][cand] = mtok
                rec_tier[cand] = cpu_tok, sh_tok
                adm_hit, adm_prompt = adm_hit + mtok, adm_prompt + prompt[cand]
        if adm_prompt > 0:
            push(hit_trace, g, t, [t, adm_hit, adm_prompt], H_pair)
        if tiers:  # this iteration's GPU victims go down the tiers
            moved["offloaded"][0] += enter(cpu_tier[g], rep.cache.victims, tiers["cpu_tokens"])
            moved["offloaded"][1] += enter(shared_tier, rep.cache.victims, tiers["shared_tokens"])

        # batch
        alloc = chunk_allocation(rep.slots, chunk)
        pos = np.array([s.pos if s else 0 for s in rep.slots], np.float32)
        dec = np.array([s is not None and s.pos == s.tgt for s in rep.slots])
        ctx = np.array([(prompt[s.rid] + s.gen) if s else 0 for s in rep.slots], np.float32)
        dt = F32(step_time(cost, alloc.astype(np.float32), pos, alloc > 0, ctx, dec))
        if lora:
            n_distinct = sum(1 for v in rep.lora_run.values() if v > 0)
            dt = F32(dt * F32(F32(1) + F32(F32(lora["step_overhead"]) * F32(n_distinct))))
        if tiers or lora:
            dt = F32(dt + load_s)
        t_end = F32(t + F32(dt))
        kv_area += kv_in_use(rep) * float(F32(dt))
        for k, s in enumerate(rep.slots):
            if s is None:
                continue
            was_decoding = dec[k]
            s.pos += int(alloc[k])
            # completed segments enter the cache
            end, node, done_segs = 0, rep.cache.root, 0
            for d, (_, tk) in enumerate(segs[s.rid]):
                end += tk
                if end > s.pos:
                    break
                done_segs = d + 1
            if done_segs > s.nseg:
                node = rep.cache.root
                for d, (sid, tk) in enumerate(segs[s.rid][:done_segs]):
                    node = rep.cache.insert(node, sid, tk, int(seg_depth[sid]))
                    if d >= s.nseg:
                        node.refcnt += 1
                        s.res -= tk
                    node.last_use = t_end
                s.nseg = done_segs
            if not was_decoding and s.pos == s.tgt:
                if s.gen == 0:
                    rec["first"][s.rid] = t_end
                    push(ttft_points, g, t_end, [t_end, F32(t_end - arrival[s.rid]), important(s.rid)], H)
                    if ref_router is not None:
                        ref_router.on_first_token(g, s.rid, t_end)
                s.gen += 1
            elif was_decoding:
                s.gen += 1
        for k, s in enumerate(rep.slots):
            if s is None or s.gen < out_tok[s.rid]:
                continue
            i = s.rid
            rec["finish"][i] = t_end
            if ref_router is not None:
                ref_router.on_finish(g, i, t_end)
            node = rep.cache.root
            for sid, _ in segs[i]:
                node = node.children[sid]
                node.refcnt -= 1
                node.last_use = t_end
            if out_seg[i] != dummy:
                o = rep.cache.insert(node, int(out_seg[i]), int(seg_len[out_seg[i]]), int(seg_depth[out_seg[i]]))
                o.last_use = t_end
            for sid, _ in segs[i] + ([(int(out_seg[i]), 0)] if out_seg[i] != dummy else []):
                dispatched[g][sid] -= 1
            inflight[g] -= 1
            tokens[g] -= prompt[i] + int(out_tok[i])
            rep.slots[k] = None
            if lora:
                lora_release(rep, i, t_end)
                if adapter[i] >= 0:
                    rep.lora_inflight[adapter[i]] -= 1
            if control is not None:
                control.finished(i)
        busy = any(s is not None for s in rep.slots) or rep.queue
        rep.clock = t_end if busy else np.inf
        if control is not None:
            control.drained(g, empty(rep), t_end)
        # invariants
        if used(rep) > cap:
            violations.append(f"replica {g} uses {used(rep)} > {cap} tokens at {t_end}")
        if not rep.cache.is_prefix_closed():
            violations.append(f"replica {g} cache not prefix-closed at {t_end}")
        if check is not None:
            check(g, rep, t_end)
    rec["overflow"] = overflow
    rec["tier"], rec["loaded"], rec["offloaded"] = rec_tier, moved["loaded"], moved["offloaded"]
    rec["lora"] = lora_rec
    rec["running_full"] = running_full
    rec["preemptions"] = sum(r.n_preempt for r in reps)
    rec["preempted"] = times_preempted
    done = np.isfinite(rec["finish"])
    span = float(rec["finish"][done].max() - arrival.min()) if done.any() else 0.0
    ttft = (rec["first"] - arrival)[done]
    rec["metrics"] = dict(
        output_tokens_per_s=float(out_tok[done].sum()) / span if span > 0 else 0.0,
        ttft_p90_s=float(np.quantile(ttft, 0.9)) if done.any() else 0.0,
        queue_mean=q_area / (G * span) if span > 0 else 0.0,
        kv_usage_mean=kv_area / (G * cap * span) if span > 0 else 0.0,
        preemptions=rec["preemptions"])
    stats["evicted"] = sum(r.cache.n_evicted for r in reps)
    n_dec = max(int(nxt), 1)
    stats.update(e2_mean_L_s=float(e2_terms[0] / F32(n_dec)), e2_mean_M_s=float(e2_terms[1] / F32(n_dec)),
                 e2_mean_P_s=float(e2_terms[2] / F32(n_dec)))
    rec["stats"] = stats
    if control is not None:
        done = np.isfinite(rec["finish"])
        rec["end"] = max(F32(t_prev), rec["finish"][done].max() if done.any() else F32(0))
        rec["ready_area"] = ready_area + len(control.ready()) * float(F32(rec["end"] - F32(t_prev)))
    return rec, violations
