"""What `jaxroute bench` measures and at which sizes: one frozen config, three size presets.

`BenchConfig()` holds the full sizes (minutes to hours on a small CPU: the cluster at 1,024 seeds and
the 50,000-request trace are the long ones); `BenchConfig.quick()` a smoke run of every part at tiny
sizes (it checks that everything runs, its numbers are not meaningful); `BenchConfig.gpu()` the seed
counts for an accelerator, each size guarded so an out-of-memory keeps the sizes below it.
"""

from __future__ import annotations

import dataclasses
import os

from jaxroute.errors import JaxrouteError

PARTS = ("dispatch", "cluster", "blis", "trace", "decode", "decision", "jobs")
JOBS = ("long-prompt", "mooncake")  # whole user jobs, timed with their compilation (bench/jobs.py)
DEFAULT_POLICIES = ("rr", "least_load", "threshold", "cache_guard", "sglang_cache_aware")
# Arrival rate (requests/s) of each synthetic cluster workload: longdoc at bench_cluster.py's old default,
# toolbench at the README's cluster example.
CLUSTER_RATES = {"longdoc": 1.0, "toolbench": 40.0}
# The BLIS scenario (tools/blis/run.sh defaults): 4 instances of Llama-3.1-8B on one H100 each, Poisson.
BLIS_SCENARIO = {"replicas": 4, "gpu": "H100-SXM", "model": "Llama-3.1-8B", "rate": 48.0, "prompt_tokens": 2000,
                 "output_tokens": 200, "prefix_groups": 256, "prefix_tokens": 1500, "policy": "rr"}
