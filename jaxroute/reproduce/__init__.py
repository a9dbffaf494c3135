"""Reproductions of the sources (lecture, BalanceRoute, LLMSelector, production routers) as one readable report.

Each source module defines `EXPERIMENTS` (a list of `document.Experiment`). `run(...)` runs the chosen
sources' experiments, writes each one's part as soon as it is done (so an interrupted run resumes where it
stopped), then `DIR/report.md` and `DIR/results.json` from all parts.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from jaxroute import output_paths, report
from jaxroute.errors import Interrupted, JaxrouteError
from jaxroute.reproduce.document import (
    Context,
    Experiment,
    Section,
    load_part,
    render,
    replace_block,
    save_part,
    summary_markdown,
    verdict_counts,
)
from jaxroute.sources import SOURCES

# SOURCES: source -> its modules here, in report order (in jaxroute/sources.py, jax-free: the CLI lists them)


def experiments(source: str) -> list[Experiment]:
    """The experiments of one source, in report order."""
    if source not in SOURCES:
        raise JaxrouteError(f"unknown source '{source}'; choose from: {', '.join(SOURCES)}, all")
    out = []
    for mod in SOURCES[source]:
        out += importlib.import_module(f"jaxroute.reproduce.{mod}").EXPERIMENTS
    return out


def parse_sources(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise JaxrouteError(f"no source given; choose from: {', '.join(SOURCES)}, all")
    if "all" in names:
        return list(SOURCES)
    for n in names:
        experiments(n)  # names the unknown one
    return list(dict.fromkeys(names))


def git_commit() -> str:
    try:
        here = Path(__file__).resolve().parent
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=10)
        # only the package's own code makes the numbers: edits elsewhere (README, docs, tests) do not count
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", str(here.parent)],
                               cwd=here, capture_output=True, text=True, timeout=10)
        if rev.returncode == 0:
            return rev.stdout.strip() + (" (with uncommitted changes to jaxroute/)" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown (not a git checkout)"


def device_line() -> str:
    import jax

    devs = jax.devices()
    return f"{len(devs)} x {devs[0].device_kind} ({jax.default_backend()}; jax {jax.__version__}; {platform.node()})"


def run(sources: Sequence[str], out_dir: str | Path, *, quick: bool = False, seeds: int | None = None,
        only: Sequence[str] = (), fresh: bool = False, progress: bool = True, echo: bool = True,
        command: str = "jaxroute reproduce", todo: Sequence[Experiment] | None = None,
        jobs: int = 1) -> tuple[Path, list[Section]]:
    """Run (or resume) the sources' experiments; write report.md, results.json and the PNGs into out_dir.

    only: experiment names to run (default all); fresh: rerun experiments an earlier run already wrote;
    todo: these experiments instead of the sources' (a script's module); jobs: worker processes
    (`run_in_workers`; 1 runs everything in this process).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = list(todo) if todo is not None else [e for s in sources for e in experiments(s)]
    if only:
        unknown = set(only) - {e.name for e in todo}
        if unknown:
            raise JaxrouteError(f"unknown experiment(s) {', '.join(sorted(unknown))}; the chosen sources have: "
                                f"{', '.join(e.name for e in todo)}")
        todo = [e for e in todo if e.name in only]
    try:
        return _run(sources, todo, out_dir, quick=quick, seeds=seeds, fresh=fresh, progress=progress, echo=echo,
                    command=command, jobs=jobs)
    except KeyboardInterrupt:  # the workers are stopped; what they saved is kept, and a rerun resumes from it
        saved = sum(load_part(out_dir, e.source, e.name, quick) is not None for e in todo)
        raise Interrupted(f"interrupted; {saved} of {len(todo)} experiments saved in {out_dir / 'parts'}, rerun "
                          "the same command to resume") from None


def _run(sources, todo: list[Experiment], out_dir: Path, *, quick: bool, seeds: int | None, fresh: bool,
         progress: bool, echo: bool, command: str, jobs: int) -> tuple[Path, list[Section]]:
    ran_now: set[tuple[str, str]] = set()
    start = time.perf_counter()
    if jobs > 1:
        pending = [e for e in todo if fresh or load_part(out_dir, e.source, e.name, quick) is None]
        ran_now = run_in_workers(pending, out_dir, jobs=jobs, quick=quick, seeds=seeds, echo=echo, progress=progress)
    sections: list[Section] = []
    for exp in todo:
        if (exp.source, exp.name) in ran_now:  # written by a worker of this run
            sections.append(dataclasses.replace(load_part(out_dir, exp.source, exp.name, quick), resumed=False))
            continue
        done = None if fresh else load_part(out_dir, exp.source, exp.name, quick)
        if done is not None:
            if echo:
                print(f"[{exp.source}.{exp.name}] resumed from {out_dir / 'parts'} (written by an earlier run)")
            sections.append(done)
            continue
        sections.append(_run_one(exp, out_dir, quick=quick, seeds=seeds, progress=progress, echo=echo))
        save_part(out_dir, sections[-1])
    commits = list(dict.fromkeys(s.commit or "unknown" for s in sections)) or [git_commit()]
    header = {"sources": ", ".join(sources), "quick": quick, "command": command, "commit": ", ".join(commits),
              "device": device_line(),
              "seeds": "; ".join(f"{s.key} {s.seeds}" for s in sections if s.seeds is not None) or "-",
              "wall_s": sum(s.wall_s for s in sections), "resumed": sum(s.resumed for s in sections)}
    if ran_now:
        header |= {"jobs": jobs, "elapsed_s": time.perf_counter() - start}
    path = out_dir / "report.md"
    output_paths.write_text(path, render(sections, header))
    report.write_json(out_dir / "results.json", results_json(sections, header))
    if echo:
        print(f"wrote {path} and {out_dir / 'results.json'}: "
              + verdict_counts(c.verdict for s in sections for c in s.claims))
    return path, sections


