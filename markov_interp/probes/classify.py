"""`classify_mechanism`: which law does a model predict with, and (for in-context laws) through which circuit?

**Labels.** Each names a law and is given only when the model's predictions follow that law:

- `uniform`: the untrained law 1/V;
- `unigram`: context-free and equal to the stationary law pi (Makkuva et al.'s bad minimum; fixed chains);
- `in_context_unigram`: the in-context state frequencies (add-beta counts over x_0..x_t; Edelman et al.'s
  unigram phase);
- `kernel`: the true kernel of the source's order (fixed chains), stored in the weights; `order` = k;
- `induction`: the in-context add-beta estimator of order k >= 1, *and* a circuit found in the weights (at
  least two layers; previous-token heads at lags 1..k feeding induction heads that match the last k states;
  every role's set of heads confirmed by ablation); `order` = k;
- `other`: none of these; the reasons say which law came closest and how far, or which part of the circuit
  is missing.

**Each label checks its own law** (`strategies.strategy_similarity`, all on one probe batch). For every
candidate law s, d(s) = mean KL(s || model) over the batch. The candidates are the uniform law, (fixed
chains) pi and the true kernel, and the in-context estimators of every order 0..source order; laws that
coincide on the batch (closer than `strategies.MIN_GAP`) count once, under the simpler name. The closest law
s* is the model's law when

1. **fit**: d(s*) <= `fit` x gap(s*), where gap(s*) is the mean KL from the nearest *other* candidate law to
   s* on the same tokens (so "close" is measured in units of how far apart the laws themselves are here);
2. **margin**: d(s*) <= `margin` x d(s2), with s2 the next closest candidate.

Otherwise the label is `other`. A value within a factor `near` of either cut gives `confident=False`.

**Circuit** (`circuit.find_circuit`): for an in-context law of order k >= 1, the roles are the previous-token
heads at each lag 1..k and the order-k induction heads; a head belongs to a role when its excess score
(`attention`: chance levels that keep the tokens' statistics) is at least `head_excess`; roles are sets
and may sit in any layers (previous-token heads below the last induction head). Each role's set is
mean-ablated at once, and so is each whole attention layer; a role is confirmed when its set's ablation
raises the loss by at least `destroy_fraction` of the model's own in-context gain, L(in-context estimator of
order k - 1) - L(model) on the same tokens. `induction` needs every role confirmed and two layers or more.

Thresholds (`Thresholds`, defaults) were set on the hand-built models of tests/handbuilt.py and the trained
models of the tests; see `Thresholds` for the numbers measured there.
"""

import dataclasses
from typing import Any, Optional

import torch

from markov_interp import theory
from markov_interp.probes._common import (
    Model,
    ProbeBatch,
    check_source_matches,
    check_tokens,
    json_safe,
    probe_length,
    sample_batch,
)
from markov_interp.probes._display import ProbeResult, evidence_tables, headline
from markov_interp.probes.ablation import AblationTable, ablation_table, model_components
from markov_interp.probes.attention import AttentionScores, attention_hook_names, attention_scores
from markov_interp.probes.behaviour import BehaviourReport, behaviour
from markov_interp.probes.circuit import Circuit, find_circuit
from markov_interp.probes.readout import KernelReadout, kernel_readout
from markov_interp.probes.strategies import (
    STRATEGY_LABELS,
    StrategySimilarity,
    in_context_order,
    strategy_similarity,
)

