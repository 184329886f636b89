"""The linear-probe engine: activations [batch, pos, feature] and a `Target` in, a `ProbeFit` out.

The fit, the split into disjoint sequences, the control, the held-out scores and their bootstrap over sequences
(`probes.representation` explains what each number means; this module knows nothing of models).

The held-out metric is computed from per-sequence sums (hits and counts; squared errors, sums and sums of squares
of the targets), so that a bootstrap resample of sequences is a weighted sum of them: the intervals cost a
[resamples, sequences] matrix product, not a refit.
"""

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Optional

import torch
from jaxtyping import Float
from torch import Tensor

from markov_interp.config import check_choice, check_int, check_number
from markov_interp.probes._display import ProbeResult, dataframe
from markov_interp.probes.ablation import derangement
from markov_interp.probes.targets import Target, check_target

__all__ = ["ProbeFit", "fit_probe"]

METHODS = ("logistic", "ridge")
CONTROLS = ("sequences", "shuffle")
_FLAT = 1e-6  # a feature whose training spread is below this fraction of the largest is constant (not rescaled)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class ProbeFit(ProbeResult):
    """A linear probe of one target at one site, scored on held-out sequences (`probes.representation`).

    `score` is the held-out accuracy (`metric` "accuracy") or pooled R^2 ("r2"); `control` the same probe's score
    on the control labels (`control_kind`), `selectivity` = score - control; each `_ci` is a 95% interval from
    `n_bootstrap` resamples of the held-out sequences (paired for the selectivity; NaN with no resamples). `chance`
    is the best constant prediction learned on the training part (the majority class; the training mean, whose
    R^2 is at most 0). `per_output` is the held-out recall of each class or the R^2 of each real output, named by
    `outputs`. `weights` [feature, output] and `bias` [output] map a raw activation to the logits or the values
    (`predict`). The sequence indices of both parts are kept (`train_sequences`, `test_sequences`).
    """

    site: str
    target: str
    metric: str
    method: str
    control_kind: str
    score: float
    score_ci: tuple[float, float]
    control: float
    control_ci: tuple[float, float]
    selectivity: float
    selectivity_ci: tuple[float, float]
    chance: float
    per_output: tuple[float, ...]
    outputs: tuple[str, ...]
    n_features: int
    n_train: int  # positions (rows) the probe was fitted on
    n_test: int  # held-out positions it was scored on
    train_sequences: tuple[int, ...] = dataclasses.field(repr=False)
    test_sequences: tuple[int, ...] = dataclasses.field(repr=False)
    weights: Float[Tensor, "feature output"] = dataclasses.field(repr=False)
    bias: Float[Tensor, " output"] = dataclasses.field(repr=False)
    penalty: float
    seed: int
    n_bootstrap: int

    def _headline(self) -> str:
        return (f"{self.site} -> {self.target}: {self.metric} {self.score:.3f} {_ci(self.score_ci)}, control "
                f"{self.control:.3f}, selectivity {self.selectivity:+.3f} {_ci(self.selectivity_ci)} on "
                f"{len(self.test_sequences)} held-out sequences")

    def summary(self) -> str:
        """The headline, then the chance level, the split and the fit."""
        return "\n".join([
            self._headline(),
            f"  chance (best constant) {self.chance:.3f}; control: {self.control_kind} "
            f"{self.control:.3f} {_ci(self.control_ci)}",
            f"  {self.method} on {self.n_features} features, penalty {self.penalty:g}: {self.n_train} positions of "
            f"{len(self.train_sequences)} sequences, scored on {self.n_test} of {len(self.test_sequences)}",
        ])

    def row(self) -> dict[str, Any]:
        """The fit's numbers as one table row (what `ProbeTable.to_dataframe` shows)."""
        return {"site": self.site, "score": self.score, "score_low": self.score_ci[0], "score_high": self.score_ci[1],
                "control": self.control, "control_low": self.control_ci[0], "control_high": self.control_ci[1],
                "selectivity": self.selectivity, "selectivity_low": self.selectivity_ci[0],
                "selectivity_high": self.selectivity_ci[1], "chance": self.chance, "n_features": self.n_features}

    def to_dataframe(self) -> Any:
        """One row per class (its held-out recall) or real output (its R^2)."""
        column = "recall" if self.metric == "accuracy" else "r2"
        return dataframe(({"output": name, column: value} for name, value in zip(self.outputs, self.per_output)),
                         index="output")

    def predict(self, activations: Float[Tensor, "*batch feature"]) -> Float[Tensor, "*batch output"]:
        """The probe's logits (classes; argmax is its label) or values (real targets) on raw activations."""
        if activations.shape[-1] != self.n_features:
            raise ValueError(f"the probe reads {self.n_features} features, the activations have "
                             f"{activations.shape[-1]}")
        weights = self.weights.to(activations.device)
        return activations.to(weights.dtype) @ weights + self.bias.to(activations.device)


