"""Path patching of edges: run the model with any set of sender -> receiver-input edges corrupted.

The computational graph of a transformer read as a circuit (Conmy et al. 2023, ACDC; Wang et al. 2022, path
patching): **senders** write into the residual stream ("embed" = the token embedding, "pos" = the position
embedding, every head "L{l}H{h}", every MLP "L{l}.mlp"); **receivers** read it through an input: a head through
its queries, keys or values ("q", "k", "v": each head input is projected from the residual stream on its own), an
MLP through its input ("mlp"), the unembedding ("logits"). An edge is (sender, receiver, input) for every sender
upstream of the receiver (heads read the senders of earlier layers, an MLP also the heads of its own layer).

**Corrupting an edge** replaces, in what that receiver input reads, the sender's output by its value in the
corrupted run; every other input reads what it reads in this run. The corrupted run is the model on other tokens
(`corrupted_tokens`: the token pass) and/or with the position embedding of other positions (`corrupted_positions`:
the positional pass, where a head that computes positions changes its output and so shows its edges; under token
corruptions alone its output never changes). `EdgeRunner.run(corrupted)` runs the model with a set of edges
corrupted at once (all of them: the corrupted run; none: the clean run), stage by stage (the attention of layer
0, its MLP, the attention of layer 1, ..., the logits):

1. a receiver input whose senders all hold their clean values and whose edges are all kept reads its clean value;
   one whose edges are all corrupted, or whose kept senders already hold their corrupted values, reads its
   corrupted value (a sender that is the same in both runs, e.g. the positions in the token pass, counts as
   either); any other reads the residual stream made of its own choice of sender values, recorded in a pass that
   stops once it is read (inputs with the same choice share one);
2. a head whose inputs are not all clean (or all corrupted) gets its output from one more pass with its queries,
   keys and values set to the recorded ones;
3. once every edge into the remaining stages is kept, one last pass with the senders' outputs so far set to what
   they are in this run gives the logits (the model's own forward does the rest).

Where the residual stream is the sum of what its senders write (`single_pass`: every standard TransformerLens
model; not a shortformer position embedding or parallel attention and MLP), a stage's pass **starts at the stage's
block** (`models.forward_from`) from the clean run's residual stream moved by what the chosen senders write
differently (a head's change through its W_O): the blocks upstream are not run again, so a stage costs about one
block, not all the blocks before it. Otherwise every pass runs from the tokens with the senders' outputs set.

A **single edge** (what every edge's effect is) takes one pass (`single_pass`, on by default): the residual stream of
that copy of the batch is moved by the sender's change (corrupted - clean output, as written into the stream) where
the receiver's sublayer reads it, the other inputs of that sublayer are set back to their clean values, and the
change is taken out again with the sublayer's output, so everything downstream reads the clean senders and the
receiver's new output; the pass starts at the receiver's block. The tests check both ways against passes run from
the tokens and against a forward written by hand. Moving the stream and taking the change out again rounds: an edge
that changes nothing (a query edge under a clamped pattern) measures rounding (under 1e-9 nats in the tests), not
exactly 0. Passes stack `max_rows` positions at most (4,096: larger stacks ran slower per copy on CPU,
benchmarks/bench_classify.py).

Everything runs through the one intervention engine (`interventions`); nothing here re-implements the model's
layers. `edge_attributions` is the gradient approximation (edge attribution patching, Syed et al. 2023):
(corrupted - clean sender output) . (gradient of the loss with respect to the receiver's input in the clean run),
from one forward and backward pass; with `steps` > 1 the gradient is averaged along the straight line from the
clean to the corrupted sender outputs (integrated gradients, as EAP-IG, Hanna et al. 2024).
"""

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Optional

import torch
from jaxtyping import Float
from torch import Tensor

from markov_interp.config import check_int
from markov_interp.models import HookedModel, first_norm, heads_per_layer
from markov_interp.models.hooks import act_name, pattern_hook
from markov_interp.probes._common import (
    Tokens,
    check_tokens,
    has_mlp,
    mlp_out_hook,
    z_hook,
)
from markov_interp.probes.interventions import Component, intervened_run

__all__ = ["EdgeKey", "EdgeRunner", "edge_attributions", "edge_estimates", "graph_edges"]

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

    @classmethod
    def parse(cls, name: str) -> "EdgeKey":
        """The edge called `name` ("L0H1->L1H0.k", "embed->L0.mlp", "L1H0->logits").

        >>> EdgeKey.parse("L0H1->L1H0.k"), EdgeKey.parse("L0H0->L0.mlp").input
        (EdgeKey(sender='L0H1', receiver='L1H0', input='k'), 'mlp')
        """
        sender, arrow, rest = name.partition("->") if isinstance(name, str) else ("", "", "")
        receiver, _, channel = rest.partition(".")
        if not arrow or not sender or not receiver:
            raise ValueError(f"an edge name looks like 'L0H1->L1H0.k', 'embed->L0.mlp' or 'L1H0->logits', got {name!r}")
        if receiver.startswith("L") and channel == "mlp":  # "L0.mlp": the receiver is the MLP, its input "mlp"
            return cls(sender, f"{receiver}.mlp", "mlp")
        return cls(sender, receiver, channel or "logits")


@dataclasses.dataclass(frozen=True)
class _Stage:
    kind: str  # "attn", "mlp" or "logits"
    layer: int


