"""Build the tutorial notebooks: each notebooks/NN_name.py (jupytext percent format, the source to edit) becomes
notebooks/NN_name.ipynb, executed, with its outputs and figures.

    python notebooks/build.py                  # all of them, full settings (what is committed)
    python notebooks/build.py 03_two_layer     # one of them
    python notebooks/build.py --quick --out /tmp/nb   # tiny budgets (MARKOV_INTERP_QUICK=1), a smoke test

Each notebook runs in a fresh kernel of this interpreter inside a new temporary folder, so its run folders
(`runs/tutorial/...`, relative) start from scratch and the outputs are the same on every build (same seeds,
same numbers). tests/test_notebooks.py checks that the committed notebooks match their sources and that every
source still runs at quick settings.
"""

import argparse
import os
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


# The kernel's environment (beside MARKOV_INTERP_QUICK): tqdm.auto warns in a kernel without ipywidgets, a
# line of noise in every committed notebook (progress bars are off in the tutorials anyway).
_KERNEL_ENV = {"MARKOV_INTERP_QUICK": "0", "PYTHONWARNINGS": "ignore:IProgress not found"}


def execute(source: Path, *, quick: bool, folder: Path | None = None, timeout: int = 3600):
    """Run `source` top to bottom in a fresh kernel inside `folder` (default a new temporary folder); the
    executed notebook.

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
    nb.metadata["markov_interp"] = {"quick": quick}
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="notebooks to build (e.g. 02_single_layer); default all")
    parser.add_argument("--quick", action="store_true", help="tiny budgets (MARKOV_INTERP_QUICK=1)")
    parser.add_argument("--out", type=Path, default=HERE, help="folder for the .ipynb files (default notebooks/)")
    args = parser.parse_args(argv)
    import nbformat

    chosen = [s for s in sources() if not args.names or s.stem in args.names]
    unknown = set(args.names) - {s.stem for s in chosen}
    if unknown:
        parser.error(f"unknown notebooks {sorted(unknown)}; expected some of {[s.stem for s in sources()]}")
    args.out.mkdir(parents=True, exist_ok=True)
    for source in chosen:
        start = time.perf_counter()
        nb = execute(source, quick=args.quick)
        target = args.out / f"{source.stem}.ipynb"
        tmp = target.with_suffix(".ipynb.tmp")
        nbformat.write(nb, tmp)
        os.replace(tmp, target)  # atomic: a failed build leaves the previous notebook in place
        print(f"wrote {target} ({time.perf_counter() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
