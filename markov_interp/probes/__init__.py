"""Probes: find out *how* a TransformerLens model predicts the next state of a Markov chain.

Pure functions of (model, tokens or cache) returning tensors with named shapes or frozen dataclasses; they
never write files, plot, or write into a cache. `probes.X` is the face: the probes a user calls and what they pass in
(`__all__`, each probe with its argument types checked); the results they return, and the engines behind them (the
intervention engine, the edge runner, ablation hooks, the score functions one by one), stay in their modules, each
with its `__all__`, as `probes.<module>.<Name>` (`probes.attention.AttentionScores`, `probes.paths.EdgeRunner`). One module per idea:

- `behaviour`: `behaviour_report`, predictions against the true kernel, the in-context add-beta estimator and pi;
  loss curves; in-context learning score; state and context dependence.
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
- `interchange`: `edge_content`, what each kept edge carries (the current state, a lagged state, counts, switch
  statistics), by interchange interventions along that edge alone (`EdgeContent`).
- `circuit`: the roles read off a graph by what its edges carry (previous-token -> induction K-edges, relayed or
  not; switch-counting heads), and the circuit axis (`CircuitVerdict`: induction of the order its lags carry,
  switch counting, kernel, state counting, none).
- `law`: the law axis (`LawVerdict`: the law check raw and after a fitted temperature).
- `formation`: `circuit_formation`, the circuit at every checkpoint of a run and when each edge enters it.
- `gains`: graded gains, the fraction of each step up the ladder of in-context laws the model has climbed.
- `kernel_swap`: `swap_kernels`, in weights or in context, from sequences of kernels the model was not trained on.
- `weights`: per-head OV and QK circuits as V x V matrices, direct logit attribution.
- `targets`, `linear`, `representation`: representation probes, what an activation carries: linear probes at any
  hook (residual stream, a head's output or its q/k/v input) of the lagged state, counts, the add-beta row, the
  posterior or a target of one's own, fitted and scored on disjoint sequences, with a control, the selectivity and
  bootstrap intervals (`linear_probe`, `probe_layers`, `fit_probe`, `probe_target`).
- `beliefs`: belief-state probes of a model trained on a hidden Markov source (Shai et al. 2024): the forward
  filter's belief regressed on the residual stream at every layer and across the layers together, the simplex
  projection, and the causal test that patches the probe's subspace from a counterfactual sequence.
- `readout`: the transition matrix implied by the model's predictions.
- `strategies`: KL from the model to the uniform, stationary, true-kernel, state-and-counts and in-context
  k-gram laws.
- `classify`: `classify_mechanism`, which names the law the model predicts with ("uniform", "unigram",
  "in_context_unigram", "state_and_counts", "kernel", "induction", "switch_counting", "other") from the causal
  evidence.

>>> from markov_interp.probes import classify_mechanism
>>> classify_mechanism(model, source, n_sequences=16, seed=0).mechanism  # a hand-built induction circuit
'induction'
"""

import inspect
import sys
import types
from typing import Any

from markov_interp.probes import (  # noqa: F401  (every module, as probes.<module>)
    ablation,
    attention,
    behaviour,
    beliefs,
    circuit,
    classify,
    discovery,
    formation,
    gains,
    interchange,
    interventions,
    joint,
    kernel_swap,
    law,
    linear,
    patching,
    paths,
    readout,
    representation,
    strategies,
    targets,
    verify,
    weights,
)
from markov_interp.probes._common import ProbeBatch, checked, next_state_probs, probe_length, sample_batch, state_labels
from markov_interp.probes.ablation import ablation_table
from markov_interp.probes.attention import attention_scores
from markov_interp.probes.behaviour import behaviour_report
from markov_interp.probes.beliefs import belief_patch, belief_probes
from markov_interp.probes.classify import MECHANISMS, MechanismReport, Thresholds, classify_mechanism
from markov_interp.probes.discovery import CircuitGraph, discover_circuit
from markov_interp.probes.interchange import edge_content
from markov_interp.probes.formation import circuit_formation
from markov_interp.probes.gains import graded_gains
from markov_interp.probes.interventions import Component
from markov_interp.probes.kernel_swap import swap_kernels
from markov_interp.probes.law import check_law
from markov_interp.probes.linear import fit_probe
from markov_interp.probes.patching import activation_patching, patching_by_position
from markov_interp.probes.readout import kernel_readout
from markov_interp.probes.representation import linear_probe, probe_layers
from markov_interp.probes.strategies import STRATEGY_LABELS, strategy_similarity
from markov_interp.probes.targets import Target, probe_target
from markov_interp.probes.weights import direct_logit_attribution, ov_circuits, qk_circuits

