"""Tests for markov_interp.models: configs, presets, heads per layer, the one initialiser, the hooked build, tying,
the stacked forward against the hooked one, save / load."""

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from safetensors import safe_open

from markov_interp import models
from markov_interp.models import ModelConfig, build, is_bridge, load, preset, save
from markov_interp.models.stack import Stack, stacked_forward

SMALL_CTX = 64  # keeps positional tables small in tests


def tokens(batch=3, seq=40, vocab=2, seed=0):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------- configs
def test_paper_preset_matches_the_paper():
    cfg = preset("paper-1layer")
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head, cfg.d_mlp) == (1, 1, 8, 8, 32)
    assert cfg.tie_weights and cfg.unembed_bias and not cfg.attn_bias and not cfg.mlp_bias
    assert cfg.normalization == "LN" and not cfg.layernorm_bias and cfg.act_fn == "gelu"
    assert (cfg.n_ctx, cfg.d_vocab, cfg.positional) == (1024, 2, "standard")
    # ~9k parameters, most of them positions (8 * 1024)
    assert cfg.n_params == sum(t.numel() for t in models.state_dict_for_save(build(cfg, seed=0)).values())
    assert 9000 < cfg.n_params < 10000
    assert preset("paper-2layer").n_layers == 2
    attn = preset("attn-only-2layer")
    assert attn.attn_only and attn.n_layers == 2


def test_unknown_preset_lists_valid_names():
    with pytest.raises(ValueError, match="paper-1layer"):
        preset("gpt-5")


def test_preset_overrides_rederive_sizes():
    cfg = preset("paper-1layer", d_model=16, n_heads=2)
    assert (cfg.d_head, cfg.d_mlp) == (8, 64)
    assert preset("paper-1layer", d_model=16, d_mlp=20).d_mlp == 20
    assert cfg.replace(d_model=32).d_mlp == 128
    assert cfg.replace(d_model=32).d_head == 16
    with pytest.raises(ValueError, match="unknown ModelConfig fields"):
        preset("paper-1layer", d_modle=3)


def test_config_json_round_trip_and_unknown_keys():
    cfg = preset("paper-2layer", init="canonical", canonical_w=-1.0)
    again = ModelConfig.from_dict(json.loads(cfg.to_json()))
    assert again == cfg
    with pytest.raises(ValueError, match="unknown ModelConfig keys"):
        ModelConfig.from_dict({**cfg.to_dict(), "dropout": 0.1})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_layers=0), "n_layers"),
        (dict(d_model=10, n_heads=3), "divisible"),
        (dict(normalization="RMS"), "normalization"),
        (dict(positional="alibi"), "positional"),
        (dict(init="xavier"), "init"),
        (dict(act_fn="tanh"), "act_fn"),
        (dict(d_vocab=1), "d_vocab"),
        (dict(normalization="LNPre", layernorm_bias=True), "layernorm_bias"),
        (dict(init="canonical", d_vocab=3), "d_vocab"),
        (dict(init_std=0.0), "init_std"),
        (dict(positional="rotary", d_model=6, n_heads=2), "even d_head"),
    ],
)
def test_bad_model_configs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**kwargs)


# --------------------------------------------------------------------------------------------- build
def test_build_is_seeded_and_leaves_global_rng_alone():
    cfg = preset("paper-1layer", n_ctx=SMALL_CTX)
    state = torch.random.get_rng_state()
    a, b, c = build(cfg, seed=1), build(cfg, seed=1), build(cfg, seed=2)
    assert torch.equal(torch.random.get_rng_state(), state)
    for (name, x), (_, y), (_, z) in zip(a.state_dict().items(), b.state_dict().items(), c.state_dict().items()):
        assert torch.equal(x, y), name
    assert not torch.equal(a.embed.W_E, c.embed.W_E)
    assert a.markov_config == cfg


def test_paper_model_has_the_papers_biases():
    model = build(preset("paper-1layer", n_ctx=SMALL_CTX), seed=0)
    names = set(models.state_dict_for_save(model))
    assert names == {
        "embed.weight", "pos_embed.weight", "blocks.0.ln1.weight", "blocks.0.attn.q.weight",
        "blocks.0.attn.k.weight", "blocks.0.attn.v.weight", "blocks.0.attn.o.weight", "blocks.0.ln2.weight",
        "blocks.0.mlp.in.weight", "blocks.0.mlp.out.weight", "ln_final.weight", "unembed.bias",
    }


