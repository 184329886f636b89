"""Averages over a source's random kernels: E[entropy rate] and E[H(pi)] (`expected_kernel_references`).

For a finite pool the exact averages over its kernels; for fresh Dirichlet kernels by quadrature for two states of
order 1 (p, q ~ Beta(alpha, alpha), a 2-D Gauss rule), else by Monte Carlo with control variates to 1e-4, cached
on disk (`theory.cache`).
"""

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from markov_interp._display import displayed
from markov_interp.sources import KernelSource, PoolKernels
from markov_interp.sources.contexts import block_sizes, kernel_bytes
from markov_interp.sources.contexts import solve_stationary as _solve_stationary
from markov_interp.theory._stats import MAX_KERNELS, _control_variate_mean
from markov_interp.theory.cache import _KernelEntry, _disk_cache_read, _disk_cache_write
from markov_interp.theory.fixed import _check_source, entropy


@displayed(line=lambda k: f"E[entropy rate] {k.entropy_rate:.4f} +- {k.entropy_rate_se:.1e}, E[H(pi)] {k.oracle_unigram_loss:.4f} "
                          f"+- {k.oracle_unigram_loss_se:.1e} ({k.method})")
@dataclasses.dataclass(frozen=True)
class KernelExpectations:
    """E[entropy rate] and E[H(pi)] over random kernels, with their errors (`method`: "quadrature" or
    "monte carlo").

    E[H(pi)] is the loss of an oracle that knows each sequence's pi: `oracle_unigram_loss`, the name it has in
    `ReferenceLosses` too, where `unigram_loss` is the in-context unigram estimator's loss for random kernels.
    (This field was called `unigram_loss` here; that name still reads it, and caches written under it load.)
    """

    entropy_rate: float
    entropy_rate_se: float
    oracle_unigram_loss: float
    oracle_unigram_loss_se: float
    method: str

    @property
    def unigram_loss(self) -> float:
        """Old name of `oracle_unigram_loss` (E[H(pi)], not the in-context unigram loss)."""
        return self.oracle_unigram_loss

    @property
    def unigram_loss_se(self) -> float:
        """Old name of `oracle_unigram_loss_se`."""
        return self.oracle_unigram_loss_se

    def cache_dict(self) -> dict[str, Any]:
        """The values under the names the disk cache has always used (so existing cache entries stay valid)."""
        return {"entropy_rate": self.entropy_rate, "entropy_rate_se": self.entropy_rate_se,
                "unigram_loss": self.oracle_unigram_loss, "unigram_loss_se": self.oracle_unigram_loss_se,
                "method": self.method}

    @classmethod
    def from_cache_dict(cls, data: Mapping[str, Any]) -> "KernelExpectations":
        """Read `cache_dict` back."""
        return cls(entropy_rate=data["entropy_rate"], entropy_rate_se=data["entropy_rate_se"],
                   oracle_unigram_loss=data["unigram_loss"], oracle_unigram_loss_se=data["unigram_loss_se"],
                   method=data["method"])


