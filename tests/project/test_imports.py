"""The package's import graph, read from its files (function-level imports included): no circle, the pipeline's
stage order that the top-level docstring prints is the real one (each stage imports only the stages to its left),
every module imports in a fresh interpreter in any order, and no name a module or a package binds at its top level
hides one of its own submodules (`probes.behaviour` is the module, never a function)."""

import ast
import importlib
import pkgutil
import random
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import markov_interp

ROOT = Path(__file__).resolve().parents[2]


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    """{dotted name: file} of every module of the package under `root` (a package by its __init__.py)."""
    modules = {}
    for path in sorted((root / "markov_interp").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports_of(path: Path, modules: dict[str, Path], name: str) -> set[str]:
    """The package modules `name` imports anywhere in its file (function-level imports included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("markov_interp"):
                found = {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules}
                out |= found or {node.module}
    return {m for m in out if m != name and not name.startswith(m + ".")}  # a module's own package: its face


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """{module: the package modules it imports} of the package under `root`."""
    modules = package_modules(root)
    return {name: imports_of(path, modules, name) for name, path in modules.items()}


def test_the_import_graph_has_no_circle():
    """Every import between the package's modules, function-level ones included, points one way (a module
    importing its own package's face aside): no circle, and none hidden in a function."""
    graph = import_graph()
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError(f"import circle: {' -> '.join(trail[trail.index(nxt):] + [nxt])}")
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert "markov_interp.training.loop" in graph["markov_interp.training"]  # the graph sees the faces' imports


# ---------------------------------------------------------------------------------------- the stage order
def stage_order(doc: str) -> tuple[list[str], list[str]]:
    """(the stages in the order the docstring prints them, the modules it names as under them all): the stages
    are its first indented block, "a -> b -> ..." over one or more lines."""
    block = re.search(r"^( {4}.*\S.*\n)+", doc, re.M)
    under = re.search(r"^Under them all: (.*?)\.$", doc, re.M | re.S)
    assert block and under, "the docstring prints the stages as '    a -> b -> ...' and 'Under them all: ...'"
    return [s.strip() for s in block[0].split("->")], re.findall(r"`(\w+)`", under[1])


def order_problems(graph: dict[str, set[str]], stages: list[str], under: list[str]) -> list[str]:
    """What breaks the printed order: a stage importing one to its right (or an unnamed part), a module named
    under them all that imports a stage, a part of the package the docstring does not name."""
    def part(module: str) -> str:
        return module.split(".")[1]

    parts = {part(m) for m in graph if m.count(".") >= 1} - {"__main__"}
    problems = [f"{p}: a part of the package the docstring does not name" for p in sorted(parts - {*stages, *under})]
    problems += [f"{p}: named by the docstring, not a part of the package" for p in [*stages, *under] if p not in parts]
    for module, imported in sorted(graph.items()):
        if module.count(".") == 0 or part(module) not in [*stages, *under]:
            continue
        mine = part(module)
        left = set(under) | (set(stages[:stages.index(mine)]) if mine in stages else set())
        for target in sorted({part(t) for t in imported if t.count(".") >= 1} - {mine} - left):
            problems.append(f"{module} imports {target}: not a stage to its left")
    return problems


def test_the_docstring_prints_the_real_stage_order():
    stages, under = stage_order(markov_interp.__doc__)
    assert len(stages) >= 10 and {"config", "devices", "_io"} <= set(under)
    assert order_problems(import_graph(), stages, under) == []


def test_the_order_check_finds_an_import_to_the_right(tmp_path):
    """The check itself on a package whose faults are known."""
    for name, text in {"__init__.py": "", "a.py": "from markov_interp import b\n", "b.py": "",
                       "c/__init__.py": "def f():\n    from markov_interp import a\n", "base.py": "",
                       "d.py": ""}.items():
        (tmp_path / "markov_interp" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "markov_interp" / name).write_text(text)
    graph = import_graph(tmp_path)
    assert order_problems(graph, ["b", "a", "c"], ["base", "d"]) == []
    assert order_problems(graph, ["a", "b", "c", "e"], ["base"]) == [
        "d: a part of the package the docstring does not name", "e: named by the docstring, not a part of the package",
        "markov_interp.a imports b: not a stage to its left"]
    assert order_problems(graph, ["b", "c", "a"], ["base", "d"]) == [
        "markov_interp.c imports a: not a stage to its left"]


# ------------------------------------------------------------------------------------ names and modules
def shadowed_submodules(package: types.ModuleType) -> list[str]:
    """"package.name" for each submodule of `package` (recursively) whose name the package binds to something
    other than that module (a function `behaviour` hiding the module `behaviour`)."""
    found = []
    for info in pkgutil.iter_modules(package.__path__):
        child = importlib.import_module(f"{package.__name__}.{info.name}")
        bound = vars(package).get(info.name, child)
        if bound is not child:
            found.append(f"{package.__name__}.{info.name}")
        if info.ispkg:
            found += shadowed_submodules(child)
    return found


def test_no_name_shadows_a_module():
    assert shadowed_submodules(markov_interp) == []
    fake = types.ModuleType("fake")
    fake.__path__ = [str(ROOT / "markov_interp" / "probes")]
    fake.__name__ = "markov_interp.probes"
    fake.behaviour = lambda: None  # the check sees a function bound over a module
    assert shadowed_submodules(fake) == ["markov_interp.probes.behaviour"]


@pytest.mark.slow
def test_every_module_imports_in_a_fresh_interpreter_in_a_random_order():
    names = random.Random(0).sample(sorted(package_modules()), len(package_modules()))
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    done = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, (names, done.stderr[-2000:])
