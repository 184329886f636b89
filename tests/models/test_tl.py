"""The hooked model on every TransformerLens version (`models.hooked`, its conversions in `models._tl`): one hooked
model from the on-disk weights on TL 2.x, 3.x (HookedTransformer) and 4.x (TransformerBridge), its inverse, the
converter for TL's unmodified models, heads per layer, and docs/transformerlens.md's "probe your own
TransformerLens model" (executed).

Every test here runs on whatever TransformerLens is installed; CI runs this file (the `tlcompat` tier,
tests/conftest.py) under TL 2.18, 3.2 and 4.x (.ci/tlcompat)."""

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from markov_interp import models
from markov_interp.models import ModelConfig, preset
from markov_interp.models.stack import Stack, stacked_forward

ROOT = Path(__file__).resolve().parents[2]
KIND = models.hooked_kind()


def tokens(vocab=2, batch=3, seq=24, seed=0):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def moved(cfg, seed=3, scale=0.3):
    """An on-disk state away from init, so every tensor matters (biases, LN scales, output bias)."""
    gen = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=gen) for k, v in models.initial_state(cfg, seed).items()}


def fused(cfg, state, toks, interventions=None):
    """The logits of the one fused forward (`models.stack`, a stack of one) for `state`."""
    return stacked_forward(Stack.from_states([cfg], [state]), toks[None], interventions)[0]


def tl_model(cfg):
    """TransformerLens's own, unmodified model for `cfg` on the installed version."""
    if KIND == "HookedTransformer":
        from transformer_lens import HookedTransformer

        return HookedTransformer(models.tl_config(cfg))
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_native(models.tl_config(cfg))


CONFIGS = {
    "paper-1layer": preset("paper-1layer", n_ctx=32),
    "paper-2layer-rotary-2heads": preset("paper-2layer", n_ctx=32, positional="rotary", n_heads=2),
    "rotary-heads-per-layer-biases": preset("paper-2layer", n_ctx=32, positional="rotary", n_heads=(2, 1),
                                            attn_bias=True, mlp_bias=True, d_model=8, d_head=4),
    "attn-only-biases-lnpre": preset("attn-only-2layer", n_ctx=32, normalization="LNPre", attn_bias=True,
                                     unembed_bias=False, d_vocab=3),
    "untied-ln-bias-gelu-new": preset("paper-1layer", n_ctx=32, tie_weights=False, layernorm_bias=True,
                                      mlp_bias=True, act_fn="gelu_new"),
    "no-norm-relu": preset("paper-2layer", n_ctx=32, normalization=None, act_fn="relu"),
}


# ------------------------------------------------------------------------------------------------- kind
def test_the_installed_version_decides_the_kind():
    model = models.hooked_model(CONFIGS["paper-1layer"], moved(CONFIGS["paper-1layer"]))
    assert type(model).__name__ == KIND
    assert KIND == ("TransformerBridge" if models.tl_version()[0] >= 4 else "HookedTransformer")
    assert model.markov_config == CONFIGS["paper-1layer"] and not model.training



@pytest.mark.parametrize("maker", ["hooked_model", "tl_own_model"])
def test_both_kinds_satisfy_the_hooked_model_protocol(maker):
    """`models.HookedModel` is what the probes use of a model: the package's model and TransformerLens's own
    unmodified model of the installed kind (a `TransformerBridge` on TL 4, a `HookedTransformer` on TL 2 / 3)
    both satisfy it, with every member the protocol names present and its config's `HookedConfig` fields
    integers; a torch module with TL's config but no hooks does not."""
    cfg = CONFIGS["rotary-heads-per-layer-biases"]
    model = models.hooked_model(cfg, moved(cfg)) if maker == "hooked_model" else tl_model(cfg)
    assert type(model).__name__ == KIND
    assert isinstance(model, models.HookedModel)
    members = models.protocol_members(models.HookedModel)
    assert {"cfg", "hook_dict", "run_with_cache", "run_with_hooks", "hooks", "W_E", "W_O", "parameters"} <= members
    assert all(hasattr(model, name) for name in members), sorted(n for n in members if not hasattr(model, n))
    fields = set(models.HookedConfig.__annotations__)
    assert {"n_layers", "n_heads", "d_vocab", "n_ctx"} <= fields
    assert all(isinstance(getattr(model.cfg, f), int) for f in fields), {f: getattr(model.cfg, f) for f in fields}
    assert (model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_vocab) == (cfg.n_layers, max(cfg.heads_per_layer),
                                                                           cfg.d_vocab)
    assert model.W_O.shape == (cfg.n_layers, max(cfg.heads_per_layer), cfg.d_head, cfg.d_model)

    plain = torch.nn.Linear(2, 2)
    plain.cfg = model.cfg  # TL's config alone does not make a hooked model
    assert not isinstance(plain, models.HookedModel)


