"""An inference-perf run as it sends: requests in a fixed order, stage by stage, at its load timers' times.

`workloads.inference_perf` reads the config; this module is its JAX side (`inference_perf.workload` builds
it for multi-turn chat, and for any config with `timer=True`). Sources: kubernetes-sigs/inference-perf at
7de5ef2, cited file:line.

Send order. Stage s sends int(rate x duration) requests (loadgen/load_generator.py:771, 785-795), and its
data generator restarts at data index 0 (`get_data()` is called anew per stage, load_generator.py:777;
the index counts up from 0, datagen/synthetic/shared_prefix_datagen.py:189-193). So which prompt request
i of a stage carries is fixed by i, and the row order of this workload is that send order:

- shared_prefix: prompt (i mod N) of the N = groups x prompts_per_group prompts, which the generator
  shuffles once (shared_prefix_datagen.py:290-296; that permutation consumes the generator's numpy state
  after the tokenizer-dependent token sampling, so it cannot be reproduced here: every seed draws its own
  uniform permutation of the N users, `shuffle`);
- multi-turn chat (`enable_multi_turn_chat`): user u = i mod N, round k = i // N
  (shared_prefix_datagen.py:174-182). The prompt of round k is the user's whole conversation so far followed
  by its prompt again: `to_request_body` sends context + " " + prompt (apis/user_session.py:210) and
  `process_response` keeps prompt + " " + answer as the next context (user_session.py:223, 113-114). The
  session starts empty: the generator's `LocalUserSession(context=<system prompt>)` objects are never
  registered in `LocalUserSession._instances`, and `get_instance` makes a fresh one with context ""
  (user_session.py:55-59; compare conversation_replay_datagen.py:282, which registers them), so round 0
  sends just the prompt, and the prompt that every round re-sends is the whole system prompt + question
  (shared_prefix_datagen.py:265-268 builds it as one text). Round k's prompt is therefore
      [system, question, answer_0, system+question, answer_1, ..., answer_(k-1), system+question]
  with (k+1) x (system + question) + k x output tokens; round k shares round k-1's prompt and answer as
  its prefix. Conversations restart at every stage: the workers clear the sessions at a stage's end
  (load_generator.py:260, 1178);
- random / synthetic: lengths[i] (datagen/synthetic/random_datagen.py:139-151), a fresh private prompt.

Segments (`workloads.prefix.types`): ids [0, G) are the groups' system prompts, [G, G+N) the N questions
(shared by every request of that prompt: its first two segments), then private ids per row j: 2j its
answer (kept in the cache as the row's `out_seg`, multi-turn only) and 2j+1 the system+question it
re-sends (rounds >= 1); random data: id j is row j's prompt.

Send times (`inference_perf.constant_offsets` / `poisson_offsets`, the same functions on jax.numpy): the
`constant` timer spreads the stage's n requests by n exponential gaps rescaled to sum to the duration,
so the last one is sent at exactly the stage's end (loadgen/load_timer.py:48-65); the `poisson` timer
draws a Poisson(rate) count per second and spreads each count the same way over its second, skipping
empty seconds (load_timer.py:78-97), so a stage lasts about n / rate seconds, not exactly its duration.
Stages are laid end to end from t = 0 at their nominal durations (inference-perf starts a stage's timer
1 s after the previous stage drained and slept `interval`, load_generator.py:766, 802-841, 1090-1091, which
a simulation whose requests do not feed back cannot know): a constant stage's last send, at exactly its
end, is kept one float32 step inside it so `experiments.requests.stage_of` counts it in its own stage; a
poisson stage that runs past its end overlaps the next (its late requests then count in the next stage's
window). `realize(key, rate)` scales every time by stage_mean_rate / rate (the stages as given at
`stage_mean_rate`, as the other staged workloads).

Not modelled here (`inference_perf` says so in a load's notes and gives the numpy checks): a user's round
waits for its previous round's answer (user_session.py:71-82) and the client holds at most its worker
slots (load_generator.py:131, 161); here every request arrives at its timer's time.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute.errors import JaxrouteError
from jaxroute.workloads.inference_perf import constant_offsets, poisson_offsets
from jaxroute.workloads.prefix.types import (
    RequestTable,
    check_stages,
    request_steps,
    stage_mean_rate,
    stage_requests,
)

PAD, SYSTEM, QUESTION, ANSWER, RESENT, PRIVATE = 0, 1, 2, 3, 4, 5  # what a template entry holds
LOAD_TYPES = ("constant", "poisson")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TimedStagesWorkload:
    """Template rows in send order (segments by kind, resolved per seed through the user permutation) and the
    stages' timers; `realize(key, rate)` draws one seed's send times and users."""

    tpl_kind: jax.Array  # [N, S] int32 PAD / SYSTEM / QUESTION / ANSWER / RESENT / PRIVATE
    tpl_priv: jax.Array  # [N, S] int32 private id of an ANSWER / RESENT / PRIVATE entry (else 0)
    tpl_slot: jax.Array  # [N] int32 user slot of the row (user = permutation[slot]; 0 without users)
    tpl_out_priv: jax.Array  # [N] int32 private id the output is kept as (-1: not kept)
    tpl_out_tok: jax.Array  # [N] int32 output tokens fixed per row (random data); 0: the user's
    tpl_session: jax.Array  # [N] int32 conversation (multi-turn: stage x users + slot) or the row
    priv_kind: jax.Array  # [P] int32 ANSWER / RESENT / PRIVATE
    priv_row: jax.Array  # [P] int32 the row that owns the private id
    priv_tok: jax.Array  # [P] int32 tokens of a PRIVATE id (0 otherwise)
    priv_depth: jax.Array  # [P] int32 tree depth of the private id
    group_sys: jax.Array  # [G] int32 system prompt tokens per group
    user_group: jax.Array  # [U] int32 group of user k (group-major: k // prompts_per_group)
    user_q: jax.Array  # [U] int32 question tokens of user k
    user_out: jax.Array  # [U] int32 output tokens of user k
    name: str = dataclasses.field(metadata=dict(static=True), default="inference-perf")
    n_requests: int = dataclasses.field(metadata=dict(static=True), default=0)
    rate_stages: tuple[tuple[float, float], ...] = dataclasses.field(metadata=dict(static=True), default=())
    stage_counts: tuple[int, ...] = dataclasses.field(metadata=dict(static=True), default=())
    load_type: str = dataclasses.field(metadata=dict(static=True), default="constant")
    shuffle: bool = dataclasses.field(metadata=dict(static=True), default=True)
    multi_turn: bool = dataclasses.field(metadata=dict(static=True), default=False)
    # (rows, ((prompt, output), ...)): groups of rows and the shapes any of their rows can take (step bounds)
    shape_groups: tuple = dataclasses.field(metadata=dict(static=True), default=())

    # ------------------------------------------------------------------ sizes and bounds (static, host side)
    @property
    def n_groups(self) -> int:
        return int(self.group_sys.shape[0])

    @property
    def n_users(self) -> int:
        return int(self.user_q.shape[0])

    @property
    def n_shared(self) -> int:
        return self.n_groups + self.n_users

    @property
    def n_segments(self) -> int:
        return self.n_shared + int(self.priv_kind.shape[0])

    @property
    def max_segments(self) -> int:
        return int(self.tpl_kind.shape[1])

    @property
    def stage_mean_rate(self) -> float | None:
        """Time-averaged rate of the stages: the `rate` that sends them as given."""
        return stage_mean_rate(self.rate_stages)

    @property
    def stage_requests(self) -> int | None:
        return stage_requests(self.rate_stages)

    @property
    def request_shapes(self) -> tuple[tuple[int, int], ...]:
        return tuple(sorted({s for _, shapes in self.shape_groups for s in shapes}))

    def segment_lengths(self) -> np.ndarray:
        """Lengths no realised run's segments are shorter than, one per segment id."""
        kind = np.asarray(self.priv_kind)
        fixed = np.asarray(self.priv_tok)
        out = np.asarray(self.user_out)
        prompt = np.asarray(self.group_sys)[np.asarray(self.user_group)] + np.asarray(self.user_q)
        low_out = int(out.min()) if out.size else 0
        low_prompt = int(prompt.min()) if prompt.size else 0
        priv = np.where(kind == ANSWER, low_out, np.where(kind == RESENT, low_prompt, fixed))
        return np.concatenate([np.asarray(self.group_sys), np.asarray(self.user_q), priv]).astype(np.int64)

    def step_bound(self, chunk: int) -> int:
        """Upper bound on events: per row, its arrival + the worst (prefill chunks + output - 1) it can take."""
        return sum(n * (1 + max(request_steps(p, o, chunk) for p, o in shapes)) for n, shapes in self.shape_groups)

    def max_request_tokens(self) -> int:
        """KV tokens (prompt + output) of the largest request."""
        return max(p + o for p, o in self.request_shapes)

    # ------------------------------------------------------------------ one seed
    def send_times(self, key: jax.Array) -> jax.Array:
        """[N] float32 send times of the template rows (template order), stages end to end from t = 0."""
        keys = jax.random.split(key, len(self.rate_stages))
        start, times = 0.0, []
        for (rate, seconds), n, k in zip(self.rate_stages, self.stage_counts, keys, strict=True):
            if self.load_type == "constant":
                off = constant_offsets(jax.random.exponential(k, (n,), jnp.float32), jnp.float32(seconds), jnp)
                t = jnp.float32(start) + off
                # the last send falls at the stage's end exactly: keep it inside the stage's window
                t = jnp.minimum(t, np.nextafter(np.float32(start + seconds), np.float32(-np.inf)))
            else:
                secs, cap = poisson_bounds(rate, n)
                k_count, k_gap = jax.random.split(k)
                counts = jax.random.poisson(k_count, rate, (secs,))
                gaps = jax.random.exponential(k_gap, (n + cap,), jnp.float32)
                t = jnp.float32(start) + poisson_offsets(counts, gaps, n, rate, jnp)
            times.append(t.astype(jnp.float32))
            start += seconds
        return jnp.concatenate(times)

    def realize(self, key: jax.Array, rate: jax.Array) -> RequestTable:
        """One seed's requests: send times by the stages' timers, users by a per-seed permutation (shuffle)."""
        k_time, k_perm = jax.random.split(key)
        ref = float(self.stage_mean_rate)
        scale = jnp.where(rate > 0, jnp.float32(ref) / jnp.where(rate > 0, rate, 1.0), 1.0)
        t = self.send_times(k_time) * scale
        order = jnp.argsort(t, stable=True)
        dummy = self.n_segments
        G, U = self.n_groups, self.n_users
        kind, priv = self.tpl_kind, self.tpl_priv
        if U:
            users = jax.random.permutation(k_perm, U)[self.tpl_slot] if self.shuffle else self.tpl_slot
            g = self.user_group[users]
            sys_t, q_t, out_u = self.group_sys[g][:, None], self.user_q[users][:, None], self.user_out[users]
            owner = users[self.priv_row]
            owner_prompt = self.group_sys[self.user_group[owner]] + self.user_q[owner]
            priv_len = jnp.where(self.priv_kind == ANSWER, self.user_out[owner],
                                 jnp.where(self.priv_kind == RESENT, owner_prompt, self.priv_tok))
        else:
            g = users = jnp.zeros_like(self.tpl_slot)
            sys_t = q_t = jnp.zeros_like(self.tpl_slot)[:, None]
            out_u = jnp.zeros_like(self.tpl_slot)
            priv_len = self.priv_tok
        fixed = self.priv_tok[priv] if self.priv_tok.shape[0] else jnp.zeros_like(priv)
        tok = jnp.select([kind == SYSTEM, kind == QUESTION, kind == ANSWER, kind == RESENT, kind == PRIVATE],
                         [sys_t, q_t, out_u[:, None], sys_t + q_t, fixed], 0)
        ids = jnp.select([kind == SYSTEM, kind == QUESTION, kind == PAD],
                         [g[:, None], G + users[:, None], dummy], self.n_shared + priv)
        out = jnp.where(self.tpl_out_tok > 0, self.tpl_out_tok, out_u)
        out_seg = jnp.where(self.tpl_out_priv >= 0, self.n_shared + self.tpl_out_priv, dummy)
        zero = jnp.zeros((1,), jnp.int32)
        seg_len = jnp.concatenate([self.group_sys, self.user_q, priv_len, zero]).astype(jnp.int32)
        seg_depth = jnp.concatenate([jnp.zeros((G,), jnp.int32), jnp.ones((U,), jnp.int32), self.priv_depth,
                                     zero]).astype(jnp.int32)
        return RequestTable(t[order].astype(jnp.float32), ids[order].astype(jnp.int32), tok[order].astype(jnp.int32),
                            out[order].astype(jnp.int32), out_seg[order].astype(jnp.int32), seg_len, seg_depth,
                            jnp.sum(tok, axis=1)[order].astype(jnp.int32), self.tpl_session[order].astype(jnp.int32))


