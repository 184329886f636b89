"""Resume points (`TrainConfig.resume_every`, `training.resume`): a run killed at any step resumes bit-identically
from the newest of its checkpoints and its resume point, whatever `n_checkpoints` is, alone or in a stack; the
resume point is the checkpoint's files in resume/, kept one at a time, gone when the run ends, and never seen by
what reads checkpoints."""

import json
import re
import shutil
import warnings
from pathlib import Path

import pytest

from markov_interp import runs, sweep
from markov_interp.report import _build
from markov_interp.training import TrainConfig, loop, plan, resume, train, train_many
from markov_interp.training.plan import PlanTooLarge

from tests.training.test_training import tiny_run  # noqa: E402


class Killed(Exception):
    """Stands for kill -9 in-process: raised after a step (and its saves), nothing of the loop's cleanup trusted."""


def _killed(monkeypatch, runs_, outs, at: int) -> None:
    """Train `runs_` into `outs` (a stack when several) and stop after step `at`."""
    def stop(step):
        if step == at:
            raise Killed

    monkeypatch.setattr(loop, "_on_step", stop)
    with pytest.raises(Killed):
        train_many(runs_, outs, progress=False, models_out=False)
    monkeypatch.setattr(loop, "_on_step", lambda step: None)


def _same_folder(out: Path, reference: Path) -> None:
    """Byte-identical final weights, metrics and checkpoints, and nothing in resume/ (no resume/ at all)."""
    for name in (runs.WEIGHTS_FILE, runs.METRICS_FILE):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    assert [s for s, _ in runs.list_checkpoints(out)] == [s for s, _ in runs.list_checkpoints(reference)]
    for _, path in runs.list_checkpoints(reference):
        assert (out / path.relative_to(reference)).read_bytes() == path.read_bytes(), path.name
    assert not (out / runs.RESUME_DIR).exists() and runs.list_resume_points(out) == []


def _points(step: int, every: int, log_every: int, checkpoints: set[int], steps: int) -> list[int]:
    """The resume points the loop should write up to `step`, computed independently: at the rows (every
    `log_every` steps here) `every` steps after the last save, never at a checkpoint or the last step."""
    saved, points = 0, []
    for s in range(1, step + 1):
        if s in checkpoints:
            saved = s
        elif s % log_every == 0 and s < steps and s - saved >= every:
            saved = s
            points.append(s)
    return points


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Uninterrupted folders of tiny_run() (12 steps, rows every 2) with 0 and 4 checkpoints (1, 2, 5, 12)."""
    base = tmp_path_factory.mktemp("references")
    return {n: train(tiny_run(n_checkpoints=n, resume_every=3), base / f"n{n}", progress=False).out_dir for n in (0, 4)}


# ------------------------------------------------------------------------------------------------ config
def test_resume_every_is_a_later_field():
    assert "resume_every" not in TrainConfig().to_dict()  # configs written before it serialise unchanged
    assert TrainConfig(resume_every=50).to_dict()["resume_every"] == 50
    assert TrainConfig.from_dict({"resume_every": 0}).resume_every == 0
    for bad in (-1, True):  # (a float or a string is refused by the annotation where types are checked)
        with pytest.raises(ValueError, match=f"resume_every must be None or an integer >= 0, got {bad!r}"):
            TrainConfig(resume_every=bad)


def test_the_cadence_is_not_part_of_what_a_run_is(tmp_path, monkeypatch, references):
    """A sweep cell's id leaves it out, and a folder killed at one cadence resumes under another."""
    assert sweep.cell_id(tiny_run(resume_every=7)) == sweep.cell_id(tiny_run())
    out = tmp_path / "run"
    _killed(monkeypatch, [tiny_run(n_checkpoints=0, resume_every=3)], [out], at=9)
    result = train(tiny_run(n_checkpoints=0, resume_every=0), out, progress=False)
    assert result.resumed_from == 8
    _same_folder(out, references[0])
    assert json.loads((out / runs.CONFIG_FILE).read_text())["train"]["resume_every"] == 3  # the folder's, kept


