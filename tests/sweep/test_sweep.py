"""Sweeps: spec parsing and errors, restart without rerunning finished cells, failure isolation, local vs Ray,
the results table, the CLI, and the reproduction's summary and figures on a tiny budget."""

import json
from pathlib import Path

import pytest

from markov_interp import sweep
from markov_interp.cli import main
from markov_interp.probes import MECHANISMS
from markov_interp.sweep import SweepSpec

TINY_TRAIN = {"steps": 6, "seq_len": 32, "batch_size": 4, "eval_every": 0, "eval_batches": 1, "n_checkpoints": 0,
              "log_every": 2}
TINY_MODEL = {"preset": "paper-1layer", "n_ctx": 32}


def tiny_spec(**changes) -> SweepSpec:
    data = dict(name="tiny", base={"source": {"kind": "binary", "p": 0.5, "q": 0.8}, "model": TINY_MODEL,
                                   "train": TINY_TRAIN},
                grid={"model.tie_weights": [True, False]}, seeds=(0, 1), probe=False)
    data.update(changes)
    return SweepSpec(**data)


# ---------------------------------------------------------------------------------------- cell functions
# Module-level so the process pool's workers (forked) can run them; they log each call to a file.
def logging_cell(cell, runs_dir, *, probe):
    with open(Path(runs_dir).parent / "calls.log", "a") as handle:
        handle.write(cell.cell_id + "\n")
    return sweep.run_cell(cell, runs_dir, probe=probe)


def failing_cell(cell, runs_dir, *, probe):
    if cell.params["model.tie_weights"] is False and cell.params["seed"] == 1:
        raise RuntimeError("planted failure in this cell")
    return logging_cell(cell, runs_dir, probe=probe)


class Interrupt(BaseException):
    pass


def interrupting_cell(cell, runs_dir, *, probe):
    calls = Path(runs_dir).parent / "calls.log"
    if calls.exists() and len(calls.read_text().split()) >= 2:
        raise Interrupt()  # like Ctrl-C: not an Exception, the sweep stops here
    return logging_cell(cell, runs_dir, probe=probe)


def calls(out: Path) -> list[str]:
    path = out / "calls.log"
    return path.read_text().split() if path.exists() else []


# ------------------------------------------------------------------------------------------------ specs
def test_cells_grid_seeds_and_exclude():
    spec = SweepSpec(base={"source": {"kind": "binary", "p": 0.5, "q": 0.5}, "train": TINY_TRAIN, "model": TINY_MODEL},
                     grid={"source.p": [0.2, 0.5], "source.q": [0.5, 0.8]}, seeds=[0, 3],
                     exclude=[{"source.p": 0.5, "source.q": 0.5}])
    cells = spec.cells()
    assert len(cells) == 3 * 2
    assert {(c.config.source.p, c.config.source.q) for c in cells} == {(0.2, 0.5), (0.2, 0.8), (0.5, 0.8)}
    assert {c.config.train.seed for c in cells} == {0, 3}
    assert len({c.cell_id for c in cells}) == len(cells)
    # ids are a function of the config only: the same cell in another spec has the same id
    again = SweepSpec(base={"source": {"kind": "binary", "p": 0.2, "q": 0.8}, "train": TINY_TRAIN, "model": TINY_MODEL},
                      seeds=[3]).cells()
    assert again[0].cell_id in {c.cell_id for c in cells}


def test_model_preset_follows_source_vocab():
    spec = SweepSpec(base={"source": {"kind": "random", "vocab": 3}, "model": {"preset": "attn-only-2layer", "n_ctx": 32},
                           "train": TINY_TRAIN})
    (cell,) = spec.cells()
    assert cell.config.model.d_vocab == 3 and cell.config.model.attn_only


