"""Plain-Python reference of the control plane (jaxroute/clusters/replicas/control.py): replica lifecycle,
autoscaler ticks, gateway admission. `reference_replicas.simulate(control=...)` drives it; floats are
float32 step by step, as in the jitted model, so decisions and times compare exactly."""

from __future__ import annotations

import math

import numpy as np

F32 = np.float32
OFF, PROVISIONING, READY, DRAINING = 0, 1, 2, 3
PRIORITY = (4, 3, -1, -2, -3)
SCALERS = ("fixed", "hpa", "kpa", "sla")
METRICS = ("waiting", "running", "kv_usage", "in_flight")
GATES = ("none", "token_bucket", "tier_shed", "saturation", "flow_control")


class Control:
    def __init__(self, s: dict, G: int, klass, tenant, n_tenants: int, max_running: int):
        """s: the settings as `control.make` takes them (all given); klass / tenant: each request's draws."""
        self.s = {k: (F32(v) if isinstance(v, float) else v) for k, v in s.items()}
        self.G, self.B = G, max_running
        self.status = [READY if g < s["initial"] else OFF for g in range(G)]
        self.ready_at = [np.inf] * G
        self.leave_at = [np.inf] * G
        self.up_since = [F32(0)] * G
        self.billed = F32(0)
        self.next_tick = F32(s["interval_s"])
        self.hist: list[tuple] = []  # (t, sample, rec)
        self.last_arrivals = 0
        self.panic_until, self.panic_max = -np.inf, 0
        self.panic_ticks = 0  # KPA ticks decided in panic (for the tests' coverage)
        self.ups = self.downs = 0
        self.slots_full = False
        self.log = [(F32(0), s["initial"], s["initial"])]
        self.bucket, self.bucket_t = F32(s["bucket_tokens"]), F32(0)
        self.klass, self.tenant = list(klass), list(tenant)
        self.tenant_inflight = [0] * n_tenants
        self.shed = 0
        self.queues: dict[tuple[int, int], list[int]] = {}  # flow control: (band, tenant) -> request ids, in order
        self.last = [n_tenants - 1] * len(PRIORITY)  # round robin: the tenant each band served last
        self.n_tenants = n_tenants

    # ------------------------------------------------------------------ events
    def transitions(self):
        return [self.ready_at[g] if st == PROVISIONING else self.leave_at[g] if st == DRAINING else np.inf
                for g, st in enumerate(self.status)]

    def next_time(self):
        return min(min(self.transitions()), self.next_tick)

    def event(self, now, obs, empty):
        """One control event at `now`; returns the replica that leaves (its cache is cleared) or None."""
        before = list(self.status)
        trans = self.transitions()
        g = int(np.argmin(trans))
        leaving = None
        if trans[g] <= self.next_tick:
            if self.status[g] == PROVISIONING:
                self.status[g] = READY
            else:
                self.status[g] = OFF
                self.billed = F32(self.billed + F32(self.leave_at[g] - self.up_since[g]))
                leaving = g
            self.ready_at[g] = self.leave_at[g] = np.inf
        else:
            self._scale(self._decide(now, obs), now, empty)
        if self.status != before:
            self.log.append((F32(now), self.status.count(READY), sum(st != OFF for st in self.status)))
        return leaving

    def _decide(self, now, obs):
        s = self.s
        ready = [st == READY for st in self.status]
        R = sum(ready)
        cur = sum(st in (READY, PROVISIONING) for st in self.status)
        sample = F32(sum(obs["inflight"]))
        rec = 0
        scaler = s["scaler"]
        if scaler == "fixed":
            want = cur
        elif scaler == "hpa":
            per = obs[{"waiting": "waiting", "running": "running", "kv_usage": "kv_usage",
                       "in_flight": "inflight"}[s["metric"]]]
            total = F32(sum(F32(per[g]) for g in range(self.G) if ready[g]))
            ratio = F32(F32(total / F32(R)) / s["target"])
            rec = cur if abs(F32(ratio - F32(1))) <= s["tolerance"] else int(math.ceil(F32(ratio * F32(R))))
            lo = F32(now - s["down_window_s"])
            stable = max([r for (t, _, r) in self.hist if t > lo] + [rec])
            want = min(stable, max(2 * cur, cur + 4))
        elif scaler == "kpa":
            pts = self.hist + [(F32(now), sample, 0)]

            def mean(w):
                inside = [x for (t, x, _) in pts if t > F32(now - w)]
                return F32(F32(sum(inside)) / F32(max(len(inside), 1)))
            up, down = math.ceil(F32(s["max_up_rate"] * F32(R))), math.floor(F32(F32(R) / s["max_down_rate"]))
            stable = math.ceil(F32(mean(s["stable_window_s"]) / s["target"]))
            panic = math.ceil(F32(mean(s["panic_window_s"]) / s["target"]))
            over = F32(F32(panic) / F32(R)) >= s["panic_threshold"]
            until = F32(now + s["stable_window_s"]) if over else self.panic_until
            if now <= until:
                self.panic_max = max(self.panic_max, min(max(panic, down), up), min(max(stable, down), up))
                self.panic_until = until
                self.panic_ticks += 1
                want = self.panic_max
            else:
                self.panic_max, self.panic_until = 0, -np.inf
                want = min(max(stable, down), up)
        else:  # sla
            rate = F32(F32(obs["arrivals"] - self.last_arrivals) / s["interval_s"])
            want = math.ceil(F32(rate / s["capacity_rps"]))
        self.hist.append((F32(now), sample, rec))
        self.last_arrivals = obs["arrivals"]
        self.next_tick = F32(self.next_tick + s["interval_s"])
        return min(max(want, s["min_replicas"]), s["max_replicas"])

    def _scale(self, want, now, empty):
        cur = sum(st in (READY, PROVISIONING) for st in self.status)
        if want > cur:
            off = [g for g in range(self.G) if self.status[g] == OFF]
            for g in off[:want - cur]:
                self.status[g] = PROVISIONING
                self.ready_at[g] = F32(now + self.s["provision_s"])
                self.up_since[g] = F32(now)
                self.ups += 1
            self.slots_full |= len(off) < want - cur
        k = cur - want
        for kind in (PROVISIONING, READY):  # provisioning replicas first, highest index first
            for g in reversed(range(self.G)):
                if k > 0 and self.status[g] == kind:
                    self.status[g] = DRAINING
                    self.ready_at[g] = np.inf
                    if kind == PROVISIONING or empty[g]:
                        self.leave_at[g] = F32(now)
                    self.downs += 1
                    k -= 1

    # ------------------------------------------------------------------ gateway and hooks
    def ready(self):
        return [g for g in range(self.G) if self.status[g] == READY]

    def admit(self, i, prompt, now, obs):
        s = self.s
        ready = self.ready()
        prio = PRIORITY[self.klass[i]]
        level = min(s["bucket_tokens"], F32(self.bucket + F32(F32(max(F32(now - self.bucket_t), F32(0))) * s["bucket_refill"])))
        gate = s["gate"]
        if gate == "none":
            ok = True
        elif gate == "token_bucket":
            ok = level >= F32(prompt)
        elif gate == "tier_shed":
            overload = max(obs["inflight"][g] for g in ready) > s["tier_threshold"]
            ok = not (overload and prio < s["min_priority"])
        elif gate == "saturation":
            ok = not (prio < 0 and self.saturation(obs) >= 1.0)
        else:  # flow_control: it waits at the gateway
            ok = True
        t = self.tenant[i]
        limit = F32(s["tenant_budget"] * F32(self.B * len(ready)))
        if s["tenant_budget"] > 0 and prio < 0 and F32(self.tenant_inflight[t]) > limit:
            ok = False
        if gate == "token_bucket":
            self.bucket = F32(level - F32(prompt)) if ok else level
            self.bucket_t = F32(now)
        if ok:
            self.tenant_inflight[t] += 1
        else:
            self.shed += 1
        return ok

    def saturation(self, obs):
        s, ready = self.s, self.ready()
        total = F32(sum(max(F32(F32(obs["waiting"][g]) / s["qd_threshold"]), F32(obs["kv_usage"][g] / s["kv_threshold"]))
                        for g in ready))
        return F32(total / F32(len(ready)))

    # ------------------------------------------------------------------ the flow-control gateway
    @property
    def flow_control(self):
        return self.s["gate"] == "flow_control"

    def waiting(self):
        return sum(len(q) for q in self.queues.values())

    def releasable(self, obs):
        return self.flow_control and self.waiting() > 0 and self.saturation(obs) < self.s["band_ceiling"]

    def push(self, i):
        self.queues.setdefault((self.klass[i], self.tenant[i]), []).append(i)
        self.max_waiting = max(getattr(self, "max_waiting", 0), self.waiting())

    def pop(self):
        band = min(k for (k, _), q in self.queues.items() if q)  # classes in priority order
        flows = [f for f in range(self.n_tenants) if self.queues.get((band, f))]
        if self.s["fairness"] == "round_robin":
            flow = next(f for f in ((self.last[band] + 1 + d) % self.n_tenants for d in range(self.n_tenants))
                        if f in flows)
        else:  # global strict: the oldest head request of the band
            flow = min(flows, key=lambda f: self.queues[(band, f)][0])
        self.last[band] = flow
        return self.queues[(band, flow)].pop(0)

    def finished(self, i):
        self.tenant_inflight[self.tenant[i]] -= 1

    def drained(self, g, empty, t_end):
        if self.status[g] == DRAINING and empty and self.leave_at[g] == np.inf:
            self.leave_at[g] = F32(t_end)

    def replica_seconds(self, end):
        total = float(self.billed)
        for g, st in enumerate(self.status):
            if st != OFF:
                stop = self.leave_at[g] if st == DRAINING and np.isfinite(self.leave_at[g]) else end
                total += float(F32(F32(stop) - self.up_since[g]))
        return total


def route(policy, ready, i, inflight, tokens, match):
    """The routers the reference runs under an autoscaler, over the ready replicas only."""
    if policy == "rr":
        return ready[i % len(ready)]
    if policy == "least_load":
        return min(ready, key=lambda g: (inflight[g], g))
    if policy == "least_tokens":
        return min(ready, key=lambda g: (tokens[g], g))
    if policy == "affinity":
        return min(ready, key=lambda g: (-match[g], inflight[g], g))
    raise ValueError(f"the control reference does not run router {policy}")
