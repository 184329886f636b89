"""`classify_mechanism`: which law does a model predict with, and through which causal circuit?

**Labels** (`MECHANISMS`), each naming a law:

- `uniform`: the untrained law 1/V;
- `unigram`: the stationary law pi, whatever the context (Makkuva et al.'s bad minimum; fixed chains);
- `in_context_unigram`: the in-context state frequencies (Edelman et al.'s unigram phase);
- `state_and_counts`: the best law of the current state and the in-context state counts (random kernels): what
  one attention layer can compute (`strategies.state_and_counts_probs`);
- `kernel`: the source's kernel held in the weights (fixed chains): the model follows the kernel *and* keeps
  following it on sequences of another kernel (`kernel_swap`); `order` = the source's order;
- `induction`: an in-context law of order k >= 1 *and* an induction circuit among the edges kept by exhaustive
  path patching (`discovery.discover_circuit`, read by `circuit.read_circuit`: a kept edge from a previous-token
  head into a later head's keys); `order` = k;
- `other`: the model follows no candidate law and moves towards none whose requirements it meets (or follows an
  in-context law with no circuit to carry it); the reasons name the nearest law and the circuit found.

**Evidence** (all on one probe batch, plus the kernel-swap sequences):

1. *law check* (`check_law`): d(s) = mean KL(s || model) for every candidate law s; the closest law s* is the
   model's law when d(s*) <= `fit` x gap(s*) (gap: the KL from the nearest other law to s*, on the same tokens)
   and d(s*) <= `margin` x d(runner-up);
2. *graded gains* (`gains.graded_gains`): g_k, the fraction of the step from the in-context law of order k - 1 to
   that of order k the model has climbed;
3. *kernel swap* (`kernel_swap.kernel_swap`): the in-context fraction f on sequences of kernels the model was not
   trained on (0: it predicts from its weights, 1: it follows the context);
4. *circuit* (`discovery.discover_circuit` with resample corruption): every edge's path-patching effect, the kept
   edges, and the previous-token -> induction K-edges among them (`circuit.read_circuit`).

**Decision.** When the law check passes, the label is the law's, with its requirement: on a fixed chain the
kernel and the in-context laws (which converge to each other at long contexts) are told apart by f (below
`in_weights`: `kernel`; above: the in-context law of the source's order); an in-context law of order >= 1 needs
the K-edge (`induction`), else `other`. When it fails the model sits between laws (mid-transition), and the label
is that of the law it is moving to, with `confident=False`: the best (lowest-loss) candidate law whose step it has
begun (its loss below the law one step down: g_k > 0 for the in-context law of order k) and whose requirement it
meets (the kernel: held in weights; an in-context law of order k >= 1: the K-edge); so a one-layer model is named by
the state-and-counts law, a two-layer one with the circuit by the in-context law its circuit computes, even when it
already does a little better than the law (a one-layer model that uses a little more than the law), up to a quarter
of the step to the next better law (`BEYOND`; one-layer models were measured up to 0.18 of it, docs/circuits.md).
`other` when there is none (a model worse than the uniform law, or one well past every law it qualifies for: an in-
context gain without a circuit the graph shows). `confident=False` also when a ratio lies within a factor `near` of
its cut.

Thresholds (`Thresholds`) were set from the distributions measured over trained models (docs/circuits.md: 112
runs, attention-only models of depth 1-3 with 1-2 heads per layer on random kernels of order 1 and 2 and two
fixed-chain controls, 8 seeds each, probed at four training steps: 408 models); see `Thresholds` for the numbers.
"""

import dataclasses
import math
from typing import Any, Optional

import torch

from markov_interp import theory
from markov_interp.data import Source
from markov_interp.models import HookedModel
from markov_interp.probes._common import (
    ProbeBatch,
    check_source_matches,
    check_tokens,
    json_safe,
    probe_length,
    sample_batch,
)
from markov_interp.probes._display import ProbeResult, displayed, evidence_tables, headline
from markov_interp.probes.ablation import AblationTable, ablation_table, model_components
from markov_interp.probes.attention import AttentionScores, attention_hook_names, attention_scores
from markov_interp.probes.behaviour import BehaviourReport, behaviour
from markov_interp.probes.circuit import Circuit, read_circuit
from markov_interp.probes.discovery import MIN_EFFECT, MIN_FRACTION, CircuitGraph, discover_circuit
from markov_interp.probes.gains import Gains, graded_gains
from markov_interp.probes.kernel_swap import KernelSwap, kernel_swap
from markov_interp.probes.readout import KernelReadout, kernel_readout
from markov_interp.probes.strategies import (
    STATE_AND_COUNTS,
    STRATEGY_LABELS,
    StrategySimilarity,
    in_context_name,
    in_context_order,
    strategy_similarity,
)

