"""Probing a trained cell: `probes.classify_mechanism` on its model, read into the row's `ProbeColumns`.

The one module of `sweep` that imports `probes`; it is imported only where a cell is probed, so a sweep that
does not probe (and the sweep's specs, tables and executors) never loads them.
"""

import math
from typing import Any, Optional

from markov_interp.models import HookedModel
from markov_interp.probes import MechanismReport, classify_mechanism
from markov_interp.sweep.results import ProbeColumns, finite
from markov_interp.runs import RunConfig

__all__ = ["probe_columns", "probe"]


def probe_columns(report: MechanismReport) -> ProbeColumns:
    """A cell's mechanism and key probe scores from its `classify_mechanism` report.

    Args:
        report: the report.

    Returns:
        The decision and its evidence ratios, the best previous-token / induction heads' scores above chance,
        the circuit heads and their ablations, the causal evidence (g_1, the kernel-swap in-context
        fraction, the circuit's faithfulness), the kernel readout (p_hat, q_hat for binary chains); NaN
        scores as None.
    """
    def best(name: str) -> Optional[float]:
        values = [v for v in report.attention.excess(name).flatten().tolist() if math.isfinite(v)]
        return max(values) if values else None

    implied = report.readout.implied
    binary = tuple(implied.shape) == (2, 2)
    return ProbeColumns(
        mechanism=report.mechanism,
        order=report.order,
        confident=report.confident,
        state_ratio=finite(report.state_ratio),
        context_ratio=finite(report.context_ratio),
        bigram_gain=finite(report.bigram_gain),
        icl_score=finite(report.behaviour.icl_score),
        previous_token_excess=best("previous_token"),
        induction_excess=best("induction"),
        previous_token_head=report.previous_token_head,
        induction_head=report.induction_head,
        previous_token_ablation=finite(report.previous_token_ablation),
        induction_ablation=finite(report.induction_ablation),
        circuit_confirmed=report.circuit_confirmed,
        readout_max_abs_error=finite(report.readout.max_abs_error),
        readout_weighted_kl=finite(report.readout.weighted_kl),
        p_hat=finite(implied[0, 1]) if binary else None,
        q_hat=finite(implied[1, 0]) if binary else None,
        gain_1=finite(report.gains.get(1)),
        in_context_fraction=finite(report.in_context_fraction),
        faithfulness=finite(report.circuit.faithfulness),
    )


def probe(model: HookedModel, config: RunConfig) -> tuple[ProbeColumns, dict[str, Any]]:
    """Mechanism and key probe scores of a trained model, and the full `classify_mechanism` report as a dict.

    Args:
        model: the cell's trained model.
        config: its run config (the source it was trained on).

    Returns:
        (the row's probe columns, the report's `to_dict()`: what results/<cell_id>.probe.json holds).
    """
    report = classify_mechanism(model, config.source.build(), seed=0)
    return probe_columns(report), report.to_dict()
