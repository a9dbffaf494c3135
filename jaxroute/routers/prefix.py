"""Replica-cluster routers: the registry built from the routers' specs, and the one router the cluster model talks to.

Each router is one `RouterSpec` in `spec.SPECS` (its rule, module, default settings, tunable settings,
partial-cluster support and source; the table of every router is docs/routers.md, generated from them). A
rule is either a stateless function `(view, request, params, key) -> replica` (`presets.py`) or belongs to
a module that owns its state (`sglang.py`, `preble.py`, ...; its `MODULE` declares its hooks, see
`jaxroute/routers/__init__.py`). The cluster model calls only the functions below; it knows no router by name.

Scraped replica metrics (`waiting`, `running`, `kv_usage`, the caches as KV events report them) go
stale with `--stale T` (e.g. 0.05 s, the 50 ms metrics refresh of llm-d's data layer and BLIS).

Partial clusters (`ReplicaParams.n_active` < n_replicas: only the first n_active replicas are in use,
`RouterView.active`): the routers whose spec says `partial_ok` (`PARTIAL_OK`) never choose an inactive
replica and decide exactly as a cluster of n_active replicas (ties, normalisations and random draws
included, `parts.py`); the others are refused by `ReplicaModel.check_params`.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from types import ModuleType

import jax
import jax.numpy as jnp

from jaxroute.errors import JaxrouteError
from jaxroute.registry import PolicyRegistry
from jaxroute.routers import parts
from jaxroute.routers.names import (  # noqa: F401  (prefix.PARTIAL_OK)
    DEFAULT_THETA,
    PARTIAL_OK,
    PREFIX_POLICIES,
    check_router_settings,
)
from jaxroute.routers.spec import HOOKS, SPECS, RouterModule, RouterSpec
from jaxroute.routers.view import Request, RouterStatic, RouterView


@dataclasses.dataclass(frozen=True)
class Preset:
    """A router's spec with its rule and module resolved: what the cluster runs.

    rule: stateless `(view, req, params: RouterParams, key) -> replica`; with a module
    `(module_state, view, req, params: RouterParams, key) -> replica` (a module's own settings are
    readable by name on RouterParams, e.g. `params.e2_window_s`; the hooks get the module's Params).
    """

    spec: RouterSpec
    rule: Callable
    module: RouterModule | None

    @property
    def defaults(self):
        return self.spec.defaults


def _python_module(name: str) -> ModuleType:
    return importlib.import_module(f"jaxroute.routers.{name}")


def _resolve(ref: str, what: str):
    module_name, attr = ref.split(".")
    try:
        return getattr(_python_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"{what}: jaxroute.routers.{ref} does not exist ({e})") from None


# short name -> the RouterModule of every module a spec names (one state per module, shared by its routers)
MODULES: dict[str, RouterModule] = {}
for _spec in SPECS:
    if _spec.module and _spec.module not in MODULES:
        MODULES[_spec.module] = _resolve(f"{_spec.module}.MODULE", f"router '{_spec.name}'")
        if not isinstance(MODULES[_spec.module], RouterModule):
            raise ImportError(f"jaxroute.routers.{_spec.module}.MODULE must be a RouterModule")
# name -> preset, in traced-id order
PRESETS: dict[str, Preset] = {s.name: Preset(s, _resolve(s.rule, f"router '{s.name}'"),
                                             MODULES[s.module] if s.module else None) for s in SPECS}
REGISTRY = PolicyRegistry("replica-cluster router", PREFIX_POLICIES)
LOAD_ONLY = ("rr", "least_load", "least_tokens")
STATEFUL = tuple(name for name, p in PRESETS.items() if p.module is not None)


def check_modules(modules: dict[str, ModuleType]) -> None:
    """Refuse, at import, a router module without a `MODULE` (a RouterModule), a function of it named like a
    hook that its MODULE does not declare (`on_finsh`, or a hook left out: it would never run), and a setting
    two modules (or a module and `RouterParams`) both claim: settings are read by name
    (`RouterParams.__getattr__`), so a shared name would silently answer the first one."""
    owner: dict[str, str] = {}
    for name, source in modules.items():
        m = getattr(source, "MODULE", None)
        if not isinstance(m, RouterModule):
            raise ImportError(f"router module '{name}' has no MODULE = RouterModule(...) declaring its hooks")
        declared = {getattr(m, h) for h in HOOKS if getattr(m, h) is not None}
        for attr in dir(source):
            f = getattr(source, attr)
            if attr.startswith("on_") and callable(f) and f not in declared:
                raise ImportError(f"router module '{name}' defines {attr}(), which its MODULE does not declare as a "
                                  f"hook: the hooks are {', '.join(HOOKS)}")
        for setting in m.settings:
            if setting in RouterParams.__dataclass_fields__ or setting in owner:
                raise ImportError(f"router setting '{setting}' is claimed by module '{name}' and by "
                                  f"{'RouterParams' if setting not in owner else repr(owner[setting])}: rename one")
            owner[setting] = name


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


check_modules({name: _python_module(name) for name in MODULES})


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


def router_params(policy: str = "weighted", *, theta=DEFAULT_THETA, guard_abs=8.0, guard_rel=1.5, weights=None,
                  picker=None, temperature=None, load_threshold=128.0, **own_kw) -> RouterParams:
    """Router settings of one row running `policy`: unset settings come from the preset's defaults,
    then the global ones; keywords of stateful modules (e.g. e2_window_s, sgl_cache_threshold) go to them."""
    preset = PRESETS[REGISTRY.name(REGISTRY.id(policy))]
    check_router_settings(own_kw, set().union(*(set(m.settings) for m in MODULES.values())))
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
        settings = set(m.settings)
        kw = {k: v for k, v in d.items() if k in settings} if preset.module is m else {}
        kw.update({k: v for k, v in own_kw.items() if k in settings})
        own[name] = m.make_params(**kw)
    f = lambda x: jnp.asarray(x, jnp.float32)
    return RouterParams(f(theta), f(guard_abs), f(guard_rel), weight_vector(weights),
                        jnp.int32(parts.PICKERS.index(picker)), f(temperature), f(load_threshold), own)


def modules_for(policies) -> tuple[str, ...]:
    """The stateful modules the presets `policies` need (the rest can be left out of the state)."""
    return tuple(sorted({PRESETS[p].spec.module for p in policies if PRESETS[p].module}))


def check(static: RouterStatic, policies) -> None:
    """Refuse, on the host, policies the model was not built for (`static.policies`), whose module is left
    out, or that cannot run with these static sizes."""
    for name in policies:
        if static.policies is not None and name not in static.policies:
            raise JaxrouteError(f"router '{name}' is not among the routers this model was built for "
                                f"({', '.join(static.policies)}): build it with router_policies including it")
        m, module_name = PRESETS[name].module, PRESETS[name].spec.module
        if m is None:
            continue
        if static.modules is not None and module_name not in static.modules:
            raise JaxrouteError(f"router '{name}' needs module '{module_name}', which this model leaves out "
                                f"(router modules kept: {', '.join(static.modules) or 'none'})")
        if m.check is not None:
            m.check(static)


# ----------------------------------------------------------------------------- the router's hooks


def _hook(m: RouterModule, hook: str, state, *args):
    f = getattr(m, hook)
    return state if f is None else f(state, *args)


def init(static: RouterStatic) -> dict:
    """The router state: each kept stateful module's state by its short name (the hooks below run
    only the modules in the state)."""
    keep = MODULES if static.modules is None else static.modules
    return {name: MODULES[name].init(static) for name in keep}


def on_refresh(state: dict, view: RouterView, active: jax.Array, params: RouterParams) -> dict:
    """Before a decision: the view is new (time advanced, possibly a new snapshot)."""
    return {n: _hook(MODULES[n], "on_refresh", state[n], view, active, params.own[n]) for n in state}


def on_arrival(state: dict, view: RouterView, req: Request, active: jax.Array, params: RouterParams) -> dict:
    """After `on_refresh`, before the decision for `req`: a module keeps what both `choose` and
    `on_dispatch` read (e.g. Preble's costs), so one event computes it once."""
    return {n: _hook(MODULES[n], "on_arrival", state[n], view, req, active, params.own[n]) for n in state}


def choose(state: dict, view: RouterView, req: Request, policy: jax.Array, params: RouterParams,
           key: jax.Array, policies: tuple[str, ...] | None = None) -> jax.Array:
    """Replica index (int32) chosen by preset `policy` (a traced REGISTRY id). `policies` (static; None = all):
    the presets rows may run; the others share one constant branch (`check` refuses them on the host)."""

    def branch(module_rule):
        if module_rule is None:  # no row runs it: refused on the host by `check`
            return lambda: jnp.int32(0)
        n, rule = module_rule
        if n is not None:
            if n not in state:  # left out of this model: refused on the host by `check`
                return lambda: jnp.int32(0)
            return lambda: jnp.asarray(rule(state[n], view, req, params, key), jnp.int32)
        return lambda: jnp.asarray(rule(view, req, params, key), jnp.int32)

    # presets of one rule (SGLang's three, llm-d's schedulers, ...) differ only in traced params: one branch
    rules = [(p.spec.module, p.rule) if policies is None or name in policies else None for name, p in PRESETS.items()]
    return REGISTRY.switch_shared(policy, rules, branch)


def on_dispatch(state: dict, view: RouterView, req: Request, g: jax.Array, active: jax.Array,
                params: RouterParams) -> dict:
    """The request was sent to replica g (only where `active`: masked point updates, O(row))."""
    return {n: _hook(MODULES[n], "on_dispatch", state[n], view, req, g, active, params.own[n]) for n in state}


def on_first_token(state: dict, view: RouterView, g: jax.Array, rids: jax.Array, first: jax.Array,
                   params: RouterParams) -> dict:
    """Requests `rids[first]` on replica g got their first token (prefill done); before `on_finish`."""
    return {n: _hook(MODULES[n], "on_first_token", state[n], view, g, rids, first, params.own[n]) for n in state}


def on_admit(state: dict, view: RouterView, g: jax.Array, rids: jax.Array, admitted: jax.Array, cached: jax.Array,
             params: RouterParams) -> dict:
    """Replica g admitted `rids[admitted]` (first admissions) at `view.now`, `cached` prompt tokens hit each."""
    return {n: _hook(MODULES[n], "on_admit", state[n], view, g, rids, admitted, cached, params.own[n]) for n in state}


def on_finish(state: dict, view: RouterView, g: jax.Array, rids: jax.Array, finished: jax.Array,
              params: RouterParams) -> dict:
    """Requests `rids[finished]` finished on replica g (`view.table` has their rows)."""
    return {n: _hook(MODULES[n], "on_finish", state[n], view, g, rids, finished, params.own[n]) for n in state}


def _uses(policy: jax.Array, module_name: str) -> jax.Array:
    return jnp.isin(policy, jnp.asarray([REGISTRY.id(k) for k, p in PRESETS.items() if p.spec.module == module_name]))


def flags(state: dict, policy: jax.Array) -> dict[str, jax.Array]:
    """Capacity flags of the stateful modules, raised only for rows whose policy uses that module."""
    out = {}
    for n in state:
        m = MODULES[n]
        if m.flags is not None:
            out.update({k: _uses(policy, n) & v for k, v in m.flags(state[n]).items()})
    return out


def stats(state: dict, policy: jax.Array) -> dict[str, jax.Array]:
    """The stateful modules' decision statistics (`stats` hook), 0 for rows whose policy does not use the module."""
    out = {}
    for n in state:
        m = MODULES[n]
        if m.stats is not None:
            out.update({k: jnp.where(_uses(policy, n), v, jnp.zeros_like(v)) for k, v in m.stats(state[n]).items()})
    return out
