"""The findings in the docs, rendered from the committed results: one command, and a check that they agree.

Repository tooling, run from the checkout (it renders this repository's markdown; it is not part of the installed
package): `python -m tools.findings [--check]` from the repository's root.

The findings tables and number-bearing findings items of README.md, docs/findings*.md, docs/landscape.md,
docs/reproduction/summary.md and docs/circuits.md sit between markers

    <!-- rendered: NAME (source: PATH[, PATH ...]) -->
    ...
    <!-- /rendered -->

and `python -m tools.findings` remakes each from the committed result files
it names (paths relative to the repository root) with the package's own statistics: an experiment's results.json
is read back by `experiments.load` (every statistic recomputed from the per-seed rows by the current code), the
reproduction's results.csv by `experiments.paper.summarise`, the first session's files (one escape step per seed) by
`dynamics.recorded_escape` on their evaluation grids. Nothing trains. `--check` renders without writing and exits
with 1 when a committed file differs (the test suite runs it); a block whose wording no longer fits its numbers
refuses to render (`holds`). Text outside the markers is not touched.

A block for a new results folder is a few lines in one of this package's block modules (`_engine.BLOCK_MODULES`:
`reproduction`, `interventions`, `icl`, `hidden`, `readme`), e.g. in `icl` for `python -m markov_interp.experiments --only
phases --budget standard --out docs/reproduction` (which writes docs/reproduction/phases/; move it to
phases-standard/):

    @block("phases-standard-claims", "docs/reproduction/phases-standard/results.json")
    def phases_standard_claims(path):
        from markov_interp.experiments import phases
        return phases.claims_table(experiment(path).result.claims).markdown()

then a region `<!-- rendered: phases-standard-claims -->` / `<!-- /rendered -->` where the table goes, and
`python -m tools.findings` fills it (and its source) in.
"""

import argparse
import sys
from pathlib import Path
from typing import Optional

from tools.findings._engine import (BLOCKS, Block, FindingNoLongerHolds, Outcome, block, blocks, holds, regions,
                                    render_files, render_text, wrap)

__all__ = ["DOCS", "BLOCKS", "Block", "block", "blocks", "holds", "FindingNoLongerHolds", "regions", "render_text",
           "render_files", "render", "wrap", "Outcome", "default_root", "add_arguments", "run_command", "main"]

DOCS = ("README.md", "docs/findings.md", "docs/findings-dynamics.md", "docs/findings-icl.md", "docs/findings-hidden.md",
        "docs/landscape.md", "docs/reproduction/summary.md", "docs/circuits.md")


def default_root() -> Path:
    """The checkout this tool is run from (the folder above `tools/`)."""
    return Path(__file__).resolve().parents[2]


def render(root: "str | Path | None" = None, *, check: bool = False,
           files: tuple[str, ...] = DOCS) -> list[Outcome]:
    """Render every findings region of `files` under `root` from the committed results.

    Args:
        root: the repository root (default `default_root()`).
        check: compare only, write nothing.
        files: the markdown files, relative to `root`.

    Returns:
        One `Outcome` per file (`changed`: its committed text differs from the rendering; `diff`).
        ValueError when `root` lacks a file, for an unknown block or a bad marker; a block's source that is
        missing raises FileNotFoundError naming the block.
    """
    root = default_root() if root is None else Path(root)
    missing = [f for f in files if not (root / f).is_file()]
    if missing:
        raise ValueError(f"{root} is not a checkout with the findings docs: {missing} missing (give --root)")
    return render_files(root, files, write=not check)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `python -m tools.findings`."""
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when a committed file differs from its rendering (with a diff)")
    parser.add_argument("--root", default=None, help="the repository root (default: this tool's checkout)")


def run_command(args: argparse.Namespace) -> int:
    """Render (or check) and report one line per file on stdout; 0, or 1 when `--check` found a difference."""
    outcomes = render(args.root, check=args.check)
    for o in outcomes:
        state = ("differs from its rendering" if args.check else "rendered anew") if o.changed else "up to date"
        print(f"{o.path}: {o.regions} rendered regions, {state}")
    stale = [o for o in outcomes if o.changed]
    if args.check and stale:
        print("".join(o.diff for o in stale), file=sys.stderr)
        print("run `python -m tools.findings` to render them", file=sys.stderr)
        return 1
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m tools.findings [--check] [--root DIR]`."""
    parser = argparse.ArgumentParser(prog="python -m tools.findings", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_command(args)
    except (ValueError, OSError) as err:
        print(f"python -m tools.findings: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