def senders(model: HookedModel) -> tuple[Component, ...]:
    """Every sender: the token embedding, the position embedding (when the model has one), then each layer's heads
    (the ones it has) and MLP."""
    out = [Component(kind="embed")]
    if act_name("pos_embed") in model.hook_dict:
        out.append(Component(kind="pos"))
    for layer, n_heads in enumerate(heads_per_layer(model)):
        out += [Component(kind="head", layer=layer, head=h) for h in range(n_heads)]
        if has_mlp(model, layer):
            out.append(Component(kind="mlp", layer=layer))
    return tuple(out)


def _upstream(sender: Component, stage: _Stage) -> bool:
    if sender.kind in ("embed", "pos") or stage.kind == "logits":
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
    out, all_senders = [], senders(model)
    for stage in _stages(model):
        ups = [s.name for s in all_senders if _upstream(s, stage)]
        for receiver, inp, _ in _receivers(model, stage):
            out += [EdgeKey(s, receiver, inp) for s in ups]
    return tuple(out)


def sequence_losses(logits: Float[Tensor, "batch pos vocab"], tokens: Tokens) -> SequenceLoss:
    """Mean next-state log-loss of each sequence (nats, float64): what every effect here is measured in."""
    logp = torch.log_softmax(logits.double(), dim=-1)[:, :-1]
    nxt = tokens[:, 1:, None].to(logp.device)
    return -torch.gather(logp, 2, nxt)[..., 0].mean(1)


def _peak(store: dict[int, Tensor], layer: int) -> Any:
    """A hook on a layer's attention pattern keeping each head's mean largest weight (queries after the first)."""
    def hook(pattern: Tensor, hook: Any = None) -> Tensor:
        store[layer] = pattern[:, :, 1:].max(-1).values.mean((0, 2))
        return pattern

    return hook


def _value_hooks(model: HookedModel) -> list[str]:
    names = [s.hook_name for s in senders(model) if s.kind in ("embed", "pos")]
    for layer in range(model.cfg.n_layers):
        names += [z_hook(layer)] + [act_name(c, layer) for c in "qkv"]
        names += [mlp_out_hook(layer)] if has_mlp(model, layer) else []
    return names


