"""Rendered blocks of Finding 1 across recipes (docs/findings-dynamics.md, the README): the clamp factorial at the
`recipes` budget, every statistic recomputed from its results.json."""

import dataclasses
from pathlib import Path
from typing import Any

from tools.findings._engine import block, holds
from tools.findings._sources import experiment, provenance_text

CLAMP_RECIPES = "docs/reproduction/clamp-recipes/results.json"
DEFAULT = ("standard", "stationary", "LN")  # the package's recipe: the one behind the original Finding 1
# `factorial.clamp_effect`'s verdicts as the verb phrase of "the clamp ..."
EFFECT_TEXT = {"slows": "slows the descent", "speeds": "speeds the descent", "no clear effect": "has no clear effect",
               "mixed": "has mixed effects"}


@dataclasses.dataclass(frozen=True)
class RecipeEffect:
    """The clamped arm against free in one cell: its layer-1 heads, recipe, comparison and `clamp_effect`."""

    heads: int
    recipe: Any  # factorial.Recipe
    comparison: Any  # dynamics comparison of clamped against free (fractions, area)
    effect: str  # "slows" / "speeds" / "no clear effect" / "mixed"

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.recipe.init, self.recipe.first_state, self.recipe.norm)

    def at_half(self) -> str:
        return self.comparison.fractions[0.5].ratio_text()


def factorial_cells(path: Path) -> list[tuple[str, int, Any, Any]]:
    """(data, layer-1 heads, recipe, cell) of every cell of a factorial's results.json, in its budget's order."""
    from markov_interp.experiments import factorial

    done = experiment(path)
    return [(*key, cell) for key, cell in zip(factorial.cells_of(done.budget), done.result.cells)]


def clamp_comparison(cell: Any) -> tuple[Any, str]:
    """A factorial cell's clamped arm against its free arm (the dynamics comparison) and `factorial.clamp_effect`
    of it ("slows", "speeds", "no clear effect", "mixed")."""
    from markov_interp.experiments import factorial

    clamped = next(a for a in cell.arms if a.arm.name == "clamped")
    return clamped.against_free, factorial.clamp_effect(clamped.against_free)


def recipe_effects(path: Path) -> list[RecipeEffect]:
    """Every cell's clamped arm of the recipes factorial, in the budget's cell order."""
    return [RecipeEffect(heads, recipe, *clamp_comparison(cell)) for _, heads, recipe, cell in factorial_cells(path)]


def count_effects(effects: list[RecipeEffect]) -> str:
    """E.g. "slows the descent in 1/8 recipes, speeds it in 5/8, no clear effect in 2/8"."""
    first = EFFECT_TEXT
    later = {"slows": "slows it", "speeds": "speeds it", "no clear effect": "no clear effect", "mixed": "mixed"}
    present = [w for w in first if any(e.effect == w for e in effects)]
    n = {w: f"{sum(e.effect == w for e in effects)}/{len(effects)}" for w in present}
    return f"{first[present[0]]} in {n[present[0]]} recipes" + "".join(f", {later[w]} in {n[w]}"
                                                                          for w in present[1:])


def _range(effects: list[RecipeEffect]) -> str:
    ratios = sorted(e.comparison.fractions[0.5].ratio for e in effects)
    return f"{ratios[0]:.2g}x-{ratios[-1]:.2g}x"


def heads_sentence(effects: list[RecipeEffect], heads: int) -> str:
    """What the clamp does with `heads` layer-1 heads across the recipes, in one clause."""
    mine = [e for e in effects if e.heads == heads]
    default = next(e for e in mine if e.key == DEFAULT)
    no_ln = [e for e in mine if e.recipe.norm == "none"]
    text = (f"with {heads} layer-1 head{'s' if heads > 1 else ''} the clamp {count_effects(mine)}; in the "
            f"package's recipe it {EFFECT_TEXT[default.effect]} ({default.at_half()} free's time to the 0.5 line, "
            f"area {default.comparison.area.text()})")
    if no_ln and len({e.effect for e in no_ln}) == 1 and no_ln[0].effect in ("slows", "speeds"):
        text += f"; without LayerNorm it {no_ln[0].effect} it in all {len(no_ln)} ({_range(no_ln)})"
    return text


def check_one_head_slows_only_by_default(effects: list[RecipeEffect]) -> None:
    """`holds` for the sentence both renderings make: with one layer-1 head the clamp slows the descent in the
    package's recipe and in no other."""
    one = [e for e in effects if e.heads == 1]
    holds(next(e for e in one if e.key == DEFAULT).effect == "slows"
          and all(e.effect != "slows" for e in one if e.key != DEFAULT),
          "with one layer-1 head the clamp slows the descent only in the package's recipe")


@block("clamp-recipes-provenance", CLAMP_RECIPES)
def clamp_recipes_provenance(path: Path) -> str:
    """Who made the recipes factorial, on what, in how long."""
    done = experiment(path)
    b = done.budget
    return (f"- {b.seeds} seeds per arm and cell, {b.steps} steps, layer-1 heads {list(b.heads)}, recipes: init "
            f"{list(b.inits)} x first state {list(b.first_states)} x norm {list(b.norms)}; "
            f"{provenance_text(done.provenance)}.")


@block("clamp-recipes-table", CLAMP_RECIPES)
def clamp_recipes_table(path: Path) -> str:
    """One row per cell: heads, recipe, the clamped/free ratio at 0.5, the area between curves, the effect."""
    rows = ["| layer-1 heads | init | first state | norm | x free at 0.5 [95% CI] | area vs free [95% CI] | effect |",
            "|---|---|---|---|---|---|---|"]
    for e in recipe_effects(path):
        rows.append(f"| {e.heads} | {e.recipe.init} | {e.recipe.first_state} | {e.recipe.norm} | {e.at_half()} | "
                    f"{e.comparison.area.text()} | {e.effect} |")
    return "\n".join(rows)


@block("clamp-recipes-findings", CLAMP_RECIPES)
def clamp_recipes_findings(path: Path) -> str:
    """What holds across recipes, per head count present in the file."""
    effects = recipe_effects(path)
    check_one_head_slows_only_by_default(effects)
    sentences = [heads_sentence(effects, heads) for heads in sorted({e.heads for e in effects})]
    return "\n".join(f"- {s[0].upper()}{s[1:]}." for s in sentences)


@block("clamp-recipes-modes", CLAMP_RECIPES)
def clamp_recipes_modes(path: Path) -> str:
    """The arms whose seeds split into two groups at the 0.5 line, every seed's crossing shown
    (`factorial.split_arms`), and how many arms were tested."""
    from markov_interp import dynamics
    from markov_interp.experiments import factorial

    done = experiment(path)
    tested, rows = factorial.split_arms(done.budget, done.result.cells)
    lines = ["| layer-1 heads | init | first state | norm | arm | 0.5-line crossings (per seed) | groups (steps) | "
             "p (two modes) | median 0.5 |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {' | '.join(row[1:])} |" for row in rows]
    return "\n".join(lines + ["", f"{len(rows)} of {tested} arms split at p < {dynamics.MODES_ALPHA:g} (about "
                                  f"{dynamics.MODES_ALPHA * tested:.1f} expected by chance alone were no arm split)."])
