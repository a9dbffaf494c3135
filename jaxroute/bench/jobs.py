"""Whole jobs as users bring them: one command's grid, timed end to end with its compilation.

The model sections time steady runs at growing seed counts; a user's job is one run of one grid, and its wall
time includes compiling it. Two jobs (issue "Speed on the jobs users bring"), each the same as a `jaxroute
cluster` command (printed in the JSON):

- **long-prompt**: inference-perf's `shared_prefix` at 150 groups x 5 prompts, a 6,000-token system prompt and
  a 1,200-token question, 1,000 output tokens, Poisson stages rising from 3 to 60 requests/s (80 s each:
  17,040 requests over 560 s), on 8 x Qwen3-32B (TP 2 on H100), vLLM-style on-demand admission, behind four
  routers in one grid (llm-d precise, approximate and load, and random), one seed;
- **mooncake**: every request of the Mooncake trace (`workloads.prefix.DEFAULT_TRACE_PATHS`; its recorded
  arrival times) on 16 replicas of the same deployment, behind six production routers in one grid (each
  project's cache-aware router, and llm-d's load router), one seed. Without the trace file it is reported as
  not run, with the path it looked for.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import numpy as np

from jaxroute.bench.config import BenchConfig
from jaxroute.bench.measure import CompileTimer, clock, error_record, say

DEPLOYMENT = {"gpu": "h100", "model_name": "qwen3-32b", "tp": 2}
LONG_PROMPT = {"groups": 150, "prompts_per_group": 5, "system_tokens": 6000, "question_tokens": 1200,
               "output_tokens": 1000}
LONG_PROMPT_STAGES = ((3.0, 80.0), (10.0, 80.0), (20.0, 80.0), (30.0, 80.0), (40.0, 80.0), (50.0, 80.0),
                      (60.0, 80.0))
LONG_PROMPT_ROUTERS = ("llmd_precise", "llmd_approx", "llmd_load", "random")
MOONCAKE_ROUTERS = ("llmd_precise", "dynamo_kv", "sglang_cache_aware", "vllm_prefixaware", "aibrix_prefix_cache",
                    "llmd_load")
TARGET_WALL_S = 60.0  # the target for each job, compilation included (2-core machine)


@dataclasses.dataclass(frozen=True)
class Job:
    """One user job: its grid; `command` is the `jaxroute cluster` command that runs the same."""

    name: str
    routers: tuple[str, ...]
    replicas: int
    workload: Callable[[int | None], object]  # requests (None: the job's full size) -> the workload
    admission: str
    workload_flags: str  # the command's flags that choose the workload
    needs: str | None = None  # a file the job reads (None: synthetic)

    @property
    def command(self) -> str:
        d = DEPLOYMENT
        return (f"jaxroute cluster {self.workload_flags} --replicas {self.replicas} --gpu {d['gpu']} "
                f"--model {d['model_name']} --tp {d['tp']} --seeds 1 --admission {self.admission} "
                f"--policies {','.join(self.routers)}")


def _long_prompt(requests: int | None):
    from jaxroute.experiments.cluster import build_workload

    total = round(sum(r * d for r, d in LONG_PROMPT_STAGES))
    return build_workload("shared-prefix", requests or total, shared_prefix=LONG_PROMPT,
                          rate_stages=LONG_PROMPT_STAGES)


def _mooncake(requests: int | None):
    from jaxroute.experiments.cluster import build_workload

    return build_workload("mooncake", requests or 10**9)  # head(n): every request of the trace


def _sp_flags() -> str:
    from jaxroute.commands._common import SP_FLAGS

    flag = {key: "--" + dest.replace("_", "-") for dest, (key, _) in SP_FLAGS.items()}
    return " ".join(f"{flag[k]} {v}" for k, v in LONG_PROMPT.items())


def jobs() -> dict[str, Job]:
    from jaxroute.workloads.prefix import DEFAULT_TRACE_PATHS

    stages = ",".join(f"{r:g}:{d:g}" for r, d in LONG_PROMPT_STAGES)
    return {
        "long-prompt": Job("long-prompt", LONG_PROMPT_ROUTERS, 8, _long_prompt, "on-demand",
                           f"--workload shared-prefix {_sp_flags()} --rate-stages {stages}"),
        "mooncake": Job("mooncake", MOONCAKE_ROUTERS, 16, _mooncake, "reserve", "--workload mooncake --requests 3993",
                        needs=DEFAULT_TRACE_PATHS["mooncake"]),
    }


def run_job(job: Job, requests: int | None) -> dict:
    """One run of the job's grid, timed whole (wall and CPU, compilation included)."""
    from jaxroute.experiments.cluster import policy_rows, run_cluster

    record: dict = {"job": job.name, "routers": list(job.routers), "replicas": job.replicas, "seeds": 1,
                    "command": job.command + (f" --requests {requests}" if requests else ""),
                    "target_wall_s": TARGET_WALL_S}
    if job.needs and not os.path.exists(job.needs):
        say(f"  {job.name}: not run, the trace is not at {job.needs}")
        return dict(record, ran=False, why=f"no file at {job.needs}")
    say(f"  {job.name}: {len(job.routers)} routers x 1 seed on {job.replicas} replicas ...")
    with CompileTimer() as ct, clock() as wall:
        wl = job.workload(requests)
        rate = getattr(wl, "stage_mean_rate", None) or 0.0  # 0: a trace replays its recorded times
        rows = policy_rows(list(job.routers), rate=rate, **DEPLOYMENT)
        res = run_cluster(rows, wl, replicas_n=job.replicas, seeds=1, admission=job.admission)
    n = int(wl.n_requests)
    simulated = n * len(job.routers)
    record.update(ran=True, requests=n, simulated_requests=simulated, wall_s=wall["wall"], cpu_s=wall["cpu"],
                  compile_s=ct.seconds, requests_per_s=simulated / wall["wall"],
                  overflow=bool(res.grid.overflow.any()), within_target=wall["wall"] <= TARGET_WALL_S,
                  mean_latency_s=dict(zip(res.labels, np.mean(res.metrics["mean_latency_s"], axis=1).tolist(), strict=True)))
    say(f"    {n:,} requests x {len(job.routers)} routers in {wall['wall']:.1f} s (compile {ct.seconds:.1f} s): "
        f"{simulated / wall['wall']:,.0f} requests/s")
    return record


def run_jobs(cfg: BenchConfig) -> dict:
    """Every job of `cfg.jobs`, at `cfg.job_requests` requests (None: each job's full size)."""
    table = jobs()
    out = {"runs": []}
    for name in cfg.jobs:
        try:
            out["runs"].append(run_job(table[name], cfg.job_requests))
        except Exception as e:
            out["runs"].append({"job": name, "ran": False, **error_record(e)})
            say(f"    failed: {out['runs'][-1]['error']} {out['runs'][-1]['detail']}")
    return out
