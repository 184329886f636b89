"""`classify_mechanism`: does a model predict with pi (unigram), with a kernel stored in its weights, or with
an induction-head circuit that estimates the kernel in context?

The call rests on behaviour first and circuitry second (thresholds in `Thresholds`, all documented there):

1. **unigram** if the prediction hardly depends on the current state: `state_dependence` (mean total
   variation when only x_t is changed) is below `unigram_state_ratio` times that of the optimal predictor
   on the same tokens (the true kernel for a fixed chain, add-beta for random kernels), or below
   `min_state_dependence` outright.
2. **kernel** if it depends on the current state but hardly on the rest of the context: `context_dependence`
   (mean total variation between sequences that end in the same context at the same position) is below
   `kernel_context_ratio` times that of the in-context add-beta estimator on the same tokens.
3. **induction** otherwise: the prediction follows in-context statistics. The circuit check: the head with
   the highest previous-token score (above chance by `head_excess`) in an earlier layer and the head with the
   highest induction score in a later layer are mean-ablated; if either ablation raises the loss by at least
   `destroy_fraction` of the *bigram gain* of the in-context estimators on the same tokens (in-context
   unigram loss minus add-beta loss: what conditioning the in-context counts on the current state is worth
   on this source), the circuit is confirmed and `confident` is True. The yardstick is the estimators' gain,
   not the model's own, so that a crudely calibrated induction circuit (worse than the in-context unigram
   estimator early in the sequence) is still recognised. A model that is in-context by behaviour but whose
   loss survives both ablations is still named "induction" with `confident=False` and a reason saying so.

Everything is measured on one batch from the source (`n_sequences` x `seq_len`, seeded), with a handful of
forward passes: seconds on CPU for the paper's small models.
"""

import dataclasses
from typing import Any, Optional

import torch

from markov_interp import theory
from markov_interp.probes._common import Model, check_source_matches, check_tokens, json_safe, sample_batch
from markov_interp.probes.ablation import AblationTable, Component, ablation_table, model_components
from markov_interp.probes.attention import AttentionScores, attention_hook_names, attention_scores
from markov_interp.probes.behaviour import BehaviourReport, behaviour
from markov_interp.probes.readout import KernelReadout, kernel_readout

