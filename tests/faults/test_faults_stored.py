"""Stored values are checked by their meaning (issue 33, items 3 and 6): reference-cache entries against the
order theory's quantities obey and their own key, sweep records field by field against their one schema. A
value that fails is recomputed with one warning naming the file. And every file main wrote before these schemas
(tests/data/stored_86ed974, written by tests/data/make_stored_files.py) still reads as valid, so nothing already
trained is recomputed."""

import json
import math
import shutil
import warnings
from pathlib import Path

import pytest

from markov_interp import sweep, theory
from markov_interp.sources import RandomMarkov
from markov_interp.sweep.records import RESULTS_DIR, read_record
from markov_interp.training import RunConfig
from markov_interp import runs
from markov_interp.training.resume import metrics_complete

from tests.sweep.test_sweep import tiny_spec  # noqa: E402

STORED = Path(__file__).parents[1] / "data" / "stored_86ed974"
RECORDS = sorted(p for p in STORED.glob("sweeps/*/results/*.json") if not p.name.endswith(".probe.json"))


# --------------------------------------------------------------------------- files written by main at 86ed974
def test_the_stored_files_are_the_ones_expected():
    assert len(RECORDS) == 12 and len(list(STORED.glob("cache/references/*.json"))) == 5
    statuses = sorted(json.loads(p.read_text())["status"] for p in RECORDS)
    assert statuses == ["diverged", "failed", "failed"] + ["ok"] * 9


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: f"{p.parts[-3]}-{p.stem}")
def test_records_written_by_main_read_as_valid(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        record = read_record(path, warn=True)
    raw = json.loads(path.read_text())
    assert record is not None and record.status == raw["status"] and record.cell_id == path.stem
    assert record.to_json() == raw  # read and written back, nothing lost or changed


@pytest.mark.parametrize("name", ["probed", "stacked", "faults"])
def test_tables_written_by_main_read_back(name):
    rows = sweep.read_table(STORED / "sweeps" / name)
    assert len(rows) == len(list((STORED / "sweeps" / name / RESULTS_DIR).glob("????????????????.json")))
    assert all(row.result is not None for row in rows if row.status == "ok")


def test_run_folders_written_by_main_read_as_valid():
    folders = [p.parent for p in STORED.rglob(runs.CONFIG_FILE)]
    assert len(folders) == 13
    for folder in folders:
        config = RunConfig.from_json((folder / runs.CONFIG_FILE).read_text())
        rows = runs.load_metrics(folder)
        assert rows and runs.foreign_entries(folder) == [], folder
        status = runs.divergence(folder)
        assert (status is not None) == (folder / runs.STATUS_FILE).exists()
        if status is None:
            assert metrics_complete(config.train, rows), folder


@pytest.mark.parametrize("name", ["binary", "intervention"])
def test_stored_run_folders_load_and_probe_at_their_training_length(tmp_path, name):
    """A stored run folder (its config.json as 86ed974 wrote it) with weights that record no training length (as
    `models.save` writes them, and training did before it recorded the length) loads through `runs.load_model`
    with the run's length in its metadata, final weights and checkpoint alike, and probes exactly as the same
    weights with the length recorded (what training writes now)."""
    from markov_interp import models, probes

    folder = tmp_path / name
    shutil.copytree(STORED / "runs" / name, folder)
    run = runs.read_config(folder)
    state = models.initial_state(run.model, seed=3)
    models.save_state(run.model, state, folder)
    checkpoint, _ = runs.checkpoint_paths(folder, 3)
    checkpoint.parent.mkdir()
    models.save_state(run.model, state, checkpoint)
    recorded = models.load(models.save_state(run.model, state, tmp_path / "recorded.safetensors",
                                             train_seq_len=run.train.seq_len))
    for path in (folder, folder / runs.WEIGHTS_FILE, checkpoint):
        assert models.weights_metadata(models.load(path)).train_seq_len is None  # the file records none
        model = runs.load_model(path, expect=run.model)
        assert models.weights_metadata(model).train_seq_len == run.train.seq_len == probes.probe_length(model)
    source = run.source.build()
    probed = [json.dumps(probes.classify_mechanism(m, source, n_sequences=8, seed=0).to_dict(), sort_keys=True)
              for m in (runs.load_model(folder), recorded)]
    assert probed[0] == probed[1]
    shorter = run.replace(train=run.train.replace(seq_len=12))  # below n_ctx: the default length is the config's
    (folder / runs.CONFIG_FILE).write_text(shorter.to_json())
    assert probes.probe_length(runs.load_model(folder)) == 12 and probes.probe_length(models.load(folder)) == 16


@pytest.mark.parametrize("path", sorted(STORED.glob("cache/references/*.json")), ids=lambda p: p.stem[:8])
def test_cache_entries_written_by_main_are_read_by_their_key(tmp_path, monkeypatch, path):
    # the entry is found under the name its key gives (the naming is unchanged) and passes every check
    entry = json.loads(path.read_text())
    key = {k: v for k, v in entry["key"].items() if k not in ("version", "code")}
    (tmp_path / "references").mkdir()
    shutil.copyfile(path, tmp_path / "references" / path.name)
    monkeypatch.setenv("MARKOV_INTERP_CACHE", str(tmp_path))
    monkeypatch.setattr(theory.cache, "_code_version", lambda: entry["key"]["code"])
    assert theory._cache_file(key) == tmp_path / "references" / path.name
    schema = theory._KernelEntry if key["what"] == "kernel-expectations" else theory._InContextEntry
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert theory._disk_cache_read(key, schema) == entry["value"]


# ------------------------------------------------------------------------- the reference cache, by meaning
def _fresh_cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MARKOV_INTERP_CACHE", str(tmp_path / "cache"))
    for cached in (theory._random_references, theory._kernel_expectations_cached):
        cached.cache_clear()


def _entries(tmp_path: Path) -> dict[str, Path]:
    found = {}
    for path in (tmp_path / "cache" / "references").glob("*.json"):
        found[json.loads(path.read_text())["key"]["what"]] = path
    return found


def _edit(path: Path, **changes) -> None:
    entry = json.loads(path.read_text())
    entry["value"].update(changes)
    path.write_text(json.dumps(entry))


SEQ_LEN, N_SEQUENCES = 9, 256  # small and fixed: the entries are quick to compute and recompute exactly


def _poison_in_context(value: dict, how: str) -> dict:
    log_v = math.log(3)
    if how == "Bayes below the entropy rate":  # the entry: 0.5 against E[entropy rate] 0.8189
        return {"bayes_loss": 0.5}
    if how == "Bayes above add-alpha":
        return {"bayes_loss": value["add_alpha_loss"] + 0.2}  # (well beyond 6 standard errors)
    if how == "Bayes above the unigram loss":
        return {"bayes_loss": value["unigram_loss"] + 0.2, "add_alpha_loss": value["unigram_loss"] + 0.3}
    if how == "Bayes above log V":
        return {"bayes_loss": log_v + 0.2, "add_alpha_loss": log_v + 0.3, "unigram_loss": log_v + 0.3}
    if how == "another sequence count":
        return {"n_sequences": N_SEQUENCES // 2}
    if how == "pool values without a pool":
        return {"pool_bayes_loss": 0.9, "pool_bayes_loss_se": 0.0, "pool_bayes_curve": value["unigram_curve"],
                "pool_bayes_curve_se": value["unigram_curve_se"]}
    if how == "a string":
        return {"add_alpha_loss": str(value["add_alpha_loss"])}
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["Bayes below the entropy rate", "Bayes above add-alpha",
                                 "Bayes above the unigram loss", "Bayes above log V", "another sequence count",
                                 "pool values without a pool", "a string"])
def test_an_impossible_cached_reference_is_recomputed_with_one_warning(tmp_path, monkeypatch, how):
    # issue 33, item 3: bayes_loss set to 0.5 in an entry whose E[entropy rate] is 0.8189 was used silently
    source = RandomMarkov(3)
    monkeypatch.setenv("MARKOV_INTERP_CACHE", "off")
    theory._random_references.cache_clear()
    truth = theory.reference_losses(source, SEQ_LEN, n_sequences=N_SEQUENCES)
    assert round(truth.entropy_rate, 4) == 0.8189
    _fresh_cache(tmp_path, monkeypatch)
    theory.reference_losses(source, SEQ_LEN, n_sequences=N_SEQUENCES)
    path = _entries(tmp_path)["in-context"]
    _edit(path, **_poison_in_context(json.loads(path.read_text())["value"], how))
    theory._random_references.cache_clear()
    with pytest.warns(UserWarning) as caught:
        again = theory.reference_losses(source, SEQ_LEN, n_sequences=N_SEQUENCES)
    messages = [str(w.message) for w in caught if "reference-loss cache" in str(w.message)]
    assert len(messages) == 1 and messages[0].startswith(f"reference-loss cache entry {path} is unusable (")
    expected = {"Bayes below the entropy rate": "E[entropy rate] = 0.8188", "Bayes above add-alpha":
                "exceeds add_alpha_loss", "Bayes above the unigram loss": "exceeds unigram_loss",
                "Bayes above log V": "exceeds log V", "another sequence count": "n_sequences is 128",
                "pool values without a pool": "present exactly when its key has a pool",
                "a string": "add_alpha_loss must be a number"}[how]
    assert expected in messages[0], messages[0]
    assert again == truth  # recomputed: the uncached values, which replace the entry
    theory._random_references.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert theory.reference_losses(source, SEQ_LEN, n_sequences=N_SEQUENCES) == truth


def test_a_pool_entry_must_keep_pool_bayes_lowest(tmp_path, monkeypatch):
    source = RandomMarkov(3, pool_size=4, pool_seed=2)
    _fresh_cache(tmp_path, monkeypatch)
    truth = theory.reference_losses(source, SEQ_LEN, n_sequences=N_SEQUENCES)
    path = _entries(tmp_path)["in-context"]
    _edit(path, pool_bayes_loss=truth.bayes_loss + 0.3)
    theory._random_references.cache_clear()
    with pytest.warns(UserWarning, match=r"pool_bayes_loss = .* exceeds"):  # the pool's optimum must be lowest
        assert theory.reference_losses(source, SEQ_LEN, n_sequences=N_SEQUENCES) == truth


@pytest.mark.parametrize("how", ["rate above H(pi)", "H(pi) above log V", "another method"])
def test_an_impossible_kernel_entry_is_recomputed(tmp_path, monkeypatch, how):
    source = RandomMarkov(3)
    _fresh_cache(tmp_path, monkeypatch)
    truth = theory.expected_kernel_references(source)
    path = _entries(tmp_path)["kernel-expectations"]
    changes = {"rate above H(pi)": {"entropy_rate": truth.oracle_unigram_loss + 0.01},
               "H(pi) above log V": {"unigram_loss": math.log(3) + 0.01, "entropy_rate": 1.0},
               "another method": {"method": "quadrature"}}[how]
    _edit(path, **changes)
    theory._kernel_expectations_cached.cache_clear()
    with pytest.warns(UserWarning, match=rf"reference-loss cache entry {path} is unusable"):
        assert theory.expected_kernel_references(source) == truth


# ---------------------------------------------------------------------------- sweep records, by schema
def _damaged(record: dict, how: str) -> dict:
    result = record.get("result") or {}
    if how == "a string loss":  # the damage
        result["final_eval_loss"] = str(result["final_eval_loss"])
    elif how == "a negative loss":
        result["final_train_loss"] = -0.1
    elif how == "a NaN loss":
        result["final_eval_loss"] = float("nan")
    elif how == "a bool step":
        result["final_step"] = True
    elif how == "a fractional step":
        result["final_step"] = 6.5
    elif how == "an escape after the end":
        result["escape_step"] = result["final_step"] + 1
    elif how == "an unknown outcome":
        result["outcome"] = "best"
    elif how == "stuck but not censored":
        result["stuck_at_unigram"] = not result["censored"]
    elif how == "an excess off the entropy rate":
        result["excess_loss"] += 0.1
    elif how == "unreadable crossings":
        result["crossings"] = {"0.5": "soon", "dwell": 2}
    elif how == "p_hat above 1":
        result["probe"]["p_hat"] = 1.5
    elif how == "a head of three numbers":
        result["probe"]["previous_token_head"] = [0, 0, 0]
    elif how == "a stack of 0":
        record["stack_size"] = 0
    elif how == "another cell's id":
        record["cell_id"] = "0123456789abcdef"
    elif how == "a failure without its error":
        record.update(status="failed", error=None)
        record.pop("result")
    elif how == "an unknown field in the result":
        result["speed"] = 3
    else:
        raise AssertionError(how)
    return record


DAMAGE = {"a string loss": "final_eval_loss must be a number", "a negative loss": "final_train_loss must be a number >= 0",
          "a NaN loss": "final_eval_loss must be a finite number", "a bool step": "final_step must be an integer",
          "a fractional step": "final_step must be an integer", "an escape after the end": "is after the final step",
          "an unknown outcome": "outcome must be one of", "stuck but not censored": "must equal censored",
          "an excess off the entropy rate": "is not the entropy rate", "unreadable crossings": "crossings",
          "p_hat above 1": "p_hat must be in [0, 1]", "a head of three numbers": "must be a list of 2 values",
          "a stack of 0": "stack_size must be an integer >= 1", "another cell's id": "record of cell 0123456789abcdef",
          "a failure without its error": "its error is null", "an unknown field in the result": "speed"}


@pytest.mark.parametrize("how", list(DAMAGE))
def test_a_record_that_breaks_its_schema_is_unusable_with_one_warning(tmp_path, how):
    source = next(p for p in RECORDS if p.parts[-3] == "probed")
    path = tmp_path / source.name
    path.write_text(json.dumps(_damaged(json.loads(source.read_text()), how)))
    with pytest.warns(UserWarning) as caught:
        assert read_record(path, warn=True) is None
    assert len(caught) == 1
    message = str(caught[0].message)
    assert message.startswith(f"sweep record {path} is unusable (") and DAMAGE[how] in message, message
    assert message.endswith("its cell runs again (its training is reused)")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_record(path) is None  # later reads of the same run say nothing


def test_a_mistyped_record_is_recomputed_and_the_table_reads_back(tmp_path):
    # issue 33, item 6: a string in result.final_eval_loss was trusted ("2 ok"), written into results.csv, and
    # sweep.read_table then refused the table it had just written
    spec = tiny_spec(seeds=(0,))
    first = sweep.run(spec, tmp_path, workers=1, progress=False)
    cell = first.rows[0].cell_id
    path = tmp_path / RESULTS_DIR / f"{cell}.json"
    record = json.loads(path.read_text())
    good = record["result"]["final_eval_loss"]
    record["result"]["final_eval_loss"] = "0.5"
    path.write_text(json.dumps(record))
    weights = tmp_path / "runs" / cell / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    with pytest.warns(UserWarning) as caught:
        again = sweep.run(spec, tmp_path, workers=1, progress=False)
    messages = [str(w.message) for w in caught if "sweep record" in str(w.message)]
    assert len(messages) == 1 and str(path) in messages[0] and "final_eval_loss must be a number" in messages[0]
    assert (again.n_run, again.n_skipped, again.n_failed) == (1, 1, 0)
    assert json.loads(path.read_text())["result"]["final_eval_loss"] == good
    assert weights.stat().st_mtime_ns == stamp  # its training was reused, not redone
    rows = sweep.read_table(tmp_path)
    assert [r.result.final_eval_loss for r in rows] == [r.result.final_eval_loss for r in first.rows]
