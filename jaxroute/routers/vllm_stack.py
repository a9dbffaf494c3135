"""vLLM production-stack router (vllm-project/production-stack `src/vllm_router/routers/routing_logic.py`,
`prefix/hashtrie.py`, `stats/request_stats.py`): the prefix-aware, session and KV-aware routing logics.
One state serves the three presets: the router's own chunk trie and its per-replica QPS window.

QPS (`stats/request_stats.py`): `RequestStatsMonitor.on_new_request` appends (timestamp, 1) to the
engine's `MovingAverageMonitor` at dispatch; `get_request_stats(now)` first drops entries with
`timestamp < now - window` and reports `qps = sum / window`: the requests dispatched to the engine in
[now - window, now], over the window (`--request-stats-window`, default 60 s, `parsers/parser.py`). An
engine that never received a request has no stats. `_qps_routing` (routing_logic.py, RoutingInterface)
walks the endpoints in order: the first engine without stats wins at once, else the lowest qps
(strict `<`, ties -> the first). Modeled exactly as router-side counts: `count[G]` plus a ring of the
replicas of the last `QPS_RING` dispatches; a dispatch's time is its arrival (`table.arrival_s`) and
requests are routed in arrival order, so `on_refresh` expires the oldest dispatches by walking a pointer
(a bounded `lax.while_loop`, O(expired)). More than QPS_RING dispatches inside one window would
overwrite a live entry: `vllm_qps_ring_overflow` says so.

prefixaware (`PrefixAwareRouter.route_request`, `HashTrie`): the prompt is cut into chunks of
`chunk_size` = 128 characters, each hashed (xxhash64) into a trie node holding the endpoints that were
sent a prompt with that chunk path; `longest_prefix_match` follows the request's chunks while some
available endpoint holds the node and returns the endpoints holding the deepest one (all endpoints when
not even the first chunk matches) and the matched characters; the router picks `random.choice` among
them and inserts the prompt under the chosen endpoint (insert on dispatch, no eviction: "we assume that
there is no eviction of prefix cache"). With `--prefix-min-match-length` (default 0 = off) a match
shorter than it falls back to `_qps_routing` (and the prompt is still inserted). Segment mapping: the
trie is `tree[G, M+1]` (prompt segments inserted on dispatch; the output is not, the real trie holds
prompts); matched chunks = floor(leading tokens on the replica's tree / `vllm_chunk_tokens`), default 32
tokens = 128 characters at 4 characters per token. The real trie also matches a prompt's final partial
chunk when an identical prompt was sent before (not modeled: floor always).

session (`SessionRouter`): with a session id (`--session-key` header/body field; here `req.session >= 0`)
the endpoint is `uhashring.HashRing().get_node(session_id)`, else `_qps_routing`. The ring (uhashring
`ring.py`/`ring_meta.py` defaults): 160 virtual nodes per endpoint, point = md5 of "<node>-<w>", lookup =
the first point strictly above the key's hash (`bisect`), wrapping to the first point. We keep its shape
(160 vnodes, bisect-right, wrap) but not its hash: node names are URLs we do not have and md5 is not
reproduced bit for bit; points are `_mix((g * 160 + w + 1) * 0x9E3779B1)` and a session's key is
`_mix(session * 0x85EBCA77 + 0x165667B1)` with `_mix` the murmur3 32-bit finaliser (distinct inputs give
distinct points: both steps are bijections of uint32). So which replica a session lands on differs from a
real deployment; the properties (sticky, balanced in expectation) do not.

kvaware (`KvawareRouter.route_request`): the LMCache controller `lookup` (lmcache
`v1/cache_controller/controllers/kv_controller.py`) walks the prompt's 256-token chunks (LMCache
`chunk_size` default) while some instance holds them and reports, per instance, the end of its last
matched chunk; the router takes the first reported instance and uses it when it matched at least one
chunk and `matched >= max(len(tokens) - kv_aware_threshold, 0)` (`--kv-aware-threshold`, default 2000),
else falls back to the session hash ring (session id present) or `_qps_routing`. Modeled on the replicas'
real caches (`view.cached_match`, what KV events report): matched = floor(leading cached tokens /
`vllm_kv_chunk_tokens`) x chunk on the replica with the longest match (ties -> lowest index). The
controller attributes each chunk to the first instance that admitted it (`kv_pool[key][0]`), an order we
do not track.

Docs vs code: the brief/tutorials describe prefix-aware routing as "longest prefix, else lowest QPS";
the code falls back to QPS only below `--prefix-min-match-length` (default 0: never) and otherwise picks
uniformly among all endpoints when nothing matches. The KV-aware docstring says it falls back to round
robin; the code falls back to the session ring / QPS.

Line citations (production-stack a6c01db): routing_logic.py:62-84 `_qps_routing`,
:198-249 SessionRouter, :262 `kv_aware_threshold: int = 2000`, :389-405 the KV-aware condition and
fallback, :432-522 PrefixAwareRouter (:507-516 min-match fallback, :518 `random.choice`);
prefix/hashtrie.py:37 `chunk_size: int = 128`, :77-104 `longest_prefix_match`; stats/request_stats.py:
:81-86 and :92-97 expiry `timestamps[0] < timestamp - window`, :261 `qps = get_sum() / window`;
parsers/parser.py `--request-stats-window` default 60, `--kv-aware-threshold` 2000,
`--prefix-min-match-length` 0; uhashring/ring.py `HashRing.__init__` (vnodes 160), `_get_pos` (bisect).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxroute.clusters.prefix_cache import leading_match
from jaxroute.errors import JaxrouteError
from jaxroute.routers import parts
from jaxroute.routers.spec import RouterModule
from jaxroute.routers.view import Request, RouterStatic, RouterView

QPS_RING = 4096  # dispatches a QPS window can hold (vllm_qps_ring_overflow when exceeded)
VNODES = 160  # uhashring default vnodes per node (uhashring/ring.py: `vnodes = 160` without hash_fn='ketama')


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Params:
    vllm_qps_window_s: jax.Array  # [] float32 --request-stats-window (s)
    vllm_chunk_tokens: jax.Array  # [] float32 HashTrie chunk, in tokens (128 characters)
    vllm_prefix_min_match: jax.Array  # [] float32 --prefix-min-match-length, in tokens (0 = off)
    vllm_kv_threshold: jax.Array  # [] float32 --kv-aware-threshold (tokens)
    vllm_kv_chunk_tokens: jax.Array  # [] float32 LMCache chunk_size (tokens)


def make_params(vllm_qps_window_s=60.0, vllm_chunk_tokens=32.0, vllm_prefix_min_match=0.0, vllm_kv_threshold=2000.0,
                vllm_kv_chunk_tokens=256.0) -> Params:
    if not vllm_qps_window_s > 0:
        raise JaxrouteError(f"vllm_qps_window_s must be > 0, got {vllm_qps_window_s}")
    if not (vllm_chunk_tokens >= 1 and vllm_kv_chunk_tokens >= 1):
        raise JaxrouteError("vllm_chunk_tokens and vllm_kv_chunk_tokens must be >= 1 token")
    f = lambda x: jnp.asarray(x, jnp.float32)
    return Params(f(vllm_qps_window_s), f(vllm_chunk_tokens), f(vllm_prefix_min_match), f(vllm_kv_threshold),
                  f(vllm_kv_chunk_tokens))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    tree: jax.Array  # [G, M+1] bool prompt segments in the router's trie under each endpoint
    count: jax.Array  # [G] int32 dispatches in the QPS window
    ever: jax.Array  # [G] bool the endpoint has request stats (was ever sent a request)
    ring: jax.Array  # [QPS_RING] int32 replica of dispatch j at j % QPS_RING
    head: jax.Array  # [] int32 oldest dispatch still in the window (request id)
    n: jax.Array  # [] int32 dispatches so far (= next request id)
    overflow: jax.Array  # [] bool a live window entry was overwritten


def init(static: RouterStatic) -> State:
    G, m1 = static.n_replicas, static.n_segments
    return State(jnp.zeros((G, m1), bool), jnp.zeros((G,), jnp.int32), jnp.zeros((G,), bool),
                 jnp.zeros((QPS_RING,), jnp.int32), jnp.int32(0), jnp.int32(0), jnp.bool_(False))


def flags(state: State) -> dict:
    return {"vllm_qps_ring_overflow": state.overflow}


def on_refresh(state: State, view: RouterView, active: jax.Array, p: Params) -> State:
    """Drop dispatches older than the window (`timestamp < now - window`), oldest first."""
    cut = view.now - p.vllm_qps_window_s
    arrival = view.table.arrival_s

    def cond(c):
        head, _ = c
        return active & (head < state.n) & (arrival[jnp.minimum(head, arrival.shape[0] - 1)] < cut)

    def body(c):
        head, count = c
        return head + 1, count.at[state.ring[head % QPS_RING]].add(-1)

    head, count = jax.lax.while_loop(cond, body, (state.head, state.count))
    return dataclasses.replace(state, head=head, count=count)


def on_dispatch(state: State, view: RouterView, req: Request, g: jax.Array, active: jax.Array, p: Params) -> State:
    """Insert the prompt under g in the trie; count the dispatch in g's QPS window."""
    segs = req.segs
    real = segs < state.tree.shape[1] - 1
    tree = state.tree.at[g, segs].set(state.tree[g, segs] | (real & active))
    slot = state.n % QPS_RING
    a = active.astype(jnp.int32)
    return State(tree, state.count.at[g].add(a), state.ever.at[g].set(state.ever[g] | active),
                 state.ring.at[slot].set(jnp.where(active, g, state.ring[slot])), state.head, state.n + a,
                 state.overflow | (active & (state.n - state.head >= QPS_RING)))


