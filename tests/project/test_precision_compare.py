"""docs/reproduction/precision/compare.py, the bf16 against fp32 comparison behind the grids' precision: its paired
sign test on hand-made crossings, and a tiny end-to-end run writing summary.md, results.json and the figure."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from markov_interp import dynamics

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "reproduction" / "precision" / "compare.py"


def _script():
    spec = importlib.util.spec_from_file_location("precision_compare", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _runs(bys: list) -> list:
    """RunDynamics whose crossing of 0.5 is at `by` (None: censored after 490)."""
    curve = dynamics.ExcessCurve(steps=(10, 20), excess=(0.05, 0.0), plateau_excess=(0.05, 0.05))
    return [dynamics.RunDynamics(curve, 2, {0.5: dynamics.StepInterval(490, None) if by is None
                                           else dynamics.StepInterval(by - 10, by)}) for by in bys]


def test_paired_signs_count_later_earlier_and_ties_with_an_exact_sign_test():
    a = _runs([100, 200, 300, 400, 150, 250, 350])
    b = _runs([110, 200, 320, None, 150, 260, 340])  # later: 110, 320, censored, 260; earlier: 340; ties: 2
    later, earlier, same, p = _script().paired_signs(a, b, 0.5)
    assert (later, earlier, same) == (4, 1, 2)
    assert p == pytest.approx(2 * (1 + 5) / 2**5)  # two-sided binomial tail of 1 of 5
    assert _script().paired_signs(a, a, 0.5) == (0, 0, 7, 1.0)


@pytest.mark.slow
def test_the_comparison_writes_its_summary(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--seeds", "2", "--steps", "12", "--seq-len", "16",
                           "--eval-every", "2", "--eval-batches", "1", "--work", str(tmp_path / "runs"), "--out",
                           str(tmp_path / "out"), "--no-progress"], capture_output=True, text=True, timeout=900,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(record["conditions"]) == {"fp32", "bf16"} and len(record["conditions"]["bf16"]["crossings"]) == 2
    assert set(record["paired"]) == {"0.9", "0.75", "0.5", "0.25"}
    text = (tmp_path / "out" / "summary.md").read_text()
    assert "log-rank p" in text and "## Reading" in text and "--work" not in text
    assert (tmp_path / "out" / "crossings.png").stat().st_size > 0
