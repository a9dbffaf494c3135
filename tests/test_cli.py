"""CLI-wide checks: every subcommand's --help is complete, and errors are short, not tracebacks."""

import argparse
import math

import pytest

from jaxroute.cli import build_parser, main
from jaxroute.commands import _common as common


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
            if not action.required:
                assert "default" in action.help.lower(), f"jaxroute {name} {action.option_strings}: no default in help"


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


@pytest.mark.parametrize("convert,good,bad", [
    (common.positive_int, [("3", 3)], ["0", "-2", "1.5", "x"]),
    (common.non_negative_int, [("0", 0)], ["-1", "x"]),
    (common.positive_float, [("0.5", 0.5)], ["0", "-1", "nan", "inf", "x"]),
    (common.non_negative_float, [("0", 0.0)], ["-0.1", "nan"]),
    (common.probability, [("0", 0.0), ("1", 1.0)], ["1.01", "-0.1", "nan"]),
    (common.fraction, [("0", 0.0), ("0.5", 0.5)], ["1", "-0.1"]),
    (common.positive_fraction, [("1", 1.0)], ["0", "1.5"]),
    (common.at_least(1.0), [("1", 1.0)], ["0.9"]),
    (common.off_or(common.at_least(1.0)), [("off", math.inf), ("OFF", math.inf), ("2", 2.0)], ["0.5", "on"]),
    (common.list_of(common.positive_int), [("1, 2,3", [1, 2, 3])], ["1,1", "", "1,x"]),
    (common.list_of(common.positive_float, unique=False), [("1,1", [1.0, 1.0])], ["1,-1"]),
])
def test_number_converters(convert, good, bad):
    for text, value in good:
        assert convert(text) == value
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError, match="expected|twice"):
            convert(text)


def test_bad_number_is_a_usage_error_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bins", "--n", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "jaxroute bins: error: argument --n: expected a positive integer, got '0'" in err