MECHANISMS = ("uniform", "unigram", "in_context_unigram", "kernel", "induction", "other")
_LABEL_OF_LAW = {"uniform": "uniform", "stationary": "unigram", "kernel": "kernel",
                 "in_context_unigram": "in_context_unigram"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Thresholds:
    """The documented cut-offs of `classify_mechanism` (module docstring).

    Measured on the tests' models (fit = d(law) / gap, margin = d(law) / d(runner-up)):
    - exact hand-built laws (constant, stationary, kernel with or without decoys): fit and margin below 1e-3;
      uniform-attention counters (logits = V x frequencies): fit 0.03-0.23, margin 0.03-0.16;
    - hand-built induction circuits (a linear read-out of counts, not add-beta itself; 128 states): order 1
      fit 0.20-0.35, margin 0.23-0.42; order 2 fit 0.42-0.43, margin 0.32-0.36 (the crude models are
      labelled right, a few near the margin: confident=False);
    - trained (two seeds each): one-layer attention-only on random kernels -> in-context unigram, fit
      0.17-0.22, margin 0.22-0.29; two-layer -> induction, fit 0.12-0.21, margin 0.13-0.29; one-layer on a
      fixed chain -> kernel, fit <= 0.015; on the unigram plateau -> unigram, fit <= 0.001.
    Circuits: role heads of hand-built and trained circuits score excess 0.55-1.0 (0.55 for an induction
    head on the sticky chain p = q = 0.1), decoy heads |excess| <= 0.1; confirmed role sets cost 1.9-4x the
    required half of the model's in-context gain, decoys nothing.
    """

    fit: float = 0.75  # d(law) <= 0.75 x the gap from the law to its nearest rival law
    margin: float = 0.6  # d(law) <= 0.6 x the divergence to the next closest law
    near: float = 1.5  # within a factor 1.5 of a cut: the call is made but confident=False
    head_excess: float = 0.3  # a head takes a role if its excess score (0 chance, 1 perfect) is >= 0.3
    destroy_fraction: float = 0.5  # a role is confirmed if ablating its set costs >= 50% of the model's gain

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"threshold {f.name} must be a number >= 0, got {value!r}")
        if self.near < 1:
            raise ValueError(f"threshold near must be >= 1 (a factor), got {self.near!r}")

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LawCheck:
    """The closest law and the two checks it must pass to be the model's law (module docstring)."""

    law: str  # the closest candidate strategy
    divergence: float  # d(law) = mean KL(law || model), nats
    gap: float  # mean KL(nearest other law || law) on the same tokens, nats
    runner_up: Optional[str]  # the next closest candidate
    runner_up_divergence: Optional[float]
    fit_ratio: float  # divergence / gap (<= Thresholds.fit)
    margin_ratio: float  # divergence / runner_up_divergence (<= Thresholds.margin)
    passed: bool
    near: bool  # neither a clear pass (both ratios <= cut / near) nor a clear failure (one > cut x near)

    def to_dict(self) -> dict[str, Any]:
        return json_safe(dataclasses.asdict(self))


