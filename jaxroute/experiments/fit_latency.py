"""The trained latency model fitted to measured runs: every stage simulated in one compiled program.

Each measured stage (`real_runs.Stage`) is simulated as inference-perf ran it: its shared-prefix prompts (groups
sharing a system prompt) arriving at the stage's rate (inference-perf's `constant` timer draws exponential gaps and
scales them to the stage's duration, loadgen/load_timer.py `ConstantLoadTimer`: a Poisson process given its
count), on one vLLM replica of the stage's model, TP degree, max_num_batched_tokens, max_num_seqs and KV pool
(`server.kv_parts`), on-demand admission with recompute preemption, the prefix cache as the server file sets it. The stages differ in
traced data only (workload arrays, rates, cost parameters, KV capacity), so they are rows of one program
(`simulate`): vmapped over stages, every row's while loop running the replica model to its end.

The step time is `beta . basis` (`cost_models.trained_basis`), linear in beta, so with a stage's decisions held
(which request runs in which iteration) each request's service times are linear in beta and their Jacobian is
exact: `jax.jvp` along each coefficient's direction gives it (forward mode through the while loops). A request's
TTFT as the client sees it is its wait before admission, plus its service to the first token, plus the
request-level costs (`latency_params.ALPHA`); its E2E adds the service after the first token and the per-output-
token cost. The fit is a Gauss-Newton iteration on these: simulate every stage at the current coefficients, solve
the damped non-negative linear least squares in log error for the stage targets (TTFT mean and p90, E2E mean and
p90, per-token time; a p90 through the requests at the p90; the wait before admission held), and
repeat; the round with the lowest simulated loss is kept. The coefficients' uncertainty is the linearised covariance of that last solve
(residual variance x (J^T J)^-1, J the relative-error Jacobian).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as PS

from jaxroute import cost_models, latency_params, real_runs, server
from jaxroute.errors import JaxrouteError
from jaxroute.latency_params import (
    ALPHA,
    BASIS,
    FIT_REQUESTS,
    FIT_ROUNDS,
    LatencyParams,
)

K = len(BASIS)
P = K + len(ALPHA)
DEFAULT_REQUESTS = FIT_REQUESTS  # requests simulated per stage that keeps up (the load is steady)
DEFAULT_ROUNDS = FIT_ROUNDS
SATURATED_TTFT_S = 1.0
# physical lower bounds (others: 0): a prefill chunk cannot run faster than the tensor cores' datasheet peak. The
# measured runs barely inform this term (short prompts, mostly found in the prefix cache), and unbounded it drifts
# to a fraction of the peak time (BLIS's own fit has 0.15), which would make long prompts prefill impossibly fast.
LOWER = {"prefill_compute": 1.0}
DAMPING = 1e-2  # Levenberg-Marquardt's first damping (relative to each coefficient's column norm)  # a measured TTFT mean above this: the stage's queue grew; simulate all its requests
ROUTER = "least_load"  # one replica: the router does not matter


@dataclasses.dataclass(frozen=True)
class StageResult:
    """One stage simulated: per-request arrays [N] (seconds; the alpha costs not yet added) and the Jacobians."""

    wait: np.ndarray  # admit - arrival
    first: np.ndarray  # first token - admit
    total: np.ndarray  # finish - admit
    d_first: np.ndarray  # [K, N] d first / d beta
    d_total: np.ndarray  # [K, N]
    prompt: np.ndarray
    output: np.ndarray
    overflow: bool
    preemptions: int


def predictions(r: StageResult, lp: LatencyParams | None, timeout_s: float = math.inf) -> dict[str, float]:
    """The stage's targets as the client measures them, over the requests that did not time out (inference-perf
    counts those as failures and leaves them out of every latency statistic), and the failed fraction."""
    ttft, e2e = _client_times(r, lp)
    ok = e2e < timeout_s
    if not ok.any():
        return {**dict.fromkeys((*real_runs.TARGETS, "ttft_p99", "e2e_p99"), math.nan), "failed": 1.0}
    ttft, e2e, out = ttft[ok], e2e[ok], float(np.mean(r.output[ok]))
    return {"ttft_mean": float(ttft.mean()), "ttft_p90": float(np.percentile(ttft, 90)),
            "e2e_mean": float(e2e.mean()), "e2e_p90": float(np.percentile(e2e, 90)),
            "itl": float((e2e.mean() - ttft.mean()) / max(out - 1, 1)),
            "ttft_p99": float(np.percentile(ttft, 99)), "e2e_p99": float(np.percentile(e2e, 99)),
            "failed": float(1 - ok.mean())}


def _rows(r: StageResult, lp: LatencyParams) -> dict[str, tuple[float, np.ndarray]]:
    """Each target as offset + J . theta (theta = beta then alpha), linearised at `lp` (the wait held)."""
    ttft, e2e = _client_times(r, lp)
    o1 = np.maximum(r.output - 1, 0).astype(np.float64)
    # the wait before admission is held at this simulation's (an arrival joins whichever iteration runs when it
    # comes: no derivative of its own); the next round's simulation updates it
    alphas = lambda last: np.stack([np.ones_like(r.prompt), r.prompt, last])
    jt = np.concatenate([r.d_first, alphas(0 * r.prompt)], 0)  # [P, N]
    je = np.concatenate([r.d_total, alphas(o1)], 0)
    wt, we = _p90_weights(ttft), _p90_weights(e2e)
    out = max(float(np.mean(r.output)) - 1, 1.0)
    rows = {"ttft_mean": (r.wait.mean(), jt.mean(1)), "ttft_p90": (wt @ r.wait, jt @ wt),
            "e2e_mean": (r.wait.mean(), je.mean(1)), "e2e_p90": (we @ r.wait, je @ we),
            "itl": (0.0, (je.mean(1) - jt.mean(1)) / out)}
    return rows


def _p90_weights(x: np.ndarray) -> np.ndarray:
    """[N] weights w with w . x = np.percentile(x, 90) (linear interpolation between the two order statistics)."""
    order = np.argsort(x, kind="stable")
    pos = 0.9 * (len(x) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(x) - 1)
    w = np.zeros(len(x))
    w[order[lo]] += 1 - (pos - lo)
    w[order[hi]] += pos - lo
    return w


# --------------------------------------------------------------------------- the program


def stage_requests(stage: real_runs.Stage, n: int) -> int:
    """Requests simulated for a stage: `n` (at most its own count) while the server keeps up, all of them when its
    measured TTFT shows a queue growing over the stage (mean above SATURATED_TTFT_S): there the stage's length
    decides the latencies."""
    return stage.requests if stage.measured["ttft_mean"] > SATURATED_TTFT_S else min(stage.requests, n)


@dataclasses.dataclass(frozen=True)
class Group:
    """Stages simulated together: the same request count and static settings (one program)."""

    index: tuple[int, ...]  # positions in the stage list
    model: object  # ReplicaModel
    workloads: object  # stacked [S, ...]
    params: object  # stacked [S, ...]
    keys: jax.Array  # [S]


def prepare(stages: list[real_runs.Stage], n: int = DEFAULT_REQUESTS, seed: int = 0,
            cost_model: str = "trained") -> list[Group]:
    """The stages' programs' inputs, grouped by request count and static settings."""
    by: dict = {}
    for i, s in enumerate(stages):
        by.setdefault((stage_requests(s, n), s.chunk, s.max_running, s.prefix_caching), []).append(i)
    return [_group([stages[i] for i in idx], tuple(idx), key[0], seed, cost_model) for key, idx in sorted(by.items())]


def _group(stages: list[real_runs.Stage], index, n: int, seed: int, cost_model: str) -> Group:
    from jaxroute.clusters import replicas
    from jaxroute.workloads import inference_perf

    chunk, max_running = stages[0].chunk, stages[0].max_running
    wls, params = [], []
    for s in stages:
        wls.append(inference_perf.workload(s.sent(n)))
        kv = server.kv_parts(s.gpu, s.model, s.tp, s.gpu_memory_utilization, s.block_size).tokens
        params.append(replicas.make_params(ROUTER, rate=s.rate, kv_capacity=kv, gpu=s.gpu, model=s.model, tp=s.tp,
                                           cost_model=cost_model))
    shapes = tuple(sorted({sh for w in wls for sh in w.request_shapes}))
    common = dict(name="real-run stage", rate_stages=((1.0, float(n)),), request_shapes=shapes)
    wls = [dataclasses.replace(w, **common) for w in wls]
    if len({(jax.tree.structure(w), tuple(np.shape(x) for x in jax.tree.leaves(w))) for w in wls}) > 1:
        raise JaxrouteError("the stages' workloads differ in shape (groups x prompts); fit them in separate groups")
    seg = np.concatenate([w.segment_lengths() for w in wls])
    kv_max = max(int(np.asarray(p.kv_capacity)) for p in params)
    model = replicas.ReplicaModel(n_replicas=1, chunk=chunk, max_running=max_running,
                                  max_queue=replicas.default_max_queue(n, 1), cache_slots=replicas.slot_bound(seg, kv_max),
                                  admission="on-demand", router_policies=(ROUTER,))
    for p in params:
        model.check_params(p, wls[0])
    stack = lambda xs: jax.tree.map(lambda *a: jnp.stack([jnp.asarray(x) for x in a]), *xs)
    keys = jax.random.split(jax.random.fold_in(jax.random.key(seed), n), len(stages))
    return Group(index, model, stack(wls), stack(params), keys)


_PROGRAMS: dict = {}


def _program(model, trained: bool = True):
    """jit(workloads, params, keys, beta [K]) -> per-stage request times and their beta Jacobians (`trained`
    False: the params' own step-time model, the roofline, whose times do not depend on beta)."""
    if (model, trained) not in _PROGRAMS:
        from jaxroute.clusters.replicas.model import request_fields

        def one(wl, params, key, beta):
            def under(b):
                return dataclasses.replace(params, cost=cost_models.with_beta(params.cost, b)) if trained else params

            def times(b):
                p = under(b)
                state = model.init(key, wl, p)
                steps = model.num_steps(wl)
                _, state = jax.lax.while_loop(lambda c: (c[0] < steps) & ~model.is_done(c[1]),
                                              lambda c: (c[0] + 1, model.step(c[1], wl, p)), (0, state))
                r = request_fields(state)
                return jnp.stack([r["first_token_s"] - r["admit_s"], r["finish_s"] - r["admit_s"]]), state

            def tangent(e):
                (t, state), (dt, _) = jax.jvp(times, (beta,), (e,))
                return t, state, dt

            t, state, dt = jax.vmap(tangent, out_axes=(None, None, 0))(jnp.eye(K, dtype=jnp.float32))
            r = request_fields(state)
            m = model.metrics(state, wl, under(beta))
            return {"wait": r["admit_s"] - r["arrival_s"], "t": t, "dt": dt, "prompt": r["prompt_tokens"],
                    "output": r["output_tokens"], "overflow": m["overflow"], "preemptions": jnp.sum(r["preemptions"])}

        def rows(wl, params, keys, beta):  # a device's stages one at a time: their branches and loops stay real
            return jax.lax.map(lambda x: one(*x, beta), (wl, params, keys))

        mesh = Mesh(np.array(jax.devices()), ("stages",))
        sharded = jax.shard_map(rows, mesh=mesh, in_specs=(PS("stages"),) * 3 + (PS(),), out_specs=PS("stages"),
                                check_vma=False)
        _PROGRAMS[model, trained] = (jax.jit(sharded), mesh)
    return _PROGRAMS[model, trained]


def simulate(stages: list[real_runs.Stage], lp: LatencyParams | None, groups: list[Group]) -> list[StageResult]:
    """Every stage under coefficients `lp` (None: the groups' own step-time model, e.g. the roofline), one
    compiled program per group; the alpha costs are added by `predictions`."""
    out: list = [None] * len(stages)
    beta = jnp.asarray(lp.beta if lp else (0.0,) * K, jnp.float32)
    for g in groups:
        fn, mesh = _program(g.model, lp is not None)
        n_dev = mesh.devices.size
        size = -(-len(g.index) // n_dev) * n_dev
        pad = lambda x, size=size: jnp.concatenate([x, jnp.repeat(x[-1:], size - x.shape[0], 0)]) \
            if x.shape[0] < size else x
        args = jax.device_put(jax.tree.map(pad, (g.workloads, g.params, g.keys)), NamedSharding(mesh, PS("stages")))
        o = jax.device_get(fn(*args, beta))
        for j, i in enumerate(g.index):
            f64 = lambda x, j=j: np.asarray(x[j], np.float64)
            t, dt = f64(o["t"]), f64(o["dt"])
            r = StageResult(wait=f64(o["wait"]), first=t[0], total=t[1], d_first=dt[:, 0], d_total=dt[:, 1],
                            prompt=f64(o["prompt"]), output=f64(o["output"]), overflow=bool(o["overflow"][j]),
                            preemptions=int(o["preemptions"][j]))
            if not np.all(np.isfinite(r.total)):
                raise JaxrouteError(f"{stages[i].label}: a simulated request never finished")
            out[i] = r
    return out


# --------------------------------------------------------------------------- the fit


@dataclasses.dataclass(frozen=True)
class Fit:
    params: LatencyParams
    loss: tuple[float, ...]  # the simulated loss of each round's coefficients
    best_round: int
    std: tuple[float, ...]  # [P] linearised standard errors of (beta, alpha)
    results: list  # the best round's StageResults


def loss(stages, results, lp: LatencyParams) -> float:
    """Mean squared log error (log simulated / measured) over the stages' targets: symmetric in over- and under-
    prediction, so one saturated stage predicted 100x too slow does not outweigh the rest."""
    errs = [math.log(max(predictions(r, lp, s.timeout_s)[k], 1e-9) / s.measured[k])
            for s, r in zip(stages, results, strict=True) for k in real_runs.TARGETS]
    return float(np.mean(np.square(errs))) if all(map(math.isfinite, errs)) else math.inf


def _solve(stages, results, lp: LatencyParams, free: np.ndarray, damping: float = 0.0):
    """Non-negative least squares of the linearised log errors over the `free` coefficients (the others held at
    `lp`'s values), Levenberg-Marquardt damped (`damping` x each column's squared norm on the step): (theta, std)."""
    from scipy.optimize import lsq_linear

    held = np.asarray(lp.beta + lp.alpha, np.float64)
    a, b = [], []
    for s, r in zip(stages, results, strict=True):
        for k, (c, j) in _rows(r, lp).items():
            # log(c + j.theta) ~ log(p0) + j.(theta - theta0) / p0, p0 = c + j.theta0 (Gauss-Newton in log space)
            p0 = max(c + j @ held, 1e-9)
            a.append(j / p0)
            b.append(math.log(s.measured[k] / p0) + (j[free] @ held[free]) / p0)
    a, b = np.asarray(a)[:, free], np.asarray(b)
    scale = np.maximum(np.linalg.norm(a, axis=0), 1e-30)
    x0 = held[free] * scale  # the current point in scaled coordinates
    ad = np.vstack([a / scale, math.sqrt(damping) * np.eye(len(scale))])
    bd = np.concatenate([b, math.sqrt(damping) * x0])
    lower = np.array([LOWER.get(n, 0.0) for n in BASIS + ALPHA])[free] * scale
    sol = lsq_linear(ad, bd, bounds=(lower, np.inf), method="bvls")
    x = sol.x / scale
    theta = held.copy()
    theta[free] = x
    resid = a @ x - b
    dof = max(len(b) - int(free.sum()), 1)
    cov = np.linalg.pinv(a.T @ a) * float(resid @ resid) / dof
    std = np.zeros(P)
    std[free] = np.sqrt(np.maximum(np.diag(cov), 0))
    return theta, std


def fit(stages: list[real_runs.Stage], start: LatencyParams | None = None, rounds: int = DEFAULT_ROUNDS,
        n: int = DEFAULT_REQUESTS, seed: int = 0, progress=None, groups: list[Group] | None = None,
        train: list[int] | None = None, only: tuple[str, ...] | None = None) -> Fit:
    """Gauss-Newton rounds (module docstring) from `start` (default `latency_params.start()`), Levenberg-Marquardt
    damped: each round solves from the best point so far, its damping cut after a round that improved on it and
    raised after one that did not.

    train: the positions of the stages fitted to (default all); the others are simulated in the same programs
    (their results come back too) but inform nothing: a held-out fold. only: the coefficients fitted (names of
    `BASIS` and `ALPHA`; default all); the others keep `start`'s values."""
    from jaxroute import catalog

    lp = start or latency_params.start()
    groups = groups or prepare(stages, n, seed)
    # a coefficient the stages cannot inform stays 0: the MoE-layer term without a MoE model, TP without TP > 1
    names = BASIS + ALPHA
    unknown = sorted(set(only or ()) - set(names))
    if unknown:
        raise JaxrouteError(f"unknown coefficient(s) {', '.join(unknown)}; choose from: {', '.join(names)}")
    free = np.array([only is None or n in only for n in names])
    train = list(range(len(stages))) if train is None else list(train)
    fitted = [stages[i] for i in train]
    free[BASIS.index("per_moe_layer_us")] &= any(catalog.get_model(s.model).n_experts > 1 for s in fitted)
    free[BASIS.index("tp_allreduce")] &= any(s.tp > 1 for s in fitted)
    free[BASIS.index("tp_hop_us")] &= len({s.tp for s in fitted if s.tp > 1}) > 1  # apart from per-layer costs
    params_of = lambda t: LatencyParams(tuple(float(x) for x in t[:K]), tuple(float(x) for x in t[K:]))
    best = None  # (loss, round, params, results)
    losses, damping = [], DAMPING
    for i in range(rounds):
        res = simulate(stages, lp, groups)
        cur = loss(fitted, [res[j] for j in train], lp)
        losses.append(cur)
        if progress:
            progress(i, cur, lp)
        if best is None or cur < best[0]:
            best = (cur, i, lp, res)
            damping = damping / 3 if i else damping
        else:
            damping *= 10  # the step went too far: a shorter one from the best point
        theta, std = _solve(fitted, [best[3][j] for j in train], best[2], free, damping)
        lp = params_of(theta)
    _, i, lp_best, res = best
    _, std = _solve(fitted, [res[j] for j in train], lp_best, free)
    return Fit(lp_best, tuple(losses), i, tuple(float(x) for x in std), res)


# --------------------------------------------------------------------------- errors


NO_ALPHA = (0.0,) * len(ALPHA)


def _client_times(r: StageResult, lp: LatencyParams | None) -> tuple[np.ndarray, np.ndarray]:
    a0, ap, ao = lp.alpha if lp else NO_ALPHA
    ttft = r.wait + r.first + a0 + ap * r.prompt
    return ttft, r.wait + r.total + a0 + ap * r.prompt + ao * np.maximum(r.output - 1, 0)


def _weighted_p90(x: np.ndarray, w: np.ndarray) -> float:
    order = np.argsort(x)
    c = np.cumsum(w[order]) / np.sum(w)
    return float(x[order][min(np.searchsorted(c, 0.9), len(x) - 1)])


def stage_errors(stages, results, lp: LatencyParams | None) -> list[dict]:
    """Per stage: measured and simulated targets and the simulated one's percent error."""
    rows = []
    for s, r in zip(stages, results, strict=True):
        p = predictions(r, lp, s.timeout_s)
        rows.append({"run": s.run, "stage": s.index, "rate": s.rate, "requests": s.requests,
                     "simulated_requests": len(r.output), "overloaded": s.overloaded,
                     "measured": {k: s.measured[k] for k in (*real_runs.TARGETS, "ttft_p99", "e2e_p99")},
                     "simulated": p, "error_pct": {k: 100 * (p[k] / s.measured[k] - 1) for k in real_runs.TARGETS},
                     "simulated_failed_pct": 100 * p["failed"], "measured_failed_pct": 100 * s.failures / s.requests,
                     "preemptions": r.preemptions, "overflow": r.overflow})
    return rows


def run_errors(stages, results, lp: LatencyParams | None) -> dict[str, dict]:
    """Per run: the whole run's targets, measured (its summary file) and simulated (its stages' requests pooled,
    each stage weighted by the requests it sent), and the percent errors."""
    out: dict = {}
    for s, r in zip(stages, results, strict=True):
        out.setdefault(s.run, []).append((s, r))
    table = {}
    for run, pairs in out.items():
        ttft, e2e, w, outl = [], [], [], []
        for s, r in pairs:
            t, e = _client_times(r, lp)
            ok = e < s.timeout_s
            ttft.append(t[ok]), e2e.append(e[ok]), outl.append(r.output[ok])
            w.append(np.full(int(ok.sum()), s.requests / len(t)))
        ttft, e2e, w, outl = map(np.concatenate, (ttft, e2e, w, outl))
        if not len(ttft):
            ttft = e2e = outl = np.array([math.nan])
            w = np.ones(1)
        tm, em = float(np.average(ttft, weights=w)), float(np.average(e2e, weights=w))
        sim = {"ttft_mean": tm, "ttft_p90": _weighted_p90(ttft, w), "e2e_mean": em, "e2e_p90": _weighted_p90(e2e, w),
               "itl": (em - tm) / max(float(np.average(outl, weights=w)) - 1, 1)}
        meas = pairs[0][0].run_measured or _pooled_measured([s for s, _ in pairs])
        table[run] = {"model": real_runs.model_family(pairs[0][0].model), "overloaded": pairs[0][0].overloaded,
                      "measured": {k: meas[k] for k in real_runs.TARGETS}, "simulated": sim,
                      "error_pct": {k: 100 * (sim[k] / meas[k] - 1) for k in real_runs.TARGETS}}
    return table


def _pooled_measured(stages) -> dict:
    w = np.array([s.requests for s in stages], np.float64)
    return {k: float(np.average([s.measured[k] for s in stages], weights=w)) for k in real_runs.TARGETS}


def medians(table: dict[str, dict], overloaded: bool = False) -> dict[str, float]:
    """Median over the runs (not overloaded, unless asked) of each target's absolute percent error."""
    rows = [v for v in table.values() if v["overloaded"] == overloaded]
    return {k: float(np.median([abs(v["error_pct"][k]) for v in rows])) if rows else math.nan
            for k in real_runs.TARGETS}


def cross_validate(stages: list[real_runs.Stage], groups: list[Group], rounds: int = DEFAULT_ROUNDS,
                   start: LatencyParams | None = None, progress=None, use: list[int] | None = None) -> dict[str, dict]:
    """Leave one model out: per model, the coefficients fitted to the other models' stages and the held-out runs'
    errors under them ({model: {"params", "runs": run_errors of its runs}}). use: the stages taking part."""
    use = list(range(len(stages))) if use is None else list(use)
    families = sorted({real_runs.model_family(stages[i].model) for i in use})
    if len(families) < 2:
        raise JaxrouteError("leave-one-model-out needs stages of at least two models")
    out = {}
    for fam in families:
        train = [i for i in use if real_runs.model_family(stages[i].model) != fam]
        held = [i for i in use if real_runs.model_family(stages[i].model) == fam]
        f = fit(stages, start=start, rounds=rounds, groups=groups, train=train,
                progress=(lambda i, cur, lp, fam=fam: progress(fam, i, cur, lp)) if progress else None)
        res = f.results
        out[fam] = {"params": f.params, "runs": run_errors([stages[i] for i in held], [res[i] for i in held],
                                                            f.params)}
    return out
