"""The experiments, the paper's reproduction among them: each one module of this package that registers itself.

`python -m markov_interp.experiments [--only NAME[,NAME]] [--quick]`, `markov-interp experiment NAME` and
`markov-interp reproduce [--extras]` find every registered experiment here, run it into OUT/NAME (run folders
under it: a rerun reuses what is finished) and write its summary through one path (`_base`): OUT/NAME/summary.md (a header with the provenance: the command, machine, device, torch and
Python versions, precision and wall time; the budget's cuts; then the experiment's sections), results.json
({"title", "provenance", "budget", "result"}), its figures (PNG) and CSV tables, every file written atomically.

Registered today:
- `paper`: the paper's headline findings reproduced as escape-time distributions (seven sweeps; `markov-interp
  reproduce` runs it with its sweep folder, backend and workers).
- `interventions`: freezes and clamps during training (three experiments).
- `phases`: the order x depth x heads phase diagram on order-k random kernels.
- `diversity`: task diversity, finite kernel pools against fresh kernels, and the transition N*.
- `factorial`: the previous-token clamp × layer-1 heads {1, 2} × data {Dirichlet, zero diagonal}, with a mixed
  clamp and a head start (docs/findings-dynamics.md).
- `reduction`: the canonical (e, w, b) reduction kept exact by training on the family, and which freedom
  (positions, embedding row 0, attention, MLP, output bias, Adam) moves the separatrix (docs/landscape.md).
- `hidden`: belief states of hidden Markov sources (Mess3, RRXOR; Shai et al. 2024): belief R^2 per layer and
  across the layers, the causal test, loss against the Bayes-optimal predictor (docs/findings-hidden.md).

Writing a new experiment: one module `markov_interp/experiments/NAME.py` (no edit anywhere else; modules whose
name starts with "_" are not experiments) that provides

1. **Its budget**: a frozen, keyword-only dataclass deriving from `Budget` (fields `name`, `seeds`, `steps`,
   `device` = "auto", `cuts`), adding its own fields, and the budgets `QUICK` and `FULL`:

       @dataclasses.dataclass(frozen=True, kw_only=True)
       class FooBudget(Budget):
           heads: tuple[int, ...] = (1, 2)
           def check(self) -> None:  # rules across fields; each field is already checked by its annotation
               ...

       FULL = FooBudget(name="full", seeds=16, steps=2000)
       QUICK = FooBudget(name="quick", seeds=4, steps=60, cuts="4 seeds, 60 steps: a smoke test")

   `Budget` validates every field by its annotation (`config.check_fields`; int: >= 1 unless named in `ZERO_OK`;
   float: finite; str; tuple[X, ...]: non-empty, each an X; `Optional[X]`: None or an X; a field declared with
   `config.bounds` gets those limits instead), requires seeds >= 2, and refuses
   a budget not named "full" whose `cuts` is empty. Runs train on `budget.device`.
2. **Its typed result**: a frozen dataclass deriving from `Summary` with `failed` (an int: failed runs),
   `sections() -> list[Section]` (each a title, text, a `Table` of text cells, text after it, figure file
   names), `to_json() -> dict` (every seed's numbers), and optionally `figures() -> {file name: matplotlib
   Figure}` and `tables() -> {file name: Table}` (CSV files). No dicts read back by key: nested results are
   dataclasses too.
3. **Its run function**: `run(budget: FooBudget, out: Path, *, progress: bool = False) -> FooResult`, which
   trains with `training.train_many` (or `sweep.run`) into folders under `out` and returns the result.
4. **Its registration**, at module level:

       EXPERIMENT = register(Experiment(name="foo", title="Foo: what it asks", budgets={"quick": QUICK,
                                        "full": FULL}, run=run, precision="fp32"))

5. Optionally **its read-back**: `read(budget, result) -> FooResult`, the typed result rebuilt from results.json's
   "result" with every statistic recomputed from the per-run rows (`Experiment(..., read=read)`); `load(path)`
   then gives it without training, and the repository's docs are rendered from it (`python -m tools.findings`).
6. Optionally **its figure functions**, in `markov_interp/experiments/_figures_foo.py` (matplotlib `Figure`s from
   the result's numbers), imported inside `figures()` so that listing the experiments imports no matplotlib. A
   figure others call too is named in `_FIGURES` here and is then `markov_interp.experiments.<name>`, loaded on
   first use (today: `escape_survival_figure`, `crossing_survival_figure`, `excess_curves_figure`,
   `excess_curves_panels_figure`, `scores_over_training_figure`, `phase_diagram_figure`, `diversity_figure`,
   `separatrix_figure`, `paths_on_landscape_figure`, `r2_by_layer_figure`, `loss_by_position_figure`).

Then `python -m markov_interp.experiments --only foo --quick`, `markov-interp experiment foo --quick`,
`--n-seeds N`, `--steps N`, `--device D` and `--set KEY=VALUE` (any budget field; JSON or text, lists as
a,b,c) work for it, and `reproduce --extras` runs it at its full budget into OUT/foo.
"""

