"""An inference-perf `config.yml` read as it is: its `data` and `load` sections as a jaxroute workload.

inference-perf (github.com/kubernetes-sigs/inference-perf, read at commit 7de5ef2) is the load generator
llm-d and the Gateway API inference extension benchmark with. Its config is validated by pydantic models
(`inference_perf/config/`); this module mirrors the parts that decide the requests and refuses, in one
line, what the simulator cannot model. The mapping:

- `data.type: shared_prefix` (`config/datagen/config.py` `SharedPrefix`, lines 46-101): groups
  (`num_unique_system_prompts`, alias `num_groups`) x prompts per group (`num_users_per_system_prompt`,
  alias `num_prompts_per_group`); `system_prompt_len`, `question_len`, `output_len` a number or a
  `Distribution`. Lengths are sampled as `SharedPrefixDataGenerator.__init__` does
  (`datagen/synthetic/shared_prefix_datagen.py` lines 89-114: one numpy Generator seeded with
  `shared_prefix.seed`, the groups' system lengths first, then per group its questions' and outputs'
  lengths) with `utils/numeric/distribution/utils.py` `sample_from_distribution`; prompt reuse is the
  generator's (every prompt recurs once per cycle of groups x prompts, `workloads.prefix.shared_prefix`).
- `data.type: random` / `synthetic` (`datagen/synthetic/random_datagen.py` lines 36-60,
  `synthetic_datagen.py` lines 54-75): `input_distribution` / `output_distribution` with `total_count`
  lengths drawn by `generate_distribution`; request i of a stage gets lengths[i] (`load_lazy_data`,
  `get_data` restarts at 0 each stage) and a prompt of fresh random tokens, so nothing is shared: private
  prompts here (cycled from each stage's start, as the shared-prefix prompts are).
- `load.type: constant` / `poisson` with `stages` of `rate` (requests/s) and `duration` (s)
  (`config/loadgen/config.py` `StandardLoadStage`, lines 27-45): each stage sends int(rate x duration)
  requests (`loadgen/load_generator.py` `run_stage`, line 770), so the run holds their sum. Arrivals
  here are jaxroute's staged Poisson process at the stage rates (`workloads.prefix.with_rate_stages`),
  the same as `--rate-stages`.

Differences, said in `notes`: inference-perf's `constant` timer spreads int(rate x d) arrivals by
normalised exponential gaps over the stage (`loadgen/load_timer.py` lines 25-50) and its `poisson`
timer draws a count per second (lines 53-78), where jaxroute draws a Poisson process; inference-perf waits
for a stage's requests to finish, and `interval` seconds, before the next stage (`run_stage` lines
800-840), where jaxroute's stages follow each other at once (a stage that does not drain overlaps the
next). `num_workers` x `worker_max_concurrency` caps the requests in flight on the client; jaxroute
does not cap them and the run reports its peak in flight beside the cap.

Refused (one line each): other data types (datasets, traces, multimodal), multi-turn chat, the
`concurrent` / trace load types, `sweep` (it probes a real server's saturation), LoRA traffic splits.
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

SOURCE = "inference-perf @ 7de5ef2"
DATA_TYPES = ("shared_prefix", "random", "synthetic")
LOAD_TYPES = ("constant", "poisson")
# the client sections of a config: how it talks to the server, not which requests it sends
CLIENT_SECTIONS = ("api", "server", "tokenizer", "metrics", "report", "storage", "circuit_breakers")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")  # as inference-perf's StrictBaseModel (config/common.py)


class Distribution(_Strict):
    """`config/common.py` `Distribution` (lines 43-70): defaults and checks as there."""

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
    """`config/datagen/config.py` `SharedPrefix` (lines 46-101)."""

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
    """`config/datagen/config.py` `DataConfig` (lines 105-170): the fields that decide the requests."""

    type: str = "mock"
    shared_prefix: SharedPrefix | None = None
    input_distribution: Distribution | None = None
    output_distribution: Distribution | None = None
    path: str | None = None
    corpus_file_path: str | None = None  # synthetic's text corpus: the prompts' words, not their lengths
    multimodal: Any = None
    trace: Any = None
    use_chat_template: bool = False


class Stage(_Strict):
    """`config/loadgen/config.py` `StandardLoadStage` (lines 27-45)."""

    rate: float = Field(gt=0)
    duration: int = Field(gt=0)
    num_requests: int | None = None
    concurrency_level: int | None = None


class LoadConfig(_Strict):
    """`config/loadgen/config.py` `LoadConfig` (lines 149-175); `num_workers` defaults to the client's CPU count there."""

    type: str = "constant"
    interval: float = Field(1.0, ge=0)
    stages: list[Stage] = []
    sweep: Any = None
    num_workers: int | None = Field(None, gt=0)
    worker_max_concurrency: int = Field(100, gt=0)
    worker_max_tcp_connections: int = 2500
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
    concurrency_cap: int | None  # num_workers x worker_max_concurrency (None: num_workers not given)
    load_type: str
    notes: tuple[str, ...]

    @property
    def requests(self) -> int:
        return sum(self.stage_requests)

    def flags(self) -> dict[str, Any]:
        """The `jaxroute cluster` settings it amounts to (dest -> value), when its lengths are fixed numbers."""
        out: dict[str, Any] = {"workload": "shared-prefix" if self.data_type == "shared_prefix" else None,
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


def load(source: str | Path | dict, seed: int = 0) -> InferencePerfLoad:
    """Validate an inference-perf config and build what it sends. `seed` draws lengths from distributions
    when the config sets no `shared_prefix.seed` (inference-perf then draws them unseeded)."""
    name, raw = read_config(source)
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
    if min(counts) < 1:
        i = counts.index(0)
        raise _fail(name, f"load.stages.{i} sends int(rate x duration) = 0 requests")
    notes.append(f"{ld.type} arrivals drawn as a Poisson process at each stage's rate (inference-perf's "
                 f"{ld.type} timer: load_timer.py); stages follow each other without inference-perf's drain "
                 f"and {ld.interval:g} s interval")
    cap = ld.num_workers * ld.worker_max_concurrency if ld.num_workers else None
    if ld.circuit_breakers or cfg.circuit_breakers:
        notes.append("circuit breakers are not modelled: every request is sent")
    if ld.request_timeout is not None:
        notes.append(f"request_timeout {ld.request_timeout:g} s is not modelled: no request is cut off")

    sp = prompt = output = None
    if data.type == "shared_prefix":
        s = data.shared_prefix or SharedPrefix()
        if s.enable_multi_turn_chat:
            raise _fail(name, "data.shared_prefix.enable_multi_turn_chat: multi-turn chat is not modelled")
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
        rng = np.random.default_rng(seed)  # random_datagen.py line 29: default_rng(seed)
        prompt = generate_distribution(data.input_distribution, rng, f"{name} data.input_distribution")
        output = generate_distribution(data.output_distribution, rng, f"{name} data.output_distribution")
        count = min(len(prompt), len(output))  # get_request_count
        if max(counts) > count:
            raise _fail(name, f"a stage sends {max(counts)} requests but the distributions hold {count} "
                        "(inference-perf indexes lengths[i] per stage); raise total_count")
        prompt, output = prompt[:count], output[:count]
    return InferencePerfLoad(name, data.type, stages, counts, sp, prompt, output, cap, ld.type, tuple(notes))


def workload(spec: InferencePerfLoad):
    """The jaxroute workload it sends (realize it at `workload.stage_mean_rate`)."""
    from jaxroute.workloads import prefix

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
