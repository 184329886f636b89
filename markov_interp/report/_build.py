"""`build(run_dir)`: probe a trained run and lay the results out as report sections; `Report.save` writes them.

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
from typing import Any, Optional

import torch

from markov_interp import dynamics, models, probes, theory
from markov_interp.data import Source
from markov_interp.theory import ReferenceLosses
from markov_interp.training import RunConfig, runfolder
from markov_interp.report import figures
from markov_interp.report.circuits import axes_panel, circuit_section
from markov_interp.report._html import Section, atomic_write_text, document, iframe, paragraph, table

REPORT_FILE = "report.html"
SECTION_IDS = ("config", "loss", "mechanism", "circuit", "heads", "attention", "ablation", "kernel", "landscape",
               "training")
MODEL_SECTION_IDS = ("mechanism", "circuit", "heads", "attention", "ablation", "kernel")  # `from_model`: no run
CONDITION_SECTION = "condition"  # added after SECTION_IDS for a run that belongs to a sweep


@dataclasses.dataclass(frozen=True, eq=False)
class Report:
    """A run's report: titled `sections` (HTML, figures) plus the probe results they were drawn from.

    `html` is the whole self-contained document (no network needed to open it); `save(path)` writes it
    atomically (default `<run_dir>/report.html`). In Jupyter the report displays inline in an iframe.
    """

    title: str
    sections: tuple[Section, ...]
    mechanism: probes.MechanismReport
    run_dir: Optional[Path] = None
    intro: str = ""

    @functools.cached_property
    def html(self) -> str:
        return document(self.title, self.sections, intro=self.intro)

    def section(self, section_id: str) -> Section:
        """The section called `section_id` (one of `SECTION_IDS`)."""
        for s in self.sections:
            if s.id == section_id:
                return s
        raise ValueError(f"no section {section_id!r}; have {[s.id for s in self.sections]}")

    def save(self, path: "str | os.PathLike | None" = None) -> Path:
        """Write the HTML file atomically to `path` (default `<run_dir>/report.html`); returns the path."""
        if path is None:
            if self.run_dir is None:
                raise ValueError("this report has no run folder; pass the path to save it to")
            path = self.run_dir / REPORT_FILE
        return atomic_write_text(path, self.html)

    def _repr_html_(self) -> str:
        return iframe(self.html)


# ------------------------------------------------------------------------------------------------ loading
def _load_run(run_dir: Path) -> RunConfig:
    config = run_dir / runfolder.CONFIG_FILE
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run folder at {run_dir}")
    if not config.exists():
        raise FileNotFoundError(f"{run_dir} is not a run folder: it has no {runfolder.CONFIG_FILE}")
    run = runfolder.read_config(run_dir)  # errors name the config file
    diverged = runfolder.divergence(run_dir)
    if diverged is not None:  # a non-finite loss: there is no trained model whose mechanism could be named
        raise runfolder.TrainingDiverged(runfolder.diverged_message(run_dir, diverged), step=diverged.get("step"),
                                         run_dir=run_dir, checkpoint=diverged.get("last_finite_checkpoint"))
    return run


def checkpoint_files(run_dir: "str | os.PathLike") -> list[tuple[int, Path]]:
    """(step, weights file) of every checkpoint saved in a run folder, by step (`runfolder.list_checkpoints`)."""
    return runfolder.list_checkpoints(run_dir)


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
def _config_section(run: RunConfig, run_dir: Optional[Path]) -> Section:
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
    if getattr(tc, "interventions", ()):  # freezes / clamps during training (markov_interp.intervene)
        from markov_interp.intervene import spec_text

        rows.append(("interventions", "; ".join(spec_text(i) for i in tc.interventions)
                     + " (the probes below see the trained weights without them; `intervene.applied(model, "
                     "interventions, t)` probes under them)"))
    pretty = json.dumps(run.to_dict(), indent=2, sort_keys=True)
    return Section("config", "Run configuration", (table(rows), f"<pre>{html.escape(pretty)}</pre>"))


def _loss_section(metrics: list[dict], logged: Optional[ReferenceLosses], mech: probes.MechanismReport,
                  steps: list[int]) -> Section:
    refs = logged or mech.references
    text = paragraph(
        "Loss in nats. Reference lines come from markov_interp.theory: the entropy rate is the loss of the true "
        "kernel (global optimum), the unigram loss the plateau of a model that ignores the current state (H(pi); "
        "for random kernels the in-context unigram estimator's loss)"
        + (", the in-context Bayes loss the best possible on random kernels." if refs.in_context else ".")
        + " A reference estimated by Monte Carlo shows its standard error (±)."
    )
    parts = [text, figures.loss_curves_figure(metrics, refs, checkpoint_steps=steps)]
    parts.append(figures.position_loss_figure(mech.behaviour, mech.references))
    return Section("loss", "Loss curves", tuple(parts))


def why_panel(mech: probes.MechanismReport) -> str:
    """The report's opening panel: the label, and in two or three sentences why (the law it follows, how
    close, and for in-context laws the circuit found or what is missing)."""
    order = f", order {mech.order}" if mech.order is not None else ""
    head = (f'<div class="verdict{"" if mech.confident else " unsure"}">Mechanism: <b>{html.escape(mech.mechanism)}'
            f'</b>{order} ({"confident" if mech.confident else "not confident"})</div>')
    items = "".join(f"<li>{html.escape(r)}</li>" for r in mech.reasons[:3])
    return f'<div class="why"><h2>Why this label</h2>{head}<ul>{items}</ul></div>'


def _mechanism_section(mech: probes.MechanismReport) -> Section:
    b, law, circuit = mech.behaviour, mech.law, mech.circuit
    reasons = "<ol>" + "".join(f"<li>{html.escape(r)}</li>" for r in mech.reasons) + "</ol>"
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
        *[(f"reference: {figures.REFERENCE_STYLE[k][0]}",
           theory.format_loss(mech.reference(k), mech.reference(f"{k}_se"))) for k in figures.REFERENCE_STYLE
          if mech.reference(k) is not None],
        ("own-law check: fit (KL / gap) and margin (KL / runner-up's KL)",
         f"{law.fit_ratio:.3f} (<= {mech.thresholds.fit}), {law.margin_ratio:.3f} (<= {mech.thresholds.margin})"),
        ("graded gains (fraction of each in-context step climbed)", mech.gains.describe()),
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
    return Section("mechanism", "Mechanism verdict", (axes_panel(mech), reasons, laws, roles,
                                                      table(rows, header=("evidence", "value"))))


def _device(model: models.HookedModel) -> torch.device:
    return next(iter(model.parameters())).device


def _num(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:+.4f}"


def _heads_section(mech: probes.MechanismReport) -> Section:
    text = paragraph(
        "Attention scores per head (Olsson et al.), each beside chance: the same score for uniform causal "
        "attention on the same tokens. Colour: excess over chance; numbers: raw scores."
    )
    return Section("heads", "Head scores against chance", (text, figures.head_scores_figure(mech.attention)))


@torch.no_grad()
def _attention_section(model: models.HookedModel, tokens: torch.Tensor, cache: Optional[Any] = None) -> Section:
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
    return Section("attention", "Attention patterns on a sample sequence",
                   (text, figures.attention_patterns_figure(patterns, tokens.cpu())))


def _ablation_section(table_: probes.AblationTable, mech: probes.MechanismReport) -> Section:
    text = paragraph(
        "Each component mean-ablated on its own (its output replaced by its mean over the probe batch at the "
        "same position); bars are the resulting increase of the loss."
    )
    return Section("ablation", "Ablations", (text, figures.ablation_figure(table_, bigram_gain=mech.bigram_gain)))


@torch.no_grad()
def _kernel_section(model: models.HookedModel, mech: probes.MechanismReport, batch: probes.ProbeBatch) -> Section:
    if not batch.random_kernel:
        return Section("kernel", "Learned kernel against the true one", (figures.kernel_figure(mech.readout),))
    parts: list = [paragraph(
        "Not applicable: every sequence of this source has its own kernel, so no kernel can be learned in the "
        "weights and an average of the model's predictions per context would mix kernels that differ per "
        "sequence." + (" Below, one sequence: the model's prediction beside the in-context estimate and that "
                       "sequence's true kernel." if batch.order == 1 else ""), cls="note")]
    if batch.order == 1:
        tokens = batch.tokens[:1]
        model_probs = probes.next_state_probs(model, tokens)[0].cpu()
        add_beta = theory.add_beta_predictions(tokens.cpu(), batch.vocab, order=1, beta=batch.beta)[0]
        parts.append(figures.in_context_tracking_figure(model_probs, add_beta, batch.kernels[0].cpu(), tokens[0]))
    return Section("kernel", "Learned kernel against the true one", tuple(parts))


def _landscape_section(run: RunConfig, model: models.HookedModel, checkpoints: list[tuple[int, Path]]) -> Section:
    from markov_interp import landscape

    src, mc = run.source, run.model
    why = None
    if mc.n_layers != 1:
        why = "multi-layer model"
    elif src.kind != "binary":
        why = f"{src.kind} source, not a binary chain"
    elif mc.attn_only:
        why = "attention-only model: the canonical coordinates need the MLP"
    elif not mc.tie_weights:
        why = "untied model: the drawn landscape is the tied one, whose bad minima untied models do not have"
    if why is not None:
        return Section("landscape", "Canonical landscape",
                       (paragraph(f"Not applicable ({why}). The canonical (e, w, b) landscape of the follow-up paper "
                                  "describes tied single-layer models on binary chains.", cls="note"),))
    states = [models.read_weights(path)[1] for _, path in checkpoints] + [model]
    try:
        traj = landscape.coordinates_trajectory(states, p=src.p, q=src.q)
    except ValueError as err:
        return Section("landscape", "Canonical landscape",
                       (paragraph(f"Could not project the run onto the canonical coordinates: {err}", cls="note"),))
    e, w, b = (float(v) for v in traj.points[-1])
    ws, es = traj.points[:, 1], abs(traj.points[:, 0])
    fig = figures.landscape_figure(
        p=src.p, q=src.q, trajectory=traj,
        w_range=(min(-2.5, float(ws.min()) - 0.3), max(1.5, float(ws.max()) + 0.3)),
        e_range=(0.0, max(2.5, 1.1 * float(es.max()))),
    )
    text = paragraph(
        f"The run's checkpoints projected onto the canonical coordinates (markov_interp.landscape; a best-effort "
        f"projection for trained models with LayerNorm). Final point: e = {e:.3f}, w = {w:.3f}, b = {b:.3f}. "
        "Unigram line e = 0: a local minimum for p + q > 1 where w > -1/sqrt(2)."
    )
    return Section("landscape", "Canonical landscape", (text, fig))


def _training_section(run: RunConfig, model: models.HookedModel, checkpoints: list[tuple[int, Path]],
                      batch: probes.ProbeBatch, mech: probes.MechanismReport, metrics: list[dict],
                      logged: Optional[ReferenceLosses], max_checkpoints: int) -> Section:
    if not checkpoints:
        return Section("training", "Probe scores over training",
                       (paragraph("Not available: the run folder has no checkpoints.", cls="note"),))
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
    device = _device(model)
    true = probes.kernel_probs(batch)
    strategies: list[Any] = []  # probes.StrategySimilarity per checkpoint
    for _, path in chosen:
        ckpt = models.load(path, device=device)
        scores = probes.attention_scores(ckpt, batch.tokens)
        probs = probes.next_state_probs(ckpt, batch.tokens).cpu()
        strategies.append(probes.strategy_similarity(ckpt, batch, probs=probs))
        values = [float(scores.excess("previous_token")[prev])]
        if ind is not None:
            values.append(float(scores.excess("induction")[ind]))
        values.append(float(probes.kl_curve(true, probs).mean()))
        values.append(probes.in_context_learning_score(probes.loss_curve(probs, batch.tokens.cpu())))
        for key, value in zip(series, values):
            series[key].append(value)
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
    return Section("training", "Probe scores over training", (text, fig, *_strategy_parts(steps, strategies, events)))


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
def _model_sections(model: models.HookedModel, source: Source, *, n_sequences: int, seq_len: Optional[int], seed: int,
                    sample_len: int) -> tuple[probes.ProbeBatch, probes.MechanismReport, tuple[Section, ...]]:
    """(probe batch, `MechanismReport`, the sections `MODEL_SECTION_IDS`): what a model alone gives."""
    seq_len = probes.probe_length(model, seq_len)
    batch = probes.sample_batch(source, n_sequences=n_sequences, seq_len=seq_len, seed=seed)
    _, cache = model.run_with_cache(batch.tokens.to(_device(model)), names_filter=probes.probe_hook_names(model))
    mech = probes.classify_mechanism(model, source, batch=batch, cache=cache, seed=seed)  # table reused below
    sections = (
        _mechanism_section(mech),
        circuit_section(model, mech, batch),
        _heads_section(mech),
        _attention_section(model, batch.tokens[0, : min(sample_len, seq_len)], cache),
        _ablation_section(mech.ablation, mech),
        _kernel_section(model, mech, batch),
    )
    assert tuple(s.id for s in sections) == MODEL_SECTION_IDS
    return batch, mech, sections


def build(
    run_dir: "str | os.PathLike",
    *,
    n_sequences: int = 64,
    seq_len: Optional[int] = None,
    seed: int = 0,
    sample_len: int = 40,
    max_checkpoints: int = 8,
    device: Any = "cpu",
) -> Report:
    """Probe the run saved in `run_dir` and lay out its report (nothing is written; call `.save()`).

    The probes run on one seeded batch of `n_sequences` x `seq_len` states from the run's source (`seq_len`
    defaults to the run's training length: `probes.probe_length`); attention patterns are shown on the first `sample_len`
    states of its first sequence; at most `max_checkpoints` checkpoints are re-probed for the training
    dynamics. Sections: see `SECTION_IDS`.

    >>> # report = build("runs/binary"); report.mechanism.mechanism; report.save()  # runs/binary/report.html
    """
    for name, value, minimum in (("n_sequences", n_sequences, 2), ("sample_len", sample_len, 2),
                                 ("max_checkpoints", max_checkpoints, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    run_dir = Path(run_dir)
    run = _load_run(run_dir)
    model = runfolder.load_model(run_dir, device=device, expect=run.model)
    metrics = runfolder.load_metrics(run_dir)
    source = run.source.build()
    # the one length rule (the training length, from the run folder), one probe batch, one cache
    batch, mech, probed = _model_sections(model, source, n_sequences=n_sequences, seq_len=seq_len, seed=seed,
                                          sample_len=sample_len)
    checkpoints = checkpoint_files(run_dir)
    logged = _logged_references(metrics)
    sections = (
        _config_section(run, run_dir),
        _loss_section(metrics, logged, mech, [s for s, _ in checkpoints]),
        *probed,
        _landscape_section(run, model, checkpoints),
        _training_section(run, model, checkpoints, batch, mech, metrics, logged, max_checkpoints),
    )
    assert tuple(s.id for s in sections) == SECTION_IDS
    condition = _condition_section(run_dir)
    sections += (condition,) if condition is not None else ()
    intro = why_panel(mech) + paragraph(
        f"Eval loss {mech.eval_loss:.4f} nats on the probe batch. Generated by markov-interp; opens without a "
        "network."
    )
    return Report(title=f"markov-interp report: {run_dir.resolve().name}", sections=sections, mechanism=mech,
                  run_dir=run_dir, intro=intro)


def from_model(
    model: models.HookedModel,
    source: Source,
    *,
    n_sequences: int = 64,
    seq_len: Optional[int] = None,
    seed: int = 0,
    sample_len: int = 40,
    title: Optional[str] = None,
) -> Report:
    """A report for a model that has no run folder (hand-built, trained in memory, loaded from weights alone):
    the sections of `build` that need no run (`MODEL_SECTION_IDS`: mechanism, circuit, heads, attention,
    ablations, kernel). `save(path)` needs a path.

    Args:
        model: a hooked model.
        source: the source to probe it on (`BinaryChain`, `MarkovChain`, `RandomMarkov`).
        n_sequences, seq_len, seed: the probe batch (`seq_len` by `probes.probe_length`).
        sample_len: states of the first sequence shown in the attention patterns.
        title: the page title.

    Returns:
        A `Report`.

    >>> # report.from_model(model, RandomMarkov(3)).save("model-report.html")
    """
    _, mech, sections = _model_sections(model, source, n_sequences=n_sequences, seq_len=seq_len, seed=seed,
                                        sample_len=sample_len)
    intro = why_panel(mech) + paragraph(
        f"{repr(source)}; eval loss {mech.eval_loss:.4f} nats on the probe batch. A model without a run folder: "
        "no training curves. Generated by markov-interp; opens without a network.")
    return Report(title=title or f"markov-interp report: a model on {source!r}", sections=sections, mechanism=mech,
                  intro=intro)
