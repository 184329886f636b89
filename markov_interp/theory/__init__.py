"""Exact reference quantities: what loss a model *should* reach, in nats.

- `stationary_distribution` (pi), `unigram_loss` (H(pi), the plateau of a model that ignores the context),
  `entropy_rate` (the loss of the true kernel, the best any predictor can do on a fixed chain) and
  `stationary_predictions` (pi at every position): the laws of one fixed chain (module `fixed` says more).
- `pool_unigram_predictions`: unigram retrieval from a finite pool of kernels (`RandomMarkov(pool_size=N)`).
- `in_context_loss_curve`: the expected loss per position of the in-context add-beta estimator.
- `hidden_references` (module `hidden`): the references of a hidden Markov source (`sources.HiddenMarkov`): the
  exact per-position Bayes loss (mixed-state enumeration), the entropy rate (exact for unifilar presentations,
  bracketed or Monte Carlo otherwise) and the losses of predicting from the last k tokens.
- `reference_losses`: the references of a source as a `ReferenceLosses`, each with its standard error, found
  through the source's family (`ReferenceFamily`: kernel sources here, hidden sources in `hidden`). Fixed
  chains: exact. Random kernels: E[entropy rate] and E[H(pi)] by quadrature (two states) or Monte Carlo to 1e-4
  (exact averages over a finite pool); the in-context Bayes, add-alpha and in-context unigram losses by
  Rao-Blackwellised Monte Carlo with control variates to below 1e-3 (checked against exact enumeration of short
  binary sequences), and for a pool the pool-Bayes loss; cached.

The laws given a prefix that these references are built on live with the sources (`markov_interp.sources`): each
source's `predictive(tokens)` (the Bayes-optimal law), `kernel_predictions` (a known kernel), `add_beta_predictions`
(the in-context add-beta estimators of every order, functions of `state_counts` / `transition_counts`) and
`pool_posterior` / `pool_bayes_predictions` (a finite pool). Sources are used through the `sources.KernelSource` protocol (vocab, order, alpha, support, pool, sample,
predictive, initial_context_laws).

Order-k kernels ([V]*k + [V]) are handled through the chain on contexts (the last k states).

The package has one module per idea, each importing only those listed before it (and `_stats`, the Monte Carlo
summaries): `fixed` (laws of one fixed chain), `pools` (finite pools of kernels), `cache` (the on-disk cache of
reference values and its entry schemas), `expectations` (E[entropy rate], E[H(pi)] over random kernels),
`in_context` (the in-context Monte Carlo), `references` (the families of sources, the plateau predictor of a
source, `reference_losses`) and `hidden` (hidden Markov sources, registered as a family).
Everything public is re-exported here (`theory.X`). A test that replaces a private name patches the module that
uses it (`theory.cache._code_version`, ...): a name here is only a re-export.
"""

from markov_interp.theory.cache import _cache_file, _disk_cache_read, _InContextEntry, _KernelEntry
from markov_interp.theory.expectations import (
    KernelExpectations,
    _kernel_expectations_cached,
    _mc_kernel_expectations,
    _spread_mean,
    expected_kernel_references,
    special_xlogx,
)
from markov_interp.theory.fixed import (
    Kernel,
    cross_entropy,
    entropy,
    entropy_rate,
    kl_divergence,
    stationary_context_distribution,
    stationary_context_laws,
    stationary_distribution,
    stationary_predictions,
    stationary_state_laws,
    target_log_loss,
    unigram_loss,
)
from markov_interp.theory.in_context import _in_context_references, in_context_loss_curve
from markov_interp.theory.pools import pool_unigram_predictions
from markov_interp.theory.references import (
    ReferenceFamily,
    ReferenceLosses,
    _random_references,
    format_loss,
    paired_losses,
    plateau_predictions,
    reference_family,
    reference_losses,
    reference_needs,
    register_references,
)
from markov_interp.theory.hidden import (  # after references: it registers the hidden family there
    BayesLossCurve,
    bayes_loss_curve,
    context_loss,
    entropy_rate_bounds,
    hidden_entropy_rate,
    hidden_references,
    mixed_states,
    stationary_token_predictions,
    word_law,
)

__all__ = [
    # fixed chains
    "Kernel", "stationary_context_distribution", "stationary_context_laws", "stationary_distribution",
    "stationary_state_laws", "entropy", "entropy_rate", "unigram_loss", "cross_entropy", "kl_divergence",
    "target_log_loss", "stationary_predictions",
    # finite pools
    "pool_unigram_predictions",
    # averages over random kernels
    "KernelExpectations", "expected_kernel_references", "special_xlogx",
    # in-context estimators
    "in_context_loss_curve",
    # hidden Markov sources
    "word_law", "context_loss", "mixed_states", "entropy_rate_bounds", "hidden_entropy_rate", "BayesLossCurve",
    "bayes_loss_curve", "hidden_references", "stationary_token_predictions",
    # a source's references
    "plateau_predictions", "paired_losses", "ReferenceLosses",
    "format_loss", "reference_losses", "reference_needs", "ReferenceFamily", "register_references",
    "reference_family",
]
