"""Experiments beyond the paper's grids: each a module of this package, run by `python -m markov_interp.experiments`
(or `markov-interp reproduce --extras`).

- `interventions`: freezes and clamps during training (issue 14's three experiments).
"""

from markov_interp.experiments.interventions import *  # noqa: F401,F403 -- the public names of the first experiment
from markov_interp.experiments.interventions import __all__, main  # noqa: F401
