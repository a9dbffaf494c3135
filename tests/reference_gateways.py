"""Reference rules of the SGLang gateway, vLLM production-stack and AIBrix routers (see tests/reference_routers.py).

Plain Python: sets and dicts per replica, explicit leaves, a sorted hash ring with `bisect`, a list of
dispatches filtered by time. Floats are float32 where the jitted routers compute in float32; random
choices call the same `jax.random` functions on `ctx.key` as the jitted rules.
"""

from __future__ import annotations

import bisect

import jax
import numpy as np

from tests.reference_routers import F32, Router, leading_tokens, random_among_best

INF = float("inf")


def _settings(world, defaults: dict) -> dict:
    return {k: world.rp.get(k, v) for k, v in defaults.items()}


def _lowest(x) -> int:
    """argmin, ties -> lowest index."""
    return min(range(len(x)), key=lambda g: (x[g], g))


def _parents(world) -> dict:
    """segment -> its parent segment (None at the root), read off the requests' paths."""
    parent = {}
    for i, path in enumerate(world.segs):
        ids = [s for s, _ in path] + ([int(world.out_seg[i])] if world.out_seg[i] != world.dummy else [])
        for k, s in enumerate(ids):
            parent[s] = ids[k - 1] if k else None
    return parent


# ----------------------------------------------------------------------------- SGLang


class SglangCacheAware(Router):
    """`sglang_cache_aware`: guard -> least load; own tree: ratio > threshold -> best match (ties ->
    fewest requests, lowest index); else smallest tree or least load; size pruning on a timer."""

    defaults = dict(sgl_cache_threshold=0.3, sgl_balance_abs=64.0, sgl_balance_rel=1.5, sgl_miss_rule="smallest_tree",
                    sgl_evict_interval_s=0.0, sgl_max_tree_tokens=float(2**26))

    def __init__(self, world):
        super().__init__(world)
        self.s = _settings(world, self.defaults)
        self.tree = [set() for _ in range(world.G)]
        self.last = [dict() for _ in range(world.G)]
        self.tick = 0.0
        self.parent = _parents(world)

    def size(self, g) -> int:
        return sum(int(self.w.seg_len[s]) for s in self.tree[g])

    def prune(self, now) -> None:
        interval = F32(self.s["sgl_evict_interval_s"])
        if interval <= 0:
            return
        n = float(np.floor(F32(F32(now) / interval)))
        if n <= self.tick:
            return
        self.tick = n
        for g in range(self.w.G):
            while self.size(g) > F32(self.s["sgl_max_tree_tokens"]):
                has_child = {self.parent[c] for c in self.tree[g]}
                leaves = [s for s in self.tree[g] if s not in has_child]
                victim = min(leaves, key=lambda s: (self.last[g][s], -int(self.w.seg_depth[s]), s))
                self.tree[g].remove(victim)

    def choose(self, ctx):
        self.prune(ctx.now)
        s, G, inf = self.s, self.w.G, ctx.inflight
        hi, lo = F32(max(inf)), F32(min(inf))
        least = _lowest(inf)
        if F32(hi - lo) > F32(s["sgl_balance_abs"]) and hi > F32(F32(s["sgl_balance_rel"]) * lo):
            return least
        segs, prompt = self.w.segs[ctx.i], self.w.prompt[ctx.i]
        tm = [leading_tokens(segs, self.tree[g]) for g in range(G)]
        best = max(tm)
        b = min((g for g in range(G) if tm[g] == best), key=lambda g: (inf[g], g))
        if F32(F32(tm[b]) / F32(max(prompt, 1))) > F32(s["sgl_cache_threshold"]):
            return b
        if s["sgl_miss_rule"] in ("least_load", 1):
            return least
        return _lowest([self.size(g) for g in range(G)])

    def on_dispatch(self, ctx, g):
        i = ctx.i
        ids = [s for s, _ in self.w.segs[i]] + ([int(self.w.out_seg[i])] if self.w.out_seg[i] != self.w.dummy else [])
        for sid in ids:
            self.tree[g].add(sid)
            self.last[g][sid] = ctx.now


