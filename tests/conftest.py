"""Shared test setup: one torch thread per test process.

The models here are tiny; on a small shared CPU, torch's default thread pool makes them several times slower
(measured ~10x on the 2-core CI machine), and pytest-xdist already runs one process per core.
"""

import torch

torch.set_num_threads(1)
