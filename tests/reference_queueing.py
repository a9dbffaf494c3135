"""Pure-Python reference for the classic dispatch model: a plain event loop in float64.

It is deliberately naive and independent of the jitted formulation: absolute
times, a list of every job's finish time per server, queue length = number of
jobs on the server that finish after now, and a board refreshed at exactly
0, T, 2T, ... It consumes the same random draws (gaps, service times, sampled
servers) as the jitted model, so the two must agree to float tolerance.
"""

from __future__ import annotations

import math

POLICIES = ("random", "rr", "jsq", "pod", "lwl")
READS_QUEUE = {"jsq", "pod"}


def _first_min_from(values, offset):
    """The first index, scanning cyclically from `offset`, whose value is the minimum."""
    n = len(values)
    best = min(values)
    for j in range(n):
        s = (offset + j) % n
        if values[s] == best:
            return s
    raise AssertionError("unreachable")


def simulate_dispatch(gaps, services, picks, policy, n_servers, stale=0.0, d=2, ring=10**9):
    """Route each arrival; return per-request response times, chosen servers and the overflow flag.

    gaps[i]: time since the previous arrival; services[i]: service time; picks[i]: sampled servers.
    `ring`: a server holding >= ring jobs when a policy that reads queue lengths sends it one more
    is an overflow (the jitted model's capacity).
    """
    finish = [[] for _ in range(n_servers)]  # finish times of every job ever sent to each server
    free_at = [0.0] * n_servers
    board = [0] * n_servers
    board_epoch = 0
    t = 0.0
    responses, servers = [], []
    overflow = False

    def queue_length(s, now):
        return sum(1 for f in finish[s] if f > now)

    for i, (gap, svc, pk) in enumerate(zip(gaps, services, picks, strict=True)):
        t += float(gap)
        if stale > 0:
            epoch = math.floor(t / stale)
            if epoch > board_epoch:
                refresh = epoch * stale
                board = [queue_length(s, refresh) for s in range(n_servers)]
                board_epoch = epoch
            seen = board
        else:
            seen = [queue_length(s, t) for s in range(n_servers)]
        work = [max(free_at[s] - t, 0.0) for s in range(n_servers)]
        pk = [int(x) for x in pk]
        if policy == "random":
            s = pk[0]
        elif policy == "rr":
            s = i % n_servers
        elif policy == "jsq":
            s = _first_min_from(seen, pk[0])
        elif policy == "pod":
            cand = set(pk[:d])
            s = _first_min_from([seen[c] if c in cand else math.inf for c in range(n_servers)], pk[0])
        elif policy == "lwl":
            s = _first_min_from(work, pk[0])
        else:
            raise ValueError(policy)
        if policy in READS_QUEUE and queue_length(s, t) >= ring:
            overflow = True
        start = max(free_at[s], t)
        free_at[s] = start + float(svc)
        finish[s].append(free_at[s])
        responses.append(free_at[s] - t)
        servers.append(s)
    return {"response": responses, "server": servers, "overflow": overflow}


def balls_into_bins(picks, d, n):
    """Place len(picks) balls into n bins; each joins the first least-loaded of its first d samples."""
    loads = [0] * n
    for pk in picks:
        cand = [int(x) for x in pk[:d]]
        vals = [loads[c] for c in cand]
        loads[cand[vals.index(min(vals))]] += 1
    return loads
