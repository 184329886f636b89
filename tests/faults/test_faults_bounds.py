"""Round four of the fault campaign, one test per defect N1-N13 (docs/faults.md): every input bounded before
anything is allocated, nothing outside a run folder read or written, values checked by their meaning. Each test
feeds the campaign's reproduction (or its in-process equivalent) and failed on the code before the fix.
Commands that took unbounded memory or crashed the interpreter before (N2, N5, N10, N13) run in a child process
under a 6 GiB address-space cap and a time limit, so that the old behaviour fails the test instead of the
machine."""

import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from markov_interp import runs, sweep, theory
from markov_interp._io import FileTooLarge, READ_LIMITS, UnsafePath, loads_json, read_regular
from markov_interp.cli import main
from markov_interp.sources import RandomMarkov
from markov_interp.training import default_run, train

from tests.faults.test_faults import _one_line_error  # noqa: E402
from tests.faults.test_faults_stored import _edit, _entries, _fresh_cache  # noqa: E402
from tests.sweep.test_sweep import tiny_spec  # noqa: E402
from tests.training.test_training import tiny_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
       "OMP_NUM_THREADS": "1"}
CAP = 6 << 30  # address space of the children below: what took 22 GB before fails fast instead


def _capped():
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def _child(args: list[str], cwd: Path, timeout: float = 180, code: bool = False) -> subprocess.CompletedProcess:
    """`markov-interp ARGS` (or `python -c ARGS[0]` with `code`) in a child under the cap; a child still running
    after `timeout` seconds fails the test."""
    command = [sys.executable, "-c", args[0]] if code else [sys.executable, "-m", "markov_interp.cli", *args]
    return subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=_capped)


def _one_error_line(done: subprocess.CompletedProcess, command: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"markov-interp {command}: error: "), done.stderr[-2000:]
    return lines[0]


# ------------------------------------------------------------------------------------------------- N1
def test_n1_a_cached_references_own_standard_error_cannot_widen_its_checks(tmp_path, monkeypatch):
    """bayes_loss 0.5 with bayes_loss_se 0.1 beside E[entropy rate] 0.8189 passed the order check by 6 x 0.1 and
    was used silently; the Monte Carlo of the entry's key (tol 5e-4) stops with every SE below 5e-4."""
    source, seq_len = RandomMarkov(3), 9
    monkeypatch.setenv("MARKOV_INTERP_CACHE", "off")
    theory._random_references.cache_clear()
    truth = theory.reference_losses(source, seq_len)
    assert max(truth.bayes_loss_se, truth.add_alpha_loss_se, truth.unigram_loss_se) < 5e-4
    _fresh_cache(tmp_path, monkeypatch)
    theory.reference_losses(source, seq_len)
    path = _entries(tmp_path)["in-context"]
    _edit(path, bayes_loss=0.5, bayes_loss_se=0.1)
    theory._random_references.cache_clear()
    with pytest.warns(UserWarning) as caught:
        again = theory.reference_losses(source, seq_len)
    messages = [str(w.message) for w in caught if "reference-loss cache" in str(w.message)]
    assert len(messages) == 1 and "bayes_loss_se = 0.1 is larger than its key allows (0.0005" in messages[0], messages
    assert again == truth


def test_n1_with_a_fixed_sample_the_bound_is_what_its_size_allows(tmp_path, monkeypatch):
    """With the key's n_sequences fixed the standard error of a mean of n losses in [0, cap] is at most
    cap / (2 sqrt(n - 1)); twice that is allowed, more is refused."""
    source, seq_len, n = RandomMarkov(3), 9, 256
    _fresh_cache(tmp_path, monkeypatch)
    truth = theory.reference_losses(source, seq_len, n_sequences=n)
    cap = math.log((seq_len + 3 * 1.0) / 1.0)  # log((T + V alpha) / alpha): no add-beta loss exceeds it
    path = _entries(tmp_path)["in-context"]
    _edit(path, add_alpha_loss_se=1.01 * cap / math.sqrt(n - 1))
    theory._random_references.cache_clear()
    with pytest.warns(UserWarning, match=r"add_alpha_loss_se = .* is larger than its key allows .*256 sequences"):
        assert theory.reference_losses(source, seq_len, n_sequences=n) == truth


