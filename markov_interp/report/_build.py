"""`build(run_dir)`: probe a trained run and lay the results out as report sections; `Report.save` writes them.

The report reads top-down. Its first screen (section "summary") holds the verdict on two axes, the circuit the
causal evidence shows and the law the outputs reach, beside the circuit diagram and the loss curve against the
reference losses; then the contents, and one section per analysis (`SECTION_IDS`). Each figure is drawn once.

Every number in the report comes from `markov_interp.probes` (the mechanism verdict, head scores, ablations,
kernel readout, behaviour along the sequence, probe scores per checkpoint), from the run's `metrics.jsonl`
(losses during training, with the `theory` reference losses logged beside them) or from
`markov_interp.landscape` (the canonical coordinates of single-layer binary runs). This module only chooses
what to show and how.
"""

import dataclasses
import functools
import html
import json
import os
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import Any, Optional

import torch

from markov_interp._threads import one_thread_if_tiny
from markov_interp import dynamics, models, probes, runs, theory
from markov_interp.probes import behaviour
from markov_interp._display import displayed, headline
from markov_interp.config import check_int
from markov_interp.sources import HiddenSource, Source, add_beta_predictions
from markov_interp.theory import ReferenceLosses
from markov_interp.devices import resolve_device
from markov_interp.runs import RunConfig
from markov_interp.report import figures
from markov_interp.report._gains import _in_context_task, gains_text
from markov_interp.report.circuits import (
    axes_panel,
    circuit_diagram,
    circuit_section,
    logit_attribution_figure,
    ov_qk_figure,
    position_patching_figure,
)
from markov_interp.report._edges import edges_section
from markov_interp.report._formation import formation_section
from markov_interp.report.interactive import interactive_circuit
from markov_interp.report._html import (Section, atomic_write_text, document, figure_svg, iframe,
                                          paragraph, section_by_id, table)

REPORT_FILE = runs.REPORT_FILE  # the run folder's own file (runs.OWN_FILES)
_LEAD = 1  # sections before the contents: the first screen
CONDITION_SECTION = "condition"  # added after SECTION_IDS for a run that belongs to a sweep


@displayed(line=lambda r: f"{r.title}: {len(r.sections)} sections; "
                         f"{headline(r.mechanism) if r.mechanism is not None else 'belief states (hidden source)'}")
