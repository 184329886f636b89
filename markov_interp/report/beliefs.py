"""The report of a run trained on a hidden Markov source (`sources.HiddenSource`): its loss against the Bayes
references, its configuration and its belief states.

A hidden source has no transition kernel, so the kernel probes behind the mechanism verdict (induction circuit or
kernel learning) do not apply; what a model of such a source can be asked is Shai et al.'s question (2024,
"Transformers represent belief state geometry in their residual stream"): does its residual stream hold the
forward filter's belief over the hidden states linearly, and does the model use it? `build` (and `from_model`) of
`markov_interp.report` give such a run the sections `HIDDEN_SECTION_IDS`:

- "summary": the loss during training beside `theory`'s references (the Bayes-optimal loss, the entropy rate);
- "config": the run's configuration (as for every run);
- "beliefs" ("Belief states"): held-out belief R^2 at every layer and across them against the shuffled control
  (`probes.beliefs.belief_probes`), the true belief simplex beside the probe's predictions coloured alike
  (`belief_simplex_figure`), and the causal test at the final layer (`probes.beliefs.belief_patch`).
"""

from collections.abc import Mapping, Sequence
from typing import Any, Optional

import torch
from matplotlib.figure import Figure

from markov_interp import models, probes
from markov_interp.report._html import Section, paragraph, table
from markov_interp.sources import HiddenSource
from markov_interp.theory import ReferenceLosses

__all__ = ["HIDDEN_SECTION_IDS", "MIN_SEQUENCES", "belief_colours", "belief_simplex_figure", "belief_section",
           "hidden_summary_section"]

HIDDEN_SECTION_IDS = ("summary", "config", "beliefs")
MIN_SEQUENCES = 500  # the belief probes' batch at least (half held out: the simplex picture's points)


# the colours of the hidden states' corners: a belief is drawn in the mixture of its states' colours
_CORNERS = ((0.85, 0.1, 0.1), (0.1, 0.65, 0.1), (0.1, 0.2, 0.9), (0.9, 0.6, 0.0), (0.6, 0.1, 0.75),
            (0.0, 0.7, 0.75), (0.5, 0.5, 0.5))


def belief_colours(beliefs: torch.Tensor) -> torch.Tensor:
    """RGB per belief [row, 3]: the mixture of its hidden states' corner colours (red, green, blue for 3 states),
    so a point's colour says where its true belief is, whatever plane it is drawn in."""
    hidden = beliefs.shape[-1]
    corners = torch.tensor([_CORNERS[i % len(_CORNERS)] for i in range(hidden)], dtype=torch.float64)
    return (beliefs.to(torch.float64).clamp(0, 1) @ corners).clamp(0, 1)


def belief_simplex_figure(points: Mapping[str, Mapping[str, Mapping[str, Sequence]]], *, title: str = "") -> Figure:
    """The true belief simplex beside the probe's predictions on held-out tokens, coloured alike (each point by its
    true belief), one row per process: the true beliefs, then the probe's predictions at each site given. Where
    the probe reads the belief, its panel repeats the true one, fractal included (Shai et al.'s picture).

    Args:
        points: {process: {site: {"true": [[...]], "predicted": [[...]]}}} (`experiments.hidden`'s seed-0 points;
            every site of a process holds the same true beliefs).
        title: above the panels.

    Returns:
        The figure (3 hidden states: barycentric coordinates; more: the true beliefs' first two principal axes,
        said in the panel title).
    """
    processes = list(points)
    n_cols = 1 + max(len(points[p]) for p in processes)
    fig = Figure(figsize=(3.2 * n_cols, 3.1 * len(processes)), layout="constrained")
    axes = fig.subplots(len(processes), n_cols, squeeze=False)
    for row, process in zip(axes, processes):
        sites = list(points[process])
        true = torch.tensor(points[process][sites[0]]["true"], dtype=torch.float64)
        plane = probes.beliefs.simplex_projection(true)
        colours = belief_colours(true).numpy()
        how = "barycentric" if plane.method == "barycentric" else f"PCA of the true beliefs ({plane.explained:.0%})"
        panels = [(f"{process}: true beliefs\n{how}", true)] + [
            (f"{process}: probe at {site}", torch.tensor(points[process][site]["predicted"], dtype=torch.float64))
            for site in sites]
        for ax, (label, shown) in zip(row, panels):
            xy = plane(shown).numpy()
            ax.scatter(xy[:, 0], xy[:, 1], c=colours, s=3, alpha=0.6, linewidths=0, rasterized=True)
            ax.set_title(label, fontsize=8)
            ax.set_aspect("equal", adjustable="datalim")
            ax.set_xticks([])
            ax.set_yticks([])
        for ax in row[len(panels):]:
            ax.axis("off")
    fig.suptitle((title + "\n" if title else "") + "held-out positions, each coloured by its true belief", fontsize=9)
    return fig


