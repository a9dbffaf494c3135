"""Tune a router's traced settings with CMA-ES (evosax) on the prefix-cache replica cluster.

The search runs in the unit box [0, 1]^d: each tunable setting (`Knob`) maps its bounds onto [0, 1]
(log-scale where it spans decades) and candidates are clipped to the box. CMA-ES starts at the
preset's defaults (what `jaxroute cluster` runs) and generation 0 holds the defaults as member 0, so
the best-ever candidate is never worse than the defaults on the search seeds.

Each generation is one compiled batch of population x seeds runs (`sim.run_grid` on one model whose
shapes never change, so the search compiles once); objective `capacity` runs one capacity search per
generation instead (a few rounds of one compiled batch, `capacity.search`). Common random numbers: every
member and every generation runs the same search seeds (base key `seed`), so members are compared on
the same workload draws and the best-ever mean is comparable across generations. The final candidates
(best-ever, best of the last generation, the CMA-ES mean) and the defaults are re-evaluated on fresh
seeds (base key `seed + FRESH_SEED`), with 95 % CIs and the gain over the defaults paired per seed.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from jaxroute import sim
from jaxroute.clusters import replicas
from jaxroute.clusters.names import (
    DEFAULT_CHUNK,
    DEFAULT_MAX_RUNNING,
    REPLICA_GPU,
    REPLICA_MODEL,
)
from jaxroute.errors import JaxrouteError
from jaxroute.experiments import capacity as cap
from jaxroute.experiments.cluster import initial_capacities, uses_weights
from jaxroute.experiments.knobs import TUNABLE, TUNABLE_ROUTERS
from jaxroute.experiments.pd import ColocatedStage, request_metrics
from jaxroute.metrics import Summary, summarize
from jaxroute.routers import prefix as routers
from jaxroute.routers.parts import SCORERS
from jaxroute.routers.spec import Knob, weight_knobs
from jaxroute.workloads import prefix as wl_prefix

FRESH_SEED = 1_000_003  # the final re-evaluation's base seed is the search's plus this

# --------------------------------------------------------------------------- the tunable settings
# Knob, TUNABLE (preset -> the settings tuned by default) and TUNABLE_ROUTERS are in experiments/knobs.py.


def knobs_for(router: str, names=None) -> tuple[Knob, ...]:
    """The knobs of `router` named (None = its default set); the weighted presets also take any `w_<scorer>`."""
    if router not in TUNABLE:
        raise JaxrouteError(f"router '{router}' has no tunable settings; choose from: {', '.join(TUNABLE_ROUTERS)}")
    table = {k.name: k for k in TUNABLE[router]}
    if uses_weights(router):
        table.update({k.name: k for k in weight_knobs(*SCORERS) if k.name not in table})
    return TUNABLE[router] if names is None else pick_knobs(table, names, router)


def pick_knobs(table: dict[str, Knob], names, router: str) -> tuple[Knob, ...]:
    """The knobs of `table` named, in order; unknown, repeated or no names are refused."""
    out = []
    for n in names:
        if n not in table:
            raise JaxrouteError(f"'{n}' is not a tunable setting of {router}; choose from: {', '.join(table)}")
        if table[n] in out:
            raise JaxrouteError(f"setting '{n}' is listed twice")
        out.append(table[n])
    if not out:
        raise JaxrouteError(f"no setting given; choose from: {', '.join(table)}")
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Space:
    """The search space of one router: its knobs, mapped to and from the unit box."""

    router: str
    knobs: tuple[Knob, ...]

    @classmethod
    def of(cls, router: str, names=None) -> Space:
        return cls(router, knobs_for(router, names))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.knobs)

    def default_values(self) -> np.ndarray:
        """The preset's values of the knobs (read back from `router_params(router)`)."""
        rp = routers.router_params(self.router)
        w = np.asarray(rp.weights, np.float64)
        v = [w[SCORERS.index(k.scorer)] if k.scorer else float(getattr(rp, k.name)) for k in self.knobs]
        return np.array([float(f"{x:.7g}") for x in v])  # float32 -> the number as written (0.3, not 0.30000001)

    def to_unit(self, values) -> np.ndarray:
        return np.array([k.to_unit(v) for k, v in zip(self.knobs, values, strict=True)])

    def from_unit(self, u) -> np.ndarray:
        return np.array([k.from_unit(x) for k, x in zip(self.knobs, u, strict=True)])

    def settings(self, values) -> dict:
        """`make_params` router keywords: the knobs at `values`; untuned weights keep the preset's."""
        out: dict[str, Any] = {}
        weights = {}
        if any(k.scorer for k in self.knobs):
            w = np.asarray(routers.router_params(self.router).weights, np.float64)
            weights = {s: float(x) for s, x in zip(SCORERS, w, strict=True) if x != 0}
        for k, v in zip(self.knobs, values, strict=True):
            if k.scorer:
                weights[k.scorer] = float(v)
            else:
                out[k.name] = float(v)
        if weights:
            out["weights"] = {s: weights[s] for s in SCORERS if s in weights}
        return out

    def values_of(self, values) -> dict[str, float]:
        return {k.name: float(v) for k, v in zip(self.knobs, values, strict=True)}


