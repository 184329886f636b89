"""When things happen in a run: the learning-rate schedule, the evaluation steps and the checkpoint steps.

The one-cycle schedule is the reference code's (`torch.optim.lr_scheduler.OneCycleLR(div_factor=100,
final_div_factor=0.05, pct_start=0.02)`: 2% cosine warm-up from lr/100, cosine decay to lr/5); "constant" keeps
lr. Evaluations happen every `eval_every` steps, at `eval_log_points` log-spaced steps and at the last step;
checkpoints at `n_checkpoints` log-spaced steps (the last included).
"""

import math

from markov_interp.training.config import TrainConfig

__all__ = ["one_cycle_lr", "lr_at", "evaluation_steps", "checkpoint_steps", "logged_steps"]


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


def evaluation_steps(tc: TrainConfig) -> frozenset[int]:
    """The steps at which a run evaluates: every `eval_every`-th step, `eval_log_points` log-spaced steps (a
    cadence plus density early on, where escape times are measured) and always the last step.

    >>> sorted(evaluation_steps(TrainConfig(steps=100, eval_every=50, eval_log_points=4)))
    [1, 5, 22, 50, 100]
    """
    every = range(tc.eval_every, tc.steps + 1, tc.eval_every) if tc.eval_every > 0 else ()
    return frozenset({tc.steps, *every, *checkpoint_steps(tc.steps, tc.eval_log_points)})


def checkpoint_steps(steps: int, n: int) -> list[int]:
    """`n` log-spaced steps in [1, steps] (rounded, distinct), always including `steps`; [] when n == 0."""
    if n <= 0:
        return []
    if n == 1 or steps == 1:
        return [steps]
    out = {max(1, min(steps, round(math.exp(math.log(steps) * i / (n - 1))))) for i in range(n)}
    out.add(steps)
    return sorted(out)


def logged_steps(tc: TrainConfig, upto: int) -> list[int]:
    """The steps <= `upto` at which a run writes a metrics row: every `log_every`-th step and every evaluation
    step (`evaluation_steps`, the last step included)."""
    evals = evaluation_steps(tc)
    return [s for s in range(1, min(upto, tc.steps) + 1) if s % tc.log_every == 0 or s in evals]
