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

from markov_interp.models import HookedModel, heads_per_layer
from markov_interp.models.hooks import act_name
from markov_interp.probes._common import (
    Tokens,
    check_tokens,
    has_mlp,
    mlp_out_hook,
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


def senders(model: HookedModel) -> tuple[Component, ...]:
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


def _stages(model: HookedModel) -> tuple[_Stage, ...]:
    out = []
    for layer in range(model.cfg.n_layers):
        out.append(_Stage("attn", layer))
        if has_mlp(model, layer):
            out.append(_Stage("mlp", layer))
    return (*out, _Stage("logits", int(model.cfg.n_layers)))


def _receivers(model: HookedModel, stage: _Stage) -> tuple[tuple[str, str, Optional[Component]], ...]:
    """(receiver name, input, the component whose hook holds that input) of one stage."""
    if stage.kind == "logits":
        return (("logits", "logits", None),)
    if stage.kind == "mlp":
        return ((f"L{stage.layer}.mlp", "mlp", Component(kind="mlp", layer=stage.layer)),)
    heads = range(heads_per_layer(model)[stage.layer])
    return tuple((f"L{stage.layer}H{h}", c, Component(kind=c, layer=stage.layer, head=h)) for h in heads
                 for c in ("q", "k", "v"))


def graph_edges(model: HookedModel) -> tuple[EdgeKey, ...]:
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


def _value_hooks(model: HookedModel) -> list[str]:
    names = [act_name("embed")]
    for layer in range(model.cfg.n_layers):
        names += [z_hook(layer)] + [act_name(c, layer) for c in "qkv"]
        names += [mlp_out_hook(layer)] if has_mlp(model, layer) else []
    return names


class EdgeRunner:
    """The clean and corrupted runs of one batch, and forward passes with any sets of edges corrupted (module
    docstring). `run(corrupted)` returns the logits; `losses(corrupted)` each sequence's mean loss on the clean
    sequence's next states; `many_losses(sets)` does the same for many sets of edges at once, stacked along the
    batch (one pass of every step serves them all: the way every edge's effect is measured).

    >>> # runner = EdgeRunner(model, tokens, corrupted_tokens)
    >>> # runner.losses({EdgeKey("L0H0", "L1H0", "k")}) - runner.clean_losses  # that edge's path-patching effect
    """

    def __init__(self, model: HookedModel, tokens: Tokens, corrupted_tokens: Tokens, *, max_rows: int = 1 << 17):
        if tokens.shape != corrupted_tokens.shape:
            raise ValueError(f"clean and corrupted tokens must have the same shape, got {tuple(tokens.shape)} and "
                             f"{tuple(corrupted_tokens.shape)}")
        self.model = model
        self.tokens = check_tokens(model, tokens)
        self.corrupted_tokens = check_tokens(model, corrupted_tokens)
        self.senders = senders(model)
        self.stages = _stages(model)
        self.edges = graph_edges(model)
        self._chunk = max(1, max_rows // max(1, int(tokens.numel())))  # copies per pass (positions <= max_rows)
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
        return self.many_losses([corrupted])[0]

    def many_losses(self, sets: Sequence[Iterable[EdgeKey]]) -> Float[Tensor, "set batch"]:
        """`losses` of every set of corrupted edges in `sets`, [set, batch]."""
        logits = self.run_many(sets)
        return torch.stack([sequence_losses(x, self.tokens) for x in logits])

    def run(self, corrupted: Iterable[EdgeKey]) -> Float[Tensor, "batch pos vocab"]:
        """The logits with the edges `corrupted` corrupted together (module docstring)."""
        return self.run_many([corrupted])[0]

    @torch.no_grad()
    def run_many(self, sets: Sequence[Iterable[EdgeKey]]) -> Float[Tensor, "set batch pos vocab"]:
        """The logits of every set of corrupted edges, [set, batch, pos, vocab] (passes chunked by `max_rows`)."""
        bads = [set(s) for s in sets]
        unknown = set().union(*bads) - set(self.edges) if bads else set()
        if unknown:
            raise ValueError(f"no such edges in this model's graph: {sorted(e.name for e in unknown)}")
        out = [self._run_chunk(bads[i:i + self._chunk]) for i in range(0, len(bads), self._chunk)]
        return torch.cat(out) if out else torch.empty(0, *self.clean_logits.shape)

    # ------------------------------------------------------------------------------------------ stages
    def _run_chunk(self, bads: list[set[EdgeKey]]) -> Tensor:
        """The stage algorithm of the module docstring for several copies of the batch at once."""
        state: dict[str, list] = {"embed": ["clean"] * len(bads)}  # sender -> per copy: "clean", "corrupt", tensor
        for i, stage in enumerate(self.stages):
            if self._tail_kept(bads, i):
                return self._finish(state, None, len(bads))
            pending = self._read_stage(stage, bads, state)
            if stage.kind == "logits":
                return pending
            if stage.kind == "mlp":
                state[f"L{stage.layer}.mlp"] = pending[f"L{stage.layer}.mlp.mlp"]
            elif self._tail_kept(bads, i + 1):  # the model's own pass does the rest from these head inputs
                return self._finish(state, (stage.layer, pending), len(bads))
            else:
                state.update(self._head_outputs(stage.layer, pending, len(bads)))
        raise AssertionError("the logits stage always returns")

    def _tail_kept(self, bads: list[set[EdgeKey]], first: int) -> bool:
        later = {r for stage in self.stages[first:] for r, _, _ in _receivers(self.model, stage)}
        return not any(e.receiver in later for bad in bads for e in bad)

    def _read_stage(self, stage: _Stage, bads: list[set[EdgeKey]], state: dict) -> Any:
        """Every receiver input of `stage` ({"receiver.input": per copy, a tensor, "clean" or "corrupt"}); for
        the logits stage, the logits [copy, batch, pos, vocab]."""
        ups = [s for s in self.senders if _upstream(s, stage)]
        receivers = _receivers(self.model, stage)
        values = {f"{r}.{i}": [None] * len(bads) for r, i, _ in receivers}
        groups: list[list[tuple[tuple, list]]] = []  # per copy: (choice, members) of each pass it needs
        for c, bad in enumerate(bads):
            mine: dict[tuple, tuple[tuple, list]] = {}
            for receiver, inp, comp in receivers:
                choice = tuple("corrupt" if EdgeKey(s.name, receiver, inp) in bad else state[s.name][c] for s in ups)
                key = f"{receiver}.{inp}"
                if all(_is(x, "clean") for x in choice) or all(_is(x, "corrupt") for x in choice):
                    values[key][c] = choice[0]
                else:
                    sig = tuple(id(x) if isinstance(x, Tensor) else x for x in choice)
                    mine.setdefault(sig, (choice, []))[1].append((key, comp))
            groups.append(list(mine.values()))
        for j in range(max((len(g) for g in groups), default=0)):
            choices = [g[j][0] if j < len(g) else ("clean",) * len(ups) for g in groups]
            comps, repl = self._sender_replacements(ups, choices)
            record = sorted({comp.hook_name for g in groups if j < len(g) for _, comp in g[j][1] if comp is not None})
            logits, recorded = intervened_run(self.model, self._tiled(len(bads)), comps, repl, record=record)
            for c, g in enumerate(groups):
                for key, comp in (g[j][1] if j < len(g) else []):
                    values[key][c] = logits.unflatten(0, (len(bads), -1))[c] if comp is None else self._block(
                        recorded[comp.hook_name], c, len(bads), comp.head)
        if stage.kind == "logits":
            return torch.stack([self._logits(v) for v in values["logits.logits"]])
        return values

    def _logits(self, spec: Any) -> Tensor:
        return spec if isinstance(spec, Tensor) else (self.clean_logits if spec == "clean" else self.corrupted_logits)

    def _tiled(self, copies: int) -> Tokens:
        return self.tokens.repeat(copies, 1)

    @staticmethod
    def _block(act: Tensor, copy: int, copies: int, head: Optional[int]) -> Tensor:
        block = act.unflatten(0, (copies, -1))[copy]
        return block if head is None else block[:, :, head]

    def _value(self, name: str, spec: Any, head: Optional[int]) -> Tensor:
        """The activation a "clean" / "corrupt" / tensor spec stands for (a head's slice when `head` is set)."""
        if isinstance(spec, Tensor):
            return spec
        full = (self.clean if spec == "clean" else self.corrupted)[name]
        return full if head is None else full[:, :, head]

    def _sender_replacements(self, ups: Sequence[Component], choices: Sequence[Sequence[Any]]) -> tuple[list, dict]:
        """Components and [copy x batch, ...] tensors setting every sender of `ups` to its per-copy spec."""
        repl: dict[str, Tensor] = {}
        for i, sender in enumerate(ups):
            name = sender.hook_name
            if sender.kind == "head":
                full = repl.setdefault(name, self.clean[name].repeat(len(choices), *[1] * (self.clean[name].ndim - 1)))
                blocks = full.unflatten(0, (len(choices), -1))
                for c, choice in enumerate(choices):
                    blocks[c, :, :, sender.head] = self._value(name, choice[i], sender.head)
            else:
                repl[name] = torch.cat([self._value(name, choice[i], None) for choice in choices])
        return list(ups), repl

    def _channel_replacements(self, layer: int, pending: dict, copies: int) -> tuple[list, dict]:
        """Components and tensors setting the queries, keys and values of a layer's heads to `pending`."""
        comps, repl = [], {}
        for c in "qkv":
            name = act_name(c, layer)
            full = self.clean[name].repeat(copies, *[1] * (self.clean[name].ndim - 1))
            blocks = full.unflatten(0, (copies, -1))
            for h in range(heads_per_layer(self.model)[layer]):
                specs = pending[f"L{layer}H{h}.{c}"]
                for k, spec in enumerate(specs):
                    if not _is(spec, "clean"):
                        blocks[k, :, :, h] = self._value(name, spec, h)
                comps.append(Component(kind=c, layer=layer, head=h))
            repl[name] = full
        return comps, repl

    def _head_outputs(self, layer: int, pending: dict, copies: int) -> dict[str, list]:
        """Each head's output in this run from its inputs (one pass when some head's inputs are mixed)."""
        heads = range(heads_per_layer(self.model)[layer])
        out = {f"L{layer}H{h}": [None] * copies for h in heads}
        mixed = []
        for h in heads:
            for k in range(copies):
                specs = [pending[f"L{layer}H{h}.{c}"][k] for c in "qkv"]
                if all(_is(x, "clean") for x in specs) or all(_is(x, "corrupt") for x in specs):
                    out[f"L{layer}H{h}"][k] = specs[0]
                else:
                    mixed.append((h, k))
        if mixed:
            comps, repl = self._channel_replacements(layer, pending, copies)
            z = intervened_run(self.model, self._tiled(copies), comps, repl, record=[z_hook(layer)])[1][z_hook(layer)]
            for h, k in mixed:
                out[f"L{layer}H{h}"][k] = self._block(z, k, copies, h)
        return out

    def _finish(self, state: dict, heads: Optional[tuple[int, dict]], copies: int) -> Tensor:
        """The logits of one pass with every sender of the stages done set to its value in this run and, with
        `heads` = (layer, inputs), that layer's head inputs set: the model computes everything downstream itself.
        (A sender still at its clean value has only clean senders upstream, so setting it changes nothing.)"""
        done = [s for s in self.senders if s.name in state]
        if heads is None and all(_is(x, "clean") for s in done for x in state[s.name]):
            return self.clean_logits.expand(copies, *self.clean_logits.shape)
        choices = [tuple(state[s.name][k] for s in done) for k in range(copies)]
        comps, repl = self._sender_replacements(done, choices)
        if heads is not None:
            more, more_repl = self._channel_replacements(*heads, copies)
            comps, repl = comps + more, {**repl, **more_repl}
        logits = intervened_run(self.model, self._tiled(copies), comps, repl)[0]
        return logits.unflatten(0, (copies, -1))


def _is(spec: Any, word: str) -> bool:
    return isinstance(spec, str) and spec == word


# ------------------------------------------------------------------------------------- gradient estimate
def _attribution_hooks(model: HookedModel, store: dict[str, Tensor]) -> list[tuple[str, Any]]:
    """Hooks recording, with their autograd graph, every value the attributions differentiate."""

    def keep(name: str, leaf: bool = False) -> tuple[str, Any]:
        def hook(act: Tensor, hook: Any = None) -> Tensor:
            if leaf:  # the graph starts here: no parameter gradient is needed
                act = act.detach().requires_grad_(True)
            store[name] = act
            return act

        return name, hook

    hooks = [keep(act_name("embed"), leaf=True)]
    for layer in range(model.cfg.n_layers):
        hooks += [keep(act_name("resid_pre", layer))]
        hooks += [keep(act_name(c, layer)) for c in "qkv"]
        if has_mlp(model, layer):
            hooks += [keep(act_name("resid_mid", layer)), keep(mlp_out_hook(layer))]
    hooks.append(keep(act_name("resid_post", int(model.cfg.n_layers) - 1)))
    return hooks


def _input_gradients(model: HookedModel, store: dict[str, Tensor], loss: Tensor) -> dict[tuple[str, str], Tensor]:
    """d loss / d (the residual stream as each receiver input reads it), [batch pos d_model] per input: one
    backward pass per layer and input kind, batched over the layer's heads (`is_grads_batched`)."""
    last = act_name("resid_post", int(model.cfg.n_layers) - 1)
    layers = range(int(model.cfg.n_layers))
    heads = heads_per_layer(model)
    names = [act_name(c, l) for l in layers for c in "qkv"] + [mlp_out_hook(l) for l in layers if has_mlp(model, l)]
    # an input the loss does not read (q and k under a clamped pattern, `intervene.applied`) has gradient zero
    grads = dict(zip(names + [last], torch.autograd.grad(loss, [store[n] for n in names + [last]], retain_graph=True,
                                                         allow_unused=True, materialize_grads=True)))
    out = {("logits", "logits"): grads[last]}
    for layer in layers:
        for c in "qkv":
            name, n = act_name(c, layer), heads[layer]
            per_head = grads[name].new_zeros(n, *grads[name].shape)
            for h in range(n):
                per_head[h, :, :, h] = grads[name][:, :, h]
            back = torch.autograd.grad(store[name], store[act_name("resid_pre", layer)], grad_outputs=per_head,
                                       retain_graph=True, is_grads_batched=True)[0]
            out.update({(f"L{layer}H{h}", c): back[h] for h in range(n)})
        if has_mlp(model, layer):
            name = mlp_out_hook(layer)
            out[f"L{layer}.mlp", "mlp"] = torch.autograd.grad(store[name], store[act_name("resid_mid", layer)],
                                                             grad_outputs=grads[name], retain_graph=True)[0]
    return out


def edge_attributions(runner: EdgeRunner) -> dict[EdgeKey, float]:
    """Edge attribution patching (Syed et al. 2023): for every edge, (corrupted - clean output of the sender) .
    (gradient of the mean loss with respect to the receiver's input, in the clean run), summed over the batch and
    positions: the first-order estimate of the edge's path-patching effect (nats) from one forward and backward
    pass. Where a receiver responds non-linearly (a softmax that switches keys) the estimate can be far off."""
    model, store = runner.model, {}
    w_o = model.W_O.detach()  # [layer, head, d_head, d_model]: a head writes z W_O
    with torch.enable_grad():
        logits = model.run_with_hooks(runner.tokens, fwd_hooks=_attribution_hooks(model, store))
        loss = sequence_losses(logits, runner.tokens).mean()
        grads = _input_gradients(model, store, loss)
    out = {}
    for edge in runner.edges:
        grad = grads[edge.receiver, edge.input].detach()
        sender = Component.parse(edge.sender)
        name = sender.hook_name
        delta = (runner.corrupted[name] - runner.clean[name]).to(grad.dtype)
        if sender.kind == "head":
            delta = delta[:, :, sender.head] @ w_o[sender.layer, sender.head].to(grad.dtype)
        out[edge] = float((delta * grad).sum())
    return out
