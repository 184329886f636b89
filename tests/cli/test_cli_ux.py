"""The command line's small cuts: `--help` imports no torch, a typo gets the command's usage and a "did you mean",
one meaning of `--seeds`, kept positional edges printed with their effect, and a run folder without weights says
whether it is still training."""

import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from markov_interp import cli

ROOT = Path(__file__).resolve().parents[2]
_HELP = ("import sys\nfrom markov_interp import cli\ntry:\n    cli.main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
         "print('TORCH' if 'torch' in sys.modules else 'NO TORCH', file=sys.stderr)\n")


@pytest.mark.parametrize("argv", [["--help"], ["probe", "--help"], ["report", "--help"], ["sweep", "--help"],
                                  ["experiment", "--help"], ["reproduce", "--help"], []])
def test_help_imports_no_torch(argv):
    """`train --help` is the exception: it lists the registered source kinds, which live beside torch."""
    done = subprocess.run([sys.executable, "-c", _HELP, *argv], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert "usage: markov-interp" in done.stdout + done.stderr
    assert done.stderr.strip().endswith("NO TORCH"), done.stderr[-500:]


def _error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == cli.EXIT_ERROR
    return capsys.readouterr().err


def test_a_mistyped_option_gets_the_commands_usage_and_a_suggestion(capsys):
    err = _error(["train", "--out", "unused", "--stesp", "3"], capsys)
    assert err.startswith("usage: markov-interp train ") and "markov-interp train: error: unrecognized arguments: " \
        "--stesp 3; did you mean --steps?" in err
    err = _error(["probe", "RUN", "--jsno"], capsys)
    assert err.startswith("usage: markov-interp probe ") and "did you mean --json?" in err
    err = _error(["trian", "--out", "x"], capsys)
    assert "invalid choice: 'trian'" in err and err.rstrip().endswith("did you mean train?")
    err = _error(["probe", "RUN", "--zzzzzz"], capsys)  # nothing close: no guess
    assert "unrecognized arguments: --zzzzzz" in err and "did you mean" not in err


def test_seeds_lists_seeds_and_an_experiment_counts_them(capsys):
    from markov_interp import experiments

    exp = experiments.get(next(iter(experiments.registered())))
    args = cli.build_parser().parse_args(["experiment", "--n-seeds", "3"])
    assert experiments.budget_for(exp, args).seeds == 3
    bad = cli.build_parser().parse_args(["experiment", "--seeds", "3"])
    with pytest.raises(ValueError, match="--n-seeds N"):
        experiments.budget_for(exp, bad)
    assert cli._parse_seeds("0-2,5") == [0, 1, 2, 5]  # train: the seeds themselves


def _edge(name, effect, se, position_effect, position_se):
    return SimpleNamespace(name=name, effect=effect, se=se, position_effect=position_effect, position_se=position_se)


def test_kept_positional_edges_are_printed_with_their_effect(capsys):
    graph = SimpleNamespace(corruption="resample", faithfulness=0.93, edges=[None] * 19, position=object(), kept=[
        _edge("embed->L1H0.q", 0.2104, 0.01, 0.0003, 0.0001),
        _edge("pos->L0H0.q", 0.0, 0.0, 0.0512, 0.004),  # only the positional pass moves it
        _edge("L0H0->L1H0.k", 0.3, 0.02, math.nan, math.nan)])
    cli._print_edges(graph)
    out = capsys.readouterr().out.splitlines()
    assert "in the resample pass; positional pass" in out[0]
    assert out[2].split() == ["pos->L0H0.q", "+0.0000", "+-", "0.0000", "+0.0512", "+-", "0.0040"]
    assert out[3].split()[-2:] == ["not", "measured"]
    cli._print_edges(SimpleNamespace(corruption="resample", faithfulness=1.0, edges=[None], position=None,
                                     kept=[_edge("embed->logits", 0.5, 0.01, math.nan, math.nan)]))
    assert capsys.readouterr().out.splitlines()[1].split() == ["embed->logits", "+0.5000", "+-", "0.0100"]


def test_a_folder_without_weights_says_whether_it_is_still_training(tmp_path, capsys):
    from markov_interp import runs
    from markov_interp.training import default_run

    (tmp_path / "config.json").write_text(default_run().to_json())
    (tmp_path / "metrics.jsonl").write_text('{"step": 10, "train_loss": 0.6}\n')
    assert cli.main(["probe", str(tmp_path)]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert "no model weights at" in err and "stopped or crashed (metrics.jsonl records step 10)" in err
    assert f"markov-interp train --config {tmp_path / 'config.json'} --out {tmp_path}" in err
    with runs.lock(tmp_path):  # a writer holds the folder: still training
        assert cli.main(["probe", str(tmp_path)]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert "the run is still training (pid " in err and "wait for it to finish" in err
    assert not runs.training_now(tmp_path)  # the lock went with the block
