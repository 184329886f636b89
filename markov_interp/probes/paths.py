"""Path patching of edges: run the model with any set of sender -> receiver-input edges corrupted.

The computational graph of a transformer read as a circuit (Conmy et al. 2023, ACDC; Wang et al. 2022, path
patching): **senders** write into the residual stream ("embed" = the token embedding, every head "L{l}H{h}", every
MLP "L{l}.mlp"); **receivers** read it through an input: a head through its queries, keys or values ("q", "k",
"v": each head input is projected from the residual stream on its own), an MLP through its input ("mlp"), the
unembedding ("logits"). An edge is (sender, receiver, input) for every sender upstream of the receiver (heads
read the senders of earlier layers, an MLP also the heads of its own layer).

**Corrupting an edge** replaces, in what that receiver input reads, the sender's output by its value on the
corrupted sequence; every other input reads what it reads in this run. `EdgeRunner.run(corrupted)` runs the
model with a set of edges corrupted at once (all of them: the corrupted run; none: the clean run), stage by stage
(the attention of layer 0, its MLP, the attention of layer 1, ..., the logits):

1. a receiver input whose senders all hold their clean values and whose edges are all kept reads its clean value;
   one whose edges are all corrupted, or whose kept senders already hold their corrupted values, reads its
   corrupted value; any other reads the residual stream made of its own choice of sender values, obtained by one
   forward pass with every upstream sender's output set to that choice (`interventions.intervened_run`) and the
   input recorded there (inputs with the same choice share the pass);
2. a head whose inputs are not all clean (or all corrupted) gets its output from one more pass with its queries,
   keys and values set to the recorded ones;
3. once every edge into the remaining stages is kept, one last pass with the senders' outputs so far set to what
   they are in this run gives the logits (the model's own forward does the rest).

The positions are never corrupted (clean and corrupted sequences have the same length), so "embed" stands for the
token embedding alone. Everything runs through the one intervention engine (`interventions`); nothing here
re-implements the model's layers. `edge_attributions` is the gradient approximation (edge attribution patching,
Syed et al. 2023): (corrupted - clean sender output) . (gradient of the loss with respect to the receiver's input
in the clean run), from one forward and backward pass.
"""

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, Optional

import torch
from jaxtyping import Float
from torch import Tensor

from markov_interp.models import heads_per_layer
from markov_interp.probes._common import (
    Model,
    Tokens,
    attn_out_hook,
    channel_hook,
    check_tokens,
    embed_hook,
    has_mlp,
    mlp_out_hook,
    resid_mid_hook,
    resid_post_hook,
    resid_pre_hook,
    z_hook,
)
from markov_interp.probes.interventions import Component, intervened_run

INPUTS = ("q", "k", "v", "mlp", "logits")
SequenceLoss = Float[Tensor, " batch"]


@dataclasses.dataclass(frozen=True)
class EdgeKey:
    """One edge of the graph: `sender` ("embed", "L0H1", "L0.mlp") -> `receiver` ("L1H0", "L1.mlp", "logits")
    through the receiver's `input` ("q", "k", "v", "mlp", "logits")."""

    sender: str
    receiver: str
    input: str

    @property
    def name(self) -> str:
        """"L0H1->L1H0.k", "embed->L0.mlp", "L1H0->logits"."""
        tail = f".{self.input}" if self.input in ("q", "k", "v") else ""
        return f"{self.sender}->{self.receiver}{tail}"

    def __str__(self) -> str:
        return self.name


@dataclasses.dataclass(frozen=True)
class _Stage:
    kind: str  # "attn", "mlp" or "logits"
    layer: int


def senders(model: Model) -> tuple[Component, ...]:
    """Every sender: the token embedding, then each layer's heads (the ones it has) and MLP."""
    out = [Component(kind="embed")]
    for layer, n_heads in enumerate(heads_per_layer(model)):
        out += [Component(kind="head", layer=layer, head=h) for h in range(n_heads)]
        if has_mlp(model, layer):
            out.append(Component(kind="mlp", layer=layer))
    return tuple(out)


def _upstream(sender: Component, stage: _Stage) -> bool:
    if sender.kind == "embed" or stage.kind == "logits":
        return True
    if sender.kind == "head":
        return sender.layer < stage.layer or (sender.layer == stage.layer and stage.kind == "mlp")
    return sender.layer < stage.layer  # an MLP feeds the stages of later layers


def _stages(model: Model) -> tuple[_Stage, ...]:
    out = []
    for layer in range(model.cfg.n_layers):
        out.append(_Stage("attn", layer))
        if has_mlp(model, layer):
            out.append(_Stage("mlp", layer))
    return (*out, _Stage("logits", int(model.cfg.n_layers)))


