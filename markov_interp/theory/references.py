"""The references a model trained on a source is compared with: the best predictor the data allow (the source's
own `predictive`), the plateau before it learns the context (`plateau_predictions`), and their losses with
standard errors (`reference_losses`, a `ReferenceLosses`; cached in memory and on disk).

Each family of sources has its references here through one `ReferenceFamily` (registered with
`register_references`): the protocol its sources satisfy, the function giving their `ReferenceLosses` and their
plateau predictor. `reference_losses` and `plateau_predictions` find a source's family by its protocol, so
training, results and the CLI never ask what kind a source is. The kernel family (`sources.KernelSource`: fixed
chains, random kernels, pools) is defined here; the hidden family (`sources.HiddenSource`) in `theory.hidden`.
"""

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, Optional

import torch
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp._display import displayed
from markov_interp._plan import Need, check_needs, memory_limit, power
from markov_interp.config import SEED_MAX, check_int, check_number
from markov_interp.sources import KernelSource, SourceConfig, add_beta_predictions
from markov_interp.sources.contexts import kernel_bytes
from markov_interp.theory._stats import MAX_SEQUENCES
from markov_interp.theory.cache import _InContextEntry, _disk_cache_read, _disk_cache_write
from markov_interp.theory.expectations import expected_kernel_references
from markov_interp.theory.fixed import entropy_rate, stationary_predictions, target_log_loss, unigram_loss
from markov_interp.theory.in_context import _in_context_references
from markov_interp.theory.pools import _pool_bayes_references