def test_load_spec_toml(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(
        'seeds = [0, 1]\n[base.source]\nkind = "binary"\np = 0.5\nq = 0.8\n[base.model]\npreset = "paper-1layer"\n'
        'n_ctx = 32\n[base.train]\nsteps = 6\nseq_len = 32\n[grid]\n"model.n_layers" = [1, 2]\n"train.lr" = [1e-3, 2e-3]\n'
    )
    spec = sweep.load_spec(path)
    assert spec.name == "grid"
    cells = spec.cells()
    assert len(cells) == 8
    assert {c.config.model.n_layers for c in cells} == {1, 2}


@pytest.mark.parametrize(
    "data, message",
    [
        ({"grids": {}}, "unknown SweepSpec keys ['grids']"),
        ({"grid": {"model.n_layer": [1]}}, "'model.n_layer' names no model option"),
        ({"grid": {"optim.lr": [1]}}, "unknown section 'optim'"),
        ({"grid": {"lr": [1]}}, "must be 'section.field'"),
        ({"grid": {"train.lr": 0.1}}, "must be a non-empty list"),
        ({"grid": {"train.seed": [1, 2]}}, "seeds"),
        ({"base": {"train": {"stepz": 3}}}, "'train.stepz' names no train option"),
        ({"base": {"data": {}}}, "unknown sections ['data']"),
        ({"seeds": []}, "seeds must be a non-empty list"),
        ({"seeds": [0, 0]}, "duplicates"),
        ({"exclude": [{"source.pp": 0.1}]}, "'source.pp' names no source option"),
    ],
)
def test_spec_errors_are_clear(data, message):
    with pytest.raises(ValueError) as err:
        SweepSpec.from_dict(data)
    assert message in str(err.value)


def test_invalid_cell_names_the_cell():
    spec = SweepSpec(base={"source": {"kind": "binary", "p": 0.5, "q": 0.8}, "model": TINY_MODEL, "train": TINY_TRAIN},
                     grid={"train.seq_len": [16, 64]})
    with pytest.raises(ValueError, match=r"cell \{'train.seq_len': 64, 'seed': 0\}.*n_ctx"):
        spec.cells()


def test_toml_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[grid\n")
    with pytest.raises(ValueError, match="bad.toml is not valid TOML"):
        sweep.load_spec(bad)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('[grid]\n"model.layers" = [1]\n')
    with pytest.raises(ValueError, match=r"unknown.toml: grid: key 'model.layers'"):
        sweep.load_spec(unknown)
    with pytest.raises(FileNotFoundError):
        sweep.load_spec(tmp_path / "missing.toml")


def test_duplicate_cells_rejected(tmp_path):
    spec = tiny_spec(grid={"train.device": ["cpu", "auto"]})
    with pytest.raises(ValueError, match="same run"):
        sweep.run(spec, tmp_path, workers=1, progress=False)


def test_run_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="backend must be one of"):
        sweep.run(tiny_spec(), tmp_path, backend="slurm")
    with pytest.raises(ValueError, match="workers must be"):
        sweep.run(tiny_spec(), tmp_path, workers=0)


# ---------------------------------------------------------------------------------------------- outcomes
def test_outcome_labels():
    er, ul = 0.6190, 0.6663
    assert sweep.outcome(er + 0.01, er, ul) == "optimum"
    assert sweep.outcome(ul + 0.01, er, ul) == "unigram"
    assert sweep.outcome(er + 0.6 * (ul - er), er, ul) == "unigram"
    assert sweep.outcome(er + 0.4 * (ul - er), er, ul) == "optimum"
    assert sweep.outcome(0.6931, er, ul) == "above"  # an untrained model (log 2) is not on the plateau
    assert sweep.outcome(0.69, 0.69, 0.692) is None  # nearly i.i.d.: undecidable


def _result(**changes):
    base = dict(final_step=60, final_eval_loss=0.62, final_train_loss=0.63, entropy_rate=0.6, unigram_loss=0.7,
                bayes_loss=None, excess_loss=0.02, outcome="optimum", stuck_at_unigram=False, escape_step=40,
                probe=None, seconds=1.0, censored=False)
    return sweep.CellResult(**{**base, **changes})


def test_a_rows_crossings_come_from_dynamics_and_older_tables_read_as_exact_steps():
    from markov_interp import dynamics

    rows = [{"step": s, "eval_loss": 0.6 + 0.1 * f, "eval_true_loss": 0.6, "eval_plateau_loss": 0.7}
            for s, f in ((20, 1.0), (40, 0.4), (60, 0.3))]
    run = dynamics.from_metrics(rows)
    new = _result(crossings=run.to_json())
    assert new.crossing() == dynamics.StepInterval(20, 40) == run.escape
    assert new.crossing(0.25) == run.crossings[0.25] == dynamics.StepInterval(40, None)  # not confirmed
    assert new.crossing(0.3) is None  # a line the run was not measured at
    assert _result().crossing() == dynamics.StepInterval(39, 40)  # escape_step and censored only
    assert _result(escape_step=60, censored=True, stuck_at_unigram=True).crossing() == dynamics.StepInterval(60, None)
    assert _result(censored=None).crossing() is None and _result().crossing(0.9) is None


# ---------------------------------------------------------------------------------------------- engine
@pytest.mark.slow
def test_restart_does_not_rerun_finished_cells(tmp_path):
    spec = tiny_spec()
    with pytest.raises(Interrupt):
        sweep.run(spec, tmp_path, workers=1, progress=False, _cell_fn=interrupting_cell)
    first = calls(tmp_path)
    assert len(first) == 2
    records = sorted((tmp_path / "results").glob("*.json"))
    assert [p.stem for p in records] == sorted(first)
    stamps = {p: p.stat().st_mtime_ns for p in records}
    weights = {cid: (tmp_path / "runs" / cid / "model.safetensors").stat().st_mtime_ns for cid in first}

    result = sweep.run(spec, tmp_path, workers=2, progress=False, _cell_fn=logging_cell)
    assert (result.n_run, result.n_skipped, result.n_failed) == (2, 2, 0)
    second = calls(tmp_path)[2:]
    assert len(second) == 2 and not set(second) & set(first)
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())
    assert all((tmp_path / "runs" / cid / "model.safetensors").stat().st_mtime_ns == t for cid, t in weights.items())
    assert [r.status for r in result.rows] == ["ok"] * 4

    again = sweep.run(spec, tmp_path, workers=2, progress=False, _cell_fn=logging_cell)
    assert (again.n_run, again.n_skipped) == (0, 4)
    assert len(calls(tmp_path)) == 4