# ------------------------------------------------------------------------------------------------- N2
def test_n2_the_python_api_plans_before_it_allocates(tmp_path):
    """`classify_mechanism(model, BinaryChain(.2, .3), n_sequences=10**9)` was killed by the out-of-memory killer
    at 22 GB; under a memory cap, huge sizes gave raw torch allocation errors. Now each is a PlanTooLarge naming
    the parameter and the estimate, at once. In a child under a 6 GiB cap."""
    code = """
import sys, time
sys.path.insert(0, "tests")
from handbuilt import kernel_model
import torch
from markov_interp import probes, theory
from markov_interp.sources import BinaryChain, RandomMarkov
from markov_interp.models.memory import PlanTooLarge
model = kernel_model(torch.tensor([[0.8, 0.2], [0.3, 0.7]]))
calls = {
    "classify_mechanism": lambda: probes.classify_mechanism(model, BinaryChain(.2, .3), n_sequences=10**9),
    "discover_circuit": lambda: probes.discover_circuit(model, BinaryChain(.2, .3), n_sequences=10**9),
    "sample_batch": lambda: probes.sample_batch(RandomMarkov(2), n_sequences=10**9, seq_len=64, seed=0),
    "reference_losses": lambda: theory.reference_losses(RandomMarkov(2), 10**9),
    "sample": lambda: RandomMarkov(4).sample(10**9, 64),
    "swap_kernels": lambda: probes.swap_kernels(model, BinaryChain(.2, .3), n_sequences=10**9),
}
for name, call in calls.items():
    start = time.monotonic()
    try:
        call()
        print(name, "ran")
    except PlanTooLarge as err:
        print(name, "refused", round(time.monotonic() - start, 2), str(err))
    except BaseException as err:
        print(name, type(err).__name__, str(err)[:200])
"""
    done = _child([code], ROOT, code=True)
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert len(lines) == 6, done.stdout + done.stderr[-2000:]
    for name, line in lines.items():
        assert line.startswith("refused "), (name, line)
        seconds, message = line.split(" ", 2)[1:]
        assert float(seconds) < 2 and " is too large: " in message and "iB of memory" in message, (name, line)
        assert "refused before anything was allocated" in message, (name, line)
    assert "n_sequences=1000000000 is too large" in lines["classify_mechanism"]
    assert "seq_len=1000000000 is too large" in lines["reference_losses"]
    assert "batch=1000000000 is too large" in lines["sample"]


# ------------------------------------------------------------------------------------------------- N3
@pytest.mark.parametrize("theirs", [["results.csv"], ["results.csv", "spec.json.bak", "notes.txt"], ["runs/x.txt"]])
def test_n3_sweep_refuses_a_folder_that_is_not_a_sweeps(tmp_path, capsys, theirs):
    """`sweep --out` into a folder of the user's files overwrote their spec.json, results.csv and results.parquet
    (`train` refuses such a folder); now it is refused in one line, the folder left byte for byte as it was."""
    folder = tmp_path / "mine"
    for name in theirs:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(f"the user's {name}\n")
    before = sorted((p.relative_to(folder), p.read_bytes()) for p in folder.rglob("*") if p.is_file())
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(tiny_spec().to_dict()))
    line = _one_line_error(capsys, ["sweep", str(spec_file), "--out", str(folder), "--no-progress"],
                           f"{folder} is not a sweep folder", theirs[0].split("/")[0])
    assert "give an empty or new folder" in line
    assert sorted((p.relative_to(folder), p.read_bytes()) for p in folder.rglob("*") if p.is_file()) == before
    assert sorted(p.name for p in folder.iterdir()) == sorted({n.split("/")[0] for n in theirs})  # no .lock left


def test_n3_an_empty_folder_and_a_sweeps_own_folder_are_swept(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    spec = tiny_spec(grid={"model.tie_weights": [True]}, seeds=(0,))
    assert sweep.run(spec, empty, workers=1, progress=False).n_failed == 0
    again = sweep.run(spec, empty, workers=1, progress=False)  # a sweep's folder (its spec.json): resumed
    assert again.n_skipped == 1 and again.n_run == 0


# ------------------------------------------------------------------------------------------------- N4
def _run_folder_with_clamp(tmp_path: Path) -> Path:
    """A run folder's config.json with a clamp file entry (its sha256 recorded), as `train --clamp X=FILE` writes."""
    from safetensors.torch import save_file

    pattern = tmp_path / "pattern.safetensors"
    save_file({"p": torch.tril(torch.ones(16, 16)) / torch.arange(1, 17)[:, None]}, str(pattern))
    run = tiny_run(interventions=[f"blocks.0.attn.hook_pattern={pattern}"])
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / runs.CONFIG_FILE).write_text(run.to_json())
    return folder


