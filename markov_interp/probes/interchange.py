"""What a kept edge carries: interchange interventions along one edge S -> R.q / .k / .v.

Path patching (`paths`, `discovery`) says *where* information flows: the edges whose corruption costs loss. It does
not say *what* flows. An interchange intervention (Geiger et al. 2021, "Causal abstractions of neural networks";
the resampling form of Chan et al. 2022's causal scrubbing) does: run the model on a counterfactual input, patch one
component's output from that run into the clean one, and see whether the output moves as a hypothesis predicts.
Applied to a single edge it names the variable the edge carries.

**The pairs.** Sender S's output at position j depends on the states x_0..x_j alone (causal attention). For every
clean sequence b of the batch and every position j a *donor* is chosen: another sequence b' of the pool (the whole
probe batch) at **the same position** j, whose **first state is the same** (x'_0 = x_0), and S's output at (b', j)
is patched in at (b, j) along the edge S -> R.input alone (`paths.EdgeRunner.patched`: the one-pass single edge,
nothing else of the run changes). Position and first state are held fixed in every pair by construction: the
position embedding is the same, and a head that parks attention on position 0 (an attention sink) carries x_0,
which is the same for every key of a sequence and so carries nothing a receiver can compare. Two donors are drawn
per variable X (`variable_names`):

- **hold X**: the donor agrees with (b, j) on X (a state variable exactly; a count variable as nearly as the pool
  allows: the donor nearest in L1 distance, its mismatch reported) and is random in everything else;
- **random**: the donor is any other sequence with the same first state, at the same positions (the scale: what
  the edge carries at all, as the resample corruption of path patching sees it).

If the edge carries X and nothing else, every donor that agrees on X is interchangeable with the clean sequence, so
patching it in leaves R and the logits where they were. The **explained fraction**
e_X = 1 - sum_b E_hold(b) / sum_b E_random(b), with E the mean KL (clean law || patched law) over the positions of
sequence b, is 1 for a variable that accounts for everything the edge carries and 0 for one that accounts for
nothing (it can go below 0 by chance). The same fraction read off R's attention pattern (mean total variation
between its clean and patched rows; q and k edges) says whether R's attention moves as the variable predicts. The
interval is a percentile bootstrap over the clean sequences. Where a hold-X donor does not exist at (b, j) (a rare
state combination), that position is left clean in both the hold and the random run, and the coverage says how
many were patched.

**What a head's keys carry** (`EdgeContent.keys`): the same pairs, patching the receiver's whole key vector (its
`hook_k` slice, every K-edge at once) from the donor. An induction head matches its query against the *lagged*
state in its keys, so a lagged state explains its keys; a head that keys positions by their own state with the
switches into them needs the state (a K-edge can carry a lagged state that the keys use only beside the key's own
state, from the embedding: the keys as a whole then carry no lagged state). Read for every head that receives a kept
K-edge from a head or an MLP; the entry is named "L1H0.k".

**What it carries** (`EdgeCarry.carries`): the first variable of `variable_names` (simplest first) whose explained
fraction reaches `CARRIES` and lies within `NEAR_BEST` of the best variable's; None when none does (then `best`
names the closest and the summary lists what was tried). Edges out of the token embedding carry the state by
construction ("state": the embedding at j is x_j), edges out of the position embedding the position ("position");
they are not measured.

>>> # content = edge_content(model, batch, graph.kept); content["L0H0->L1H0.k"].carries
>>> # 'lag1'
"""

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any, Optional

import torch
from jaxtyping import Int
from torch import Tensor

from markov_interp import theory
from markov_interp.config import check_int
from markov_interp.models import HookedModel
from markov_interp.probes._common import ProbeBatch, Tokens, check_tokens, json_safe, pattern_hook, total_variation
from markov_interp.probes._display import ProbeResult, dataframe, displayed
from markov_interp.probes.interventions import Component
from markov_interp.probes.paths import EdgeKey, EdgeRunner

