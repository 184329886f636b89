"""Cyclic chains: a fresh cyclic chain per sequence (`CyclicMarkov`, kind "cyclic"), a random-kernel source whose
prior allows two transitions per state, so that its stationary law, entropy rate and in-context Bayes law are in
closed form.
"""

import dataclasses
from typing import ClassVar

import torch
from jaxtyping import Bool
from torch import Tensor

from markov_interp.config import check_int
from markov_interp.sources.base import InitialLaw, SourceConfig, register_source
from markov_interp.sources.dirichlet import RandomMarkov
from markov_interp.sources.fixed import _initial_arg


class CyclicMarkov(RandomMarkov):
    """A random cyclic chain per sequence: from state x the chain stays at x or moves on to x + 1 (mod V), and
    P(stay at x) = s_x ~ Beta(alpha, alpha), independently per state (each row Dirichlet(alpha) over its two allowed
    states, `support`). Its in-context task has one unknown per state, where `RandomMarkov`'s has V - 1.

    Closed forms, checked against theory in tests/sources/test_cyclic.py: the stationary law pi_x is proportional to
    1 / (1 - s_x) (each lap spends a geometric time of mean 1 / (1 - s_x) at x); the entropy rate is
    sum_x pi_x h(s_x) (h the binary entropy); with a uniform first state the Bayes predictor is
    P(stay at x | the sequence so far) = (alpha + n_stay(x)) / (2 alpha + n(x)) over the n(x) steps taken from x
    (`add_beta_predictions` over the support, its `predictive`), and the Bayes loss of a sequence is the Beta-Binomial
    marginal likelihood -sum_x log B(alpha + n_stay(x), alpha + n_move(x)) / B(alpha, alpha).

    >>> CyclicMarkov(3).support.int().tolist()
    [[1, 1, 0], [0, 1, 1], [1, 0, 1]]
    >>> tokens = CyclicMarkov(4).sample(2, 12, generator=torch.Generator().manual_seed(0))
    >>> bool((((tokens[:, 1:] - tokens[:, :-1]) % 4) <= 1).all())  # every step stays or moves on by one
    True
    """

    def __init__(self, vocab: int, alpha: float | int = 1.0, *, initial: InitialLaw = "stationary"):
        check_int("vocab", vocab, minimum=3)  # two states would be every transition: RandomMarkov(2)
        super().__init__(vocab, 1, alpha, initial=initial)

    def __repr__(self) -> str:
        return f"CyclicMarkov(vocab={self.vocab}, alpha={self.alpha})"

    @property
    def support(self) -> Bool[Tensor, "context vocab"]:
        """x -> x (stay) and x -> x + 1 mod V (move on), [V, V] booleans (the `Source` protocol)."""
        stay = torch.eye(self.vocab, dtype=torch.bool)
        return stay | stay.roll(1, dims=1)

    @property
    def config(self) -> "CyclicMarkovConfig":
        """The config that builds this source (kind "cyclic")."""
        return CyclicMarkovConfig(vocab=self.vocab, alpha=self.alpha, initial=self.initial)

    def out_of_pool(self) -> "CyclicMarkov":
        """This source (it has no pool: every sequence draws a fresh kernel)."""
        return CyclicMarkov(self.vocab, self.alpha, initial=self._initial)


@register_source("cyclic")
@dataclasses.dataclass(frozen=True, kw_only=True)
class CyclicMarkovConfig(SourceConfig):
    """a fresh cyclic chain per sequence: x stays with probability s_x ~ Beta(alpha, alpha), else moves to x + 1 (--vocab >= 3, --alpha)"""

    order: ClassVar[int] = 1
    _flat_layout: ClassVar[bool] = True

    vocab: int  # number of states, at least 3
    alpha: float | int = 1.0  # Beta(alpha, alpha) concentration of each state's stay probability
    initial: str | tuple | list = "stationary"  # "stationary", "uniform" or a law over the first state

    def build(self) -> CyclicMarkov:
        """The `CyclicMarkov`."""
        return CyclicMarkov(self.vocab, self.alpha, initial=_initial_arg(self.initial))

    @property
    def vocab_size(self) -> int:
        """`vocab`."""
        return int(self.vocab)
