"""Monte Carlo summaries shared by the reference estimates: means with standard errors and control-variate
coefficients."""

import numpy as np
import torch
from torch import Tensor

# The largest draws of the Monte Carlo estimates (each stops earlier once its standard errors are below its tol);
# the reference cache bounds a stored standard error by them (`cache._InContextEntry`)
MAX_KERNELS = 1 << 24  # kernels of E[entropy rate] and E[H(pi)] (`expectations._mc_kernel_expectations`)
MAX_SEQUENCES = 1 << 18  # sequences of the in-context and pool-Bayes losses (`in_context`, `pools`)


def _control_variate_mean(moments: np.ndarray, n: int, known: np.ndarray, n_targets: int) -> tuple:
    """Regression control-variate estimates of E[y_j] from accumulated moments of z = (1, c, y).

    `moments` = sum z z^T over n draws, c the controls (exact means `known`), y the targets (last
    `n_targets` entries). Returns (means, standard errors) of the targets: ybar - b (cbar - E[c]) with b the
    least-squares coefficient, the standard error from the residual variance (O(1/n) bias, negligible here)."""
    mean = moments[0] / n
    cov = moments[1:, 1:] / n - np.outer(mean[1:], mean[1:])
    n_c = cov.shape[0] - n_targets
    scc, scy, syy = cov[:n_c, :n_c], cov[:n_c, n_c:], cov[n_c:, n_c:]
    b = np.linalg.solve(scc, scy)  # [controls, targets]
    est = mean[1 + n_c:] - (mean[1:1 + n_c] - known) @ b
    resid = np.clip(np.diag(syy - scy.T @ b), 0.0, None)
    return est, np.sqrt(resid / (n - n_c - 1))


def _control_coefficients(values: Tensor, controls: Tensor) -> Tensor:
    """Per curve and target the variance-minimising coefficient b = Cov(value, control) / Var(control) of
    `value - b (control - E[control])`: about 1 late in the sequence, 0 where the value is exact (t = 0)."""
    v = values - values.mean(1, keepdim=True)
    c = controls - controls.mean(1, keepdim=True)
    var = (c * c).mean(1)
    return torch.where(var > 0, (v * c).mean(1) / var.clamp_min(1e-300), torch.zeros_like(var))


def _mean_se(total: Tensor, total_sq: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """Mean and its standard error from a sum and a sum of squares over n draws."""
    mean = total / n
    var = (total_sq / n - mean**2).clamp_min(0) * n / max(n - 1, 1)
    return mean, (var / n).sqrt()
