"""Tests for the one engine's stacks: the stacked forward against the hooked model and against stacks of one
(a member's numbers do not depend on its companions), members equal to their runs alone, bit for bit,
incompatible runs refused, resume after a kill, divergence masking, the CLI."""

import math

import pytest
import torch

from markov_interp import models, theory, training
from markov_interp.cli import _parse_seeds, main
from markov_interp.models import stack as stacked
from markov_interp.models.optim import StackedOptimizer, decayed
from markov_interp.training import batches, loop
from markov_interp import runs
from markov_interp.sources import RandomMarkov, SourceConfig
from markov_interp.models import preset
from markov_interp.training import RunConfig, TrainConfig, train, train_many

ARCHS = {
    "1layer-tied": dict(),
    "1layer-untied": dict(tie_weights=False),
    "2layer-tied": dict(n_layers=2),
    "2layer-attn-only-untied": dict(n_layers=2, attn_only=True, tie_weights=False),
    "rotary-2heads-biases": dict(positional="rotary", n_heads=2, attn_bias=True, mlp_bias=True),
    "lnpre-relu": dict(normalization="LNPre", act_fn="relu"),
}


def _stack_and_solos(overrides: dict, seeds=(0, 5, 7)):
    cfg = preset("paper-1layer", n_ctx=32, **overrides)
    configs = [cfg, cfg.replace(init_std=0.1), cfg][: len(seeds)]
    return stacked.build_stack(configs, list(seeds)), [models.build(c, seed=s) for c, s in zip(configs, seeds)]


def _tokens(n_members: int, batch: int = 3, seq: int = 32, vocab: int = 2):
    return torch.randint(0, vocab, (n_members, batch, seq), generator=torch.Generator().manual_seed(1))


# -------------------------------------------------------------------------------------------- forward
@pytest.mark.parametrize("arch", list(ARCHS))
def test_stacked_forward_equals_hooked_forward_and_stacks_of_one(arch):
    stack, solos = _stack_and_solos(ARCHS[arch])
    tokens = _tokens(len(solos))
    logits = stacked.stacked_forward(stack, tokens)
    for k, solo in enumerate(solos):
        torch.testing.assert_close(logits[k], solo(tokens[k]), rtol=0, atol=1e-5)
        alone = stacked.build_stack([solo.markov_config], [(0, 5, 7)[k]])  # member k as a stack of one
        assert torch.equal(logits[k], stacked.stacked_forward(alone, tokens[k:k + 1])[0])  # bit for bit
    # members start at their init (`models.build`'s weights), tying kept as one matrix per member
    for k, solo in enumerate(solos):
        for name, value in models.state_dict_for_save(solo).items():
            assert torch.equal(stack.params[name][k], value), name
    assert ("unembed.weight" in stack.params) == (not ARCHS[arch].get("tie_weights", True))


