"""Induction circuits as sets of heads by role, confirmed by ablating each set at once.

An order-k induction circuit (Olsson et al.; Edelman et al. for Markov data) has two kinds of roles:
previous-token heads at each lag l = 1..k, which copy x_{j-l} into position j, and induction heads, which
attend from i to the keys j whose k preceding states match the k states ending at i and copy x_j. A role
may be spread over several heads, in any layers (previous-token heads below the last induction head), so
it is a *set*: every head whose excess score for the role (`attention.AttentionScores`: chance levels that
keep the tokens' statistics) is at least `Thresholds.head_excess`.

Each role's set is mean-ablated at once (`ablation.set_ablation_losses`); redundant heads that each survive
their own ablation cannot hide the role that way. The yardstick is the model's own in-context gain of that
order: L(in-context add-beta estimator of order k - 1) - L(model) on the same tokens, what conditioning on
the k-th state is worth to this model. A role is confirmed when its set's ablation costs at least
`destroy_fraction` of that gain; the circuit when every role is (and the model has two layers or more).
Whole attention layers are ablated too (from the ablation table), as evidence of where the gain lives.
"""

import dataclasses
from typing import Any, Optional


from markov_interp import theory
from markov_interp.probes._common import Model, ProbeBatch, Probs, json_safe, target_losses
from markov_interp.probes.ablation import AblationTable, set_ablation_losses
from markov_interp.probes._display import ProbeResult, dataframe
from markov_interp.probes.attention import AttentionScores
from markov_interp.probes.interventions import Component


@dataclasses.dataclass(frozen=True, kw_only=True)
class Role:
    """One role of the circuit: its set of heads, their excess scores, and the cost of ablating the set."""

    kind: str  # "previous_token" or "induction"
    index: int  # the lag (previous_token) or the order (induction)
    heads: tuple[Component, ...]
    scores: tuple[float, ...]  # each head's excess score for the role
    ablation: Optional[float]  # loss change (nats) when the whole set is mean-ablated; None if no head
    confirmed: bool

    @property
    def name(self) -> str:
        return f"previous-token lag {self.index}" if self.kind == "previous_token" else f"induction order {self.index}"

    def to_dict(self) -> dict[str, Any]:
        return json_safe({"kind": self.kind, "index": self.index, "name": self.name,
                          "heads": [h.name for h in self.heads], "scores": list(self.scores),
                          "ablation": self.ablation, "confirmed": self.confirmed})


@dataclasses.dataclass(frozen=True, kw_only=True, repr=False)
class Circuit(ProbeResult):
    """The order-`order` circuit found in the weights (module docstring)."""

    order: int
    roles: tuple[Role, ...]
    model_gain: float  # L(in-context estimator of order - 1) - L(model), nats
    required: float  # destroy_fraction x model_gain: what each role's set ablation must cost
    layer_ablation: tuple[tuple[Component, float], ...]  # each whole attention layer mean-ablated
    n_layers: int
    confirmed: bool
    near: bool  # a role's cost within a factor `near` of the requirement

    def role(self, kind: str, index: int) -> Optional[Role]:
        for r in self.roles:
            if r.kind == kind and r.index == index:
                return r
        return None

    def top_head(self, kind: str, index: int) -> Optional[tuple[int, int]]:
        """(layer, head) of the role's head with the largest excess score (None for an empty role)."""
        r = self.role(kind, index)
        if r is None or not r.heads:
            return None
        best = max(range(len(r.heads)), key=lambda i: r.scores[i])
        return r.heads[best].layer, r.heads[best].head

    def role_ablation(self, kind: str, index: int) -> Optional[float]:
        r = self.role(kind, index)
        return None if r is None else r.ablation

    def missing(self) -> str:
        """Why the circuit is not confirmed, in words."""
        if self.n_layers < 2:
            return "a single-layer model has no induction circuit (it needs a previous-token head below it)"
        if self.model_gain <= 0:
            return f"the model gains nothing from the order-{self.order} context ({self.model_gain:+.4f} nats)"
        empty = [r.name for r in self.roles if not r.heads]
        if empty:
            return "no head takes the role(s) " + ", ".join(empty)
        weak = [f"{r.name} {_heads(r.heads)} costs {r.ablation:+.4f}" for r in self.roles if not r.confirmed]
        return f"ablating the role sets does not remove the gain (needs >= {self.required:.4f}): " + "; ".join(weak)

    def summary(self) -> str:
        roles = "; ".join(
            f"{r.name}: {_heads(r.heads)} (ablation {_num(r.ablation)}{', confirmed' if r.confirmed else ''})"
            for r in self.roles
        )
        layers = ", ".join(f"{c.name} {v:+.4f}" for c, v in self.layer_ablation)
        return (f"circuit of order {self.order}: model's in-context gain {self.model_gain:.4f} nats (each role's "
                f"set ablation must cost >= {self.required:.4f}); {roles}; whole attention layers: {layers}")

    def to_dataframe(self) -> Any:
        """One row per role (index its name, e.g. "induction order 1"): its heads and their excess scores, the
        loss change when the set is mean-ablated, what the confirmation required, and whether it is confirmed.

        Returns:
            A pandas DataFrame.
        """
        return dataframe(({"role": r.name, "heads": ", ".join(h.name for h in r.heads),
                           "scores": ", ".join(f"{x:.2f}" for x in r.scores), "ablation": r.ablation,
                           "required": self.required, "confirmed": r.confirmed} for r in self.roles), index="role")

    def _headline(self) -> str:
        roles = "; ".join(f"{r.name} {_heads(r.heads)}{' confirmed' if r.confirmed else ''}" for r in self.roles)
        return f"order-{self.order} circuit, {'confirmed' if self.confirmed else 'not confirmed'}: {roles}"

    def to_dict(self) -> dict[str, Any]:
        return json_safe({
            "order": self.order, "roles": [r.to_dict() for r in self.roles], "model_gain": self.model_gain,
            "required": self.required, "layer_ablation": {c.name: v for c, v in self.layer_ablation},
            "n_layers": self.n_layers, "confirmed": self.confirmed, "near": self.near,
        })


