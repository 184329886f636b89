"""Hidden Markov sources: tokens emitted by a chain whose state the model never sees.

A hidden Markov process is given by its labelled transition matrices T[x, i, j] = P(emit x, move to j | in i)
(Shai et al. 2024, "Transformers represent belief state geometry in their residual stream"): from hidden state i
the process emits token x and moves to hidden state j together. The hidden chain is sum_x T[x]; the first hidden
state is drawn from its stationary law, so the emitted process is stationary.

- `HiddenMarkov(matrices)`: any proper HMM (checked: shape [vocab, hidden, hidden], non-negative, each row of
  sum_x T[x] sums to 1, a unique stationary law). `hmm_preset(name, **params)` builds the named processes of
  `PRESETS`, one table: `mess3`, `rrxor`, `z1r` and `random` (Dirichlet-drawn, seeded).
- `belief_states(tokens)`: the forward filter, the posterior over the hidden state after each token: what a
  transformer trained on the process was found to hold linearly in its residual stream.
- `bayes_predictions(tokens)`: the Bayes-optimal law of the next token after each prefix; as for every source of
  the package, position t's prediction is for token t + 1 given tokens 0..t.
- `sample(batch, seq_len, generator=...)`: every sequence and position at once (hidden steps as state maps
  composed by a prefix scan, as the chain sampler does), from an explicit generator.

The exact losses these define (per-position Bayes loss, entropy rate, the losses of predicting from the last k
tokens) are in `theory.hidden`.
"""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Optional

import torch
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp.config import check_int, check_number
from markov_interp.sources.base import SourceConfig, register_source
from markov_interp.sources.contexts import check_tokens, stationary_context_law
from markov_interp.sources.sampling import _check_sizes, _compose_prefix, _gamma, _resolve_device

Tokens = Int[Tensor, "batch pos"]
Matrices = Float[Tensor, "vocab hidden hidden"]

CUSTOM = "custom"  # the process name of matrices given by the user
_ROW_SUM_TOL = 1e-6  # how far a row of sum_x T[x] may sum from 1 (as `sources.validate_kernel`)


def validate_hmm(matrices: Any) -> Matrices:
    """`matrices` as a float64 tensor [vocab, hidden, hidden] after checking it is a hidden Markov process.

    Args:
        matrices: T[x, i, j] = P(emit x, move to j | in i), array-like.

    Returns:
        A float64 copy on the CPU, each row of sum_x T[x] rescaled to sum to 1 exactly.

    Raises:
        ValueError naming the problem: not numeric, not 3-D, not square in the hidden axes, fewer than 2 tokens,
        NaN or infinite or negative entries, a row of sum_x T[x] that does not sum to 1 (tolerance 1e-6).

    >>> validate_hmm([[[0.5, 0.5]], [[0.0, 0.0]]])
    Traceback (most recent call last):
    ...
    ValueError: HMM transition matrices must have shape [vocab, hidden, hidden], got (2, 1, 2)
    """
    try:
        t = torch.as_tensor(matrices, dtype=torch.float64).detach().cpu().clone()
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"HMM transition matrices must be a numeric array, got {type(matrices).__name__}: "
                         f"{err}") from None
    if t.ndim != 3 or t.shape[1] != t.shape[2] or t.shape[1] < 1:
        raise ValueError(f"HMM transition matrices must have shape [vocab, hidden, hidden], got {tuple(t.shape)}")
    if t.shape[0] < 2:
        raise ValueError(f"an HMM needs at least 2 tokens (the first axis of T[x, i, j]), got {t.shape[0]}")
    if not torch.isfinite(t).all():
        raise ValueError("HMM transition matrices have NaN or infinite entries")
    if (t < 0).any():
        x, i, j = (int(v) for v in (t < 0).nonzero()[0])
        raise ValueError(f"HMM transition matrices have negative entries: T[{x}, {i}, {j}] = {t[x, i, j].item():.3g}")
    sums = t.sum((0, 2))
    bad = ((sums - 1).abs() > _ROW_SUM_TOL).nonzero()
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"each row of the hidden chain sum_x T[x] must sum to 1 (P(emit x, move to j | in i) "
                         f"over x and j); row {i} sums to {sums[i].item():.6g}")
    return t / sums[None, :, None]  # rows within the tolerance made exact: every law built on T sums to 1


