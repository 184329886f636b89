"""The law axis of `classify_mechanism`: which candidate law a model's outputs reach, read so that the output
calibration alone does not decide it.

A circuit that computes the right statistic can still put the wrong confidence on it: the same hand-built
induction circuit with its unembedding scaled by 3 or 8 predicts the same ranking of next states, sharper. Compared
with the candidate laws as it is, it looked like a lower law or none (it was `in_context_unigram` at scale 3 and
`other` at 8). So the model's laws are compared with the candidates twice:

- **raw**: d(s) = mean KL(s || model) over the probe batch, every candidate law s (`strategies`);
- **fitted**: the same for the model whose logits are divided by one temperature T, fitted on the probe batch by
  maximum likelihood of its next states (`fit_temperature`; Guo et al. 2017's temperature scaling): the one number
  that changes calibration and nothing else, so the fitted distances do not move with the unembedding's scale.
  T > 1: the model was over-confident.

`check_law` is the law check on either: the closest law s* passes when d(s*) <= `fit` x gap(s*) (the KL from the
nearest other law to s*, on the same tokens) and d(s*) <= `margin` x d(runner-up). `law_verdict` reads the raw
check first: when it passes, the outputs reach that law as they are ("reached"). When only the fitted check
passes, and with an in-context law (the in-context k-gram laws, the state-and-counts law: what a circuit reads
out of counts through an unembedding whose scale is free), they reach it up to calibration ("miscalibrated"). A
context-free law (uniform, pi, the kernel in the weights) is its numbers, so it is never reached up to calibration
(otherwise any constant law one-sided enough would be "pi, miscalibrated"); nor is any law when T sits at an edge
of `TEMPERATURE_RANGE` (the logits point away from the data: flattening them is no calibration). Otherwise the
model sits "between" laws.
"""

import dataclasses
from typing import Any, Optional

import torch
from jaxtyping import Float
from torch import Tensor

from markov_interp._display import displayed
from markov_interp.probes._common import Tokens, json_safe
from markov_interp.probes.gains import Gains
from markov_interp.probes.strategies import StrategySimilarity

TEMPERATURE_RANGE = (0.01, 100.0)  # the temperatures a fit may take; at an edge the fitted check is not used
STATUSES = ("reached", "miscalibrated", "between")
_BISECTIONS = 60


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


def _ratio(value: float, reference: float) -> float:
    return value / reference if reference > 0 else (0.0 if value <= 0 else float("inf"))


def check_law(sim: StrategySimilarity, th: Any) -> LawCheck:
    """The closest candidate law of `sim` and whether it passes the fit and margin checks of `th` (a
    `classify.Thresholds`: `fit`, `margin`, `near`)."""
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


@displayed(line=lambda v: f"{v.describe()}; fit {v.fit_ratio:.3f}, margin {v.margin_ratio:.3f}")
@dataclasses.dataclass(frozen=True, kw_only=True)
class LawVerdict(LawCheck):
    """The law axis (module docstring). Its `LawCheck` fields are the check the decision read: `raw` (the model's
    laws as they are) when it passes or the model is between laws, `fitted` (at the fitted temperature) when only
    that passes ("miscalibrated"); `temperature` is the fitted T, `fitted_divergences` the fitted distances per
    candidate; `gains` the graded gains g_k with SEs; `status` "reached", "miscalibrated" or "between"; `target`
    the law a model between laws moves to (set by `classify_mechanism`, None otherwise)."""

    raw: LawCheck
    fitted: LawCheck
    temperature: float
    fitted_divergences: dict[str, float]
    gains: Gains
    status: str
    target: Optional[str] = None

    @property
    def reached(self) -> Optional[str]:
        """The law the outputs reach (up to calibration when "miscalibrated"), None between laws."""
        return self.law if self.status != "between" else None

    def describe(self) -> str:
        """One clause: "in-context bigram (order 1) reached", "... up to calibration (T 3.2)", "between laws"."""
        from markov_interp.probes.strategies import STRATEGY_LABELS

        name = STRATEGY_LABELS.get(self.law, self.law)
        if self.status == "reached":
            return f"{name} reached"
        if self.status == "miscalibrated":
            return f"{name} reached up to calibration (temperature {self.temperature:.2f})"
        to = f", moving to the {STRATEGY_LABELS.get(self.target, self.target)}" if self.target else ""
        return f"between laws (nearest: {name}{to})"

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["raw"], data["fitted"], data["gains"] = self.raw.to_dict(), self.fitted.to_dict(), self.gains.to_dict()
        return json_safe({**data, "reached": self.reached})


