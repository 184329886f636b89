"""markov-interp: mechanistic interpretability of transformers trained on Markov chains.

The package is a pipeline, one module per stage (each imports only stages to its left):

    sources -> theory -> landscape -> models -> runs -> training -> probes -> report -> sweep,   cli on top.

`runs` is what a run is (`RunConfig`) and its folder, read and written: probes, report and sweeps read run folders
without importing `training`.

`config` sits under them all: the one base of the source, model, training, run and sweep configs.

References: Makkuva et al., "Attention with Markov" (arXiv 2402.04161); "Local to Global" (arXiv 2406.03072);
Olsson et al. 2022 and Edelman et al. 2024 on (statistical) induction heads.
"""

__version__ = "0.1.0"


def quick_mode() -> bool:
    """Whether the tutorials (notebooks/) run on tiny budgets: True when the environment variable
    MARKOV_INTERP_QUICK is set to anything but "" or "0" (the notebook tests and `python notebooks/build.py
    --quick` set it). Tiny budgets run the code path in seconds; their numbers do not show the paper's results.
    """
    import os

    return os.environ.get("MARKOV_INTERP_QUICK", "0") not in ("", "0")
