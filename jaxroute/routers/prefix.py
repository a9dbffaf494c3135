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
| preble | Preble complete: preble_e2 + prefill/decode pairing + autoscaling of hot prefixes (use it with local order "priority") |
| weighted | llm-d-style weighted scorers (prefix ratio on the record 3, in-flight 2, tokens 2) and a traced picker |
| llmd_precise | llm-d scheduler: precise prefix (reported cache, matched/prompt 64-token blocks) 3 + kv-utilization 2 + queue 2; max-score picker (random ties) |
| llmd_approx | llm-d with the approximate prefix index (own LRU of block hashes, inserted on dispatch, greedy walk) 1 + kv 1 + queue 1; max-score picker |
| llmd_load | llm-d queue 1 + kv-cache-utilization 1; max-score picker |
| llmd_load_aware | llm-d load-aware scorer (0.5 at an empty queue -> 0 at 128 waiting); max-score picker |
| dynamo_kv | Dynamo KV router: argmin of w x (active + uncached prefill tokens) / B + unique active blocks after admission; ties random, softmax at T > 0 |
| random | uniformly random replica (SGLang random.rs) |
| sglang_cache_aware_rs | SGLang cache-aware with the Rust CacheAwareConfig defaults (0.5 / 32 / 1.1) and LRU size pruning of its tree (every 30 s to 10,000 tokens per worker) |
| sglang_gateway | SGLang model gateway cache-aware: CLI defaults, a cache miss goes to the least-loaded worker |
| sglang_power_of_two | two distinct random replicas, the lower scraped token load (KV in use); ties -> the first draw |
| vllm_prefixaware | production-stack prefix-aware: most matched trie chunks (32 tokens), random among ties (all when none); QPS below --prefix-min-match-length (off) |
| vllm_session | production-stack session: consistent-hash ring (160 vnodes) on the session id, else lowest 60 s QPS |
| vllm_kvaware | production-stack KV-aware: the longest real-cache match when it covers all but 2,000 tokens, else session ring / QPS |
| aibrix_prefix_cache | AIBrix prefix-cache: running spread > 8 -> only least-loaded pods match; best % match among pods with running <= mean + 1 sigma, ties random; else least request |
| aibrix_least_request | AIBrix least-request: fewest running requests, ties random |

