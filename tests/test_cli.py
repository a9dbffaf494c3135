"""CLI-wide checks: every subcommand's --help is complete, and errors are short, not tracebacks."""

import argparse

import pytest

from jaxroute.cli import build_parser, main


def _subparsers():
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return parser, action.choices


def test_every_option_has_help_text():
    _, subs = _subparsers()
    assert subs, "no subcommands registered"
    for name, sub in subs.items():
        assert sub.description or sub.format_usage(), name
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help and action.help.strip(), f"jaxroute {name} {action.option_strings or action.dest}: no help"


def test_help_runs_for_every_subcommand(capsys):
    _, subs = _subparsers()
    for name in subs:
        with pytest.raises(SystemExit) as e:
            main([name, "--help"])
        assert e.value.code == 0
        assert "usage: jaxroute" in capsys.readouterr().out


def test_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["no-such-command"])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