def _stationary_law(matrices: Matrices) -> Float[Tensor, " hidden"]:
    try:
        return stationary_context_law(matrices.sum(0))
    except ValueError as err:
        raise ValueError(f"the hidden chain sum_x T[x] has no unique stationary law, so the HMM has no single "
                         f"stationary start: {err}") from None


class HiddenMarkov:
    """A hidden Markov source: labelled transition matrices T[x, i, j] = P(emit x, move to j | in i).

    The first hidden state is drawn from the stationary law of the hidden chain sum_x T[x], so every position of
    the emitted process has the same law. `vocab` tokens, `hidden` hidden states; `process` names the preset it
    came from ("custom" for user-given matrices) and `params` its parameters.

    Args:
        matrices: T, array-like [vocab, hidden, hidden] (`validate_hmm` checks it).
        process: a name for it (`hmm_preset` sets the preset's).
        params: the preset's parameters, as given to `hmm_preset`.

    >>> hmm = HiddenMarkov([[[0.9, 0.0], [0.2, 0.0]], [[0.0, 0.1], [0.0, 0.8]]])  # a chain on 2 states as an HMM
    >>> hmm.vocab, hmm.hidden, hmm.stationary, hmm.unifilar
    (2, 2, tensor([0.6667, 0.3333], dtype=torch.float64), True)
    """

    in_context = False  # one fixed law, which a model can learn in its weights (the hidden state is inferred)

    def __init__(self, matrices: Any, *, process: str = CUSTOM, params: Optional[Mapping[str, Any]] = None):
        self._matrices = validate_hmm(matrices)
        self.vocab = int(self._matrices.shape[0])
        self.hidden = int(self._matrices.shape[1])
        self.process = process
        self.params = dict(params or {})
        self._stationary = _stationary_law(self._matrices)
        # one row per hidden state i over the outcomes (x, j), x major: the filter's step and the sampler's CDF
        self._step = self._matrices.permute(1, 0, 2).reshape(self.hidden, -1)
        self._steps = {self._step.device: self._step}  # the step on each device the filter has run on
        cdf = self._step.cumsum(-1)
        self._cdf = cdf / cdf[:, -1:]  # last entry exactly 1, so a uniform < 1 never picks a zero-probability tail
        stationary_cdf = self._stationary.cumsum(-1)
        self._stationary_cdf = stationary_cdf / stationary_cdf[-1:]

    def __repr__(self) -> str:
        return f"HiddenMarkov(process={self.process!r}, vocab={self.vocab}, hidden={self.hidden})"

    @property
    def config(self) -> "HiddenMarkovConfig":
        """The config that builds this source (kind "hmm"): the preset and its parameters, or the matrices."""
        if self.process in PRESETS:
            return HiddenMarkovConfig(process=self.process, params=self.params)
        return HiddenMarkovConfig(process=CUSTOM, matrices=self._matrices.tolist())

    @property
    def transition_matrices(self) -> Matrices:
        """T[x, i, j] = P(emit x, move to j | in i), float64 [vocab, hidden, hidden] (a copy)."""
        return self._matrices.clone()

    @property
    def stationary(self) -> Float[Tensor, " hidden"]:
        """The stationary law of the hidden chain sum_x T[x]: the law of the first hidden state (a copy)."""
        return self._stationary.clone()

    @property
    def emission_law(self) -> Float[Tensor, "hidden vocab"]:
        """P(next token = x | in hidden state i) = sum_j T[x, i, j], [hidden, vocab]."""
        return self._matrices.sum(2).T.contiguous()

    @property
    def unifilar(self) -> bool:
        """Whether the presentation is unifilar: the current hidden state and the emitted token fix the next
        state (each T[x, i, :] has at most one non-zero entry). Then the belief synchronises to a state and the
        entropy rate is exact (`theory.hidden_entropy_rate`)."""
        return bool(((self._matrices > 0).sum(2) <= 1).all())

    def next_joint(self, beliefs: Float[Tensor, "*lead hidden"]) -> Float[Tensor, "*lead vocab hidden"]:
        """P(next token = x, hidden state after it = j | belief) for each belief: the one step of the forward
        filter (`belief_states` keeps the observed token's row, `theory.mixed_states` branches on every token).

        Args:
            beliefs: laws over the hidden states, float64, on any device.

        Returns:
            float64 [..., vocab, hidden]; summed over both axes each is 1.

        >>> hmm_preset("z1r").next_joint(torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))  # from C: 0 or 1, to A
        tensor([[0.5000, 0.0000, 0.0000],
                [0.5000, 0.0000, 0.0000]], dtype=torch.float64)
        """
        step = self._steps.get(beliefs.device)
        if step is None:
            step = self._steps[beliefs.device] = self._step.to(beliefs.device)
        return (beliefs @ step).unflatten(-1, (self.vocab, self.hidden))

    def belief_states(self, tokens: Tokens, *,
                      initial: Optional[Float[Tensor, "*lead hidden"]] = None) -> Float[Tensor, "batch pos hidden"]:
        """The belief after each token: P(hidden state | x_0..x_t), the forward filter.

        Entry [b, t] is the law of the hidden state the process is in after emitting x_t (the one that emits
        x_{t+1}), given x_0..x_t of sequence b, starting from the stationary law. This is the mixed state of Shai
        et al., whose geometry (for Mess3 a fractal in the simplex) they found linearly in the residual stream.
        Normalised at every step, in float64, so any length is stable.

        Args:
            tokens: int tokens 0..vocab-1, [batch, pos].
            initial: the law of the first hidden state instead of the stationary one: one law [hidden] or one per
                sequence [batch, hidden] (e.g. one-hot: the filter that knows where the process started).

        Returns:
            float64 [batch, pos, hidden] on the tokens' device; each row sums to 1.

        Raises:
            ValueError for tokens out of range or a sequence the process cannot emit (probability 0).

        >>> z1r = hmm_preset("z1r")  # 0, 1, then a random bit, repeated
        >>> z1r.belief_states(torch.tensor([[0, 0, 1]]))[0]  # a second 0 is only possible as "random, 0"
        tensor([[0.3333, 0.6667, 0.0000],
                [0.0000, 1.0000, 0.0000],
                [0.0000, 0.0000, 1.0000]], dtype=torch.float64)
        """
        check_tokens(tokens, self.vocab)
        batch, seq = tokens.shape
        start = self._stationary if initial is None else torch.as_tensor(initial, dtype=torch.float64)
        belief = start.to(tokens.device, torch.float64).expand(batch, self.hidden)
        rows = torch.arange(batch, device=tokens.device)
        out = torch.empty(batch, seq, self.hidden, dtype=torch.float64, device=tokens.device)
        for t in range(seq):
            unnormalised = self.next_joint(belief)[rows, tokens[:, t]]
            belief = unnormalised / unnormalised.sum(-1, keepdim=True)  # 0/0 = NaN marks an impossible sequence
            out[:, t] = belief
        _check_possible(out)
        return out

    def bayes_predictions(self, tokens: Tokens) -> Float[Tensor, "batch pos vocab"]:
        """The Bayes-optimal law of x_{t+1} given x_0..x_t at every position t: the belief after x_t
        (`belief_states`) times the emission law. The best any predictor can do on this source; its expected
        log-loss per position is `theory.bayes_loss_curve`, which falls to the entropy rate as the belief
        synchronises.

        Args:
            tokens: int tokens 0..vocab-1, [batch, pos].

        Returns:
            float64 [batch, pos, vocab] on the tokens' device.

        >>> hmm_preset("z1r").bayes_predictions(torch.tensor([[0, 0, 1]]))[0]
        tensor([[0.3333, 0.6667],
                [0.0000, 1.0000],
                [0.5000, 0.5000]], dtype=torch.float64)
        """
        return self.belief_states(tokens) @ self.emission_law.to(tokens.device)

    predictive = bayes_predictions  # the name the source protocol gives the Bayes-optimal next-token law

    def sample(self, batch: int, seq_len: int, generator: Optional[torch.Generator] = None, *, device: Any = None,
               return_states: bool = False) -> Tokens | tuple[Tokens, Int[Tensor, "batch pos"]]:
        """`batch` independent sequences of `seq_len` tokens, the first hidden state from the stationary law.

        All positions at once: one uniform per sequence for the first state, one per step; a step's uniform picks
        (token, next state) for every possible current state (inverse CDF), which makes the step a map on hidden
        states, and the hidden path is the prefix composition of those maps applied to the first state.

        Args:
            batch, seq_len: how many sequences, how long.
            generator: the only source of randomness (same state, same samples); its device is the tokens'.
            device: where to draw without a generator.
            return_states: also return the hidden state each token was emitted from.

        Returns:
            int64 tokens [batch, pos], with `return_states` also the hidden states [batch, pos].

        >>> hmm_preset("mess3").sample(2, 4, generator=torch.Generator().manual_seed(0)).shape
        torch.Size([2, 4])
        """
        dev = _resolve_device(generator, device)
        _check_sizes(batch, seq_len, self, dev)
        tokens, states = self._from_uniforms(self.uniforms(batch, seq_len, generator, dev))
        return (tokens, states) if return_states else tokens

    def uniforms(self, batch: int, seq_len: int, generator: Optional[torch.Generator],
                 device: Any) -> Float[Tensor, "batch draw"]:
        """The only random draw of `sample`: [batch, seq_len + 1] float64 uniforms, the first for the first hidden
        state, one per token after it (`sources.stacked_sampler` draws them per member, then maps all at once)."""
        return torch.rand(batch, seq_len + 1, generator=generator, device=device, dtype=torch.float64)

    def _from_uniforms(self, u: Float[Tensor, "batch draw"]) -> tuple[Tokens, Int[Tensor, "batch pos"]]:
        """(tokens, hidden states) given `uniforms`' draw: arithmetic only, row by row independent."""
        batch, seq_len = u.shape[0], u.shape[1] - 1
        first = torch.searchsorted(self._stationary_cdf.to(u.device), u[:, 0].contiguous(), right=True)
        first = first.clamp_(max=self.hidden - 1)
        flat = u[:, 1:].reshape(1, -1).expand(self.hidden, -1).contiguous()
        outcome = torch.searchsorted(self._cdf.to(u.device), flat, right=True).clamp_(max=self._cdf.shape[1] - 1)
        outcome = outcome.T.reshape(batch, seq_len, self.hidden)  # [batch, step, current state] -> (x, j) index
        moves, emits = outcome % self.hidden, outcome // self.hidden
        states = first[:, None]
        if seq_len > 1:
            paths = _compose_prefix(moves[:, :-1])  # [b, t] = F_t o ... o F_0: where each first state is after t+1
            later = torch.gather(paths, -1, first[:, None, None].expand(batch, seq_len - 1, 1))[..., 0]
            states = torch.cat([states, later], dim=1)
        return torch.gather(emits, -1, states[..., None])[..., 0], states