def _receivers(model: Model, stage: _Stage) -> tuple[tuple[str, str, Optional[Component]], ...]:
    """(receiver name, input, the component whose hook holds that input) of one stage."""
    if stage.kind == "logits":
        return (("logits", "logits", None),)
    if stage.kind == "mlp":
        return ((f"L{stage.layer}.mlp", "mlp", Component(kind="mlp", layer=stage.layer)),)
    heads = range(heads_per_layer(model)[stage.layer])
    return tuple((f"L{stage.layer}H{h}", c, Component(kind=c, layer=stage.layer, head=h)) for h in heads
                 for c in ("q", "k", "v"))


def graph_edges(model: Model) -> tuple[EdgeKey, ...]:
    """Every edge of the model's graph, stage by stage (receivers in order, senders in order)."""
    out = []
    for stage in _stages(model):
        for receiver, inp, _ in _receivers(model, stage):
            out += [EdgeKey(s.name, receiver, inp) for s in senders(model) if _upstream(s, stage)]
    return tuple(out)


def sequence_losses(logits: Float[Tensor, "batch pos vocab"], tokens: Tokens) -> SequenceLoss:
    """Mean next-state log-loss of each sequence (nats, float64): what every effect here is measured in."""
    logp = torch.log_softmax(logits.double(), dim=-1)[:, :-1]
    nxt = tokens[:, 1:, None].to(logp.device)
    return -torch.gather(logp, 2, nxt)[..., 0].mean(1)


def _value_hooks(model: Model) -> list[str]:
    names = [embed_hook()]
    for layer in range(model.cfg.n_layers):
        names += [z_hook(layer)] + [channel_hook(layer, c) for c in "qkv"]
        names += [mlp_out_hook(layer)] if has_mlp(model, layer) else []
    return names


