"""The one training engine (issue 20): the same run gives the same weights whatever the entry point, a stack
member's numbers do not depend on its companions, run folders written before the engine was unified still load,
probe, report and resume, heads per layer through the command line."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from markov_interp import models, sweep, training
from markov_interp.cli import main
from markov_interp.sources import SourceConfig
from markov_interp.models import preset
from markov_interp.models.optim import StackedOptimizer
from markov_interp.training import RunConfig, TrainConfig, train, train_many
from markov_interp import runs
from tests.project.test_imports import import_graph

ROOT = Path(__file__).resolve().parents[2]
OLD_RUNS = Path(__file__).parents[1] / "data" / "old_runs"  # written by tests/data/make_fixtures.py with main's code
BINARY = SourceConfig(kind="binary", p=0.5, q=0.8)


def tiny_run(seed=0, source=BINARY, model=None, **train_kwargs) -> RunConfig:
    kwargs = dict(steps=8, batch_size=4, seq_len=16, log_every=2, eval_every=4, eval_batches=1, n_checkpoints=2,
                  device="cpu", seed=seed)
    kwargs.update(train_kwargs)
    return RunConfig(source=source, model=model or preset("paper-1layer", n_ctx=16), train=TrainConfig(**kwargs))


def _weights(model_or_folder) -> dict:
    if isinstance(model_or_folder, Path):
        return models.read_weights(model_or_folder)[1]
    return models.state_dict_for_save(model_or_folder)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------ entry points
@pytest.mark.slow
def test_every_entry_point_gives_the_same_weights(tmp_path, capsys):
    run = tiny_run(seed=0)
    reference = train(run, progress=False)
    expected = _weights(reference.model)
    others = [tiny_run(seed=3, source=SourceConfig(kind="binary", p=0.2, q=0.3), lr=4e-3), tiny_run(seed=5)]
    got = {
        "train into a folder": _weights(train(run, tmp_path / "folder", progress=False).model),
        "train_many alone": _weights(train_many([run], progress=False)[0].model),
        "train_many among others": _weights(train_many([others[0], run, others[1]], progress=False)[1].model),
    }
    config = tmp_path / "folder" / "config.json"
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "cli"), "--no-progress"]) == 0
    got["markov-interp train"] = _weights(tmp_path / "cli")
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "seeds"), "--seeds", "5,0,3",
                 "--no-progress"]) == 0
    got["markov-interp train --seeds"] = _weights(tmp_path / "seeds" / "seed-0")
    capsys.readouterr()
    base = json.loads(run.to_json())
    del base["train"]["seed"]  # a sweep's seeds are its own list
    spec = sweep.SweepSpec(name="same", base=base, grid={"source.p": [0.2, 0.5]}, seeds=(0, 5), probe=False)
    for group in (1, 4):
        result = sweep.run(spec, tmp_path / f"sweep-{group}", workers=1, progress=False, group=group)
        (row,) = [r for r in result.rows if r.config == run]
        got[f"sweep.run, group {group}"] = _weights(tmp_path / f"sweep-{group}" / row.run_dir)
    for entry, weights in got.items():
        assert _same(weights, expected), entry
    assert training.load_metrics(tmp_path / "cli") == reference.metrics == training.load_metrics(tmp_path / "folder")


RECIPES = {
    "adamw clip decay": (BINARY, dict(n_layers=2), dict(grad_clip=0.1, weight_decay=0.1)),
    "sgd momentum clip": (BINARY, {}, dict(optimizer="sgd", momentum=0.9, lr=0.05, grad_clip=0.05)),
    "fp16 loss scaling freeze": (BINARY, {}, dict(precision="fp16", loss_scaling=True,
                                                  interventions=["blocks.0.attn.*@1:4"])),
    "bf16 heads per layer clamps": (BINARY, dict(n_layers=2, n_heads=(1, 2)), dict(
        precision="bf16", interventions=["blocks.1.attn.hook_z[1]=mean", "blocks.0.attn.hook_pattern=previous_token@:3"])),
    "random rotary": (SourceConfig(kind="random", vocab=3), dict(n_layers=2, attn_only=True, d_vocab=3,
                                                                  positional="rotary", d_model=16), dict(grad_clip=0.2)),
    "order 2 LNPre gelu_new": (SourceConfig(kind="markov", order=2, kernel=torch.softmax(
        torch.arange(27.0).reshape(9, 3) / 5, -1).tolist()), dict(d_vocab=3, normalization="LNPre", act_fn="gelu_new"),
        dict()),
}


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_a_member_does_not_depend_on_its_companions(recipe):
    """Bit for bit: a run alone, and the same run in the middle of a stack of three (other seeds)."""
    source, model, train_kwargs = RECIPES[recipe]
    run = tiny_run(source=source, model=preset("paper-1layer", n_ctx=16, **model), n_checkpoints=0, **train_kwargs)
    alone = train_many([run], progress=False)[0]
    stacked = train_many([run.replace(train=run.train.replace(seed=s)) for s in (7, 0, 4)], progress=False)[1]
    assert alone.metrics == stacked.metrics
    assert _same(_weights(alone.model), _weights(stacked.model))


# ------------------------------------------------------------------------------------------- old folders
def _old(name: str, tmp_path: Path) -> Path:
    folder = tmp_path / name
    shutil.copytree(OLD_RUNS / name, folder)
    return folder


def test_a_finished_folder_of_the_old_solo_loop_loads_and_is_not_retrained(tmp_path):
    folder = _old("finished", tmp_path)
    run = runs.read_config(folder)
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    done = train(run, folder, progress=False)
    assert done.already_done and (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert done.metrics == runs.load_metrics(folder) and done.final.step == run.train.steps
    assert done.final.references.entropy_rate == runs.load_metrics(folder)[-1]["entropy_rate"]
    assert _same(_weights(done.model), _weights(folder))


def test_old_weights_without_a_recorded_length_load_with_the_runs():
    """The old loop's weights record no training length; `runs.load_model` takes it from the run's config.json,
    for the final weights and for a checkpoint (whose run folder is the one above checkpoints/)."""
    from markov_interp import probes

    for path in (OLD_RUNS / "finished", OLD_RUNS / "finished" / "model.safetensors",
                 OLD_RUNS / "unfinished" / "checkpoints" / "step_0000003.safetensors"):
        assert models.weights_metadata(models.load(path)).train_seq_len is None
        run = runs.read_config(runs.run_folder_of(path))
        model = runs.load_model(path, expect=run.model)
        assert models.weights_metadata(model).train_seq_len == run.train.seq_len == probes.probe_length(model)


@pytest.mark.slow
def test_a_finished_folder_of_the_old_solo_loop_probes_and_reports(tmp_path, capsys):
    from markov_interp import report

    folder = _old("finished", tmp_path)
    assert main(["probe", str(folder), "--json", "--n-sequences", "8"]) == 0
    assert json.loads(capsys.readouterr().out)["mechanism"]
    built = report.build(folder, n_sequences=8, max_checkpoints=2)
    # the first screen draws the loss during training (from the old loop's metrics.jsonl) beside the circuit
    assert built.mechanism.mechanism and any("Loss during training" in part for part in built.section("summary").parts
                                                 if isinstance(part, str))


def test_an_unfinished_folder_of_the_old_solo_loop_resumes(tmp_path):
    """Its checkpoint (torch AdamW state in two decay groups, generators, a clamp's running mean) continues in the
    one engine: the rows it had are kept and the run ends where the old loop ended uninterrupted up to float
    rounding (a wrongly mapped moment or step count would be off by ~lr per step); a second resume of the same
    folder is bit-identical to the first."""
    folder = _old("unfinished", tmp_path)
    run = runs.read_config(folder)
    before = runs.load_metrics(folder)
    _, state = runs.read_checkpoint(folder, 3)
    stack_optimizer = StackedOptimizer(models.stack.build_stack([run.model], [0]), kind="adamw")
    for index, name in enumerate(stack_optimizer.checkpoint_order()):  # the old numbering of parameters
        assert state["optimizer"]["state"][index]["exp_avg"].shape == stack_optimizer.stack.params[name].shape[1:]
    resumed = train(run, folder, progress=False)
    assert resumed.resumed_from == 3 and resumed.metrics[:len([r for r in before if r["step"] <= 3])] == [
        r for r in before if r["step"] <= 3]
    old_final = _weights(OLD_RUNS / "unfinished_final.safetensors")
    ours = _weights(resumed.model)
    assert max((ours[k] - old_final[k]).abs().max().item() for k in ours) < 1e-5
    again = train(run, _old("unfinished", tmp_path / "again"), progress=False)
    assert again.metrics == resumed.metrics and _same(_weights(again.model), ours)


# ------------------------------------------------------------------------------------- heads on the CLI
@pytest.mark.slow
def test_cli_heads_per_layer_round_trip(tmp_path, capsys):
    out = tmp_path / "heads"
    common = ["--steps", "4", "--seq-len", "16", "--n-ctx", "16", "--batch-size", "2", "--no-progress",
              "--checkpoints", "1"]
    assert main(["train", "--out", str(out), "--layers", "2", "--heads", "1,2", *common]) == 0
    saved = json.loads((out / "config.json").read_text())["model"]
    assert saved["n_heads"] == [1, 2] and saved["d_head"] == 4
    assert models.heads_per_layer(models.load(out)) == (1, 2)
    assert main(["train", "--config", str(out / "config.json"), "--out", str(tmp_path / "again"), "--no-progress"]) == 0
    assert _same(_weights(out), _weights(tmp_path / "again"))
    capsys.readouterr()
    assert main(["train", "--out", str(tmp_path / "bad"), "--layers", "2", "--heads", "1,2,3", *common]) == 2
    assert "3 head counts but n_layers=2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--out", str(tmp_path / "bad"), "--heads", "1,x"])
    assert "one count per layer such as 1,2" in capsys.readouterr().err


def test_sweep_grid_over_head_counts():
    spec = sweep.SweepSpec(name="heads", base={"source": {"kind": "binary", "p": 0.5, "q": 0.8},
                                               "model": {"preset": "paper-2layer", "n_ctx": 16},
                                               "train": {"steps": 4, "seq_len": 16}},
                           grid={"model.n_heads": [[1, 2], 2]}, seeds=[0], probe=False)
    cells = spec.cells()
    assert sorted(c.config.model.heads_per_layer for c in cells) == [(1, 2), (2, 2)]
    assert len({training.stack_key(c.config) for c in cells}) == 2  # different shapes: different stacks


# ---------------------------------------------------------------------------------------------- imports
def test_reading_a_run_folder_imports_nothing_of_training(tmp_path):
    """`probe` and `report` read run folders through `markov_interp.runs`, which imports nothing of `training`:
    a fresh interpreter reads a trained folder (config, metrics, divergence, checkpoints, model, the probes'
    length) and imports the probes and the report without loading any module of `markov_interp.training`."""
    folder = tmp_path / "run"
    train(tiny_run(), folder, progress=False)
    code = ("import sys\nfrom markov_interp import probes, report, runs\n"
            "run = runs.read_config(sys.argv[1])\n"
            "assert runs.load_metrics(sys.argv[1]) and runs.divergence(sys.argv[1]) is None\n"
            "(step, path), *_ = runs.list_checkpoints(sys.argv[1])\n"
            "for where in (sys.argv[1], path):\n"
            "    assert probes.probe_length(runs.load_model(where, expect=run.model)) == run.train.seq_len\n"
            "print(sorted(m for m in sys.modules if m.startswith('markov_interp.training')))\n")
    done = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
    graph = import_graph()
    for reader in ("markov_interp.runs", "markov_interp.runs.folder", "markov_interp.runs.checkpoints",
                   "markov_interp.runs.config", "markov_interp.report._build", "markov_interp.report._formation"):
        assert not {m for m in graph[reader] if m.startswith("markov_interp.training")}, reader