MECHANISMS = ("unigram", "kernel", "induction")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Thresholds:
    """The documented cut-offs of `classify_mechanism` (ratios are model measure / optimal-predictor measure)."""

    unigram_state_ratio: float = 0.2  # state dependence below 20% of the optimal predictor's -> unigram
    min_state_dependence: float = 0.01  # ... or below 0.01 total variation outright -> unigram
    kernel_context_ratio: float = 0.25  # context dependence below 25% of add-beta's -> kernel
    head_excess: float = 0.3  # a head is a previous-token / induction head if (score-chance)/(1-chance) >= 0.3
    destroy_fraction: float = 0.5  # an ablation "destroys" the circuit if it costs >= 50% of the bigram gain
    # (bigram gain = in-context unigram loss - add-beta loss on the same tokens)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"threshold {f.name} must be a number >= 0, got {value!r}")

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class MechanismReport:
    """What `classify_mechanism` decided and the evidence behind it (see the module docstring)."""

    mechanism: str  # "unigram", "kernel" or "induction"
    confident: bool  # False when the numbers sit near a threshold or an in-context model's circuit is unconfirmed
    reasons: tuple[str, ...]  # one sentence per step of the decision, with the numbers
    state_ratio: float  # state_dependence / reference_state_dependence
    context_ratio: float  # context_dependence / reference_context_dependence
    bigram_gain: float  # in-context unigram loss - add-beta loss on the probe tokens (nats): the yardstick
    model_bigram_gain: float  # in-context unigram loss - model loss (nats): what the model gets of it
    previous_token_head: Optional[tuple[int, int]]
    induction_head: Optional[tuple[int, int]]
    previous_token_ablation: Optional[float]  # loss change when mean-ablating the previous-token head
    induction_ablation: Optional[float]  # loss change when mean-ablating the induction head
    circuit_confirmed: bool
    behaviour: BehaviourReport
    attention: AttentionScores
    ablation: AblationTable
    readout: KernelReadout
    references: dict[str, float]  # theory.reference_losses(...).as_row() of the source
    thresholds: Thresholds
    source: str
    seq_len: int
    n_sequences: int
    seed: int

    @property
    def eval_loss(self) -> float:
        return self.behaviour.eval_loss

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: mechanism, losses beside theory's references, per-head scores, all evidence."""
        b = self.behaviour
        return json_safe({
            "mechanism": self.mechanism,
            "confident": self.confident,
            "reasons": list(self.reasons),
            "eval_loss": b.eval_loss,
            "entropy_rate": self.references.get("entropy_rate"),
            "unigram_loss": self.references.get("unigram_loss"),
            "references": dict(self.references),
            "state_dependence": b.state_dependence,
            "reference_state_dependence": b.reference_state_dependence,
            "state_ratio": self.state_ratio,
            "context_dependence": b.context_dependence,
            "reference_context_dependence": b.reference_context_dependence,
            "context_ratio": self.context_ratio,
            "bigram_gain": self.bigram_gain,
            "model_bigram_gain": self.model_bigram_gain,
            "icl_score": b.icl_score,
            "previous_token_head": None if self.previous_token_head is None else list(self.previous_token_head),
            "induction_head": None if self.induction_head is None else list(self.induction_head),
            "previous_token_ablation": self.previous_token_ablation,
            "induction_ablation": self.induction_ablation,
            "circuit_confirmed": self.circuit_confirmed,
            "heads": self.attention.to_dict(),
            "ablation": self.ablation.to_dict(),
            "readout": self.readout.to_dict(),
            "behaviour": b.to_dict(),
            "thresholds": self.thresholds.to_dict(),
            "source": self.source,
            "seq_len": self.seq_len,
            "n_sequences": self.n_sequences,
            "seed": self.seed,
        })


def _ratio(value: float, reference: float) -> float:
    return value / reference if reference > 0 else (0.0 if value == 0 else float("inf"))


def _near(value: float, cut: float) -> bool:
    """Within a factor 1.5 of a cut-off: the call is made but flagged as not confident."""
    return cut / 1.5 <= value <= cut * 1.5


Head = Optional[tuple[int, int]]


def _circuit_heads(scores: AttentionScores, th: Thresholds) -> tuple[Head, Head]:
    """(previous-token head in an earlier layer, induction head in a later layer), None where none clears
    `head_excess`."""
    n_layers = scores.previous_token.shape[0]
    if n_layers < 2:
        return None, None
    prev = scores.top_head("previous_token", layers=range(n_layers - 1))
    if float(scores.excess("previous_token")[prev]) < th.head_excess:
        prev = None
    first = prev[0] + 1 if prev is not None else 1
    ind = scores.top_head("induction", layers=range(first, n_layers))
    if float(scores.excess("induction")[ind]) < th.head_excess:
        ind = None
    return prev, ind