def test_the_cuda_short_row_norm_is_layer_norm(monkeypatch):
    """On CUDA, rows of up to SHORT_ROWS_ON_CUDA values are normalised by two reductions instead of F.layer_norm
    (faster there): the same function, and the stacked forward taking that path still equals the hooked model's."""
    x = torch.randn(4, 3, 32, stacked.SHORT_ROWS_ON_CUDA, generator=torch.Generator().manual_seed(2)) * 5 + 3
    reference = torch.nn.functional.layer_norm(x, x.shape[-1:], eps=1e-5)
    torch.testing.assert_close(stacked._two_reduction_norm(x, 1e-5), reference, rtol=0, atol=2e-6)
    assert torch.equal(stacked._layer_norm(x, 1e-5), reference)  # a CPU tensor keeps the fused kernel
    monkeypatch.setattr(stacked, "_layer_norm", stacked._two_reduction_norm)  # what a CUDA tensor takes
    stack, solos = _stack_and_solos(ARCHS["2layer-tied"])
    tokens = _tokens(len(solos))
    logits = stacked.stacked_forward(stack, tokens)
    for k, solo in enumerate(solos):
        torch.testing.assert_close(logits[k], solo(tokens[k]), rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", ["1layer-tied", "1layer-untied", "rotary-2heads-biases"])
def test_checkpoint_order_is_two_decay_groups(arch):
    """The optimiser state a stack checkpoints numbers parameters as a torch optimiser with two groups does
    (decayed weights, then the rest, each in the model's order): the numbering of every run folder's checkpoints."""
    stack, _ = _stack_and_solos(ARCHS[arch], seeds=(0,))
    order = StackedOptimizer(stack, kind="adamw").checkpoint_order()
    names = list(stack.params)
    assert order == [n for n in names if decayed(n)] + [n for n in names if not decayed(n)]


def test_stack_gradients_equal_stacks_of_one():
    stack, solos = _stack_and_solos(dict(n_layers=2, tie_weights=False))
    tokens = _tokens(len(solos))
    stacked.stacked_loss(stacked.stacked_forward(stack, tokens[..., :-1]), tokens[..., 1:]).sum().backward()
    for k, (solo, seed) in enumerate(zip(solos, (0, 5, 7))):
        alone = stacked.build_stack([solo.markov_config], [seed])
        logits = stacked.stacked_forward(alone, tokens[k:k + 1, :, :-1])
        stacked.stacked_loss(logits, tokens[k:k + 1, :, 1:]).sum().backward()
        for name, param in stack.params.items():
            assert torch.equal(param.grad[k], alone.params[name].grad[0]), name


@pytest.mark.parametrize("hook", ["blocks.0.hook_attn_out", "blocks.0.attn.hook_z", "blocks.1.hook_resid_pre",
                                  "blocks.0.mlp.hook_post", "blocks.1.attn.hook_v", "hook_pos_embed"])
def test_intervention_points_are_the_hooked_models(hook):
    """Zeroing a named point in the stack equals zeroing the TransformerLens hook of that name."""
    stack, solos = _stack_and_solos(dict(n_layers=2), seeds=(0, 1))
    tokens = _tokens(2)
    logits = stacked.stacked_forward(stack, tokens, {hook: torch.zeros_like})
    plain = stacked.stacked_forward(stack, tokens)
    assert hook in models.hooks.intervention_points(stack.cfg)
    for k, solo in enumerate(solos):
        hooked = solo.run_with_hooks(tokens[k], fwd_hooks=[(hook, lambda x, hook: torch.zeros_like(x))])
        torch.testing.assert_close(logits[k], hooked, rtol=0, atol=1e-5)
        assert (logits[k] - plain[k]).abs().max() > 1e-4  # the intervention acts


def test_unknown_intervention_point_is_refused():
    stack, _ = _stack_and_solos({}, seeds=(0,))
    # (attn.hook_pattern became a point with issue 14: formed when intervened; the scores never are)
    with pytest.raises(ValueError, match=r"unknown intervention points \['blocks.0.attn.hook_attn_scores'\]"):
        stacked.stacked_forward(stack, _tokens(1), {"blocks.0.attn.hook_attn_scores": torch.zeros_like})


# ------------------------------------------------------------------------------------------- sampling
@pytest.mark.parametrize("configs", [
    [SourceConfig(kind="binary", p=0.2, q=0.3), SourceConfig(kind="binary", p=0.5, q=0.8, initial="uniform")],
    [SourceConfig(kind="markov", kernel=torch.full((3, 3, 3), 1 / 3).tolist(), order=2),
     SourceConfig(kind="markov", kernel=torch.softmax(torch.arange(27.0).reshape(3, 3, 3), -1).tolist(), order=2)],
    [SourceConfig(kind="random", vocab=3), SourceConfig(kind="random", vocab=3, alpha=0.5)],
    [SourceConfig(kind="random", vocab=3, alpha=0.5), SourceConfig(kind="random", vocab=3, zero_diagonal=True),
     SourceConfig(kind="random", vocab=3, pool_size=4), SourceConfig(kind="random", vocab=3, alpha=0.5)],
    [SourceConfig(kind="random", vocab=2, order=2), SourceConfig(kind="random", vocab=2, order=2, pool_size=2,
                                                                  initial="uniform")],
])
def test_member_sampler_draws_each_solo_stream(configs):
    """The stack's batches are, member by member, what `source.sample` draws from the same generator."""
    sources = [c.build() for c in configs]
    seeds = range(3, 3 + len(sources))
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    sample = batches.member_sampler(sources, gens, 5, 40)
    solo_gens = [torch.Generator().manual_seed(s) for s in seeds]
    for _ in range(2):  # the streams stay aligned over consecutive batches
        tokens = sample()
        assert tokens.shape == (len(sources), 5, 40)
        for k, source in enumerate(sources):
            assert torch.equal(tokens[k], source.sample(5, 40, generator=solo_gens[k]))


def test_member_sampler_shares_the_arithmetic_of_one_source_object_bit_for_bit():
    """Members of one source object (a stack of seeds) have their kernels normalised, stationary laws solved and
    pools indexed together; each member's batches are still `source.sample`'s from its own generator, members of
    two objects interleaved (fresh kernels of one alpha share the Gamma rounds across the objects)."""
    for a, b in ((RandomMarkov(3), RandomMarkov(3, zero_diagonal=True)),
                 (RandomMarkov(3, alpha=0.5, pool_size=4), RandomMarkov(3, alpha=0.5)),
                 (RandomMarkov(2, order=2, alpha=2), RandomMarkov(2, order=2, alpha=2, initial="uniform"))):
        sources = [a, b, a, a, b]
        sample = batches.member_sampler(sources, [torch.Generator().manual_seed(s) for s in range(5)], 4, 24)
        solo = [torch.Generator().manual_seed(s) for s in range(5)]
        for _ in range(2):
            tokens = sample()
            for k, source in enumerate(sources):
                assert torch.equal(tokens[k], source.sample(4, 24, generator=solo[k])), (a, k)


# ------------------------------------------------------------------------------------------- training
def run_config(seed=0, p=0.2, q=0.3, *, model=None, **train_kwargs) -> RunConfig:
    kwargs = dict(steps=100, batch_size=8, seq_len=32, log_every=10, eval_every=50, eval_batches=2,
                  n_checkpoints=0, device="cpu", seed=seed)
    kwargs.update(train_kwargs)
    return RunConfig(source=SourceConfig(kind="binary", p=p, q=q), model=model or preset("paper-1layer", n_ctx=32),
                     train=TrainConfig(**kwargs))


def _weights_equal(a, b) -> bool:
    wa, wb = models.state_dict_for_save(a), models.state_dict_for_save(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def assert_same_run(result, alone) -> None:
    """One engine: a stack member's metrics and weights are its run's alone, bit for bit."""
    assert result.metrics == alone.metrics
    assert result.final == alone.final
    assert _weights_equal(result.model, alone.model)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_members_equal_their_runs_alone(optimizer):
    extra = dict(optimizer="sgd", momentum=0.9, grad_clip=1.0) if optimizer == "sgd" else {}
    scale = 20 if optimizer == "sgd" else 1
    runs = [run_config(0, lr=2e-3 * scale, **extra),
            run_config(3, 0.5, 0.8, lr=5e-3 * scale, weight_decay=1e-2, **extra),
            run_config(1, lr=1e-3 * scale, weight_decay=0.0, **extra)]
    results = train_many(runs, progress=False)
    for run, result in zip(runs, results):
        assert_same_run(result, train(run, progress=False))
        assert isinstance(result.final.references, theory.ReferenceLosses) and result.failed is None
        models.check_tied(result.model)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_reduced_precision_members_equal_their_runs_alone(precision):
    """Under autocast too (what was up to 2.5e-3 apart with two engines is now one computation); the fp32
    master weights stay fp32."""
    runs = [run_config(0, steps=30, precision=precision), run_config(1, 0.5, 0.8, steps=30, precision=precision)]
    for run, result in zip(runs, train_many(runs, progress=False)):
        assert_same_run(result, train(run, progress=False))
        assert next(result.model.parameters()).dtype == torch.float32


@pytest.mark.slow
def test_loss_scaling_members_follow_their_own_scalers(tmp_path, monkeypatch):
    """fp16 with loss scaling: one GradScaler per member (its scale, skipped overflow steps and the AdamW step
    count those leave), checkpointed as a GradScaler's state dict and resumed bit-identically."""
    runs = [run_config(0, steps=30, precision="fp16", loss_scaling=True, n_checkpoints=4),
            run_config(1, 0.5, 0.8, steps=30, precision="fp16", loss_scaling=True, lr=4e-3, n_checkpoints=4)]
    reference = train_many(runs, [tmp_path / "a0", tmp_path / "a1"], progress=False)
    for k, (run, result) in enumerate(zip(runs, reference)):
        alone = train(run, tmp_path / f"solo{k}", progress=False)
        assert_same_run(result, alone)
        ours = torch.load(tmp_path / f"a{k}" / "checkpoints" / "step_0000030.pt", weights_only=True)
        theirs = torch.load(tmp_path / f"solo{k}" / "checkpoints" / "step_0000030.pt", weights_only=True)
        scaler = torch.amp.GradScaler("cpu").state_dict()  # the keys of a torch GradScaler's state
        assert ours["scaler"] == theirs["scaler"] and set(ours["scaler"]) == set(scaler)
        assert ours["optimizer"]["state"][0]["step"] == theirs["optimizer"]["state"][0]["step"] == 30
    outs = [tmp_path / "b0", tmp_path / "b1"]
    monkeypatch.setattr(loop, "_on_step", lambda step: (_ for _ in ()).throw(_Kill) if step == 12 else None)
    with pytest.raises(_Kill):
        train_many(runs, outs, progress=False)
    monkeypatch.undo()
    for ref, res in zip(reference, train_many(runs, outs, progress=False)):
        assert res.resumed_from == 10 and res.metrics == ref.metrics and _weights_equal(res.model, ref.model)


@pytest.mark.slow
def test_loss_scaling_overflow_skips_are_per_member(tmp_path, monkeypatch):
    """Started at a scale that overflows fp16, each member skips its overflow steps as a GradScaler does: its
    scale halves per skip and its AdamW step count leaves the skipped steps out (scale = init / 2**skips with
    skips = steps - AdamW steps), and a member skips what it skips alone."""
    init = 2.0**40
    monkeypatch.setitem(loop._SCALER, "scale", init)
    runs = [run_config(0, steps=40, precision="fp16", loss_scaling=True, n_checkpoints=1),
            run_config(1, 0.5, 0.8, steps=40, precision="fp16", loss_scaling=True, lr=4e-3, n_checkpoints=1)]
    results = train_many(runs, [tmp_path / "a0", tmp_path / "a1"], progress=False)
    for k, (run, result) in enumerate(zip(runs, results)):
        assert_same_run(result, train(run, tmp_path / f"solo{k}", progress=False))
        counts = {}
        for name in (f"a{k}", f"solo{k}"):
            state = torch.load(tmp_path / name / "checkpoints" / "step_0000040.pt", weights_only=True)
            steps = int(state["optimizer"]["state"][0]["step"])
            assert steps < 40 and state["scaler"]["scale"] == init / 2 ** (40 - steps)
            counts[name] = steps
        assert counts[f"a{k}"] == counts[f"solo{k}"], counts
        assert result.failed is None


@pytest.mark.slow
def test_members_with_other_inits_and_sources():
    base = preset("attn-only-2layer", d_vocab=3, n_ctx=32)
    runs = [RunConfig(source=SourceConfig(kind="random", vocab=3, alpha=a), model=base.replace(init_std=s),
                      train=TrainConfig(steps=20, batch_size=4, seq_len=32, eval_every=10, eval_batches=1,
                                        n_checkpoints=0, device="cpu", seed=seed))
            for a, s, seed in ((1.0, 0.02, 0), (0.5, 0.05, 1))]
    for run, result in zip(runs, train_many(runs, progress=False)):
        assert_same_run(result, train(run, progress=False))


@pytest.mark.parametrize(
    "other, field",
    [
        (dict(steps=50), "train.steps"),
        (dict(optimizer="sgd"), "train.optimizer"),
        (dict(precision="bf16"), "train.precision"),
        (dict(model=preset("paper-2layer", n_ctx=32)), "model.n_layers"),
        (dict(model=preset("paper-1layer", n_ctx=64)), "model.n_ctx"),
        (dict(batch_size=4), "train.batch_size"),
    ],
)
def test_incompatible_runs_are_refused(other, field):
    with pytest.raises(ValueError, match=rf"runs\[1\] cannot share a stack with runs\[0\]: {field} differs"):
        train_many([run_config(0), run_config(1, **other)], progress=False)


def test_other_refusals(tmp_path):
    random = RunConfig(source=SourceConfig(kind="random", vocab=2), model=preset("paper-1layer", n_ctx=32),
                       train=run_config().train)
    with pytest.raises(ValueError, match="source.kind differs"):
        train_many([run_config(0), random], progress=False)
    with pytest.raises(ValueError, match="train.loss_scaling differs"):
        train_many([run_config(0, precision="fp16", loss_scaling=True), run_config(1, precision="fp16")],
                   progress=False)
    with pytest.raises(ValueError, match="at least one run"):
        train_many([], progress=False)
    with pytest.raises(ValueError, match="distinct"):
        train_many([run_config(0), run_config(1)], [tmp_path, tmp_path], progress=False)
    with pytest.raises(ValueError, match="2 runs but 1 out_dirs"):
        train_many([run_config(0), run_config(1)], [tmp_path], progress=False)


class _Kill(Exception):
    pass


@pytest.mark.slow
def test_stacked_resume_is_bit_identical(tmp_path, monkeypatch):
    configs = [run_config(0, steps=30, eval_every=15, n_checkpoints=4, log_every=5),
            run_config(1, 0.5, 0.8, steps=30, eval_every=15, n_checkpoints=4, log_every=5, lr=4e-3)]
    reference = train_many(configs, [tmp_path / "a0", tmp_path / "a1"], progress=False)
    outs = [tmp_path / "b0", tmp_path / "b1"]

    def kill_at_12(step):
        if step == 12:  # after the checkpoint at step 10, before the one at 30
            raise _Kill

    monkeypatch.setattr(loop, "_on_step", kill_at_12)
    with pytest.raises(_Kill):
        train_many(configs, outs, progress=False)
    monkeypatch.undo()
    assert [s for s, _ in runs.list_checkpoints(outs[0])] == [1, 3, 10]
    assert not (outs[0] / "model.safetensors").exists()

    resumed = train_many(configs, outs, progress=False)
    for ref, res, out, ref_out in zip(reference, resumed, outs, [tmp_path / "a0", tmp_path / "a1"]):
        assert res.resumed_from == 10
        assert res.metrics == ref.metrics
        assert training.load_metrics(out) == training.load_metrics(ref_out)
        assert _weights_equal(res.model, ref.model)
        assert _weights_equal(models.load(out), ref.model)
    again = train_many(configs, outs, progress=False)  # finished: loaded, not retrained
    assert all(r.already_done for r in again)


@pytest.mark.slow
def test_a_stack_member_folder_resumes_alone(tmp_path, monkeypatch):
    """A member's folder is a run folder: `train` resumes, alone, a member folder a killed stack left, and ends
    where the uninterrupted run alone ends."""
    runs = [run_config(0, steps=30, eval_every=15, n_checkpoints=4), run_config(2, steps=30, eval_every=15,
                                                                                n_checkpoints=4)]
    outs = [tmp_path / "m0", tmp_path / "m1"]
    monkeypatch.setattr(loop, "_on_step", lambda step: (_ for _ in ()).throw(_Kill) if step == 12 else None)
    with pytest.raises(_Kill):
        train_many(runs, outs, progress=False)
    monkeypatch.undo()
    resumed = train(runs[1], outs[1], progress=False)
    assert resumed.resumed_from == 10
    assert_same_run(resumed, train(runs[1], progress=False))


@pytest.mark.slow
def test_a_stack_resumes_a_folder_trained_alone(tmp_path, monkeypatch):
    """The other direction: a folder `train` left after a kill is resumed within a stack of two."""
    run, other = run_config(1, steps=30, eval_every=15, n_checkpoints=4), run_config(5, steps=30, eval_every=15,
                                                                                     n_checkpoints=4)
    monkeypatch.setattr(loop, "_on_step", lambda step: (_ for _ in ()).throw(_Kill) if step == 12 else None)
    with pytest.raises(_Kill):
        train(run, tmp_path / "solo", progress=False)
    with pytest.raises(_Kill):
        train(other, tmp_path / "other", progress=False)
    monkeypatch.undo()
    resumed, _ = train_many([run, other], [tmp_path / "solo", tmp_path / "other"], progress=False)
    assert resumed.resumed_from == 10
    assert_same_run(resumed, train(run, progress=False))


@pytest.mark.slow
def test_diverging_member_is_masked_and_recorded(tmp_path):
    common = dict(optimizer="sgd", steps=40, eval_every=20, n_checkpoints=2)
    configs = [run_config(0, lr=0.05, **common), run_config(1, lr=1e12, **common), run_config(2, lr=0.02, **common)]
    outs = [tmp_path / f"m{k}" for k in range(3)]
    results = train_many(configs, outs, progress=False)
    bad = results[1]
    assert bad.failed is not None and "diverged at step" in bad.failed
    failed_rows = [r for r in bad.metrics if r.get("diverged")]
    assert len(failed_rows) == 1 and failed_rows[0] == bad.metrics[-1]
    assert math.isnan(bad.final.eval_loss) and bad.final.step == failed_rows[0]["step"]
    assert runs.divergence(outs[1])["step"] == bad.final.step  # probe / report / sweeps say "diverged"
    assert all(torch.isfinite(p).all() for p in bad.model.parameters())  # frozen at its last finite weights
    assert runs.load_metrics(outs[1]) == bad.metrics
    assert not (outs[1] / "model.safetensors").exists()  # a diverged run has no final weights
    assert all(s < bad.final.step for s, _ in runs.list_checkpoints(outs[1]))  # only finite checkpoints
    for run, result in zip([configs[0], configs[2]], [results[0], results[2]]):
        assert result.failed is None
        assert_same_run(result, train(run, progress=False))
    again = train_many(configs, outs, progress=False)
    assert again[1].already_done and again[1].failed == bad.failed


# ------------------------------------------------------------------------------------------------- CLI
def test_parse_seeds():
    assert _parse_seeds("0-3") == [0, 1, 2, 3]
    assert _parse_seeds("0,3,5") == [0, 3, 5]
    assert _parse_seeds("1,4-6") == [1, 4, 5, 6]
    for bad in ("", "a", "3-1", "1,1", "-2", "0-"):
        with pytest.raises(ValueError, match="--seeds"):
            _parse_seeds(bad)


@pytest.mark.slow
def test_cli_train_seeds(tmp_path, capsys):
    out = tmp_path / "seeds"
    args = ["train", "--out", str(out), "--steps", "4", "--seq-len", "16", "--batch-size", "2", "--no-progress",
            "--device", "cpu", "--seeds", "0,2"]
    assert main(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("seed 0: trained (4 steps)") and "seed-2" in lines[1]
    assert sorted(p.name for p in out.iterdir()) == ["seed-0", "seed-2"]
    for seed in (0, 2):
        run = RunConfig.from_json((out / f"seed-{seed}" / "config.json").read_text())
        assert run.train.seed == seed
        assert _weights_equal(models.load(out / f"seed-{seed}"), train(run, progress=False).model)
    assert main(args) == 0 and "already trained" in capsys.readouterr().out
    assert main(args[:-2] + ["--seeds", "2-1"]) == 2
    assert "--seeds" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- sweeps
def _sweep_spec(**changes):
    from markov_interp.sweep import SweepSpec

    data = dict(name="stacks", base={"source": {"kind": "binary", "p": 0.5, "q": 0.8},
                                     "model": {"preset": "paper-1layer", "n_ctx": 32},
                                     "train": {"steps": 8, "seq_len": 32, "batch_size": 4, "eval_batches": 1,
                                               "n_checkpoints": 2, "device": "cpu"}},
                grid={"source.p": [0.2, 0.5], "model.n_layers": [1, 2]}, seeds=(0, 1), probe=False)
    data.update(changes)
    return SweepSpec(**data)


def test_group_cells_stacks_compatible_cells_only(tmp_path):
    from markov_interp import sweep

    cells = _sweep_spec().cells()  # 2 p x 2 depths x 2 seeds
    groups = sweep.group_cells(cells, 8, tmp_path)
    assert sorted(len(g) for g in groups) == [4, 4]  # one stack per depth, p and seed vary inside
    for g in groups:
        assert len({c.config.model.n_layers for c in g}) == 1
    assert sorted(len(g) for g in sweep.group_cells(cells, 3, tmp_path)) == [1, 1, 3, 3]
    assert all(len(g) == 1 for g in sweep.group_cells(cells, 1, tmp_path))
    assert sweep.default_group(cells) == 1  # these cells run on the CPU
    with pytest.raises(ValueError, match="group must be None or an integer >= 1"):
        sweep.run(_sweep_spec(), tmp_path, group=0)


def test_group_cells_regroups_cells_by_their_resume_point(tmp_path):
    """Cells whose folders hold a resume point of step 4 stack apart from those at step 0 (a stack resumes from
    one step); a resume point counts as a checkpoint of that step would."""
    from markov_interp import runs, sweep

    cells = [c for c in _sweep_spec().cells() if c.config.model.n_layers == 1]  # one stack of 4
    for c in cells[:2]:
        for path in runs.checkpoint_paths(tmp_path / c.cell_id, 4, resume_point=True):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"")  # only the names are read
    groups = sweep.group_cells(cells, 8, tmp_path)
    assert sorted([c.cell_id for c in g] for g in groups) == sorted([[c.cell_id for c in cells[:2]],
                                                                     [c.cell_id for c in cells[2:]]])


@pytest.mark.slow
def test_sweep_with_stacks_matches_solo_cells_and_restarts(tmp_path, monkeypatch):
    from markov_interp import sweep

    solo = sweep.run(_sweep_spec(), tmp_path / "solo", workers=1, progress=False, group=1)
    stacks = sweep.run(_sweep_spec(), tmp_path / "stacks", workers=2, progress=False, group=4)
    assert solo.n_failed == 0 and stacks.n_failed == 0, stacks.failed
    for a, b in zip(solo.rows, stacks.rows):
        assert a.cell_id == b.cell_id and b.stack_size == 4
        assert b.result.final_eval_loss == a.result.final_eval_loss  # one engine: the same run, bit for bit
        assert _weights_equal(models.load(tmp_path / "solo" / "runs" / a.cell_id),
                              models.load(tmp_path / "stacks" / "runs" / b.cell_id))
    again = sweep.run(_sweep_spec(), tmp_path / "stacks", workers=1, progress=False, group=4)
    assert again.n_run == 0 and again.n_skipped == 8  # per-cell restart: finished cells are skipped

    def broken_stack(cells, runs_dir, *, probes):
        raise RuntimeError("stack lost")

    monkeypatch.setattr("markov_interp.sweep.cells.run_stack", broken_stack)  # a stack that raises is retried as solo cells
    isolated = sweep.run(_sweep_spec(seeds=(2,)), tmp_path / "iso", workers=1, progress=False, group=4)
    assert isolated.n_failed == 0 and all("stack of 2 raised RuntimeError" in r.stack_note for r in isolated.rows)


def test_cli_train_imports_no_transformer_lens(tmp_path):
    """`markov-interp train` needs no hooked model, so it never pays transformer_lens's import time."""
    import subprocess
    import sys

    code = ("import sys; from markov_interp.cli import main; "
            f"code = main(['train', '--out', {str(tmp_path / 'run')!r}, '--steps', '2', '--seq-len', '16', "
            "'--batch-size', '2', '--no-progress', '--device', 'cpu', '--checkpoints', '1']); "
            "assert code == 0; print('transformer_lens' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
    assert models.load(tmp_path / "run").markov_config.d_vocab == 2


@pytest.mark.slow
def test_ray_runs_stacks_like_the_local_pool(tmp_path):
    ray = pytest.importorskip("ray", reason="the Ray backend needs the optional 'ray' package")
    from markov_interp import sweep

    spec = _sweep_spec(seeds=(0,), grid={"source.p": [0.2, 0.5]})
    local = sweep.run(spec, tmp_path / "local", workers=1, progress=False, group=2)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = sweep.run(spec, tmp_path / "ray", backend="ray", progress=False, group=2)
    finally:
        ray.shutdown()
    assert remote.n_failed == 0 and [r.stack_size for r in remote.rows] == [2, 2]
    assert [r.result.final_eval_loss for r in remote.rows] == [r.result.final_eval_loss for r in local.rows]


# ------------------------------------------------------------------------------------------------ CUDA
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_cuda_stacked_forward_and_members_equal_their_runs_alone():
    """The GPU check: the stacked forward against the hooked model on CUDA, and stack members against the same
    runs trained alone (a stack of one) on CUDA."""
    _, solos = _stack_and_solos(dict(n_layers=2), seeds=(0, 1))
    stack = stacked.build_stack([s.markov_config for s in solos], [0, 1], device="cuda")
    tokens = _tokens(2).cuda()
    logits = stacked.stacked_forward(stack, tokens)
    for k, solo in enumerate(solos):
        solo.to("cuda", print_details=False)
        torch.testing.assert_close(logits[k], solo(tokens[k]), rtol=0, atol=1e-5)
    runs = [run_config(0, steps=50, device="cuda"), run_config(1, 0.5, 0.8, steps=50, device="cuda", lr=4e-3)]
    for run, result in zip(runs, train_many(runs, progress=False)):
        assert_same_run(result, train(run, progress=False))


@pytest.mark.slow
def test_truncated_metrics_beside_final_weights_are_repaired_by_the_stack(tmp_path):
    # what a killed second writer left (issue 15): final weights, metrics cut short; the CLI's stacked path
    # resumes from the newest checkpoint the metrics cover and rewrites the rest bit-identically
    run = run_config(0, steps=40, eval_every=10, n_checkpoints=4)
    done = train_many([run], [tmp_path / "a"], progress=False)[0]
    rows = runs.load_metrics(tmp_path / "a")
    runs.write_metrics(tmp_path / "a", [r for r in rows if r["step"] <= 25])
    with pytest.warns(UserWarning, match="incomplete"):
        again = train_many([run], [tmp_path / "a"], progress=False)[0]
    assert not again.already_done and runs.load_metrics(tmp_path / "a") == rows
    assert _weights_equal(again.model, done.model)
