"""llm-d's inference scheduler (llm-d/llm-d-inference-scheduler, commit 520af478, module path
`llm-d-router`; the EPP framework of kubernetes-sigs/gateway-api-inference-extension now lives in it
under `pkg/epp/framework/`): a scheduling profile of weighted scorers and the max-score picker.

Presets (weights over `parts.SCORERS`; all pick with the max-score picker):
- `llmd_precise`: precise prefix-cache scorer (the replicas' caches as their KV events report them:
  `view.cached_match`) 3, kv-cache-utilization 2, queue 2: the weights of the precise-prefix-cache
  guide (llm-d/llm-d `guides/precise-prefix-cache-aware/gaie-kv-events/values.yaml`, commit 126f65d6;
  also the scheduler's built-in default profile, `pkg/epp/config/loader/defaults.go:47-49`).
- `llmd_approx`: approximate prefix-cache scorer (the router's own LRU index of block hashes, inserted
  on dispatch; this module's state) 1, kv 1, queue 1 ("estimated" in llm-d's benchmarks).
- `llmd_load`: queue 1 + kv-cache-utilization 1. `llmd_load_aware`: load-aware scorer 1.

Scorers (all in [0, 1], higher is better), `S = pkg/epp/framework/plugins/scheduling/scorer`:
- queue: (max - w) / (max - min) of the waiting queues, 1 when all equal (`S/queuedepth/queue.go:94-100`)
  = `parts.spread(view.waiting)`.
- kv-cache-utilization: 1 - KV usage (`S/kvcacheutilization/kvcache_utilization.go:79`).
- load-aware: 0.5 at an empty queue, else 0.5 (1 - min(w, threshold) / threshold), threshold 128
  (`S/loadaware/load_aware.go:20,87-97`) = `parts.load_aware` (checked: identical).
- precise prefix: matched blocks / prompt blocks, clipped to 1; prompt blocks = floor(prompt / B)
  (the token processor drops the partial tail: llm-d-kv-cache `pkg/kvcache/kvblock/token_processor.go:187-191`),
  matched = the replica's longest cached block prefix (`pkg/kvcache/kvblock_scorer.go:106-154`, GPU
  weight 1.0) = floor(cached_match / B) (`S/preciseprefixcache/utils.go:16-44`, `precise_prefix_cache.go:501`).
  That absolute normalisation is the scheduler's HEAD (commit e6f6b84f, May 2026, in no release yet);
  releases up to v0.8.0 min-max normalise the raw matched blocks over the pods with a hit (1.0 when
  they are equal, 0 for pods without a hit; v0.8.0 `.../preciseprefixcache/utils.go:20-44`):
  `llmd_precise_minmax=True`. B = `llmd_block_tokens`, 64 (the guide's `blockSize: 64`, "must match
  vLLM --block-size"; the code's default is 16, token_processor.go:32).
- approximate prefix (`pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/`, `A/`):
  the prompt's first `llmd_max_blocks` x B tokens (256 blocks, `A/types.go:99`; `A/hashing.go:63-66`)
  are cut into B-token blocks plus a partial tail block (hashed too, `A/hashing.go:89-96`); a prompt
  shorter than one block has no blocks (`A/hashing.go:58-61`). Matching is greedy over the blocks
  (`A/plugin.go:214-230`): walk the blocks in order while at least one server holds the block, and
  count for every server the walked blocks it holds; score = count / prompt blocks
  (`S/prefix/plugin.go:109-110`). After the decision the chosen server's LRU gets all the prompt's
  block hashes in order (`A/plugin.go:164-192`, `A/indexer.go:52-83`), so within one request the first
  blocks are the least recent; capacity `llmd_lru_blocks` entries per server, LRU eviction per entry.
  With the code's default `autoTune: true` (`A/types.go:137`) block size and capacity come from the
  server's metrics (`A/plugin.go:202-211,233-245`): capacity = the server's KV blocks; here
  `llmd_lru_blocks = 0` = autoTune (kv_capacity // B), > 0 = that fixed capacity (31,250, `A/types.go:110`,
  is the fallback when no metric is scraped). The block size is the same `llmd_block_tokens`.

Picker: max-score with random tie breaking (shuffle, then a stable sort by score:
`pkg/epp/framework/plugins/scheduling/picker/maxscore/picker.go:91-102`) = `parts.random_among_ties`.

Segment granularity (the cluster model's cache holds whole segments; a segment id fixes its position
in every prompt, `RequestTable.seg_depth`): a block is identified by the segment its last token falls
in; a full block is "held" exactly when that segment is. The partial tail belongs to the prompt's last
segment and is held when a prompt ending with that segment (the same prompt) was inserted (`tail`).
The LRU index keeps, per server and segment, the number of entries that segment holds (its full blocks
below the match cap + its tail); it evicts whole segments, least recent first (recency = the request id
of the segment's last insertion, ties = shallower first, as the source inserts a prompt's blocks in
order), until the entries fit, where the source evicts one block entry at a time.

Not modeled: the EPP's data-layer refresh interval of scraped metrics (use `--stale`), speculative
indexing of the precise scorer (off by default, `precise_prefix_cache.go:78`), the periodic removal of
inactive pods from the approximate index, the prefill/decode profiles.

Docs vs code: the approximate producer's README says `maxPrefixBlocksToMatch` and `blockSizeTokens`
default to 0 ("0 means unlimited"); the code's defaults are 256 and 16 (`A/types.go:91,99,136-142`), and
0 blocks would hash nothing (`A/hashing.go:63-66`). The precise guide's newer scheduler values
(`guides/precise-prefix-cache-aware/scheduler/precise-prefix-cache-aware.values.yaml`) weigh 2/1/1.

Every llm-d preset takes `--weights` and the picker from `RouterParams` (defaults: the table above).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxroute.clusters.prefix_cache import evict_lru
from jaxroute.errors import JaxrouteError
from jaxroute.routers import parts
from jaxroute.routers.spec import RouterModule
from jaxroute.routers.view import Request, RouterStatic, RouterView


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Params:
    llmd_block_tokens: jax.Array  # [] int32 B: tokens per hashed block (both prefix scorers)
    llmd_max_blocks: jax.Array  # [] int32 approximate scorer: prefix blocks hashed and matched
    llmd_lru_blocks: jax.Array  # [] int32 approximate scorer: LRU entries per server (0 = autoTune)
    llmd_precise_minmax: jax.Array  # [] bool precise scorer: min-max normalisation (releases <= v0.8.0)
    llmd_cpu_weight: jax.Array  # [] float32 precise scorer: weight of a block held in a CPU offload tier (GPU: 1)


def make_params(llmd_block_tokens=64, llmd_max_blocks=256, llmd_lru_blocks=0, llmd_precise_minmax=False,
                llmd_cpu_weight=0.8) -> Params:
    if not (llmd_block_tokens >= 1 and float(llmd_block_tokens).is_integer()):
        raise JaxrouteError(f"llmd_block_tokens must be a whole number >= 1, got {llmd_block_tokens}")
    if not (llmd_max_blocks >= 1 and float(llmd_max_blocks).is_integer()):
        raise JaxrouteError(f"llmd_max_blocks must be a whole number >= 1, got {llmd_max_blocks}")
    if not (llmd_lru_blocks >= 0 and float(llmd_lru_blocks).is_integer()):
        raise JaxrouteError(f"llmd_lru_blocks must be a whole number >= 0 (0 = from the KV capacity), "
                            f"got {llmd_lru_blocks}")
    if not 0 <= llmd_cpu_weight <= 1:
        raise JaxrouteError(f"llmd_cpu_weight must be in [0, 1], got {llmd_cpu_weight}")
    i = lambda x: jnp.asarray(int(x), jnp.int32)
    return Params(i(llmd_block_tokens), i(llmd_max_blocks), i(llmd_lru_blocks), jnp.bool_(bool(llmd_precise_minmax)),
                  jnp.float32(llmd_cpu_weight))


# ----------------------------------------------------------------------------- block arithmetic


def _blocks(req: Request, B: jax.Array, limit: jax.Array):
    """(full blocks ending in each prompt segment [S], has a partial tail block [], last segment [S] bool)
    for the prompt's first `limit` tokens (limit = inf: all)."""
    tok = req.tok.astype(jnp.int32)
    end = jnp.cumsum(tok)
    start = end - tok
    nb = jnp.minimum(end, limit) // B - jnp.minimum(start, limit) // B
    nb = jnp.where(tok > 0, nb, 0)
    hashed = jnp.minimum(req.prompt, limit)
    partial = (req.prompt >= B) & (hashed % B != 0)
    last = (tok > 0) & (end == req.prompt)
    return nb, partial, last


