"""`jaxroute bench`: simulated requests per second of every model, beside its pure-Python reference and BLIS."""

from __future__ import annotations

import argparse

from jaxroute.bench import config as C
from jaxroute.commands._common import (
    choose,
    csv_list,
    list_of,
    positive_float,
    positive_int,
)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark every model: simulated requests/s, per core, compile time, memory, scaling, vs references",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Time every model of jaxroute in one run and write one JSON (--out).

Parts (--only selects some; all by default):
  dispatch  JSQ on 16 FCFS servers at load 0.9, exponential service
  cluster   replica cluster on synthetic longdoc and toolbench: the default routers
            (rr,least_load,threshold,cache_guard,sglang_cache_aware) in one grid, preble_e2 in its own
  blis      BLIS's scenario: 4 x Llama-3.1-8B on H100, Poisson 48 req/s, prompt 2,000, output 200, rr,
            with unique prompts (a Mooncake-style table) and with 256 shared 1,500-token prefixes;
            BLIS beside: timed in the same run with --blis-run, else its figures from ../shared/tools/blis/README.md
  trace     the unique-prompt table at growing lengths (rr, 1 seed): is requests/s flat?
  decode    decode DP at G=8 with BR-0 and BR-H (oracle), saturated
  decision  P50/P99 latency of one jitted BR-0 / BR-H binding decision at G=8

For each model and seed count: requests/s of a steady run (a second run with other seeds, results
on the host), requests/s per core (CPU: over the cores used, one per JAX CPU device; accelerators:
per device), the first run's time (compilation included) and the compile time alone (jax.monitoring),
the bytes of one row's state (jax.eval_shape of init), and its pure-Python reference timed in the
same run on the same workload (the JSQ loop; tests/reference_replicas.py; tests/reference_dp_decode.py
-- these two need a source checkout: elsewhere they are reported unavailable). Scaling: requests/s
from the second-largest to the largest seed count (flat or rising?), and time per request at 2x the
requests per seed (linear?). A size that runs out of memory is recorded and the larger ones skipped.

