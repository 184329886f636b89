"""Deprecated alias of `markov_interp.clamps` (freezes and clamps during training), kept for one release.

The module was renamed so that one name is not shared by three modules (`intervene`, `probes.interventions`,
`experiments.interventions`). Importing it warns (DeprecationWarning) and gives the same objects:
`intervene.Clamp is clamps.Clamp`.
"""

import warnings

from markov_interp import clamps as _clamps
from markov_interp.clamps import *  # noqa: F401,F403 (the public names, `clamps.__all__`)

__all__ = list(_clamps.__all__)

warnings.warn("markov_interp.intervene is deprecated and will be removed: it is now markov_interp.clamps",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str):  # the private helpers too, for code that reached into the old module
    return getattr(_clamps, name)