def _check_possible(beliefs: Float[Tensor, "batch pos hidden"]) -> None:
    """One host read after the filter: a NaN belief is a prefix of probability 0 under the process."""
    bad = beliefs.isnan().any(-1)
    if bool(bad.any()):
        b, t = (int(v) for v in bad.nonzero()[0])
        raise ValueError(f"sequence {b} has probability 0 under the HMM (impossible at token {t}, "
                         "or under the given initial law)")


# ------------------------------------------------------------------------------------------------- presets
def _mess3(x: float, alpha: float) -> Matrices:
    """Mess3 (Shai et al. 2024): 3 hidden states, 3 tokens; with y = 1 - 2x and beta = (1 - alpha) / 2,
    T[s, i, j] = (y if i = j else x) * (alpha if j = s else beta): stay with probability y, then emit the new
    state's own token with probability alpha."""
    check_number("x", x, minimum=0)
    check_number("alpha", alpha, minimum=0)
    if not (x <= 0.5 and alpha <= 1):
        raise ValueError(f"mess3 needs 0 <= x <= 0.5 and 0 <= alpha <= 1, got x={x}, alpha={alpha}")
    same = torch.eye(3, dtype=torch.bool)
    move = torch.full((3, 3), float(x), dtype=torch.float64).masked_fill(same, 1 - 2 * x)  # [i, j]
    emit = torch.full((3, 3), (1 - alpha) / 2, dtype=torch.float64).masked_fill(same, alpha)  # [s, j]
    return move[None, :, :] * emit[:, None, :]


