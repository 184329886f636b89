"""The findings in README.md and docs/ are what the committed results give with the current code: one command
renders them (`python -m tools.findings`, repository tooling outside the package), the committed text equals its
rendering, a rendered number follows its source file, a finding whose numbers no longer fit its words refuses to
render, and quick budgets say they are smoke tests. Nothing here trains."""

import json
import math
import re
import statistics
from pathlib import Path

import pytest

from markov_interp import dynamics, experiments, sweep
from markov_interp.experiments import paper
from markov_interp.training import evaluation_steps
from tools import findings
from tools.findings import _engine

ROOT = Path(__file__).resolve().parents[2]
REPRO = ROOT / "docs" / "reproduction"


# -------------------------------------------------------------------------------------- the committed docs
def test_committed_docs_equal_their_rendering():
    outcomes = findings.render(ROOT, check=True)
    assert [str(o.path) for o in outcomes] == list(findings.DOCS)
    stale = [o for o in outcomes if o.changed]
    assert not stale, "run `python -m tools.findings`:\n" + "".join(o.diff for o in stale)
    assert all(o.regions >= 1 for o in outcomes), [(str(o.path), o.regions) for o in outcomes]


def test_every_block_is_used_in_the_docs_and_its_sources_are_committed():
    used = {r.name for doc in findings.DOCS for r in findings.regions((ROOT / doc).read_text(), doc)}
    known = findings.blocks()
    assert used == set(known), (used ^ set(known))
    for b in known.values():
        assert all((ROOT / s).is_file() for s in b.sources), b


def test_the_readme_quotes_full_budget_results_only_and_every_number_is_rendered():
    text = (ROOT / "README.md").read_text()
    section = text.split("## What it found", 1)[1]
    inside = re.findall(r"<!-- rendered: [^\n]*-->\n(.*?)<!-- /rendered -->", section, re.S)
    assert inside and any(re.search(r"\d", body) for body in inside)
    outside = re.sub(r"<!-- rendered: [^\n]*-->\n.*?<!-- /rendered -->", "", section, flags=re.S)
    prose = [line for line in outside.splitlines()[1:] if line.strip()]
    assert prose and not [line for line in prose if re.search(r"\d", line)], prose
    for source in findings.blocks()["readme-findings"].sources:
        data = json.loads((ROOT / source).read_text())
        if "budget" in data:  # an experiment's results.json: never a quick (smoke) budget
            assert data["budget"]["name"] != "quick", source


def test_the_stale_numbers_of_issue_31_are_gone():
    findings_md = (ROOT / "docs" / "findings.md").read_text()
    summary = (REPRO / "summary.md").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "210 [180, 241]" not in findings_md and "[180, 241]" not in summary  # 3 seeds: no interval now
    assert "[31, 31]" not in summary and "[13, 13]" not in summary and "none (4 seeds)" in summary
    assert "without self-transitions" not in readme and "zero-diagonal" not in readme  # 5 seeds, 150 steps


# ------------------------------------------------------------------------------------------ the engine
@pytest.fixture
def scratch_blocks(monkeypatch):
    """The registry with a test block "sum" (the sum of a JSON list in data.json) added, restored afterwards."""
    monkeypatch.setattr(_engine, "BLOCKS", dict(findings.blocks()))

    @findings.block("sum", "data.json")
    def _sum(path: Path) -> str:
        values = json.loads(path.read_text())
        findings.holds(all(v >= 0 for v in values), "every value is non-negative")
        return f"| total |\n|---|\n| {sum(values)} |"

    return _engine.BLOCKS


def _doc(body: str = "old") -> str:
    return f"# Doc\n\nProse with 1 number.\n<!-- rendered: sum -->\n{body}\n<!-- /rendered -->\nAfter.\n"


def test_rendering_replaces_the_region_and_names_its_source(scratch_blocks, tmp_path):
    (tmp_path / "data.json").write_text("[1, 2, 3]")
    out = findings.render_text(_doc(), tmp_path)
    assert out == ("# Doc\n\nProse with 1 number.\n<!-- rendered: sum (source: data.json) -->\n| total |\n|---|\n"
                   "| 6 |\n<!-- /rendered -->\nAfter.\n")
    assert findings.render_text(out, tmp_path) == out  # rendering is a fixed point
    (tmp_path / "data.json").write_text("[1, 2, 30]")  # the number follows the source
    assert "| 33 |" in findings.render_text(out, tmp_path)


def test_a_finding_that_no_longer_holds_refuses_to_render(scratch_blocks, tmp_path):
    (tmp_path / "data.json").write_text("[1, -2]")
    with pytest.raises(findings.FindingNoLongerHolds, match="every value is non-negative"):
        findings.render_text(_doc(), tmp_path)


