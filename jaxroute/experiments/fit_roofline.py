"""The roofline's factors fitted to a measured run by gradient descent through the simulator (optax).

The replay of a measured run (`experiments.replay`) is a function of the cost model's factors
(`cost_models.CostFactors`: the effective shares of peak FLOP/s and memory bandwidth, and the fixed time of an
iteration). Every simulated time is a sum of iteration times, so with the run's discrete decisions held (which
request is admitted when, to which replica) each request's TTFT and TPOT is differentiable in the factors:
`jax.jvp` carries three tangents through the whole jitted run (forward mode, so the while loops of the event
loop are no obstacle), giving the Jacobian of every request's times at the cost of about one more run. The loss
is the mean squared log error of TTFT and of TPOT over the requests measured with both; optax's Adam steps
`coordinates` of the factors (positive by construction, the weakly pinned direction on one axis) with a
cosine-decayed step size, every step inside one compiled `lax.scan`, and the best point is kept. A decision that flips as the factors move
shows as a jump in the loss curve, which Adam steps over.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute import cost_models, output_paths
from jaxroute.cost_models import CostFactors
from jaxroute.errors import JaxrouteError
from jaxroute.mapping_files import read_mapping
from jaxroute.measured import MeasuredRun

FIELDS = CostFactors._fields
BOUNDS = {"eta_compute": (1e-3, 1.0), "eta_memory": (1e-3, 1.0), "overhead_s": (1e-6, 1.0)}  # a factor's sane range
DEFAULT_STEPS = 150
DEFAULT_LR = 0.1


@dataclasses.dataclass(frozen=True)
class Fit:
    """A fit's result: the factors, where it started and the loss at every step."""

    factors: CostFactors
    start: CostFactors
    loss: tuple[float, ...]  # the loss at each step's point
    best_step: int
    requests: int  # requests with a measured TTFT and TPOT

    def as_json(self) -> dict:
        return {"cost_factors": {k: float(v) for k, v in self.factors._asdict().items()},
                "start": {k: float(v) for k, v in self.start._asdict().items()}, "loss": list(self.loss),
                "best_step": self.best_step, "requests": self.requests}


_PROGRAMS: dict = {}


def _weights_s(cp) -> jax.Array:
    """Seconds to read a replica's dense weights at full peak bandwidth (eta_memory = 1)."""
    return cp.dense_weight_bytes / cp.tp / (cp.mem_bw / cost_models.ETA_MEMORY)


def coordinates(f: CostFactors, weights_s) -> jax.Array:
    """The fit's coordinates of factors `f`: log eta_compute, log of the weights-bound step (overhead + weights /
    (eta_memory x bandwidth)), and the logit of the overhead's share of that step. A decode step pins the second
    well and the third only through its KV reads, so the weakly pinned direction is one axis, which Adam's
    per-coordinate steps travel at full speed (in eta_memory and overhead it is a curved valley)."""
    step = f.overhead_s + weights_s / f.eta_memory
    share = f.overhead_s / step
    return jnp.stack([jnp.log(f.eta_compute), jnp.log(step), jnp.log(share) - jnp.log1p(-share)]).astype(jnp.float32)


def factors_of(u: jax.Array, weights_s) -> CostFactors:
    """Inverse of `coordinates`."""
    step, share = jnp.exp(u[1]), jax.nn.sigmoid(u[2])
    return CostFactors(jnp.exp(u[0]), weights_s / (step * (1.0 - share)), step * share)


def _program(model, steps: int, lr: float):
    """jit(start coordinates, key, workload, params, log targets [2, N], valid [N] -> (loss per step [steps], best
    coordinates, best step)): the whole fit, every Adam step in one compiled scan, per (model, steps, lr)."""
    import optax

    cache_key = (model, steps, lr)
    if cache_key not in _PROGRAMS:
        from jaxroute.clusters.replicas.model import request_fields

        def times(u, key, wl, params):
            f = factors_of(u, _weights_s(params.cost))
            p = dataclasses.replace(params, cost=cost_models.with_factors(params.cost, f))
            state = model.init(key, wl, p)
            state = jax.lax.while_loop(lambda s: ~model.is_done(s), lambda s: model.step(s, wl, p), state)
            r = request_fields(state)
            out = jnp.maximum(r["output_tokens"] - 1, 1).astype(jnp.float32)
            # TTFT's tangent from admission on: an arrival joins whichever iteration runs when it comes, so the
            # shift of the iteration grid before it (the busy period's tangent) is not its own
            wait = jax.lax.stop_gradient(r["admit_s"] - r["arrival_s"])
            return jnp.stack([wait + r["first_token_s"] - r["admit_s"], (r["finish_s"] - r["first_token_s"]) / out])

        opt = optax.adam(optax.cosine_decay_schedule(lr, steps, alpha=0.01))  # settle as the steps run out

        def run(u0, key, wl, params, log_target, valid):
            def step(carry, i):
                u, state, best_loss, best_u, best_i = carry
                one = lambda t: jax.jvp(lambda v: times(v, key, wl, params), (u,), (t,))
                t, dt = jax.vmap(one, out_axes=(None, 0))(jnp.eye(3, dtype=u.dtype))  # [2, N], [3, 2, N]
                ok = valid & jnp.all(jnp.isfinite(t) & (t > 0), axis=0)
                n = jnp.sum(ok)
                resid = jnp.where(ok, jnp.log(jnp.where(ok, t, 1.0)) - log_target, 0.0)
                loss = jnp.where(n > 0, jnp.sum(resid ** 2) / jnp.maximum(n, 1), jnp.inf)
                # d loss / d u_k = 2 / n sum (log t - log m) (d t / d u_k) / t
                grad = 2.0 * jnp.sum(resid[None] * jnp.where(ok, dt / jnp.where(ok, t, 1.0), 0.0), axis=(1, 2))
                grad = grad / jnp.maximum(n, 1)
                better = loss < best_loss
                updates, new_state = opt.update(grad, state, u)
                done = loss < 1e-12  # the measured run itself: stay
                u_next = jnp.where(done, u, optax.apply_updates(u, updates))
                carry = (u_next, new_state, jnp.where(better, loss, best_loss), jnp.where(better, u, best_u),
                         jnp.where(better, i, best_i))
                return carry, loss

            init = (u0, opt.init(u0), jnp.float32(jnp.inf), u0, jnp.int32(0))
            (_, _, _, best_u, best_i), losses = jax.lax.scan(step, init, jnp.arange(steps, dtype=jnp.int32))
            return losses, best_u, best_i

        _PROGRAMS[cache_key] = jax.jit(run)
    return _PROGRAMS[cache_key]