CARRIES = 0.75  # an edge carries the first variable (simplest first) whose explained fraction reaches this
NEAR_BEST = 0.05  # ... and lies within this of the best variable's explained fraction
N_BOOT = 200  # bootstrap resamples of the clean sequences
Donors = Int[Tensor, "donor pos"]  # more sequences of the source, to draw donors from
_POSITIONS_AT_ONCE = 16  # positions whose donors are chosen at once (`choose_donors`)
LAGGED = "lagged state"  # the kinds of variable (`KINDS`), in words
KINDS = {"state": "current state", "switch": "switch statistics", "step": "switch statistics", "lags": LAGGED,
         "window": "recent states",
         "counts": "state counts", "switches": "switch statistics", "transitions": "switch statistics",
         "position": "position"}
# held fixed in every pair by construction (not measured): the position, and the first state x_0
BY_CONSTRUCTION = {"embed": "state", "pos": "position"}


__all__ = ["EdgeCarry", "EdgeContent", "edge_content", "variable_names", "kind_of", "is_lagged", "measurable",
           "position_variables", "choose_donors", "CARRIES", "BY_CONSTRUCTION"]


def variable_names(max_lag: int) -> tuple[str, ...]:
    """The variables tested, simplest first: the current state x_j, the lagged states x_{j-1}..x_{j-max_lag}, the
    switch into j ([x_j != x_{j-1}]), the step into j (x_{j-1}, x_j: the state with the switch into it, what a key
    needs to be told apart as a switch into its own state), the lagged states together, the window (x_j and the
    lagged states), the state counts up to j, the number of switches up to j, and the transition counts up to j
    (the in-context bigram statistics).

    >>> variable_names(2)
    ('state', 'lag1', 'lag2', 'switch', 'step', 'lags', 'window', 'counts', 'switches', 'transitions')
    """
    check_int("max_lag", max_lag, minimum=1)
    return ("state", *(f"lag{lag}" for lag in range(1, max_lag + 1)), "switch", "step", "lags", "window", "counts",
            "switches", "transitions")


def kind_of(variable: Optional[str]) -> Optional[str]:
    """The kind of a variable in words ("lag2" -> "lagged state"); None for None."""
    if variable is None:
        return None
    return LAGGED if variable.startswith("lag") else KINDS.get(variable, variable)


def is_lagged(variable: Optional[str]) -> bool:
    """Whether `variable` is a lagged state (one lag or several together)."""
    return variable is not None and variable.startswith("lag")


def position_variables(tokens: Tokens, *, vocab: int, max_lag: int) -> dict[str, tuple[Tensor, bool]]:
    """Every variable of `variable_names(max_lag)` at every position: {name: ([batch, pos, features] float64,
    exact)}; `exact` variables are matched exactly, the others (counts) by the nearest donor. A lag reaching before
    position 0 reads -1 (the same for every sequence at that position).

    >>> v = position_variables(torch.tensor([[0, 1, 1, 0]]), vocab=2, max_lag=1)
    >>> v["lag1"][0][0, :, 0].tolist(), v["switches"][0][0, :, 0].tolist()
    ([-1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 2.0])
    """
    x = tokens.long()
    batch, seq = x.shape
    # a lag beyond the sequence reads nothing (and a copy of the states per lag: 2**20 lags took 4 GiB)
    check_int("max_lag", max_lag, minimum=1, maximum=seq)
    lag = [torch.full_like(x, -1) for _ in range(max_lag + 1)]
    for l in range(max_lag + 1):
        lag[l][:, l:] = x[:, :seq - l]
    switch = torch.where(lag[1] < 0, -1, (x != lag[1]).long())
    counts = torch.nn.functional.one_hot(x, vocab).cumsum(1)
    moves = torch.nn.functional.one_hot(lag[1].clamp_min(0) * vocab + x, vocab * vocab) * (lag[1] >= 0)[..., None]
    out = {"state": (x[..., None], True)}
    out.update({f"lag{l}": (lag[l][..., None], True) for l in range(1, max_lag + 1)})
    out["switch"] = (switch[..., None], True)
    out["step"] = (torch.stack([lag[1], x], -1), True)
    out["lags"] = (torch.stack(lag[1:], -1), True)
    out["window"] = (torch.stack(lag, -1), True)
    out["counts"] = (counts, False)
    out["switches"] = (switch.clamp_min(0).cumsum(1)[..., None], False)
    out["transitions"] = (moves.cumsum(1), False)
    return {name: (values.double(), exact) for name, (values, exact) in out.items()}


