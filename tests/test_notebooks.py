"""The tutorial notebooks run top to bottom (tiny settings: MARKOV_INTERP_QUICK=1), and are stored without outputs.

Each notebook is executed with nbclient in a fresh kernel of this interpreter, inside a temporary folder; any
failing cell fails the test with the cell's error.
"""

import os
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
nbformat = pytest.importorskip("nbformat")


def test_the_four_tutorials_exist():
    names = [p.stem for p in NOTEBOOKS]
    assert names == ["01_quickstart", "02_single_layer", "03_two_layer", "04_landscape"], names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name} has stored outputs"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("MARKOV_INTERP_QUICK", "1")
    monkeypatch.setenv("MARKOV_INTERP_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError naming the failing cell
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert (tmp_path / "runs").is_dir()
    assert not [p for p in tmp_path.iterdir() if p.name != "runs"], "the notebook wrote outside its run folder"
