"""Rendered regions of markdown files: the marker syntax, the block registry, rendering and checking.

A region of a markdown file is rendered when it sits between

    <!-- rendered: NAME (source: PATH[, PATH ...]) -->
    ...
    <!-- /rendered -->

on lines of their own. NAME is a registered `Block`; rendering replaces the region's text with what the block's
function returns for its sources (paths relative to the repository root) and rewrites the opening marker with the
block's sources, so the file always names what it was made from. Text outside the regions is never touched.
"""

import dataclasses
import difflib
import importlib
import re
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

from markov_interp._io import atomic_write

__all__ = ["Block", "BLOCKS", "blocks", "block", "wrap", "WIDTH", "FindingNoLongerHolds", "holds", "Region",
           "regions", "render_text", "Outcome", "render_files"]

_OPEN = re.compile(r"^<!-- rendered: (?P<name>[A-Za-z0-9_.-]+)(?: \(source: (?P<sources>[^)]*)\))? -->$")
_CLOSE = "<!-- /rendered -->"


@dataclasses.dataclass(frozen=True)
class Block:
    """A rendered region's recipe: its name, the result files it is made from (relative to the repository root)
    and the function that turns them (as absolute paths, in order) into markdown."""

    name: str
    sources: tuple[str, ...]
    render: Callable[..., str]

    def marker(self) -> str:
        """The opening marker line."""
        return f"<!-- rendered: {self.name} (source: {', '.join(self.sources)}) -->"

    def text(self, root: Path) -> str:
        """The block's markdown for the files under `root` (no leading or trailing blank line)."""
        paths = [root / s for s in self.sources]
        missing = [str(p) for p in paths if not p.exists()]
        if missing:
            raise FileNotFoundError(f"rendered block {self.name!r}: its source {', '.join(missing)} does not exist")
        return wrap(self.render(*paths).strip("\n"))


BLOCKS: dict[str, Block] = {}
# the modules of this tool that register blocks
BLOCK_MODULES = ("reproduction", "interventions", "recipes", "icl", "hidden", "readme")


def blocks() -> dict[str, Block]:
    """Every registered block by name (importing the modules that register them: rendering needs the package's
    statistics, the command line's start does not)."""
    for module in BLOCK_MODULES:
        importlib.import_module(f"tools.findings.{module}")
    return BLOCKS
WIDTH = 115  # the docs' line width: rendered prose is wrapped to it (tables are not)
_ITEM = re.compile(r"^(\s*(?:[-*] |\d+\. )?)")
_OPENS_BLOCK = re.compile(r"(>.*|#+|[-+*]|\d+[.)]|=+|`{3}.*)")  # markdown reads these at a line start as a block
_GLUE = "\x00"


def wrap(text: str, width: int = WIDTH) -> str:
    """Markdown prose wrapped to `width`, a list item's lines indented under its text; table rows, headings and
    blank lines kept as they are.

    >>> print(wrap("- one two three four", width=12))
    - one two
      three four
    >>> print(wrap("a shift >+270 steps", width=8))  # never a line that opens a quote
    a
    shift >+270
    steps
    """
    out = []
    for line in text.split("\n"):
        if len(line) <= width or line.lstrip().startswith(("|", "#", "<!--", "```")):
            out.append(line)
            continue
        lead = _ITEM.match(line).group(1)
        words = line[len(lead):].split(" ")
        # a word that would open a quote, heading or list at the start of a line stays with the word before it
        glued = [words[0]]
        for word in words[1:]:
            if _OPENS_BLOCK.fullmatch(word):
                glued[-1] += _GLUE + word
            else:
                glued.append(word)
        filled = textwrap.fill(lead + " ".join(glued), width, subsequent_indent=" " * len(lead),
                               break_long_words=False, break_on_hyphens=False)
        out.append(filled.replace(_GLUE, " "))
    return "\n".join(out)


def block(name: str, *sources: str) -> Callable[[Callable[..., str]], Callable[..., str]]:
    """Register the decorated function as the block `name` made from `sources` (paths relative to the repository
    root); it is called with their absolute paths and returns markdown.

    >>> @block("doctest-example", "docs/reproduction/results.csv")
    ... def _example(path):
    ...     return f"made from {path.name}"
    >>> BLOCKS["doctest-example"].render(Path("results.csv"))
    'made from results.csv'
    >>> del BLOCKS["doctest-example"]
    """
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"a block name is letters, digits, '_', '.' and '-', got {name!r}")
    if not sources:
        raise ValueError(f"block {name!r}: name the result files it is made from")

    def register(render: Callable[..., str]) -> Callable[..., str]:
        known = BLOCKS.get(name)
        if known is not None and known.render.__module__ != render.__module__:
            raise ValueError(f"rendered block {name!r} is registered twice ({known.render.__module__} and "
                             f"{render.__module__})")
        BLOCKS[name] = Block(name, tuple(sources), render)
        return render

    return register


