"""AIBrix gateway routers (vllm-project/aibrix `pkg/plugins/gateway/algorithms/prefix_cache.go`,
`least_request.go`, `util.go`; the prefix index `pkg/utils/prefixcacheindexer/hash.go` over
`pkg/utils/lrustore/lru_store.go`).

Load: `getRequestCounts` reads `RealtimeNumRequestsRunning`, a per-pod count the gateway keeps itself
(requests it sent and that have not finished: least_request.go "gateway instance tracks active running
request counts for each pod locally"): the router-side `view.inflight`.

least-request (`leastRequestRouter.Route`): the fewest running requests, ties -> uniformly at random
(`targetPods[rand.Intn(len(targetPods))]`).

prefix-cache (`prefixCacheRouter.routeOriginal`, the default path without KV event sync):
1. `getTargetPodListOnLoadImbalance`: if max - min running > `AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_
   IMBALANCE_ABS_COUNT` (default 8, `defaultPodRunningRequestImbalanceAbsCount`), only the pods at the
   minimum are matched.
2. `MatchPrefix`: the prompt's full blocks (`AIBRIX_PREFIX_CACHE_BLOCK_SIZE` = 4 tokens of the default
   "character" tokenizer, i.e. 4 characters ~ 1 model token; incomplete blocks are not hashed) are looked
   up in order; a pod stays matched while it holds every block so far; a matched pod scores
   `(i + 1) * 100 / len(blocks)` (integer %) at its last held block i. Pods with >= 1 matched block are
   "matched" (even when the integer % is 0).
3. `getTargetPodFromMatchedPods`: over ALL ready pods, mean and sample standard deviation (n - 1,
   `util.go standardDeviation`; 0 for one pod) of the running counts; matched pods are shuffled, then
   stable-sorted by % descending, running count ascending; the first with count <= mean + k x std
   (`AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR`, default 1) is the target: the best (%, count) among the
   pods under the bound, ties uniformly at random.
4. No matched pod or none under the bound -> `selectTargetPodWithLeastRequestCount` over all pods
   (random among the minimum).
5. `PostRouteUpdate` -> `AddPrefix`: the prompt's blocks are recorded for the target pod (insert on
   dispatch).

Index (`hash.go`): one LRU store keyed by block prefix-hash, each block holding {pod: last add time};
entries are evicted when idle (last Put) longer than `AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS` (20 min),
checked every second, and when more than 200,000 blocks are stored (LRU by last Put). Modeled at segment
granularity with `aibrix_block_tokens` (default 1 model token per block; matched blocks = floor(leading
tokens / block), blocks of the prompt = floor(prompt / block)): `put[M+1]` last add of the segment (any
pod), `born[M+1]` the time the segment's current index entry was created (an add after more than the TTL
of idleness re-creates it, forgetting the other pods), `pod_t[G, M+1]` each pod's last add. Pod g holds s
at t iff t - put[s] <= ttl and pod_t[g, s] >= born[s] (the TTL as a continuous clock, not 1 s ticks).
The 200,000-block capacity is not modeled (the index is assumed to fit). Floats are float32 (Go float64).

Docs vs code: `algorithms/prefix_cache_readme.md` lists defaults block size 128, imbalance count 16 and
deviation factor 2, and `syncprefixcacheindexer/README.md` a block size of 16; the code's constants are
block size 4 (`defaultPrefixCacheBlockSize`, hash.go), imbalance 8 and factor 1 (prefix_cache.go), as
`pkg/plugins/gateway/ENV_VARS.md` also says. We follow the code.

Line citations (aibrix e3e10f9): prefix_cache.go:46-47 defaults 8 and 1, :401-420 imbalance filter,
:422 MatchPrefix, :425-465 matched target then least-request fallback, :926-945 shuffle / stable sort /
mean + k std bound, :991-1025 `getTargetPodListOnLoadImbalance`; least_request.go:148-166
`selectTargetPodWithLeastRequestCount`, :262-273 `getRequestCounts`, :99-114 least-request ties;
util.go:31-54 mean and sample std; prefixcacheindexer/hash.go:33-36 block number 200000, block size 4,
eviction interval 1 s, duration 20 min, :134-158 `seqSearchPrefix`, :152 the %, :193-204 `matchPods`,
:206-221 full blocks only; lrustore/lru_store.go:92-98 capacity eviction, :131-150 TTL eviction.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxroute.clusters.prefix_cache import leading_run
from jaxroute.errors import JaxrouteError
from jaxroute.in_place import after
from jaxroute.routers import parts
from jaxroute.routers.spec import RouterModule
from jaxroute.routers.view import Request, RouterStatic, RouterView


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Params:
    aibrix_imbalance_abs: jax.Array  # [] float32 running-request spread that counts as imbalanced
    aibrix_std_factor: jax.Array  # [] float32 k in mean + k x std
    aibrix_block_tokens: jax.Array  # [] int32 model tokens per index block
    aibrix_ttl_s: jax.Array  # [] float32 idle time after which an index block is evicted


def make_params(aibrix_imbalance_abs=8.0, aibrix_std_factor=1.0, aibrix_block_tokens=1, aibrix_ttl_s=1200.0) -> Params:
    if not aibrix_block_tokens >= 1:
        raise JaxrouteError(f"aibrix_block_tokens must be >= 1, got {aibrix_block_tokens}")
    f = lambda x: jnp.asarray(x, jnp.float32)
    return Params(f(aibrix_imbalance_abs), f(aibrix_std_factor), jnp.asarray(aibrix_block_tokens, jnp.int32),
                  f(aibrix_ttl_s))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    put: jax.Array  # [M+1] float32 last add of the segment (any pod); -inf = never
    born: jax.Array  # [M+1] float32 creation of the segment's current index entry
    pod_t: jax.Array  # [G, M+1] float32 last add of the segment for each pod; -inf = never


def init(static: RouterStatic) -> State:
    G, m1 = static.n_replicas, static.n_segments
    return State(jnp.full((m1,), -jnp.inf), jnp.full((m1,), -jnp.inf), jnp.full((G, m1), -jnp.inf))


def held(state: State, now: jax.Array, p: Params, segs: jax.Array) -> jax.Array:
    """[G, S] bool: the pod is in the live index entry of each of the segments `segs` [S] at `now` (O(G x S))."""
    return (now - state.put[segs] <= p.aibrix_ttl_s)[None, :] & (state.pod_t[:, segs] >= state.born[segs][None, :])


def on_dispatch(state: State, view: RouterView, req: Request, g: jax.Array, active: jax.Array, p: Params) -> State:
    """`AddPrefix` of the prompt's blocks for the target pod."""
    segs = req.segs
    do = (segs < state.put.shape[0] - 1) & active
    t = view.now
    expired = ~(t - state.put[segs] <= p.aibrix_ttl_s)  # never added (-inf) counts as expired
    born = state.born.at[after(segs, g)].set(jnp.where(do & expired, t, state.born[segs]))  # after the reads: in place
    return State(state.put.at[after(segs, g, expired)].set(jnp.where(do, t, state.put[segs])), born,
                 state.pod_t.at[g, segs].set(jnp.where(do, t, state.pod_t[g, segs])))