@dataclasses.dataclass(frozen=True, eq=False)
class Report:
    """A run's report: titled `sections` (HTML, figures) plus the probe results they were drawn from.

    `html` is the whole self-contained document (no network needed to open it); `save(path)` writes it
    atomically (default `<run_dir>/report.html`). In Jupyter the report displays inline in an iframe.
    """

    title: str
    sections: tuple[Section, ...]
    mechanism: Optional[probes.MechanismReport]  # None for a hidden Markov source (no kernel: `report.beliefs`)
    run_dir: Optional[Path] = None
    intro: str = ""

    @functools.cached_property
    def html(self) -> str:
        return document(self.title, self.sections, intro=self.intro, lead=min(_LEAD, len(self.sections)))

    def section(self, section_id: str) -> Section:
        """The section called `section_id` (one of `SECTION_IDS`)."""
        return section_by_id(self.sections, section_id)

    def save(self, path: "str | os.PathLike | None" = None) -> Path:
        """Write the HTML file atomically to `path` (default `<run_dir>/report.html`); returns the path."""
        if path is None:
            if self.run_dir is None:
                raise ValueError("this report has no run folder; pass the path to save it to")
            path = self.run_dir / REPORT_FILE
        return atomic_write_text(path, self.html)

    def _repr_html_(self) -> str:
        return iframe(self.html)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the title, the run folder, the sections (id and title) and the verdict with its evidence
        (`MechanismReport.to_dict`); the figures are in `html`."""
        return {"title": self.title, "run_dir": None if self.run_dir is None else str(self.run_dir),
                "sections": [{"id": s.id, "title": s.title} for s in self.sections],
                "mechanism": None if self.mechanism is None else self.mechanism.to_dict()}


# ------------------------------------------------------------------------------------------------ loading
def _load_run(run_dir: Path) -> RunConfig:
    config = run_dir / runs.CONFIG_FILE
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run folder at {run_dir}")
    if not config.exists():
        raise FileNotFoundError(f"{run_dir} is not a run folder: it has no {runs.CONFIG_FILE}")
    run = runs.read_config(run_dir)  # errors name the config file
    diverged = runs.divergence(run_dir)
    if diverged is not None:  # a non-finite loss: there is no trained model whose mechanism could be named
        raise runs.TrainingDiverged(runs.diverged_message(run_dir, diverged), step=diverged.get("step"),
                                    run_dir=run_dir, checkpoint=diverged.get("last_finite_checkpoint"))
    return run


def checkpoint_files(run_dir: "str | os.PathLike") -> list[tuple[int, Path]]:
    """(step, weights file) of every checkpoint saved in a run folder, by step (`runs.list_checkpoints`)."""
    return runs.list_checkpoints(run_dir)


def _spread(items: list, n: int) -> list:
    """At most `n` items, evenly spread, always keeping the first and last."""
    if len(items) <= n:
        return items
    idx = sorted({round(i * (len(items) - 1) / (n - 1)) for i in range(n)})
    return [items[i] for i in idx]


def _logged_references(metrics: list[dict]) -> Optional[ReferenceLosses]:
    """The reference losses (with their standard errors) logged beside the last evaluation (training gets them
    from `theory`), or None when no evaluation row holds them."""
    for row in reversed(metrics):
        if "eval_loss" in row and "entropy_rate" in row:
            return ReferenceLosses.from_row(row)
    return None


# ----------------------------------------------------------------------------------------------- sections
def _config_section(run: RunConfig, run_dir: Optional[Path]) -> tuple:
    src, mc, tc = run.source, run.model, run.train
    rows = [
        ("run folder", str(run_dir) if run_dir else "(in memory)"),
        ("source", repr(src.build())),
        ("model", f"{mc.n_layers} layer(s) x {mc.n_heads} head(s), d_model {mc.d_model}, "
                  f"{'attention-only' if mc.attn_only else f'MLP {mc.d_mlp}'}, "
                  f"{'tied' if mc.tie_weights else 'untied'} unembedding, init {mc.init}"),
        # the config's count: a hooked model has surplus zero heads (heads per layer) and, on TL 2 / 3, zero biases
        # and a tied copy that are not parameters of the model
        ("parameters", f"{mc.n_params:,}"),
        ("training", f"{tc.steps} steps of {tc.batch_size} x {tc.seq_len} states, {tc.optimizer} lr {tc.lr:g} "
                     f"({tc.schedule}), {tc.precision}{' + loss scaling' if tc.loss_scaling else ''}, seed {tc.seed}"),
    ]
    if getattr(tc, "interventions", ()):  # freezes / clamps during training (markov_interp.clamps)
        from markov_interp.clamps import spec_text

        rows.append(("interventions", "; ".join(spec_text(i) for i in tc.interventions)
                     + " (the probes below see the trained weights without them; `clamps.applied(model, "
                     "interventions, t)` probes under them)"))
    pretty = json.dumps(run.to_dict(), indent=2, sort_keys=True)
    raw = ('<details class="config-json"><summary>config.json (the whole run configuration; <code>markov-interp '
           f'train --config</code> retrains it)</summary><pre>{html.escape(pretty)}</pre></details>')
    return (table(rows), raw)


def _loss_section(mech: probes.MechanismReport, refs: ReferenceLosses) -> tuple:
    text = paragraph(
        "Loss in nats. Reference lines come from markov_interp.theory: the entropy rate is the loss of the true "
        "kernel (global optimum), the unigram loss the plateau of a model that ignores the current state (H(pi); "
        "for random kernels the in-context unigram estimator's loss)"
        + (", the in-context Bayes loss the best possible on random kernels." if refs.in_context else ".")
        + " A reference estimated by Monte Carlo shows its standard error (±). The loss during training against "
        "these references is the figure at the top (Summary)."
    )
    return (text, figures.position_loss_figure(mech.behaviour, mech.references))


def shown_reasons(mech: probes.MechanismReport) -> list[str]:
    """The classifier's reasons as the report shows them: on a fixed chain the graded-gains reason gives way to
    why gains are not shown (`gains_text`)."""
    if _in_context_task(mech):
        return list(mech.reasons)
    return [gains_text(mech) if r.startswith("graded gains") else r for r in mech.reasons]


def _axis(value: Any, fallback: Callable[[], str]) -> str:
    """A verdict axis in words: `MechanismReport.circuit` / `.law` when they are verdicts (text, or a result with a
    headline), else `fallback()`, read from the evidence they hold (the `CircuitGraph`, the `LawCheck`)."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, (probes.CircuitGraph, probes.law.LawCheck)):
        return fallback()
    return headline(value)


def _graph(mech: probes.MechanismReport) -> probes.CircuitGraph:
    """The discovered `CircuitGraph`: `mech.circuit` today; where `.circuit` is a verdict, the graph it was read
    from (`.graph` or `.circuit_graph`)."""
    for value in (getattr(mech, "circuit", None), getattr(mech, "graph", None), getattr(mech, "circuit_graph", None)):
        if isinstance(value, probes.CircuitGraph):
            return value
    raise ValueError("this MechanismReport holds no CircuitGraph")


def _circuit_words(mech: probes.MechanismReport) -> str:
    """The circuit the causal evidence shows, from the graph and its induction reading."""
    graph, induction = _graph(mech), mech.induction
    kept = (f"{len(graph.kept)} of {len(graph.edges)} edges kept by path patching, faithfulness "
            f"{graph.faithfulness:.2f}")
    if induction.found:
        roles = " -> ".join(f"{r.name} {', '.join(h.name for h in r.heads)}" for r in induction.roles)
        return f"induction circuit of order {induction.order} ({roles}; K-edges {induction.effect:+.3f} nats); {kept}"
    if not _in_context_task(mech):
        swap = mech.kernel_swap
        where = ("the kernel held in the weights" if swap.in_context_fraction < mech.thresholds.in_weights
                 else "follows the context")
        return f"{where} (kernel swap: in-context fraction {swap.in_context_fraction:.2f}); {kept}"
    return f"no induction circuit ({induction.missing()}); {kept}"


def _law_check(mech: probes.MechanismReport) -> probes.law.LawCheck:
    """The own-law check: `mech.law` today; where `.law` is a verdict, the same check read again from the
    evidence (`probes.check_law`)."""
    law = getattr(mech, "law", None)
    return law if isinstance(law, probes.law.LawCheck) else probes.check_law(mech.strategies, mech.thresholds)