@functools.lru_cache(maxsize=16)
def _beta_nodes(alpha: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss nodes and weights for E[f(p)], p ~ Beta(alpha, alpha), accurate for f with log singularities at
    0 and 1 (entropies). Each half [0, 1/2] is mapped from u in [0, 1] by p = u**m / 2 with m = k / alpha
    (k = max(1, ceil(2 alpha))): the density's p**(alpha - 1) becomes the polynomial u**(k - 1) and m >= 2
    smooths the logs, so Gauss-Legendre in u converges fast."""
    x, w = np.polynomial.legendre.leggauss(n)
    u, w = (x + 1) / 2, w / 2
    k = max(1, math.ceil(2 * alpha))
    m = k / alpha
    p = 0.5 * u**m
    log_beta = 2 * math.lgamma(alpha) - math.lgamma(2 * alpha)
    wp = w * 0.5**alpha * m * u ** (k - 1) * (1 - p) ** (alpha - 1) / math.exp(log_beta)
    return np.concatenate([p, 1 - p[::-1]]), np.concatenate([wp, wp[::-1]])


def _binary_h(x: np.ndarray) -> np.ndarray:
    return -(special_xlogx(x) + special_xlogx(1 - x))


def special_xlogx(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)


def _binary_quadrature(alpha: float, n: int) -> tuple[float, float]:
    p, w = _beta_nodes(alpha, n)
    pp, qq = np.meshgrid(p, p, indexing="ij")
    weights = np.outer(w, w)
    rate = (qq * _binary_h(pp) + pp * _binary_h(qq)) / (pp + qq)  # (q h(p) + p h(q)) / (p + q)
    return float((weights * rate).sum()), float((weights * _binary_h(pp / (pp + qq))).sum())


def _binary_kernel_expectations(alpha: float, n: int = 256) -> KernelExpectations:
    """Two states, order 1: E over p, q ~ Beta(alpha, alpha) of the entropy rate and H(pi) by a 2-D Gauss
    rule; the error is estimated as the change from half the nodes (the rule converges much faster)."""
    rate, hpi = _binary_quadrature(alpha, n)
    rate_half, hpi_half = _binary_quadrature(alpha, n // 2)
    eps = 1e-12  # float rounding of the sums
    return KernelExpectations(rate, abs(rate - rate_half) + eps, hpi, abs(hpi - hpi_half) + eps, "quadrature")


def _mc_kernel_expectations(vocab: int, order: int, alpha: float, seed: int, tol: float,
                            max_kernels: int = MAX_KERNELS, zero_diagonal: bool = False,
                            support: tuple | None = None) -> KernelExpectations:
    """E[entropy rate] and E[H(pi)] over Dirichlet(alpha) kernels by Monte Carlo, in chunks of 2**18 kernels
    until both standard errors are below `tol`. Two controls with exact means cut the variance about 3x:
    the mean row entropy (E = psi(V alpha + 1) - psi(alpha + 1)) and the spread sum_x (m_x - 1/V)**2 of the
    mean row m (E = (V - 1) / (V (V alpha + 1) V**k)). `zero_diagonal` (order 1): rows Dirichlet(alpha) over
    the other V - 1 states; the means become psi(W alpha + 1) - psi(alpha + 1) and (V - 2) / (V W (W alpha + 1))
    with W = V - 1 (each m_x averages the V - 1 entries P(c, x), c != x, of variance (W - 1) / (W^2 (W alpha + 1)),
    over V rows). Any other `support` ([V**k, V] booleans, W allowed states in every row, `_prior_support`): the
    first mean with that W, the second `_spread_mean`'s."""
    n_ctx = vocab**order
    width = vocab - 1 if zero_diagonal else vocab  # states per row
    spread = ((vocab - 2) / (vocab * width * (width * alpha + 1)) if zero_diagonal
              else (vocab - 1) / (vocab * (vocab * alpha + 1) * n_ctx))
    if support is not None:
        allowed = np.array(support, dtype=np.float64)
        width, spread = int(allowed[0].sum()), _spread_mean(allowed, alpha)
    known = np.array([
        float(torch.special.digamma(torch.tensor(width * alpha + 1.0, dtype=torch.float64))
              - torch.special.digamma(torch.tensor(alpha + 1.0, dtype=torch.float64))),
        spread,
    ])
    mask = 1.0 - np.eye(vocab) if zero_diagonal else 1.0 if support is None else allowed
    rng = np.random.default_rng([seed, 16])
    moments, n, chunk = np.zeros((5, 5)), 0, 1 << 18
    while True:
        # the chunk's kernels are drawn and reduced block by block (memory ~ contexts.BLOCK_BYTES, not 2**18 V**(k+1));
        # numpy draws them as one call would, so z and the estimates are the unblocked ones, bit for bit
        sizes = block_sizes(chunk, kernel_bytes(n_ctx, vocab))
        z = torch.cat([_kernel_moment_rows(rng.standard_gamma(alpha, size=(size, n_ctx, vocab)).clip(1e-300) * mask)
                       for size in sizes]).numpy()
        moments += z.T @ z
        n += chunk
        est, se = _control_variate_mean(moments, n, known, 2)
        if se.max() < tol or n >= max_kernels:
            return KernelExpectations(float(est[0]), float(se[0]), float(est[1]), float(se[1]), "monte carlo")


def _spread_mean(allowed: np.ndarray, alpha: float) -> float:
    """E[sum_x (m_x - 1/V)**2], m the mean row of a kernel whose row c is Dirichlet(alpha) over the W states
    `allowed[c]` allows (every row W). Each P(c, x) allowed has mean 1/W and variance (W - 1) / (W**2 (W alpha + 1))
    and the rows are independent, so m_x has mean a_x = n_x / (C W) and variance n_x (W - 1) / (C**2 W**2 (W alpha
    + 1)), with n_x the rows allowing x and C the rows; the expectation is sum_x var(m_x) + (a_x - 1/V)**2. (For
    every state allowed or all but the diagonal this is the closed form `_mc_kernel_expectations` states.)"""
    n_ctx, vocab = allowed.shape
    width = allowed[0].sum()
    n_x = allowed.sum(0)
    var = n_x * (width - 1) / (n_ctx**2 * width**2 * (width * alpha + 1))
    return float((var + (n_x / (n_ctx * width) - 1.0 / vocab) ** 2).sum())


def _kernel_moment_rows(gam: np.ndarray) -> Float[Tensor, "kernel 5"]:
    """Per kernel (normalised Gamma draws `gam` [kernel, context, V], zero where a transition is not allowed) the
    row (1, mean row entropy, spread of the mean row, entropy rate, H(pi)) of `_mc_kernel_expectations`'
    moments."""
    vocab = gam.shape[-1]
    kernels = torch.from_numpy(gam / gam.sum(-1, keepdims=True))
    pi = _solve_stationary(kernels)
    rows_h = entropy(kernels)
    rate = (pi * rows_h).sum(-1)
    hpi = entropy(pi.reshape(len(kernels), -1, vocab).sum(1))  # law of the last state
    spread = ((kernels.mean(-2) - 1.0 / vocab) ** 2).sum(-1)
    return torch.stack([torch.ones_like(rate), rows_h.mean(-1), spread, rate, hpi], 1)


def expected_kernel_references(source: KernelSource, *, seed: int = 0, tol: float = 1e-4) -> KernelExpectations:
    """E[entropy rate] and E[H(pi)] over the kernels of a random-kernel source (`RandomMarkov`): for a finite
    pool the exact averages over its kernels; for fresh Dirichlet kernels by quadrature for two states of order 1
    (error ~1e-9), else by Monte Carlo to a standard error below `tol` (cached)."""
    _check_source(source)
    if source.alpha is None:
        raise ValueError(f"expected a source with random kernels (RandomMarkov), got {type(source).__name__}")
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol!r}")
    if source.pool is not None:
        return _pool_expectations(source.pool)
    support = _prior_support(source)
    return _kernel_expectations_cached(source.vocab, source.order, source.alpha, seed, float(tol),
                                       support is True, None if isinstance(support, bool) else support)


