"""The README's picture is the current output: `tools/readme_image.py` writes it with `report.json` beside it (what
the picture shows), and re-running the README's example (same seed, same weights) must show the same."""

import json

import pytest

from tools import readme_image


def test_the_picture_and_what_it_shows_are_there():
    facts = json.loads(readme_image.SHOWN.read_text(encoding="utf-8"))
    assert readme_image.IMAGE.stat().st_size > 20_000 and readme_image.IMAGE.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(facts) == {"mechanism", "confident", "kept", "edges", "nodes"}
    assert 0 < facts["kept"] <= facts["edges"] and {"embed", "pos", "logits"} <= set(facts["nodes"])
    assert "steps=600" in readme_image.readme_example() and "seed=0" in readme_image.readme_example()


@pytest.mark.slow  # trains the README's model (600 steps) and builds its report
def test_the_picture_shows_the_current_output(tmp_path):
    _, facts = readme_image.run_example(tmp_path)
    assert facts == json.loads(readme_image.SHOWN.read_text(encoding="utf-8")), (
        "the README's picture is stale: run `python -m tools.readme_image`")