@pytest.mark.parametrize("text, match", [
    ("<!-- rendered: sum -->\nx\n", r"doc.md:1: rendered block 'sum' is never closed"),
    ("<!-- rendered: sum -->\n<!-- rendered: sum -->\n<!-- /rendered -->\n", r"doc.md:2: .* opens inside 'sum'"),
    ("x\n<!-- /rendered -->\n", r"doc.md:2: '<!-- /rendered -->' closes no rendered block"),
    ("<!-- rendered: sum source: x -->\n<!-- /rendered -->\n", r"doc.md:1: a rendered marker must read"),
    ("a\n<!-- rendered: nope -->\n<!-- /rendered -->\n", r"doc.md:2: unknown rendered block 'nope'; the blocks"),
])
def test_bad_markers_are_refused_naming_the_file_and_line(scratch_blocks, tmp_path, text, match):
    with pytest.raises(ValueError, match=match):
        findings.render_text(text, tmp_path, where="doc.md")


def test_a_missing_source_names_the_block(scratch_blocks, tmp_path):
    with pytest.raises(FileNotFoundError, match="rendered block 'sum': its source .*data.json does not exist"):
        findings.render_text(_doc(), tmp_path)


def test_wrap_keeps_tables_and_never_starts_a_line_that_markdown_reads_as_a_block():
    table = "| a | b |\n|---|---|\n| " + "x " * 80 + "|"
    assert findings.wrap(table, width=20) == table
    text = "- " + " ".join(["word"] * 20) + " shift >+270 then 150. and - and # and 1) end"
    lines = findings.wrap(text, width=24).splitlines()
    assert lines[0].startswith("- ") and all(line.startswith("  ") for line in lines[1:])
    assert not [line for line in lines[1:] if re.match(r"\s*(>|#|[-+*] |\d+[.)] )", line)], lines
    assert " ".join(line.strip() for line in lines) == text


@pytest.fixture
def checkout(scratch_blocks, tmp_path):
    """A scratch repository root with the five docs, each holding one region of the "sum" block, stale."""
    (tmp_path / "data.json").write_text("[4, 5]")
    for doc in findings.DOCS:
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / doc).write_text(_doc())
    return tmp_path


def test_check_writes_nothing_and_exits_1_until_rendered(checkout, capsys):
    before = {doc: (checkout / doc).read_text() for doc in findings.DOCS}
    assert findings.main(["--check", "--root", str(checkout)]) == 1
    assert {doc: (checkout / doc).read_text() for doc in findings.DOCS} == before
    err = capsys.readouterr().err
    assert "-old" in err and "+| 9 |" in err and "python -m tools.findings" in err
    assert findings.main(["--root", str(checkout)]) == 0
    assert all("| 9 |" in (checkout / doc).read_text() for doc in findings.DOCS)
    assert not [p for p in checkout.rglob(".*") if p.is_file()]  # atomic writes leave no temporary files
    assert findings.main(["--check", "--root", str(checkout)]) == 0
    assert "up to date" in capsys.readouterr().out


