"""A reproduction's parts: claims with verdicts, sections, the context an experiment runs in, the report."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jaxroute import output_paths, report
from jaxroute.metrics import Summary

VERDICTS = ("reproduced", "direction only", "differs")


@dataclasses.dataclass
class Claim:
    """One claim of a source beside our number."""

    claim: str  # the source's claim, quoted briefly
    where: str  # its section in the source, e.g. "lecture §1.2"
    source: str  # the source's number (text; "-" where it states none)
    ours: str  # our number with its 95 % CI (text)
    verdict: str  # one of VERDICTS
    reason: str = ""  # one line where the verdict is not "reproduced"
    value: dict | None = None  # our Summary as JSON (mean, ci95, per_seed), when there is one

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}, got '{self.verdict}'")
        if self.verdict != "reproduced" and not self.reason:
            raise ValueError(f"claim '{self.claim}' is '{self.verdict}' without a reason")


@dataclasses.dataclass
class Section:
    """What one experiment contributes to the report (and to results.json)."""

    source: str  # registry name of the source, e.g. "lecture"
    name: str  # experiment name, unique within its source
    title: str
    intro: str = ""  # one paragraph: what was run, at which sizes
    claims: list[Claim] = dataclasses.field(default_factory=list)
    tables: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (caption, Markdown table)
    figures: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (caption, PNG name in the report dir)
    data: dict = dataclasses.field(default_factory=dict)  # anything JSON-able: records, settings, curves
    log: list[str] = dataclasses.field(default_factory=list)  # the experiment's printed lines
    seeds: int | None = None
    quick: bool = False
    wall_s: float = 0.0
    commit: str = ""  # the git commit that ran it (a resumed part keeps its own)
    resumed: bool = False  # loaded from an earlier run's part file, not run now
    # a grid the experiment kept overflowed a fixed capacity (`sim.collecting_grids`); None: not recorded (a part
    # written before the flag was: rerun it to know)
    overflow: bool | None = None

    @property
    def key(self) -> str:
        return f"{self.source}.{self.name}"

    def as_json(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("resumed")
        return report.jsonable(d)

    @classmethod
    def from_json(cls, d: dict) -> Section:
        d = dict(d)
        d["claims"] = [Claim(**c) for c in d.get("claims", [])]
        d["tables"] = [tuple(t) for t in d.get("tables", [])]
        d["figures"] = [tuple(f) for f in d.get("figures", [])]
        return cls(**d, resumed=True)


# --------------------------------------------------------------------------- verdicts


def fmt(s: Summary, unit: str = "", digits: int = 3) -> str:
    """`mean ± half-width [unit]` for a claim's 'ours' column."""
    return report.fmt_ci(s, digits) + (f" {unit}" if unit else "")


def value_verdict(ours: Summary, source: float, rel_tol: float = 0.15) -> tuple[str, str]:
    """Reproduced when the source's number lies in our CI or within rel_tol of our mean; else differs."""
    if not math.isfinite(ours.mean):
        return "differs", "our value is not finite"
    if ours.lo <= source <= ours.hi or abs(ours.mean - source) <= rel_tol * abs(source):
        return "reproduced", ""
    return "differs", f"ours is {ours.mean / source:.2f}x the source's" if source else "the source's value is 0"


def gain_verdict(ours: Summary, source: float | None, factor: float = 1.3) -> tuple[str, str]:
    """A gain (a signed change, source's sign = the claimed direction) against the source's.

    Reproduced: same sign, CI clear of 0 and within `factor` of the source's (or inside our CI);
    direction only: same sign and CI clear of 0; differs: otherwise. source None: direction only is the best.
    """
    sign = 1.0 if source is None or source >= 0 else -1.0
    clear = (ours.lo > 0) if sign > 0 else (ours.hi < 0)
    if not clear:
        return "differs", "our CI includes 0 or the other sign"
    if source is None:
        return "direction only", "the source states a direction, not a number"
    if ours.lo <= source <= ours.hi or (1 / factor <= ours.mean / source <= factor):
        return "reproduced", ""
    return "direction only", f"same direction, ours {ours.mean / source:.2f}x the source's size"