class SglangCacheAwareRs(SglangCacheAware):
    """Rust `CacheAwareConfig::default()`: 0.5 / 32 / 1.1, pruning every 30 s to 10,000 tokens."""

    defaults = dict(SglangCacheAware.defaults, sgl_cache_threshold=0.5, sgl_balance_abs=32.0, sgl_balance_rel=1.1,
                    sgl_evict_interval_s=30.0, sgl_max_tree_tokens=10000.0)


class SglangGateway(SglangCacheAware):
    defaults = dict(SglangCacheAware.defaults, sgl_miss_rule="least_load")


class SglangPowerOfTwo(Router):
    def choose(self, ctx):
        G = self.w.G
        if G == 1:
            return 0
        k1, k2 = jax.random.split(ctx.key)
        i1 = int(jax.random.randint(k1, (), 0, G))
        i2 = (i1 + 1 + int(jax.random.randint(k2, (), 0, G - 1))) % G
        return i1 if ctx.kv_usage[i1] <= ctx.kv_usage[i2] else i2


class Random(Router):
    def choose(self, ctx):
        return int(jax.random.randint(ctx.key, (), 0, self.w.G))


# ----------------------------------------------------------------------------- vLLM production-stack

M32 = 0xFFFFFFFF
VNODES = 160


def mix32(x: int) -> int:
    """murmur3's 32-bit finaliser."""
    x &= M32
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & M32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & M32
    return x ^ (x >> 16)


class HashRing:
    """Consistent-hash ring: VNODES points per replica, the first point strictly above the key, wrapping."""

    def __init__(self, G):
        pts = sorted((mix32((g * VNODES + w + 1) * 0x9E3779B1), g) for g in range(G) for w in range(VNODES))
        self.keys = [k for k, _ in pts]
        self.owner = [g for _, g in pts]

    def get(self, session: int) -> int:
        pos = bisect.bisect_right(self.keys, mix32(session * 0x85EBCA77 + 0x165667B1))
        return self.owner[0 if pos == len(self.keys) else pos]


class VllmStack(Router):
    """production-stack: own prompt trie (chunked), QPS over a sliding window, session ring."""

    defaults = dict(vllm_qps_window_s=60.0, vllm_chunk_tokens=32.0, vllm_prefix_min_match=0.0,
                    vllm_kv_threshold=2000.0, vllm_kv_chunk_tokens=256.0)

    def __init__(self, world):
        super().__init__(world)
        self.s = _settings(world, self.defaults)
        self.tree = [set() for _ in range(world.G)]
        self.log = []  # (dispatch time, replica)
        self.ring = HashRing(world.G)

    def qps(self, ctx) -> int:
        cut = F32(F32(ctx.now) - F32(self.s["vllm_qps_window_s"]))
        seen = {g for _, g in self.log}
        for g in range(self.w.G):  # `_qps_routing`: an engine without stats wins at once
            if g not in seen:
                return g
        counts = [sum(1 for t, h in self.log if h == g and not t < cut) for g in range(self.w.G)]
        return _lowest(counts)

    def session_or_qps(self, ctx) -> int:
        sess = int(self.w.session[ctx.i])
        return self.ring.get(sess) if sess >= 0 else self.qps(ctx)

    def on_dispatch(self, ctx, g):
        self.tree[g].update(s for s, _ in self.w.segs[ctx.i])
        self.log.append((F32(ctx.now), g))


class VllmPrefixAware(VllmStack):
    def choose(self, ctx):
        C = F32(self.s["vllm_chunk_tokens"])
        segs = self.w.segs[ctx.i]
        chunks = [F32(np.floor(F32(F32(leading_tokens(segs, self.tree[g])) / C))) for g in range(self.w.G)]
        if F32(max(chunks) * C) < F32(self.s["vllm_prefix_min_match"]):
            return self.qps(ctx)
        return random_among_best(chunks, ctx.key)


class VllmSession(VllmStack):
    def choose(self, ctx):
        return self.session_or_qps(ctx)