def test_n4_a_run_folders_config_opens_no_file_it_names(tmp_path, capsys, monkeypatch):
    """A clamp entry of config.json edited to name another file (its sha256 removed) made `probe` / `report` open
    that file and read it whole (a 2 GB file: 2.35 GB; /etc/shadow opened as root). Now the entry is refused in one
    line naming it, and no file outside the run folder is opened."""
    folder = _run_folder_with_clamp(tmp_path)
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"\0" * 4096)
    config = json.loads((folder / runs.CONFIG_FILE).read_text())
    entry = config["train"]["interventions"][0]
    entry["value"] = str(victim)
    del entry["sha256"]
    (folder / runs.CONFIG_FILE).write_text(json.dumps(config))
    opened = []
    real_open, real_io_open = os.open, __import__("io").open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: (opened.append(str(path)), real_open(path, *a, **k))[1])
    monkeypatch.setattr("io.open", lambda path, *a, **k: (opened.append(str(path)), real_io_open(path, *a, **k))[1])
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: (opened.append(str(path)),
                                                                 real_io_open(path, *a, **k))[1])
    for command in ("probe", "report"):
        _one_line_error(capsys, [command, str(folder)], f"{folder / runs.CONFIG_FILE}", "without its sha256",
                        "opens no file a stored config names")
    with pytest.raises(ValueError, match="without its sha256"):
        train(tiny_run(), folder, progress=False)  # the config check of `train` (prepare) reads it too
    assert str(victim) not in opened, [p for p in opened if "victim" in p]
    assert sorted(p.name for p in folder.iterdir()) == [runs.CONFIG_FILE]  # and nothing was written there


def test_n4_a_recorded_clamp_file_is_not_opened_and_clamp_files_are_read_bounded(tmp_path, monkeypatch):
    folder = _run_folder_with_clamp(tmp_path)
    pattern = tmp_path / "pattern.safetensors"
    pattern.rename(tmp_path / "moved.safetensors")  # a reader needs no clamp file: the run's config still reads
    assert runs.read_config(folder).train.interventions[0].sha256 is not None
    from markov_interp import clamps

    monkeypatch.setitem(READ_LIMITS, "clamp file", 64)  # a clamp file larger than the cap is refused unread
    with pytest.raises(FileTooLarge, match=r"clamp file .*moved.safetensors is .* more than the 64 bytes"):
        clamps.parse_clamp(f"blocks.0.attn.hook_pattern={tmp_path / 'moved.safetensors'}")
    os.mkfifo(tmp_path / "fifo.safetensors")  # a FIFO is refused, not read (an open for reading would block)
    with pytest.raises(ValueError, match="nor an existing safetensors file"):
        clamps.parse_clamp(f"blocks.0.attn.hook_pattern={tmp_path / 'fifo.safetensors'}")
    with pytest.raises(UnsafePath, match="is a FIFO, not a regular file"):  # the one reader, asked directly
        read_regular(tmp_path / "fifo.safetensors", "clamp file")


# ------------------------------------------------------------------------------------------------- N5
def test_n5_a_huge_thread_count_is_refused_in_one_line(tmp_path):
    """`train --threads 100000` crashed with a segfault (exit 139), no message."""
    done = _child(["train", "--out", "x", "--threads", "100000", "--steps", "1"], tmp_path)
    line = _one_error_line(done, "train")
    assert "--threads must be an integer in 1..512, got 100000" in line
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------------------------------------- N6
def test_n6_probes_refuse_non_finite_models_and_unbounded_knobs():
    """A NaN-filled model was labelled "other", `beta=inf` gave "confident" with NaN gains, `min_fraction` of 2 or
    inf was accepted. (Every probe and every knob: tests/probes/test_probe_bounds.py.)"""
    from markov_interp import probes
    from markov_interp.sources import BinaryChain

    from handbuilt import kernel_model

    model = kernel_model(torch.tensor([[0.8, 0.2], [0.3, 0.7]]))
    source = BinaryChain(0.2, 0.3)
    for call, message in [
            (lambda: probes.classify_mechanism(model, source, beta=math.inf), "beta must be a finite number, got inf"),
            (lambda: probes.discover_circuit(model, source, min_fraction=2), r"min_fraction must be in \[0, 1\]"),
            (lambda: probes.discover_circuit(model, source, min_fraction=math.inf), "min_fraction must be a finite")]:
        with pytest.raises(ValueError, match=message):
            call()
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(math.nan)
    with pytest.raises(ValueError, match="^classify_mechanism: the model's weights hold NaN or infinity"):
        probes.classify_mechanism(model, source)