def plateau_predictions(source: Any, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos vocab"]:
    """The plateau a model sits on before it learns the context, at every position: its family's
    (`ReferenceFamily.plateau`). Kernel sources: the stationary law pi (the unigram solution of Makkuva et al.;
    `stationary_predictions`) for fixed chains; the in-context unigram (add-alpha state count) estimator for random
    kernels (fresh or from a finite pool), the best a model can do without using the current state's transitions
    (where the prior rules transitions out, `support`, e.g. `zero_diagonal`, the counts are restricted to the
    states the current state can move to: knowing that costs no in-context learning). Hidden sources: the
    stationary token law (`theory.hidden`).

    >>> from markov_interp.sources import BinaryChain
    >>> plateau_predictions(BinaryChain(0.2, 0.3), torch.tensor([[0, 1]]))[0, 0]
    tensor([0.6000, 0.4000], dtype=torch.float64)
    """
    return reference_family(source).plateau(source, tokens)


def _kernel_plateau(source: KernelSource, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos vocab"]:
    if source.in_context:  # kernels from a prior
        return add_beta_predictions(tokens, source.vocab, order=0, beta=source.alpha, support=source.support)
    return stationary_predictions(source.pool, tokens)


def paired_losses(source: Any, tokens: Int[Tensor, "batch pos"]) -> tuple[float, float]:
    """(true, plateau): mean log-loss of the source's `predictive` and of `plateau_predictions` over every target
    of `tokens` (x_1..x_T). Subtracted from a model's loss on the *same* tokens they give its paired excess
    and the plateau's, free of most sampling noise (`dynamics.curve_from_metrics`)."""
    true = target_log_loss(source.predictive(tokens), tokens).mean()
    plateau = target_log_loss(plateau_predictions(source, tokens), tokens).mean()
    return float(true), float(plateau)


# the scalar values of a ReferenceLosses, in the order rows list them
_ROW_VALUES = ("entropy_rate", "unigram_loss", "bayes_loss", "add_alpha_loss", "oracle_unigram_loss", "pool_bayes_loss",
               "bigram_loss", "trigram_loss")


@displayed
@dataclasses.dataclass(frozen=True, kw_only=True)
class ReferenceLosses:
    """The losses (nats per prediction, averaged over the targets of a sequence) a model is compared with.

    Every value carries its standard error (`*_se`): 0 when exact, a quadrature error estimate when computed
    by quadrature, the Monte Carlo standard error otherwise.

    - `entropy_rate`: the loss of the true kernel (an oracle that knows each sequence's kernel); for random
      kernels its expectation over kernels.
    - `unigram_loss`: the unigram plateau, the loss of the best predictor that ignores the current state: H(pi)
      for a fixed chain; for random kernels the in-context unigram estimator (add-alpha state counts of the
      sequence so far), what a single-layer model sits at (`in_context_unigram_loss` names it there).
    - random kernels only: `bayes_loss`, the Bayes-optimal in-context loss under the sampler's law (the
      posterior predictive; with a stationary first state it also uses what x_0 says about the kernel);
      `add_alpha_loss`, the loss of the add-alpha count estimator (`add_beta_predictions` with beta = alpha: the
      posterior predictive when the first state's law does not depend on the kernel, what an induction head
      approximates); `oracle_unigram_loss`, E[H(pi)], the loss of an oracle that knows each sequence's pi.
    - a finite pool of kernels (`RandomMarkov(pool_size=N)`) only: `pool_bayes_loss`, the loss of the pool's
      Bayes predictor (`pool_bayes_predictions`), what a model that memorised the pool reaches; the in-context
      values above are then measured on the pool's sequences, and `entropy_rate`, `oracle_unigram_loss` are
      exact averages over the pool.
    - a hidden Markov source (`sources.HiddenSource`; `hidden`): `bayes_loss` is the Bayes-optimal loss (the
      forward filter's) averaged over the targets, the optimum, exact by mixed-state enumeration where the beliefs
      stay few (`bayes_curve` per position; beyond, the entropy rate's bracket or Monte Carlo, `bayes_loss_se`);
      `entropy_rate` its limit once the belief has synchronised, found by `entropy_rate_method` ("exact",
      "bracket": its `_se` is the half-width of a rigorous interval, "monte carlo"); `unigram_loss`,
      `bigram_loss`, `trigram_loss` the losses of the best predictors from the last k = 0, 1, 2 tokens (exact).
    - curves: per target position t (predicting x_{t+1}), for random kernels and hidden sources.
    """

    entropy_rate: float
    unigram_loss: float
    bayes_loss: float | None = None
    add_alpha_loss: float | None = None
    oracle_unigram_loss: float | None = None
    entropy_rate_se: float = 0.0
    unigram_loss_se: float = 0.0
    bayes_loss_se: float | None = None
    add_alpha_loss_se: float | None = None
    oracle_unigram_loss_se: float | None = None
    pool_bayes_loss: float | None = None
    pool_bayes_loss_se: float | None = None
    add_alpha_curve: tuple[float, ...] | None = dataclasses.field(default=None, repr=False)
    add_alpha_curve_se: tuple[float, ...] | None = dataclasses.field(default=None, repr=False)
    unigram_curve: tuple[float, ...] | None = dataclasses.field(default=None, repr=False)
    unigram_curve_se: tuple[float, ...] | None = dataclasses.field(default=None, repr=False)
    pool_bayes_curve: tuple[float, ...] | None = dataclasses.field(default=None, repr=False)
    pool_bayes_curve_se: tuple[float, ...] | None = dataclasses.field(default=None, repr=False)
    bigram_loss: float | None = None
    trigram_loss: float | None = None
    entropy_rate_method: str | None = None
    bayes_curve: tuple[float, ...] | None = dataclasses.field(default=None, repr=False)
    bayes_curve_se: tuple[float, ...] | None = dataclasses.field(default=None, repr=False)

    @property
    def optimum(self) -> float:
        """The best loss any predictor reaches: the pool-Bayes loss for a finite pool, the in-context Bayes loss
        for fresh random kernels, the Bayes loss over the positions for a hidden source, else the entropy rate."""
        return self.pool_bayes_loss if self.pool_bayes_loss is not None else (
            self.bayes_loss if self.bayes_loss is not None else self.entropy_rate)

    @property
    def optimum_se(self) -> float:
        return self.pool_bayes_loss_se if self.pool_bayes_loss is not None else (
            self.bayes_loss_se if self.bayes_loss is not None else self.entropy_rate_se)

    @property
    def in_context(self) -> bool:
        """True for random kernels, where the references are in-context losses."""
        return self.bayes_loss is not None and not self.hidden

    @property
    def hidden(self) -> bool:
        """True for a hidden Markov source (its references hold the losses from the last k tokens)."""
        return self.bigram_loss is not None

    @property
    def in_context_unigram_loss(self) -> float | None:
        """The in-context unigram estimator's loss (random kernels; None for a fixed chain)."""
        return self.unigram_loss if self.in_context else None

    def as_row(self, digits: int | None = None) -> dict[str, float | str]:
        """Flat columns for a metrics row or table: the values that exist, and `<name>_se` where not 0.

        Keys: entropy_rate, unigram_loss (the plateau), for random kernels bayes_loss, add_alpha_loss,
        oracle_unigram_loss, and for a finite pool pool_bayes_loss; for a hidden source bayes_loss, bigram_loss,
        trigram_loss and entropy_rate_method (text). `digits` rounds every value (rows that must compare exactly
        across calls)."""
        row: dict[str, float | str] = {}
        for name in _ROW_VALUES:
            value = getattr(self, name)
            if value is None:
                continue
            row[name] = float(value) if digits is None else round(float(value), digits)
            se = getattr(self, f"{name}_se", None)  # the last-k-token losses are exact
            if se:
                row[f"{name}_se"] = float(se) if digits is None else round(float(se), digits)
        if self.entropy_rate_method is not None:
            row["entropy_rate_method"] = self.entropy_rate_method
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "ReferenceLosses":
        """The values (and standard errors) of `as_row` read back from a metrics row or table row; other keys
        are ignored, the curves are not in rows."""
        names = [f.name for f in dataclasses.fields(cls) if "curve" not in f.name]
        missing = [k for k in ("entropy_rate", "unigram_loss") if row.get(k) is None]
        if missing:
            raise ValueError(f"a reference row needs {missing}; it has {sorted(row)}")
        # a missing `<name>_se` stays None (not recorded, e.g. rows of older runs) for the in-context values
        method = row.get("entropy_rate_method")
        return cls(**{k: float(row[k]) for k in names if row.get(k) is not None and k != "entropy_rate_method"},
                   entropy_rate_method=None if method is None else str(method))

    def describe(self) -> str:
        """One line for people: every value, with its standard error where that is not negligible (>= 5e-5)."""
        labels = {"entropy_rate": "entropy rate", "unigram_loss": "in-context unigram loss" if self.in_context
                  else "unigram loss", "bayes_loss": "Bayes loss" if self.hidden else "in-context Bayes loss",
                  "add_alpha_loss": "add-alpha loss", "oracle_unigram_loss": "oracle E[H(pi)]",
                  "pool_bayes_loss": "pool Bayes loss", "bigram_loss": "last-token loss",
                  "trigram_loss": "last-2-token loss"}
        row = self.as_row()
        method = f" ({self.entropy_rate_method})" if self.entropy_rate_method is not None else ""
        return ", ".join(f"{label} {format_loss(row[k], row.get(k + '_se'))}" + (method if k == "entropy_rate" else "")
                         for k, label in labels.items() if k in row)


def format_loss(value: float, se: float | None = None, digits: int = 4) -> str:
    """`value` with '± se' appended when the standard error shows at this precision (>= half the last digit)."""
    text = f"{value:.{digits}f}"
    if se is not None and se >= 0.5 * 10 ** -digits:
        text += f" ± {se:.{digits}f}"
    return text


# ------------------------------------------------------------------------------------------- the families
@dataclasses.dataclass(frozen=True)
class ReferenceFamily:
    """A family of sources whose references theory computes, found by the protocol its sources satisfy.

    - `name`: what errors call it ("kernel", "hidden").
    - `protocol`: a runtime-checkable protocol (or a class) its sources satisfy (`sources.KernelSource`, ...).
    - `references(source, seq_len, *, seed, tol, n_sequences)`: its `ReferenceLosses` at a training length.
    - `plateau(source, tokens)`: the plateau predictor's law at every position, [batch, pos, vocab] float64 (what
      training's paired evaluation logs as "eval_plateau_loss").
    """

    name: str
    protocol: type
    references: Callable[..., ReferenceLosses]
    plateau: Callable[[Any, Tensor], Tensor]


_FAMILIES: dict[str, ReferenceFamily] = {}


def register_references(family: ReferenceFamily) -> ReferenceFamily:
    """Make theory know the references of a family of sources (the kernel family is registered here, the hidden
    one by `theory.hidden`; a source of a new family registers its own once). Families are tried in
    registration order.

    Args:
        family: the family.

    Returns:
        `family`; a name registered already raises ValueError.
    """
    if family.name in _FAMILIES:
        raise ValueError(f"a reference family {family.name!r} is registered already")
    _FAMILIES[family.name] = family
    return family


def reference_family(source: Any) -> ReferenceFamily:
    """The family of `source`: the first registered family whose protocol it satisfies; ValueError naming the
    families and what each needs otherwise.

    >>> from markov_interp.sources import BinaryChain
    >>> reference_family(BinaryChain(0.2, 0.3)).name
    'kernel'
    """
    for family in _FAMILIES.values():
        if isinstance(source, family.protocol):
            return family
    known = "; ".join(f"{f.name}: a sources.{f.protocol.__name__}" for f in _FAMILIES.values())
    raise ValueError(f"unknown source type {type(source).__name__}: theory knows the references of ({known}); "
                     "a new family registers its own (theory.register_references)")


# source: Any, not Source: a non-source gets the families' ValueError (the test run's type checker would answer
# first with a TypeError)
def reference_losses(source: Any, seq_len: int, *, seed: int = 0, tol: float = 5e-4,
                     n_sequences: int | None = None) -> ReferenceLosses:
    """The losses a model trained on `source` is compared with, averaged over the targets t = 0..seq_len-2: its
    family's (`ReferenceFamily.references`).

    Fixed kernels (`MarkovChain`, `BinaryChain`): the exact entropy rate (global optimum) and H(pi) (the
    unigram plateau), standard errors 0. `RandomMarkov` (see `ReferenceLosses` for each value's meaning):
    E[entropy rate] and E[H(pi)] by quadrature (two states) or Monte Carlo to a standard error below 1e-4 (exact
    averages over a finite pool); the in-context losses, and for a finite pool the pool-Bayes loss, by Monte
    Carlo over `seed`'s sequences until each standard error is below `tol` (or over exactly `n_sequences`).
    Hidden Markov sources (`sources.HiddenSource`): the per-position Bayes loss, the entropy rate with its method
    and the last-k-token losses (`theory.hidden.hidden_reference_losses`). Results are cached in memory and, where
    Monte Carlo is involved, on disk (`$MARKOV_INTERP_CACHE`, default ~/.cache/markov-interp; "off" disables), so
    sweeps and reports pay once.

    Args:
        source: a source of a registered family (`reference_family`).
        seq_len: sequence length; the values average the seq_len - 1 targets.
        seed: seed of the Monte Carlo draws.
        tol: standard error to reach by Monte Carlo.
        n_sequences: a fixed number of Monte Carlo sequences instead of `tol` (at most `MAX_SEQUENCES`, what
            `tol` draws at most).

    Returns:
        A `ReferenceLosses` (with `pool_bayes_loss` for a finite pool).

    Raises:
        PlanTooLarge: the Monte Carlo's arrays would not fit in memory (`reference_needs`), naming the size.
    """
    check_int("seq_len", seq_len, minimum=2)  # one target at least
    check_int("seed", seed, minimum=0, maximum=SEED_MAX)
    check_int("n_sequences", n_sequences, minimum=2, maximum=MAX_SEQUENCES, none_ok=True)  # the Monte Carlo's cap
    return reference_family(source).references(source, seq_len, seed=seed, tol=tol, n_sequences=n_sequences)


def _kernel_references(source: KernelSource, seq_len: int, *, seed: int, tol: float,
                       n_sequences: Optional[int]) -> ReferenceLosses:
    check_needs(reference_needs(vocab=source.vocab, order=source.order, random=source.in_context,
                                seq_len=seq_len, pool_size=getattr(source, "pool_size", None)),
                memory_limit("cpu"), where="reference_losses", before="anything was allocated")
    if not source.in_context:  # one fixed kernel: exact
        return ReferenceLosses(entropy_rate=entropy_rate(source), unigram_loss=unigram_loss(source))
    config = getattr(source, "config", None)
    if not isinstance(config, SourceConfig):  # the Monte Carlo below is cached under the source's config
        raise ValueError(f"reference losses of random kernels are keyed on the source's config: "
                         f"{type(source).__name__} has no `config` property giving its sources.SourceConfig")
    check_number("tol", tol, positive=True)
    return _random_references(config.to_json(), seq_len, seed, float(tol), n_sequences)


REFERENCE_SEQUENCES = 1024  # kernels and sequences the in-context Monte Carlo holds at once (at least one chunk)


def reference_needs(*, vocab: int, order: int, random: bool, seq_len: int, pool_size: int | None = None,
                    fields: list[tuple[str, Any]] | None = None) -> list[Need]:
    """The memory `reference_losses` holds for a source of `vocab` states and order `order` at `seq_len` (a lower
    bound, the one estimate `reference_losses` and `training.plan` check): for a fixed kernel its stationary
    solve; for random kernels `REFERENCE_SEQUENCES` kernels and sequences of per-target losses at once, and a
    finite pool's kernels.

    Args:
        vocab, order, random, pool_size: the source's.
        seq_len: the sequence length the losses average over.
        fields: how a refusal names the sizes (default: vocab, order, seq_len).

    Returns:
        One `Need`.
    """
    contexts = power(vocab, order)  # capped at 2**63: vocab**order itself would take hours for order 2**40
    per_kernel = kernel_bytes(contexts, vocab)
    if random:
        n_bytes = (REFERENCE_SEQUENCES * (contexts * vocab + 8 * seq_len) * 8 + per_kernel
                   + (pool_size or 0) * contexts * vocab * 8)
    else:
        n_bytes = 2 * per_kernel
    fields = fields if fields is not None else [("vocab", vocab), ("order", order), ("seq_len", seq_len)]
    return [Need.of("the reference losses", n_bytes, fields)]


@functools.lru_cache(maxsize=64)
def _random_references(config_json: str, seq_len: int, seed: int, tol: float,
                       n_sequences: int | None) -> ReferenceLosses:
    config = SourceConfig.from_json(config_json)
    source = config.build()
    kernel = expected_kernel_references(source, seed=seed)
    pool = source.pool is not None
    key = {"what": "in-context", **config.reference_key(), "seq_len": seq_len, "seed": seed, "tol": tol,
           "n_sequences": n_sequences, "kernel": kernel.cache_dict()}
    found = _disk_cache_read(key, _InContextEntry)  # its schema checks the values against this key
    if found is None:
        found = _in_context_references(source, seq_len, kernel, seed=seed, tol=tol, n_sequences=n_sequences)
        if pool:
            found.update(_pool_bayes_references(source, seq_len, seed=seed, tol=tol, n_sequences=n_sequences))
        _disk_cache_write(key, found)
    curves = {k: tuple(v) for k, v in found.items() if k.endswith(("_curve", "_curve_se"))}
    values = {k: v for k, v in found.items() if k not in curves and k != "n_sequences"}
    return ReferenceLosses(entropy_rate=kernel.entropy_rate, entropy_rate_se=kernel.entropy_rate_se,
                           oracle_unigram_loss=kernel.oracle_unigram_loss,
                           oracle_unigram_loss_se=kernel.oracle_unigram_loss_se,
                           **values, **curves)


register_references(ReferenceFamily("kernel", KernelSource, _kernel_references, _kernel_plateau))