def _ci(pair: tuple[float, float]) -> str:
    return "[n/a]" if any(math.isnan(v) for v in pair) else f"[{pair[0]:.3f}, {pair[1]:.3f}]"


# ---------------------------------------------------------------------------------------------- the split
def split_sequences(n_sequences: int, *, test_fraction: float | int = 0.5, seed: int = 0) -> tuple[Tensor, Tensor]:
    """(train, test): sorted indices of a random split of `n_sequences` sequences into two disjoint parts, the held-out
    part round(test_fraction x n) sequences (at least 2, leaving at least 2 to train on).

    Args:
        n_sequences: how many sequences (at least 4).
        test_fraction: the held-out share, in (0, 1).
        seed: the split's seed (a CPU generator).

    Returns:
        Two int64 tensors.

    >>> train, test = split_sequences(6, seed=0); sorted(train.tolist() + test.tolist())
    [0, 1, 2, 3, 4, 5]
    """
    check_int("the number of sequences", n_sequences, minimum=0)
    if n_sequences < 4:
        raise ValueError(f"a probe needs at least 4 sequences (2 to fit on, 2 held out), got {n_sequences}")
    check_number("test_fraction", test_fraction)
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
    check_int("seed", seed)
    n_test = min(max(round(test_fraction * n_sequences), 2), n_sequences - 2)
    order = torch.randperm(n_sequences, generator=torch.Generator().manual_seed(seed))
    return order[n_test:].sort().values, order[:n_test].sort().values


@dataclasses.dataclass(frozen=True)
class _Rows:
    """The positions of one part as rows: features [row, feature], labels [row] or [row, output], and the part's
    sequence (0..n_seq-1) each row belongs to."""

    x: Tensor
    y: Tensor
    seq: Tensor
    n_seq: int


def _rows(x: Tensor, values: Tensor, mask: Tensor, sequences: Tensor, donors: Optional[Tensor] = None) -> _Rows:
    """The rows of `sequences` (on x's device, as `values` and `mask`), labelled by the `donors`' values at the
    same positions (default: their own); a position is kept where both define the target."""
    index = sequences.to(x.device)
    donor = index if donors is None else donors.to(x.device)
    keep = mask[index] & mask[donor]
    owner = torch.arange(len(index), device=x.device)[:, None].expand(keep.shape)
    return _Rows(x[index][keep], values[donor][keep], owner[keep], len(index))


def _control_rows(x: Tensor, values: Tensor, mask: Tensor, sequences: Tensor, kind: str, seed: int) -> _Rows:
    """One part's rows with control labels: another sequence's target at the same positions, from the same part
    ("sequences"), or the part's labels permuted over its rows ("shuffle")."""
    if kind == "sequences":
        return _rows(x, values, mask, sequences, donors=sequences[derangement(len(sequences), seed=seed)])
    rows = _rows(x, values, mask, sequences)
    perm = torch.randperm(len(rows.y), generator=torch.Generator().manual_seed(seed)).to(rows.y.device)
    return dataclasses.replace(rows, y=rows.y[perm])


# ------------------------------------------------------------------------------------------------ the fits
def _standardise(x: Tensor) -> tuple[Tensor, Tensor]:
    """(mean, scale) of the training features; a (near-)constant feature keeps scale 1."""
    mean, spread = x.mean(0), x.std(0, correction=0)
    flat = spread <= _FLAT * spread.max().clamp_min(torch.finfo(spread.dtype).tiny)
    return mean, torch.where(flat, torch.ones_like(spread), spread)


