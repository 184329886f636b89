"""The report's "What the edges carry" section: what each kept edge of the circuit carries (the interchange
interventions `classify_mechanism` already ran, `MechanismReport.content`) and where along the depth the previous
state becomes linearly readable (`probes.probe_layers` on the report's probe batch).

Path patching says where information flows; these two tables say what flows. An edge into an induction head's keys
that carries `lag1` is the previous-token half of an induction circuit; a linear probe that reads the lag-1 state
after layer 0 and not before (beyond its control) says some head of layer 0 writes it.
"""

from typing import Any, Optional

from markov_interp import probes
from markov_interp.report._html import paragraph, table

PROBE_BOOTSTRAP = 200  # resamples of the held-out sequences behind each probe's interval
PROBE_LAG = 1  # the probed state: x_{t-1}
PROBE_METHOD = "ridge"  # closed form on one-hot labels: 2.4-2.9 s against logistic 6.1-7.9 s (64 x 128, 1 thread)
_CONTROL_TEXT = {"sequences": "another sequence's target at the same positions", "shuffle": "the labels permuted"}


def _interval(bounds: tuple[float, float]) -> str:
    return f"[{bounds[0]:.2f}, {bounds[1]:.2f}]"


def edge_rows(content: "probes.interchange.EdgeContent") -> list[tuple]:
    """One row per edge: its name, what it carries (or '—'), the variable's kind, the explained fraction of the
    carried (else the closest) variable on the logits [bootstrap 95%] and on the receiver's attention, the share of
    positions patched, and the random interchange's effect (nats: what the edge carries at all)."""
    rows = []
    for e in content.edges:
        if not e.measured:
            rows.append((e.edge, e.carries, e.kind, "by construction", "", "", ""))
            continue
        shown = e.carries or e.best
        logits = "" if shown is None else f"{shown}: {e.explained[shown]:.2f} {_interval(e.interval[shown])}"
        attention = "" if shown is None else e.attention.get(shown, float("nan"))
        coverage = "" if shown is None else e.coverage.get(shown, float("nan"))
        rows.append((e.edge, e.carries or "—", e.kind or "", logits, attention, coverage, e.effect))
    return rows


def probe_rows(found: "probes.representation.ProbeTable") -> list[tuple]:
    """One row per site: the score, its control and the selectivity, each with its 95% interval, and chance."""
    return [(fit.site, f"{fit.score:.3f} {_interval(fit.score_ci)}", f"{fit.control:.3f} {_interval(fit.control_ci)}",
             f"{fit.selectivity:+.3f} {_interval(fit.selectivity_ci)}", fit.chance) for fit in found.fits]


def edges_section(model: Any, batch: "probes.ProbeBatch", mech: "probes.MechanismReport", *, seed: int = 0,
                  cache: Optional[Any] = None) -> tuple:
    """The section's parts: the edge-content table (or why there is none) and the lag-1 state probed along the
    residual stream.

    Args:
        model: the probed model.
        batch: the report's probe batch (the probes' sequences; at least 4).
        mech: its `classify_mechanism` report (`content`: what each kept edge carries, None when not measured).
        seed: the probes' split and bootstrap seed.
        cache: the probes' cache of the same tokens (read where it holds the residual hooks).

    Returns:
        The HTML parts, in order.
    """
    content = mech.content
    if content is None:
        edges = (paragraph("What the kept edges carry was not measured for this model (`classify_mechanism` reads it "
                           "only where the residual stream is a sum of its components' outputs, with content=True); "
                           "the roles come from the attention scores."),)
    else:
        edges = (paragraph(
            f"Each kept edge S -> R.input patched alone with S's output from a donor sequence that agrees with the "
            f"clean one on one variable (same position and first state; `probes.edge_content`): the explained "
            f"fraction is 1 - (KL after the hold-X patch) / (KL after a random patch), 1 when X accounts for all the "
            f"edge carries. An edge carries the first variable (simplest first) reaching {content.cut}. "
            f"{content.n_sequences} sequences patched, donors from {content.pool}; tried: "
            f"{', '.join(content.variables)}."),
            table(edge_rows(content), header=("edge", "carries", "kind", "explained on the logits [95% CI]",
                                              "explained on R's attention", "coverage", "random patch (nats)")))
    target = probes.probe_target("state", batch, lag=PROBE_LAG)
    found = probes.probe_layers(model, batch, target, cache=cache, method=PROBE_METHOD, n_bootstrap=PROBE_BOOTSTRAP,
                                seed=seed)
    best = found.best
    probe = paragraph(
        f"A linear probe for the state at lag {PROBE_LAG} (x_(t-{PROBE_LAG})) at every place on the residual "
        f"stream, fitted and scored on disjoint sequences of the probe batch (`probes.probe_layers`, {best.method} on "
        f"the one-hot labels, argmax); "
        f"control: the same probe on control labels ({_CONTROL_TEXT.get(best.control_kind, best.control_kind)}); "
        f"selectivity = accuracy - control, 95% intervals from {PROBE_BOOTSTRAP} resamples of the "
        f"held-out sequences. Most selective: {best.site} ({best.selectivity:+.3f}).")
    sites = table(probe_rows(found), header=("site", "accuracy [95% CI]", "control [95% CI]",
                                             "selectivity [95% CI]", "chance"))
    return (*edges, probe, sites)
