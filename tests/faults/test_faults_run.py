"""Faults of a run (issue 25, items 3, 5, 7, 8): plans bounded by arithmetic and refused up front, metrics
appended, damaged weights and checkpoints detected, a full disk during a checkpoint, permissions, the open-file
limit, byte-identical weight files, and a sweep whose worker is killed mid-cell."""

import errno
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from markov_interp import models, sweep
from markov_interp.models import canonical_safetensors
from markov_interp.training import RunConfig, TrainConfig, loop, plan, train
from markov_interp import runs
from markov_interp.training.plan import PlanTooLarge
from markov_interp.runs import RunFolderError
from markov_interp.training.schedule import StepPlan, checkpoint_steps

from tests.sweep.test_sweep import tiny_spec  # noqa: E402
from tests.training.test_training import assert_same_weights, tiny_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class Killed(Exception):
    """Stands for kill -9 in-process: raised after a step's checkpoint, nothing of the loop's cleanup trusted."""


def _interrupted(tmp_path: Path, monkeypatch, at: int, name: str = "run") -> Path:
    """A run folder of `tiny_run()` (checkpoints at 1, 2, 5, 12) stopped after step `at`."""
    def stop(step):
        if step == at:
            raise Killed

    out = tmp_path / name
    monkeypatch.setattr(loop, "_on_step", stop)
    with pytest.raises(Killed):
        train(tiny_run(), out, progress=False)
    monkeypatch.setattr(loop, "_on_step", lambda step: None)
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted `tiny_run()` folder: what every repaired or resumed folder must equal, bit for bit."""
    out = tmp_path_factory.mktemp("reference") / "run"
    result = train(tiny_run(), out, progress=False)
    return out, result


# ------------------------------------------------------------------------------------- byte-identical files
def test_safetensors_header_is_canonical():
    tensors = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.ones(3)}
    one = canonical_safetensors(st_save(tensors, metadata={"x": "1", "y": "2", "format": "pt"}))
    two = canonical_safetensors(st_save(dict(reversed(tensors.items())), metadata={"format": "pt", "y": "2", "x": "1"}))
    assert one == two
    size = int.from_bytes(one[:8], "little")
    assert size % 8 == 0
    header = json.loads(one[8:8 + size])
    assert list(header) == sorted(header) and list(header["__metadata__"]) == sorted(header["__metadata__"])
    back = st_load(one)
    assert back.keys() == tensors.keys() and all(torch.equal(back[k], tensors[k]) for k in tensors)


def test_identical_runs_write_byte_identical_weights(tmp_path, reference):
    out, _ = reference
    train(tiny_run(), tmp_path / "again", progress=False)
    assert (tmp_path / "again" / models.WEIGHTS_FILE).read_bytes() == (out / models.WEIGHTS_FILE).read_bytes()
    for step, path in runs.list_checkpoints(out):
        assert (tmp_path / "again" / path.relative_to(out)).read_bytes() == path.read_bytes(), step


@pytest.mark.slow
def test_weights_are_byte_identical_across_processes(tmp_path):
    """safetensors orders its metadata by a per-process hash: two processes are what showed the difference."""
    script = ("import sys; from markov_interp import models; m = models.build(models.preset('paper-1layer'), seed=0); "
              "models.save(m, sys.argv[1])")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    files = [tmp_path / f"{i}.safetensors" for i in range(3)]
    for path in files:
        subprocess.run([sys.executable, "-c", script, str(path)], check=True, env=env, timeout=300)
    assert len({path.read_bytes() for path in files}) == 1


# ------------------------------------------------------------------------------------------- plan sizes
def _brute_points(steps: int, n: int) -> set[int]:
    """The log-spaced points as first written: every point computed, O(n)."""
    if n <= 0:
        return set()
    if n == 1 or steps == 1:
        return {steps}
    return {max(1, min(steps, round(math.exp(math.log(steps) * i / (n - 1))))) for i in range(n)} | {steps}


@pytest.mark.parametrize("steps, n", [(1000, 4), (12, 4), (5, 10**6), (300, 300), (10**4, 5000), (10**6, 2 * 10**5),
                                      (97, 40), (1, 7), (10**5, 1)])
def test_checkpoint_steps_equal_every_point_computed(steps, n):
    assert checkpoint_steps(steps, n) == sorted(_brute_points(steps, n))


@pytest.mark.parametrize("kwargs", [dict(steps=100, log_every=7, eval_every=30, eval_log_points=9, n_checkpoints=5),
                                    dict(steps=257, log_every=1, eval_every=0, eval_log_points=0, n_checkpoints=0),
                                    dict(steps=1000, log_every=50, eval_every=0, eval_log_points=400,
                                         n_checkpoints=10**6)])
def test_step_plan_equals_the_brute_force_plan(kwargs):
    tc = TrainConfig(**kwargs)
    plan_ = StepPlan.of(tc)
    evals = _brute_points(tc.steps, tc.eval_log_points) | {tc.steps} | (
        set(range(tc.eval_every, tc.steps + 1, tc.eval_every)) if tc.eval_every else set())
    ckpts = _brute_points(tc.steps, tc.n_checkpoints)
    logged = [s for s in range(1, tc.steps + 1) if s % tc.log_every == 0 or s in evals]
    assert [s for s in range(1, tc.steps + 1) if plan_.evaluates(s)] == sorted(evals)
    assert [s for s in range(1, tc.steps + 1) if plan_.checkpoints(s)] == sorted(ckpts)
    assert [s for s in range(1, tc.steps + 1) if plan_.logs(s)] == logged == list(plan_.logged(tc.steps))
    assert list(plan_.logged(tc.steps // 3)) == [s for s in logged if s <= tc.steps // 3]


def test_a_trillion_step_plan_is_arithmetic():
    # the evaluation plan of 10**12 steps used to be a set of 10**10 steps (6 GB before step 1)
    tc = TrainConfig(steps=10**12, eval_every=100, log_every=10, eval_log_points=30, n_checkpoints=20)
    plan_ = StepPlan.of(tc)
    assert plan_.evaluates(10**12) and plan_.evaluates(500) and not plan_.evaluates(10**12 - 1)
    assert plan_.checkpoints(10**12) and plan_.checkpoints(1) and not plan_.checkpoints(2)
    expected = sorted({s for s in _brute_points(10**12, 30) if s <= 100} | set(range(10, 101, 10)))
    rows = plan_.logged(10**12)
    assert [next(rows) for _ in expected] == expected


@pytest.mark.parametrize("change, field", [
    (dict(train=dict(steps=10**12)), "train.steps=1000000000000"),
    (dict(train=dict(steps=10**8, n_checkpoints=10**9)), "train.n_checkpoints=1000000000"),
    (dict(model=dict(d_model=10**9)), "model.d_model=1000000000"),
    (dict(model=dict(n_ctx=10**9)), "model.n_ctx=1000000000"),
    (dict(source=dict(kind="random", vocab=10**6, p=None, q=None), model=dict(d_vocab=10**6)), "source.vocab=1000000"),
    (dict(train=dict(batch_size=10**7)), "train.batch_size=10000000"),
])
def test_absurd_sizes_are_refused_before_anything_is_written(tmp_path, change, field):
    run = tiny_run()
    data = run.to_dict()
    for section, fields in change.items():
        data[section].update(fields)
    big = RunConfig.from_json(json.dumps(data))
    out = tmp_path / "run"
    with pytest.raises(PlanTooLarge, match=rf"{field} is too large: (.* would need .* of memory|at most 10000 checkpoints)") as info:
        train(big, out, progress=False)
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)
    assert not out.exists()  # nothing left that would refuse the corrected command
    assert train(tiny_run(), out, progress=False).resumed_from is None  # the corrected command runs


def test_a_config_left_by_a_refused_command_gives_way(tmp_path, reference):
    # an older version wrote config.json before refusing: the folder holds nothing else, so the corrected
    # command takes it over (with a warning) instead of refusing "a different config"
    out = tmp_path / "run"
    out.mkdir()
    (out / runs.CONFIG_FILE).write_text(tiny_run(steps=10**12).to_json())
    with pytest.warns(UserWarning, match="never started"):
        result = train(tiny_run(), out, progress=False)
    assert_same_weights(result.model, reference[1].model)
    started = tmp_path / "started"  # a folder with progress keeps its config: refused as before
    train(tiny_run(steps=6), started, progress=False)
    with pytest.raises(ValueError, match="different config"):
        train(tiny_run(), started, progress=False)


def test_checkpoint_and_evaluation_counts_are_capped_at_the_steps(tmp_path):
    result = train(tiny_run(n_checkpoints=10**9, eval_log_points=10**9), tmp_path, progress=False)
    assert [s for s, _ in runs.list_checkpoints(tmp_path)] == list(range(1, 13))
    assert [r["step"] for r in result.metrics if "eval_loss" in r] == list(range(1, 13))
    assert result.config.train.n_checkpoints == 10**9


# ------------------------------------------------------------------------------------------- open files
def test_open_file_limit_is_raised_or_the_plan_refused(monkeypatch):
    import resource

    calls = []
    monkeypatch.setattr(resource, "setrlimit", lambda which, limits: calls.append(limits))
    monkeypatch.setattr(resource, "getrlimit", lambda which: (256, 4096))
    plan.check_open_files(300)  # 600 descriptors fit under the hard limit: the soft one is raised
    assert calls and 600 < calls[0][0] <= 4096 and calls[0][1] == 4096
    monkeypatch.setattr(resource, "getrlimit", lambda which: (256, 256))
    with pytest.raises(PlanTooLarge, match=r"300 run folders .*\(ulimit -n\) is 256; raise it \(ulimit -n \d+\) or "
                                           r"train fewer runs at once \(e.g. --seeds in batches of \d+\)"):
        plan.check_open_files(300)
    plan.check_open_files(10)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="ulimit is POSIX")
def test_seeds_under_a_low_open_file_limit_are_refused_up_front(tmp_path):
    out = tmp_path / "seeds"
    command = (f"ulimit -n 256 && {sys.executable} -m markov_interp.cli train --seeds 0-299 --steps 2 "
               f"--seq-len 8 --batch-size 2 --n-ctx 8 --no-progress --out {out}")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "ulimit -n" in done.stderr and "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
    assert not out.exists() or not any(out.iterdir())


# ---------------------------------------------------------------------------------------- metrics appended
def test_metrics_are_appended_never_rewritten(tmp_path, monkeypatch, reference):
    rewrites = []
    real = runs.write_metrics
    monkeypatch.setattr(runs, "write_metrics", lambda *a, **k: (rewrites.append(a), real(*a, **k)))
    train(tiny_run(), tmp_path, progress=False)
    assert rewrites == []  # a fresh run only appends
    assert (tmp_path / runs.METRICS_FILE).read_bytes() == (reference[0] / runs.METRICS_FILE).read_bytes()


def test_a_row_torn_by_a_crash_is_cut_and_the_resume_is_bit_identical(tmp_path, monkeypatch, reference):
    out = _interrupted(tmp_path, monkeypatch, at=7)
    with open(out / runs.METRICS_FILE, "a") as handle:
        handle.write('{"step": 8, "train_lo')  # the append a kill interrupted
    assert runs.load_metrics(out)[-1]["step"] <= 7
    result = train(tiny_run(), out, progress=False)
    assert result.resumed_from == 5
    assert (out / runs.METRICS_FILE).read_bytes() == (reference[0] / runs.METRICS_FILE).read_bytes()
    assert (out / models.WEIGHTS_FILE).read_bytes() == (reference[0] / models.WEIGHTS_FILE).read_bytes()


def test_a_torn_line_inside_the_file_is_still_an_error(tmp_path, reference):
    shutil.copytree(reference[0], tmp_path / "run")
    path = tmp_path / "run" / runs.METRICS_FILE
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:2]) + '{"step": 6, "tr\n' + "".join(lines[2:]))
    with pytest.raises(ValueError, match=r"metrics.jsonl line 3 is not JSON"):
        runs.load_metrics(tmp_path / "run")


# ------------------------------------------------------------------------------------------ damage
def test_truncated_final_weights_are_restored_from_the_last_checkpoint(tmp_path, reference):
    out = tmp_path / "run"
    shutil.copytree(reference[0], out)
    weights = out / models.WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.warns(UserWarning, match=r"model.safetensors is damaged .*checkpoint of step 12"):
        result = train(tiny_run(), out, progress=False)
    assert not result.already_done
    assert weights.read_bytes() == (reference[0] / models.WEIGHTS_FILE).read_bytes()


def test_nan_final_weights_are_refused_by_readers_and_restored_by_train(tmp_path, reference):
    out = tmp_path / "run"
    shutil.copytree(reference[0], out)
    cfg, state = models.read_weights(out)
    state = {k: v.clone() for k, v in state.items()}
    next(iter(state.values())).view(-1)[0] = float("nan")
    models.save_state(cfg, state, out, train_seq_len=32, step=12)
    assert runs.divergence(out) is None
    with pytest.raises(RunFolderError, match=r"non-finite weights .* not recorded as diverged"):
        runs.load_model(out)
    with pytest.warns(UserWarning, match="non-finite values"):
        train(tiny_run(), out, progress=False)
    assert (out / models.WEIGHTS_FILE).read_bytes() == (reference[0] / models.WEIGHTS_FILE).read_bytes()


def test_final_weights_without_any_checkpoint_are_refused_with_the_way_out(tmp_path):
    run = tiny_run(n_checkpoints=0)
    train(run, tmp_path, progress=False)
    (tmp_path / models.WEIGHTS_FILE).write_bytes(b"\x00" * 20)
    with pytest.raises(RunFolderError, match=r"damaged .* no checkpoint to restore it from; delete"):
        train(run, tmp_path, progress=False)


@pytest.mark.parametrize("damage", ["truncate weights", "truncate state", "nan weights"])
def test_a_damaged_newest_checkpoint_falls_back_to_an_older_one(tmp_path, monkeypatch, reference, damage):
    out = _interrupted(tmp_path, monkeypatch, at=7)
    weights, state = runs.checkpoint_paths(out, 5)
    if damage == "nan weights":
        cfg, tensors = models.read_weights(weights)
        models.save_state(cfg, {k: v * float("nan") for k, v in tensors.items()}, weights, train_seq_len=32, step=5)
    else:
        path = weights if damage == "truncate weights" else state
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.warns(UserWarning, match=r"checkpoint .*step_0*5.*; resuming from the checkpoint of step 2"):
        result = train(tiny_run(), out, progress=False)
    assert result.resumed_from == 2
    assert (out / models.WEIGHTS_FILE).read_bytes() == (reference[0] / models.WEIGHTS_FILE).read_bytes()
    assert (out / runs.METRICS_FILE).read_bytes() == (reference[0] / runs.METRICS_FILE).read_bytes()


def test_a_checkpoint_copied_from_another_step_is_refused(tmp_path, monkeypatch):
    out = _interrupted(tmp_path, monkeypatch, at=7)
    for old, new in zip(runs.checkpoint_paths(out, 2), runs.checkpoint_paths(out, 5)):
        shutil.copyfile(old, new)
    with pytest.raises(RunFolderError, match=r"holds the checkpoint of step 2, not 5 .*remove"):
        train(tiny_run(), out, progress=False)


def _deny(monkeypatch, module, name: str, target: Path):
    """Make `module.name` (os.scandir, open) raise PermissionError for `target`, as an unreadable path does
    for a user who is not root (the tests may run as root, who reads anything)."""
    real = getattr(module, name)

    def denied(path=".", *args, **kwargs):
        if isinstance(path, (str, os.PathLike)) and Path(path) == target:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(module, name, denied)


def test_an_unreadable_checkpoints_folder_stops_the_run_and_keeps_the_metrics(tmp_path, monkeypatch):
    out = _interrupted(tmp_path, monkeypatch, at=7)
    before = (out / runs.METRICS_FILE).read_bytes()
    if os.geteuid() != 0:
        (out / runs.CHECKPOINT_DIR).chmod(0)
    else:
        _deny(monkeypatch, os, "scandir", out / runs.CHECKPOINT_DIR)
    try:
        with pytest.raises(PermissionError, match="checkpoints"):
            train(tiny_run(), out, progress=False)
    finally:
        (out / runs.CHECKPOINT_DIR).chmod(0o755)
    assert (out / runs.METRICS_FILE).read_bytes() == before  # not truncated to 0 bytes


def test_unreadable_weights_are_a_permission_error_naming_the_file(tmp_path, monkeypatch, reference):
    out = tmp_path / "run"
    shutil.copytree(reference[0], out)
    weights = out / models.WEIGHTS_FILE
    if os.geteuid() != 0:
        weights.chmod(0)
    else:  # the weights are read by `_io.read_regular`, which opens with os.open
        _deny(monkeypatch, os, "open", weights)
    with pytest.raises(PermissionError, match="Permission denied") as info:
        models.load(out)
    assert info.value.filename == str(weights) and "No such file" not in str(info.value)


# ------------------------------------------------------------------------------------------- full disk
def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="finds the file of a descriptor in /proc")
@pytest.mark.parametrize("call", ["write", "fsync"])
def test_a_full_disk_during_a_checkpoint_leaves_no_half_file(tmp_path, monkeypatch, reference, call):
    out = tmp_path / "run"
    real = getattr(os, call)
    hits = []

    def full(fd, *args):
        path = _fd_path(fd)
        if f"{os.sep}checkpoints{os.sep}" in path and "step_0000005" in path:
            hits.append(path)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, *args)

    monkeypatch.setattr(os, call, full)
    with pytest.raises(OSError, match=r"No space left on device: .*checkpoints.*step_0*5") as info:
        train(tiny_run(), out, progress=False)
    monkeypatch.setattr(os, call, real)
    assert hits and info.value.errno == errno.ENOSPC
    names = sorted(p.name for p in (out / runs.CHECKPOINT_DIR).iterdir())
    assert not [n for n in names if n.endswith(".tmp") or "0000005" in n], names  # nothing half-written
    assert [s for s, _ in runs.list_checkpoints(out)] == [1, 2]
    result = train(tiny_run(), out, progress=False)  # space again: resumes and ends where an unbroken run ends
    assert result.resumed_from == 2
    assert (out / models.WEIGHTS_FILE).read_bytes() == (reference[0] / models.WEIGHTS_FILE).read_bytes()
    assert (out / runs.METRICS_FILE).read_bytes() == (reference[0] / runs.METRICS_FILE).read_bytes()


@pytest.mark.parametrize("call", ["write", "fsync"])
def test_a_full_disk_while_appending_metrics_names_the_file(tmp_path, monkeypatch, call):
    log = runs.MetricsLog(tmp_path)
    log.append({"step": 1})
    log.sync()
    monkeypatch.setattr(os, call, lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))
    with pytest.raises(OSError, match=r"No space left on device: .*metrics.jsonl") as info:
        log.append({"step": 2})
        log.sync()
    monkeypatch.undo()
    log.close()
    rows = runs.load_metrics(tmp_path)  # the synced row survives; an fsync failure may keep the new one
    assert info.value.errno == errno.ENOSPC and rows == [{"step": 1}] + ([{"step": 2}] if call == "fsync" else [])


# ------------------------------------------------------------------------------------- sweeps killed mid-cell
def dying_cell(cell, runs_dir, *, probe):
    """Module-level (the sweep's workers run it): the first cell's worker is killed by SIGKILL after its step-3
    checkpoint, once; the retry resumes that cell's run folder."""
    marker = Path(runs_dir).parent / "killed-once"
    if cell.params["seed"] == 0 and cell.params["model.tie_weights"] is True and not marker.exists():
        def kill(step):
            if step == 4:
                marker.write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)

        loop._on_step = kill
    return sweep.run_cell(cell, runs_dir, probe=probe)


