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
from types import ModuleType

import jax
import jax.numpy as jnp

from jaxroute.errors import JaxrouteError
from jaxroute.registry import PolicyRegistry
from jaxroute.routers import parts, preble, presets, sglang
from jaxroute.routers.view import Request, RouterStatic, RouterView

# name -> a stateless preset function or a stateful router module (order = traced policy id)
PRESETS: dict[str, object] = {
    "rr": presets.rr,
    "least_load": presets.least_load,
    "least_tokens": presets.least_tokens,
    "affinity": presets.affinity,
    "threshold": presets.threshold,
    "cache_guard": presets.cache_guard,
    "sglang_cache_aware": sglang,
    "preble_e2": preble,
    "weighted": presets.weighted,
}
REGISTRY = PolicyRegistry("replica-cluster router", tuple(PRESETS))
PREFIX_POLICIES = REGISTRY.names
LOAD_ONLY = ("rr", "least_load", "least_tokens")
STATEFUL: dict[str, ModuleType] = {k: v for k, v in PRESETS.items() if isinstance(v, ModuleType)}


def policy_id(name: str) -> int:
    return REGISTRY.id(name)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RouterParams:
    """Traced router settings (vmappable: a sweep over any of them is one compilation)."""

    theta: jax.Array  # [] float32 match ratio needed by threshold / cache_guard
    guard_abs: jax.Array  # [] float32 cache_guard: in-flight spread that counts as imbalanced
    guard_rel: jax.Array  # [] float32 cache_guard: max / min ratio that counts as imbalanced
    weights: jax.Array  # [3] float32 weighted: prefix ratio, queue, tokens in flight
    picker: jax.Array  # [] int32 weighted: index into parts.PICKERS
    temperature: jax.Array  # [] float32 weighted: softmax temperature
    own: dict  # stateful preset name -> its module's Params

    def __getattr__(self, name: str):
        """A stateful module's setting by name (e.g. `e2_window_s`)."""
        own = self.__dict__.get("own") or {}
        for q in own.values():
            if name in getattr(q, "__dataclass_fields__", {}):
                return getattr(q, name)
        raise AttributeError(name)


def _own_kwargs(module: ModuleType) -> set[str]:
    return set(inspect.signature(module.make_params).parameters)


def router_params(theta=0.5, guard_abs=8.0, guard_rel=1.5, weights=(3.0, 2.0, 2.0), picker="argmax",
                  temperature=0.0, **own_kw) -> RouterParams:
    """Router settings; keywords of stateful modules (e.g. e2_window_s, sgl_cache_threshold) go to them."""
    known = set().union(*(_own_kwargs(m) for m in STATEFUL.values()))
    if unknown := set(own_kw) - known:
        raise JaxrouteError(f"unknown router setting(s) {sorted(unknown)}")
    if picker not in parts.PICKERS:
        raise JaxrouteError(f"unknown picker '{picker}'; choose from: {', '.join(parts.PICKERS)}")
    w = jnp.asarray(weights, jnp.float32)
    if w.shape != (3,):
        raise JaxrouteError(f"weights are (prefix, queue, tokens): 3 numbers, got {weights}")
    own = {name: m.make_params(**{k: v for k, v in own_kw.items() if k in _own_kwargs(m)})
           for name, m in STATEFUL.items()}
    f = lambda x: jnp.asarray(x, jnp.float32)
    return RouterParams(f(theta), f(guard_abs), f(guard_rel), w, jnp.int32(parts.PICKERS.index(picker)),
                        f(temperature), own)


def check(static: RouterStatic, policies) -> None:
    """Refuse, on the host, policies whose module cannot run with these static sizes."""
    for name in policies:
        m = PRESETS[name]
        if isinstance(m, ModuleType) and hasattr(m, "check"):
            m.check(static)


# ----------------------------------------------------------------------------- the router's hooks


def init(static: RouterStatic) -> dict:
    """The router state: each stateful module's state by preset name."""
    return {name: m.init(static) for name, m in STATEFUL.items()}


def on_refresh(state: dict, view: RouterView, active: jax.Array, params: RouterParams) -> dict:
    """Before a decision: the view is new (time advanced, possibly a new snapshot)."""
    return {name: (m.on_refresh(state[name], view, active, params.own[name]) if hasattr(m, "on_refresh")
                   else state[name]) for name, m in STATEFUL.items()}


def choose(state: dict, view: RouterView, req: Request, policy: jax.Array, params: RouterParams,
           key: jax.Array) -> jax.Array:
    """Replica index (int32) chosen by preset `policy` (a traced REGISTRY id)."""

    def branch(name, f):
        if isinstance(f, ModuleType):
            return lambda: jnp.asarray(f.choose(state[name], view, req, params.own[name], key), jnp.int32)
        return lambda: jnp.asarray(f(view, req, params, key), jnp.int32)

    return REGISTRY.switch(policy, [branch(n, f) for n, f in PRESETS.items()])


def on_dispatch(state: dict, view: RouterView, req: Request, g: jax.Array, active: jax.Array,
                params: RouterParams) -> dict:
    """The request was sent to replica g (only where `active`: masked point updates, O(row))."""
    return {name: (m.on_dispatch(state[name], view, req, g, active, params.own[name])
                   if hasattr(m, "on_dispatch") else state[name]) for name, m in STATEFUL.items()}


def on_finish(state: dict, g: jax.Array, rids: jax.Array, finished: jax.Array, params: RouterParams) -> dict:
    """Requests `rids[finished]` finished on replica g (no preset needs it yet: both keep their records)."""
    return {name: (m.on_finish(state[name], g, rids, finished, params.own[name]) if hasattr(m, "on_finish")
                   else state[name]) for name, m in STATEFUL.items()}


def flags(state: dict, policy: jax.Array) -> dict[str, jax.Array]:
    """Capacity flags of the stateful modules, raised only for rows whose policy uses that module."""
    out = {}
    for name, m in STATEFUL.items():
        if hasattr(m, "flags"):
            uses = policy == REGISTRY.id(name)
            out.update({k: uses & v for k, v in m.flags(state[name]).items()})
    return out