# The decode-DP deployment of scripts/bench_dispatch_latency.py: G = 8 workers, BR-0 and BR-H (oracle).
DECODE_WORKERS = 8
DECODE_WORKLOAD = "synthetic-azure24"
# Thresholds the JSON reports against.
SEED_SCALING_MIN = 0.9  # requests/s at the largest seed count >= 0.9 x the next smaller: "flat or rising"
LINEAR_MAX = 1.5  # time per request at 2R <= 1.5 x at R: "linear in requests per seed"
TRACE_FLAT_MAX = 1.5  # max / min requests/s over the trace sizes
DECISION_TARGET_P50_MS = 0.1
# Rows of the profiled run that counts steps and launches (`program_cost`): XLA runs a much smaller program
# inline, without the per-operation events the count reads.
PROFILE_ROWS = 64


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """Every size and switch of one benchmark run (see `jaxroute bench --help` for each)."""

    parts: tuple[str, ...] = PARTS
    preset: str = "full"
    dispatch_seeds: tuple[int, ...] = (1, 64, 1024)
    cluster_seeds: tuple[int, ...] = (1, 64, 1024)
    decode_seeds: tuple[int, ...] = (1, 64, 1024)
    dispatch_requests: int = 20_000
    dispatch_servers: int = 16
    dispatch_load: float = 0.9
    cluster_requests: int = 500
    cluster_workloads: tuple[str, ...] = ("longdoc", "toolbench")
    cluster_rate: float | None = None  # None: CLUSTER_RATES per workload
    replicas: int = 4
    policies: tuple[str, ...] = DEFAULT_POLICIES
    separate: tuple[str, ...] = ("preble_e2",)  # routers timed in a grid of their own
    decode_requests: int = 1000
    decode_output_cap: int | None = None  # clip output lengths (quick: short runs); None = the workload's
    blis_requests: tuple[int, ...] = (2000, 10_000)
    blis_seeds: int = 1
    blis_run: str | None = None  # BLIS's run.sh (../shared/tools/blis/): time BLIS in the same run; None: README figures
    blis_repeats: int = 3  # BLIS runs per workload and size when timed (median); arrival draws per fidelity rate
    blis_rates: tuple[float, ...] = (40.0, 48.0, 56.0)  # arrival rates of the fidelity sweep (with blis_run)
    trace_sizes: tuple[int, ...] = (2000, 10_000, 50_000)
    request_scaling: bool = True  # also time each model at 2x its requests per seed
    references: bool = True
    ref_seeds: int = 8  # dispatch: seeds of the pure-Python JSQ loop (about 0.4 s a run)
    ref_requests: int = 200  # cluster: requests of the radix-tree reference run
    ref_decode_requests: int = 32  # decode: requests of the reference run ...
    ref_decode_steps: int = 300  # ... stopped after this many barrier steps (it runs ~10 ms per step)
    decision_calls: int = 2000
    jobs: tuple[str, ...] = JOBS
    job_requests: int | None = None  # requests of each job (None: its full size; quick: a few)
    max_repeat_s: float = 120.0  # a first run longer than this is not repeated (steady = first - compile)
    progress: bool = False  # tqdm bars inside the long cluster / trace runs
    cost_profile: bool = True  # count steps, launches and loop trips per request (one profiled run per model;
    #                            the quick preset: off, a smoke run)
    # every size compiles at one effort (jaxroute.compile_effort), so per-request costs compare across sizes
    compile_effort: str = "optimized"  # the quick preset: "auto" (a smoke run, not a measurement)

    def __post_init__(self):
        unknown = [p for p in self.parts if p not in PARTS]
        if unknown or not self.parts:
            raise JaxrouteError(f"unknown bench part(s) {', '.join(unknown) or '(none given)'}; "
                                f"choose from: {', '.join(PARTS)}")
        for name in ("dispatch_seeds", "cluster_seeds", "decode_seeds", "blis_requests", "trace_sizes"):
            values = getattr(self, name)
            if not values or any(int(v) != v or v < 1 for v in values):
                raise JaxrouteError(f"{name.replace('_', ' ')} must be positive integers, got {values}")
            if len(set(values)) != len(values):
                raise JaxrouteError(f"{name.replace('_', ' ')} lists a value twice: {values}")
        for name in ("dispatch_requests", "cluster_requests", "decode_requests", "blis_seeds", "replicas",
                     "dispatch_servers", "ref_seeds", "ref_requests", "ref_decode_requests", "ref_decode_steps",
                     "decision_calls", "blis_repeats"):
            v = getattr(self, name)
            if int(v) != v or v < 1:
                raise JaxrouteError(f"{name.replace('_', ' ')} must be a positive integer, got {v}")
        if not self.blis_rates or any(not r > 0 for r in self.blis_rates):
            raise JaxrouteError(f"blis rates must be > 0 requests/s, got {self.blis_rates}")
        if self.blis_run is not None and not os.path.isfile(self.blis_run):
            raise JaxrouteError(f"BLIS's run script not found: {self.blis_run} (it is ../shared/tools/blis/run.sh; "
                                "build BLIS first with build.sh there)")
        if not 0 < self.dispatch_load < 1:
            raise JaxrouteError(f"dispatch load must be in (0, 1), got {self.dispatch_load}")
        if self.cluster_rate is not None and not self.cluster_rate > 0:
            raise JaxrouteError(f"cluster rate must be > 0, got {self.cluster_rate}")
        if self.cluster_rate is None and any(w not in CLUSTER_RATES for w in self.cluster_workloads):
            raise JaxrouteError(f"give a cluster rate for workloads other than {', '.join(CLUSTER_RATES)}")
        unknown = [j for j in self.jobs if j not in JOBS]
        if unknown:
            raise JaxrouteError(f"unknown bench job(s) {', '.join(unknown)}; choose from: {', '.join(JOBS)}")
        if self.job_requests is not None and (int(self.job_requests) != self.job_requests or self.job_requests < 1):
            raise JaxrouteError(f"job requests must be a positive integer, got {self.job_requests}")
        if self.decode_output_cap is not None and self.decode_output_cap < 1:
            raise JaxrouteError(f"decode output cap must be >= 1, got {self.decode_output_cap}")

    def rate_of(self, workload: str) -> float:
        return self.cluster_rate if self.cluster_rate is not None else CLUSTER_RATES[workload]

    @classmethod
    def quick(cls, **overrides) -> BenchConfig:
        """Every part at tiny sizes: a check that all of it runs (compilation dominates its time, so each
        program's effort follows its job, as in the other commands)."""
        sizes = dict(preset="quick", compile_effort="auto", cost_profile=False, dispatch_seeds=(4,), cluster_seeds=(4,), decode_seeds=(4,), request_scaling=False,
                     dispatch_requests=2000, cluster_requests=24, cluster_workloads=("toolbench",),
                     decode_requests=32, decode_output_cap=48, blis_requests=(32,), trace_sizes=(32, 64),
                     ref_seeds=1, ref_requests=24, ref_decode_requests=8, ref_decode_steps=20, decision_calls=50,
                     job_requests=16)
        return cls(**{**sizes, **overrides})

    @classmethod
    def gpu(cls, **overrides) -> BenchConfig:
        """Seed counts for one accelerator: up to 65,536 seeds for dispatch and 4,096 for the cluster."""
        sizes = dict(preset="gpu", dispatch_seeds=(1, 64, 1024, 4096, 16384, 65536),
                     cluster_seeds=(1, 64, 1024, 4096), decode_seeds=(1, 64, 1024, 4096))
        return cls(**{**sizes, **overrides})

    @classmethod
    def preset_named(cls, name: str, **overrides) -> BenchConfig:
        makers = {"full": cls, "quick": cls.quick, "gpu": cls.gpu}
        if name not in makers:
            raise JaxrouteError(f"unknown bench preset '{name}'; choose from: {', '.join(makers)}")
        return makers[name](**overrides)
