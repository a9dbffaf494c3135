"""CLI plumbing shared by the commands: typed flag converters, the common flags, refusals, output.

Importing this module (and building any parser) imports no JAX: the names and defaults the flags show come
from the jax-free `names` modules and `jaxroute.catalog`; the helpers that run or write something import
what they need when called.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from jaxroute import catalog
from jaxroute.clusters.names import CONTROL_DEFAULTS, check_control_names
from jaxroute.deployment import PD, PD_PAPER, PD_PRESETS, Deployment
from jaxroute.errors import JaxrouteError, warn
from jaxroute.experiments import names as ex_names
from jaxroute.experiments.names import CLUSTER_WORKLOADS
from jaxroute.routers.names import DECODE_POLICIES, PARTIAL_OK, PREFIX_POLICIES
from jaxroute.workloads.names import MAX_COUNT, SP_DEFAULTS

if TYPE_CHECKING:
    from jaxroute.experiments import pd

__all__ = [
    "add_grid_args", "add_model_args", "add_output_args", "add_save_spec", "add_shared_prefix_args", "shared_prefix_settings", "at_least", "check_conservation", "check_overflow", "requests_held", "choose", "csv_list",
    "finite_float", "fraction", "key_values", "list_of", "non_negative_float", "non_negative_int", "off_or", "positive_float",
    "positive_fraction", "positive_int", "probability", "rate_stages", "save_outputs", "show_progress", "warn",
]

# --------------------------------------------------------------------------- typed converters (argparse type=)
# Each raises argparse.ArgumentTypeError; argparse then exits with code 2 and
# "jaxroute CMD: error: argument --flag: expected ..., got 'VALUE'".


def _parse(text: str, kind: type, what: str):
    try:
        v = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {what}, got '{text}'") from None
    if kind is float and not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected {what}, got '{text}'")
    return v


def _checked(kind: type, what: str, ok: Callable[[float], bool]) -> Callable[[str], float]:
    def convert(text: str):
        v = _parse(text, kind, what)
        if not ok(v):
            raise argparse.ArgumentTypeError(f"expected {what}, got '{text}'")
        return v

    return convert


def _count(minimum: int, what: str) -> Callable[[str], int]:
    """Converter for a count >= minimum that an int32 holds (a larger one would fail inside numpy or JAX)."""
    check = _checked(int, what, lambda v: v >= minimum)

    def convert(text: str) -> int:
        v = check(text)
        if v > MAX_COUNT:
            raise argparse.ArgumentTypeError(f"expected {what} up to {MAX_COUNT:,} (an int32 count), got '{text}'")
        return v

    return convert


positive_int = _count(1, "a positive integer")
non_negative_int = _count(0, "an integer >= 0")
finite_float = _checked(float, "a finite number", lambda v: True)
positive_float = _checked(float, "a finite number > 0", lambda v: v > 0)
non_negative_float = _checked(float, "a finite number >= 0", lambda v: v >= 0)
probability = _checked(float, "a probability in [0, 1]", lambda v: 0.0 <= v <= 1.0)
fraction = _checked(float, "a fraction in [0, 1)", lambda v: 0.0 <= v < 1.0)
positive_fraction = _checked(float, "a fraction in (0, 1]", lambda v: 0.0 < v <= 1.0)


def at_least(minimum: float) -> Callable[[str], float]:
    """Converter for a finite number >= minimum."""
    return _checked(float, f"a finite number >= {minimum:g}", lambda v: v >= minimum)


def off_or(convert: Callable[[str], float]) -> Callable[[str], float]:
    """Converter that maps 'off' to +inf and anything else through `convert`."""

    def off_or_value(text: str) -> float:
        return math.inf if text.strip().lower() == "off" else convert(text)

    return off_or_value


def on_off(text: str) -> bool:
    """Converter for a switch: 'on' -> True, 'off' -> False."""
    key = text.strip().lower()
    if key not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got '{text}'")
    return key == "on"


def list_of(convert: Callable[[str], object], unique: bool = True) -> Callable[[str], list]:
    """Converter for a comma-separated list of values, each through `convert` (no repeats if unique)."""

    def values(text: str) -> list:
        items = [convert(t) for t in csv_list(text)]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got '{text}'")
        if unique and len(set(items)) != len(items):
            raise argparse.ArgumentTypeError(f"lists a value twice: '{text}'")
        return items

    return values


def key_values(text: str) -> dict[str, float]:
    """'name=number,...' -> {name: number} (e.g. router weights `prefix=3,kv=2,queue=2`)."""
    out = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or not key or not math.isfinite(number):
            raise argparse.ArgumentTypeError(f"expected name=number,... (e.g. prefix=3,kv=2), got '{text}'")
        if key in out:
            raise argparse.ArgumentTypeError(f"names '{key}' twice: '{text}'")
        out[key] = number
    return out


def rate_stages(text: str) -> list[tuple[float, float]]:
    """argparse type: 'RATE:SECONDS,...' (each > 0) -> [(rate, seconds), ...]."""
    stages = []
    for item in text.split(","):
        parts = item.strip().split(":")
        try:
            r, d = (float(x) for x in parts) if len(parts) == 2 else (math.nan, math.nan)
        except ValueError:
            r = d = math.nan
        if not (math.isfinite(r) and math.isfinite(d) and r > 0 and d > 0):
            raise argparse.ArgumentTypeError(f"expected RATE:SECONDS,... with each rate and duration > 0, got '{text}'")
        stages.append((r, d))
    return stages


def csv_list(text: str) -> list[str]:
    """Split `a,b, c` into ['a', 'b', 'c'] (empty items dropped)."""
    return [t.strip() for t in text.split(",") if t.strip()]


def choose(names: Sequence[str], allowed: Sequence[str], what: str) -> list[str]:
    """Lower-case and validate a list of names against the allowed ones (no repeats)."""
    out = []
    for n in names:
        key = n.lower()
        if key not in allowed:
            raise JaxrouteError(f"unknown {what} '{n}'; choose from: {', '.join(allowed)}")
        out.append(key)
    if not out:
        raise JaxrouteError(f"no {what} given; choose from: {', '.join(allowed)}")
    if len(set(out)) != len(out):
        raise JaxrouteError(f"a {what} is listed twice: {', '.join(names)}")
    return out


# --------------------------------------------------------------------------- the model flags

MODEL_CONFIG_HELP = ("the served model from its Hugging Face config.json, or the folder holding it (dense Llama/"
                     "Mistral/Qwen2/Qwen3, Mixtral, Qwen3-MoE, Llama-4, DeepSeek-V3; FP8 and W8A8 quantization_config: "
                     "jaxroute/hf_config.py); named after its folder; not with {flag} (default: {flag})")


def model_config_path(text: str) -> str:
    """argparse type of --model-config: the absolute path of a config.json (or its folder) that reads as a model
    (`catalog.get_model` reads it wherever a model name goes); its one-line error names the file and the field."""
    try:
        return catalog.model_ref(os.path.abspath(os.path.expanduser(text.strip())))
    except JaxrouteError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class _ModelConfig(argparse.Action):
    """--model-config PATH: keeps the path (dest model_config, a spec's `model_config` key) and puts it in the model
    flag's dest, so every later use of the model reads the config."""

    def __init__(self, *args, model_dest: str = "model", **kwargs) -> None:
        self.model_dest = model_dest
        super().__init__(*args, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, self.model_dest, values)


def add_model_args(p, *, default: str | None, help: str, flag: str = "--model", dest: str | None = None,
                   metavar: str = "NAME") -> None:
    """The model flags of a command: `flag` (a catalog name, or a config path: `catalog.get_model`) and
    --model-config PATH, one or the other (argparse refuses both in one line: "argument --model-config: not allowed
    with argument --model"). After parsing, args.<dest> (default: the flag's name) holds the catalog name given or the
    config's absolute path; pass it on as a model argument (`catalog.model_ref` makes either canonical)."""
    dest = dest or flag.lstrip("-").replace("-", "_")
    g = p.add_mutually_exclusive_group()
    g.add_argument(flag, dest=dest, default=default, metavar=metavar, help=help)
    g.add_argument("--model-config", dest="model_config", type=model_config_path, default=None, metavar="PATH",
                   action=_ModelConfig, model_dest=dest, help=MODEL_CONFIG_HELP.format(flag=flag))


# --------------------------------------------------------------------------- common flags


def add_output_args(p: argparse.ArgumentParser, plot: bool = True) -> None:
    """--out, --plot, --allow-overflow and --no-progress."""
    p.add_argument("--out", metavar="PATH.json", help="write results JSON (and a CSV beside it) (default: none)")
    if plot:
        p.add_argument("--plot", metavar="PATH.png", help="write a PNG plot (default: none)")
    p.add_argument("--allow-overflow", action="store_true",
                   help="print tables even when a fixed capacity overflowed (default: refuse with an error)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar (default: shown)")
    add_save_spec(p)


def add_save_spec(p: argparse.ArgumentParser) -> None:
    """--save-spec: write the experiment spec of this run (`jaxroute run` reruns it; `jaxroute.spec`)."""
    p.add_argument("--save-spec", metavar="PATH.yaml",
                   help="after a successful run, write its experiment spec (the flags given, by section: "
                   "deployment, workload, routers, control, slo, run, outputs); `jaxroute run PATH.yaml` reruns it "
                   "(default: none)")


def add_grid_args(p: argparse.ArgumentParser, *, seeds: int, requests: int | None = None,
                  seeds_help: str = "independent runs per row", requests_flag: str = "--requests") -> None:
    """The flags of every grid command: --seeds, --requests (when given a default), --seed and the outputs."""
    p.add_argument("--seeds", type=positive_int, default=seeds, metavar="S", help=f"{seeds_help} (default {seeds})")
    if requests is not None:
        p.add_argument(requests_flag, dest="requests", type=positive_int, default=requests, metavar="N",
                       help=f"requests per run (default {requests})")
    p.add_argument("--seed", type=non_negative_int, default=0, metavar="INT", help="base PRNG seed (default 0)")
    add_output_args(p)


# --sp-* flag (dest) -> shared-prefix setting (defaults: inference-perf's, `workloads.prefix.SP_DEFAULTS`)
SP_FLAGS = {"sp_groups": ("groups", "shared system prompts (groups)"),
            "sp_prompts_per_group": ("prompts_per_group", "questions per group"),
            "sp_system_len": ("system_tokens", "system prompt tokens"),
            "sp_question_len": ("question_tokens", "question tokens"),
            "sp_output_len": ("output_tokens", "output tokens")}


def add_shared_prefix_args(p: argparse.ArgumentParser) -> None:
    """The --sp-* flags of the shared-prefix workload."""
    for dest, (key, what) in SP_FLAGS.items():
        p.add_argument("--" + dest.replace("_", "-"), type=positive_int, default=None, metavar="N",
                       help=f"shared-prefix only: {what} (default {SP_DEFAULTS[key]}, inference-perf's)")


def shared_prefix_settings(args) -> dict:
    """{shared-prefix setting: value} of the --sp-* flags given."""
    return {key: getattr(args, dest) for dest, (key, _) in SP_FLAGS.items() if getattr(args, dest, None) is not None}


def show_progress(args) -> bool:
    return not getattr(args, "no_progress", False) and os.environ.get("JAXROUTE_NO_PROGRESS") != "1"


# --------------------------------------------------------------------------- refusals and output


def requests_held(workload, args) -> int:
    """The requests that will run: a trace shorter than --requests runs whole (said once, on stderr); the
    header, the JSON config and the requests/s line report this count, not the one asked."""
    n = int(workload.n_requests)
    if n < args.requests:
        warn(f"the trace holds {n:,} requests, fewer than --requests {args.requests:,}: all {n:,} run")
    return n


def check_overflow(records, args, hint: str) -> None:
    """Refuse (error) when any record overflowed, unless --allow-overflow."""
    bad = [r.policy for r in records if r.overflow]
    if bad and not getattr(args, "allow_overflow", False):
        raise JaxrouteError(f"a fixed capacity overflowed in: {', '.join(bad)}. {hint} "
                            "(or pass --allow-overflow to print anyway)")


def check_conservation(results, labels: Sequence[str] | None = None) -> None:
    """Refuse (error, always) when some row lost or invented requests: arrived != completed + in flight."""
    from jaxroute.experiments import conservation_failures

    bad = conservation_failures(results, labels)
    if bad:
        raise JaxrouteError(f"conservation failed (arrived != completed + in flight) in: {', '.join(bad)}; "
                            "this is a simulator bug, please report it")


def save_outputs(args, command: str, config: dict, records, plot: Callable[[str], object] | None = None,
                 extra: dict | None = None) -> None:
    """Write --out (JSON and CSV; `extra`: more JSON keys) and --plot (plot(path) draws it) when asked, and say so."""
    if getattr(args, "out", None):
        from jaxroute import report

        path = report.write_results(args.out, command, config, records, extra)
        print(f"wrote {path} and {path.with_suffix('.csv')}")
    if plot is not None and getattr(args, "plot", None):
        plot(args.plot)
        print(f"wrote {args.plot}")


# ----------------------------------------------------------------- shared by capacity, tune and pd

def rate_or_max(text: str) -> float:
    """argparse type of pd's --rate: a positive number of requests/s, or max (every request at t = 0: inf)."""
    return math.inf if text.strip().lower() == "max" else positive_float(text)


def rate_range(text: str) -> tuple[float, float]:
    """argparse type of --rate-range: LO:HI with 0 < LO < HI < inf."""
    try:
        lo, hi = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO:HI, got '{text}'") from None
    if not 0 < lo < hi < float("inf"):
        raise argparse.ArgumentTypeError(f"expected 0 < LO < HI, got '{text}'")
    return lo, hi


def slo_clauses(text: str):
    """argparse type of --slo (`capacity.parse_slo`)."""
    try:
        return ex_names.parse_slo(text)
    except JaxrouteError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _ratios(text: str) -> list[tuple[int, int]]:
    """argparse type for --ratios (the message of a bad pair, as a usage error)."""
    try:
        return ex_names.parse_ratios(text)
    except JaxrouteError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


PD_DEFAULT_REQUESTS = 400


def add_pd_args(p) -> None:
    """The deployment, routing and SLO flags of `pd` (shared with `capacity pd`)."""
    p.add_argument("--workload", default="shared-prefix", metavar="NAME",
                   help=f"one of: {', '.join(CLUSTER_WORKLOADS)} (default shared-prefix); mooncake and azure-conv read --trace")
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="trace file for mooncake (JSONL) or azure-conv (CSV) (default: ../shared/data/<the public trace>)")
    p.add_argument("--deployment", default="default", metavar="NAME",
                   help="hardware and topology preset: default (Llama-3.1-70B on H200, groups of TP 4, 4:4) or paper "
                   "(BalanceRoute's 4P1D: DeepSeek-V3-W8A8 on Ascend 910C, 4 prefill instances of 16 devices, 8 decode "
                   "DP ranks of TP 4 stepping as DP attention + expert parallelism, prefill chunks of 8,192 tokens); "
                   "--gpu, --model, --tp, --prefill-tp, --chunk, --prefill and --decode override it (default default)")
    p.add_argument("--prefill", type=positive_int, default=None, metavar="P", help=f"prefill groups (default: the deployment's, {PD.ratio[0]})")
    p.add_argument("--decode", type=positive_int, default=None, metavar="D", help=f"decode groups (default: the deployment's, {PD.ratio[1]})")
    p.add_argument("--ratios", type=_ratios, default=None, metavar="P:D,...",
                   help="P:D ratios to compare in one grid, e.g. 2:6,3:5,4:4,5:3,6:2 (default: --prefill:--decode)")
    p.add_argument("--prefill-router", default="llmd_precise", metavar="LIST",
                   help=f"comma-separated prefix routers for the prefill tier from: {', '.join(PREFIX_POLICIES)}; with "
                   f"several ratios only those that run on part of a tier: {', '.join(PARTIAL_OK)} (default llmd_precise)")
    p.add_argument("--decode-tier", default="dp", metavar="KIND",
                   help="decode tier: dp (data-parallel ranks stepping behind a barrier, BalanceRoute's setting) or "
                   "replicas (independent replicas with continuous batching, the replica engine; landed KV is "
                   "cached there) (default dp)")
    p.add_argument("--decode-router", default=None, metavar="LIST",
                   help=f"comma-separated decode routers: for --decode-tier dp from {', '.join(DECODE_POLICIES)} "
                   "(br0/brh bind from a prompt pool; brh uses --predictor) (default br0); for "
                   f"replicas any prefix router, with several ratios one of {', '.join(PARTIAL_OK)} (default least_load)")
    p.add_argument("--predictor", default="oracle", metavar="SPEC",
                   help="BR-H's horizon predictor: none, oracle, survival, exact or learned:DIR (a checkpoint of "
                   "`jaxroute train-predictor`); survival and exact are fitted on requests other than the simulated "
                   "ones (a trace's next --requests rows, or another draw of a synthetic workload); without prompt "
                   "keys exact predicts as survival (default oracle)")
    p.add_argument("--pd-threshold", type=list_of(non_negative_float), default=[0.0], metavar="TOKENS[,...]",
                   help="llm-d's prefix-based P/D decider (nonCachedTokens): disaggregate only when the uncached prompt "
                   "is at least this many tokens, counting the decode side as holding none of it; shorter ones are "
                   "prefilled by their decode worker (0 = always disaggregate, llm-d's default; several values give "
                   "rows) (default 0)")
    p.add_argument("--colocated", action="store_true",
                   help="add rows for the same number of groups as one replica cluster without disaggregation, "
                   "routed by each prefill router (default: off)")
    p.add_argument("--kv-link-gbps", type=positive_float, default=ex_names.DEFAULT_LINK_GBPS, metavar="GBPS",
                   help=f"KV link bandwidth per GPU in Gb/s (default {ex_names.DEFAULT_LINK_GBPS:g}: one ConnectX-7 NIC per "
                   "GPU, NVIDIA's DGX H100/H200 design)")
    p.add_argument("--kv-link-latency-ms", type=non_negative_float, default=ex_names.DEFAULT_LINK_LATENCY_MS, metavar="MS",
                   help=f"fixed latency per KV transfer in ms (default {ex_names.DEFAULT_LINK_LATENCY_MS:g}, assumed)")
    p.add_argument("--slo-ttft", type=positive_float, default=ex_names.DEFAULT_SLO_TTFT_S, metavar="S",
                   help=f"TTFT SLO in seconds for goodput (default {ex_names.DEFAULT_SLO_TTFT_S:g})")
    p.add_argument("--slo-tpot", type=positive_float, default=ex_names.DEFAULT_SLO_TPOT_S, metavar="S",
                   help=f"TPOT SLO in seconds for goodput (default {ex_names.DEFAULT_SLO_TPOT_S:g})")
    p.add_argument("--gpu", default=None, metavar="NAME", help=f"GPU: {', '.join(catalog.GPUS)} (default: the deployment's, {PD.gpu})")
    add_model_args(p, default=None,
                   help=f"model: {', '.join(catalog.MODELS)} (default: the deployment's, {PD.model})")
    p.add_argument("--tp", type=positive_int, default=None, metavar="T",
                   help="GPUs per decode group (tensor parallel), and per prefill group unless --prefill-tp (default: "
                   f"the deployment's, {PD.tp})")
    p.add_argument("--prefill-tp", type=positive_int, default=None, metavar="T",
                   help=f"GPUs per prefill group (default: the deployment's: {PD_PAPER.prefill_tp} for paper, else --tp)")
    p.add_argument("--cost-model", default="roofline", metavar="KIND", help="iteration time: roofline or preble (default roofline)")
    p.add_argument("--chunk", type=positive_int, default=None, metavar="TOKENS",
                   help=f"prefill tokens per iteration on a prefill replica (default: the deployment's, {PD.chunk})")
    p.add_argument("--max-running", type=positive_int, default=PD.max_running, metavar="B",
                   help=f"running requests per prefill replica (default {PD.max_running})")
    p.add_argument("--decode-slots", type=positive_int, default=PD.slots, metavar="S",
                   help=f"running requests per decode rank (default {PD.slots})")
    add_shared_prefix_args(p)


