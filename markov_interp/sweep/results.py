"""What a finished cell adds to its row, typed: where its final loss sits (`outcome`), its crossings of the lines
of `dynamics`, its losses beside `theory`'s references (`CellResult`) and, when probed, its mechanism and key
probe scores (`ProbeColumns`; read off a `probes.MechanismReport` by `sweep.probing`)."""

import dataclasses
import json
import math
from collections.abc import Collection, Mapping
from typing import Any, Optional

from markov_interp import dynamics
from markov_interp.config import Checked, bounds
from markov_interp._display import displayed
from markov_interp.training import TrainResult

__all__ = ["outcome", "ProbeColumns", "CellResult", "OUTCOMES", "STUCK_FRACTION", "MIN_GAP", "finite"]

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
class ProbeColumns(Checked):
    """A cell's mechanism and key probe scores, read off `probes.classify_mechanism`'s `MechanismReport`.

    The decision and its evidence ratios, the best previous-token / induction heads' scores above chance,
    the circuit heads and their ablations, the causal evidence (the gain g_1, the kernel-swap in-context
    fraction, the circuit's faithfulness), and the kernel readout (for binary chains the learned P(1|0)
    "p_hat" and P(0|1) "q_hat", the paper's comparison with p and q). In a table: `mechanism` and
    `probe.<field>` columns. Checked when built (`config.Checked`): the types below, every score finite (NaN
    scores are stored as None), heads as (layer, head) >= 0, p_hat / q_hat probabilities.
    """

    mechanism: Optional[str]  # None when the probes offer no classifier
    order: Optional[int] = bounds(minimum=0, default=None)  # k of a "kernel" or "induction" label
    confident: Optional[bool] = None
    state_ratio: Optional[float] = bounds(default=None)
    context_ratio: Optional[float] = bounds(default=None)
    bigram_gain: Optional[float] = bounds(default=None)
    icl_score: Optional[float] = bounds(default=None)
    previous_token_excess: Optional[float] = bounds(default=None)  # the best head's (score - chance) / (1 - chance)
    induction_excess: Optional[float] = bounds(default=None)
    previous_token_head: Optional[tuple[int, int]] = bounds(minimum=0, default=None)  # (layer, head)
    induction_head: Optional[tuple[int, int]] = bounds(minimum=0, default=None)
    previous_token_ablation: Optional[float] = bounds(default=None)  # loss change when mean-ablating that head
    induction_ablation: Optional[float] = bounds(default=None)
    circuit_confirmed: Optional[bool] = None
    readout_max_abs_error: Optional[float] = bounds(minimum=0, maximum=1, default=None)  # of probabilities
    readout_weighted_kl: Optional[float] = bounds(default=None)
    p_hat: Optional[float] = bounds(minimum=0, maximum=1, default=None)  # binary chains: learned P(1 | 0)
    q_hat: Optional[float] = bounds(minimum=0, maximum=1, default=None)  # binary chains: learned P(0 | 1)
    gain_1: Optional[float] = bounds(default=None)  # fraction of the in-context unigram -> bigram step climbed
    in_context_fraction: Optional[float] = bounds(default=None)  # kernel swap: 0 in weights, 1 in context
    faithfulness: Optional[float] = bounds(default=None)  # of the circuit path patching kept


OUTCOMES = ("optimum", "unigram", "above")
# How far a finite pool's optimum (its pool-Bayes loss, not in the record) may lie above the in-context Bayes loss
# the record holds: both are Monte Carlo estimates with standard errors below 5e-4 (theory's default tol), and
# pool Bayes <= in-context Bayes holds in expectation (the pool's Bayes predictor is optimal for its sequences).
_POOL_SLACK = 0.01
_ROUNDING = 1e-9  # final_eval_loss - excess_loss gives the optimum back up to float rounding


@displayed(line=lambda r: f"{r.outcome}: eval loss {r.final_eval_loss:.4f} at step {r.final_step}, escape {r.crossing()}"
                          + (f", {r.probe.mechanism}" if r.probe is not None else ""))