def _std_bound(count: jax.Array, k: jax.Array) -> jax.Array:
    """mean + k x sample std of the running counts, summed in replica order (float32)."""
    G = count.shape[0]
    total = count[0]
    for g in range(1, G):
        total = total + count[g]
    mean = total / G
    if G == 1:
        return mean
    ss = (count[0] - mean) ** 2
    for g in range(1, G):
        ss = ss + (count[g] - mean) ** 2
    return mean + k * jnp.sqrt(ss / (G - 1))


def least_request(view: RouterView, req: Request, p, key) -> jax.Array:
    """`least-request`: fewest running requests, ties -> uniformly at random."""
    return parts.random_among_ties(-view.inflight, key)


def choose(state: State, view: RouterView, req: Request, p, key) -> jax.Array:
    count = view.inflight
    lo = jnp.min(count)
    allowed = jnp.where(jnp.max(count) - lo > p.aibrix_imbalance_abs, count == lo, True)
    live = held(state, view.now, p, req.segs)
    _, m = leading_run(live, req.tok)
    B = p.aibrix_block_tokens
    n_blocks = req.prompt // B
    blocks = m // B
    matched = allowed & (blocks >= 1) & (n_blocks >= 1)
    pct = (blocks * 100) // jnp.maximum(n_blocks, 1)
    under = matched & (count <= _std_bound(count, p.aibrix_std_factor))
    best_pct = jnp.max(jnp.where(under, pct, -1))
    tier = under & (pct == best_pct)
    target = parts.random_among_ties(jnp.where(tier, -count, -jnp.inf), key)
    return jnp.where(jnp.any(under), target, least_request(view, req, p, key))


# The contract the cluster calls (hooks as typed fields: routers/spec.py)
MODULE = RouterModule(init=init,
                      make_params=make_params,
                      on_dispatch=on_dispatch)
