"""The README's quick start stays true: two commands, and CI runs exactly the second one's test command."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
