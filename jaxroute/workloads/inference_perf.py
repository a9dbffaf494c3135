"""An inference-perf `config.yml` read as it is: its `data` and `load` sections as a jaxroute workload.

inference-perf (github.com/kubernetes-sigs/inference-perf, read at commit 7de5ef2; `file:line` below is that
commit's inference_perf/ tree) is the load generator llm-d and the Gateway API inference extension benchmark
with. Its config is validated by pydantic models (`config/`); this module mirrors the parts that decide the
requests, how the client paces and cuts them, and refuses, in one line, what the simulator cannot model. A
`results/config.yaml` as inference-perf writes it (`reportgen/base.py:743-751`, the whole model dumped with
its nulls) reads as the config it was written from.

Data:
- `data.type: shared_prefix` (`config/datagen/config.py:46-102` `SharedPrefix`): groups
  (`num_unique_system_prompts`, alias `num_groups`) x prompts per group (`num_users_per_system_prompt`,
  alias `num_prompts_per_group`); `system_prompt_len`, `question_len`, `output_len` a number or a
  `Distribution`. Lengths are sampled as `SharedPrefixDataGenerator.__init__` does
  (`datagen/synthetic/shared_prefix_datagen.py:89-114`: one numpy Generator seeded with `shared_prefix.seed`,
  the groups' system lengths first, then per group its questions' and outputs' lengths) with
  `utils/numeric/distribution/utils.py:112-179` `sample_from_distribution`. The N = groups x prompts
  prompts are shuffled once (shared_prefix_datagen.py:290-296) and request i of a stage sends prompt
  i mod N (line 154), the index restarting at 0 each stage (`get_data`, lines 185-193, called per stage at
  `loadgen/load_generator.py:777`).
- `enable_multi_turn_chat` (config.py:83-85): request i of a stage is round i // N of user i mod N
  (shared_prefix_datagen.py:174-182); round k's prompt is the user's conversation so far (its earlier
  prompts and answers) followed by its prompt (system prompt + question) again, so it holds
  (k+1) x (system + question) + k x output tokens and shares round k-1's prompt and answer as its prefix
  (`apis/user_session.py:55-59, 106-114, 210, 223`; the rules and why in `workloads.timed_stages`). Each
  user's requests go to one worker, (i mod groups) mod num_workers (shared_prefix_datagen.py:191,
  load_generator.py:789-791, one queue per worker: 941-943), and a round waits for the user's previous
  answer before it is sent (user_session.py:71-82; the wait is before the request's start time is taken,
  `client/modelserver/openai_client.py:364, 413`).
- `data.type: random` / `synthetic` (`datagen/synthetic/random_datagen.py:43-70`, `synthetic_datagen.py:54-73`):
  `input_distribution` / `output_distribution` with `total_count` lengths drawn by `generate_distribution`
  (utils.py:26-96); request i of a stage gets lengths[i] (random_datagen.py:139-161, restarting per stage)
  and a prompt of fresh random tokens: nothing is shared.

Load:
- `load.type: constant` / `poisson` with `stages` of `rate` (requests/s) and `duration` (s)
  (`config/loadgen/config.py:39-55` `StandardLoadStage`): each stage sends int(rate x duration) requests
  (load_generator.py:771, 785-795), so the run holds their sum. The send times (`stage_send_times`):
  the `constant` timer is not evenly spaced: it draws int(rate x d) exponential gaps and rescales them to sum
  to d, so the sends are spread like a Poisson process's and the last is at exactly the stage's end
  (`loadgen/load_timer.py:36-65`); the `poisson` timer draws a Poisson(rate) count for each second and spreads
  that count over the second the same way (a fresh constant timer per second), skipping empty seconds
  (load_timer.py:68-97), so a stage takes about int(rate x d) / rate seconds, not exactly d. Both timers use an
  unseeded numpy Generator (load_timer.py:46, 76): a run's times cannot be reproduced, only their law. The
  timer of a stage starts 1 s after the stage begins (load_generator.py:766); a stage ends when its requests
  have finished (lines 802-841), then the client sleeps `interval` s (lines 1090-1091).
- `workload(load)` sends a single-turn config's requests as jaxroute's staged Poisson process at the stage
  rates (`workloads.prefix.with_rate_stages`, the same as `--rate-stages`, so `flags()` reproduces it);
  `workload(load, timer=True)`, and every multi-turn config, sends them in inference-perf's order at its
  timers' times (`workloads.timed_stages`). Either way the stages follow each other at once, with no drain.

The client (`ClientLimits`, `load.client`):
- concurrency: each of `num_workers` worker processes takes a request from the queue only while it holds one
  of its `worker_max_concurrency` semaphore slots, and keeps the slot until the request has finished
  (load_generator.py:131, 161, 225); its aiohttp session opens at most `worker_max_tcp_connections`
  connections (openai_client.py:208-210, main.py:204; aiohttp's `TCPConnector(limit=0)` means no limit, connector.py:406).
  So at most num_workers x min(worker_max_concurrency, worker_max_tcp_connections) requests are held at once
  (multi-turn: per worker, and only min(groups, num_workers) workers get any). `num_workers` defaults to the
  client machine's CPU count (config/loadgen/config.py:173-176), unknown here; 0 runs the single-process
  loop with no semaphore (load_generator.py:1097-1099, 1132-1156), which also stops sending a stage at its
  duration (line 1147). jaxroute does not hold requests back: `ClientLimits.over_cap` counts the simulated
  requests that would have waited for a slot.
- timeouts: `load.request_timeout` becomes an aiohttp `ClientTimeout(total=...)`, else (None or 0) aiohttp's
  default, total = 300 s (openai_client.py:203, 213; aiohttp 3.14.1, inference-perf's lock, `client.py:253,
  365-366`). `total` bounds the whole request, sending, waiting for the headers and reading the body, not
  each read (`client.py:663-668, 697`); for a timeout >= 5 s the deadline is rounded up to the event loop's
  next whole second (`helpers.py:655-661`, `ClientTimeout.ceil_threshold = 5`, client.py:236). A timed-out
  request is a failure (openai_client.py:488-531 sets its `error`), counted in the stage report's
  `failures` (count, latency, prompt tokens) and left out of every success statistic (reportgen/base.py:472-473,
  510, 711-719). jaxroute runs every request to its end: `apply_timeouts` splits simulated requests as
  inference-perf would.

Refused (one line each): other data types (datasets, traces, multimodal), the `concurrent` / trace load
types, `sweep` (it probes a real server's saturation), LoRA traffic splits.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from jaxroute.errors import JaxrouteError
from jaxroute.mapping_files import read_mapping
from jaxroute.workloads.names import MAX_COUNT

SOURCE = "inference-perf @ 7de5ef2"
DATA_TYPES = ("shared_prefix", "random", "synthetic")
LOAD_TYPES = ("constant", "poisson")
# the client sections of a config: how it talks to the server, not which requests it sends
CLIENT_SECTIONS = ("api", "server", "tokenizer", "metrics", "report", "storage", "circuit_breakers")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")  # as inference-perf's StrictBaseModel (config/common.py)


class Distribution(_Strict):
    """`config/common.py` `Distribution` (lines 43-67): defaults and checks as there."""

    min: int = 10
    max: int = 1024
    mean: float = 512
    std_dev: float = 200
    total_count: int | None = Field(default=None, gt=0)
    type: Literal["normal", "skew_normal", "lognormal", "uniform", "poisson", "fixed"] = "normal"
    variance: float | None = Field(default=None, ge=0)
    skew: float = 0.0

    @model_validator(mode="after")
    def _check(self) -> Distribution:
        if self.variance is not None and self.std_dev > 0 and "std_dev" in self.model_fields_set:
            raise ValueError("give either std_dev or variance, not both")
        if self.variance is not None:
            self.std_dev = math.sqrt(self.variance)
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is greater than max ({self.max})")
        if self.min < 1:
            raise ValueError(f"min must be >= 1 token, got {self.min}")
        if self.std_dev < 0:
            raise ValueError("std_dev must be >= 0")
        return self


class SharedPrefix(_Strict):
    """`config/datagen/config.py` `SharedPrefix` (lines 46-102)."""

    groups: int = Field(10, gt=0, validation_alias=AliasChoices("num_unique_system_prompts", "num_groups"))
    prompts_per_group: int = Field(10, gt=0, validation_alias=AliasChoices("num_users_per_system_prompt",
                                                                           "num_prompts_per_group"))
    system_prompt_len: int | Distribution = 100
    question_len: int | Distribution = 50
    output_len: int | Distribution = 50
    seed: int | None = None
    question_distribution: Distribution | None = None
    output_distribution: Distribution | None = None
    enable_multi_turn_chat: bool = False
    multimodal: Any = None

    @model_validator(mode="after")
    def _check(self) -> SharedPrefix:
        for name in ("question", "output"):
            if isinstance(getattr(self, f"{name}_len"), Distribution) and getattr(self, f"{name}_distribution"):
                raise ValueError(f"give either an inline distribution on {name}_len or {name}_distribution, not both")
        for name in ("system_prompt_len", "question_len", "output_len"):
            v = getattr(self, name)
            if isinstance(v, int) and v < 1:
                raise ValueError(f"{name} must be >= 1 token, got {v}")
        return self


class DataConfig(_Strict):
    """`config/datagen/config.py` `DataConfig` (lines 105-169): the fields that decide the requests."""

    type: str = "mock"
    shared_prefix: SharedPrefix | None = None
    input_distribution: Distribution | None = None
    output_distribution: Distribution | None = None
    path: str | None = None
    corpus_file_path: str | None = None  # synthetic's text corpus: the prompts' words, not their lengths
    multimodal: Any = None
    trace: Any = None
    use_chat_template: bool = False
    # the other data types' sections (config.py:131-149): a dumped config holds them as nulls
    otel_trace_replay: Any = None
    weka_trace_replay: Any = None
    conversation_replay: Any = None
    visionarena: Any = None


class Stage(_Strict):
    """`config/loadgen/config.py` `StandardLoadStage` (lines 39-55)."""

    rate: float = Field(gt=0, allow_inf_nan=False)
    duration: int = Field(gt=0)
    num_requests: int | None = None
    concurrency_level: int | None = None


class LoadConfig(_Strict):
    """`config/loadgen/config.py` `LoadConfig` (lines 162-224); `num_workers` defaults to the client's CPU count
    there (lines 173-176), None here; 0 is inference-perf's single-process loop (load_generator.py:1097-1099)."""

    type: str = "constant"
    interval: float = Field(1.0, ge=0)
    stages: list[Stage] = []
    sweep: Any = None
    num_workers: int | None = Field(None, ge=0)
    worker_max_concurrency: int = Field(100, gt=0)
    worker_max_tcp_connections: int = Field(2500, ge=0)
    trace: Any = None
    circuit_breakers: list[str] = []
    request_timeout: float | None = None
    lora_traffic_split: Any = None
    base_seed: int | None = None


