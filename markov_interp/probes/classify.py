"""`classify_mechanism`: which circuit does a model compute with, and which law do its outputs reach?

Two axes, reported apart:

- **circuit** (`MechanismReport.circuit`, a `circuit.CircuitVerdict`): what structure the causal evidence shows.
  Path patching of every edge (`discovery.discover_circuit`: a token pass and a positional pass, joint tests that
  drop cancelling pairs) gives the kept edges; interchange interventions along each (`edge_content`) say what
  they carry; `circuit.read_circuit` reads the roles from that: previous-token heads (a K-edge carrying a lagged
  state, directly or relayed) -> induction heads (whose query carries the current state), and switch-counting
  heads. Kinds: `induction` (with its **order read from the lags** its previous-token heads carry:
  `circuit.lag_channels`), `switch_counting` (keys by the keys' own state, switch statistics in), `kernel` (the
  kernel swap finds the prediction in the weights), `state_counting` (heads carry the context, neither), `none`;
- **law** (`MechanismReport.law`, a `law.LawVerdict`): which candidate law the outputs reach, compared raw and
  after fitting one temperature per model on the probe batch (`law.fit_temperature`), with the graded gains g_k and
  their SEs (`gains.graded_gains`).

**Labels** (`MECHANISMS`, `.mechanism`), each naming a law or a circuit:

- `uniform`: the untrained law 1/V;
- `unigram`: the stationary law pi, whatever the context (Makkuva et al.'s bad minimum; fixed chains);
- `in_context_unigram`: the in-context state frequencies (Edelman et al.'s unigram phase);
- `state_and_counts`: the best law of the current state and the in-context state counts (random kernels): what
  one attention layer can compute (`strategies.state_and_counts_probs`);
- `kernel`: the source's kernel held in the weights (fixed chains): the model follows the kernel *and* keeps
  following it on sequences of another kernel (`kernel_swap`); `order` = the source's order;
- `induction`: an induction circuit among the kept edges (a kept edge carrying a lagged state into the keys of a
  head whose query carries the current state); `order` = its lag channels;
- `switch_counting`: a switch-counting circuit among the kept edges and no induction circuit (order 1): on two
  states, the in-context bigram law from the switches into the current state's positions;
- `other`: the model follows no candidate law and moves towards none whose requirements it meets (or follows an
  in-context law with no circuit to carry it); the reasons name the nearest law and the circuit found.

**Decision.** The headline names the circuit where one is found and the kept circuit is faithful (faithfulness
at least `circuit.FAITHFUL` 0.5; below it no circuit is named and no label that reads the context is confident;
the context-free labels `CONTEXT_FREE` rest on the law and the kernel swap, not on a circuit): a model whose induction
(or switch-counting) circuit is kept is `induction` of the circuit's order (`switch_counting`), whatever its law,
and `qualifier` says where the law lags the circuit: "partial" when the outputs sit between laws or at a lower law
(mid-training), "miscalibrated" when they reach the circuit's law only once the temperature is fitted; then
`confident` is False. Without a named circuit the label is the law's, with its requirement: on a fixed chain the
kernel and the in-context laws (which converge at long contexts) are told apart by the kernel swap (f below
`in_weights`: `kernel`); an in-context law of order >= 1 needs a named circuit, else `other` (the reasons say what
each kept K-edge carries and every variable tried). When the law check fails the model sits between laws, and the
label is that of the law it is moving to, with `confident=False`: the best (lowest-loss) candidate law whose step
it has begun (its loss below the law one step down) and whose requirement it meets, up to a quarter of the step
past it (`BEYOND`). `other` when there is none. `confident=False` also when a ratio lies within a factor `near` of
its cut.

Thresholds (`Thresholds`) were set from the distributions measured over trained models (docs/circuits.md); see
`Thresholds` for the numbers. The probe batch is `PROBE_SEQUENCES` sequences by default, path patching runs on
its first `circuit_sequences`: `discover_circuit` with the same seed draws the same sequences, so the graph (and
its faithfulness) is the same in both.
"""

import dataclasses
import math
from typing import Any, Optional

import torch
from torch import Tensor

