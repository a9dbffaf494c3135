"""Helpers shared by the CLI tests."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

from jaxroute.cli import main

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str):
    """The module `scripts/<name>.py` (scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_quick(name: str, out, capsys) -> tuple[str, dict]:
    """Run `scripts/<name>.py --quick --out OUT`; (its printed text, its JSON)."""
    assert load_script(name).main(["--quick", "--out", str(out)]) == 0
    return capsys.readouterr().out, json.loads(Path(out).read_text())


def cli(argv) -> int:
    """Exit code of `jaxroute argv`: bad numbers are argparse usage errors (SystemExit 2)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def leak(monkeypatch, module, runner: str, row: int, seed: int, amount: int = 1) -> None:
    """Make `module.runner` report a conservation error of `amount` at (row, seed), as a broken model would."""
    real = getattr(module, runner)

    def leaky(*a, **k):
        res = real(*a, **k)
        err = res.grid.metrics["conservation_error"].copy()
        err[row, seed] = amount
        res.grid.metrics["conservation_error"] = err
        return res

    monkeypatch.setattr(module, runner, leaky)


def resume_from(report, out, keys) -> None:
    """Copy the parts `keys` ("source.name") of a report folder and the PNGs they link into `out`."""
    (out / "parts").mkdir(parents=True, exist_ok=True)
    for key in keys:
        part = report / "parts" / f"{key}.json"
        shutil.copy(part, out / "parts" / part.name)
        for _, png in json.loads(part.read_text())["figures"]:
            shutil.copy(report / png, out / png)


def assert_spec_reruns(spec, by: dict, metrics, tmp_path) -> None:
    """`jaxroute run SPEC` reproduces the per-seed `metrics` of every row in `by` (label -> result row)."""
    out = Path(tmp_path) / "rerun.json"
    assert main(["run", str(spec), "--out", str(out)]) == 0
    again = {r["policy"]: r["metrics"] for r in json.loads(out.read_text())["results"]}
    for label, row in by.items():
        for k in metrics:
            assert again[label][k]["per_seed"] == row["metrics"][k]["per_seed"], (label, k)
