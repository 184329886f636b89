"""Tests for markov_interp.training: schedule, configs, run folders, resume, reproducibility, the CLI."""

import json
import math

import pytest
import torch

from markov_interp import models, theory, training
from markov_interp.cli import main
from markov_interp.sources import SourceConfig
from markov_interp.models import preset
from markov_interp.training import RunConfig, TrainConfig, checkpoint_steps, one_cycle_lr, train

BINARY = SourceConfig(kind="binary", p=0.2, q=0.3)


def tiny_run(**train_kwargs) -> RunConfig:
    """A run small enough for unit tests (a few hundred ms)."""
    kwargs = dict(steps=12, batch_size=4, seq_len=32, log_every=2, eval_every=6, eval_batches=1,
                  n_checkpoints=4, device="cpu")
    kwargs.update(train_kwargs)
    return RunConfig(source=BINARY, model=preset("paper-1layer", n_ctx=32), train=TrainConfig(**kwargs))


def weights(model) -> dict:
    return {k: v.clone() for k, v in models.state_dict_for_save(model).items()}


def assert_same_weights(a, b):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


# -------------------------------------------------------------------------------------------- schedule
@pytest.mark.parametrize("total", [10, 100, 401])
def test_one_cycle_matches_torch(total):
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=2e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=total, pct_start=0.02,
                                                div_factor=100, final_div_factor=0.05, cycle_momentum=False)
    for step in range(total):
        assert math.isclose(one_cycle_lr(step, total=total, lr=2e-3), opt.param_groups[0]["lr"], rel_tol=1e-9)
        opt.step()
        sched.step()
    assert math.isclose(one_cycle_lr(total - 1, total=total, lr=2e-3), 4e-4, rel_tol=1e-9)


def test_checkpoint_steps_are_log_spaced():
    assert checkpoint_steps(1000, 4) == [1, 10, 100, 1000]
    assert checkpoint_steps(5, 10) == [1, 2, 3, 4, 5]
    assert checkpoint_steps(7, 0) == []
    assert checkpoint_steps(7, 1) == [7]


# --------------------------------------------------------------------------------------------- configs
def test_run_config_round_trip():
    run = tiny_run(precision="bf16", optimizer="sgd", momentum=0.9)
    assert RunConfig.from_json(run.to_json()) == run
    with pytest.raises(ValueError, match="unknown TrainConfig keys"):
        RunConfig.from_dict({**run.to_dict(), "train": {**run.train.to_dict(), "dropout": 0.0}})
    with pytest.raises(ValueError, match="unknown RunConfig keys"):
        RunConfig.from_dict({**run.to_dict(), "notes": "x"})


def test_seq_len_longer_than_context_is_refused():
    with pytest.raises(ValueError, match=r"seq_len=64 exceeds the model's n_ctx=32"):
        RunConfig(source=BINARY, model=preset("paper-1layer", n_ctx=32), train=TrainConfig(seq_len=64))


def test_vocab_mismatch_is_refused():
    source = SourceConfig(kind="random", vocab=3)
    with pytest.raises(ValueError, match="source emits 3 states but the model has d_vocab=2"):
        RunConfig(source=source, model=preset("attn-only-2layer"), train=TrainConfig())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(steps=0), "steps"),
        (dict(precision="fp8"), "precision"),
        (dict(optimizer="lion"), "optimizer"),
        (dict(schedule="linear"), "schedule"),
        (dict(loss_scaling=True), "loss_scaling"),
        (dict(betas=(0.9,)), "betas"),
        (dict(lr=0.0), "lr"),
        (dict(warmup_frac=1.0), "warmup_frac"),
    ],
)
def test_bad_train_configs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kwargs)


def test_weight_decay_only_on_linear_weights():
    """One rule, by parameter name: linear weights decay; embeddings (tied or not), positions, LayerNorm and
    biases do not."""
    from markov_interp.models.optim import decay_names, decayed

    tied = decay_names(preset("paper-1layer", n_ctx=32))
    assert tied == {f"blocks.0.attn.{n}.weight" for n in "qkvo"} | {"blocks.0.mlp.in.weight", "blocks.0.mlp.out.weight"}
    untied = decay_names(preset("paper-1layer", n_ctx=32, tie_weights=False, attn_bias=True, layernorm_bias=True))
    assert untied == tied | {"unembed.weight"}  # an untied head is a linear layer
    assert not any(decayed(n) for n in ("embed.weight", "pos_embed.weight", "blocks.0.ln1.weight",
                                        "blocks.0.attn.q.bias", "unembed.bias", "ln_final.weight"))


# ------------------------------------------------------------------------------------- training runs
@pytest.mark.slow
def test_same_seed_same_metrics_and_weights():
    a, b = train(tiny_run(), progress=False), train(tiny_run(), progress=False)
    assert a.metrics == b.metrics
    assert_same_weights(a.model, b.model)
    c = train(tiny_run(seed=1), progress=False)
    assert c.metrics != a.metrics