def _ridge(z: Tensor, y: Tensor, penalty: float) -> tuple[Tensor, Tensor]:
    """Weights [feature, output] and intercept of ridge regression of y [row, output] on centred features z."""
    gram = z.T @ z + penalty * z.shape[0] * torch.eye(z.shape[1], dtype=z.dtype, device=z.device)
    centre = y.mean(0)
    return torch.linalg.solve(gram, z.T @ (y - centre)), centre


def _logistic(z: Tensor, y: Tensor, n_classes: int, penalty: float, max_iter: int) -> tuple[Tensor, Tensor]:
    """Weights and intercept of multinomial logistic regression (L-BFGS from zero weights and the training log
    frequencies; L2 penalty / 2 on the weights)."""
    counts = torch.bincount(y, minlength=n_classes).to(z.dtype)
    weights = torch.zeros(z.shape[1], n_classes, dtype=z.dtype, device=z.device, requires_grad=True)
    bias = ((counts + 1) / (counts.sum() + n_classes)).log().requires_grad_(True)
    opt = torch.optim.LBFGS([weights, bias], lr=1.0, max_iter=max_iter, tolerance_grad=1e-9, tolerance_change=1e-12,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(z @ weights + bias, y) + 0.5 * penalty * (weights**2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return weights.detach(), bias.detach()


def _fit(train: _Rows, target: Target, method: str, penalty: float, max_iter: int) -> tuple[Tensor, Tensor]:
    """(weights [feature, output], bias [output]) on raw features."""
    mean, scale = _standardise(train.x)
    z = (train.x - mean) / scale
    if target.n_classes is None:
        weights, bias = _ridge(z, train.y, penalty)
    elif method == "ridge":
        weights, bias = _ridge(z, torch.nn.functional.one_hot(train.y, target.n_classes).to(z.dtype), penalty)
    else:
        weights, bias = _logistic(z, train.y, target.n_classes, penalty, max_iter)
    weights = weights / scale[:, None]
    return weights, bias - mean @ weights


# ---------------------------------------------------------------------------------------- held-out scores
@dataclasses.dataclass(frozen=True)
class _Tally:
    """Per held-out sequence sums that every resample's metric is a weighted sum of: hits / counts (classes), or
    squared errors, target sums and sums of squares per output (R^2)."""

    count: Tensor  # [seq]
    hits: Optional[Tensor] = None  # [seq]
    sse: Optional[Tensor] = None  # [seq, output]
    total: Optional[Tensor] = None  # [seq, output]
    square: Optional[Tensor] = None  # [seq, output]

    def score(self, weights: Tensor) -> Tensor:
        """The metric of each resample, `weights` [resample, seq] (how often each sequence is drawn)."""
        n = weights @ self.count
        if self.hits is not None:
            return (weights @ self.hits) / n
        square = (weights @ self.square).sum(-1)
        spread = square - ((weights @ self.total) ** 2 / n[:, None]).sum(-1)
        r2 = 1 - (weights @ self.sse).sum(-1) / spread
        return torch.where(spread > _FLAT**2 * square, r2, math.nan)  # a constant target has no R^2


def _per_seq(rows: _Rows, values: Tensor) -> Tensor:
    out = torch.zeros(rows.n_seq, *values.shape[1:], dtype=torch.float64, device=values.device)
    return out.index_add_(0, rows.seq, values.to(torch.float64))


def _tally(rows: _Rows, predicted: Tensor, classes: bool) -> _Tally:
    count = _per_seq(rows, torch.ones(len(rows.y), device=rows.y.device))
    if classes:
        return _Tally(count, hits=_per_seq(rows, (predicted == rows.y).to(torch.float64)))
    return _Tally(count, sse=_per_seq(rows, (predicted - rows.y) ** 2), total=_per_seq(rows, rows.y),
                  square=_per_seq(rows, rows.y**2))


def _per_output(rows: _Rows, predicted: Tensor, n_outputs: int, classes: bool) -> tuple[float, ...]:
    """Held-out recall of each class, or R^2 of each output (NaN where undefined)."""
    if classes:
        hits = torch.zeros(n_outputs, dtype=torch.float64, device=rows.y.device)
        hits.index_add_(0, rows.y, (predicted == rows.y).to(torch.float64))
        seen = torch.bincount(rows.y, minlength=n_outputs).to(torch.float64)
        return tuple(float(v) for v in (hits / seen).cpu())
    spread = ((rows.y - rows.y.mean(0)) ** 2).sum(0)
    r2 = 1 - ((predicted - rows.y) ** 2).sum(0) / spread
    return tuple(float(v) for v in torch.where(spread > _FLAT**2 * (rows.y**2).sum(0), r2, math.nan).cpu())


def _held_out(train: _Rows, test: _Rows, target: Target, method: str, penalty: float,
              max_iter: int) -> tuple[_Tally, Tensor, Tensor, Tensor]:
    """(tally of the held-out metric, predictions on the test rows, weights, bias) of one fit."""
    weights, bias = _fit(train, target, method, penalty, max_iter)
    out = test.x @ weights + bias
    predicted = out.argmax(-1) if target.n_classes is not None else out
    return _tally(test, predicted, target.n_classes is not None), predicted, weights, bias


def _chance(train: _Rows, test: _Rows, target: Target) -> float:
    """The held-out score of the best constant learned on the training rows."""
    if target.n_classes is not None:
        majority = torch.bincount(train.y, minlength=target.n_classes).argmax()
        return float((test.y == majority).to(torch.float64).mean())
    constant = train.y.mean(0).expand_as(test.y)
    tally = _tally(test, constant, classes=False)
    return float(tally.score(torch.ones(1, test.n_seq, dtype=torch.float64, device=test.y.device))[0])


def _resamples(n_seq: int, n_bootstrap: int, seed: int, device: torch.device) -> Tensor:
    """[resample, seq]: how often each held-out sequence is drawn in each bootstrap resample."""
    gen = torch.Generator().manual_seed(seed + 1)
    draws = torch.randint(n_seq, (n_bootstrap, n_seq), generator=gen)
    counts = torch.zeros(n_bootstrap, n_seq, dtype=torch.float64).scatter_add_(1, draws, torch.ones_like(
        draws, dtype=torch.float64))
    return counts.to(device)


def _scores(tally: _Tally, control: _Tally, n_bootstrap: int, seed: int) -> dict[str, Any]:
    """The score, the control and the selectivity with their intervals (the same resamples for both tallies)."""
    ones = torch.ones(1, tally.count.shape[0], dtype=torch.float64, device=tally.count.device)
    real, fake = float(tally.score(ones)[0]), float(control.score(ones)[0])
    draws = _resamples(tally.count.shape[0], n_bootstrap, seed, tally.count.device)
    names = ("score", "score_ci", "control", "control_ci", "selectivity", "selectivity_ci")
    return dict(zip(names, _paired(real, tally.score(draws), fake, control.score(draws))))


def _paired(real: float, boot: Tensor, fake: float, boot_control: Tensor) -> tuple[Any, ...]:
    """(value, interval, control, interval, value - control, interval): a measure beside its control, each with its
    95% bootstrap interval, the difference's paired (`boot` and `boot_control` drawn on the same resamples)."""
    return real, _interval(boot), fake, _interval(boot_control), real - fake, _interval(boot - boot_control)


def _interval(values: Tensor) -> tuple[float, float]:
    values = values[values.isfinite()]
    if values.numel() == 0:
        return math.nan, math.nan
    low, high = torch.quantile(values.cpu(), torch.tensor([0.025, 0.975], dtype=values.dtype))
    return float(low), float(high)


# -------------------------------------------------------------------------------------------------- engine
def fit_probe(
    activations: Float[Tensor, "batch pos feature"],
    target: Target,
    *,
    site: str = "activations",
    positions: Optional[Sequence[int]] = None,
    method: Optional[str] = None,
    control: str = "sequences",
    penalty: float | int = 1e-4,
    test_fraction: float | int = 0.5,
    n_bootstrap: int = 1000,
    max_iter: int = 100,
    seed: int = 0,
) -> ProbeFit:
    """A linear probe from `activations` to `target`, fitted on some sequences and scored on the others, with its
    control, selectivity and bootstrap intervals (`probes.representation`).

    Args:
        activations: features at every position of every sequence (any device; fitted in float64 there).
        target: what to read back, on the same [batch, pos] (`probes.targets`).
        site: the name the result gives the activations.
        positions: the positions probed (default: every position where the target is defined).
        method: "logistic" (classes' default) or "ridge" (real targets' only method; for classes, ridge on the
            one-hot labels, argmax).
        control: "sequences" (another sequence's target at the same positions) or "shuffle" (labels permuted).
        penalty: the L2 penalty on the standardised weights (ridge: x the number of training rows).
        test_fraction: the held-out share of the sequences.
        n_bootstrap: resamples of the held-out sequences for the intervals (0: none, NaN intervals).
        max_iter: L-BFGS iterations of the logistic fit.
        seed: the split, the control's labels and the resamples.

    Returns:
        A `ProbeFit`.
    """
    if not isinstance(activations, Tensor) or activations.ndim != 3 or not activations.dtype.is_floating_point:
        raise ValueError(f"activations must be a float tensor [batch, pos, feature], got {_shape(activations)}")
    check_target(target, activations.shape[:2])
    method = _check_options(target, method, control, penalty, n_bootstrap, max_iter)
    penalty = float(penalty)
    x = activations.detach().to(torch.float64)
    mask = target.valid.to(x.device) & _positions(positions, activations.shape[1], x.device)
    train_seqs, test_seqs = split_sequences(activations.shape[0], test_fraction=test_fraction, seed=seed)
    values = target.values.to(x.device)
    train, test = _rows(x, values, mask, train_seqs), _rows(x, values, mask, test_seqs)
    if len(train.y) == 0 or len(test.y) == 0:
        raise ValueError(f"target {target.name!r} is defined at no probed position of the "
                         f"{'training' if len(train.y) == 0 else 'held-out'} sequences")
    controls = [_control_rows(x, values, mask, part, control, seed + i) for i, part in enumerate((train_seqs,
                                                                                                 test_seqs))]
    tally, predicted, weights, bias = _held_out(train, test, target, method, penalty, max_iter)
    control_tally = _held_out(*controls, target, method, penalty, max_iter)[0]
    return ProbeFit(
        site=site, target=target.name, metric="accuracy" if target.n_classes is not None else "r2", method=method,
        control_kind=control, **_scores(tally, control_tally, n_bootstrap, seed), chance=_chance(train, test, target),
        per_output=_per_output(test, predicted, len(target.outputs), target.n_classes is not None),
        outputs=target.outputs, n_features=int(x.shape[-1]), n_train=len(train.y), n_test=len(test.y),
        train_sequences=tuple(train_seqs.tolist()), test_sequences=tuple(test_seqs.tolist()),
        weights=weights.cpu(), bias=bias.cpu(), penalty=penalty, seed=seed, n_bootstrap=n_bootstrap,
    )


def _shape(value: Any) -> str:
    return f"shape {tuple(value.shape)} ({value.dtype})" if isinstance(value, Tensor) else type(value).__name__


def _check_options(target: Target, method: Optional[str], control: str, penalty: float | int, n_bootstrap: int,
                   max_iter: int) -> str:
    """The method to use (the target's default when None), after checking every option."""
    classes = target.n_classes is not None
    method = ("logistic" if classes else "ridge") if method is None else method
    check_choice("method", method, METHODS)
    if method == "logistic" and not classes:
        raise ValueError(f"target {target.name!r} is real-valued: method must be 'ridge', got 'logistic'")
    check_choice("control", control, CONTROLS)
    check_number("penalty", penalty, positive=True)
    check_int("n_bootstrap", n_bootstrap, minimum=0)
    check_int("max_iter", max_iter, minimum=1)
    return method


def _positions(positions: Optional[Sequence[int]], seq_len: int, device: torch.device) -> Tensor:
    """[pos] booleans: the probed positions."""
    chosen = torch.ones(seq_len, dtype=torch.bool, device=device)
    if positions is None:
        return chosen
    index = [int(p) for p in positions]
    if not index or any(not -seq_len <= p < seq_len for p in index):
        raise ValueError(f"positions {index} must be a non-empty list within the {seq_len} positions")
    chosen[:] = False
    chosen[index] = True
    return chosen
