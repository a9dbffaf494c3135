"""Experiment specs: a command's settings as a YAML file, run by `jaxroute run SPEC.yaml`.

A spec names its command and gives that command's settings (the dests of its flags: `tp`, `policies`,
`rate_stages`, ...) in sections a reader scans: deployment, workload, routers, control, slo, run, outputs and
options (whatever fits none). The command's own parser checks every value, so a spec accepts exactly what
the flags accept and a setting's default lives in one place, the flag's. Every comparison command writes
the spec of what it just ran with `--save-spec PATH` (the flags given, in their sections), and running it
reproduces the same numbers. An inference-perf `config.yml` is also a spec: its `data` and `load`
sections become a `jaxroute cluster` workload (`workloads.inference_perf`), alone or under
`workload: {inference_perf: FILE or the sections inline}` beside a deployment and routers.

Relative paths in a spec are relative to the spec's folder. The structure (sections, the command's name)
is validated by pydantic; every bad field is named in one line with its value and what is allowed.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from jaxroute import output_paths
from jaxroute.errors import JaxrouteError, warn
from jaxroute.mapping_files import read_mapping

# setting (a flag's dest) -> the section `--save-spec` writes it in; any other setting goes to `options`
SECTION_OF = {
    **dict.fromkeys(("deployment", "gpu", "model", "model_config", "tp", "prefill_tp", "replicas", "admission", "max_running",
                     "chunk", "local", "priority_groups", "kv_capacity", "cost_model", "max_queue", "cache_slots",
                     "e2_ring", "prefill", "decode", "ratios", "decode_tier", "decode_slots", "kv_link_gbps",
                     "kv_link_latency_ms", "colocated", "servers", "ranks", "cost_params", "latency_params", "server", "cpu_tier", "shared_tier",
                     "tier_set", "lora_slots", "lora_set"), "deployment"),
    **dict.fromkeys(("workload", "trace", "requests", "rate", "rate_stages", "hot_tool", "sp_groups",
                     "sp_prompts_per_group", "sp_system_len", "sp_question_len", "sp_output_len", "inference_perf",
                     "rate_range", "adapters", "adapter_zipf"), "workload"),
    **dict.fromkeys(("policies", "policy", "weights", "theta", "stale", "e2_window", "e2_th_bal", "e2_pairing",
                     "e2_autoscale", "router_set", "params_json", "prefill_router", "decode_router", "predictor",
                     "pd_threshold", "d"), "routers"),
    **dict.fromkeys(("slo", "slo_ttft", "slo_tpot", "goodput"), "slo"),
    **dict.fromkeys(("autoscaler", "gate", "min_replicas", "initial_replicas", "replica_slots", "provision_s",
                     "scale_metric", "scale_target", "scale_interval", "capacity_rps", "class_mix", "tenant_mix",
                     "gpu_price", "control_set", "fairness"), "control"),
    **dict.fromkeys(("seeds", "seed", "allow_overflow", "no_progress"), "run"),
    **dict.fromkeys(("out", "plot", "requests_out", "stage_plot"), "outputs"),
}
SECTIONS = ("deployment", "workload", "routers", "control", "slo", "run", "outputs", "options")
NOT_SAVED = ("save_spec", "func", "command", "no_compile_cache")  # settings of the saving, not of the experiment


class Spec(BaseModel):
    """A spec file's structure: the command, a description, and settings by section."""

    model_config = ConfigDict(extra="forbid")
    command: str
    description: str | None = None
    deployment: dict[str, Any] = {}
    workload: dict[str, Any] = {}
    routers: dict[str, Any] = {}
    control: dict[str, Any] = {}
    slo: dict[str, Any] = {}
    run: dict[str, Any] = {}
    outputs: dict[str, Any] = {}
    options: dict[str, Any] = {}

    @field_validator("command")
    @classmethod
    def _known(cls, v: str, info) -> str:
        known = _parsers(info.context["root"])
        if v not in known:
            raise ValueError(f"unknown command '{v}'; choose from: {', '.join(sorted(known))}")
        return v