def test_standard_init_scales():
    cfg = preset("paper-1layer", d_model=64, n_ctx=SMALL_CTX, n_layers=2)
    model = build(cfg, seed=0)
    sd = models.state_dict_for_save(model)
    assert abs(sd["blocks.0.attn.q.weight"].std().item() - 0.02) < 0.002
    assert abs(sd["blocks.1.mlp.out.weight"].std().item() - 0.02 / 2) < 0.001  # 0.02 / sqrt(2 * 2)
    assert abs(sd["blocks.0.attn.o.weight"].std().item() - 0.01) < 0.001
    assert torch.all(sd["unembed.bias"] == 0) and torch.all(sd["ln_final.weight"] == 1)


def test_plain_init_draws_the_same_weights_without_the_depth_scaling():
    """init="plain": the standard init's draws (same generator order), with the output projections at init_std."""
    cfg = preset("paper-1layer", d_model=64, n_ctx=SMALL_CTX, n_layers=2)
    standard, plain = models.initial_state(cfg, 3), models.initial_state(cfg.replace(init="plain"), 3)
    for name, tensor in standard.items():
        scale = 2.0 if name.endswith(("attn.o.weight", "mlp.out.weight")) else 1.0  # sqrt(2 * n_layers) = 2
        torch.testing.assert_close(plain[name], tensor * scale, rtol=1e-6, atol=0)
    assert abs(plain["blocks.0.attn.o.weight"].std().item() - 0.02) < 0.002


def test_hooks_work():
    model = build(preset("paper-2layer", n_ctx=SMALL_CTX), seed=0)
    toks = tokens()
    logits, cache = model.run_with_cache(toks)
    pattern = cache["pattern", 0]
    assert pattern.shape == (3, 1, 40, 40)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(3, 1, 40))
    assert torch.all(pattern.triu(1) == 0)  # causal
    seen = []

    def uniform_pattern(pattern, hook):
        seen.append(hook.name)
        causal = torch.tril(torch.ones_like(pattern))
        return causal / causal.sum(-1, keepdim=True)

    patched = model.run_with_hooks(toks, fwd_hooks=[("blocks.0.attn.hook_pattern", uniform_pattern)])
    assert seen == ["blocks.0.attn.hook_pattern"]
    assert not torch.allclose(patched, logits)
    torch.testing.assert_close(model(toks), logits)  # hooks removed afterwards


OPTIONS = [
    {},
    dict(positional="rotary"),
    dict(normalization=None),
    dict(normalization="LNPre", n_heads=2),
    dict(layernorm_bias=True, attn_bias=True, mlp_bias=True, tie_weights=False, unembed_bias=False),
    dict(act_fn="relu", d_vocab=3),
    dict(init="canonical", canonical_v_std=0.5),
    dict(n_heads=(1, 2), attn_bias=True),
    dict(n_heads=(2, 1), positional="rotary", d_model=16, tie_weights=False),
]


def _stack_of(model) -> Stack:
    """A stack of one holding `model`'s weights (the training engine's view of it)."""
    return Stack.from_states([model.markov_config], [models.state_dict_for_save(model)])


# per-layer head counts need two layers: not with the one-layer preset
CASES = [(name, options) for name in sorted(models.PRESETS) for options in OPTIONS
         if not (isinstance(options.get("n_heads"), tuple) and models.PRESETS[name].get("n_layers", 1) == 1)]


@pytest.mark.parametrize("name, options", CASES,
                         ids=[f"{n}-{','.join(f'{k}={v}' for k, v in o.items()) or 'default'}" for n, o in CASES])