@pytest.mark.slow
def test_a_sweep_whose_worker_is_killed_mid_cell_gives_the_same_weights(tmp_path):
    spec = tiny_spec(base={**tiny_spec().base, "train": {**tiny_spec().base["train"], "n_checkpoints": 3}})
    clean = sweep.run(spec, tmp_path / "clean", workers=1, progress=False)
    killed = sweep.run(spec, tmp_path / "killed", workers=2, progress=False, _cell_fn=dying_cell)
    assert (tmp_path / "killed" / "killed-once").exists() and killed.n_failed == 0
    for a, b in zip(clean.rows, killed.rows):
        assert a.cell_id == b.cell_id and a.status == b.status == "ok"
        for name in (models.WEIGHTS_FILE, runs.METRICS_FILE):
            assert (tmp_path / "clean" / "runs" / a.cell_id / name).read_bytes() == \
                (tmp_path / "killed" / "runs" / b.cell_id / name).read_bytes(), (a.cell_id, name)


# -------------------------------------------------------------------------------------------- command line
@pytest.mark.parametrize("command", ["probe", "report"])
def test_an_absurd_probe_batch_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch, reference, command):
    from markov_interp.cli import main

    loaded = []
    monkeypatch.setattr(runs, "load_model", lambda *a, **k: loaded.append(a))
    out = tmp_path / "report.html"
    extra = ["--out", str(out)] if command == "report" else []
    assert main([command, str(reference[0]), "--n-sequences", str(10**7), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"markov-interp {command}: error: {command}: --n-sequences=10000000 is too large: the "
                          "activations would need") and len(err.splitlines()) == 1
    assert not loaded and not out.exists()


def test_cli_refuses_an_absurd_train_in_one_line_and_writes_nothing(tmp_path, capsys):
    from markov_interp.cli import main

    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--steps", str(10**12), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "train.steps=1000000000000 is too large" in err and len(err.splitlines()) == 1 and not out.exists()
