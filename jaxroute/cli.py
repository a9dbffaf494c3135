"""The `jaxroute` command. Each subcommand lives in `jaxroute/commands/<name>.py` and is found automatically.

A command module defines `register(subparsers)`, which adds its parser and sets
`func=<callable(args) -> int>` as a default.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

from jaxroute.errors import JaxrouteError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxroute",
        description="JAX simulator for routing and load balancing in LLM serving. "
        "Every command runs many seeds in one compiled program and prints means with 95% CIs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    import jaxroute.commands as commands

    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"jaxroute.commands.{info.name}")
        module.register(sub)
    return parser


def use_all_cpu_cores() -> None:
    """Expose one JAX CPU device per core so the grid's batch axis is sharded across cores.

    Set JAXROUTE_CPU_DEVICES to override. Must run before JAX initialises its backends.
    """
    import jax

    if jax.config.jax_num_cpu_devices != -1 and "JAXROUTE_CPU_DEVICES" not in os.environ:
        return  # the caller (e.g. the test suite) already chose a device count
    n = int(os.environ.get("JAXROUTE_CPU_DEVICES", os.cpu_count() or 1))
    try:
        jax.config.update("jax_num_cpu_devices", max(1, n))
    except RuntimeError:  # backends already initialised (e.g. called from a test): keep them
        pass


def main(argv: list[str] | None = None) -> int:
    use_all_cpu_cores()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except JaxrouteError as e:
        print(f"jaxroute {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