def holds_verdict(holds: bool, why_not: str) -> tuple[str, str]:
    """A qualitative claim (an ordering, a bound): reproduced when it holds."""
    return ("reproduced", "") if holds else ("differs", why_not)


# --------------------------------------------------------------------------- running an experiment


@dataclasses.dataclass
class Context:
    """What an experiment gets: sizes (quick), where figures go, a log and the progress bar."""

    out_dir: Path
    quick: bool = False
    seeds: int | None = None  # override of the experiment's seed count
    echo: bool = True  # print log lines as they come
    advance: Callable[[str], None] = lambda desc: None  # one tick of this experiment's progress bar
    lines: list[str] = dataclasses.field(default_factory=list)

    def log(self, text: str = "") -> None:
        self.lines.append(text)
        if self.echo:
            from tqdm.auto import tqdm

            tqdm.write(text)

    def figure(self, source: str, name: str) -> tuple[Path, str]:
        """(path to write, name to link) of a PNG beside the report."""
        file = f"{source}_{name}.png"
        return self.out_dir / file, file


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One reproduction experiment: run(ctx) -> Section."""

    source: str
    name: str
    title: str
    run: Callable[[Context], Section]
    steps: Callable[[bool], int | None] = lambda quick: None  # ticks of its progress bar (None: unknown)


# --------------------------------------------------------------------------- the report


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def claims_table(claims: Sequence[Claim]) -> str:
    return markdown_table(["claim", "where", "source", "ours (95 % CI)", "verdict", "reason"],
                          [[c.claim, c.where, c.source, c.ours, f"**{c.verdict}**", c.reason] for c in claims])


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table from a header and rows of cells."""
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def records_table(records, metrics: Sequence[str], label=None) -> str:
    """Markdown table of report.Records: one row per record, `mean ± half-width` per metric."""
    label = label or (lambda r: r.policy)
    rows = [[label(r) + (" (OVERFLOW)" if r.overflow else "")] + [report.fmt_ci(r.metrics[m]) for m in metrics]
            for r in records]
    return markdown_table(["row"] + list(metrics), rows)


def render(sections: Sequence[Section], header: dict) -> str:
    """The whole report.md: header, verdict summary, then one section per experiment."""
    out = [f"# jaxroute reproduction report: {header['sources']}", ""]
    if header.get("quick"):
        out += ["> **QUICK RUN.** Every experiment ran at small sizes (same code paths, few seeds): the numbers",
                "> check that the reproduction runs; they are not the results. Run without `--quick` for those.", ""]
    out += [f"- command: `{header['command']}`", f"- git commit: `{header['commit']}`",
            f"- device: {header['device']}", f"- seeds: {header['seeds']}",
            f"- wall time: {header['wall_s']:.0f} s" + (f" ({header['resumed']} experiment(s) resumed from an earlier "
                                                       "run; their time is their own run's)" if header['resumed'] else "")
            + (f"; experiments summed: {header['jobs']} worker processes ran them in {header['elapsed_s']:.0f} s"
               if header.get("jobs", 1) > 1 else ""),
            ""]
    out += ["## Verdicts", "", verdict_counts(c.verdict for s in sections for c in s.claims), ""]
    rows = [[f"[{s.key}](#{key_anchor(s.key)})", c.claim, c.source, c.ours, f"**{c.verdict}**"]
            for s in sections for c in s.claims]
    out += [markdown_table(["experiment", "claim", "source", "ours (95 % CI)", "verdict"], rows), "",
            "Each section below gives the claim's place in the source and the reason for every verdict other than "
            "reproduced.", ""]
    for s in sections:
        out += [f"## {s.title}", f'<a id="{key_anchor(s.key)}"></a>', "",
                f"_{s.key}; {s.seeds if s.seeds is not None else '-'} seeds; {s.wall_s:.0f} s"
                + ("; resumed from an earlier run" if s.resumed else "") + "_", ""]
        if s.intro:
            out += [s.intro, ""]
        if s.claims:
            out += ["**Claims**", "", claims_table(s.claims), ""]
        for caption, table in s.tables:
            out += [f"**{caption}**", "", table, ""]
        for caption, file in s.figures:
            alt = caption.replace("[", "(").replace("]", ")")  # brackets in alt text end the link in simple readers
            out += [f"![{alt}]({file})", "", f"_{caption}_", ""]
        if s.log:
            out += ["<details><summary>full log</summary>", "", "```", *s.log, "```", "", "</details>", ""]
    return "\n".join(out)


