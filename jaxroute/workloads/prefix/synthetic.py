"""Synthetic prefix-sharing workloads, built from *units*.

A unit is a small group of requests that belong together (one question; 8 parallel samples of one
problem; the turns of one agent session). Per seed (from the JAX key) units arrive as a Poisson
process and each arrival picks its unit by popularity; a unit's requests arrive at fixed offsets
after it. Segment codes >= 0 in a unit are shared ids; code -1-k is the unit instance's private slot
k (a question, an output that the next turn reads), which becomes a fresh id for every instance.
Structure (document lengths, tool lengths) is drawn once with numpy from `structure_seed`, so every
seed sees the same catalogue. Parameters: see the table in `jaxroute/workloads/prefix/__init__.py`.

Staged load (`with_rate_stages`, like inference-perf's load stages): the unit arrival rate is
piecewise constant over stages (rate_k for seconds_k). Arrivals come from time rescaling: unit-rate
exponential gaps give points of a Poisson process in "reference seconds" u (at the rate passed to
`realize`), and t = M^-1(u) with dM/dt = rate_k / reference rate. So `realize` stays pure and
jittable: the stages are arrays in the pytree and `rate` scales the whole profile (the reference rate,
`stage_mean_rate`, gives the stages as given). After the last stage its rate continues.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute.errors import JaxrouteError
from jaxroute.workloads.names import PREFIX_WORKLOADS, SP_DEFAULTS  # noqa: F401  (SP_DEFAULTS: inference-perf's)
from jaxroute.workloads.prefix.types import (
    RequestTable,
    check_stages,
    request_steps,
    stage_mean_rate,
    stage_requests,
)


def _zipf(n: int, s: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


def zipf_top_shares(n: int, s: float, k: int) -> np.ndarray:
    """Traffic shares of the k most popular of n items under Zipf(s) (DESIGN: 300, 1.1 -> 20.3/9.5/6.1 %)."""
    return _zipf(n, s)[:k]


def _lognormal_lengths(rng, n, mean, sigma, lo, hi) -> np.ndarray:
    x = rng.lognormal(0.0, sigma, size=n)
    x = x / x.mean() * mean
    return np.clip(np.round(x), lo, hi).astype(np.int64)


# ----------------------------------------------------------------------------- synthetic


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SyntheticPrefixWorkload:
    """Unit templates; `realize(key, rate)` draws one seed's requests (Poisson units, popularity)."""

    unit_prob: jax.Array  # [U] float32 popularity of each unit
    unit_seg: jax.Array  # [U, R, S] int32 segment codes (>= 0 shared id, -1-k private slot k)
    unit_tok: jax.Array  # [U, R, S] int32 tokens (0 = pad)
    unit_out: jax.Array  # [U, R] int32 output tokens (0 = no such request)
    unit_out_slot: jax.Array  # [U, R] int32 private slot the output is kept in (-1 = not kept)
    unit_offset_s: jax.Array  # [U, R] float32 arrival offset of each request after its unit
    unit_slot_len: jax.Array  # [U, K] int32 tokens of each private slot
    unit_slot_depth: jax.Array  # [U, K] int32 tree depth of each private slot
    shared_len: jax.Array  # [n_shared] int32
    shared_depth: jax.Array  # [n_shared] int32
    # Load stages (K = 1 and no stages: a homogeneous Poisson process). Stage k starts at stage_t0[k]
    # seconds and at stage_m0[k] reference seconds, and runs at stage_mult[k] x the reference rate.
    stage_t0: jax.Array = dataclasses.field(default_factory=lambda: jnp.zeros((1,), jnp.float32))  # [K]
    stage_m0: jax.Array = dataclasses.field(default_factory=lambda: jnp.zeros((1,), jnp.float32))  # [K]
    stage_mult: jax.Array = dataclasses.field(default_factory=lambda: jnp.ones((1,), jnp.float32))  # [K]
    name: str = dataclasses.field(metadata=dict(static=True), default="synthetic")
    n_requests: int = dataclasses.field(metadata=dict(static=True), default=0)
    n_instances: int = dataclasses.field(metadata=dict(static=True), default=0)
    n_shared: int = dataclasses.field(metadata=dict(static=True), default=0)
    n_slots: int = dataclasses.field(metadata=dict(static=True), default=1)
    requests_per_unit: float = dataclasses.field(metadata=dict(static=True), default=1.0)
    # distinct (prompt tokens, output tokens) of the unit requests: static, for step_bound and check_fits
    request_shapes: tuple[tuple[int, int], ...] = dataclasses.field(metadata=dict(static=True), default=())
    # units in a per-seed shuffled order, cycled (and restarted at each stage) instead of drawn by popularity
    cycle: bool = dataclasses.field(metadata=dict(static=True), default=False)
    # the load stages as given: ((requests/s, seconds), ...); () = one rate for the whole run
    rate_stages: tuple[tuple[float, float], ...] = dataclasses.field(metadata=dict(static=True), default=())

    @property
    def stage_mean_rate(self) -> float | None:
        """Time-averaged rate of the stages (requests/s): the `rate` that reproduces them; None without stages."""
        return stage_mean_rate(self.rate_stages)

    @property
    def stage_requests(self) -> int | None:
        """Expected requests within the stages, round(sum rate x seconds); None without stages."""
        return stage_requests(self.rate_stages)

    @property
    def n_segments(self) -> int:
        return self.n_shared + self.n_instances * self.n_slots

    @property
    def max_segments(self) -> int:
        return int(self.unit_seg.shape[2])

    def segment_lengths(self) -> np.ndarray:
        """Lengths no realised run's segments are shorter than, one per segment id: the shared segments'
        own, and the shortest private slot for every instance slot (bounds how many a replica can cache)."""
        slots = np.asarray(self.unit_slot_len)
        shortest = int(slots[slots > 0].min()) if np.any(slots > 0) else 0
        return np.concatenate([np.asarray(self.shared_len), np.full(self.n_instances * self.n_slots, shortest)])

    def step_bound(self, chunk: int) -> int:
        """Upper bound on events: per request, its arrival + its worst (prefill chunks + output - 1)."""
        return self.n_requests * (1 + max(request_steps(p, o, chunk) for p, o in self.request_shapes))

    def max_request_tokens(self) -> int:
        """KV tokens (prompt + output) of the largest request."""
        return max(p + o for p, o in self.request_shapes)

    def realize(self, key: jax.Array, rate: jax.Array) -> RequestTable:
        """Draw one seed's requests: unit arrivals ~ Poisson(rate / requests_per_unit), scaled per load
        stage; unit ~ popularity, or (cycle) a per-seed shuffle of the units, cycled from each stage's start."""
        k_gap, k_unit = jax.random.split(key)
        n_inst, n_r = self.n_instances, self.unit_seg.shape[1]
        unit_rate = rate / self.requests_per_unit
        u = jnp.cumsum(jax.random.exponential(k_gap, (n_inst,)) / unit_rate)
        u = u - u[0]  # reference seconds; the first unit arrives at t = 0
        # Time rescaling through the piecewise-linear M(t); past the last stage its rate continues.
        # With no stages (t0 = m0 = 0, mult = 1) this is t = u exactly.
        stage = jnp.clip(jnp.searchsorted(self.stage_m0, u, side="right") - 1, 0, self.stage_m0.shape[0] - 1)
        starts = self.stage_t0[stage] + (u - self.stage_m0[stage]) / self.stage_mult[stage]
        if self.cycle:
            # inference-perf: prompts pre-shuffled once, then sent in order i % n_prompts; each stage
            # calls get_data() anew, so the cycle restarts at every stage.
            first = jnp.searchsorted(stage, jnp.arange(self.stage_m0.shape[0]), side="left")
            pos = jnp.arange(n_inst) - first[stage]
            units = jax.random.permutation(k_unit, self.unit_prob.shape[0])[pos % self.unit_prob.shape[0]]
        else:
            units = jax.random.categorical(k_unit, jnp.log(self.unit_prob), shape=(n_inst,))
        valid = self.unit_out[units] > 0  # [n_inst, R]
        arr = jnp.where(valid, starts[:, None] + self.unit_offset_s[units], jnp.inf).reshape(-1)
        order = jnp.argsort(arr, stable=True)[: self.n_requests]
        inst, r = order // n_r, order % n_r
        u = units[inst]
        codes, tok = self.unit_seg[u, r], self.unit_tok[u, r]  # [N, S]
        dummy = self.n_segments
        private = self.n_shared + inst[:, None] * self.n_slots + (-1 - codes)
        seg_ids = jnp.where(tok == 0, dummy, jnp.where(codes >= 0, codes, private)).astype(jnp.int32)
        slot = self.unit_out_slot[u, r]
        out_seg = jnp.where(slot >= 0, self.n_shared + inst * self.n_slots + slot, dummy).astype(jnp.int32)
        zero = jnp.zeros((1,), jnp.int32)
        seg_len = jnp.concatenate([self.shared_len, self.unit_slot_len[units].reshape(-1), zero])
        seg_depth = jnp.concatenate([self.shared_depth, self.unit_slot_depth[units].reshape(-1), zero])
        return RequestTable(arr[order].astype(jnp.float32), seg_ids, tok.astype(jnp.int32),
                            self.unit_out[u, r].astype(jnp.int32), out_seg,
                            seg_len.astype(jnp.int32), seg_depth.astype(jnp.int32),
                            jnp.sum(tok, axis=1).astype(jnp.int32), inst.astype(jnp.int32))


