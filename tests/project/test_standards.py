"""The project's code standards that a machine can check: no function over 80 lines (style.md), and tests/ laid
out as the package is (a test file lives in the folder of the module or subpackage it tests).

A reviewer still reads the rest; this catches the rules that drift silently as code grows.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 80
CHECKED = ("markov_interp", "benchmarks")  # the package and the scripts that measure it
# Functions allowed over MAX_LINES, as "path::qualified.name": each with the reason it is not split yet.
KNOWN_EXCEPTIONS: dict[str, str] = {}


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, first line, last line) of every function in `tree`, nested ones included; the first
    line is the first decorator's (a decorator is part of what a reader must take in)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{node.name}"
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            yield name, first, node.end_lineno
            yield from _functions(node, f"{name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def long_functions(root: Path, max_lines: int = MAX_LINES) -> dict[str, int]:
    """Every function under `root`'s CHECKED folders longer than `max_lines`, as {"path::name": lines}."""
    found = {}
    for folder in CHECKED:
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for name, first, last in _functions(tree):
                lines = last - first + 1
                if lines > max_lines:
                    found[f"{path.relative_to(root).as_posix()}::{name}"] = lines
    return found


def test_no_function_is_over_80_lines():
    found = long_functions(ROOT)
    new = {k: v for k, v in found.items() if k not in KNOWN_EXCEPTIONS}
    assert not new, f"functions over {MAX_LINES} lines (split them): {new}"
    stale = sorted(set(KNOWN_EXCEPTIONS) - set(found))
    assert not stale, f"known exceptions no longer over {MAX_LINES} lines (remove them from the list): {stale}"


def test_the_walk_finds_long_and_nested_functions(tmp_path):
    """The check itself on a file whose long functions are known: a method, a nested function, a decorated
    function counted from its decorator, and one exactly at the limit that passes."""
    body = "\n".join(f"    x{i} = {i}" for i in range(78))
    source = (
        f"def at_limit():\n{body}\n    return 0\n\n"  # 1 + 78 + 1 = 80 lines
        "@staticmethod\n"
        f"def decorated():\n{body}\n    return 0\n\n"  # 81 with its decorator
        f"class K:\n    def method(self):\n{body.replace('    ', '        ')}\n        y = 1\n        return 0\n\n"
        "def outer():\n    def inner():\n" + body.replace("    ", "        ") + "\n        y = 1\n        return 0\n"
        "    return inner\n"
    )
    (tmp_path / "markov_interp").mkdir()
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "markov_interp" / "m.py").write_text(source)
    found = long_functions(tmp_path)
    assert found == {"markov_interp/m.py::decorated": 81, "markov_interp/m.py::K.method": 81,
                     "markov_interp/m.py::outer.inner": 81, "markov_interp/m.py::outer": 83}


def test_the_walk_sees_the_code():
    """Every checked folder holds functions the walk measures (a moved folder must not make the check pass by
    finding nothing): at a 10-line limit each has some."""
    short = long_functions(ROOT, max_lines=10)
    for folder in CHECKED:
        assert any(k.startswith(f"{folder}/") for k in short), folder
    assert any(k.startswith("markov_interp/sweep/") for k in short)


# ---------------------------------------------------------------------------------------------- tests/ layout
# tests/<name>/ holds the tests of markov_interp/<name>.py or markov_interp/<name>/; these folders are the exceptions
CROSS_CUTTING = {
    "project": "the README, notebooks, docs and these standards",
    "faults": "faults across the package, one place (docs/faults.md)",
    "sources": "the sources of data.py (tests/data/ is the fixtures folder)",
}
NOT_TESTS = {"data", "__pycache__"}  # fixtures and the scripts that wrote them (never collected)
HELPERS = {"__init__.py", "conftest.py", "handbuilt.py", "compile_runs.py"}  # at tests/, imported by the tests


def layout_problems(root: Path) -> list[str]:
    """What in `root`/tests breaks the mirrored layout: a folder named after no part of `root`/markov_interp (and
    not a cross-cutting one), a folder without `__init__.py` (each is a package, so two folders may hold the same
    file name), a test file at tests/ itself or nested deeper than one folder."""
    package = root / "markov_interp"
    parts = {p.stem for p in package.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    parts -= {"__init__", "__main__"}
    tests = root / "tests"
    problems = [f"tests/{p.name}: not a test helper ({sorted(HELPERS)}); tests go in the folder of their part"
                for p in sorted(tests.glob("*.py")) if p.name not in HELPERS]
    for folder in sorted(p for p in tests.iterdir() if p.is_dir() and p.name not in NOT_TESTS):
        if folder.name not in parts and folder.name not in CROSS_CUTTING:
            problems.append(f"tests/{folder.name}/: no markov_interp module or package of that name")
        if not (folder / "__init__.py").is_file():
            problems.append(f"tests/{folder.name}/: no __init__.py")
        problems += [f"{p.relative_to(root).as_posix()}: nested below tests/{folder.name}/"
                     for p in sorted(folder.rglob("test_*.py")) if p.parent != folder]
    return problems


def test_tests_mirror_the_package():
    assert layout_problems(ROOT) == []
    folders = {p.parent.name for p in (ROOT / "tests").rglob("test_*.py")} - NOT_TESTS
    assert {"probes", "training", "models", "project"} <= folders  # the walk finds the tests


def test_the_layout_check_finds_misplaced_tests(tmp_path):
    """The check itself on a tree whose faults are known."""
    (tmp_path / "markov_interp" / "probes").mkdir(parents=True)
    (tmp_path / "markov_interp" / "probes" / "__init__.py").write_text("")
    (tmp_path / "markov_interp" / "theory.py").write_text("")
    for folder in ("probes", "theory", "project", "widgets", "data"):
        (tmp_path / "tests" / folder).mkdir(parents=True)
        (tmp_path / "tests" / folder / "test_x.py").write_text("")
    for folder in ("probes", "project", "widgets"):
        (tmp_path / "tests" / folder / "__init__.py").write_text("")
    (tmp_path / "tests" / "probes" / "deep").mkdir()
    (tmp_path / "tests" / "probes" / "deep" / "test_y.py").write_text("")
    (tmp_path / "tests" / "conftest.py").write_text("")
    (tmp_path / "tests" / "test_loose.py").write_text("")
    assert layout_problems(tmp_path) == [
        "tests/test_loose.py: not a test helper (['__init__.py', 'compile_runs.py', 'conftest.py', 'handbuilt.py']); "
        "tests go in the folder of their part",
        "tests/probes/deep/test_y.py: nested below tests/probes/",
        "tests/theory/: no __init__.py",
        "tests/widgets/: no markov_interp module or package of that name",
    ]
