"""Measured vLLM runs driven by inference-perf, read as stages to simulate and targets to meet. No JAX.

A run folder holds the server's settings (`exp-config.yaml` or `server.yaml`, vLLM serve arguments:
`jaxroute.server`), the inference-perf config (`results/config.yaml`, else `config.yaml`: inference-perf's own
record of what it ran: used here, because
the `profile.yaml` beside it disagrees on the shared-prefix groups and on multi-turn chat, and the measured prompt
lengths match `results/config.yaml`: system prompt + question + the chat template's few tokens, no growing
context), and one `results/stage_N_lifecycle_metrics.json` per load stage (`measured.read_inference_perf_stage_
summaries`). A bare inference-perf report folder works too, with the server file and the config given.

Targets per stage: TTFT mean and p90, E2E mean and p90, and the per-token time ("ITL") as (E2E mean - TTFT mean) /
(output tokens - 1), with the output length the server generated (the config's `output_len`; `ignore_eos` makes
vLLM generate exactly that many). The reported TPOT and ITL means are not used as targets: the inference-perf of
these runs re-tokenized each one-token stream chunk with a BOS (inference-perf reportgen/base.py, the comment on
issue #564 at HEAD 7de5ef2), counting every token twice, so they are about half the real per-token time (they
are still printed, beside the simulated value halved the same way: `reported_itl`).

A run is overloaded when more than 10 % of its requests failed (timed out), as the data's source excludes them.
A stage is client-bound when the client sent slower than its rate asked (its concurrency cap held requests: a
closed loop this replay does not model): it is reported, not simulated or fitted.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

from jaxroute.errors import JaxrouteError

OVERLOAD_FAILURES = 0.10  # the data's SOURCE.md: runs with more than 10 % failures are in overload
CLIENT_BOUND = 0.95  # achieved / requested rate below this: the client's concurrency cap paced the stage
SERVER_FILES = ("exp-config.yaml", "server.yaml")  # a run folder's vLLM serve arguments, first found
CONFIG_FILES = ("results/config.yaml", "config.yaml")  # its inference-perf config, first found
TARGETS = ("ttft_mean", "ttft_p90", "e2e_mean", "e2e_p90", "itl")


@dataclasses.dataclass(frozen=True)
class Stage:
    """One measured load stage and what it ran on."""

    run: str  # the run folder's name
    index: int
    model: str  # a catalog name or a config.json path (`catalog.get_model`)
    tp: int
    gpu: str
    chunk: int  # max_num_batched_tokens
    max_running: int  # max_num_seqs
    gpu_memory_utilization: float
    block_size: int
    data: dict  # the inference-perf data section
    rate: float
    requests: int  # sent
    failures: int
    output_len: int  # tokens the server generated per request
    measured: dict  # TARGETS (seconds) and the reported TPOT / ITL means
    run_measured: dict = dataclasses.field(default_factory=dict)  # the whole run's TARGETS (summary file)
    achieved_rate: float = math.nan  # requests / send duration, as the client measured it
    timeout_s: float = math.inf  # the client's request timeout (inference-perf: aiohttp's total, 300 s default)
    prefix_caching: bool = True  # the server file's enable_prefix_caching
    chunked_prefill: bool = True  # the server file's enable_chunked_prefill (vLLM V1 chunks regardless: `server`)

    @property
    def overloaded(self) -> bool:
        return self.failures > OVERLOAD_FAILURES * self.requests

    @property
    def client_bound(self) -> bool:
        """The client sent slower than asked (its concurrency cap held requests back: a closed loop, not simulated;
        e.g. the KubeCon demo's last three stages at about 106 of 123-183 req/s)."""
        return client_bound(self.achieved_rate, self.rate)

    @property
    def label(self) -> str:
        return f"{self.run}/stage {self.index}"

    def sent(self, requests: int):
        """What the client sent in this stage, `requests` of it, as the server saw it (`InferencePerfLoad`)."""
        from jaxroute.workloads import inference_perf

        spec = inference_perf.one_stage(self.data, self.rate, requests)
        return spec if self.prefix_caching else inference_perf.without_prefix_cache(spec)


def model_family(name: str) -> str:
    """A short model key of a run (the served model's basename, lower-case): groups runs for cross-validation."""
    return re.sub(r"[^a-z0-9.]+", "-", name.rsplit("/", 1)[-1].lower()).strip("-")


def find_model_config(server_model: str, search: list[Path]) -> Path | None:
    """The folder of `server_model`'s config.json among `search` folders (basename match, case-insensitive)."""
    base = server_model.rsplit("/", 1)[-1].lower()
    for root in search:
        if not root.is_dir():
            continue
        for d in sorted(root.iterdir()):
            if d.name.lower() == base and (d / "config.json").is_file():
                return d
    return None


def client_bound(achieved_rate: float, rate: float) -> bool:
    """Whether a stage was sent slower than its rate asked (`CLIENT_BOUND`): its client's cap paced it."""
    return achieved_rate < CLIENT_BOUND * rate


def served_model_name(server_model: str) -> str:
    """A served model's catalog name: its basename less a -Instruct / -chat / -hf suffix
    ('meta-llama/Llama-3.1-8B-Instruct' -> 'Llama-3.1-8B'); the name itself when the catalog has no such model."""
    from jaxroute import catalog

    base = re.sub(r"(-(instruct|chat|hf))+$", "", server_model.rsplit("/", 1)[-1], flags=re.IGNORECASE)
    try:
        return catalog.get_model(base).name
    except JaxrouteError:
        return server_model


def _output_len(p: Path, data: dict) -> int:
    sp = data.get("shared_prefix") if isinstance(data, dict) else None
    out = sp.get("output_len") if isinstance(sp, dict) else None
    if isinstance(out, dict):  # a distribution: its mean
        out = out.get("mean")
    if isinstance(out, bool) or not isinstance(out, int | float) or out < 1:
        raise JaxrouteError(f"{p}: data.shared_prefix.output_len must be a number of tokens >= 1 (got {out!r})")
    return int(round(out))


def read_run(folder: str | Path, *, server_file: str | Path | None = None, config: str | Path | None = None,
             model: str | None = None, gpu: str = "H100-SXM") -> list[Stage]:
    """The stages of one run folder (or of a report folder, with `server_file` and `config`).

    model: the model (a catalog name or a config.json path); None: the folder of the served model's config.json
    found beside the runs (`../../model_configs/<basename>`), else the server's model name as a catalog name."""
    from jaxroute import catalog, measured, server
    from jaxroute.workloads import inference_perf

    d = Path(folder)
    if not d.is_dir():
        raise JaxrouteError(f"run folder not found: {d}")
    results = d / "results" if (d / "results").is_dir() else d
    server_path = Path(server_file) if server_file else _first(d, SERVER_FILES)
    config_path = Path(config) if config else _first(d, CONFIG_FILES)
    if not server_path.is_file():
        raise JaxrouteError(f"{d.name}: no server file ({' or '.join(SERVER_FILES)}); give --server FILE")
    if not config_path.is_file():
        raise JaxrouteError(f"{d.name}: no inference-perf config ({' or '.join(CONFIG_FILES)}); give --config FILE")
    srv = server.read_server(server_path, gpu)
    _, cfg = inference_perf.read_config(config_path)
    data = cfg.get("data")
    if not isinstance(data, dict) or data.get("type") != "shared_prefix":
        raise JaxrouteError(f"{config_path}: only shared_prefix data is read as real-run stages")
    if model is None:
        found = find_model_config(srv.model, [d.parent.parent / "model_configs", d.parent / "model_configs"])
        model = str(found) if found else served_model_name(srv.model)
    spec = catalog.get_model(model)
    catalog.check_tp(spec, srv.tensor_parallel_size)
    out_len = _output_len(config_path, data)
    timeout = inference_perf.read_client(cfg).request_timeout_s
    whole = _run_summary(results, out_len)
    stages = []
    for row in measured.read_inference_perf_stage_summaries(results):
        if not math.isfinite(row["ttft_mean_s"]) or not math.isfinite(row["e2e_mean_s"]):
            raise JaxrouteError(f"{results / row['file']}: no successful streamed request to compare with")
        itl = (row["e2e_mean_s"] - row["ttft_mean_s"]) / max(out_len - 1, 1)
        m = {"ttft_mean": row["ttft_mean_s"], "ttft_p90": row["ttft_p90_s"], "e2e_mean": row["e2e_mean_s"],
             "e2e_p90": row["e2e_p90_s"], "itl": itl, "ttft_p99": row["ttft_p99_s"], "e2e_p99": row["e2e_p99_s"],
             "reported_tpot": row["tpot_mean_s"], "reported_itl": row["itl_mean_s"]}
        stages.append(Stage(run=d.name, index=row["stage"], model=model, tp=srv.tensor_parallel_size, gpu=gpu,
                            chunk=srv.max_num_batched_tokens, max_running=srv.max_num_seqs,
                            gpu_memory_utilization=srv.gpu_memory_utilization, block_size=srv.block_size,
                            data=data, rate=row["rate"], requests=row["requests"], failures=row["failures"],
                            output_len=out_len, measured=m, run_measured=whole, achieved_rate=row["achieved_rate"],
                            timeout_s=timeout, prefix_caching=srv.enable_prefix_caching,
                            chunked_prefill=srv.enable_chunked_prefill))
    if any(st.client_bound for st in stages):  # the run's summary pools stages not simulated: pool the others
        stages = [dataclasses.replace(st, run_measured={}) for st in stages]
    return stages


def _first(d: Path, names) -> Path:
    """The first of `names` under folder `d` that exists (else the first name)."""
    return next((d / n for n in names if (d / n).is_file()), d / names[0])


def _run_summary(results: Path, out_len: int) -> dict:
    """The whole run's TARGETS from `summary_lifecycle_metrics.json` (empty when the file is missing)."""
    from jaxroute import measured

    f = results / "summary_lifecycle_metrics.json"
    if not f.is_file():
        return {}
    row = measured._stage_summary(f, measured._load_json(f), -1)
    return {"ttft_mean": row["ttft_mean_s"], "ttft_p90": row["ttft_p90_s"], "e2e_mean": row["e2e_mean_s"],
            "e2e_p90": row["e2e_p90_s"], "itl": (row["e2e_mean_s"] - row["ttft_mean_s"]) / max(out_len - 1, 1),
            "requests": row["requests"], "failures": row["failures"]}


def is_run_folder(d: Path) -> bool:
    """A folder holding a server file (`SERVER_FILES`)."""
    return d.is_dir() and any((d / n).is_file() for n in SERVER_FILES)


def discover(data_dir: str | Path) -> list[Path]:
    """The run folders under `data_dir` (itself, its `runs/`, or its children holding a server file)."""
    d = Path(data_dir)
    if not d.is_dir():
        raise JaxrouteError(f"data folder not found: {d}")
    if is_run_folder(d):
        return [d]
    root = d / "runs" if (d / "runs").is_dir() else d
    runs = sorted(p for p in root.iterdir() if is_run_folder(p))
    if not runs:
        raise JaxrouteError(f"{d}: no run folders (each with {' or '.join(SERVER_FILES)} and its stage reports)")
    return runs
