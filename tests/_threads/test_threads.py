"""Torch's CPU threads: one for tiny models by default, `markov_interp.set_threads` / `threads` / `--threads`
to choose (markov_interp/_threads.py)."""

import argparse

import pytest
import torch

import markov_interp
from markov_interp import _threads, cli
from markov_interp.probes import discovery
from markov_interp.sources import RandomMarkov
from markov_interp.training import default_run
from tests.handbuilt import induction_circuit


@pytest.fixture(autouse=True)
def two_threads():
    """Each test starts from two torch threads and no chosen count, and leaves them so."""
    before = torch.get_num_threads()
    markov_interp.set_threads(None)
    torch.set_num_threads(2)
    yield
    markov_interp.set_threads(None)
    torch.set_num_threads(before)


def test_a_block_chooses_and_restores():
    with markov_interp.threads(3):
        assert torch.get_num_threads() == 3 and _threads.chosen_threads() == 3
        with _threads.one_thread_if_tiny(induction_circuit(2, n_ctx=8)):  # a chosen count wins
            assert torch.get_num_threads() == 3
    assert torch.get_num_threads() == 2 and _threads.chosen_threads() is None
    with pytest.raises(ValueError, match="threads"):
        markov_interp.set_threads(0)
    with pytest.raises(ValueError, match="threads"):
        with markov_interp.threads(-1):
            pass


def test_tiny_models_get_one_thread_and_large_ones_torchs():
    tiny = induction_circuit(2, n_ctx=8)
    with _threads.one_thread_if_tiny(tiny):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    large = torch.nn.Linear(1000, _threads.TINY_PARAMS // 1000)  # 1000 x 1000 weights and 1000 biases
    assert sum(p.numel() for p in large.parameters()) >= _threads.TINY_PARAMS
    with _threads.one_thread_if_tiny(large):
        assert torch.get_num_threads() == 2
    markov_interp.set_threads(2)
    with _threads.one_thread_if_tiny(tiny):  # chosen for everything
        assert torch.get_num_threads() == 2


def test_the_quickstart_model_trains_and_is_probed_on_one_thread(monkeypatch):
    from markov_interp import models
    from markov_interp.training import loop, train

    run = default_run()  # what `markov-interp train` builds with no flags
    n = sum(p.numel() for p in models.build(run.model, seed=0).parameters())
    assert n < _threads.TINY_PARAMS
    seen = []
    real = loop._Group.train

    def spy(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(loop._Group, "train", spy)
    result = train(run.replace(train=run.train.replace(steps=2, eval_every=0)), progress=False)
    assert seen == [1] and torch.get_num_threads() == 2

    def stop(*args, **kwargs):
        seen.append(torch.get_num_threads())
        raise KeyboardInterrupt

    monkeypatch.setattr(discovery, "_passes", stop)
    with pytest.raises(KeyboardInterrupt):
        discovery.discover_circuit(result.model, run.source.build(), n_sequences=4, seq_len=16)
    assert seen == [1, 1] and torch.get_num_threads() == 2  # restored after an error too


def test_the_command_line_threads_option_chooses_for_everything():
    cli._set_threads(argparse.Namespace(threads=None))
    assert _threads.chosen_threads() is None
    cli._set_threads(argparse.Namespace(threads=3))
    assert _threads.chosen_threads() == 3 and torch.get_num_threads() == 3
    with pytest.raises(ValueError, match="--threads"):
        cli._set_threads(argparse.Namespace(threads=0))
    RandomMarkov(2)  # nothing else changed
