"""What training returns: `TrainResult` (the hooked model, the metrics rows, the run folder) and its typed end,
`FinalLosses` (the last evaluation beside `theory`'s reference losses as a `theory.ReferenceLosses`)."""

import dataclasses
from pathlib import Path
from typing import Optional

from markov_interp._display import displayed, headline, jsonable
from markov_interp.models import HookedModel
from markov_interp.theory import ReferenceLosses
from markov_interp.runs.config import RunConfig

__all__ = ["FinalLosses", "TrainResult"]


@displayed(line=lambda f: f"step {f.step}: eval loss {f.eval_loss:.4f} nats ({f.references.describe()})")
@dataclasses.dataclass(frozen=True, kw_only=True)
class FinalLosses:
    """The end of a run: its last evaluation beside the `theory` reference losses at the training length.

    A diverged run has NaN losses and `step` = the step it diverged at.
    """

    step: int  # the last step (training always evaluates there)
    eval_loss: float  # mean next-state cross-entropy on fresh evaluation batches (nats)
    train_loss: float  # mean training loss of the last metrics row (nats)
    references: ReferenceLosses  # theory.reference_losses(source, seq_len + 1) as logged (rounded to 12 digits)

    @property
    def entropy_rate(self) -> float:
        """Loss of the true kernel (for random kernels: of an oracle knowing each sequence's kernel)."""
        return self.references.entropy_rate

    @property
    def unigram_loss(self) -> float:
        """The plateau: H(pi) for fixed kernels; for random kernels the in-context unigram estimator's loss."""
        return self.references.unigram_loss

    @property
    def bayes_loss(self) -> Optional[float]:
        """The Bayes loss: in context for random kernels, the forward filter's for a hidden Markov source (None for
        fixed kernels)."""
        return self.references.bayes_loss

    @property
    def optimum(self) -> float:
        """The best loss a model can reach: the in-context Bayes loss for random kernels, the Bayes loss over the
        positions for a hidden Markov source, else the entropy rate."""
        return self.references.optimum

    @property
    def excess_loss(self) -> float:
        """eval_loss - optimum (nats)."""
        return self.eval_loss - self.optimum


@displayed
@dataclasses.dataclass
class TrainResult:
    """What `train` / `train_many` return for one run: the hooked model, the metrics rows, the final evaluation
    and the run folder."""

    # with .markov_config and the training length in `models.weights_metadata(model)` (the probes' default length);
    # None when the caller asked for no models (models_out=False)
    model: Optional[HookedModel]
    metrics: list[dict]  # rows as written to metrics.jsonl
    final: FinalLosses
    config: RunConfig
    out_dir: Optional[Path] = None
    resumed_from: Optional[int] = None  # checkpoint step the run resumed from, None if fresh
    already_done: bool = False  # True when a finished run folder was loaded instead of trained
    failed: Optional[str] = None  # why the run stopped (it diverged: "diverged at step N: reason"), None if finished
    # how its steps ran (train.capture): "uncaptured", "one CUDA graph per step" or "not captured: <why>"
    engine: str = "uncaptured"

    def _headline(self) -> str:
        status = (f"failed ({self.failed})" if self.failed else "already trained" if self.already_done else
                  f"resumed from step {self.resumed_from}" if self.resumed_from else "trained")
        return f"{status}: {headline(self.final)}" + (f" -> {self.out_dir}" if self.out_dir is not None else "")

    def to_dict(self) -> dict:
        """JSON-ready: the final losses, the config, the run folder and status (not the model or the metrics,
        which the run folder holds)."""
        return jsonable({"final": self.final, "config": self.config, "out_dir": self.out_dir,
                         "resumed_from": self.resumed_from, "already_done": self.already_done,
                         "failed": self.failed, "n_metrics_rows": len(self.metrics),
                         "engine": self.engine})
