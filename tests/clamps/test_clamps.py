"""Interventions during training (issue 14): parsing and refusals, the fused clamps against the hooked model
under `run_with_hooks`, a hand-built previous-token check, freezes (solo, stacked, ranges), clamped runs that
load / probe / report, bit-identical resume, the CLI flags and sweep grids over interventions."""

import json

import pytest
import torch
from safetensors.torch import save_file

from markov_interp import clamps, models, report, sweep, training
from markov_interp.models import stack as stacked
from markov_interp.cli import main
from markov_interp.sources import SourceConfig
from markov_interp.clamps import Clamp, ClampState, Freeze
from markov_interp.models.hooks import write
from markov_interp.models import preset
from markov_interp.training import RunConfig, TrainConfig, train
from tests.training.test_resume import _killed  # train, stopped after a step

BINARY = SourceConfig(kind="binary", p=0.5, q=0.8)
# large init: every clamp below moves the logits visibly (the test of equality must be able to fail)
CFG = preset("paper-1layer", n_layers=2, n_heads=2, n_ctx=16, init_std=0.5)


def tiny_run(interventions=(), model=None, **train_kwargs) -> RunConfig:
    kwargs = dict(steps=12, batch_size=4, seq_len=16, log_every=2, eval_every=6, eval_batches=1, n_checkpoints=4,
                  device="cpu", interventions=interventions)
    kwargs.update(train_kwargs)
    model = model if model is not None else preset("paper-1layer", n_layers=2, n_ctx=16)
    return RunConfig(source=BINARY, model=model, train=TrainConfig(**kwargs))


def weights(state_or_model) -> dict:
    if isinstance(state_or_model, dict):
        return state_or_model
    return {k: v.clone() for k, v in models.state_dict_for_save(state_or_model).items()}