def test_resume_point_due():
    every = TrainConfig(resume_every=4)
    assert [resume.resume_point_due(every, n, 0.0) for n in (3, 4, 5)] == [False, True, True]
    assert not resume.resume_point_due(TrainConfig(resume_every=0), 10**9, 10.0**9)
    default = TrainConfig()
    assert not resume.resume_point_due(default, 10**9, resume.RESUME_SECONDS - 1)
    assert resume.resume_point_due(default, 1, resume.RESUME_SECONDS)


# ------------------------------------------------------------------------------------------ bit-identical
@pytest.mark.parametrize("n_checkpoints, at", [(0, 9), (0, 5), (4, 9), (4, 7)])
def test_a_killed_run_resumes_bit_identically(tmp_path, monkeypatch, references, n_checkpoints, at):
    out = tmp_path / "run"
    run = tiny_run(n_checkpoints=n_checkpoints, resume_every=3)
    _killed(monkeypatch, [run], [out], at)
    checkpoints = {s for s, _ in runs.list_checkpoints(out)}
    expected = _points(at, 3, 2, checkpoints, 12)
    held = [s for s, _ in runs.list_resume_points(out)]
    assert held == [p for p in expected[-1:] if p > max(checkpoints, default=0)]  # one at rest, newer than ckpts
    assert checkpoints == ({1, 2, 5} if n_checkpoints else set())
    result = train(run, out, progress=False)
    assert result.resumed_from == max([*held, *checkpoints])
    _same_folder(out, references[n_checkpoints])


@pytest.mark.slow
@pytest.mark.parametrize("n_checkpoints", [0, 4])
def test_a_run_killed_at_any_step_resumes_bit_identically(tmp_path, monkeypatch, references, n_checkpoints):
    run = tiny_run(n_checkpoints=n_checkpoints, resume_every=3)
    for at in range(1, 12):
        out = tmp_path / f"at{at}"
        _killed(monkeypatch, [run], [out], at)
        train(run, out, progress=False)
        _same_folder(out, references[n_checkpoints])


def test_without_resume_points_a_run_without_checkpoints_starts_over(tmp_path, monkeypatch, references):
    out = tmp_path / "run"
    run = tiny_run(n_checkpoints=0, resume_every=0)
    _killed(monkeypatch, [run], [out], at=9)
    assert not (out / runs.RESUME_DIR).exists()
    assert train(run, out, progress=False).resumed_from is None
    _same_folder(out, references[0])


def test_a_stack_resumes_bit_identically_also_when_killed_between_its_members_saves(tmp_path, monkeypatch,
                                                                                  references):
    """Three members (seeds 0, 1, 2). A kill while the stack writes its resume points of step 8 (after member
    0's) leaves member 0 with the points of steps 4 and 8, the others with 4's: the stack resumes from 4, and
    every member ends as it does trained alone and uninterrupted."""
    members = [tiny_run(n_checkpoints=0, resume_every=3, seed=seed) for seed in range(3)]
    alone = [train(run, tmp_path / f"alone{run.train.seed}", progress=False).out_dir for run in members]
    assert (alone[0] / runs.WEIGHTS_FILE).read_bytes() == (references[0] / runs.WEIGHTS_FILE).read_bytes()
    outs = [tmp_path / f"member{k}" for k in range(3)]
    save = runs.save_checkpoint

    def save_then_die(run_dir, step, *args, **kwargs):
        save(run_dir, step, *args, **kwargs)
        if step == 8 and Path(run_dir) == outs[0]:
            raise Killed

    monkeypatch.setattr(runs, "save_checkpoint", save_then_die)
    with pytest.raises(Killed):
        train_many(members, outs, progress=False, models_out=False)
    monkeypatch.undo()
    assert [[s for s, _ in runs.list_resume_points(out)] for out in outs] == [[4, 8], [4], [4]]
    results = train_many(members, outs, progress=False, models_out=False)
    assert [r.resumed_from for r in results] == [4, 4, 4]
    for out, reference in zip(outs, alone):
        _same_folder(out, reference)
    again = [tmp_path / f"again{k}" for k in range(3)]
    _killed(monkeypatch, members, again, at=11)  # a plain kill: the points of step 8 (the row of 10 is too soon)
    assert [r.resumed_from for r in train_many(members, again, progress=False, models_out=False)] == [8, 8, 8]
    for out, reference in zip(again, alone):
        _same_folder(out, reference)


