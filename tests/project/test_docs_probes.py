"""docs/probes.md stays true: its Python examples run as written (one namespace, in order)."""

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "probes.md"


@pytest.mark.slow  # trains a model and computes random-kernel reference losses by Monte Carlo (~25 s)
def test_probe_docs_examples_run(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)  # nothing the examples write lands in the checkout
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    assert namespace["mech"].seq_len == 32 == namespace["batch"].tokens.shape[1]  # the training length
    assert namespace["scores"].previous_token.shape == (2, 1)  # attn-only-2layer: one head per layer