@dataclasses.dataclass
class _Unit:
    """Host-side unit under construction: requests of (codes, tokens, out, out_slot, offset)."""

    requests: list = dataclasses.field(default_factory=list)
    slot_len: list = dataclasses.field(default_factory=list)


def _build(name: str, units: list[_Unit], prob: np.ndarray, shared_len: np.ndarray,
           n_requests: int, cycle: bool = False) -> SyntheticPrefixWorkload:
    n_u = len(units)
    n_r = max(len(u.requests) for u in units)
    n_s = max(len(req[0]) for u in units for req in u.requests)
    n_k = max(1, max(len(u.slot_len) for u in units))
    seg = np.zeros((n_u, n_r, n_s), np.int32)
    tok = np.zeros((n_u, n_r, n_s), np.int32)
    out = np.zeros((n_u, n_r), np.int32)
    out_slot = np.full((n_u, n_r), -1, np.int32)
    offset = np.zeros((n_u, n_r), np.float32)
    slot_len = np.zeros((n_u, n_k), np.int32)
    slot_depth = np.zeros((n_u, n_k), np.int32)
    shared_depth = np.zeros(len(shared_len), np.int32)
    shapes = set()
    for ui, u in enumerate(units):
        slot_len[ui, : len(u.slot_len)] = u.slot_len
        for ri, (codes, toks, o, oslot, off) in enumerate(u.requests):
            seg[ui, ri, : len(codes)] = codes
            tok[ui, ri, : len(codes)] = toks
            out[ui, ri], out_slot[ui, ri], offset[ui, ri] = o, oslot, off
            for d, c in enumerate(codes):
                if c >= 0:
                    shared_depth[c] = d
                else:
                    slot_depth[ui, -1 - c] = d
            if oslot >= 0:
                slot_depth[ui, oslot] = len(codes)
            shapes.add((int(sum(toks)), int(o)))
    n_per_unit = np.array([len(u.requests) for u in units], np.float64)
    mean_r = float((prob * n_per_unit).sum())
    n_inst = math.ceil(n_requests / n_per_unit.min()) + 1
    return SyntheticPrefixWorkload(
        jnp.asarray(prob, jnp.float32), jnp.asarray(seg), jnp.asarray(tok), jnp.asarray(out),
        jnp.asarray(out_slot), jnp.asarray(offset), jnp.asarray(slot_len), jnp.asarray(slot_depth),
        jnp.asarray(shared_len, jnp.int32), jnp.asarray(shared_depth),
        name=name, n_requests=n_requests, n_instances=n_inst, n_shared=len(shared_len), n_slots=n_k,
        requests_per_unit=mean_r, request_shapes=tuple(sorted(shapes)), cycle=cycle)