def test_the_tool_runs_from_the_checkout_and_the_package_has_no_findings(checkout, capsys, tmp_path):
    """`python -m tools.findings` is the command (the wheel packages only markov_interp: the renderer of this
    repository's docs is not in it); a contradicted finding or a folder without the docs is one line, exit 2."""
    import subprocess
    import sys

    from markov_interp.cli import main

    (checkout / "data.json").write_text("[-1]")
    assert findings.main(["--root", str(checkout)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("python -m tools.findings: error: the finding 'every value is non-negative' no longer")
    done = subprocess.run([sys.executable, "-m", "tools.findings", "--check", "--root", str(tmp_path / "nowhere")],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 2 and done.stderr.startswith("python -m tools.findings: error: ")
    assert "missing" in done.stderr
    assert not (ROOT / "markov_interp" / "findings").exists() and (ROOT / "tools" / "findings").is_dir()
    with pytest.raises(SystemExit):  # no `markov-interp findings` any more
        main(["findings", "--check"])
    assert "invalid choice: 'findings'" in capsys.readouterr().err


# ---------------------------------------------------------------------- real blocks follow their sources
def test_the_gpu_blocks_follow_their_file_and_refuse_a_contradicted_finding(tmp_path):
    data = json.loads((REPRO / "gpu" / "escape_times.json").read_text())
    (tmp_path / "docs" / "reproduction" / "gpu").mkdir(parents=True)
    target = tmp_path / "docs" / "reproduction" / "gpu" / "escape_times.json"
    table, claims = findings.blocks()["gpu-escape-times"], findings.blocks()["gpu-escape-findings"]
    data["conditions"]["8-layers @ 2000"]["escape_steps"] = [1000] * 16  # depth 8 now the slowest
    target.write_text(json.dumps(data))
    assert "| 8 layers, fp32 (2000 steps) | 16/16 | (980, 1000], 95% CI" in table.text(tmp_path)
    with pytest.raises(findings.FindingNoLongerHolds, match="depth shortens the plateau"):
        claims.text(tmp_path)
    data["setup"] = data["setup"].replace("eval every 20 steps", "eval every 10 steps")
    target.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="no longer says 'eval every 20 steps'"):
        table.text(tmp_path)


def _direction(entry: dict, free: dict) -> str:
    """The clamp's direction from a results.json's raw escape steps, independently of `dynamics`: the median escape
    step over seeds (a censored seed counted as never) against free's."""
    def median(arm: dict) -> float:
        steps = sorted(math.inf if c else s for s, c in zip(arm["escape_steps"], arm["censored"]))
        return statistics.median(steps)

    return "slows" if median(entry) > median(free) else "speeds" if median(entry) < median(free) else "ties"


def test_the_gpu_factorial_states_its_agreement_with_the_cpu_cells_as_the_raw_escapes_give_it():
    from markov_interp.experiments import factorial

    text = " ".join(findings.blocks()["factorial-gpu-findings"].text(ROOT).split())
    gpu = json.loads((REPRO / "factorial-full-gpu" / "results.json").read_text())
    agreed = 0
    for heads in (1, 2):
        cell = f"dirichlet-h{heads}"
        cpu = json.loads((REPRO / f"factorial-dirichlet-h{heads}" / "results.json").read_text())["result"][cell]
        g, c = (_direction(r["arms"]["clamped"], r["arms"]["free"]) for r in (gpu["result"][cell], cpu))
        label = f"{heads} layer-1 head{'s' if heads > 1 else ''}: "
        words = "(slows|speeds|no clear effect|mixed)"
        both = re.search(re.escape(label) + words + " on both", text)
        split = re.search(re.escape(label) + words + " on the GPU, " + words + " on the CPU", text)
        wg, wc = (both.group(1), both.group(1)) if both else split.groups()
        # an effect the rule names is the raw medians' direction; the rule may also withhold one (both measures)
        assert wg in (g, "no clear effect") and wc in (c, "no clear effect"), (heads, g, c, wg, wc)
        agreed += wg == wc and wg in ("slows", "speeds")
    assert f"direction agrees in {agreed} of 2 head counts" in text
    for heads in (1, 2):  # the per-cell bullets of the cells the CPU never ran at this budget
        arms = gpu["result"][f"zero-diagonal-h{heads}"]["arms"]
        bullet = f"**Zero-diagonal kernels (no self-transitions), {heads} layer-1 head{'s' if heads > 1 else ''}**:"
        assert f"{bullet} the clamp {_direction(arms['clamped'], arms['free'])} the descent" in text
    not_run = [a for a in factorial.ARMS if a not in gpu["budget"]["arms"]]  # and no scores over training, circuits
    assert gpu["budget"]["score_checkpoints"] == gpu["budget"]["discovered"] == 0 and not_run
    assert f"the arms {', '.join(not_run)}; the scores over training; the circuits at the end" in text


def test_the_gpu_factorial_blocks_follow_their_file(tmp_path):
    sources = findings.blocks()["factorial-gpu-findings"].sources
    for source in sources:
        (tmp_path / source).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / source).write_bytes((ROOT / source).read_bytes())
    target = tmp_path / sources[0]
    data = json.loads(target.read_text())
    arms = data["result"]["dirichlet-h2"]["arms"]
    for key in set(arms["free"]) - {"interventions"}:  # the two heads' arms swapped: the clamp now slows
        arms["free"][key], arms["clamped"][key] = arms["clamped"].get(key), arms["free"][key]
    data["provenance"]["seconds"] = 600.0
    target.write_text(json.dumps(data))
    text = " ".join(findings.blocks()["factorial-gpu-findings"].text(tmp_path).split())
    assert "direction agrees in 1 of 2 head counts" in text  # the CPU's two heads: ratio below 1, area holds 0
    assert "2 layer-1 heads: slows on the GPU, no clear effect on the CPU" in text
    assert "10.0 min of wall time" in findings.blocks()["factorial-gpu-provenance"].text(tmp_path)
    data["budget"]["steps"] = 300  # no longer the CPU cells' recipe: the comparison refuses to render
    target.write_text(json.dumps(data))
    with pytest.raises(findings.FindingNoLongerHolds, match="share the recipe"):
        findings.blocks()["factorial-gpu-findings"].text(tmp_path)


def test_summary_csv_is_the_current_summary_of_the_committed_results_csv():
    from tools.findings._sources import reproduction  # `paper.summarise` of the table, read once

    conditions = reproduction(REPRO / "results.csv")
    assert len(conditions) == 32 and {c.experiment for c in conditions} == set(paper.SECTION_COLUMNS)
    assert (REPRO / "summary.csv").read_text() == paper.summary_table(conditions).csv()


# ------------------------------------------------------------------------------- read back results.json
# files written by the current statistics (factorial-quick predates the bound for a ratio against a censored
# median: its recorded "0x" ratios differ from what the code gives now, which is why docs re-render, not copy)
@pytest.mark.parametrize("folder", ["interventions", "factorial-dirichlet-h1", "factorial-dirichlet-h2",
                                    "factorial-full-gpu"])
def test_reading_back_recomputes_what_the_experiment_wrote(folder):
    committed = json.loads((REPRO / folder / "results.json").read_text())["result"]
    finished = experiments.load(REPRO / folder)
    again = json.loads(json.dumps(finished.result.to_json(), default=str))
    for part, data in committed.items():
        for arm, entry in data["arms"].items():
            mine = again[part]["arms"][arm]
            for key in ("crossings", "escape_steps", "censored", "median", "median_interval", "logrank_p", "lines",
                        "area"):
                assert mine.get(key) == entry.get(key), (folder, part, arm, key)


@pytest.mark.parametrize("folder, keys", [("icl/phases-quick", ("cells", "claims")),
                                          ("icl/diversity-quick", ("cells", "transitions")),
                                          ("reduction", ("separatrices", "boundary"))])
def test_reading_back_grids_recomputes_their_summaries(folder, keys):
    committed = json.loads((REPRO / folder / "results.json").read_text())["result"]
    again = json.loads(json.dumps(experiments.load(REPRO / folder).result.to_json()))
    for key in keys:
        assert again[key] == committed[key], key


def test_a_read_back_phase_grid_draws_no_empty_curve_figure():
    # results.json keeps no loss curves: the read-back result must not draw (or link) an empty escape-curves panel
    back = experiments.load(REPRO / "icl/phases-quick").result
    assert "escape_curves.png" not in back.figures()
    assert all("escape_curves.png" not in s.figures for s in back.sections())
    assert "phase_diagram.png" in back.figures()


def test_load_refuses_what_is_not_a_readable_results_json(tmp_path):
    bad = tmp_path / "results.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        experiments.load(tmp_path)
    bad.write_text(json.dumps({"title": "x"}))
    with pytest.raises(ValueError, match="not an experiment's results.json"):
        experiments.load(bad)
    bad.write_text(json.dumps({"title": "No such experiment", "budget": {}, "provenance": {}, "result": {}}))
    with pytest.raises(ValueError, match="no registered experiment is titled 'No such experiment'"):
        experiments.load(bad)
    with pytest.raises(FileNotFoundError):
        experiments.load(tmp_path / "missing.json")


def test_load_finds_the_experiment_by_title_and_refuses_one_without_a_read_back(monkeypatch, tmp_path):
    from markov_interp.experiments import factorial

    monkeypatch.setattr(experiments, "_REGISTRY", dict(experiments.registered()))
    mute = experiments.Experiment(name="mute", title="Mute", budgets=dict(factorial.EXPERIMENT.budgets),
                                  run=factorial.run)
    monkeypatch.setitem(experiments._REGISTRY, "mute", mute)
    data = json.loads((REPRO / "factorial-dirichlet-h1" / "results.json").read_text())
    assert experiments.load(REPRO / "factorial-dirichlet-h1").name == "factorial"  # by its title
    (tmp_path / "results.json").write_text(json.dumps({**data, "title": "Mute"}))
    with pytest.raises(ValueError, match="experiment 'mute' cannot read back its results.json"):
        experiments.load(tmp_path)
    finished = experiments.load(tmp_path, name="factorial")  # named explicitly: its title is not looked at
    assert finished.budget == factorial.FULL.replace(heads=(1,), data=("dirichlet",), arms=("free", "clamped"),
                                                     device="cpu")
    assert finished.provenance.seconds == data["provenance"]["seconds"] and finished.files == (tmp_path /
                                                                                                 "results.json",)


# ---------------------------------------------------------------------------------- quick is a smoke test
def _provenance() -> experiments.Provenance:
    return experiments.Provenance(command="c", machine="m", device="cpu", torch="t", python="p", precision="fp32",
                                  seconds=1.0)


def test_summaries_at_the_quick_budget_say_smoke_at_their_top():
    from markov_interp.experiments import factorial

    for budget in (factorial.QUICK, paper.QUICK):  # an experiment's and `reproduce --quick`'s
        head = experiments.render_markdown("T", _provenance(), budget, []).split("\n\n")
        assert head[0] == "# T (quick)" and head[1].startswith("**smoke: does not test the claims.**")
    for budget in (factorial.FULL, paper.FULL):
        assert "smoke" not in experiments.render_markdown("T", _provenance(), budget, [])


def test_committed_quick_summaries_say_smoke_at_their_top():
    quick = [p for p in REPRO.rglob("summary.md") if p.read_text().split("\n", 1)[0].endswith("(quick)")]
    assert len(quick) >= 4
    for path in quick:
        assert path.read_text().split("\n\n")[1] == experiments.smoke_note("quick"), path


def test_a_recorded_escape_is_read_on_the_runs_grid():
    import csv

    with (REPRO / "results.csv").open(newline="") as handle:
        row = sweep.Row.from_columns(next(csv.DictReader(handle)))
    assert row.status == "ok" and not row.result.censored
    assert row.result.crossings is None and row.result.escape_step == 20  # the first session's table
    grid = sorted(evaluation_steps(row.config.train))
    found = row.result.crossing(evaluations=grid)
    assert found == dynamics.StepInterval(grid[grid.index(20) - 1], 20)
    assert row.result.crossing() == dynamics.StepInterval(19, 20)  # without the grid: the exact step, as before


def test_recipe_sentences_count_effects_and_name_the_default_recipe():
    from types import SimpleNamespace as NS

    from markov_interp.experiments.factorial import Recipe
    from tools.findings.recipes import RecipeEffect, heads_sentence

    def effect(heads, recipe, ratio, word):
        half = NS(ratio=ratio, ratio_text=lambda: f"{ratio:.2g}x [lo, hi]")
        area = NS(text=lambda: f"{100 * (ratio - 1):+.0f} [lo, hi]")
        return RecipeEffect(heads, recipe, NS(fractions={0.5: half}, area=area), word)

    effects = [effect(1, Recipe(), 3.6, "slows"), effect(1, Recipe(norm="none"), 0.29, "speeds"),
               effect(1, Recipe(first_state="uniform"), 0.56, "no clear effect"),
               effect(1, Recipe(first_state="uniform", norm="none"), 0.24, "speeds"),
               effect(2, Recipe(), 0.7, "speeds")]
    one = heads_sentence(effects, 1)
    assert one.startswith("with 1 layer-1 head the clamp slows the descent in 1/4 recipes, speeds it in 2/4, "
                          "no clear effect in 1/4")
    assert "in the package's recipe it slows the descent (3.6x [lo, hi] free's time to the 0.5 line, area +260" in one
    assert "without LayerNorm it speeds it in all 2 (0.24x-0.29x)" in one
    assert heads_sentence(effects, 2).startswith("with 2 layer-1 heads the clamp speeds the descent in 1/1 recipes")
    unclear = heads_sentence([effect(2, Recipe(), 0.76, "no clear effect")], 2)
    assert "in the package's recipe it has no clear effect (0.76x [lo, hi]" in unclear


def test_the_split_arms_block_shows_each_seed_as_the_raw_escape_steps_give_it():
    """Every listed arm's per-seed crossings are its raw escape steps in results.json (an independent read), and the
    one-head, uniform-first-state, LayerNorm recipe's clamped arm (8 seeds early, 8 late) is among them."""
    text = findings.blocks()["clamp-recipes-modes"].text(ROOT)
    raw = json.loads((REPRO / "clamp-recipes" / "results.json").read_text())["result"]
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert rows
    for heads, init, first, norm, arm, steps, *_ in rows:
        suffix = ("-plain" if init == "plain" else "") + ("-uniform" if first == "uniform" else "") + (
            "-noLN" if norm == "none" else "")
        entry = raw[f"dirichlet-h{heads.lstrip('| ')}{suffix}"]["arms"][arm]
        expected = sorted((s, c) for s, c in zip(entry["escape_steps"], entry["censored"]))
        assert steps == ", ".join(f">{s}" if c else str(s) for s, c in expected), (heads, init, first, norm, arm)
    assert any(r[1:5] == ["standard", "uniform", "LN", "clamped"] and "8 at 40-90, 8 at 210-1000" in r[6]
               for r in rows)
