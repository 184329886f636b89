"""Probes: find out *how* a TransformerLens model predicts the next state of a Markov chain.

Pure functions of (model, tokens or cache) returning tensors with named shapes or frozen dataclasses; they
never write files, plot, or write into a cache. One module per idea:

- `behaviour`: predictions against the true kernel, the in-context add-beta estimator and pi; loss curves;
  in-context learning score; state and context dependence.
- `attention`: previous-token scores at lags 1..k, induction scores of order k, same-token scores per head,
  beside chance levels that hold on any chain.
- `interventions`: the one engine: `Component` (head, attention layer, MLP, with its hook name), one setter,
  one loop.
- `ablation`: zero / mean / resample ablation of components and sets of components; a table over all of them.
- `patching`: activation patching between two sequences; Q/K/V composition scores.
- `readout`: the transition matrix implied by the model's predictions.
- `strategies`: KL from the model to the uniform, stationary, true-kernel and in-context k-gram laws.
- `circuit`: induction circuits as role sets of heads, confirmed by ablating each set.
- `classify`: `classify_mechanism`, which names the law the model predicts with ("uniform", "unigram",
  "in_context_unigram", "kernel", "induction", "other") and checks it.

>>> # from markov_interp.probes import classify_mechanism
>>> # classify_mechanism(model, RandomMarkov(3), seed=0).mechanism
"""

from markov_interp.probes._common import (
    DEFAULT_PROBE_LENGTH,
    ProbeBatch,
    ProbeLengthWarning,
    in_context_unigram_probs,
    kernel_probs,
    next_state_probs,
    probe_length,
    sample_batch,
    state_labels,
    stationary_probs,
    total_variation,
    training_length,
)
from markov_interp.probes.ablation import (
    METHODS,
    AblationTable,
    Component,
    ablated_probs,
    ablation_hooks,
    ablation_loss_change,
    ablation_table,
    model_components,
    reference_activations,
    set_ablation_losses,
)
from markov_interp.probes.attention import (
    AttentionScores,
    attention_scores,
    induction_baseline,
    induction_keys,
    induction_score,
    previous_token_score,
    same_token_score,
    uniform_causal_pattern,
)
from markov_interp.probes.behaviour import (
    BehaviourReport,
    add_beta_predictor,
    behaviour,
    context_dependence,
    in_context_learning_score,
    kernel_predictor,
    kl_curve,
    loss_curve,
    model_predictor,
    state_dependence,
)
from markov_interp.probes.circuit import Circuit, Role, find_circuit
from markov_interp.probes.classify import (
    MECHANISMS,
    LawCheck,
    MechanismReport,
    Thresholds,
    check_law,
    classify_mechanism,
    probe_hook_names,
)
from markov_interp.probes.interventions import intervened_probs, set_component
from markov_interp.probes.patching import (
    PatchingResult,
    activation_patching,
    composition_scores,
    head_composition,
    patched_probs,
    patching_pair,
)
from markov_interp.probes.readout import KernelReadout, implied_kernel, kernel_readout
from markov_interp.probes.strategies import (
    STRATEGIES,
    STRATEGY_LABELS,
    StrategySimilarity,
    in_context_name,
    in_context_order,
    strategy_probs,
    strategy_similarity,
)

__all__ = [
    "DEFAULT_PROBE_LENGTH", "ProbeLengthWarning", "probe_length", "state_labels", "training_length",
    "AblationTable", "AttentionScores", "BehaviourReport", "Circuit", "Component", "KernelReadout", "LawCheck",
    "MECHANISMS", "METHODS", "MechanismReport", "PatchingResult", "ProbeBatch", "Role", "STRATEGIES",
    "STRATEGY_LABELS", "StrategySimilarity", "Thresholds", "ablated_probs", "ablation_hooks", "check_law",
    "find_circuit", "in_context_name", "in_context_order", "induction_baseline", "induction_keys",
    "intervened_probs", "probe_hook_names", "set_ablation_losses", "set_component",
    "ablation_loss_change", "ablation_table", "activation_patching", "add_beta_predictor", "attention_scores",
    "behaviour", "classify_mechanism", "composition_scores", "context_dependence", "head_composition",
    "implied_kernel", "in_context_learning_score", "in_context_unigram_probs", "induction_score",
    "kernel_predictor", "kernel_probs", "kernel_readout", "kl_curve", "loss_curve", "model_components",
    "model_predictor", "reference_activations", "next_state_probs", "patched_probs", "patching_pair",
    "previous_token_score",
    "same_token_score", "sample_batch", "state_dependence", "stationary_probs", "strategy_probs",
    "strategy_similarity", "total_variation",
    "uniform_causal_pattern",
]
