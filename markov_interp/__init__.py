"""markov-interp: mechanistic interpretability of transformers trained on Markov chains.

The package is a pipeline, one module or sub-package per stage, each importing only the stages to its left
(tests/project/test_imports.py holds this line against the real imports, function-level ones included):

    sources -> theory -> landscape -> models -> clamps -> runs -> training -> probes -> dynamics -> sweep -> report
            -> experiments -> cli

`sources` are the data (one class per kind, registered by name); `theory` gives their exact laws and reference
losses (`landscape`: the one-layer model's canonical reduction); `clamps` freezes and clamps activations during
training; `runs` is what a run is (`RunConfig`) and its folder, read and written, so that probes, report and
sweeps read run folders without importing `training`; `experiments` are the registered studies, the paper's reproduction among them.

Under them all: `config` (the one base of the source, model, training, run, sweep and budget configs), `devices`,
`streams` (the counter-based random streams every sampler draws from) and the private helpers `_io`, `_display`,
`_workers`, `_threads` and `_plan` (the memory plan).

Torch's CPU threads: training and the probes run a model of under a million parameters on one thread (the
package's models are far smaller: more threads only spin, `benchmarks/bench_threads.py`); `set_threads(n)` chooses
a count for everything, `with threads(n):` for a block.

References: Makkuva et al., "Attention with Markov" (arXiv 2402.04161); "Local to Global" (arXiv 2406.03072);
Olsson et al. 2022 and Edelman et al. 2024 on (statistical) induction heads.
"""

__version__ = "0.1.0"

from markov_interp._threads import set_threads, threads  # noqa: E402  (imports no torch until called)

__all__ = ["quick_mode", "set_threads", "threads"]


def quick_mode() -> bool:
    """Whether the tutorials (notebooks/) run on tiny budgets: True when the environment variable
    MARKOV_INTERP_QUICK is set to anything but "" or "0" (the notebook tests and `python notebooks/build.py
    --quick` set it). Tiny budgets run the code path in seconds; their numbers do not show the paper's results.
    """
    import os

    return os.environ.get("MARKOV_INTERP_QUICK", "0") not in ("", "0")
