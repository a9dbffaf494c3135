"""The experiments' names, defaults and argument grammars, defined once and importable without JAX.

The parsers of `jaxroute` show these and check arguments with them (`parse_slo`, `parse_ratios` are
argparse types) without importing the models, so `jaxroute --help` and argument errors need no JAX; the
experiment modules import them from here (`dispatch.CLI_POLICIES`, `pd.DEFAULT_SLO_TTFT_S`,
`capacity.parse_slo`, ... stay where they were).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import TYPE_CHECKING

from jaxroute.errors import JaxrouteError
from jaxroute.routers.names import DECODE_POLICIES, PREFIX_POLICIES
from jaxroute.workloads.names import PREFIX_WORKLOADS, TRACE_WORKLOADS

if TYPE_CHECKING:
    import numpy as np

# ----------------------------------------------------------------- classic dispatch (dispatch.py)
# CLI policy names -> model policy ids; p2c is power-of-d with d = --d (2 unless changed).
DISPATCH_POLICIES = {"random": "random", "rr": "rr", "jsq": "jsq", "p2c": "pod", "pod": "pod", "lwl": "lwl"}


def unstable_reason(load: float) -> str:
    """Why a dispatch load >= 1 has no steady state (the refusal, and the report of a run allowed anyway)."""
    return (f"load {load:g} >= 1 is unstable: the queues grow without bound, so there is no steady state and the "
            "response times grow with --requests")


def check_load(load: float, allow_unstable: bool) -> None:
    """Refuse a load that is not > 0, and a load >= 1 unless `allow_unstable` (known before any run: no ring
    size can hold queues that grow without bound)."""
    if not load > 0:
        raise JaxrouteError(f"--load must be > 0, got {load}")
    if load >= 1.0 and not allow_unstable:
        raise JaxrouteError(unstable_reason(load) + "; pass --allow-unstable to run it once anyway")

# ----------------------------------------------------------------- replica cluster (cluster.py)
# The synthetic decode workloads' lengths with one private prompt per request (no sharing; BalanceRoute's datasets)
LENGTH_WORKLOADS: tuple[str, ...] = ("synthetic-prod", "synthetic-azure24")
CLUSTER_WORKLOADS: tuple[str, ...] = PREFIX_WORKLOADS + TRACE_WORKLOADS + LENGTH_WORKLOADS


def check_cluster_workload(name: str, trace=None, hot_tool: float = 0.0, shared_prefix: dict | None = None,
                           rate_stages=None) -> None:
    """Refuse, without JAX, a cluster workload's flags that do not go together (`cluster.build_workload` and the
    commands, before they load the models): an unknown name, --trace, --hot-tool or --sp-* where they do not
    apply, a --trace file that is not there."""
    if name not in CLUSTER_WORKLOADS:
        raise JaxrouteError(f"unknown workload '{name}'; choose from: {', '.join(CLUSTER_WORKLOADS)}")
    if shared_prefix and name != "shared-prefix":
        raise JaxrouteError(f"--sp-* flags apply to --workload shared-prefix only, not '{name}'")
    if name in LENGTH_WORKLOADS and (hot_tool or rate_stages or trace is not None):
        raise JaxrouteError(f"'{name}' draws its own lengths and Poisson arrivals: --hot-tool, --rate-stages "
                            "and --trace do not apply (--rate rescales its arrivals)")
    if hot_tool and name != "toolbench":
        raise JaxrouteError("--hot-tool applies to --workload toolbench only")
    check_trace_flag(name, trace, TRACE_WORKLOADS)


def check_trace_flag(workload: str, trace, readers) -> None:
    """Refuse, without JAX, --trace for a workload that reads none (`readers`: those that do) or a trace file that
    is not there."""
    if trace is None:
        return
    if workload not in readers:
        raise JaxrouteError(f"--trace is for {' / '.join(readers)}, not the synthetic workload '{workload}'")
    check_input_file(trace, "trace file")


def check_input_file(path, what: str) -> None:
    """Refuse, in one line, an input path that is missing or is a folder."""
    from pathlib import Path

    p = Path(path)
    if not p.exists():
        raise JaxrouteError(f"{what} not found: {p}")
    if p.is_dir():
        raise JaxrouteError(f"{what} {p} is a folder; name a file")

# ----------------------------------------------------------------- P/D disaggregation (pd.py)
# A DGX H100/H200 pairs each GPU with its own ConnectX-7 port on the compute fabric (NVIDIA DGX H100 User Guide,
# 1.2.3 Network Modules, Table 6: eight OSFP ports, one per GPU), 400 Gb/s NDR each: the path NIXL / Mooncake
# transfer engines use for KV. A transfer also pays a fixed latency (an RDMA round trip is a few microseconds;
# a transfer-engine request with its metadata exchange, ~0.1 ms, is our assumption, not a measurement).
DEFAULT_LINK_GBPS = 400.0
DEFAULT_LINK_LATENCY_MS = 0.1
DEFAULT_SLO_TTFT_S = 2.0
DEFAULT_SLO_TPOT_S = 0.1
DECODE_TIERS: tuple[str, ...] = ("dp", "replicas")
PD_DEPLOYMENTS: tuple[str, ...] = ("default", "paper")  # the keys of `deployment.PD_PRESETS`, in this order


def decode_routers(tier: str) -> tuple[str, ...]:
    """The decode routers a decode tier takes: decode policies (dp) or prefix router presets (replicas)."""
    if tier not in DECODE_TIERS:
        raise JaxrouteError(f"unknown decode tier '{tier}'; choose from: {', '.join(DECODE_TIERS)}")
    return DECODE_POLICIES if tier == "dp" else PREFIX_POLICIES


def parse_ratios(text: str) -> list[tuple[int, int]]:
    """'2:6,4:4' -> [(2, 6), (4, 4)] (each count >= 1)."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            a, b = (int(x) for x in part.split(":"))
        except ValueError:
            raise JaxrouteError(f"a P:D ratio is two integers like 4:4, got '{part}'") from None
        if a < 1 or b < 1:
            raise JaxrouteError(f"a P:D ratio needs at least one prefill and one decode group, got '{part}'")
        out.append((a, b))
    if not out:
        raise JaxrouteError("--ratios is empty; give P:D pairs like 2:6,4:4")
    return out