def test_the_default_cadence_is_wall_time(tmp_path, monkeypatch, references):
    """resume_every=None: a resume point at the first row 5 minutes after the last save (a clock advancing 100 s a
    call stands in for a slow run); a quick run on the real clock writes none."""
    out = tmp_path / "run"
    now = iter(range(0, 10**6, 100))
    monkeypatch.setattr(loop, "_clock", lambda: float(next(now)))
    _killed(monkeypatch, [tiny_run(n_checkpoints=0)], [out], at=9)
    # the clock reads 0 at the start, 100, 200, 300 (due: saved, then 400) at the rows of steps 2, 4, 6, 500 at 8
    assert [s for s, _ in runs.list_resume_points(out)] == [6]
    monkeypatch.undo()
    assert train(tiny_run(n_checkpoints=0), out, progress=False).resumed_from == 6
    _same_folder(out, references[0])
    written = []
    monkeypatch.setattr(runs, "save_checkpoint", lambda *args, **kwargs: written.append(kwargs))
    train(tiny_run(n_checkpoints=0), tmp_path / "quick", progress=False)
    assert written == []


# ------------------------------------------------------------------------------------------ what reads it
def test_readers_never_see_a_resume_point(tmp_path, monkeypatch):
    out = tmp_path / "run"
    run = tiny_run(n_checkpoints=0, resume_every=3)
    _killed(monkeypatch, [run], [out], at=9)
    assert [s for s, _ in runs.list_resume_points(out)] == [8]
    assert runs.list_checkpoints(out) == [] and _build.checkpoint_files(out) == []
    assert runs.foreign_entries(out) == []  # the package's own files
    assert runs.run_folder_of(runs.list_resume_points(out)[0][1]) == out
    other = tiny_run(n_checkpoints=0, resume_every=3, lr=1e-3)
    shutil.copytree(out, tmp_path / "copy")
    (tmp_path / "copy" / runs.METRICS_FILE).write_text("")
    with pytest.raises(ValueError, match=r"holds a run with a different config.*lr"):  # its progress: resume/ files
        train(other, tmp_path / "copy", progress=False)


def test_a_resume_point_left_beside_final_weights_is_removed(tmp_path, monkeypatch, references):
    """A kill between the final weights and the resume point's removal: the next call loads the run and removes it."""
    out = tmp_path / "run"
    run = tiny_run(n_checkpoints=0, resume_every=3)
    _killed(monkeypatch, [run], [out], at=9)
    shutil.copytree(out / runs.RESUME_DIR, tmp_path / "kept")
    train(run, out, progress=False)
    shutil.copytree(tmp_path / "kept", out / runs.RESUME_DIR)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert train(run, out, progress=False).already_done
    _same_folder(out, references[0])


def test_a_damaged_resume_point_falls_back_to_the_checkpoints(tmp_path, monkeypatch, references):
    out = tmp_path / "run"
    run = tiny_run(resume_every=3)
    _killed(monkeypatch, [run], [out], at=9)
    (weights, _), = [runs.checkpoint_paths(out, s, resume_point=True) for s, _ in runs.list_resume_points(out)]
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.warns(UserWarning, match=r"resume point .*step_0000008.safetensors.*; resuming from the checkpoint "
                                         r"of step 5"):
        assert train(run, out, progress=False).resumed_from == 5
    _same_folder(out, references[4])


# ------------------------------------------------------------------------------------------------ disk plan
def test_a_disk_full_between_a_checkpoints_files_leaves_neither(tmp_path, monkeypatch, references):
    """The weights are written, then the training state hits a full disk: the weights file goes too (an orphan
    would take space the resumed run's disk check does not count: a CI flake of the tmpfs test), the error is the
    disk's, and the run resumes from the checkpoint before to the uninterrupted run's bytes."""
    import errno

    from markov_interp.runs import checkpoints

    real = checkpoints.atomic_write

    def full_at_step_5(path, data):
        if "0000005" in Path(path).name:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data)

    out = tmp_path / "run"
    monkeypatch.setattr(checkpoints, "atomic_write", full_at_step_5)
    with pytest.raises(OSError, match="No space left"):
        train(tiny_run(n_checkpoints=4, resume_every=3), out, progress=False)
    assert not list((out / runs.CHECKPOINT_DIR).glob("step_0000005*"))  # neither file of step 5
    assert [s for s, _ in runs.list_checkpoints(out)] == [1, 2]
    monkeypatch.setattr(checkpoints, "atomic_write", real)
    assert train(tiny_run(n_checkpoints=4, resume_every=3), out, progress=False).resumed_from >= 2
    _same_folder(out, references[4])