def _single_question(name, sys_len, item_len, item_prob, question_len, out, n_requests) -> SyntheticPrefixWorkload:
    """Units of one request: [system prompt, item i, private question]."""
    n = len(item_len)
    shared = np.concatenate([[sys_len], item_len])
    units = []
    for i in range(n):
        q = int(question_len[i])
        units.append(_Unit(requests=[([0, 1 + i, -1], [sys_len, int(item_len[i]), q], out, -1, 0.0)], slot_len=[q]))
    return _build(name, units, item_prob, shared, n_requests)


def longdoc(n_requests: int, n_docs: int = 300, doc_mean: int = 21_000, zipf_s: float = 1.1,
            question_frac: float = 0.09, question_spread: float = 0.05, output_tokens: int = 45,
            sys_tokens: int = 13, structure_seed: int = 0) -> SyntheticPrefixWorkload:
    """Long-document QA (LooGLE-like): the question of document d is a fraction f_d of the whole
    prompt, f_d ~ U(question_frac -/+ question_spread) per document (mean 9 %)."""
    rng = np.random.default_rng(structure_seed)
    docs = _lognormal_lengths(rng, n_docs, doc_mean, 0.4, 4_000, 60_000)
    frac = rng.uniform(question_frac - question_spread, question_frac + question_spread, n_docs)
    if not (0 < frac.min() and frac.max() < 1):
        raise JaxrouteError("question_frac -/+ question_spread must stay inside (0, 1)")
    q = np.maximum(1, np.round(frac / (1 - frac) * (sys_tokens + docs))).astype(np.int64)
    return _single_question("longdoc", sys_tokens, docs, _zipf(n_docs, zipf_s), q, output_tokens, n_requests)