def fit(measured: MeasuredRun, dep, start: CostFactors | None = None, steps: int = DEFAULT_STEPS,
        lr: float = DEFAULT_LR, router: str = "least_load") -> Fit:
    """Fit the factors to `measured` replayed on `dep` (`deployment.Deployment`) behind `router`: `steps` Adam steps
    in one compiled run."""
    from jaxroute.clusters import replicas
    from jaxroute.experiments import replay
    from jaxroute.experiments.cluster import initial_capacities

    if dep.cost_model != "roofline":
        raise JaxrouteError("only the roofline has factors to fit (--cost-model roofline)")
    start = start or CostFactors()
    wl = replay.workload(measured)
    keep = replay.replayable(measured)
    target = np.stack([measured.ttft_s[keep], measured.tpot_s[keep]])  # [2, N]
    valid = measured.ok[keep] & np.all(np.isfinite(target) & (target > 0), axis=0)
    if valid.sum() < 3:
        raise JaxrouteError(f"{measured.name}: fewer than 3 requests with a measured TTFT and TPOT (streamed, more "
                            "than one output token); nothing to fit")
    params = replicas.make_params(router, rate=0.0, kv_capacity=dep.kv_capacity, gpu=dep.gpu, model=dep.model,
                                  tp=dep.tp, cost_model="roofline")
    caps = initial_capacities(wl, [params], dep.replicas)
    model = replicas.ReplicaModel(n_replicas=dep.replicas, chunk=dep.chunk, max_running=dep.max_running,
                                  max_queue=caps["max_queue"], cache_slots=caps["cache_slots"], admission=dep.admission,
                                  router_policies=(router,))
    model.check_params(params, wl)
    weights_s = float(_weights_s(params.cost))
    log_target = jnp.asarray(np.log(np.where(valid, target, 1.0)), jnp.float32)
    losses, best_u, best_i = _program(model, int(steps), float(lr))(
        coordinates(start, weights_s), jax.random.key(0), wl, params, log_target, jnp.asarray(valid))
    losses = np.asarray(losses, np.float64)
    if not np.isfinite(losses).any():
        raise JaxrouteError("the replay finished no request; the deployment cannot serve this run")
    factors = CostFactors(*(float(x) for x in factors_of(best_u, weights_s)))
    return Fit(factors, start, tuple(losses.tolist()), int(best_i), int(valid.sum()))


def save(path: str | Path, result: Fit, dep, source: str) -> Path:
    """The fitted factors as JSON (`--cost-params` reads them back)."""
    path = Path(path)
    doc = {"kind": "jaxroute cost factors", **result.as_json(), "fitted_to": source,
           "deployment": dataclasses.asdict(dep)}
    output_paths.write_text(path, json.dumps(doc, indent=1))
    return path


def load(path: str | Path) -> CostFactors:
    """Factors from a file `save` wrote (or any JSON with a `cost_factors` mapping of the three), checked."""
    p = Path(path)
    doc = read_mapping(p, "cost params file", "a mapping with cost_factors (`jaxroute compare --fit --cost-params-out`)")
    f = doc.get("cost_factors")
    if not isinstance(f, dict) or set(f) != set(FIELDS):
        got = sorted(f) if isinstance(f, dict) else type(f).__name__
        raise JaxrouteError(f"{p.name}: expected cost_factors with exactly {', '.join(FIELDS)}, got {got}")
    for k in FIELDS:
        v = f[k]
        lo, hi = BOUNDS[k]
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not (lo <= v <= hi):
            raise JaxrouteError(f"{p.name}: cost_factors.{k} = {v!r}; expected a number in [{lo:g}, {hi:g}]")
    return CostFactors(*(float(f[k]) for k in FIELDS))


def loss_plot(result: Fit, path: str | Path, title: str) -> Path:
    """PNG of the loss at each step (log scale), the best step marked."""
    from jaxroute import report

    steps = list(range(len(result.loss)))
    return report.line_plot({"loss (mean squared log error of TTFT and TPOT)": [
        {"x": steps, "y": list(result.loss), "label": "loss", "marker": "."},
        {"vline": result.best_step, "color": "grey", "ls": ":"}]}, path, xlabel="Adam step", ylabel="loss",
        title=title, ylog=("loss (mean squared log error of TTFT and TPOT)",))