def test_the_disk_check_counts_two_resume_points_a_run(tmp_path, monkeypatch):
    """n_checkpoints=0: the files left are the metrics, the final weights and, unless resume_every=0, two resume
    points (a checkpoint's files each); free space between the two totals passes only without them."""
    from markov_interp import models

    run = tiny_run(n_checkpoints=0)
    params = models.memory.parameter_count(run.model) * 4
    base = plan.max_rows(run.train) * plan._ROW_FILE_BYTES + params
    points = 2 * (3 * params + plan._CHECKPOINT_EXTRA[run.train.stream])
    monkeypatch.setattr(plan.shutil, "disk_usage",
                        lambda path: shutil._ntuple_diskusage(10**12, 0, base + points // 2))
    train(tiny_run(n_checkpoints=0, resume_every=0), tmp_path / "off", progress=False)
    with pytest.raises(PlanTooLarge, match=r"2 resume point\(s\) .*plan a smaller run: set train.resume_every=0"):
        train(run, tmp_path / "on", progress=False)
    monkeypatch.setattr(plan.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 0, base + points))
    train(run, tmp_path / "on", progress=False)


def test_a_diverging_member_keeps_no_resume_point_and_the_cadence_changes_no_number(tmp_path, monkeypatch):
    """A stack of a diverging member (SGD at lr 3e3) and a healthy one, with a resume point at every row: the
    diverged folder keeps none, each member's metrics equal those of its run alone without resume points, and a
    kill after the divergence resumes to the same folders."""
    def pair(every):
        return [tiny_run(lr=lr, optimizer="sgd", n_checkpoints=0, resume_every=every) for lr in (3e3, 1e-2)]

    alone = [train_many([run], [tmp_path / f"alone{k}"], progress=False, models_out=False)[0]
             for k, run in enumerate(pair(0))]
    assert alone[0].failed is not None and alone[1].failed is None
    outs = [tmp_path / f"member{k}" for k in range(2)]
    results = train_many(pair(1), outs, progress=False, models_out=False)
    assert [r.failed is None for r in results] == [False, True]
    again = [tmp_path / f"again{k}" for k in range(2)]
    _killed(monkeypatch, pair(1), again, at=11)
    assert runs.list_resume_points(again[0]) == [] and [s for s, _ in runs.list_resume_points(again[1])] == [10]
    assert train_many(pair(1), again, progress=False, models_out=False)[1].resumed_from == 10
    for folders in (outs, again):
        for out, reference in zip(folders, alone):
            assert runs.load_metrics(out) == runs.load_metrics(reference.out_dir)
            assert not (out / runs.RESUME_DIR).exists()
        assert (folders[1] / runs.WEIGHTS_FILE).read_bytes() == (alone[1].out_dir / runs.WEIGHTS_FILE).read_bytes()


def test_metrics_that_reach_no_resume_point_are_refused_with_the_way_out(tmp_path, monkeypatch, references):
    """Rows cut before the resume point (a folder edited by hand): the resume is refused naming resume/ to delete;
    deleting it, as the message says, retrains from step 0 to the same bytes."""
    out = tmp_path / "run"
    run = tiny_run(n_checkpoints=0, resume_every=3)
    _killed(monkeypatch, [run], [out], at=9)
    runs.write_metrics(out, [r for r in runs.load_metrics(out) if r["step"] <= 6])
    with pytest.raises(runs.RunFolderError, match=r"lacks rows before every checkpoint and resume point \(steps \[8\]\)"
                                                  rf".* delete .*, {re.escape(str(out / runs.RESUME_DIR))} and"):
        train(run, out, progress=False)
    shutil.rmtree(out / runs.RESUME_DIR)
    assert train(run, out, progress=False).resumed_from is None
    _same_folder(out, references[0])
