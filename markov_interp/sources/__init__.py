"""Markov sources: the data a model is trained and probed on, one module per family and one config class per kind.

- `fixed`: one known kernel for every sequence. `BinaryChain(p, q)` (kind "binary"), the two-state chain of
  Makkuva et al. with P(0 -> 1) = p and P(1 -> 0) = q; `MarkovChain(kernel, order=k)` (kind "markov"), any
  number of states, the kernel indexed by the last k states.
- `dirichlet`: `RandomMarkov(vocab, order, alpha)` (kind "random"), a fresh kernel per sequence with rows
  ~ Dirichlet(alpha): the in-context learning task of the induction-head literature (Edelman et al. 2024); with
  `pool_size=N` one of N kernels fixed once (the task-diversity setting of Raventos et al. 2023); with
  `zero_diagonal=True` no state follows itself.
- `cyclic`: `CyclicMarkov(vocab, alpha)` (kind "cyclic"), a fresh cyclic chain per sequence, each state staying
  with probability s_x ~ Beta(alpha, alpha) or moving on to the next state mod V.
- `hmm`: `HiddenMarkov(matrices)` (kind "hmm"), tokens emitted by a hidden Markov chain given by labelled
  transition matrices T[x, i, j] = P(emit x, move to j | in i); presets `hmm_preset("mess3" | "rrxor" | "z1r" |
  "random")` (Shai et al. 2024); its `predictive` is the forward filter's Bayes prediction, `belief_states` the
  belief over hidden states.
- `sampling` (the vectorised chain sampler every kernel source draws with, from a generator or from the counter
  stream) and `stacked` (one batch per member of a stack of runs: `stacked_sampler` from a generator per member,
  stream "torch-1"; `stream_sampler` from the counter stream, stream "counter-1", `markov_interp.streams`);
  `contexts` (the chain on contexts, its stationary law, memory blocks).
- `base`: the `Source` protocol (vocab, in_context, sample, predictive; `KernelSource` adds the kernel members,
  `HiddenSource` the hidden chain's),
  `SourceConfig` and the registry of kinds (`register_source`, `source_kinds`).

Every source's `predictive(tokens)` is its Bayes-optimal next-state law given the prefix (a fixed kernel's rows,
the in-context add-alpha posterior, a pool's exact Bayes mixture): what theory and the probes compare a model
with. A new kind is one module (its source class, its config class registered with `@register_source`) imported
below; docs/sources.md says what it must provide.
"""

from markov_interp.sources.base import (
    DEFAULT_KIND,
    FLAT_LAYOUT,
    InitialLaw,
    Kernels,
    HiddenSource,
    KernelSource,
    Probs,
    Source,
    SourceConfig,
    StreamSource,
    Tokens,
    register_source,
    source_config_class,
    source_kinds,
    source_options,
)
from markov_interp.sources.contexts import (
    context_index,
    context_kernel,
    context_transition_matrix,
    solve_stationary,
    stationary_context_law,
)
from markov_interp.sources.fixed import (
    BinaryChain,
    BinaryChainConfig,
    MarkovChain,
    MarkovChainConfig,
    kernel_predictions,
    validate_kernel,
)
from markov_interp.sources.dirichlet import (
    PoolKernels,
    PoolLaws,
    PoolWeights,
    RandomMarkov,
    RandomMarkovConfig,
    add_beta_predictions,
    pool_bayes_predictions,
    pool_log_likelihoods,
    pool_posterior,
    state_counts,
    transition_counts,
)
from markov_interp.sources.cyclic import CyclicMarkov, CyclicMarkovConfig
from markov_interp.sources.hmm import HiddenMarkov, HiddenMarkovConfig, hmm_preset, validate_hmm
from markov_interp.sources.stacked import stacked_sampler, stream_sampler

__all__ = [
    # the protocol and the registry of kinds
    "Source", "KernelSource", "HiddenSource", "StreamSource", "SourceConfig", "register_source", "source_kinds",
    "source_config_class", "source_options", "DEFAULT_KIND", "FLAT_LAYOUT", "Tokens", "Probs", "Kernels",
    "InitialLaw",
    # the sources and their configs
    "BinaryChain", "BinaryChainConfig", "MarkovChain", "MarkovChainConfig", "RandomMarkov", "RandomMarkovConfig",
    "CyclicMarkov", "CyclicMarkovConfig", "HiddenMarkov", "HiddenMarkovConfig", "hmm_preset", "validate_kernel",
    "validate_hmm", "stacked_sampler", "stream_sampler",
    # laws given a prefix
    "kernel_predictions", "add_beta_predictions", "state_counts", "transition_counts", "pool_log_likelihoods",
    "pool_posterior", "pool_bayes_predictions",
    "PoolKernels", "PoolLaws", "PoolWeights",
    # contexts
    "context_index", "context_kernel", "context_transition_matrix", "solve_stationary", "stationary_context_law",
]
