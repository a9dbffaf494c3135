"""The `jaxroute` command. Each subcommand lives in `jaxroute/commands/<name>.py` and is found automatically.

A command module defines `register(subparsers)`, which adds its parser and sets
`func=<callable(args) -> int>` as a default. Building the parsers and parsing the arguments import no JAX
(nor matplotlib, optax, orbax, evosax, tqdm, numpy; tests/test_cli.py checks): a command module imports
only jax-free modules at its top (`commands._common`, the packages' `names` modules, `catalog`, `sources`),
and its `func` imports the models when it runs. So `jaxroute --help` and every usage error take a fraction
of a second; `main` sets JAX up (CPU devices, compilation cache) only once the arguments parsed.

JAX's set-up (CPU devices, the persistent compilation cache) is `jaxroute.runtime`'s.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from jaxroute import (
    compile_log,  # jax-free until it watches
    distributed,
)
from jaxroute.errors import JaxrouteError
from jaxroute.runtime import NO_CACHE_ENV, use_all_cpu_cores, use_compile_cache

INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process Ctrl-C stopped


class Parser(argparse.ArgumentParser):
    """argparse with a usage error in one line, the error first and last (no usage block above it: --help
    prints that); every subcommand's parser is one too (argparse builds them with the root's class)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="jaxroute", allow_abbrev=False,  # a command's abbreviated flag never matches a root flag
        description="JAX simulator for routing and load balancing in LLM serving. "
        "Every command runs many seeds in one compiled program and prints means with 95% CIs.",
    )
    parser.add_argument("--no-compile-cache", action="store_true",
                        help=f"do not use the persistent compilation cache (also: {NO_CACHE_ENV}=1; default: use it)")
    distributed.add_args(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    import jaxroute.commands as commands

    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"jaxroute.commands.{info.name}")
        module.register(sub)
    _name_commands(parser)
    return parser


def _name_commands(parser: argparse.ArgumentParser) -> None:
    """Each (sub)command's parser sets `command_name` to its full name ("capacity cluster"), so an error names the
    command the user typed; the innermost parser's default wins."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                child.set_defaults(command_name=child.prog.split(" ", 1)[1])
                _name_commands(child)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parser.set_defaults(root_parser=parser)  # `jaxroute run` parses the spec's command line with it
    args = parser.parse_args(argv)  # no JAX yet: --help and usage errors exit here
    # JAX from here on, set up before any command builds a program
    compile_log.log_from_env()  # JAXROUTE_COMPILE_LOG: one JSON line per program
    use_all_cpu_cores()
    use_compile_cache(not args.no_compile_cache)
    try:
        several = distributed.start(args)  # several processes: joined before any JAX computation
        if several:
            distributed.quiet_unless_main(args)
        from jaxroute import spec

        return spec.run_parsed(args, sys.argv[1:] if argv is None else argv, parser)
    except JaxrouteError as e:
        print(f"jaxroute {args.command_name}: error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:  # a host array past what the machine holds (numpy says how large)
        what = str(e).splitlines()[0] if str(e) else "an allocation failed"
        print(f"jaxroute {args.command_name}: error: out of memory ({what}); run fewer requests, seeds or rows",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C: one line, the shell's exit status for SIGINT, no traceback
        print(f"\njaxroute {args.command_name}: {str(e) or 'interrupted'}", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