@dataclasses.dataclass(frozen=True)
class DefaultsSpace(Space, abc.ABC):
    """A space whose candidates are plain settings dicts: `defaults()` (each subclass's) with the knobs' values over it."""

    @abc.abstractmethod
    def defaults(self) -> dict[str, Any]:
        """The settings a candidate's knob values go over."""

    def default_values(self) -> np.ndarray:
        d = self.defaults()
        return np.array([float(d[k.name]) for k in self.knobs])

    def settings(self, values) -> dict:
        out = self.defaults()
        out.update({k.name: float(v) for k, v in zip(self.knobs, values, strict=True)})
        return out


# --------------------------------------------------------------------------- settings files (`cluster --params-json`)

ROUTER_SETTINGS = ("theta", "guard_abs", "guard_rel", "temperature", "load_threshold")
PARAMS_KEYS = ("router", "settings", "about")


def allowed_settings(router: str) -> tuple[str, ...]:
    """Keys a settings file may give `router`: the router-level ones, weights (weighted presets), its module's."""
    module = routers.PRESETS[router].module
    own = module.settings if module else ()
    return ROUTER_SETTINGS + (("weights",) if uses_weights(router) else ()) + own


def check_settings(router: str, settings: Any, where: str = "settings") -> dict:
    """Refuse an unknown router or unknown / malformed settings; returns the settings as make_params keywords."""
    if router not in routers.PRESETS:
        raise JaxrouteError(f"{where}: unknown router '{router}'; choose from: {', '.join(routers.PRESETS)}")
    if not isinstance(settings, dict):
        raise JaxrouteError(f"{where}: settings must be an object of name: value, got {type(settings).__name__}")
    allowed = allowed_settings(router)
    if unknown := sorted(set(settings) - set(allowed)):
        raise JaxrouteError(f"{where}: unknown setting(s) {', '.join(unknown)} for {router}; "
                            f"choose from: {', '.join(allowed)}")
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    for k, v in settings.items():
        if k == "weights":
            if not (isinstance(v, dict) and all(isinstance(s, str) and number(x) for s, x in v.items())):
                raise JaxrouteError(f"{where}: weights must be an object of scorer: number, got {v!r}")
        elif not (number(v) or isinstance(v, (bool, str))):
            raise JaxrouteError(f"{where}: setting {k} must be a finite number, got {v!r}")
    try:
        routers.router_params(router, **settings)
    except (JaxrouteError, TypeError, ValueError) as e:
        raise JaxrouteError(f"{where}: {e}") from None
    return dict(settings)


