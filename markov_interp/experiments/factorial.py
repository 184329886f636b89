"""Finding 1 as a factorial: does clamping layer 0 to a previous-token head slow the escape from the
in-context unigram plateau, and in which cells?

Cells: layer-1 heads {1, 2} (layer 0 one head; d_head fixed, so a second head adds width only in layer 1) ×
data {"dirichlet": a Dirichlet(1) kernel per sequence, "zero-diagonal": no self-transitions, each row
Dirichlet(1) over the other states, so self-transition counts carry no information and a same-token head in
layer 1 cannot help}. In every cell the same seeds train under each arm:

- "free": nothing changed (the reference every arm is compared with);
- "clamped": layer 0's attention pattern clamped to a perfect previous-token head for the whole run;
- "mixed": clamped to half previous-token, half uniform causal attention (`clamps.pattern_value("mixed")`);
- "head-start": layer 0's Q/K *initialised* as a previous-token head and trained freely
  (`ModelConfig.init_attention="previous_token"`);
- "position-code": the head start's positions and embeddings with standard Q/K (the head start's control).

A clamp stops gradient to layer 0's Q/K, so "clamped" and "head-start" ask different questions: the first
whether a fixed perfect previous-token head helps, the second whether starting with one does.

Each arm's runs are summarised by `dynamics` (crossings of 0.9 / 0.75 / 0.5 / 0.25 of the plateau excess,
interval-censored, survival, median excess curves) and compared with the cell's free arm at every line and by
the area between median curves (bootstrap over seeds); layer 0's previous-token score and layer 1's induction
and same-token scores are measured at the end and at `score_checkpoints` log-spaced checkpoint steps (read back
after training, under the arm's clamp: `_arms.circuit_scores_over_training`), and the circuit of the
first `discovered` seeds of every arm is found by path patching at the end (`probes.discover_circuit`, under
the clamp, so edges into a clamped layer's queries and keys carry nothing). The arm loop, scoring, tables and
figures are the shared ones of `experiments._arms` (`run_arms`); this module only lays out the cells, the overview
and the per-cell tables of scores over training and discovered circuits.

Registered as "factorial": `python -m markov_interp.experiments --only factorial [--quick]`.
"""

import collections
import dataclasses
import itertools
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from markov_interp import dynamics
from markov_interp.sources import SourceConfig
from markov_interp.experiments import Budget, Experiment, Section, Summary, Table, _shared, register
from markov_interp.experiments._arms import (Arm, ExperimentResult, arm_json, dynamics_figures,
                                             experiment_from_json, experiment_sections, run_arms)
from markov_interp.models import preset
from markov_interp.models.hooks import act_name
from markov_interp.training import RunConfig, TrainConfig

__all__ = ["FactorialBudget", "QUICK", "STANDARD", "FULL", "RECIPES", "ARMS", "DATA", "INITS", "FIRST_STATES",
           "NORMS", "Recipe", "recipes", "cells_of", "cell_base", "cell_arms", "FactorialResult", "over_training_table",
           "run", "read", "EXPERIMENT"]

