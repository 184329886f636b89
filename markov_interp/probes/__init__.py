"""Probes: find out *how* a TransformerLens model predicts the next state of a Markov chain.

Pure functions of (model, tokens or cache) returning tensors with named shapes or frozen dataclasses; they
never write files, plot, or write into a cache. One module per idea:

- `behaviour`: predictions against the true kernel, the in-context add-beta estimator and pi; loss curves;
  in-context learning score; state and context dependence.
- `attention`: previous-token, induction and same-token scores per head, beside chance.
- `ablation`: zero / mean / resample ablation of heads, attention layers and MLPs; a table over all of them.
- `patching`: activation patching between two sequences; Q/K/V composition scores.
- `readout`: the transition matrix implied by the model's predictions.
- `strategies`: KL from the model to the uniform, in-context unigram / k-gram, stationary and kernel laws.
- `classify`: `classify_mechanism`, which names the mechanism ("unigram", "kernel", "induction").

>>> # from markov_interp.probes import classify_mechanism
>>> # classify_mechanism(model, RandomMarkov(3), seed=0).mechanism
"""

from markov_interp.probes._common import (
    ProbeBatch,
    in_context_unigram_probs,
    kernel_probs,
    next_state_probs,
    sample_batch,
    stationary_probs,
    total_variation,
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
)
from markov_interp.probes.attention import (
    AttentionScores,
    attention_scores,
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
from markov_interp.probes.classify import MECHANISMS, MechanismReport, Thresholds, classify_mechanism
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
    strategy_probs,
    strategy_similarity,
)

__all__ = [
    "AblationTable", "AttentionScores", "BehaviourReport", "Component", "KernelReadout", "MECHANISMS", "METHODS",
    "MechanismReport", "PatchingResult", "ProbeBatch", "STRATEGIES", "STRATEGY_LABELS", "StrategySimilarity",
    "Thresholds", "ablated_probs", "ablation_hooks",
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