def test_stacked_forward_equals_hooked_forward(name, options):
    """The one training forward computes the hooked model's logits, for every architecture option."""
    if options.get("init") == "canonical" and name == "attn-only-2layer":
        options = dict(options, d_head=None)
    cfg = preset(name, n_ctx=SMALL_CTX, **options)
    model = build(cfg, seed=3)
    # move the weights away from init so every parameter matters (biases, LN scales)
    state = models.state_dict_for_save(model)
    gen = torch.Generator().manual_seed(9)
    state = {k: v + 0.3 * torch.randn(v.shape, generator=gen) for k, v in state.items()}
    model = models.hooked_model(cfg, state)
    toks = tokens(seq=SMALL_CTX, vocab=cfg.d_vocab)
    hooked = model(toks)
    fast = stacked_forward(Stack.from_states([cfg], [state]), toks[None])[0]
    torch.testing.assert_close(fast, hooked, atol=1e-5, rtol=0)


def test_stacked_gradients_equal_the_hooked_models():
    model = build(preset("paper-2layer", n_ctx=SMALL_CTX, n_heads=(1, 2)), seed=0)
    if not is_bridge(model):
        pytest.skip("TransformerLens < 4: HookedTransformer parameters have another layout (and a tied copy); "
                    "its logits equal the fused forward's (test above, tests/models/test_tl.py)")
    stack = _stack_of(model)
    toks = tokens()
    stacked_forward(stack, toks[None]).logsumexp(-1).mean().backward()
    model(toks).logsumexp(-1).mean().backward()
    hooked = {n: p.grad for n, p in model.state_dict(keep_vars=True).items() if p.grad is not None}
    for name, param in stack.params.items():
        expected = hooked[name]
        if name.startswith("blocks.0.attn."):  # layer 0 has one real head of the hooked model's two
            expected = expected[:4] if not name.endswith("o.weight") else expected[:, :4]
        torch.testing.assert_close(param.grad[0], expected, atol=1e-6, rtol=1e-4)


def test_stacked_forward_refuses_long_input():
    model = build(preset("paper-1layer", n_ctx=16), seed=0)
    with pytest.raises(ValueError, match="n_ctx=16"):
        stacked_forward(_stack_of(model), tokens(seq=17)[None])


# ---------------------------------------------------------------------------------------------- tying
def test_tying_is_one_parameter_and_survives_an_update_and_to():
    """The TL 4 bridge ties by one Parameter (TL 2/3's HookedTransformer holds an equal copy:
    tests/models/test_tl.py)."""
    model = build(preset("paper-1layer", n_ctx=4), seed=0)
    if not is_bridge(model):
        pytest.skip("TransformerLens < 4: HookedTransformer has no tying (W_U is an equal copy, "
                    "tests/models/test_tl.py)")
    model = build(preset("paper-1layer", n_ctx=SMALL_CTX), seed=0)
    assert model.embed.W_E.data_ptr() == model.unembed.W_U.data_ptr()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(tokens()).sum().backward()
    opt.step()
    torch.testing.assert_close(model.embed.W_E, model.unembed.W_U.T, rtol=0, atol=0)
    model.to("cpu", print_details=False)
    models.check_tied(model)
    untied = build(preset("paper-1layer", n_ctx=SMALL_CTX, tie_weights=False), seed=0)
    assert untied.embed.W_E.data_ptr() != untied.unembed.W_U.data_ptr()
    models.check_tied(untied)


def test_canonical_init_is_the_reduced_model():
    e, w, b = 0.8, -0.9, 0.25
    cfg = preset("paper-1layer", n_ctx=SMALL_CTX, init="canonical", normalization=None, act_fn="relu",
                 canonical_e=e, canonical_w=w, canonical_b=b)
    model = build(cfg, seed=5)
    toks = tokens(seq=SMALL_CTX)
    logits = model(toks)
    diff = logits[..., 1] - logits[..., 0]
    f1 = (0.5 + 2 * w * abs(w)) * e**2 + b
    f0 = b - e**2 / 2
    expected = torch.where(toks == 1, torch.tensor(f1), torch.tensor(f0))
    torch.testing.assert_close(diff, expected, atol=1e-5, rtol=0)
    # the weights are rank one along u = alpha / sqrt(d): W_E[1] = e u, positions -(e/2) u
    W_E = model.embed.W_E
    u = W_E[1] / e
    assert torch.allclose(u.abs(), torch.full((8,), 8**-0.5)) and torch.all(W_E[0] == 0)
    torch.testing.assert_close(model.pos_embed.W_pos, (-e / 2) * u.expand(SMALL_CTX, 8))


