"""The one budget / summary path of the experiments, the paper's reproduction among them
(`markov_interp.experiments._base`), and the experiment registry: budgets validated by their annotations, the summary files and their header, and a toy
experiment registered and run through the command line (no training: fast)."""

import argparse
import dataclasses
import importlib
import json
import pkgutil
import sys
from pathlib import Path
from typing import Optional

import pytest
import torch

from markov_interp import experiments
from markov_interp.experiments import Budget, Experiment, Section, Summary, Table


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToyBudget(Budget):
    widths: tuple[int, ...] = (1, 2)
    lr: float = 0.1
    warmup: int = 0
    label: Optional[str] = None

    ZERO_OK = ("warmup",)

    def check(self) -> None:
        if self.warmup >= self.steps:
            raise ValueError(f"warmup ({self.warmup}) must be below steps ({self.steps})")


@pytest.mark.parametrize("change, match", [
    ({"seeds": 1}, "seeds must be at least 2"), ({"seeds": True}, "seeds must be an integer"),
    ({"steps": 0}, "steps must be an integer >= 1"), ({"warmup": -1}, "warmup must be an integer >= 0"),
    ({"warmup": 10}, r"warmup \(10\) must be below steps"), ({"lr": float("nan")}, "lr must be a finite number"),
    ({"widths": ()}, "widths must be a non-empty list"), ({"widths": (1, "2")}, r"widths\[1\] must be an integer"),
    ({"widths": (1, 0)}, r"widths\[1\] must be an integer >= 1"),
    ({"name": ""}, "name must be a non-empty string"), ({"cuts": 3}, "cuts must be a string"),
    ({"name": "quick"}, "cuts must say what this budget leaves out"), ({"nope": 1}, "unknown ToyBudget fields"),
])
def test_budget_fields_are_checked_by_their_annotations(change, match):
    full = ToyBudget(name="full", seeds=4, steps=10)
    with pytest.raises(ValueError, match=match):
        full.replace(**change)


def test_budget_stores_lists_as_tuples_and_serialises():
    b = ToyBudget(name="short", seeds=3, steps=10, widths=[4, 8], lr=1, warmup=0, cuts="10 steps")
    assert b.widths == (4, 8) and isinstance(b.lr, float)
    assert b.to_dict() == {"name": "short", "seeds": 3, "steps": 10, "device": "auto", "cuts": "10 steps",
                           "widths": [4, 8], "lr": 1.0, "warmup": 0, "label": None}
    assert ToyBudget.from_dict(b.to_dict()) == b


def test_table_renders_markdown_and_csv_and_refuses_ragged_rows():
    t = Table(("a", "b"), [("1", "x|y"), ("=2", "")])
    assert t.markdown().splitlines() == ["| a | b |", "|---|---|", "| 1 | x\\|y |", "| =2 |  |"]
    assert t.csv() == "a,b\n1,x|y\n=2,\n"
    assert Table(("a",), ()).markdown() == "(no rows)"
    with pytest.raises(ValueError, match="has 1 cells for 2 columns"):
        Table(("a", "b"), [("1",)])


@dataclasses.dataclass(frozen=True)
class ToyResult(Summary):
    budget: ToyBudget
    values: tuple[float, ...]
    broken: int = 0

    @property
    def failed(self) -> int:
        return self.broken

    def sections(self) -> list[Section]:
        table = Table(("seed", "value"), [(str(i), f"{v:.3f}") for i, v in enumerate(self.values)])
        return [Section(text="Toy intro."), Section("Values", table=table, after="Done.", figures=("toy.png",))]

    def figures(self) -> dict:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(2, 2))
        fig.subplots().plot(list(self.values))
        return {"toy.png": fig}

    def tables(self) -> dict:
        return {"values.csv": self.sections()[1].table}

    def to_json(self) -> dict:
        return {"values": list(self.values)}


