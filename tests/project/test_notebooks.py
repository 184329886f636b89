"""The tutorial notebooks: sources in notebooks/NN_name.py (jupytext percent format), committed executed as
notebooks/NN_name.ipynb by `python notebooks/build.py`.

Fast checks: every committed notebook has exactly its source's cells, was executed top to bottom at full
settings with no error and shows figures, and the sources use the package's public API only. Slow check: every
source still runs top to bottom at quick settings (MARKOV_INTERP_QUICK=1, set by the build script for the
kernel), in a fresh kernel inside a temporary folder, writing nothing outside its run folder.
"""

import ast
import importlib.util
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[2] / "notebooks"
SOURCES = sorted(FOLDER.glob("[0-9][0-9]_*.py"))
IDS = [p.stem for p in SOURCES]
nbformat = pytest.importorskip("nbformat")
jupytext = pytest.importorskip("jupytext")


def _build_module():
    spec = importlib.util.spec_from_file_location("notebooks_build", FOLDER / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cells(nb) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source) for cell in nb.cells]


def test_the_seven_tutorials_exist_with_their_notebooks():
    assert IDS == ["01_quickstart", "02_single_layer", "03_two_layer", "04_landscape", "05_interventions",
                   "06_in_context", "07_hidden"], IDS
    assert sorted(p.stem for p in FOLDER.glob("*.ipynb")) == IDS


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_committed_notebook_matches_its_source(source):
    committed = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    nbformat.validate(committed)
    expected = _cells(jupytext.read(source))
    assert [c for c in expected if c[0] == "code"], "no code cells"
    assert _cells(committed) == expected, f"{source.name} changed: run `python notebooks/build.py {source.stem}`"


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_committed_notebook_is_executed_with_figures(source):
    nb = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    assert nb.metadata.get("markov_interp") == {"quick": False}, "built with --quick: rebuild at full settings"
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1)), "not run top to bottom"
    outputs = [o for cell in code for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure"


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_committed_notebook_holds_no_progress_bar(source):
    nb = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    bars = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs if _build_module().is_progress(o)]
    assert not bars, f"{len(bars)} progress-bar outputs: rebuild with `python notebooks/build.py {source.stem}`"
    assert "widgets" not in nb.metadata


def test_progress_bars_are_stripped_and_nothing_else():
    build = _build_module()
    v4 = nbformat.v4
    text_bar = v4.new_output("stream", name="stderr", text="\rpath patching:  52%|#####     | 13/25 [00:06<00:06]")
    widget = v4.new_output("display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "x"},
                                                 "text/plain": "path patching:   0%|          | 0/12"})
    cleared = v4.new_output("stream", name="stderr", text="\r                    \r")
    warning = v4.new_output("stream", name="stderr", text="UserWarning: 50% of the runs | are censored\n")
    printed = v4.new_output("stream", name="stdout", text="loss 100%|done| 3/3 (a printed line, not a bar)\n")
    figure = v4.new_output("display_data", data={"image/png": "iVBOR", "text/plain": "<Figure>"})
    nb = v4.new_notebook(cells=[v4.new_code_cell("x", outputs=[text_bar, figure, widget, cleared, warning, printed]),
                                v4.new_markdown_cell("text")], metadata={"widgets": {"state": {}}})
    assert build.strip_progress(nb) == 3
    assert nb.cells[0].outputs == [figure, warning, printed] and "widgets" not in nb.metadata


def _private_uses(tree: ast.AST) -> list[str]:
    """Imports of private names or modules of markov_interp, and attribute access to private names."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("markov_interp"):
            parts = node.module.split(".") + [a.name for a in node.names]
            found += [p for p in parts if p.startswith("_")]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if any(p.startswith("_") for p in a.name.split("."))]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            found.append(node.attr)
    return found


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_notebooks_use_the_public_api_only(source):
    nb = jupytext.read(source)
    code = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "code")
    code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith("%"))  # magics
    assert _private_uses(ast.parse(code)) == []
    assert "environ" not in code, "settings come from markov_interp.quick_mode(), not the notebook"


def test_private_use_detector_catches_private_helpers():
    tree = ast.parse("from markov_interp.landscape.flow import _predict_many\nimport markov_interp._io\n"
                     "from markov_interp import landscape\nlandscape._check_pq(0.1, 0.2)\n")
    assert _private_uses(tree) == ["_predict_many", "markov_interp._io", "_check_pq"]


def test_quick_builds_honour_the_environment_and_never_write_into_notebooks(monkeypatch, tmp_path):
    build = _build_module()
    monkeypatch.setenv("MARKOV_INTERP_QUICK", "1")
    quick, out = build.settings(False, None)  # the environment alone makes the build quick ...
    assert quick and out.is_dir() and out.resolve() != FOLDER  # ... and it goes to a new temporary folder
    out.rmdir()
    assert build.settings(False, tmp_path) == (True, tmp_path)
    with pytest.raises(ValueError, match="never overwrites the committed notebooks"):
        build.settings(False, FOLDER)
    with pytest.raises(SystemExit):  # the command line refuses before running anything
        build.main(["01_quickstart", "--out", str(FOLDER)])
    monkeypatch.setenv("MARKOV_INTERP_QUICK", "0")
    assert build.settings(False, None) == (False, FOLDER)  # full builds write the committed notebooks
    with pytest.raises(ValueError, match="never overwrites"):
        build.settings(True, FOLDER)


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_notebook_source_runs_at_quick_settings(source, tmp_path):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = _build_module().execute(source, quick=True, folder=tmp_path)
    assert nb.metadata["markov_interp"] == {"quick": True}
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert (tmp_path / "runs").is_dir()
    assert not [p for p in tmp_path.iterdir() if p.name != "runs"], "the notebook wrote outside its run folder"