def _rrxor() -> Matrices:
    """RRXOR: two random bits, then their XOR, repeated (Crutchfield's 5-state unifilar presentation: start S,
    after a 0 or a 1, then T / F which emit the XOR 1 / 0). Entropy rate 2/3 bit."""
    t = torch.zeros(2, 5, 5, dtype=torch.float64)
    s, zero, one, true, false = range(5)
    for x, i, j, p in [(0, s, zero, 0.5), (1, s, one, 0.5), (0, zero, false, 0.5), (1, zero, true, 0.5),
                       (0, one, true, 0.5), (1, one, false, 0.5), (1, true, s, 1.0), (0, false, s, 1.0)]:
        t[x, i, j] = p
    return t


def _z1r() -> Matrices:
    """Z1R: 0, 1, then a random bit, repeated (3 states, unifilar). Entropy rate 1/3 bit."""
    t = torch.zeros(2, 3, 3, dtype=torch.float64)
    t[0, 0, 1] = t[1, 1, 2] = 1.0
    t[0, 2, 0] = t[1, 2, 0] = 0.5
    return t


def _random(hidden: int, vocab: int, concentration: float, seed: int) -> Matrices:
    """A random HMM emitting from its current state: transition rows and emission rows ~ Dirichlet(concentration),
    drawn from a generator seeded by `seed`; T[x, i, j] = P(x | i) P(j | i)."""
    check_int("hidden", hidden, minimum=1)
    check_int("vocab", vocab, minimum=2)
    check_number("concentration", concentration, positive=True)
    check_int("seed", seed, minimum=0)
    gen = torch.Generator().manual_seed(seed)
    gamma = _gamma(float(concentration), (hidden, hidden + vocab), gen, torch.device("cpu"))
    move = gamma[:, :hidden] / gamma[:, :hidden].sum(-1, keepdim=True)
    emit = gamma[:, hidden:] / gamma[:, hidden:].sum(-1, keepdim=True)
    return emit.T[:, :, None] * move[None, :, :]


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named process: `build(**params)` returns its matrices; `defaults` are its parameters when not given."""

    build: Callable[..., Matrices]
    defaults: Mapping[str, Any]
    help: str


# a new preset is one entry here
PRESETS: dict[str, Preset] = {
    "mess3": Preset(_mess3, {"x": 0.05, "alpha": 0.85}, "Mess3 of Shai et al. 2024 (3 states, 3 tokens)"),
    "rrxor": Preset(_rrxor, {}, "random, random, XOR (5 states, 2 tokens, unifilar)"),
    "z1r": Preset(_z1r, {}, "zero, one, random (3 states, 2 tokens, unifilar)"),
    "random": Preset(_random, {"hidden": 3, "vocab": 3, "concentration": 1.0, "seed": 0},
                     "Dirichlet-drawn transition and emission rows, seeded"),
}


def hmm_preset(process: str, **params: Any) -> HiddenMarkov:
    """The named process of `PRESETS` with `params` over its defaults.

    Args:
        process: "mess3" (x = 0.05, alpha = 0.85 as in Shai et al.), "rrxor", "z1r" or "random" (hidden = 3,
            vocab = 3, concentration = 1.0, seed = 0).
        params: parameters of that preset.

    Returns:
        The `HiddenMarkov`.

    >>> mess3 = hmm_preset("mess3")
    >>> mess3.params, mess3.stationary
    ({'x': 0.05, 'alpha': 0.85}, tensor([0.3333, 0.3333, 0.3333], dtype=torch.float64))
    """
    if process not in PRESETS:
        raise ValueError(f"unknown HMM process {process!r}; the presets are {sorted(PRESETS)}")
    preset = PRESETS[process]
    unknown = sorted(set(params) - set(preset.defaults))
    if unknown:
        raise ValueError(f"the {process!r} process takes {sorted(preset.defaults) or 'no parameters'}, "
                         f"got {unknown}")
    values = {**preset.defaults, **params}
    return HiddenMarkov(preset.build(**values), process=process, params=values)


# -------------------------------------------------------------------------------------------------- config
@register_source("hmm")
@dataclasses.dataclass(frozen=True, kw_only=True)
class HiddenMarkovConfig(SourceConfig):
    """hidden Markov process, the state never seen: --process mess3 | rrxor | z1r | random (parameters: --set source.params='{"x": 0.1}'), or custom with --set source.matrices=T[x][i][j]

    `process` names a preset of `PRESETS` and `params` its parameters over the preset's defaults (stored with every
    default filled in, so the file says what was trained on); `process="custom"` takes the labelled transition
    matrices T[x][i][j] = P(emit x, move to j | in i) as `matrices` instead. A new preset is one entry of
    `PRESETS`; this config needs nothing new.

    >>> cfg = SourceConfig(kind="hmm", process="mess3", params={"x": 0.1})
    >>> cfg.to_dict(), cfg.vocab_size, cfg.in_context
    ({'kind': 'hmm', 'process': 'mess3', 'params': {'alpha': 0.85, 'x': 0.1}}, 3, False)
    """

    run_defaults: ClassVar[dict[str, Any]] = {"process": "mess3"}
    states_option: ClassVar[Optional[str]] = None  # the process fixes the number of tokens
    _LATER_FIELDS: ClassVar[dict] = {"params": (), "matrices": None}  # left out of the JSON when not set

    process: str  # a preset of PRESETS, or "custom" with `matrices`
    params: Mapping[str, Any] | tuple | list = ()  # the preset's parameters, {name: value}; stored as sorted pairs
    matrices: tuple | list | None = None  # process "custom": T[x][i][j] = P(emit x, move to j | in i)

    def __post_init__(self) -> None:
        if not isinstance(self.process, str) or self.process not in (*PRESETS, CUSTOM):
            raise ValueError(f"unknown HMM process {self.process!r}; the presets are {sorted(PRESETS)}, or "
                             f"{CUSTOM!r} with matrices")
        if (self.process == CUSTOM) != (self.matrices is not None):
            raise ValueError(f"matrices go with process={CUSTOM!r} and only with it (got process={self.process!r}, "
                             f"matrices {'given' if self.matrices is not None else 'not given'})")
        given = _params_dict(self.params)
        if self.process == CUSTOM and given:
            raise ValueError(f"a custom HMM takes its matrices and no params, got params {given}")
        full = {} if self.process == CUSTOM else {**PRESETS[self.process].defaults, **given}
        object.__setattr__(self, "params", tuple(sorted(full.items())))
        super().__post_init__()

    def build(self) -> HiddenMarkov:
        """The `HiddenMarkov`."""
        if self.process == CUSTOM:
            return HiddenMarkov(self.matrices)
        return hmm_preset(self.process, **dict(self.params))

    def to_dict(self) -> dict[str, Any]:
        """{"kind": "hmm", "process", "params" as a table (presets), "matrices" (custom)}."""
        out = super().to_dict()
        if "params" in out:
            out["params"] = dict(self.params)
        return out

    def data_bytes(self, *, batch: int, length: int, members: int) -> tuple[int, int]:
        """(sampler, references) bytes: the sampler's uniforms, per-state outcomes and state maps (float64 and
        int64 [member, batch, length, hidden], a few copies in the prefix scan); the references' mixed-state
        enumeration (`theory.hidden.MAX_STATES` beliefs x (token, next state), float64 and a few copies)."""
        hmm = self.build()
        sampler = members * batch * length * (8 + 6 * 8 * hmm.hidden)
        references = 6 * (1 << 18) * hmm.vocab * hmm.hidden * 8
        return sampler, references


def _params_dict(params: Any) -> dict[str, Any]:
    """`params` (a table, or the sorted (name, value) pairs a config stores) as a dict; ValueError otherwise."""
    if isinstance(params, Mapping):
        return dict(params)
    if isinstance(params, (tuple, list)) and all(isinstance(p, (tuple, list)) and len(p) == 2 for p in params):
        return {str(k): v for k, v in params}
    raise ValueError(f"params must be a table of the preset's parameters, e.g. {{\"x\": 0.1}}, got {params!r}")
