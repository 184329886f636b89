"""The cited papers' claims read against the phase diagram's cells (`phases.claims`): each claim's cells, its
verdict at the budget ("holds", "fails", "not resolved", "not tested") from the seeds' Wilson intervals, at every
alphabet (number of states) the cells hold, and the claims table.

A claim that a shape learns a law "with an induction head" holds only when most seeds reach the law and the
seeds carrying the circuit (the classifier's `induction` label where the seeds were classified) have a Wilson
interval above 1/2: the law alone is not the claim.
"""

import functools
from typing import Optional

from markov_interp.experiments._base import Table

__all__ = ["shape_label", "claims", "claims_table", "NOT_TESTED"]


def shape_label(heads: tuple) -> str:
    """"L2 (2,1)": depth and heads per layer; one count for all layers reads "L2 x1"."""
    if len(set(heads)) == 1:
        return f"L{len(heads)} x{heads[0]}"
    return f"L{len(heads)} ({','.join(map(str, heads))})"


def _find(cells: list[dict], family: str, heads: tuple, order: int, vocab: int) -> Optional[dict]:
    return next((c for c in cells if c["family"] == family and tuple(c["heads"]) == heads and c["order"] == order
                 and c.get("vocab", 2) == vocab), None)


def _majority(p: Optional[dict]) -> str:
    """Whether most seeds do it: 'yes' (Wilson interval above 1/2), 'no' (below), 'mixed'."""
    if not p or p["n"] == 0:
        return "not run"
    lo, hi = p["interval"]
    return "yes" if lo > 0.5 else "no" if hi < 0.5 else "mixed"


def _fmt_p(p: Optional[dict]) -> str:
    if not p or not p["n"]:
        return "not run"
    lo, hi = p["interval"]
    return f"{p['k']}/{p['n']} [{lo:.2f}, {hi:.2f}]"


def _compare(a: Optional[dict], b: Optional[dict]) -> str:
    """'ahead' when proportion a's Wilson interval lies above b's, 'behind' when below, else 'not resolved'."""
    if not a or not b or not a["n"] or not b["n"]:
        return "not run"
    if a["interval"][0] > b["interval"][1]:
        return "ahead"
    return "behind" if a["interval"][1] < b["interval"][0] else "not resolved"


# (paper, claim, kind, cells): a cell is (family, heads(k), orders). Kinds: "learn" (the paper trained it: does
# most of the grid's seeds reach the order-k law?), "learn-circuit" (and with an induction head: most seeds also
# carry the circuit, `_circuit_proportion`), "represent" (a construction; training need not find it),
# "learn-not" (the paper says it does not), "versus" (the first cell against the second at each order).
_CLAIMS = (
    ("Rajaraman et al. 2024", "trained long enough, a fixed depth with one head per layer reaches the order-k law "
     "as k grows", "learn", [("layernorm", lambda k: (1, 1), (2, 3)), ("layernorm", lambda k: (1, 1, 1), (2, 3))]),
    ("Rajaraman et al. 2024", "three layers with one head each and LayerNorm represent the order-k law for any k",
     "represent", [("layernorm", lambda k: (1, 1, 1), (1, 2, 3))]),
    ("Rajaraman et al. 2024", "LayerNorm is what lets constant depth suffice: attention-only models need more "
     "layers or heads as k grows (LayerNorm cell against the attention-only cell of the same shape)", "versus",
     [("layernorm", lambda k: (1, 1), (1, 2, 3)), ("attention-only", lambda k: (1, 1), (1, 2, 3))]),
    ("Ekbote et al. 2025", "two layers with one head each represent the order-k law", "represent",
     [("layernorm", lambda k: (1, 1), (1, 2, 3)), ("attention-only", lambda k: (1, 1), (1, 2, 3))]),
    ("Nichani et al. 2024", "one layer-0 head per parent (lag) feeding an induction head: k heads in layer 0 "
     "against one", "versus", [("layernorm", lambda k: (k, 1), (2, 3)), ("layernorm", lambda k: (1, 1), (2, 3))]),
    ("Edelman et al. 2024", "one layer cannot form an induction head: depth 1 does not reach the bigram law",
     "learn-not", [("layernorm", lambda k: (1,), (1,)), ("layernorm", lambda k: (3,), (1,))]),
    ("Edelman et al. 2024", "two layers learn the in-context bigram law with an induction head", "learn-circuit",
     [("layernorm", lambda k: (1, 1), (1,)), ("attention-only", lambda k: (1, 1), (1,))]),
)
# verdicts: "holds", "fails" (at this budget: a claim about what training reaches), "not resolved" (the Wilson
# interval straddles 1/2, or two cells' intervals overlap) and "not tested" (a cell the budget does not run)
_LEARN = {"yes": "holds", "no": "fails at this budget", "mixed": "not resolved (mixed)"}
_LEARN_NOT = {"no": "holds", "yes": "fails", "mixed": "not resolved (mixed)"}
_REPRESENT = {"yes": "holds (training finds it)", "mixed": "not resolved (mixed)",
              "no": "not shown: training does not find it at this budget (a construction need not be found)"}