def _law_words(mech: probes.MechanismReport) -> str:
    """The law the outputs reach: the closest candidate law and its checks."""
    law, th = _law_check(mech), mech.thresholds
    checks = "passes" if law.passed else "fails"
    return (f"{probes.STRATEGY_LABELS.get(law.law, law.law)}: mean KL {law.divergence:.4f} nats, fit "
            f"{law.fit_ratio:.2f} (<= {th.fit}) and margin {law.margin_ratio:.2f} (<= {th.margin}): {checks} the "
            "own-law check")


def why_panel(mech: probes.MechanismReport) -> str:
    """The verdict: the label with the decision's first reason, then its two axes (the circuit the causal
    evidence shows, the law the outputs reach), the graded gains where the task has an in-context component (else
    why not) and the loss beside its references. `MechanismReport.circuit` / `.law` are shown as the axes when
    they are verdicts (a headline or text), else the axes are read from the evidence they hold."""
    order = f", order {mech.order}" if mech.order is not None else ""
    first = shown_reasons(mech)[:1]
    head = (f'<div class="verdict{"" if mech.confident else " unsure"}">Mechanism: <b>{html.escape(mech.mechanism)}'
            f'</b>{order} ({"confident" if mech.confident else "not confident"})'
            + (f'<div class="reason">{html.escape(first[0])}</div>' if first else "") + "</div>")
    rows = [("circuit", _axis(getattr(mech, "circuit", None), lambda: _circuit_words(mech))),
            ("law", _axis(getattr(mech, "law", None), lambda: _law_words(mech))),
            ("graded gains", gains_text(mech, short=True)),
            ("loss", f"{mech.eval_loss:.4f} nats on the probe batch ({mech.n_sequences} x {mech.seq_len} states); "
                     f"its references: {mech.references.describe()}")]
    return f'<div class="why">{head}{table(rows)}</div>'


def _summary_section(mech: probes.MechanismReport, loss_figure: Any) -> tuple:
    """The first screen: the verdict, then the circuit diagram beside the loss curve (or, without a run, the
    loss along the sequence) against the references."""
    pair = (f'<div class="first-screen"><figure class="diagram">{circuit_diagram(_graph(mech))}</figure>'
            f'<figure class="plot">{figure_svg(loss_figure, salt="summary-loss")}</figure></div>')
    return (why_panel(mech), pair)


def _mechanism_section(mech: probes.MechanismReport) -> tuple:
    b, law, circuit = mech.behaviour, _law_check(mech), _graph(mech)
    reasons = "<ol>" + "".join(f"<li>{html.escape(r)}</li>" for r in shown_reasons(mech)) + "</ol>"
    sim = mech.strategies
    laws = table([(probes.STRATEGY_LABELS.get(n, n), sim.divergences[n], sim.gaps[n],
                   f"same law as {probes.STRATEGY_LABELS.get(sim.aliases[n])}" if n in sim.aliases else
                   ("closest" if n == law.law else ""))
                  for n in sim.divergences], header=("candidate law", "mean KL(law || model), nats",
                                                      "gap to nearest other law, nats", ""))
    induction = mech.induction
    role_rows = [(r.name, ", ".join(h.name for h in r.heads) or "none", ", ".join(f"{x:.2f}" for x in r.scores),
                  r.effect, "yes" if r.confirmed else "no") for r in induction.roles]
    roles = table(role_rows, header=(f"role (order {induction.order} circuit)", "heads", "scores",
                                     "kept K-edges' path-patching effect, nats", "found"))
    rows = [
        ("eval loss on the probe batch (nats)", b.eval_loss),
        *[(f"reference (probe batch): {figures.REFERENCE_STYLE[k][0]}",
           theory.format_loss(mech.reference(k), mech.reference(f"{k}_se"))) for k in figures.REFERENCE_STYLE
          if mech.reference(k) is not None],
        ("own-law check: fit (KL / gap) and margin (KL / runner-up's KL)",
         f"{law.fit_ratio:.3f} (<= {mech.thresholds.fit}), {law.margin_ratio:.3f} (<= {mech.thresholds.margin})"),
        ("graded gains (fraction of each in-context step climbed)", gains_text(mech)),
        ("kernel swap: in-context fraction", f"{mech.in_context_fraction:.3f} +- {mech.kernel_swap.se:.3f}"),
        ("circuit: kept edges, faithfulness", f"{len(circuit.kept)} of {len(circuit.edges)}, "
                                              f"{circuit.faithfulness:.3f}"),
        ("state dependence / optimal predictor's", f"{b.state_dependence:.4f} / {b.reference_state_dependence:.4f} "
                                                   f"= {mech.state_ratio:.3f}"),
        ("context dependence / add-beta's", f"{b.context_dependence:.4f} / {b.reference_context_dependence:.4f} "
                                            f"= {mech.context_ratio:.3f}"),
        ("in-context learning score (late - early loss, nats)", b.icl_score),
        ("probe batch", f"{mech.n_sequences} sequences x {mech.seq_len} states, seed {mech.seed}"),
    ]
    return (axes_panel(mech), reasons, laws, roles, table(rows, header=("evidence", "value")))