class Config(BaseModel):
    """A whole inference-perf config: `data` and `load` are read; the client's sections are accepted as they are."""

    model_config = ConfigDict(extra="forbid")
    data: DataConfig = DataConfig()
    load: LoadConfig = LoadConfig()
    api: Any = None
    server: Any = None
    tokenizer: Any = None
    metrics: Any = None
    report: Any = None
    storage: Any = None
    circuit_breakers: Any = None


AIOHTTP_DEFAULT_TIMEOUT_S = 300.0  # aiohttp client.py:253 DEFAULT_TIMEOUT total (3.11.11 to 3.14.1)
AIOHTTP_CEIL_THRESHOLD_S = 5.0  # aiohttp client.py:236 ClientTimeout.ceil_threshold


@dataclasses.dataclass(frozen=True)
class ClientLimits:
    """How inference-perf's client holds and cuts requests: its concurrency cap and request timeout, each with
    where it comes from (see the module docstring for the rules)."""

    num_workers: int | None  # None: not given (inference-perf uses the client machine's CPU count)
    worker_max_concurrency: int
    worker_max_tcp_connections: int  # 0: no connection limit (aiohttp connector.py:406)
    pinned_groups: int | None  # multi-turn: request i goes to worker (i mod pinned_groups) mod num_workers
    cap: int | None  # the most requests the client holds at once (None: unknown, or no cap)
    cap_source: str
    request_timeout_s: float  # whole-request timeout (inf: none)
    request_timeout_source: str
    interval_s: float  # sleep after each stage (load_generator.py:1090-1091)

    @property
    def per_worker(self) -> int | None:
        """Requests one worker holds at once: its semaphore slots, or its TCP connections if fewer."""
        if self.num_workers == 0:  # the single-process loop: no semaphore, one aiohttp session
            return self.worker_max_tcp_connections or None
        tcp = self.worker_max_tcp_connections
        return min(self.worker_max_concurrency, tcp) if tcp > 0 else self.worker_max_concurrency

    def worker_of(self, data_index) -> np.ndarray | None:
        """Worker of each request of a stage by its data index there (0, 1, ... from the stage's start), when a
        worker is pinned (multi-turn: shared_prefix_datagen.py:191, load_generator.py:789-791); None: one queue."""
        if self.pinned_groups is None or not self.num_workers:
            return None
        i = np.asarray(data_index, np.int64)
        return (i % self.pinned_groups) % self.num_workers

    def over_cap(self, arrival_s, finish_s, data_index=None) -> tuple[int, int]:
        """(requests that would have waited for a client slot, the most held at one arrival) of one simulated
        stage: a request waits when, at its send time, the client (its worker, when pinned) already holds
        `cap` (`per_worker`) requests that have not finished. Computed on the uncapped simulation, so it says
        whether and how often the cap binds, not by how much it would have delayed the stage."""
        a, f = _times(arrival_s, finish_s)
        workers = self.worker_of(np.arange(len(a)) if data_index is None else data_index)
        if workers is None:
            held, limit = in_flight_at_arrivals(a, f), self.cap
        else:
            held, limit = np.zeros(len(a), np.int64), self.per_worker
            for w in np.unique(workers):
                on = workers == w
                held[on] = in_flight_at_arrivals(a[on], f[on])
        peak = int(held.max(initial=0))
        return (0 if limit is None else int(np.sum(held > limit))), peak


