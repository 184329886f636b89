"""The kernel-swap fraction's denominator guard in the task-diversity N* (`diversity.swap_transition`): a pool size
whose gap L(pool Bayes) - L(in-context Bayes) on fresh kernels is at or below the floor set by the N = ∞ control
has no fraction for N*. Synthetic records whose fractions follow from their losses, as the probe's do."""

import dataclasses
import math

import numpy as np
import pytest

import handbuilt as hb
from markov_interp.sources import RandomMarkov
from markov_interp.experiments import diversity

ICB = 0.9  # the in-context Bayes loss on the fresh batch (the same for every pool size, as in the experiment)


def _record(size, seed, *, gap=None, fraction=None, excess=None):
    """One finished run at pool size `size` (None: fresh kernels) whose fresh-kernel losses give `fraction` over a
    denominator `gap` (pool sizes), or a model `excess` nats above in-context Bayes (the control, or a pool model
    that infers as well as it)."""
    out = {"in_context_bayes": ICB}
    if size is not None:
        out["pool_bayes"] = ICB + gap
        out["model"] = ICB + excess if fraction is None else out["pool_bayes"] - fraction * gap
        fraction = (out["pool_bayes"] - out["model"]) / gap
    else:
        out["model"] = ICB + excess
    m = {"in": {"model": 1.0, "in_context_bayes": 1.0} | ({} if size is None else {"pool_bayes": 0.9}), "out": out,
         "swap_fraction": fraction, "swap_se": 0.01, "kl": {a: 0.1 for a in diversity.ALGORITHMS},
         "phase": "bigram inference" if size is None or size >= 16 else "bigram retrieval"}
    return diversity.DiversityRecord(depth=2, pool_size=size, seed=seed, status="ok", measure=m)


def _budget(sizes):
    return diversity.TINY.replace(pool_sizes=tuple(sizes), depths=(2,))


def _verdict(records, trans):
    rows = diversity.claims(diversity.cell_summaries(records), trans)
    return {paper: verdict for paper, _, _, verdict in rows}["Raventós et al. 2023"]


def test_a_vanishing_denominator_leaves_n_star_at_the_crossing():
    """Retrieval at N = 1, 4, inference from N = 16, and at N = 256 models as close to in-context Bayes as the
    control (0.01 nats) over a gap of 0.002 nats: fraction -4. Before the guard N* read "> 256, not reached"."""
    control = [_record(None, s, excess=0.01) for s in range(4)]
    shape = {1: (0.7, 0.0), 4: (0.2, 0.0), 16: (0.1, 1.0), 64: (0.05, 0.8)}
    records = control + [_record(n, s, gap=gap, fraction=f + 0.01 * (s - 1.5)) for n, (gap, f) in shape.items()
                         for s in range(4)]
    records += [_record(256, s, gap=0.002, excess=0.01 + 0.001 * s) for s in range(4)]
    trans = diversity.transitions(records, _budget([1, 4, 16, 64, 256]))["2"]["swap_fraction"]
    assert np.mean([r.measure["swap_fraction"] for r in records if r.pool_size == 256]) < -3  # the raw fraction
    assert trans["relation"] == "=" and trans["estimate"] == pytest.approx(8.0)  # halfway from log2 4 to log2 16
    assert trans["interval"][0] <= 8.0 <= trans["interval"][1] and math.isfinite(trans["interval"][1])
    assert "undefined at N = 256: denominator 0.002 nats <= floor 0.02" in trans["describe"]
    assert _verdict(records, diversity.transitions(records, _budget([1, 4, 16, 64, 256]))) == "holds"
    # the raw fraction stays in the cell table
    cell = next(c for c in diversity.cell_summaries(records) if c["pool_size"] == 256)
    assert cell["swap_fraction"]["mean"] < -3 and "-4." in diversity.cells_table([cell]).rows[0][6]