class FindingNoLongerHolds(ValueError):
    """A rendered finding's wording no longer fits the numbers its source gives."""


def holds(condition: bool, claim: str) -> None:
    """Refuse to render the sentence `claim` when `condition` (what its words assert about the numbers) is false:
    a finding whose source changed must be reworded by hand, not printed with numbers that contradict it."""
    if not condition:
        raise FindingNoLongerHolds(f"the finding {claim!r} no longer holds on its source: reword it")


@dataclasses.dataclass(frozen=True)
class Region:
    """A rendered region of a file: its block name, the line of its opening marker (1-based) and its text
    between the markers."""

    name: str
    line: int
    body: str


def _parse(text: str, where: str) -> list[tuple[int, int, str]]:
    """(first line index, closing line index, name) of each region; ValueError for bad nesting."""
    found, opened = [], None
    for i, line in enumerate(text.split("\n")):
        match = _OPEN.match(line)
        if match or line.startswith("<!-- rendered:"):
            if match is None:
                raise ValueError(f"{where}:{i + 1}: a rendered marker must read '<!-- rendered: NAME (source: "
                                 f"PATH) -->', got {line!r}")
            if opened is not None:
                raise ValueError(f"{where}:{i + 1}: rendered block {match['name']!r} opens inside "
                                 f"{opened[1]!r} (line {opened[0] + 1}): close that one first")
            opened = (i, match["name"])
        elif line == _CLOSE:
            if opened is None:
                raise ValueError(f"{where}:{i + 1}: '{_CLOSE}' closes no rendered block")
            found.append((opened[0], i, opened[1]))
            opened = None
    if opened is not None:
        raise ValueError(f"{where}:{opened[0] + 1}: rendered block {opened[1]!r} is never closed ('{_CLOSE}')")
    return found


def regions(text: str, where: str = "<text>") -> list[Region]:
    """The rendered regions of a markdown text, in order.

    >>> [r.name for r in regions("a\\n<!-- rendered: x (source: f) -->\\nold\\n<!-- /rendered -->\\nb")]
    ['x']
    """
    lines = text.split("\n")
    return [Region(name, start + 1, "\n".join(lines[start + 1:end])) for start, end, name in _parse(text, where)]


def render_text(text: str, root: Path, where: str = "<text>", cache: Optional[dict] = None) -> str:
    """`text` with every rendered region made again from its block's sources under `root`.

    Args:
        text: a markdown file's text.
        root: the repository root the sources are relative to.
        where: the file's name, for error messages.
        cache: {block name: markdown} shared across files (a block used twice is rendered once).

    Returns:
        The text; regions replaced, everything else as it was. ValueError naming the file and line for an unknown
        block or a bad marker; a block's own errors name the block.
    """
    cache = {} if cache is None else cache
    known = blocks()
    lines = text.split("\n")
    out, last = [], 0
    for start, end, name in _parse(text, where):
        if name not in known:
            raise ValueError(f"{where}:{start + 1}: unknown rendered block {name!r}; the blocks are "
                             f"{sorted(known)}")
        if name not in cache:
            cache[name] = known[name].text(root)
        out += lines[last:start] + [known[name].marker(), *cache[name].split("\n"), _CLOSE]
        last = end + 1
    return "\n".join(out + lines[last:])


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What rendering one file found: whether its committed text differs from the rendering, and the diff."""

    path: Path  # relative to the root
    regions: int
    changed: bool
    diff: str


def render_files(root: Path, files: Sequence[str], *, write: bool) -> list[Outcome]:
    """Render every region of `files` (relative to `root`); with `write`, save each changed file atomically.

    Args:
        root: the repository root.
        files: the markdown files.
        write: write the rendering (False: only compare, as `--check`).

    Returns:
        One `Outcome` per file, in order."""
    cache: dict[str, str] = {}
    outcomes = []
    for name in files:
        path = root / name
        text = path.read_text()
        new = render_text(text, root, where=name, cache=cache)
        diff = "".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True), f"{name} (committed)",
                                            f"{name} (rendered)", n=1))
        if write and new != text:
            atomic_write(path, new)
        outcomes.append(Outcome(Path(name), len(regions(text, name)), new != text, diff))
    return outcomes
