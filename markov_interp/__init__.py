"""markov-interp: mechanistic interpretability of transformers trained on Markov chains.

The package is a pipeline, one module per stage (each imports only stages to its left):

    data -> theory -> landscape -> models -> training -> probes -> report -> sweep,   cli on top.

`config` sits under them all: the one base of the source, model, training, run and sweep configs.

References: Makkuva et al., "Attention with Markov" (arXiv 2402.04161); "Local to Global" (arXiv 2406.03072);
Olsson et al. 2022 and Edelman et al. 2024 on (statistical) induction heads.
"""

__version__ = "0.1.0"