def _toy_run(budget: ToyBudget, out: Path, *, progress: bool = False) -> ToyResult:
    g = torch.Generator().manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    return ToyResult(budget, tuple(float(x) for x in torch.rand(budget.seeds, generator=g)),
                     broken=int(budget.label == "break"))


TOY = Experiment(name="toy", title="Toy experiment", run=_toy_run, budgets={
    "full": ToyBudget(name="full", seeds=4, steps=10), "quick": ToyBudget(name="quick", seeds=2, steps=5,
                                                                          cuts="2 seeds, 5 steps")})


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setattr(experiments, "_REGISTRY", dict(experiments.registered()))  # the package's, discovered
    experiments.register(TOY)
    return TOY


def test_toy_experiment_runs_from_the_command_line_and_writes_its_summary(toy_registered, tmp_path):
    code = experiments.main(["--only", "toy", "--quick", "--out", str(tmp_path), "--n-seeds", "3",
                             "--set", "widths=4,8", "--set", "lr=0.5", "--set", "label=x"])
    assert code == 0
    out = tmp_path / "toy"
    text = (out / "summary.md").read_text()
    head = text.split("\n\n")
    assert head[0] == "# Toy experiment (quick)"
    assert head[1] == experiments.smoke_note("quick") and "smoke: does not test the claims" in head[1]
    assert head[2].startswith("Made by `python -m markov_interp.experiments --only toy --quick")
    assert f"torch {torch.__version__}" in head[2] and ("device cpu" in head[2] or "device cuda" in head[2])
    assert "precision fp32" in head[2] and "wall time" in head[2] and "CPU cores" in head[2]
    assert head[3] == "Budget: 2 seeds, 5 steps."
    assert head[4] == "Toy intro." and "## Values" in text and "![toy](toy.png)" in text
    data = json.loads((out / "results.json").read_text())
    assert data["budget"] == {**TOY.budgets["quick"].to_dict(), "seeds": 3, "widths": [4, 8], "lr": 0.5,
                              "label": "x"}
    assert len(data["result"]["values"]) == 3 and data["title"] == "Toy experiment"
    assert set(data["provenance"]) == {"command", "machine", "device", "torch", "python", "precision", "seconds"}
    assert (out / "values.csv").read_text().startswith("seed,value\n0,")
    assert (out / "toy.png").stat().st_size > 1000
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # atomic writes leave no temporary files
    # a failed run makes the exit code 1
    assert experiments.main(["--only", "toy", "--out", str(tmp_path), "--set", "label=break"]) == 1


def test_set_gives_a_list_field_one_value_as_a_list_of_one(toy_registered):
    for text, expected in (("8", (8,)), ("4,8", (4, 8)), ("[4, 8]", (4, 8)), ("[8]", (8,))):
        args = argparse.Namespace(quick=False, budget=None, seeds=None, n_seeds=None, steps=None, device=None,
                                  set=[f"widths={text}"])
        assert experiments.budget_for(TOY, args).widths == expected, text


