"""Faults: dead sweep workers, a killed sweep, two writers on one run folder, damaged metrics, stale temporary
files, diverged training, and bad command-line input (one line, no traceback)."""

import errno
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from markov_interp import _workers, sweep, training
from markov_interp.cli import EXIT_DIVERGED, main
from markov_interp import runs
from markov_interp.runs import RunFolderBusy, RunFolderError, TrainingDiverged
from markov_interp.training import checkpoint_steps, train

from tests.sweep.test_sweep import logging_cell, tiny_spec  # noqa: E402
from tests.training.test_training import assert_same_weights, tiny_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
       "OMP_NUM_THREADS": "1"}


# ---------------------------------------------------------------------------------- process supervision
def square_or_die(task):
    """Module-level so the supervised children can run it: dies as the task says, else returns a value."""
    kind, value, marker = task
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "exit":
        os._exit(7)
    if kind == "once":  # dies on its first try only (the marker file remembers it)
        if not os.path.exists(marker):
            Path(marker).write_text("died once")
            os.kill(os.getpid(), signal.SIGKILL)
    if kind == "big":  # more than a pipe buffer: the parent must read while the child is alive
        return "x" * 2_000_000
    return value * value


def run_supervised(tasks, **kwargs):
    results, deaths = {}, {}

    def done(task, result, death):
        (results if death is None else deaths)[task] = result if death is None else death

    _workers.supervise(tasks, square_or_die, done, **kwargs)
    return results, deaths


def test_supervise_isolates_dead_workers(tmp_path):
    once = str(tmp_path / "once")
    tasks = [("ok", 2, ""), ("kill", 0, ""), ("ok", 3, ""), ("exit", 0, ""), ("once", 5, once), ("big", 0, "")]
    results, deaths = run_supervised(tasks, workers=2, retries=1)
    assert results[("ok", 2, "")] == 4 and results[("ok", 3, "")] == 9
    assert results[("once", 5, once)] == 25  # a one-off death costs nothing: the retry in a fresh worker succeeds
    assert results[("big", 0, "")] == "x" * 2_000_000
    killed, exited = deaths[("kill", 0, "")], deaths[("exit", 0, "")]
    assert (killed.exitcode, killed.signal, killed.attempts) == (-signal.SIGKILL, "SIGKILL", 2)
    assert (exited.exitcode, exited.signal, exited.attempts) == (7, None, 2)
    assert "killed by SIGKILL" in killed.describe() and "code 7" in exited.describe()


def test_supervise_splits_a_dead_group_before_retrying(tmp_path):
    # a group (a stack of runs) whose process dies is retried as its members, each with its own retry budget
    seen = []

    def split(task):
        seen.append(task)
        return [("ok", 4, ""), ("kill", 0, "")] if task == ("kill", 1, "") else None

    results, deaths = run_supervised([("kill", 1, "")], workers=2, retries=1, split=split)
    assert results == {("ok", 4, ""): 16}
    assert set(deaths) == {("kill", 0, "")} and deaths[("kill", 0, "")].attempts == 2
    assert seen.count(("kill", 1, "")) == 1


# --------------------------------------------------------------------------------------- sweep workers
def killer_cell(cell, runs_dir, *, probe):
    """Kills its own worker on one cell, every time (like a cell that always runs out of memory)."""
    if cell.params["model.tie_weights"] is False and cell.params["seed"] == 1:
        with open(Path(runs_dir).parent / "attempts.log", "a") as handle:
            handle.write(cell.cell_id + "\n")
        os.kill(os.getpid(), signal.SIGKILL)
    return logging_cell(cell, runs_dir, probe=probe)


def waiting_cell(cell, runs_dir, *, probe):
    """On one cell's first try: publish its pid and wait to be killed from outside (the test's thread)."""
    out = Path(runs_dir).parent
    if cell.params["model.tie_weights"] is True and cell.params["seed"] == 0 and not (out / "victim.pid").exists():
        (out / "victim.tmp").write_text(str(os.getpid()))
        os.replace(out / "victim.tmp", out / "victim.pid")
        time.sleep(120)
    return logging_cell(cell, runs_dir, probe=probe)