@dataclasses.dataclass(frozen=True)
class InferencePerfLoad:
    """What an inference-perf config sends, as jaxroute builds it."""

    source: str  # the file (or "inline")
    data_type: str  # shared_prefix | random | synthetic
    stages: tuple[tuple[float, float], ...]  # (requests/s, seconds)
    stage_requests: tuple[int, ...]  # int(rate x duration) per stage
    shared_prefix: dict[str, Any] | None  # `workloads.prefix.shared_prefix` keywords (lengths as arrays)
    prompt_tokens: np.ndarray | None  # random / synthetic: [total_count] input lengths
    output_tokens: np.ndarray | None  # random / synthetic: [total_count] output lengths
    concurrency_cap: int | None  # client.cap: the most requests the client holds (None: unknown or none)
    load_type: str
    notes: tuple[str, ...]
    multi_turn: bool = False  # shared_prefix.enable_multi_turn_chat
    client: ClientLimits | None = None  # the client's cap and timeout, with their sources

    @property
    def requests(self) -> int:
        return sum(self.stage_requests)

    def flags(self) -> dict[str, Any]:
        """The `jaxroute cluster` settings it amounts to (dest -> value), when its lengths are fixed numbers
        (multi-turn chat has no flag form: workload None)."""
        single = self.data_type == "shared_prefix" and not self.multi_turn
        out: dict[str, Any] = {"workload": "shared-prefix" if single else None,
                               "rate_stages": list(self.stages), "requests": self.requests}
        if self.shared_prefix is not None:
            sp = self.shared_prefix
            out.update(sp_groups=sp["groups"], sp_prompts_per_group=sp["prompts_per_group"])
            for dest, key in (("sp_system_len", "system_tokens"), ("sp_question_len", "question_tokens"),
                              ("sp_output_len", "output_tokens")):
                v = np.unique(sp[key])
                out[dest] = int(v[0]) if len(v) == 1 else None
        return out


