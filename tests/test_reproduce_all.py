"""`jaxroute reproduce all --quick`: one report with every experiment's section, claims and figures; resumable;
its summary goes into a README block; the README's committed blocks are exactly their reports' summaries."""

import json
import re
import shutil
from pathlib import Path

import pytest

from jaxroute.reproduce import SOURCES, experiments
from jaxroute.reproduce.document import VERDICTS, block_markers, summary_markdown
from tests.cli_helpers import cli

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!\[[^\]]*\]\(([^)]+\.png)\)")


def _every_key() -> list[str]:
    return [f"{s}.{e.name}" for s in SOURCES for e in experiments(s)]


def _check_report(folder: Path, keys: list[str], quick: bool) -> dict:
    """Every experiment has its section and claims, every linked PNG is there, the tally matches results.json."""
    text = (folder / "report.md").read_text()
    res = json.loads((folder / "results.json").read_text())
    assert ("QUICK RUN" in text) == quick
    for field in ("- command: `jaxroute reproduce", "- git commit: `", "- device: ", "- seeds: ", "- wall time: "):
        assert field in text, field
    anchors = re.findall(r'^<a id="([^"]+)"></a>$', text, re.M)
    assert anchors == [k.replace(".", "-").replace("_", "-") for k in keys]  # one section each, in order
    assert text.count("\n## ") == len(keys) + 1  # "## Verdicts", then one heading per experiment
    assert set(res["experiments"]) == set(keys)
    by_exp = {k: [r for r in res["results"] if r["policy"] == k] for k in keys}
    assert all(by_exp.values()), [k for k, v in by_exp.items() if not v]  # every experiment states claims
    for r in res["results"]:
        assert r["verdict"] in VERDICTS and (r["verdict"] == "reproduced" or r["reason"]), r
        assert r["params"]["claim"] and r["params"]["where"] and r["ours"]
        # taken from the part's runs (None: a part written before the flag, not recorded)
        assert r["overflow"] == json.loads((folder / "parts" / f"{r['policy']}.json").read_text()).get("overflow")
    # a claim compares something simulated with its source: exercise 7 (a) adds up the lecture's own prices
    assert not any(r["params"]["claim"].startswith("(a) A+B costs") for r in res["results"])
    counts = {v: sum(r["verdict"] == v for r in res["results"]) for v in VERDICTS}
    assert ", ".join(f"{n} {v}" for v, n in counts.items()) + f" ({len(res['results'])} claims)." in text
    links = LINK.findall(text)
    assert links and len(links) == len(set(links))
    for png in links:
        data = (folder / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, png
    assert {p.name for p in folder.glob("*.png")} == set(links)  # no figure left unlinked
    return res


@pytest.mark.slow
def test_quick_all_has_every_section_claim_and_figure(quick_report):
    res = _check_report(quick_report, _every_key(), quick=True)
    assert res["config"]["quick"] is True and res["config"]["resumed"] == 0
    log = (quick_report / "stdout.txt").read_text()
    assert all(f"[{k}]" in log for k in _every_key())  # each experiment ran (and logged) in this process


@pytest.mark.slow
def test_quick_all_resumes_without_running_again(quick_report, tmp_path, capsys):
    copy = tmp_path / "again"
    shutil.copytree(quick_report, copy)
    before = json.loads((copy / "results.json").read_text())
    assert cli(["reproduce", "all", "--quick", "--out", str(copy), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.count("resumed from") == len(_every_key())
    after = json.loads((copy / "results.json").read_text())
    assert after["results"] == before["results"] and after["config"]["resumed"] == len(_every_key())
    assert "resumed from an earlier run" in (copy / "report.md").read_text()


@pytest.mark.slow
def test_readme_block_written_from_the_report(quick_report, tmp_path, capsys):
    copy = tmp_path / "rep"
    shutil.copytree(quick_report, copy)
    begin, end = block_markers("all")
    readme = tmp_path / "docs" / "README.md"
    readme.parent.mkdir()
    readme.write_text(f"# x\n\nbefore\n{begin}\nstale text\n{end}\nafter\n")
    argv = ["reproduce", "all", "--quick", "--out", str(copy), "--no-progress", "--readme", str(readme)]
    assert cli(argv) == 0
    text = readme.read_text()
    assert "stale text" not in text and text.startswith("# x\n\nbefore\n") and text.endswith(f"{end}\nafter\n")
    assert "QUICK RUN" in text and "[../rep/report.md](../rep/report.md)" in text  # linked relative to the README
    res = json.loads((copy / "results.json").read_text())
    for r in res["results"]:
        assert r["params"]["claim"].replace("|", "\\|") in text
    assert cli(argv) == 0 and readme.read_text() == text  # rerunning resumes and writes the same block


def test_readme_without_its_block_is_refused_before_running(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    assert cli(["reproduce", "lecture", "--out", str(tmp_path / "r"), "--readme", str(readme)]) == 2
    err = capsys.readouterr().err
    assert "no block for 'lecture'" in err and "<!-- reproduce:lecture begin -->" in err
    assert not (tmp_path / "r").exists()  # nothing ran
    assert cli(["reproduce", "lecture", "--out", str(tmp_path / "r"), "--readme", str(tmp_path / "nope.md")]) == 2
    assert "no such file" in capsys.readouterr().err


def _readme_blocks() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    return dict(re.findall(r"<!-- reproduce:(\S+) begin -->\n(.*?)\n<!-- reproduce:\1 end -->", text, re.S))


def test_readme_results_are_their_reports_summaries():
    """The README's results come from committed reports: each block is exactly its report's summary (rerun the
    command in the block's first line to regenerate it), and every figure those reports link is committed."""
    blocks = _readme_blocks()
    assert blocks and set(blocks) <= {*SOURCES, "all"}
    for key, body in blocks.items():
        origin = re.match(r"<!-- generated by `([^`]+)`", body)
        assert origin and f"jaxroute reproduce {key} " in origin.group(1) and "--readme README.md" in origin.group(1)
        link = re.search(r"Generated from \[([^\]]+)\]", body).group(1)
        folder = (ROOT / link).parent
        results = json.loads((folder / "results.json").read_text())
        assert body.split("\n\n", 1)[1].rstrip("\n") == summary_markdown(results, link), f"README block '{key}' is stale"
        keys = [f"{key}.{e.name}" for e in experiments(key)] if key in SOURCES else _every_key()
        _check_report(folder, keys, quick=bool(results["config"]["quick"]))
