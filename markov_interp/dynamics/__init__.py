"""Training dynamics as statistics: excess curves, crossings at several fractions, interval censoring, survival
over seeds, intervals and comparisons. The one home of "escape" and "stuck".

A model trained on a Markov chain often sits on a plateau (the stationary law for a fixed chain, the in-context
unigram estimator for random kernels; Makkuva et al., arXiv 2402.04161; Edelman et al. 2024) before it learns
the transitions. Every evaluation is *paired* (`training.evaluate_paired`): the model's loss beside the true
law's and the plateau's on the same tokens. From those rows:

- **excess curve** (`ExcessCurve`, `curve_from_metrics`): at each evaluation the fraction of the plateau's
  excess that is left, (model - true) / (plateau - true): 1 on the plateau, 0 at the true law.
- **crossing** (`crossing`, `crossings`): when that fraction falls below a line f, for each f in `FRACTIONS`
  (0.9, 0.75, 0.5, 0.25). The crossing is the first evaluation that starts `dwell` consecutive evaluations
  below f. Evaluations are discrete, so it is known only to lie in (previous evaluation, that evaluation]: a
  `StepInterval`. A run that has no such evaluation is **right-censored** after the last evaluation whose
  verdict is known (the `dwell`-th from the end): a crossing among the last `dwell - 1` evaluations cannot be
  confirmed, so the rule gets no easier near the end of the budget, and a longer budget never moves a crossing
  a shorter one saw. **Escape** is the crossing at `ESCAPE_FRACTION` (½); **stuck** means censored there.
- **survival** (`survival`): P(crossing after step t) over a condition's seeds, the nonparametric maximum
  likelihood estimate for interval-censored data (Turnbull 1976). When every run shares the evaluation grid
  (the usual case) it is the Kaplan-Meier estimate on that grid, with Greenwood's variance and a log-log band
  (the `scipy.stats.ecdf` one); medians are reported as the grid intervals they are (`Quantile`), with an
  interval only from `MIN_RUNS` runs up and an upper bound "not reached" where the band never falls to ½.
- **median excess curve** (`median_curve`) with a band across seeds, and `condition` (all of it per condition).
- **modes** (`modes`): whether a condition's seeds cross at one typical time or split into two groups (the
  Engelman-Hartigan test for two clusters on the log crossing steps, against normal samples of the same size).
- **comparisons** (`compare`): two conditions at every fraction (difference and ratio of median crossings) and
  by the area between their median curves, with percentile-bootstrap intervals over seeds (explicit seed);
  the log-rank test where it is valid (a common evaluation grid).

Nothing here trains or plots: the figures are `markov_interp.experiments.escape_survival_figure` (and
`crossing_survival_figure`, `excess_curves_figure`) and `markov_interp.report.run_escape_figure`.
"""

from markov_interp.dynamics._compare import (AreaComparison, Comparison, FractionComparison, compare,
                                             compare_crossings, logrank_test)
from markov_interp.dynamics._modes import MODES_ALPHA, MIN_GROUP, Modes, cluster_statistic, modes
from markov_interp.dynamics._runs import (DWELL, ESCAPE_FRACTION, FRACTIONS, MIN_GAP, MIN_RUNS, ExcessCurve,
                                          RunDynamics, StepInterval, crossing, crossings, crossings_from_json,
                                          crossings_to_json, curve_from_metrics, escape_from_metrics, from_metrics,
                                          recorded_escape, run_dynamics)
from markov_interp.dynamics._survival import (ConditionDynamics, MedianCurve, Quantile, Survival, condition,
                                              median_curve, survival, turnbull, wilson_interval)

__all__ = [
    "FRACTIONS", "ESCAPE_FRACTION", "DWELL", "MIN_RUNS", "MIN_GAP",
    "StepInterval", "ExcessCurve", "curve_from_metrics",
    "crossing", "crossings", "RunDynamics", "run_dynamics", "from_metrics", "escape_from_metrics",
    "crossings_to_json", "crossings_from_json", "recorded_escape",
    "Quantile", "Survival", "survival", "turnbull", "wilson_interval",
    "MedianCurve", "median_curve", "ConditionDynamics", "condition",
    "Modes", "modes", "cluster_statistic", "MODES_ALPHA", "MIN_GROUP",
    "logrank_test", "FractionComparison", "AreaComparison", "Comparison", "compare", "compare_crossings",
]
