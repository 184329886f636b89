"""The one config base (markov_interp.config) and what is built on it: serialisation that keeps existing run
folders readable, unknown-key refusal, the common validators, presets as replacements of the base preset,
dotted options (`training.split_key`, `build_run`, `default_run`, `override_run`) and the sweep's typed table."""

import dataclasses
import json
from pathlib import Path
from typing import Literal, Optional

import pytest

from markov_interp import models, sweep, training
from markov_interp.config import (bounds, check_choice, check_fields, check_int, check_number, check_probability,
                                  check_value)
from markov_interp.sources import SourceConfig
from markov_interp.models import ModelConfig, preset
from markov_interp.training import RunConfig, TrainConfig, build_run, default_run, override_run

FIXTURES = Path(__file__).parents[1] / "data" / "run_configs"


# ------------------------------------------------------------------------------------------ serialisation
@pytest.mark.parametrize("name", ["binary", "random", "markov"])
def test_existing_run_configs_load_and_serialise_unchanged(name):
    """config.json files written before the config base (fixtures) load, and are written back byte for byte."""
    text = (FIXTURES / f"{name}.json").read_text()
    run = RunConfig.from_json(text)
    assert run.to_json() == text
    assert RunConfig.from_dict(json.loads(text)) == run


def test_fixture_configs_are_what_the_api_builds():
    binary = RunConfig.from_json((FIXTURES / "binary.json").read_text())
    assert binary == RunConfig(source=SourceConfig(kind="binary", p=0.2, q=0.3), model=preset("paper-1layer", n_ctx=32),
                               train=TrainConfig(steps=12, batch_size=4, seq_len=32, device="cpu",
                                                 stream="torch-1"))  # a file naming no stream: the old one
    markov = RunConfig.from_json((FIXTURES / "markov.json").read_text())
    assert markov.source.kernel == ((0.9, 0.1), (0.4, 0.6)) and markov.source.initial == (0.5, 0.5)
    assert markov.train.betas == (0.9, 0.99) and markov.model.d_mlp == 64


def test_unknown_keys_name_the_unknown_and_the_valid_ones():
    data = json.loads((FIXTURES / "binary.json").read_text())
    with pytest.raises(ValueError) as err:
        RunConfig.from_dict({**data, "model": {**data["model"], "dropout": 0.1, "d_modle": 8}})
    message = str(err.value)
    assert "unknown ModelConfig keys ['d_modle', 'dropout']" in message and "'d_model'" in message
    assert message.startswith("model: ")


def test_a_value_where_a_table_belongs_is_not_read_as_keys():
    data = json.loads((FIXTURES / "binary.json").read_text())
    with pytest.raises(ValueError) as err:
        RunConfig.from_dict({**data, "source": "binary"})
    message = str(err.value)
    assert "source must be a table (dict) of options, got str 'binary'" in message
    assert "unknown" not in message and "'y'" not in message
    with pytest.raises(ValueError, match="lacks required keys \\['train'\\]"):
        RunConfig.from_dict({"source": data["source"], "model": data["model"]})
    with pytest.raises(ValueError, match="must be given a table"):
        TrainConfig.from_dict([("steps", 3)])
    with pytest.raises(ValueError, match="not valid JSON"):
        RunConfig.from_json("{")


def test_replace_is_dataclasses_replace_with_checked_names():
    cfg = TrainConfig()
    assert cfg.replace(lr=0.01) == dataclasses.replace(cfg, lr=0.01)
    with pytest.raises(ValueError, match=r"unknown TrainConfig fields \['lrr'\]"):
        cfg.replace(lrr=0.01)
    with pytest.raises(ValueError, match="lr must be > 0"):
        cfg.replace(lr=0.0)  # re-validated