__all__ = [
    # sequences to probe on, and the model's predictions
    "sample_batch", "ProbeBatch", "probe_length", "next_state_probs", "state_labels",
    # the verdict and its evidence
    "classify_mechanism", "MechanismReport", "Thresholds", "MECHANISMS", "behaviour_report", "attention_scores",
    "graded_gains", "swap_kernels", "kernel_readout", "strategy_similarity", "STRATEGY_LABELS", "check_law",
    # circuits: discovery, formation over training, ablation, patching, weights
    "discover_circuit", "CircuitGraph", "circuit_formation", "Component", "ablation_table", "activation_patching",
    "patching_by_position", "direct_logit_attribution", "ov_circuits", "qk_circuits",
    # what an edge carries: interchange interventions
    "edge_content",
    # what an activation carries: representation probes
    "probe_target", "Target", "linear_probe", "probe_layers", "fit_probe",
    # belief states of a hidden Markov source
    "belief_probes", "belief_patch",
]


class _CheckedModule(types.ModuleType):
    """A probes module whose public functions (its `__all__`), read from outside (`probes.strategies.
    state_and_counts_probs`, or `from markov_interp.probes.beliefs import belief_probes`), are the checked ones
    (`_common.checked`: argument types, the bounds of plain values, finite weights, the memory plan), while its own
    code and the probes' calls among themselves (bound when the modules were imported) run the functions unchecked,
    as the face's own calls always have: a NaN faithfulness is a value the package passes on, not a user's input.
    A function of a module's `__all__` is checked by default: a new one needs nothing more
    (tests/probes/test_probe_bounds.py walks them all)."""

    def __getattribute__(self, name: str) -> Any:
        value = types.ModuleType.__getattribute__(self, name)
        if name.startswith("_") or not inspect.isfunction(value):
            return value
        table = types.ModuleType.__getattribute__(self, "__dict__").get("_checked_functions", {})
        wrapped = table.get(name)
        return wrapped if wrapped is not None and wrapped.__wrapped__ is value else value

    def __setattr__(self, name: str, value: Any) -> None:  # a checked function put back (monkeypatch's undo)
        table = types.ModuleType.__getattribute__(self, "__dict__").get("_checked_functions", {})
        if table.get(name) is value:
            value = value.__wrapped__
        types.ModuleType.__setattr__(self, name, value)


for _module in [value for value in list(globals().values()) if inspect.ismodule(value) and value.__name__.startswith(
        __name__ + ".") and not value.__name__.rsplit(".", 1)[-1].startswith("_")]:
    _module._checked_functions = {name: checked(value) for name in getattr(_module, "__all__", ())
                                  for value in [vars(_module)[name]] if inspect.isfunction(value)}
    _module.__class__ = _CheckedModule
# the face: the modules' checked functions (the face's own, `sample_batch` and the rest from `_common`, checked here)
for _name in __all__:
    _value = globals()[_name]
    if inspect.isfunction(_value):
        _home = sys.modules[_value.__module__]
        globals()[_name] = getattr(_home, "_checked_functions", {}).get(_name) or checked(_value)
del _name, _value, _module, _home, checked
