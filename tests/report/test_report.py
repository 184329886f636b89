"""Tests of markov_interp.report: the offline HTML builder, the figures, the full report, and a real browser.

The browser test opens the report in Debian's chromium (driven by playwright, never downloading a browser)
with every http(s) request aborted, and checks that nothing was requested, no JavaScript error occurred and
circuitsvis drew its figure. It is skipped, with the reason, only where chromium or playwright is missing
(CI installs both).
"""

import os
import re
import shutil
import urllib.request
from pathlib import Path

import pytest
import torch
from matplotlib.figure import Figure

from markov_interp import models, report
from markov_interp.cli import main as cli_main
from markov_interp.sources import RandomMarkov
from markov_interp.probes import MECHANISMS
from markov_interp.probes.ablation import AblationTable
from markov_interp.probes.attention import AttentionScores
from markov_interp.probes.readout import KernelReadout
from markov_interp.report._html import _json_for_script, circuits_figure

CHROMIUM = os.environ.get("MARKOV_INTERP_CHROMIUM", "/usr/bin/chromium")
BUNDLE_MARKER = "var CircuitsVis="  # the bundle's first statement: must appear exactly once per file

# Anything that would make a browser fetch from the network: external scripts, stylesheets, module imports.
NETWORK_PATTERNS = [
    r"<script[^>]*\bsrc\s*=\s*[\"']?\s*(https?:)?//",
    r"<link[^>]*\bhref\s*=\s*[\"']?\s*(https?:)?//",
    r"\bimport\s[^;]{0,200}?\bfrom\s*[\"'](https?:)?//",
    r"\bimport\s*\(\s*[\"'](https?:)?//",
    r"@import\s+(url\()?\s*[\"']?(https?:)?//",
    r"url\(\s*[\"']?(https?:)?//",
    r"<(img|iframe|embed|source|video|audio)[^>]*\bsrc\s*=\s*[\"']?\s*(https?:)?//",
]


def network_references(text: str) -> list[str]:
    """Every place in an HTML text that would load something over http(s)."""
    found = []
    for pattern in NETWORK_PATTERNS:
        found += [m.group(0)[:120] for m in re.finditer(pattern, text, flags=re.IGNORECASE)]
    return found


# ------------------------------------------------------------------------------------------ offline HTML
def test_network_check_catches_cdn_html():
    """The check itself can fail: circuitsvis's CDN rendering and the usual tags are caught."""
    assert network_references('<script src="https://unpkg.com/x.js"></script>')
    assert network_references('<link rel="stylesheet" href="http://a.b/c.css">')
    assert network_references('import { render } from "https://unpkg.com/circuitsvis/dist/cdn/esm.js";')
    assert network_references("<style>@import url('https://fonts.googleapis.com/css');</style>")
    assert not network_references('<svg xmlns="http://www.w3.org/2000/svg"></svg><script>var a=1;</script>')


def test_bundle_is_safe_to_inline():
    bundle = report.circuitsvis_bundle()
    assert len(bundle) > 100_000
    assert BUNDLE_MARKER in bundle
    assert "</script" not in bundle.lower()
    assert "sourceMappingURL" not in bundle[-300:]
    assert not network_references(bundle)


def test_json_for_script_cannot_close_the_script():
    text = _json_for_script({"tokens": ["</script><script>alert(1)</script>", "<!--"]})
    assert "</" not in text and "<!--" not in text
    import json

    assert json.loads(text)["tokens"][0] == "</script><script>alert(1)</script>"


def _attention_figure(n_layers: int = 2, seq: int = 6) -> report.CircuitsFigure:
    tokens = torch.tensor([0, 1, 1, 0, 1, 0])[:seq]
    pattern = torch.tril(torch.ones(seq, seq))
    pattern = pattern / pattern.sum(-1, keepdim=True)
    return report.attention_patterns_figure(pattern.expand(n_layers, 1, seq, seq).clone(), tokens)


def test_document_inlines_the_bundle_once_for_many_figures():
    figs = [_attention_figure(), _attention_figure(), _attention_figure()]
    sections = [report.Section("a", "A", (figs[0], "<p>x</p>")), report.Section("b", "B", tuple(figs[1:]))]
    doc = report.document("title", sections)
    assert doc.count(BUNDLE_MARKER) == 1
    assert doc.count("CircuitsVis.render(") == 3 + report.circuitsvis_bundle().count("CircuitsVis.render(")
    assert len({f.element_id for f in figs}) == 3
    for f in figs:
        assert f'id="{f.element_id}"' in doc
    assert 'id="section-a"' in doc and 'id="section-b"' in doc
    assert not network_references(doc)


