"""The reduction experiment's tables (`experiments.reduction`), read from hand-made per-run rows."""

from markov_interp.experiments import reduction


def test_the_gap_table_takes_max_and_median_over_runs_not_over_per_w0_medians():
    gaps = {-0.9: [(0.01, 0.02, 0.03), (0.02, 0.02, 0.03), (0.50, 0.02, 0.03)],  # one far run at w0 = -0.9
            -0.5: [(0.04, 0.01, 0.01), (0.04, 0.01, 0.01), (0.04, 0.01, 0.01)]}
    runs = tuple({"w0": w, "seed": k, "escape": None, "flow_gap": list(g)}
                 for w, rows in gaps.items() for k, g in enumerate(rows))
    budget = reduction.FULL.replace(w0=(-0.9, -0.5), seeds=3)
    arm = reduction._tally("reduced", list(runs), budget)
    assert arm.flow_gap == ((0.02, 0.02, 0.03), (0.04, 0.01, 0.01))  # per w0: the median over seeds
    result = reduction.ReductionResult(budget, (arm,), -0.6, 0)
    (row,) = result.gap_table().rows
    # the max over the 6 runs is the far run's 0.5, where the max of the per-w0 medians would say 0.04; the medians
    # over all 6 runs: e (0.01, 0.02, 0.04, 0.04, 0.04, 0.5) -> 0.04, w -> 0.015, b -> 0.02
    assert row == ("reduced", "6", "0.5", "0.02", "0.03", "0.04", "0.015", "0.02")
