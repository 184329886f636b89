"""Reports: a run's probes drawn as figures, in one self-contained HTML file that opens with no network.

`build(run_dir)` loads a run folder (config, metrics, final weights, checkpoints), runs `markov_interp.probes` on it
and returns a `Report`; `Report.save()` writes `<run_dir>/report.html` atomically. The report reads top-down: its
first screen ("summary") holds the verdict on two axes (the circuit the causal evidence shows, the law the outputs
reach; graded gains only where the task has an in-context component, else why not) beside the circuit diagram and
the loss curve against `theory`'s reference losses; then the contents, and one section per analysis: the run's
configuration (a table, its JSON collapsed), the loss along the sequence, the verdict's evidence, the circuit found
by path patching, what its edges carry (interchange interventions, and the previous state probed along the residual
stream: section "edges", `report._edges`), OV / QK circuits, direct logit attribution, activation patching by
position, per-head scores against chance, attention patterns (circuitsvis, its JavaScript inlined once per file),
ablations, the learned kernel against the true one, the canonical landscape (single-layer binary runs) and probe
scores over training (runs with checkpoints, run through the package's fused forward); for a run of a sweep
(`<sweep>/runs/<cell_id>` beside `<sweep>/results.csv`) also its escape against the survival curve of its
condition's seeds (section "condition", `report._condition`). `from_model(model, source)` builds the sections that
need no run folder for any model. Each figure is drawn once. `compare([run_dir, ...])` (or a sweep folder) lays
several runs side by side: verdicts, overlaid loss curves, kept edges as runs x edges, head scores, the distribution
over seeds (`report.compare`; `markov-interp report RUN1 RUN2 ... --out compare.html`).

The figure functions in `markov_interp.report.figures` return matplotlib figures (or a circuitsvis figure)
from probe results, the canonical landscape and a run's escape against its condition, for use in notebooks (the
circuit figures live in `markov_interp.report.circuits`); nothing in this package computes a probe number itself.
The experiments' figures live with the experiments (`markov_interp.experiments.escape_survival_figure`, ...), the
paper's reproduction's among them (`markov_interp.experiments.paper`).

>>> from markov_interp import report
>>> built = report.from_model(model, source, n_sequences=8)  # report.build(run_dir) for a run folder
>>> built.mechanism.mechanism, built.section("circuit").title  # built.save("report.html") writes the file
('induction', 'Circuit found by path patching')
"""

from markov_interp.report._build import (
    MODEL_SECTION_IDS,
    REPORT_FILE,
    SECTION_IDS,
    Report,
    build,
    checkpoint_files,
    from_model,
)
from markov_interp.report.interactive import InteractiveCircuit, interactive_circuit
from markov_interp.report._compare import COMPARE_SECTION_IDS, Comparison, compare
from markov_interp.report.circuits import (
    circuit_diagram,
    logit_attribution_figure,
    ov_qk_figure,
    position_patching_figure,
)
from markov_interp.report._html import (
    CircuitsFigure,
    Section,
    atomic_write_text,
    circuits_figure,
    circuitsvis_bundle,
    document,
    figure_svg,
)
from markov_interp.report.figures import (
    ablation_figure,
    attention_patterns_figure,
    head_scores_figure,
    in_context_tracking_figure,
    kernel_figure,
    landscape_figure,
    loss_curves_figure,
    position_loss_figure,
    regime_map_init_figure,
    regime_map_pq_figure,
    run_escape_figure,
    strategy_similarity_figure,
    training_probes_figure,
)

__all__ = [
    "InteractiveCircuit", "interactive_circuit", "COMPARE_SECTION_IDS", "Comparison", "compare", "MODEL_SECTION_IDS", "circuit_diagram", "from_model", "logit_attribution_figure", "ov_qk_figure",
    "position_patching_figure",
    "REPORT_FILE", "SECTION_IDS", "CircuitsFigure", "Report", "Section", "ablation_figure", "atomic_write_text",
    "attention_patterns_figure", "build", "checkpoint_files", "circuits_figure", "circuitsvis_bundle", "document",
    "figure_svg", "head_scores_figure", "in_context_tracking_figure", "kernel_figure", "landscape_figure",
    "loss_curves_figure", "position_loss_figure", "regime_map_init_figure", "regime_map_pq_figure",
    "strategy_similarity_figure", "training_probes_figure", "run_escape_figure",
]