# ----------------------------------------------------------------- decode data parallelism (decode.py)
DECODE_DEPLOYMENTS: tuple[str, ...] = ("default", "paper")  # the keys of `deployment.DECODE_PRESETS`, in this order
# the decode model's metrics that are compared against the best paper baseline; True = lower is better
LOWER_IS_BETTER = {"imbalance_tokens": True, "imbalance_loaded_tokens": True, "barrier_idle_tokens": True,
                   "tpot_p95_s": True, "tpot_p95_loaded_s": True, "throughput_tok_s": False,
                   "throughput_loaded_tok_s": False, "tokens_per_step": False, "tokens_per_step_loaded": False}
# objectives of `jaxroute tune decode` (tune_decode.py): metrics of the decode model, True = maximised
DECODE_OBJECTIVES = {**{m: not low for m, low in LOWER_IS_BETTER.items()},
                     "makespan_s": False, "preemptions": False, "recomputed_tokens": False,
                     "util_mean": True, "util_min": True}
DEFAULT_DECODE_OBJECTIVE = "throughput_tok_s"

# ----------------------------------------------------------------- SLOs (capacity.py, tune.py)
_BOUND = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=)\s*([-+0-9.eE]+)\s*$")


@dataclasses.dataclass(frozen=True)
class Bound:
    """One SLO clause: metric op value (op '<=' or '>=')."""

    metric: str
    op: str
    value: float

    def holds(self, x: np.ndarray) -> np.ndarray:
        return x <= self.value if self.op == "<=" else x >= self.value


def parse_slo(text: str) -> tuple[Bound, ...]:
    """'ttft_p90_s<=2,tpot_p90_s<=0.1' -> the clauses (all must hold)."""
    out = []
    for part in (p for p in text.split(",") if p.strip()):
        m = _BOUND.match(part)
        if not m:
            raise JaxrouteError(f"an SLO clause is METRIC<=VALUE or METRIC>=VALUE, got '{part.strip()}'")
        value = float(m.group(3))
        if not math.isfinite(value):
            raise JaxrouteError(f"an SLO bound must be a finite number, got '{part.strip()}'")
        out.append(Bound(m.group(1), m.group(2), value))
    if not out:
        raise JaxrouteError("the SLO is empty; give METRIC<=VALUE[,...]")
    return tuple(out)