@pytest.mark.slow
def test_failed_cell_is_recorded_and_others_finish(tmp_path):
    spec = tiny_spec()
    result = sweep.run(spec, tmp_path, workers=2, progress=False, _cell_fn=failing_cell)
    assert result.n_failed == 1
    (bad,) = result.failed
    assert bad.params["model.tie_weights"] is False and bad.params["seed"] == 1
    assert bad.error == "RuntimeError: planted failure in this cell" and bad.result is None
    record = json.loads((tmp_path / "results" / f"{bad.cell_id}.json").read_text())
    assert record["status"] == "failed" and "planted failure" in record["traceback"]
    assert "Traceback" in record["traceback"]
    ok = [r for r in result.rows if r.status == "ok"]
    assert len(ok) == 3 and all(r.result.final_eval_loss > 0 for r in ok)

    table = sweep.read_table(tmp_path)
    assert table == result.rows  # the one typed reader gives back the rows the sweep wrote
    assert table[[r.cell_id for r in table].index(bad.cell_id)].error.startswith("RuntimeError")

    skip = sweep.run(spec, tmp_path, workers=1, progress=False, retry_failed=False, _cell_fn=logging_cell)
    assert (skip.n_run, skip.n_failed) == (0, 1)
    retried = sweep.run(spec, tmp_path, workers=1, progress=False, _cell_fn=logging_cell)
    assert (retried.n_run, retried.n_failed) == (1, 0)
    assert calls(tmp_path)[-1] == bad.cell_id


