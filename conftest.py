"""The names the package's `>>>` examples use without defining them (pytest --doctest-modules over markov_interp/):
a tiny hand-built two-layer induction circuit on 3 states (`tests/handbuilt.py`: its mechanism is known by
construction), a probe batch of it, and a run folder of a few training steps. They are made once per test process,
when the first doctest that names one runs, so those examples take seconds and the rest of the suite pays nothing.
"""

import ast
import sys
from pathlib import Path

import pytest
from _pytest.doctest import DoctestItem

ROOT = Path(__file__).resolve().parent
NAMES = ("model", "source", "batch", "tokens", "corrupted_tokens", "run_dir", "scratch")
_MADE: dict = {}


def _make(scratch: Path) -> dict:
    """`model` (the induction circuit: previous-token head L0H0, induction head L1H0), `source` (its in-context
    task), `batch`, `tokens` and `corrupted_tokens` (16 sequences of 32 states, and 16 others), `run_dir` (a
    two-layer run trained for 4 steps, 2 checkpoints) and `scratch` (a folder to write into)."""
    import torch

    from markov_interp import probes, training
    from markov_interp.sources import RandomMarkov

    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from handbuilt import induction_circuit

    torch.set_num_threads(1)
    source = RandomMarkov(3)
    batch = probes.sample_batch(source, n_sequences=16, seq_len=32, seed=0)
    run = training.default_run(kind="random", vocab=3, steps=4, n_ctx=16, seq_len=16, batch_size=8, eval_every=2,
                               eval_batches=1, n_checkpoints=2, device="cpu")
    training.train(run, scratch / "run", progress=False)
    return {"model": induction_circuit(3, n_ctx=32), "source": source, "batch": batch, "tokens": batch.tokens,
            "corrupted_tokens": probes.sample_batch(source, n_sequences=16, seq_len=32, seed=1).tokens,
            "run_dir": scratch / "run", "scratch": scratch}


def _free_names(examples: list) -> set[str]:
    """The names a doctest's examples read without assigning them."""
    loaded, stored = set(), set()
    for example in examples:
        for node in ast.walk(ast.parse(example.source)):
            if isinstance(node, ast.Name):
                (stored if isinstance(node.ctx, ast.Store) else loaded).add(node.id)
    return loaded - stored


@pytest.fixture(autouse=True)
def _doctest_names(request: pytest.FixtureRequest) -> None:
    """A doctest whose examples read one of `NAMES` without defining it finds them all in its globals."""
    if not isinstance(request.node, DoctestItem) or not _free_names(request.node.dtest.examples) & set(NAMES):
        return
    if not _MADE:
        _MADE.update(_make(request.getfixturevalue("tmp_path_factory").mktemp("doctest")))
    request.getfixturevalue("doctest_namespace").update(_MADE)