# ------------------------------------------------------------------------------------------ save/load
def test_save_load_round_trip_keeps_tying(tmp_path):
    cfg = preset("paper-2layer", n_ctx=SMALL_CTX)
    model = build(cfg, seed=4)
    path = save(model, tmp_path)
    assert path.name == "model.safetensors"
    with safe_open(str(path), framework="pt") as handle:
        assert "unembed.weight" not in handle.keys()  # stored once
        assert ModelConfig.from_dict(json.loads(handle.metadata()["markov_interp.model_config"])) == cfg
    again = load(tmp_path)
    models.check_tied(again)
    assert again.markov_config == cfg
    toks = tokens()
    torch.testing.assert_close(again(toks), model(toks), rtol=0, atol=0)
    assert load(path).markov_config == cfg  # the file itself also works


def test_load_errors_are_clear(tmp_path):
    model = build(preset("paper-1layer", n_ctx=SMALL_CTX), seed=0)
    path = save(model, tmp_path / "m.safetensors")
    metadata = safe_open(str(path), framework="pt").metadata()
    state = load_file(str(path))

    with pytest.raises(FileNotFoundError):
        load(tmp_path / "absent.safetensors")
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match="not a readable safetensors"):
        load(corrupt)
    missing = tmp_path / "missing.safetensors"
    save_file({k: v for k, v in state.items() if k != "blocks.0.attn.q.weight"}, str(missing), metadata=metadata)
    with pytest.raises(ValueError, match=r"missing tensors \['blocks.0.attn.q.weight'\]"):
        load(missing)
    wrong = tmp_path / "wrong.safetensors"
    save_file({**state, "blocks.0.attn.q.weight": torch.zeros(4, 8)}, str(wrong), metadata=metadata)
    with pytest.raises(ValueError, match="blocks.0.attn.q.weight has shape"):
        load(wrong)
    nometa = tmp_path / "nometa.safetensors"
    save_file(state, str(nometa))
    with pytest.raises(ValueError, match="no markov-interp model config"):
        load(nometa)
    with pytest.raises(ValueError, match="d_model"):
        load(path, expect=preset("paper-1layer", n_ctx=SMALL_CTX, d_model=16))


def test_canonical_untied_output_scale():
    from markov_interp.landscape import canonical_projection

    cfg = preset("paper-1layer", init="canonical", tie_weights=False, canonical_e=0.3, canonical_a=0.7,
                 normalization=None, act_fn="relu")
    model = build(cfg, seed=3)
    state = model.state_dict()
    w_u = next(v for k, v in state.items() if k.startswith("unembed") and v.ndim == 2)
    w_e = next(v for k, v in state.items() if k.startswith("embed") and v.ndim == 2)
    rows = w_u if w_u.shape[0] == 2 else w_u.T
    # row 1 of the output is a u, parallel to the embedding of state 1 (e u) with ratio a / e
    assert torch.allclose(rows[0], torch.zeros_like(rows[0]))
    assert torch.allclose(rows[1], w_e[1] * (0.7 / 0.3), atol=1e-6)
    with pytest.raises(ValueError, match="canonical_a"):
        preset("paper-1layer", init="canonical", canonical_a=0.5)  # tied: a is e by definition
    projection = canonical_projection(model)  # the landscape reads the same (e, a) back
    assert projection.e == pytest.approx(0.3, abs=1e-6) and projection.a == pytest.approx(0.7, abs=1e-6)


