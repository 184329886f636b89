"""Shared test setup: one torch thread per test process; the reference-loss cache in a temporary folder; the
helpers at tests/ (handbuilt.py) importable from every test folder.

The models here are tiny; on a small shared CPU, torch's default thread pool makes them several times slower
(measured ~10x on the 2-core CI machine), and pytest-xdist already runs one process per core. The tests must
neither read a developer's `~/.cache/markov-interp` (stale entries would hide a changed computation) nor fill it.
"""

import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)
# ... and in every process a test starts (CLI runs, notebook kernels, Ray workers): a child with torch's default
# pool of 2 threads beside the other xdist worker ran 1.2-3x slower than with one (measured on this 2-core machine)
os.environ.setdefault("OMP_NUM_THREADS", "1")
# tests/ mirrors the package (tests/probes/, tests/training/, ...), one package per folder (`tests.probes.test_probes`,
# so two folders may hold the same file name); the helper modules stay at tests/ and import as `handbuilt`
TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
os.environ.setdefault("MARKOV_INTERP_CACHE", tempfile.mkdtemp(prefix="markov-interp-cache-"))

# The probe / model / report tier: CI runs these files again under TransformerLens 2.18 and 3.2
# (`pytest -m "tlcompat and not slow"` in .ci/tlcompat; docs/transformerlens.md has the matrix).
TLCOMPAT_FILES = ("models/test_tl.py", "models/test_models.py", "probes/test_probes.py", "probes/test_probe_ux.py",
                  "probes/test_classify.py", "probes/test_strategies.py", "clamps/test_clamps.py",
                  "report/test_report.py", "probes/test_circuits.py", "project/test_readme.py")


@pytest.fixture
def limited_memory(monkeypatch):
    """Every memory plan check sees a machine of 1 GiB (wherever `_plan.memory_limit` was imported), so what a plan
    lets through is small on any machine (the fuzz tests of tests/probes/test_probe_bounds.py and
    tests/faults/test_faults_sizes.py)."""
    from markov_interp import _plan

    limit = lambda device: (1 << 30, "a test's 1 GiB")  # noqa: E731
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("markov_interp") and \
                getattr(module, "memory_limit", None) is _plan.memory_limit:
            monkeypatch.setattr(module, "memory_limit", limit)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/".join(item.path.parts[-2:]) in TLCOMPAT_FILES:
            item.add_marker(pytest.mark.tlcompat)

# tests/data holds fixtures and the scripts that wrote them, not tests or doctests
collect_ignore = ["data"]