def key_anchor(key: str) -> str:
    """The in-page anchor of experiment `key` ("source.name") in report.md."""
    return key.replace(".", "-").replace("_", "-")


def verdict_counts(verdicts) -> str:
    """`N reproduced, N direction only, N differs (N claims).` for an iterable of verdicts."""
    counts = dict.fromkeys(VERDICTS, 0)
    for v in verdicts:
        counts[v] += 1
    return ", ".join(f"{n} {v}" for v, n in counts.items()) + f" ({sum(counts.values())} claims)."


def part_path(out_dir: Path, source: str, name: str) -> Path:
    return Path(out_dir) / "parts" / f"{source}.{name}.json"


def save_part(out_dir: Path, section: Section) -> Path:
    path = part_path(out_dir, section.source, section.name)
    return output_paths.write_text(path, json.dumps(section.as_json(), indent=1))  # whole or absent


def load_part(out_dir: Path, source: str, name: str, quick: bool) -> Section | None:
    """The part an earlier run wrote at the same sizes, or None."""
    path = part_path(out_dir, source, name)
    if not path.exists():
        return None
    try:
        section = Section.from_json(json.loads(path.read_text()))
    except (ValueError, TypeError, KeyError):
        return None  # unreadable: run it again
    return section if section.quick == quick else None


# --------------------------------------------------------------------------- the README's block


def block_markers(key: str) -> tuple[str, str]:
    """The lines that open and close the generated block of report `key` (a source, or "all") in a Markdown file."""
    return f"<!-- reproduce:{key} begin -->", f"<!-- reproduce:{key} end -->"


def summary_markdown(results: dict, report_link: str) -> str:
    """A report's results.json as a short Markdown summary: provenance, verdict tally, every claim and its verdict."""
    cfg = results["config"]
    claims = results["results"]
    out = []
    if cfg.get("quick"):
        out += ["> QUICK RUN: small sizes, a smoke run; these numbers are not the results.", ""]
    out += [f"Generated from [{report_link}]({report_link}) (tables, figures, logs and the reason for every verdict): "
            f"`{cfg['command']}` at commit `{cfg['commit']}` on {cfg['device']}, {cfg['wall_s']:.0f} s; "
            f"seeds: {cfg['seeds']}.", "",
            "Verdicts: " + verdict_counts(c["verdict"] for c in claims), ""]
    rows = [[f"[{c['policy']}]({report_link}#{key_anchor(c['policy'])})", c["params"]["claim"],
             c["source"], c["ours"], f"**{c['verdict']}**"] for c in claims]
    out.append(markdown_table(["experiment", "claim", "source", "ours (95 % CI)", "verdict"], rows))
    return "\n".join(out)


def find_block(text: str, key: str) -> tuple[int, int] | None:
    """(end of the opening marker line, start of the closing one) of report `key`'s block; None when either
    marker is missing from a line of its own."""
    begin, end = block_markers(key)
    i = ("\n" + text).find("\n" + begin + "\n")
    j = ("\n" + text).find("\n" + end + "\n", i + 1) if i >= 0 else -1
    return None if i < 0 or j < 0 else (i + len(begin), j)


def missing_block(key: str) -> str:
    begin, end = block_markers(key)
    return (f"no block for '{key}'; add the lines '{begin}' and '{end}', each on a line of its own, where the "
            "summary should go")


def replace_block(text: str, key: str, body: str, origin: str) -> str:
    """`text` with the block of report `key` replaced by `body` (refused, naming the markers, when they are missing)."""
    where = find_block(text, key)
    if where is None:
        raise ValueError(missing_block(key))
    note = f"<!-- generated by `{origin}`; edits between these markers are overwritten -->"
    return text[: where[0]] + "\n" + note + "\n\n" + body + "\n\n" + text[where[1]:]