def test_healthy_denominators_change_nothing():
    rng = np.random.default_rng(0)
    sizes = [1, 2, 4, 16, 64]
    for _ in range(20):
        fractions = [list(rng.uniform(-0.2, 1.2, size=3)) for _ in sizes]
        records = [_record(None, s, excess=0.05) for s in range(3)]
        records += [_record(n, s, gap=0.3, fraction=fractions[i][s]) for i, n in enumerate(sizes) for s in range(3)]
        trans = diversity.transitions(records, _budget(sizes))["2"]["swap_fraction"]
        before = diversity.transition_interval(sizes, [[r.measure["swap_fraction"] for r in records
                                                        if r.pool_size == n] for n in sizes])
        assert trans == dataclasses.asdict(before) | {"describe": before.describe()}


def test_every_cell_undefined_says_so_instead_of_an_n_star():
    control = [_record(None, s, excess=0.1) for s in range(3)]  # a control far from Bayes: floor 0.2 nats
    records = control + [_record(n, s, gap=gap, fraction=f) for n, gap, f in ((1, 0.15, 0.0), (4, 0.1, 0.9),
                                                                              (16, 0.05, 1.0)) for s in range(3)]
    trans = diversity.transitions(records, _budget([1, 4, 16]))["2"]["swap_fraction"]
    assert trans["relation"] == diversity.UNDEFINED and math.isnan(trans["estimate"]) and trans["interval"] is None
    assert trans["describe"] == ("N* undefined; undefined at every N (1, 4, 16): denominator 0.15, 0.1, 0.05 nats "
                                 "<= floor 0.2 (2 x the N = ∞ models' excess over in-context Bayes, 0.1)")
    assert _verdict(records, {"2": {"swap_fraction": trans}}).startswith("not tested at this budget")
    table = diversity.transitions_table({"2": {"swap_fraction": trans, "inference_phase": trans}})
    assert "N* undefined" in table.markdown()


def test_the_floor_is_where_a_model_as_good_as_the_control_reads_the_level():
    for excess, level in ((0.011, 0.5), (0.03, 0.25), (0.2, 0.9)):
        floor = diversity.swap_floor(excess, level=level)
        assert 1 - excess / floor == pytest.approx(level)  # f of a model `excess` above in-context Bayes
    assert diversity.swap_floor(None) == 0.0 and diversity.swap_floor(-0.01) == 0.0
    for level in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="level"):
            diversity.swap_floor(0.01, level=level)


def test_without_a_control_only_non_positive_denominators_are_left_out():
    records = [_record(n, s, gap=gap, fraction=f) for n, gap, f in ((1, 0.5, 0.0), (4, 0.3, 1.0)) for s in range(2)]
    records += [_record(16, s, gap=-0.001, excess=0.01) for s in range(2)]  # pool Bayes beats in-context Bayes
    trans = diversity.transitions(records, _budget([1, 4, 16]))["2"]["swap_fraction"]
    assert (trans["estimate"], trans["relation"]) == (pytest.approx(2.0), "=")
    assert trans["describe"].endswith("undefined at N = 16: denominator -0.001 nats <= 0 (no N = ∞ run for a floor)")
    healthy = [r for r in records if r.pool_size != 16]
    note = diversity.transitions(healthy, _budget([1, 4]))["2"]["swap_fraction"]["describe"]
    assert note.endswith("(no N = ∞ run: only a non-positive denominator would leave a size out)")


def test_the_guard_reads_the_denominator_the_probe_divides_by():
    """measure_model's "out" losses are on the batch `probes.swap_kernels` feeds: the fraction is their ratio."""
    budget = diversity.TINY.replace(pool_sizes=(4,), seq_len=64, probe_sequences=32)
    inside, outside = diversity._batches(budget)  # the experiment's own probe batches
    pool = RandomMarkov(budget.vocab, alpha=budget.alpha, pool_size=4)
    for model in (hb.induction_circuit(3, n_ctx=64), hb.counting_circuit(3, n_ctx=64)):
        m = diversity.measure_model(model, inside[4], outside, pool)
        ratio = (m["out"]["pool_bayes"] - m["out"]["model"]) / diversity.swap_denominator(m)
        assert m["swap_fraction"] == pytest.approx(ratio, rel=1e-9, abs=1e-12)