def _prior_support(source: KernelSource) -> bool | tuple:
    """The support of the source's prior, as the kernel expectations are keyed on it: False for every transition
    allowed, True for all but the self-transitions (`RandomMarkov(zero_diagonal=True)`), else the [V**k, V] booleans
    as nested tuples (e.g. `CyclicMarkov`'s). The Monte Carlo's control variate needs every row to allow the same
    number of states; a ValueError for other supports."""
    support = source.support
    if support is None:
        return False
    support = support.cpu()
    if source.order == 1 and torch.equal(support, ~torch.eye(source.vocab, dtype=torch.bool)):
        return True
    widths = support.sum(-1)
    if not (widths == widths[0]).all() or int(widths[0]) < 2:
        raise ValueError("reference losses are computed for priors whose rows each allow the same number (>= 2) of "
                         f"states, not for the support {support.int().tolist()}")
    return tuple(tuple(bool(x) for x in row) for row in support.tolist())


def _pool_expectations(pool: PoolKernels) -> KernelExpectations:
    """The entropy rate and H(pi) averaged over the kernels of a pool (each drawn with probability 1/N): exact."""
    pi = _solve_stationary(pool.to(torch.float64))
    rate = (pi * entropy(pool)).sum(-1)
    hpi = entropy(pi.reshape(pool.shape[0], -1, pool.shape[-1]).sum(1))
    return KernelExpectations(float(rate.mean()), 0.0, float(hpi.mean()), 0.0, "pool")


@functools.lru_cache(maxsize=64)
def _kernel_expectations_cached(vocab: int, order: int, alpha: float, seed: int, tol: float,
                                zero_diagonal: bool = False, support: tuple | None = None) -> KernelExpectations:
    if vocab == 2 and order == 1 and not zero_diagonal and support is None:
        return _binary_kernel_expectations(alpha)
    key = {"what": "kernel-expectations", "vocab": vocab, "order": order, "alpha": alpha, "seed": seed, "tol": tol,
           **({"zero_diagonal": True} if zero_diagonal else {}),  # full support: the keys as before
           **({"support": support} if support is not None else {})}
    cached = _disk_cache_read(key, _KernelEntry)
    if cached is not None:
        return KernelExpectations.from_cache_dict(cached)
    out = _mc_kernel_expectations(vocab, order, alpha, seed, tol, zero_diagonal=zero_diagonal, support=support)
    _disk_cache_write(key, out.cache_dict())
    return out

