"""`jaxroute reproduce`: run a source's reproductions and write a report a person can read."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from jaxroute.commands._common import csv_list, positive_int, show_progress
from jaxroute.errors import JaxrouteError
from jaxroute.sources import SOURCES

MAX_JOBS = 4  # default worker processes at most (each holds its own compiled programs in memory)

_ABOUT = {
    "lecture": "the lecture's §1-§3: dispatch theory, balls into bins, stale information, the cache-aware cluster, Preble",
    "balanceroute": "BalanceRoute (arXiv 2605.06113): the decode-DP barrier, BR-0 / BR-H against the baselines",
    "llmselector": "LLMSelector in the lecture's toy compound-AI world (§4)",
    "production-routers": "llm-d, Dynamo, SGLang, production-stack and AIBrix routers; P/D disaggregation; capacity",
}


def register(subparsers) -> None:
    listing = "; ".join(f"{s}: {_ABOUT[s]}" for s in SOURCES)
    p = subparsers.add_parser(
        "reproduce",
        help="reproduce a source's claims: DIR/report.md (claims, our numbers with CIs, verdicts), results.json, PNGs",
        description="Run the reproductions of a source and write DIR/report.md: for each claim of the source, our "
        "number with its 95 % CI beside the source's, a verdict (reproduced / direction only / differs) and a reason "
        "where it differs; Markdown tables; PNG figures beside the report. Also DIR/results.json (docs/architecture.md's "
        "results convention: one record per claim). Each experiment's part is saved in DIR/parts/ as soon as it is "
        f"done, so an interrupted run resumes where it stopped (--fresh reruns everything). Sources: {listing}.",
    )
    p.add_argument("source", choices=[*SOURCES, "all"], help="which source to reproduce (all: every one, in order)")
    p.set_defaults(output_dirs=("out",))
    p.add_argument("--out", default="results/reproduce", metavar="DIR",
                   help="report folder: report.md, results.json, PNGs, parts/ (default results/reproduce)")
    p.add_argument("--quick", action="store_true",
                   help="small sizes, same code paths (all of them: about 4 min on 2 idle cores with --jobs 2 and an empty compile cache, measured 3:49; a smoke run, not results); marked QUICK in the report (default: full size)")
    p.add_argument("--only", type=csv_list, default=[], metavar="NAMES",
                   help="comma-separated experiment names to run (see --list); the report holds only those (default: all)")
    p.add_argument("--seeds", type=positive_int, default=None, metavar="N",
                   help="seeds per configuration in every experiment (default: each experiment's own)")
    p.add_argument("--fresh", action="store_true", help="rerun experiments already written in DIR/parts/ (default: resume, skipping them)")
    p.add_argument("--list", action="store_true", help="list the source's experiments and exit (default off)")
    p.add_argument("--readme", default=None, metavar="FILE",
                   help="also write a summary of the report (provenance, verdict tally, every claim with its verdict) into "
                        "FILE between the lines '<!-- reproduce:SOURCE begin -->' and '<!-- reproduce:SOURCE end -->' "
                        "(rerun on a finished DIR, this only resumes and rewrites; default: no summary)")
    p.add_argument("--jobs", type=positive_int, default=None, metavar="N",
                   help="worker processes running experiments at once, the longest first (those that share grids run in one "
                   "worker; compilation is single-threaded, so a second core compiles a second experiment) "
                   f"(default: the CPU cores, at most {MAX_JOBS})")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (also JAXROUTE_NO_PROGRESS=1; default: one bar per experiment)")
    p.set_defaults(func=main)


def main(args) -> int:
    from jaxroute.reproduce import experiments, parse_sources, run, write_readme_block

    sources = parse_sources(args.source)
    if args.list:
        for s in sources:
            for e in experiments(s):
                print(f"{s:20s} {e.name:16s} {e.title}")
        return 0
    command = " ".join(["jaxroute reproduce", args.source, "--out", shlex.quote(str(args.out))]
                       + (["--quick"] if args.quick else []) + (["--only", ",".join(args.only)] if args.only else [])
                       + (["--seeds", str(args.seeds)] if args.seeds else []) + (["--fresh"] if args.fresh else []))
    if args.readme is not None:
        _check_readme(args.readme, args.source)
        command += f" --readme {shlex.quote(str(args.readme))}"
    jobs = args.jobs or min(MAX_JOBS, os.cpu_count() or 1)
    run(sources, args.out, quick=args.quick, seeds=args.seeds, only=args.only, fresh=args.fresh,
        progress=show_progress(args), command=command, jobs=jobs)
    if args.readme is not None:
        path = write_readme_block(args.readme, args.source, args.out, command)
        print(f"wrote the {args.source} summary into {path}")
    return 0


def _check_readme(path: str, key: str) -> None:
    """Refuse before any simulation when FILE cannot take the summary."""
    from jaxroute.reproduce.document import find_block, missing_block

    file = Path(path)
    if not file.is_file():
        raise JaxrouteError(f"--readme {path}: no such file")
    if find_block(file.read_text(), key) is None:
        raise JaxrouteError(f"--readme {path}: {missing_block(key)}")