def test_document_without_circuitsvis_has_no_bundle():
    fig = Figure()
    fig.add_subplot().plot([0, 1], [1, 0])
    doc = report.document("t", [report.Section("plot", "Plot", (fig, "<p>hi</p>"))])
    assert BUNDLE_MARKER not in doc
    assert "<svg" in doc and "<?xml" not in doc and "DOCTYPE svg" not in doc


def test_attention_figure_props():
    fig = _attention_figure(n_layers=2, seq=6)
    assert fig.component == "AttentionHeads"
    assert fig.props["tokens"] == ["0", "1", "1", "0", "1", "0"]
    assert fig.props["attentionHeadNames"] == ["L0H0", "L1H0"]
    assert len(fig.props["attention"]) == 2 and len(fig.props["attention"][0]) == 6
    with pytest.raises(ValueError, match="do not match"):
        report.attention_patterns_figure(torch.ones(1, 1, 5, 5), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="component"):
        circuits_figure("Attention<script>", {})


def test_jupyter_display_makes_no_network_probe(monkeypatch):
    """circuitsvis's own RenderedHTML fetches google.com to decide; ours must never touch the network."""

    def no_network(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    import socket

    monkeypatch.setattr(socket, "create_connection", no_network)
    out = _attention_figure()._repr_html_()
    assert BUNDLE_MARKER in out and "CircuitsVis.render(" in out
    assert not network_references(out)


def test_figure_svg_salts_ids_and_closes_pyplot_figures():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    fig.add_subplot().imshow([[0, 1], [1, 0]])
    n_open = len(plt.get_fignums())
    svg = report.figure_svg(fig, salt="one")
    assert svg.startswith("<svg") and "<metadata>" not in svg
    assert len(plt.get_fignums()) == n_open - 1


def test_atomic_write(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "r.html"
    report.atomic_write_text(path, "first")
    assert path.read_text() == "first"

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        report.atomic_write_text(path, "second")
    assert path.read_text() == "first"
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.html"]  # no temp file left behind
    monkeypatch.undo()
    with pytest.raises(ValueError, match="folder"):
        report.atomic_write_text(tmp_path, "x")


def test_section_validation():
    with pytest.raises(ValueError, match="section id"):
        report.Section("Bad Id", "t", ())
    with pytest.raises(TypeError, match="section part"):
        report.Section("ok", "t", (3,)).body()


# --------------------------------------------------------------------------- figures from hand-built probes
def _scores() -> AttentionScores:
    return AttentionScores(
        previous_token=torch.tensor([[0.95, 0.1], [0.1, 0.05]]),
        induction=torch.tensor([[0.5, 0.5], [0.9, 0.4]]),
        same_token=torch.tensor([[0.5, 0.6], [0.5, 0.5]]),
        previous_token_chance=0.1, induction_chance=0.5, same_token_chance=0.5,
    )


def test_probe_figures_draw_the_given_numbers():
    fig = report.head_scores_figure(_scores())
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "0.95" in texts and "0.90" in texts  # raw scores annotated
    assert any("chance 0.100" in ax.get_title() for ax in fig.axes)

    table = AblationTable(method="mean", clean_loss=0.5, components=("L0H0", "L0.attn", "L1H0", "L1.attn"),
                          losses=(0.55, 0.56, 0.8, 0.81), n_layers=2, n_heads=1)
    fig = report.ablation_figure(table, bigram_gain=0.1)
    widths = [round(p.get_width(), 6) for p in fig.axes[0].patches]
    assert widths == [0.05, 0.06, 0.3, 0.31]

    true = torch.tensor([[0.8, 0.2], [0.3, 0.7]], dtype=torch.float64)
    readout = KernelReadout(implied=true + 0.01, counts=torch.tensor([10, 10]), true=true, max_abs_error=0.01,
                            weighted_kl=0.001)
    fig = report.kernel_figure(readout)
    assert len([ax for ax in fig.axes if ax.images]) == 3  # implied, true, difference
    assert "0.810" in [t.get_text() for t in fig.axes[0].texts]

    metrics = [{"step": s, "train_loss": 0.7 - s / 1000} for s in range(10, 110, 10)]
    metrics[-1].update(eval_loss=0.6, entropy_rate=0.5446, unigram_loss=0.6730)
    fig = report.loss_curves_figure(metrics, {"entropy_rate": 0.5446, "unigram_loss": 0.6730})
    levels = sorted(round(line.get_ydata()[0], 4) for line in fig.axes[0].lines if len(set(line.get_ydata())) == 1
                    and len(line.get_ydata()) == 2)
    assert 0.5446 in levels and 0.673 in levels
    fig = report.training_probes_figure([1, 10, 100], {"previous-token excess L0H0": [0.0, 0.2, 0.9]},
                                        metrics=metrics, references={"unigram_loss": 0.673}, head_threshold=0.3)
    assert list(fig.axes[0].lines[0].get_ydata()) == [0.0, 0.2, 0.9]
    fig = report.strategy_similarity_figure([1, 10, 100], {"uniform 1/V": [0.0, 0.1, 0.2],
                                                           "in-context unigram": [0.1, 0.05, 0.1]})
    assert [line.get_label() for line in fig.axes[0].lines] == ["uniform 1/V", "in-context unigram"]
    assert list(fig.axes[0].lines[1].get_ydata()) == [0.1, 0.05, 0.1]


# ------------------------------------------------------------------------------------------ full reports
def _train(out: Path, *, source: dict, preset: str, steps: int, seq_len: int, **model_overrides):
    from markov_interp.sources import SourceConfig
    from markov_interp.models import preset as model_preset
    from markov_interp.training import RunConfig, TrainConfig, train

    src = SourceConfig(**source)
    model = model_preset(preset, d_vocab=src.vocab_size, n_ctx=seq_len, **model_overrides)
    cfg = TrainConfig(steps=steps, batch_size=16, seq_len=seq_len, seed=0, device="cpu", eval_every=steps // 4,
                      n_checkpoints=4, log_every=5)
    train(RunConfig(source=src, model=model, train=cfg), out, progress=False)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A two-layer attention-only run on random kernels and a one-layer tied run on a binary chain, each with
    its report saved (tiny settings: seconds of training)."""
    base = tmp_path_factory.mktemp("report-runs")
    two = _train(base / "two-layer", source=dict(kind="random", vocab=3, alpha=1.0), preset="attn-only-2layer",
                 steps=80, seq_len=48)
    one = _train(base / "one-layer", source=dict(kind="binary", p=0.2, q=0.3), preset="paper-1layer",
                 steps=40, seq_len=48)
    out = {}
    for name, run in (("two", two), ("one", one)):
        rep = report.build(run, n_sequences=16, sample_len=24, max_checkpoints=3)
        out[name] = (run, rep, rep.save())
    return out


@pytest.mark.slow
def test_report_file_has_every_section_and_no_network_reference(runs):
    for name, (run, rep, path) in runs.items():
        assert path == run / report.REPORT_FILE and path.exists()
        text = path.read_text(encoding="utf-8")
        assert text == rep.html
        assert network_references(text) == [], name
        for section_id in report.SECTION_IDS:
            assert f'<section id="section-{section_id}">' in text, (name, section_id)
        assert text.count(BUNDLE_MARKER) == 1
        assert text.count('class="circuitsvis"') == 1
        assert rep.mechanism.mechanism in MECHANISMS
        assert f"Mechanism: <b>{rep.mechanism.mechanism}</b>" in text
        # the first screen, before the contents: the verdict, the circuit diagram, the loss curve
        nav = text.index("<nav>")
        assert text.index('<section id="section-summary">') < text.index("Mechanism: <b>") < nav
        assert text.index('class="circuit-diagram"') < nav and text.index("Loss during training") < nav
        config = rep.section("config").body()
        assert "<table>" in config and '<details class="config-json">' in config and "<details open" not in config


@pytest.mark.slow
def test_report_numbers_do_not_depend_on_its_memory_and_time_savings(runs, monkeypatch):
    """The report as built (attention masses a few sequences at a time, no gradient estimate per checkpoint in
    the circuit over training) is the same file as the one built in one step over the batch with the estimate."""
    from markov_interp import probes
    from markov_interp.probes import attention

    run, built, _ = runs["two"]
    formation = probes.circuit_formation
    monkeypatch.setattr(attention, "_CHUNK", 10**6)
    monkeypatch.setattr(probes, "circuit_formation", lambda *a, **k: formation(*a, **{**k, "attribution": True}))
    again = report.build(run, n_sequences=16, sample_len=24, max_checkpoints=3)
    assert again.to_dict() == built.to_dict()
    numbered = lambda text: re.sub(r"circuits-vis-\d+", "circuits-vis-N", text)  # noqa: E731  (a per-process count)
    assert numbered(again.html) == numbered(built.html)


@pytest.mark.slow
def test_report_sections_fit_the_run(runs):
    _, two, path_two = runs["two"]
    _, one, _ = runs["one"]
    size = path_two.stat().st_size
    assert size < 3_000_000, f"two-layer report is {size / 1e6:.2f} MB"
    # reference lines of the loss section come from theory (logged in metrics): the Bayes line for random kernels
    assert "in-context Bayes" in two.section("loss").body()
    assert "Not applicable" in two.section("landscape").body()  # two layers: no canonical landscape
    assert "Not applicable" not in one.section("landscape").body()
    assert "Not applicable" in two.section("kernel").body()  # random kernels: no kernel to average
    for run_dir, rep, _ in runs.values():  # the config's count, not what TL holds beside it (TL 2 / 3: zero
        # biases and a tied copy)
        assert f"{models.read_weights(run_dir)[0].n_params:,}" in rep.section("config").body(), run_dir
    assert "<svg" in one.section("landscape").body()
    for rep in (one, two):  # both runs have checkpoints
        assert "<svg" in rep.section("training").body()
        formation = rep.section("formation").body()  # the circuit at the saved checkpoints, entries in a table
        assert "<svg" in formation and "enters at step" in formation and "*" in formation
        assert "holds the final weights: its circuit is the verdict" in formation  # reused, not patched again
    assert "L1H0" in two.section("ablation").body()
    assert "true kernel" in one.section("kernel").body()
    assert "induction head forms" in two.section("training").body() or "Events:" in two.section("training").body()
    # strategy similarity over training (Edelman et al.): the closest strategy is named at every checkpoint
    for rep, names in ((two, ("uniform 1/V", "in-context unigram", "in-context k-gram")),
                       (one, ("uniform 1/V", "stationary law pi", "true kernel"))):
        training_body = rep.section("training").body()
        assert "Closest prediction strategy" in training_body and training_body.count("<svg") >= 2
        assert any(name in training_body for name in names)


ANALYSES = {"weights": "OV and QK circuits", "attribution": "Direct logit attribution",
            "patching": "Activation patching by position", "attention": "Attention patterns on a sample sequence",
            "ablation": "Ablations", "landscape": "Canonical landscape", "training": "Probe scores over training",
            "formation": "Circuit over training"}


@pytest.mark.slow
def test_every_analysis_has_its_heading_in_the_contents(runs):
    for name, (_, rep, _) in runs.items():
        nav = rep.html.split("<nav>", 1)[1].split("</nav>", 1)[0]
        for section_id, title in ANALYSES.items():
            assert f'<a href="#section-{section_id}">{title}</a>' in nav, (name, section_id)
            assert rep.section(section_id).title == title
        assert "<svg" in rep.section("weights").body() and "<svg" in rep.section("attribution").body()


@pytest.mark.slow
def test_gains_only_where_the_task_has_an_in_context_component(runs):
    """Issue 32: a fixed binary chain printed "g_0 18.74 +- 5.00"; its report now says why there are no gains."""
    _, two, _ = runs["two"]
    _, one, _ = runs["one"]
    assert two.mechanism.references.in_context and not one.mechanism.references.in_context
    assert re.search(r"g_1 [-+]?\d", two.section("summary").body()) and "g_1 " in two.section("mechanism").body()
    value = re.compile(r"g_\d [-+]?\d")  # a gain's value, as "g_0 18.74 +- 5.00"
    assert not value.search(one.html), value.search(one.html)
    assert "no in-context component" in one.section("summary").body()
    assert "no in-context component" in one.section("mechanism").body()


@pytest.mark.slow
def test_checkpoints_probed_through_the_fused_forward_match_the_hooked_model(runs):
    """The training section runs checkpoints through `models.stack` (no hooked model per checkpoint): its
    patterns and predictions equal the hooked model's (one forward, tested at 1e-5 in test_stacked)."""
    from markov_interp import probes
    from markov_interp.report._build import _checkpoint_outputs

    run, rep, _ = runs["two"]
    step, path = report.checkpoint_files(run)[-1]
    hooked = models.load(path)
    batch = probes.sample_batch(RandomMarkov(3), n_sequences=4, seq_len=24, seed=1)
    (patterns, probs), = list(_checkpoint_outputs([(step, path)], batch.tokens, 1, torch.device("cpu")))
    expected = probes.attention_scores(hooked, batch)
    got = probes.attention_scores(hooked, batch, cache=patterns)
    for name in ("previous_token", "induction", "same_token"):
        assert torch.allclose(got.excess(name), expected.excess(name), atol=1e-5), name
    assert torch.allclose(probs, probes.next_state_probs(hooked, batch), atol=1e-5)


def test_verdict_shows_the_axes_when_the_report_has_them():
    """`why_panel` shows `MechanismReport.circuit` / `.law` as the verdict's axes when they are verdicts (text or a
    result with a headline) and reads them off the evidence otherwise."""
    import copy

    from handbuilt import induction_model
    from markov_interp import probes
    from markov_interp.report._build import why_panel

    mech = probes.classify_mechanism(induction_model(3), RandomMarkov(3), n_sequences=8, seed=0)
    panel = why_panel(mech)
    assert "induction circuit of order 1" in panel and "in-context bigram" in panel and "g_1 " in panel
    verdict = copy.copy(mech)  # as the two-axis report will hold them (issue 30): verdicts, not the evidence
    object.__setattr__(verdict, "law", "in-context bigram reached (g_1 0.98 +- 0.02)")
    object.__setattr__(verdict, "circuit", "an induction circuit at lag 1")
    panel = why_panel(verdict)
    assert "in-context bigram reached (g_1 0.98 +- 0.02)" in panel and "an induction circuit at lag 1" in panel


def test_document_puts_the_lead_sections_before_the_contents():
    sections = [report.Section(x, x.upper(), (f"<p>{x}</p>",)) for x in ("first", "second", "third")]
    doc = report.document("t", sections, lead=1)
    assert doc.index('id="section-first"') < doc.index("<nav>") < doc.index('id="section-second"')
    assert '<a href="#section-first">' in doc  # the first screen is in the contents too
    with pytest.raises(ValueError, match="lead"):
        report.document("t", sections, lead=4)


@pytest.mark.slow
def test_report_displays_in_jupyter_without_network(runs, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    _, two, _ = runs["two"]
    frame = two._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and "&lt;section id=&quot;section-attention&quot;&gt;" in frame
    attention = two.section("attention")._repr_html_()
    assert attention.count(BUNDLE_MARKER) == 1 and not network_references(attention)
    assert BUNDLE_MARKER not in two.section("heads")._repr_html_()


@pytest.mark.slow
def test_report_without_checkpoints_says_so(runs, tmp_path):
    run, _, _ = runs["one"]
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "checkpoints")
    rep = report.build(copy, n_sequences=8, sample_len=8)
    assert "no checkpoints" in rep.section("training").body()
    assert "no checkpoints" in rep.section("formation").body()
    assert rep.save(tmp_path / "elsewhere.html").exists()


def test_build_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no run folder"):
        report.build(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="config.json"):
        report.build(tmp_path)
    with pytest.raises(ValueError, match="n_sequences"):
        report.build(tmp_path, n_sequences=1)


@pytest.mark.slow
def test_cli_report(runs, tmp_path, capsys):
    run, _, _ = runs["two"]
    out = tmp_path / "cli.html"
    assert cli_main(["report", str(run), "--out", str(out), "--n-sequences", "8", "--max-checkpoints", "2"]) == 0
    assert out.exists() and "mechanism:" in capsys.readouterr().out
    assert cli_main(["report", str(tmp_path / "nope")]) == 2
    assert "no run folder" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- the browser
def _browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"chromium not found at {CHROMIUM} (CI installs Debian's chromium; set MARKOV_INTERP_CHROMIUM)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright Python package is not installed (pip install playwright; no browser download)")
    return sync_playwright


SCREEN_HEIGHT = 800  # a laptop's first screen at 1280 x 800


def _check_layout(page, name: str) -> None:
    """As laid out by the browser: the verdict, the circuit diagram and the loss curve start on the first screen,
    above the contents, and the sections follow in `SECTION_IDS` order."""
    found = page.evaluate(
        "() => { const top = s => document.querySelector(s).getBoundingClientRect().top + window.scrollY;"
        " return {verdict: top('.verdict'), diagram: top('svg.circuit-diagram'),"
        " loss: top('.first-screen figure.plot'), nav: top('nav'),"
        " sections: [...document.querySelectorAll('section[id^=section-]')].map("
        "   s => [s.id.slice(8), s.getBoundingClientRect().top + window.scrollY])}; }")
    assert found["verdict"] < found["diagram"] < SCREEN_HEIGHT, (name, found)
    assert found["verdict"] < found["loss"] < SCREEN_HEIGHT, (name, found)
    assert max(found["diagram"], found["loss"]) < found["nav"], (name, found)
    ids = [section_id for section_id, _ in found["sections"]]
    assert ids == list(report.SECTION_IDS), (name, ids)
    tops = [y for _, y in found["sections"]]
    assert tops == sorted(tops) and tops[1] > found["nav"], (name, found["sections"])


def overflowing(page, root: str) -> list:
    """Elements under `root` whose content runs out of their box, or out of the page's width, and SVG text that
    runs out of its picture (as laid out: rotated labels included)."""
    return page.evaluate(
        "(root) => { const out = [], width = document.documentElement.clientWidth;"
        " for (const e of document.querySelectorAll(root + ' *')) {"
        "  const r = e.getBoundingClientRect(); if (!r.width) continue;"
        "  if (r.right > width + 1 || r.left < -1) out.push(['page', e.tagName, e.className.baseVal ?? e.className]);"
        "  if (!(e instanceof SVGElement) && e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX !="
        "   'auto') out.push(['box', e.tagName, e.className, e.scrollWidth, e.clientWidth]); }"
        " for (const t of document.querySelectorAll(root + ' svg text')) {"
        "  const v = t.ownerSVGElement.getBoundingClientRect(), b = t.getBoundingClientRect();"
        "  if (b.left < v.left - 1 || b.right > v.right + 1 || b.top < v.top - 1 || b.bottom > v.bottom + 1)"
        "   out.push(['svg text', t.textContent.slice(0, 60)]); }"
        " return out; }", root)


@pytest.mark.slow
def test_report_opens_offline_in_a_real_browser(runs):
    sync_playwright = _browser()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--disable-dev-shm-usage"],
        )
        try:
            for name, (_, _, path) in runs.items():
                page = browser.new_page(viewport={"width": 1280, "height": SCREEN_HEIGHT})
                attempted, errors = [], []

                def route(r, attempted=attempted):
                    if r.request.url.startswith(("file:", "data:", "about:", "blob:")):
                        r.continue_()
                    else:
                        attempted.append(r.request.url)
                        r.abort()

                page.route("**/*", route)
                page.on("console", lambda m, errors=errors: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                page.on("request", lambda r, attempted=attempted: attempted.append(r.url)
                        if r.url.startswith(("http:", "https:", "ws:", "wss:")) else None)
                page.goto(path.resolve().as_uri(), wait_until="load")
                page.wait_for_selector(".circuitsvis canvas", state="attached", timeout=30_000)
                page.wait_for_timeout(500)  # let React finish (errors would show up here)
                drawn = page.evaluate(
                    "() => { const c = document.querySelector('.circuitsvis');"
                    " return {children: c.children.length, canvases: c.querySelectorAll('canvas').length,"
                    " text: c.innerText}; }"
                )
                assert drawn["children"] > 0 and drawn["canvases"] > 0, (name, drawn)
                assert "L0H0" in drawn["text"], (name, drawn["text"][:200])
                _check_layout(page, name)
                assert overflowing(page, "#section-summary") == [], name  # nothing on the first screen runs out
                n_svg = page.evaluate("() => document.querySelectorAll('section svg').length")
                n_sections = page.evaluate("() => document.querySelectorAll('section[id^=section-]').length")
                assert n_svg >= 5 and n_sections == len(report.SECTION_IDS), (name, n_svg, n_sections)
                assert attempted == [], (name, attempted)
                assert errors == [], (name, errors)
                page.close()
        finally:
            browser.close()
