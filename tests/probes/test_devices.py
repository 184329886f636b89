"""Every public probe on a model that lives on another device than the batches, kernels and laws made on the CPU.

A model trained on a GPU (`TrainConfig.device="cuda"`: `train_many` returns it there) meets CPU tensors in every
probe: `sample_batch` draws on the CPU, theory computes its laws there, an ablation's zero is a CPU scalar. Here
each probe runs twice, on the CPU and with the model on another device, and must give the same result:

- "simulated": `tests/devicesim.SimulatedDevice` keeps the numbers on the CPU and refuses, as CUDA does, an
  operation that mixes the model's tensors with the CPU's (so the results must be equal bit for bit). It runs on
  every machine and failed, before they were fixed, on three probes that a GPU would have stopped at: a zero
  ablation (`models.hooks.write` kept the 0-d CPU zero where it was), `patching_by_position` (a device result
  written by index into its CPU grid), `direct_logit_attribution` of a model without a final LayerNorm (a CPU
  `ones(1)` for its scale).
- "cuda": the model on the GPU, where there is one (`python -m pytest tests/probes/test_devices.py -k cuda`);
  results agree within a float32 tolerance, except those whose outcome is a choice (a circuit, a label) or a ratio
  over a tiny KL (patching a random model), compared by their fields only (`FIELDS_ONLY`).
"""

import contextlib
import inspect
import math

import pytest
import torch

from devicesim import DEVICE, DeviceMismatch, SimulatedDevice
from handbuilt import induction_model

from markov_interp import clamps, probes
from markov_interp.sources import BinaryChain, RandomMarkov, hmm_preset
from markov_interp.models import build, preset

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
SEQ = 24

MODELS = {  # name -> (the model, on the CPU; the source it is probed on)
    # attention only, no LayerNorm: the mechanism known by construction (the classifier confirms the circuit)
    "induction": (lambda: induction_model(3, n_ctx=SEQ), RandomMarkov(3)),
    # the paper's one-layer model: LayerNorm, an MLP, tied weights, a fixed chain (kernel swap "random")
    "paper": (lambda: build(preset("paper-1layer", n_ctx=SEQ), seed=0), BinaryChain(0.2, 0.3)),
    # rotary positions (no position embedding), two heads then one, a finite pool of kernels
    "rotary": (lambda: build(preset("paper-2layer", d_vocab=3, n_ctx=SEQ, positional="rotary", n_heads=(2, 1)),
                             seed=0), RandomMarkov(3, pool_size=4)),
}


def _under_clamps(model, source, batch, pair):
    """What the factorial does after training: scores and a circuit under a pattern clamp and a mean clamp."""
    items = [{"clamp": "blocks.0.attn.hook_pattern", "value": "previous_token"},
             {"clamp": "blocks.0.hook_attn_out", "value": "mean"}]
    with clamps.applied(model, items, 0):
        return probes.attention_scores(model, batch), probes.discover_circuit(model, source, batch=batch,
                                                                              n_sequences=8)


def _edge_runner(model, source, batch, pair):
    runner, edges = probes.paths.EdgeRunner(model, *pair), probes.paths.graph_edges(model)
    return runner.many_losses([[e] for e in edges[:6]] + [edges[-3:]])


def _cpu_replacements(model, batch):
    """Replacements made on the CPU (a 0-d zero, a mean moved there) for every attention output."""
    comps = [c for c in probes.interventions.model_components(model) if c.kind == "attn"]
    mean = probes.ablation.reference_activations(model, comps, method="mean", tokens=batch)
    return comps, {c.hook_name: mean[c.hook_name].cpu() if c.layer else torch.zeros(()) for c in comps}


def _intervened(model, source, batch, pair):
    comps, values = _cpu_replacements(model, batch)
    return (probes.interventions.intervened_probs(model, batch.tokens, [comps[:1], comps], values),
            probes.interventions.intervened_run(model, batch.tokens, comps[-1:], values, record=[comps[0].hook_name]))


