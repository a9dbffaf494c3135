"""The `jaxroute` command. Each subcommand lives in `jaxroute/commands/<name>.py` and is found automatically.

A command module defines `register(subparsers)`, which adds its parser and sets
`func=<callable(args) -> int>` as a default.

Compiled programs are kept in JAX's persistent compilation cache, in
`$XDG_CACHE_HOME/jaxroute/jax` (default `~/.cache/jaxroute/jax`), so a second run of the
same command skips XLA compilation. `--no-compile-cache` or `JAXROUTE_NO_COMPILE_CACHE=1`
turns it off; a `JAX_COMPILATION_CACHE_DIR` set by the user is respected.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from pathlib import Path

from jaxroute.errors import JaxrouteError

NO_CACHE_ENV = "JAXROUTE_NO_COMPILE_CACHE"
# Programs that compile faster than this are not written to the cache (JAX's default, 1 s, misses
# most of ours on a fast machine; tiny helper programs below 0.5 s are not worth a file).
CACHE_MIN_COMPILE_S = 0.5


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxroute",
        description="JAX simulator for routing and load balancing in LLM serving. "
        "Every command runs many seeds in one compiled program and prints means with 95% CIs.",
    )
    parser.add_argument("--no-compile-cache", action="store_true",
                        help=f"do not use the persistent compilation cache (also: {NO_CACHE_ENV}=1)")
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


def compile_cache_dir(environ=None) -> Path | None:
    """Where the CLI keeps compiled programs, or None when the cache is turned off."""
    env = os.environ if environ is None else environ
    if env.get(NO_CACHE_ENV, "").strip().lower() not in ("", "0", "false", "no"):
        return None
    if env.get("JAX_COMPILATION_CACHE_DIR"):
        return Path(env["JAX_COMPILATION_CACHE_DIR"])
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "jaxroute" / "jax"


def use_compile_cache(enabled: bool = True) -> Path | None:
    """Turn JAX's persistent compilation cache on (in `compile_cache_dir()`); returns the folder used."""
    path = compile_cache_dir() if enabled else None
    if path is None:
        return None
    import jax

    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", CACHE_MIN_COMPILE_S)
    return path


def main(argv: list[str] | None = None) -> int:
    use_all_cpu_cores()
    parser = build_parser()
    args = parser.parse_args(argv)
    use_compile_cache(not args.no_compile_cache)
    try:
        return int(args.func(args) or 0)
    except JaxrouteError as e:
        print(f"jaxroute {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
