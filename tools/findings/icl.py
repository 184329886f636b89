"""Rendered blocks of the in-context experiments (docs/findings-icl.md): the phase diagram and task diversity,
each table the experiment's own (`phases.cells_table`, `diversity.cells_table`, ...) made from its results.json
read back."""

from pathlib import Path

from tools.findings._engine import block
from tools.findings._sources import experiment, provenance_text

PHASES_QUICK = "docs/reproduction/icl/phases-quick/results.json"
DIVERSITY_QUICK = "docs/reproduction/icl/diversity-quick/results.json"
PHASES_STANDARD = "docs/reproduction/icl/phases-standard/results.json"


@block("phases-quick-cells", PHASES_QUICK)
def phases_quick_cells(path: Path) -> str:
    """Every cell of the quick phase diagram (smoke)."""
    from markov_interp.experiments import phases

    return phases.cells_table(experiment(path).result.cells).markdown()


@block("diversity-quick-cells", DIVERSITY_QUICK)
def diversity_quick_cells(path: Path) -> str:
    """Every cell of the quick diversity sweep and its N* (smoke)."""
    from markov_interp.experiments import diversity

    result = experiment(path).result
    return (diversity.cells_table(result.cells).markdown() + "\n\n"
            + diversity.transitions_table(result.transitions).markdown())


def _phases_provenance(path: Path) -> str:
    """Who made a phase diagram, on what, from which runs."""
    done = experiment(path)
    b = done.budget
    return (f"- {b.seeds} seeds per cell, {b.steps} steps, {b.vocab} states, orders {list(b.orders)}, probes of "
            f"{b.probe_sequences} sequences, the classifier on {b.classified} seeds per cell; "
            f"{provenance_text(done.provenance)} "
            + ("(no training: this call measured and classified again the final weights kept beside results.json; "
               "the runs trained before, in the background, by the same budget)." if "--remeasure" in
               done.provenance.command else "(the runs trained before, in the background, by the same budget; this "
               "call measured and summarised)."))


@block("phases-standard-provenance", PHASES_STANDARD)
def phases_standard_provenance(path: Path) -> str:
    """Who made the standard phase diagram, on what, from which runs."""
    return _phases_provenance(path)


@block("phases-standard-claims", PHASES_STANDARD)
def phases_standard_claims(path: Path) -> str:
    """Each cited claim beside the cells that bear on it, at the standard budget (the rows it can test)."""
    from markov_interp.experiments import phases

    claims = [c for c in experiment(path).result.claims if c["verdict"] != phases.NOT_TESTED]
    return phases.claims_table(claims).markdown()


@block("phases-standard-cells", PHASES_STANDARD)
def phases_standard_cells(path: Path) -> str:
    """Every cell of the standard phase diagram."""
    from markov_interp.experiments import phases

    return phases.cells_table(experiment(path).result.cells).markdown()


@block("phases-standard-formation", PHASES_STANDARD)
def phases_standard_formation(path: Path) -> str:
    """The circuit over training of one seed per cell (the experiment's own section table), and how often the
    first K-edge to stay entered before, while or after the loss crossed half the plateau's excess."""
    from collections import Counter

    result = experiment(path).result
    section = next(s for s in result.sections() if s.id == "formation")
    when = Counter(r.k_edge_timing for r in result.formation)
    tally = (f"Of {len(result.formation)} runs, {len(result.formation) - when['—']} kept a K-edge to the end. It "
             f"entered before the loss crossed half the plateau's excess in {when['before']}, while it crossed in "
             f"{when['while']}, after in {when['after']}; {when['no 0.5 crossing']} never crossed within the budget.")
    return section.table.markdown() + "\n\n" + tally


DIVERSITY_STANDARD = "docs/reproduction/icl/diversity-standard/results.json"


@block("diversity-standard-provenance", DIVERSITY_STANDARD)
def diversity_standard_provenance(path: Path) -> str:
    """Who made the standard diversity sweep, on what, from which runs."""
    done = experiment(path)
    b = done.budget
    sizes = ", ".join(str(n) for n in b.pool_sizes)
    return (f"- {b.seeds} seeds per cell, {b.steps} steps, depths {list(b.depths)}, pool sizes N = {sizes} and fresh "
            f"kernels (N = ∞), probes of {b.probe_sequences} sequences; {provenance_text(done.provenance)} (the "
            "command names the budget's cuts; the runs trained before, in the background, by the same budget).")


@block("diversity-standard-claims", DIVERSITY_STANDARD)
def diversity_standard_claims(path: Path) -> str:
    """Raventós et al. / Park et al.'s claims beside the standard sweep's cells and N*."""
    from markov_interp.experiments import diversity

    result = experiment(path).result
    return diversity.claims_table(diversity.claims(result.cells, result.transitions)).markdown()


@block("diversity-standard-cells", DIVERSITY_STANDARD)
def diversity_standard_cells(path: Path) -> str:
    """Every cell of the standard diversity sweep and its N* with the bootstrap interval."""
    from markov_interp.experiments import diversity

    result = experiment(path).result
    return (diversity.transitions_table(result.transitions).markdown() + "\n\n"
            + diversity.cells_table(result.cells).markdown())