MECHANISMS = ("uniform", "unigram", "in_context_unigram", "state_and_counts", "kernel", "induction", "other")
BEYOND = 0.25  # a model past the best law it qualifies for keeps its label up to a quarter of the next step
_LABEL_OF_LAW = {"uniform": "uniform", "stationary": "unigram", "in_context_unigram": "in_context_unigram",
                 STATE_AND_COUNTS: "state_and_counts"}


@displayed
@dataclasses.dataclass(frozen=True, kw_only=True)
class Thresholds:
    """The documented cut-offs of `classify_mechanism` (module docstring), with the distributions they were read
    from: 408 trained models (docs/circuits.md: attention-only, depth 1-3, 1-2 heads per layer, random kernels of
    order 1 and 2, 8 seeds each, at steps 65 / 186 / 528 / 1500, and fixed-chain controls).

    - `fit` 0.75, `margin` 0.6 (law check): every trained model whose law check passed had fit <= 0.72 and margin
      <= 0.58 (90% below 0.59 and 0.50); models between laws sit above them (medians 1.54 and 0.76). Exact
      hand-built laws are below 1e-3, hand-built circuits (a linear read-out of counts) 0.2-0.45.
    - `in_weights` 0.5 (kernel swap, fixed chains): trained fixed-chain models have f <= 0.10 (64 models), the
      hand-built induction circuit on a fixed chain 0.89, so the middle of [0, 1] is the cut.
    - `head_excess` 0.2: the spread previous-token excess of heads below the last layer is bimodal (446 of 536
      measurements below 0.05, 68 at or above 0.2, 22 between); senders of kept K-edges in `induction` models are
      all >= 0.20, other heads below 0.02 in 90% of cases (once 0.42).
    - `edge_min`, `edge_fraction` (`discovery`): the kept-edge rule, effect >= max(edge_min, edge_fraction x
      total effect), lowered until faithfulness 0.9: reached in 380 of the 408 models (median 0.98).
    - `near` 1.5: a ratio within a factor 1.5 of its cut makes the call unconfident.
    """

    fit: float = 0.75
    margin: float = 0.6
    near: float = 1.5
    head_excess: float = 0.2
    in_weights: float = 0.5
    edge_min: float = MIN_EFFECT
    edge_fraction: float = MIN_FRACTION

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"threshold {f.name} must be a number >= 0, got {value!r}")
        if self.near < 1:
            raise ValueError(f"threshold near must be >= 1 (a factor), got {self.near!r}")

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


@displayed(line=lambda c: f"{c.law}: fit {c.fit_ratio:.3f}, margin {c.margin_ratio:.3f}, passed {c.passed}")
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
    d2 = sim.divergences[runner] if runner is not None else float("inf")
    fit, margin = _ratio(d, sim.gaps[law]), _ratio(d, d2)
    passed = fit <= th.fit and margin <= th.margin
    clear_pass = fit <= th.fit / th.near and margin <= th.margin / th.near
    clear_fail = fit > th.fit * th.near or margin > th.margin * th.near
    return LawCheck(law=law, divergence=d, gap=sim.gaps[law], runner_up=runner,
                    runner_up_divergence=None if runner is None else d2, fit_ratio=fit, margin_ratio=margin,
                    passed=passed, near=not (clear_pass or clear_fail))


def _ratio(value: float, reference: float) -> float:
    return value / reference if reference > 0 else (0.0 if value <= 0 else float("inf"))


