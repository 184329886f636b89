"""What a finished cell adds to its row, typed: where its final loss sits (`outcome`), its crossings of the lines
of `dynamics`, its losses beside `theory`'s references (`CellResult`) and, when probed, its mechanism and key
probe scores (`ProbeColumns`; read off a `probes.MechanismReport` by `sweep.probing`)."""

import dataclasses
import json
import math
from collections.abc import Collection, Mapping
from typing import Any, Optional

from markov_interp import dynamics
from markov_interp._display import displayed
from markov_interp.training import TrainResult

__all__ = ["outcome", "ProbeColumns", "CellResult", "STUCK_FRACTION", "MIN_GAP", "finite"]

# `outcome`: a final loss is at the "optimum" below optimum + STUCK_FRACTION * (unigram_loss - optimum), the line
# of `dynamics` (escape and stuck themselves are `dynamics`' crossings of the paired excess curve). The optimum
# is the entropy rate for a fixed kernel (the bigram / k-gram loss) and the in-context Bayes loss for random kernels.
STUCK_FRACTION = dynamics.ESCAPE_FRACTION
# Below this gap (nats) between unigram loss and optimum the two solutions are indistinguishable (p + q near
# 1 makes the chain nearly i.i.d.) and the flag is left undecided (None).
MIN_GAP = 0.005


def outcome(eval_loss: float, optimum: float, unigram: float) -> Optional[str]:
    """Where a final loss sits: "optimum", "unigram" or "above" (worse than the unigram plateau: not trained).

    With gap = unigram - optimum (entropy rate, or the in-context Bayes loss for random kernels):
    "optimum" below optimum + STUCK_FRACTION * gap; "unigram" from there up to unigram + STUCK_FRACTION * gap
    (the plateau of the tied single-layer model's bad local minimum, H(pi)); "above" beyond. None when the gap
    is below MIN_GAP nats (p + q near 1: the chain is nearly i.i.d. and the two solutions coincide).

    Args:
        eval_loss: the final evaluation loss (nats).
        optimum: the entropy rate, or the in-context Bayes loss for random kernels.
        unigram: the unigram loss H(pi).

    Returns:
        "optimum", "unigram", "above", or None (undecided).

    >>> outcome(0.665, 0.619, 0.666), outcome(0.620, 0.619, 0.666), outcome(0.693, 0.619, 0.666)
    ('unigram', 'optimum', 'above')
    """
    gap = unigram - optimum
    if not math.isfinite(eval_loss) or gap < MIN_GAP:
        return None
    if eval_loss <= optimum + STUCK_FRACTION * gap:
        return "optimum"
    return "unigram" if eval_loss <= unigram + STUCK_FRACTION * gap else "above"


