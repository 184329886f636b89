"""Training configs, whose home is `markov_interp.runs.config` (a run folder's config.json is a `RunConfig`, read
without the training package); this module re-exports them under their first name."""

from markov_interp.runs.config import *  # noqa: F403
from markov_interp.runs.config import COMPILE_MODES, PRECISIONS, __all__  # noqa: F401