# ----------------------------------------------------------------------------------------- initialiser
def _digest(state: dict) -> str:
    digest = hashlib.sha256()
    for name, tensor in state.items():  # names, shapes and values, in order
        digest.update(f"{name}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()


INIT_REFERENCE = json.loads((Path(__file__).parents[1] / "data" / "init_main.json").read_text())


@pytest.mark.parametrize("name", sorted(INIT_REFERENCE))
def test_initial_state_is_the_weights_main_built(name):
    """The one initialiser gives, bit for bit and in the same order, what `models.build` gave before the engine
    was unified (tests/data/init_main.json: hashes written by tests/data/make_fixtures.py with that code)."""
    entry = INIT_REFERENCE[name]
    cfg = ModelConfig.from_dict(entry["config"])
    state = models.initial_state(cfg, entry["seed"])
    assert list(state) == list(models.state_shapes(cfg))
    assert _digest(state) == entry["sha256"]
    assert _digest(models.state_dict_for_save(build(cfg, seed=entry["seed"]))) == entry["sha256"]


def test_initial_state_refuses_a_bool_seed():  # (other types: the annotations, checked at test time)
    with pytest.raises(ValueError, match="seed must be an integer"):
        models.initial_state(preset("paper-1layer"), seed=True)


# ------------------------------------------------------------------------------------- heads per layer
def test_heads_per_layer_configs():
    cfg = preset("paper-2layer", n_heads=(1, 2))
    assert cfg.heads_per_layer == (1, 2) and cfg.max_heads == 2 and cfg.d_head == 4  # d_model // the largest
    assert ModelConfig.from_json(cfg.to_json()) == cfg and json.loads(cfg.to_json())["n_heads"] == [1, 2]
    assert preset("paper-2layer", n_heads=[1, 2]) == cfg  # a JSON list reads as the tuple
    assert preset("paper-2layer", n_heads=(2, 2)).n_heads == 2  # equal counts: the single int
    assert preset("paper-2layer", n_heads=2).heads_per_layer == (2, 2)
    assert cfg.replace(d_model=16).d_head == 8  # the default d_head follows d_model
    assert preset("paper-2layer", n_heads=(1, 2), d_head=3).d_head == 3
    # per layer: 4 d h weights of attention (h = heads * d_head), the rest as in a 2-layer model
    two = preset("paper-2layer")
    assert cfg.n_params == two.n_params - 4 * 8 * (8 - 4) - 4 * 8 * (8 - 8)
    assert cfg.n_params == sum(t.numel() for t in models.initial_state(cfg, 0).values())


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_layers=2, n_heads=(1, 2, 3)), "3 head counts but n_layers=2"),
    (dict(n_layers=2, n_heads=(1, 0)), "n_heads"),
    (dict(n_layers=2, n_heads=(1, 3)), r"not divisible by n_heads=3 \(the largest count of \(1, 3\)\)"),
    (dict(n_layers=2, n_heads=(1, "2")), "n_heads"),
    (dict(n_layers=2, n_heads=(1, 2), init="canonical", canonical_v_std=0.1), "in every layer"),
])
def test_bad_head_counts_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**kwargs)


def test_a_model_with_heads_per_layer_saves_real_shapes_and_loads(tmp_path):
    cfg = preset("paper-2layer", n_ctx=SMALL_CTX, n_heads=(1, 2), attn_bias=True)
    model = build(cfg, seed=2)
    assert models.heads_per_layer(model) == (1, 2) and model.cfg.n_heads == 2  # TL: the largest count everywhere
    # TL's per-head views (the same on a bridge and a HookedTransformer): layer 0's second head is zero
    assert model.W_Q.shape == (2, 2, 8, 4) and torch.all(model.W_Q[0, 1] == 0) and torch.any(model.W_Q[0, 0] != 0)
    assert torch.all(model.W_O[0, 1] == 0) and torch.all(model.b_V[0, 1] == 0)
    path = save(model, tmp_path)
    with safe_open(str(path), framework="pt") as handle:  # on disk: each layer's real heads
        assert handle.get_slice("blocks.0.attn.q.weight").get_shape() == [4, 8]
        assert handle.get_slice("blocks.0.attn.o.weight").get_shape() == [8, 4]
        assert handle.get_slice("blocks.1.attn.q.weight").get_shape() == [8, 8]
    again = load(tmp_path)
    assert models.heads_per_layer(again) == (1, 2)
    toks = tokens()
    torch.testing.assert_close(again(toks), model(toks), rtol=0, atol=0)
    _, cache = again.run_with_cache(toks)
    assert cache["pattern", 0].shape == (3, 2, 40, 40)  # the surplus head is there, uniform, writing nothing
    assert torch.all(cache["z", 0][:, :, 1] == 0)