def _pair(head: Optional[tuple[int, int]]) -> Optional[list[int]]:
    return None if head is None else list(head)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class MechanismReport(ProbeResult):
    """What `classify_mechanism` decided and all the evidence behind it (module docstring).

    `gains` (k -> g_k with `.se`), `in_context_fraction` (kernel swap, with `kernel_swap.se`), `circuit` (the
    discovered `CircuitGraph`) and `induction` (the previous-token -> induction reading of it) are the causal
    evidence; `strategies` and `law` the law check; the rest is supporting evidence (attention scores, single
    component ablations, behaviour, the implied kernel).
    """

    mechanism: str  # one of MECHANISMS
    order: Optional[int]  # k for "kernel" and "induction", None otherwise
    confident: bool
    reasons: tuple[str, ...]  # one sentence per step of the decision, with the numbers
    law: LawCheck
    strategies: StrategySimilarity
    gains: Gains
    kernel_swap: KernelSwap
    circuit: CircuitGraph
    induction: Circuit
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

    @property
    def in_context_fraction(self) -> float:
        """The kernel-swap in-context fraction in [0, 1] (SE: `kernel_swap.se`)."""
        return self.kernel_swap.in_context_fraction

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
        """A previous-token -> induction K-edge is among the kept edges."""
        return self.induction.found

    @property
    def previous_token_head(self) -> Optional[tuple[int, int]]:
        """(layer, head) sending the strongest kept previous-token -> induction K-edge (None without one)."""
        return self.induction.top_head("previous_token")

    @property
    def induction_head(self) -> Optional[tuple[int, int]]:
        """(layer, head) receiving the strongest kept previous-token -> induction K-edge (None without one)."""
        return self.induction.top_head("induction")

    @property
    def previous_token_ablation(self) -> Optional[float]:
        """Loss change when that previous-token head is mean-ablated alone (None without one)."""
        head = self.previous_token_head
        return None if head is None else self.ablation[f"L{head[0]}H{head[1]}"]

    @property
    def induction_ablation(self) -> Optional[float]:
        """Loss change when that induction head is mean-ablated alone (None without one)."""
        head = self.induction_head
        return None if head is None else self.ablation[f"L{head[0]}H{head[1]}"]

    def reference(self, name: str) -> Optional[float]:
        """A reference loss of theory ("entropy_rate", "unigram_loss", "bayes_loss"), None if not defined."""
        value = getattr(self.references, name, None)
        return None if value is None else float(value)

    # ------------------------------------------------------------------ display (notebooks, printing)
    def summary(self) -> str:
        """The verdict, the law check behind it, the gains, the kernel swap, the circuit, and why (a few lines)."""
        order = f"order {self.order}, " if self.order is not None else ""
        law = self.law
        lines = [
            f"{self.mechanism} ({order}{'confident' if self.confident else 'not confident'}): eval loss "
            f"{self.eval_loss:.4f} nats on {self.n_sequences} x {self.seq_len} states of {self.source}",
            f"closest law: {STRATEGY_LABELS.get(law.law, law.law)}, fit {law.fit_ratio:.3f} (needs <= "
            f"{self.thresholds.fit}), margin {law.margin_ratio:.3f} (needs <= {self.thresholds.margin})",
            f"gains {self.gains.describe()}; in-context fraction {self.in_context_fraction:.2f}",
            f"circuit: {headline(self.circuit)}",
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
        """JSON-ready summary: the label and its reasons, the law check, gains, kernel swap, the circuit graph
        (every edge) and its induction reading, per-head scores, ablations, behaviour."""
        b = self.behaviour
        return json_safe({
            "mechanism": self.mechanism, "order": self.order, "confident": self.confident,
            "reasons": list(self.reasons), "law": self.law.to_dict(), "strategies": self.strategies.to_dict(),
            "gains": self.gains.to_dict(), "in_context_fraction": self.in_context_fraction,
            "kernel_swap": self.kernel_swap.to_dict(), "circuit": self.circuit.to_dict(),
            "induction": self.induction.to_dict(), "eval_loss": b.eval_loss,
            "entropy_rate": self.reference("entropy_rate"), "unigram_loss": self.reference("unigram_loss"),
            "references": self.references.as_row(), "state_ratio": self.state_ratio,
            "context_ratio": self.context_ratio, "bigram_gain": self.bigram_gain,
            "model_bigram_gain": self.model_bigram_gain, "icl_score": b.icl_score,
            "previous_token_head": _pair(self.previous_token_head), "induction_head": _pair(self.induction_head),
            "previous_token_ablation": self.previous_token_ablation, "induction_ablation": self.induction_ablation,
            "circuit_confirmed": self.circuit_confirmed, "heads": self.attention.to_dict(),
            "ablation": self.ablation.to_dict(), "readout": self.readout.to_dict(), "behaviour": b.to_dict(),
            "thresholds": self.thresholds.to_dict(), "source": self.source, "seq_len": self.seq_len,
            "n_sequences": self.n_sequences, "seed": self.seed,
        })


# -------------------------------------------------------------------------------------------- decision
@dataclasses.dataclass(frozen=True)
class _Evidence:
    law: LawCheck
    sim: StrategySimilarity
    gains: Gains
    swap: KernelSwap
    induction: Circuit
    graph: CircuitGraph
    random_kernel: bool
    source_order: int


def _in_weights(ev: _Evidence, th: Thresholds) -> tuple[bool, bool]:
    """(the model predicts from its weights, that call is near the cut) from the kernel swap."""
    f = ev.swap.in_context_fraction
    return f < th.in_weights, th.in_weights / th.near <= f <= th.in_weights * th.near


def _label(name: str, ev: _Evidence, th: Thresholds) -> tuple[str, Optional[int], bool, Optional[str]]:
    """(mechanism, order, near, why-not) for the candidate law `name`; why-not says what requirement fails."""
    if name in _LABEL_OF_LAW:
        return _LABEL_OF_LAW[name], None, False, None
    k = in_context_order(name)
    near = False
    if not ev.random_kernel:  # kernel and in-context laws of a fixed chain: weights or context?
        weights, near = _in_weights(ev, th)
        if weights:
            return "kernel", ev.source_order, near, None
        k = k or ev.source_order
    if ev.induction.found:
        return "induction", k, near, None
    return "other", None, near, f"it follows the {STRATEGY_LABELS[name]} without an induction circuit: " \
                                f"{ev.induction.missing()}"


def _eligible(name: str, ev: _Evidence, th: Thresholds) -> bool:
    """Whether a model between laws can be moving to law `name`: it has begun the step to it (its loss is below
    the law one step down the ladder: uniform for pi and the in-context unigram, the in-context unigram for the
    state-and-counts law, pi for the kernel, the order k - 1 law for the order k one) and meets its requirement
    (the kernel: predicted from the weights; an in-context law of order k >= 1: the K-edge kept, and on fixed
    chains the context read)."""
    if name == "uniform":
        return False
    k = in_context_order(name)
    lower = {"stationary": "uniform", in_context_name(0): "uniform", STATE_AND_COUNTS: in_context_name(0),
             "kernel": "stationary"}.get(name, in_context_name(k - 1) if k else "uniform")
    if not ev.gains.model_loss < ev.sim.losses.get(lower, math.inf):
        return False
    if name in _LABEL_OF_LAW:
        return True
    weights = not ev.random_kernel and _in_weights(ev, th)[0]
    if name == "kernel":
        return weights
    return ev.induction.found and not weights


def _target(ev: _Evidence, th: Thresholds) -> tuple[Optional[str], bool]:
    """(the law a model between laws is moving to, whether it is already beyond it): the best (lowest-loss) law
    it has begun the step to and meets the requirement of (`_eligible`); beyond it when the model's loss is lower
    still (it meets the requirement of no better law)."""
    eligible = [(loss, n) for n, loss in ev.sim.losses.items() if n in ev.sim.candidates and _eligible(n, ev, th)]
    if not eligible:
        return None, False
    loss, name = min(eligible)
    model = ev.gains.model_loss
    if loss < model:
        return name, False
    better = [x for n, x in ev.sim.losses.items() if n in ev.sim.candidates and x < loss]
    if better and loss - model > BEYOND * (loss - max(better)):  # past half the next step: not that law any more
        return None, False
    return name, True


def _nearest(ev: _Evidence) -> str:
    d = ev.sim.divergences
    return f"{STRATEGY_LABELS[ev.law.law]} (mean KL {d[ev.law.law]:.4f} nats)"


def _evidence_reasons(ev: _Evidence, th: Thresholds) -> list[str]:
    law, swap = ev.law, ev.swap
    out = [
        f"closest law: {STRATEGY_LABELS[law.law]}, mean KL {law.divergence:.4f} nats = {law.fit_ratio:.3f} x the gap "
        f"to the nearest other law ({law.gap:.4f}; fit needs <= {th.fit}) and {law.margin_ratio:.3f} x the "
        f"divergence to the runner-up {STRATEGY_LABELS.get(law.runner_up, law.runner_up)} (margin needs <= "
        f"{th.margin})",
        f"graded gains (fraction of each step up the in-context ladder; g_1: unigram -> bigram): "
        f"{ev.gains.describe()}",
        f"kernel swap: in-context fraction {swap.in_context_fraction:.2f} +- {swap.se:.2f} ({swap.description})",
        ev.graph.summary() + "; " + ev.induction.summary(),
    ]
    return out


def _decide(ev: _Evidence, th: Thresholds) -> tuple[str, Optional[int], bool, list[str]]:
    """(mechanism, order, confident, reasons) from the evidence (module docstring)."""
    reasons = _evidence_reasons(ev, th)
    if ev.law.passed:
        mech, order, near, why_not = _label(ev.law.law, ev, th)
        if why_not is None:
            reasons.insert(0, f"{mech}{'' if order is None else f' (order {order})'}: the model follows the "
                              f"{STRATEGY_LABELS[ev.law.law]}" + (" through a kept previous-token -> induction "
                                                                  "K-edge" if mech == "induction" else ""))
        else:
            reasons.insert(0, f"other: {why_not}; nearest law {_nearest(ev)}")
        return mech, order, not (ev.law.near or near), reasons
    target, beyond = _target(ev, th)
    if target is None:  # confident only for a model worse than the uniform law: no law at all
        worse = ev.gains.model_loss >= ev.sim.losses.get("uniform", math.inf)
        reasons.insert(0, f"other: the model follows no candidate law and moves towards none whose requirement it "
                          f"meets; nearest law {_nearest(ev)}; {ev.induction.summary()}")
        return "other", None, worse and not ev.law.near, reasons
    mech, order, _, _ = _label(target, ev, th)
    where = (f"does better than the {STRATEGY_LABELS[target]} (loss {ev.sim.losses[target]:.4f}) without meeting "
             "the requirement of any better law" if beyond else
             f"moves towards the {STRATEGY_LABELS[target]} (loss {ev.sim.losses[target]:.4f})")
    reasons.insert(0, f"{mech}{'' if order is None else f' (order {order})'}, not confident: the model sits "
                      f"between laws (loss {ev.gains.model_loss:.4f} nats) and {where}; nearest law {_nearest(ev)}")
    return mech, order, False, reasons


def probe_hook_names(model: HookedModel) -> list[str]:
    """Every hook `classify_mechanism` reads from its cache (patterns and every component's output)."""
    return attention_hook_names(model) + sorted({c.hook_name for c in model_components(model)})


# ------------------------------------------------------------------------------------------------ entry
@torch.no_grad()
def classify_mechanism(
    model: HookedModel,
    source: Source,
    *,
    batch: Optional[ProbeBatch] = None,
    cache: Optional[Any] = None,
    seq_len: Optional[int] = None,
    n_sequences: int = 64,
    circuit_sequences: int = 16,
    seed: int = 0,
    beta: float | int | None = None,
    thresholds: Thresholds = Thresholds(),
) -> MechanismReport:
    """Name the law `model` predicts `source` with and the causal circuit behind it (module docstring).

    Args:
        model: a hooked model.
        source: the source it was trained on.
        batch: a `ProbeBatch` from `sample_batch(source, ...)` to probe on (default: a fresh seeded batch of
            `n_sequences` x `seq_len` states, `seq_len` from `probe_length(model)`).
        cache: a `run_with_cache` of `batch` holding `probe_hook_names(model)` (only read).
        circuit_sequences: how many of the batch's sequences path patching runs on (every edge costs about two
            forward passes of them).
        seed: seed of the probe batch, the corruption and the kernel-swap sequences.
        beta: add-beta smoothing of the in-context laws (default: the source's alpha, or 1/2).
        thresholds: the cut-offs (`Thresholds`).

    Returns:
        A `MechanismReport` (label, order, confidence, reasons and every piece of evidence).

    >>> # report = classify_mechanism(model, RandomMarkov(3), seed=0); report.mechanism, report.order
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
    seq = int(batch.tokens.shape[1])
    graph = discover_circuit(model, source, batch=batch, n_sequences=min(circuit_sequences, batch.tokens.shape[0]),
                             seed=seed, min_effect=thresholds.edge_min, min_fraction=thresholds.edge_fraction)
    scores = attention_scores(model, batch.tokens, cache=cache, max_order=batch.order, max_lag=batch.order + 1)
    ev = _Evidence(law=check_law(sim, thresholds), sim=sim, gains=graded_gains(probs, batch, beta=sim.beta),
                   swap=kernel_swap(model, source, seq_len=seq, n_sequences=batch.tokens.shape[0], seed=seed),
                   induction=read_circuit(graph, scores, order=batch.order, head_excess=thresholds.head_excess),
                   graph=graph, random_kernel=batch.random_kernel, source_order=batch.order)
    mechanism, order, confident, reasons = _decide(ev, thresholds)
    return MechanismReport(
        mechanism=mechanism, order=order, confident=bool(confident), reasons=tuple(reasons), law=ev.law,
        strategies=sim, gains=ev.gains, kernel_swap=ev.swap, circuit=graph, induction=ev.induction,
        behaviour=behaviour(model, batch, beta=beta, probs=probs, n_flip_positions=4), attention=scores,
        ablation=ablation_table(model, tokens, method="mean", cache=cache, clean_probs=probs),
        readout=kernel_readout(model, batch, probs=probs),
        references=theory.reference_losses(source, seq),  # of the source: cached
        thresholds=thresholds, source=repr(source), seq_len=seq, n_sequences=int(batch.tokens.shape[0]), seed=seed,
    )
