"""Reference rules of llm-d's scheduler presets and Dynamo's KV router (see tests/reference_routers.py).

Plain Python, written from the sources (see jaxroute/routers/llmd.py, dynamo.py), not from the jitted
code: each prompt is walked block by block (a block belongs to the segment its last token falls in),
the approximate index is a dict per server, Dynamo's active blocks a per-worker multiset of segments.
Floats are float32 where the jitted routers compute in float32; random choices call the same
`jax.random` functions on `ctx.key` as the jitted rules.
"""

from __future__ import annotations

import jax
import numpy as np

from tests.reference_routers import (
    F32,
    Router,
    random_among_best,
    scores,
    weighted_total,
)


def _settings(world, defaults: dict) -> dict:
    return {k: world.rp.get(k, v) for k, v in defaults.items()}


def block_owners(path, B, limit=None) -> tuple[list, bool]:
    """(segment of each full block in order, has a partial tail block) for a prompt [(seg, tokens)],
    hashing only its first `limit` tokens (None = all); a prompt shorter than a block has no blocks."""
    prompt = sum(t for _, t in path)
    hashed = prompt if limit is None else min(prompt, limit)
    owners, pos = [], 0
    for sid, t in path:
        for b_end in range((pos // B + 1) * B, pos + t + 1, B):
            if b_end <= hashed:
                owners.append(sid)
        pos += t
    partial = prompt >= B and hashed % B != 0
    return owners, partial


LLMD = dict(llmd_block_tokens=64, llmd_max_blocks=256, llmd_lru_blocks=0, llmd_precise_minmax=False, llmd_cpu_weight=0.8)


class LlmdPrecise(Router):
    """`llmd_precise`: precise prefix (matched full blocks of the reported cache / prompt full blocks, or
    min-max over the pods with a hit) 3, kv 2, queue 2; max-score picker (random among ties)."""

    default_weights = dict(prefix=3.0, kv=2.0, queue=2.0)

    def __init__(self, world):
        super().__init__(world)
        self.s = _settings(world, LLMD)

    def prefix(self, ctx) -> list:
        B = int(self.s["llmd_block_tokens"])
        total = self.w.prompt[ctx.i] // B
        matched = [int(m) // B for m in ctx.cached_match]
        if ctx.cpu_match is not None:  # each block past the GPU prefix found in the CPU tier weighs llmd_cpu_weight
            w = F32(self.s["llmd_cpu_weight"])
            matched = [F32(F32(m) + F32(w * F32(int(c) // B - m))) for m, c in zip(matched, ctx.cpu_match, strict=True)]
        if self.s["llmd_precise_minmax"]:
            hits = [m for m in matched if m > 0]
            if not hits:
                return [F32(0)] * len(matched)
            lo, hi = F32(min(hits)), F32(max(hits))
            return [F32(0) if m == 0 else F32(1) if hi == lo else F32(F32(F32(m) - lo) / F32(hi - lo)) for m in matched]
        if total == 0:
            return [F32(0)] * len(matched)
        return [min(F32(F32(m) / F32(total)), F32(1)) for m in matched]

    def weights(self) -> dict:
        return self.w.rp.get("weights") or self.default_weights

    def choose(self, ctx):
        sc = scores(ctx, self.w.prompt[ctx.i], ctx.cached_match, self.w.rp.get("load_threshold", 128.0))
        sc["prefix"] = self.prefix(ctx)
        total = weighted_total(self.weights(), sc, self.w.G)
        assert (self.w.rp.get("picker") or "random") == "random"
        return random_among_best(total, ctx.key)


class LlmdLoad(LlmdPrecise):
    default_weights = dict(queue=1.0, kv=1.0)


class LlmdLoadAware(LlmdPrecise):
    default_weights = dict(load_aware=1.0)


class LlmdApprox(LlmdPrecise):
    """`llmd_approx`: the router's own LRU index of block entries per server, inserted on dispatch; greedy
    walk over the prompt's blocks; prefix 1 + kv 1 + queue 1 (or the test's weights); random among ties."""

    def __init__(self, world):
        super().__init__(world)
        G = world.G
        self.entries = [dict() for _ in range(G)]  # seg -> entries it holds (full blocks + tail)
        self.tails = [set() for _ in range(G)]  # segs whose prompt's partial tail block is held
        self.stamp = [dict() for _ in range(G)]  # seg -> id of the last request inserting it
        B = int(self.s["llmd_block_tokens"])
        self.B, self.limit = B, int(self.s["llmd_max_blocks"]) * B
        self.stats = dict(evicted=0, tail_hits=0, split_counts=0)  # paths taken (tests read LlmdApprox.last)
        LlmdApprox.last = self

    default_weights = dict(prefix=1.0, kv=1.0, queue=1.0)

    def prefix(self, ctx) -> list:
        path = self.w.segs[ctx.i]
        owners, partial = block_owners(path, self.B, self.limit)
        total = len(owners) + partial
        count = [0] * self.w.G
        walked = True
        for k, sid in enumerate(owners):  # A/plugin.go matchLongestPrefix: stop at the first block no server holds
            holders = [g for g in range(self.w.G) if sid in self.entries[g]]
            if not holders:
                walked = False
                break
            for g in holders:
                count[g] += 1
            self.stats["split_counts"] += any(count[g] < k + 1 for g in holders)  # a holder missed an earlier block
        if walked and partial:
            last = path[-1][0]
            for g in range(self.w.G):
                if last in self.tails[g]:
                    count[g] += 1
                    self.stats["tail_hits"] += 1
        if total == 0:
            return [F32(0)] * self.w.G
        return [F32(F32(c) / F32(total)) for c in count]

    def on_dispatch(self, ctx, g):
        path = self.w.segs[ctx.i]
        owners, partial = block_owners(path, self.B, self.limit)
        per_seg = {}
        for sid in owners:
            per_seg[sid] = per_seg.get(sid, 0) + 1
        last = path[-1][0]
        if partial:
            self.tails[g].add(last)
            per_seg.setdefault(last, 0)
        for sid, n in per_seg.items():
            self.entries[g][sid] = n + (sid in self.tails[g])
            self.stamp[g][sid] = ctx.i
        cap = int(self.s["llmd_lru_blocks"]) or self.w.cap // self.B
        size = sum(self.entries[g].values())
        while size > cap and self.entries[g]:  # whole segments: oldest insert first, shallower first, lowest id
            victim = min(self.entries[g], key=lambda s: (self.stamp[g][s], int(self.w.seg_depth[s]), s))
            size -= self.entries[g].pop(victim)
            self.stats["evicted"] += 1
            self.tails[g].discard(victim)


DYNAMO = dict(dyn_overlap_weight=1.0, dyn_temperature=0.0, dyn_block_tokens=16, dyn_host_weight=0.75,
              dyn_disk_weight=0.25)


class DynamoKv(Router):
    """`dynamo_kv`: cost = w x (active prefill tokens + uncached prompt tokens) / B + unique active full
    blocks after admission; T = 0 -> lowest cost, random among ties; T > 0 -> softmax on min-max scaled
    costs. Prefill tokens and blocks are added on dispatch; prefill tokens leave at the first token,
    blocks when the request finishes."""

    def __init__(self, world):
        super().__init__(world)
        self.s = _settings(world, DYNAMO)
        self.B = int(self.s["dyn_block_tokens"])
        self.count = [dict() for _ in range(world.G)]  # seg -> unfinished requests holding it
        self.prefill = [0] * world.G
        self.req = {}  # rid -> (worker, prefill tokens)
        self.all_blocks = {}  # seg -> full blocks ending in it (fixed by its position)

    def seg_blocks(self, path) -> dict:
        owners, _ = block_owners(path, self.B)
        out = {sid: 0 for sid, _ in path}
        for sid in owners:
            out[sid] += 1
        return out

    def new_tokens(self, ctx, g) -> int:
        return self.w.prompt[ctx.i] - (int(ctx.cached_match[g]) // self.B) * self.B

    def costs(self, ctx) -> list:
        path = self.w.segs[ctx.i]
        nb = self.seg_blocks(path)
        self.all_blocks.update(nb)
        out = []
        for g in range(self.w.G):
            active = sum(self.all_blocks[sid] for sid, c in self.count[g].items() if c > 0)
            added = sum(n for sid, n in nb.items() if self.count[g].get(sid, 0) == 0)
            pre = F32(F32(self.prefill[g] + self.new_tokens(ctx, g)) / F32(self.B))
            if ctx.cpu_match is not None:  # credit for the blocks past the device prefix in lower tiers
                dev, host, ext = (int(x[g]) // self.B for x in (ctx.cached_match, ctx.cpu_match, ctx.shared_match))
                credit = F32(F32(F32(self.s["dyn_host_weight"]) * F32(host - dev))
                             + F32(F32(self.s["dyn_disk_weight"]) * F32(ext - host)))
                pre = max(F32(pre - credit), F32(0))
            out.append(F32(F32(F32(self.s["dyn_overlap_weight"]) * pre) + F32(active + added)))
        return out

    def choose(self, ctx):
        cost = self.costs(ctx)
        T = F32(self.s["dyn_temperature"])
        if T == 0:
            return random_among_best([-c for c in cost], ctx.key)
        lo, hi = min(cost), max(cost)
        if hi == lo:
            logits = np.zeros(len(cost), np.float32)
        else:
            logits = np.asarray([-(F32(F32(c - lo) / F32(F32(hi - lo) * T))) for c in cost], np.float32)
        return int(jax.random.categorical(ctx.key, logits))

    def on_dispatch(self, ctx, g):
        for sid, _ in self.w.segs[ctx.i]:
            self.count[g][sid] = self.count[g].get(sid, 0) + 1
        tok = self.new_tokens(ctx, g)
        self.prefill[g] += tok
        self.req[ctx.i] = (g, tok)

    def on_first_token(self, g, rid, t):
        if rid in self.req:
            w, tok = self.req.pop(rid)
            assert w == g
            self.prefill[g] -= tok

    def on_finish(self, g, rid, t):
        for sid, _ in self.w.segs[rid]:
            self.count[g][sid] -= 1
        self.on_first_token(g, rid, t)


class LlmdLora(LlmdPrecise):
    """`llmd_lora`: llmd_precise's scorers + lora-affinity 1 (reference_routers.lora_affinity)."""

    default_weights = dict(prefix=3.0, kv=2.0, queue=2.0, lora=1.0)


ROUTERS: dict[str, type[Router]] = {"llmd_precise": LlmdPrecise, "llmd_approx": LlmdApprox, "llmd_load": LlmdLoad,
                                    "llmd_load_aware": LlmdLoadAware, "dynamo_kv": DynamoKv, "llmd_lora": LlmdLora}