def pd_setup(args) -> tuple[str, list[pd.PDRow], object, Deployment]:
    """(workload name, rows, workload, deployment) from `add_pd_args`' flags, checked before anything runs
    (the names before JAX is imported)."""
    name = choose([args.workload], CLUSTER_WORKLOADS, "workload")[0]
    cost_model = choose([args.cost_model], ("roofline", "preble"), "cost model")[0]
    prefill_routers = choose(csv_list(args.prefill_router), PREFIX_POLICIES, "prefill router")
    tier = choose([args.decode_tier], ex_names.DECODE_TIERS, "decode tier")[0]
    default_decode = "br0" if tier == "dp" else "least_load"
    decode_routers = choose(csv_list(args.decode_router or default_decode), ex_names.decode_routers(tier),
                            "decode router")
    preset = choose([args.deployment], ex_names.PD_DEPLOYMENTS, "deployment")[0]
    if args.ratios and (args.prefill is not None or args.decode is not None):
        raise JaxrouteError("give either --ratios or --prefill/--decode, not both")
    ex_names.check_cluster_workload(name, args.trace, shared_prefix=shared_prefix_settings(args))
    from jaxroute.experiments import pd
    from jaxroute.experiments.cluster import build_workload

    base = PD_PRESETS[preset]
    ratios = args.ratios or [(args.prefill or base.ratio[0], args.decode or base.ratio[1])]
    given = {k: v for k, v in dict(gpu=args.gpu, model=args.model, tp=args.tp, prefill_tp=args.prefill_tp,
                                   chunk=args.chunk).items() if v is not None}
    base = dataclasses.replace(base, **given)
    gpu, model = catalog.get_gpu(base.gpu).name, catalog.model_ref(base.model)  # a name, or a config's path

    bank, predictor = (), 1
    if "brh" in decode_routers and tier == "dp":
        train = pd.train_lengths(name, args.requests, args.trace, shared_prefix_settings(args), args.seed)
        bank, predictor = pd.predictor_bank(args.predictor, train)
    dep = dataclasses.replace(base, predictor=predictor, bank=bank, gpu=gpu, model=model, cost_model=cost_model,
                              max_running=args.max_running, slots=args.decode_slots, link_gbps=args.kv_link_gbps,
                              link_latency_ms=args.kv_link_latency_ms, decode_tier=tier)
    rows = pd.rows_for(prefill_routers, decode_routers, ratios, thresholds=args.pd_threshold, colocated=args.colocated)
    pd.check_rows(rows, tier, dep)
    workload = build_workload(name, args.requests, args.trace, shared_prefix=shared_prefix_settings(args))
    return name, rows, workload, dep