@dataclasses.dataclass(frozen=True, kw_only=True)
class CellResult(Checked):
    """What a finished cell adds to its row: final losses beside `theory`'s references, where the final loss
    sits (`outcome`), when the run crossed each line of `dynamics` (`crossings`: {"dwell": K, "0.9": [after,
    by], ...}; `crossing(f)` reads one) and, when probed, the mechanism (`probe`). Losses in nats.

    `escape_step`, `censored` and `stuck_at_unigram` restate the crossing at `dynamics.ESCAPE_FRACTION` (the
    `by` step, or the censoring step; censored; stuck = censored) for tables and older readers.

    The one schema of a record's result (`config.Checked`, checked whenever one is built, so whenever a record or
    a table row is read): the types below; losses finite and >= 0; steps >= 0 and the escape step within the
    run; `outcome` one of `OUTCOMES` or None; stuck = censored where both are recorded; `crossings` readable by
    `dynamics.crossings_from_json`; and the references as theory orders them: the optimum final_eval_loss -
    excess_loss is the entropy rate for a fixed chain (which is at most H(pi)), and for random kernels at most
    the in-context Bayes loss (equal to it for fresh kernels, the pool-Bayes loss below it for a finite pool).
    """

    final_step: int = bounds(minimum=1)
    final_eval_loss: float = bounds(minimum=0)
    final_train_loss: float = bounds(minimum=0)  # mean training loss of the last logged row
    entropy_rate: float = bounds(minimum=0)
    unigram_loss: float = bounds(minimum=0)
    bayes_loss: Optional[float] = bounds(minimum=0)  # random kernels only
    excess_loss: float = bounds()  # final_eval_loss - optimum (the in-context Bayes loss, else the entropy rate)
    outcome: Optional[str]
    stuck_at_unigram: Optional[bool]  # = censored (one definition)
    escape_step: Optional[int] = bounds(minimum=0)  # the escape crossing's `by` step, or its censoring step
    probe: Optional[ProbeColumns]  # None when the sweep does not probe
    seconds: float = bounds(minimum=0)
    censored: Optional[bool] = None  # True: no confirmed escape within the budget (see `dynamics`)
    crossings: Optional[dict] = None  # `dynamics.crossings_to_json`; None in tables written before it

    def check(self) -> None:
        if self.outcome is not None and self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {list(OUTCOMES)} or null, got {self.outcome!r}")
        if self.escape_step is not None and self.escape_step > self.final_step:
            raise ValueError(f"escape_step {self.escape_step} is after the final step {self.final_step}")
        if self.censored is not None and self.stuck_at_unigram is not None and self.censored != self.stuck_at_unigram:
            raise ValueError(f"stuck_at_unigram ({self.stuck_at_unigram}) must equal censored ({self.censored})")
        if self.crossings is not None:
            try:
                dynamics.crossings_from_json(self.crossings)
            except (ValueError, TypeError, KeyError, AttributeError) as err:
                raise ValueError(f"crossings {self.crossings!r} are unreadable ({type(err).__name__}: {err})") from None
        optimum = self.final_eval_loss - self.excess_loss
        if self.bayes_loss is None:  # a fixed chain: the optimum is the entropy rate, at most H(pi)
            if abs(optimum - self.entropy_rate) > _ROUNDING * max(1.0, self.entropy_rate):
                raise ValueError(f"final_eval_loss - excess_loss = {optimum!r} is not the entropy rate "
                                 f"{self.entropy_rate!r}")
            if self.entropy_rate > self.unigram_loss + _ROUNDING:
                raise ValueError(f"entropy_rate {self.entropy_rate!r} exceeds unigram_loss {self.unigram_loss!r}")
        elif not -_ROUNDING <= optimum <= self.bayes_loss + _POOL_SLACK:
            raise ValueError(f"final_eval_loss - excess_loss = {optimum!r} (the optimum) is not in [0, bayes_loss "
                             f"{self.bayes_loss!r}]")

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
    def from_dict(cls, data: Any) -> "CellResult":
        """The result a record file's table holds, checked field by field (ValueError naming the field)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"CellResult: a result must be a table, got {data!r}")
        data = dict(data)
        probe = data.pop("probe", None)
        return super().from_dict({**data, "probe": None if probe is None else ProbeColumns.from_dict(probe)})
