"""When things happen in a run: the learning-rate schedule, the evaluation steps and the checkpoint steps.

The one-cycle schedule is the reference code's (`torch.optim.lr_scheduler.OneCycleLR(div_factor=100,
final_div_factor=0.05, pct_start=0.02)`: 2% cosine warm-up from lr/100, cosine decay to lr/5); "constant" keeps
lr. Evaluations happen every `eval_every` steps, at `eval_log_points` log-spaced steps and at the last step;
checkpoints at `n_checkpoints` log-spaced steps (the last included). `StepPlan` answers "does step s log /
evaluate / checkpoint?" by arithmetic, so no plan is ever built as a list of steps.
"""

import dataclasses
import heapq
import math
from collections.abc import Iterator

from markov_interp.runs.config import TrainConfig

__all__ = ["one_cycle_lr", "lr_at", "StepPlan", "evaluation_steps", "checkpoint_steps", "logged_steps", "max_rows"]


def one_cycle_lr(step: int, *, total: int, lr: float, warmup_frac: float = 0.02, start_div: float = 100.0,
                 final_div: float = 5.0) -> float:
    """Learning rate at 0-based `step` of the one-cycle schedule: cosine from lr/start_div up to lr over
    the first warmup_frac of `total` steps, then cosine down to lr/final_div at the last step: the values of
    torch's `OneCycleLR(max_lr=lr, total_steps=total, pct_start=warmup_frac, div_factor=start_div,
    final_div_factor=final_div / start_div)` (the reference code's schedule, 2e-5 -> 2e-3 -> 4e-4)."""
    initial, final = lr / start_div, lr / final_div
    warm_end = float(warmup_frac * total) - 1
    last = total - 1

    def cos(start: float, end: float, pct: float) -> float:
        return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)

    if step <= warm_end:
        return cos(initial, lr, step / warm_end) if warm_end > 0 else lr
    if last <= warm_end:
        return lr
    return cos(lr, final, (step - warm_end) / (last - warm_end))


def lr_at(cfg: TrainConfig, step: int) -> float:
    """The learning rate of an update.

    Args:
        cfg: the training config (schedule, peak lr, steps, warm-up).
        step: the update, 0-based.

    Returns:
        The learning rate of update `step` (`one_cycle_lr` for "one-cycle", lr for "constant").
    """
    if cfg.schedule == "constant":
        return cfg.lr
    return one_cycle_lr(step, total=cfg.steps, lr=cfg.lr, warmup_frac=cfg.warmup_frac)


def checkpoint_steps(steps: int, n: int) -> list[int]:
    """`n` log-spaced steps in [1, steps] (rounded, distinct), always including `steps`; [] when n == 0.

    The points are round(steps ** (i / (n - 1))) for i < n. Where consecutive points lie less than 1/4 apart
    their rounded values skip no integer, so that dense start is taken as a range and only the sparse rest is
    computed point by point: the work is O(min(n, steps)), not O(n) (`n_checkpoints=10**9` does not hang).

    >>> checkpoint_steps(1000, 4), checkpoint_steps(5, 10**9)
    ([1, 10, 100, 1000], [1, 2, 3, 4, 5])
    """
    if n <= 0:
        return []
    if n == 1 or steps == 1:
        return [steps]
    log_steps = math.log(steps)
    growth = math.expm1(log_steps / (n - 1))  # consecutive points grow by the factor 1 + growth
    dense = 0  # points 0..dense lie less than 1/4 apart (two points of margin for rounding)
    if 0 < growth < 0.25:
        dense = max(0, min(n - 1, int((n - 1) * math.log(0.25 / growth) / log_steps) - 2))
    first = round(math.exp(log_steps * dense / (n - 1)))
    out = set(range(1, min(first, steps) + 1))
    out.update(max(1, min(steps, round(math.exp(log_steps * i / (n - 1))))) for i in range(dense, n))
    out.add(steps)
    return sorted(out)


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """When a run logs, evaluates and checkpoints, by arithmetic: membership costs O(1) whatever `steps` is
    (an evaluation plan over `steps=10**12` used to be built as a set of every evaluation step).

    A metrics row is written at every `log_every`-th step and at every evaluation step; evaluations happen at
    every `eval_every`-th step, at `eval_log_points` log-spaced steps and at the last step; checkpoints at
    `n_checkpoints` log-spaced steps (the last included). Build it with `StepPlan.of(tc)` after the plan check
    (`training.plan`), which bounds the log-spaced sets.
    """

    steps: int
    log_every: int
    eval_every: int
    log_points: frozenset  # the eval_log_points log-spaced evaluation steps
    checkpoint_points: frozenset

    @classmethod
    def of(cls, tc: TrainConfig) -> "StepPlan":
        """The plan of a training config."""
        return cls(steps=tc.steps, log_every=tc.log_every, eval_every=tc.eval_every,
                   log_points=frozenset(checkpoint_steps(tc.steps, tc.eval_log_points)),
                   checkpoint_points=frozenset(checkpoint_steps(tc.steps, tc.n_checkpoints)))

    def evaluates(self, step: int) -> bool:
        """Whether the run evaluates at `step`."""
        every = self.eval_every > 0 and step % self.eval_every == 0
        return step == self.steps or every or step in self.log_points

    def logs(self, step: int) -> bool:
        """Whether the run writes a metrics row at `step`."""
        return step % self.log_every == 0 or self.evaluates(step)

    def checkpoints(self, step: int) -> bool:
        """Whether the run writes a checkpoint at `step`."""
        return step in self.checkpoint_points

    def logged(self, upto: int) -> Iterator[int]:
        """The steps <= `upto` with a metrics row, in order, generated (O(rows), never O(steps))."""
        upto = min(upto, self.steps)
        streams = [range(self.log_every, upto + 1, self.log_every), sorted(s for s in self.log_points if s <= upto),
                   [self.steps] if self.steps <= upto else []]
        if self.eval_every > 0:
            streams.append(range(self.eval_every, upto + 1, self.eval_every))
        previous = 0
        for step in heapq.merge(*streams):
            if step != previous:
                yield step
                previous = step


def evaluation_steps(tc: TrainConfig) -> frozenset[int]:
    """The steps at which a run evaluates: every `eval_every`-th step, `eval_log_points` log-spaced steps (a
    cadence plus density early on, where escape times are measured) and always the last step (`StepPlan`;
    a set as big as the number of evaluations).

    >>> sorted(evaluation_steps(TrainConfig(steps=100, eval_every=50, eval_log_points=4)))
    [1, 5, 22, 50, 100]
    """
    plan = StepPlan.of(tc)
    return frozenset(s for s in plan.logged(tc.steps) if plan.evaluates(s))


def logged_steps(tc: TrainConfig, upto: int) -> list[int]:
    """The steps <= `upto` at which a run writes a metrics row: every `log_every`-th step and every evaluation
    step (`evaluation_steps`, the last step included). A list as long as the rows (`StepPlan.logged` generates
    them one by one)."""
    return list(StepPlan.of(tc).logged(upto))


def max_rows(tc: TrainConfig) -> int:
    """An upper bound of a run's metrics rows, by arithmetic (what the plan check sizes before anything is
    built): at most one row a step."""
    evals = (tc.steps // tc.eval_every if tc.eval_every else 0) + min(tc.eval_log_points, tc.steps) + 1
    return min(tc.steps, tc.steps // tc.log_every + evals)
