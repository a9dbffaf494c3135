"""Replica-cluster routers: the registry of presets and the one router the cluster model talks to.

A preset is either a stateless function `(view, request, params, key) -> replica` (`presets.py`) or
a module that owns its state (`sglang.py`, `preble.py`; see `jaxroute/routers/__init__.py` for the
module interface). The cluster model calls only the functions below; it knows no router by name.

| policy | rule (details and sources in the preset's docstring) |
|---|---|
| rr | round robin |
| least_load | fewest requests in flight |
| least_tokens | fewest tokens (prompt + output) in flight |
| affinity | longest view match; ties -> least load |
| threshold | longest match if its ratio >= theta, else least load (Preble E2's split at theta = 0.5) |
| cache_guard | least load when max - min in-flight > guard_abs and max > guard_rel * min, else threshold |
| sglang_cache_aware | SGLang router (`cache_aware.rs`): imbalanced -> shortest queue; else its own approximate tree: ratio > cache_threshold -> the matching worker, else the smallest tree |
| preble_e2 | Preble E2: exploit (cached > missed) or explore by load cost L + M + P; post-hoc rebalancing |
| weighted | llm-d-style weighted scorers (prefix ratio, queue, tokens) and a traced picker |
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from types import ModuleType

import jax
import jax.numpy as jnp

from jaxroute.errors import JaxrouteError
from jaxroute.registry import PolicyRegistry
from jaxroute.routers import parts, preble, presets, sglang
from jaxroute.routers.view import Request, RouterStatic, RouterView


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named router: its rule, the module that owns its state and settings (None = stateless), and
    the settings it starts from (`router_params` keywords: weights, picker, a module's own settings).

    rule: stateless `(view, req, params: RouterParams, key) -> replica`; with a module
    `(module_state, view, req, module_params, key) -> replica`.
    """

    rule: Callable
    module: ModuleType | None = None
    defaults: dict = dataclasses.field(default_factory=dict)


def _stateful(module: ModuleType, rule: Callable | None = None, **defaults) -> Preset:
    return Preset(rule or module.choose, module, defaults)


# name -> preset (order = traced policy id: append new ones)
PRESETS: dict[str, Preset] = {
    "rr": Preset(presets.rr),
    "least_load": Preset(presets.least_load),
    "least_tokens": Preset(presets.least_tokens),
    "affinity": Preset(presets.affinity),
    "threshold": Preset(presets.threshold),
    "cache_guard": Preset(presets.cache_guard),
    "sglang_cache_aware": _stateful(sglang),
    "preble_e2": _stateful(preble),
    "weighted": Preset(presets.weighted, defaults=dict(weights=dict(prefix=3.0, inflight=2.0, tokens=2.0))),
}
REGISTRY = PolicyRegistry("replica-cluster router", tuple(PRESETS))
PREFIX_POLICIES = REGISTRY.names
LOAD_ONLY = ("rr", "least_load", "least_tokens")
# modules that own router state, by short name (one state per module, shared by its presets)
MODULES: dict[str, ModuleType] = {m.__name__.rsplit(".", 1)[-1]: m
                                  for m in dict.fromkeys(p.module for p in PRESETS.values() if p.module)}
STATEFUL = tuple(name for name, p in PRESETS.items() if p.module is not None)


def _module_name(m: ModuleType) -> str:
    return m.__name__.rsplit(".", 1)[-1]


def policy_id(name: str) -> int:
    return REGISTRY.id(name)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RouterParams:
    """Traced router settings (vmappable: a sweep over any of them is one compilation)."""

    theta: jax.Array  # [] float32 match ratio needed by threshold / cache_guard
    guard_abs: jax.Array  # [] float32 cache_guard: in-flight spread that counts as imbalanced
    guard_rel: jax.Array  # [] float32 cache_guard: max / min ratio that counts as imbalanced
    weights: jax.Array  # [len(parts.SCORERS)] float32 weighted presets: one weight per named scorer
    picker: jax.Array  # [] int32 weighted presets: index into parts.PICKERS
    temperature: jax.Array  # [] float32 softmax picker temperature
    load_threshold: jax.Array  # [] float32 llm-d load-aware scorer: waiting requests that score 0
    own: dict  # module short name -> its module's Params

    def __getattr__(self, name: str):
        """A stateful module's setting by name (e.g. `e2_window_s`)."""
        own = self.__dict__.get("own") or {}
        for q in own.values():
            if name in getattr(q, "__dataclass_fields__", {}):
                return getattr(q, name)
        raise AttributeError(name)


def _own_kwargs(module: ModuleType) -> set[str]:
    return set(inspect.signature(module.make_params).parameters)