Scraped replica metrics (`waiting`, `running`, `kv_usage`, the caches as KV events report them) go
stale with `--stale T` (e.g. 0.05 s, the 50 ms metrics refresh of llm-d's data layer and BLIS).

Partial clusters (`ReplicaParams.n_active` < n_replicas: only the first n_active replicas are in use,
`RouterView.active`): the presets of `PARTIAL_OK` never choose an inactive replica and decide exactly
as a cluster of n_active replicas (ties, normalisations and random draws included, `parts.py`); the
others are refused by `ReplicaModel.check_params`.
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
from jaxroute.routers import (
    aibrix,
    dynamo,
    llmd,
    parts,
    preble,
    presets,
    sglang,
    vllm_stack,
)
from jaxroute.routers.names import DEFAULT_THETA, PARTIAL_OK, PREFIX_POLICIES  # noqa: F401  (prefix.PARTIAL_OK)
from jaxroute.routers.view import Request, RouterStatic, RouterView


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named router: its rule, the module that owns its state and settings (None = stateless), and
    the settings it starts from (`router_params` keywords: weights, picker, a module's own settings).

    rule: stateless `(view, req, params: RouterParams, key) -> replica`; with a module
    `(module_state, view, req, params: RouterParams, key) -> replica` (a module's own settings are
    readable by name on RouterParams, e.g. `params.e2_window_s`; the hooks get the module's Params).
    """

    rule: Callable
    module: ModuleType | None = None
    defaults: dict = dataclasses.field(default_factory=dict)


def _module_name(m: ModuleType) -> str:
    return m.__name__.rsplit(".", 1)[-1]


def _stateful(module: ModuleType, rule: Callable | None = None, **defaults) -> Preset:
    return Preset(rule or module.choose, module, defaults)


# name -> preset, in the order of `names.PREFIX_POLICIES` (= traced policy id: append new ones there and here)
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
    # llm-d and Dynamo (routers/llmd.py, routers/dynamo.py)
    "llmd_precise": Preset(llmd.scheduler, defaults=dict(weights=dict(prefix=3.0, kv=2.0, queue=2.0), picker="random")),
    "llmd_approx": _stateful(llmd, weights=dict(prefix=1.0, kv=1.0, queue=1.0), picker="random"),
    "llmd_load": Preset(llmd.scheduler, defaults=dict(weights=dict(queue=1.0, kv=1.0), picker="random")),
    "llmd_load_aware": Preset(llmd.scheduler, defaults=dict(weights=dict(load_aware=1.0), picker="random")),
    "dynamo_kv": _stateful(dynamo),
    # SGLang gateway, vLLM production-stack, AIBrix (routers/sglang.py, vllm_stack.py, aibrix.py)
    "random": Preset(presets.random),
    # Rust `impl Default for CacheAwareConfig` (sgl-model-gateway/src/policies/mod.rs), pruning on
    "sglang_cache_aware_rs": _stateful(sglang, sgl_cache_threshold=0.5, sgl_balance_abs=32.0, sgl_balance_rel=1.1,
                                       sgl_evict_interval_s=30.0, sgl_max_tree_tokens=10000.0),
    # newer sgl-model-gateway: CLI defaults, least-loaded worker on a cache miss
    "sglang_gateway": _stateful(sglang, sgl_miss_rule="least_load"),
    "sglang_power_of_two": Preset(sglang.power_of_two),
    "vllm_prefixaware": _stateful(vllm_stack, rule=vllm_stack.prefixaware),
    "vllm_session": _stateful(vllm_stack, rule=vllm_stack.session),
    "vllm_kvaware": _stateful(vllm_stack, rule=vllm_stack.kvaware),
    "aibrix_prefix_cache": _stateful(aibrix),
    "aibrix_least_request": Preset(aibrix.least_request),
    # Preble with every rule (routers/preble.py); the local priority groups are the replicas' (--local priority)
    "preble": _stateful(preble, e2_pairing=True, e2_autoscale=True),
}
if tuple(PRESETS) != PREFIX_POLICIES:
    raise ImportError(f"routers.prefix.PRESETS {tuple(PRESETS)} must name routers.names.PREFIX_POLICIES "
                      f"{PREFIX_POLICIES}, in that order")
REGISTRY = PolicyRegistry("replica-cluster router", PREFIX_POLICIES)
LOAD_ONLY = ("rr", "least_load", "least_tokens")
# modules that own router state, by short name (one state per module, shared by its presets)
MODULES: dict[str, ModuleType] = {_module_name(m): m
                                  for m in dict.fromkeys(p.module for p in PRESETS.values() if p.module)}
STATEFUL = tuple(name for name, p in PRESETS.items() if p.module is not None)
# the hooks the cluster calls on a stateful module (found by name, so a misspelled one would never run)
HOOKS = ("on_refresh", "on_arrival", "on_dispatch", "on_admit", "on_first_token", "on_finish")


def check_modules(modules: dict[str, ModuleType]) -> None:
    """Refuse, at import, a module function named like a hook but not one (`on_finsh`), a module without
    `init` / `make_params`, and a setting two modules (or a module and `RouterParams`) both claim: settings
    are read by name (`RouterParams.__getattr__`), so a shared name would silently answer the first one."""
    owner: dict[str, str] = {}
    for name, m in modules.items():
        for required in ("init", "make_params"):
            if not callable(getattr(m, required, None)):
                raise ImportError(f"router module '{name}' defines no {required}()")
        for attr in dir(m):
            if attr.startswith("on_") and callable(getattr(m, attr)) and attr not in HOOKS:
                raise ImportError(f"router module '{name}' defines {attr}(), which is no hook: the hooks are "
                                  f"{', '.join(HOOKS)}")
        for setting in _own_kwargs(m):
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


def _own_kwargs(module: ModuleType) -> set[str]:
    return set(inspect.signature(module.make_params).parameters)


check_modules(MODULES)


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


def modules_for(policies) -> tuple[str, ...]:
    """The stateful modules the presets `policies` need (the rest can be left out of the state)."""
    return tuple(sorted({_module_name(PRESETS[p].module) for p in policies if PRESETS[p].module}))


def check(static: RouterStatic, policies) -> None:
    """Refuse, on the host, policies the model was not built for (`static.policies`), whose module is left
    out, or that cannot run with these static sizes."""
    for name in policies:
        if static.policies is not None and name not in static.policies:
            raise JaxrouteError(f"router '{name}' is not among the routers this model was built for "
                                f"({', '.join(static.policies)}): build it with router_policies including it")
        m = PRESETS[name].module
        if m is None:
            continue
        if static.modules is not None and _module_name(m) not in static.modules:
            raise JaxrouteError(f"router '{name}' needs module '{_module_name(m)}', which this model leaves out "
                                f"(router modules kept: {', '.join(static.modules) or 'none'})")
        if hasattr(m, "check"):
            m.check(static)


# ----------------------------------------------------------------------------- the router's hooks


def _hook(m: ModuleType, hook: str, state, *args):
    return getattr(m, hook)(state, *args) if hasattr(m, hook) else state


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
        module, rule = module_rule
        if module is not None:
            n = _module_name(module)
            if n not in state:  # left out of this model: refused on the host by `check`
                return lambda: jnp.int32(0)
            return lambda: jnp.asarray(rule(state[n], view, req, params, key), jnp.int32)
        return lambda: jnp.asarray(rule(view, req, params, key), jnp.int32)

    # presets of one rule (SGLang's three, llm-d's schedulers, ...) differ only in traced params: one branch
    rules = [(p.module, p.rule) if policies is None or name in policies else None for name, p in PRESETS.items()]
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


def _uses(policy: jax.Array, m: ModuleType) -> jax.Array:
    return jnp.isin(policy, jnp.asarray([REGISTRY.id(k) for k, p in PRESETS.items() if p.module is m]))


def flags(state: dict, policy: jax.Array) -> dict[str, jax.Array]:
    """Capacity flags of the stateful modules, raised only for rows whose policy uses that module."""
    out = {}
    for n in state:
        m = MODULES[n]
        if hasattr(m, "flags"):
            out.update({k: _uses(policy, m) & v for k, v in m.flags(state[n]).items()})
    return out


def stats(state: dict, policy: jax.Array) -> dict[str, jax.Array]:
    """The stateful modules' decision statistics (`stats` hook), 0 for rows whose policy does not use the module."""
    out = {}
    for n in state:
        m = MODULES[n]
        if hasattr(m, "stats"):
            out.update({k: jnp.where(_uses(policy, m), v, jnp.zeros_like(v)) for k, v in m.stats(state[n]).items()})
    return out