PHASES_STANDARD_BEFORE = "docs/reproduction/icl/phases-standard/labels-before.json"


def _deep_other(runs: list[dict], *, still: str = "", lead: str = "Of") -> str:
    """How many of the deep seeds at their law (`phases.deep_at_law`) are labelled `other`, with their table
    (`phases.unnamed_at_law`)."""
    from markov_interp.experiments import phases

    unnamed = phases.unnamed_at_law(runs)
    return (f"{lead} the {len(phases.deep_at_law(runs))} seeds with two or more layers whose g_k reaches 0.75, "
            f"{sum(int(row[1]) for row in unnamed.rows)} are {still}labelled `other`"
            + (":\n\n" + unnamed.markdown() if unnamed.rows else "."))


@block("phases-standard-label-changes", PHASES_STANDARD_BEFORE, PHASES_STANDARD)
def phases_standard_label_changes(before: Path, after: Path) -> str:
    """How the standard diagram's labels moved when its kept weights were measured again by the classifier with
    roles by edge content (`phases.label_changes`), and the deep seeds at their law still labelled `other`."""
    import json

    from markov_interp.experiments import phases

    old, new = json.loads(before.read_text())["runs"], json.loads(after.read_text())["result"]["runs"]
    changes = phases.label_changes(old, new)
    changed = sum(int(row[2]) for row in changes.rows if row[3] != "unchanged")
    first = {phases.run_key(r): r for r in old}
    same = sum((first.get(phases.run_key(r)) or {}).get("gains") == r.get("gains")
               and first[phases.run_key(r)].get("model_loss") == r.get("model_loss") for r in new)
    return (f"Of {sum(int(row[2]) for row in changes.rows)} classified seeds, {changed} changed label. The numbers "
            f"held: {same} of {len(new)} seeds' gain fractions and model loss equal the first measurement's "
            "exactly.\n\n"
            + changes.markdown() + "\n\n" + _deep_other(new, still="still "))


PHASES_STANDARD3 = "docs/reproduction/icl/phases-standard3/results.json"


@block("phases-standard3-provenance", PHASES_STANDARD3)
def phases_standard3_provenance(path: Path) -> str:
    """Who made the three-state phase diagram, on what, from which runs."""
    return _phases_provenance(path)


@block("phases-standard3-cells", PHASES_STANDARD3)
def phases_standard3_cells(path: Path) -> str:
    """Every cell of the three-state phase diagram, and its deep seeds at their law that are still `other`."""
    from markov_interp.experiments import phases

    result = experiment(path).result
    return phases.cells_table(result.cells).markdown() + "\n\n" + _deep_other(result.to_json()["runs"])


@block("phases-alphabets-claims", PHASES_STANDARD, PHASES_STANDARD3)
def phases_alphabets_claims(two: Path, three: Path) -> str:
    """The claims about induction heads read on two and three states side by side (`phases.alphabets`): the rows
    each diagram can test, the binary row above the three-state row of the same claim and cell."""
    from markov_interp.experiments import phases

    _, rows = phases.alphabets([experiment(two).result, experiment(three).result])
    induction = [r for r in rows if r["verdict"] != phases.NOT_TESTED and "induction" in r["claim"]]
    induction.sort(key=lambda r: (r["paper"], r["claim"], r["family"], r["shape"], r["order"], r.get("vocab", 2)))
    return phases.claims_table(induction).markdown()


PHASES_CONVERGED = "docs/reproduction/icl/phases-converged/results.json"


@block("phases-converged-provenance", PHASES_CONVERGED)
def phases_converged_provenance(path: Path) -> str:
    """Who made the converged chunk, on what, from which runs."""
    return _phases_provenance(path)


@block("phases-converged-changes", PHASES_STANDARD, PHASES_CONVERGED)
def phases_converged_changes(standard: Path, converged: Path) -> str:
    """The same seeds at 3000 steps (the standard diagram) and at 10,000 (the converged chunk): their cells, how
    far g_k moved, and how their labels moved (`phases.label_changes`)."""
    from statistics import mean

    from markov_interp.experiments import phases

    longer = experiment(converged).result
    runs = longer.to_json()["runs"]
    first = {phases.run_key(r): r for r in experiment(standard).result.to_json()["runs"]}
    moved = []
    for order in sorted({r["order"] for r in runs}):
        pairs = [(first[phases.run_key(r)]["gains"][str(order)], r["gains"][str(order)]) for r in runs
                 if r["order"] == order and phases.run_key(r) in first]
        up = sum(b - a > 0.05 for a, b in pairs)
        moved.append(f"order {order}: g_{order} mean {mean(a for a, _ in pairs):.2f} at 3000 steps, "
                     f"{mean(b for _, b in pairs):.2f} at 10,000 ({up} of {len(pairs)} seeds up by more than 0.05)")
    return (phases.cells_table(longer.cells).markdown() + "\n\nThe same seeds, 3000 -> 10,000 steps: "
            + "; ".join(moved) + ".\n\n" + phases.label_changes(list(first.values()), runs).markdown()
            + "\n\n" + _deep_other(runs, still="still ", lead="At 10,000 steps, of"))