_VERSUS = {"ahead": "holds", "behind": "fails", "not resolved": "not resolved"}
NOT_TESTED = "not tested at this budget"


def _claim_row(paper: str, claim: str, cell: Optional[dict], family: str, heads: tuple, k: int,
               verdict: str, vocab: int) -> dict:
    circuit = cell["circuit"] if cell else None
    return {"paper": paper, "claim": claim, "family": family, "vocab": vocab, "shape": shape_label(heads), "order": k,
            "reached": cell["reached"][str(k)] if cell else None,
            "full_circuit": circuit["full"] if circuit else None,
            "induction": _circuit_proportion(cell), "verdict": verdict}


def _circuit_proportion(cell: Optional[dict]) -> Optional[dict]:
    """The seeds of `cell` with an induction circuit: those `probes.classify_mechanism` labels `induction` (roles
    by what the edges carry) where the cell's seeds were classified, else the full attention circuit."""
    circuit = (cell or {}).get("circuit")
    if not circuit:
        return None
    classified = circuit.get("classified") or {"n": 0}
    return classified["induction"] if classified["n"] else circuit["full"]


def _circuit_verdict(found: list, i: int, k: int) -> str:
    """"Learns the law with an induction head": holds only when most seeds reach the law AND the circuit's Wilson
    interval lies above 1/2 (the law alone is not the claim)."""
    cell = found[i][2]
    if cell is None:
        return NOT_TESTED
    law, circuit = _majority(cell["reached"][str(k)]), _majority(_circuit_proportion(cell))
    if law != "yes":
        return _LEARN.get(law, law)
    if circuit == "yes":
        return "holds"
    words = "fails: the law without an induction head" if circuit == "no" else "not resolved: the circuit is mixed"
    return f"{words} ({_fmt_p(_circuit_proportion(cell))})"


def _verdict(kind: str, found: list, i: int, k: int) -> str:
    """The verdict of claim `kind` for cell i of `found` ((family, heads, cell) per cell of the claim)."""
    return _VERDICTS[kind](found, i, k)


def _versus_verdict(found: list, i: int, k: int) -> str:
    """A claim comparing two cells: the first against the second (which is "the comparison")."""
    cell = found[i][2]
    other = found[1 - i] if len(found) == 2 else None
    if cell is None or other is None or other[2] is None:
        return NOT_TESTED
    if i == 1:
        return "(the comparison)"
    compared = _compare(cell["reached"][str(k)], other[2]["reached"][str(k)])
    return f"{_VERSUS[compared]} ({compared} of {other[0]} {shape_label(other[1])})"


def _majority_verdict(words: dict[str, str], found: list, i: int, k: int) -> str:
    """A claim about one cell: its seeds' majority (reached the order-k law or not) in the claim's words."""
    cell = found[i][2]
    if cell is None:
        return NOT_TESTED
    majority = _majority(cell["reached"][str(k)])
    return words.get(majority, majority)


_VERDICTS = {"versus": _versus_verdict, "learn": functools.partial(_majority_verdict, _LEARN),
             "learn-circuit": _circuit_verdict,
             "learn-not": functools.partial(_majority_verdict, _LEARN_NOT),
             "represent": functools.partial(_majority_verdict, _REPRESENT)}


def claims(cells: list[dict]) -> list[dict]:
    """One row per cited claim, order and cell bearing on it: the fraction of seeds reaching the order-k law
    (Wilson 95%), the fraction with a full circuit, and the verdict at this budget: "holds", "fails" ("at this
    budget" for what training reaches), "not resolved" (the interval straddles 1/2; for a comparison, the two
    cells' Wilson intervals overlap) or "not tested at this budget" (a cell the budget does not run)."""
    rows = []
    for vocab in sorted({c.get("vocab", 2) for c in cells}) or [2]:  # every alphabet the cells hold
        for paper, claim, kind, spec in _CLAIMS:
            for k in sorted({k for _, _, ks in spec for k in ks}):
                found = [(family, heads(k), _find(cells, family, heads(k), k, vocab)) for family, heads, ks in spec
                         if k in ks]
                for i, (family, heads, cell) in enumerate(found):
                    rows.append(_claim_row(paper, claim, cell, family, heads, k, _verdict(kind, found, i, k), vocab))
    return rows


def claims_table(rows: list[dict]) -> Table:
    """One row per cited claim and cell (`claims`)."""
    return Table(("paper", "claim", "states", "cell", "order k", "seeds reaching order k [95% CI]",
                  "full circuit (attention)", "induction (classifier)", "at this budget"),
                 [(r["paper"], r["claim"], str(r.get("vocab", 2)), f"{r['family']} {r['shape']}", str(r["order"]),
                   _fmt_p(r["reached"]), _fmt_p(r["full_circuit"]), _fmt_p(r.get("induction")), r["verdict"])
                  for r in rows])
