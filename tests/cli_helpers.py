"""Helpers shared by the CLI tests."""

from __future__ import annotations

from jaxroute.cli import main


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