def toolbench(n_requests: int, n_tools: int = 500, tool_mean: int = 1_500, zipf_s: float = 1.1,
              question_tokens: int = 130, output_tokens: int = 43, sys_tokens: int = 300,
              hot_tool_share: float = 0.0, structure_seed: int = 0) -> SyntheticPrefixWorkload:
    """Tool calling: tool descriptions shared across questions; tool 0 optionally takes `hot_tool_share`.

    The system prompt is 10-32 % of every prompt (mean ~16 %): a match on it alone passes theta = 0.1.
    """
    if not 0.0 <= hot_tool_share < 1.0:
        raise JaxrouteError(f"hot_tool_share must be in [0, 1), got {hot_tool_share}")
    rng = np.random.default_rng(structure_seed)
    tools = _lognormal_lengths(rng, n_tools, tool_mean, 0.3, 600, 2_500)
    prob = _zipf(n_tools, zipf_s)
    if hot_tool_share > 0:
        prob = np.concatenate([[hot_tool_share], (1 - hot_tool_share) * _zipf(n_tools - 1, zipf_s)])
    q = np.full(n_tools, question_tokens)
    return _single_question("toolbench", sys_tokens, tools, prob, q, output_tokens, n_requests)


def videoqa(n_requests: int, n_videos: int = 200, video_mean: int = 8_700, zipf_s: float = 1.1,
            question_tokens: int = 1_150, output_tokens: int = 4, sys_tokens: int = 13,
            structure_seed: int = 0) -> SyntheticPrefixWorkload:
    """Video QA: a long shared video prefix, short questions and very short answers."""
    rng = np.random.default_rng(structure_seed)
    vids = _lognormal_lengths(rng, n_videos, video_mean, 0.3, 2_000, 30_000)
    q = np.full(n_videos, question_tokens)
    return _single_question("videoqa", sys_tokens, vids, _zipf(n_videos, zipf_s), q, output_tokens, n_requests)