# ------------------------------------------------------------------------------------------------- N7
DEEP = "[" * 100_000 + "]" * 100_000


def test_n7_a_deeply_nested_sweep_record_reruns_its_cell(tmp_path):
    """JSON nested 100,000 deep in results/<id>.json gave a RecursionError naming no file and aborted the whole
    sweep; now that record is unusable (one warning naming it) and only its cell runs again."""
    spec = tiny_spec(grid={"model.tie_weights": [True]}, seeds=(0, 1))
    first = sweep.run(spec, tmp_path, workers=1, progress=False)
    assert first.n_failed == 0
    record = sweep.records.record_path(tmp_path, first.rows[0].cell_id)
    record.write_text(DEEP)
    with pytest.warns(UserWarning) as caught:
        again = sweep.run(spec, tmp_path, workers=1, progress=False)
    messages = [str(w.message) for w in caught if "sweep record" in str(w.message)]
    assert len(messages) == 1 and messages[0].startswith(f"sweep record {record} is unusable (") and \
        "nested more than 64 deep" in messages[0], messages
    assert again.n_run == 1 and again.n_skipped == 1 and again.n_failed == 0
    assert [r.status for r in sweep.read_table(tmp_path)] == ["ok", "ok"]


def test_n7_deep_json_anywhere_is_a_value_error_naming_the_file(tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / runs.CONFIG_FILE).write_text(DEEP)
    _one_line_error(capsys, ["probe", str(folder)], str(folder / runs.CONFIG_FILE), "nested more than 64 deep")
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(DEEP)
    _one_line_error(capsys, ["sweep", str(spec_file), "--out", str(tmp_path / "sw")], str(spec_file),
                    "nested more than 64 deep")
    toml = tmp_path / "spec.toml"
    toml.write_text("a = " + "[" * 5000 + "]" * 5000)
    _one_line_error(capsys, ["sweep", str(toml), "--out", str(tmp_path / "sw")], str(toml), "nested more than 64")
    with pytest.raises(ValueError, match="a value is JSON nested more than 64 deep"):
        loads_json("[" * 65 + "]" * 65, "a value")
    value = loads_json("[" * 64 + "]" * 64, "a value")  # 64 levels are read
    for _ in range(63):
        value = value[0]
    assert value == []


def _safetensors_file(path: Path, header: bytes) -> Path:
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    return path


def test_n7_deep_json_in_a_weights_file_the_kernel_flag_or_a_lock_is_refused_naming_it(tmp_path, capsys):
    """The other JSON the package reads: a weights file's safetensors header and the model config in its metadata,
    `train --kernel`, the lock file's holder. Each nested 100,000 deep gave a RecursionError naming nothing."""
    from markov_interp.models import read_weights_file
    from markov_interp.models.hooked import _CONFIG_KEY

    deep = _safetensors_file(tmp_path / "deep.safetensors", DEEP.encode())
    with pytest.raises(ValueError, match=rf"^{deep}'s safetensors header is JSON nested more than 64 deep"):
        read_weights_file(deep)
    config = _safetensors_file(tmp_path / "config.safetensors", json.dumps({"__metadata__": {_CONFIG_KEY: DEEP}})
                               .encode())
    with pytest.raises(ValueError, match=rf"^{config}: invalid model config in metadata: {config}: the model config "
                                         "in its metadata is JSON nested more than 64 deep"):
        read_weights_file(config)
    line = _one_line_error(capsys, ["train", "--out", str(tmp_path / "k"), "--kernel", DEEP],
                           "--kernel is JSON nested more than 64 deep")
    assert len(line) < 300 and not (tmp_path / "k").exists()
    line = _one_line_error(capsys, ["train", "--out", str(tmp_path / "k"), "--kernel", "[" + "x" * 100_000],
                           "--kernel is not valid JSON")
    assert len(line) < 1000  # the bad value quoted short
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / runs.LOCK_FILE).write_text("[" * 4096)
    assert runs.holder(tmp_path / "locked").startswith("an unknown process")