def _weights_section(model: models.HookedModel, mech: probes.MechanismReport) -> tuple:
    """Per-head OV and QK circuits of the heads on the circuit (all heads when none is)."""
    graph = _graph(mech)
    on = list(graph.kept_heads()) or [n for n in graph.nodes if "H" in n]
    heads = [(int(n[1:].split("H")[0]), int(n.split("H")[1])) for n in on][:6]
    text = paragraph("OV and QK circuits of the heads on the circuit (all heads when none is; at most six), as "
                     "V x V matrices of token embeddings only: positions, LayerNorm and what earlier heads write "
                     "are left out, so a head whose keys read a previous-token head shows its match in the "
                     "circuit's K-edge, not here.")
    return (text, ov_qk_figure(probes.ov_circuits(model), probes.qk_circuits(model), heads))


def _attribution_section(model: models.HookedModel, batch: probes.ProbeBatch) -> tuple:
    attribution = probes.direct_logit_attribution(model, batch)
    text = paragraph("Direct logit attribution: what each component writes straight into the logit of the next "
                     "state (minus the mean logit), through the final LayerNorm's scale, averaged over the probe "
                     "batch; the bars add up to the total. Components a model does not have are left out.")
    return (text, logit_attribution_figure(attribution))


def _patching_section(model: models.HookedModel, mech: probes.MechanismReport, batch: probes.ProbeBatch, *,
                      max_positions: int = 48) -> tuple:
    """Activation patching by layer x position on a `patching_pair` of the probe batch's first 16 sequences, cut
    to the last `max_positions` states."""
    tokens = batch.tokens[:16, -min(max_positions, batch.tokens.shape[1]):]
    clean, corrupted = probes.patching.patching_pair(tokens, seed=mech.seed)
    if bool((clean == corrupted).all()):
        return (paragraph("Not applicable: the corrupted sequences equal the clean ones.", cls="note"),)
    text = paragraph(f"The residual stream before each layer patched from the clean run into the corrupted one, "
                     f"one position at a time ({clean.shape[0]} pairs of {clean.shape[1]} states): the fraction "
                     "of the clean prediction at the last position each patch recovers.")
    return (text, position_patching_figure(probes.patching_by_position(model, clean, corrupted)))


def _device(model: models.HookedModel) -> torch.device:
    return next(iter(model.parameters())).device


def _heads_section(mech: probes.MechanismReport) -> tuple:
    text = paragraph(
        "Attention scores per head (Olsson et al.), each beside chance: the same score for uniform causal "
        "attention on the same tokens. Colour: excess over chance; numbers: raw scores."
    )
    return (text, figures.head_scores_figure(mech.attention))


@torch.no_grad()
def _attention_section(model: models.HookedModel, tokens: torch.Tensor, cache: Optional[Any] = None) -> tuple:
    from markov_interp.probes.attention import attention_hook_names

    names = attention_hook_names(model)
    if cache is None:
        _, cache = model.run_with_cache(tokens[None].to(_device(model)), names_filter=names)
    n = tokens.shape[0]  # causal attention: the first n queries of a longer run are the run on the prefix
    patterns = torch.stack([cache[name][0, :, :n, :n] for name in names]).float().cpu()
    text = paragraph(
        f"Attention of every head on one sampled sequence of {tokens.shape[0]} states (labels are the states). "
        "Hover a head to enlarge it; rows are queries, columns keys."
    )
    return (text, figures.attention_patterns_figure(patterns, tokens.cpu()))


def _ablation_section(table_: probes.ablation.AblationTable, mech: probes.MechanismReport) -> tuple:
    text = paragraph(
        "Each component mean-ablated on its own (its output replaced by its mean over the probe batch at the "
        "same position); bars are the resulting increase of the loss."
    )
    return (text, figures.ablation_figure(table_, bigram_gain=mech.bigram_gain))


@torch.no_grad()
def _kernel_section(model: models.HookedModel, mech: probes.MechanismReport, batch: probes.ProbeBatch) -> tuple:
    if not batch.random_kernel:
        return (figures.kernel_figure(mech.readout),)
    parts: list = [paragraph(
        "Not applicable: every sequence of this source has its own kernel, so no kernel can be learned in the "
        "weights and an average of the model's predictions per context would mix kernels that differ per "
        "sequence." + (" Below, one sequence: the model's prediction beside the in-context estimate and that "
                       "sequence's true kernel." if batch.order == 1 else ""), cls="note")]
    if batch.order == 1:
        tokens = batch.tokens[:1]
        model_probs = probes.next_state_probs(model, tokens)[0].cpu()
        add_beta = add_beta_predictions(tokens.cpu(), batch.vocab, order=1, beta=batch.beta)[0]
        parts.append(figures.in_context_tracking_figure(model_probs, add_beta, batch.kernels[0].cpu(), tokens[0]))
    return tuple(parts)