class EdgeRunner:
    """The clean and corrupted runs of one batch, and forward passes with any sets of edges corrupted (module
    docstring). `run(corrupted)` returns the logits; `losses(corrupted)` each sequence's mean loss on the clean
    sequence's next states; `many_losses(sets)` does the same for many sets of edges at once, stacked along the
    batch (one pass of every step serves them all: the way every edge's effect is measured).

    The corrupted run reads `corrupted_tokens` (default: the clean tokens) at the positions `corrupted_positions`
    ([batch, pos] indices into the position embedding; default: each position its own), so a runner corrupts the
    tokens, the positions, or both. `varies(sender)` says whether a sender's output differs between the two runs
    (an edge out of a sender that does not vary has no effect, exactly). `single_pass=False` runs every pass from the
    tokens with the senders' outputs set, single edges by the stage algorithm too (module docstring: the reference
    the tests compare the faster passes with).

    >>> runner = EdgeRunner(model, tokens, corrupted_tokens)
    >>> effect = runner.losses({EdgeKey("L0H0", "L1H0", "k")}) - runner.clean_losses  # that edge's path-patching effect
    >>> bool(effect.mean() > 0.1)  # the induction head's keys need the previous-token head
    True
    """

    def __init__(self, model: HookedModel, tokens: Tokens, corrupted_tokens: Optional[Tokens] = None, *,
                 corrupted_positions: Optional[Tensor] = None, max_rows: int = 1 << 12, single_pass: bool = True):
        corrupted_tokens = tokens if corrupted_tokens is None else corrupted_tokens
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
        streams = [act_name("resid_pre", layer) for layer in range(int(model.cfg.n_layers))]
        peaks: dict[int, Tensor] = {}
        with torch.no_grad():
            logits, clean = intervened_run(model, self.tokens, [], {}, record=names + streams, edits=[
                (pattern_hook(layer), _peak(peaks, layer)) for layer in range(int(model.cfg.n_layers))])
            self.clean = {n: clean[n] for n in names}
            self._streams = [clean[n] for n in streams]  # where a single edge's pass starts (`_single_edges`)
            corrupted_logits, self.corrupted = self._corrupted_run(names, corrupted_positions)
        # [layer, head]: each head's largest attention weight, averaged over the clean batch's queries after the
        # first (which has one key only): where the softmax saturates, gradients through queries and keys vanish
        self.attention_peak = torch.stack([peaks[layer] for layer in range(int(model.cfg.n_layers))])
        self.clean_logits, self.corrupted_logits = logits, corrupted_logits
        self.clean_losses = sequence_losses(logits, self.tokens)
        self.corrupted_losses = sequence_losses(corrupted_logits, self.tokens)
        self._same = {s.name for s in self.senders if torch.equal(self.clean[s.hook_name], self.corrupted[s.hook_name])}
        self._by_name = {s.name: s for s in self.senders}
        self._stage_of = {r: i for i, stage in enumerate(self.stages) for r, _, _ in _receivers(model, stage)}
        self.single_pass = single_pass and additive(model)
        self._deltas: dict[str, Tensor] = {}  # sender -> its corrupted - clean output as written (`_change`)

    def _corrupted_run(self, names: list[str], positions: Optional[Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """The logits and value hooks of the corrupted run (the corrupted tokens at the corrupted positions)."""
        if positions is None:
            logits, cache = self.model.run_with_cache(self.corrupted_tokens, names_filter=names)
            return logits, {n: cache[n] for n in names}
        pos = Component(kind="pos")
        if pos.hook_name not in self.clean:
            raise ValueError("corrupted_positions needs a model with a position embedding (hook_pos_embed)")
        positions = positions.to(self.tokens.device, torch.long)
        if positions.shape != self.tokens.shape or int(positions.min()) < 0 or int(positions.max()) >= int(
                self.model.cfg.n_ctx):
            raise ValueError(f"corrupted_positions must be indices in 0..n_ctx-1 of shape {tuple(self.tokens.shape)}")
        moved = self.model.W_pos.detach()[positions].to(self.clean[pos.hook_name].dtype)  # other positions' embedding
        logits, recorded = intervened_run(self.model, self.corrupted_tokens, [pos], {pos.hook_name: moved},
                                          record=[n for n in names if n != pos.hook_name])
        return logits, {**recorded, pos.hook_name: moved}

    def varies(self, sender: str) -> bool:
        """Whether `sender`'s output differs between the clean and the corrupted run."""
        return sender not in self._same

    def losses(self, corrupted: Iterable[EdgeKey]) -> SequenceLoss:
        """Each sequence's mean loss (nats) with the edges `corrupted` corrupted and all others kept."""
        return self.many_losses([corrupted])[0]

    def many_losses(self, sets: Sequence[Iterable[EdgeKey]], *, progress: Any = None) -> Float[Tensor, "set batch"]:
        """`losses` of every set of corrupted edges in `sets`, [set, batch] (`progress`: a tqdm bar to advance)."""
        logits = self.run_many(sets, progress=progress)
        return torch.stack([sequence_losses(x, self.tokens) for x in logits]) if len(logits) else logits.new_zeros(
            0, self.tokens.shape[0], dtype=torch.float64)

    def run(self, corrupted: Iterable[EdgeKey]) -> Float[Tensor, "batch pos vocab"]:
        """The logits with the edges `corrupted` corrupted together (module docstring)."""
        return self.run_many([corrupted])[0]

    @torch.no_grad()
    def run_many(self, sets: Sequence[Iterable[EdgeKey]], *, progress: Any = None) -> Float[Tensor,
                                                                                            "set batch pos vocab"]:
        """The logits of every set of corrupted edges, [set, batch, pos, vocab] (passes chunked by `max_rows`);
        `progress` (a tqdm bar) is advanced by the sets done."""
        bads = [set(s) for s in sets]
        unknown = set().union(*bads) - set(self.edges) if bads else set()
        if unknown:
            raise ValueError(f"no such edges in this model's graph: {sorted(e.name for e in unknown)}")
        if progress is not None and progress.n + len(bads) > (progress.total or 0):  # more runs than planned
            progress.total = progress.n + len(bads)
            progress.refresh()
        # single edges whose sender varies take the one-pass way (`_single_edges`); the rest the stage algorithm
        single = [i for i, bad in enumerate(bads) if self.single_pass and len(bad) == 1
                  and self.varies(next(iter(bad)).sender)]
        single.sort(key=lambda i: self._start_layer(next(iter(bads[i]))))  # a pass starts at its first receiver
        general = sorted(set(range(len(bads))) - set(single))
        out = torch.empty(len(bads), *self.clean_logits.shape, dtype=self.clean_logits.dtype,
                          device=self.clean_logits.device)
        for indices, run in ((single, lambda chunk: self._single_edges([next(iter(b)) for b in chunk])[0]),
                             (general, self._run_chunk)):
            for i in range(0, len(indices), self._chunk):
                part = indices[i:i + self._chunk]
                out[part] = run([bads[k] for k in part]).to(out.dtype)
                if progress is not None:
                    progress.update(len(part))
        return out

    # ------------------------------------------------------------------------------------- one edge, one pass
    def patched(self, edges: Sequence[EdgeKey], values: Sequence[Tensor], *, record: Sequence[str] = ()
                ) -> tuple[Float[Tensor, "copy batch pos vocab"], dict[str, Tensor]]:
        """The logits with each of `edges` patched alone, its sender's output replaced by `values[c]` (a head's slice
        of hook_z [batch, pos, d_head], or the whole output of an MLP or embedding) where that edge's receiver reads
        it: one copy of the batch per edge, in the one-pass way of the single edges (`_single_edges`), and each
        hook of `record` as that pass computed it ({hook: [copy, batch, ...]}). What an edge carries is measured
        this way (`edge_content`: interchange interventions, the sender's output taken from other sequences).

        Args:
            edges: single edges of this runner's graph (into a head's q, k or v, an MLP, or the logits).
            values: per edge, the sender's output to patch in.
            record: hook names to return (e.g. a receiver layer's attention pattern).

        Returns:
            (logits [copy, batch, pos, vocab], {hook name: [copy, batch, ...]}).
        """
        if not self.single_pass:
            raise ValueError("patching one edge with given values needs a residual stream that is the sum of its "
                             "senders' writes (no shortformer position embedding, no parallel attention and MLP)")
        unknown = sorted(e.name for e in edges if e not in set(self.edges))
        if unknown or len(values) != len(edges):
            raise ValueError(f"one value per edge of this model's graph, got {len(values)} values for {len(edges)} "
                             f"edges (unknown: {unknown})")
        logits, recorded = [], {name: [] for name in record}
        for i in range(0, len(edges), self._chunk):
            out, seen = self._single_edges(list(edges[i:i + self._chunk]), values[i:i + self._chunk], record)
            logits.append(out)
            for name in record:
                recorded[name].append(seen[name].unflatten(0, (out.shape[0], -1)))
        return torch.cat(logits), {name: torch.cat(parts) for name, parts in recorded.items()}

    def _single_edges(self, edges: list[EdgeKey], values: Optional[Sequence[Tensor]] = None,
                      record: Sequence[str] = ()) -> tuple[Tensor, dict[str, Tensor]]:
        """The logits with each of `edges` corrupted alone, one copy of the batch each, all in one forward pass:
        copy c's residual stream is moved by its sender's change (corrupted - clean output, as written into the
        stream; with `values`, values[c] - clean output) where its receiver reads it, every other input of that
        sublayer is set back to its clean value, and the change is taken out again after the sublayer, so that
        everything downstream reads the clean senders and the receiver's new output. Exact where the residual
        stream is the sum of what its senders write (`single_pass`); the stage algorithm gives the same logits with
        two to three passes per edge. Returns (logits [copy, batch, pos, vocab], the hooks of `record`)."""
        n_layers = int(self.model.cfg.n_layers)
        edits: dict[str, list[tuple[int, str, Any]]] = {}  # hook name -> (copy, "add" | "clean", payload)
        for c, e in enumerate(edges):
            delta = self._change(e.sender, "corrupt" if values is None else values[c])
            if e.input == "logits":
                edits.setdefault(act_name("resid_post", n_layers - 1), []).append((c, "add", delta))
                continue
            receiver = Component.parse(e.receiver)
            # moved where the sublayer reads the stream, taken out with its output (hooks on the residual path
            # in every TransformerLens: TL 4's hook_resid_mid is the MLP's input only)
            if e.input == "mlp":
                into, after = act_name("attn_out", receiver.layer), act_name("mlp_out", receiver.layer)
            else:
                into, after = act_name("resid_pre", receiver.layer), act_name("attn_out", receiver.layer)
                for ch in "qkv":  # only the receiver's own input reads the moved stream
                    edits.setdefault(act_name(ch, receiver.layer), []).append(
                        (c, "clean", receiver.head if ch == e.input else None))
            edits.setdefault(into, []).append((c, "add", delta))
            edits.setdefault(after, []).append((c, "add", -delta))
        hooks = [(name, self._edit(name, items, len(edges))) for name, items in edits.items()]
        first = min(self._start_layer(e) for e in edges)  # nothing before the first receiver's layer changes
        logits, seen = intervened_run(self.model, self._tiled(len(edges)), [], {}, edits=hooks, record=record,
                                      start=(first, self._clean_stream(first, len(edges))))
        return logits.unflatten(0, (len(edges), -1)), seen

    def _start_layer(self, edge: EdgeKey) -> int:
        """The block a single edge's pass starts at: its receiver's (the last block for the logits, whose edit is
        on that block's output)."""
        return len(self._streams) - 1 if edge.input == "logits" else int(Component.parse(edge.receiver).layer)

    def _edit(self, name: str, items: list[tuple[int, str, Any]], copies: int) -> Any:
        """A hook applying `items` to the copies of one activation: add a tensor, or set the clean value back
        (but for one head's slice, which keeps what this pass computed)."""
        def hook(act: Tensor, hook: Any = None) -> Tensor:
            out = act.clone()
            blocks = out.unflatten(0, (copies, -1))
            for c, kind, payload in items:
                if kind == "add":
                    blocks[c] += payload.to(out.dtype)
                    continue
                own = None if payload is None else blocks[c, :, :, payload].clone()
                blocks[c] = self.clean[name]
                if own is not None:
                    blocks[c, :, :, payload] = own
            return out

        return hook

    # ------------------------------------------------------------------------------------------ stages
    def _run_chunk(self, bads: list[set[EdgeKey]]) -> Tensor:
        """The stage algorithm of the module docstring for several copies of the batch at once."""
        # sender -> per copy: "clean", "corrupt" or a tensor; the embeddings start clean
        state: dict[str, list] = {s.name: ["clean"] * len(bads) for s in self.senders if s.kind in ("embed", "pos")}
        into: list[dict[tuple[str, str], set[str]]] = [{} for _ in bads]  # (receiver, input) -> corrupted senders
        for mine, bad in zip(into, bads):
            for e in bad:
                mine.setdefault((e.receiver, e.input), set()).add(e.sender)
        last = max((self._stage_of[r] for mine in into for r, _ in mine), default=-1)  # the last stage with a cut
        for i, stage in enumerate(self.stages):
            if i > last:  # every edge into the remaining stages is kept
                return self._finish(state, None, len(bads), stage)
            pending = self._read_stage(stage, into, state)
            if stage.kind == "logits":
                return pending
            if stage.kind == "mlp":
                state[f"L{stage.layer}.mlp"] = pending[f"L{stage.layer}.mlp.mlp"]
            elif i + 1 > last:  # the model's own pass does the rest from these head inputs
                return self._finish(state, (stage.layer, pending), len(bads), stage)
            else:
                state.update(self._head_outputs(stage.layer, pending, len(bads)))
        raise AssertionError("the logits stage always returns")

    def _read_stage(self, stage: _Stage, into: list[dict[tuple[str, str], set[str]]], state: dict) -> Any:
        """Every receiver input of `stage` ({"receiver.input": per copy, a tensor, "clean" or "corrupt"}; `into`:
        per copy, the corrupted senders of each receiver input); for the logits stage, the logits [copy, batch, pos,
        vocab]."""
        ups = [s for s in self.senders if _upstream(s, stage)]
        receivers = _receivers(self.model, stage)
        values = {f"{r}.{i}": [None] * len(into) for r, i, _ in receivers}
        groups: list[list[tuple[tuple, list]]] = []  # per copy: (choice, members) of each pass it needs
        index = {s.name: i for i, s in enumerate(ups)}
        moving = [i for i, s in enumerate(ups) if s.name not in self._same]  # what `_whole` reads
        for c, cuts in enumerate(into):
            mine: dict[tuple, tuple[tuple, list]] = {}
            base = tuple(state[s.name][c] for s in ups)  # the senders' values in this copy; a receiver's cut on top
            plain = (base, _whole([base[i] for i in moving]), _signature(base))
            for receiver, inp, comp in receivers:
                cut = cuts.get((receiver, inp))
                choice, whole, sig = plain if not cut else self._cut(base, [index[x] for x in cut], moving)
                if whole is not None:
                    values[f"{receiver}.{inp}"][c] = whole
                else:
                    mine.setdefault(sig, (choice, []))[1].append((f"{receiver}.{inp}", comp))
            groups.append(list(mine.values()))
        rows = [(c, choice, reads) for c, g in enumerate(groups) for choice, reads in g]  # one copy each
        for i in range(0, len(rows), self._chunk):
            part = rows[i:i + self._chunk]
            record = sorted({comp.hook_name for _, _, reads in part for _, comp in reads if comp is not None})
            logits, recorded = self._sender_pass(stage, ups, [choice for _, choice, _ in part], record=record,
                                                 stop=stage.kind != "logits")
            for m, (c, _, reads) in enumerate(part):
                for key, comp in reads:
                    values[key][c] = logits.unflatten(0, (len(part), -1))[m] if comp is None else self._block(
                        recorded[comp.hook_name], m, len(part), comp.head)
        if stage.kind == "logits":
            return torch.stack([self._logits(v) for v in values["logits.logits"]])
        return values

    @staticmethod
    def _cut(base: tuple, corrupted: list[int], moving: list[int]) -> tuple[tuple, Optional[str], tuple]:
        """A receiver input's choice: `base` with the senders at `corrupted` corrupted; with `_whole` of its
        senders that vary and its signature (inputs with the same one share a pass)."""
        choice = list(base)
        for i in corrupted:
            choice[i] = "corrupt"
        return tuple(choice), _whole([choice[i] for i in moving]), _signature(choice)

    def _logits(self, spec: Any) -> Tensor:
        return spec if isinstance(spec, Tensor) else (self.clean_logits if spec == "clean" else self.corrupted_logits)

    def _tiled(self, copies: int) -> Tokens:
        return self.tokens.repeat(copies, 1)

    def _clean_stream(self, layer: int, copies: int) -> Tensor:
        """The clean run's residual stream entering block `layer`, for `copies` copies of the batch."""
        return self._streams[layer].repeat(copies, 1, 1)

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

    def _sender_pass(self, stage: _Stage, ups: Sequence[Component], choices: Sequence[Sequence[Any]], *,
                     comps: Sequence[Component] = (), repl: Optional[dict] = None, record: Sequence[str] = (),
                     stop: bool = False) -> tuple[Optional[Tensor], dict[str, Tensor]]:
        """One pass of len(`choices`) copies of the batch with each sender of `ups` (upstream of `stage`) set to
        the copy's spec and `comps` replaced by `repl` (`interventions.intervened_run`). Where the stream is
        additive (`single_pass`) it starts at `stage`'s block from the clean run's residual stream moved by the
        senders' changes (`_moved`): the blocks before it are not run again. Otherwise it runs from the tokens
        with the senders' outputs set."""
        comps, repl = list(comps), dict(repl or {})
        if self.single_pass:
            start, edits = self._moved(stage, self._changes(ups, choices))
            return intervened_run(self.model, self._tiled(len(choices)), comps, repl, record=record, stop=stop,
                                  start=start, edits=edits)
        more, more_repl = self._sender_replacements(ups, choices)
        return intervened_run(self.model, self._tiled(len(choices)), more + comps, {**more_repl, **repl},
                              record=record, stop=stop)

    def _moved(self, stage: _Stage, change: Tensor) -> tuple[tuple[int, Tensor], list]:
        """Where a pass reading `stage` starts, and the edit that moves the stream there by `change` ([copy x
        batch, pos, d_model]): a layer's attention reads the stream entering its block; its MLP reads it after
        the attention (moved at hook_attn_out); the logits after the last block (moved at its output)."""
        last = len(self._streams) - 1
        layer = last if stage.kind == "logits" else stage.layer
        stream = self._clean_stream(layer, change.shape[0] // self.tokens.shape[0])
        if stage.kind == "attn":
            return (layer, stream + change.to(stream.dtype)), []
        hook = act_name("resid_post", last) if stage.kind == "logits" else act_name("attn_out", layer)
        return (layer, stream), [(hook, lambda act, hook=None: act + change.to(act.dtype))]

    def _changes(self, ups: Sequence[Component], choices: Sequence[Sequence[Any]]) -> Tensor:
        """The residual stream's change ([copy x batch, pos, d_model]) when each sender of `ups` takes the copy's
        spec instead of its clean value (the sum of what they write differently)."""
        base = self._streams[0]
        out = base.new_zeros(len(choices), *base.shape)
        for i, sender in enumerate(ups):
            if sender.name in self._same:
                continue
            for c, choice in enumerate(choices):
                if not _is(choice[i], "clean"):
                    out[c] += self._change(sender.name, choice[i]).to(out.dtype)
        return out.flatten(0, 1)

    def _change(self, sender: str, spec: Any) -> Tensor:
        """What `sender` writes into the stream with output `spec` ("corrupt" or a tensor: a head's slice) minus
        what it writes in the clean run."""
        if _is(spec, "corrupt"):
            if sender not in self._deltas:
                self._deltas[sender] = _sender_delta(self, self._by_name[sender])
            return self._deltas[sender]
        comp = self._by_name[sender]
        return _written(self.model, comp, spec - self._value(comp.hook_name, "clean", comp.head))

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

    def _channel_replacements(self, layer: int, pending: dict, members: Sequence[int]) -> tuple[list, dict]:
        """Components and tensors setting the queries, keys and values of a layer's heads to `pending`, for the
        copies `members` (stacked in that order)."""
        comps, repl = [], {}
        for c in "qkv":
            name = act_name(c, layer)
            full = self.clean[name].repeat(len(members), *[1] * (self.clean[name].ndim - 1))
            blocks = full.unflatten(0, (len(members), -1))
            for h in range(heads_per_layer(self.model)[layer]):
                specs = pending[f"L{layer}H{h}.{c}"]
                for m, k in enumerate(members):
                    if not _is(specs[k], "clean"):
                        blocks[m, :, :, h] = self._value(name, specs[k], h)
                comps.append(Component(kind=c, layer=layer, head=h))
            repl[name] = full
        return comps, repl

    def _head_outputs(self, layer: int, pending: dict, copies: int) -> dict[str, list]:
        """Each head's output in this run from its inputs (one pass, of the copies where some head's inputs are
        mixed)."""
        heads = range(heads_per_layer(self.model)[layer])
        out = {f"L{layer}H{h}": [None] * copies for h in heads}
        mixed = []
        for h in heads:
            for k in range(copies):
                whole = _whole([pending[f"L{layer}H{h}.{c}"][k] for c in "qkv"])
                if whole is not None:
                    out[f"L{layer}H{h}"][k] = whole
                else:
                    mixed.append((h, k))
        if mixed:
            members = sorted({k for _, k in mixed})
            comps, repl = self._channel_replacements(layer, pending, members)
            z = self._sender_pass(_Stage("attn", layer), [], [()] * len(members), comps=comps, repl=repl,
                                  record=[z_hook(layer)], stop=True)[1][z_hook(layer)]
            for h, k in mixed:
                out[f"L{layer}H{h}"][k] = self._block(z, members.index(k), len(members), h)
        return out

    def _finish(self, state: dict, heads: Optional[tuple[int, dict]], copies: int, stage: _Stage) -> Tensor:
        """The logits of one pass with every sender of the stages done set to its value in this run and, with
        `heads` = (layer, inputs), that layer's head inputs set: the model computes everything downstream itself.
        (A sender still at its clean value has only clean senders upstream, so setting it changes nothing; a copy
        with nothing but clean values gets the clean logits without a pass.)"""
        done = [s for s in self.senders if s.name in state]
        channels = [] if heads is None else [v for v in heads[1].values()]
        members = [k for k in range(copies) if not all(_is(state[s.name][k], "clean") for s in done)
                   or not all(_is(v[k], "clean") for v in channels)]
        out = self.clean_logits.expand(copies, *self.clean_logits.shape).clone()
        if not members:
            return out
        comps, repl = ([], {}) if heads is None else self._channel_replacements(*heads, members)
        logits = self._sender_pass(stage, done, [tuple(state[s.name][k] for s in done) for k in members],
                                   comps=comps, repl=repl)[0]
        out[members] = logits.unflatten(0, (len(members), -1)).to(out.dtype)
        return out


def _is(spec: Any, word: str) -> bool:
    return isinstance(spec, str) and spec == word


def _signature(choice: Sequence[Any]) -> tuple:
    """What identifies a choice of sender values (a tensor by its identity)."""
    return tuple(id(x) if isinstance(x, Tensor) else x for x in choice)


def _whole(choice: Sequence[Any]) -> Optional[str]:
    """"clean" / "corrupt" when every spec of `choice` is that word (an empty choice is clean), else None."""
    if all(_is(x, "clean") for x in choice):
        return "clean"
    return "corrupt" if all(_is(x, "corrupt") for x in choice) else None


# ------------------------------------------------------------------------------------- gradient estimate
def _attribution_hooks(model: HookedModel, store: dict[str, Tensor], inputs: dict[str, Tensor]
                       ) -> list[tuple[str, Any]]:
    """Hooks recording, with their autograd graph, every value the attributions differentiate; the embeddings
    are replaced by `inputs` ({hook name: value}; the token embedding's value is the graph's leaf)."""

    def keep(name: str) -> tuple[str, Any]:
        def hook(act: Tensor, hook: Any = None) -> Tensor:
            if name in inputs:  # the graph starts here: no parameter gradient is needed
                act = inputs[name].detach().to(act.dtype).requires_grad_(name == act_name("embed"))
            store[name] = act
            return act

        return name, hook

    hooks = [keep(name) for name in inputs]
    for layer in range(model.cfg.n_layers):
        hooks += [keep(act_name("resid_pre", layer))]
        hooks += [keep(act_name(c, layer)) for c in "qkv"]
        if has_mlp(model, layer):
            hooks += [keep(act_name("resid_mid", layer)), keep(mlp_out_hook(layer))]
    hooks.append(keep(act_name("resid_post", int(model.cfg.n_layers) - 1)))
    return hooks


def _gradient_blocks(runner: EdgeRunner, alpha: float) -> Iterator[tuple[list[tuple[str, str]], Tensor]]:
    """d loss / d (the residual stream as each receiver input reads it), in the run whose embeddings are the clean
    ones moved `alpha` of the way to the corrupted ones (alpha 0: the clean run): one block per layer and input
    kind ([(receiver, input) per head], [head, batch x pos x d_model]), one backward pass each, batched over the
    layer's heads (`is_grads_batched`), then the MLPs' and the logits'. Yielded one block at a time, so that the
    gradients of a large model are never all held at once."""
    model = runner.model
    inputs = {s.hook_name: runner.clean[s.hook_name] + alpha * (runner.corrupted[s.hook_name] - runner.clean[
        s.hook_name]) for s in runner.senders if s.kind in ("embed", "pos")}
    store: dict[str, Tensor] = {}
    with torch.enable_grad():
        logits = model.run_with_hooks(runner.tokens, fwd_hooks=_attribution_hooks(model, store, inputs))
        loss = sequence_losses(logits, runner.tokens).mean()
        last = act_name("resid_post", int(model.cfg.n_layers) - 1)
        layers = range(int(model.cfg.n_layers))
        heads = heads_per_layer(model)
        names = [act_name(c, l) for l in layers for c in "qkv"] + [mlp_out_hook(l) for l in layers
                                                                    if has_mlp(model, l)]
        # an input the loss does not read (q and k under a clamped pattern, `clamps.applied`) has gradient 0
        grads = dict(zip(names + [last], torch.autograd.grad(loss, [store[n] for n in names + [last]],
                                                             retain_graph=True, allow_unused=True,
                                                             materialize_grads=True)))
        yield [("logits", "logits")], grads[last].detach().reshape(1, -1)
        for layer in layers:
            n, stream = heads[layer], store[act_name("resid_pre", layer)]
            if runner.single_pass:
                back = _head_input_grads(model, layer, [grads[act_name(c, layer)][:, :, :n] for c in "qkv"], stream)
            else:  # the reference: back through the whole pass's graph, one head at a time (batched)
                backs = []
                for c in "qkv":
                    name = act_name(c, layer)
                    per_head = grads[name].new_zeros(n, *grads[name].shape)
                    for h in range(n):
                        per_head[h, :, :, h] = grads[name][:, :, h]
                    backs.append(torch.autograd.grad(store[name], stream, grad_outputs=per_head, retain_graph=True,
                                                     is_grads_batched=True)[0])
                back = torch.cat(backs)
            # the layer's queries, keys and values in one block: the senders' changes are read once a layer
            yield [(f"L{layer}H{h}", c) for c in "qkv" for h in range(n)], back.detach().reshape(3 * n, -1)
            if has_mlp(model, layer):
                name = mlp_out_hook(layer)
                back = torch.autograd.grad(store[name], store[act_name("resid_mid", layer)],
                                           grad_outputs=grads[name], retain_graph=True)[0]
                yield [(f"L{layer}.mlp", "mlp")], back.detach().reshape(1, -1)


def _head_input_grads(model: HookedModel, layer: int, grads: Sequence[Float[Tensor, "batch pos head d_head"]],
                      resid_pre: Tensor) -> Float[Tensor, "channel_head batch pos d_model"]:
    """d loss / d (the residual stream as each head of `layer` reads it through each channel), from `grads` (the
    gradients at hook_q, hook_k and hook_v, in that order), [channel x head, ...] in the same order: at the
    projection's input it is grad @ W^T, every head in one product (TransformerLens's W_Q / W_K / W_V), then back
    through the block's own first norm (`models.first_norm`, run again on the stream, one copy per head and
    channel: one backward). Where the stream is additive (`additive`) each head's input is the norm of the
    stream; `single_pass=False` takes the slower way through the pass's graph, and the tests check they agree."""
    cotangent = torch.cat([torch.einsum("bphe,hde->hbpd", grad, getattr(model, f"W_{c}").detach()[
        layer, :grad.shape[2]].to(grad.dtype)) for c, grad in zip("QKV", grads)])
    # one copy of the stream per head and channel, normed position by position: one plain backward gives each
    # copy's gradient (on the 12 x 12 benchmark model, timed once by hand: 0.014 s a channel against 0.043 s for a
    # batched backward through the bridge's hooked norm)
    stream = resid_pre.detach().repeat(cotangent.shape[0], *[1] * (resid_pre.ndim - 1)).requires_grad_(True)
    normed = first_norm(model, layer)(stream)
    back = torch.autograd.grad(normed, stream, grad_outputs=cotangent.flatten(0, 1).to(normed.dtype))[0]
    return back.unflatten(0, (cotangent.shape[0], -1))


def _sender_delta(runner: EdgeRunner, sender: Component) -> Float[Tensor, "batch pos d_model"]:
    """(corrupted - clean) output of `sender`, as written into the residual stream (a head's through its W_O)."""
    delta = runner.corrupted[sender.hook_name] - runner.clean[sender.hook_name]
    return _written(runner.model, sender, delta[:, :, sender.head] if sender.kind == "head" else delta)


def _written(model: HookedModel, sender: Component, change: Tensor) -> Float[Tensor, "batch pos d_model"]:
    """A change of `sender`'s output (a head's: its slice of hook_z) as it reaches the residual stream (a head's
    through its W_O; the embeddings and MLPs write their output as it is)."""
    if sender.kind == "head":
        return change @ model.W_O.detach()[sender.layer, sender.head].to(change.dtype)
    return change


def _sender_deltas(runner: EdgeRunner) -> Float[Tensor, "sender flat"]:
    """`_sender_delta` of every sender, in `runner.senders` order, flattened over batch, position and d_model
    (through the runner's cache, which the verifying passes read again)."""
    return torch.stack([runner._change(sender.name, "corrupt").float().reshape(-1) for sender in runner.senders])


def additive(model: HookedModel) -> bool:
    """Whether the residual stream of `model` is the sum of what its senders write, each sublayer reading it
    whole: not with a position embedding added to queries and keys only (shortformer) or attention and MLP
    reading the same stream (parallel blocks). `EdgeRunner`'s one-pass single edges need it, and so does
    `EdgeRunner.patched` (what `edge_content` measures with)."""
    cfg = model.cfg
    return (getattr(cfg, "positional_embedding_type", "standard") != "shortformer"
            and not getattr(cfg, "parallel_attn_mlp", False))


def edge_estimates(runner: EdgeRunner, *, steps: int = 1) -> tuple[dict[EdgeKey, float], dict[EdgeKey, float]]:
    """(edge attribution patching, its integrated-gradients version) of every edge of `runner`, nats.

    Both are sum over batch, positions and d_model of (corrupted - clean sender output) x (gradient of the mean
    loss with respect to the receiver's input): the first with the gradient of the clean run (Syed et al. 2023),
    the second with it averaged over `steps` runs whose embeddings move in equal steps from the clean to the
    corrupted ones (trapezoid rule; EAP-IG, Hanna et al. 2024). With `steps` 1 both are the first. Their gap is a
    measure of how far from linear the edge's path is (`discovery` verifies such edges exactly). Every receiver
    input's estimates come from one matrix product of the senders' outputs with its gradients.
    """
    check_int("steps", steps, minimum=1)
    alphas = [0.0] if steps == 1 else [i / (steps - 1) for i in range(steps)]
    weights = [1.0] if steps == 1 else [(0.5 if i in (0, steps - 1) else 1.0) / (steps - 1) for i in range(steps)]
    edges = set(runner.edges)
    deltas = _sender_deltas(runner)
    keys: dict[tuple, list[EdgeKey]] = {}  # a block's edges, sender-major (the same blocks at every alpha)
    first: dict[EdgeKey, float] = {}
    mean: dict[EdgeKey, float] = {}
    for alpha, weight in zip(alphas, weights):
        for inputs, grads in _gradient_blocks(runner, alpha):
            block = keys.get(tuple(inputs))
            if block is None:  # the senders upstream of a block come first in `runner.senders`
                ups = [x.name for x in runner.senders if EdgeKey(x.name, *inputs[0]) in edges]
                block = keys[tuple(inputs)] = [EdgeKey(s, r, i) for s in ups for r, i in inputs]
            n_ups = len(block) // len(inputs)
            products = (deltas[:n_ups] @ grads.float().T).flatten().tolist()  # sender-major, as `block`
            if alpha == 0.0:
                first.update(zip(block, products))
            for edge, value in zip(block, products):
                mean[edge] = mean.get(edge, 0.0) + weight * value
    return first, mean


def edge_attributions(runner: EdgeRunner, *, steps: int = 1) -> dict[EdgeKey, float]:
    """Edge attribution patching (Syed et al. 2023): for every edge, (corrupted - clean output of the sender) .
    (gradient of the mean loss with respect to the receiver's input, in the clean run), summed over the batch and
    positions: the first-order estimate of the edge's path-patching effect (nats) from one forward and backward
    pass. Where a receiver responds non-linearly (a softmax that switches keys) the estimate can be far off;
    `steps` > 1 averages the gradient along the way from the clean to the corrupted run (`edge_estimates`)."""
    first, mean = edge_estimates(runner, steps=steps)
    return first if steps == 1 else mean