def programming(n_requests: int, n_problems: int = 1_000, problem_mean: int = 3_700, samples: int = 8,
                sample_tokens: int = 100, output_tokens: int = 190, sys_tokens: int = 13,
                structure_seed: int = 0) -> SyntheticPrefixWorkload:
    """Code generation: `samples` parallel samples of one problem arrive together (long outputs)."""
    rng = np.random.default_rng(structure_seed)
    probs = _lognormal_lengths(rng, n_problems, problem_mean, 0.3, 500, 16_000)
    shared = np.concatenate([[sys_tokens], probs])
    units = []
    for i in range(n_problems):
        reqs = [([0, 1 + i, -1 - j], [sys_tokens, int(probs[i]), sample_tokens], output_tokens, -1, 0.0)
                for j in range(samples)]
        units.append(_Unit(requests=reqs, slot_len=[sample_tokens] * samples))
    return _build("programming", units, np.full(n_problems, 1.0 / n_problems), shared, n_requests)


def agent(n_requests: int, n_envs: int = 50, env_mean: int = 600, turns: int = 6, obs_tokens: int = 150,
          output_tokens: int = 16, sys_tokens: int = 1_200, think_s: float = 5.0, zipf_s: float = 1.1,
          structure_seed: int = 0) -> SyntheticPrefixWorkload:
    """Multi-turn agent: turn t's prompt = system + environment + (obs, output) of turns < t + obs t."""
    rng = np.random.default_rng(structure_seed)
    envs = _lognormal_lengths(rng, n_envs, env_mean, 0.3, 100, 4_000)
    shared = np.concatenate([[sys_tokens], envs])
    units = []
    for e in range(n_envs):
        reqs, slot_len = [], []
        codes, toks = [0, 1 + e], [sys_tokens, int(envs[e])]
        for t in range(turns):
            obs, out = 2 * t, 2 * t + 1  # private slots
            codes, toks = codes + [-1 - obs], toks + [obs_tokens]
            reqs.append((list(codes), list(toks), output_tokens, out, t * think_s))
            slot_len += [obs_tokens, output_tokens]
            codes, toks = codes + [-1 - out], toks + [output_tokens]
        units.append(_Unit(requests=reqs, slot_len=slot_len))
    return _build("agent", units, _zipf(n_envs, zipf_s), shared, n_requests)


# SP_DEFAULTS (workloads/names.py): inference-perf's SharedPrefix defaults; the generator in
# inference_perf/datagen/synthetic/shared_prefix_datagen.py.


def shared_prefix(n_requests: int, groups: int = 10, prompts_per_group: int = 10, system_tokens=100,
                  question_tokens=50, output_tokens=50, private_questions: bool = False) -> SyntheticPrefixWorkload:
    """inference-perf's `shared_prefix` data: `groups` system prompts, `prompts_per_group` questions each.

    As in inference-perf's SharedPrefixDataGenerator: groups x prompts_per_group fixed prompts
    [system prompt of its group, its question] (shared_prefix_datagen.py lines 249-270) are shuffled
    once (line 290; per seed here, as with inference-perf's default seed None) and sent in order,
    request i getting prompt i % (groups x prompts_per_group) (line 154): every prompt, question
    included, recurs once per cycle. The output is not part of any later prompt. A length is one number
    for all, or one per group (system_tokens, [groups]) or per prompt (question_tokens and output_tokens,
    [groups x prompts_per_group], group-major), as inference-perf samples them from its distributions
    (shared_prefix_datagen.py lines 100-114; `workloads.inference_perf`). `private_questions=True` gives
    every request a fresh question instead (no question ever recurs).
    """
    for label, v in (("groups", groups), ("prompts_per_group", prompts_per_group)):
        if int(v) != v or v < 1:
            raise JaxrouteError(f"shared-prefix {label} must be a positive integer, got {v}")
    n = groups * prompts_per_group
    sys_len = _lengths("system_tokens", system_tokens, groups)
    q_len = _lengths("question_tokens", question_tokens, n)
    out_len = _lengths("output_tokens", output_tokens, n)
    shared = list(sys_len) + ([] if private_questions else list(q_len))
    units = []
    for g in range(groups):
        for p in range(prompts_per_group):
            k = g * prompts_per_group + p
            q = -1 if private_questions else groups + k
            units.append(_Unit(requests=[([g, q], [int(sys_len[g]), int(q_len[k])], int(out_len[k]), -1, 0.0)],
                               slot_len=[int(q_len[k])] if private_questions else []))
    return _build("shared-prefix", units, np.full(n, 1.0 / n), np.asarray(shared), n_requests, cycle=True)


