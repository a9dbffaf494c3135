"""What a simulated request costs the hardware, counted rather than timed: scan steps, kernel launches,
while-loop trips, compiled ops per step.

A grid program (`sim.run_grid`) is a while loop of blocks of `sim.DONE_CHECK_EVERY` scan steps; the body of
that inner loop is one batched scan step. `profile(run)` runs `run()` once under JAX's profiler while
`sim.recording_programs()` keeps the programs it launched, compiles their text (from the compile cache) and
attributes every executed operation (one thunk on the CPU: a fused kernel, a copy, a loop) to the
computation it belongs to. From the counts:

- scan steps executed = executions of the step body (every instruction in it runs once per step);
- launches = operations executed (per step, per request), each computation's runtime operations times its
  executions: what a GPU pays per dependent kernel launch;
- each while loop nested in the step (admission, eviction, preemption): its trips (executions of its body);
- compiled ops per step = runtime operations in the step body's program text (its nested loops counted once).

These do not depend on the machine's speed, so they project to an accelerator before one is lent
(`projection`: launches x an assumed time per dependent launch, divided over the rows that run together).
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import re
import statistics
import tempfile

import jax

from jaxroute import sim

# HLO instructions that launch nothing at run time (views and plumbing of the thunk runtime).
_FREE_OPS = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
                       "partition-id", "replica-id", "opt-barrier"})
# An accelerator's cost of one dependent kernel launch, assumed for the projection: CUDA's launch latency
# is 2-5 us and a while loop's predicate goes to the host each trip (cudaMemcpy + sync, ~10 us);
# stated in the JSON beside the projection.
ASSUMED_US_PER_LAUNCH = 5.0

_COMP_HEAD = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*\S.*?\s([\w\-]+)\((.*)$")
_CALLS = re.compile(r"(?:condition|body|calls|to_apply|branch_computations|true_computation|false_computation)"
                    r"=\{?(%[\w.\-]+(?:,\s*%[\w.\-]+)*)\}?")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_FRAME_ID = re.compile(r"stack_frame_id=(\d+)")


@dataclasses.dataclass
class Instr:
    name: str
    opcode: str
    computation: str
    calls: tuple[str, ...]  # computations it runs (loop body and condition, branches, fused computation)
    trip_count: int | None  # a while loop's known trip count
    source: str  # the JAX operation it came from (op_name metadata), "" when unknown
    frame: int | None  # its stack frame id (`frames`: the Python lines that traced it)


def parse_hlo(text: str) -> dict[str, list[Instr]]:
    """computation name -> its instructions, from an optimized HLO module's text."""
    comps: dict[str, list[Instr]] = {}
    current = None
    for line in text.splitlines():
        if current is None:
            m = _COMP_HEAD.match(line)
            if m and ("->" in line or line.startswith("ENTRY")):
                current = m.group(2)
                comps[current] = []
            continue
        if line.startswith("}"):
            current = None
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        calls = tuple(c.strip().lstrip("%") for grp in _CALLS.findall(line) for c in grp.split(","))
        trips, op_name, frame = _TRIPS.search(line), _OP_NAME.search(line), _FRAME_ID.search(line)
        comps[current].append(Instr(m.group(1), m.group(2), current, calls,
                                    int(trips.group(1)) if trips else None, op_name.group(1) if op_name else "",
                                    int(frame.group(1)) if frame else None))
    return comps


def _section(text: str, name: str) -> str:
    """The body of one of the module's debug tables (FileNames, FunctionNames, FileLocations, StackFrames)."""
    m = re.search(rf"^{name}\n(.*?)(?:\n\n|\Z)", text, re.M | re.S)
    return m.group(1) if m else ""


def frames(text: str) -> dict[int, str]:
    """stack frame id -> "path:line (function)" of the innermost jaxroute line in it (the module's debug
    tables; frames outside the package, e.g. JAX's, are skipped up to their jaxroute caller)."""
    files = dict(re.findall(r'^(\d+) "([^"]*)"', _section(text, "FileNames"), re.M))
    funcs = dict(re.findall(r'^(\d+) "([^"]*)"', _section(text, "FunctionNames"), re.M))
    locs = {a: (files.get(f, "?"), funcs.get(fn, "?"), line) for a, f, fn, line in re.findall(
        r"^(\d+) \{file_name_id=(\d+) function_name_id=(\d+) line=(\d+)", _section(text, "FileLocations"), re.M)}
    parent = {int(a): (loc, int(p)) for a, loc, p in re.findall(
        r"^(\d+) \{file_location_id=(\d+) parent_frame_id=(\d+)", _section(text, "StackFrames"), re.M)}
    out = {}
    for fid in parent:
        f, seen = fid, set()
        while f in parent and f not in seen:
            seen.add(f)
            path, func, line = locs.get(parent[f][0], ("?", "?", "?"))
            if "jaxroute/" in path:
                out[fid] = f"{'jaxroute/' + path.rsplit('jaxroute/', 1)[1]}:{line} ({func})"
                break
            f = parent[f][1]
    return out


def _runtime(instrs: list[Instr]) -> list[Instr]:
    return [i for i in instrs if i.opcode not in _FREE_OPS]


def step_body(comps: dict[str, list[Instr]]) -> str | None:
    """The computation of one scan step: the body of the while loop that runs `sim.DONE_CHECK_EVERY` trips."""
    for instrs in comps.values():
        for i in instrs:
            if i.opcode == "while" and i.trip_count == sim.DONE_CHECK_EVERY:
                return i.calls[-1] if i.calls else None
    return None