class VllmKvAware(VllmStack):
    def choose(self, ctx):
        cm = [F32(x) for x in ctx.cached_match]
        b = max(range(self.w.G), key=lambda g: (cm[g], -g))
        c = F32(self.s["vllm_kv_chunk_tokens"])
        matched = F32(F32(np.floor(F32(cm[b] / c))) * c)
        need = max(F32(F32(self.w.prompt[ctx.i]) - F32(self.s["vllm_kv_threshold"])), F32(0))
        if matched > 0 and matched >= need:
            return b
        return self.session_or_qps(ctx)


# ----------------------------------------------------------------------------- AIBrix


class AibrixLeastRequest(Router):
    def choose(self, ctx):
        return random_among_best([-F32(c) for c in ctx.inflight], ctx.key)


class AibrixPrefixCache(Router):
    """prefix-cache: imbalance -> only the least-loaded pods match; best (% match, fewest running) among
    matched pods under mean + k std, ties at random; else least request. Index with an idle TTL."""

    defaults = dict(aibrix_imbalance_abs=8.0, aibrix_std_factor=1.0, aibrix_block_tokens=1, aibrix_ttl_s=1200.0)

    def __init__(self, world):
        super().__init__(world)
        self.s = _settings(world, self.defaults)
        self.put, self.born = {}, {}
        self.pod_t = [dict() for _ in range(world.G)]

    def held(self, g, sid, now) -> bool:
        if sid not in self.put or F32(F32(now) - self.put[sid]) > F32(self.s["aibrix_ttl_s"]):
            return False
        return self.pod_t[g].get(sid, -INF) >= self.born[sid]

    def choose(self, ctx):
        G, cnt, now = self.w.G, [F32(c) for c in ctx.inflight], ctx.now
        lo, hi = min(cnt), max(cnt)
        allowed = [c == lo for c in cnt] if F32(hi - lo) > F32(self.s["aibrix_imbalance_abs"]) else [True] * G
        B = int(self.s["aibrix_block_tokens"])
        segs, prompt = self.w.segs[ctx.i], self.w.prompt[ctx.i]
        n_blocks = prompt // B
        total = cnt[0]
        for c in cnt[1:]:
            total = F32(total + c)
        mean = F32(total / F32(G))
        bound = mean
        if G > 1:
            ss = F32(F32(cnt[0] - mean) * F32(cnt[0] - mean))
            for c in cnt[1:]:
                ss = F32(ss + F32(F32(c - mean) * F32(c - mean)))
            bound = F32(mean + F32(F32(self.s["aibrix_std_factor"]) * np.sqrt(F32(ss / F32(G - 1)))))
        pct, under = {}, []
        for g in range(G):
            blocks = leading_tokens(segs, {s for s, _ in segs if self.held(g, s, now)}) // B
            if allowed[g] and blocks >= 1 and n_blocks >= 1:
                pct[g] = blocks * 100 // n_blocks
                if cnt[g] <= bound:
                    under.append(g)
        if under:
            top = max(pct[g] for g in under)
            return random_among_best([-cnt[g] if g in under and pct[g] == top else -INF for g in range(G)], ctx.key)
        return random_among_best([-c for c in cnt], ctx.key)

    def on_dispatch(self, ctx, g):
        t = F32(ctx.now)
        for sid, _ in self.w.segs[ctx.i]:
            if sid not in self.put or F32(t - self.put[sid]) > F32(self.s["aibrix_ttl_s"]):
                self.born[sid] = t
            self.put[sid] = t
            self.pod_t[g][sid] = t


ROUTERS: dict[str, type[Router]] = {
    "sglang_cache_aware": SglangCacheAware,
    "sglang_cache_aware_rs": SglangCacheAwareRs,
    "sglang_gateway": SglangGateway,
    "sglang_power_of_two": SglangPowerOfTwo,
    "random": Random,
    "vllm_prefixaware": VllmPrefixAware,
    "vllm_session": VllmSession,
    "vllm_kvaware": VllmKvAware,
    "aibrix_prefix_cache": AibrixPrefixCache,
    "aibrix_least_request": AibrixLeastRequest,
}
