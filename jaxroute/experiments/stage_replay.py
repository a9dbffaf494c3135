"""A published per-stage measurement (inference-perf's stage summaries) replayed stage by stage.

inference-perf's report folder holds one `stage_N_lifecycle_metrics.json` per load stage (`jaxroute.measured`):
the requested rate, the requests sent and the TTFT and request-latency statistics, with no per-request
records. Each stage is simulated on its own, as the measured run ran it: inference-perf sends a stage's
int(rate x duration) requests and waits for them to finish before the next stage (loadgen/load_generator.py
`run_stage`, lines 770-840), so a stage starts on an idle server. The prompts are the config's `data` section
(`workloads.inference_perf`), the arrivals a Poisson process at the stage's rate. A stage whose achieved rate
fell short of its requested rate (by more than 5 %) was bound by the client (its `num_workers` x
`worker_max_concurrency` in flight, a closed loop jaxroute does not model) and is reported as such, not compared.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxroute.errors import JaxrouteError
from jaxroute.metrics import Summary
from jaxroute.real_runs import client_bound

METRICS = ("ttft_mean_s", "ttft_p90_s", "e2e_mean_s", "e2e_p90_s", "tpot_mean_s")


@dataclasses.dataclass(frozen=True)
class StageComparison:
    stage: int
    rate: float
    requests: int
    client_bound: bool
    measured: dict[str, float]  # METRICS (tpot_mean_s: the stage's (E2E mean - TTFT mean) / (output mean - 1))
    simulated: dict[str, Summary] | None  # None for a client-bound stage

    def as_json(self) -> dict:
        sim = None if self.simulated is None else {k: v.as_json() for k, v in self.simulated.items()}
        return {"stage": self.stage, "rate": self.rate, "requests": self.requests, "client_bound": self.client_bound,
                "measured": self.measured, "simulated": sim,
                "percent_error": None if sim is None else {
                    k: 100 * (self.simulated[k].mean / self.measured[k] - 1) for k in METRICS if self.measured[k] > 0}}


def compare_stages(folder, config, dep, seeds: int = 4, stages=None, factors=None, progress=None,
                   router: str = "least_load") -> list[StageComparison]:
    """Replay each stage of an inference-perf report `folder` whose prompts are `config`'s data section, on
    `dep` (`deployment.Deployment`) behind `router`, `seeds` draws each; `stages`: the indices to run (None: all)."""
    from jaxroute import measured
    from jaxroute.experiments import requests as req_lib
    from jaxroute.experiments.cluster import policy_rows, run_cluster
    from jaxroute.workloads import inference_perf

    rows_measured = measured.read_inference_perf_stage_summaries(folder)
    _, cfg = inference_perf.read_config(config)
    if "data" not in cfg:
        raise JaxrouteError(f"{config}: the config has no data section: the replay needs the prompts it sent")
    out = []
    for row in rows_measured:
        k = row["stage"]
        if stages is not None and k not in stages:
            continue
        m = {"ttft_mean_s": row["ttft_mean_s"], "ttft_p90_s": row["ttft_p90_s"], "e2e_mean_s": row["e2e_mean_s"],
             "e2e_p90_s": row["e2e_p90_s"], "tpot_mean_s": row["tpot_from_means_s"]}
        bound = client_bound(row["achieved_rate"], row["rate"])
        if bound:
            out.append(StageComparison(k, row["rate"], row["requests"], True, m, None))
            continue
        duration = row["requests"] / row["rate"]
        wl = inference_perf.workload(inference_perf.one_stage(cfg["data"], row["rate"], row["requests"]))
        rows = policy_rows([router], rate=wl.stage_mean_rate, gpu=dep.gpu, model_name=dep.model, tp=dep.tp,
                           kv_capacity=dep.kv_capacity, cost_factors=factors)
        res = run_cluster(rows, wl, replicas_n=dep.replicas, seeds=seeds, chunk=dep.chunk,
                          max_running=dep.max_running, admission=dep.admission, request_records=True)
        if res.grid.overflow.any():
            raise JaxrouteError(f"stage {k}: the replay overflowed a fixed capacity")
        per = req_lib.stage_summaries(req_lib.request_table(res), [(row["rate"], duration)])[0][0]
        sim = {key: per[key] for key in METRICS}
        out.append(StageComparison(k, row["rate"], row["requests"], False, m, sim))
        if progress:
            progress(out[-1])
    return out


def format_stages(result: list[StageComparison]) -> str:
    """One line per stage: measured / simulated (ms) per metric and the simulated mean's error."""
    head = ["stage", "req/s", "requests"] + [f"{m.removesuffix('_s')} meas / sim ms (err)" for m in METRICS]
    lines = []
    for c in result:
        cells = [str(c.stage), f"{c.rate:g}", f"{c.requests:,}"]
        for m in METRICS:
            if c.simulated is None:
                cells.append(f"{c.measured[m] * 1e3:.4g} / client-bound")
            else:
                s = c.simulated[m]
                err = 100 * (s.mean / c.measured[m] - 1) if c.measured[m] > 0 else np.nan
                cells.append(f"{c.measured[m] * 1e3:.4g} / {s.mean * 1e3:.4g} ± {s.half_width * 1e3:.2g} ({err:+.0f} %)")
        lines.append(cells)
    from jaxroute.report import text_table

    return text_table(head, lines)