# --------------------------------------------------------------------------------------------- validators
@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: check_int("steps", 0, minimum=1), "steps must be an integer >= 1, got 0"),
        (lambda: check_int("steps", True, minimum=0), "steps must be an integer >= 0, got True"),
        (lambda: check_int("steps", 2.0, minimum=0), "got 2.0"),
        (lambda: check_number("lr", float("nan")), "lr must be a finite number, got nan"),
        (lambda: check_number("lr", -1, minimum=0), "lr must be a finite number >= 0, got -1"),
        (lambda: check_number("eps", 0, positive=True), "eps must be > 0, got 0"),
        (lambda: check_number("eps", "1e-5"), "eps must be a finite number, got '1e-5'"),
        (lambda: check_choice("optimizer", "lion", ("adamw", "sgd")), "optimizer must be one of ['adamw', 'sgd']"),
        (lambda: check_probability("p", 1.5), "p must be in [0, 1], got 1.5"),
        (lambda: check_probability("p", None), "p must be a number in [0, 1], got None"),
        (lambda: check_probability("p", 1, strict=True), "p must be a probability strictly between 0 and 1, got 1"),
        (lambda: check_int("order", 5, minimum=0, maximum=4), "order must be an integer in 0..4, got 5"),
        (lambda: check_int("workers", 0, minimum=1, none_ok=True), "workers must be None or an integer >= 1, got 0"),
        (lambda: check_int("seed", "1"), "seed must be an integer, got '1'"),
        (lambda: check_number("cut", float("nan"), minimum=0, finite=False), "cut must be a number >= 0, got nan"),
        (lambda: check_value("shape", ((1,), ()), tuple[tuple[int, ...], ...], minimum=1, nonempty=True),
         "shape[1] must be a non-empty list, got ()"),
        (lambda: check_value("shape", [[1, 0]], tuple[tuple[int, ...], ...], minimum=1),
         "shape[0][1] must be an integer >= 1, got 0"),
        (lambda: check_value("w", -0.5, Optional[float], minimum=0), "w must be a number >= 0, got -0.5"),
        (lambda: check_value("kind", "z", Literal["a", "b"]), "kind must be one of ['a', 'b'], got 'z'"),
    ],
)
def test_validators_name_the_option_and_the_value(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert message in str(err.value)


def test_validators_accept_good_values():
    check_int("steps", 3, minimum=1)
    check_number("lr", 1, positive=True)
    check_number("w", -0.5)
    check_choice("init", None, (None, "LN"))
    assert check_probability("p", 1) == 1.0 and isinstance(check_probability("p", 1), float)
    check_int("workers", None, minimum=1, none_ok=True)
    check_int("seed", -3)
    check_number("cut", float("inf"), minimum=0, finite=False)
    assert check_value("shape", [[1, 2]], tuple[tuple[int, ...], ...], minimum=1, nonempty=True) == ((1, 2),)


def test_check_fields_checks_a_dataclass_by_its_annotations_and_bounds():
    """The one annotation checker on a plain frozen dataclass: a field's declared bounds, the prefix in the
    message, lists stored as tuples, and `limits` replacing the declared bounds (what Budget does)."""
    @dataclasses.dataclass(frozen=True)
    class Part:
        layer: int = bounds(minimum=0, default=0)
        sizes: tuple[int, ...] = (1,)

        def __post_init__(self) -> None:
            check_fields(self, prefix="part ")

    assert Part(layer=2, sizes=[3, 4]).sizes == (3, 4)
    with pytest.raises(ValueError, match="part layer must be an integer >= 0, got -1"):
        Part(layer=-1)
    with pytest.raises(ValueError, match=r"part sizes\[0\] must be an integer, got True"):
        Part(sizes=(True,))
    with pytest.raises(ValueError, match="x sizes must be a non-empty list"):
        check_fields(Part(sizes=()), prefix="x ", limits=lambda f: {"nonempty": True})


def test_configs_use_the_validators():
    with pytest.raises(ValueError, match="n_layers must be an integer >= 1, got 0"):
        ModelConfig(n_layers=0)
    with pytest.raises(ValueError, match="seed must be an integer in 0..9223372036854775807, got -1"):
        TrainConfig(seed=-1)
    with pytest.raises(ValueError, match=r"momentum must be a finite number >= 0, got -0.5"):
        TrainConfig(optimizer="sgd", momentum=-0.5)
    with pytest.raises(ValueError, match="source kind must be one of"):
        SourceConfig(kind="ising")


def test_a_source_refuses_options_of_another_kind():
    with pytest.raises(ValueError, match=r"a binary source does not use \['kernel'\]"):
        SourceConfig(kind="binary", p=0.1, q=0.2, kernel=[[1, 0], [0, 1]])
    with pytest.raises(ValueError, match=r"a random source does not use \['p'\]"):
        SourceConfig(kind="random", vocab=3, p=0.1)
    with pytest.raises(ValueError, match=r"a markov source does not use \['alpha'\]"):
        SourceConfig(kind="markov", kernel=[[0.5, 0.5], [0.5, 0.5]], alpha=2.0)


# ------------------------------------------------------------------------------------------------- presets
def test_presets_are_replacements_of_the_base_preset():
    base = ModelConfig()
    assert preset("paper-1layer") == base
    for name, changes in models.PRESETS.items():
        assert preset(name) == dataclasses.replace(base, d_head=None, d_mlp=None, **changes)
    attn = preset("attn-only-2layer")
    assert (attn.n_layers, attn.d_model, attn.d_mlp, attn.d_head, attn.attn_only, attn.tie_weights) == (
        2, 16, 64, 16, True, False)
    assert preset("paper-2layer", n_heads=2).d_head == 4 and preset("paper-2layer", d_mlp=7).d_mlp == 7


# ----------------------------------------------------------------------------------------- dotted options
def test_split_key_is_the_one_parser_of_dotted_keys():
    assert training.split_key("train.lr") == ("train", "lr")
    assert training.split_key("model.preset") == ("model", "preset")
    with pytest.raises(ValueError) as err:
        training.split_key("train.lrr", where="--set")
    message = str(err.value)
    assert message.startswith("--set: key 'train.lrr' names no train option; valid train options are [")
    assert "'lr'" in message and "\n" not in message
    with pytest.raises(ValueError, match="unknown section 'optim'"):
        training.split_key("optim.lr")
    with pytest.raises(ValueError, match="must be 'section.field'"):
        training.split_key("lr")


def test_default_run_holds_the_source_dependent_defaults():
    fixed = default_run()
    assert fixed == RunConfig(source=SourceConfig(kind="binary", p=0.2, q=0.3), model=preset("paper-1layer"),
                              train=TrainConfig(steps=300, lr=2e-3))
    random = default_run(SourceConfig(kind="random", vocab=3))
    assert random.model == preset("attn-only-2layer", d_vocab=3)
    assert (random.train.steps, random.train.lr) == (1000, 1e-2)
    assert default_run(kind="random", vocab=3) == random
    mine = default_run(SourceConfig(kind="binary", p=0.5, q=0.8), steps=50, d_model=16, **{"train.lr": 0.01})
    assert (mine.train.steps, mine.train.lr, mine.model.d_model, mine.model.d_mlp) == (50, 0.01, 16, 64)
    assert default_run(preset="paper-2layer").model.n_layers == 2
    with pytest.raises(ValueError, match="'stepz' names no option"):
        default_run(stepz=3)


def test_build_run_merges_sections_and_dotted_overrides():
    run = build_run({"source": {"kind": "random", "vocab": 4}, "model": {"preset": "attn-only-2layer", "n_ctx": 64},
                     "train": {"seq_len": 64}}, {"model.d_model": 32, "train.lr": 0.01})
    assert run.model.d_vocab == 4 and run.model.d_model == 32 and run.model.d_mlp == 128 and run.train.lr == 0.01
    assert build_run({}).source == SourceConfig(kind="binary", p=0.2, q=0.3)
    with pytest.raises(ValueError, match=r"unknown sections \['data'\]"):
        build_run({"data": {}})


def test_override_run_sets_fields_of_a_complete_run():
    run = RunConfig.from_json((FIXTURES / "binary.json").read_text())
    assert override_run(run, {}) == run
    new = override_run(run, {"train.lr": 0.01, "source.p": 0.5})
    assert new == dataclasses.replace(run, train=run.train.replace(lr=0.01), source=run.source.replace(p=0.5))
    with pytest.raises(ValueError, match="'model.preset' cannot change a complete run config"):
        override_run(run, {"model.preset": "paper-2layer"})
    # derived sizes follow as in ModelConfig.replace; explicit ones stay
    assert override_run(run, {"model.d_model": 16}).model == run.model.replace(d_model=16)
    assert override_run(run, {"model.n_heads": 2}).model.d_head == 4
    odd = dataclasses.replace(run, model=run.model.replace(d_mlp=12))
    assert override_run(odd, {"model.d_model": 16}).model.d_mlp == 12
    random = override_run(run, {"source.kind": "random", "source.vocab": 3, "source.p": None, "source.q": None})
    assert random.model.d_vocab == 3
    for name in ("random", "markov"):
        other = RunConfig.from_json((FIXTURES / f"{name}.json").read_text())
        assert override_run(other, {}) == other


# ---------------------------------------------------------------------------------------- typed table rows
def _row(cell: sweep.Cell, *, status: str = "ok", probe: bool = True) -> sweep.Row:
    columns = sweep.ProbeColumns(mechanism="induction", confident=False, state_ratio=0.25, context_ratio=1.5,
                                 bigram_gain=0.1, icl_score=-0.02, previous_token_excess=0.9, induction_excess=0.8,
                                 previous_token_head=(0, 0), induction_head=(1, 0), previous_token_ablation=0.3,
                                 induction_ablation=0.2, circuit_confirmed=True)
    result = sweep.CellResult(final_step=6, final_eval_loss=0.94871, final_train_loss=1.0, entropy_rate=0.8,
                              unigram_loss=0.98, bayes_loss=0.944, excess_loss=0.00471, outcome="optimum",
                              stuck_at_unigram=False, escape_step=4, probe=columns if probe else None,
                              seconds=1.0, censored=False, crossings={"dwell": 2, "0.9": [2, 3], "0.5": [3, 4],
                                                                       "0.25": [5, None]})
    return sweep.Row(sweep="demo", cell_id=cell.cell_id, status=status, error=None if status == "ok" else "boom",
                     params=dict(cell.params), config=cell.config, result=result if status == "ok" else None,
                     run_dir=f"runs/{cell.cell_id}")


def test_table_rows_round_trip_through_the_one_typed_reader(tmp_path):
    spec = sweep.SweepSpec(name="demo", base={"source": {"kind": "markov", "kernel": [[0.9, 0.1], [0.4, 0.6]],
                                                         "initial": [0.5, 0.5]},
                                              "model": {"preset": "paper-1layer", "n_ctx": 32},
                                              "train": {"steps": 5, "seq_len": 32}},
                           grid={"model.tie_weights": [True, False], "train.lr": [1, 0.5]}, seeds=(0, 1))
    cells = spec.cells()
    rows = [_row(cells[0]), _row(cells[1], probe=False), _row(cells[2], status="failed")] + [
        _row(c) for c in cells[3:]]
    sweep.write_table(tmp_path, rows)
    back = sweep.read_table(tmp_path)
    assert back == rows
    assert back[0].result.probe.previous_token_head == (0, 0) and back[0].params["train.lr"] == 1
    assert back[0].result.crossings["0.25"] == [5, None] and back[0].result.crossing(0.25).censored
    assert isinstance(back[0].params["train.lr"], int) and back[0].config.source.kernel == ((0.9, 0.1), (0.4, 0.6))
    header = (tmp_path / "results.csv").read_text().splitlines()[0].split(",")
    assert header[:4] == ["sweep", "cell_id", "status", "error"]
    assert {"param.model.tie_weights", "source.kernel", "mechanism", "probe.induction_head"} <= set(header)


def test_the_reader_refuses_a_row_whose_config_is_not_its_cell(tmp_path):
    (cell,) = sweep.SweepSpec(base={"train": {"steps": 5, "seq_len": 32}, "model": {"n_ctx": 32}}).cells()
    sweep.write_table(tmp_path, [_row(cell)])
    path = tmp_path / "results.csv"
    path.write_text(path.read_text().replace(",0.2,0.3,", ",0.25,0.3,"))
    with pytest.raises(ValueError, match="config columns give another cell id"):
        sweep.read_table(path)


def test_tables_written_before_typed_rows_read_back():
    """results.csv of the earlier, dict-based sweep (fixture: two ok cells, two failed) reads as typed rows."""
    rows = sweep.read_table(Path(__file__).parents[1] / "data" / "results_v1.csv")
    assert [r.status for r in rows] == ["ok", "failed", "ok", "failed"]
    ok = rows[0]
    assert ok.params == {"model.tie_weights": True, "seed": 0} and ok.config.source.kernel == ((0.9, 0.1), (0.4, 0.6))
    assert ok.result.final_eval_loss == 0.61234 and ok.result.escape_step == 4 and ok.result.bayes_loss is None
    assert ok.result.probe.mechanism == "kernel" and ok.result.probe.previous_token_head == (0, 0)
    assert ok.result.probe.induction_head is None and ok.result.probe.circuit_confirmed is False
    assert ok.result.crossing() is None  # its escape step was a training-loss rule without censoring: not read
    assert rows[1].result is None and rows[1].error == "RuntimeError: planted"
    assert rows[2].config.model.tie_weights is False