def choose_donors(values: Tensor, exact: bool, first: Tensor, n_base: int, gen: torch.Generator,
                  allowed: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """For every base sequence b < `n_base` of the pool and position j, a donor sequence of the pool at the same
    position: not b, with the same first state, agreeing on the variable `values` ([pool, pos, features]) exactly
    (`exact`) or as nearly as the pool allows (L1 distance), ties broken at random by `gen`; only at positions
    `allowed` ([base, pos], default all). Positions are taken `_POSITIONS_AT_ONCE` at a time (the distances of
    every base and pool sequence at once would be [base, pool, pos]).

    Returns:
        (donor index into the pool [base, pos] (b itself where none qualifies), covered [base, pos], the donor's
        distance from (b, j) on the variable [base, pos]).
    """
    pool, seq = values.shape[:2]
    valid = (first[:n_base, None] == first[None, :]) & (torch.arange(n_base)[:, None] != torch.arange(pool)[None])
    donors, covered, distance = [], [], []
    for start in range(0, seq, _POSITIONS_AT_ONCE):
        part = values[:, start:start + _POSITIONS_AT_ONCE]
        base = part[:n_base]
        if exact:
            dist = torch.where((base[:, None] == part[None]).all(-1), 0.0, math.inf)
        else:
            dist = (base[:, None] - part[None]).abs().sum(-1)
        dist = dist.masked_fill(~valid[..., None], math.inf)
        if allowed is not None:
            dist = dist.masked_fill(~allowed[:, None, start:start + _POSITIONS_AT_ONCE], math.inf)
        best = dist.min(1).values
        found = torch.isfinite(best)
        ties = (dist == best[:, None]) & found[:, None]
        score = torch.rand(dist.shape, generator=gen, dtype=torch.float64).masked_fill(~ties, -1.0)
        donors.append(torch.where(found, score.argmax(1), torch.arange(n_base)[:, None]))
        covered.append(found)
        distance.append(torch.where(found, best, 0.0))
    return torch.cat(donors, 1), torch.cat(covered, 1), torch.cat(distance, 1)


@displayed(line=lambda e: e.describe())
@dataclasses.dataclass(frozen=True, kw_only=True)
class EdgeCarry:
    """What one edge carries (module docstring): per variable, the explained fraction of the edge's effect on the
    logits (`explained`, with its bootstrap interval), on the receiver's attention (`attention`; q and k edges,
    NaN otherwise), the share of positions patched (`coverage`) and the mean distance of the donors from the clean
    position on a count variable (`mismatch`, 0 for exact matches). `effect`: the mean KL (nats) of the random
    interchange, what the edge carries at all. `carries`: the first variable reaching the cut, or None; `best`: the
    variable with the largest explained fraction. `measured` is False for edges out of the embeddings, whose
    content is known by construction."""

    edge: str
    carries: Optional[str]
    best: Optional[str]
    explained: dict[str, float]
    interval: dict[str, tuple[float, float]]
    attention: dict[str, float]
    coverage: dict[str, float]
    mismatch: dict[str, float]
    effect: float
    measured: bool = True

    @property
    def key(self) -> EdgeKey:
        return EdgeKey.parse(self.edge)

    @property
    def kind(self) -> Optional[str]:
        """The kind of what it carries, in words ("lagged state", "current state", ...), None if nothing."""
        return kind_of(self.carries)

    def describe(self) -> str:
        """One clause: "L0H0->L1H0.k carries lag1 (0.99 [0.98, 1.00])", or what came closest."""
        if not self.measured:
            return f"{self.edge} carries the {kind_of(self.carries)} (by construction)"
        if self.carries is not None:
            lo, hi = self.interval[self.carries]
            return f"{self.edge} carries {self.carries} ({self.explained[self.carries]:.2f} [{lo:.2f}, {hi:.2f}])"
        if self.best is None:
            return f"{self.edge}: no resampling effect to explain ({self.effect:.2g} nats)"
        return f"{self.edge}: no tested variable reaches the cut (closest {self.best} {self.explained[self.best]:.2f})"

    def to_dict(self) -> dict[str, Any]:
        return json_safe({**dataclasses.asdict(self), "interval": {k: list(v) for k, v in self.interval.items()},
                          "kind": self.kind})


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class EdgeContent(ProbeResult):
    """What each edge carries (`edge_content`; module docstring): one `EdgeCarry` per edge, in the graph's order.
    `variables` are the variables tried, `cut` the explained fraction an edge's variable needs; `n_sequences` clean
    sequences are patched, the donors drawn from `pool` sequences of the probe batch."""

    edges: tuple[EdgeCarry, ...]
    variables: tuple[str, ...]
    cut: float
    n_sequences: int
    pool: int
    seq_len: int
    seed: int
    vocab: Optional[int] = None  # the model's states (the switch-counting reading is defined on two)
    keys: tuple[EdgeCarry, ...] = ()  # what each receiver's whole key vector carries ("L1H0.k"; module docstring)

    def __getitem__(self, name: str) -> EdgeCarry:
        for e in self.edges:
            if e.edge == name:
                return e
        raise KeyError(f"no edge {name!r} was measured; have {[e.edge for e in self.edges]}")

    def __contains__(self, name: object) -> bool:
        return any(e.edge == name for e in self.edges)

    def keys_of(self, receiver: str) -> Optional[EdgeCarry]:
        """What head `receiver`'s keys carry as a whole ("L1H0"), None when they were not measured."""
        return next((e for e in self.keys if e.edge == f"{receiver}.k"), None)

    def carries(self, name: str) -> Optional[str]:
        """The variable edge `name` carries (None when it was not measured or nothing reaches the cut)."""
        return self[name].carries if name in self else None

    def _headline(self) -> str:
        measured = [e for e in self.edges if e.measured]
        named = ", ".join(f"{e.edge} {e.carries or '?'}" for e in measured) or "no edge from a head or MLP"
        return f"what {len(measured)} edges carry: {named}"

    def summary(self) -> str:
        """One line per edge, then what was tried."""
        lines = [self._headline()] + [e.describe() for e in self.edges + self.keys]
        return "\n".join(lines + [f"tried (simplest first, cut {self.cut}): {', '.join(self.variables)}; position "
                                  f"and first state held in every pair; {self.n_sequences} sequences patched, donors "
                                  f"from {self.pool}"])

    def to_dataframe(self) -> Any:
        """One row per edge (index its name): what it carries, its random-interchange effect, and the explained
        fraction of every variable (logits).

        Returns:
            A pandas DataFrame.
        """
        return dataframe(({"edge": e.edge, "carries": e.carries, "kind": e.kind, "effect": e.effect,
                           **{v: e.explained.get(v, math.nan) for v in self.variables}} for e in self.edges),
                         index="edge")

    def to_dict(self) -> dict[str, Any]:
        return json_safe({"edges": [e.to_dict() for e in self.edges], "keys": [e.to_dict() for e in self.keys],
                          "variables": list(self.variables),
                          "cut": self.cut, "n_sequences": self.n_sequences, "pool": self.pool,
                          "seq_len": self.seq_len, "seed": self.seed, "vocab": self.vocab})


def measurable(edge: Any) -> bool:
    """Whether `edge_content` measures `edge` (an `Edge`, `EdgeKey` or name): an edge into a head's queries, keys or
    values or into an MLP, out of a head or an MLP (the embeddings' edges carry what they carry by construction)."""
    key = _as_key(edge)
    return key.input in ("q", "k", "v", "mlp") and key.sender not in BY_CONSTRUCTION


def _as_key(edge: Any) -> EdgeKey:
    if isinstance(edge, EdgeKey):
        return edge
    if hasattr(edge, "key"):
        return edge.key
    return EdgeKey.parse(edge)


def _ratio_interval(hold: Tensor, rand: Tensor, gen: torch.Generator, n_boot: int) -> tuple[float, float, float]:
    """1 - sum(hold) / sum(rand) over sequences, and its 95% percentile-bootstrap interval (resampling sequences);
    NaN where the random interchange changes nothing."""
    total = float(rand.sum())
    if not total > 1e-12:
        return math.nan, math.nan, math.nan
    idx = torch.randint(hold.shape[0], (n_boot, hold.shape[0]), generator=gen)
    boot = 1 - hold[idx].sum(1) / rand[idx].sum(1).clamp_min(1e-12)
    lo, hi = torch.quantile(boot, torch.tensor([0.025, 0.975], dtype=boot.dtype)).tolist()
    return 1 - float(hold.sum()) / total, lo, hi


def _sender_outputs(model: HookedModel, tokens: Tokens, donors: Optional[Donors], senders: Sequence[Component],
                    cache: Optional[Any]) -> dict[str, Tensor]:
    """Each sender's output on every sequence of the pool, `tokens` then `donors` ([pool, pos, d]; a head's slice of
    hook_z): on `tokens` read from `cache` (a run of them) where it holds them, else from one run; on `donors` from
    one run."""
    names = sorted({s.hook_name for s in senders})
    runs = [cache if cache is not None and all(n in cache for n in names) else
            model.run_with_cache(tokens, names_filter=names)[1]]
    if donors is not None:
        runs.append(model.run_with_cache(donors, names_filter=names)[1])
    return {s.name: torch.cat([run[s.hook_name][:, :, s.head] if s.kind == "head" else run[s.hook_name]
                               for run in runs]) for s in senders}


def _effects(runner: EdgeRunner, key: EdgeKey, values: list[Tensor]) -> tuple[Tensor, Optional[Tensor]]:
    """Per copy and clean sequence: the mean KL (clean law || patched law) over positions, and for a q or k edge the
    mean total variation between the receiver's clean and patched attention rows ([copy, batch] each). The first
    copy of `values` must be the clean output (its pattern is the clean one)."""
    receiver = Component.parse(key.receiver) if key.input in ("q", "k") else None
    record = [pattern_hook(receiver.layer)] if receiver is not None else []
    logits, seen = runner.patched([key] * len(values), values, record=record)
    patched = torch.softmax(logits.double(), -1)
    kl = theory.kl_divergence(torch.softmax(runner.clean_logits.double(), -1).expand_as(patched), patched).mean(-1)
    if receiver is None:
        return kl.cpu(), None
    pattern = seen[record[0]][:, :, receiver.head].double()  # [copy, batch, query, key]
    return kl.cpu(), total_variation(pattern, pattern[:1]).mean(-1).cpu()


@dataclasses.dataclass(frozen=True)
class _Pairs:
    """The donors of every test, shared by every edge (they depend on the tokens alone): per variable its hold
    donors [base, pos], the positions covered, the donors' distance on the variable, and which random draw (one
    per distinct set of covered positions) sets its scale."""

    holds: dict[str, tuple[Tensor, Tensor, Tensor, int]]
    randoms: tuple[Tensor, ...]


def _pairs(variables: dict, first: Tensor, n_base: int, gen: torch.Generator) -> _Pairs:
    """A hold-X donor per variable, and a random donor per distinct set of covered positions (module docstring)."""
    holds, randoms, masks = {}, [], {}
    for name, (values, exact) in variables.items():
        donor, covered, dist = choose_donors(values, exact, first, n_base, gen)
        mask = covered.numpy().tobytes()
        if mask not in masks:
            masks[mask] = len(randoms)
            randoms.append(choose_donors(torch.zeros_like(values[..., :1]), True, first, n_base, gen,
                                         allowed=covered)[0])
        holds[name] = (donor, covered, dist, masks[mask])
    return _Pairs(holds, tuple(randoms))


def _measure(runner: EdgeRunner, key: EdgeKey, out: Tensor, pairs: _Pairs, gen: torch.Generator, *, n_boot: int,
             cut: float) -> EdgeCarry:
    """One edge's `EdgeCarry`: the clean output, every hold-X and every random donor patched along the edge."""
    n_base, seq = runner.tokens.shape
    at = torch.arange(seq, device=out.device)
    donors = [torch.arange(n_base)[:, None].expand(n_base, seq)] + [h[0] for h in pairs.holds.values()]
    kl, tv = _effects(runner, key, [out[d.to(out.device), at] for d in donors + list(pairs.randoms)])
    return _carry(key.name, kl, tv, pairs, gen, n_boot=n_boot, cut=cut)


def _carry(name: str, kl: Tensor, tv: Optional[Tensor], pairs: "_Pairs", gen: torch.Generator, *, n_boot: int,
           cut: float) -> EdgeCarry:
    """An `EdgeCarry` from the per-copy, per-sequence KL (and attention TV) of the clean copy, one copy per hold-X
    donor and one per random donor, in `pairs`' order."""
    first_random = 1 + len(pairs.holds)
    explained, interval, attention, coverage, mismatch = {}, {}, {}, {}, {}
    for i, (var, (_, covered, dist, r)) in enumerate(pairs.holds.items(), start=1):
        explained[var], *bounds = _ratio_interval(kl[i], kl[first_random + r], gen, n_boot)
        interval[var] = tuple(bounds)
        attention[var] = math.nan if tv is None else _ratio_interval(tv[i], tv[first_random + r], gen, 1)[0]
        coverage[var] = float(covered.double().mean())
        mismatch[var] = float(dist[covered].mean()) if bool(covered.any()) else math.nan
    return EdgeCarry(edge=name, carries=_carried(explained, cut), best=_best(explained),
                     explained=explained, interval=interval, attention=attention, coverage=coverage,
                     mismatch=mismatch, effect=float(kl[first_random:].mean()))


def _best(explained: dict[str, float]) -> Optional[str]:
    finite = [v for v in explained if math.isfinite(explained[v])]
    return max(finite, key=lambda v: explained[v]) if finite else None


def _carried(explained: dict[str, float], cut: float) -> Optional[str]:
    """The first variable (simplest first) whose explained fraction reaches `cut` and lies within `NEAR_BEST` of
    the best variable's (a simpler variable that explains clearly less than a richer one is not what the edge
    carries; one that explains nearly as much is: the window of recent states always explains at least as much as
    any one lag in it)."""
    best = _best(explained)
    if best is None:
        return None
    return next((v for v in explained if explained[v] >= cut and explained[v] >= explained[best] - NEAR_BEST), None)


def _by_construction(key: EdgeKey) -> EdgeCarry:
    return EdgeCarry(edge=key.name, carries=BY_CONSTRUCTION[key.sender], best=None, explained={}, interval={},
                     attention={}, coverage={}, mismatch={}, effect=math.nan, measured=False)


@torch.no_grad()
def edge_content(model: HookedModel, batch: ProbeBatch, edges: Iterable[Any], *, donors: Optional[Donors] = None,
                 cache: Optional[Any] = None, n_sequences: int = 16, max_lag: Optional[int] = None, seed: int = 0,
                 n_boot: int = N_BOOT, cut: float = CARRIES) -> EdgeContent:
    """What each of `edges` carries, by interchange interventions along that edge alone (module docstring).

    Args:
        model: a hooked model whose residual stream is the sum of its senders' writes (`paths.EdgeRunner`).
        batch: the probe batch: its first `n_sequences` sequences are patched, the donors come from all of them
            (and `donors`).
        edges: the edges to read (`Edge`s of a `CircuitGraph`, `EdgeKey`s or names); edges into a head's queries,
            keys or values or into an MLP are measured when their sender is a head or an MLP, edges out of the
            embeddings are given their content by construction, the others are left out.
        donors: more sequences of the same source, [n, pos], to draw donors from: a count variable (counts,
            switches, transitions) is held only as nearly as the pool has a sequence with the same counts at the
            same position, so a larger pool holds it better (the trained models of docs/circuits.md: 512).
        cache: a `run_with_cache` of `batch.tokens` holding the senders' outputs (only read; default: one run).
        n_sequences: clean sequences patched (the bootstrap resamples them).
        max_lag: the largest lag tested (default: the batch's order + 1).
        seed: seed of the donor draws and of the bootstrap.
        n_boot: bootstrap resamples.
        cut: the explained fraction an edge's variable needs.

    Returns:
        An `EdgeContent`: per edge, what it carries and the explained fraction of every variable tried.
    """
    if not isinstance(batch, ProbeBatch):
        raise TypeError(f"batch must be a ProbeBatch (probes.sample_batch), got {type(batch).__name__}")
    check_int("n_sequences", n_sequences, minimum=2)
    check_int("n_boot", n_boot, minimum=1)
    max_lag = batch.order + 1 if max_lag is None else max_lag
    tokens = check_tokens(model, batch.tokens)
    donors = None if donors is None else check_tokens(model, donors)
    if donors is not None and donors.shape[1] != tokens.shape[1]:
        raise ValueError(f"donors must be as long as the batch's sequences ({tokens.shape[1]}), got {donors.shape[1]}")
    every = tokens if donors is None else torch.cat([tokens, donors.to(tokens.device)])
    pool, n_base = int(every.shape[0]), min(n_sequences, int(tokens.shape[0]))
    keys = [_as_key(e) for e in edges]
    measured = [k for k in keys if measurable(k)]
    senders = list(dict.fromkeys(Component.parse(k.sender) for k in measured))
    outputs = _sender_outputs(model, tokens, donors, senders, cache) if measured else {}
    variables = position_variables(every.cpu(), vocab=int(model.cfg.d_vocab), max_lag=max_lag)
    runner = EdgeRunner(model, tokens[:n_base]) if measured else None
    gen = torch.Generator().manual_seed(seed)
    pairs = _pairs(variables, every[:, 0].cpu(), n_base, gen) if measured else None
    rows = []
    for key in keys:
        if key.sender in BY_CONSTRUCTION and key.input in ("q", "k", "v", "mlp"):
            rows.append(_by_construction(key))
        elif key in measured:
            rows.append(_measure(runner, key, outputs[key.sender], pairs, gen, n_boot=n_boot, cut=cut))
    receivers = list(dict.fromkeys(Component.parse(k.receiver) for k in measured if k.input == "k"))
    key_rows = _key_content(model, every, n_base, receivers, pairs, gen, n_boot=n_boot, cut=cut) if receivers else ()
    return EdgeContent(edges=tuple(rows), variables=tuple(variables), cut=cut, n_sequences=n_base, pool=pool,
                       seq_len=int(tokens.shape[1]), seed=seed, vocab=int(model.cfg.d_vocab), keys=key_rows)


def _key_content(model: HookedModel, every: Tensor, n_base: int, receivers: Sequence[Component], pairs: "_Pairs",
                 gen: torch.Generator, *, n_boot: int, cut: float) -> tuple[EdgeCarry, ...]:
    """What each receiver head's whole key vector carries (module docstring): its hook_k slice on the pool, patched
    from every hold-X and random donor into the first `n_base` sequences, one copy of them per donor, in one run
    per receiver."""
    names = sorted({f"blocks.{r.layer}.attn.hook_k" for r in receivers})
    _, cache = model.run_with_cache(every, names_filter=names)
    base, seq = every[:n_base], int(every.shape[1])
    at = torch.arange(seq, device=every.device)
    donors = [torch.arange(n_base)[:, None].expand(n_base, seq)] + [h[0] for h in pairs.holds.values()]
    donors += list(pairs.randoms)
    rows = []
    for r in receivers:
        hook, pattern = f"blocks.{r.layer}.attn.hook_k", f"blocks.{r.layer}.attn.hook_pattern"
        keys = torch.cat([cache[hook][d.to(every.device), at][:, :, r.head] for d in donors])
        seen = {}

        def patch(k: Tensor, hook: Any) -> Tensor:
            k = k.clone()
            k[:, :, r.head] = keys
            return k

        def record(p: Tensor, hook: Any) -> None:
            seen["p"] = p[:, r.head].double().unflatten(0, (len(donors), n_base))

        logits = model.run_with_hooks(base.repeat(len(donors), 1), fwd_hooks=[(hook, patch), (pattern, record)])
        probs = torch.softmax(logits.double(), -1).unflatten(0, (len(donors), n_base))
        kl = theory.kl_divergence(probs[:1].expand_as(probs), probs).mean(-1).cpu()
        tv = total_variation(seen["p"], seen["p"][:1]).mean(-1).cpu()
        rows.append(_carry(f"{r.name}.k", kl, tv, pairs, gen, n_boot=n_boot, cut=cut))
    return tuple(rows)