def test_a_checkpoints_training_state_is_read_bounded(tmp_path, monkeypatch):
    """The training state beside a checkpoint's weights (torch.load, read whole) is read as the weights are: a
    regular file no larger than the machine's memory (`read_regular`); larger, it is a damaged checkpoint, refused
    unread (a resume then falls back to an older one)."""
    from markov_interp.runs import checkpoints

    run_dir = tmp_path / "run"
    train(tiny_run(), run_dir, progress=False)
    step = runs.list_checkpoints(run_dir)[-1][0]
    weights, state = checkpoints.read_checkpoint(run_dir, step)
    assert "optimizer" in state
    state_path = checkpoints.checkpoint_paths(run_dir, step)[1]
    limit = state_path.stat().st_size - 1
    monkeypatch.setattr(checkpoints, "memory_limit", lambda device: (limit, "a test's memory"))
    with pytest.raises(runs.CheckpointDamaged, match=rf"{state_path} is unreadable \(FileTooLarge: training state "
                                                    rf"file {state_path} is .*, more than the .* markov-interp reads"):
        checkpoints.read_checkpoint(run_dir, step)


# ------------------------------------------------------------------------------------------------- N8
def _run_with_metrics(tmp_path: Path, row: str) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / runs.CONFIG_FILE).write_text(tiny_run().to_json())
    (folder / runs.METRICS_FILE).write_text('{"lr": 0.001, "step": 1, "train_loss": 0.7}\n' + row + "\n")
    return folder


def test_n8_a_metrics_row_that_is_no_object_is_one_line_naming_the_file_and_line(tmp_path, capsys):
    """A row `[1, 2]` inserted into metrics.jsonl gave `probe RUN` a raw AttributeError naming no file."""
    folder = _run_with_metrics(tmp_path, "[1,2]")
    _one_line_error(capsys, ["probe", str(folder)], f"{folder / runs.METRICS_FILE} line 2 is not a metrics row: "
                                                    "a metrics row is a JSON object, got [1, 2]")


@pytest.mark.parametrize("row,message", [
    ('{"step": 4, "train_loss": "0.5"}', "train_loss must be a number, got '0.5'"),
    ('{"step": "4", "train_loss": 0.5}', "step must be an integer >= 0, got '4'"),
    ('{"train_loss": 0.5}', "step must be an integer >= 0, got None"),
    ('{"step": 4, "diverged": "yes"}', "diverged must be true or false, got 'yes'"),
    ('{"step": 4, "eval_loss": [0.5]}', "eval_loss must be a number, got [0.5]"),
], ids=["a loss as text", "a step as text", "no step", "diverged as text", "a loss as a list"])
def test_n8_metrics_rows_are_type_checked(tmp_path, row, message):
    """Rows whose values are of the wrong type were returned as they were, to fail later in whatever read them
    (a TypeError naming no file); now the one reader refuses them naming the file, line and field."""
    folder = _run_with_metrics(tmp_path, row)
    with pytest.raises(ValueError) as refused:
        runs.load_metrics(folder)
    assert str(refused.value) == f"{folder / runs.METRICS_FILE} line 2 is not a metrics row: {message}"


# ------------------------------------------------------------------------------------------------- N9
def test_n9_a_seed_beyond_64_bits_is_refused_before_anything_is_written(tmp_path, capsys):
    """`--seed 1180591620717411303424` (2**70) passed validation, wrote config.json, then failed with "Overflow
    when unpacking long long"."""
    out = tmp_path / "run"
    _one_line_error(capsys, ["train", "--out", str(out), "--seed", str(2**70), "--steps", "1"],
                    "seed must be an integer in 0..9223372036854775807, got 1180591620717411303424")
    assert not out.exists()
    with pytest.raises(ValueError, match="each of seeds must be an integer in 0..9223372036854775807"):
        tiny_spec(seeds=(2**64,))
    with pytest.raises(ValueError, match="pool_seed must be an integer in 0..9223372036854775807"):
        RandomMarkov(3, pool_size=2, pool_seed=2**63)
    assert train(tiny_run(seed=2**63 - 1), tmp_path / "largest", progress=False).final.eval_loss > 0