@pytest.mark.slow
def test_results_table_columns_and_probes(tmp_path):
    base = {"source": {"kind": "binary", "p": 0.5, "q": 0.8}, "model": {**TINY_MODEL, "n_ctx": 64}, "train": TINY_TRAIN}
    spec = tiny_spec(grid={}, seeds=(0,), probe=True, base=base)  # trained at 32 in a context of 64
    result = sweep.run(spec, tmp_path, workers=1, progress=False)
    (row,) = sweep.read_table(tmp_path / "results.csv")
    assert row == result.rows[0]
    assert row.status == "ok" and row.sweep == "tiny" and row.params["seed"] == 0
    assert row.config.source.p == 0.5 and row.config.model.n_layers == 1 and row.config.train.steps == 6
    res = row.result
    assert res.entropy_rate == pytest.approx(0.6190, abs=1e-4)
    assert res.unigram_loss == pytest.approx(0.6663, abs=1e-4)
    assert res.final_step == 6 and res.final_eval_loss > 0.5
    assert res.stuck_at_unigram in (True, False)
    assert res.probe.mechanism in MECHANISMS
    assert 0 <= res.probe.p_hat <= 1
    probed = json.loads((tmp_path / "results" / f"{row.cell_id}.probe.json").read_text())
    assert probed["seq_len"] == row.config.train.seq_len  # sweeps probe at the training length, like `probe`
    # the causal columns are the report's own numbers (the circuits' evidence carried into the table)
    assert res.probe.in_context_fraction == pytest.approx(probed["in_context_fraction"])
    assert res.probe.gain_1 == pytest.approx(probed["gains"]["fractions"]["1"])
    assert res.probe.faithfulness == pytest.approx(probed["circuit"]["faithfulness"])
    columns = (tmp_path / "results.csv").read_text().splitlines()[0].split(",")
    assert {"param.seed", "source.p", "model.n_layers", "final_eval_loss", "mechanism", "probe.p_hat",
            "probe.gain_1", "probe.in_context_fraction", "probe.faithfulness"} <= set(columns)
    try:
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        assert not (tmp_path / "results.parquet").exists()
    else:
        table = pq.read_table(tmp_path / "results.parquet").to_pylist()
        assert table[0]["final_eval_loss"] == result.rows[0].result.final_eval_loss
        assert table[0]["mechanism"] == res.probe.mechanism


@pytest.mark.slow
def test_changed_probes_reprobe_without_retraining(tmp_path, monkeypatch):
    spec = tiny_spec(grid={}, seeds=(0,), probe=True)
    first = sweep.run(spec, tmp_path, workers=1, progress=False)
    cid = first.rows[0].cell_id
    weights = tmp_path / "runs" / cid / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert sweep.run(spec, tmp_path, workers=1, progress=False).n_run == 0
    monkeypatch.setattr("markov_interp.sweep.runner.probe_settings", lambda: {"version": 1, "probes_source": "edited"})
    again = sweep.run(spec, tmp_path, workers=1, progress=False)
    assert again.n_run == 1 and again.rows[0].result.probe.mechanism == first.rows[0].result.probe.mechanism
    assert weights.stat().st_mtime_ns == stamp  # the training was reused, only the probes ran again
    assert again.rows[0].result.final_eval_loss == first.rows[0].result.final_eval_loss


def probe_logging_cell(cell, runs_dir, *, probe):
    with open(Path(runs_dir).parent / "calls.log", "a") as handle:
        handle.write(f"{cell.cell_id}:{probe}\n")
    return sweep.run_cell(cell, runs_dir, probe=False)  # the flag is what is under test, not the probes


def test_a_cell_two_sweeps_share_runs_once_probed_if_either_asks(tmp_path):
    plain, probed = tiny_spec(name="plain", probe=False), tiny_spec(name="probed", probe=True, seeds=(1,))
    result = sweep.run([plain, probed], tmp_path, workers=1, progress=False, _cell_fn=probe_logging_cell)
    assert len(result.rows) == 6 and result.n_run == 4 and result.n_failed == 0
    shared = {c.cell_id for c in probed.cells()}
    assert sorted(calls(tmp_path)) == sorted(f"{c.cell_id}:{c.cell_id in shared}" for c in plain.cells())
    assert [r.sweep for r in result.rows] == ["plain"] * 4 + ["probed"] * 2
    for cell in plain.cells():
        record = json.loads((tmp_path / "results" / f"{cell.cell_id}.json").read_text())
        assert (record["probe_settings"] is not None) == (cell.cell_id in shared)