The full sizes take long on a small CPU (the cluster at 1,024 seeds and the 50,000-request trace
most: drop them with --cluster-seeds / --trace-sizes). --quick runs every part at tiny sizes to
check that it all works (its numbers mean little; compiling ~20 programs takes most of its time).
First-run times include compilation only when the persistent compile cache misses: use
`jaxroute --no-compile-cache bench` for cold numbers.""",
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help="every part at tiny sizes (4 seeds, no 2x-requests runs; few requests; trace sizes 32,64; 50 decision calls; "
                      "cluster on toolbench only); explicit flags still win (default: the full sizes)")
    size.add_argument("--gpu-sizes", action="store_true",
                      help="seed counts for an accelerator: dispatch 1,64,1024,4096,16384,65536; cluster and decode "
                      "1,64,1024,4096 (each guarded: an out-of-memory keeps the smaller sizes) (default: off)")
    p.add_argument("--only", metavar="LIST", help=f"comma-separated parts to run: {', '.join(C.PARTS)} (default: all)")
    seeds = list_of(positive_int)
    p.add_argument("--seeds", type=seeds, metavar="LIST",
                   help="seed counts for dispatch, cluster and decode (default 1,64,1024; quick 4)")
    for model in ("dispatch", "cluster", "decode"):
        p.add_argument(f"--{model}-seeds", type=seeds, metavar="LIST", help=f"seed counts for {model} (default: --seeds)")
    p.add_argument("--dispatch-requests", type=positive_int, metavar="N", help="requests per seed (default 20000)")
    p.add_argument("--dispatch-servers", type=positive_int, metavar="N", help="dispatch servers (default 16)")
    p.add_argument("--dispatch-load", type=positive_float, metavar="RHO", help="dispatch load, below 1 (default 0.9)")
    p.add_argument("--cluster-requests", type=positive_int, metavar="N", help="requests per seed (default 500; quick 24)")
    p.add_argument("--decode-requests", type=positive_int, metavar="N", help="requests per seed (default 1000; quick 32)")
    p.add_argument("--workloads", metavar="LIST",
                   help="cluster workloads (synthetic prefix workloads; default longdoc,toolbench; quick toolbench)")
    p.add_argument("--policies", metavar="LIST",
                   help=f"routers run together in one cluster grid (default {','.join(C.DEFAULT_POLICIES)})")
    p.add_argument("--separate", metavar="LIST",
                   help="routers each timed in a cluster grid of their own (default preble_e2; 'none' for none)")
    p.add_argument("--replicas", type=positive_int, metavar="G", help="cluster replicas (default 4)")
    p.add_argument("--cluster-rate", type=positive_float, metavar="REQ_S",
                   help="arrival rate of every cluster workload (default: longdoc 1, toolbench 40 requests/s)")
    p.add_argument("--blis-requests", type=seeds, metavar="LIST", help="BLIS scenario sizes (default 2000,10000; quick 32)")
    p.add_argument("--blis-seeds", type=positive_int, metavar="S", help="seeds of each BLIS-scenario run (default 1, as BLIS)")
    p.add_argument("--blis-run", metavar="RUN_SH",
                   help="BLIS's run script (../shared/tools/blis/run.sh, BLIS built with build.sh there): time BLIS "
                   "in the same run on the same scenarios and sizes, one core, CACHE_DELAY_US=0, and compare with it "
                   "(default: BLIS's figures from that folder's README)")
    p.add_argument("--blis-repeats", type=positive_int, metavar="N",
                   help="BLIS runs per scenario and size, median; also the arrival draws per rate of the fidelity "
                   "sweep (default 3)")
    p.add_argument("--blis-rates", type=list_of(positive_float), metavar="LIST",
                   help="with --blis-run: arrival rates (requests/s) at which ours and BLIS's TTFT, TPOT/ITL and E2E "
                   "means are compared on the unique-prompt scenario at the first --blis-requests size "
                   "(default 40,48,56)")
    p.add_argument("--trace-sizes", type=seeds, metavar="LIST",
                   help="trace lengths in requests (default 2000,10000,50000; quick 32,64); sizes also in "
                   "--blis-requests are reused; the largest may take long (progress printed; Ctrl-C skips it)")
    p.add_argument("--request-scaling", action=argparse.BooleanOptionalAction, default=None,
                   help="also time each model at 2x its requests per seed (the linear-in-requests check) "
                   "(default: on; quick: off)")
    p.add_argument("--no-references", action="store_true", help="skip the pure-Python references (default: run them)")
    p.add_argument("--ref-seeds", type=positive_int, metavar="S", help="seeds of the Python JSQ loop, best of 3 runs (default 8)")
    p.add_argument("--ref-requests", type=positive_int, metavar="N", help="requests of the cluster reference run (default 200)")
    p.add_argument("--ref-decode-requests", type=positive_int, metavar="N",
                   help="requests of the decode reference run (default 32)")
    p.add_argument("--ref-decode-steps", type=positive_int, metavar="K",
                   help="barrier steps the decode reference runs (default 300; it takes ~10 ms per step)")
    p.add_argument("--jobs", metavar="LIST",
                   help=f"user jobs of the jobs part: {', '.join(C.JOBS)} (default: all; see jaxroute/bench/jobs.py)")
    p.add_argument("--job-requests", type=positive_int, metavar="N",
                   help="requests of each job (default: its full size, 17,040 and the whole Mooncake trace; quick 16)")
    p.add_argument("--calls", type=positive_int, metavar="N", help="timed calls per decision benchmark (default 2000)")
    p.add_argument("--max-repeat-s", type=positive_float, metavar="S",
                   help="a first run longer than this is not repeated: its steady time is the first run minus "
                   "the compile time (default 120)")
    p.add_argument("--progress", action="store_true", help="show progress bars inside the long simulations (default: one line per measurement)")
    p.add_argument("--cost-profile", action=argparse.BooleanOptionalAction, default=None,
                   help="one more (profiled) run per model that counts scan steps, kernel launches and loop trips "
                   "per simulated request (default: on; quick: off)")
    p.add_argument("--out", default="results/bench.json", metavar="PATH.json",
                   help="where to write the JSON (default results/bench.json)")
    p.set_defaults(func=run)


def config_from_args(args) -> C.BenchConfig:
    """The BenchConfig of the parsed flags: the preset's sizes, then every flag given."""
    from jaxroute.routers.names import PREFIX_POLICIES
    from jaxroute.workloads.names import PREFIX_WORKLOADS

    kw: dict = {}
    if args.only:
        kw["parts"] = tuple(choose(csv_list(args.only), C.PARTS, "bench part"))
    for model in ("dispatch", "cluster", "decode"):
        given = getattr(args, f"{model}_seeds") or args.seeds
        if given:
            kw[f"{model}_seeds"] = tuple(given)
    simple = {"dispatch_requests": "dispatch_requests", "dispatch_servers": "dispatch_servers",
              "dispatch_load": "dispatch_load", "cluster_requests": "cluster_requests",
              "decode_requests": "decode_requests", "replicas": "replicas", "cluster_rate": "cluster_rate",
              "blis_seeds": "blis_seeds", "ref_seeds": "ref_seeds", "ref_requests": "ref_requests",
              "ref_decode_requests": "ref_decode_requests", "ref_decode_steps": "ref_decode_steps",
              "calls": "decision_calls", "max_repeat_s": "max_repeat_s", "blis_run": "blis_run",
              "blis_repeats": "blis_repeats"}
    kw.update({field: getattr(args, flag) for flag, field in simple.items() if getattr(args, flag) is not None})
    if args.blis_requests:
        kw["blis_requests"] = tuple(args.blis_requests)
    if args.blis_rates:
        kw["blis_rates"] = tuple(args.blis_rates)
    if args.jobs:
        kw["jobs"] = tuple(choose(csv_list(args.jobs), C.JOBS, "bench job"))
    if args.job_requests is not None:
        kw["job_requests"] = args.job_requests
    if args.trace_sizes:
        kw["trace_sizes"] = tuple(args.trace_sizes)
    if args.workloads:
        kw["cluster_workloads"] = tuple(choose(csv_list(args.workloads), PREFIX_WORKLOADS, "cluster workload"))
    if args.policies:
        kw["policies"] = tuple(choose(csv_list(args.policies), PREFIX_POLICIES, "router"))
    if args.separate:
        names = csv_list(args.separate)
        kw["separate"] = () if names == ["none"] else tuple(choose(names, PREFIX_POLICIES, "router"))
    if args.request_scaling is not None:
        kw["request_scaling"] = args.request_scaling
    if args.no_references:
        kw["references"] = False
    if args.progress:
        kw["progress"] = True
    if args.cost_profile is not None:
        kw["cost_profile"] = args.cost_profile
    preset = "quick" if args.quick else "gpu" if args.gpu_sizes else "full"
    return C.BenchConfig.preset_named(preset, **kw)


def run(args) -> int:
    cfg = config_from_args(args)
    import jax

    from jaxroute import report
    from jaxroute.bench import format_report, run_bench

    print(f"jaxroute bench ({cfg.preset} sizes): parts {', '.join(p for p in C.PARTS if p in cfg.parts)}; "
          f"{len(jax.devices())} x {jax.devices()[0].device_kind}", flush=True)
    cache = jax.config.jax_compilation_cache_dir

    def checkpoint(partial: dict) -> None:  # the JSON so far, so a run stopped early keeps its numbers
        report.write_json(args.out, dict(partial, config=dict(partial["config"], compile_cache_dir=cache)))

    res = run_bench(cfg, checkpoint)
    res["config"]["compile_cache_dir"] = cache
    print()
    print(format_report(res))
    path = report.write_json(args.out, res)
    print(f"wrote {path}")
    return 1 if res["errors"] else 0