def poisson_bounds(rate: float, n: int) -> tuple[int, int]:
    """(seconds, extra gaps) drawn for a poisson stage of n sends: enough seconds that their Poisson(rate)
    counts reach n but with probability ~1e-20, and gaps for the last, partly used second (its count
    beyond rate + 10 sqrt(rate) + 10 has about the same probability; `poisson_offsets` then normalises it
    over the gaps drawn)."""
    secs = math.ceil((n + 10 * math.sqrt(n) + 10) / rate) + 2
    return secs, math.ceil(rate + 10 * math.sqrt(rate) + 10)


def _template(counts, users: int, multi_turn: bool):
    """(stage, slot, round, row) per row, in send order: request i of stage s is user slot i mod users,
    round i // users (multi-turn; 0 otherwise)."""
    stage = np.repeat(np.arange(len(counts)), counts)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    i = np.arange(int(sum(counts))) - first[stage]
    slot = i % users
    rnd = i // users if multi_turn else np.zeros_like(i)
    return stage, slot, rnd, first


def shared_prefix_stages(stages, counts, load_type: str, groups: int, prompts_per_group: int, system_tokens,
                         question_tokens, output_tokens, multi_turn: bool = False,
                         name: str = "shared-prefix") -> TimedStagesWorkload:
    """inference-perf's shared_prefix data as sent (see the module docstring): `system_tokens` [groups],
    `question_tokens` and `output_tokens` [groups x prompts_per_group] group-major; `counts` the requests
    of each stage; multi-turn: request i of a stage is round i // N of user i mod N."""
    stages, counts = _check(stages, counts, load_type)
    n_users = groups * prompts_per_group
    sys_len = _lengths("system_tokens", system_tokens, groups)
    q_len = _lengths("question_tokens", question_tokens, n_users)
    out_len = _lengths("output_tokens", output_tokens, n_users)
    stage, slot, rnd, first = _template(counts, n_users, multi_turn)
    n = len(stage)
    rows = np.arange(n)
    r_max = int(rnd.max())
    kind = np.zeros((n, 2 + 2 * r_max), np.int32)
    priv = np.zeros_like(kind)
    kind[:, 0], kind[:, 1] = SYSTEM, QUESTION
    for m in range(1, r_max + 1):  # round m adds the answer of round m-1 and the re-sent prompt of round m
        on = rnd >= m
        owner = first[stage[on]] + slot[on]
        kind[on, 2 * m], priv[on, 2 * m] = ANSWER, 2 * (owner + (m - 1) * n_users)
        kind[on, 2 * m + 1], priv[on, 2 * m + 1] = RESENT, 2 * (owner + m * n_users) + 1
    if multi_turn:
        p_kind = np.tile(np.array([ANSWER, RESENT], np.int32), n)
        p_row = np.repeat(rows, 2)
        p_depth = np.stack([2 + 2 * rnd, 1 + 2 * rnd], axis=1).reshape(-1)
        out_priv, session = 2 * rows, stage * n_users + slot
    else:
        p_kind = p_row = p_depth = np.zeros(0, np.int64)
        out_priv, session = np.full(n, -1), rows
    # shape groups for the step bound: the rows of one round can be any user's round
    prompt_u = sys_len[np.arange(n_users) // prompts_per_group] + q_len
    shape_groups = tuple((int(np.sum(rnd == r)), tuple(sorted({(int((r + 1) * p + r * o), int(o))
                                                                for p, o in zip(prompt_u, out_len, strict=True)})))
                         for r in range(r_max + 1) if np.any(rnd == r))
    i32 = lambda x: jnp.asarray(np.asarray(x), jnp.int32)
    return TimedStagesWorkload(
        i32(kind), i32(priv), i32(slot), i32(out_priv), i32(np.zeros(n)), i32(session), i32(p_kind), i32(p_row),
        i32(np.zeros(len(p_kind))), i32(p_depth), i32(sys_len), i32(np.arange(n_users) // prompts_per_group),
        i32(q_len), i32(out_len), name=name, n_requests=n, rate_stages=stages, stage_counts=counts,
        load_type=load_type, shuffle=True, multi_turn=multi_turn, shape_groups=shape_groups)


def private_prompt_stages(stages, counts, load_type: str, prompt_tokens, output_tokens,
                          name: str = "random") -> TimedStagesWorkload:
    """inference-perf's random / synthetic data as sent: request i of a stage has prompt_tokens[i] fresh tokens
    and output_tokens[i] (random_datagen.py:139-151, indexed from each stage's start)."""
    stages, counts = _check(stages, counts, load_type)
    p = _lengths("prompt_tokens", prompt_tokens, len(np.atleast_1d(prompt_tokens)))
    o = _lengths("output_tokens", output_tokens, len(p))
    if max(counts) > len(p):
        raise JaxrouteError(f"a stage sends {max(counts)} requests but {len(p)} lengths were given")
    stage, _, _, first = _template(counts, 1, False)
    n = len(stage)
    i = np.arange(n) - first[stage]
    shapes = {}
    for a, b in zip(p[i].tolist(), o[i].tolist(), strict=True):
        shapes[(a, b)] = shapes.get((a, b), 0) + 1
    i32 = lambda x: jnp.asarray(np.asarray(x), jnp.int32)
    z = np.zeros(0)
    return TimedStagesWorkload(
        i32(np.full((n, 1), PRIVATE)), i32(np.arange(n)[:, None]), i32(np.zeros(n)), i32(np.full(n, -1)),
        i32(o[i]), i32(np.arange(n)), i32(np.full(n, PRIVATE)), i32(np.arange(n)), i32(p[i]), i32(np.zeros(n)),
        i32(z), i32(z), i32(z), i32(z), name=name, n_requests=n, rate_stages=stages, stage_counts=counts,
        load_type=load_type, shuffle=False, multi_turn=False,
        shape_groups=tuple((c, (s,)) for s, c in sorted(shapes.items())))


def _check(stages, counts, load_type):
    stages = check_stages(stages)
    counts = tuple(int(c) for c in counts)
    if len(counts) != len(stages) or min(counts) < 1:
        raise JaxrouteError(f"need one request count >= 1 per load stage, got {list(counts)} for {len(stages)} stages")
    if load_type not in LOAD_TYPES:
        raise JaxrouteError(f"load type '{load_type}' has no timer here; choose {' or '.join(LOAD_TYPES)}")
    return stages, counts


def _lengths(label: str, value, count: int) -> np.ndarray:
    v = np.atleast_1d(np.asarray(value, dtype=np.float64))
    if v.ndim != 1 or len(v) not in (1, count):
        raise JaxrouteError(f"{label} must be one number or {count}, got {len(v)}")
    if not np.all(np.isfinite(v)) or np.any(v < 1) or np.any(v != np.round(v)):
        raise JaxrouteError(f"{label} must be positive whole token counts")
    return np.broadcast_to(v.astype(np.int64), (count,)).copy()