class EdgeRunner:
    """The clean and corrupted runs of one batch, and forward passes with any set of edges corrupted (module
    docstring). `run(corrupted)` returns the logits; `losses(corrupted)` each sequence's mean loss on the clean
    sequence's next states.

    >>> # runner = EdgeRunner(model, tokens, corrupted_tokens)
    >>> # runner.losses({EdgeKey("L0H0", "L1H0", "k")}) - runner.clean_losses  # that edge's path-patching effect
    """

    def __init__(self, model: Model, tokens: Tokens, corrupted_tokens: Tokens):
        if tokens.shape != corrupted_tokens.shape:
            raise ValueError(f"clean and corrupted tokens must have the same shape, got {tuple(tokens.shape)} and "
                             f"{tuple(corrupted_tokens.shape)}")
        self.model = model
        self.tokens = check_tokens(model, tokens)
        self.corrupted_tokens = check_tokens(model, corrupted_tokens)
        self.senders = senders(model)
        self.stages = _stages(model)
        self.edges = graph_edges(model)
        names = _value_hooks(model)
        with torch.no_grad():
            logits, clean = model.run_with_cache(self.tokens, names_filter=names)
            corrupted_logits, corrupted = model.run_with_cache(self.corrupted_tokens, names_filter=names)
        self.clean = {n: clean[n] for n in names}
        self.corrupted = {n: corrupted[n] for n in names}
        self.clean_logits, self.corrupted_logits = logits, corrupted_logits
        self.clean_losses = sequence_losses(logits, self.tokens)
        self.corrupted_losses = sequence_losses(corrupted_logits, self.tokens)

    def losses(self, corrupted: Iterable[EdgeKey]) -> SequenceLoss:
        """Each sequence's mean loss (nats) with the edges `corrupted` corrupted and all others kept."""
        return sequence_losses(self.run(corrupted), self.tokens)

    @torch.no_grad()
    def run(self, corrupted: Iterable[EdgeKey]) -> Float[Tensor, "batch pos vocab"]:
        """The logits with the edges `corrupted` corrupted together (module docstring)."""
        bad = set(corrupted)
        unknown = bad - set(self.edges)
        if unknown:
            raise ValueError(f"no such edges in this model's graph: {sorted(e.name for e in unknown)}")
        state: dict[str, Any] = {"embed": "clean"}  # sender -> "clean", "corrupt" or its tensor in this run
        for i, stage in enumerate(self.stages):
            if self._tail_kept(bad, i):
                return self._finish(state, None)
            pending = self._read_stage(stage, bad, state)
            if stage.kind == "logits":
                return pending
            if stage.kind == "mlp":
                state[f"L{stage.layer}.mlp"] = pending[f"L{stage.layer}.mlp.mlp"]
            elif self._tail_kept(bad, i + 1):  # the model's own pass does the rest from these head inputs
                return self._finish(state, (stage.layer, pending))
            else:
                state.update(self._head_outputs(stage.layer, pending))
        raise AssertionError("the logits stage always returns")

    # ------------------------------------------------------------------------------------------ stages
    def _tail_kept(self, bad: set[EdgeKey], first: int) -> bool:
        later = {r for stage in self.stages[first:] for r, _, _ in _receivers(self.model, stage)}
        return not any(e.receiver in later for e in bad)

    def _read_stage(self, stage: _Stage, bad: set[EdgeKey], state: dict) -> Any:
        """Every receiver input of `stage` ({"receiver.input": tensor, "clean" or "corrupt"}); for the logits
        stage, the logits."""
        ups = [s for s in self.senders if _upstream(s, stage)]
        groups: dict[tuple, tuple[tuple, list]] = {}
        values: dict[str, Any] = {}
        for receiver, inp, comp in _receivers(self.model, stage):
            choice = tuple("corrupt" if EdgeKey(s.name, receiver, inp) in bad else state[s.name] for s in ups)
            key = f"{receiver}.{inp}"
            if all(_is(c, "clean") for c in choice) or all(_is(c, "corrupt") for c in choice):
                values[key] = choice[0]
            else:
                sig = tuple(id(c) if isinstance(c, Tensor) else c for c in choice)
                groups.setdefault(sig, (choice, []))[1].append((key, comp))
        if stage.kind == "logits":
            if "logits.logits" in values:
                return self.clean_logits if values["logits.logits"] == "clean" else self.corrupted_logits
            ((choice, _),) = groups.values()
            comps, repl = self._sender_replacements(zip(ups, choice))
            return intervened_run(self.model, self.tokens, comps, repl)[0]
        for choice, members in groups.values():
            comps, repl = self._sender_replacements(zip(ups, choice))
            recorded = intervened_run(self.model, self.tokens, comps, repl,
                                      record=[comp.hook_name for _, comp in members])[1]
            for key, comp in members:
                act = recorded[comp.hook_name]
                values[key] = act[:, :, comp.head] if comp.head is not None else act
        return values

    def _value(self, name: str, spec: Any, head: Optional[int]) -> Tensor:
        """The activation a "clean" / "corrupt" / tensor spec stands for (a head's slice when `head` is set)."""
        if isinstance(spec, Tensor):
            return spec
        full = (self.clean if spec == "clean" else self.corrupted)[name]
        return full if head is None else full[:, :, head]

    def _sender_replacements(self, pairs: Iterable[tuple[Component, Any]]) -> tuple[list, dict]:
        """Components and replacement tensors setting each sender to its spec (heads of a layer share one
        tensor, each writing its own slice)."""
        comps, repl = [], {}
        for sender, spec in pairs:
            name = sender.hook_name
            if sender.kind == "head":
                full = repl.setdefault(name, self.clean[name].clone())
                full[:, :, sender.head] = self._value(name, spec, sender.head)
            else:
                repl[name] = self._value(name, spec, None)
            comps.append(sender)
        return comps, repl

    def _channel_replacements(self, layer: int, pending: dict) -> tuple[list, dict]:
        """Components and tensors setting the queries, keys and values of a layer's heads to `pending`."""
        comps, repl = [], {}
        for c in "qkv":
            name = channel_hook(layer, c)
            full = self.clean[name].clone()
            for h in range(heads_per_layer(self.model)[layer]):
                spec = pending[f"L{layer}H{h}.{c}"]
                if not _is(spec, "clean"):
                    full[:, :, h] = self._value(name, spec, h)
                    comps.append(Component(kind=c, layer=layer, head=h))
            repl[name] = full
        return comps, repl

    def _head_outputs(self, layer: int, pending: dict) -> dict[str, Any]:
        """Each head's output in this run from its inputs (one pass when some head's inputs are mixed)."""
        out, mixed = {}, []
        for h in range(heads_per_layer(self.model)[layer]):
            specs = [pending[f"L{layer}H{h}.{c}"] for c in "qkv"]
            if all(_is(s, "clean") for s in specs) or all(_is(s, "corrupt") for s in specs):
                out[f"L{layer}H{h}"] = specs[0]
            else:
                mixed.append(h)
        if mixed:
            comps, repl = self._channel_replacements(layer, pending)
            z = intervened_run(self.model, self.tokens, comps, repl, record=[z_hook(layer)])[1][z_hook(layer)]
            out.update({f"L{layer}H{h}": z[:, :, h] for h in mixed})
        return out

    def _finish(self, state: dict, heads: Optional[tuple[int, dict]]) -> Tensor:
        """The logits of one pass with every sender set to its value in this run and, with `heads` = (layer,
        inputs), that layer's head inputs set: the model computes everything downstream itself."""
        moved = [(s, state[s.name]) for s in self.senders if s.name in state and not _is(state[s.name], "clean")]
        if not moved and heads is None:
            return self.clean_logits
        comps, repl = self._sender_replacements(moved)
        if heads is not None:
            more, more_repl = self._channel_replacements(*heads)
            comps, repl = comps + more, {**repl, **more_repl}
        return intervened_run(self.model, self.tokens, comps, repl)[0]