ARMS = ("free", "clamped", "mixed", "head-start", "position-code")
DATA = ("dirichlet", "zero-diagonal")
INITS = ("standard", "plain")
FIRST_STATES = ("stationary", "uniform")
NORMS = ("LN", "none")
_PATTERN0 = act_name("pattern", 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FactorialBudget(Budget):
    """Seeds per arm and cell, steps (constant lr: a shorter run is a prefix of a longer one), the cells
    (`heads`: layer-1 head counts; `data`) and the `arms` ("free" first)."""

    seeds: int = 16
    steps: int = 600
    heads: tuple[int, ...] = (1, 2)
    data: tuple[str, ...] = DATA
    arms: tuple[str, ...] = ARMS
    d_head: int = 8  # fixed across cells: a second layer-1 head adds width
    eval_every: int = 10
    eval_batches: int = 4
    device: str = "cpu"
    score_checkpoints: int = 6  # log-spaced checkpoints (the last step among them) scored after training; 0: none
    discovered: int = 3  # seeds per arm whose circuit is discovered at the end (seconds each); 0: none
    # the recipe factors, crossed with the cells; the first value of each is the package's recipe
    inits: tuple[str, ...] = ("standard",)  # ModelConfig.init: "standard" (output projections / sqrt(2 L)), "plain"
    first_states: tuple[str, ...] = ("stationary",)  # the first state's law: each kernel's stationary law or uniform
    norms: tuple[str, ...] = ("LN",)  # pre-LayerNorm ("LN") or none ("none")

    ZERO_OK = ("score_checkpoints", "discovered")

    def check(self) -> None:
        for field, value, known in (("data", self.data, DATA), ("arms", self.arms, ARMS)):
            unknown = [v for v in value if v not in known]
            if unknown:
                raise ValueError(f"{field}: unknown {unknown}; expected some of {list(known)}")
        if self.arms[0] != "free" or len(set(self.arms)) != len(self.arms):
            raise ValueError(f"arms must start with 'free' (the reference) and not repeat, got {list(self.arms)}")
        if len(set(self.heads)) != len(self.heads):
            raise ValueError(f"heads must not repeat, got {list(self.heads)}")
        for field, value, known in (("inits", self.inits, INITS), ("first_states", self.first_states, FIRST_STATES),
                                    ("norms", self.norms, NORMS)):
            if [v for v in value if v not in known] or len(set(value)) != len(value):
                raise ValueError(f"{field} must be distinct values of {list(known)}, got {list(value)}")
        if self.discovered > self.seeds:
            raise ValueError(f"discovered ({self.discovered}) must be at most seeds ({self.seeds})")


FULL = FactorialBudget(name="full")
# CPU-sized: free runs leave the plateau in 16/16 seeds by step 600 (docs/reproduction/factorial-dirichlet-h1/)
STANDARD = FULL.replace(name="standard", cuts="none: the full budget (free runs escape in every seed)")
QUICK = FactorialBudget(name="quick", seeds=5, steps=150, arms=("free", "clamped"), eval_batches=2,
                        cuts="5 seeds (the fewest that give an interval), 150 steps (free runs cross 0.5 at about "
                             "160-290 steps, so the 0.5 line is mostly censored: read 0.9 and 0.75), arms free and "
                             "clamped only (no mixed clamp, head start or its control), 2 evaluation batches")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One combination of the recipe factors: the init, the first state's law and the normalisation."""

    init: str = "standard"
    first_state: str = "stationary"
    norm: str = "LN"

    @property
    def suffix(self) -> str:
        """"" for the package's recipe, else "-plain-uniform-noLN" naming what differs (cell and folder names)."""
        parts = [self.init if self.init != "standard" else "", self.first_state if self.first_state != "stationary"
                 else "", "noLN" if self.norm == "none" else ""]
        return "".join(f"-{p}" for p in parts if p)


def recipes(budget: FactorialBudget) -> list[Recipe]:
    """Every combination of the budget's recipe factors, the package's recipe first."""
    return [Recipe(i, f, n) for i, f, n in itertools.product(budget.inits, budget.first_states, budget.norms)]

RECIPES = FactorialBudget(
    name="recipes", steps=1500, data=("dirichlet",), arms=("free", "clamped"), inits=INITS,
    first_states=FIRST_STATES, norms=NORMS, discovered=0,
    cuts="Dirichlet kernels only (no zero diagonal), arms free and clamped, the recipe factors crossed (init: the "
         "package's or plain N(0, 0.02); the first state's law: stationary or uniform; LayerNorm on or off), 16 "
         "seeds, 1500 steps, no circuits discovered: does Finding 1 hold across recipes?")


def cell_base(budget: FactorialBudget, data: str, heads: int, recipe: Recipe = Recipe()) -> RunConfig:
    """The free run of one cell (seed 0): two attention-only layers, 3 states, sequences of 32, layer 0 one head
    and layer 1 `heads` heads of width `budget.d_head`; Adam at a constant 1e-2, batch 64; `recipe` sets the
    init, the first state's law and the normalisation (default: the package's)."""
    return RunConfig(
        source=SourceConfig(kind="random", vocab=3, alpha=1.0, zero_diagonal=data == "zero-diagonal",
                            initial=recipe.first_state),
        model=preset("attn-only-2layer", n_ctx=32, d_vocab=3, n_heads=(1, heads), d_head=budget.d_head,
                     init=recipe.init, normalization=None if recipe.norm == "none" else recipe.norm),
        train=TrainConfig(steps=budget.steps, seq_len=32, batch_size=64, lr=1e-2, schedule="constant",
                          eval_every=budget.eval_every, eval_batches=budget.eval_batches, log_every=budget.eval_every,
                          n_checkpoints=budget.score_checkpoints, device=budget.device))


def cell_arms(budget: FactorialBudget) -> list[Arm]:
    """The arms `budget.arms` names, "free" first."""
    every = {"free": Arm("free"),
             "clamped": Arm("clamped", ({"clamp": _PATTERN0, "value": "previous_token"},)),
             "mixed": Arm("mixed", ({"clamp": _PATTERN0, "value": "mixed"},)),
             "head-start": Arm("head-start", model=(("init_attention", "previous_token"),)),
             "position-code": Arm("position-code", model=(("init_attention", "position_code"),))}
    return [every[name] for name in budget.arms]


def _cell_name(data: str, heads: int, recipe: Recipe = Recipe()) -> str:
    return f"{data}-h{heads}{recipe.suffix}"


def _fmt_interval(interval: Any, digits: int = 2) -> str:
    lo, hi = interval
    return "—" if not (math.isfinite(lo) and math.isfinite(hi)) else f"[{lo:.{digits}f}, {hi:.{digits}f}]"


def _overview_rows(cell: ExperimentResult) -> list[tuple[str, ...]]:
    """Per arm of a cell: escaped k/n, the median crossing of 0.75 and 0.5, the ratio to free at 0.75 and 0.5
    [bootstrap CI], and layer 1's induction and same-token scores at the end [bootstrap CI of the mean]."""
    rows = []
    for a in cell.arms:
        s = a.condition.survival
        ratios = []
        for f in (0.75, 0.5):
            c = a.against_free.fractions.get(f) if a.against_free else None
            ratios.append("—" if c is None else c.ratio_text())
        scores = a.at_end
        rows.append((cell.name, a.arm.name, f"{a.summary.n - a.summary.n_censored}/{a.summary.n}",
                     s[0.75].median().describe(), s[0.5].median().describe(), *ratios,
                     f"{scores.previous_token_mean:.2f}" if scores else "—",
                     f"{scores.induction_mean:.2f} {_fmt_interval(scores.induction_interval)}" if scores else "—",
                     f"{scores.same_token_mean:.2f} {_fmt_interval(scores.same_token_interval)}" if scores else "—"))
    return rows


_OVERVIEW = ("One row per cell (data, layer-1 heads) and arm. Crossing = the first evaluation starting "
             f"{dynamics.DWELL} in a row below the line (a fraction of the in-context unigram plateau's excess "
             "over the true law), a grid interval; medians by Kaplan-Meier with a 95% log-log band (none from "
             f"fewer than {dynamics.MIN_RUNS} seeds; '?' = not reached within the budget); ratios = arm / free "
             "median crossing with a 95% percentile bootstrap over seeds. Scores are measured at the last step on "
             "64 fresh sequences, the best head of the layer (layer 0 under the arm's clamp); chance levels are "
             "in the per-cell sections.")


_SCORES = (("previous_token", "L0 previous-token"), ("induction", "L1 induction"), ("same_token", "L1 same-token"))


def over_training_table(cell: ExperimentResult) -> Table:
    """Per arm and score: the mean over seeds at every scored step [bootstrap 95% CI]."""
    steps = [x.step for x in cell.arms[0].over_training]
    rows = [(a.arm.name, label, *(f"{getattr(x, key + '_mean'):.2f} {_fmt_interval(getattr(x, key + '_interval'))}"
                                  for x in a.over_training))
            for a in cell.arms for key, label in _SCORES]
    return Table(("arm", "score", *(f"step {s}" for s in steps)), rows)


def _circuits_table(cell: ExperimentResult) -> Table:
    """Per arm: the seeds read, faithfulness (mean [bootstrap CI]), the kept edges and the heads on the circuit
    with how many of those seeds keep each."""
    rows = []
    for a in cell.arms:
        n = len(a.circuits)
        edges = collections.Counter(name for _, g in a.circuits for name in g.kept_names)
        heads = collections.Counter(h for _, g in a.circuits for h in g.kept_heads())
        faithful = [g.faithfulness for _, g in a.circuits]
        rows.append((a.arm.name, ", ".join(str(seed) for seed, _ in a.circuits),
                     f"{_shared.mean(faithful):.2f} {_fmt_interval(_shared.mean_interval(faithful))}",
                     ", ".join(f"{e} {k}/{n}" for e, k in edges.most_common()) or "none",
                     ", ".join(f"{h} {k}/{n}" for h, k in heads.most_common()) or "none"))
    return Table(("arm", "seeds", "faithfulness [95% CI]", "kept edges (seeds keeping it)", "heads on the circuit"),
                 rows)


def _cell_sections(cell: ExperimentResult) -> list[Section]:
    """The cell's scores over training (table and figure) and its discovered circuits, where measured."""
    out = []
    if cell.arms[0].over_training:
        a = cell.arms[0].over_training[-1]
        out.append(Section(f"{cell.name}: attention scores over training", _OVER_TRAINING.format(
            prev=a.previous_token_chance, ind=a.induction_chance, same=a.same_token_chance), over_training_table(cell),
            figures=(f"scores-{cell.name}.png",)))
    if cell.arms[0].circuits:
        out.append(Section(f"{cell.name}: circuits discovered at the end", _CIRCUITS, _circuits_table(cell)))
    return out


_OVER_TRAINING = ("The best head's score of each layer (layer 0 previous-token, layer 1 induction and same-token), "
                  "mean over seeds [95% bootstrap CI], at the log-spaced checkpoint steps, each read back after "
                  "training and probed under the arm's clamp on the same 64 fresh sequences per seed at every step "
                  "(`experiments._arms.circuit_scores_at`; the last step is the end-of-run score). Uniform attention "
                  "gives {prev:.2f} / {ind:.2f} / {same:.2f}.")
_CIRCUITS = ("`probes.discover_circuit` at the last step on 32 fresh sequences (resample corruption), under the "
             "arm's clamp: every edge's path-patching effect, the kept edges by its stated rule and their "
             "faithfulness (1: the kept edges alone give the clean loss). k/n = of the n seeds read, k keep it.")


def _interval_side(interval: Any, null: float) -> "str | None":
    """"slows" when a 95% interval lies wholly above `null` (its lower end known and > null), "speeds" when wholly
    below (its upper end known and < null), None when it holds `null`, has an unknown end on that side, or is None."""
    if interval is None:
        return None
    low, high = interval
    if low is not None and low > null:
        return "slows"
    if high is not None and high < null:
        return "speeds"
    return None


def clamp_effect(comparison: Any) -> str:
    """What the clamp does to the descent, read from the comparison with free where both of its measures decide it.

    The two measures are the ratio of the median crossings of the 0.5 line (clamped / free, 95% bootstrap interval;
    no change = 1) and the area between the median excess curves (clamped - free, 95% bootstrap interval; no
    change = 0). "slows" when both intervals lie above no change, "speeds" when both lie below, "mixed" when one
    lies above and the other below, "no clear effect" otherwise (either interval holds no change, or a measure is
    missing): one measure alone never names an effect.

    Args:
        comparison: a `dynamics` comparison of the clamped arm against free (`fractions`, `area`), or None.

    Returns:
        "slows", "speeds", "mixed", "no clear effect", or "—" for no comparison.
    """
    if comparison is None:
        return "—"
    area = _interval_side(comparison.area.interval if comparison.area is not None else None, 0.0)
    half = comparison.fractions.get(0.5)
    ratio = _interval_side(half.ratio_interval if half is not None else None, 1.0)
    if area is not None and area == ratio:
        return area
    return "mixed" if area is not None and ratio is not None else "no clear effect"


def _recipe_rows(budget: FactorialBudget, cells: tuple) -> list[tuple[str, ...]]:
    """Per cell with a clamped arm: heads, the recipe, escaped counts, ratios at 0.75 / 0.5, log-rank p at 0.5,
    the area between median curves and `clamp_effect`."""
    rows = []
    for (data, heads, recipe), cell in zip(cells_of(budget), cells):
        free = cell.arms[0]
        for arm in cell.arms[1:]:
            c = arm.against_free
            half = c.fractions.get(0.5) if c else None
            area = c.area if c else None
            area_text = "—" if area is None else f"{area.area:+.0f} " + (
                "[no interval]" if area.interval is None else
                "[" + ", ".join("?" if x is None else f"{x:+.0f}" for x in area.interval) + "]")
            rows.append((data, str(heads), recipe.init, recipe.first_state, recipe.norm, arm.arm.name,
                         f"{free.summary.n - free.summary.n_censored}/{free.summary.n}",
                         f"{arm.summary.n - arm.summary.n_censored}/{arm.summary.n}",
                         c.fractions[0.75].ratio_text() if c and 0.75 in c.fractions else "—",
                         half.ratio_text() if half else "—",
                         "—" if half is None or half.p_value is None else f"{half.p_value:.2g}", area_text,
                         clamp_effect(c)))
    return rows


_RECIPES_TEXT = ("Each cell's clamped arm against its free arm, per recipe (the same seeds in both). Escaped = seeds "
                 "whose excess fell below half the plateau's within the budget; ratios = clamped / free median "
                 "crossing [95% bootstrap]; area = the integral over steps of the clamped median excess-fraction "
                 "curve minus the free one [95% bootstrap] (> 0: clamped slower). Effect: 'slows' / 'speeds' where "
                 "the area's and the 0.5 ratio's intervals both exclude no change on the same side ('mixed' on "
                 "opposite sides; one alone is 'no clear effect').")


def recipe_verdicts(rows: list[tuple[str, ...]]) -> str:
    """One line per layer-1 head count: how many recipes the clamp slows, speeds or leaves unclear."""
    lines = []
    for heads in sorted({r[1] for r in rows}, key=int):
        effects = collections.Counter(r[-1] for r in rows if r[1] == heads)
        lines.append(f"- {heads} layer-1 head(s): " + ", ".join(f"{k} in {n}/{sum(effects.values())} recipes"
                                                             for k, n in effects.most_common()))
    return "\n".join(lines)


def split_arms(budget: FactorialBudget, cells: tuple) -> tuple[int, list[tuple[str, ...]]]:
    """Every arm whose seeds cross the 0.5 line in two groups (`dynamics.modes`: p < `dynamics.MODES_ALPHA`),
    with every seed's crossing; and how many arms were tested.

    Returns:
        (arms tested, rows): per split arm its data, layer-1 heads, recipe, arm, the seeds' steps (a censored seed
        as "> step"), the two groups, the test's p-value and the arm's median crossing (a median of two groups).
    """
    rows, tested = [], 0
    for (data, heads, recipe), cell in zip(cells_of(budget), cells):
        for a in cell.arms:
            crossings = [r.escape for r in a.runs]
            if len(crossings) < 2 * dynamics.MIN_GROUP:
                continue
            tested += 1
            found = dynamics.modes(crossings)
            if not found.bimodal:
                continue
            steps = ", ".join(str(c.by) if c.escaped else f">{c.after}"
                              for c in sorted(crossings, key=lambda c: c.step))
            rows.append((data, str(heads), recipe.init, recipe.first_state, recipe.norm, a.arm.name, steps,
                         found.groups(), f"{found.p_value:.2g}",
                         str(a.summary.median().estimate)))
    return tested, rows


_SPLIT_TEXT = ("Arms whose seeds cross the 0.5 line in two groups: the Engelman-Hartigan test for two clusters on "
               "the log crossing steps (`dynamics.modes`: the best cut's share of the sum of squares against normal "
               "samples of the same size; at least 2 seeds a group; a censored seed at its censoring step), p < "
               f"{dynamics.MODES_ALPHA:g}. Each seed's crossing is the evaluation that confirmed it (the crossing "
               "lies in the grid interval ending there; '>' censored). Where an arm splits, its median crossing (and "
               "a ratio of medians) falls between the groups: read the groups.")


@dataclasses.dataclass(frozen=True)
class FactorialResult(Summary):
    """The cells (one `_arms.ExperimentResult` each, named DATA-hHEADS) at one budget."""

    budget: FactorialBudget
    cells: tuple[ExperimentResult, ...]

    @property
    def failed(self) -> int:
        return sum(a.failed for c in self.cells for a in c.arms)

    def overview(self) -> Table:
        """The cells × arms table of `_overview_rows` (also written as overview.csv)."""
        return Table(("cell", "arm", "escaped (0.5)", "median 0.75 [95% CI]", "median 0.5 [95% CI]",
                      "x free at 0.75 [95% CI]", "x free at 0.5 [95% CI]", "L0 prev-token",
                      "L1 induction [95% CI]", "L1 same-token [95% CI]"),
                     [row for c in self.cells for row in _overview_rows(c)])

    def sections(self) -> list[Section]:
        intro = Section(text=f"{self.budget.seeds} seeds per arm and cell, {self.budget.steps} steps, evaluations "
                        f"every {self.budget.eval_every} steps ({self.budget.eval_batches} batches of 64); "
                        f"d_head {self.budget.d_head}; arms {', '.join(self.budget.arms)}.")
        out = [intro]
        if len(recipes(self.budget)) > 1:
            rows = _recipe_rows(self.budget, self.cells)
            out.append(Section("Across recipes", _RECIPES_TEXT, self.recipes_table(),
                               after=recipe_verdicts(rows)))
        tested, split = split_arms(self.budget, self.cells)
        if split:
            out.append(Section("Arms whose seeds split", _SPLIT_TEXT, Table(
                ("data", "layer-1 heads", "init", "first state", "norm", "arm", "0.5-line crossings (per seed)",
                 "groups (steps)", "p (two modes)", "median 0.5"), split),
                after=f"{len(split)} of {tested} arms tested split at p < {dynamics.MODES_ALPHA:g} (about "
                      f"{dynamics.MODES_ALPHA * tested:.1f} expected by chance alone were no arm split)."))
        return out + [Section("Overview", _OVERVIEW, self.overview())] + [
            s for c in self.cells for s in experiment_sections(c) + _cell_sections(c)]

    def recipes_table(self) -> Table:
        """The clamp's effect per recipe (`_recipe_rows`; also written as recipes.csv)."""
        return Table(("data", "layer-1 heads", "init", "first state", "norm", "arm", "free escaped (0.5)",
                      "arm escaped (0.5)", "x free at 0.75 [95% CI]", "x free at 0.5 [95% CI]", "log-rank p (0.5)",
                      "area vs free [95% CI]", "effect"), _recipe_rows(self.budget, self.cells))

    def figures(self) -> dict[str, Any]:
        from markov_interp.experiments import _figures_factorial as figures

        drawn: dict[str, Any] = {}
        for c in self.cells:
            drawn.update(dynamics_figures(c))
            if any(a.over_training for a in c.arms):
                drawn[f"scores-{c.name}.png"] = figures.scores_over_training_figure(
                    {a.arm.name: a.over_training for a in c.arms},
                    title=f"{c.name}: attention scores over training ({c.budget.seeds} seeds)")
        return drawn

    def tables(self) -> dict[str, Table]:
        found = {"overview.csv": self.overview()}
        if len(recipes(self.budget)) > 1:
            found["recipes.csv"] = self.recipes_table()
        return found

    def to_json(self) -> dict:
        """Every seed's crossings, excess curve, final loss and scores, per arm and cell, with the comparisons."""
        return {c.name: {"steps": c.steps, "seconds": round(c.seconds, 1),
                         "arms": {a.arm.name: arm_json(a) for a in c.arms}} for c in self.cells}


def cells_of(budget: FactorialBudget) -> list[tuple[str, int, Recipe]]:
    """(data, layer-1 heads, recipe) of every cell, in the order they train."""
    return list(itertools.product(budget.data, budget.heads, recipes(budget)))


def read(budget: FactorialBudget, result: Mapping) -> FactorialResult:
    """results.json's "result" read back as the typed result, every statistic recomputed from the seeds' curves
    (`_arms.experiment_from_json`; `experiments.load`). The discovered circuits stay in the file."""
    return FactorialResult(budget, tuple(experiment_from_json(name, cell, budget) for name, cell in result.items()))


def run(budget: FactorialBudget, out: Path, *, progress: bool = False) -> FactorialResult:
    """Train every cell's arms into `out` (run folders out/runs/DATA-hHEADS/ARM/seedN; a rerun loads them).

    Args:
        budget: seeds, steps, cells, arms and device.
        out: the experiment's folder.
        progress: progress bars.

    Returns:
        The typed result (`FactorialResult`)."""
    arms = cell_arms(budget)
    cells = [run_arms(_cell_name(data, heads, recipe), cell_base(budget, data, heads, recipe), arms, budget, out,
                      progress=progress, task=_cell_name(data, heads, recipe),
                      over_training=budget.score_checkpoints > 0, discovered=budget.discovered)
             for data, heads, recipe in cells_of(budget)]
    return FactorialResult(budget, tuple(cells))


EXPERIMENT = register(Experiment(name="factorial", title="Finding 1 as a factorial: clamp x layer-1 heads x data",
                                 budgets={"quick": QUICK, "standard": STANDARD, "full": FULL,
                                          "recipes": RECIPES}, run=run, read=read, precision="fp32"))
