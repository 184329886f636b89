"""Source kinds as registered config classes: `SourceConfig(kind=...)` dispatch, the flat layout of the first four
kinds' files, and a kind added as one class of its own (defined in this file, registered for one test) that runs
through configs, files, sweeps, the CLI, training, theory and the probes with nothing else changed."""

import dataclasses
import json
from typing import ClassVar, Optional

import pytest
import torch

from markov_interp import probes, sweep, theory, training
from markov_interp.sources import (
    FLAT_LAYOUT,
    BinaryChainConfig,
    CyclicMarkovConfig,
    MarkovChain,
    MarkovChainConfig,
    RandomMarkovConfig,
    SourceConfig,
    base,
    register_source,
    source_config_class,
    source_kinds,
    source_options,
)

KERNEL = [[0.9, 0.1, 0.0], [0.2, 0.5, 0.3], [0.0, 0.4, 0.6]]


# ----------------------------------------------------------------------------------------------- dispatch
@pytest.mark.parametrize("kind, options, cls", [
    ("binary", dict(p=0.2, q=0.3), BinaryChainConfig),
    ("markov", dict(kernel=KERNEL, order=1), MarkovChainConfig),
    ("random", dict(vocab=3, alpha=0.5, pool_size=4), RandomMarkovConfig),
    ("cyclic", dict(vocab=4), CyclicMarkovConfig),
])
def test_the_base_builds_the_registered_kinds_config(kind, options, cls):
    cfg = SourceConfig(kind=kind, **options)
    assert type(cfg) is cls and isinstance(cfg, SourceConfig) and cfg.kind == kind
    assert cfg == cls(**options) and hash(cfg) == hash(cls(**options))
    assert SourceConfig.from_json(cfg.to_json()) == cfg and cls.from_dict(cfg.to_dict()) == cfg
    assert dataclasses.replace(cfg, initial="uniform").initial == "uniform"
    assert source_config_class(kind) is cls and cfg.summary() == cls.__doc__.splitlines()[0]


def test_every_first_kind_writes_the_flat_layout():
    """The keys (and their order) every config.json of the first four kinds holds, whatever the kind."""
    for cfg in (SourceConfig(kind="binary", p=0.2, q=0.3), SourceConfig(kind="markov", kernel=KERNEL),
                SourceConfig(kind="random", vocab=3), SourceConfig(kind="cyclic", vocab=3)):
        assert list(cfg.to_dict()) == ["kind", *FLAT_LAYOUT], cfg
    assert SourceConfig(kind="binary", p=0.2, q=0.3).to_dict() == {
        "kind": "binary", "p": 0.2, "q": 0.3, "kernel": None, "order": 1, "vocab": None, "alpha": 1.0,
        "initial": "stationary"}
    pooled = SourceConfig(kind="random", vocab=3, pool_size=2, zero_diagonal=True).to_dict()
    assert list(pooled) == ["kind", *FLAT_LAYOUT, "pool_size", "zero_diagonal"]  # pool_seed None: left out


def test_options_of_other_kinds_are_absent_only_at_their_defaults():
    same = SourceConfig(kind="binary", p=0.2, q=0.3)
    for absent in (dict(vocab=None), dict(alpha=1.0), dict(alpha=1), dict(order=1), dict(zero_diagonal=False),
                   dict(pool_size=None)):
        assert SourceConfig(kind="binary", p=0.2, q=0.3, **absent) == same, absent
    for present, name in ((dict(alpha=2.0), "alpha"), (dict(order=2), "order"), (dict(zero_diagonal=0), "zero_diagonal"),
                          (dict(vocab=3), "vocab")):
        with pytest.raises(ValueError, match=rf"a binary source does not use \['{name}'\]"):
            SourceConfig(kind="binary", p=0.2, q=0.3, **present)
    with pytest.raises(ValueError, match=r"a cyclic source does not use \['order'\]"):
        SourceConfig(kind="cyclic", vocab=3, order=2)  # was stored, then ignored by the cyclic builder
    with pytest.raises(ValueError, match="a binary source needs p and q"):
        SourceConfig(kind="binary")
    with pytest.raises(ValueError, match="a markov source needs kernel"):
        MarkovChainConfig()
    with pytest.raises(ValueError, match=r"RandomMarkovConfig is the config of kind 'random', got kind='cyclic'"):
        RandomMarkovConfig(kind="cyclic", vocab=3)
    with pytest.raises(ValueError, match=r"unknown SourceConfig keys \['colour'\]"):
        RandomMarkovConfig(vocab=3, colour="red")
    with pytest.raises(TypeError, match="keyword arguments only"):
        SourceConfig("binary")
    with pytest.raises(ValueError, match="source kind must be one of"):
        SourceConfig.from_dict({"kind": "ising"})


