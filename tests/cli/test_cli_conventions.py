"""One set of conventions across the command line (issue 32): every subcommand's parser is walked.

- metavars: upper case, the positionals named (RUN_DIR, SPEC, NAME), a run folder always RUN_DIR;
- one `--set KEY=VALUE` form (repeatable, parsed by `config.parse_setting`) wherever `--set` exists;
- `--device` defaults to auto wherever it exists (`train`'s through the run config's default);
- `--no-progress` on every command that draws progress bars, `--threads` wherever probes or training run.
"""

import argparse
import re

import pytest

from markov_interp import cli
from markov_interp.config import parse_setting, parse_value

PROGRESS = {"train", "probe", "report", "sweep", "reproduce", "experiment"}
THREADS = {"train", "probe", "report"}
DEVICE = {"train", "probe", "report", "reproduce", "experiment"}  # sweep: every cell's spec names its device


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: a for a in parser._actions for flag in a.option_strings}


def metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    return action.dest if not action.option_strings else action.dest.upper()


def test_every_subcommand_is_walked():
    assert set(subparsers()) == {"train", "probe", "report", "sweep", "reproduce", "experiment"}


@pytest.mark.parametrize("name", sorted(subparsers()))
def test_metavars_are_upper_case_and_positionals_named(name):
    parser = subparsers()[name]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._StoreTrueAction, argparse._StoreConstAction)):
            continue
        if action.choices is not None and action.metavar is None:
            continue  # shown as {a,b}
        text = metavar(action)
        assert not re.search(r"[a-z]", text), (name, action.dest, text)
        if not action.option_strings:  # a positional: an explicit metavar, not the dest in lower case
            assert action.metavar is not None, (name, action.dest)
    positional = [a for a in parser._actions if not a.option_strings]
    if name in ("probe", "report"):  # a run folder is RUN_DIR wherever it is given
        assert [metavar(a) for a in positional] == ["RUN_DIR"]
    if name == "train":
        assert metavar(options(parser)["--out"]) == "RUN_DIR"


@pytest.mark.parametrize("name", sorted(subparsers()))
def test_one_set_form(name):
    action = options(subparsers()[name]).get("--set")
    if action is None:
        return
    assert isinstance(action, argparse._AppendAction) and action.metavar == "KEY=VALUE", name
    assert action.default == [], name


def test_set_is_parsed_one_way():
    assert parse_setting("train.lr=0.01") == ("train.lr", 0.01)
    assert parse_setting("source.initial=uniform") == ("source.initial", "uniform")
    assert cli._parse_set(["model.n_heads=[1, 2]"]) == {"model.n_heads": [1, 2]}
    with pytest.raises(ValueError, match="--set takes KEY=VALUE"):
        cli._parse_set(["train.lr"])
    from markov_interp import experiments

    exp = experiments.get(next(iter(experiments.registered())))
    args = cli.build_parser().parse_args(["experiment", "--set", "seeds=3"])
    assert experiments.budget_for(exp, args).seeds == 3
    bad = cli.build_parser().parse_args(["experiment", "--set", "seeds"])
    with pytest.raises(ValueError, match="--set takes KEY=VALUE"):
        experiments.budget_for(exp, bad)
    assert parse_value("[1, 2]") == [1, 2] and parse_value("a,b") == "a,b"


@pytest.mark.parametrize("name", sorted(subparsers()))
def test_device_defaults_to_auto(name):
    action = options(subparsers()[name]).get("--device")
    assert (action is not None) == (name in DEVICE), name
    if action is None:
        return
    if name == "train":  # a shortcut: unset on the command line, the run config's default decides
        from markov_interp.training import default_run

        assert action.default is None and default_run().train.device == "auto"
    else:
        assert action.default == "auto", name


@pytest.mark.parametrize("name", sorted(subparsers()))
def test_progress_and_threads(name):
    flags = options(subparsers()[name])
    assert ("--no-progress" in flags) == (name in PROGRESS), name
    assert ("--threads" in flags) == (name in THREADS), name


def test_probe_and_report_progress_only_on_a_terminal(monkeypatch):
    args = argparse.Namespace(no_progress=False)
    monkeypatch.setattr("sys.stderr.isatty", lambda: False, raising=False)
    assert cli._progress(args) is False
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    assert cli._progress(args) is True
    assert cli._progress(argparse.Namespace(no_progress=True)) is False
