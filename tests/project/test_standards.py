"""The project's code standards that a machine can check (style.md, issue 34): no function over 60 lines, no module
over 800 lines, `theory`'s re-exports (`__all__`) complete and resolvable, and tests/ laid out as the package is (a
test file lives in the folder of the module or subpackage it tests).

A reviewer still reads the rest; this catches the rules that drift silently as code grows. A function's lines run
from its first decorator to the end of its body, docstring included (all a reader must take in).
"""

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 60
MAX_MODULE_LINES = 800
CHECKED = ("markov_interp", "benchmarks", "tools")  # the package, the scripts that measure it, the repository's tools
# Functions allowed over MAX_LINES, as "path::qualified.name": each with the reason it is not split yet.
KNOWN_EXCEPTIONS: dict[str, str] = {}
# Modules of the package allowed over MAX_MODULE_LINES, with the reason.
LONG_MODULES: dict[str, str] = {}


_BODIES = (ast.stmt, ast.excepthandler, ast.match_case)  # what can hold a def (an expression cannot)


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, first line, last line) of every function in `tree`, nested ones included; the first
    line is the first decorator's (a decorator is part of what a reader must take in)."""
    for node in ast.iter_child_nodes(tree):
        if not isinstance(node, _BODIES):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{node.name}"
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            yield name, first, node.end_lineno
            yield from _functions(node, f"{name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


@functools.lru_cache(maxsize=4)
def _parsed(root: Path) -> tuple[tuple[str, ast.AST], ...]:
    """("path", syntax tree) of every file in `root`'s CHECKED folders, parsed once per test session."""
    paths = [path for folder in CHECKED for path in sorted((root / folder).rglob("*.py"))]
    return tuple((path.relative_to(root).as_posix(), ast.parse(path.read_text(), filename=str(path))) for path in paths)


def long_functions(root: Path, max_lines: int = MAX_LINES) -> dict[str, int]:
    """Every function under `root`'s CHECKED folders longer than `max_lines`, as {"path::name": lines}."""
    found = {}
    for path, tree in _parsed(root):
        for name, first, last in _functions(tree):
            lines = last - first + 1
            if lines > max_lines:
                found[f"{path}::{name}"] = lines
    return found


def _check_lengths(found: dict[str, int], allowed: dict[str, str], limit: int, what: str) -> None:
    """No `what` over `limit` lines beyond the `allowed` ones, and every allowed one still over it."""
    new = {k: v for k, v in found.items() if k not in allowed}
    assert not new, f"{what} over {limit} lines (split them): {new}"
    stale = sorted(set(allowed) - set(found))
    assert not stale, f"allowed {what} no longer over {limit} lines (remove them from the list): {stale}"


def test_no_function_is_over_60_lines():
    _check_lengths(long_functions(ROOT), KNOWN_EXCEPTIONS, MAX_LINES, "functions")


def test_the_walk_finds_long_and_nested_functions(tmp_path):
    """The check itself on a file whose long functions are known: a method, a nested function, a decorated
    function counted from its decorator, and one exactly at the limit that passes."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES - 2))
    source = (
        f"def at_limit():\n{body}\n    return 0\n\n"  # 1 + (MAX_LINES - 2) + 1 lines
        "@staticmethod\n"
        f"def decorated():\n{body}\n    return 0\n\n"  # one more with its decorator
        f"class K:\n    def method(self):\n{body.replace('    ', '        ')}\n        y = 1\n        return 0\n\n"
        "def outer():\n    def inner():\n" + body.replace("    ", "        ") + "\n        y = 1\n        return 0\n"
        "    return inner\n"
    )
    (tmp_path / "markov_interp").mkdir()
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "markov_interp" / "m.py").write_text(source)
    found = long_functions(tmp_path)
    over = MAX_LINES + 1
    assert found == {"markov_interp/m.py::decorated": over, "markov_interp/m.py::K.method": over,
                     "markov_interp/m.py::outer.inner": over, "markov_interp/m.py::outer": over + 2}


def test_the_walk_sees_the_code():
    """Every checked folder holds functions the walk measures (a moved folder must not make the check pass by
    finding nothing): at a 10-line limit each has some."""
    short = long_functions(ROOT, max_lines=10)
    for folder in CHECKED:
        assert any(k.startswith(f"{folder}/") for k in short), folder
    assert any(k.startswith("markov_interp/sweep/") for k in short)


def long_modules(root: Path, max_lines: int = MAX_MODULE_LINES) -> dict[str, int]:
    """Every module of the package longer than `max_lines`, as {"path": lines}."""
    found = {}
    for path in sorted((root / "markov_interp").rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > max_lines:
            found[path.relative_to(root).as_posix()] = lines
    return found


def test_no_module_is_over_800_lines():
    _check_lengths(long_modules(ROOT), LONG_MODULES, MAX_MODULE_LINES, "modules")
    assert long_modules(ROOT, max_lines=100)  # the walk sees the package (a moved folder must not pass by finding none)


def test_theory_reexports_every_public_name():
    """`theory.__all__` names only what resolves, once each, and every public function or class that a module of
    the package defines (so a new one cannot be left out of `theory.X`)."""
    import importlib
    import pkgutil

    from markov_interp import theory

    assert len(set(theory.__all__)) == len(theory.__all__)
    missing = [name for name in theory.__all__ if not hasattr(theory, name)]
    assert not missing, f"theory.__all__ names what theory does not have: {missing}"
    modules = [importlib.import_module(f"{theory.__name__}.{m.name}") for m in pkgutil.iter_modules(theory.__path__)]
    assert len(modules) >= 4  # fixed chains, in-context, pools, the cache (at least)
    defined = {name for m in modules for name, value in vars(m).items() if not name.startswith("_")
               and getattr(value, "__module__", None) == m.__name__}
    left_out = defined - set(theory.__all__)
    assert not left_out, f"defined in theory's modules, not in its __all__: {left_out}"


# ---------------------------------------------------------------------------------------------- tests/ layout
# tests/<name>/ holds the tests of markov_interp/<name>.py or markov_interp/<name>/; these folders are the exceptions
CROSS_CUTTING = {
    "project": "the README, notebooks, docs and these standards",
    "faults": "faults across the package, one place (docs/faults.md)",
}
NOT_TESTS = {"data", "__pycache__"}  # fixtures and the scripts that wrote them (never collected)
HELPERS = {"__init__.py", "conftest.py", "handbuilt.py", "compile_runs.py", "devicesim.py"}  # imported by the tests


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
        "tests/test_loose.py: not a test helper (['__init__.py', 'compile_runs.py', 'conftest.py', 'devicesim.py', "
        "'handbuilt.py']); tests go in the folder of their part",
        "tests/probes/deep/test_y.py: nested below tests/probes/",
        "tests/theory/: no __init__.py",
        "tests/widgets/: no markov_interp module or package of that name",
    ]


# ------------------------------------------------------------------------------------------- inline guards
# Argument checks go through markov_interp.config (check_int and its siblings, or a field's annotation and bounds):
# one message form, one place to change. Files allowed to keep the inline form, as path prefixes, each with why.
GUARD_EXCEPTIONS: dict[str, str] = {}


def _is_type_guard(node: ast.AST) -> bool:
    """`isinstance(x, bool) or not isinstance(x, int)` (or `(int, float)`), in either order, on the same x."""
    def isinstance_of(call: ast.AST, names: set) -> "ast.AST | None":
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "isinstance" and len(call.args) == 2:
            kinds = call.args[1].elts if isinstance(call.args[1], ast.Tuple) else [call.args[1]]
            if names & {getattr(k, "id", None) for k in kinds}:
                return call.args[0]
        return None

    if not (isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or)):
        return False
    bools = {ast.dump(x) for v in node.values if (x := isinstance_of(v, {"bool"})) is not None}
    ints = {ast.dump(x) for v in node.values if isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.Not)
            and (x := isinstance_of(v.operand, {"int"})) is not None}
    return bool(bools & ints)


def inline_guards(root: Path) -> list[str]:
    """"path:line" of every inline int/bool guard in the package outside config.py."""
    found = []
    for path in sorted((root / "markov_interp").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "markov_interp/config.py":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        found += [f"{rel}:{n.lineno}" for n in ast.walk(tree) if _is_type_guard(n)]
    return found


def test_no_inline_int_guards():
    found = inline_guards(ROOT)
    new = [f for f in found if not f.startswith(tuple(GUARD_EXCEPTIONS))]
    assert not new, f"inline int/bool guards (use markov_interp.config.check_int or a field's bounds): {new}"
    stale = [p for p in GUARD_EXCEPTIONS if not any(f.startswith(p) for f in found)]
    assert not stale, f"allowed inline guards no longer there (remove them from GUARD_EXCEPTIONS): {stale}"


def test_the_guard_scan_finds_the_pattern(tmp_path):
    """The scan itself on known code: both orders and a tuple of types found, other checks left alone."""
    (tmp_path / "markov_interp").mkdir()
    (tmp_path / "markov_interp" / "m.py").write_text(
        "if isinstance(n, bool) or not isinstance(n, int) or n < 1:\n    pass\n"
        "ok = not isinstance(v, (int, float)) or isinstance(v, bool)\n"
        "fine = isinstance(a, bool) or not isinstance(b, int)\n"  # two different values: not a guard
        "also = isinstance(v, int) and not isinstance(v, bool)\n")
    (tmp_path / "markov_interp" / "config.py").write_text("x = isinstance(n, bool) or not isinstance(n, int)\n")
    assert inline_guards(tmp_path) == ["markov_interp/m.py:1", "markov_interp/m.py:3"]