def _interval(value: float, interval: tuple[float, float]) -> str:
    return f"{value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]"


def belief_section(model: models.HookedModel, source: HiddenSource, *, n_sequences: int, seq_len: int,
                   seed: int) -> Section:
    """"Belief states": the R^2 table, the simplex figure and the causal test of one model.

    Args:
        model: a model trained on `source`.
        source: the hidden Markov source.
        n_sequences, seq_len, seed: the probe batch (half of the sequences held out); the causal test runs on
            `n_sequences` fresh sequences (seed + 1).

    Returns:
        The section.
    """
    from markov_interp.probes import beliefs

    generator = torch.Generator().manual_seed(seed)
    tokens = source.sample(n_sequences, seq_len, generator=generator)
    fits = probes.beliefs.belief_probes(model, tokens, source, n_bootstrap=200, seed=seed)
    rows = [(f.site, _interval(f.score, f.score_ci), f"{f.control:.3f}") for f in fits.fits]
    final = fits.fits[-2]  # the last layer's probe (the last fit is "all layers")
    fresh = source.sample(n_sequences, seq_len, generator=torch.Generator().manual_seed(seed + 1))
    patch = probes.beliefs.belief_patch(model, fresh, source, final, n_bootstrap=200, seed=seed)
    figure = belief_simplex_figure({"this run": beliefs.simplex_points(model, tokens, source, fits)})
    text = paragraph(
        "The forward filter's belief over the hidden states after each token (P(state | tokens so far)) regressed "
        f"on the residual stream (ridge; {n_sequences} sequences of {seq_len} tokens, R^2 on the held-out half, 95% "
        "bootstrap interval over sequences) at the embeddings (L0.resid_pre), after each block, and on all of them "
        "concatenated; the control is the same probe on beliefs shuffled over positions. Shai et al. (2024) found "
        "the Mess3 belief linear in the final layer and the RRXOR belief only across the layers together.")
    causal = paragraph(
        f"Causal test at {final.site}: replacing the stream's component in the probe's subspace (its activation "
        f"pattern's span, dimension {patch.dimension}) by that of another sequence moves the next-token law "
        f"{_interval(patch.effect, patch.effect_ci)} of the way the Bayes prediction moves (1: as far as Bayes); a "
        f"random subspace of the same dimension moves it {_interval(patch.control, patch.control_ci)}.")
    return Section("beliefs", "Belief states", (text, table(rows, header=("site", "belief R^2 [95% CI]",
                                                                          "shuffled control")), figure, causal))


def hidden_summary_section(metrics: list[dict], refs: Optional[ReferenceLosses], loss_figure: Any) -> Section:
    """"summary" of a hidden-source run: its last evaluation beside the Bayes-optimal loss and the entropy rate,
    and the loss curve.

    Args:
        metrics: the run's metrics rows (empty for a model without a run).
        refs: `theory`'s references for the training length (logged, or computed).
        loss_figure: the loss curve (training) or the loss along the sequence (a model alone).

    Returns:
        The section.
    """
    evals = [r["eval_loss"] for r in metrics if "eval_loss" in r]
    said = f"Last evaluation loss {evals[-1]:.4f} nats; " if evals else ""
    if refs is not None and refs.bayes_loss is not None:
        said += (f"the Bayes-optimal loss at the training length is {refs.bayes_loss:.4f}, the entropy rate "
                 f"{refs.entropy_rate:.4f} ({refs.entropy_rate_method}), the unigram loss {refs.unigram_loss:.4f}. ")
    said += ("A hidden Markov source has no transition kernel, so the mechanism verdict (induction circuit or kernel "
             "learning) does not apply; the belief probes below ask what the residual stream holds.")
    return Section("summary", "Summary", (paragraph(said), loss_figure))
