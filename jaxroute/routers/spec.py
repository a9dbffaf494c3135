"""Each replica-cluster router declared once, as one typed spec (importable without JAX).

A `RouterSpec` holds every fact about one router: its one-line rule, the function that decides (a
`module.function` of `jaxroute.routers`, resolved when `prefix.py` builds the registry), the module that owns
its state and settings, the settings it starts from, which settings `jaxroute tune` searches (and their
bounds), whether it decides on part of a cluster, and the source it follows. The traced policy ids, the
partial-cluster list, the tuner's table, the docs table (docs/routers.md) and `jaxroute cluster --help` are
all read from `SPECS`.

A stateful module declares its hooks as the typed fields of one `RouterModule` (its `MODULE`); a field
that is not a hook is a TypeError when the module is imported (as optax's `GradientTransformation` names
its two functions).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import textwrap
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any


@dataclasses.dataclass(frozen=True)
class Knob:
    """One tunable setting: a `make_params` router keyword (`w_<scorer>` = that scorer's weight) in [lo, hi]."""

    name: str
    lo: float
    hi: float
    log: bool = False

    @property
    def scorer(self) -> str | None:
        """The scorer whose weight this is (None for other settings)."""
        return self.name.removeprefix("w_") if self.name.startswith("w_") else None

    def to_unit(self, v: float) -> float:
        v = min(max(float(v), self.lo), self.hi)
        if self.log:
            return (math.log(v) - math.log(self.lo)) / (math.log(self.hi) - math.log(self.lo))
        return (v - self.lo) / (self.hi - self.lo)

    def from_unit(self, u: float) -> float:
        u = min(max(float(u), 0.0), 1.0)
        if self.log:
            return math.exp(math.log(self.lo) + u * (math.log(self.hi) - math.log(self.lo)))
        return self.lo + u * (self.hi - self.lo)


def weight_knobs(*scorers: str) -> tuple[Knob, ...]:
    """The weights `w_<scorer>` of the weighted presets, each in [0, 10]."""
    return tuple(Knob(f"w_{s}", 0.0, 10.0) for s in scorers)


@dataclasses.dataclass(frozen=True)
class RouterModule:
    """A stateful router module's contract: its state, its settings and the hooks the cluster calls.

    init(static) -> state; make_params(**settings) -> its Params (the keywords are its settings). Hooks,
    each optional (None: the state passes unchanged), with `active` a traced bool (update only where true):
    on_refresh(state, view, active, p) before every decision; on_arrival(state, view, req, active, p) after it,
    with the request; on_dispatch(state, view, req, g, active, p) once replica g is chosen; after an iteration
    on replica g, on_admit(state, view, g, rids, admitted, cached, p), on_first_token(state, view, g, rids,
    first, p) and on_finish(state, view, g, rids, finished, p). check(static) refuses static sizes on the host;
    flags(state) -> {name: bool} capacity flags (OR-ed into overflow); stats(state) -> {name: scalar}.
    """

    init: Callable
    make_params: Callable
    on_refresh: Callable | None = None
    on_arrival: Callable | None = None
    on_dispatch: Callable | None = None
    on_admit: Callable | None = None
    on_first_token: Callable | None = None
    on_finish: Callable | None = None
    check: Callable | None = None
    flags: Callable | None = None
    stats: Callable | None = None

    @property
    def settings(self) -> tuple[str, ...]:
        """Its settings: the keywords of make_params."""
        return tuple(inspect.signature(self.make_params).parameters)


HOOKS = tuple(f.name for f in dataclasses.fields(RouterModule) if f.name.startswith("on_"))


@dataclasses.dataclass(frozen=True)
class RouterSpec:
    """One replica-cluster router (see the module docstring)."""

    name: str
    summary: str  # its rule in one line (the docs table, --help)
    rule: str  # "module.function" in jaxroute.routers: stateless (view, req, params, key), or with a module
    #            (module_state, view, req, params, key) -> replica
    source: str  # what it follows (file and function of the real router, or the paper)
    module: str | None = None  # the module of jaxroute.routers that owns its state and settings (None: stateless)
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # settings it starts from
    tunable: tuple[Knob, ...] = ()  # what `jaxroute tune` searches by default, with bounds
    partial_ok: bool = False  # decides on the first n_active replicas exactly as a cluster of n_active would

    def __post_init__(self):
        object.__setattr__(self, "defaults", MappingProxyType(dict(self.defaults)))
        if self.rule.count(".") != 1:
            raise ValueError(f"router '{self.name}': rule must be 'module.function', got '{self.rule}'")


_THETA = Knob("theta", 0.0, 1.0)
_SGL = (Knob("sgl_cache_threshold", 0.0, 1.0), Knob("sgl_balance_abs", 1.0, 1024.0, log=True),
        Knob("sgl_balance_rel", 1.0, 4.0))
_E2 = (Knob("e2_th_bal", 1.0, 4.0), Knob("e2_window_s", 10.0, 1800.0, log=True))
_LLMD = "llm-d inference scheduler (pkg/epp/scheduling, scorers and max-score picker; routers/llmd.py)"
_SGLANG = "SGLang router / model gateway (sgl-model-gateway/src/policies/cache_aware.rs; routers/sglang.py)"
_VLLM = "vLLM production-stack (src/vllm_router/routers/routing_logic.py; routers/vllm_stack.py)"

# In traced-id order: append new routers (existing ids stay).
SPECS: tuple[RouterSpec, ...] = (
    RouterSpec("rr", "round robin", "presets.rr", "the lecture's round robin", partial_ok=True),
    RouterSpec("least_load", "fewest requests in flight", "presets.least_load",
               "SGLang's shortest-queue fallback (cache_aware.rs); llm-d queue scorer", partial_ok=True),
    RouterSpec("least_tokens", "fewest tokens (prompt + output) in flight", "presets.least_tokens",
               "the lecture's least work left, counted in tokens", partial_ok=True),
    RouterSpec("affinity", "longest view match; ties -> least load", "presets.affinity",
               "jaxroute's baseline: the longest match on the router's record", partial_ok=True),
    RouterSpec("threshold", "longest match if its ratio >= theta, else least load (Preble E2's split at theta = 0.5)",
               "presets.threshold", "Preble E2's exploit/explore split (lecture 3.2)", tunable=(_THETA,),
               partial_ok=True),
    RouterSpec("cache_guard", "least load when max - min in-flight > guard_abs and max > guard_rel * min, else threshold",
               "presets.cache_guard", "SGLang's balance guard (cache_aware.rs) over the threshold rule",
               tunable=(_THETA, Knob("guard_abs", 1.0, 256.0, log=True), Knob("guard_rel", 1.0, 4.0))),
    RouterSpec("sglang_cache_aware", "SGLang router: imbalanced -> shortest queue; else its own approximate tree: "
               "ratio > cache_threshold -> the matching worker, else the smallest tree", "sglang.choose",
               _SGLANG + "; CLI defaults (router_args.py)", module="sglang", tunable=_SGL),
    RouterSpec("preble_e2", "Preble E2: exploit (cached > missed) or explore by load cost L + M + P; post-hoc "
               "rebalancing", "preble.choose", "Preble (WukLab/preble global_scheduler_with_time.py; lecture 3.2-3.4)",
               module="preble", tunable=_E2),
    RouterSpec("weighted", "llm-d-style weighted scorers (prefix ratio on the record 3, in-flight 2, tokens 2) and "
               "a traced picker", "presets.weighted", _LLMD + ", scorers of jaxroute's own",
               defaults=dict(weights=dict(prefix=3.0, inflight=2.0, tokens=2.0)),
               tunable=weight_knobs("prefix", "inflight", "tokens"), partial_ok=True),
    RouterSpec("llmd_precise", "llm-d scheduler: precise prefix (reported cache, matched/prompt 64-token blocks) 3 + "
               "kv-utilization 2 + queue 2; max-score picker (random ties)", "llmd.scheduler", _LLMD,
               defaults=dict(weights=dict(prefix=3.0, kv=2.0, queue=2.0), picker="random"),
               tunable=weight_knobs("prefix", "kv", "queue"), partial_ok=True),
    RouterSpec("llmd_approx", "llm-d with the approximate prefix index (own LRU of block hashes, inserted on "
               "dispatch, greedy walk) 1 + kv 1 + queue 1; max-score picker", "llmd.choose", _LLMD, module="llmd",
               defaults=dict(weights=dict(prefix=1.0, kv=1.0, queue=1.0), picker="random"),
               tunable=weight_knobs("prefix", "kv", "queue")),
    RouterSpec("llmd_load", "llm-d queue 1 + kv-cache-utilization 1; max-score picker", "llmd.scheduler", _LLMD,
               defaults=dict(weights=dict(queue=1.0, kv=1.0), picker="random"), tunable=weight_knobs("queue", "kv"),
               partial_ok=True),
    RouterSpec("llmd_load_aware", "llm-d load-aware scorer (0.5 at an empty queue -> 0 at 128 waiting); max-score "
               "picker", "llmd.scheduler", _LLMD + " (scorer/loadaware/load_aware.go)",
               defaults=dict(weights=dict(load_aware=1.0), picker="random"),
               tunable=(Knob("load_threshold", 4.0, 1024.0, log=True),), partial_ok=True),
    RouterSpec("dynamo_kv", "Dynamo KV router: argmin of w x (active + uncached prefill tokens) / B + unique active "
               "blocks after admission; ties random, softmax at T > 0", "dynamo.choose",
               "NVIDIA Dynamo (lib/kv-router/src/scheduling/selector.rs; routers/dynamo.py)", module="dynamo",
               tunable=(Knob("dyn_overlap_weight", 0.0, 10.0), Knob("dyn_temperature", 0.0, 2.0)), partial_ok=True),
    RouterSpec("random", "uniformly random replica", "presets.random", "SGLang random.rs", partial_ok=True),
    RouterSpec("sglang_cache_aware_rs", "SGLang cache-aware with the Rust CacheAwareConfig defaults (0.5 / 32 / 1.1) "
               "and LRU size pruning of its tree (every 30 s to 10,000 tokens per worker)", "sglang.choose",
               _SGLANG + "; `impl Default for CacheAwareConfig` (policies/mod.rs)", module="sglang",
               defaults=dict(sgl_cache_threshold=0.5, sgl_balance_abs=32.0, sgl_balance_rel=1.1,
                             sgl_evict_interval_s=30.0, sgl_max_tree_tokens=10000.0), tunable=_SGL),
    RouterSpec("sglang_gateway", "SGLang model gateway cache-aware: CLI defaults, a cache miss goes to the "
               "least-loaded worker", "sglang.choose", _SGLANG + "; newer gateway's miss rule", module="sglang",
               defaults=dict(sgl_miss_rule="least_load"), tunable=_SGL),
    RouterSpec("sglang_power_of_two", "two distinct random replicas, the lower scraped token load (KV in use); ties "
               "-> the first draw", "sglang.power_of_two", "SGLang power_of_two.rs"),
    RouterSpec("vllm_prefixaware", "production-stack prefix-aware: most matched trie chunks (32 tokens), random among "
               "ties (all when none); QPS below --prefix-min-match-length (off)", "vllm_stack.prefixaware",
               _VLLM + ", prefix/hashtrie.py", module="vllm_stack"),
    RouterSpec("vllm_session", "production-stack session: consistent-hash ring (160 vnodes) on the session id, else "
               "lowest 60 s QPS", "vllm_stack.session", _VLLM, module="vllm_stack"),
    RouterSpec("vllm_kvaware", "production-stack KV-aware: the longest real-cache match when it covers all but 2,000 "
               "tokens, else session ring / QPS", "vllm_stack.kvaware", _VLLM, module="vllm_stack"),
    RouterSpec("aibrix_prefix_cache", "AIBrix prefix-cache: running spread > 8 -> only least-loaded pods match; best % "
               "match among pods with running <= mean + 1 sigma, ties random; else least request", "aibrix.choose",
               "AIBrix (pkg/plugins/gateway/algorithms/prefix_cache.go; routers/aibrix.py)", module="aibrix"),
    RouterSpec("aibrix_least_request", "AIBrix least-request: fewest running requests, ties random",
               "aibrix.least_request", "AIBrix (pkg/plugins/gateway/algorithms/least_request.go)"),
    RouterSpec("preble", "Preble complete: preble_e2 + prefill/decode pairing + autoscaling of hot prefixes (use it "
               "with local order \"priority\")", "preble.choose", "Preble (global_scheduler_with_time.py, "
               "model_runtime_manager.py; lecture 3.2-3.4)", module="preble",
               defaults=dict(e2_pairing=True, e2_autoscale=True), tunable=_E2),
    RouterSpec("llmd_lora", "llm-d scheduler with its lora-affinity scorer: precise prefix 3 + kv-utilization 2 + queue 2 "
               "+ lora-affinity 1 (adapter running 1, room for it 0.8, only waiting 0.6); max-score picker",
               "llmd.scheduler", _LLMD + " (scorer/loraaffinity/lora_affinity.go; a plugin listed without a weight "
               "weighs 1)", defaults=dict(weights=dict(prefix=3.0, kv=2.0, queue=2.0, lora=1.0), picker="random"),
               tunable=weight_knobs("prefix", "kv", "queue", "lora"), partial_ok=True),
)
BY_NAME: dict[str, RouterSpec] = {s.name: s for s in SPECS}
if len(BY_NAME) != len(SPECS):
    raise ImportError("routers.spec.SPECS names a router twice")


def docs_page() -> str:
    """docs/routers.md: `python -m jaxroute.routers.spec > docs/routers.md` (a test checks it is current)."""
    return ("# Replica-cluster routers\n\n"
            "Generated from `jaxroute/routers/spec.py` (`python -m jaxroute.routers.spec > docs/routers.md`): each "
            "router's rule, what it follows, the module that owns its state, whether it decides on part of a "
            "cluster (`n_active` < replicas, exactly as a cluster of `n_active`), and the settings `jaxroute tune` "
            "searches by default. Each rule's details and line-level sources are in its function's docstring.\n\n"
            + markdown_table())


def markdown_table() -> str:
    """The routers' table of docs/routers.md, from SPECS."""
    rows = ["| router | rule | follows | state | partial cluster | tuned by default |", "|---|---|---|---|---|---|"]
    for s in SPECS:
        tuned = ", ".join(k.name for k in s.tunable) or "-"
        rows.append(f"| `{s.name}` | {s.summary} | {s.source} | {s.module or '-'} | "
                    f"{'yes' if s.partial_ok else 'no'} | {tuned} |")
    return "\n".join(rows) + "\n"


def help_lines(width: int = 100) -> str:
    """Each router's name and rule, wrapped, for `--help` epilogs."""
    pad = max(len(s.name) for s in SPECS) + 4
    return "\n".join(textwrap.fill(s.summary, width, initial_indent=f"  {s.name:<{pad - 2}}",
                                   subsequent_indent=" " * pad, break_on_hyphens=False) for s in SPECS)


if __name__ == "__main__":
    print(docs_page(), end="")