@torch.no_grad()
def classify_mechanism(
    model: Model,
    source: Any,
    *,
    seq_len: Optional[int] = None,
    n_sequences: int = 64,
    seed: int = 0,
    beta: float | int | None = None,
    thresholds: Thresholds = Thresholds(),
) -> MechanismReport:
    """Name the mechanism by which `model` predicts the next state of `source`: unigram, kernel or induction.

    `seq_len` defaults to min(model n_ctx, 128); `beta` to the source's alpha (random kernels) or 1/2. See the
    module docstring for the decision rule and `Thresholds` for the cut-offs.

    >>> # report = classify_mechanism(model, BinaryChain(0.2, 0.3), seed=0); report.mechanism
    """
    check_source_matches(model, source)
    if seq_len is None:
        seq_len = min(int(model.cfg.n_ctx), 128)
    batch = sample_batch(source, n_sequences=n_sequences, seq_len=seq_len, seed=seed)
    head_components = model_components(model, kinds=("head",))
    names = attention_hook_names(model) + sorted({c.hook_name for c in head_components})
    logits, cache = model.run_with_cache(check_tokens(model, batch.tokens), names_filter=names)
    probs = torch.softmax(logits.double(), dim=-1)
    beh = behaviour(model, batch, beta=beta, probs=probs)
    scores = attention_scores(model, batch.tokens, cache=cache)
    heads = ablation_table(
        model, batch.tokens, method="mean", components=head_components, cache=cache, clean_probs=probs
    )
    readout = kernel_readout(model, batch, probs=probs)
    references = theory.reference_losses(source, seq_len)  # a property of the source: shared, cached

    th = thresholds
    state_ratio = _ratio(beh.state_dependence, beh.reference_state_dependence)
    context_ratio = _ratio(beh.context_dependence, beh.reference_context_dependence)
    gain = beh.in_context_unigram_loss - beh.add_beta_loss
    prev, ind = _circuit_heads(scores, th)
    prev_change = heads[Component(kind="head", layer=prev[0], head=prev[1]).name] if prev else None
    ind_change = heads[Component(kind="head", layer=ind[0], head=ind[1]).name] if ind else None
    changes = [c for c in (prev_change, ind_change) if c is not None]
    confirmed = gain > 0 and any(c >= th.destroy_fraction * gain for c in changes)

    reasons = [
        f"state dependence {beh.state_dependence:.4f} = {state_ratio:.3f} x the optimal predictor's "
        f"({beh.reference_state_dependence:.4f}); unigram below {th.unigram_state_ratio} x or "
        f"{th.min_state_dependence} absolute",
    ]
    if state_ratio < th.unigram_state_ratio or beh.state_dependence < th.min_state_dependence:
        mechanism = "unigram"
        confident = not _near(state_ratio, th.unigram_state_ratio)
    else:
        reasons.append(
            f"context dependence {beh.context_dependence:.4f} = {context_ratio:.3f} x add-beta's "
            f"({beh.reference_context_dependence:.4f}); kernel below {th.kernel_context_ratio} x"
        )
        if context_ratio < th.kernel_context_ratio:
            mechanism = "kernel"
            borderline = _near(context_ratio, th.kernel_context_ratio) or _near(state_ratio, th.unigram_state_ratio)
            confident = not borderline
        else:
            mechanism = "induction"
            confident = confirmed and not _near(context_ratio, th.kernel_context_ratio)
    reasons.append(
        f"bigram gain of the in-context estimators {gain:.4f} nats (the model's: "
        f"{beh.in_context_unigram_loss - beh.eval_loss:.4f}); previous-token head {prev} (ablation "
        f"{_fmt(prev_change)}), induction head {ind} (ablation {_fmt(ind_change)}); "
        f"circuit {'confirmed' if confirmed else 'not confirmed'} "
        f"(needs an ablation >= {th.destroy_fraction} x the gain)"
    )
    if mechanism == "induction" and not confirmed:
        reasons.append("in-context by behaviour, but no single head ablation removes the bigram gain")
    return MechanismReport(
        mechanism=mechanism,
        confident=bool(confident),
        reasons=tuple(reasons),
        state_ratio=state_ratio,
        context_ratio=context_ratio,
        bigram_gain=gain,
        model_bigram_gain=beh.in_context_unigram_loss - beh.eval_loss,
        previous_token_head=prev,
        induction_head=ind,
        previous_token_ablation=prev_change,
        induction_ablation=ind_change,
        circuit_confirmed=bool(confirmed),
        behaviour=beh,
        attention=scores,
        ablation=heads,
        readout=readout,
        references=references.as_row(),
        thresholds=th,
        source=repr(source),
        seq_len=seq_len,
        n_sequences=n_sequences,
        seed=seed,
    )


def _fmt(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:+.4f}"