def _is(spec: Any, word: str) -> bool:
    return isinstance(spec, str) and spec == word


# ------------------------------------------------------------------------------------- gradient estimate
def _attribution_hooks(model: Model, store: dict[str, Tensor]) -> list[tuple[str, Any]]:
    """Hooks recording, with their autograd graph, every value the attributions differentiate."""

    def keep(name: str, leaf: bool = False) -> tuple[str, Any]:
        def hook(act: Tensor, hook: Any = None) -> Tensor:
            if leaf:  # the graph starts here: no parameter gradient is needed
                act = act.detach().requires_grad_(True)
            store[name] = act
            return act

        return name, hook

    hooks = [keep(embed_hook(), leaf=True)]
    for layer in range(model.cfg.n_layers):
        hooks += [keep(resid_pre_hook(layer)), keep(z_hook(layer)), keep(attn_out_hook(layer))]
        hooks += [keep(channel_hook(layer, c)) for c in "qkv"]
        if has_mlp(model, layer):
            hooks += [keep(resid_mid_hook(layer)), keep(mlp_out_hook(layer))]
    hooks.append(keep(resid_post_hook(int(model.cfg.n_layers) - 1)))
    return hooks


def _input_gradients(model: Model, store: dict[str, Tensor], loss: Tensor) -> dict[tuple[str, str], Tensor]:
    """d loss / d (the residual stream as each receiver input reads it), [batch pos d_model] per input."""
    last = resid_post_hook(int(model.cfg.n_layers) - 1)
    outs = {(f"L{l}H{h}", c): (channel_hook(l, c), h) for l, n in enumerate(heads_per_layer(model))
            for h in range(n) for c in "qkv"}
    outs.update({(f"L{l}.mlp", "mlp"): (mlp_out_hook(l), None) for l in range(model.cfg.n_layers)
                 if has_mlp(model, l)})
    names = sorted({name for name, _ in outs.values()})
    grads = dict(zip(names, torch.autograd.grad(loss, [store[n] for n in names] + [store[last]],
                                                retain_graph=True)))
    grads[last] = torch.autograd.grad(loss, store[last], retain_graph=True)[0]
    out = {("logits", "logits"): grads[last]}
    for (receiver, inp), (name, head) in outs.items():
        layer = int(receiver[1:].split("H")[0].split(".")[0])
        resid = store[resid_mid_hook(layer) if inp == "mlp" else resid_pre_hook(layer)]
        value, grad = (store[name], grads[name]) if head is None else (store[name][:, :, head],
                                                                       grads[name][:, :, head])
        out[receiver, inp] = torch.autograd.grad(value, resid, grad_outputs=grad, retain_graph=True)[0]
    return out


def edge_attributions(runner: EdgeRunner) -> dict[EdgeKey, float]:
    """Edge attribution patching (Syed et al. 2023): for every edge, (corrupted - clean output of the sender) .
    (gradient of the mean loss with respect to the receiver's input, in the clean run), summed over the batch and
    positions: the first-order estimate of the edge's path-patching effect (nats) from one forward and backward
    pass. Where a receiver responds non-linearly (a softmax that switches keys) the estimate can be far off."""
    model, store = runner.model, {}
    with torch.enable_grad():
        logits = model.run_with_hooks(runner.tokens, fwd_hooks=_attribution_hooks(model, store))
        loss = sequence_losses(logits, runner.tokens).mean()
        grads = _input_gradients(model, store, loss)
        out = {}
        for edge in runner.edges:
            grad = grads[edge.receiver, edge.input]
            sender = Component.parse(edge.sender)
            name = sender.hook_name
            delta = (runner.corrupted[name] - runner.clean[name]).to(grad.dtype)
            if sender.kind == "head":  # a head writes z W_O: pull the gradient back through W_O
                back = torch.autograd.grad(store[attn_out_hook(sender.layer)], store[name], grad_outputs=grad,
                                           retain_graph=True)[0]
                out[edge] = float((delta[:, :, sender.head] * back[:, :, sender.head]).sum())
            else:
                out[edge] = float((delta * grad).sum())
    return out