def _lengths(label: str, value, count: int) -> np.ndarray:
    """[count] positive whole token counts from one number or `count` of them."""
    v = np.atleast_1d(np.asarray(value, dtype=np.float64))
    if v.ndim != 1 or len(v) not in (1, count):
        raise JaxrouteError(f"shared-prefix {label} must be one number or {count}, got {len(v)}")
    if not np.all(np.isfinite(v)) or np.any(v < 1) or np.any(v != np.round(v)):
        bad = v[~(np.isfinite(v) & (v >= 1) & (v == np.round(v)))][0]
        raise JaxrouteError(f"shared-prefix {label} must be a positive integer, got {bad:g}")
    return np.broadcast_to(v.astype(np.int64), (count,))


def private_prompts(n_requests: int, prompt_tokens, output_tokens, name: str = "random") -> SyntheticPrefixWorkload:
    """Prompts that share nothing (inference-perf's `random` and `synthetic` data: fresh random tokens per
    request), lengths[i] for the i-th request of a cycle, cycled from each load stage's start."""
    p = _lengths("prompt_tokens", prompt_tokens, len(np.atleast_1d(prompt_tokens)))
    o = _lengths("output_tokens", output_tokens, len(p))
    units = [_Unit(requests=[([-1], [int(a)], int(b), -1, 0.0)], slot_len=[int(a)]) for a, b in zip(p, o, strict=True)]
    return _build(name, units, np.full(len(p), 1.0 / len(p)), np.zeros(0, np.int64), n_requests, cycle=True)


def with_rate_stages(workload: SyntheticPrefixWorkload, stages) -> SyntheticPrefixWorkload:
    """The workload with staged Poisson load: stages = [(requests/s, seconds), ...], run in order (a trace:
    its recorded arrivals time-warped to the stages, `adapters.warp_to_stages`).

    Realize it at `rate = workload.stage_mean_rate` for the stages as given (another rate scales every
    stage by rate / stage_mean_rate). Arrivals past the last stage continue at its rate, so a run of
    more requests than the stages hold goes on at that rate, and a run of fewer ends early.
    """
    from jaxroute.workloads.prefix.adapters import TracePrefixWorkload, warp_to_stages

    if isinstance(workload, TracePrefixWorkload):
        return warp_to_stages(workload, stages)
    if not isinstance(workload, SyntheticPrefixWorkload):
        raise JaxrouteError("load stages apply to synthetic workloads and traces")
    stages = list(check_stages(stages))
    rates, secs = np.array([r for r, _ in stages]), np.array([d for _, d in stages])
    mult = rates / ((rates * secs).sum() / secs.sum())
    t0 = np.concatenate([[0.0], np.cumsum(secs)[:-1]])
    m0 = np.concatenate([[0.0], np.cumsum(mult * secs)[:-1]])
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    return dataclasses.replace(workload, stage_t0=f32(t0), stage_m0=f32(m0), stage_mult=f32(mult),
                               rate_stages=tuple(stages))


SYNTHETIC = {"longdoc": longdoc, "toolbench": toolbench, "agent": agent, "programming": programming,
             "videoqa": videoqa, "shared-prefix": shared_prefix}


def synthetic(name: str, n_requests: int, **kwargs) -> SyntheticPrefixWorkload:
    """Build a built-in synthetic workload by name (see the module table for parameters)."""
    if name not in SYNTHETIC:
        raise JaxrouteError(f"unknown prefix workload '{name}'; choose from: {', '.join(PREFIX_WORKLOADS)}")
    if n_requests < 1:
        raise JaxrouteError(f"need at least 1 request, got {n_requests}")
    return SYNTHETIC[name](n_requests, **kwargs)
