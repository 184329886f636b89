"""Build the tutorial notebooks: each notebooks/NN_name.py (jupytext percent format, the source to edit) becomes
notebooks/NN_name.ipynb, executed, with its outputs and figures.

    python notebooks/build.py                  # all of them, full settings (what is committed)
    python notebooks/build.py 03_two_layer     # one of them
    python notebooks/build.py --quick          # tiny budgets, a smoke test: written into a new temporary folder
    MARKOV_INTERP_QUICK=1 python notebooks/build.py 01_quickstart --out /tmp/nb   # the same as --quick

Quick builds (`--quick`, or MARKOV_INTERP_QUICK set as `markov_interp.quick_mode()` reads it) never write into
notebooks/: their numbers are not the committed ones. They go to `--out`, by default a new temporary folder
(printed).

Each notebook runs in a fresh kernel of this interpreter inside a new temporary folder, so its run folders
(`runs/tutorial/...`, relative) start from scratch and the outputs are the same on every build (same seeds,
same numbers). tests/project/test_notebooks.py checks that the committed notebooks match their sources and that every
source still runs at quick settings.
"""

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def sources() -> list[Path]:
    """The notebooks' sources, in order: notebooks/NN_name.py."""
    return sorted(p for p in HERE.glob("[0-9][0-9]_*.py"))


def to_notebook(source: Path):
    """The notebook (no outputs) that `source` describes, as jupytext reads it."""
    import jupytext

    return jupytext.read(source)


# The kernel's environment (beside MARKOV_INTERP_QUICK): tqdm.auto warns in a kernel without ipywidgets (the
# `notebook` extra), a line of noise in every committed notebook; the bars themselves are stripped (`strip_progress`).
_KERNEL_ENV = {"MARKOV_INTERP_QUICK": "0", "PYTHONWARNINGS": "ignore:IProgress not found"}


_BAR = re.compile(r"\d+%\|.*\|\s*\d+/\d+")  # a tqdm text bar: "path patching:  52%|#####     | 13/25 [...]"
_WIDGET = "application/vnd.jupyter.widget-view+json"


def is_progress(output: dict) -> bool:
    """Whether a cell output is a progress bar: a tqdm widget (ipywidgets installed) or a text bar on stderr."""
    if output.get("output_type") == "stream":
        text = output.get("text", "")  # a bar, or the blank line a closed bar (leave=False) overwrites it with
        return output.get("name") == "stderr" and (bool(_BAR.search(text)) or ("\r" in text and not text.strip()))
    return _WIDGET in output.get("data", {})


def strip_progress(nb) -> int:
    """Remove every progress-bar output from the executed notebook `nb` (and the widgets' saved state, which only
    the bars use): a bar is live feedback while a cell runs, noise in the saved file. Returns how many went."""
    gone = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            kept = [o for o in cell.outputs if not is_progress(o)]
            gone += len(cell.outputs) - len(kept)
            cell.outputs = kept
    nb.metadata.pop("widgets", None)
    return gone


def execute(source: Path, *, quick: bool, folder: Path | None = None, timeout: int = 3600):
    """Run `source` top to bottom in a fresh kernel inside `folder` (default a new temporary folder); the
    executed notebook, without its progress bars (`strip_progress`).

    `quick` sets MARKOV_INTERP_QUICK=1 for the kernel (read by `markov_interp.quick_mode()`); the build's
    settings are recorded in the notebook's metadata ("markov_interp": {"quick": ...}).
    """
    import nbclient

    nb = to_notebook(source)
    saved = {key: os.environ.get(key) for key in _KERNEL_ENV}
    os.environ.update(_KERNEL_ENV, MARKOV_INTERP_QUICK="1" if quick else "0")
    try:
        with tempfile.TemporaryDirectory(prefix="markov-interp-notebook-") as scratch:
            client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                             resources={"metadata": {"path": str(folder or scratch)}})
            client.execute()  # raises CellExecutionError naming the failing cell
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    strip_progress(nb)
    nb.metadata["markov_interp"] = {"quick": quick}
    return nb


def settings(quick_flag: bool, out: Path | None) -> tuple[bool, Path]:
    """(quick, output folder) of a build: quick when `--quick` is given or MARKOV_INTERP_QUICK asks for it;
    full builds write into notebooks/ by default, quick ones into a new temporary folder, never notebooks/."""
    from markov_interp import quick_mode

    quick = quick_flag or quick_mode()
    if out is None:
        out = Path(tempfile.mkdtemp(prefix="markov-interp-notebooks-")) if quick else HERE
    if quick and out.resolve() == HERE:
        raise ValueError(f"a quick build (tiny budgets) never overwrites the committed notebooks in {HERE}; "
                         "give another --out, or unset MARKOV_INTERP_QUICK for a full build")
    return quick, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="notebooks to build (e.g. 02_single_layer); default all")
    parser.add_argument("--quick", action="store_true",
                        help="tiny budgets (also when MARKOV_INTERP_QUICK is set); never written into notebooks/")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the .ipynb files (default notebooks/; quick builds: a new temporary folder)")
    args = parser.parse_args(argv)
    import nbformat

    chosen = [s for s in sources() if not args.names or s.stem in args.names]
    unknown = set(args.names) - {s.stem for s in chosen}
    if unknown:
        parser.error(f"unknown notebooks {sorted(unknown)}; expected some of {[s.stem for s in sources()]}")
    try:
        quick, args.out = settings(args.quick, args.out)
    except ValueError as err:
        parser.error(str(err))
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"building {len(chosen)} notebook(s) at {'quick' if quick else 'full'} settings into {args.out}", flush=True)
    for source in chosen:
        start = time.perf_counter()
        nb = execute(source, quick=quick)
        target = args.out / f"{source.stem}.ipynb"
        tmp = target.with_suffix(".ipynb.tmp")
        nbformat.write(nb, tmp)
        os.replace(tmp, target)  # atomic: a failed build leaves the previous notebook in place
        print(f"wrote {target} ({time.perf_counter() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