@pytest.mark.slow
def test_run_folder_tying_and_reload(tmp_path):
    result = train(tiny_run(), tmp_path, progress=False)
    assert {p.name for p in tmp_path.iterdir()} == {"config.json", "metrics.jsonl", "model.safetensors", "checkpoints",
                                                  ".lock"}  # the write lock (runs.lock)
    assert RunConfig.from_json((tmp_path / "config.json").read_text()) == tiny_run()
    rows = training.load_metrics(tmp_path)
    assert rows == json.loads(json.dumps(result.metrics))
    assert [r["step"] for r in rows] == [2, 4, 6, 8, 10, 12]
    assert {"eval_loss", "entropy_rate", "unigram_loss"} <= set(rows[2]) and "eval_loss" not in rows[0]
    assert math.isclose(rows[-1]["entropy_rate"], 0.5445871749, rel_tol=1e-6)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt")) == [
        f"step_{s:07d}.pt" for s in checkpoint_steps(12, 4)
    ]
    models.check_tied(result.model)  # tying survives training
    assert result.model.embed.W_E.data_ptr() == result.model.unembed.W_U.data_ptr()
    reloaded = models.load(tmp_path)
    models.check_tied(reloaded)
    toks = BINARY.build().sample(2, 32, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(reloaded(toks), result.model(toks), rtol=0, atol=0)

    mtime = (tmp_path / "model.safetensors").stat().st_mtime_ns
    again = train(tiny_run(), tmp_path, progress=False)  # finished: loaded, not retrained
    assert again.already_done and again.metrics == rows
    assert (tmp_path / "model.safetensors").stat().st_mtime_ns == mtime
    assert_same_weights(again.model, result.model)

    with pytest.raises(ValueError, match=r"different config.*train.steps: 12 in folder vs 13 requested"):
        train(tiny_run(steps=13), tmp_path, progress=False)


def test_foreign_folder_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"holds files that are not a run's \(notes.txt\) and no config.json"):
        train(tiny_run(), tmp_path, progress=False)
    # no run file written beside it, and the lock it took is taken back (`runs.lock` removes the .lock it created)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


class _Interrupt(Exception):
    pass


@pytest.mark.slow
def test_resume_is_bit_identical(tmp_path, monkeypatch):
    reference = train(tiny_run(), tmp_path / "a", progress=False)

    def kill_after_step_9(step):
        if step == 9:  # after the 9th update, before the 10th
            raise _Interrupt

    monkeypatch.setattr(training.loop, "_on_step", kill_after_step_9)
    with pytest.raises(_Interrupt):
        train(tiny_run(), tmp_path / "b", progress=False)
    assert not (tmp_path / "b" / "model.safetensors").exists()
    assert max(r["step"] for r in training.load_metrics(tmp_path / "b")) == 8  # rows past the checkpoint
    monkeypatch.undo()

    resumed = train(tiny_run(), tmp_path / "b", progress=False)
    assert resumed.resumed_from == max(s for s in checkpoint_steps(12, 4) if s < 10)
    assert resumed.metrics == reference.metrics
    assert training.load_metrics(tmp_path / "b") == training.load_metrics(tmp_path / "a")
    assert_same_weights(resumed.model, reference.model)
    models.check_tied(resumed.model)


@pytest.mark.slow
@pytest.mark.parametrize("precision, scaling", [("bf16", False), ("fp16", False), ("fp16", True)])
def test_reduced_precision_runs(precision, scaling):
    result = train(tiny_run(steps=4, eval_every=0, precision=precision, loss_scaling=scaling), progress=False)
    assert math.isfinite(result.final.eval_loss)
    assert next(result.model.parameters()).dtype == torch.float32  # autocast, fp32 master weights


@pytest.mark.slow
def test_random_source_logs_the_bayes_loss():
    source = SourceConfig(kind="random", vocab=3, alpha=1.0)
    run = RunConfig(source=source, model=preset("attn-only-2layer", d_vocab=3, n_ctx=32),
                    train=TrainConfig(steps=4, batch_size=4, seq_len=32, eval_batches=1, n_checkpoints=0,
                                      device="cpu"))
    result = train(run, progress=False)
    refs = result.final.references
    assert isinstance(refs, theory.ReferenceLosses) and refs.in_context
    assert refs.bayes_loss == result.metrics[-1]["bayes_loss"] and refs.entropy_rate == result.metrics[-1]["entropy_rate"]
    assert result.final.optimum == result.final.bayes_loss is not None


@pytest.mark.slow
def test_one_layer_reaches_the_entropy_rate():
    """The paper's one-layer model on p=0.2, q=0.3 (p + q < 1: no bad minima) learns the kernel."""
    run = RunConfig(source=BINARY, model=preset("paper-1layer", n_ctx=128),
                    train=TrainConfig(steps=120, seq_len=128, eval_every=0, eval_batches=16, n_checkpoints=0,
                                      device="cpu"))
    final = train(run, progress=False).final
    assert math.isclose(final.entropy_rate, 0.5446, abs_tol=1e-4)
    assert abs(final.eval_loss - final.entropy_rate) < 0.01, final
    assert final.unigram_loss - final.eval_loss > 0.1


