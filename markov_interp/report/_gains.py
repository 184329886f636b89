"""The graded gains as the report shows them: g_k +- SE on an in-context task, or why not on a fixed chain (one home,
read by the first screen, the mechanism section and the circuit section)."""

from markov_interp import probes


def _in_context_task(mech: probes.MechanismReport) -> bool:
    """Whether the task has an in-context component (random kernels, or a pool of them): only there do the
    graded gains measure something about the task."""
    return mech.gains_meaningful  # the probes' rule (one home)


def gains_text(mech: probes.MechanismReport, *, short: bool = False) -> str:
    """The graded gains g_k +- SE, or, on a fixed chain, why they are not shown (`short`: in one clause)."""
    if _in_context_task(mech):
        return mech.gains.describe()
    swap = mech.kernel_swap
    fraction = f"in-context fraction {swap.in_context_fraction:.2f} +- {swap.se:.2f}"
    if short:
        return f"not shown: a fixed chain has no in-context component (the kernel swap decides instead: {fraction})"
    return ("not shown: every sequence of this source has the same kernel, so the task has no in-context "
            "component. A model that holds the kernel in its weights does better than the in-context laws from the "
            "first position, so g_k would grade the kernel, not in-context learning (g_1 above 1), and where the "
            "step between two laws is narrow (uniform to in-context unigram, for a nearly uniform pi) its ratio is "
            "noise. Whether the model predicts from its weights or from the context is the kernel swap's question: "
            f"{fraction} on sequences of another kernel (0: from the weights, 1: from the context).")