def weight_vector(weights) -> jax.Array:
    """{scorer name: weight} (missing = 0) or a full sequence in parts.SCORERS order -> [K] float32."""
    if isinstance(weights, dict):
        if unknown := set(weights) - set(parts.SCORERS):
            raise JaxrouteError(f"unknown scorer(s) {sorted(unknown)} in weights; choose from: "
                                f"{', '.join(parts.SCORERS)}")
        weights = [float(weights.get(k, 0.0)) for k in parts.SCORERS]
    w = jnp.asarray(weights, jnp.float32)
    if w.shape != (len(parts.SCORERS),):
        raise JaxrouteError(f"weights are one number per scorer ({', '.join(parts.SCORERS)}), got {weights}")
    if not bool(jnp.all(jnp.isfinite(w))):
        raise JaxrouteError(f"weights must be finite numbers, got {weights}")
    return w


def router_params(policy: str = "weighted", *, theta=0.5, guard_abs=8.0, guard_rel=1.5, weights=None,
                  picker=None, temperature=None, load_threshold=128.0, **own_kw) -> RouterParams:
    """Router settings of one row running `policy`: unset settings come from the preset's defaults,
    then the global ones; keywords of stateful modules (e.g. e2_window_s, sgl_cache_threshold) go to them."""
    preset = PRESETS[REGISTRY.name(REGISTRY.id(policy))]
    known = set().union(*(_own_kwargs(m) for m in MODULES.values()))
    if unknown := set(own_kw) - known:
        raise JaxrouteError(f"unknown router setting(s) {sorted(unknown)}")
    d = preset.defaults
    weights = d.get("weights", {}) if weights is None else weights
    picker = d.get("picker", "argmax") if picker is None else picker
    temperature = d.get("temperature", 0.0) if temperature is None else temperature
    if picker not in parts.PICKERS:
        raise JaxrouteError(f"unknown picker '{picker}'; choose from: {', '.join(parts.PICKERS)}")
    if not temperature >= 0:
        raise JaxrouteError(f"the picker temperature must be >= 0, got {temperature}")
    if not load_threshold > 0:
        raise JaxrouteError(f"the load-aware threshold must be > 0 waiting requests, got {load_threshold}")
    own = {}
    for name, m in MODULES.items():
        kw = {k: v for k, v in d.items() if k in _own_kwargs(m)} if preset.module is m else {}
        kw.update({k: v for k, v in own_kw.items() if k in _own_kwargs(m)})
        own[name] = m.make_params(**kw)
    f = lambda x: jnp.asarray(x, jnp.float32)
    return RouterParams(f(theta), f(guard_abs), f(guard_rel), weight_vector(weights),
                        jnp.int32(parts.PICKERS.index(picker)), f(temperature), f(load_threshold), own)


def check(static: RouterStatic, policies) -> None:
    """Refuse, on the host, policies whose module cannot run with these static sizes."""
    for name in policies:
        m = PRESETS[name].module
        if m is not None and hasattr(m, "check"):
            m.check(static)


# ----------------------------------------------------------------------------- the router's hooks


def _hook(m: ModuleType, hook: str, state, *args):
    return getattr(m, hook)(state, *args) if hasattr(m, hook) else state


def init(static: RouterStatic) -> dict:
    """The router state: each stateful module's state by its short name."""
    return {name: m.init(static) for name, m in MODULES.items()}


def on_refresh(state: dict, view: RouterView, active: jax.Array, params: RouterParams) -> dict:
    """Before a decision: the view is new (time advanced, possibly a new snapshot)."""
    return {n: _hook(m, "on_refresh", state[n], view, active, params.own[n]) for n, m in MODULES.items()}


def choose(state: dict, view: RouterView, req: Request, policy: jax.Array, params: RouterParams,
           key: jax.Array) -> jax.Array:
    """Replica index (int32) chosen by preset `policy` (a traced REGISTRY id)."""

    def branch(p: Preset):
        if p.module is not None:
            n = _module_name(p.module)
            return lambda: jnp.asarray(p.rule(state[n], view, req, params.own[n], key), jnp.int32)
        return lambda: jnp.asarray(p.rule(view, req, params, key), jnp.int32)

    return REGISTRY.switch(policy, [branch(p) for p in PRESETS.values()])


def on_dispatch(state: dict, view: RouterView, req: Request, g: jax.Array, active: jax.Array,
                params: RouterParams) -> dict:
    """The request was sent to replica g (only where `active`: masked point updates, O(row))."""
    return {n: _hook(m, "on_dispatch", state[n], view, req, g, active, params.own[n]) for n, m in MODULES.items()}


def on_finish(state: dict, view: RouterView, g: jax.Array, rids: jax.Array, finished: jax.Array,
              params: RouterParams) -> dict:
    """Requests `rids[finished]` finished on replica g (`view.table` has their rows)."""
    return {n: _hook(m, "on_finish", state[n], view, g, rids, finished, params.own[n]) for n, m in MODULES.items()}


def flags(state: dict, policy: jax.Array) -> dict[str, jax.Array]:
    """Capacity flags of the stateful modules, raised only for rows whose policy uses that module."""
    out = {}
    for n, m in MODULES.items():
        if hasattr(m, "flags"):
            uses = jnp.isin(policy, jnp.asarray([REGISTRY.id(k) for k, p in PRESETS.items() if p.module is m]))
            out.update({k: uses & v for k, v in m.flags(state[n]).items()})
    return out
