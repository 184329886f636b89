"""Probes: find out *how* a TransformerLens model predicts the next state of a Markov chain.

Pure functions of (model, tokens or cache) returning tensors with named shapes or frozen dataclasses; they
never write files, plot, or write into a cache. One module per idea:

- `behaviour`: predictions against the true kernel, the in-context add-beta estimator and pi; loss curves;
  in-context learning score; state and context dependence.
- `attention`: previous-token scores at lags 1..k, induction scores of order k, same-token scores per head,
  beside chance levels that hold on any chain.
- `interventions`: the one engine: `Component` (head, attention layer, MLP, embedding, a head's q/k/v input,
  residual stream, with its hook name), one setter, one forward pass with replacements and recordings.
- `ablation`: zero / mean / resample ablation of components and sets of components; a table over all of them.
- `patching`: activation patching between two sequences (per component, per layer x position); Q/K/V
  composition scores.
- `paths`: the model's graph of sender -> receiver-input edges; forward passes with any sets of edges corrupted
  (path patching); edge attribution patching (the gradient estimate).
- `discovery`: `discover_circuit`, every edge's exact path-patching effect, the kept edges, faithfulness and
  minimality, as a `CircuitGraph`.
- `joint`: joint tests of a circuit's kept edges (cancelling pairs, receivers together); `verify`: which edges
  `discover_circuit(method="attribution+verify")` measures exactly.
- `edge_content`: what each kept edge carries (the current state, a lagged state, counts, switch statistics), by
  interchange interventions along that edge alone (`EdgeContent`).
- `circuit`: the roles read off a graph by what its edges carry (previous-token -> induction K-edges, relayed or
  not; switch-counting heads), and the circuit axis (`CircuitVerdict`: induction of the order its lags carry,
  switch counting, kernel, state counting, none).
- `law`: the law axis (`LawVerdict`: the law check raw and after a fitted temperature).
- `formation`: `circuit_formation`, the circuit at every checkpoint of a run and when each edge enters it.
- `gains`: graded gains, the fraction of each step up the ladder of in-context laws the model has climbed.
- `kernel_swap`: in weights or in context, from sequences of kernels the model was not trained on.
- `weights`: per-head OV and QK circuits as V x V matrices, direct logit attribution.
- `targets`, `linear`, `representation`: representation probes, what an activation carries: linear probes at any
  hook (residual stream, a head's output or its q/k/v input) of the lagged state, counts, the add-beta row, the
  posterior or a target of one's own, fitted and scored on disjoint sequences, with a control, the selectivity and
  bootstrap intervals (`linear_probe`, `probe_layers`, `fit_probe`, `probe_target`).
- `readout`: the transition matrix implied by the model's predictions.
- `strategies`: KL from the model to the uniform, stationary, true-kernel, state-and-counts and in-context
  k-gram laws.
- `classify`: `classify_mechanism`, which names the law the model predicts with ("uniform", "unigram",
  "in_context_unigram", "state_and_counts", "kernel", "induction", "switch_counting", "other") from the causal
  evidence.

>>> # from markov_interp.probes import classify_mechanism
>>> # classify_mechanism(model, RandomMarkov(3), seed=0).mechanism
"""

import inspect

