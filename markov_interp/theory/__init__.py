"""Exact reference quantities: what loss a model *should* reach, in nats.

- `stationary_distribution`: the law pi the chain settles into.
- `unigram_loss`: H(pi), the loss of the best predictor that ignores the context. A single-layer transformer
  stuck at a bad local minimum sits here (Makkuva et al.).
- `entropy_rate`: sum_s pi(s) H(P(. | s)), the loss of the true kernel, which is the best any predictor can do on
  a fixed chain (exact at every position when the first states are drawn from pi).
- `state_counts` / `transition_counts`: the in-context counts every in-context estimator is a function of.
- `add_beta_predictions`: the in-context add-beta (Laplace beta = 1, Krichevsky-Trofimov beta = 1/2) estimator of
  the next-state law from transition counts in the sequence so far: Bayes-optimal for `RandomMarkov` with
  alpha = beta when the first state's law does not depend on the kernel, and what an induction-head circuit
  approximates.
- `kernel_predictions` / `stationary_predictions`: the true next-state law (exact before an order-k context is
  full) and pi at every position, given each sequence's kernel: the one computation behind `true_predictions` /
  `plateau_predictions` for fixed chains and the probes' `kernel_probs` / `stationary_probs`.
- `pool_posterior` / `pool_bayes_predictions`: for a finite pool of kernels (`RandomMarkov(pool_size=N)`, or a
  fixed chain as a pool of one) the exact posterior over the pool given x_0..x_t and the Bayes predictor it
  gives (the mixture of the pool's kernel rows), in log space, chunked over the batch.
- `reference_losses`: all of these for a source as a `ReferenceLosses`, each with its standard error. Fixed
  chains: exact. Random kernels: E[entropy rate] and E[H(pi)] by quadrature (two states) or Monte Carlo to 1e-4
  (exact averages over a finite pool); the in-context Bayes, add-alpha and in-context unigram losses by
  Rao-Blackwellised Monte Carlo with control variates to below 1e-3 (checked against exact enumeration of short
  binary sequences), and for a pool the pool-Bayes loss; cached.

Sources are used through the `data.Source` protocol (vocab, order, alpha, pool, sample, initial_context_laws).

Order-k kernels ([V]*k + [V]) are handled through the chain on contexts (the last k states).

The package has one module per idea, each importing only those listed before it (and `_stats`, the Monte Carlo
summaries): `fixed` (laws of one fixed chain), `pools` (finite pools of kernels), `cache` (the on-disk cache of
reference values and its entry schemas), `expectations` (E[entropy rate], E[H(pi)] over random kernels),
`in_context` (the add-beta estimators and the in-context Monte Carlo) and `references` (the true and plateau
predictors of a source, `reference_losses`).
Everything public is re-exported here (`theory.X`). A test that replaces a private name patches the module that
uses it (`theory.cache._code_version`, `theory.pools._CHUNK_ELEMENTS`, ...): a name here is only a re-export.
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
    context_index,
    cross_entropy,
    entropy,
    entropy_rate,
    kernel_predictions,
    kl_divergence,
    stationary_context_distribution,
    stationary_context_laws,
    stationary_distribution,
    stationary_predictions,
    stationary_state_laws,
    target_log_loss,
    unigram_loss,
)
from markov_interp.theory.in_context import (
    _in_context_references,
    add_beta_predictions,
    in_context_loss_curve,
    state_counts,
    transition_counts,
)
from markov_interp.theory.pools import (
    PoolKernels,
    PoolLaws,
    PoolWeights,
    pool_bayes_predictions,
    pool_log_likelihoods,
    pool_posterior,
    pool_unigram_predictions,
)
from markov_interp.theory.references import (
    ReferenceLosses,
    _random_references,
    _source_key,
    format_loss,
    initial_context_laws,
    paired_losses,
    plateau_predictions,
    reference_losses,
    true_predictions,
)

__all__ = [
    # fixed chains
    "Kernel", "stationary_context_distribution", "stationary_context_laws", "stationary_distribution",
    "stationary_state_laws", "entropy", "entropy_rate", "unigram_loss", "cross_entropy", "kl_divergence",
    "context_index", "target_log_loss", "kernel_predictions", "stationary_predictions",
    # finite pools
    "PoolKernels", "PoolLaws", "PoolWeights", "pool_log_likelihoods", "pool_posterior", "pool_bayes_predictions",
    "pool_unigram_predictions",
    # averages over random kernels
    "KernelExpectations", "expected_kernel_references", "special_xlogx",
    # in-context estimators
    "add_beta_predictions", "in_context_loss_curve", "state_counts", "transition_counts",
    # a source's references
    "initial_context_laws", "true_predictions", "plateau_predictions", "paired_losses", "ReferenceLosses",
    "format_loss", "reference_losses",
]