def test_bad_options_are_refused_before_anything_runs(toy_registered, tmp_path):
    with pytest.raises(ValueError, match="unknown experiment 'nope'; the experiments are .*toy"):
        experiments.main(["--only", "toy,nope", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="unknown ToyBudget fields"):
        experiments.main(["--only", "toy", "--out", str(tmp_path), "--set", "widthz=3"])
    with pytest.raises(ValueError, match="has no budget 'medium'"):
        experiments.main(["--only", "toy", "--out", str(tmp_path), "--budget", "medium"])
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        experiments.main(["--only", "toy", "--out", str(tmp_path), "--steps", "0"])
    assert not (tmp_path / "toy").exists()


def test_an_experiment_name_is_registered_once(toy_registered):
    other = dataclasses.replace(TOY, run=json.dumps)  # the same name from another module
    with pytest.raises(ValueError, match="registered twice"):
        experiments.register(other)
    with pytest.raises(ValueError, match="budgets lack \\['quick'\\]"):
        Experiment(name="x", title="x", run=_toy_run, budgets={"full": TOY.budgets["full"]})
    with pytest.raises(ValueError, match="lower case"):
        Experiment(name="Bad Name", title="x", run=_toy_run, budgets=TOY.budgets)


def test_every_experiment_module_registers_itself_with_valid_budgets():
    """The contract of experiments/__init__.py, checked for every module there (today's and future ones)."""
    names = [m.name for m in pkgutil.iter_modules(experiments.__path__) if not m.name.startswith("_")]
    assert "interventions" in names
    found = experiments.registered()
    for name in names:
        module = importlib.import_module(f"markov_interp.experiments.{name}")
        experiment = module.EXPERIMENT
        assert found[experiment.name] is experiment, name
        quick, full = experiment.budgets["quick"], experiment.budgets["full"]
        assert type(quick) is type(full) and quick.cuts, name
        assert full.seeds >= quick.seeds >= 2, name


def test_importing_the_package_imports_no_experiment_module():
    """Discovery is lazy: `import markov_interp.experiments` (the reproduction's summary path) trains nothing
    and loads no experiment module until the registry is asked."""
    import subprocess

    code = ("import sys, markov_interp.experiments as e; "
            "print(sorted(m for m in sys.modules if m.startswith('markov_interp.experiments.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['markov_interp.experiments._base']"


def test_cli_experiment_runs_a_registered_experiment_and_lists_them(toy_registered, tmp_path, capsys):
    from markov_interp import cli

    assert cli.main(["experiment", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "interventions: Interventions during training (budgets: quick, standard, full)" in listed
    assert "toy: Toy experiment" in listed
    assert cli.main(["experiment", "toy", "--quick", "--out", str(tmp_path), "--no-progress"]) == 0
    assert json.loads((tmp_path / "toy" / "results.json").read_text())["budget"]["name"] == "quick"
    assert cli.main(["experiment", "toy", "--set", "label=break", "--out", str(tmp_path)]) == 1
    assert cli.main(["experiment", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown experiment 'nope'" in capsys.readouterr().err


def test_reproduce_runs_the_registered_paper_experiment_and_extras_every_other_one(toy_registered, tmp_path,
                                                                                   monkeypatch):
    """`markov-interp reproduce` runs the registered experiment "paper" through the one experiment path, with its
    own options (sweep folder, backend, workers, group); `--extras` then runs each other registered experiment into
    OUT/NAME at its full budget, not the reproduction again (the reproduction is stood in for: the wiring, fast)."""
    from markov_interp import cli
    from markov_interp.experiments import paper

    calls = []

    def stand_in(budget, out, **options):
        calls.append((budget.name, out, options))
        return ToyResult(TOY.budgets["full"], (1.0,))

    standing = dataclasses.replace(paper.EXPERIMENT, run=stand_in)
    monkeypatch.setattr(paper, "EXPERIMENT", standing)
    monkeypatch.setattr(experiments, "_REGISTRY", {"toy": TOY, "paper": standing})
    monkeypatch.setattr(experiments, "_discover", lambda: None)
    assert cli.main(["reproduce", "--quick", "--out", str(tmp_path), "--work", str(tmp_path / "w"), "--workers", "3",
                     "--extras", "--no-progress"]) == 0
    assert calls == [("quick", tmp_path, {"progress": False, "work": str(tmp_path / "w"), "backend": "local",
                                          "workers": 3, "group": None})]
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("# Reproduction (quick)") and "Made by `markov-interp reproduce --quick" in summary
    data = json.loads((tmp_path / "toy" / "results.json").read_text())
    assert data["budget"]["name"] == "full" and len(data["result"]["values"]) == 4
    assert not (tmp_path / "paper").exists()
    assert experiments.get("paper") is standing and paper.EXPERIMENT.title == "Reproduction"