# ----------------------------------------------------------------------------- the control plane's flags


def add_control_args(p) -> None:
    """The control plane's flags: autoscalers and gateways as rows (jaxroute/clusters/replicas/control.py)."""
    from jaxroute.clusters.names import CLASSES, GATES, SCALE_METRICS, SCALERS

    d = CONTROL_DEFAULTS
    g = p.add_argument_group("control plane (autoscaler and gateway; jaxroute/clusters/replicas/control.py, "
                             "docs/control.md)")
    g.add_argument("--autoscaler", type=list_of(str), default=None, metavar="LIST",
                   help=f"replica autoscalers, each a row per router, from: {', '.join(SCALERS)} (fixed: the initial "
                   "count throughout; hpa: Kubernetes HPA on --scale-metric; kpa: Knative's stable/panic windows on "
                   "requests in flight; sla: Dynamo's SLA planner from the arrival rate and --capacity-rps). "
                   "--replicas is then the most replicas; scale-ups become ready after --provision-s, scale-downs drain "
                   "(default: none, a fixed cluster)")
    g.add_argument("--gate", type=list_of(str), default=None, metavar="LIST",
                   help=f"gateway admission policies, each a row per router and autoscaler, from: {', '.join(GATES)} "
                   "(token_bucket: prompt tokens from a bucket, BLIS; tier_shed: classes below min_priority shed when "
                   "the busiest ready replica has more than tier_threshold in flight; saturation: llm-d's GAIE detector "
                   "sheds sheddable classes at saturation >= 1; flow_control: llm-d's flow-control queue, every "
                   "request waits by priority band and tenant and is dispatched while saturation < band_ceiling, "
                   "highest band first, --fairness within a band). Shed requests are counted, never lost (default: none)")
    g.add_argument("--fairness", default=d["fairness"], metavar="NAME",
                   help="flow_control: how a band picks among its tenants, global_strict (the oldest request first, "
                   f"GAIE's default) or round_robin (default {d['fairness']})")
    g.add_argument("--min-replicas", type=positive_int, default=d["min_replicas"], metavar="N",
                   help=f"fewest replicas the autoscaler keeps (default {d['min_replicas']})")
    g.add_argument("--initial-replicas", type=positive_int, default=None, metavar="N",
                   help="replicas ready at t = 0 (default: --min-replicas; --replicas with --gate alone)")
    g.add_argument("--replica-slots", type=positive_int, default=None, metavar="N",
                   help="replica slots the compiled model holds (scale-ups need a slot that is neither provisioning, "
                   "ready nor draining; a run that finds none is flagged replica_slots_full and rerun with twice as "
                   "many) (default: --replicas + a quarter, at least 1 more)")
    g.add_argument("--provision-s", type=non_negative_float, default=d["provision_s"], metavar="S",
                   help=f"scale-up to ready: node start and model load (default {d['provision_s']:g})")
    g.add_argument("--scale-metric", default=d["metric"], metavar="NAME",
                   help=f"hpa: the metric per ready replica, one of {', '.join(SCALE_METRICS)} (default {d['metric']})")
    g.add_argument("--scale-target", type=positive_float, default=d["target"], metavar="X",
                   help=f"hpa: the metric's target per replica; kpa: requests in flight per replica (default {d['target']:g})")
    g.add_argument("--scale-interval", type=positive_float, default=None, metavar="S",
                   help="seconds between autoscaler ticks (default: HPA's sync period 15, Knative's tick 2, "
                   "60 for the SLA planner)")
    g.add_argument("--capacity-rps", type=positive_float, default=d["capacity_rps"], metavar="REQ_PER_S",
                   help="sla: requests/s one replica sustains within the SLO (`jaxroute capacity` measures it) "
                   f"(default {d['capacity_rps']:g})")
    g.add_argument("--class-mix", type=key_values, default=None, metavar="CLASS=SHARE,...",
                   help=f"request classes (GAIE priorities: {', '.join(CLASSES)} = 4, 3, -1, -2, -3; negative = "
                   "sheddable), e.g. critical=0.3,batch=0.7 (default: all standard)")
    g.add_argument("--tenant-mix", type=lambda text: [positive_float(x) for x in text.split(",")], default=None,
                   metavar="SHARE,...",
                   help="tenants' shares of the requests, up to 8, for the tenant budget (default: one tenant)")
    g.add_argument("--gpu-price", type=non_negative_float, default=d["gpu_price"], metavar="PER_GPU_HOUR",
                   help="price of a GPU-hour for the cost column (default 1: the cost is in GPU-hours)")
    g.add_argument("--control-set", type=key_values, default=None, metavar="NAME=V,...",
                   help="other control settings: " + ", ".join(k for k in CONTROL_SET) + " (defaults from the "
                   "sources: HPA tolerance 0.1 and a 300 s scale-down window; Knative's 60 s stable and 6 s panic "
                   "windows, panic at 2x, rates 1000 up and 2 down; BLIS's bucket of 10,000 tokens at 1,000/s; GAIE's "
                   "thresholds 5 waiting and 0.8 KV; tier_shed at any load (0) below priority 3; slo_ttft_s and "
                   "slo_tpot_s bound goodput and attainment: docs/control.md) (default: those)")