def _module(exp: Experiment) -> str:
    return exp.run.__module__


def _previous_wall(out_dir: Path, keys: list[tuple[str, str]], quick: bool) -> float:
    """Seconds the parts of `keys` took in an earlier run in out_dir (inf when one is missing)."""
    parts = [load_part(out_dir, source, name, quick) for source, name in keys]
    return sum(p.wall_s for p in parts) if all(p is not None for p in parts) else float("inf")


def _jax_setup() -> dict:
    """The JAX settings the CLI made in this process (devices, compile cache), for worker processes."""
    import jax

    names = ("jax_num_cpu_devices", "jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    return {n: getattr(jax.config, n) for n in names}


def _worker_group(keys: list[tuple[str, str]], out_dir: str, quick: bool, seeds: int | None, echo: bool,
                  setup: dict) -> list[tuple[str, str]]:
    """In a worker process: run the experiments `keys` (one task's) in order, saving each part."""
    import jax

    from jaxroute import compile_log

    for name, value in setup.items():
        jax.config.update(name, value)
    compile_log.log_from_env()  # as `cli.main` does
    by_key = {(e.source, e.name): e for src in {k[0] for k in keys} for e in experiments(src)}
    for key in keys:
        section = _run_one(by_key[key], Path(out_dir), quick=quick, seeds=seeds, progress=False, echo=echo)
        save_part(Path(out_dir), section)
        sys.stdout.flush()
    return keys


def plan_tasks(todo: Sequence[Experiment], out_dir: Path, quick: bool) -> list[list[tuple[str, str]]]:
    """The worker tasks for `todo`, in the order to start them: lists of (source, name) run in order.

    Each experiment is a task of its own, except those of a module that sets `ONE_WORKER` (its experiments
    share grids in memory or read a sibling's part): one task runs them in order. The longest go first: by the
    wall time of the task's parts an earlier run left in `out_dir`; tasks without one go first, those of more
    experiments first, then the later sources' (the production routers' runs are the longest)."""
    tasks: dict[str, list[tuple[str, str]]] = {}
    for e in todo:
        module = _module(e)
        together = getattr(importlib.import_module(module), "ONE_WORKER", False)
        tasks.setdefault(module if together else f"{module}.{e.name}", []).append((e.source, e.name))
    listed = list(tasks.values())
    return [listed[i] for i in sorted(range(len(listed)), reverse=True,
                                      key=lambda i: (_previous_wall(out_dir, listed[i], quick), len(listed[i]), i))]


def run_in_workers(todo: Sequence[Experiment], out_dir: Path, *, jobs: int, quick: bool, seeds: int | None,
                   echo: bool, progress: bool) -> set[tuple[str, str]]:
    """Run `todo` on `jobs` worker processes (`plan_tasks`; a free worker takes the next task), writing their
    parts; the (source, name) of each one run. Compilation is single-threaded, so the workers compile at
    once; they share the compile cache."""
    import concurrent.futures as cf
    import multiprocessing

    order = plan_tasks(todo, out_dir, quick)
    if len(order) < 2:
        return set()
    done: set[tuple[str, str]] = set()
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc=f"reproduce ({jobs} workers)", unit="experiment", dynamic_ncols=True)
    setup = _jax_setup()
    pool = cf.ProcessPoolExecutor(max_workers=min(jobs, len(order)), mp_context=multiprocessing.get_context("spawn"),
                                  initializer=_leave_ctrl_c_to_the_parent)
    try:
        futures = [pool.submit(_worker_group, keys, str(out_dir), quick, seeds, echo, setup) for keys in order]
        for fut in cf.as_completed(futures):
            keys = fut.result()  # a worker's exception is raised here
            done.update(keys)
            if bar is not None:
                bar.update(len(keys))
    except BaseException:  # Ctrl-C or a worker's error: stop the others now, not after their experiments
        _stop_workers(pool)
        raise
    finally:
        if bar is not None:
            bar.close()
    pool.shutdown()
    return done