def _heads(heads: tuple[Component, ...]) -> str:
    return "{" + ", ".join(h.name for h in heads) + "}" if heads else "no head"


def _num(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:+.4f}"


def role_heads(scores: AttentionScores, kind: str, index: int, *, layers: range, threshold: float
               ) -> tuple[tuple[Component, ...], tuple[float, ...]]:
    """The heads in `layers` whose excess score for the role is >= `threshold`, strongest first."""
    grid = scores.lag_excess(index) if kind == "previous_token" else scores.induction_excess(index)
    found = [(float(grid[layer, head]), Component(kind="head", layer=layer, head=head))
             for layer in layers for head in range(grid.shape[1]) if float(grid[layer, head]) >= threshold]
    found.sort(key=lambda pair: -pair[0])
    return tuple(c for _, c in found), tuple(s for s, _ in found)


def model_in_context_gain(probs: Probs, batch: ProbeBatch, *, order: int, beta: float) -> float:
    """L(in-context add-beta estimator of order `order` - 1) - L(model) on the batch (nats)."""
    tokens = batch.tokens.cpu()
    lower = theory.add_beta_predictions(tokens, batch.vocab, order=order - 1, beta=beta)
    return float(target_losses(lower, tokens).mean() - target_losses(probs.cpu(), tokens).mean())


def find_circuit(
    model: Model,
    batch: ProbeBatch,
    scores: AttentionScores,
    table: AblationTable,
    *,
    order: int,
    beta: float,
    probs: Probs,
    cache: Optional[Any],
    thresholds: Any,
) -> Circuit:
    """The order-`order` circuit of `model` on `batch`: role sets, their set-ablation costs, confirmation."""
    th = thresholds
    n_layers = int(model.cfg.n_layers)
    induction, ind_scores = role_heads(scores, "induction", order, layers=range(1, n_layers),
                                       threshold=th.head_excess)
    top = max((c.layer for c in induction), default=n_layers - 1)
    specs = [("previous_token", lag, *role_heads(scores, "previous_token", lag, layers=range(top),
                                                 threshold=th.head_excess)) for lag in range(1, order + 1)]
    specs.append(("induction", order, induction, ind_scores))
    gain = model_in_context_gain(probs, batch, order=order, beta=beta)
    required = th.destroy_fraction * gain
    filled = [s for s in specs if s[2]]
    losses = set_ablation_losses(model, batch.tokens, [s[2] for s in filled], method="mean", cache=cache)
    cost = {(s[0], s[1]): loss - table.clean_loss for s, loss in zip(filled, losses)}
    roles, near = [], False
    for kind, index, heads, role_scores in specs:
        ablation = cost.get((kind, index))
        ok = ablation is not None and gain > 0 and n_layers >= 2 and ablation >= required
        near |= ablation is not None and gain > 0 and required / th.near <= ablation <= required * th.near
        roles.append(Role(kind=kind, index=index, heads=heads, scores=role_scores, ablation=ablation, confirmed=ok))
    layers = tuple((c, table[c]) for c in table.components if c.kind == "attn")
    return Circuit(order=order, roles=tuple(roles), model_gain=gain, required=required, layer_ablation=layers,
                   n_layers=n_layers, confirmed=all(r.confirmed for r in roles), near=near)