# ------------------------------------------------------------------------------------------------ N10
def test_n10_a_huge_seed_range_is_refused_at_once(tmp_path):
    """`--seeds 0-1000000` was still building configs after 300 s at 1 GB."""
    start = time.monotonic()
    done = _child(["train", "--out", "x", "--seeds", "0-1000000"], tmp_path, timeout=120)
    line = _one_error_line(done, "train")
    assert "--seeds '0-1000000' names 1000001 seeds, more than the 4096 one command trains" in line
    assert time.monotonic() - start < 60 and not (tmp_path / "x").exists()
    done = _child(["train", "--out", "y", "--seeds", f"0,{2**64}"], tmp_path, timeout=120)
    assert "each of --seeds must be an integer in 0..9223372036854775807" in _one_error_line(done, "train")


# ------------------------------------------------------------------------------------------------ N11
def test_n11_an_empty_out_is_refused_and_a_refused_train_leaves_no_lock(tmp_path, capsys, monkeypatch):
    """`train --out ""` trained into the current folder; a refused `train` left a .lock in the user's folder."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    for command in (["train", "--out", ""], ["sweep", "spec.toml", "--out", ""], ["report", "run", "--out", " "]):
        with pytest.raises(SystemExit) as refused:
            main(command)
        assert refused.value.code == 2
        assert "argument --out: empty; give a folder name (use . for the current folder)" in capsys.readouterr().err
    with pytest.raises(ValueError, match="out_dirs entry is empty"):
        train(tiny_run(), "", progress=False)
    with pytest.raises(ValueError, match="out_dir is empty"):
        sweep.run(tiny_spec(), "", workers=1, progress=False)
    assert list(here.iterdir()) == []
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    _one_line_error(capsys, ["train", "--out", str(mine), "--steps", "2"], "holds files that are not a run's")
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]  # no .lock
    run_dir = tmp_path / "new" / "deeper"
    train(tiny_run(), run_dir, progress=False)
    with pytest.raises(ValueError, match="different config"):  # refused, in a folder whose lock it did not create
        train(tiny_run(seed=1), run_dir, progress=False)
    assert (run_dir / runs.CONFIG_FILE).exists() and (run_dir / runs.LOCK_FILE).exists()  # a run's lock is kept


def test_n11_a_refused_lock_takes_back_the_folders_it_made(tmp_path):
    target = tmp_path / "a" / "b"
    with pytest.raises(RuntimeError, match="refused"):
        with runs.lock(target):
            raise RuntimeError("refused")
    assert not (tmp_path / "a").exists()
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / runs.LOCK_FILE).write_text("")  # a lock that was there before stays
    with pytest.raises(RuntimeError):
        with runs.lock(tmp_path / "kept"):
            raise RuntimeError("refused")
    assert (tmp_path / "kept" / runs.LOCK_FILE).exists()


# ------------------------------------------------------------------------------------------------ N12
def test_n12_messages_quote_at_most_about_200_characters_of_a_bad_value(tmp_path, capsys):
    """A 60 MB string in a config gave a 60 MB stderr line. (A config.json of 60 MB is now refused unread as larger
    than READ_LIMITS["run config"]; a 10 MB value inside one is quoted short.)"""
    folder = tmp_path / "run"
    folder.mkdir()
    config = json.loads(tiny_run().to_json())
    config["source"]["kind"] = "x" * 10_000_000
    (folder / runs.CONFIG_FILE).write_text(json.dumps(config))
    line = _one_line_error(capsys, ["probe", str(folder)], "kind must be one of")
    assert len(line) < 1000, len(line)
    with pytest.raises(ValueError) as refused:
        default_run(**{"train.device": "y" * 10_000_000, "source.kind": "z" * 10_000_000})
    assert len(str(refused.value)) < 1000
    big = tmp_path / "big"
    big.mkdir()
    (big / runs.CONFIG_FILE).write_text(json.dumps({"pad": "x" * (READ_LIMITS["run config"] + 1)}))
    line = _one_line_error(capsys, ["probe", str(big)], "run config", "is 16.0 MiB, more than the 16.0 MiB")
    assert len(line) < 1000


# ------------------------------------------------------------------------------------------------ N13
def test_n13_a_spec_that_is_not_a_regular_file_or_too_large_is_refused_unread(tmp_path):
    """`sweep /dev/zero --out sw` ran until the out-of-memory killer ended it at 21.6 GB."""
    start = time.monotonic()
    done = _child(["sweep", "/dev/zero", "--out", "sw"], tmp_path, timeout=120)
    assert "sweep spec /dev/zero is a character device, not a regular file" in _one_error_line(done, "sweep")
    assert time.monotonic() - start < 60 and not (tmp_path / "sw").exists()
    os.mkfifo(tmp_path / "spec.toml")  # no writer: reading it would block forever
    done = _child(["sweep", "spec.toml", "--out", "sw"], tmp_path, timeout=120)
    assert "is a FIFO, not a regular file" in _one_error_line(done, "sweep")
    with open(tmp_path / "huge.toml", "wb") as handle:
        handle.truncate(READ_LIMITS["sweep spec"] + 1)  # sparse: no disk used
    done = _child(["sweep", "huge.toml", "--out", "sw"], tmp_path, timeout=120)
    assert "sweep spec huge.toml is 4.0 MiB, more than the 4.0 MiB markov-interp reads of a sweep spec" in \
        _one_error_line(done, "sweep")


def test_read_regular_refuses_a_file_that_grows_past_its_cap(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_regular(path, "sweep spec", limit=100) == b"x" * 100
    with pytest.raises(FileTooLarge, match="is 101 bytes, more than the 100 bytes"):
        path.write_bytes(b"x" * 101)
        read_regular(path, "sweep spec", limit=100)


def test_a_grid_of_too_many_cells_is_refused_before_one_is_built():
    spec = tiny_spec(grid={"train.lr": [0.001 * (i + 1) for i in range(1000)], "model.d_model": list(range(8, 208))},
                     seeds=(0,))
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"the grid has 200000 cells \(1000 train.lr x 200 model.d_model x 1 seeds\), "
                                         "more than the 100000 a sweep may have"):
        spec.cells()
    assert time.monotonic() - start < 1


# ------------------------------------------------------------------------------------------------ Ray
class _FakeRay:
    """What `executors._ClusterHealth` asks of Ray: the head's address and the cluster's resources."""

    def __init__(self, address: str, cpus: float) -> None:
        self.address, self.cpus = address, cpus

    def get_runtime_context(self):
        return type("Context", (), {"gcs_address": self.address})()

    def cluster_resources(self) -> dict:
        return {"CPU": self.cpus} if self.cpus else {}


def test_the_ray_health_check_names_a_lost_head_or_lost_workers(monkeypatch):
    """The check `run_ray` makes while it waits (the real head kill: test_faults_ray.py, slow): a head that does
    not answer, or a cluster with no CPU left, for LOST_SECONDS raises ClusterLost saying what was lost and how to
    resume; a problem that clears in time, or a healthy cluster, raises nothing."""
    import socket

    from markov_interp.sweep import ClusterLost, executors

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    alive = f"127.0.0.1:{listening.getsockname()[1]}"
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead = f"127.0.0.1:{closed.getsockname()[1]}"  # bound, not listening: connections are refused
    try:
        assert executors._ClusterHealth(_FakeRay(alive, 2)).check(3, 4)  # healthy
        start = time.monotonic()
        executors._ClusterHealth(_FakeRay(alive, 2)).confirm(3, 4)  # a task lost on a healthy cluster: its own
        assert time.monotonic() - start < 1
        health = executors._ClusterHealth(_FakeRay(dead, 2))
        assert not health.check(3, 4)  # lost for less than LOST_SECONDS: not yet
        monkeypatch.setattr(executors, "LOST_SECONDS", 0.0)
        with pytest.raises(ClusterLost, match=rf"^the Ray cluster at {dead} was lost \(its head does not answer for "
                                              r"0 s\) with 3 of 4 cells not finished .*start the cluster again \(ray "
                                              r"start --head \.\.\.\) and run the same command"):
            health.check(3, 4)
        with pytest.raises(ClusterLost, match=r"no worker node with a CPU is left .* with 1 of 4 cells not finished.*"
                                              r"add a worker node \(ray start --address \.\.\.\)"):
            executors._ClusterHealth(_FakeRay(alive, 0)).check(1, 4)
        with pytest.raises(ClusterLost, match=r"its head does not answer .* with 2 of 4 cells not finished"):
            executors._ClusterHealth(_FakeRay(dead, 2)).confirm(2, 4)  # a task lost with its head: not the cell's
    finally:
        listening.close()
        closed.close()