def load_params(path: str | Path) -> tuple[str, dict]:
    """(router, settings) of a settings file written by `jaxroute tune --params-out` (checked)."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise JaxrouteError(f"cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise JaxrouteError(f"{path} is not JSON: {e}") from None
    if not isinstance(data, dict) or "router" not in data or "settings" not in data:
        raise JaxrouteError(f"{path}: expected an object with 'router' and 'settings' (as jaxroute tune --params-out writes)")
    if unknown := sorted(set(data) - set(PARAMS_KEYS)):
        raise JaxrouteError(f"{path}: unknown key(s) {', '.join(unknown)}; expected: {', '.join(PARAMS_KEYS)}")
    if not isinstance(data["router"], str):
        raise JaxrouteError(f"{path}: 'router' must be a router name, got {data['router']!r}")
    return data["router"], check_settings(data["router"], data["settings"], str(path))


# --------------------------------------------------------------------------- objectives

REQUEST_METRICS = ("goodput_rps", "slo_attainment", "e2e_mean_s", "e2e_p99_s")  # from the per-request records
MAXIMISE = ("goodput_rps", "slo_attainment", "capacity", "output_tokens_per_s", "hit_rate")
OBJECTIVES = ("goodput", "capacity") + REQUEST_METRICS[1:] + replicas.METRICS


@dataclasses.dataclass(frozen=True)
class CapacitySearch:
    """`capacity.search` settings of objective capacity (rates in req/s)."""

    lo: float = 0.5
    hi: float = 100.0
    tol: float = 0.05
    points: int = 4
    max_rounds: int = 6


@dataclasses.dataclass(frozen=True)
class Objective:
    """What is optimised: `metric` (goodput_rps, capacity or a metric of the model) and its direction.

    Goodput counts requests whose TTFT <= slo_ttft and TPOT <= slo_tpot per second (`pd.request_metrics`);
    capacity is the largest rate at which every `slo` clause holds (`capacity.search`)."""

    metric: str
    maximise: bool
    slo: tuple = ()
    slo_ttft: float = math.inf
    slo_tpot: float = math.inf
    search: CapacitySearch = CapacitySearch()

    @property
    def sign(self) -> float:
        return 1.0 if self.maximise else -1.0

    @property
    def slo_text(self) -> str:
        return ",".join(f"{b.metric}{b.op}{b.value:g}" for b in self.slo)


def objective(name: str, slo: tuple = (), search: CapacitySearch = CapacitySearch()) -> Objective:
    """The objective by CLI name; for goodput the SLO's ttft_* / tpot_* bounds are the per-request thresholds."""
    metric = "goodput_rps" if name == "goodput" else name
    if metric not in OBJECTIVES + ("goodput_rps",):
        raise JaxrouteError(f"unknown objective '{name}'; choose from: {', '.join(OBJECTIVES)}")
    ttft = tpot = math.inf
    if metric in ("goodput_rps", "slo_attainment"):
        if not slo:
            raise JaxrouteError(f"objective {name} needs an SLO, e.g. --slo ttft_p90_s<=2,tpot_p90_s<=0.1")
        for b in slo:
            kind = b.metric.split("_")[0]
            if kind not in ("ttft", "tpot") or b.op != "<=":
                raise JaxrouteError(f"objective {name} takes per-request bounds ttft_*<=S and tpot_*<=S, got "
                                    f"'{b.metric}{b.op}{b.value:g}'")
            ttft, tpot = (min(ttft, b.value), tpot) if kind == "ttft" else (ttft, min(tpot, b.value))
    elif metric == "capacity":
        if not slo:
            raise JaxrouteError("objective capacity needs an SLO, e.g. --slo ttft_p90_s<=1")
    elif slo:
        raise JaxrouteError(f"--slo applies to objectives goodput, slo_attainment and capacity, not {name}")
    return Objective(metric, metric in MAXIMISE, tuple(slo), ttft, tpot, search)


# --------------------------------------------------------------------------- evaluation


@dataclasses.dataclass(frozen=True)
class Setup:
    """The cluster a router is tuned on (as `jaxroute cluster` sets it up)."""

    workload: Any
    replicas: int = 4
    rate: float = 1.0  # req/s (0 = a trace's recorded times); unused by objective capacity
    gpu: str = REPLICA_GPU
    model_name: str = REPLICA_MODEL
    tp: int = 1
    cost_model: str = "roofline"
    kv_capacity: int | None = None
    stale_s: float = 0.0
    latency: Any = None  # the trained model's coefficients (`latency_params.LatencyParams`; None: the shipped ones)
    chunk: int = DEFAULT_CHUNK
    max_running: int = DEFAULT_MAX_RUNNING
    local: str = "fcfs"
    admission: str = "reserve"

    def params(self, router: str, settings: dict) -> replicas.ReplicaParams:
        return replicas.make_params(router, rate=self.rate, stale_s=self.stale_s, kv_capacity=self.kv_capacity,
                                    gpu=self.gpu, model=self.model_name, cost_model=self.cost_model, tp=self.tp,
                                    latency=self.latency, **settings)


