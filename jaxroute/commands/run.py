"""`jaxroute run SPEC.yaml`: one experiment from a file (a spec, or an inference-perf config)."""

from __future__ import annotations

import argparse
import shlex
import textwrap


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "run",
        help="run one experiment from a spec file (or an inference-perf config.yml)",
        description=textwrap.fill(
            "Run the experiment a spec file describes: `command` (cluster, pd, decode, dispatch, bins, select, "
            "capacity cluster, tune cluster, ...) and that command's settings, named as its flags without the "
            "dashes (tp, policies, rate_stages, ...), in sections: deployment, workload, routers, control, slo, run, "
            "outputs, options. Every comparison command writes the spec of what it ran with --save-spec. An "
            "inference-perf config.yml (its data and load sections) runs as `jaxroute cluster` on that workload "
            "with the cluster's defaults, or under `workload: {inference_perf: FILE}` in a spec. Relative paths "
            "are relative to the spec's folder. Flags after the spec override it, e.g. `jaxroute run job.yaml "
            "--seeds 8 --out res.json`.", 100),
        epilog="example spec:\n" + textwrap.indent(EXAMPLE, "  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("spec", metavar="SPEC.yaml", help="the spec file or inference-perf config")
    p.add_argument("overrides", nargs=argparse.REMAINDER, metavar="FLAGS",
                   help="flags of the spec's command, after the spec's own (the later flag wins)")
    p.set_defaults(func=run)


EXAMPLE = """\
command: cluster
deployment: {gpu: h100, model: qwen3-32b, tp: 2, replicas: 8, admission: on-demand}
workload: {inference_perf: config.yml}   # or: {workload: shared-prefix, sp_groups: 150, ...}
routers: {policies: [llmd_precise, llmd_approx, llmd_load, random], weights: [{prefix: 3, queue: 2}]}
run: {seeds: 4}
outputs: {out: results.json, plot: results.png, requests_out: requests.csv}
"""


def run(args) -> int:
    from jaxroute import spec

    root = args.root_parser
    command, argv = spec.read(args.spec, root)
    full = command.split() + argv + list(args.overrides)
    inner = root.parse_args(full)
    args.command_name = f"{inner.command_name} (spec {args.spec})"  # an error names the command that failed
    rc = spec.run_parsed(inner, full, root)
    print(f"spec {args.spec} ran: jaxroute {shlex.join(full)}")
    return rc
