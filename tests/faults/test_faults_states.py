"""Faults, round three (issue 33): run folders killed before their first checkpoint, hard links, the disk
pre-check after a full disk, devices, and the cosmetic items (one warning for many damaged checkpoints, the
NaN refusal naming the file's keys, retried stack cells' size). docs/faults.md names each test."""

import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from markov_interp import devices, models, report, sweep
from markov_interp._io import UnsafePath, atomic_write
from markov_interp.cli import main
from markov_interp.training import loop, plan, train
from markov_interp import runs
from markov_interp.training.plan import PlanTooLarge
from markov_interp.runs import RunFolderError

from tests.faults.test_faults_io import _can_mount_tmpfs  # noqa: E402
from tests.sweep.test_sweep import tiny_spec  # noqa: E402
from tests.training.test_training import tiny_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
       "OMP_NUM_THREADS": "1"}


class Killed(Exception):
    """Stands for kill -9 in-process."""


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted `tiny_run()` folder (checkpoints at 1, 2, 5, 12): what a resumed folder must equal."""
    out = tmp_path_factory.mktemp("reference") / "run"
    train(tiny_run(), out, progress=False)
    return out


def _same_run(out: Path, reference: Path) -> None:
    for name in (models.WEIGHTS_FILE, runs.METRICS_FILE, runs.CONFIG_FILE):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    for step, path in runs.list_checkpoints(reference):
        assert (out / path.relative_to(reference)).read_bytes() == path.read_bytes(), step


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


# ---------------------------------------------------------------------- runs that never reached a checkpoint
def _before_first_checkpoint(out: Path, reference: Path, state: str) -> None:
    """A folder as a run of `tiny_run()` killed before its first checkpoint leaves it (the lock file too)."""
    out.mkdir()
    (out / runs.LOCK_FILE).write_text('{"pid": 1, "host": "gone", "started": "then"}')
    shutil.copyfile(reference / runs.CONFIG_FILE, out / runs.CONFIG_FILE)
    rows = (reference / runs.METRICS_FILE).read_text().splitlines(keepends=True)
    if state == "empty metrics":  # killed the moment metrics.jsonl appeared
        (out / runs.METRICS_FILE).write_text("")
    elif state == "rows, no checkpoint":  # n_checkpoints=0 runs (the background sweeps') killed mid-run
        (out / runs.METRICS_FILE).write_text("".join(rows[:1]))
    elif state == "half a checkpoint":  # Ctrl-C during the step-1 save: the weights written, not the state
        (out / runs.METRICS_FILE).write_text("")
        (out / runs.CHECKPOINT_DIR).mkdir()
        weights, _ = runs.checkpoint_paths(reference, 1)
        shutil.copyfile(weights, out / runs.CHECKPOINT_DIR / weights.name)
        (out / runs.CHECKPOINT_DIR / ".step_0000001.pt.x1y2.tmp").write_bytes(b"torn")
    elif state == "empty checkpoints folder":
        (out / runs.CHECKPOINT_DIR).mkdir()
    else:
        raise AssertionError(state)


@pytest.mark.parametrize("state", ["empty metrics", "rows, no checkpoint", "half a checkpoint",
                                   "empty checkpoints folder"])
def test_a_run_killed_before_its_first_checkpoint_resumes_from_scratch(tmp_path, reference, state):
    out = tmp_path / "run"
    _before_first_checkpoint(out, reference, state)
    assert runs.foreign_entries(out) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about: the same run starts again
        result = train(tiny_run(), out, progress=False)
    assert result.resumed_from is None
    _same_run(out, reference)


def test_the_issue_command_killed_as_metrics_appear_resumes(tmp_path):
    # issue 33, item 1, as reported: kill -9 the moment metrics.jsonl appears, then the same command
    argv = [sys.executable, "-m", "markov_interp.cli", "train", "--layers", "1", "--d-model", "8", "--seq-len",
            "32", "--batch-size", "8", "--steps", "40", "--checkpoints", "12", "--no-progress", "--threads", "1"]
    clean = subprocess.run([*argv, "--out", str(tmp_path / "clean")], env=ENV, capture_output=True, text=True,
                           timeout=300)
    assert clean.returncode == 0, clean.stderr
    out = tmp_path / "st"
    child = subprocess.Popen([*argv, "--out", str(out)], env=ENV, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (out / runs.METRICS_FILE).exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    child.send_signal(signal.SIGKILL)
    child.wait()
    again = subprocess.run([*argv, "--out", str(out)], env=ENV, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "not empty" not in again.stderr
    _same_run(out, tmp_path / "clean")


# A `train --seeds` stack (the background training's kind of run: one process, several run folders) SIGKILLed
# by itself at an exact point: after the N-th call of one of the package's writers, or after step N.
_DIE_AT = """
import os, signal, sys
from markov_interp.training import loop
from markov_interp import runs
from markov_interp.runs import checkpoints
point, n = sys.argv[1], int(sys.argv[2])
def die_after(name):
    home = checkpoints if name == "save_state" else runs  # the module whose calls of `name` are counted
    calls, writer = [0], getattr(home, name)
    def wrapped(*args, **kwargs):
        result = writer(*args, **kwargs)
        calls[0] += 1
        if calls[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return result
    setattr(home, name, wrapped)
if point == "step":
    loop._on_step = lambda step: step == n and os.kill(os.getpid(), signal.SIGKILL)
else:
    die_after(point)
from markov_interp.cli import main
sys.exit(main(sys.argv[3:]))
"""
_STACK = ["train", "--seeds", "0-2", "--layers", "1", "--d-model", "8", "--seq-len", "16", "--batch-size", "4",
          "--steps", "12", "--eval-every", "4", "--no-progress", "--threads", "1"]


def _folder_state(seed_dir: Path) -> str:
    names = sorted(p.name for p in seed_dir.iterdir()) if seed_dir.exists() else []
    checkpoints = seed_dir / runs.CHECKPOINT_DIR
    names += [f"checkpoints/{p.name}" for p in sorted(checkpoints.iterdir())] if checkpoints.is_dir() else []
    rows = len(runs.load_metrics(seed_dir)) if (seed_dir / runs.METRICS_FILE).is_file() else 0
    return f"{names} ({rows} rows)"


def _clean_and_killed(tmp_path: Path, argv: list[str], point: str, n: int) -> tuple[Path, list[Path]]:
    """`markov-interp` `argv` run clean into tmp_path/clean, and into tmp_path/killed SIGKILLed at `point` / `n`
    (`_DIE_AT`); returns the killed stack's folder and its seeds' folders."""
    clean = subprocess.run([sys.executable, "-m", "markov_interp.cli", *argv, "--out", str(tmp_path / "clean")],
                           env=ENV, capture_output=True, text=True, timeout=300)
    assert clean.returncode == 0, clean.stderr
    out = tmp_path / "killed"
    killed = subprocess.run([sys.executable, "-c", _DIE_AT, point, str(n), *argv, "--out", str(out)], env=ENV,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    return out, [out / f"seed-{s}" for s in range(3)]


@pytest.mark.slow
@pytest.mark.parametrize("checkpoints, point, n, left", [
    # after the 2nd config.json: seed-0 and seed-1 hold a config, seed-2 only the lock
    ("3", "prepare", 2, lambda s: not (s[2] / runs.CONFIG_FILE).exists() and (s[1] / "config.json").exists()),
    # after the 3rd metrics.jsonl opened: empty metrics everywhere, no row yet
    ("3", "MetricsLog", 3, lambda s: all((d / runs.METRICS_FILE).stat().st_size == 0 for d in s)),
    # during the step-1 save: seed-0's checkpoint weights written, not its training state (half a checkpoint)
    ("3", "save_state", 1, lambda s: runs.list_checkpoints(s[0]) == [] and any(
        (s[0] / runs.CHECKPOINT_DIR).iterdir())),
    # mid-run with checkpoints behind it: resumes from the newest
    ("3", "step", 7, lambda s: runs.list_checkpoints(s[0]) != []),
    # the background training's runs (no checkpoints) killed mid-run: rows, no checkpoint; restarts from scratch
    ("0", "step", 9, lambda s: runs.load_metrics(s[0]) != [] and not (s[0] / runs.CHECKPOINT_DIR).exists()),
])
def test_a_stack_killed_at_each_point_resumes_or_restarts_to_the_clean_run(tmp_path, checkpoints, point, n, left):
    argv = [*_STACK, "--checkpoints", checkpoints]
    out, seeds = _clean_and_killed(tmp_path, argv, point, n)
    assert left(seeds), [_folder_state(d) for d in seeds]  # the kill left the state this case is about
    assert all(runs.foreign_entries(d) == [] for d in seeds)
    # a file of the user's in a folder with no config is still refused, and the refusal writes nothing
    bare = next((d for d in seeds if not (d / runs.CONFIG_FILE).exists()), None)
    if bare is not None:
        before = [_folder_state(d) for d in seeds]
        (bare / "notes.txt").write_text("mine")
        refused = subprocess.run([sys.executable, "-m", "markov_interp.cli", *argv, "--out", str(out)], env=ENV,
                                 capture_output=True, text=True, timeout=300)
        assert refused.returncode == 2 and "holds files that are not a run's (notes.txt)" in refused.stderr
        (bare / "notes.txt").unlink()
        assert [_folder_state(d) for d in seeds] == before
    again = subprocess.run([sys.executable, "-m", "markov_interp.cli", *argv, "--out", str(out)], env=ENV,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "refusing" not in again.stderr and "never started" not in again.stderr
    for seed in range(3):
        _same_run(out / f"seed-{seed}", tmp_path / "clean" / f"seed-{seed}")


def _resume_points(seed_dir: Path) -> list[int]:
    return [step for step, _ in runs.list_resume_points(seed_dir)]


@pytest.mark.slow
@pytest.mark.parametrize("point, n, left", [
    # during the resume points of step 8 (rows at 4, 8, 10, 12; one at 4 and 8): seed-0's weights written, not its state
    ("save_state", 4, lambda s: _resume_points(s[0]) == [4] and (s[0] / "resume" / "step_0000008.safetensors").exists()),
    # after seed-0's whole resume point of step 8: the stack's newest common one is 4's
    ("save_state", 5, lambda s: [_resume_points(d) for d in s] == [[4, 8], [4], [4]]),
    # mid-run after every member's resume point of step 8 (the old ones removed)
    ("step", 9, lambda s: [_resume_points(d) for d in s] == [[8]] * 3),
])
def test_a_stack_without_checkpoints_killed_around_its_resume_points_resumes_to_the_clean_run(tmp_path, point, n,
                                                                                              left):
    """The background training's kind of run (no checkpoints) with a resume point every 3 steps, SIGKILLed by
    itself around its resume points: it resumes from the newest step every member holds, to the clean run's bytes,
    and keeps no resume point."""
    argv = [*_STACK, "--checkpoints", "0", "--set", "train.resume_every=3"]
    out, seeds = _clean_and_killed(tmp_path, argv, point, n)
    assert left(seeds), [_folder_state(d) for d in seeds]
    assert all(runs.foreign_entries(d) == [] and runs.list_checkpoints(d) == [] for d in seeds)
    again = subprocess.run([sys.executable, "-m", "markov_interp.cli", *argv, "--out", str(out)], env=ENV,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    for seed in range(3):
        _same_run(out / f"seed-{seed}", tmp_path / "clean" / f"seed-{seed}")
        assert not (out / f"seed-{seed}" / runs.RESUME_DIR).exists()


def test_folders_that_are_not_a_runs_are_refused_saying_what_is_there(tmp_path, reference):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"holds files that are not a run's \(notes.txt\) and no config.json"):
        train(tiny_run(), foreign, progress=False)
    orphan = tmp_path / "orphan"  # a run's rows without its config: which run is unknown
    orphan.mkdir()
    shutil.copyfile(reference / runs.METRICS_FILE, orphan / runs.METRICS_FILE)
    with pytest.raises(ValueError, match=r"holds run files \(metrics.jsonl rows\) but no config.json"):
        train(tiny_run(), orphan, progress=False)
    other = tmp_path / "other"  # another run's rows (no checkpoint): kept, not replaced
    _before_first_checkpoint(other, reference, "rows, no checkpoint")
    with pytest.raises(ValueError, match="holds a run with a different config"):
        train(tiny_run(lr=0.01), other, progress=False)
    mine = tmp_path / "mine"  # the same run beside a file of the user's: trained
    _before_first_checkpoint(mine, reference, "empty metrics")
    (mine / "notes.txt").write_text("mine")
    train(tiny_run(), mine, progress=False)
    assert (mine / "notes.txt").read_text() == "mine"


def test_own_files_are_one_list(tmp_path, reference):
    from markov_interp.report import REPORT_FILE

    assert REPORT_FILE == runs.REPORT_FILE
    assert runs.foreign_entries(reference) == []
    diverged = tmp_path / "diverged"
    with pytest.raises(runs.TrainingDiverged):
        train(tiny_run(lr=1e9), diverged, progress=False)
    assert (diverged / runs.STATUS_FILE).exists() and runs.foreign_entries(diverged) == []


# ---------------------------------------------------------------------------------------------- hard links
@pytest.mark.parametrize("name", [".lock", "metrics.jsonl", "config.json", "model.safetensors", "status.json",
                                  "checkpoints/step_0000001.pt"])
def test_a_hard_link_in_a_run_folder_is_refused_and_the_other_file_kept(tmp_path, capsys, reference, name):
    # issue 33, item 2: `echo precious > v.txt; ln v.txt r/.lock; train --out r` wrote the lock into v.txt
    out = tmp_path / "r"
    shutil.copytree(reference, out) if name != ".lock" else out.mkdir()
    (out / runs.LOCK_FILE).unlink(missing_ok=True)
    victim = tmp_path / "v.txt"
    victim.write_text("precious\n")
    (out / name).unlink(missing_ok=True)
    (out / name).parent.mkdir(exist_ok=True)
    os.link(victim, out / name)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"}
    err = _one_line_error(capsys, ["train", "--config", str(reference / runs.CONFIG_FILE), "--out", str(out),
                                   "--no-progress"])
    assert "other hard link" in err and str(out / name) in err
    assert victim.read_text() == "precious\n" and os.stat(victim).st_nlink == 2
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before  # nothing written into the folder
    assert name == ".lock" or not (out / ".lock").exists()  # the lock file it created is taken back (N11)


def test_the_in_place_writers_refuse_a_hard_link_themselves(tmp_path):
    # the lock and metrics.jsonl are written in place; each checks its own file (a link made after the
    # folder's check is refused too)
    victim = tmp_path / "v.txt"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir()
    os.link(victim, run / runs.METRICS_FILE)
    with pytest.raises(UnsafePath, match="other hard link"):
        runs.MetricsLog(run)
    os.link(victim, run / runs.LOCK_FILE)
    with pytest.raises(UnsafePath, match="other hard link"):
        runs.folder._open_lock(run / runs.LOCK_FILE, create=True)
    assert victim.read_text() == "precious\n"


def test_readers_read_a_hard_linked_file_and_atomic_writes_never_write_through_one(tmp_path, reference):
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    shared = tmp_path / "shared.safetensors"
    os.link(run / models.WEIGHTS_FILE, shared)  # weights shared to save disk: reading is harmless
    assert runs.read_config(run) == tiny_run()
    runs.load_model(run)
    keep = shared.read_bytes()
    atomic_write(run / models.WEIGHTS_FILE, b"new")  # written fresh and renamed: the other name keeps its bytes
    assert shared.read_bytes() == keep and (run / models.WEIGHTS_FILE).read_bytes() == b"new"


@pytest.mark.parametrize("where", [".lock", "spec.json", "results/abcdef0123456789.json", "results.csv"])
def test_a_hard_link_in_a_sweep_folder_is_refused(tmp_path, where):
    out = tmp_path / "sweep"
    (out / "results").mkdir(parents=True)
    victim = tmp_path / "v.txt"
    victim.write_text("precious\n")
    os.link(victim, out / where)
    with pytest.raises(UnsafePath, match="other hard link"):
        sweep.run(tiny_spec(), out, workers=1, progress=False)
    assert victim.read_text() == "precious\n" and not (out / "runs").exists()


# ------------------------------------------------------------------------------- the disk pre-check
def _interrupted(tmp_path: Path, monkeypatch, at: int) -> Path:
    def stop(step):
        if step == at:
            raise Killed

    out = tmp_path / "run"
    monkeypatch.setattr(loop, "_on_step", stop)
    with pytest.raises(Killed):
        train(tiny_run(), out, progress=False)
    monkeypatch.setattr(loop, "_on_step", lambda step: None)
    return out


def _free(monkeypatch, n_bytes: int) -> None:
    monkeypatch.setattr(plan.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 0, n_bytes))


def _whole_plan(out: Path) -> tuple[int, int]:
    """(bytes of the whole plan of tiny_run(), bytes left after the checkpoint of step 5): both count two resume
    points (the one kept and the one written over it; tiny_run() writes none, but its cadence is on)."""
    params = models.memory.parameter_count(tiny_run().model) * 4
    rows = plan.max_rows(tiny_run().train) * plan._ROW_FILE_BYTES
    checkpoint = 3 * params + plan._CHECKPOINT_EXTRA[tiny_run().train.stream]
    return rows + (4 + 2) * checkpoint + params, rows + (1 + 2) * checkpoint + params


def test_the_disk_check_counts_only_what_is_left_to_write(tmp_path, monkeypatch, reference):
    # issue 33, item 4: a run stopped by a full disk, resumed once some space is free, was refused because the
    # checkpoints already on disk were counted again, and the refusal blamed model.n_ctx
    out = _interrupted(tmp_path, monkeypatch, at=7)  # checkpoints 1, 2, 5 on disk; 12 left
    whole, left = _whole_plan(out)
    _free(monkeypatch, (whole + left) // 2)  # less than the whole plan, more than what is left
    train(tiny_run(), out, progress=False)
    _same_run(out, reference)


def test_a_refused_resume_names_free_space_not_a_setting(tmp_path, monkeypatch):
    out = _interrupted(tmp_path, monkeypatch, at=7)
    _, left = _whole_plan(out)
    _free(monkeypatch, left // 2)
    with pytest.raises(PlanTooLarge) as caught:
        train(tiny_run(), out, progress=False)
    message = str(caught.value)
    assert message.startswith("train: not enough free disk space: ") and f"free at {out}" in message
    assert "checkpoints already on disk are not counted" in message and "1 checkpoint(s)" in message
    assert "too large" not in message and "lower" not in message  # changing the run would orphan its folder
    fresh = tmp_path / "fresh"
    with pytest.raises(PlanTooLarge, match=r"not enough free disk space: .* \(or plan a smaller run: lower "
                                           r"train.n_checkpoints=4\)"):
        train(tiny_run(), fresh, progress=False)
    assert not fresh.exists()


# The issue's run: 400 steps, 12 checkpoints of a model whose positions (n_ctx 1024) make each checkpoint ~80 KB.
ISSUE_RUN = ["--layers", "1", "--d-model", "8", "--seq-len", "32", "--batch-size", "8", "--steps", "400",
             "--checkpoints", "12", "--no-progress", "--threads", "1"]


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs user namespaces to mount a private tmpfs")
def test_a_run_stopped_by_a_really_full_disk_resumes_once_space_is_freed(tmp_path):
    # a private tmpfs two checkpoints larger than the whole run: the run starts (its plan fits), a filler takes the
    # rest of the disk as soon as the checkpoint of step 9 exists, the run stops with ENOSPC naming its file; the
    # filler is deleted, leaving less free space than the whole run but more than what is left, and the same
    # command finishes the run, which ends byte-identical to an unbroken one
    clean = subprocess.run([sys.executable, "-m", "markov_interp.cli", "train", *ISSUE_RUN, "--out",
                            str(tmp_path / "clean")], env=ENV, capture_output=True, text=True, timeout=600)
    assert clean.returncode == 0, clean.stderr
    pages = [-(-p.stat().st_size // 4096) * 4096 for p in (tmp_path / "clean").rglob("*") if p.is_file()]
    pair = sum(p.stat().st_size for p in (tmp_path / "clean" / "checkpoints").glob("step_0000400.*"))
    size_kb = (sum(pages) + 2 * pair) // 1024 + 96  # + the lock, config and a rewritten metrics file
    disk, copy = tmp_path / "disk", tmp_path / "copy"
    disk.mkdir()
    train_cmd = " ".join([f'"{sys.executable}"', "-m", "markov_interp.cli", "train", *ISSUE_RUN, "--out",
                          '"$1/st"'])
    script = f"""
mount -t tmpfs -o size={size_kb}k tmpfs "$1" || exit 90
{train_cmd} 2> "$2.first" &
pid=$!
while [ ! -e "$1/st/checkpoints/step_0000009.pt" ] && kill -0 $pid 2>/dev/null; do sleep 0.005; done
dd if=/dev/zero of="$1/filler" bs=4k 2>/dev/null
wait $pid; echo "first $?"
rm "$1/filler"
echo "free $(df --output=avail -B1 "$1" | tail -1)"
{train_cmd} 2> "$2.second"; echo "second $?"
cp -r "$1/st" "$2"
"""
    done = subprocess.run(["unshare", "-Urm", "sh", "-c", script, "sh", str(disk), str(copy)], env=ENV,
                          capture_output=True, text=True, timeout=900)
    lines = dict(line.split(" ", 1) for line in done.stdout.split("\n") if line)
    first_err = Path(f"{copy}.first").read_text()
    assert lines.get("first") == "2", (done.stdout, done.stderr, first_err)
    assert "[Errno 28] No space left on device" in first_err and len(first_err.strip().splitlines()) == 1
    assert lines.get("second") == "0", Path(f"{copy}.second").read_text()
    assert int(lines["free"]) < sum(pages)  # less than the whole run takes: what is left fits, the whole would not
    _same_run(copy, tmp_path / "clean")


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs POSIX file-size limits")
def test_a_file_size_limit_stops_the_run_cleanly_and_it_resumes(tmp_path):
    # `ulimit -f`: a checkpoint file larger than the limit fails with EFBIG naming the file (Python ignores
    # SIGXFSZ), no half file is left, and without the limit the same command finishes byte-identical
    argv = [sys.executable, "-m", "markov_interp.cli", "train", *ISSUE_RUN]
    clean = subprocess.run([*argv, "--out", str(tmp_path / "clean")], env=ENV, capture_output=True, text=True,
                           timeout=600)
    assert clean.returncode == 0, clean.stderr
    state = max(p.stat().st_size for p in (tmp_path / "clean" / "checkpoints").glob("*.pt"))

    def limit():
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (state // 2, state // 2))

    out = tmp_path / "st"
    limited = subprocess.run([*argv, "--out", str(out)], env=ENV, capture_output=True, text=True, timeout=600,
                             preexec_fn=limit)
    assert limited.returncode == 2, limited.stderr
    assert "[Errno 27] File too large" in limited.stderr and str(out / "checkpoints") in limited.stderr
    assert len(limited.stderr.strip().splitlines()) == 1
    assert not [p for p in out.rglob("*.tmp")]  # no half-written checkpoint
    again = subprocess.run([*argv, "--out", str(out)], env=ENV, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    _same_run(out, tmp_path / "clean")


# ---------------------------------------------------------------------------------------------- devices
def test_every_entry_point_checks_its_device_in_one_line(tmp_path, capsys, reference):
    # issue 33, item 5: meta gave "META device type not an accelerator", mps without the build a raw
    # RuntimeError, and `probe RUN --device meta` a "weight tying broken" assertion
    out = tmp_path / "run"
    err = _one_line_error(capsys, ["train", "--out", str(out), "--set", "train.device=meta", "--no-progress"])
    assert "device 'meta' is not one markov-interp runs on" in err and "available here: cpu" in err
    assert not out.exists()
    for command in (["probe", str(reference), "--device", "meta"],
                    ["report", str(reference), "--device", "meta", "--out", str(tmp_path / "r.html")]):
        err = _one_line_error(capsys, command)
        assert "device 'meta' is not one markov-interp runs on" in err and "assert" not in err.lower()
    if not torch.backends.mps.is_built():
        err = _one_line_error(capsys, ["train", "--out", str(out), "--set", "train.device=mps", "--no-progress"])
        assert "this torch build has no MPS support (available here: cpu" in err
    if not torch.cuda.is_available():
        err = _one_line_error(capsys, ["probe", str(reference), "--device", "cuda:1"])
        assert "device 'cuda:1': CUDA is not available" in err
    with pytest.raises(ValueError, match="device 'xla' is not one"):
        sweep.run(tiny_spec(base={**tiny_spec().base, "train": {**tiny_spec().base["train"], "device": "xla"}}),
                  tmp_path / "sweep", workers=1, progress=False)
    assert not (tmp_path / "sweep").exists()
    with pytest.raises(ValueError, match="device 'meta'"):
        runs.load_model(reference, device="meta")
    with pytest.raises(ValueError, match="device 'meta'"):
        report.build(reference, device=torch.device("meta"))
    # the experiments and the reproduction: refused in one line before any folder is made
    for command in (["experiment", "phases", "--quick", "--out", str(tmp_path / "ex")],
                    ["reproduce", "--quick", "--work", str(tmp_path / "rq")]):
        for device in ("meta", "mps:0x") + (() if torch.cuda.is_available() else ("cuda:1",)):
            err = _one_line_error(capsys, [*command, "--device", device, "--no-progress"])
            assert f"device {device!r}" in err and "available here: cpu" in err
    assert not (tmp_path / "ex").exists() and not (tmp_path / "rq").exists()


def test_resolve_device_knows_the_kinds():
    assert devices.resolve_device("cpu") == torch.device("cpu")
    assert devices.resolve_device(torch.device("cpu")) == torch.device("cpu")
    assert devices.resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert devices.available_devices()[0] == "cpu"
    for bad in ("meta", "xla", "CPU", "cuda:", "cuda:-1", "mps:0x", "", 3):
        with pytest.raises(ValueError, match="device"):
            devices.resolve_device(bad)
    assert devices.check_device_name("cuda:3") == "cuda:3"  # the name alone (a Ray worker checks the rest)


# -------------------------------------------------------------------------------------------- cosmetics
def test_many_damaged_checkpoints_give_one_warning(tmp_path, monkeypatch, reference):
    out = _interrupted(tmp_path, monkeypatch, at=7)  # checkpoints 1, 2, 5
    for step, weights in runs.list_checkpoints(out):
        weights.write_bytes(weights.read_bytes()[:100])
    with pytest.warns(UserWarning) as caught:
        train(tiny_run(), out, progress=False)
    damaged = [w for w in caught if "unusable" in str(w.message) or "checkpoint" in str(w.message)]
    assert len(damaged) == 1, [str(w.message) for w in caught]
    assert str(damaged[0].message).startswith("3 checkpoints are unusable (steps 5, 2, 1); the newest: checkpoint ")
    assert str(damaged[0].message).endswith("; training from step 0")
    _same_run(out, reference)


def test_nan_weights_are_named_by_the_files_keys(tmp_path, reference):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    cfg, state = models.read_weights(out)
    state = {k: v.clone() for k, v in state.items()}
    name = sorted(state)[0]
    state[name].view(-1)[0] = float("nan")
    models.save_state(cfg, state, out, train_seq_len=32, step=12)
    with pytest.raises(RunFolderError) as caught:
        runs.load_model(out)
    message = str(caught.value)
    assert f"non-finite weights ({name})" in message
    assert "_original_component" not in message and "layers." not in message


def _dying_stack(cells, runs_dir, *, probes):
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.slow
def test_cells_of_a_dead_stack_say_so_in_their_row(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep.cells, "run_stack", _dying_stack)  # forked workers inherit it
    result = sweep.run(tiny_spec(), tmp_path, workers=2, group=2, progress=False)
    assert result.n_failed == 0 and all(row.status == "ok" for row in result.rows)
    for row in result.rows:
        assert row.stack_size == 1 and row.stack_note == "the worker of its stack of 2 died; retried as a solo cell"
    table = sweep.read_table(tmp_path)
    assert [r.stack_size for r in table] == [1, 1, 1, 1]


# -------------------------------------------------------------------- sweep and train --seeds overlapping
SEEDS_RUN = ["--layers", "1", "--d-model", "8", "--n-ctx", "32", "--seq-len", "16", "--batch-size", "4", "--steps",
             "30", "--checkpoints", "3", "--no-progress", "--threads", "1"]


def _cli(*argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "markov_interp.cli", *argv], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _files(folder: Path) -> dict:
    """Every weights and metrics file under `folder`, by relative path, as bytes."""
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*")
            if p.name in (models.WEIGHTS_FILE, runs.METRICS_FILE)}


@pytest.mark.slow
def test_sweep_and_train_seeds_into_overlapping_folders(tmp_path):
    # a sweep into D while `train --seeds` writes D/seed-N, and another into D/runs/seed-N (beside the sweep's
    # cell folders): all run at once, each refuses nothing of the others', and every file equals the same work
    # done apart, byte for byte
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(tiny_spec().to_json())
    apart = [_cli("sweep", str(spec_file), "--out", str(tmp_path / "apart-sweep"), "--workers", "1",
                  "--no-progress"),
             _cli("train", *SEEDS_RUN, "--seeds", "0-1", "--out", str(tmp_path / "apart-seeds"))]
    for child in apart:
        assert child.wait(timeout=900) == 0, child.communicate()[1]
    shared = tmp_path / "D"
    together = [_cli("sweep", str(spec_file), "--out", str(shared), "--workers", "1", "--no-progress"),
                _cli("train", *SEEDS_RUN, "--seeds", "0-1", "--out", str(shared)),
                _cli("train", *SEEDS_RUN, "--seeds", "0-1", "--out", str(shared / "runs"))]
    for child in together:
        out, err = child.communicate(timeout=900)
        assert child.returncode == 0, err
    sweep_files = {p: b for p, b in _files(shared).items() if not p.parts[0].startswith("seed-")
                   and not (p.parts[0] == "runs" and p.parts[1].startswith("seed-"))}
    assert sweep_files == _files(tmp_path / "apart-sweep")
    seeds = _files(tmp_path / "apart-seeds")
    assert {p: b for p, b in _files(shared).items() if p.parts[0].startswith("seed-")} == seeds
    assert _files(shared / "runs" / "seed-0") == {p.relative_to("seed-0"): b for p, b in seeds.items()
                                                 if p.parts[0] == "seed-0"}
    table = sweep.read_table(shared)
    assert [r.status for r in table] == ["ok"] * 4
    # the sweep again: its cells are done, the seed folders beside them are not its business
    again = sweep.run(tiny_spec(), shared, workers=1, progress=False)
    assert (again.n_run, again.n_skipped) == (0, 4)


@pytest.mark.slow
def test_train_into_a_cell_folder_while_the_sweep_trains_it(tmp_path):
    # the same run folder written by two commands at once: one waits for nothing and is refused (naming the
    # holder), or they do not overlap in time and the second finds the run finished; either way one run, intact
    spec = tiny_spec(base={**tiny_spec().base, "train": {**tiny_spec().base["train"], "steps": 60}})
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec.to_json())
    cell = spec.cells()[0]
    config = tmp_path / "cell.json"
    config.write_text(cell.config.to_json())
    shared = tmp_path / "D"
    sweeper = _cli("sweep", str(spec_file), "--out", str(shared), "--workers", "1", "--no-progress")
    _wait = time.monotonic() + 900
    while not (shared / "runs" / cell.cell_id).exists() and time.monotonic() < _wait:
        time.sleep(0.01)
    trainer = _cli("train", "--config", str(config), "--out", str(shared / "runs" / cell.cell_id), "--no-progress")
    _, err = trainer.communicate(timeout=900)
    assert trainer.returncode == 0 or (trainer.returncode == 2 and "is being written by pid" in err), err
    assert sweeper.wait(timeout=900) == 0, sweeper.communicate()[1]
    apart = sweep.run(spec, tmp_path / "apart", workers=1, progress=False)
    assert _files(shared) == _files(tmp_path / "apart")
    assert [r.status for r in apart.rows] == [r.status for r in sweep.read_table(shared)] == ["ok"] * 4
