"""Reference router rules for `tests/reference_replicas.py`: plain Python, one class per router.

A reference router is built once per run from the `World` (the run's requests and settings) and
sees, at each arrival, a `Ctx` (what the jitted router's `RouterView` holds, as Python lists and
sets). It answers `choose(ctx) -> replica` and is told `on_dispatch(ctx, g)` and
`on_first_token(g, rid, t)` / `on_finish(g, rid, t)`. Floats are float32 (`F32`) where the jitted router computes in float32.
Random choices use the same JAX key the jitted router gets (`ctx.key`), drawn the same way.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

F32 = np.float32
ROUTER_KEY_TAG = 0x7E57  # jaxroute.clusters.replicas.model._ROUTER_KEY
SCORERS = ("prefix", "inflight", "tokens", "queue", "kv", "load_aware", "lora")  # jaxroute.routers.parts.SCORERS


@dataclasses.dataclass
class World:
    """The run: requests (segments, prompt/output tokens, output segment, session) and settings."""

    G: int
    segs: list  # per request: [(segment id, tokens)] in prompt order
    prompt: list  # per request: prompt tokens
    out_tok: np.ndarray  # [N] output tokens
    out_seg: np.ndarray  # [N] output segment id (dummy = not kept)
    session: np.ndarray  # [N] session id (-1 = none)
    seg_len: np.ndarray  # [M+1]
    seg_depth: np.ndarray  # [M+1]
    dummy: int  # the padding segment id
    cap: int  # KV tokens per replica
    cost: object  # cost_models.CostParams
    rp: dict  # router settings (defaults of reference_replicas.simulate + the test's)


@dataclasses.dataclass
class Ctx:
    """One arrival as the router sees it (loads and caches possibly a stale snapshot)."""

    i: int  # request id
    now: float
    key: object  # the JAX key of this decision
    inflight: list  # [G] requests in flight (router counters)
    tokens: list  # [G] their prompt + output tokens
    record: list  # [G] sets: cache + dispatched segments (insert on dispatch)
    match: list  # [G] leading prompt tokens on `record`
    cached: list  # [G] sets: the replicas' caches (as KV events report them)
    cached_match: list  # [G] leading prompt tokens on `cached`
    waiting: list  # [G] local queue lengths
    running: list  # [G] running requests
    kv_usage: list  # [G] float32 KV fraction in use
    cpu_match: list | None = None  # [G] leading prompt tokens on `cached` + the replica's CPU tier (None: no tiers)
    shared_match: list | None = None  # [G] the same + the shared tier
    adapter: int = -1  # the request's LoRA adapter (-1 = base model)
    lora_running: list | None = None  # [G] its adapter runs there (None: no adapters)
    lora_waiting: list | None = None  # [G] it only waits there
    lora_room: list | None = None  # [G] running + waiting adapters < max_lora


def leading_tokens(segs, present) -> int:
    """Leading prompt tokens whose segments are all in `present`."""
    m = 0
    for sid, t in segs:
        if sid not in present:
            break
        m += t
    return m


def spread(x) -> list:
    """(max - x) / (max - min), 1 when all equal (float32)."""
    x = [F32(v) for v in x]
    hi, lo = max(x), min(x)
    return [F32(F32(hi - v) / F32(hi - lo)) if hi > lo else F32(1) for v in x]


def load_aware(waiting, threshold) -> list:
    t = F32(threshold)
    return [F32(0.5) if w == 0 else F32(0) if F32(w) > t else F32(F32(0.5) * F32(F32(1) - F32(F32(w) / t)))
            for w in waiting]


def scores(ctx: Ctx, prompt: int, prefix_match, threshold) -> dict:
    """The named scorers of jaxroute.routers.parts.score_matrix, per replica."""
    return dict(prefix=[F32(F32(m) / F32(max(prompt, 1))) for m in prefix_match], inflight=spread(ctx.inflight),
                tokens=spread(ctx.tokens), queue=spread(ctx.waiting), kv=[F32(F32(1) - F32(u)) for u in ctx.kv_usage],
                load_aware=load_aware(ctx.waiting, threshold), lora=lora_affinity(ctx))


def lora_affinity(ctx: Ctx) -> list:
    """llm-d's lora-affinity scorer: 1 running there, 0.8 room for another adapter, 0.6 only waiting, 0 else."""
    if ctx.lora_running is None or ctx.adapter < 0:
        return [F32(1)] * len(ctx.inflight)
    return [F32(1.0 if run else 0.8 if room else 0.6 if wait else 0.0)
            for run, wait, room in zip(ctx.lora_running, ctx.lora_waiting, ctx.lora_room, strict=True)]


def weighted_total(weights: dict, sc: dict, G: int) -> list:
    """sum_k w_k * score_k in SCORERS order, float32."""
    total = []
    for g in range(G):
        acc = None
        for k in SCORERS:
            term = F32(F32(weights.get(k, 0.0)) * sc[k][g])
            acc = term if acc is None else F32(acc + term)
        total.append(acc)
    return total


def argmax_lowest(score) -> int:
    """Highest score, ties -> lowest index."""
    return max(range(len(score)), key=lambda g: (score[g], -g))


def random_among_best(score, key) -> int:
    """Highest score, ties -> the largest uniform draw (jax.random.uniform(key, [G]))."""
    u = np.asarray(jax.random.uniform(key, (len(score),)))
    best = max(score)
    return max((g for g in range(len(score)) if score[g] == best), key=lambda g: (u[g], -g))


class Router:
    """The interface (stateless by default)."""

    def __init__(self, world: World):
        self.w = world

    def choose(self, ctx: Ctx) -> int:
        raise NotImplementedError

    def on_dispatch(self, ctx: Ctx, g: int) -> None:
        pass

    def on_first_token(self, g: int, rid: int, t: float) -> None:
        pass

    def on_finish(self, g: int, rid: int, t: float) -> None:
        pass


class Weighted(Router):
    """`weighted`: weights . scorers with the prefix scorer on the router's record, argmax picker
    (the test's `picker` / `weights` settings: argmax or random among ties)."""

    prefix_source = "match"
    default_weights = dict(prefix=3.0, inflight=2.0, tokens=2.0)
    default_picker = "argmax"

    def choose(self, ctx):
        rp = self.w.rp
        weights = rp.get("weights") or self.default_weights
        sc = scores(ctx, self.w.prompt[ctx.i], getattr(ctx, self.prefix_source), rp.get("load_threshold", 128.0))
        total = weighted_total(weights, sc, self.w.G)
        picker = rp.get("picker") or self.default_picker
        if picker == "argmax":
            return argmax_lowest(total)
        if picker == "random":
            return random_among_best(total, ctx.key)
        raise ValueError(picker)


ROUTERS: dict[str, type[Router]] = {"weighted": Weighted}
