"""Behaviour probes: what the model predicts, compared with the laws it could have learned.

A model that learned the kernel in its weights (Makkuva et al.'s single-layer models) predicts P(. | x_t)
whatever came before: its predictions depend on the current state and not on the rest of the context, and
its loss is flat along the sequence. A model that estimates the kernel in context (an induction-head
circuit, Edelman et al. 2024) tracks the add-beta estimator: its predictions change with the context, and
its loss falls along the sequence. A unigram model predicts pi whatever the current state. The probes below
measure exactly these differences.
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Optional

import torch
from jaxtyping import Float
from torch import Tensor

from markov_interp import theory
from markov_interp.models import HookedModel
from markov_interp.sources import add_beta_predictions
from markov_interp.probes._common import (
    ProbeBatch,
    Probs,
    Tokens,
    check_batch,
    contexts,
    in_context_unigram_probs,
    json_safe,
    kernel_probs,
    next_state_probs,
    stationary_probs,
    target_losses,
    total_variation,
)
from markov_interp.probes._display import ProbeResult, dataframe

__all__ = ["BehaviourReport", "add_beta_predictor", "behaviour_report", "context_dependence",
           "in_context_learning_score", "kernel_predictor", "kl_curve", "loss_curve", "model_predictor",
           "state_dependence"]

Predictor = Callable[[Tokens], Probs]


def loss_curve(probs: Probs, tokens: Tokens) -> Float[Tensor, " target"]:
    """Mean log-loss (nats) of the prediction made at each position t for x_{t+1}, over the batch.

    Entry t is the loss after seeing x_0..x_t (seq_len - 1 entries), the quantity whose fall along the
    sequence is in-context learning (Olsson et al.). A model that learned the kernel is flat at the entropy
    rate; the Bayes in-context predictor starts near log V and falls towards it.
    """
    return target_losses(probs, tokens).mean(0)


def kl_curve(true: Probs, probs: Probs) -> Float[Tensor, " pos"]:
    """Mean KL(true || model) in nats at each position: how far the model's next-state law is from `true`.

    With `true` the sequence's kernel row this is the model's excess loss per position; with the add-beta
    estimator it says how closely the model follows in-context statistics; with pi, how close it is to the
    unigram solution.
    """
    return theory.kl_divergence(true, probs.to(true.device)).mean(0)


def in_context_learning_score(curve: Float[Tensor, " target"], *, early: float = 0.1, late: float = 0.1) -> float:
    """Loss late in the sequence minus loss early on (nats; negative = the model learns in context).

    Early is the first `early` fraction of the prediction positions, late the last `late` fraction (each at
    least one position), after Olsson et al.'s "loss at token 500 minus loss at token 50". About 0 for a model
    that learned the kernel; clearly negative for an induction circuit.

    >>> round(in_context_learning_score(torch.linspace(0.7, 0.5, 10, dtype=torch.float64)), 6)
    -0.2
    """
    if not (0 < early <= 1 and 0 < late <= 1):
        raise ValueError(f"early and late must be fractions in (0, 1], got early={early}, late={late}")
    n = curve.shape[0]
    n_early, n_late = max(1, round(early * n)), max(1, round(late * n))
    return float(curve[-n_late:].mean() - curve[:n_early].mean())


def context_dependence(probs: Probs, tokens: Tokens, *, vocab: int, order: int = 1) -> float:
    """How much the prediction differs between contexts that end in the same state (mean total variation).

    Compares sequences pairwise at the same position t whose last `order` states agree: a model that learned
    the kernel (or pi) predicts the same law for all of them (0, up to float noise); an in-context estimator
    gives each context its own estimate. Grouping by position as well removes any dependence on position
    alone. The mean is over all such pairs (a != b) at all positions.

    >>> tokens = torch.tensor([[0, 1, 1], [1, 0, 1]])
    >>> context_dependence(kernel_predictor(torch.tensor([[0.8, 0.2], [0.3, 0.7]]), order=1)(tokens), tokens, vocab=2)
    0.0
    >>> round(context_dependence(add_beta_predictions(tokens, 2), tokens, vocab=2), 4)  # (1/3,2/3) vs (2/3,1/3)
    0.3333
    """
    ctx = contexts(tokens, vocab=vocab, order=order).to(probs.device)
    per_pos = probs.transpose(0, 1)  # [pos, batch, vocab]
    tv = total_variation(per_pos[:, :, None, :], per_pos[:, None, :, :])  # [pos, batch, batch]
    c = ctx.T  # [pos, batch]
    same = (c[:, :, None] == c[:, None, :]) & (c[:, :, None] >= 0)
    same &= ~torch.eye(c.shape[1], dtype=torch.bool, device=c.device)[None]
    n_pairs = int(same.sum())
    return float((tv * same).sum() / n_pairs) if n_pairs else 0.0


def flip_positions(seq_len: int, *, n_positions: int = 8, order: int = 1) -> tuple[int, ...]:
    """Evenly spaced positions (from `order` - 1 to the last) at which `state_dependence` flips the state."""
    first = max(order - 1, 1)
    if seq_len - 1 < first:
        return (seq_len - 1,)
    grid = torch.linspace(first, seq_len - 1, min(n_positions, seq_len - first)).round().long()
    return tuple(sorted({int(t) for t in grid}))


@torch.no_grad()
def state_dependence(
    predict: Predictor, tokens: Tokens, *, vocab: int, positions: Sequence[int], base: Optional[Probs] = None
) -> float:
    """How much the prediction at t changes when only the current state x_t is changed (mean total variation).

    For every position t in `positions`, every sequence and every other state s != x_t, compare the prediction
    after x_0..x_{t-1}, x_t with the one after x_0..x_{t-1}, s. Zero for a unigram model (it ignores x_t); the
    distance between kernel rows for a model that learned the kernel; the distance between in-context rows for
    an induction circuit. `predict` maps a token batch to next-state laws (the model, or a reference);
    `base` may hold its laws on `tokens` already (saves a forward pass).

    >>> kernel = kernel_predictor(torch.tensor([[0.8, 0.2], [0.3, 0.7]]), order=1)
    >>> round(state_dependence(kernel, torch.tensor([[0, 1, 1, 0]]), vocab=2, positions=[1, 3]), 6)
    0.5
    """
    tokens = tokens.cpu()
    batch = tokens.shape[0]
    shifts = torch.arange(1, vocab)
    total, count = 0.0, 0
    for t in positions:
        prefix = tokens[:, : t + 1]
        flipped = prefix.repeat(vocab - 1, 1)  # [(V-1) * batch, t+1], block k shifts x_t by k+1
        flipped[:, t] = (flipped[:, t] + shifts.repeat_interleave(batch)) % vocab
        here = (predict(prefix) if base is None else base)[:, t].cpu()
        alt = predict(flipped)[:, t].cpu()
        tv = total_variation(here.repeat(vocab - 1, 1), alt)
        total += float(tv.sum())
        count += tv.numel()
    return total / count


def model_predictor(model: HookedModel, *, fwd_hooks: Optional[list] = None) -> Predictor:
    """The model as a `Predictor` (token batch -> next-state laws), optionally with hooks (ablations)."""
    return lambda tokens: next_state_probs(model, tokens, fwd_hooks=fwd_hooks)


def add_beta_predictor(vocab: int, *, order: int, beta: float | int) -> Predictor:
    """The in-context add-beta estimator (`sources.add_beta_predictions`) as a `Predictor`."""
    return lambda tokens: add_beta_predictions(tokens, vocab, order=order, beta=beta)


def kernel_predictor(kernel: Tensor, *, order: int) -> Predictor:
    """A fixed kernel [V**order, V] (or [V]*order + [V]) as a `Predictor`: row of the current context."""
    vocab = kernel.shape[-1]
    flat = kernel.reshape(-1, vocab).to(torch.float64)

    def predict(tokens: Tokens) -> Probs:
        ctx = contexts(tokens, vocab=vocab, order=order)
        return flat.to(tokens.device)[ctx.clamp_min(0)]

    return predict


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class BehaviourReport(ProbeResult):
    """The model's predictions against the true kernel, the in-context add-beta estimator and pi.

    Curves have one entry per position (`kl_*`) or per prediction target (`*_loss_curve`, seq_len - 1
    entries); the scalars are their means. `state_dependence` / `context_dependence` are mean total
    variations (see the functions of those names); the `reference_*` values are the same measures for the
    predictor that is optimal on this source (the source's `predictive` for a fixed chain, its kernel's rows;
    add-beta for a random one) for the state measure, and for add-beta for the context measure.
    """

    loss_curve: Float[Tensor, " target"]
    kernel_loss_curve: Float[Tensor, " target"]
    add_beta_loss_curve: Float[Tensor, " target"]
    kl_kernel_curve: Float[Tensor, " pos"]
    kl_add_beta_curve: Float[Tensor, " pos"]
    kl_stationary_curve: Float[Tensor, " pos"]
    eval_loss: float  # mean model loss over all targets (nats)
    kernel_loss: float  # mean loss of predicting with the true kernel on the same tokens
    add_beta_loss: float  # mean loss of the add-beta estimator on the same tokens
    in_context_unigram_loss: float  # mean loss of the in-context state-count estimator (ignores x_t)
    stationary_loss: float  # mean loss of predicting pi
    kl_kernel: float
    kl_add_beta: float
    kl_stationary: float
    icl_score: float  # model: loss late minus loss early (negative = learns in context)
    add_beta_icl_score: float  # the same for the add-beta estimator
    state_dependence: float
    reference_state_dependence: float
    context_dependence: float
    reference_context_dependence: float
    beta: float

    def to_dataframe(self) -> Any:
        """The curves, one row per position t (index "position"): the losses of the prediction made at t for
        x_{t+1} (model, true kernel, add-beta; empty at the last position, which has no target) and
        KL(law || model) at t for the true kernel, the add-beta estimator and pi.

        Returns:
            A pandas DataFrame.
        """
        n = int(self.kl_kernel_curve.shape[0])
        columns = {"loss": self.loss_curve, "kernel_loss": self.kernel_loss_curve,
                   "add_beta_loss": self.add_beta_loss_curve, "kl_kernel": self.kl_kernel_curve,
                   "kl_add_beta": self.kl_add_beta_curve, "kl_stationary": self.kl_stationary_curve}
        values = {name: curve.detach().cpu().tolist() for name, curve in columns.items()}
        return dataframe(({"position": t, **{name: (v[t] if t < len(v) else float("nan"))
                                             for name, v in values.items()}} for t in range(n)), index="position")

    def summary(self) -> str:
        """The model's loss beside the laws it could have learned, how it learns in context, what it depends on."""
        return "\n".join([
            f"eval loss {self.eval_loss:.4f} nats; true kernel {self.kernel_loss:.4f}, add-beta (beta={self.beta:g}) "
            f"{self.add_beta_loss:.4f}, in-context unigram {self.in_context_unigram_loss:.4f}, pi "
            f"{self.stationary_loss:.4f}",
            f"in-context learning score {self.icl_score:+.4f} nats (add-beta {self.add_beta_icl_score:+.4f}; "
            "negative: the loss falls along the sequence)",
            f"mean KL(law || model): true kernel {self.kl_kernel:.4f}, add-beta {self.kl_add_beta:.4f}, pi "
            f"{self.kl_stationary:.4f} nats",
            f"state dependence {self.state_dependence:.3f} (optimal predictor {self.reference_state_dependence:.3f}); "
            f"context dependence {self.context_dependence:.3f} (add-beta {self.reference_context_dependence:.3f})",
        ])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: scalars as floats, curves as lists."""
        return json_safe({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})


def behaviour_report(
    model: HookedModel,
    batch: ProbeBatch,
    *,
    beta: float | int | None = None,
    probs: Optional[Probs] = None,
    n_flip_positions: int = 8,
) -> BehaviourReport:
    """All behaviour probes on one batch (see `BehaviourReport`); `probs` reuses a forward pass already made.

    `beta` is the add-beta smoothing of the in-context references (default `batch.beta`: the source's alpha
    for random kernels, 1/2 otherwise).

    >>> report = behaviour_report(model, batch)  # a hand-built induction circuit on random kernels
    >>> bool(report.icl_score < 0)  # its loss falls along the sequence: it learns in context
    True
    """
    batch = check_batch(batch, "behaviour")
    tokens = batch.tokens
    beta = batch.beta if beta is None else beta
    if probs is None:
        probs = next_state_probs(model, tokens)
    probs = probs.cpu()
    true = kernel_probs(batch).cpu()
    add_beta = add_beta_predictions(tokens, batch.vocab, order=batch.order, beta=beta)
    unigram_ic = in_context_unigram_probs(tokens, batch.vocab, beta=beta)
    pis = stationary_probs(batch).cpu()
    curve = loss_curve(probs, tokens)
    ab_curve = loss_curve(add_beta, tokens)
    positions = flip_positions(tokens.shape[1], n_positions=n_flip_positions, order=batch.order)
    # the optimal predictor of a fixed chain; for random kernels the add-beta estimator, defined on every flipped
    # sequence (a pool's Bayes law is not once a flip makes a sequence impossible under every kernel)
    reference = add_beta_predictor(batch.vocab, order=batch.order, beta=beta) if batch.random_kernel else (
        batch.source.predictive)
    kl_k, kl_ab, kl_pi = kl_curve(true, probs), kl_curve(add_beta, probs), kl_curve(pis, probs)
    kernel_curve = loss_curve(true, tokens)
    return BehaviourReport(
        loss_curve=curve,
        kernel_loss_curve=kernel_curve,
        add_beta_loss_curve=ab_curve,
        kl_kernel_curve=kl_k,
        kl_add_beta_curve=kl_ab,
        kl_stationary_curve=kl_pi,
        eval_loss=float(curve.mean()),
        kernel_loss=float(kernel_curve.mean()),
        add_beta_loss=float(ab_curve.mean()),
        in_context_unigram_loss=float(loss_curve(unigram_ic, tokens).mean()),
        stationary_loss=float(loss_curve(pis, tokens).mean()),
        kl_kernel=float(kl_k.mean()),
        kl_add_beta=float(kl_ab.mean()),
        kl_stationary=float(kl_pi.mean()),
        icl_score=in_context_learning_score(curve),
        add_beta_icl_score=in_context_learning_score(ab_curve),
        state_dependence=state_dependence(model_predictor(model), tokens, vocab=batch.vocab, positions=positions,
                                          base=probs),
        reference_state_dependence=state_dependence(reference, tokens, vocab=batch.vocab, positions=positions),
        context_dependence=context_dependence(probs, tokens, vocab=batch.vocab, order=batch.order),
        reference_context_dependence=context_dependence(add_beta, tokens, vocab=batch.vocab, order=batch.order),
        beta=float(beta),
    )