def fit_temperature(logits: Float[Tensor, "batch pos vocab"], tokens: Tokens) -> float:
    """The temperature T that maximises the likelihood of the batch's next states under softmax(logits / T),
    within `TEMPERATURE_RANGE` (the mean log-loss is convex in 1 / T: bisection on its derivative).

    >>> logits = torch.tensor([[[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]]])
    >>> round(fit_temperature(logits, torch.tensor([[0, 1, 1]])), 3)  # one miss in two: no confidence at all
    100.0
    """
    z = logits.detach().double()[:, :-1]
    z = z - z.mean(-1, keepdim=True)
    target = float(torch.gather(z, 2, tokens[:, 1:, None].to(z.device)).mean())  # the data's mean logit
    slope = lambda beta: float((torch.softmax(beta * z, -1) * z).sum(-1).mean()) - target  # noqa: E731
    a, b = 1.0 / TEMPERATURE_RANGE[1], 1.0 / TEMPERATURE_RANGE[0]
    if slope(a) >= 0:
        return 1.0 / a
    if slope(b) <= 0:
        return 1.0 / b
    for _ in range(_BISECTIONS):
        mid = 0.5 * (a + b)
        a, b = (mid, b) if slope(mid) < 0 else (a, mid)
    return 2.0 / (a + b)


def at_edge(temperature: float) -> bool:
    """Whether a fitted temperature sits at an edge of `TEMPERATURE_RANGE` (the fit is not a calibration)."""
    low, high = TEMPERATURE_RANGE
    return not low * (1 + 1e-6) < temperature < high * (1 - 1e-6)


def fitted_similarity(model: Any, batch: Any, logits: Float[Tensor, "batch pos vocab"], laws: dict[str, Tensor], *,
                      beta: Any = None) -> tuple[StrategySimilarity, float]:
    """The strategy similarity of the model with its logits divided by its fitted temperature, and that T."""
    from markov_interp.probes.strategies import strategy_similarity

    temperature = fit_temperature(logits, batch.tokens)
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    return strategy_similarity(model, batch, beta=beta, probs=probs, laws=laws), temperature


def _in_context(name: str) -> bool:
    from markov_interp.probes.strategies import STATE_AND_COUNTS, in_context_order

    return name == STATE_AND_COUNTS or in_context_order(name) is not None


def law_verdict(raw_sim: StrategySimilarity, fitted_sim: StrategySimilarity, temperature: float, gains: Gains,
                th: Any) -> LawVerdict:
    """The law axis from the raw and the temperature-fitted strategy similarities (module docstring).

    Args:
        raw_sim: `strategy_similarity` of the model as it is.
        fitted_sim: the same of the model at its fitted temperature (`fitted_similarity`).
        temperature: that temperature.
        gains: the graded gains of the model as it is.
        th: the classifier's `Thresholds`.

    Returns:
        A `LawVerdict`.
    """
    raw, fitted = check_law(raw_sim, th), check_law(fitted_sim, th)
    if raw.passed:
        used, status = raw, "reached"
    elif fitted.passed and _in_context(fitted.law) and not at_edge(temperature):
        used, status = fitted, "miscalibrated"
    else:
        used, status = raw, "between"
    return LawVerdict(**dataclasses.asdict(used), raw=raw, fitted=fitted, temperature=temperature,
                      fitted_divergences=dict(fitted_sim.divergences), gains=gains, status=status)


def with_target(verdict: LawVerdict, target: Optional[str]) -> LawVerdict:
    """`verdict` with the law a model between laws moves to."""
    return dataclasses.replace(verdict, target=target)


__all__ = ["LawCheck", "LawVerdict", "STATUSES", "TEMPERATURE_RANGE", "at_edge", "check_law", "fit_temperature",
           "fitted_similarity", "law_verdict", "with_target"]