def _leave_ctrl_c_to_the_parent() -> None:
    """A worker ignores Ctrl-C (the terminal sends it to every process of the group): the parent stops it."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stop_workers(pool) -> None:
    """End a worker pool at once: queued tasks cancelled, running workers terminated (a part is written whole or
    not at all, so nothing half-saved is left)."""
    processes = list(getattr(pool, "_processes", {}).values())  # no public way before Python 3.14
    pool.shutdown(wait=False, cancel_futures=True)
    for p in processes:
        p.terminate()
    for p in processes:
        p.join(timeout=10)


def _run_one(exp: Experiment, out_dir: Path, *, quick: bool, seeds: int | None, progress: bool,
             echo: bool) -> Section:
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=exp.steps(quick), desc=f"{exp.source}.{exp.name}", unit="step", dynamic_ncols=True)

    def advance(desc: str) -> None:
        if bar is not None:
            bar.set_postfix_str(desc[:40])
            bar.update(1)

    ctx = Context(out_dir=out_dir, quick=quick, seeds=seeds, echo=echo, advance=advance)
    ctx.log(f"[{exp.source}.{exp.name}] {exp.title}")
    from jaxroute import compile_log, sim

    compile_log.tag_programs(f"{exp.source}.{exp.name}")  # the compile log names the experiment of each program
    start = time.perf_counter()
    try:
        with sim.collecting_grids() as grids:
            section = exp.run(ctx)
    finally:
        if bar is not None:
            bar.close()
        import jax

        jax.clear_caches()  # one process runs every experiment: free their compiled programs between them
    section.source, section.name, section.quick = exp.source, exp.name, quick
    section.overflow = any(bool(g.overflow.any()) for g in grids)
    section.wall_s = time.perf_counter() - start
    section.commit = git_commit()
    section.log = ctx.lines
    for _, file in section.figures:
        if not (out_dir / file).exists():
            raise RuntimeError(f"{exp.source}.{exp.name} links figure {file}, which it did not write")
    return section


def write_readme_block(readme: str | Path, key: str, out_dir: str | Path, command: str) -> Path:
    """Put the summary of the report in out_dir (its results.json) into readme's block for `key`."""
    readme, out_dir = Path(readme), Path(out_dir)
    results = json.loads((out_dir / "results.json").read_text())
    link = os.path.relpath(out_dir / "report.md", readme.resolve().parent).replace(os.sep, "/")
    try:
        text = replace_block(readme.read_text(), key, summary_markdown(results, link), command)
    except ValueError as e:
        raise JaxrouteError(f"--readme {readme}: {e}") from None
    output_paths.write_text(readme, text)
    return readme


def script_main(module: str, argv: Sequence[str] | None = None, description: str | None = None) -> int:
    """The `scripts/reproduce_*.py` wrappers: run one module's experiments into a report folder."""
    import argparse

    mod = importlib.import_module(f"jaxroute.reproduce.{module}")
    names = [e.name for e in mod.EXPERIMENTS]
    source = mod.EXPERIMENTS[0].source
    ap = argparse.ArgumentParser(description=description or mod.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, same code paths (a smoke run)")
    ap.add_argument("--out", default=f"results/{module}", metavar="DIR",
                    help=f"report folder: report.md, results.json, PNGs, parts/ (default results/{module})")
    ap.add_argument("--only", default=",".join(names), metavar="NAMES",
                    help=f"comma-separated experiments (default all: {','.join(names)})")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per configuration (default: each experiment's own)")
    ap.add_argument("--fresh", action="store_true", help="rerun experiments already written in DIR/parts/")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(only) - set(names))
    if unknown:
        ap.error(f"unknown experiment(s) {', '.join(unknown)}; choose from {', '.join(names)}")
    if args.seeds is not None and args.seeds < 1:
        ap.error(f"--seeds must be a positive integer, got {args.seeds}")
    from jaxroute.runtime import use_all_cpu_cores

    use_all_cpu_cores()
    script = Path(sys.argv[0]).name if argv is None else f"<{module} wrapper>"
    command = f"python scripts/{script} " + " ".join(argv if argv is not None else sys.argv[1:])
    run([source], args.out, quick=args.quick, seeds=args.seeds, only=only, fresh=args.fresh,
        progress=not args.no_progress, command=command.strip(), todo=mod.EXPERIMENTS)
    return 0


def results_json(sections: Sequence[Section], header: dict) -> dict:
    """The results convention (docs/architecture.md): one record per claim (our value as its metric), experiments' data beside."""
    results = []
    for s in sections:
        for c in s.claims:
            metrics = {"ours": c.value} if c.value else {}
            results.append({"policy": s.key, "params": {"claim": c.claim, "where": c.where}, "overflow": s.overflow,
                            "metrics": metrics, "source": c.source, "ours": c.ours, "verdict": c.verdict,
                            "reason": c.reason})
    return {"command": "reproduce", "config": header, "results": results,
            "experiments": {s.key: s.data for s in sections}}