def test_register_refuses_a_taken_name_and_a_non_config(monkeypatch, without_annotation_checks):
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    with pytest.raises(ValueError, match="source kind 'binary' is registered already"):
        register_source("binary")(dataclasses.dataclass(frozen=True, kw_only=True)(type("Other", (SourceConfig,), {})))
    with pytest.raises(ValueError, match="takes a dataclass deriving from SourceConfig"):
        register_source("dict")(dict)


# ------------------------------------------------------------------------------------- a kind of its own
@pytest.fixture
def started(monkeypatch):
    """A kind defined here, registered for one test: a fixed chain whose first state follows a given law."""
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))

    @register_source("started")
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class StartedChainConfig(SourceConfig):
        """fixed chain whose first state follows the law `start` (--kernel, --set source.start=[...])"""

        states_option: ClassVar[Optional[str]] = "kernel"
        order: ClassVar[int] = 1

        kernel: tuple | list
        start: tuple | list

        def build(self) -> MarkovChain:
            return MarkovChain(self.kernel, initial=list(self.start))

    return StartedChainConfig


def test_a_kind_of_its_own_is_one_registered_class(started):
    cfg = SourceConfig(kind="started", kernel=KERNEL, start=[1, 0, 0])
    assert type(cfg) is started and "started" in source_kinds() and "start" in source_options()
    assert cfg.to_dict() == {"kind": "started", "kernel": KERNEL, "start": [1, 0, 0]}  # its own keys only
    assert SourceConfig.from_json(cfg.to_json()) == cfg and not cfg.in_context and cfg.vocab_size == 3
    assert SourceConfig(kind="started", kernel=KERNEL, start=[1, 0, 0], p=None) == cfg
    with pytest.raises(ValueError, match=r"a started source does not use \['p'\]"):
        SourceConfig(kind="started", kernel=KERNEL, start=[1, 0, 0], p=0.2)
    source = cfg.build()
    tokens = source.sample(64, 5, torch.Generator().manual_seed(0))
    assert (tokens[:, 0] == 0).all()  # every sequence starts where the law says
    assert torch.equal(source.predictive(tokens)[:, 0], torch.tensor(KERNEL, dtype=torch.float64)[tokens[:, 0]])


def test_a_kind_of_its_own_runs_through_the_package(started):
    from markov_interp.cli import _train_run, build_parser

    parser = build_parser()
    train_parser = parser._subparsers._group_actions[0].choices["train"]
    assert "started: fixed chain whose first state follows the law `start`" in " ".join(train_parser.format_help().split())
    kernel = json.dumps(KERNEL)
    run = _train_run(parser.parse_args(["train", "--out", "x", "--source", "started", "--kernel", kernel,
                                        "--set", "source.start=[0, 1, 0]", "--steps", "3", "--seq-len", "8"]))
    assert run.source == SourceConfig(kind="started", kernel=KERNEL, start=[0, 1, 0]) and run.model.d_vocab == 3
    assert training.RunConfig.from_json(run.to_json()) == run
    spec = sweep.SweepSpec(name="starts", base={"source": {"kind": "started", "kernel": KERNEL},
                                                "train": {"steps": 2, "seq_len": 8, "batch_size": 2}},
                           grid={"source.start": [[1, 0, 0], [0, 0, 1]]}, probe=False)
    assert len({c.cell_id for c in spec.cells()}) == 2
    result = training.train(spec.cells()[0].config, progress=False)
    refs = theory.reference_losses(run.source.build(), 8)
    assert result.final.entropy_rate == pytest.approx(refs.entropy_rate) and result.final.eval_loss > 0
    batch = probes.sample_batch(run.source.build(), n_sequences=4, seq_len=6, seed=0)
    assert torch.equal(probes._common.kernel_probs(batch), batch.source.predictive(batch.tokens))