def _landscape_section(run: RunConfig, model: models.HookedModel, checkpoints: list[tuple[int, Path]]) -> tuple:
    from markov_interp import landscape

    mc, (p, q) = run.model, _switching_probabilities(run.source.build())
    why = None
    if mc.n_layers != 1:
        why = "multi-layer model"
    elif p is None:
        why = f"{run.source.kind} source, not a fixed binary chain"
    elif mc.attn_only:
        why = "attention-only model: the canonical coordinates need the MLP"
    elif not mc.tie_weights:
        why = "untied model: the drawn landscape is the tied one, whose bad minima untied models do not have"
    if why is not None:
        return (paragraph(f"Not applicable ({why}). The canonical (e, w, b) landscape of the follow-up paper "
                          "describes tied single-layer models on binary chains.", cls="note"),)
    states = [models.read_weights(path)[1] for _, path in checkpoints] + [model]
    try:
        traj = landscape.coordinates_trajectory(states, p=p, q=q)
    except ValueError as err:
        return (paragraph(f"Could not project the run onto the canonical coordinates: {err}", cls="note"),)
    e, w, b = (float(v) for v in traj.points[-1])
    ws, es = traj.points[:, 1], abs(traj.points[:, 0])
    fig = figures.landscape_figure(
        p=p, q=q, trajectory=traj,
        w_range=(min(-2.5, float(ws.min()) - 0.3), max(1.5, float(ws.max()) + 0.3)),
        e_range=(0.0, max(2.5, 1.1 * float(es.max()))),
    )
    text = paragraph(
        f"The run's checkpoints projected onto the canonical coordinates (markov_interp.landscape; a best-effort "
        f"projection for trained models with LayerNorm). Final point: e = {e:.3f}, w = {w:.3f}, b = {b:.3f}. "
        "Unigram line e = 0: a local minimum for p + q > 1 where w > -1/sqrt(2)."
    )
    return (text, fig)


def _switching_probabilities(source: Source) -> tuple[Optional[float], Optional[float]]:
    """(p, q) = (P(0 -> 1), P(1 -> 0)) of a fixed two-state first-order chain (its kernel: a pool of one 2 x 2
    kernel), else (None, None): the sources the canonical landscape describes."""
    pool = getattr(source, "pool", None) if not source.in_context else None
    if pool is None or tuple(pool.shape) != (1, 2, 2):
        return None, None
    return float(pool[0, 0, 1]), float(pool[0, 1, 0])


@torch.no_grad()
def _checkpoint_outputs(checkpoints: list[tuple[int, Path]], tokens: torch.Tensor, n_heads: int,
                        device: torch.device) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
    """(attention pattern per hook name, next-state probabilities) of each checkpoint on `tokens`.

    The checkpoints run through the package's fused forward (`models.stack`, tested against the hooked model)
    as one stack member whose weights are reloaded per checkpoint: no hooked model is built per checkpoint and
    each pattern is formed once. Patterns of a layer with fewer heads are padded to `n_heads` with zero heads
    (the hooked model's layout; `probes.attention_scores` leaves them out).
    """
    from markov_interp.models.stack import Stack, stacked_forward

    stack: Optional[Stack] = None
    for _, path in checkpoints:
        cfg, state = models.read_weights(path)
        if stack is None:
            stack = Stack.from_states([cfg], [state], device=device)
        else:
            stack.load_member(0, state)
        patterns: dict[str, torch.Tensor] = {}

        def record(name: str) -> Any:
            def keep(pattern: torch.Tensor) -> torch.Tensor:
                missing = n_heads - pattern.shape[2]
                patterns[name] = torch.nn.functional.pad(pattern[0], (0, 0, 0, 0, 0, missing)) if missing else pattern[0]
                return pattern
            return keep

        hooks = {models.hooks.pattern_hook(layer): record(models.hooks.pattern_hook(layer))
                 for layer in range(cfg.n_layers)}
        logits = stacked_forward(stack, tokens.to(device)[None], hooks)[0]
        yield patterns, torch.softmax(logits.double(), dim=-1).cpu()


def _training_section(run: RunConfig, model: models.HookedModel, checkpoints: list[tuple[int, Path]],
                      batch: probes.ProbeBatch, mech: probes.MechanismReport, metrics: list[dict],
                      logged: Optional[ReferenceLosses], max_checkpoints: int) -> tuple:
    if not checkpoints:
        return (paragraph("Not available: the run folder has no checkpoints.", cls="note"),)
    chosen = _spread(checkpoints, max_checkpoints)
    n_layers = run.model.n_layers
    prev = mech.previous_token_head or mech.attention.top_head("previous_token",
                                                               layers=range(max(1, n_layers - 1)))
    ind = mech.induction_head or (mech.attention.top_head("induction", layers=range(1, n_layers))
                                  if n_layers > 1 else None)
    series: dict[str, list[float]] = {f"previous-token excess L{prev[0]}H{prev[1]}": []}
    induction_label = f"induction excess L{ind[0]}H{ind[1]}" if ind is not None else None
    if induction_label is not None:
        series[induction_label] = []
    series["KL(true kernel || model), nats"] = []
    series["in-context learning score, nats"] = []
    true = probes._common.kernel_probs(batch)
    stats = probes.attention.token_statistics(batch.tokens, vocab=batch.vocab)  # shared by every checkpoint
    strategies: list[Any] = []  # probes.strategies.StrategySimilarity per checkpoint
    for patterns, probs in _checkpoint_outputs(chosen, batch.tokens, int(model.cfg.n_heads), _device(model)):
        scores = probes.attention_scores(model, batch.tokens, cache=patterns, statistics=stats)
        strategies.append(probes.strategy_similarity(model, batch, probs=probs))
        values = [float(scores.excess("previous_token")[prev])]
        if ind is not None:
            values.append(float(scores.excess("induction")[ind]))
        values.append(float(behaviour.kl_curve(true, probs).mean()))
        values.append(behaviour.in_context_learning_score(behaviour.loss_curve(probs, batch.tokens.cpu())))
        for key, value in zip(series, values):
            series[key].append(value)
        del patterns, probs, scores  # before the next checkpoint's forward: one checkpoint's patterns at a time
    steps = [s for s, _ in chosen]
    references = logged or mech.references
    induction = series[induction_label] if ind is not None else None
    events = _training_events(steps, induction, metrics, mech.thresholds.head_excess)
    fig = figures.training_probes_figure(
        steps, series, metrics=metrics, references=references.as_row(),
        head_threshold=mech.thresholds.head_excess, events=events,
    )
    found = "; ".join(f"{label}: step {step}" for label, step in events.items()) or "none in the saved steps"
    text = paragraph(
        f"Probes re-run on {len(chosen)} saved checkpoints (same probe batch as above). The heads followed are the "
        f"final model's previous-token and induction heads. Events: {found}."
    )
    return (text, fig, *_strategy_parts(steps, strategies, events))


