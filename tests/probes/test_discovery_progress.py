"""The path-patching bar of `discover_circuit`: its total is planned before the first run and grown in one
announced step, never run by run (a notebook showed "100%" up to eight times in one call)."""

import pytest

from markov_interp.probes import discover_circuit, discovery
from markov_interp.sources import RandomMarkov
from tests.handbuilt import induction_circuit

SEQ = 24


@pytest.fixture
def bars(monkeypatch):
    made = []

    def spy(enabled):
        bar = discovery._Runs(False)  # counted, never drawn
        made.append(bar)
        return bar

    monkeypatch.setattr(discovery, "_progress", spy)
    return made


@pytest.mark.parametrize("method", ["exact", "attribution+verify", "attribution"])
def test_the_total_is_announced_up_front_and_grown_once(bars, method):
    model, source = induction_circuit(3, n_ctx=SEQ), RandomMarkov(3)
    graph = discover_circuit(model, source, seq_len=SEQ, n_sequences=16, method=method)
    (bar,) = bars
    first, second, *rest = bar.totals
    # first: the planned single edges; second: the circuit and joint tests, planned once the kept edges are known
    assert first > 0 and second > 0 and graph.n_runs == bar.n
    assert rest in ([], [bar.n]), bar.totals  # at most the close, where a bound ends at the runs done
    assert bar.totals[-1] == bar.n


def test_every_run_is_counted_against_the_runner():
    model, source = induction_circuit(3, n_ctx=SEQ), RandomMarkov(3)
    runs = discovery._Runs(False)
    with runs:
        runs.plan(3, "single edges")
        runs.update(2)
        runs.total = 7  # an overrun, as `EdgeRunner.run_many` asks for it
        runs.refresh()
    assert runs.totals == [3, 7, 2] and runs.n == 2
    graph = discover_circuit(model, source, seq_len=SEQ, n_sequences=16, method="exact", progress=False)
    singles = sum(1 for e in graph.edges if e.verified and e.se == e.se)  # measured alone in the token pass ...
    assert graph.n_runs >= singles  # ... each one run