def _tokens(batch=3, seq=16, seed=1):
    return torch.randint(0, 2, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _fused(model, tokens, hooks=None):
    """The training forward (a stack of one holding `model`'s weights) with clamp hooks built for one model
    (`clamp_hooks` without a member axis)."""
    stack = stacked.Stack.from_states([model.markov_config], [models.state_dict_for_save(model)])
    wrapped = {name: (lambda fn: lambda x: fn(x[0]).unsqueeze(0))(fn) for name, fn in (hooks or {}).items()}
    return stacked.stacked_forward(stack, tokens[None], wrapped)[0]


# ------------------------------------------------------------------------------------------- config
def test_default_config_json_and_cell_ids_are_unchanged():
    """Adding the field changes no earlier config.json nor sweep cell id (ids computed before the change, of runs
    on the random stream they had, "torch-1", which config.json leaves out; defaults now name "counter-1")."""
    old_stream = {"train.stream": "torch-1"}
    run = training.default_run()
    assert "interventions" not in run.to_dict()["train"]
    assert "interventions" not in json.loads(run.to_json())["train"]
    assert sweep.cell_id(training.default_run(**old_stream)) == "972a6b34eaa2671c"
    assert sweep.cell_id(training.default_run(kind="random", steps=50, seed=3, **old_stream)) == "e3f14fa5bc3fcd01"


@pytest.mark.parametrize("text, expected", [
    ("blocks.1.*@0:200", Freeze(freeze="blocks.1.*", start=0, end=200)),
    ("embed.weight", Freeze(freeze="embed.weight")),
    ("blocks.0.attn.hook_pattern=previous_token@:200", Clamp(clamp="blocks.0.attn.hook_pattern",
                                                             value="previous_token", end=200)),
    ("blocks.0.attn.hook_pattern=previous_token:2", Clamp(clamp="blocks.0.attn.hook_pattern",
                                                          value="previous_token", lag=2)),
    ("blocks.0.attn.hook_pattern=mixed:3@:50", Clamp(clamp="blocks.0.attn.hook_pattern", value="mixed", lag=3,
                                                     end=50)),
    ("blocks.0.attn.hook_pattern[0,1]=uniform@5:", Clamp(clamp="blocks.0.attn.hook_pattern", value="uniform",
                                                         heads=(0, 1), start=5)),
    ("blocks.0.hook_attn_out=mean", Clamp(clamp="blocks.0.hook_attn_out", value="mean")),
    ("blocks.0.attn.hook_z[1]=zero", Clamp(clamp="blocks.0.attn.hook_z", value="zero", heads=[1])),
])
def test_string_and_dict_forms_round_trip(text, expected):
    item = clamps.parse_intervention(text)
    assert item == expected
    assert clamps.parse_intervention(clamps.spec_text(item)) == item
    assert clamps.parse_intervention(json.loads(json.dumps(item.to_dict()))) == item
    run = tiny_run([text], model=CFG)
    again = RunConfig.from_json(run.to_json())
    assert again == run and again.train.interventions == (expected,)
    assert json.loads(run.to_json())["train"]["interventions"] == [expected.to_dict()]


@pytest.mark.parametrize("spec, message", [
    ("blocks.1.*@5:3", "empty step range"),
    ("blocks.9.*", "matches no parameter; valid names are ['embed.weight'"),
    ("blocks.0.attn.hook_patern=uniform", "unknown hook name; valid names are ['hook_embed'"),
    ("blocks.0.attn.hook_pattern=mean", "valid values are ['previous_token', 'uniform', 'self', 'mixed']"),
    ("blocks.0.hook_attn_out=uniform", "valid values are ['zero', 'mean']"),
    ("blocks.0.hook_attn_out=no_such_value", "neither one of"),
    ("blocks.0.hook_attn_out[0]=zero", "heads apply only to per-head points"),
    ("blocks.0.attn.hook_z[5]=zero", "heads [5] out of range; valid heads are [0, 1]"),
    ({"clamp": "blocks.0.attn.hook_pattern", "value": "uniform", "lag": 2}, "lag applies only to previous_token"),
    ({"clamp": "blocks.0.hook_attn_out", "value": "zero", "scale": 2}, "unknown Clamp keys ['scale']"),
    ({"freeze": "embed.weight", "clamp": "hook_embed"}, "exactly one of the keys"),
    ("x[=y", "must be HOOK[HEADS]=VALUE"),
])
def test_bad_interventions_are_refused(spec, message):
    with pytest.raises(ValueError) as err:
        tiny_run([spec], model=CFG)
    assert message in str(err.value)


def test_unembed_weight_is_a_name_only_when_untied():
    with pytest.raises(ValueError, match="matches no parameter"):
        tiny_run(["unembed.weight"], model=CFG)
    untied = CFG.replace(tie_weights=False)
    assert tiny_run(["unembed.weight"], model=untied).train.interventions == (Freeze(freeze="unembed.weight"),)


@pytest.mark.parametrize("cfg", [CFG, preset("attn-only-2layer", n_ctx=16), CFG.replace(
    tie_weights=False, attn_bias=True, mlp_bias=True, layernorm_bias=True, unembed_bias=False),
    CFG.replace(normalization="LNPre", positional="rotary")])
def test_parameter_names_are_the_saved_names(cfg):
    assert clamps.parameter_names(cfg) == list(models.state_dict_for_save(models.build(cfg, seed=0)))


def _pattern_file(tmp_path, value, name="p.safetensors", **extra):
    path = tmp_path / name
    save_file({"pattern": value.contiguous(), **extra}, str(path))
    return str(path)


def test_pattern_files_are_checked(tmp_path):
    uniform = clamps.pattern_value("uniform", 16)
    with pytest.raises(ValueError, match="not causal"):
        Clamp(clamp="blocks.0.attn.hook_pattern", value=_pattern_file(tmp_path, torch.full((16, 16), 1 / 16)))
    with pytest.raises(ValueError, match="sum to 1"):
        Clamp(clamp="blocks.0.attn.hook_pattern", value=_pattern_file(tmp_path, 2 * uniform))
    with pytest.raises(ValueError, match="exactly one tensor"):
        Clamp(clamp="blocks.0.attn.hook_pattern", value=_pattern_file(tmp_path, uniform, other=uniform.clone()))
    three = tiny_run([{"clamp": "blocks.0.attn.hook_pattern",  # a config without the file check ...
                       "value": _pattern_file(tmp_path, torch.stack([uniform] * 3), "three.safetensors")}], model=CFG)
    with pytest.raises(ValueError, match=r"expected \[q, k\] or \[2, q, k\]"):  # ... is checked with the model
        clamps.check_interventions(three.train.interventions, CFG)
    path = _pattern_file(tmp_path, uniform, "good.safetensors")
    run = tiny_run([f"blocks.0.attn.hook_pattern={path}"], model=CFG)
    entry = run.train.interventions[0]
    assert len(entry.sha256) == 64 and json.loads(run.to_json())["train"]["interventions"][0]["sha256"] == entry.sha256
    _pattern_file(tmp_path, clamps.pattern_value("self", 16), "good.safetensors")  # the file changes
    again = RunConfig.from_json(run.to_json())  # a config is still readable (reports need no file) ...
    with pytest.raises(ValueError, match="changed since the run was configured"):
        train(again, progress=False)  # ... but training refuses it before any step


# -------------------------------------------------------------------------------- fused equals hooked
def _clamp_specs(tmp_path) -> dict:
    heads_pattern = torch.stack([clamps.pattern_value("uniform", 16), clamps.pattern_value("self", 16)])
    value = torch.randn(20, CFG.d_model, generator=torch.Generator().manual_seed(0))
    save_file({"v": value}, str(tmp_path / "attn_out.safetensors"))
    return {
        "previous_token": "blocks.0.attn.hook_pattern=previous_token",
        "previous_token lag 2": "blocks.0.attn.hook_pattern=previous_token:2",
        "mixed": "blocks.0.attn.hook_pattern=mixed",
        "mixed lag 2, one head": "blocks.1.attn.hook_pattern[0]=mixed:2",
        "uniform": "blocks.1.attn.hook_pattern=uniform",
        "self": "blocks.0.attn.hook_pattern=self",
        "file pattern": f"blocks.0.attn.hook_pattern={_pattern_file(tmp_path, heads_pattern)}",
        "per-head pattern": "blocks.1.attn.hook_pattern[1]=previous_token",
        "zero z of one head": "blocks.0.attn.hook_z[1]=zero",
        "zero attn_out": "blocks.0.hook_attn_out=zero",
        "mean attn_out": "blocks.0.hook_attn_out=mean",
        "file attn_out": f"blocks.0.hook_attn_out={tmp_path / 'attn_out.safetensors'}",
        "mean resid_mid": "blocks.1.hook_resid_mid=mean",
        "zero resid_mid": "blocks.0.hook_resid_mid=zero",
        "mean resid_post": "blocks.0.hook_resid_post=mean",
        "zero mlp_out": "blocks.1.hook_mlp_out=zero",
        "mean mlp_out": "blocks.0.hook_mlp_out=mean",
        "mean v of one head": "blocks.0.attn.hook_v[0]=mean",
    }


def test_fused_clamps_equal_the_hooked_model(tmp_path):
    """Every kind of clamp: the fused forward (a model alone and each stack member) equals `run_with_hooks` with
    the same clamp."""
    seeds = (0, 3)
    solos = [models.build(CFG, seed=s) for s in seeds]
    stack = stacked.build_stack([CFG, CFG], list(seeds))
    tokens = torch.stack([_tokens(seed=1), _tokens(seed=2)])
    for kind, spec in _clamp_specs(tmp_path).items():
        items = clamps.parse_interventions([spec])
        clamps.check_interventions(items, CFG)
        stack_state = ClampState()
        with torch.no_grad():
            stacked_logits = stacked.stacked_forward(stack, tokens, clamps.clamp_hooks(
                items, 0, state=stack_state, update=True, member_axis=True))
            for k, model in enumerate(solos):
                state = ClampState()  # a running mean starts at the first batch's mean: solo and stack agree
                fused = _fused(model, tokens[k], clamps.clamp_hooks(items, 0, state=state, update=True))
                hooked = model.run_with_hooks(tokens[k], fwd_hooks=clamps.tl_hooks(items, CFG, 0, state=state))
                torch.testing.assert_close(fused, hooked, rtol=0, atol=1e-5, msg=kind)
                torch.testing.assert_close(stacked_logits[k], hooked, rtol=0, atol=1e-5, msg=kind)
                assert (fused - _fused(model, tokens[k])).abs().max() > 1e-4, kind  # the clamp acts
                assert stack_state.member_state_dict(k).keys() == state.state_dict().keys()


def test_clamps_follow_their_step_range_and_means_move_only_in_training():
    items = clamps.parse_interventions(["blocks.0.hook_attn_out=mean@3:5", "blocks.1.*@:4"])
    state = ClampState()
    assert clamps.clamp_hooks(items, 2, state=state, update=True) == {}
    assert set(clamps.clamp_hooks(items, 3, state=state, update=True)) == {"blocks.0.hook_attn_out"}
    assert clamps.clamp_hooks(items, 5, state=state, update=True) == {}
    assert clamps.frozen_names(items, CFG, 3) == {n for n in clamps.parameter_names(CFG)
                                                      if n.startswith("blocks.1.")}
    assert clamps.frozen_names(items, CFG, 4) == set()
    model = models.build(CFG, seed=0)
    first, second = _tokens(seed=1), _tokens(seed=2)
    seen = {}
    record = {"blocks.0.hook_attn_out": lambda x: seen.setdefault("raw", []).append(x) or x}
    with torch.no_grad():
        for tokens in (first, second):
            _fused(model, tokens, record)
        _fused(model, first, clamps.clamp_hooks(items, 3, state=state, update=True))
        key = "mean.0.blocks.0.hook_attn_out"
        torch.testing.assert_close(state.means[key], seen["raw"][0].mean(0))  # initialised to the first batch
        _fused(model, second, clamps.clamp_hooks(items, 3, state=state, update=False))
        torch.testing.assert_close(state.means[key], seen["raw"][0].mean(0))  # evaluations do not move it
        _fused(model, second, clamps.clamp_hooks(items, 4, state=state, update=True))
    expected = 0.9 * seen["raw"][0].mean(0) + 0.1 * seen["raw"][1].mean(0)  # BatchNorm's momentum 0.1
    torch.testing.assert_close(state.means[key], expected)


def _clamped_z_and_v(value: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer 0's z in the fused forward with its pattern clamped to `value`, and its v from the unclamped hooked
    model ([batch, pos, head, d_head]: layer 0's v does not depend on its pattern)."""
    model = models.build(CFG, seed=0)
    tokens = _tokens()
    items = clamps.parse_interventions([f"blocks.0.attn.hook_pattern={value}"])
    seen = {}
    hooks = dict(clamps.clamp_hooks(items, 0, state=ClampState(), update=True))
    hooks["blocks.0.attn.hook_z"] = lambda z: seen.setdefault("z", z)
    with torch.no_grad():
        _fused(model, tokens, hooks)
        _, cache = model.run_with_cache(tokens)
    return seen["z"], cache["blocks.0.attn.hook_v"]


@pytest.mark.parametrize("lag", [1, 2])
def test_previous_token_clamp_copies_v_from_lag_back(lag):
    """Hand-built check: layer 0 clamped to previous_token makes z at q equal v at q - lag (position 0 for the
    first lag queries), with v read from the unclamped hooked model."""
    z, v = _clamped_z_and_v(f"previous_token:{lag}")
    source = torch.clamp(torch.arange(v.shape[1]) - lag, min=0)
    torch.testing.assert_close(z, v[:, source], rtol=0, atol=1e-6)
    assert clamps.pattern_value("previous_token", 4, lag=2).tolist() == [
        [1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0]]
    assert clamps.pattern_value("uniform", 3)[2].tolist() == pytest.approx([1 / 3] * 3)


@pytest.mark.parametrize("lag", [1, 2])
def test_mixed_clamp_is_half_previous_token_half_uniform(lag):
    """Hand-built check: under `mixed` z at q is (v[q - lag] + mean of v[0..q]) / 2."""
    z, v = _clamped_z_and_v(f"mixed:{lag}")
    seq = v.shape[1]
    source = torch.clamp(torch.arange(seq) - lag, min=0)
    running = v.cumsum(1) / torch.arange(1, seq + 1)[None, :, None, None]
    torch.testing.assert_close(z, (v[:, source] + running) / 2, rtol=0, atol=1e-6)
    value = clamps.pattern_value("mixed", 5, lag=lag)
    assert torch.allclose(value.sum(-1), torch.ones(5)) and torch.equal(value, value.tril())


# ------------------------------------------------------------------------------------------- training
FREEZE = ["blocks.0.attn.*", "embed.weight@:6"]


def _frozen_checks(final: dict, init: dict, at6: dict) -> None:
    for name in init:
        if name.startswith("blocks.0.attn."):
            assert torch.equal(final[name], init[name]), name
        elif name == "embed.weight":  # tied: the unembedding too; frozen for updates 0..5 only
            assert torch.equal(at6[name], init[name]) and not torch.equal(final[name], init[name])
        else:
            assert not torch.equal(final[name], init[name]), name


@pytest.mark.slow
def test_frozen_parameters_stay_at_init_solo_and_stacked(tmp_path):
    run = tiny_run(FREEZE, n_checkpoints=12, eval_every=0)  # log-spaced checkpoints, step 6 among them
    solo = train(run, tmp_path / "solo", progress=False)
    init = weights(models.build(run.model, seed=0))
    _, at6 = models.read_weights(tmp_path / "solo" / "checkpoints" / "step_0000006.safetensors")
    _frozen_checks(weights(solo.model), init, at6)
    runs = [run, run.replace(train=run.train.replace(seed=4))]
    members = training.train_many(runs, [tmp_path / "m0", tmp_path / "m4"], progress=False)
    for k, (member, seed) in enumerate(zip(members, (0, 4))):
        _, at6 = models.read_weights(tmp_path / f"m{seed}" / "checkpoints" / "step_0000006.safetensors")
        _frozen_checks(weights(member.model), weights(models.build(run.model, seed=seed)), at6)
    for name, value in weights(members[0].model).items():  # the stacked member is its run alone, bit for bit
        assert torch.equal(value, weights(solo.model)[name]), name
    # a frozen-from-the-start parameter has no optimiser state in a checkpoint (as in a torch optimiser's)
    state = torch.load(tmp_path / "m0" / "checkpoints" / "step_0000012.pt", weights_only=True)
    solo_state = torch.load(tmp_path / "solo" / "checkpoints" / "step_0000012.pt", weights_only=True)
    assert state["optimizer"]["state"].keys() == solo_state["optimizer"]["state"].keys()
    for index, entry in solo_state["optimizer"]["state"].items():
        assert float(entry["step"]) == float(state["optimizer"]["state"][index]["step"])


@pytest.mark.slow
def test_clamped_run_differs_records_loads_probes_and_reports(tmp_path):
    from markov_interp import probes

    clamp = "blocks.0.attn.hook_pattern=previous_token@:8"
    clamped = train(tiny_run([clamp], n_checkpoints=2), tmp_path / "run", progress=False)
    free = train(tiny_run(n_checkpoints=2), progress=False)
    assert clamped.metrics != free.metrics
    assert any(not torch.equal(a, b) for a, b in zip(weights(clamped.model).values(), weights(free.model).values()))
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["train"]["interventions"] == [clamps.parse_clamp(clamp).to_dict()]
    model = models.load(tmp_path / "run")  # plain weights
    source = clamped.config.source.build()
    batch = probes.sample_batch(source, n_sequences=8, seq_len=16, seed=0)
    assert probes.classify_mechanism(model, source, batch=batch).mechanism in probes.MECHANISMS
    rep = report.build(tmp_path / "run", n_sequences=8, max_checkpoints=2)
    assert clamps.spec_text(clamps.parse_clamp(clamp)) in rep.section("config").body()


RESUME = ["blocks.0.hook_attn_out=mean", "blocks.1.attn.*@3:9"]  # checkpoints at 1, 2, 5, 12 (of 12)


@pytest.mark.slow
def test_solo_resume_with_interventions_is_bit_identical(tmp_path, monkeypatch):
    reference = train(tiny_run(RESUME), tmp_path / "a", progress=False)
    _killed(monkeypatch, [tiny_run(RESUME)], [tmp_path / "b"], at=9)  # after the 9th update
    assert "clamp_state" in torch.load(tmp_path / "b" / "checkpoints" / "step_0000005.pt", weights_only=True)
    resumed = train(tiny_run(RESUME), tmp_path / "b", progress=False)
    assert resumed.resumed_from == 5  # inside the freeze range, with a running mean to restore
    assert resumed.metrics == reference.metrics
    for name, value in weights(reference.model).items():
        assert torch.equal(weights(resumed.model)[name], value), name


@pytest.mark.slow
def test_stacked_resume_with_interventions_is_bit_identical(tmp_path, monkeypatch):
    runs = [tiny_run(RESUME, seed=s) for s in (0, 2)]
    reference = training.train_many(runs, [tmp_path / "a0", tmp_path / "a2"], progress=False)
    _killed(monkeypatch, runs, [tmp_path / "b0", tmp_path / "b2"], at=8)
    resumed = training.train_many(runs, [tmp_path / "b0", tmp_path / "b2"], progress=False)
    for ref, res in zip(reference, resumed):
        assert res.resumed_from == 5 and res.metrics == ref.metrics
        for name, value in weights(ref.model).items():
            assert torch.equal(weights(res.model)[name], value), name


def test_resume_point_with_interventions_is_bit_identical(tmp_path, monkeypatch):
    """No checkpoints, a resume point every 3 steps (at the rows of 4 and 8): killed at 9, the run resumes from the
    resume point of step 8, inside the freeze range and with the running mean it holds."""
    run = tiny_run(RESUME, n_checkpoints=0, resume_every=3)
    reference = train(run, tmp_path / "a", progress=False)
    _killed(monkeypatch, [run], [tmp_path / "b"], at=9)
    assert "clamp_state" in torch.load(tmp_path / "b" / "resume" / "step_0000008.pt", weights_only=True)
    resumed = train(run, tmp_path / "b", progress=False)
    assert resumed.resumed_from == 8 and resumed.metrics == reference.metrics
    for name, value in weights(reference.model).items():
        assert torch.equal(weights(resumed.model)[name], value), name


def test_members_with_other_interventions_do_not_share_a_stack():
    a, b = tiny_run(["blocks.1.*"]), tiny_run()
    assert training.stack_key(a) != training.stack_key(b)
    with pytest.raises(ValueError, match="train.interventions differs"):
        training.check_compatible([a, b])


# ------------------------------------------------------------------------------------------ CLI, sweeps
@pytest.mark.slow
def test_cli_flags_land_in_config_json(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--out", str(out), "--steps", "4", "--seq-len", "16", "--batch-size", "4",
                 "--set", "model.n_ctx=16", "--set", "train.n_checkpoints=0", "--no-progress",
                 "--freeze", "blocks.0.mlp.*@:2", "--clamp", "blocks.0.attn.hook_pattern=uniform@1:",
                 "--clamp", "blocks.0.hook_attn_out=mean"])
    assert code == 0, capsys.readouterr().err
    saved = json.loads((out / "config.json").read_text())["train"]["interventions"]
    assert [clamps.spec_text(clamps.parse_intervention(s)) for s in saved] == [
        "blocks.0.mlp.*@:2", "blocks.0.attn.hook_pattern=uniform@1:", "blocks.0.hook_attn_out=mean"]
    code = main(["train", "--out", str(tmp_path / "bad"), "--clamp", "blocks.0.attn.hook_pattern=zero"])
    err = capsys.readouterr().err
    assert code != 0 and "valid values are ['previous_token', 'uniform', 'self', 'mixed']" in err
    assert len(err.strip().splitlines()) == 1


def test_sweep_grid_over_interventions():
    spec = sweep.SweepSpec(name="iv", base={"source": {"kind": "binary", "p": 0.5, "q": 0.8},
                                            "model": {"preset": "paper-1layer", "n_ctx": 16},
                                            "train": {"steps": 4, "seq_len": 16}},
                           grid={"train.interventions": [[], ["blocks.0.attn.*"],
                                                         [{"clamp": "blocks.0.attn.hook_pattern",
                                                           "value": "uniform", "end": 2}]]},
                           seeds=[0, 1], probe=False)
    cells = spec.cells()
    assert len({c.cell_id for c in cells}) == len(cells) == 6
    recorded = {json.dumps(c.config.to_dict()["train"].get("interventions")) for c in cells}
    assert len(recorded) == 3
    assert len({training.stack_key(c.config) for c in cells}) == 3  # stacks group by intervention


@pytest.mark.slow
def test_sweep_over_interventions_writes_them_into_run_folders(tmp_path):
    grid = [[], ["blocks.0.attn.*"], ["blocks.0.attn.hook_pattern=uniform@:2"]]
    spec = sweep.SweepSpec(name="iv", base={"source": {"kind": "binary", "p": 0.5, "q": 0.8},
                                            "model": {"preset": "paper-1layer", "n_ctx": 16},
                                            "train": {"steps": 4, "seq_len": 16, "batch_size": 4, "eval_every": 0,
                                                      "n_checkpoints": 0}},
                           grid={"train.interventions": grid}, seeds=[0, 1], probe=False)
    result = sweep.run(spec, tmp_path, workers=1, progress=False)
    assert [row.status for row in result.rows] == ["ok"] * 6
    for row in result.rows:
        saved = json.loads((tmp_path / "runs" / row.cell_id / "config.json").read_text())["train"]
        expected = [clamps.parse_intervention(s).to_dict() for s in row.params["train.interventions"]]
        assert saved.get("interventions", []) == expected


def test_a_file_shorter_than_the_sequence_is_refused(tmp_path):
    path = _pattern_file(tmp_path, clamps.pattern_value("uniform", 8))
    items = clamps.parse_interventions([f"blocks.0.attn.hook_pattern={path}"])
    hooks = clamps.clamp_hooks(items, 0, state=ClampState(), update=True)
    with pytest.raises(ValueError, match="covers 8 positions, the sequence has 16"):
        _fused(models.build(CFG, seed=0), _tokens(), hooks)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [dict(optimizer="sgd", momentum=0.9, lr=0.05, grad_clip=0.5),
                                    dict(grad_clip=0.1, weight_decay=0.1)])
def test_stacked_member_with_interventions_equals_its_run_alone(recipe):
    """Freeze ranges and clamps with SGD momentum / AdamW decay and clipping (frozen parameters out of the norm):
    a stack member is its run alone, bit for bit."""
    run = tiny_run(["blocks.1.*@2:6", "blocks.0.attn.hook_pattern=previous_token@:4", "blocks.0.hook_mlp_out=mean"],
                   steps=10, eval_every=5, n_checkpoints=0, **recipe)
    solo = train(run, progress=False)
    member = training.train_many([run, run.replace(train=run.train.replace(seed=9))], progress=False)[0]
    assert member.metrics == solo.metrics
    for name, value in weights(solo.model).items():
        assert torch.equal(weights(member.model)[name], value), name


def test_applied_probes_the_model_under_its_clamps_and_only_inside():
    cfg = preset("attn-only-2layer", n_ctx=16)
    model = models.build(cfg, seed=0)
    tokens = torch.randint(0, 2, (4, 12), generator=torch.Generator().manual_seed(0))
    items = clamps.parse_interventions(["blocks.0.attn.hook_pattern=previous_token@:10", "blocks.1.*@:5"])
    fused = _fused(model, tokens, clamps.clamp_hooks(items, 3, state=ClampState(), update=False))
    with clamps.applied(model, items, 3):
        logits, cache = model.run_with_cache(tokens)
    torch.testing.assert_close(logits, fused, atol=1e-5, rtol=0)
    expected = clamps.pattern_value("previous_token", 12).expand(4, 1, 12, 12)
    torch.testing.assert_close(cache["pattern", 0], expected)
    bare_logits, bare_cache = model.run_with_cache(tokens)  # the hooks are gone after the block
    assert not torch.allclose(bare_cache["pattern", 0], expected)
    assert not torch.allclose(bare_logits, logits)
    with clamps.applied(model, items, 10):  # released at t = 10: the bare model
        torch.testing.assert_close(model(tokens), bare_logits)
    with pytest.raises(ValueError, match="valid"):
        with clamps.applied(model, ["blocks.0.attn.hook_patern=uniform"], 0):
            pass


# ---------------------------------------------------------------------------------------- heads per layer
HEADS = preset("paper-2layer", n_heads=(1, 2), n_ctx=16, init_std=0.5)  # layer 0: one head, layer 1: two


@pytest.mark.parametrize("spec", [
    "blocks.1.attn.hook_z[1]=zero",
    "blocks.1.attn.hook_pattern[1]=previous_token",
    "blocks.1.attn.hook_v[0]=mean",
    "blocks.0.attn.hook_z=mean",  # the one-head layer: the hooked model's surplus head is left alone
    "blocks.0.attn.hook_pattern=uniform",
])
def test_clamps_on_a_model_with_heads_per_layer_index_real_heads(spec):
    """Clamps name a layer's real heads: the fused forward (a stack of two) equals the hooked model (built with
    two heads in layer 0, the second one zero) under the same clamp."""
    items = clamps.parse_interventions([spec])
    clamps.check_interventions(items, HEADS)
    seeds = (0, 3)
    stack = stacked.build_stack([HEADS, HEADS], list(seeds))
    tokens = torch.stack([_tokens(seed=1), _tokens(seed=2)])
    with torch.no_grad():
        clamped = stacked.stacked_forward(stack, tokens, clamps.clamp_hooks(items, 0, state=ClampState(),
                                                                               update=True, member_axis=True))
        plain = stacked.stacked_forward(stack, tokens)
        for k, seed in enumerate(seeds):
            model = models.build(HEADS, seed=seed)
            hooked = model.run_with_hooks(tokens[k], fwd_hooks=clamps.tl_hooks(items, HEADS, 0, state=ClampState(),
                                                                                  update=True))
            torch.testing.assert_close(clamped[k], hooked, rtol=0, atol=1e-5)
            assert (clamped[k] - plain[k]).abs().max() > 1e-4  # the clamp acts


def test_heads_of_a_clamp_are_checked_against_their_layer(tmp_path):
    with pytest.raises(ValueError, match=r"heads \[1\] out of range; valid heads are \[0\] \(its layer has 1\)"):
        clamps.check_interventions(clamps.parse_interventions(["blocks.0.attn.hook_z[1]=zero"]), HEADS)
    path = _pattern_file(tmp_path, clamps.pattern_value("uniform", 16).expand(2, 16, 16).contiguous())
    with pytest.raises(ValueError, match=r"expected \[q, k\] or \[1, q, k\]"):
        clamps.check_interventions(clamps.parse_interventions([f"blocks.0.attn.hook_pattern={path}"]), HEADS)
    clamps.check_interventions(clamps.parse_interventions([f"blocks.1.attn.hook_pattern={path}"]), HEADS)
    assert "blocks.0.attn.q.weight" in clamps.parameter_names(HEADS)


@pytest.mark.slow
def test_a_run_with_heads_per_layer_trains_with_layer_one_clamps_and_resumes(tmp_path, monkeypatch):
    run = tiny_run(["blocks.1.attn.hook_pattern[1]=previous_token@:6", "blocks.1.attn.hook_z[0]=mean"],
                   model=preset("paper-2layer", n_heads=(1, 2), n_ctx=16))
    reference = train(run, tmp_path / "a", progress=False)
    _killed(monkeypatch, [run], [tmp_path / "b"], at=7)
    resumed = train(run, tmp_path / "b", progress=False)
    assert resumed.resumed_from == 5 and resumed.metrics == reference.metrics
    for name, value in weights(reference.model).items():
        assert torch.equal(weights(resumed.model)[name], value), name
    loaded = models.load(tmp_path / "b")
    assert models.heads_per_layer(loaded) == (1, 2)
    with clamps.applied(loaded, run.train.interventions, 0):  # probing under the clamps works too
        loaded(_tokens())


# -------------------------------------------------------------------------------------------- one writer
def _set_by_hand(act, value, *, head_axis=None, heads=None, pos_axis, positions=None):
    """The TransformerLens setter way: a clone, then index assignment of the selected slice (an independent
    definition of what `write` writes)."""
    out, value = act.clone(), value.to(act.dtype).expand_as(act)
    index = [slice(None)] * act.ndim
    if heads is not None:
        index[act.ndim - head_axis] = list(heads)
    if positions is not None:
        sel = torch.zeros(act.shape[-pos_axis], dtype=torch.bool)
        sel[list(positions)] = True
        keep = out.clone()
        out[tuple(index)] = value[tuple(index)]
        shape = [1] * act.ndim
        shape[act.ndim - pos_axis] = -1
        return torch.where(sel.view(shape), out, keep)
    out[tuple(index)] = value[tuple(index)]
    return out


@pytest.mark.parametrize("kind, shape, head_axis, pos_axis", [
    ("z", (3, 5, 4, 2), 2, 3), ("q", (2, 3, 5, 4, 2), 2, 3),  # [(member,) batch, pos, head, d_head]
    ("pattern", (3, 4, 5, 5), 3, 2), ("resid_pre", (2, 3, 5, 6), None, 2), ("embed", (3, 5, 6), None, 2)])
def test_write_writes_its_heads_and_positions_only(kind, shape, head_axis, pos_axis):
    gen = torch.Generator().manual_seed(0)
    act = torch.randn(shape, generator=gen, requires_grad=True)
    value = torch.randn(shape[-pos_axis:], generator=gen)  # per position (a mean), broadcast over leading axes
    heads = [0, 2] if head_axis else None
    for positions in (None, [1, 4]):
        out = write(act, value, kind, heads=heads, positions=positions)
        assert torch.equal(out, _set_by_hand(act.detach(), value, head_axis=head_axis, heads=heads, pos_axis=pos_axis,
                                              positions=positions))
        if heads is None and positions is None:
            continue
        out.sum().backward()  # gradients reach what was not written, nothing else
        written = _set_by_hand(torch.zeros(shape), torch.ones(()), head_axis=head_axis, heads=heads,
                               pos_axis=pos_axis, positions=positions)
        assert torch.equal(act.grad, 1 - written) and 0 < written.sum() < written.numel()
        act.grad = None
    whole = write(act, value, kind)
    assert torch.equal(whole, value.expand(shape)) and whole.data_ptr() == value.data_ptr()  # a view, no copy
    longer = torch.cat([value, value], dim=value.ndim - pos_axis)  # cut to the run's positions
    assert torch.equal(write(act, longer, kind), whole)


def test_write_refuses_what_it_cannot_select():
    with pytest.raises(ValueError, match="'resid_pre' activation has no head axis"):
        write(torch.zeros(2, 3, 4), torch.zeros(()), "resid_pre", heads=[0])
    with pytest.raises(ValueError, match=r"heads \[2\] out of range: the activation has 2"):
        write(torch.zeros(2, 3, 2, 4), torch.zeros(()), "z", heads=[2])


def test_clamps_and_probe_interventions_write_through_the_one_writer(monkeypatch):
    """A clamp and a probe's `set_component` on the same slice give the same activation, and both go through
    `models.hooks.write` (counted by wrapping it)."""
    from markov_interp.models import hooks
    from markov_interp.probes import interventions as probe_interventions
    from markov_interp.probes.interventions import Component

    calls = []

    def counting(*args, **kwargs):
        calls.append(args[2])
        return hooks.write(*args, **kwargs)

    monkeypatch.setattr(clamps, "write", counting)
    monkeypatch.setattr(probe_interventions, "write", counting)
    z = torch.randn(4, 6, 2, 3, generator=torch.Generator().manual_seed(1))
    items = clamps.parse_interventions(["blocks.1.attn.hook_z[1]=zero"])
    clamped = clamps.clamp_hooks(items, 0, state=ClampState(), update=True)["blocks.1.attn.hook_z"](z)
    probed = probe_interventions.set_component(z, Component(kind="head", layer=1, head=1), torch.zeros(()))
    assert torch.equal(clamped, probed) and (clamped[:, :, 1] == 0).all() and torch.equal(clamped[:, :, 0], z[:, :, 0])
    assert calls == ["z", "z"]


def test_experiments_name_hooks_through_act_name():
    """No hook name typed out in the experiments: they come from `models.hooks.act_name` (freeze globs name
    parameters, not hooks)."""
    import pathlib
    import re

    import markov_interp

    folder = pathlib.Path(markov_interp.__file__).parent / "experiments"
    typed = [(path.name, match) for path in folder.glob("*.py")
             for match in re.findall(r"[\"']blocks\.\d+\.(?:attn\.)?hook_\w+", path.read_text())]
    assert typed == []