def _beliefs(model):
    """The belief probes' table on the hidden Markov source with the model's vocabulary (Mess3 on 3 states, Z1R on
    2), its tokens drawn on the CPU, and those tokens and the source."""
    hmm = hmm_preset("mess3" if model.cfg.d_vocab == 3 else "z1r")
    tokens = hmm.sample(12, SEQ, generator=torch.Generator().manual_seed(1))
    return probes.beliefs.belief_probes(model, tokens, hmm, n_bootstrap=50), tokens, hmm


def _belief_patch(model, source, batch, pair):
    table, tokens, hmm = _beliefs(model)
    return [probes.beliefs.belief_patch(model, tokens, hmm, table.fits[1], n_bootstrap=50, subspace=kind)
            for kind in probes.beliefs.SUBSPACES]


def _components(model):
    return probes.interventions.model_components(model)[:3]


PROBES = {  # name -> fn(model, source, batch, (clean, corrupted)): every public probe that takes a model
    "next_state_probs": lambda m, s, b, p: probes.next_state_probs(m, b),
    "model_predictor": lambda m, s, b, p: probes.behaviour.model_predictor(m)(b.tokens),
    "attention_scores": lambda m, s, b, p: probes.attention_scores(m, b, max_order=2, max_lag=2),
    "behaviour_report": lambda m, s, b, p: probes.behaviour_report(m, b),
    "swap_kernels": lambda m, s, b, p: probes.swap_kernels(m, s, n_sequences=8),
    "kernel_readout": lambda m, s, b, p: probes.kernel_readout(m, b),
    "strategy_similarity": lambda m, s, b, p: probes.strategy_similarity(m, b),
    "ablation_table": lambda m, s, b, p: [probes.ablation_table(m, b, method=k) for k in probes.ablation.METHODS],
    "ablated_probs": lambda m, s, b, p: probes.ablation.ablated_probs(m, b, _components(m), method="zero"),
    "ablation_loss_change": lambda m, s, b, p: probes.ablation.ablation_loss_change(m, b, _components(m),
                                                                                    reference_tokens=p[1]),
    "set_ablation_losses": lambda m, s, b, p: probes.ablation.set_ablation_losses(
        m, b, [_components(m)[:1], _components(m)], method="resample"),
    "reference_activations": lambda m, s, b, p: probes.ablation.reference_activations(m, _components(m), tokens=b,
                                                                                      method="resample"),
    "ablation_hooks": lambda m, s, b, p: probes.next_state_probs(m, b, fwd_hooks=probes.ablation.ablation_hooks(
        m, _components(m), method="zero", reference={})),
    "intervened_probs": _intervened,
    "intervened_run": _intervened,
    "patched_probs": lambda m, s, b, p: probes.patching.patched_probs(m, *p, _components(m), positions=[SEQ - 1]),
    "activation_patching": lambda m, s, b, p: probes.activation_patching(m, *p),
    "patching_by_position": lambda m, s, b, p: probes.patching_by_position(m, *p),
    "direct_logit_attribution": lambda m, s, b, p: probes.direct_logit_attribution(m, b),
    "ov_circuits": lambda m, s, b, p: probes.ov_circuits(m),
    "qk_circuits": lambda m, s, b, p: probes.qk_circuits(m),
    "composition_scores": lambda m, s, b, p: (probes.patching.composition_scores(m, "K") if m.cfg.n_layers > 1
                                              else None),
    "head_composition": lambda m, s, b, p: (probes.patching.head_composition(m, (0, 0), (1, 0)) if m.cfg.n_layers > 1
                                            else None),
    "EdgeRunner": _edge_runner,
    "discover_circuit": lambda m, s, b, p: [probes.discover_circuit(m, s, n_sequences=8, method="exact"),
                                            probes.discover_circuit(m, s, n_sequences=8, method="attribution+verify",
                                                                    joint=True, corruption="kernel_swap")],
    "classify_mechanism": lambda m, s, b, p: probes.classify_mechanism(m, s, n_sequences=12),
    "edge_content": lambda m, s, b, p: probes.edge_content(m, b, [e for e in probes.paths.graph_edges(m) if e.input in (
        "q", "k", "v")][-4:], n_sequences=6),
    "circuit_formation": lambda m, s, b, p: probes.circuit_formation([(1, m), (2, m)], s, n_sequences=8),
    "clamps.applied": _under_clamps,
    "linear_probe": lambda m, s, b, p: [probes.linear_probe(m, b, ("z", 0, 0), "state", n_bootstrap=50),
                                        probes.linear_probe(m, b, ("result", 0, 0), "state_counts", n_bootstrap=50)],
    "belief_probes": lambda m, s, b, p: _beliefs(m)[0],
    "belief_patch": _belief_patch,
    "simplex_points": lambda m, s, b, p: probes.beliefs.simplex_points(m, *_beliefs(m)[1:], _beliefs(m)[0]),
    "probe_layers": lambda m, s, b, p: probes.probe_layers(m, b, probes.probe_target("state", b, lag=1),
                                                           n_bootstrap=50),
}
# compared by their fields only on CUDA: a choice (the edges kept, a label), or a ratio over a KL of 1e-8..1e-6 nats
# (the patching baseline of the random models here), which float32 rounding on another device moves; a belief
# patch is a ratio of moves as small on these untrained models, and the simplex points are rounded to 4 decimals
FIELDS_ONLY = {"discover_circuit", "classify_mechanism", "circuit_formation", "clamps.applied", "activation_patching",
               "patching_by_position", "edge_content", "belief_patch", "simplex_points"}
