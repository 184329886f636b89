"""Experiments beyond the paper's grids: each a module of this package, run by `python -m markov_interp.experiments
[NAME] [options]` (or `markov-interp reproduce --extras`).

- `interventions` (the default, no NAME): freezes and clamps during training (issue 14's three experiments).
- `phases`: the order x depth x heads phase diagram on order-k random kernels (issue 23).
- `diversity`: task diversity, finite kernel pools from 1 to 1024 kernels against fresh ones (issue 23).
"""

import sys
from typing import Optional

from markov_interp.experiments.interventions import *  # noqa: F401,F403 -- the public names of the first experiment
from markov_interp.experiments.interventions import __all__ as _interventions_all
from markov_interp.experiments.interventions import main as _interventions_main

NAMED = ("phases", "diversity")
__all__ = [name for name in _interventions_all if name != "main"] + ["main", "NAMED"]


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m markov_interp.experiments [phases|diversity] [options]`: a named experiment's `main`, or the
    intervention experiments when the first argument names none."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in NAMED:
        import importlib

        return importlib.import_module(f"markov_interp.experiments.{argv[0]}").main(argv[1:])
    return _interventions_main(argv)