@dataclasses.dataclass(frozen=True)
class TuneStage(ColocatedStage):
    """The replica cluster with its metrics and its per-request records (`ColocatedStage`) in one run."""

    def metrics(self, state, workload, params):
        return {**self.tier.metrics(state, workload, params), **super().metrics(state, workload, params)}


@dataclasses.dataclass(frozen=True)
class Batch:
    """Scores [C, S] of one evaluated batch (NaN where a run overflowed) and the runs it took."""

    scores: np.ndarray
    runs: int


Evaluate = Callable[[list[dict]], Batch]


def tune_model(space: Space, setup: Setup) -> TuneStage:
    """The model of every grid evaluation: sized for any candidate in the box, so its shapes never change."""
    probe = [setup.params(space.router, space.settings(space.from_unit(np.full(len(space.knobs), u)))) for u in (0, 1)]
    probe.append(setup.params(space.router, space.settings(space.default_values())))
    wl_prefix.check_fits(setup.workload, int(np.asarray(probe[0].kv_capacity)))
    caps = initial_capacities(setup.workload, probe, setup.replicas)
    return TuneStage(replicas.ReplicaModel(
        n_replicas=setup.replicas, chunk=setup.chunk, max_running=setup.max_running,
        max_queue=setup.workload.n_requests, cache_slots=caps["cache_slots"], router_window=caps["router_window"],
        router_policies=(space.router,),
        stale_view=setup.stale_s > 0, local_order=setup.local, admission=setup.admission))


def scores_of(metrics: dict[str, np.ndarray], obj: Objective, n_replicas: int, max_running: int) -> np.ndarray:
    """[C, S] objective values of a grid's metrics (NaN where a run overflowed); the per-request ones read the
    records as `pd.request_metrics` does for colocated rows (n_replicas groups of max_running slots)."""
    over = np.asarray(metrics["overflow"], bool)
    C, S = over.shape[:2]
    if obj.metric in REQUEST_METRICS:
        rec = dict(metrics, n_groups=np.full((C, S), n_replicas), slots=np.full((C, S), max_running))
        val = np.array([[request_metrics(rec, c, s, obj.slo_ttft, obj.slo_tpot, True)[obj.metric] for s in range(S)]
                        for c in range(C)])
    elif obj.metric in metrics and np.ndim(metrics[obj.metric]) == 2:
        val = np.asarray(metrics[obj.metric], np.float64)
    else:
        names = sorted(k for k, v in metrics.items() if np.ndim(v) == 2) + list(REQUEST_METRICS)
        raise JaxrouteError(f"unknown objective metric '{obj.metric}'; the model reports: {', '.join(names)}")
    return np.where(over.reshape(C, S, -1).any(axis=2), np.nan, val)


def grid_evaluator(space: Space, obj: Objective, setup: Setup, *, seeds: int, seed: int) -> Evaluate:
    """Evaluate a list of settings in one compiled batch (settings x seeds) on common seeds (base key `seed`)."""
    import jax

    model = tune_model(space, setup)
    key = jax.random.key(seed)

    def evaluate(settings: list[dict]) -> Batch:
        params = sim.stack_params([setup.params(space.router, s) for s in settings])
        m = sim.run_grid(model, key, setup.workload, params, seeds).metrics  # no bar: one whole-run program
        return Batch(scores_of(m, obj, setup.replicas, setup.max_running), len(settings) * seeds)

    return evaluate


def capacity_evaluator(space: Space, obj: Objective, setup: Setup, *, seeds: int, seed: int) -> Evaluate:
    """Evaluate by capacity search (`capacity.ClusterEvaluator`): per (settings, seed) the largest rate known
    to meet the SLO (0 when even the lowest rate misses it; NaN when its bracket overflowed)."""
    s = obj.search

    def evaluate(settings: list[dict]) -> Batch:
        rows = [(space.router, setup.replicas, kw) for kw in settings]
        ev = cap.ClusterEvaluator(rows, setup.workload, seeds=seeds, gpu=setup.gpu, model_name=setup.model_name,
                                  tp=setup.tp, chunk=setup.chunk, max_running=setup.max_running, seed=seed,
                                  local=setup.local, admission=setup.admission, cost_model=setup.cost_model,
                                  kv_capacity=setup.kv_capacity, stale_s=setup.stale_s, latency=setup.latency)
        res = cap.search(ev, len(rows), s.lo, s.hi, obj.slo, tol=s.tol, points=s.points, max_rounds=s.max_rounds)
        scores = np.where(np.isfinite(res.ok), res.ok, 0.0)
        return Batch(np.where(res.overflowed, np.nan, scores), res.evaluations)

    return evaluate