def _strategy_parts(steps: list[int], strategies: list[Any], events: dict[str, int]) -> tuple:
    """The strategy-similarity paragraph and figure of the training section (Edelman et al.'s phases)."""
    names = list(strategies[0].divergences)
    divergences = {probes.STRATEGY_LABELS[n]: [s.divergences[n] for s in strategies] for n in names}
    closest = "; ".join(f"step {step}: {probes.STRATEGY_LABELS[s.closest]}" for step, s in zip(steps, strategies))
    text = paragraph(
        "Closest prediction strategy at each checkpoint (smallest mean KL(strategy || model) over the probe "
        "batch; Edelman et al. 2024 see uniform, then in-context unigram, then in-context bigram on random "
        f"kernels): {closest}."
    )
    return text, figures.strategy_similarity_figure(steps, divergences, events=events)


def _training_events(steps: list[int], induction: Optional[list[float]], metrics: list[dict],
                     threshold: float) -> dict[str, int]:
    """When the induction head forms (first checkpoint whose induction excess, `induction`, reaches the
    classifier's head threshold), when the loss leaves the plateau and when it escapes: the crossings of
    `dynamics` at 0.9 and at `dynamics.ESCAPE_FRACTION` of the plateau's paired excess (the step by which each
    was seen)."""
    events: dict[str, int] = {}
    hit = [s for s, v in zip(steps, induction or ()) if v >= threshold]
    if hit:
        events["induction head forms"] = hit[0]
    run = dynamics.from_metrics(metrics, fractions=(0.9, dynamics.ESCAPE_FRACTION))
    for fraction, label in ((0.9, "loss leaves the plateau (0.9 of its excess left)"),
                            (dynamics.ESCAPE_FRACTION, "escape (half of the plateau's excess gone)")):
        if run is not None and run.crossings[fraction].escaped:
            events[label] = run.crossings[fraction].by
    return events


def _condition_section(run_dir: Path) -> Optional[Section]:
    """For a run of a sweep: its escape against its condition's survival curve (`_condition`)."""
    from markov_interp.report._condition import condition_escapes

    found = condition_escapes(run_dir)
    if found is None:
        return None
    s = found.summary
    text = paragraph(
        f"This run is cell {found.cell_id} of sweep {found.sweep_name!r} ({found.sweep_dir}): {found.sentence()}. "
        "Its condition is every finished seed of the same cell up to the seed, this run included; escape = the "
        f"first evaluation that starts {dynamics.DWELL} in a row with the paired excess loss below half the "
        "plateau's, known to lie between the previous evaluation and it (`dynamics`)."
    )
    fig = figures.run_escape_figure(s, budget=found.budget, crossing=found.escape,
                                    title=f"escape: this run against its condition ({s.n} seeds)")
    return Section(CONDITION_SECTION, "Escape time against its condition", (text, fig))


# --------------------------------------------------------------------------------------------------- build
def _probe(model: models.HookedModel, source: Source, *, n_sequences: int, seq_len: Optional[int],
           seed: int) -> tuple[probes.ProbeBatch, probes.MechanismReport, Any]:
    """(probe batch, `MechanismReport`, the cache of the probes' hooks): the one length rule
    (`probes.probe_length`), one probe batch, one forward pass shared by the classifier and the sections."""
    seq_len = probes.probe_length(model, seq_len)
    batch = probes.sample_batch(source, n_sequences=n_sequences, seq_len=seq_len, seed=seed)
    hooks = probes.classify.probe_hook_names(model)
    _, cache = model.run_with_cache(batch.tokens.to(_device(model)), names_filter=hooks)
    mech = probes.classify_mechanism(model, source, batch=batch, cache=cache, seed=seed)  # table reused below
    return batch, mech, cache


@dataclasses.dataclass(frozen=True)
class _Probed:
    """What the sections are made from: the model, its probe batch, the verdict and the probes' cache; for a run
    folder also its config, metrics, checkpoints and reference losses (None for a model without a run)."""

    model: models.HookedModel
    batch: probes.ProbeBatch
    mech: probes.MechanismReport
    cache: Any
    sample_len: int
    loss_figure: Any  # the summary's: the loss during training, or along the sequence without a run
    seed: int
    run: Optional[RunConfig] = None
    run_dir: Optional[Path] = None
    metrics: tuple = ()
    checkpoints: tuple = ()
    logged: Optional[ReferenceLosses] = None
    max_checkpoints: int = 0


