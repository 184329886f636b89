"""The README stays true: two quick-start commands (CI runs exactly the second one's test command), only existing
CLI commands, links that resolve, and Python examples that run."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_quick_start_is_two_commands_and_ci_runs_the_test_one():
    train, tests = quick_start_commands()
    assert "markov-interp train" in train and "pytest" in tests
    install_and_test = tests.split("&& pip install", 1)[1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"pip install{install_and_test}" in ci.splitlines()


def test_readme_names_only_existing_cli_commands():
    from markov_interp.cli import build_parser

    commands = set(build_parser()._subparsers._group_actions[0].choices)
    used = set(re.findall(r"^markov-interp (\w+)", (ROOT / "README.md").read_text(), re.M))
    assert used and used <= commands, used - commands


def test_readme_is_an_onboarding_page_whose_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 160  # issue 24: an onboarding page of about 150 lines; the rest is in docs/
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert any(t.endswith(".png") for t in targets)  # the committed picture of the report
    missing = [t for t in targets if not t.startswith("http") and not (ROOT / t).exists()]
    assert not missing, missing
    for page in sorted((ROOT / "docs").glob("*.md")):  # docs link each other relatively too
        links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
        broken = [t for t in links if not t.startswith("http") and not (page.parent / t).exists()]
        assert not broken, (page.name, broken)


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


@pytest.mark.slow  # trains a small model (at 30 steps instead of 600: the code path, not the verdict)
def test_readme_python_example_runs(tmp_path, monkeypatch):
    example = _python_blocks()[0]
    assert "steps=600" in example
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(example.replace("steps=600", "steps=30"), "README.md", "exec"), namespace)
    assert namespace["mech"].mechanism in {"uniform", "unigram", "in_context_unigram", "state_and_counts",
                                           "kernel", "induction", "other"}
    assert (tmp_path / "runs" / "icl-3" / "report.html").stat().st_size > 10_000


def _own_model_example() -> tuple[str, str]:
    """The README's own-model example as written (TL 4.x uncommented), and its TL 2.16-3.x variant (the commented
    block uncommented in place of the TL 4 lines above it)."""
    example = _python_blocks()[1]
    head, rest = example.split("from transformer_lens.config import", 1)
    tl4, rest = rest.split("# TL 2.16-3.x (beside sae-lens), instead of the TL 4.x lines above:\n", 1)
    assert "TransformerBridge.boot_native" in tl4 and "#" not in tl4.split("\n", 1)[1], tl4
    tl2, tail = rest.split("\n\n", 1)
    assert all(line.startswith("# ") for line in tl2.splitlines()), tl2
    return example, head + "\n".join(line.removeprefix("# ") for line in tl2.splitlines()) + "\n\n" + tail


def test_readme_own_model_example_runs_on_the_installed_transformerlens():
    """Issue 32: the default install resolves TL 4.x, so the uncommented block is the TransformerBridge one and it
    runs exactly as written there; on TL 2 / 3 (CI's compatibility matrix) the commented variant runs."""
    from markov_interp.models import tl_version

    as_written, tl2_variant = _own_model_example()
    code = as_written if tl_version()[0] >= 4 else tl2_variant
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["own"].markov_train_seq_len == 32
    assert type(namespace["own"]).__name__ == ("TransformerBridge" if tl_version()[0] >= 4 else "HookedTransformer")


def test_readme_says_where_to_train_and_that_probes_check_types():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Probe your own TransformerLens model", 1)[1].split("\n## ", 1)[0]
    assert "markov_interp.training" in section and "TypeError" in section and "probe with TL" in section
