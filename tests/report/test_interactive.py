"""Tests of markov_interp.report.interactive: the circuit as an offline HTML/JS figure, on the hand-built induction
circuit (previous-token head L0H0 feeding the keys of induction head L1H0: what each head does is known by
construction), and in a real browser: clicking a head shows its pattern and OV / QK, hovering an edge shows its
effect and what it carries, and no element of the report's first screen runs out of its box."""

import json
import re

import pytest
import torch

from handbuilt import induction_circuit
from markov_interp import probes, report
from markov_interp.report.interactive import interactive_circuit
from markov_interp.sources import RandomMarkov

from tests.report.test_report import CHROMIUM, _browser, network_references, overflowing

SEQ = 32


@pytest.fixture(scope="module")
def built():
    torch.set_num_threads(1)
    model = induction_circuit(3, n_ctx=SEQ)
    return model, report.from_model(model, RandomMarkov(3), n_sequences=16, seq_len=SEQ, sample_len=SEQ)


def _data(fragment: str) -> dict:
    """The JSON the fragment's script reads (what the page shows is drawn from it)."""
    return json.loads(re.search(r"const root=document.getElementById\(\"[^\"]+\"\),data=(\{.*?\});\n", fragment,
                                flags=re.DOTALL).group(1))


def test_heads_carry_their_own_ov_qk_and_attention(built):
    model, rep = built
    tokens = probes.sample_batch(RandomMarkov(3), n_sequences=2, seq_len=SEQ, seed=5).tokens[0]
    widget = interactive_circuit(rep.mechanism, model, tokens)
    assert set(widget.data["nodes"]) == {"L0H0", "L1H0"}
    ov, qk = probes.ov_circuits(model), probes.qk_circuits(model)
    for name, (layer, head) in (("L0H0", (0, 0)), ("L1H0", (1, 0))):
        torch.testing.assert_close(torch.tensor(widget.data["nodes"][name]["ov"]), ov[layer, head].float(),
                                   atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.tensor(widget.data["nodes"][name]["qk"]), qk[layer, head].float(),
                                   atol=1e-4, rtol=0)
    attention = torch.tensor(widget.data["nodes"]["L1H0"]["attention"])
    assert attention.shape == (SEQ, SEQ) and torch.allclose(attention.sum(1), torch.ones(SEQ), atol=1e-3)
    # by construction the induction head attends to the keys whose previous state is the query's state
    for i in range(SEQ):
        match = [j for j in range(1, i + 1) if tokens[j - 1] == tokens[i]]
        if match:
            assert float(attention[i, match].sum()) > 0.9, (i, match)
    previous = torch.tensor(widget.data["nodes"]["L0H0"]["attention"])
    assert all(float(previous[i, i - 1]) > 0.9 for i in range(1, SEQ))  # the previous-token head


def test_edges_show_their_effect_and_what_they_carry(built):
    model, rep = built
    mech, content = rep.mechanism, rep.mechanism.content
    tokens = probes.sample_batch(RandomMarkov(3), n_sequences=2, seq_len=8, seed=0).tokens[0]
    widget = interactive_circuit(mech, model, tokens, content=content)
    graph = mech.graph
    assert set(widget.data["edges"]) == {e.name for e in graph.edges}
    for e in graph.edges:
        text = widget.data["edges"][e.name]
        assert f"{e.effect:+.4f} nats" in text and (("kept" in text) == (e.name in graph.kept_names))
    assert content is not None and "L0H0->L1H0.k" in content
    assert content["L0H0->L1H0.k"].describe() in widget.data["edges"]["L0H0->L1H0.k"]
    assert "lag1" in widget.data["edges"]["L0H0->L1H0.k"]  # the K-edge carries the previous state


def test_the_report_embeds_the_widget_offline(built):
    _, rep = built
    body = rep.section("circuit").body()
    assert body.count('class="icircuit"') == 1 and body.count('class="edge') == len(rep.mechanism.graph.kept)
    data = _data(body)
    assert data["first"] == "L0H0" and data["tokens"] and not network_references(rep.html)


def _edge_point(page, selector: str) -> dict:
    return page.evaluate(
        "(s) => { const e = document.querySelector(s); const q = e.getPointAtLength(e.getTotalLength() / 2),"
        " m = e.getScreenCTM(); return {x: q.x * m.a + m.e, y: q.y * m.d + m.f}; }", selector)


@pytest.mark.slow
def test_clicks_and_hovers_in_a_real_browser(built, tmp_path):
    sync_playwright = _browser()
    _, rep = built
    path = rep.save(tmp_path / "model.html")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu",
                                                                     "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            fetched, errors = [], []
            page.on("request", lambda r: fetched.append(r.url) if r.url.startswith(("http:", "https:")) else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(path.resolve().as_uri(), wait_until="load")
            assert overflowing(page, "#section-summary") == []  # the first screen
            assert overflowing(page, "#section-circuit") == []
            panel = "#section-circuit .ic-panel"
            assert page.inner_text(panel).startswith("L0H0")  # the first head on the circuit, shown at load
            page.click("#section-circuit [data-node='L1H0']")
            text = page.inner_text(panel)
            cells = page.evaluate(f"() => [...document.querySelectorAll('{panel} table')[0].querySelectorAll("
                                  "'td:not(.lab)')].map(td => td.textContent)")
            ov = probes.ov_circuits(built[0])[1, 0]
            assert text.startswith("L1H0") and cells == [f"{float(v):.2f}".replace("-0.00", "0.00") for v in ov.flatten()]
            assert page.evaluate(f"() => document.querySelectorAll('{panel} img').length") == 1  # the pattern
            point = _edge_point(page, "#section-circuit path[data-edge='L0H0->L1H0.k']")
            page.mouse.move(point["x"], point["y"])
            tip = page.inner_text("#section-circuit .ic-tip")
            assert tip.startswith("L0H0->L1H0.k: path-patching effect") and "carries lag1" in tip
            page.set_content('<div id="clipped"><svg width="100" height="20" viewBox="0 0 100 20"><text x="50" '
                             'y="12" text-anchor="middle">a caption far wider than its picture</text></svg>'
                             '<div style="width:50px;overflow:hidden;white-space:nowrap">words beyond the box'
                             '</div></div>')
            found = overflowing(page, "#clipped")  # the check itself can fail
            assert {f[0] for f in found} >= {"box", "svg text"}, found
        finally:
            browser.close()
    assert fetched == [] and errors == []