def _reachable(comps: dict[str, list[Instr]], root: str) -> tuple[set[str], dict[str, Instr]]:
    """(every computation run from `root`: loop bodies and conditions, branches, calls; while instruction
    name -> the instruction, for every loop among them)."""
    loops, todo, seen = {}, [root], set()
    while todo:
        c = todo.pop()
        if c in seen or c not in comps:
            continue
        seen.add(c)
        for i in comps[c]:
            if i.opcode == "while" and i.calls:
                loops[i.name] = i
            if i.opcode in ("while", "conditional", "call"):
                todo += list(i.calls)
    return seen, loops


def _executions(counts: collections.Counter, instrs: list[Instr]) -> int:
    """How many times a computation ran: the median execution count of its runtime instructions."""
    seen = [counts[i.name] for i in _runtime(instrs) if counts[i.name] > 0]
    return int(statistics.median(seen)) if seen else 0


def program_figures(hlo_text: str, counts: collections.Counter) -> dict | None:
    """Steps, launches and loop trips of one program, from its text and its operations' execution counts."""
    comps = parse_hlo(hlo_text)
    body = step_body(comps)
    if body is None:
        return None
    where = frames(hlo_text)
    under_step, loops = _reachable(comps, body)
    steps = _executions(counts, comps[body])
    # each computation's runtime operations, times its executions (robust to a kernel traced as several tasks)
    launches = sum(_executions(counts, comps.get(c, [])) * len(_runtime(comps.get(c, []))) for c in under_step)
    nested = []
    for name, loop in loops.items():
        loop_body = comps.get(loop.calls[-1], [])  # (condition, body): the body is named last
        trips = _executions(counts, loop_body)
        nested.append({"loop": name, "where": where.get(loop.frame, "?"), "source": loop.source.split("/", 1)[-1],
                       "known_trip_count": loop.trip_count,
                       "ops_per_trip": len(_runtime(loop_body)), "trips": trips,
                       "trips_per_step": trips / steps if steps else None})
    nested.sort(key=lambda x: -x["trips"] * x["ops_per_trip"])
    return {"steps": steps, "launches": launches, "launches_per_step": launches / steps if steps else None,
            "compiled_ops_per_step": len(_runtime(comps[body])), "nested_loops": nested}


def _event_counts(xspace_path: str) -> dict[int, collections.Counter]:
    """Executions of each operation in a profile, per program: program id -> {instruction name: count}
    (the executor's events name their instruction and program in their stats)."""
    pd = jax.profiler.ProfileData.from_file(xspace_path)
    counts: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for plane in pd.planes:
        for line in plane.lines:
            for ev in line.events:
                stats = dict(ev.stats)
                if "hlo_op" in stats and "program_id" in stats:
                    counts[int(stats["program_id"])][str(stats["hlo_op"])] += 1
    return counts


def _program_counts(hlo_text: str, counts: dict[int, collections.Counter]) -> collections.Counter:
    """The execution counts of the program whose text this is: the profiled program all of whose operations
    are instructions of the text, with the most operations (one compiled program, one id)."""
    names = {i.name for instrs in parse_hlo(hlo_text).values() for i in instrs}
    fits = [c for c in counts.values() if c and set(c) <= names]
    return max(fits, key=len) if fits else collections.Counter()


def profile(run, requests_per_row: float) -> dict:
    """Run `run()` (one grid run) on one device, once to compile and once under the profiler; the figures
    per step and per simulated request of its longest-running program (the one with the most scan steps).
    requests_per_row: requests one row simulates."""
    with sim.recording_programs():
        run()  # compiles the one-device programs outside the profile
    with tempfile.TemporaryDirectory(prefix="jaxroute-profile-") as tmp, sim.recording_programs() as launched:
        with jax.profiler.trace(tmp):
            run()
        files = glob.glob(f"{tmp}/**/*.xplane.pb", recursive=True)
        if not files:
            return {"available": False, "why": "the profiler wrote no trace"}
        # (XLA runs a small enough program inline, without per-operation events: it is then not counted)
        counts = _event_counts(files[0])
        best = None
        for fn, args in launched:
            text = fn.lower(*args).compile().as_text()
            fig = program_figures(text, _program_counts(text, counts))
            if fig and fig["steps"] and (best is None or fig["steps"] > best["steps"]):
                best = fig
    if best is None:
        return {"available": False, "why": "no scan step was traced (no grid program, or one XLA ran inline)"}
    per_req = lambda x: x / requests_per_row if requests_per_row else None
    best.update(available=True, scan_steps_per_request=per_req(best["steps"]),
                launches_per_request=per_req(best["launches"]))
    for loop in best["nested_loops"]:
        loop["trips_per_request"] = per_req(loop["trips"])
    return best


def projection(figures: dict, rows: int, requests_per_row: float, us_per_launch: float = ASSUMED_US_PER_LAUNCH) -> dict:
    """Simulated requests/s on an accelerator bound by dependent launches: `rows` rows advance together, each
    step costing `launches_per_step` launches of `us_per_launch` (an assumption, not a measurement)."""
    seconds = figures["launches"] * us_per_launch * 1e-6
    return {"assumed_us_per_launch": us_per_launch, "rows_in_parallel": rows,
            "launch_bound_seconds": seconds,
            "requests_per_s": rows * requests_per_row / seconds if seconds else None,
            "assumes": "every launch is dependent (no overlap) and a step's width costs nothing beside its launch"}