CONTROL_SET = ("tolerance", "down_window_s", "stable_window_s", "panic_window_s", "panic_threshold", "max_up_rate",
               "max_down_rate", "bucket_tokens", "bucket_refill", "tier_threshold", "min_priority", "qd_threshold",
               "kv_threshold", "tenant_budget", "band_ceiling", "slo_ttft_s", "slo_tpot_s")


def check_names(given: dict | None, allowed, flag: str) -> None:
    """One line naming the first setting of a NAME=V,... flag that is not one of `allowed`."""
    if unknown := sorted(set(given or {}) - set(allowed)):
        raise JaxrouteError(f"unknown {flag} name '{unknown[0]}'; choose from: {', '.join(allowed)}")


def control_settings(args, replicas: int):
    """(autoscalers, gates, settings for `control.make`, replica slots) of the control flags; None without
    --autoscaler or --gate."""
    from jaxroute.clusters.names import CLASSES

    given = [f for f, v in (("--min-replicas", args.min_replicas != CONTROL_DEFAULTS["min_replicas"]),
                            ("--initial-replicas", args.initial_replicas), ("--replica-slots", args.replica_slots),
                            ("--class-mix", args.class_mix), ("--tenant-mix", args.tenant_mix),
                            ("--control-set", args.control_set), ("--scale-interval", args.scale_interval),
                            ("--fairness", args.fairness != CONTROL_DEFAULTS["fairness"])) if v]
    if not args.autoscaler and not args.gate:
        if given:
            raise JaxrouteError(f"{given[0]} applies with --autoscaler or --gate")
        return None
    check_names(args.control_set, CONTROL_SET, "--control-set")
    check_control_names(args.autoscaler or (), args.gate or ())
    mix = args.class_mix or {}
    if bad := sorted(set(mix) - set(CLASSES)):
        raise JaxrouteError(f"unknown class '{bad[0]}' in --class-mix; choose from: {', '.join(CLASSES)}")
    lo = args.min_replicas if args.autoscaler else replicas
    initial = args.initial_replicas or lo
    if lo > replicas:  # the flags named (the model's check would speak of its replica slots)
        raise JaxrouteError(f"--min-replicas {lo} is more than --replicas {replicas} (the most the autoscaler "
                            "may run); lower it or raise --replicas")
    if not lo <= initial <= replicas:
        raise JaxrouteError(f"--initial-replicas {initial} must lie in --min-replicas {lo} .. --replicas {replicas}")
    settings = dict(args.control_set or {}, min_replicas=lo, max_replicas=replicas,
                    initial=initial, provision_s=args.provision_s, metric=args.scale_metric,
                    target=args.scale_target, interval_s=args.scale_interval, capacity_rps=args.capacity_rps,
                    gpu_price=args.gpu_price, fairness=args.fairness)
    if "min_priority" in settings:
        settings["min_priority"] = int(settings["min_priority"])
    if mix:
        settings["class_mix"] = tuple(mix.get(c, 0.0) for c in CLASSES)
    if args.tenant_mix:
        settings["tenant_mix"] = tuple(args.tenant_mix)
    slots = args.replica_slots or replicas + max(1, replicas // 4)
    return args.autoscaler or ["fixed"], args.gate or ["none"], settings, slots


def control_variants(args, replicas: int):
    """(label, ControlParams) rows of the control flags (None without --autoscaler or --gate), and the model's slots."""
    from jaxroute.experiments import control as ctl_exp

    got = control_settings(args, replicas)
    if got is None:
        return None, replicas
    scalers, gates, settings, slots = got
    return ctl_exp.variants(scalers, gates, slots, settings), slots


# ----------------------------------------------------------------------------- the KV offload tiers' flags


def add_tier_args(p) -> None:
    """The KV offload tiers' flags: tier sizes as rows (jaxroute/clusters/replicas/tiers.py, docs/tiers.md)."""
    from jaxroute.clusters.names import TIER_DEFAULTS

    g = p.add_argument_group("KV offload tiers (a CPU tier per replica, one shared tier; jaxroute/clusters/replicas/"
                             "tiers.py, docs/tiers.md)")
    g.add_argument("--cpu-tier", type=list_of(non_negative_float), default=None, metavar="GIB,...",
                   help="CPU offload tier per replica, GiB of KV (vLLM's --kv-offloading-size, summed over the TP "
                   "ranks), each a row per router: GPU evictions move down to it and a later hit loads back over the "
                   "GPU's host link, the admitting iteration taking the load time longer; 0 = none (default: no tiers)")
    g.add_argument("--shared-tier", type=list_of(non_negative_float), default=None, metavar="GIB,...",
                   help="one tier shared by every replica (LMCache-style store), GiB of KV, each a row per router and "
                   "CPU tier: the CPU tiers' evictions move down to it; 0 = none (default: no tiers)")
    g.add_argument("--tier-set", type=key_values, default=None, metavar="NAME=V,...",
                   help="tier links: cpu_gbps (GB/s per GPU; default the GPU's PCIe host link, 32 for A6000/A100, 64 "
                   f"for H100/H200), shared_gbps (default {TIER_DEFAULTS['shared_gbps']:g}), shared_latency_ms "
                   f"(per load; default {TIER_DEFAULTS['shared_latency_ms']:g})")


TIER_SET = ("cpu_gbps", "shared_gbps", "shared_latency_ms")


def tier_rows(args):
    """(label, TierParams) rows of the tier flags (`experiments.cluster.tier_variants`); None without them."""
    if args.cpu_tier is None and args.shared_tier is None:
        if args.tier_set:
            raise JaxrouteError("--tier-set applies with --cpu-tier or --shared-tier")
        return None
    check_names(args.tier_set, TIER_SET, "--tier-set")
    from jaxroute.experiments.cluster import tier_variants

    return tier_variants(args.cpu_tier, args.shared_tier, args.gpu, args.model, args.tp, args.tier_set)


# ----------------------------------------------------------------------------- the LoRA adapters' flags


def add_lora_args(p) -> None:
    """The LoRA adapters' flags: adapter counts and skews as rows (jaxroute/clusters/replicas/adapters.py,
    docs/adapters.md)."""
    from jaxroute.clusters.names import LORA_DEFAULTS, LORA_SLOTS

    d = LORA_DEFAULTS
    g = p.add_argument_group("LoRA adapters (adapter slots per replica; jaxroute/clusters/replicas/adapters.py, "
                             "docs/adapters.md)")
    g.add_argument("--adapters", type=list_of(positive_int), default=None, metavar="N,...",
                   help="LoRA adapters the requests name, Zipf-popular (see --adapter-zipf), each a row per router; a "
                   "trace with an adapter_id column names its own (default: no adapters)")
    g.add_argument("--adapter-zipf", type=list_of(non_negative_float), default=None, metavar="S,...",
                   help=f"popularity exponents s, P(adapter k) ~ (k + 1)^-s, each a row (default {d['zipf_s']:g})")
    g.add_argument("--lora-slots", type=positive_int, default=LORA_SLOTS, metavar="N",
                   help="adapters a replica holds at once (vLLM's --max-loras); a request whose adapter cannot join "
                   f"waits while others are admitted (default {LORA_SLOTS}, vLLM's)")
    g.add_argument("--lora-set", type=key_values, default=None, metavar="NAME=V,...",
                   help=f"other adapter settings: rank (default {d['rank']}, vLLM's max_lora_rank), load_ms (default: "
                   f"{d['base_latency_ms']:g} ms + the rank's q/k/v/o weights over the GPU's host link), base_latency_ms, "
                   f"step_overhead (step time x (1 + this x distinct adapters in the batch); default {d['step_overhead']:g}, "
                   f"BLIS's at rank 16), base_share (requests on the base model; default {d['base_share']:g})")


LORA_SET = ("rank", "load_ms", "base_latency_ms", "step_overhead", "base_share")


def lora_rows(args, trace_adapters: int | None):
    """(label, LoraParams) rows of the adapter flags; None without adapters. `trace_adapters`: the adapters a
    trace's adapter_id column names (None: no such column)."""
    given = [f for f, v in (("--adapter-zipf", args.adapter_zipf), ("--lora-set", args.lora_set)) if v]
    if args.adapters is None and trace_adapters is None:
        if given:
            raise JaxrouteError(f"{given[0]} applies with --adapters (or a trace with an adapter_id column)")
        return None
    if args.adapters is not None and trace_adapters is not None:
        raise JaxrouteError("the trace names its requests' adapters (column adapter_id); drop --adapters")
    check_names(args.lora_set, LORA_SET, "--lora-set")
    from jaxroute.experiments.cluster import lora_variants

    counts = args.adapters or [max(trace_adapters, 1)]
    return lora_variants(counts, args.adapter_zipf, args.gpu, args.model, args.tp, args.lora_set,
                         label=trace_adapters is None)


# --------------------------------------------------------------------------- the latency model

LATENCY_MODELS = ("trained", "roofline", "preble")


def add_latency_args(p, default: str = "trained") -> None:
    """--latency-model (alias --cost-model) and --latency-params: the step time of a replica cluster."""
    p.add_argument("--latency-model", "--cost-model", dest="cost_model", default=None, metavar="KIND",
                   help="iteration time: trained (coefficients fitted to real vLLM runs on H100: jaxroute/data/latency/"
                   "trained.json, `jaxroute fit-latency`), roofline (today's calibration on the lecture's A6000 "
                   f"anchors) or preble (Preble's fitted A6000 equations) (default {default}"
                   + ("; roofline with --cost-params)" if default == "trained" else ")"))
    p.set_defaults(latency_default=default)
    p.add_argument("--latency-params", default=None, metavar="PATH.json",
                   help="the trained model's coefficients from your own fit (`jaxroute fit-latency --params-out`) "
                   "(default: the shipped ones)")


def latency_choice(args):
    """(cost model name, LatencyParams or None) from --latency-model / --cost-params / --latency-params."""
    given = getattr(args, "cost_params", None)
    implied = "roofline" if given else "trained" if args.latency_params else args.latency_default
    kind = (args.cost_model or implied).lower()  # --latency-params implies the trained model
    kind = choose([kind], LATENCY_MODELS, "latency model")[0]
    if args.latency_params is None:
        return kind, None
    if kind != "trained":
        raise JaxrouteError(f"--latency-params holds the trained model's coefficients; drop --latency-model {kind}")
    from jaxroute import latency_params

    return kind, latency_params.load(args.latency_params)


def warn_extrapolation(args, kind: str, latency) -> None:
    """One line, once the run is certain, when the trained model runs on a GPU its coefficients were not fitted on
    (they scale by the datasheet there: an extrapolation)."""
    gpu = getattr(args, "gpu", None)
    if gpu is None or kind != "trained":
        return
    from jaxroute import latency_params

    fitted = (latency or latency_params.default()).provenance.get("gpus") or []
    name = catalog.get_gpu(gpu).name
    if fitted and name not in fitted:
        warn(f"the trained latency model was fitted on {', '.join(fitted)}; on {name} it scales by the datasheet "
             "(an extrapolation; --latency-model roofline for today's model)")


# --------------------------------------------------------------------------- a vLLM server file


SERVER_SETS = ("tp", "chunk", "max_running", "admission")  # the flags a server file sets


def add_server_arg(p) -> None:
    """--server FILE; call it after the flags it sets (`SERVER_SETS`), whose defaults it records."""
    p.set_defaults(server_defaults={f: p.get_default(f) for f in SERVER_SETS})
    p.add_argument("--server", default=None, metavar="FILE",
                   help="vLLM's serve arguments (YAML: tensor_parallel_size, max_num_batched_tokens, max_num_seqs, "
                   "gpu_memory_utilization, block_size, ...; vLLM's defaults for the rest): they set --tp, --chunk, "
                   "--max-running, on-demand admission and, without --kv-capacity, the KV cache as vLLM sizes it "
                   "(default: none)")


def apply_server(args) -> None:
    """Read --server into the flags it sets (replacing their defaults); a flag given with another value than the
    file's is refused in one line. Prints vLLM's KV sizing with its parts."""
    if not getattr(args, "server", None):
        return
    from jaxroute import server

    srv = server.read_server(args.server, catalog.get_gpu(args.gpu).name)
    wanted = {"tp": srv.tensor_parallel_size, "chunk": srv.max_num_batched_tokens, "max_running": srv.max_num_seqs,
              "admission": "on-demand"}
    for flag, value in wanted.items():
        given = getattr(args, flag)
        if given != args.server_defaults[flag] and given != value:
            raise JaxrouteError(f"--{flag.replace('_', '-')} {given} disagrees with the server file's {value}; "
                                "drop one")
        setattr(args, flag, value)
    if args.kv_capacity is None:
        kv = server.kv_parts(args.gpu, args.model, srv.tensor_parallel_size, srv.gpu_memory_utilization,
                             srv.block_size)
        args.kv_capacity = kv.tokens
        print(f"server {args.server}: {kv.text()}")