import argparse
import importlib
import pkgutil
import sys
import typing
from pathlib import Path
from typing import Any, Optional

from markov_interp._io import read_json
from markov_interp.config import parse_setting, parse_value
from markov_interp.experiments._base import (RESULTS_FILE, SMOKE, SUMMARY_FILE, Budget, Experiment, Finished,
                                             Provenance, Section, Summary, Table, describe_device, render_markdown,
                                             run, smoke_note, write_summary)

# The experiments' figures, each in the module `_figures_<experiment>` (the dynamics figures, shared by several
# experiments and the reproduction, in `_figures_dynamics`), loaded on first use: importing the experiments
# imports no matplotlib.
_FIGURES = {
    **dict.fromkeys(("escape_survival_figure", "crossing_survival_figure", "excess_curves_figure",
                     "excess_curves_panels_figure"), "_figures_dynamics"),
    **dict.fromkeys(("scores_over_training_figure", "SCORES_OVER_TRAINING"), "_figures_factorial"),
    **dict.fromkeys(("phase_diagram_figure", "ORDER_COLOURS"), "_figures_phases"),
    "diversity_figure": "_figures_diversity",
    **dict.fromkeys(("separatrix_figure", "paths_on_landscape_figure"), "_figures_reduction"),
    **dict.fromkeys(("r2_by_layer_figure", "loss_by_position_figure"), "_figures_hidden"),
}

__all__ = ["Budget", "Table", "Section", "Summary", "Provenance", "Experiment", "Finished", "register", "get",
           "registered", "describe_registered", "budget_for", "run", "run_many", "write_summary", "render_markdown",
           "describe_device", "add_arguments", "load", "smoke_note", "main", "SMOKE", "SUMMARY_FILE", "RESULTS_FILE",
           *_FIGURES]

_REGISTRY: dict[str, Experiment] = {}


def __getattr__(name: str) -> Any:
    """An experiment's figure (`_FIGURES`), imported on first use."""
    module = _FIGURES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def register(experiment: Experiment) -> Experiment:
    """Add `experiment` to the registry (at its module's import) and return it.

    Args:
        experiment: the experiment; its name must be new (the same module imported again replaces its own).

    Returns:
        `experiment`.
    """
    known = _REGISTRY.get(experiment.name)
    if known is not None and getattr(known.run, "__module__", None) != getattr(experiment.run, "__module__", None):
        raise ValueError(f"experiment {experiment.name!r} is registered twice ({known.run.__module__} and "
                         f"{experiment.run.__module__})")
    _REGISTRY[experiment.name] = experiment
    return experiment


def _discover() -> None:
    """Import every experiment module of this package (each registers itself at import)."""
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")


def registered() -> dict[str, Experiment]:
    """Every registered experiment by name, in name order (importing the package's experiment modules)."""
    _discover()
    return dict(sorted(_REGISTRY.items()))


def get(name: str) -> Experiment:
    """The registered experiment `name`; ValueError listing the registered names otherwise."""
    experiments = registered()
    if name not in experiments:
        raise ValueError(f"unknown experiment {name!r}; the experiments are {list(experiments)}")
    return experiments[name]


def load(path: "str | Path", name: Optional[str] = None) -> Finished:
    """An experiment's committed results.json read back as its typed result, with no training: every statistic
    recomputed by the current code from the per-run rows the file keeps (`Experiment.read`), so tables made from
    it are what this code gives on those rows.

    Args:
        path: a results.json or the folder holding one.
        name: the experiment (default: the one whose title the file names).

    Returns:
        `Finished` with the typed result, the file's budget and provenance, and the file (`files`).
        FileNotFoundError without the file; ValueError for a file that is not an experiment's results.json, or an
        experiment that cannot be read back.
    """
    file = Path(path) / RESULTS_FILE if Path(path).is_dir() else Path(path)
    try:
        data = read_json(file, "results file")  # a regular file, bounded, depth-limited
        title, budget_data, provenance, result = (data["title"], data["budget"], data["provenance"],
                                                  data["result"])
    except (KeyError, TypeError):
        raise ValueError(f"{file}: not an experiment's results.json (it needs title, provenance, budget and "
                         "result)") from None
    if name is None:
        by_title = {e.title: e for e in registered().values()}
        if title not in by_title:
            raise ValueError(f"{file}: no registered experiment is titled {title!r}; name it (the experiments are "
                             f"{list(registered())})")
        experiment = by_title[title]
    else:
        experiment = get(name)
    if experiment.read is None:
        raise ValueError(f"experiment {experiment.name!r} cannot read back its results.json (no `read`)")
    budget = type(experiment.budgets["full"]).from_dict(budget_data, where=f"{file}: budget")
    return Finished(experiment.name, budget, experiment.read(budget, result), Provenance(**provenance), (file,))