@dataclasses.dataclass(frozen=True)
class SectionMaker:
    """One section of a report: its id (the HTML anchor, `Report.section(id)`), its title and the function that
    makes its parts from what was probed; `run` sections need a run folder (its config, metrics, checkpoints),
    the others a model alone (`from_model`); `cache`: it reads the probes' activations."""

    id: str
    title: str
    make: Callable[[_Probed], tuple]
    run: bool = False
    cache: bool = False

    def section(self, probed: _Probed) -> Section:
        return Section(self.id, self.title, tuple(self.make(probed)))


def _sample(p: _Probed) -> torch.Tensor:
    """The first `sample_len` states of the batch's first sequence (the attention patterns' sample)."""
    return p.batch.tokens[0, : min(p.sample_len, p.batch.tokens.shape[1])]


# every section of a report, in order (`build`: all; `from_model`: those without `run`)
SECTIONS = (
    SectionMaker("summary", "Summary", lambda p: _summary_section(p.mech, p.loss_figure)),
    SectionMaker("config", "Run configuration", lambda p: _config_section(p.run, p.run_dir), run=True),
    SectionMaker("loss", "Loss along the sequence", lambda p: _loss_section(p.mech, p.logged or p.mech.references),
                 run=True),
    SectionMaker("mechanism", "Mechanism verdict: the evidence", lambda p: _mechanism_section(p.mech)),
    SectionMaker("circuit", "Circuit found by path patching", lambda p: circuit_section(p.mech, interactive_circuit(
        p.mech, p.model, _sample(p), content=getattr(p.mech, "content", None), cache=p.cache)), cache=True),
    SectionMaker("edges", "What the edges carry", lambda p: edges_section(p.model, p.batch, p.mech, seed=p.seed,
                                                                          cache=p.cache), cache=True),
    SectionMaker("weights", "OV and QK circuits", lambda p: _weights_section(p.model, p.mech)),
    SectionMaker("attribution", "Direct logit attribution", lambda p: _attribution_section(p.model, p.batch)),
    SectionMaker("patching", "Activation patching by position",
                 lambda p: _patching_section(p.model, p.mech, p.batch)),
    SectionMaker("heads", "Head scores against chance", lambda p: _heads_section(p.mech)),
    SectionMaker("attention", "Attention patterns on a sample sequence",
                 lambda p: _attention_section(p.model, _sample(p), p.cache), cache=True),
    SectionMaker("ablation", "Ablations", lambda p: _ablation_section(p.mech.ablation, p.mech)),
    SectionMaker("kernel", "Learned kernel against the true one", lambda p: _kernel_section(p.model, p.mech, p.batch)),
    SectionMaker("landscape", "Canonical landscape",
                 lambda p: _landscape_section(p.run, p.model, list(p.checkpoints)), run=True),
    SectionMaker("training", "Probe scores over training",
                 lambda p: _training_section(p.run, p.model, list(p.checkpoints), p.batch, p.mech, list(p.metrics),
                                             p.logged, p.max_checkpoints), run=True),
    SectionMaker("formation", "Circuit over training", lambda p: formation_section(
        p.run, list(p.checkpoints), p.batch, list(p.metrics), _spread(list(p.checkpoints), p.max_checkpoints),
        seed=p.seed, final=(p.run_dir / runs.WEIGHTS_FILE, p.model, _graph(p.mech))), run=True),
)
SECTION_IDS = tuple(s.id for s in SECTIONS)
MODEL_SECTION_IDS = tuple(s.id for s in SECTIONS if not s.run)  # `from_model`: the sections that need no run folder


def _sections(makers: tuple[SectionMaker, ...], probed: _Probed, bar: Any) -> tuple[Section, ...]:
    """Every maker's section in order, advancing `bar` once each; the probes' cache is let go once no later
    section reads it (the checkpoints' sections load models of their own)."""
    out = []
    for i, maker in enumerate(makers):
        with one_thread_if_tiny(probed.model):  # tiny models: one CPU thread (markov_interp.set_threads)
            out.append(maker.section(probed))
        bar.update()
        if probed.cache is not None and not any(m.cache for m in makers[i + 1:]):
            probed = dataclasses.replace(probed, cache=None)
    return tuple(out)


def _progress(total: int, progress: bool, what: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=what, unit="section", disable=not progress, leave=False)


def _check_counts(**values: int) -> None:
    for name, value in values.items():
        check_int(name, value, minimum=2)