def _fail(where: str, message: str) -> JaxrouteError:
    return JaxrouteError(f"inference-perf config {where}: {message}")


def _one_line(where: str, err: ValidationError) -> JaxrouteError:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        value = e.get("input")
        shown = "" if isinstance(value, (dict, list)) or value is None else f" (got {value!r})"
        parts.append(f"{loc}: {e['msg'].removeprefix('Value error, ')}{shown}")
    return _fail(where, "; ".join(parts))


def read_config(source: str | Path | dict) -> tuple[str, dict]:
    """(name, mapping) of a config file (YAML or JSON) or an inline mapping."""
    if isinstance(source, dict):
        return "inline", source
    p = Path(source)
    loaded = read_mapping(p, "inference-perf config", "a mapping with `data` and `load` sections")
    return p.name, loaded


def read_client(source: str | Path | dict) -> ClientLimits:
    """The client limits of a config that ran (a measured run's: its stages' rates are in its reports, so a
    `load.sweep` is read too)."""
    name, raw = read_config(source)
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as e:
        raise _one_line(name, e) from None
    return client_limits(cfg.load, None)


def load(source: str | Path | dict, seed: int = 0) -> InferencePerfLoad:
    """Validate an inference-perf config and build what it sends. `seed` draws lengths from distributions
    when the config sets no `shared_prefix.seed` (inference-perf then draws them unseeded)."""
    name, raw = read_config(source)
    missing = [k for k in ("data", "load") if k not in raw]
    if missing:  # inference-perf would fill them in (mock data, one stage); a config to simulate says what it sends
        raise _fail(name, f"no `{'` or `'.join(missing)}` section; the config says what it sends under `data` "
                    "(type: shared_prefix, random or synthetic) and `load` (its stages)")
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as e:
        raise _one_line(name, e) from None
    data, ld = cfg.data, cfg.load
    notes: list[str] = []
    if data.type not in DATA_TYPES:
        raise _fail(name, f"data.type '{data.type}' is not modelled; jaxroute reads {', '.join(DATA_TYPES)} "
                    "(a dataset's or trace's lengths: give the trace to `jaxroute cluster --trace`)")
    if data.multimodal is not None or (data.shared_prefix and data.shared_prefix.multimodal is not None):
        raise _fail(name, "multimodal data is not modelled")
    if data.trace is not None:
        raise _fail(name, "data.trace is not modelled; replay the trace with `jaxroute cluster --trace`")
    if ld.type not in LOAD_TYPES:
        raise _fail(name, f"load.type '{ld.type}' is not modelled; jaxroute runs {', '.join(LOAD_TYPES)} stages")
    if ld.sweep is not None:
        raise _fail(name, "load.sweep probes a real server for its saturation rate; give the stages' rates "
                    "as load.stages (jaxroute capacity finds the simulated saturation)")
    if not ld.stages:
        raise _fail(name, "load.stages is empty; give at least one stage of rate and duration")
    if ld.lora_traffic_split is not None:
        raise _fail(name, "load.lora_traffic_split: LoRA adapters are not modelled yet")
    for i, st in enumerate(ld.stages):
        if st.num_requests is not None or st.concurrency_level is not None:
            raise _fail(name, f"load.stages.{i}: num_requests and concurrency_level belong to the concurrent load type")
    stages = tuple((float(s.rate), float(s.duration)) for s in ld.stages)
    counts = tuple(int(r * d) for r, d in stages)  # load_generator.py run_stage: int(rate * duration)
    if sum(counts) > MAX_COUNT:
        raise _fail(name, f"load.stages send {sum(counts):,} requests; a run holds at most {MAX_COUNT:,} (an int32 "
                    "count): lower a stage's rate or duration")
    if min(counts) < 1:
        i = counts.index(0)
        raise _fail(name, f"load.stages.{i} sends int(rate x duration) = 0 requests")
    s = (data.shared_prefix or SharedPrefix()) if data.type == "shared_prefix" else None
    multi_turn = bool(s is not None and s.enable_multi_turn_chat)
    timer = f"load_timer.py:{TIMER_LINES[ld.type]}"
    if multi_turn:
        notes.append(f"multi-turn chat: request i of a stage is round i // N of user i mod N, sent at inference-perf's "
                     f"{ld.type} timer's times ({timer}); a round here does not wait for the user's previous "
                     "answer as inference-perf's does (user_session.py:71-82): `turn_waits` counts those that would")
    else:
        notes.append(f"{ld.type} arrivals drawn as a Poisson process at each stage's rate (workload(..., timer=True): "
                     f"inference-perf's {ld.type} timer, {timer})")
    notes[-1] += (f"; stages follow each other without inference-perf's drain and {ld.interval:g} s interval "
                  "(load_generator.py:802-841, 1090-1091)")
    client = client_limits(ld, s.groups if multi_turn else None)
    cap = client.cap
    notes.append(f"the client holds at most {cap:,} requests at once ({client.cap_source}); jaxroute does not hold "
                 "any back (`ClientLimits.over_cap` counts those that would wait)" if cap is not None else
                 f"client cap: {client.cap_source}")
    if ld.num_workers == 0:
        notes.append("num_workers 0: inference-perf's single-process loop sends only the requests timed before the "
                     "stage's end (load_generator.py:1147): a constant stage's last one may not be sent")
    if ld.circuit_breakers or cfg.circuit_breakers:
        notes.append("circuit breakers are not modelled: every request is sent")
    notes.append(f"requests running {client.request_timeout_s:g} s or more fail in inference-perf "
                 f"({client.request_timeout_source}); jaxroute runs them to the end (`apply_timeouts` splits them)")

    sp = prompt = output = None
    if s is not None:
        rng = np.random.default_rng(s.seed if s.seed is not None else seed)
        n = s.groups * s.prompts_per_group
        q_dist = s.question_distribution if s.question_distribution is not None else s.question_len
        o_dist = s.output_distribution if s.output_distribution is not None else s.output_len
        system = sample_from_distribution(_as_distribution(s.system_prompt_len), s.groups, rng)
        questions, outputs = [], []
        for _ in range(s.groups):  # shared_prefix_datagen.py lines 109-114: per group, questions then outputs
            questions.append(sample_from_distribution(_as_distribution(q_dist), s.prompts_per_group, rng))
            outputs.append(sample_from_distribution(_as_distribution(o_dist), s.prompts_per_group, rng))
        sp = {"groups": s.groups, "prompts_per_group": s.prompts_per_group, "system_tokens": system,
              "question_tokens": np.concatenate(questions), "output_tokens": np.concatenate(outputs)}
        if np.any(sp["output_tokens"] < 1) or np.any(sp["question_tokens"] < 1):
            raise _fail(name, "data.shared_prefix: a sampled length is 0 tokens; raise the distribution's min")
        assert len(sp["question_tokens"]) == n
    else:
        for field in ("input_distribution", "output_distribution"):
            d = getattr(data, field)
            if d is None or d.total_count is None:
                raise _fail(name, f"data.{field} with a total_count is required for data.type {data.type}")
        rng = np.random.default_rng(seed)  # random_datagen.py:43 default_rng(seed)
        prompt = generate_distribution(data.input_distribution, rng, f"{name} data.input_distribution")
        output = generate_distribution(data.output_distribution, rng, f"{name} data.output_distribution")
        count = min(len(prompt), len(output))  # get_request_count
        if max(counts) > count:
            raise _fail(name, f"a stage sends {max(counts)} requests but the distributions hold {count} "
                        "(inference-perf indexes lengths[i] per stage); raise total_count")
        prompt, output = prompt[:count], output[:count]
    if multi_turn:
        last = max((c - 1) // (s.groups * s.prompts_per_group) for c in counts)
        worst = (last + 1) * int((system[np.arange(n) // s.prompts_per_group] + sp["question_tokens"]).max()) \
            + last * int(sp["output_tokens"].max())
        notes.append(f"multi-turn prompts grow by system + question + output tokens a round: round {last} (the last) "
                     f"holds up to {worst:,} prompt tokens (inference-perf's shared-prefix sessions do not truncate, "
                     "user_session.py:146-210 needs a tokenizer and max_model_len they are not given)")
    return InferencePerfLoad(name, data.type, stages, counts, sp, prompt, output, cap, ld.type, tuple(notes),
                             multi_turn, client)


def one_stage(data: dict, rate: float, requests: int) -> InferencePerfLoad:
    """A config's `data` section sent as one stage of exactly `requests` requests at `rate` (a measured stage
    replayed: its duration is requests / rate, which need not be whole seconds)."""
    load_ = load({"data": data, "load": {"stages": [{"rate": rate, "duration": max(1, round(requests / rate))}]}})
    return dataclasses.replace(load_, stages=((rate, requests / rate),), stage_requests=(int(requests),))


def without_prefix_cache(spec: InferencePerfLoad) -> InferencePerfLoad:
    """What a server without prefix caching sees of `spec`: every request's whole prompt (system prompt +
    question, group-major) as a private prompt, so nothing is found cached (vLLM's `--no-enable-prefix-caching`)."""
    sp = spec.shared_prefix
    if sp is None:
        return spec  # random / synthetic prompts share nothing already
    if spec.multi_turn:
        raise JaxrouteError(f"inference-perf config {spec.source}: multi-turn chat without prefix caching is not "
                            "modelled (each round would recompute its whole conversation)")
    n = sp["groups"] * sp["prompts_per_group"]
    system = np.broadcast_to(np.asarray(sp["system_tokens"]), (sp["groups"],))
    prompt = np.repeat(system, sp["prompts_per_group"]) + np.broadcast_to(np.asarray(sp["question_tokens"]), (n,))
    output = np.broadcast_to(np.asarray(sp["output_tokens"]), (n,))
    return dataclasses.replace(spec, shared_prefix=None, prompt_tokens=np.asarray(prompt, np.int64),
                               output_tokens=np.asarray(output, np.int64),
                               notes=spec.notes + ("prefix caching off: every prompt sent whole, as a private prompt",))


def workload(spec: InferencePerfLoad, timer: bool | None = None):
    """The jaxroute workload it sends (realize it at `workload.stage_mean_rate`). `timer` False: a staged Poisson
    process at the stage rates (`prefix.with_rate_stages`, what `flags()` gives); True: inference-perf's send
    order at its load timer's times (`workloads.timed_stages`). None: True for multi-turn chat (its rounds are
    fixed by the send order), else False."""
    from jaxroute.workloads import prefix

    timer = spec.multi_turn if timer is None else bool(timer)
    if spec.multi_turn and not timer:
        raise JaxrouteError(f"inference-perf config {spec.source}: multi-turn chat is sent in inference-perf's order "
                            "at its timer's times; it has no Poisson-process form (drop timer=False)")
    if timer:
        from jaxroute.workloads import timed_stages

        if spec.shared_prefix is not None:
            return timed_stages.shared_prefix_stages(spec.stages, spec.stage_requests, spec.load_type,
                                                     multi_turn=spec.multi_turn, **spec.shared_prefix)
        return timed_stages.private_prompt_stages(spec.stages, spec.stage_requests, spec.load_type,
                                                  spec.prompt_tokens, spec.output_tokens, name=spec.data_type)
    if spec.shared_prefix is not None:
        wl = prefix.synthetic("shared-prefix", spec.requests, **spec.shared_prefix)
    else:
        wl = prefix.private_prompts(spec.requests, spec.prompt_tokens, spec.output_tokens, name=spec.data_type)
    return prefix.with_rate_stages(wl, spec.stages)


def _as_distribution(v: int | Distribution) -> Distribution:
    """shared_prefix_datagen.py `_resolve_distribution` (lines 60-71): a number is a fixed distribution."""
    return v if isinstance(v, Distribution) else Distribution(mean=float(v), min=v, max=v, std_dev=0.0, type="fixed")


def sample_from_distribution(d: Distribution, count: int, rng: np.random.Generator) -> np.ndarray:
    """`utils/numeric/distribution/utils.py` `sample_from_distribution` (lines 106-166): draw, clip, round."""
    if d.type == "fixed":
        return np.full(count, int(d.mean), dtype=np.int64)
    if d.type == "normal":
        x = rng.normal(loc=d.mean, scale=d.std_dev, size=count)
    elif d.type == "skew_normal":  # Azzalini's two-normal construction, as there (lines 90-103)
        delta = d.skew / math.sqrt(1.0 + d.skew ** 2)
        u0, v = rng.standard_normal(count), rng.standard_normal(count)
        u1 = delta * u0 + math.sqrt(1.0 - delta ** 2) * v
        x = d.mean + d.std_dev * np.where(u0 >= 0, u1, -u1)
    elif d.type == "lognormal":
        if d.std_dev <= 0:
            x = np.full(count, d.mean)
        else:
            s2 = math.log(1.0 + (d.std_dev / d.mean) ** 2)
            x = rng.lognormal(mean=math.log(d.mean) - s2 / 2.0, sigma=math.sqrt(s2), size=count)
    elif d.type == "uniform":
        x = rng.uniform(low=d.min, high=d.max + 1, size=count)
    else:  # poisson
        x = rng.poisson(lam=d.mean if d.mean > 0 else 1.0, size=count).astype(np.float64)
    return np.clip(np.round(np.clip(x, d.min, d.max)).astype(np.int64), d.min, d.max)


def generate_distribution(d: Distribution, rng: np.random.Generator, where: str) -> np.ndarray:
    """`utils/numeric/distribution/utils.py` `generate_distribution` (lines 13-79), used by the random and
    synthetic generators: its lognormal is shifted to start at min, its normal needs min <= mean <= max."""
    n = int(d.total_count)
    if d.type == "fixed":
        return np.full(n, int(d.mean), dtype=np.int64)
    if d.type == "uniform":
        x = rng.uniform(low=d.min, high=d.max, size=n)
    elif d.type == "lognormal":
        shifted = d.mean - d.min if d.mean - d.min > 0 else 1.0
        s2 = np.log(1 + (d.std_dev / shifted) ** 2)
        x = rng.lognormal(mean=np.log(shifted) - s2 / 2, sigma=np.sqrt(s2), size=n) + d.min
    elif d.type == "normal":
        if not d.min <= d.mean <= d.max:
            raise JaxrouteError(f"inference-perf config {where}: mean {d.mean:g} is outside [min, max]")
        x = rng.normal(loc=d.mean, scale=d.std_dev, size=n)
    else:
        raise JaxrouteError(f"inference-perf config {where}: type '{d.type}' is not one of normal, lognormal, "
                            "uniform, fixed (inference-perf's random and synthetic data)")
    return np.clip(np.round(np.clip(x, d.min, d.max)).astype(np.int64), d.min, d.max)


def is_config(mapping: dict) -> bool:
    """Whether a mapping looks like an inference-perf config (its `load` or `data` section, no `command`)."""
    return isinstance(mapping, dict) and "command" not in mapping and bool({"load", "data"} & set(mapping))


# ----------------------------------------------------------------------------- the client


def client_limits(ld: LoadConfig, pinned_groups: int | None = None) -> ClientLimits:
    """The client's cap and timeout of a `load` section (`pinned_groups`: the shared-prefix groups when
    multi-turn chat pins each user to a worker)."""
    w, c, tcp = ld.num_workers, ld.worker_max_concurrency, ld.worker_max_tcp_connections
    per = f"worker_max_concurrency {c} slots (load_generator.py:131, 161)"
    if tcp and tcp < c:
        per = f"worker_max_tcp_connections {tcp} connections (openai_client.py:208-210), fewer than {per}"
    if w is None:
        cap, source = None, ("unknown: num_workers is not given and inference-perf defaults it to the client "
                             "machine's CPU count (config/loadgen/config.py:173-176)")
    elif w == 0:
        cap = tcp or None
        source = ("num_workers 0: the single-process loop has no semaphore (load_generator.py:1097-1099, "
                  "1132-1156)" + (f", one aiohttp session of {tcp} connections (openai_client.py:210)" if tcp else ""))
    else:
        lim = min(c, tcp) if tcp else c
        if pinned_groups is None:
            cap, source = w * lim, f"num_workers {w} x {per}"
        else:
            used = min(pinned_groups, w)
            cap = used * lim
            source = (f"multi-turn pins request i to worker (i mod {pinned_groups} groups) mod {w} "
                      "(shared_prefix_datagen.py:191, load_generator.py:789-791): "
                      f"{used} worker{'s' * (used > 1)} x {per}, per worker")
    t = ld.request_timeout
    if t is None or t == 0:
        timeout, t_source = AIOHTTP_DEFAULT_TIMEOUT_S, ("aiohttp's default ClientTimeout total, as request_timeout "
                                                        "is not set (openai_client.py:203; aiohttp client.py:253)")
    elif t < 0:
        timeout, t_source = math.inf, f"request_timeout {t:g}: aiohttp sets no timer for total <= 0 (helpers.py:655-663)"
    else:
        timeout, t_source = float(t), "load.request_timeout as aiohttp's ClientTimeout total (openai_client.py:203)"
    if timeout >= AIOHTTP_CEIL_THRESHOLD_S and math.isfinite(timeout):
        t_source += ", its deadline rounded up to the event loop's next whole second (aiohttp helpers.py:655-661)"
    return ClientLimits(w, c, tcp, pinned_groups if w else None, cap, source, timeout, t_source, float(ld.interval))


def _times(arrival_s, finish_s) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(arrival_s, np.float64)
    f = np.asarray(finish_s, np.float64)
    if a.ndim != 1 or a.shape != f.shape:
        raise JaxrouteError(f"arrival and finish times must be two 1-d arrays of one length, got shapes "
                            f"{a.shape} and {f.shape}")
    if not np.all(np.isfinite(a)):
        raise JaxrouteError("arrival times must be finite")
    return a, np.where(np.isnan(f), np.inf, f)  # an unfinished request (NaN or inf) holds its slot


def in_flight_at_arrivals(arrival_s, finish_s) -> np.ndarray:
    """Requests in flight when each request arrives, itself included (a finish at the same instant has freed its
    slot, as `experiments.requests.peak_in_flight` counts)."""
    a, f = _times(arrival_s, finish_s)
    return np.searchsorted(np.sort(a), a, side="right") - np.searchsorted(np.sort(f), a, side="right")


def turn_waits(arrival_s, finish_s, session) -> int:
    """Multi-turn chat: requests that arrive before their session's previous request (by arrival) has finished.
    inference-perf holds such a round until the answer is in (user_session.py:71-82); a simulation that sends
    it at its timer's time (`workloads.timed_stages`) does not."""
    a, f = _times(arrival_s, finish_s)
    sess = np.asarray(session)
    if sess.shape != a.shape:
        raise JaxrouteError(f"session must have one entry per request, got {sess.shape} for {a.shape}")
    order = np.lexsort((a, sess))
    same = sess[order][1:] == sess[order][:-1]
    return int(np.sum(same & (a[order][1:] < f[order][:-1])))


# ----------------------------------------------------------------------------- timeouts


def request_deadlines(timeout_s: float | None, start_s=None, n: int | None = None) -> np.ndarray:
    """Seconds after its start at which each request times out. `timeout_s`: `ClientLimits.request_timeout_s`
    (None or 0: aiohttp's default 300 s, openai_client.py:203; < 0: none, helpers.py:655-663). From 5 s up,
    aiohttp rounds the deadline up to the event loop's next whole second (helpers.py:655-661): given the
    requests' start times on that clock (`start_s`) that is applied; without them every deadline is
    `timeout_s` (the lower end: the deadline lies in [timeout, timeout + 1))."""
    t = AIOHTTP_DEFAULT_TIMEOUT_S if timeout_s is None or timeout_s == 0 else float(timeout_s)
    if math.isnan(t):
        raise JaxrouteError("request timeout is NaN")
    if start_s is None:
        if n is None:
            raise JaxrouteError("give the requests' start times or their number")
        return np.full(int(n), math.inf if t < 0 else t)
    start = np.asarray(start_s, np.float64)
    if t < 0 or math.isinf(t):
        return np.full(start.shape, math.inf)
    if t >= AIOHTTP_CEIL_THRESHOLD_S:
        return np.ceil(start + t) - start
    return np.full(start.shape, t)


def apply_timeouts(ttft_s, e2e_s, timeout_s: float | None = None, start_s=None) -> tuple[np.ndarray, int]:
    """(ok mask, failures) of simulated requests as inference-perf counts them: aiohttp's `total` timeout bounds
    the whole request (aiohttp client.py:663-668, 697: sending, the response's headers and every body read), so a
    request fails when its end-to-end time reaches its deadline (`request_deadlines`), whatever its TTFT; it
    then has an error (openai_client.py:488-531), counts in the stage report's `failures.count` and is left out
    of every success statistic, TTFT included (reportgen/base.py:472-473, 510, 711-719). A request that never
    finished (e2e NaN or inf) fails. `ttft_s` is checked against `e2e_s` (a first token after the end is an
    error in the caller's data); streaming or not, the rule is the same."""
    ttft = np.asarray(ttft_s, np.float64)
    e2e = np.asarray(e2e_s, np.float64)
    if ttft.shape != e2e.shape:
        raise JaxrouteError(f"ttft_s and e2e_s must have one shape, got {ttft.shape} and {e2e.shape}")
    both = np.isfinite(ttft) & np.isfinite(e2e)
    if np.any(ttft[both] > e2e[both] + 1e-9) or np.any(e2e[np.isfinite(e2e)] < 0):
        raise JaxrouteError("a request's TTFT exceeds its end-to-end time, or a time is negative")
    if start_s is None:
        deadline = request_deadlines(timeout_s, n=1)[0]
    else:
        deadline = request_deadlines(timeout_s, start_s)
        try:
            fits = np.broadcast_shapes(deadline.shape, e2e.shape) == e2e.shape
        except ValueError:
            fits = False
        if not fits:
            raise JaxrouteError(f"start_s of shape {deadline.shape} does not match e2e_s of shape {e2e.shape}")
    ok = np.isfinite(e2e) & (e2e < deadline)
    return ok, int(e2e.size - np.count_nonzero(ok))


# ----------------------------------------------------------------------------- load timers

TIMER_LINES = {"constant": "36-65", "poisson": "68-97"}


def constant_offsets(draws, duration, xp=np):
    """inference-perf's constant timer from its exponential draws (any scale; load_timer.py:48-65): the draws
    rescaled to sum to `duration`, summed in order, so the last send is at `duration`. `xp`: numpy or jax.numpy."""
    return xp.cumsum(draws * (duration / xp.sum(draws)))


def poisson_offsets(counts, draws, n: int, rate: float, xp=np):
    """inference-perf's poisson timer (load_timer.py:78-97) from its draws: `counts` [seconds] Poisson(rate) counts,
    one per second (an empty second passes, lines 87-90); second j's count c spreads its c sends over
    [j, j + 1] as the constant timer does (lines 92-97), using the next c of `draws` (exponentials, any scale).
    The first n send times; past the drawn seconds (not expected) they continue 1 / rate apart."""
    counts = xp.asarray(counts)
    ends = xp.cumsum(counts)
    i = xp.arange(n)
    sec = xp.searchsorted(ends, i, side="right")
    inside = sec < counts.shape[0]
    j = xp.minimum(sec, counts.shape[0] - 1)
    first = ends[j] - counts[j]
    total = xp.concatenate([xp.zeros((1,), draws.dtype), xp.cumsum(draws)])
    m = draws.shape[0]
    lo = total[xp.minimum(first, m)]
    frac = (total[xp.minimum(i + 1, m)] - lo) / (total[xp.minimum(first + counts[j], m)] - lo)
    beyond = counts.shape[0] + (i - ends[-1] + 1) / rate
    return xp.where(inside, sec + frac, beyond)


def stage_send_times(load_type: str, rate: float, duration: float, rng: np.random.Generator,
                     n: int | None = None) -> np.ndarray:
    """The int(rate x duration) send times (s after the stage's timer starts) of one stage, as inference-perf's
    timer makes them with the numpy Generator `rng` (load_timer.py:36-97; the run's timer starts 1 s after the
    stage does, load_generator.py:766). constant: one `exponential(1 / rate, n)` draw, as there; poisson:
    `poisson(rate)` per second and `exponential(1 / c, c)` per non-empty second from the same `rng` (inference-perf
    draws each second's gaps from a fresh unseeded Generator, line 93 via line 46: the same law)."""
    if load_type not in TIMER_LINES:
        raise JaxrouteError(f"load type '{load_type}' has no timer here; choose {' or '.join(TIMER_LINES)}")
    if not (rate > 0 and duration > 0 and math.isfinite(rate) and math.isfinite(duration)):
        raise JaxrouteError(f"a stage needs a rate > 0 and a duration > 0, got {rate:g} and {duration:g}")
    n = int(rate * duration) if n is None else int(n)
    if n < 1:
        return np.zeros(0)
    if load_type == "constant":
        return constant_offsets(rng.exponential(1 / rate, n), float(duration))
    out, t = [], 0.0
    while len(out) < n:
        c = int(rng.poisson(rate))
        if c < 1:
            t += 1.0
            continue
        gaps = rng.exponential(1 / c, c)
        sends = np.cumsum(np.concatenate([[t], gaps * (1.0 / np.sum(gaps))]))[1:]  # from t, one gap at a time
        out.extend(sends[: n - len(out)].tolist())
        t = float(sends[-1])
    return np.asarray(out)