def test_the_protocol_check_sees_instance_members_and_misses_one_absent():
    """`isinstance` looks members up without running them (TL's weight views are properties that compute):
    members held by the instance count, and any one missing fails the check."""
    members = sorted(models.protocol_members(models.HookedModel))
    assert isinstance(SimpleNamespace(**{name: None for name in members}), models.HookedModel)
    for gone in members:
        held = SimpleNamespace(**{name: None for name in members if name != gone})
        assert not isinstance(held, models.HookedModel), gone


def _tl_imports(tree: ast.AST) -> list[tuple[str, list[str]]]:
    """(module, imported names) of every transformer_lens import in `tree`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("transformer_lens"):
            found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("transformer_lens")]
    return found


def test_the_package_uses_no_private_transformer_lens_api():
    """Only public TransformerLens names anywhere in the package: no `transformer_lens...._module` import, no
    `_private` name; the modules that handle TL's objects (models/_tl.py, models/hooked.py) read no `_private`
    attribute."""
    found = []
    for path in sorted((ROOT / "markov_interp").rglob("*.py")):
        for module, names in _tl_imports(ast.parse(path.read_text())):
            found.append(module)
            assert not any(part.startswith("_") for part in module.split(".")), (path.name, module)
            assert not any(name.startswith("_") for name in names), (path.name, module, names)
    assert "transformer_lens.model_bridge" in found and "transformer_lens" in found
    for name in ("_tl.py", "hooked.py"):
        tree = ast.parse((ROOT / "markov_interp" / "models" / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                pytest.fail(f"private attribute {node.attr} at {name}:{node.lineno}")


# ----------------------------------------------------------------------------------------------- logits
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_hooked_model_holds_the_state_and_reads_it_back(name):
    cfg = CONFIGS[name]
    state = moved(cfg)
    model = models.hooked_model(cfg, state)
    toks = tokens(cfg.d_vocab)
    torch.testing.assert_close(model(toks), fused(cfg, state, toks), atol=1e-5, rtol=0)
    back = models.state_dict_for_save(model)
    assert list(back) == list(state)
    for key in state:
        assert torch.equal(back[key], state[key]), key


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_saved_model_loads_strictly_into_transformer_lens_own_model(name, tmp_path):
    """The documented converter: `tl_state_dict(*read_weights(path))` into TL's unmodified model, strict=True."""
    cfg = CONFIGS[name]
    ours = models.hooked_model(cfg, moved(cfg))
    path = models.save(ours, tmp_path)
    saved_cfg, state = models.read_weights(path)
    theirs = tl_model(saved_cfg)
    result = theirs.load_state_dict(models.tl_state_dict(saved_cfg, state), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    toks = tokens(cfg.d_vocab)
    torch.testing.assert_close(theirs(toks), ours(toks), atol=1e-5, rtol=0)
    again = models.state_dict_for_save(theirs, saved_cfg)  # and back: TL's model saves in the package's layout
    assert all(torch.equal(again[k], state[k]) for k in state) and set(again) == set(state)


def test_converter_and_loading_refuse_a_wrong_state_by_name():
    cfg = CONFIGS["paper-1layer"]
    state = moved(cfg)
    with pytest.raises(ValueError, match=r"missing tensors \['blocks.0.attn.k.weight'\]"):
        models.tl_state_dict(cfg, {k: v for k, v in state.items() if k != "blocks.0.attn.k.weight"})
    with pytest.raises(ValueError, match="blocks.0.mlp.in.weight has shape"):
        models.hooked_model(cfg, {**state, "blocks.0.mlp.in.weight": torch.zeros(3, 8)})


def test_reading_back_refuses_what_the_config_cannot_hold():
    """A non-zero bias the config lacks (TL's own model carries zero biases) is refused, not dropped."""
    cfg = CONFIGS["paper-1layer"]
    theirs = tl_model(cfg)
    theirs.load_state_dict(models.tl_state_dict(cfg, moved(cfg)), strict=True)
    bias = "blocks.0.attn.b_Q" if KIND == "HookedTransformer" else "blocks.0.attn.q.bias"
    with torch.no_grad():
        theirs.state_dict(keep_vars=True)[bias].fill_(0.5)
    with pytest.raises(ValueError, match="blocks.0.attn.q.bias is non-zero"):
        models.state_dict_for_save(theirs, cfg)
    with pytest.raises(ValueError, match=r"has no tensors \['blocks.1"):  # a model of another config
        models.state_dict_for_save(theirs, cfg.replace(n_layers=2))


def test_tying_in_each_kind():
    """Bridge: one Parameter (survives an update). HookedTransformer (TL has no tying): an equal copy, and
    `state_dict_for_save` refuses copies that training moved apart."""
    cfg = CONFIGS["paper-1layer"]
    model = models.hooked_model(cfg, moved(cfg))
    models.check_tied(model)
    if KIND == "TransformerBridge":
        assert model.embed.W_E.data_ptr() == model.unembed.W_U.data_ptr()
        return
    assert model.embed.W_E.data_ptr() != model.unembed.W_U.data_ptr()
    torch.testing.assert_close(model.unembed.W_U.T, model.embed.W_E, rtol=0, atol=0)
    with torch.no_grad():
        model.unembed.W_U.add_(0.1)
    with pytest.raises(ValueError, match="ties the unembedding"):
        models.state_dict_for_save(model)


# ------------------------------------------------------------------------------------------ heads per layer
def test_a_layer_with_fewer_heads_is_padded_with_silent_heads():
    cfg = ModelConfig(n_layers=2, n_heads=(1, 2), d_model=8, d_head=4, n_ctx=32, d_vocab=3)
    state = moved(cfg)
    assert state["blocks.0.attn.q.weight"].shape == (4, 8) and state["blocks.1.attn.q.weight"].shape == (8, 8)
    model = models.hooked_model(cfg, state)
    assert model.cfg.n_heads == 2 and models.heads_per_layer(model) == (1, 2)
    toks = tokens(3)
    logits, cache = model.run_with_cache(toks)
    torch.testing.assert_close(logits, fused(cfg, state, toks), atol=1e-5, rtol=0)
    assert cache["pattern", 0].shape == (3, 2, 24, 24)  # the surplus head exists ...
    assert torch.all(cache["z", 0][:, :, 1] == 0) and torch.any(cache["z", 0][:, :, 0] != 0)  # ... and is silent
    back = models.state_dict_for_save(model)
    assert all(torch.equal(back[k], state[k]) for k in state)
    name = "blocks.0.attn.W_V" if KIND == "HookedTransformer" else "blocks.0.attn.v.weight"
    with torch.no_grad():  # weights in the padded head: the config cannot hold them
        model.state_dict(keep_vars=True)[name][-1].fill_(0.1)
    with pytest.raises(ValueError, match="blocks.0.attn.v.weight is non-zero"):
        models.state_dict_for_save(model)


# ------------------------------------------------------------------------------------------ whole package
def test_training_builds_the_installed_kind_and_saves_it(tmp_path):
    from markov_interp import training

    run = training.default_run(steps=6, seq_len=16, batch_size=4, eval_batches=1, n_checkpoints=1)
    result = training.train(run, tmp_path, progress=False)
    assert type(result.model).__name__ == KIND
    again = models.load(tmp_path)
    toks = tokens(seq=16)
    torch.testing.assert_close(again(toks), result.model(toks), rtol=0, atol=0)
    path = models.save(result.model, tmp_path / "resaved.safetensors")  # saving works from the hooked model
    assert all(torch.equal(models.read_weights(path)[1][k], v) for k, v in models.read_weights(tmp_path)[1].items())


def test_applied_clamp_matches_the_fused_forward_on_this_kind():
    """`clamps.applied` on the hooked model equals the fused forward with the same clamp (resid_mid is hooked
    differently by a bridge and a HookedTransformer)."""
    from markov_interp import clamps

    cfg = preset("paper-2layer", n_ctx=16, n_heads=2)
    state = moved(cfg, scale=0.5)
    model = models.hooked_model(cfg, state)
    toks = tokens(seq=16)
    for spec in ("blocks.0.hook_resid_mid=zero", "blocks.1.attn.hook_pattern[1]=uniform"):
        items = clamps.parse_interventions([spec])
        want = fused(cfg, state, toks, clamps.clamp_hooks(items, 0, state=clamps.ClampState(),
                                                             update=False, member_axis=True))
        with clamps.applied(model, [spec], 0):
            hooked = model(toks)
        torch.testing.assert_close(hooked, want, atol=1e-5, rtol=0)
        assert (hooked - model(toks)).abs().max() > 1e-3, spec  # the clamp acts


# ------------------------------------------------------------------------------------------------- docs
def _doc_example(kind: str) -> str:
    text = (ROOT / "docs" / "transformerlens.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    found = [b for b in blocks if b.startswith(f"# {kind}")]
    assert len(found) == 1, f"docs/transformerlens.md needs one python block starting '# {kind}'"
    return found[0]


def test_docs_probe_your_own_transformer_lens_model():
    """The doc's example for the installed kind runs: a plain TL model trained in a plain loop is probed."""
    namespace: dict = {}
    exec(compile(_doc_example(KIND), "docs/transformerlens.md", "exec"), namespace)
    report = namespace["report"]
    assert type(namespace["model"]).__name__ == KIND
    assert isinstance(namespace["model"], models.HookedModel)  # a plain TL model has what the probes use
    assert (report.mechanism, report.order) == ("kernel", 1), report.reasons
    refs = report.references  # trained past halfway from the unigram plateau to the entropy rate
    assert report.eval_loss < refs.unigram_loss - 0.5 * (refs.unigram_loss - refs.entropy_rate)


# ------------------------------------------------------------------------------------------ forward_from
@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_forward_from_a_block_gives_the_logits_and_fires_no_earlier_hook(name):
    """`forward_from` (path patching's passes that start at their receiver's block) from the residual stream that
    enters block k gives the full forward's logits, on every config (rotary, biases, LNPre, no norm) and both
    kinds, and the hooks of blocks before k do not fire; a hook on block k does, and its edit changes the logits."""
    cfg = CONFIGS[name]
    model = models.hooked_model(cfg, moved(cfg))
    toks = tokens(cfg.d_vocab)
    with torch.no_grad():
        logits, cache = model.run_with_cache(toks)
        for k in range(cfg.n_layers):
            fired = []
            spy = [(f"blocks.{j}.hook_resid_pre", lambda act, hook, j=j: fired.append(j)) for j in range(cfg.n_layers)]
            out = models.forward_from(model, cache[f"blocks.{k}.hook_resid_pre"], k, tokens=toks, fwd_hooks=spy)
            torch.testing.assert_close(out, logits, atol=1e-5, rtol=1e-5)
            assert fired == list(range(k, cfg.n_layers))
            push = torch.randn(cfg.d_model, generator=torch.Generator().manual_seed(k))  # not a constant: LN removes it
            nudge = [(f"blocks.{k}.hook_resid_pre", lambda act, hook: act + push)]
            moved_out = models.forward_from(model, cache[f"blocks.{k}.hook_resid_pre"], k, tokens=toks,
                                            fwd_hooks=nudge)
            assert (moved_out - logits).abs().max() > 1e-3
