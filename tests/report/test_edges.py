"""The report's "What the edges carry" section (`report._edges`) on a hand-built induction circuit, whose kept
K-edge carries the previous state by construction and whose layer 0 writes that state into the residual stream."""

import dataclasses
import re

import pytest

from handbuilt import induction_circuit
from markov_interp import probes, report
from markov_interp.report import _edges
from markov_interp.sources import RandomMarkov


@pytest.fixture(scope="module")
def probed():
    model, source = induction_circuit(3, n_ctx=64), RandomMarkov(3)
    batch = probes.sample_batch(source, n_sequences=32, seq_len=64, seed=0)
    mech = probes.classify_mechanism(model, source, batch=batch, seed=0)
    return model, batch, mech


def _cells(table_html: str) -> list[list[str]]:
    return [re.findall(r"<t[dh]>(.*?)</t[dh]>", row) for row in re.findall(r"<tr>(.*?)</tr>", table_html)]


def test_the_section_names_the_lag1_edge_and_reads_the_previous_state_after_layer_0(probed):
    model, batch, mech = probed
    intro, edges, probe_text, sites = _edges.edges_section(model, batch, mech, seed=0)
    rows = {r[0]: r for r in _cells(edges)[1:]}
    k_edge = rows["L0H0-&gt;L1H0.k"]  # the previous-token head into the induction head's keys
    assert k_edge[1] == "lag1" and k_edge[2] == "lagged state"
    explained = float(k_edge[3].split(":")[1].split()[0])
    assert explained >= mech.content.cut and explained == pytest.approx(mech.content["L0H0->L1H0.k"].explained["lag1"],
                                                                        abs=5e-3)
    assert rows["embed-&gt;L1H0.q"][1:4] == ["state", "current state", "by construction"]
    by_site = {r[0]: r for r in _cells(sites)[1:]}
    assert list(by_site) == ["L0.resid_pre", "L0.resid_post", "L1.resid_post"]
    before, after = (float(by_site[s][3].split()[0]) for s in ("L0.resid_pre", "L0.resid_post"))
    # before layer 0 only the current state and the position are there: near the control; after it, x_{t-1} is
    # written by the previous-token head (attention 1 on t-1 by construction) and read exactly
    assert abs(before) < 0.1 and after > 0.5
    assert float(by_site["L0.resid_post"][1].split()[0]) > 0.95
    text = intro + edges + probe_text + sites
    assert "http" not in text and "<script" not in text  # offline: no link, nothing fetched


def test_without_edge_content_the_section_says_why_and_still_probes(probed):
    model, batch, mech = probed
    parts = _edges.edges_section(model, batch, dataclasses.replace(mech, content=None), seed=0)
    assert len(parts) == 3 and "was not measured" in parts[0] and "L1.resid_post" in parts[2]


def test_the_section_is_a_model_section_after_the_circuit():
    ids = list(report.SECTION_IDS)
    assert ids.index("edges") == ids.index("circuit") + 1 and "edges" in report.MODEL_SECTION_IDS