def precise_score(view: RouterView, req: Request, p) -> jax.Array:
    """[G] the precise prefix-cache scorer on the replicas' reported caches (see the module docstring)."""
    B = p.llmd_block_tokens
    total = req.prompt // B
    on_gpu = view.cached_match.astype(jnp.int32) // B
    m = on_gpu.astype(jnp.float32)
    if view.cpu_match is not None:  # blocks past the GPU prefix held in the CPU tier count llmd_cpu_weight each
        m = m + p.llmd_cpu_weight * (view.cpu_match.astype(jnp.int32) // B - on_gpu).astype(jnp.float32)
    absolute = jnp.where(total > 0, jnp.minimum(m / jnp.maximum(total, 1).astype(jnp.float32), 1.0), 0.0)
    hit = parts.among(m > 0, view.active)  # min-max over the active pods with a hit
    lo = jnp.min(jnp.where(hit, m, jnp.inf))
    hi = jnp.max(jnp.where(hit, m, -jnp.inf))
    minmax = jnp.where(hit, jnp.where(hi > lo, (m - lo) / jnp.where(hi > lo, hi - lo, 1.0), 1.0), 0.0)
    return jnp.where(p.llmd_precise_minmax, minmax, absolute)


def _scores(view: RouterView, req: Request, prefix: jax.Array, load_threshold) -> jax.Array:
    """parts.score_matrix with the prefix row replaced by an llm-d prefix scorer's score."""
    return parts.score_matrix(view, req, view.cached_match, load_threshold).at[0].set(prefix)


def scheduler(view: RouterView, req: Request, p, key) -> jax.Array:
    """Stateless llm-d profile (`llmd_precise`, `llmd_load`, `llmd_load_aware`): weights . scorers with the
    precise prefix scorer in the prefix row, then `p.picker` (max-score = random among ties). On a partial
    cluster (`view.active`) every scorer normalises over the active pods and inactive ones score -inf: the
    same decisions and draws as a cluster of the active pods (`parts.py`)."""
    scores = _scores(view, req, precise_score(view, req, p), p.load_threshold)
    return parts.pick(p.picker, parts.keep(parts.weighted_sum(p.weights, scores), view.active), key, p.temperature)


# ----------------------------------------------------------------------------- the approximate index


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    blk: jax.Array  # [G, M+1] int32 LRU entries the segment holds in each server's index (0 = absent)
    tail: jax.Array  # [G, M+1] bool the index holds the partial tail block of the prompt ending here
    stamp: jax.Array  # [G, M+1] float32 recency: id of the last request that inserted the segment
    size: jax.Array  # [G] int32 entries in each server's index


def init(static: RouterStatic) -> State:
    G, m1 = static.n_replicas, static.n_segments
    return State(jnp.zeros((G, m1), jnp.int32), jnp.zeros((G, m1), bool), jnp.full((G, m1), -1.0, jnp.float32),
                 jnp.zeros((G,), jnp.int32))


def _limit(p: Params) -> jax.Array:
    return p.llmd_max_blocks * p.llmd_block_tokens


def approx_match(s: State, req: Request, p: Params) -> tuple[jax.Array, jax.Array]:
    """(matched blocks [G], prompt blocks []) of the greedy walk over the index (`A/plugin.go:214-230`)."""
    nb, partial, last = _blocks(req, p.llmd_block_tokens, _limit(p))
    held = s.blk[:, req.segs] > 0  # [G, S]
    walk = jnp.cumprod((jnp.any(held, axis=0) | (nb == 0)).astype(jnp.int32))  # [S] block run still going
    count = jnp.sum(held * (walk * nb)[None, :], axis=1)
    tail = jnp.any(s.tail[:, req.segs] & last[None, :], axis=1)  # [G] holds this prompt's tail block
    tail_walk = partial & (walk[-1] > 0) & jnp.any(tail)
    count = count + (tail_walk & tail).astype(jnp.int32)
    return count, jnp.sum(nb) + partial.astype(jnp.int32)


def approx_score(s: State, req: Request, p: Params) -> jax.Array:
    count, total = approx_match(s, req, p)
    return jnp.where(total > 0, count.astype(jnp.float32) / jnp.maximum(total, 1).astype(jnp.float32), 0.0)


def choose(s: State, view: RouterView, req: Request, p, key) -> jax.Array:
    """`llmd_approx`: weights . scorers with the approximate prefix score (own index), then `p.picker`
    (default max-score = random among ties; weights default prefix 1, kv 1, queue 1)."""
    scores = _scores(view, req, approx_score(s, req, p), p.load_threshold)
    return parts.pick(p.picker, parts.weighted_sum(p.weights, scores), key, p.temperature)


def capacity(view: RouterView, p: Params) -> jax.Array:
    """LRU entries per server: llmd_lru_blocks, or (0 = autoTune) the server's KV blocks."""
    return jnp.where(p.llmd_lru_blocks > 0, p.llmd_lru_blocks, view.kv_capacity // p.llmd_block_tokens)


def on_dispatch(s: State, view: RouterView, req: Request, g: jax.Array, active: jax.Array, p: Params) -> State:
    """Insert the prompt's block entries into server g's index, then evict LRU segments beyond capacity."""
    nb, partial, last = _blocks(req, p.llmd_block_tokens, _limit(p))
    segs = req.segs
    tail_new = s.tail[g, segs] | (partial & last)
    put = active & ((nb > 0) | (partial & last))
    old = s.blk[g, segs]
    new = jnp.where(put, nb + tail_new.astype(jnp.int32), old)
    size = s.size[g] + jnp.sum(new - old)
    blk = s.blk.at[g, segs].set(new)
    tail = s.tail.at[g, segs].set(jnp.where(put, tail_new, s.tail[g, segs]))
    stamp = s.stamp.at[g, segs].set(jnp.where(put, req.id.astype(jnp.float32), s.stamp[g, segs]))
    deficit = jnp.where(active, size - capacity(view, p), 0)
    row = blk[g]
    depth = view.table.seg_depth
    shallow = jnp.max(depth) - depth  # >= 0, larger = shallower: evict_lru takes the largest first on ties
    out, freed, _ = evict_lru(row > 0, stamp[g], shallow, row, deficit)
    return State(blk.at[g].set(jnp.where(out, 0, row)), tail.at[g].set(tail[g] & ~out), stamp, s.size.at[g].set(size - freed))


# The contract the cluster calls (hooks as typed fields: routers/spec.py)
MODULE = RouterModule(init=init,
                      make_params=make_params,
                      on_dispatch=on_dispatch)