from markov_interp.probes._common import (
    DEFAULT_PROBE_LENGTH,
    ProbeBatch,
    ProbeLengthWarning,
    checked,
    in_context_unigram_probs,
    kernel_probs,
    next_state_probs,
    probe_length,
    probe_length_for,
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
    TokenStatistics,
    attention_scores,
    induction_baseline,
    induction_keys,
    induction_score,
    previous_token_score,
    same_token_score,
    token_statistics,
    uniform_causal_pattern,
)
from markov_interp.probes._display import ProbeResult, headline
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
from markov_interp.probes.circuit import (
    CIRCUIT_KINDS,
    Circuit,
    CircuitVerdict,
    Role,
    circuit_verdict,
    edge_carried,
    lag_channels,
    read_circuit,
    spread_previous_token_excess,
    switch_counting,
)
from markov_interp.probes.classify import (
    MECHANISMS,
    QUALIFIERS,
    MechanismReport,
    Thresholds,
    classify_mechanism,
    probe_hook_names,
)
from markov_interp.probes.law import LawCheck, LawVerdict, check_law, fit_temperature
from markov_interp.probes.discovery import (
    CORRUPTIONS,
    CircuitGraph,
    Edge,
    PassResult,
    discover_circuit,
    kept_edges,
)
from markov_interp.probes.edge_content import EdgeCarry, EdgeContent, edge_content
from markov_interp.probes.joint import Cancelling, JointTest
from markov_interp.probes.formation import CircuitFormation, circuit_formation, entry_step
from markov_interp.probes.gains import Gains, graded_gains
from markov_interp.probes.interventions import intervened_probs, intervened_run, set_component
from markov_interp.probes.kernel_swap import KernelSwap, SwapPlan, kernel_swap, swap_plan
from markov_interp.probes.paths import EdgeKey, EdgeRunner, edge_attributions, edge_estimates, graph_edges
from markov_interp.probes.patching import (
    PatchingResult,
    PositionPatching,
    patching_by_position,
    activation_patching,
    composition_scores,
    head_composition,
    patched_probs,
    patching_pair,
)
from markov_interp.probes.weights import LogitAttribution, direct_logit_attribution, ov_circuits, qk_circuits
from markov_interp.probes.readout import KernelReadout, implied_kernel, kernel_readout
from markov_interp.probes.linear import ProbeFit, fit_probe
from markov_interp.probes.representation import ProbeTable, linear_probe, probe_layers
from markov_interp.probes.targets import Target, probe_target
from markov_interp.probes.strategies import (
    STATE_AND_COUNTS,
    STRATEGIES,
    STRATEGY_LABELS,
    StrategySimilarity,
    in_context_name,
    in_context_order,
    state_and_counts_probs,
    strategy_probs,
    strategy_similarity,
)

__all__ = [
    "CircuitFormation", "circuit_formation", "entry_step",
    "DEFAULT_PROBE_LENGTH", "ProbeLengthWarning", "probe_length", "probe_length_for", "state_labels", "training_length",
    "AblationTable", "AttentionScores", "BehaviourReport", "CORRUPTIONS", "Cancelling", "Circuit", "CircuitGraph",
    "Component", "JointTest", "PassResult", "edge_estimates", "CIRCUIT_KINDS", "CircuitVerdict", "circuit_verdict",
    "lag_channels", "QUALIFIERS", "LawVerdict", "fit_temperature",
    "Edge", "EdgeKey", "EdgeRunner", "Gains", "KernelReadout", "KernelSwap", "LawCheck", "MECHANISMS", "METHODS",
    "MechanismReport", "PatchingResult", "ProbeBatch", "Role", "STATE_AND_COUNTS", "STRATEGIES", "STRATEGY_LABELS",
    "StrategySimilarity", "SwapPlan", "Thresholds", "ablated_probs", "ablation_hooks", "ablation_loss_change",
    "ablation_table", "activation_patching", "add_beta_predictor", "attention_scores", "behaviour", "check_law",
    "classify_mechanism", "composition_scores", "context_dependence", "discover_circuit", "edge_attributions",
    "graded_gains", "graph_edges", "head_composition", "implied_kernel", "in_context_learning_score",
    "in_context_name", "in_context_order", "in_context_unigram_probs", "induction_baseline", "induction_keys",
    "induction_score", "intervened_probs", "intervened_run", "kept_edges", "kernel_predictor", "kernel_probs",
    "kernel_readout", "kernel_swap", "kl_curve", "loss_curve", "model_components", "model_predictor",
    "next_state_probs", "patched_probs", "patching_pair", "previous_token_score", "probe_hook_names",
    "read_circuit", "reference_activations", "same_token_score", "sample_batch", "set_ablation_losses",
    "set_component", "spread_previous_token_excess", "state_and_counts_probs", "state_dependence",
    "stationary_probs", "strategy_probs", "strategy_similarity", "swap_plan", "total_variation",
    "uniform_causal_pattern", "PositionPatching", "patching_by_position", "LogitAttribution",
    "direct_logit_attribution", "ov_circuits", "qk_circuits", "TokenStatistics", "token_statistics", "checked",
    "ProbeResult", "headline",
    "ProbeFit", "ProbeTable", "Target", "fit_probe", "linear_probe", "probe_layers", "probe_target",
    "EdgeCarry", "EdgeContent", "edge_content", "edge_carried", "switch_counting",
]

# Every public probe is exported with its argument types checked (`checked`: a TypeError naming the parameter
# and what it takes); the modules keep the unwrapped functions for the package's own calls.
for _name in __all__:
    _value = globals()[_name]
    if inspect.isfunction(_value) and _name not in ("checked", "headline"):
        globals()[_name] = checked(_value)
del _name, _value