def evaluator(space: Space, obj: Objective, setup: Setup, *, seeds: int, seed: int) -> Evaluate:
    make = capacity_evaluator if obj.metric == "capacity" else grid_evaluator
    return make(space, obj, setup, seeds=seeds, seed=seed)


# --------------------------------------------------------------------------- the search


@dataclasses.dataclass(frozen=True)
class Generation:
    """One generation: the best and mean member (objective values, mean over the search seeds), best so far."""

    index: int
    best: float
    mean: float
    best_ever: float
    overflowed: int


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A final candidate: its knob values and settings, its search-seed mean, its fresh-seed summary and gain."""

    label: str
    values: dict[str, float]
    settings: dict
    search_score: float
    final: Summary
    gain: Summary | None  # improvement over the defaults (+ = better), paired per fresh seed
    gain_pct: float | None

    def as_json(self) -> dict:
        return {"label": self.label, "values": self.values, "settings": self.settings,
                "search_score": self.search_score, "final": self.final.as_json(),
                "gain": self.gain.as_json() if self.gain else None, "gain_pct": self.gain_pct}


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """The search curve, the final candidates (defaults first) and the best one on the fresh seeds (the
    defaults when no tuned candidate beats them there)."""

    space: Space
    objective: Objective
    generations: tuple[Generation, ...]
    candidates: tuple[Candidate, ...]
    best: Candidate
    start_score: float  # the start's (the defaults' unless `start`) objective on the search seeds
    population: int
    seeds: int
    final_seeds: int
    runs: int  # configurations x seeds simulated
    elapsed_s: float

    def as_json(self) -> dict:
        return {"router": self.space.router,
                "knobs": [dataclasses.asdict(k) for k in self.space.knobs],
                "objective": {"metric": self.objective.metric, "maximise": self.objective.maximise,
                              "slo": self.objective.slo_text},
                "population": self.population, "seeds": self.seeds, "final_seeds": self.final_seeds,
                "runs": self.runs, "elapsed_s": self.elapsed_s, "start_score": self.start_score,
                "generations": [dataclasses.asdict(g) for g in self.generations],
                "candidates": [c.as_json() for c in self.candidates], "best": self.best.label}

    def params_json(self, about: dict | None = None) -> dict:
        """The settings file `jaxroute cluster --params-json` reruns (the best candidate's settings)."""
        return {"router": self.space.router, "settings": self.best.settings,
                "about": dict(about or {}, label=self.best.label, objective=self.objective.metric,
                              gain=self.best.gain.as_json() if self.best.gain else None)}


def _mean_scores(scores: np.ndarray) -> np.ndarray:
    """Mean over seeds; a member with an overflowed run gets NaN."""
    return np.where(np.isnan(scores).any(axis=1), np.nan, np.nanmean(np.where(np.isnan(scores), 0, scores), axis=1))


def _paired_gain(tuned: np.ndarray, default: np.ndarray, sign: float) -> Summary | None:
    ok = np.isfinite(tuned) & np.isfinite(default)
    return summarize(sign * (tuned[ok] - default[ok])) if ok.any() else None


def tune(space: Space, obj: Objective, setup: Setup | None, *, population: int = 8, generations: int = 10,
         seeds: int = 4, final_seeds: int = 8, seed: int = 0, std_init: float = 0.2, start=None,
         on_generation: Callable[[Generation], None] | None = None,
         make_evaluator: Callable[[int, int], Evaluate] | None = None) -> TuneResult:
    """CMA-ES over `space` (the unit box; std_init in box units); see the module docstring.

    start: knob values to start from instead of the defaults (they then take member 0 of generation 0; the
    defaults are still re-evaluated at the end). on_generation(Generation) is called after each generation.
    make_evaluator(seeds, seed) -> Evaluate replaces the cluster evaluator (`evaluator(space, obj, setup, ...)`;
    setup may then be None), e.g. the decode model's (`tune_decode`): it is called once for the search seeds
    (base key `seed`) and once for the final fresh seeds (`seed + FRESH_SEED`)."""
    import jax
    import jax.numpy as jnp
    from evosax.algorithms import CMA_ES

    if population < 2:
        raise JaxrouteError(f"CMA-ES needs a population of at least 2, got {population}")
    if make_evaluator is None:
        if setup is None:
            raise JaxrouteError("tune needs a cluster Setup or an evaluator factory (make_evaluator)")
        make_evaluator = lambda n, s: evaluator(space, obj, setup, seeds=n, seed=s)
    t0 = time.perf_counter()
    search = make_evaluator(seeds, seed)
    d = len(space.knobs)
    x_def = space.to_unit(space.default_values())
    lo, hi = np.array([k.lo for k in space.knobs]), np.array([k.hi for k in space.knobs])
    v0 = space.default_values() if start is None else np.clip(np.asarray(start, np.float64), lo, hi)
    x0 = space.to_unit(v0)
    es = CMA_ES(population_size=population, solution=jnp.zeros(d))
    es_params = es.default_params.replace(std_init=float(std_init))
    key = jax.random.key(seed)
    state = es.init(jax.random.fold_in(key, 0), jnp.asarray(x0, jnp.float32), es_params)
    gens: list[Generation] = []
    best_u, best_f, last_u, last_f = x0, -math.inf, x0, -math.inf
    start_score, runs = math.nan, 0
    for g in range(generations):
        k_ask, k_tell = jax.random.split(jax.random.fold_in(key, g + 1))
        pop, state = es.ask(k_ask, state, es_params)
        units = np.clip(np.asarray(pop, np.float64), 0.0, 1.0)
        values = [space.from_unit(u) for u in units]
        if g == 0:  # the start runs in generation 0: best-ever is never below it on the search seeds
            units[0], values[0] = x0, v0
        batch = search([space.settings(v) for v in values])
        runs += batch.runs
        f = obj.sign * _mean_scores(batch.scores)  # higher is better
        bad = np.isnan(f)
        if bad.all():
            raise JaxrouteError("every candidate's run overflowed a fixed capacity; use fewer --requests or a lower --rate")
        f_es = np.where(bad, np.nanmin(f), f)  # an overflowed member ranks last (CMA-ES uses ranks only)
        state, _ = es.tell(k_tell, jnp.asarray(units, jnp.float32), jnp.asarray(-f_es, jnp.float32), state, es_params)
        i = int(np.nanargmax(f))
        if g == 0:
            start_score = float(obj.sign * f[0])
        if f[i] > best_f:
            best_f, best_u = float(f[i]), units[i]
        last_f, last_u = float(f[i]), units[i]
        gens.append(Generation(g, float(obj.sign * f[i]), float(obj.sign * np.nanmean(f)), obj.sign * best_f,
                               int(bad.sum())))
        if on_generation:
            on_generation(gens[-1])
    picks = [("defaults", x_def, start_score if start is None else math.nan), ("best-ever", best_u, obj.sign * best_f),
             ("best-last", last_u, obj.sign * last_f),
             ("cma-mean", np.clip(np.asarray(state.mean, np.float64), 0.0, 1.0), math.nan)]
    unique: list[tuple] = []
    for p in picks:
        if not any(np.allclose(p[1], q[1]) for q in unique):
            unique.append(p)
    final = make_evaluator(final_seeds, seed + FRESH_SEED)
    exact = [space.default_values() if label == "defaults" else space.from_unit(u) for label, u, _ in unique]
    batch = final([space.settings(v) for v in exact])
    runs += batch.runs
    base = batch.scores[0]
    cands = []
    for (label, _, score), values, sc in zip(unique, exact, batch.scores, strict=True):
        s = summarize(sc[np.isfinite(sc)]) if np.isfinite(sc).any() else Summary(math.nan, math.nan, math.nan, ())
        gain = None if label == "defaults" else _paired_gain(sc, base, obj.sign)
        pct = 100 * gain.mean / abs(np.nanmean(base)) if gain and np.nanmean(base) != 0 else None
        cands.append(Candidate(label, space.values_of(values), space.settings(values), float(score), s, gain, pct))
    best = max(cands, key=lambda c: -math.inf if math.isnan(c.final.mean) else obj.sign * c.final.mean)
    return TuneResult(space, obj, tuple(gens), tuple(cands), best, start_score, population, seeds, final_seeds,
                      runs, time.perf_counter() - t0)