@pytest.mark.slow
def test_killed_worker_costs_only_a_retry(tmp_path):
    def kill_victim():
        deadline = time.monotonic() + 120
        while not (tmp_path / "victim.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(int((tmp_path / "victim.pid").read_text()), signal.SIGKILL)  # what the out-of-memory killer does

    killer = threading.Thread(target=kill_victim)
    killer.start()
    result = sweep.run(tiny_spec(), tmp_path, workers=2, progress=False, _cell_fn=waiting_cell)
    killer.join()
    assert [r.status for r in result.rows] == ["ok"] * 4 and result.n_failed == 0
    victim = result.rows[0].cell_id
    log = (tmp_path / "calls.log").read_text().split()
    assert sorted(log) == sorted(r.cell_id for r in result.rows)  # each cell trained once; the victim on retry
    assert victim in log


@pytest.mark.slow
def test_cell_that_always_kills_its_worker_fails_alone(tmp_path):
    result = sweep.run(tiny_spec(), tmp_path, workers=2, progress=False, _cell_fn=killer_cell)
    (bad,) = result.failed
    assert bad.params["model.tie_weights"] is False and bad.params["seed"] == 1
    assert bad.error.startswith("worker died (killed by SIGKILL")
    assert (tmp_path / "attempts.log").read_text().split() == [bad.cell_id] * 2  # one retry, fresh worker
    ok = [r for r in result.rows if r.status == "ok"]
    assert len(ok) == 3 and all(r.result.final_eval_loss > 0 for r in ok)
    record = json.loads((tmp_path / "results" / f"{bad.cell_id}.json").read_text())
    assert record["worker_signal"] == "SIGKILL" and record["worker_exitcode"] == -signal.SIGKILL
    # --no-retry: the dead cell stays failed, nothing else is touched or rerun
    skip = sweep.run(tiny_spec(), tmp_path, workers=2, progress=False, retry_failed=False, _cell_fn=killer_cell)
    assert (skip.n_run, skip.n_skipped, skip.n_failed) == (0, 4, 1)
    again = sweep.run(tiny_spec(), tmp_path, workers=2, progress=False, _cell_fn=killer_cell)
    assert (again.n_run, again.n_skipped, again.n_failed) == (1, 3, 1)
    assert len((tmp_path / "attempts.log").read_text().split()) == 4


@pytest.mark.slow
def test_ray_dead_worker_fails_only_its_cell(tmp_path):
    ray = pytest.importorskip("ray")
    from tests.sweep import test_sweep

    # Ray's workers may not have tests/ on their path: ship the cell functions by value
    for module in (sys.modules[__name__], test_sweep):
        ray.cloudpickle.register_pickle_by_value(module)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        result = sweep.run(tiny_spec(), tmp_path, backend="ray", progress=False, _cell_fn=killer_cell)
    finally:
        ray.shutdown()
    (bad,) = result.failed
    assert bad.params["model.tie_weights"] is False and bad.params["seed"] == 1
    assert bad.error.startswith("worker died (Ray retried it once)")
    assert (tmp_path / "attempts.log").read_text().split() == [bad.cell_id] * 2
    assert sum(r.status == "ok" for r in result.rows) == 3


@pytest.mark.slow
def test_diverged_cells_are_counted_apart(tmp_path):
    spec = tiny_spec(grid={"train.lr": [2e-3, 1e6]}, seeds=(0,),
                     base={"source": {"kind": "binary", "p": 0.5, "q": 0.8},
                           "model": {"preset": "paper-1layer", "n_ctx": 32},
                           "train": {"steps": 6, "seq_len": 32, "batch_size": 4, "eval_batches": 1,
                                     "n_checkpoints": 0, "log_every": 2, "optimizer": "sgd"}})
    result = sweep.run(spec, tmp_path, workers=2, progress=False)
    assert (result.n_failed, result.n_diverged) == (0, 1)
    ok, diverged = result.rows
    assert ok.status == "ok" and ok.result.outcome != "diverged"
    assert diverged.status == "diverged" and diverged.result is None and "diverged at step" in diverged.error
    again = sweep.run(spec, tmp_path, workers=2, progress=False)
    assert (again.n_run, again.n_skipped, again.n_diverged) == (0, 2, 1)  # deterministic: not rerun


def test_second_sweep_on_a_folder_is_refused(tmp_path):
    stale = tmp_path / "results" / ".abc.json.x1.tmp"
    stale.parent.mkdir()
    stale.write_text("half a record")
    with runs.lock(tmp_path):  # a sweep running here
        with pytest.raises(RunFolderBusy, match=f"pid {os.getpid()} "):
            sweep.run(tiny_spec(), tmp_path, workers=2, progress=False, _cell_fn=killer_cell)
        assert stale.exists()  # not ours to remove while another sweep may be writing it
    assert not (tmp_path / "runs").exists() and not (tmp_path / "spec.json").exists()  # refused before any write
    done = sweep.run(tiny_spec(grid={}, seeds=(0,)), tmp_path, workers=1, progress=False)
    assert done.n_failed == 0 and not stale.exists()  # the next sweep holds the lock and cleans up


def _children(pid: int) -> set[int]:
    """Live (non-zombie) processes whose parent is `pid`, from /proc."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if int(ppid) == pid and state != "Z":
                found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc (Linux)")
def test_killing_the_sweep_leaves_no_worker(tmp_path):
    spec = tmp_path / "long.toml"
    spec.write_text('probe = false\nseeds = [0, 1]\n[base.source]\nkind = "binary"\np = 0.2\nq = 0.3\n[base.model]\n'
                    'preset = "paper-1layer"\nn_ctx = 32\n[base.train]\nsteps = 100000\nseq_len = 32\n'
                    'batch_size = 4\nn_checkpoints = 0\n')
    workers: set[int] = set()
    sweep_proc = subprocess.Popen([sys.executable, "-m", "markov_interp.cli", "sweep", str(spec), "--out",
                                   str(tmp_path / "out"), "--workers", "2", "--no-progress"], env=ENV)
    try:
        deadline = time.monotonic() + 120
        while len(workers) < 2 and time.monotonic() < deadline and sweep_proc.poll() is None:
            time.sleep(0.2)
            workers = _children(sweep_proc.pid)
        assert len(workers) == 2, "the sweep did not start its two workers"
        sweep_proc.kill()  # kill -9: no handler in the sweep runs
        sweep_proc.wait()
        deadline = time.monotonic() + 10
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(w) for w in workers), "workers outlived their sweep"
    finally:
        if sweep_proc.poll() is None:
            sweep_proc.kill()
        for worker in workers:  # should the test fail, leave no orphan training for 100000 steps
            if _alive(worker):
                os.kill(worker, signal.SIGKILL)


# ------------------------------------------------------------------------------------------- run folders
def test_second_writer_is_refused_at_once(tmp_path):
    run_dir = tmp_path / "run"
    with runs.lock(run_dir):
        start = time.perf_counter()
        with pytest.raises(RunFolderBusy, match=rf"is being written by pid {os.getpid()} on \S+ since 20"):
            train(tiny_run(), run_dir, progress=False)
        assert time.perf_counter() - start < 2
        assert not (run_dir / training.CONFIG_FILE).exists()  # refused before touching the folder
    with runs.lock(run_dir):  # released on exit of the block: the next writer gets it
        pass


def test_lock_is_released_when_its_holder_is_killed(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom markov_interp import runs\n"
         "with runs.lock(sys.argv[1]):\n    print('locked', flush=True)\n    time.sleep(120)\n", str(tmp_path)],
        env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderBusy, match=f"pid {holder.pid} "):
            with runs.lock(tmp_path):
                pass
    finally:
        holder.kill()
        holder.wait()
    with runs.lock(tmp_path):  # the kernel dropped the dead holder's lock
        pass


@pytest.mark.slow
def test_two_train_processes_on_one_folder(tmp_path, capsys):
    out = tmp_path / "run"
    common = ["--out", str(out), "--seq-len", "32", "--batch-size", "4", "--steps", "1000", "--no-progress",
              "--device", "cpu"]
    first = subprocess.Popen([sys.executable, "-m", "markov_interp.cli", "train", "--p", "0.2", "--threads", "1",
                              *common], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and first.poll() is None and not (out / training.METRICS_FILE).exists():
            time.sleep(0.05)  # the first writer holds the lock and is training
        assert first.poll() is None, "the first run ended before the second started; make it longer"
        start = time.perf_counter()
        assert main(["train", "--p", "0.4", *common]) == 2  # another config, same folder: refused at once
        assert time.perf_counter() - start < 5
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and f"is being written by pid {first.pid} " in lines[0], lines
        assert first.poll() is None, "the first run ended before the second was refused; make it longer"
        stdout, stderr = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, stderr
    saved = training.RunConfig.from_json((out / training.CONFIG_FILE).read_text())
    assert saved.source.p == 0.2
    rows = training.load_metrics(out)
    assert [r["step"] for r in rows] == training.schedule.logged_steps(saved.train, 1000)
    assert train(saved, out, progress=False).already_done


@pytest.mark.slow
def test_stale_tmp_files_are_removed_at_start(tmp_path):
    run = tiny_run()
    train(run, tmp_path, progress=False)
    stale = [tmp_path / ".metrics.jsonl.abc123.tmp", tmp_path / "checkpoints" / ".step_0000005.pt.x1y2.tmp"]
    for path in stale:
        path.write_bytes(b"half a file")
    keep = tmp_path / "notes.tmp"  # not the atomic writer's pattern: not ours to delete
    keep.write_text("mine")
    assert train(run, tmp_path, progress=False).already_done
    assert not any(p.exists() for p in stale) and keep.exists()


@pytest.mark.slow
def test_resume_repairs_metrics_behind_the_final_weights(tmp_path):
    reference = train(tiny_run(), tmp_path / "a", progress=False)
    damaged = tmp_path / "b"
    train(tiny_run(), damaged, progress=False)
    rows = training.load_metrics(damaged)
    runs.write_metrics(damaged, [r for r in rows if r["step"] <= 8])
    assert checkpoint_steps(12, 4) == [1, 2, 5, 12]
    with pytest.warns(UserWarning, match="ends at step 8 .*checkpoint of step 5"):
        repaired = train(tiny_run(), damaged, progress=False)
    assert repaired.resumed_from == 5 and not repaired.already_done
    assert training.load_metrics(damaged) == training.load_metrics(tmp_path / "a")
    assert_same_weights(repaired.model, reference.model)


@pytest.mark.slow
@pytest.mark.parametrize("n_checkpoints", [0, 1])
def test_resume_refuses_metrics_that_reach_no_checkpoint(tmp_path, n_checkpoints):
    run = tiny_run(n_checkpoints=n_checkpoints)  # checkpoints: none, or only the last step
    train(run, tmp_path, progress=False)
    rows = training.load_metrics(tmp_path)
    runs.write_metrics(tmp_path, rows[:2])
    with pytest.raises(RunFolderError, match=r"metrics.jsonl .* step 4 .*delete"):
        train(run, tmp_path, progress=False)


def test_logged_steps_match_the_training_loop():
    result = train(tiny_run(steps=13, log_every=3, eval_every=5), progress=False)
    assert [r["step"] for r in result.metrics] == training.schedule.logged_steps(result.config.train, 13)


# ---------------------------------------------------------------------------------------------- diverged
def test_divergence_stops_training_and_is_recorded(tmp_path):
    run = tiny_run(lr=1e6, optimizer="sgd")
    with pytest.raises(TrainingDiverged) as caught:
        train(run, tmp_path, progress=False)
    err = caught.value
    assert isinstance(err, RuntimeError) and err.run_dir == tmp_path and "diverged at step" in str(err)
    status = json.loads((tmp_path / runs.STATUS_FILE).read_text())
    assert status["status"] == "diverged" and status["step"] == err.step
    rows = training.load_metrics(tmp_path)
    assert rows[-1] == {"step": err.step, "diverged": True, "reason": status["reason"]}
    assert all(math.isfinite(r["train_loss"]) for r in rows[:-1])
    assert not (tmp_path / "model.safetensors").exists()
    kept = training.list_checkpoints(tmp_path)
    assert kept and all(s < err.step for s, _ in kept) and status["last_finite_checkpoint"] == kept[-1][0]
    from markov_interp import models

    for _, path in kept:  # every checkpoint kept is finite
        _, state = models.read_weights(path)
        assert all(torch.isfinite(t).all() for t in state.values())
    stamp = (tmp_path / training.METRICS_FILE).stat().st_mtime_ns
    with pytest.raises(TrainingDiverged, match="diverged at step"):
        train(run, tmp_path, progress=False)  # refused at once, nothing rewritten
    assert (tmp_path / training.METRICS_FILE).stat().st_mtime_ns == stamp


def test_divergence_step_is_the_first_non_finite_loss():
    # the step found from the pending losses of a coarse log equals the one a log at every step shows
    steps = []
    for log_every in (1, 5):
        with pytest.raises(TrainingDiverged) as caught:
            train(tiny_run(lr=3e3, optimizer="sgd", log_every=log_every, n_checkpoints=0), progress=False)
        steps.append(caught.value.step)
    assert steps[0] == steps[1] > 1
    assert steps[1] % 5 != 0  # found inside the losses pending between two rows, not at a row


@pytest.mark.slow
def test_cli_diverged_run(tmp_path, capsys):
    out = str(tmp_path / "run")
    args = ["train", "--out", out, "--lr", "1e6", "--optimizer", "sgd", "--steps", "20", "--seq-len", "32",
            "--no-progress"]
    assert main(args) == EXIT_DIVERGED
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert "diverged at step" in captured.err and "Traceback" not in captured.err
    assert main(["probe", out, "--json"]) == EXIT_DIVERGED
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "diverged" and report["step"] >= 1 and "mechanism" not in report
    assert main(["probe", out]) == EXIT_DIVERGED
    assert capsys.readouterr().out.startswith("diverged: ")
    assert main(["report", out]) == EXIT_DIVERGED
    assert "diverged" in capsys.readouterr().err and not (tmp_path / "run" / "report.html").exists()


def test_old_folder_with_a_nan_loss_reads_as_diverged(tmp_path):
    (tmp_path / training.CONFIG_FILE).write_text(tiny_run().to_json())
    runs.write_metrics(tmp_path, [{"step": 2, "train_loss": 0.7}, {"step": 4, "train_loss": float("nan")}])
    status = runs.divergence(tmp_path)
    assert status["status"] == "diverged" and status["step"] == 4


# ------------------------------------------------------------------------------------------- CLI errors
def _one_line_error(capsys, argv, *needles):
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_cli_errors_are_one_line(tmp_path, capsys, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("x")
    _one_line_error(capsys, ["train", "--out", str(afile)], "is a file", str(afile))
    _one_line_error(capsys, ["train", "--out", str(afile / "run")], "cannot be created", str(afile))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"source": ')
    _one_line_error(capsys, ["probe", str(bad)], str(bad / "config.json"), "not valid JSON")
    (bad / "config.json").write_text(json.dumps({**tiny_run().to_dict(), "source": "binary"}))
    line = _one_line_error(capsys, ["probe", str(bad)], str(bad / "config.json"), "source must be a table")
    assert "unknown" not in line
    _one_line_error(capsys, ["report", str(tmp_path / "nothing")], "no run folder",
                    str(tmp_path / "nothing" / "config.json"))
    if not torch.cuda.is_available():
        (bad / "config.json").write_text(tiny_run().to_json())
        _one_line_error(capsys, ["probe", str(bad), "--device", "cuda"], "CUDA is not available")
    # an OSError from deep inside (disk full) comes out as one line naming the file
    monkeypatch.setattr(training, "train_many", lambda *a, **k: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "metrics.jsonl"))))
    _one_line_error(capsys, ["train", "--out", str(tmp_path / "run")], "No space left on device", "metrics.jsonl")


@pytest.mark.slow
def test_report_checks_its_output_before_probing(tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "run"
    train(tiny_run(steps=4, eval_every=0), run_dir, progress=False)
    from markov_interp import probes

    def must_not_run(*args, **kwargs):
        raise AssertionError("probed before checking where the report goes")

    monkeypatch.setattr(probes, "classify_mechanism", must_not_run)
    afile = tmp_path / "afile"
    afile.write_text("x")
    _one_line_error(capsys, ["report", str(run_dir), "--out", str(afile / "report.html")], "is a file", str(afile))
    if os.geteuid() != 0:  # root writes anywhere: a read-only folder only stops other users
        run_dir.chmod(0o555)
        try:
            _one_line_error(capsys, ["report", str(run_dir)], "not writable", str(run_dir))
        finally:
            run_dir.chmod(0o755)


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(FileNotFoundError, match="no run folder"):
        main(["probe", str(tmp_path / "nothing"), "--debug"])
    with pytest.raises(FileNotFoundError, match="no run folder"):
        main(["--debug", "probe", str(tmp_path / "nothing")])