def _parsers(root: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The (sub)commands of the `jaxroute` parser `root` that take a spec, by name ("cluster", "capacity
    cluster"): those with --save-spec."""
    out = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, p in action.choices.items():
                    walk(p, f"{prefix} {name}".strip())
        if prefix and any(a.dest == "save_spec" for a in parser._actions):
            out[prefix] = parser

    walk(root, "")
    return out


def split_command(argv: list[str], first: str, root: argparse.ArgumentParser) -> tuple[str, list[str]]:
    """(command name, the flags after it) of a command line whose (first) command word is `first`."""
    i = argv.index(first)
    words = [first]
    known = _parsers(root)
    while i + 1 < len(argv) and any(k.startswith(" ".join(words + [argv[i + 1]])) for k in known):
        i += 1
        words.append(argv[i])
    return " ".join(words), argv[i + 1:]


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest not in ("help", *NOT_SAVED)}


def _is_path(action: argparse.Action) -> bool:
    meta = str(action.metavar or "")
    return any(k in meta for k in ("PATH", "DIR", "FILE"))


def _text(value: Any) -> str:
    """A YAML value as flag text: lists joined by commas, {name: number} as name=number, pairs as a:b."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        if set(value) == {"rate", "seconds"} or set(value) == {"rate", "duration"}:
            return f"{_text(value['rate'])}:{_text(value.get('seconds', value.get('duration')))}"
        return ",".join(f"{k}={_text(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):  # a list, or a list of pairs such as rate stages [[3, 80], ...]
        return ",".join(_pair(v) for v in value)
    return str(value)


def _pair(v: Any) -> str:
    if isinstance(v, (list, tuple)) and len(v) == 2:
        return f"{_text(v[0])}:{_text(v[1])}"
    return _text(v)


def _tokens(action: argparse.Action, value: Any, where: str, base: Path) -> list[str]:
    """The flag tokens of one setting, each value checked by the flag's own converter."""
    flag = action.option_strings[-1]
    if action.nargs == 0:  # a switch
        if not isinstance(value, bool):
            raise JaxrouteError(f"{where}: expected true or false, got {value!r}")
        return [flag] if value else []
    items = value if isinstance(action, argparse._AppendAction) and isinstance(value, list) else [value]
    out = []
    for item in items:
        text = _text(item)
        if _is_path(action) and not os.path.isabs(text):
            text = str(base / text)
        if action.type is not None:
            try:
                action.type(text)
            except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
                raise JaxrouteError(f"{where}: {e}") from None
        if action.choices is not None and text not in action.choices:
            raise JaxrouteError(f"{where}: {text!r} is not one of {', '.join(map(str, action.choices))}")
        out += [flag, text]
    return out


def read(path: str | Path, root: argparse.ArgumentParser) -> tuple[str, list[str]]:
    """(command, argv after the command) of a spec file, or of an inference-perf config (a cluster run), for the
    `jaxroute` parser `root`."""
    from jaxroute.workloads import inference_perf

    p = Path(path)
    raw = read_mapping(p, "spec file", "a mapping with a `command` and its settings")
    if inference_perf.is_config(raw):
        return "cluster", ["--inference-perf", str(p)]
    try:
        spec = Spec.model_validate(raw, context={"root": root})
    except ValidationError as e:
        parts = [f"{'.'.join(map(str, err['loc'])) or 'spec'}: {err['msg'].removeprefix('Value error, ')}"
                 for err in e.errors()]
        raise JaxrouteError(f"{p.name}: " + "; ".join(parts)) from None
    actions = _actions(_parsers(root)[spec.command])
    argv: list[str] = []
    seen: dict[str, str] = {}
    errors = []
    for section in SECTIONS:
        for key, value in getattr(spec, section).items():
            where = f"{p.name}: {section}.{key}"
            if key not in actions:
                errors.append(f"{where}: not a setting of `jaxroute {spec.command}`; its settings: "
                              f"{', '.join(sorted(actions))}")
                continue
            if key in seen:
                errors.append(f"{where}: also given in {seen[key]}")
                continue
            seen[key] = section
            if value is None:
                continue
            if key == "inference_perf" and isinstance(value, dict):
                value = _inline_config(value)
            try:
                argv += _tokens(actions[key], value, where, p.parent)
            except JaxrouteError as e:
                errors.append(str(e))
    if errors:
        raise JaxrouteError("; ".join(errors))
    return spec.command, argv


def _inline_config(config: dict) -> str:
    """An inline inference-perf config, written to a file for --inference-perf."""
    import yaml

    fd, name = tempfile.mkstemp(prefix="jaxroute-inference-perf-", suffix=".yml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(config, f)
    return name


def given_settings(command: str, argv: list[str], root: argparse.ArgumentParser) -> dict[str, Any]:
    """{dest: value} of the flags given on a command line (argv after the command), as the user typed them."""
    actions = _actions(_parsers(root)[command])
    by_flag = {s: a for a in actions.values() for s in a.option_strings}
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        flag, eq, inline = token.partition("=")
        action = by_flag.get(flag)
        i += 1
        if action is None:
            continue
        if action.nargs == 0:
            out[action.dest] = True
            continue
        text = inline if eq else argv[i]
        i += 0 if eq else 1
        value = _native(text)
        if isinstance(action, argparse._AppendAction):
            out.setdefault(action.dest, []).append(value)
        else:
            out[action.dest] = value
    return out


def _native(text: str) -> Any:
    """Flag text as a YAML value: an int or float when it reads as one exactly, else the text."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        v = float(text)
        return v if math.isfinite(v) and repr(v) == text else text
    except ValueError:
        return text


def save(path: str | Path, command: str, argv: list[str], root: argparse.ArgumentParser,
         description: str | None = None) -> Path:
    """Write the spec of `jaxroute COMMAND ARGV` (the flags given, by section; paths relative to the spec)."""
    import yaml

    p = Path(path)
    actions = _actions(_parsers(root)[command])
    settings = given_settings(command, argv, root)
    doc: dict[str, Any] = {"command": command}
    if description:
        doc["description"] = description
    for key, value in settings.items():
        if _is_path(actions[key]) and isinstance(value, str) and not os.path.isabs(value):
            value = os.path.relpath(os.path.abspath(value), os.path.abspath(p.parent))
        doc.setdefault(SECTION_OF.get(key, "options"), {})[key] = value
    ordered = {k: doc[k] for k in ("command", "description", *SECTIONS) if k in doc}
    header = f"# jaxroute experiment spec: run it with `jaxroute run {p.name}`\n# written by: jaxroute {command} {shlex.join(argv)}\n"
    output_paths.write_text(p, header + yaml.safe_dump(ordered, sort_keys=False))
    return p


def run_parsed(args: argparse.Namespace, argv: list[str], root: argparse.ArgumentParser) -> int:
    """Run a parsed `jaxroute` command line (its output paths, GPUs and models checked first, without JAX:
    `output_paths.check_args`, `catalog.check_args`); with --save-spec, write the spec of what it ran once it
    succeeded."""
    from jaxroute import catalog

    output_paths.check_args(args)
    catalog.check_args(args)
    rc = int(args.func(args) or 0)
    if rc == 0 and getattr(args, "seeds", None) == 1:  # said after the run, never before an error
        warn("one seed gives no confidence interval")
    if rc == 0 and getattr(args, "save_spec", None):
        command, after = split_command(argv, args.command, root)
        print(f"wrote {save(args.save_spec, command, after, root)}")
    return rc