# ----------------------------------------------------------------------------- shared pieces


def qps_routing(state: State) -> jax.Array:
    """`_qps_routing`: the first endpoint without stats, else the lowest window count (ties -> first)."""
    score = jnp.where(state.ever, -state.count.astype(jnp.float32), jnp.inf)
    return parts.argmax(score)


def _mix(x: jax.Array) -> jax.Array:
    """murmur3's 32-bit finaliser (a bijection of uint32)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def ring_points(G: int) -> jax.Array:
    """[G * VNODES] uint32 ring points; point g * VNODES + w belongs to replica g."""
    idx = jnp.arange(G * VNODES, dtype=jnp.uint32)
    return _mix((idx + jnp.uint32(1)) * jnp.uint32(0x9E3779B1))


def session_key(session: jax.Array) -> jax.Array:
    return _mix(session.astype(jnp.uint32) * jnp.uint32(0x85EBCA77) + jnp.uint32(0x165667B1))


def hash_ring(session: jax.Array, G: int) -> jax.Array:
    """The replica owning the first ring point strictly above the session's key, wrapping around:
    the point minimising (point - key - 1) mod 2^32 (uint32 arithmetic wraps)."""
    d = ring_points(G) - session_key(session) - jnp.uint32(1)
    return (jnp.argmin(d) // VNODES).astype(jnp.int32)


def _session_or_qps(state: State, req: Request) -> jax.Array:
    G = state.count.shape[0]
    return jnp.where(req.session >= 0, hash_ring(req.session, G), qps_routing(state))


# ----------------------------------------------------------------------------- the three rules


def prefixaware(state: State, view: RouterView, req: Request, p, key) -> jax.Array:
    """Random among the endpoints with the most matched trie chunks (all when none matched); below
    `vllm_prefix_min_match` matched tokens -> `_qps_routing`."""
    _, m = leading_match(state.tree[:, req.segs], jnp.arange(req.segs.shape[0]), req.tok)
    chunks = jnp.floor(m.astype(jnp.float32) / p.vllm_chunk_tokens)
    pick = parts.random_among_ties(chunks, key)
    short = jnp.max(chunks) * p.vllm_chunk_tokens < p.vllm_prefix_min_match
    return jnp.where(short, qps_routing(state), pick)


def session(state: State, view: RouterView, req: Request, p, key) -> jax.Array:
    """Hash ring on the session id; no session -> `_qps_routing`."""
    return _session_or_qps(state, req)


def kvaware(state: State, view: RouterView, req: Request, p, key) -> jax.Array:
    """The replica whose real cache holds the longest chunk-aligned prefix when it covers all but
    `vllm_kv_threshold` tokens of the prompt (and at least one chunk); else session ring / QPS."""
    b = parts.argmax(view.cached_match)
    c = p.vllm_kv_chunk_tokens
    matched = jnp.floor(view.cached_match[b] / c) * c
    ok = (matched > 0) & (matched >= jnp.maximum(req.prompt.astype(jnp.float32) - p.vllm_kv_threshold, 0.0))
    return jnp.where(ok, b, _session_or_qps(state, req))


choose = prefixaware


# The contract the cluster calls (hooks as typed fields: routers/spec.py)
MODULE = RouterModule(init=init,
                      make_params=make_params,
                      on_refresh=on_refresh,
                      on_dispatch=on_dispatch,
                      flags=flags)