# ---------------------------------------------------------------------------------------- the command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every experiment takes (`python -m markov_interp.experiments` and `markov-interp experiment`)."""
    parser.add_argument("--out", default="runs/experiments", metavar="DIR",
                        help="each experiment goes to DIR/NAME: run folders, summary.md, results.json, figures")
    parser.add_argument("--quick", action="store_true", help="the quick budget (its cuts say what it leaves out)")
    parser.add_argument("--budget", default=None, help="a named budget (default full; --quick: quick)")
    parser.add_argument("--n-seeds", type=int, default=None, metavar="N",
                        help="override the budget's number of seeds per condition")
    # `--seeds` lists seeds (`train --seeds 0-7`) wherever it exists; here it is refused with the count's name
    parser.add_argument("--seeds", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=None, help="override the budget's steps")
    parser.add_argument("--device", default="auto", metavar="DEVICE",
                        help="where the runs train: auto (default: cuda when available, else cpu), cpu, cuda, cuda:1")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override any budget field, e.g. --set seeds=4 (values as JSON or text; a list as "
                        "a,b,c); repeatable")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--remeasure", action="store_true",
                        help="no training: measure and classify again the runs of DIR/NAME/results.json from the "
                        "weights kept beside it, at the file's budget, and rewrite its summary")


def budget_for(experiment: Experiment, args: Optional[argparse.Namespace] = None) -> Budget:
    """The budget the options of `add_arguments` name (--quick / --budget, then --n-seeds, --steps, --device,
    --set), validated; the full budget without options."""
    if args is None:
        return experiment.budget("full")
    if args.quick and args.budget not in (None, "quick"):
        raise ValueError(f"--quick contradicts --budget {args.budget}")
    name = "quick" if args.quick else (args.budget or "full")
    if args.seeds is not None:
        raise ValueError(f"--seeds lists seeds (as in `train --seeds 0-7`); an experiment takes how many seeds per "
                         f"condition: --n-seeds N (got --seeds {args.seeds})")
    changes = {k: getattr(args, a) for k, a in (("seeds", "n_seeds"), ("steps", "steps"), ("device", "device"))
               if getattr(args, a) is not None}
    base = experiment.budget(name)
    for item in args.set:
        field, value = parse_setting(item)
        changes[field] = _parse_value(type(base), field, value)
    return experiment.budget(name, **changes)


def _parse_value(cls: type, field: str, value: Any) -> Any:
    """A --set value (`config.parse_value`'s) for `field` of the budget class `cls`: for a tuple field, text "a,b"
    is the list [a, b] and one value is a list of one."""
    kind = typing.get_type_hints(cls).get(field)
    if typing.get_origin(kind) is tuple:  # a list field: "a,b" or a JSON list
        if isinstance(value, str):
            value = [parse_value(part.strip()) for part in value.split(",")]
        value = tuple(value) if isinstance(value, list) else (value,)  # one JSON scalar ("2") is a list of one
    return value


def run_many(names: list[str], out_dir: "str | Path", *, command: str, args: Optional[argparse.Namespace] = None,
             progress: bool = False) -> list[Finished]:
    """Run the named experiments, each into out_dir/NAME, printing a line each on stderr.

    Args:
        names: registered experiment names.
        out_dir: the parent folder.
        command: the command line named in each summary's header.
        args: the options of `add_arguments` (None: full budgets); every budget is built and validated before
            anything trains.
        progress: progress bars.

    Returns:
        Each experiment's `Finished`."""
    plan = [(get(name), name) for name in names]
    remeasure = bool(args is not None and getattr(args, "remeasure", False))
    budgets = [load(Path(out_dir) / name, name).budget if remeasure else budget_for(experiment, args)
               for experiment, name in plan]
    done = []
    for (experiment, name), budget in zip(plan, budgets):
        finished = run(experiment, Path(out_dir) / name, budget=budget, command=command, progress=progress,
                       remeasure=remeasure)
        print(f"{name} ({budget.name}): {finished.provenance.seconds / 60:.1f} min, {finished.failed} failed -> "
              f"{Path(out_dir) / name / SUMMARY_FILE}", file=sys.stderr)
        done.append(finished)
    return done


def describe_registered() -> list[str]:
    """One line per registered experiment: its name, title and budgets (what --list prints)."""
    return [f"{name}: {e.title} (budgets: {', '.join(e.budgets)})" for name, e in registered().items()]


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m markov_interp.experiments`: run the registered experiments (all, or --only NAME[,NAME]).

    Returns:
        0, or 1 when a run failed (a bad option raises ValueError)."""
    parser = argparse.ArgumentParser(prog="python -m markov_interp.experiments", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=None, metavar="NAME[,NAME]", help="run only these experiments")
    parser.add_argument("--list", action="store_true", help="list the registered experiments and their budgets")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(describe_registered()))
        return 0
    names = args.only.split(",") if args.only else list(registered())
    line = " ".join(argv if argv is not None else sys.argv[1:])
    finished = run_many(names, args.out, args=args, command=f"python -m markov_interp.experiments {line}".strip(),
                        progress=not args.no_progress and sys.stderr.isatty())
    return 1 if any(f.failed for f in finished) else 0