EXEMPT = {  # public probes taking a model that read only its config, never a tensor
    "probe_length", "training_length", "graph_edges", "model_components", "probe_hook_names",
    "fitted_similarity",  # given the model's logits: runs no forward (the classifier's law axis, run above)
    "layer_sites"}  # the belief probes' sites, from the config
SLOW = {"discover_circuit", "classify_mechanism", "circuit_formation", "clamps.applied", "EdgeRunner", "edge_content"}


def _plain(value):
    """A result as nested lists / dicts of Python values (`to_dict()` where a result has one)."""
    if isinstance(value, torch.Tensor):
        return _plain(value.detach().cpu().tolist())
    if hasattr(value, "to_dict"):
        return _plain(value.to_dict())
    if isinstance(value, dict) or (hasattr(value, "keys") and hasattr(value, "__getitem__")):
        return {str(k): _plain(value[k]) for k in value.keys()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _same(a, b, *, tolerance, path="result"):
    """Equal structure; numbers equal (NaN to NaN) within `tolerance` = (rtol, atol), or exactly when None."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], tolerance=tolerance, path=f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, tolerance=tolerance, path=f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float) and (math.isnan(a) or math.isnan(b)):
        assert math.isnan(a) and math.isnan(b), f"{path}: {a} vs {b}"
    elif isinstance(a, float) and tolerance is not None:
        assert math.isclose(a, b, rel_tol=tolerance[0], abs_tol=tolerance[1]), f"{path}: {a} vs {b}"
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def _fields(value):
    """A result's outline: a dict's keys, a list's elements' outlines, else the type's name."""
    if isinstance(value, dict):
        return sorted(value)
    if isinstance(value, list):
        return [_fields(v) for v in value]
    return type(value).__name__


@contextlib.contextmanager
def on(device: str):
    """The device a model is moved to, inside the simulation for "simulated"."""
    if device == "cuda":
        yield torch.device("cuda")
        return
    with SimulatedDevice():
        yield DEVICE


def _inputs(source):
    batch = probes.sample_batch(source, n_sequences=12, seq_len=SEQ, seed=1)
    return batch, probes.patching.patching_pair(batch, seed=0)


def _cases():
    """(device, model, probe) for every probe on every model on each device; the path-patching ones are slow."""
    for name in PROBES:
        for device in ("simulated", "cuda"):
            marks = ([pytest.mark.slow] if name in SLOW else []) + ([cuda] if device == "cuda" else [])
            yield from (pytest.param(device, model, name, marks=marks, id=f"{device}-{model}-{name}")
                        for model in MODELS)


@pytest.mark.parametrize("device, model_name, probe", list(_cases()))
def test_probe_gives_the_cpu_result_with_the_model_on_another_device(device, model_name, probe):
    make, source = MODELS[model_name]
    batch, pair = _inputs(source)
    reference = _plain(PROBES[probe](make(), source, batch, pair))
    with on(device) as where:
        model = make().to(where, print_details=False)
        result = _plain(PROBES[probe](model, source, *_inputs(source)))  # batches made on the CPU, as always
    if device == "simulated":
        _same(result, reference, tolerance=None)
    elif probe in FIELDS_ONLY:
        assert _fields(result) == _fields(reference)
    else:
        _same(result, reference, tolerance=(1e-3, 1e-4))


def test_every_public_probe_that_takes_a_model_is_run_on_another_device():
    """A probe added later is added to PROBES (or, reading only the config, to EXEMPT)."""
    def first_parameter(f):
        try:
            return next(iter(inspect.signature(f).parameters), None)
        except (TypeError, ValueError):  # a class without a Python signature (a warning category)
            return None

    from tests.probes.test_probe_ux import public_probe_names

    takes_model = {name for name, value in public_probe_names().items()
                   if callable(value) and first_parameter(value) in ("model", "checkpoints")}
    assert takes_model - EXEMPT <= set(PROBES), sorted(takes_model - EXEMPT - set(PROBES))
    assert "EdgeRunner" in takes_model and not EXEMPT & set(PROBES)


# ------------------------------------------------------------------------------------- the simulation itself
def test_the_simulation_refuses_what_cuda_refuses_and_allows_what_it_allows():
    sim = SimulatedDevice()
    host = torch.ones(3, 4)
    with sim:
        here = host.to(DEVICE)
        assert here.device == DEVICE and sim.on_device(here) and not sim.on_device(host)  # the original stays
        for mixed in (lambda: here + host, lambda: torch.cat([here, host]), lambda: host[torch.tensor([0]).to(DEVICE)],
                      lambda: host.__setitem__(torch.tensor([0, 1]), here[:2]), lambda: here.numpy(),
                      lambda: torch.where(host > 0, here, here)):
            with pytest.raises(DeviceMismatch):
                mixed()
        assert sim.on_device(here * torch.tensor(2.0))  # a 0-d CPU tensor is a scalar to CUDA
        assert sim.on_device(here[torch.tensor([0, 2])])  # CPU indices index a device tensor
        host[0:2] = here[:2]  # basic slicing copies across devices
        here[torch.tensor([1])] = torch.zeros(1, 4).to(DEVICE)
        assert not sim.on_device(torch.zeros(()).expand_as(here))  # expand_as reads the other tensor's shape only
        values, indices = here.max(-1)
        assert sim.on_device(values) and sim.on_device(indices) and sim.on_device(torch.zeros_like(here))
        assert sim.on_device(torch.arange(3, device=here.device)) and not sim.on_device(here.cpu())
        model = build(preset("attn-only-2layer", d_vocab=3, n_ctx=8), seed=0).to(DEVICE, print_details=False)
        assert all(sim.on_device(p) for p in model.parameters()) and model.cfg.device == DEVICE
        tokens = torch.zeros(2, 8, dtype=torch.long)
        with pytest.raises(DeviceMismatch, match="embed"):  # the factorial's crash of 2026-11-27, on the CPU
            model.run_with_cache(tokens)
        on_cpu = build(preset("attn-only-2layer", d_vocab=3, n_ctx=8), seed=0)
        assert torch.equal(model(tokens.to(DEVICE)).cpu(), on_cpu(tokens))  # the numbers are the CPU's