def build(
    run_dir: "str | os.PathLike",
    *,
    n_sequences: int = 64,
    seq_len: Optional[int] = None,
    seed: int = 0,
    sample_len: int = 40,
    max_checkpoints: int = 8,
    device: Any = "auto",
    progress: bool = False,
) -> Report:
    """Probe the run saved in `run_dir` and lay out its report (nothing is written; call `.save()`).

    The probes run on one seeded batch of `n_sequences` x `seq_len` states from the run's source (`seq_len`
    defaults to the run's training length: `probes.probe_length`); attention patterns are shown on the first
    `sample_len` states of its first sequence; at most `max_checkpoints` checkpoints are re-probed for the
    training dynamics. Sections: see `SECTION_IDS`.

    Args:
        run_dir: a run folder written by training.
        n_sequences, seq_len, seed: the probe batch.
        sample_len: states of the first sequence shown in the attention patterns.
        max_checkpoints: checkpoints re-probed (evenly spread, first and last kept).
        device: where the model is probed: "auto" (cuda when available, else cpu; the command line's default too),
            "cpu", "cuda", ...
        progress: show a progress bar over the stages (tqdm).

    Returns:
        A `Report`.

    >>> report = build(run_dir, n_sequences=8, max_checkpoints=2)  # report.save(): run_dir/report.html
    >>> [section.id for section in report.sections] == list(SECTION_IDS)
    True
    """
    _check_counts(n_sequences=n_sequences, sample_len=sample_len, max_checkpoints=max_checkpoints)
    run_dir = Path(run_dir)
    run = _load_run(run_dir)
    device = resolve_device(device)  # the one device check: a name or a torch.device of a kind we run on
    if isinstance(run.source.build(), HiddenSource):  # no kernel: the belief states (`report.beliefs`)
        return _hidden_report(run, run_dir, runs.load_model(run_dir, device=device, expect=run.model),
                              n_sequences=n_sequences, seq_len=seq_len, seed=seed)
    with _progress(len(SECTIONS) + 1, progress, "report") as bar:
        model = runs.load_model(run_dir, device=device, expect=run.model)
        batch, mech, cache = _probe(model, run.source.build(), n_sequences=n_sequences, seq_len=seq_len, seed=seed)
        bar.update()
        metrics, checkpoints = runs.load_metrics(run_dir), checkpoint_files(run_dir)
        logged = _logged_references(metrics)
        curve = figures.loss_curves_figure(metrics, logged or mech.references,
                                           checkpoint_steps=[s for s, _ in checkpoints])
        probed = _Probed(model=model, batch=batch, mech=mech, cache=cache, sample_len=sample_len, loss_figure=curve,
                         seed=seed, run=run, run_dir=run_dir, metrics=tuple(metrics), checkpoints=tuple(checkpoints),
                         logged=logged, max_checkpoints=max_checkpoints)
        del cache  # `_sections` lets it go after the last section that reads it
        sections = _sections(SECTIONS, probed, bar)
    condition = _condition_section(run_dir)
    sections += (condition,) if condition is not None else ()
    return Report(title=f"markov-interp report: {run_dir.resolve().name}", sections=sections, mechanism=mech,
                  run_dir=run_dir)


def _hidden_report(run: RunConfig, run_dir: Path, model: models.HookedModel, *, n_sequences: int,
                   seq_len: Optional[int], seed: int) -> Report:
    """The report of a run on a hidden Markov source: `beliefs.HIDDEN_SECTION_IDS` (the belief probes take at
    least `beliefs.MIN_SEQUENCES` sequences: a simplex needs points)."""
    from markov_interp.report import beliefs

    metrics = runs.load_metrics(run_dir)
    source, refs = run.source.build(), _logged_references(metrics)
    curve = figures.loss_curves_figure(metrics, refs or theory.reference_losses(source, run.train.seq_len + 1))
    sections = (beliefs.hidden_summary_section(metrics, refs, curve),
                Section("config", "Run configuration", _config_section(run, run_dir)),
                beliefs.belief_section(model, source, n_sequences=max(n_sequences, beliefs.MIN_SEQUENCES),
                                       seq_len=probes.probe_length(model, seq_len), seed=seed))
    return Report(title=f"markov-interp report: {run_dir.resolve().name}", sections=sections, mechanism=None,
                  run_dir=run_dir, intro="A run on a hidden Markov source: its belief states.")


@probes._common.checked  # a wrong argument type: a TypeError naming the parameter, as for the probes
def from_model(
    model: models.HookedModel,
    source: Source,
    *,
    n_sequences: int = 64,
    seq_len: Optional[int] = None,
    seed: int = 0,
    sample_len: int = 40,
    title: Optional[str] = None,
    progress: bool = False,
) -> Report:
    """A report for a model that has no run folder (hand-built, trained in memory, loaded from weights alone):
    the sections of `build` that need no run (`MODEL_SECTION_IDS`); its summary shows the loss along the
    sequence instead of the loss during training. `save(path)` needs a path.

    Args:
        model: a hooked model.
        source: the source to probe it on (`BinaryChain`, `MarkovChain`, `RandomMarkov`).
        n_sequences, seq_len, seed: the probe batch (`seq_len` by `probes.probe_length`).
        sample_len: states of the first sequence shown in the attention patterns.
        title: the page title.
        progress: show a progress bar over the stages (tqdm).

    Returns:
        A `Report`.

    >>> report = from_model(model, source, n_sequences=8)  # report.save("model-report.html") writes it
    >>> [section.id for section in report.sections] == list(MODEL_SECTION_IDS)
    True
    """
    _check_counts(n_sequences=n_sequences, sample_len=sample_len)
    makers = tuple(s for s in SECTIONS if not s.run)
    with _progress(len(makers) + 1, progress, "report") as bar:
        batch, mech, cache = _probe(model, source, n_sequences=n_sequences, seq_len=seq_len, seed=seed)
        bar.update()
        probed = _Probed(model=model, batch=batch, mech=mech, cache=cache, sample_len=sample_len, seed=seed,
                         loss_figure=figures.position_loss_figure(mech.behaviour, mech.references))
        del cache
        sections = _sections(makers, probed, bar)
    intro = paragraph(f"{source!r}. A model without a run folder: no training curves.")
    return Report(title=title or f"markov-interp report: a model on {source!r}", sections=sections, mechanism=mech,
                  intro=intro)