def check_law(sim: StrategySimilarity, th: "Thresholds") -> LawCheck:
    """The closest candidate law of `sim` and whether it passes the fit and margin checks of `th`."""
    ranking = sim.ranking
    law, runner = ranking[0], (ranking[1] if len(ranking) > 1 else None)
    d = sim.divergences[law]
    gap = sim.gaps[law]
    d2 = sim.divergences[runner] if runner is not None else float("inf")
    fit = _ratio(d, gap)
    margin = _ratio(d, d2)
    passed = fit <= th.fit and margin <= th.margin
    # near: neither a clear pass (both checks within cut / near) nor a clear failure (one beyond cut x near)
    clear_pass = fit <= th.fit / th.near and margin <= th.margin / th.near
    clear_fail = fit > th.fit * th.near or margin > th.margin * th.near
    near = not (clear_pass or clear_fail)
    return LawCheck(law=law, divergence=d, gap=gap, runner_up=runner, runner_up_divergence=None if runner is None
                    else d2, fit_ratio=fit, margin_ratio=margin, passed=passed, near=near)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class MechanismReport(ProbeResult):
    """What `classify_mechanism` decided and all the evidence behind it (see the module docstring)."""

    mechanism: str  # one of MECHANISMS
    order: Optional[int]  # k for "kernel" and "induction", None otherwise
    confident: bool  # False near a cut (law fit, margin, or a role's ablation cost)
    reasons: tuple[str, ...]  # one sentence per step of the decision, with the numbers
    law: LawCheck
    strategies: StrategySimilarity
    circuit: Circuit
    behaviour: BehaviourReport
    attention: AttentionScores
    ablation: AblationTable  # every head, attention layer and MLP mean-ablated alone
    readout: KernelReadout
    references: "theory.ReferenceLosses"  # theory.reference_losses(source, seq_len): shared, cached
    thresholds: Thresholds
    source: str
    seq_len: int
    n_sequences: int
    seed: int

    # ------------------------------------------------------------------ summaries of the evidence
    @property
    def eval_loss(self) -> float:
        return self.behaviour.eval_loss

    @property
    def state_ratio(self) -> float:
        """State dependence / the optimal predictor's (behaviour evidence)."""
        return _ratio(self.behaviour.state_dependence, self.behaviour.reference_state_dependence)

    @property
    def context_ratio(self) -> float:
        """Context dependence / the add-beta estimator's (behaviour evidence)."""
        return _ratio(self.behaviour.context_dependence, self.behaviour.reference_context_dependence)

    @property
    def bigram_gain(self) -> float:
        """In-context unigram loss - in-context estimator (source order) loss on the probe tokens (nats)."""
        return self.behaviour.in_context_unigram_loss - self.behaviour.add_beta_loss

    @property
    def model_bigram_gain(self) -> float:
        """In-context unigram loss - model loss on the probe tokens (nats)."""
        return self.behaviour.in_context_unigram_loss - self.behaviour.eval_loss

    @property
    def circuit_confirmed(self) -> bool:
        return self.circuit.confirmed

    @property
    def previous_token_head(self) -> Optional[tuple[int, int]]:
        """(layer, head) of the strongest lag-1 previous-token head of the circuit (None if the role is empty)."""
        return self.circuit.top_head("previous_token", 1)

    @property
    def induction_head(self) -> Optional[tuple[int, int]]:
        """(layer, head) of the strongest induction head of the circuit (None if the role is empty)."""
        return self.circuit.top_head("induction", self.circuit.order)

    @property
    def previous_token_ablation(self) -> Optional[float]:
        """Loss change when the lag-1 previous-token set is mean-ablated (None if empty)."""
        return self.circuit.role_ablation("previous_token", 1)

    @property
    def induction_ablation(self) -> Optional[float]:
        """Loss change when the induction set is mean-ablated (None if empty)."""
        return self.circuit.role_ablation("induction", self.circuit.order)

    def reference(self, name: str) -> Optional[float]:
        """A reference loss of theory ("entropy_rate", "unigram_loss", "bayes_loss"), None if not defined."""
        value = getattr(self.references, name, None)
        return None if value is None else float(value)

    # ------------------------------------------------------------------ display (notebooks, printing)
    def summary(self) -> str:
        """The verdict, the law check behind it, the circuit, the references, and why (a few lines)."""
        order = f"order {self.order}, " if self.order is not None else ""
        law = self.law
        lines = [
            f"{self.mechanism} ({order}{'confident' if self.confident else 'not confident'}): eval loss "
            f"{self.eval_loss:.4f} nats on {self.n_sequences} x {self.seq_len} states of {self.source}",
            f"closest law: {STRATEGY_LABELS.get(law.law, law.law)}, fit {law.fit_ratio:.3f} (needs <= "
            f"{self.thresholds.fit}), margin {law.margin_ratio:.3f} (needs <= {self.thresholds.margin})",
            f"circuit: {headline(self.circuit)}",
            f"references: {self.references.describe()}",
        ]
        return "\n".join(lines + [f"why: {self.reasons[0]}"] if self.reasons else lines)

    def to_dataframe(self) -> Any:
        """The per-head evidence, one row per head (index "L0H1"): the attention scores with their excess over
        chance (`AttentionScores.to_dataframe`) and the loss change when the head alone is mean-ablated.

        Returns:
            A pandas DataFrame.
        """
        frame = self.attention.to_dataframe()
        changes = dict(zip(self.ablation.names, self.ablation.loss_change))
        frame["ablation_loss_change"] = [changes.get(name, float("nan")) for name in frame.index]
        return frame

    def _html_tables(self) -> list[tuple[str, Any]]:
        # every piece of evidence with a table (the candidate laws first), then the per-head view
        return evidence_tables(self) + [("per head: scores, excess over chance, ablation cost", self.to_dataframe())]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: the label, its own-law check, every strategy divergence and gap, the circuit's
        role sets with their scores and set-ablation costs, the per-head scores, ablations, behaviour."""
        refs = self.references.as_row()
        b = self.behaviour
        return json_safe({
            "mechanism": self.mechanism, "order": self.order, "confident": self.confident,
            "reasons": list(self.reasons), "law": self.law.to_dict(), "strategies": self.strategies.to_dict(),
            "circuit": self.circuit.to_dict(), "eval_loss": b.eval_loss,
            "entropy_rate": self.reference("entropy_rate"), "unigram_loss": self.reference("unigram_loss"),
            "references": refs, "state_dependence": b.state_dependence,
            "reference_state_dependence": b.reference_state_dependence, "state_ratio": self.state_ratio,
            "context_dependence": b.context_dependence, "reference_context_dependence": b.reference_context_dependence,
            "context_ratio": self.context_ratio, "bigram_gain": self.bigram_gain,
            "model_bigram_gain": self.model_bigram_gain, "icl_score": b.icl_score,
            "previous_token_head": _pair(self.previous_token_head), "induction_head": _pair(self.induction_head),
            "previous_token_ablation": self.previous_token_ablation, "induction_ablation": self.induction_ablation,
            "circuit_confirmed": self.circuit_confirmed, "heads": self.attention.to_dict(),
            "ablation": self.ablation.to_dict(), "readout": self.readout.to_dict(), "behaviour": b.to_dict(),
            "thresholds": self.thresholds.to_dict(), "source": self.source, "seq_len": self.seq_len,
            "n_sequences": self.n_sequences, "seed": self.seed,
        })


def _pair(head: Optional[tuple[int, int]]) -> Optional[list[int]]:
    return None if head is None else list(head)


def _ratio(value: float, reference: float) -> float:
    return value / reference if reference > 0 else (0.0 if value <= 0 else float("inf"))


# -------------------------------------------------------------------------------------------- decision
def _decide(law: LawCheck, circuit: Circuit, source_order: int, th: Thresholds) -> tuple[str, Optional[int], bool,
                                                                                          list[str]]:
    """(mechanism, order, confident, reasons) from the law check and the circuit."""
    label = STRATEGY_LABELS.get(law.law, law.law)
    reasons = [
        f"closest law: {label}, mean KL {law.divergence:.4f} nats = {law.fit_ratio:.3f} x the gap to the nearest "
        f"other law ({law.gap:.4f}; fit needs <= {th.fit}) and {law.margin_ratio:.3f} x the divergence to the "
        f"runner-up {STRATEGY_LABELS.get(law.runner_up, law.runner_up)} (margin needs <= {th.margin})"
    ]
    if not law.passed:
        reasons.insert(0, f"other: the predictions follow none of the candidate laws closely enough (closest: {label})")
        return "other", None, not law.near, reasons
    k = in_context_order(law.law)
    if law.law in _LABEL_OF_LAW:
        mech = _LABEL_OF_LAW[law.law]
        order = source_order if mech == "kernel" else None
        reasons.insert(0, f"{mech}: the model predicts with the {label}")
        return mech, order, not law.near, reasons
    assert k is not None and k >= 1
    reasons.append(circuit.summary())
    if circuit.confirmed:
        reasons.insert(0, f"induction (order {k}): the model follows the {label} through a circuit confirmed by "
                          "ablating each role's set of heads")
        return "induction", k, not (law.near or circuit.near), reasons
    reasons.insert(0, f"other: the model follows the {label}, but {circuit.missing()}")
    return "other", None, not (law.near or circuit.near), reasons


def probe_hook_names(model: Model) -> list[str]:
    """Every hook `classify_mechanism` reads from its cache (patterns and every component's output)."""
    return attention_hook_names(model) + sorted({c.hook_name for c in model_components(model)})


@torch.no_grad()
def classify_mechanism(
    model: Model,
    source: Any,
    *,
    batch: Optional[ProbeBatch] = None,
    cache: Optional[Any] = None,
    seq_len: Optional[int] = None,
    n_sequences: int = 64,
    seed: int = 0,
    beta: float | int | None = None,
    thresholds: Thresholds = Thresholds(),
) -> MechanismReport:
    """Name the law `model` predicts `source` with and the circuit behind it (module docstring).

    The probes run on `batch` when given (a `ProbeBatch` from `sample_batch(source, ...)`; `cache` may hold a
    `run_with_cache` of it with `probe_hook_names`, only read), else on a fresh seeded batch of `n_sequences`
    x `seq_len` states (`seq_len` defaults to the model's training length when known, else min(n_ctx, 128):
    `probe_length`). `beta` defaults to the source's alpha (random kernels) or 1/2.

    >>> # report = classify_mechanism(model, BinaryChain(0.2, 0.3), seed=0); report.mechanism, report.order
    """
    check_source_matches(model, source)
    if batch is None:
        batch = sample_batch(source, n_sequences=n_sequences, seq_len=probe_length(model, seq_len), seed=seed)
    elif batch.vocab != source.vocab or batch.order != source.order:
        raise ValueError(f"the probe batch ({batch.vocab} states, order {batch.order}) is not from {source!r}")
    tokens = check_tokens(model, batch.tokens)
    names = probe_hook_names(model)
    if cache is None or any(name not in cache for name in names):
        logits, cache = model.run_with_cache(tokens, names_filter=names)
    else:
        logits = model(tokens)
    probs = torch.softmax(logits.double(), dim=-1)
    sim = strategy_similarity(model, batch, beta=beta, probs=probs)
    law = check_law(sim, thresholds)
    k = in_context_order(law.law) or batch.order  # the circuit order to look for (evidence for other laws)
    scores = attention_scores(model, batch.tokens, cache=cache, max_order=max(k, batch.order))
    table = ablation_table(model, tokens, method="mean", cache=cache, clean_probs=probs)
    circuit = find_circuit(model, batch, scores, table, order=max(k, 1), beta=sim.beta, probs=probs, cache=cache,
                           thresholds=thresholds)
    mechanism, order, confident, reasons = _decide(law, circuit, batch.order, thresholds)
    return MechanismReport(
        mechanism=mechanism, order=order, confident=bool(confident), reasons=tuple(reasons), law=law,
        strategies=sim, circuit=circuit, behaviour=behaviour(model, batch, beta=beta, probs=probs, n_flip_positions=4),
        attention=scores, ablation=table, readout=kernel_readout(model, batch, probs=probs),
        references=theory.reference_losses(source, int(batch.tokens.shape[1])),  # of the source: cached
        thresholds=thresholds, source=repr(source), seq_len=int(batch.tokens.shape[1]),
        n_sequences=int(batch.tokens.shape[0]), seed=seed,
    )