def test_cell_records_round_trip_and_refuse_what_they_cannot_be(tmp_path):
    """A cell's record file: typed `CellRecord` written and read back; inconsistent records refused; a file
    that is not a usable format-2 record reads as absent (the cell runs again)."""
    from markov_interp.sweep import records

    (cell,) = tiny_spec(grid={}, seeds=(0,)).cells()
    result = sweep.run(tiny_spec(grid={}, seeds=(0,)), tmp_path, workers=1, progress=False).rows[0].result
    ok = records.CellRecord(status="ok", result=result, stack_size=4, cell_id=cell.cell_id,
                            probe_settings={"version": 1})
    path = records.write_record(tmp_path, ok)
    assert path == records.record_path(tmp_path, cell.cell_id) and records.read_record(path) == ok
    assert records.is_done(ok, True, {"version": 1}) and not records.is_done(ok, True, {"version": 2})
    died = records.failure("worker died", worker_signal="SIGKILL", cell_id=cell.cell_id)
    records.write_record(tmp_path, died)
    assert records.read_record(path) == died and died.failed and not records.is_done(died, False, {})
    with pytest.raises(ValueError, match="names no cell"):
        records.write_record(tmp_path, records.failure("no cell"))
    with pytest.raises(ValueError, match="status must be one of"):
        records.CellRecord(status="done")
    with pytest.raises(ValueError, match="exactly when its status is 'ok'"):
        records.CellRecord(status="ok")
    for text in ("{not json", json.dumps({"format": 1, "status": "ok"}), json.dumps({"format": 2, "status": "ok"}),
                 json.dumps({"format": 2, "status": "running"}), json.dumps([1, 2])):
        path.write_text(text)
        assert records.read_record(path) is None, text


@pytest.mark.slow
def test_local_and_ray_give_the_same_table(tmp_path):
    ray = pytest.importorskip("ray", reason="the Ray backend needs the optional 'ray' package")
    spec = tiny_spec(probe=True, seeds=(0,))
    local = sweep.run(spec, tmp_path / "local", workers=2, progress=False)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = sweep.run(spec, tmp_path / "ray", backend="ray", progress=False)
    finally:
        ray.shutdown()
    assert local.n_failed == 0 and remote.n_failed == 0, remote.failed
    assert len(local.rows) == len(remote.rows) == 2
    for row_a, row_b in zip(local.rows, remote.rows):
        a, b = row_a.columns(), row_b.columns()
        assert set(a) == set(b)
        for key in set(a) - {"seconds"}:
            if isinstance(a[key], float) and not isinstance(b[key], bool):
                # training is bit-identical; float64 reference linear algebra may differ in its last bits
                assert b[key] == pytest.approx(a[key], rel=1e-9, abs=1e-12), key
            else:
                assert a[key] == b[key], key
        assert a["final_eval_loss"] == b["final_eval_loss"] and a["final_train_loss"] == b["final_train_loss"]


# --------------------------------------------------------------------------------------------------- cli
@pytest.mark.slow
def test_cli_sweep(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(
        'probe = false\nseeds = [0]\n[base.source]\nkind = "binary"\np = 0.2\nq = 0.3\n[base.model]\n'
        'preset = "paper-1layer"\nn_ctx = 32\n[base.train]\nsteps = 4\nseq_len = 32\nbatch_size = 4\n'
        'eval_batches = 1\nn_checkpoints = 0\n[grid]\n"model.tie_weights" = [true, false]\n'
    )
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1", "--no-progress"]) == 0
    assert "2 cells: 2 ok (2 run now, 0 already done), 0 failed" in capsys.readouterr().out
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1", "--no-progress"]) == 0
    assert "(0 run now, 2 already done)" in capsys.readouterr().out


def test_cli_sweep_bad_spec(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text('[grid]\n"model.heads" = [1, 2]\n')
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "markov-interp sweep: error:" in err and "'model.heads' names no model option" in err


# the reproduction's tests: tests/experiments/test_paper.py


def test_example_spec_in_docs_loads():
    spec = sweep.load_spec(Path(__file__).parents[2] / "docs" / "examples" / "pq-tying.toml")
    cells = spec.cells()
    assert len(cells) == (9 - 3) * 2 * 3
    assert all(abs(c.config.source.p + c.config.source.q - 1) > 1e-9 for c in cells)