from markov_interp import theory
from markov_interp._threads import one_thread_if_tiny
from markov_interp.config import bounds, check_fields
from markov_interp.sources import KernelSource, Source
from markov_interp.models import HookedModel
from markov_interp.probes._common import (
    PROBE_SEQUENCES,
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
from markov_interp.probes.behaviour import BehaviourReport, behaviour_report
from markov_interp.probes.circuit import FAITHFUL, Circuit, CircuitVerdict, circuit_verdict, no_circuit, read_circuit
from markov_interp.probes.discovery import (
    CIRCUIT_SEQUENCES,
    MIN_EFFECT,
    MIN_FRACTION,
    CircuitGraph,
    discover_circuit,
    faithfulness_text,
    head_of_batch,
)
from markov_interp.probes.interchange import CARRIES, EdgeContent, edge_content, measurable
from markov_interp.probes.gains import Gains, graded_gains
from markov_interp.probes.kernel_swap import KernelSwap, swap_kernels
from markov_interp.probes.paths import additive
from markov_interp.probes.law import (  # noqa: F401 (LawCheck, check_law: their public home was here)
    LawCheck,
    LawVerdict,
    check_law,
    fitted_similarity,
    law_verdict,
    with_target,
)
from markov_interp.probes.readout import KernelReadout, kernel_readout
from markov_interp.probes.strategies import (
    STATE_AND_COUNTS,
    STRATEGY_LABELS,
    StrategySimilarity,
    in_context_name,
    in_context_order,
    strategy_probs,
    strategy_similarity,
)

__all__ = ["MECHANISMS", "QUALIFIERS", "MechanismReport", "Thresholds", "classify_mechanism", "probe_hook_names"]

MECHANISMS = ("uniform", "unigram", "in_context_unigram", "state_and_counts", "kernel", "induction", "switch_counting",
              "other")
NAMED_CIRCUITS = ("induction", "switch_counting")  # circuit kinds the headline names (when faithful)
# labels whose law ignores the context: no circuit carries them, so the kept circuit's faithfulness (of a context
# effect that may be nil) does not bear on their confidence
CONTEXT_FREE = ("uniform", "unigram", "kernel")
QUALIFIERS = ("partial", "miscalibrated")
BEYOND = 0.25  # a model past the best law it qualifies for keeps its label up to a quarter of the next step
CONTENT_POOL = 512  # sequences the edge content draws donors from (the probe batch, and more of the source)
BEHAVIOUR_SEQUENCES = 128  # the behaviour evidence (not read by the decision) compares sequences pairwise: its cost
_LABEL_OF_LAW = {"uniform": "uniform", "stationary": "unigram", "in_context_unigram": "in_context_unigram",
                 STATE_AND_COUNTS: "state_and_counts"}


@displayed
@dataclasses.dataclass(frozen=True, kw_only=True)
class Thresholds:
    """The documented cut-offs of `classify_mechanism` (module docstring), with the distributions they were read
    from (docs/circuits.md: attention-only models of depth 1-3, 1-2 heads per layer, on random kernels of order
    1 and 2 and fixed-chain controls, probed at four training steps).

    - `fit` 0.75, `margin` 0.6 (law check, on the temperature-fitted distances): models whose law check passed sit
      below them, models between laws above (docs/circuits.md has the quantiles). Exact hand-built laws are below
      1e-3.
    - `in_weights` 0.5 (kernel swap, fixed chains): trained fixed-chain models have f <= 0.10, the hand-built
      induction circuit on a fixed chain 0.89, so the middle of [0, 1] is the cut.
    - `head_excess` 0.2: the spread previous-token excess of heads below the last layer is bimodal; senders of
      kept K-edges in `induction` models are >= 0.20, other heads near 0.
    - `edge_min`, `edge_fraction` (`discovery`): the kept-edge rule, effect >= max(edge_min, edge_fraction x
      total effect), lowered until faithfulness 0.9.
    - `near` 1.5: a ratio within a factor 1.5 of its cut makes the call unconfident.
    - `carries` 0.75 (`edge_content`): the explained fraction a variable needs for an edge to carry it; hand-built
      circuits' edges carry theirs at 0.99-1.00, trained models' previous-token K-edges lag1 at 1.00 (three states),
      the variables of unrelated edges stay below 0.7 (docs/circuits.md).
    """

    fit: float = bounds(minimum=0, finite=False, default=0.75)
    margin: float = bounds(minimum=0, finite=False, default=0.6)
    near: float = bounds(minimum=0, finite=False, default=1.5)
    head_excess: float = bounds(minimum=0, finite=False, default=0.2)
    in_weights: float = bounds(minimum=0, finite=False, default=0.5)
    edge_min: float = bounds(minimum=0, finite=False, default=MIN_EFFECT)
    edge_fraction: float = bounds(minimum=0, finite=False, default=MIN_FRACTION)
    carries: float = bounds(minimum=0, finite=False, default=CARRIES)

    def __post_init__(self) -> None:
        check_fields(self, prefix="threshold ")  # numbers >= 0 (inf allowed: a cut never met)
        if self.near < 1:
            raise ValueError(f"threshold near must be >= 1 (a factor), got {self.near!r}")

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def _ratio(value: float, reference: float) -> float:
    return value / reference if reference > 0 else (0.0 if value <= 0 else float("inf"))


def _pair(head: Optional[tuple[int, int]]) -> Optional[list[int]]:
    return None if head is None else list(head)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class MechanismReport(ProbeResult):
    """What `classify_mechanism` decided and all the evidence behind it (module docstring).

    The two axes: `circuit` (a `CircuitVerdict`: kind, order from the lags, the kept edges of the graph it reads
    through) and `law` (a `LawVerdict`: the law reached raw and after the temperature fit, the gains g_k with
    SEs). `mechanism`, `order`, `qualifier` and `confident` are the headline (`label` in words). `graph` is the
    discovered `CircuitGraph`, `induction` its previous-token -> induction reading; `strategies` the raw law
    comparison and `fitted_strategies` the fitted one; the rest is supporting evidence (attention scores, single
    component ablations, behaviour on the batch's first `BEHAVIOUR_SEQUENCES` sequences, the implied kernel).
    """

    mechanism: str  # one of MECHANISMS
    order: Optional[int]  # k for "kernel" and "induction", None otherwise
    confident: bool
    reasons: tuple[str, ...]  # one sentence per step of the decision, with the numbers
    law: LawVerdict
    strategies: StrategySimilarity
    gains: Gains
    kernel_swap: KernelSwap
    circuit: CircuitVerdict
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
    qualifier: Optional[str] = None  # "partial" / "miscalibrated": the law lags the circuit
    fitted_strategies: Optional[StrategySimilarity] = None
    content: Optional[EdgeContent] = None  # what each kept edge carries (None: not measured; roles from attention)

    @property
    def graph(self) -> CircuitGraph:
        """The discovered graph (every edge's effects, the kept edges, faithfulness, joint tests)."""
        return self.circuit.graph

    @property
    def faithfulness(self) -> float:
        """The kept circuit's faithfulness in the token pass (1: the kept edges alone give the clean loss)."""
        return float(self.graph.faithfulness)

    @property
    def label(self) -> str:
        """The headline in words: "induction (order 2, partial)", "kernel (order 1)", "state_and_counts"."""
        bits = [f"order {self.order}"] if self.order is not None else []
        bits += [self.qualifier] if self.qualifier else []
        return self.mechanism + (f" ({', '.join(bits)})" if bits else "")

    @property
    def in_context_fraction(self) -> float:
        """The kernel-swap in-context fraction in [0, 1] (SE: `kernel_swap.se`)."""
        return self.kernel_swap.in_context_fraction

    @property
    def eval_loss(self) -> float:
        """The model's mean next-state loss (nats) on the whole probe batch."""
        return self.gains.model_loss

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
    def headline(self) -> str:
        """One line: the label and confidence, the kept circuit's faithfulness, the gains g_k +- SE, the kernel
        swap."""
        bits = ([f"order {self.order}"] if self.order is not None else []) + ([self.qualifier] if self.qualifier
                                                                              else [])
        bits.append("confident" if self.confident else "not confident")
        swap = f"in-context fraction {self.in_context_fraction:.2f} +- {self.kernel_swap.se:.2f}"
        circuit = ("no circuit" if self.circuit.kind == "none" else
                   f"faithfulness {faithfulness_text(self.faithfulness, short=True)}")
        gains = self.gains.describe() if self.gains_meaningful else "gains not shown (a fixed chain)"
        return f"{self.mechanism} ({', '.join(bits)}): {circuit}; {gains}; {swap}"

    @property
    def gains_meaningful(self) -> bool:
        """Whether the graded gains measure something about the task: only where it has an in-context component
        (random kernels, a pool of them). On a fixed chain a model holding the kernel in its weights beats every
        in-context law from the first position, so g_k grades the kernel, not in-context learning; the kernel swap
        answers there instead."""
        return bool(self.references.in_context)

    def summary(self) -> str:
        """The headline, then the two axes (circuit, law), the law check's numbers, and why (a few lines)."""
        law, th = self.law, self.thresholds
        lines = [
            self.headline(),
            f"circuit: {self.circuit.describe()}; {self.graph._headline()}",
            f"law: {law.describe()}; fit {law.fit_ratio:.3f} (needs <= {th.fit}), margin {law.margin_ratio:.3f} "
            f"(needs <= {th.margin}) after temperature {law.temperature:.2f}; raw: "
            f"{STRATEGY_LABELS.get(law.raw.law, law.raw.law)}, fit {law.raw.fit_ratio:.3f}",
            f"eval loss {self.eval_loss:.4f} nats on {self.n_sequences} x {self.seq_len} states of {self.source}",
        ]
        disagree = self.patching_vs_ablation()
        lines += [disagree] if disagree else []
        return "\n".join(lines + [f"why: {self.reasons[0]}"] if self.reasons else lines)

    def patching_vs_ablation(self) -> str:
        """Where path patching and mean ablation disagree on a head (a kept edge out of it costs at least five times
        what ablating the head does), one sentence naming the heads and what each intervention removes; "" where
        they agree. The two answer different questions, so both numbers stand."""
        changes = dict(zip(self.ablation.names, self.ablation.loss_change))
        found = []
        for head in self.graph.kept_heads():
            out = [e.strongest for e in self.graph.kept if e.sender == head]
            if out and head in changes and abs(max(out, key=abs)) >= 5 * abs(changes[head]):
                found.append(f"{head} ({max(out, key=abs):+.4f} vs {changes[head]:+.4f} nats)")
        if not found:
            return ""
        return ("path patching and mean ablation disagree on " + ", ".join(found) + ": path patching gives one edge "
                "the head's output on another sequence (wrong information, which the receiver follows), mean "
                "ablation gives every receiver the head's mean output (no information: the model falls back on what "
                "else it reads); a head whose ablation costs little can still carry what its kept edges feed")

    def _headline(self) -> str:
        return self.headline()

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
        """JSON-ready summary: the label, qualifier and reasons, the two axes (circuit: every edge of the graph
        with the reading; law: raw and fitted checks, temperature, gains), kernel swap, per-head scores,
        ablations, behaviour."""
        b = self.behaviour
        return json_safe({
            "mechanism": self.mechanism, "order": self.order, "confident": self.confident,
            "qualifier": self.qualifier, "label": self.label,
            "reasons": list(self.reasons), "law": self.law.to_dict(), "strategies": self.strategies.to_dict(),
            "fitted_strategies": None if self.fitted_strategies is None else self.fitted_strategies.to_dict(),
            "gains": self.gains.to_dict(), "in_context_fraction": self.in_context_fraction,
            "kernel_swap": self.kernel_swap.to_dict(), "circuit": self.circuit.to_dict(),
            "induction": self.induction.to_dict(), "eval_loss": self.eval_loss,
            "entropy_rate": self.reference("entropy_rate"), "unigram_loss": self.reference("unigram_loss"),
            "references": self.references.as_row(), "state_ratio": self.state_ratio,
            "context_ratio": self.context_ratio, "bigram_gain": self.bigram_gain,
            "model_bigram_gain": self.model_bigram_gain, "icl_score": b.icl_score,
            "previous_token_head": _pair(self.previous_token_head), "induction_head": _pair(self.induction_head),
            "previous_token_ablation": self.previous_token_ablation, "induction_ablation": self.induction_ablation,
            "circuit_confirmed": self.circuit_confirmed, "faithfulness": self.faithfulness,
            "content": None if self.content is None else self.content.to_dict(), "heads": self.attention.to_dict(),
            "ablation": self.ablation.to_dict(), "readout": self.readout.to_dict(), "behaviour": b.to_dict(),
            "thresholds": self.thresholds.to_dict(), "source": self.source, "seq_len": self.seq_len,
            "n_sequences": self.n_sequences, "seed": self.seed,
        })


# -------------------------------------------------------------------------------------------- decision
@dataclasses.dataclass(frozen=True)
class _Evidence:
    law: LawVerdict
    sim: StrategySimilarity  # raw
    gains: Gains
    swap: KernelSwap
    induction: Circuit
    circuit: CircuitVerdict
    random_kernel: bool
    source_order: int

    @classmethod
    def of(cls, law: "_LawSide", circuit: "_CircuitSide", batch: ProbeBatch) -> "_Evidence":
        return cls(law=law.law, sim=law.sim, gains=law.gains, swap=circuit.swap, induction=circuit.reading,
                   circuit=circuit.circuit, random_kernel=batch.random_kernel, source_order=batch.order)


@dataclasses.dataclass(frozen=True)
class _LawLabel:
    """The label a candidate law gives a model without a named circuit: `why_not` says what requirement fails
    (then the label is "other"); `near` when the kernel swap's call is near its cut."""

    mechanism: str
    order: Optional[int]
    near: bool
    why_not: Optional[str]


@dataclasses.dataclass(frozen=True)
class _Decision:
    """What `_decide` makes of the evidence: the headline, the reasons (first: why), the law moved to."""

    mechanism: str
    order: Optional[int]
    qualifier: Optional[str]
    confident: bool
    reasons: tuple[str, ...]
    target: Optional[str] = None


def _in_weights(ev: _Evidence, th: Thresholds) -> tuple[bool, bool]:
    """(the model predicts from its weights, that call is near the cut) from the kernel swap (fixed chains)."""
    if ev.random_kernel:
        return False, False
    f = ev.swap.in_context_fraction
    return f < th.in_weights, th.in_weights / th.near <= f <= th.in_weights * th.near


def _no_circuit(ev: _Evidence) -> str:
    """Why no circuit carries an in-context law of order >= 1, in words."""
    if ev.circuit.kind in NAMED_CIRCUITS and not ev.circuit.faithful:
        return (f"the kept circuit ({ev.circuit.describe()}) has faithfulness {ev.circuit.graph.faithfulness:.2f}, "
                f"below {FAITHFUL}: the kept edges do not carry the model's behaviour, so no circuit is named")
    if ev.circuit.kind == "switch_counting":
        return (f"without an induction circuit ({ev.induction.missing()}); the {ev.circuit.describe()} gives the "
                f"in-context bigram law, not the law of higher order the model follows")
    return f"without an induction or switch-counting circuit: {ev.induction.missing()}"


def _label(name: str, ev: _Evidence, th: Thresholds) -> _LawLabel:
    """The label of the candidate law `name` for a model without a named circuit."""
    if name in _LABEL_OF_LAW:
        return _LawLabel(_LABEL_OF_LAW[name], None, False, None)
    weights, near = _in_weights(ev, th)
    if weights:  # kernel and in-context laws of a fixed chain: the weights
        return _LawLabel("kernel", ev.source_order, near, None)
    return _LawLabel("other", None, near, f"it follows the {STRATEGY_LABELS[name]} {_no_circuit(ev)}")


def _eligible(name: str, ev: _Evidence, th: Thresholds) -> bool:
    """Whether a model between laws (and without a named circuit) can be moving to law `name`: it has begun
    the step to it (its loss is below the law one step down the ladder: uniform for pi and the in-context unigram,
    the in-context unigram for the state-and-counts law, pi for the kernel) and meets its requirement (the kernel:
    predicted from the weights; in-context laws of order >= 1 need the circuit, which this model lacks)."""
    if name == "uniform":
        return False
    lower = {"stationary": "uniform", in_context_name(0): "uniform", STATE_AND_COUNTS: in_context_name(0),
             "kernel": "stationary"}.get(name)
    if lower is None or not ev.gains.model_loss < ev.sim.losses.get(lower, math.inf):
        return False
    return _in_weights(ev, th)[0] if name == "kernel" else True


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
    if better and loss - model > BEYOND * (loss - max(better)):  # past a quarter of the next step: not that law
        return None, False
    return name, True


def _nearest(ev: _Evidence) -> str:
    return f"{STRATEGY_LABELS[ev.law.law]} (mean KL {ev.law.divergence:.4f} nats)"


def _check_text(check: LawCheck, th: Thresholds) -> str:
    return (f"{STRATEGY_LABELS[check.law]}, mean KL {check.divergence:.4f} nats = {check.fit_ratio:.3f} x the gap to "
            f"the nearest other law ({check.gap:.4f}; fit needs <= {th.fit}) and {check.margin_ratio:.3f} x the "
            f"divergence to the runner-up {STRATEGY_LABELS.get(check.runner_up, check.runner_up)} (margin needs <= "
            f"{th.margin})")


def _evidence_reasons(ev: _Evidence, th: Thresholds) -> list[str]:
    law, swap = ev.law, ev.swap
    content = ev.induction.content
    return [
        f"circuit: {ev.circuit.describe()} (faithfulness {ev.circuit.graph.faithfulness:.2f})",
        f"law: {law.describe()}; closest law as the outputs are: {_check_text(law.raw, th)}; at the fitted "
        f"temperature {law.temperature:.2f}: {_check_text(law.fitted, th)}",
        f"graded gains (fraction of each step up the in-context ladder; g_1: unigram -> bigram): "
        f"{ev.gains.describe()}",
        f"kernel swap: in-context fraction {swap.in_context_fraction:.2f} +- {swap.se:.2f} ({swap.description})",
        ev.circuit.graph.summary() + "; " + ev.induction.summary(),
    ] + ([f"edge content: {'; '.join(content.summary().splitlines()[1:])}"] if content is not None else [])


def _named_circuit(ev: _Evidence, reasons: list[str]) -> _Decision:
    """The headline of a model whose induction or switch-counting circuit is kept (and faithful): its order, and a
    qualifier where the law lags the circuit (module docstring)."""
    order, law, kind = ev.circuit.order, ev.law, ev.circuit.kind
    reached = None if law.status == "between" else (ev.source_order if law.law == "kernel" else
                                                     in_context_order(law.law))
    if reached is None or reached < order:
        qualifier = "partial"
        why = (f"the outputs lag the circuit: {law.describe()}; g_{order} = {ev.gains.get(order, math.nan):.2f} +- "
               f"{ev.gains.se.get(order, math.nan):.2f} of the step to the order-{order} law")
    elif law.status == "miscalibrated":
        qualifier, why = "miscalibrated", f"the outputs reach the circuit's law only up to calibration: {law.describe()}"
    else:
        qualifier, why = None, f"the outputs reach the circuit's law: {law.describe()}"
    reasons.insert(0, f"{kind} (order {order}{', ' + qualifier if qualifier else ''}): {ev.circuit.describe()}; "
                      f"{why}")
    target = in_context_name(order) if order <= 4 and law.status == "between" else None
    return _Decision(kind, order, qualifier, qualifier is None and not law.near, tuple(reasons), target)


def _at_law(ev: _Evidence, th: Thresholds, reasons: list[str]) -> _Decision:
    """The headline of a model without a named circuit whose law check passed: that law's label (module
    docstring)."""
    call = _label(ev.law.law, ev, th)
    if call.why_not is None:
        reasons.insert(0, f"{call.mechanism}{'' if call.order is None else f' (order {call.order})'}: the model "
                          f"follows the {STRATEGY_LABELS[ev.law.law]}" + (" up to calibration (temperature "
                                                                          f"{ev.law.temperature:.2f})" if
                                                                          ev.law.status == "miscalibrated" else ""))
    else:
        reasons.insert(0, f"other: {call.why_not}; nearest law {_nearest(ev)}")
    qualifier = "miscalibrated" if ev.law.status == "miscalibrated" and call.why_not is None else None
    return _Decision(call.mechanism, call.order, qualifier, not (ev.law.near or call.near or qualifier),
                     tuple(reasons))


def _between(ev: _Evidence, th: Thresholds, reasons: list[str]) -> _Decision:
    """The headline of a model without a named circuit between laws: the law it moves to, not confident."""
    target, beyond = _target(ev, th)
    if target is None:  # confident only for a model worse than the uniform law: no law at all
        worse = ev.gains.model_loss >= ev.sim.losses.get("uniform", math.inf)
        reasons.insert(0, f"other: the model follows no candidate law and moves towards none whose requirement it "
                          f"meets; nearest law {_nearest(ev)}; {ev.induction.summary()}")
        return _Decision("other", None, None, worse and not ev.law.near, tuple(reasons))
    call = _label(target, ev, th)
    where = (f"does better than the {STRATEGY_LABELS[target]} (loss {ev.sim.losses[target]:.4f}) without meeting "
             "the requirement of any better law" if beyond else
             f"moves towards the {STRATEGY_LABELS[target]} (loss {ev.sim.losses[target]:.4f})")
    reasons.insert(0, f"{call.mechanism}{'' if call.order is None else f' (order {call.order})'}, not confident: "
                      f"the model sits between laws (loss {ev.gains.model_loss:.4f} nats) and {where}; nearest law "
                      f"{_nearest(ev)}")
    return _Decision(call.mechanism, call.order, None, False, tuple(reasons), target)


def _decide(ev: _Evidence, th: Thresholds) -> _Decision:
    """The headline from the evidence (module docstring). A kept circuit whose faithfulness is below `FAITHFUL`
    is not named, and no label that reads the context is confident over it; nor is a switch-counting circuit in a
    model that follows an in-context law of higher order than the bigram law it computes."""
    reasons = _evidence_reasons(ev, th)
    beyond_bigram = ev.circuit.kind == "switch_counting" and ev.law.passed and (in_context_order(ev.law.law) or 0) > 1
    if ev.circuit.kind in NAMED_CIRCUITS and ev.circuit.faithful and not _in_weights(ev, th)[0] and not beyond_bigram:
        return _resolved(_named_circuit(ev, reasons), ev)
    decision = _at_law(ev, th, reasons) if ev.law.passed else _between(ev, th, reasons)
    if ev.circuit.faithful or decision.mechanism in CONTEXT_FREE:
        return _resolved(decision, ev)
    why = (f"not confident: the kept circuit's faithfulness {ev.circuit.graph.faithfulness:.2f} is below "
           f"{FAITHFUL}")
    return dataclasses.replace(decision, confident=False, reasons=(decision.reasons[0] + f"; {why}",
                                                                   *decision.reasons[1:]))


def _resolved(decision: _Decision, ev: _Evidence) -> _Decision:
    """`decision`, not confident where the reading hinges on an edge whose content lies within its bootstrap
    interval of the cut (`Circuit.unresolved`)."""
    unresolved = ev.induction.unresolved
    if not unresolved:
        return decision
    why = (f"not confident: what {', '.join(unresolved)} carr{'ies' if len(unresolved) == 1 else 'y'} is within the "
           f"bootstrap interval of the cut {ev.induction.content.cut} "
           f"({'; '.join(ev.induction.describe_edge(name) for name in unresolved)})")
    return dataclasses.replace(decision, confident=False, reasons=(decision.reasons[0] + f"; {why}",
                                                                   *decision.reasons[1:]))


def probe_hook_names(model: HookedModel) -> list[str]:
    """Every hook `classify_mechanism` reads from its cache (patterns and every component's output)."""
    return attention_hook_names(model) + sorted({c.hook_name for c in model_components(model)})


def _probe_batch(model: HookedModel, source: Source, batch: Optional[ProbeBatch], *, n_sequences: int,
                 seq_len: Optional[int], seed: int, thresholds: Thresholds) -> ProbeBatch:
    """The caller's probe batch, checked against `source`, or a fresh seeded one (and the source and thresholds
    checked)."""
    if not isinstance(source, KernelSource):
        raise ValueError(f"classify_mechanism names the law a model predicts a Markov chain's next state with, which "
                         f"needs a source with a kernel (a sources.KernelSource), got {type(source).__name__}; for a "
                         f"hidden Markov source probe the beliefs (probes.beliefs.belief_probes)")
    check_source_matches(model, source)
    if not isinstance(thresholds, Thresholds):
        raise TypeError(f"thresholds must be a Thresholds, got {type(thresholds).__name__}")
    if batch is None:
        return sample_batch(source, n_sequences=n_sequences, seq_len=probe_length(model, seq_len), seed=seed)
    if not isinstance(batch, ProbeBatch):
        raise TypeError(f"batch must be a ProbeBatch (probes.sample_batch), got {type(batch).__name__}")
    if batch.vocab != source.vocab or batch.order != source.order:
        raise ValueError(f"the probe batch ({batch.vocab} states, order {batch.order}) is not from {source!r}")
    return batch


# ------------------------------------------------------------------------------------------------ entry
@torch.no_grad()
def classify_mechanism(
    model: HookedModel,
    source: Source,
    *,
    batch: Optional[ProbeBatch] = None,
    cache: Optional[Any] = None,
    seq_len: Optional[int] = None,
    n_sequences: int = PROBE_SEQUENCES,
    circuit_sequences: int = CIRCUIT_SEQUENCES,
    seed: int = 0,
    beta: float | int | None = None,
    thresholds: Thresholds = Thresholds(),
    method: str = "auto",
    max_edges: Optional[int] = None,
    progress: Optional[bool] = None,
    content: bool = True,
) -> MechanismReport:
    """Name the circuit `model` computes with and the law its outputs reach on `source` (module docstring).

    Args:
        model, source: a hooked model and the source it was trained on.
        batch: a `ProbeBatch` from `sample_batch(source, ...)` to probe on (default: a fresh seeded batch of
            `n_sequences` x `seq_len` states, `seq_len` from `probe_length(model)`).
        cache: a `run_with_cache` of `batch` holding `probe_hook_names(model)` (only read).
        circuit_sequences: path patching runs on the batch's first this many (`discover_circuit`'s, by default).
        seed: seed of the probe batch, the corruptions and the kernel-swap sequences.
        beta: add-beta smoothing of the in-context laws (default: the source's alpha, or 1/2).
        thresholds: the cut-offs (`Thresholds`).
        method, max_edges, progress: `discover_circuit`'s (the method, a cap on exact measurements, a tqdm bar).
        content: read the roles from what the kept edges carry (`edge_content`); False (or a model whose residual
            stream is not additive) reads them from the attention scores (docs/circuits.md has the cost).

    Returns:
        A `MechanismReport` (label, qualifier, confidence, reasons, the circuit and law axes, all the evidence).

    >>> classify_mechanism(model, source, n_sequences=16, seed=0).mechanism  # a hand-built induction circuit
    'induction'
    """
    with one_thread_if_tiny(model):  # tiny models: one CPU thread (markov_interp.set_threads)
        batch = _probe_batch(model, source, batch, n_sequences=n_sequences, seq_len=seq_len, seed=seed,
                             thresholds=thresholds)
        tokens = check_tokens(model, batch.tokens)
        logits, cache = _logits_and_cache(model, tokens, cache)
        probs = torch.softmax(logits.double(), dim=-1)
        lawside = _law_evidence(model, batch, logits, probs, beta=beta, thresholds=thresholds)
        side = _circuit_evidence(model, source, batch, cache, n_sequences=min(circuit_sequences, len(batch.tokens)),
                                 seed=seed, thresholds=thresholds, method=method, max_edges=max_edges,
                                 progress=progress, content=content)
        decision = _decide(_Evidence.of(lawside, side, batch), thresholds)
        return MechanismReport(
            mechanism=decision.mechanism, order=decision.order, confident=bool(decision.confident),
            reasons=decision.reasons, law=with_target(lawside.law, decision.target), strategies=lawside.sim,
            gains=lawside.gains, kernel_swap=side.swap, circuit=_circuit_axis(side.circuit, decision.mechanism),
            induction=side.reading, attention=side.scores, thresholds=thresholds, source=repr(source),
            seq_len=int(batch.tokens.shape[1]), n_sequences=int(batch.tokens.shape[0]), seed=seed,
            qualifier=decision.qualifier, fitted_strategies=lawside.fitted, content=side.reading.content,
            **_side_probes(model, source, batch, tokens, cache, probs, beta=beta),
        )


def _circuit_axis(circuit: CircuitVerdict, mechanism: str) -> CircuitVerdict:
    """The circuit axis as the label allows it: a model labelled uniform runs no circuit (`circuit.no_circuit`),
    whatever edges the kept rule found in a tiny total effect."""
    if mechanism != "uniform":
        return circuit
    return no_circuit(circuit, f"the model predicts the uniform law, which reads nothing of its input (the edges "
                               f"kept from a total effect of {circuit.graph.total_effect:.4f} nats carry no "
                               "prediction)")


def _logits_and_cache(model: HookedModel, tokens: Tensor, cache: Optional[Any]) -> tuple[Tensor, Any]:
    """The model's logits on `tokens`, with a `run_with_cache` of `probe_hook_names` unless `cache` holds them all."""
    names = probe_hook_names(model)
    if cache is None or any(name not in cache for name in names):
        logits, cache = model.run_with_cache(tokens, names_filter=names)
        return logits, cache
    return model(tokens), cache


@dataclasses.dataclass(frozen=True)
class _LawSide:
    """The law side of `classify_mechanism`: the raw and fitted-temperature law comparisons, the graded gains,
    the law verdict."""

    sim: StrategySimilarity
    fitted: StrategySimilarity
    gains: Gains
    law: LawVerdict


@dataclasses.dataclass(frozen=True)
class _CircuitSide:
    """The circuit side of `classify_mechanism`: attention scores, the kernel swap, the circuit read from the
    discovered graph (with what its kept edges carry), the circuit verdict."""

    scores: AttentionScores
    swap: KernelSwap
    reading: Circuit
    circuit: CircuitVerdict


def _law_evidence(model: HookedModel, batch: ProbeBatch, logits: Tensor, probs: Tensor, *,
                  beta: float | int | None, thresholds: Thresholds) -> _LawSide:
    """The law side of `classify_mechanism`."""
    laws = strategy_probs(batch, beta=beta)
    sim = strategy_similarity(model, batch, beta=beta, probs=probs, laws=laws)
    fitted, temperature = fitted_similarity(model, batch, logits, laws, beta=beta)
    gains = graded_gains(probs, batch, beta=sim.beta)
    return _LawSide(sim, fitted, gains, law_verdict(sim, fitted, temperature, gains, thresholds))


def _circuit_evidence(model: HookedModel, source: Source, batch: ProbeBatch, cache: Any, *, n_sequences: int,
                      seed: int, thresholds: Thresholds, method: str, max_edges: Optional[int],
                      progress: Optional[bool], content: bool) -> _CircuitSide:
    """The circuit side of `classify_mechanism`: the graph on the batch's first `n_sequences` sequences, what its
    kept edges carry (donors from the whole batch, read from `cache`), the roles and the circuit axis."""
    graph = discover_circuit(model, source, batch=batch, n_sequences=n_sequences, seed=seed,
                             min_effect=thresholds.edge_min, min_fraction=thresholds.edge_fraction,
                             method=method, max_edges=max_edges, progress=progress)
    scores = attention_scores(model, batch.tokens, cache=cache, max_order=batch.order, max_lag=batch.order + 1)
    swap = swap_kernels(model, source, seq_len=int(batch.tokens.shape[1]), n_sequences=batch.tokens.shape[0],
                       seed=seed)
    carried = None
    if content and additive(model):
        more = CONTENT_POOL - int(batch.tokens.shape[0])
        donors = sample_batch(source, n_sequences=more, seq_len=int(batch.tokens.shape[1]), seed=seed + 1).tokens \
            if more >= 2 and any(measurable(e) for e in graph.kept) else None
        carried = edge_content(model, batch, graph.kept, donors=donors, cache=cache, n_sequences=n_sequences,
                               seed=seed, cut=thresholds.carries)
    reading = read_circuit(graph, scores, order=batch.order, head_excess=thresholds.head_excess, content=carried)
    in_weights = not batch.random_kernel and swap.in_context_fraction < thresholds.in_weights
    circuit = circuit_verdict(graph, reading, in_weights=in_weights, in_context_fraction=swap.in_context_fraction,
                              source_order=batch.order)
    return _CircuitSide(scores, swap, reading, circuit)


def _side_probes(model: HookedModel, source: Source, batch: ProbeBatch, tokens: Tensor, cache: Any,
                 probs: Tensor, *, beta: float | int | None) -> dict[str, Any]:
    """The report's evidence that the verdict does not read: behaviour on the batch's first sequences, the mean
    ablation table, the kernel readout and the source's reference losses."""
    return dict(
        behaviour=behaviour_report(model, head_of_batch(batch, BEHAVIOUR_SEQUENCES), beta=beta,
                            probs=probs[:BEHAVIOUR_SEQUENCES], n_flip_positions=4),
        ablation=ablation_table(model, tokens, method="mean", cache=cache, clean_probs=probs),
        readout=kernel_readout(model, batch, probs=probs),
        references=theory.reference_losses(source, int(batch.tokens.shape[1])),  # of the source: cached
    )