def finite(value: Any) -> Optional[float]:
    """A float, or None where there is no finite number (a NaN score: nothing to report)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


@displayed(line=lambda p: f"{p.mechanism} (order {p.order}, confident {p.confident}), faithfulness {p.faithfulness}")
@dataclasses.dataclass(frozen=True, kw_only=True)
class ProbeColumns:
    """A cell's mechanism and key probe scores, read off `probes.classify_mechanism`'s `MechanismReport`.

    The decision and its evidence ratios, the best previous-token / induction heads' scores above chance,
    the circuit heads and their ablations, the causal evidence (the gain g_1, the kernel-swap in-context
    fraction, the circuit's faithfulness), and the kernel readout (for binary chains the learned P(1|0)
    "p_hat" and P(0|1) "q_hat", the paper's comparison with p and q). In a table: `mechanism` and
    `probe.<field>` columns.
    """

    mechanism: Optional[str]  # None when the probes offer no classifier
    order: Optional[int] = None  # k of a "kernel" or "induction" label
    confident: Optional[bool] = None
    state_ratio: Optional[float] = None
    context_ratio: Optional[float] = None
    bigram_gain: Optional[float] = None
    icl_score: Optional[float] = None
    previous_token_excess: Optional[float] = None  # the best head's (score - chance) / (1 - chance)
    induction_excess: Optional[float] = None
    previous_token_head: Optional[tuple[int, int]] = None  # (layer, head)
    induction_head: Optional[tuple[int, int]] = None
    previous_token_ablation: Optional[float] = None  # loss change when mean-ablating that head (nats)
    induction_ablation: Optional[float] = None
    circuit_confirmed: Optional[bool] = None
    readout_max_abs_error: Optional[float] = None
    readout_weighted_kl: Optional[float] = None
    p_hat: Optional[float] = None  # binary chains: learned P(1 | 0)
    q_hat: Optional[float] = None  # binary chains: learned P(0 | 1)
    gain_1: Optional[float] = None  # fraction of the in-context unigram -> bigram step climbed (`gains`)
    in_context_fraction: Optional[float] = None  # kernel swap: 0 in weights, 1 in context
    faithfulness: Optional[float] = None  # of the circuit path patching kept


@displayed(line=lambda r: f"{r.outcome}: eval loss {r.final_eval_loss:.4f} at step {r.final_step}, escape {r.crossing()}"
                          + (f", {r.probe.mechanism}" if r.probe is not None else ""))
@dataclasses.dataclass(frozen=True, kw_only=True)
class CellResult:
    """What a finished cell adds to its row: final losses beside `theory`'s references, where the final loss
    sits (`outcome`), when the run crossed each line of `dynamics` (`crossings`: {"dwell": K, "0.9": [after,
    by], ...}; `crossing(f)` reads one) and, when probed, the mechanism (`probe`). Losses in nats.

    `escape_step`, `censored` and `stuck_at_unigram` restate the crossing at `dynamics.ESCAPE_FRACTION` (the
    `by` step, or the censoring step; censored; stuck = censored) for tables and older readers."""

    final_step: int
    final_eval_loss: float
    final_train_loss: float  # mean training loss of the last logged row
    entropy_rate: float
    unigram_loss: float
    bayes_loss: Optional[float]  # random kernels only
    excess_loss: float  # final_eval_loss - optimum (the in-context Bayes loss, else the entropy rate)
    outcome: Optional[str]
    stuck_at_unigram: Optional[bool]  # = censored (one definition)
    escape_step: Optional[int]  # the escape crossing's `by` step, or its censoring step
    probe: Optional[ProbeColumns]  # None when the sweep does not probe
    seconds: float
    censored: Optional[bool] = None  # True: no confirmed escape within the budget (see `dynamics`)
    crossings: Optional[dict] = None  # `dynamics.crossings_to_json`; None in tables written before it

    @classmethod
    def from_training(cls, result: TrainResult, probe: Optional[ProbeColumns], seconds: float) -> "CellResult":
        f = result.final
        run = dynamics.from_metrics(result.metrics)  # None: no paired evaluation, or no plateau (p + q = 1)
        escape = run.escape if run else None
        return cls(
            final_step=f.step, final_eval_loss=f.eval_loss, final_train_loss=f.train_loss,
            entropy_rate=f.entropy_rate, unigram_loss=f.unigram_loss, bayes_loss=f.bayes_loss,
            excess_loss=f.excess_loss,
            outcome=outcome(f.eval_loss, f.optimum, f.unigram_loss),
            stuck_at_unigram=escape.censored if escape else None,
            escape_step=escape.step if escape else None,
            censored=escape.censored if escape else None,
            crossings=run.to_json() if run else None,
            probe=probe, seconds=seconds,
        )

    def crossing(self, fraction: float = dynamics.ESCAPE_FRACTION, *,
                 evaluations: Optional[Collection[int]] = None) -> Optional[dynamics.StepInterval]:
        """The run's crossing of the line `fraction` (`dynamics.StepInterval`), None where not recorded.

        Tables written before `crossings` hold only `escape_step` and `censored` (the escape line, with the
        previous evaluation not recorded): `dynamics.recorded_escape` reads them, as the grid interval
        (previous evaluation, escape_step] when `evaluations` (the run's evaluation steps,
        `training.evaluation_steps`) is given, else as the exact step (escape_step - 1, escape_step]; censored
        after escape_step."""
        if self.crossings is not None:
            return dynamics.crossings_from_json(self.crossings)[0].get(float(fraction))
        if fraction != dynamics.ESCAPE_FRACTION or self.escape_step is None or self.censored is None:
            return None
        return dynamics.recorded_escape(self.escape_step, self.censored,
                                        None if evaluations is None else sorted(evaluations))

    def to_dict(self) -> dict:
        """JSON-ready (what a cell's record file holds)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CellResult":
        data = dict(data)
        probe = data.pop("probe", None)
        if probe is not None:
            probe = {k: tuple(v) if k.endswith("_head") and v is not None else v for k, v in probe.items()}
            probe = ProbeColumns(**probe)
        return cls(probe=probe, **data)