# ------------------------------------------------------------------------------------------------- CLI
@pytest.mark.slow
def test_cli_train(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--out", str(out), "--steps", "4", "--seq-len", "16", "--batch-size", "2", "--no-progress",
            "--device", "cpu", "--d-model", "16"]
    assert main(args) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("trained (4 steps): final eval loss") and "entropy rate 0.5446" in line
    assert "unigram loss 0.6730" in line
    assert models.load(out).markov_config.d_model == 16
    assert main(args) == 0 and capsys.readouterr().out.startswith("already trained")
    assert main(["train", "--out", str(tmp_path / "r2"), "--seq-len", "2000", "--no-progress"]) == 2
    assert "seq_len=2000 exceeds the model's n_ctx=1024" in capsys.readouterr().err
    assert main(["train", "--out", str(tmp_path / "r3"), "--preset", "gpt", "--no-progress"]) == 2
    assert "unknown preset 'gpt'" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_train_on_a_fixed_multistate_kernel(tmp_path, capsys):
    kernel = [[0.8, 0.1, 0.1], [0.2, 0.5, 0.3], [0.05, 0.15, 0.8]]
    out = tmp_path / "run"
    args = ["train", "--out", str(out), "--source", "markov", "--kernel", json.dumps(kernel), "--steps", "3",
            "--seq-len", "16", "--batch-size", "2", "--no-progress", "--device", "cpu"]
    assert main(args) == 0
    line = capsys.readouterr().out
    expected = theory.entropy_rate(kernel)
    assert f"entropy rate {expected:.4f}" in line
    assert models.load(out).markov_config.d_vocab == 3  # the model's vocabulary follows the kernel
    bad = ["train", "--out", str(tmp_path / "bad"), "--source", "markov", "--no-progress"]
    assert main(bad + ["--kernel", "[[0.5, 0.6], [0.5, 0.5]]"]) == 2
    assert "sum to 1" in capsys.readouterr().err
    assert main(bad + ["--kernel", "[[0.5, 0.5]"]) == 2
    assert "--kernel is not valid JSON" in capsys.readouterr().err
    assert main(bad) == 2
    assert "a markov source needs kernel" in capsys.readouterr().err
    assert main(["train", "--out", str(tmp_path / "b2"), "--kernel", "[[1, 0], [0, 1]]", "--no-progress"]) == 2
    assert "a binary source does not use ['kernel']" in capsys.readouterr().err


def test_cli_unknown_set_key_is_one_line_listing_the_valid_ones(tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path / "r"), "--set", "train.lrr=0.01", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("markov-interp train: error: --set: key 'train.lrr' names no train")
    assert "'lr'" in err and "'steps'" in err
    assert main(["train", "--out", str(tmp_path / "r"), "--set", "train.lr", "--no-progress"]) == 2
    assert "--set takes KEY=VALUE" in capsys.readouterr().err  # the one --set form (issue 32)
    assert main(["train", "--out", str(tmp_path / "r"), "--lr", "0.1", "--set", "train.lr=0.2"]) == 2
    assert "contradicts" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_cli_builds_its_run_with_default_run():
    from markov_interp.cli import _train_run, build_parser

    def run_of(*argv):
        return _train_run(build_parser().parse_args(["train", "--out", "x", *argv]))

    assert run_of() == training.default_run()
    assert run_of("--source", "random", "--vocab", "3") == training.default_run(kind="random", vocab=3)
    mine = run_of("--steps", "7", "--no-tie", "--set", "model.n_heads=2", "--set", "source.initial=uniform",
                  "--set", "train.betas=[0.8, 0.9]", "--set", "train.grad_clip=null")
    assert mine == training.default_run(steps=7, tie_weights=False, n_heads=2, initial="uniform", betas=(0.8, 0.9))


@pytest.mark.slow
def test_cli_config_reproduces_a_run_and_set_overrides_it(tmp_path, capsys):
    first = tmp_path / "first"
    common = ["--no-progress", "--threads", "1"]
    assert main(["train", "--out", str(first), "--steps", "6", "--seq-len", "16", "--batch-size", "2",
                 "--n-ctx", "16", "--checkpoints", "2", "--device", "cpu", *common]) == 0
    again = tmp_path / "again"
    assert main(["train", "--config", str(first / "config.json"), "--out", str(again), *common]) == 0
    assert (again / "config.json").read_text() == (first / "config.json").read_text()
    a, b = models.read_weights(first)[1], models.read_weights(again)[1]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit for bit
    assert training.load_metrics(first) == training.load_metrics(again)

    changed = tmp_path / "changed"
    assert main(["train", "--config", str(first / "config.json"), "--out", str(changed), "--set", "train.lr=0.01",
                 "--set", "model.n_heads=2", *common]) == 0
    saved = json.loads((changed / "config.json").read_text())
    assert saved["train"]["lr"] == 0.01 and saved["model"]["n_heads"] == 2 and saved["model"]["d_head"] == 4
    base = json.loads((first / "config.json").read_text())
    assert {**saved["train"], "lr": None} == {**base["train"], "lr": None}
    capsys.readouterr()
    assert main(["train", "--config", str(tmp_path / "missing.json"), "--out", str(tmp_path / "m"), *common]) == 2
    assert "no run config at" in capsys.readouterr().err
