"""Faults outside the training loop (issue 25): targets that are not regular files, planted links in run and
sweep folders, a full disk, a closed output pipe, multi-line warnings, formula-like CSV text, damaged sweep
records, a poisoned reference-loss cache and the memory of the Monte Carlo references. Each test feeds the
fault and checks what is promised in docs/faults.md."""

import dataclasses
import errno
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from markov_interp import _io, runs, sweep, theory
from markov_interp.sources import contexts as chains
from markov_interp._io import UnsafePath, atomic_write
from markov_interp.cli import EXIT_PIPE, main
from markov_interp.sources import BinaryChain, MarkovChain, RandomMarkov
from markov_interp.runs import RunFolderBusy
from markov_interp.training import train

from tests.sweep.test_sweep import logging_cell, tiny_spec  # noqa: E402
from tests.training.test_training import tiny_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
       "OMP_NUM_THREADS": "1"}
VICTIM_BYTES = b"precious data the package must never touch\n"


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM_BYTES)
    return victim


def _plant(kind: str, path: Path, tmp_path: Path) -> Path:
    """Put a non-regular file of `kind` at `path` (all inside tmp_path: no real device is ever touched)."""
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif kind == "folder":
        path.mkdir()
    elif kind == "link-to-file":
        path.symlink_to(_victim(tmp_path))
    elif kind == "link-to-fifo":
        os.mkfifo(outside / "fifo")
        path.symlink_to(outside / "fifo")
    elif kind == "link-to-folder":
        path.symlink_to(outside)
    elif kind == "dangling-link":
        path.symlink_to(outside / "nothing-here")
    return path


def _snapshot(path: Path) -> tuple:
    """What is at `path` without following or opening it: its type, link target and (regular files) bytes."""
    st = os.lstat(path)
    link = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
    return stat.S_IFMT(st.st_mode), link, st.st_ino


KINDS = ["fifo", "socket", "folder", "link-to-file", "link-to-fifo", "link-to-folder", "dangling-link"]


# --------------------------------------------------------------------------------------- atomic writes
@pytest.mark.parametrize("kind", KINDS)
def test_atomic_write_refuses_what_is_not_a_regular_file(tmp_path, kind):
    target = _plant(kind, tmp_path / "out.html", tmp_path)
    before = _snapshot(target)
    word = {"fifo": "FIFO", "socket": "socket", "folder": "folder"}.get(kind, "symbolic link")
    with pytest.raises(UnsafePath, match=f"{re.escape(str(target))}.* {word}"):
        atomic_write(target, "x" * 1000)
    assert _snapshot(target) == before  # not replaced, not written through
    if (tmp_path / "victim.txt").exists():
        assert (tmp_path / "victim.txt").read_bytes() == VICTIM_BYTES
    assert not list(tmp_path.glob(".out.html.*.tmp"))  # refused before a temporary file was made
    assert isinstance(UnsafePath("x"), ValueError)


def test_atomic_write_replaces_a_regular_file(tmp_path):
    target = tmp_path / "a.json"
    target.write_text("old")
    atomic_write(target, "new")
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


@pytest.mark.parametrize("kind", ["fifo", "link-to-fifo", "link-to-file", "socket"])
def test_report_out_refuses_a_non_regular_target_before_probing(tmp_path, capsys, kind):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(tiny_run().to_json())  # enough for report's early checks
    target = _plant(kind, tmp_path / "report.html", tmp_path)
    before = _snapshot(target)
    assert main(["report", str(run_dir), "--out", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("markov-interp report: error: --out ") and str(target) in err[0]
    assert _snapshot(target) == before
    if kind == "link-to-file":
        assert (tmp_path / "victim.txt").read_bytes() == VICTIM_BYTES


# -------------------------------------------------------------------------------------------- disk full
def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as the kernel reports it: no file name


@pytest.mark.parametrize("call", ["write", "fsync"])
def test_disk_full_names_the_file_being_written(tmp_path, monkeypatch, call):
    target = tmp_path / "metrics.jsonl"
    target.write_text("old rows\n")
    monkeypatch.setattr(_io.os, call, _enospc)
    with pytest.raises(OSError) as caught:
        atomic_write(target, "new rows\n" * 1000)
    monkeypatch.undo()
    err = caught.value
    assert err.errno == errno.ENOSPC and err.filename == str(target)
    from markov_interp.cli import _one_line

    assert _one_line(err) == f"[Errno 28] No space left on device: '{target}'"
    assert target.read_text() == "old rows\n" and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def _can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None or not sys.platform.startswith("linux"):
        return False
    probe = subprocess.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs user namespaces to mount a private tmpfs")
def test_a_really_full_disk_names_the_file(tmp_path):
    # a 64 KiB tmpfs, private to the child (unshare), holding a small file; a 200 KB write must fail cleanly
    disk = tmp_path / "disk"
    disk.mkdir()
    script = ("import sys\nfrom pathlib import Path\nfrom markov_interp._io import atomic_write\n"
              "d = Path(sys.argv[1]); atomic_write(d / 'model.safetensors', b'old')\n"
              "try:\n    atomic_write(d / 'model.safetensors', b'0' * 200_000)\n"
              "except OSError as err:\n    print(err.errno, err.filename, str(err))\n"
              "print(sorted(p.name for p in d.iterdir()), (d / 'model.safetensors').read_bytes())\n")
    done = subprocess.run(["unshare", "-Urm", "sh", "-c", f'mount -t tmpfs -o size=64k tmpfs "$1" && '
                           f'exec "{sys.executable}" -c "$2" "$1"', "sh", str(disk), script],
                          capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.strip().splitlines()
    assert first.startswith(f"28 {disk / 'model.safetensors'} [Errno 28] No space left on device"), first
    assert second == "['model.safetensors'] b'old'"  # the old file intact, no temporary file left


# ------------------------------------------------------------------------------------ planted links
def test_planted_lock_link_leaves_the_victim_byte_identical(tmp_path, capsys):
    victim = _victim(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".lock").symlink_to(victim)
    with pytest.raises(UnsafePath, match=r"lock file .*\.lock is a symbolic link"):
        with runs.lock(run_dir):
            pass
    with pytest.raises(UnsafePath, match="symbolic link"):
        train(tiny_run(), run_dir, progress=False)
    assert main(["train", "--out", str(run_dir), "--steps", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ".lock is a symbolic link" in err[0], err
    assert victim.read_bytes() == VICTIM_BYTES
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # nothing written into the folder either
    assert "unknown process" in runs.holder(run_dir)  # the holder is not read through the link


@pytest.mark.parametrize("kind", ["fifo", "socket", "folder-link"])
def test_lock_file_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _plant({"folder-link": "link-to-folder"}.get(kind, kind), run_dir / ".lock", tmp_path)
    before = _snapshot(run_dir / ".lock")
    with pytest.raises(UnsafePath, match=r"\.lock is a"):
        with runs.lock(run_dir):
            pass
    assert _snapshot(run_dir / ".lock") == before


@pytest.mark.parametrize("name", ["metrics.jsonl", "status.json", "model.safetensors", "checkpoints",
                                  "checkpoints/step_0000001.pt", "config.json"])
def test_links_planted_in_a_run_folder_are_refused(tmp_path, capsys, name):
    victim = _victim(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    stale = outside / ".step_0000001.pt.abc.tmp"  # what remove_stale_tmp would delete in a linked folder
    stale.write_bytes(VICTIM_BYTES)
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    if name != "config.json":
        (run_dir / "config.json").write_text(tiny_run().to_json())
    if name == "checkpoints":
        (run_dir / "checkpoints").rmdir()
    (run_dir / name).symlink_to(outside if name == "checkpoints" else victim)
    with pytest.raises(UnsafePath, match=re.escape(f"{run_dir / name} is a symbolic link")):
        train(tiny_run(), run_dir, progress=False)
    for command in (["probe", str(run_dir)], ["report", str(run_dir)]):  # readers refuse it too
        assert main(command) == 2
        assert f"{run_dir / name} is a symbolic link" in capsys.readouterr().err
    assert victim.read_bytes() == VICTIM_BYTES and stale.read_bytes() == VICTIM_BYTES
    assert sorted(p.name for p in outside.iterdir()) == [stale.name]


def test_fifo_in_a_run_folder_is_refused_not_read(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(tiny_run().to_json())
    os.mkfifo(run_dir / "metrics.jsonl")  # reading it would block forever
    assert main(["probe", str(run_dir)]) == 2
    assert "metrics.jsonl is a FIFO" in capsys.readouterr().err
    with pytest.raises(UnsafePath, match="metrics.jsonl is a FIFO"):
        train(tiny_run(), run_dir, progress=False)


def test_remove_stale_tmp_follows_no_link(tmp_path):
    victim = _victim(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / ".x.tmp").write_bytes(VICTIM_BYTES)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoints").symlink_to(outside)
    (run_dir / ".metrics.jsonl.abc.tmp").symlink_to(victim)
    (run_dir / ".config.json.def.tmp").write_text("half a file")
    assert runs.remove_stale_tmp(run_dir) == [run_dir / ".config.json.def.tmp"]
    assert (outside / ".x.tmp").read_bytes() == VICTIM_BYTES and victim.read_bytes() == VICTIM_BYTES


def test_seeds_folder_with_a_planted_link_is_refused(tmp_path, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "seeds"
    out.mkdir()
    (out / "seed-1").symlink_to(outside)
    assert main(["train", "--out", str(out), "--seeds", "0-1", "--steps", "2", "--no-progress"]) == 2
    assert f"{out / 'seed-1'} is a symbolic link" in capsys.readouterr().err
    assert list(outside.iterdir()) == [] and sorted(p.name for p in out.iterdir()) == ["seed-1"]


@pytest.mark.parametrize("where", [".lock", "results/abc.json", "runs/abc", "spec.json"])
def test_links_planted_in_a_sweep_folder_are_refused(tmp_path, where):
    victim = _victim(tmp_path)
    out = tmp_path / "sweep"
    (out / "results").mkdir(parents=True)
    (out / "runs").mkdir()
    (out / where).symlink_to(tmp_path / "outside" if where == "runs/abc" else victim)
    (tmp_path / "outside").mkdir()
    with pytest.raises(UnsafePath, match="symbolic link"):
        sweep.run(tiny_spec(grid={}, seeds=(0,)), out, workers=1, progress=False)
    assert victim.read_bytes() == VICTIM_BYTES and list((tmp_path / "outside").iterdir()) == []
    assert list((out / "runs").iterdir()) == ([out / "runs" / "abc"] if where == "runs/abc" else [])


# ----------------------------------------------------------------------------------------------- sweeps
def test_refused_second_sweep_does_not_rewrite_spec_json(tmp_path):
    first = tiny_spec(grid={}, seeds=(0,))
    (tmp_path / "spec.json").write_text("the first sweep's spec\n")
    with runs.lock(tmp_path):  # the first sweep is running
        with pytest.raises(RunFolderBusy):
            sweep.run(tiny_spec(name="second", grid={}, seeds=(1,)), tmp_path, workers=1, progress=False)
    assert (tmp_path / "spec.json").read_text() == "the first sweep's spec\n"
    sweep.run(first, tmp_path, workers=1, progress=False, _cell_fn=logging_cell)
    assert json.loads((tmp_path / "spec.json").read_text())[0]["name"] == "tiny"


@pytest.mark.parametrize("damage", ["no result", "result missing a field", "unknown status", "result not a table"])
def test_incomplete_sweep_record_reruns_its_cell(tmp_path, damage):
    spec = tiny_spec(grid={}, seeds=(0,))
    done = sweep.run(spec, tmp_path, workers=1, progress=False, _cell_fn=logging_cell)
    (row,) = done.rows
    path = tmp_path / "results" / f"{row.cell_id}.json"
    record = json.loads(path.read_text())
    if damage == "no result":
        del record["result"]
    elif damage == "result missing a field":
        del record["result"]["final_eval_loss"]
    elif damage == "unknown status":
        record["status"] = "okay"
    else:
        record["result"] = [1, 2]
    path.write_text(json.dumps(record))  # valid JSON, right format, but not a usable record
    again = sweep.run(spec, tmp_path, workers=1, progress=False, _cell_fn=logging_cell)
    assert (again.n_run, again.n_skipped, again.n_failed) == (1, 0, 0)
    assert (tmp_path / "calls.log").read_text().split() == [row.cell_id] * 2
    # the cell's training was reused: the same result, up to the time it took
    assert dataclasses.replace(again.rows[0].result, seconds=0.0) == dataclasses.replace(row.result, seconds=0.0)


def test_formula_like_sweep_names_are_quoted_in_the_csv(tmp_path):
    names = ["=HYPERLINK(\"http://x\")", "+1+1", "-2", "@SUM(A1)", "'quoted", "plain"]
    specs = [tiny_spec(name=name, grid={}, seeds=(0,)) for name in names]  # one cell, shared: trained once
    result = sweep.run(specs, tmp_path, workers=1, progress=False)
    import csv

    with open(tmp_path / "results.csv", newline="") as handle:
        cells = [row["sweep"] for row in csv.DictReader(handle)]
    assert cells == ["'" + n for n in names[:-1]] + ["plain"]
    assert not any(c.startswith(("=", "+", "-", "@")) for c in cells)
    assert [r.sweep for r in sweep.read_table(tmp_path)] == names == [r.sweep for r in result.rows]
    assert [r.columns() for r in sweep.read_table(tmp_path)] == [r.columns() for r in result.rows]


# -------------------------------------------------------------------------------------------------- CLI
@pytest.mark.slow
def test_probe_into_a_closed_pipe_exits_quietly(tmp_path):
    run_dir = tmp_path / "run"
    train(tiny_run(steps=4, eval_every=0, n_checkpoints=0), run_dir, progress=False)
    child = subprocess.Popen([sys.executable, "-m", "markov_interp.cli", "probe", str(run_dir)], env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.close()  # the reader is gone before the probe writes (as `| head -1` after its line)
    stderr = child.stderr.read()
    child.wait(timeout=300)
    assert (child.returncode, stderr) == (EXIT_PIPE, b"")
    shell = subprocess.run(f'"{sys.executable}" -m markov_interp.cli probe "{run_dir}" | head -1', shell=True,
                           env=ENV, capture_output=True, text=True, timeout=300)
    assert shell.stdout.startswith("mechanism: ") and shell.stdout.count("\n") == 1 and shell.stderr == ""


def test_cli_warnings_are_one_line(tmp_path, capsys, monkeypatch):
    def warn_then_fail(run_dir):
        warnings.warn("a warning\nover three\n   lines")
        warnings.warn("a deprecation", DeprecationWarning)
        raise ValueError("stop here")

    monkeypatch.setattr(runs, "read_config", warn_then_fail)
    shown = warnings.showwarning
    assert main(["probe", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "markov-interp probe: warning: a warning over three lines",
        "markov-interp probe: warning: DeprecationWarning: a deprecation",
        "markov-interp probe: error: stop here"]
    assert warnings.showwarning is shown  # restored for the caller


# ------------------------------------------------------------------------------------ reference cache
@pytest.fixture(scope="module")
def clean_cache(tmp_path_factory):
    """A cache folder holding the two entries of RandomMarkov(3) at seq_len 12 (kernel expectations,
    in-context), and the references computed without any cache."""
    folder = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MARKOV_INTERP_CACHE", "off")
        _forget()
        fresh = theory.reference_losses(RandomMarkov(3), 12, n_sequences=256)
        mp.setenv("MARKOV_INTERP_CACHE", str(folder))
        _forget()
        assert theory.reference_losses(RandomMarkov(3), 12, n_sequences=256) == fresh
        _forget()
    return folder, fresh


def _forget() -> None:
    theory._random_references.cache_clear()
    theory._kernel_expectations_cached.cache_clear()


def _entries(folder: Path) -> dict:
    found = {}
    for path in (folder / "references").glob("*.json"):
        found[json.loads(path.read_text())["key"]["what"]] = path
    return found


def _poison(path: Path, how: str) -> None:
    entry = json.loads(path.read_text())
    value = entry["value"]
    first = "bayes_loss" if "bayes_loss" in value else "entropy_rate"
    if how == "malformed JSON":
        path.write_text('{"key": {"what": ')
        return
    if how == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        return
    if how == "fifo":
        path.unlink()
        os.mkfifo(path)  # reading it would block forever
        return
    if how in ("nan", "infinity"):
        value[first] = float(how[:3])
    elif how == "out of range":
        value[first] = 50.0  # above log 3 (and above every add-beta bound at T = 12)
    elif how == "order violated":  # add-alpha below the Bayes loss; E[H(pi)] below E[entropy rate]
        second = "add_alpha_loss" if first == "bayes_loss" else "unigram_loss"
        value[second] = value[first] - 0.2
    elif how == "negative error":
        value[first + "_se"] = -0.1
    elif how == "wrong type":
        value[first] = "0.7"
    elif how == "missing field":
        del value[first]
    elif how == "another key":
        entry["key"]["seed"] = 99
    path.write_text(json.dumps(entry))  # json writes NaN / Infinity as they are: what a foreign tool might do


POISONS = ["nan", "infinity", "out of range", "order violated", "negative error", "wrong type",
           "missing field", "another key", "malformed JSON", "truncated", "fifo"]


# every poison on the in-context entry (cheap to recompute); a few on the kernel-expectation one (a second each)
CASES = [("in-context", how) for how in POISONS] + [
    ("kernel-expectations", how) for how in ("nan", "order violated", "wrong type", "truncated")]


@pytest.mark.parametrize("which, how", CASES)
def test_bad_cache_entry_is_recomputed_with_a_warning(tmp_path, monkeypatch, clean_cache, which, how):
    folder, fresh = clean_cache
    shutil.copytree(folder, tmp_path / "cache")
    monkeypatch.setenv("MARKOV_INTERP_CACHE", str(tmp_path / "cache"))
    path = _entries(tmp_path / "cache")[which]
    _poison(path, how)
    _forget()
    with pytest.warns(UserWarning) as caught:
        got = theory.reference_losses(RandomMarkov(3), 12, n_sequences=256)
    (warning,) = [w for w in caught if "cache entry" in str(w.message)]
    text = str(warning.message)
    assert text.startswith(f"reference-loss cache entry {path} is unusable (") and "\n" not in text
    assert got == fresh  # the recomputed value, never the poisoned one
    _forget()
    if how == "fifo":  # not a file of ours to replace (atomic writes never replace a FIFO): warned each time
        assert stat.S_ISFIFO(os.lstat(path).st_mode)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the entry was rewritten: read back now without a warning
        assert theory.reference_losses(RandomMarkov(3), 12, n_sequences=256) == fresh


def test_short_cache_curve_is_recomputed(tmp_path, monkeypatch, clean_cache):
    folder, fresh = clean_cache
    shutil.copytree(folder, tmp_path / "cache")
    monkeypatch.setenv("MARKOV_INTERP_CACHE", str(tmp_path / "cache"))
    path = _entries(tmp_path / "cache")["in-context"]
    entry = json.loads(path.read_text())
    entry["value"]["unigram_curve"] = entry["value"]["unigram_curve"][:-1]
    path.write_text(json.dumps(entry))
    _forget()
    with pytest.warns(UserWarning, match="unigram_curve has 10 points, expected 11"):
        assert theory.reference_losses(RandomMarkov(3), 12, n_sequences=256) == fresh


def test_cache_entries_are_keyed_by_the_code(monkeypatch, tmp_path):
    monkeypatch.setenv("MARKOV_INTERP_CACHE", str(tmp_path))
    key = {"what": "test", "vocab": 3}
    before = theory._cache_file(key)
    monkeypatch.setattr(theory.cache, "_code_version", lambda: "edited")
    assert theory._cache_file(key) != before


def test_cache_hits_for_a_fixed_initial_law(monkeypatch, tmp_path):
    # keys with a tuple (a fixed initial law) were compared with the list JSON gives back: never a hit before
    monkeypatch.setenv("MARKOV_INTERP_CACHE", str(tmp_path))
    source = RandomMarkov(3, initial=[0.5, 0.3, 0.2])
    _forget()
    fresh = theory.reference_losses(source, 10, n_sequences=64)
    _forget()

    def must_not_run(*args, **kwargs):
        raise AssertionError("recomputed although the cache holds the entry")

    monkeypatch.setattr(theory.references, "_in_context_references", must_not_run)
    monkeypatch.setattr(theory.expectations, "_mc_kernel_expectations", must_not_run)
    assert theory.reference_losses(source, 10, n_sequences=64) == fresh
    _forget()


# ------------------------------------------------------------------------------------- bounded memory
@pytest.mark.parametrize("source", [RandomMarkov(3), RandomMarkov(3, order=2), RandomMarkov(4, initial="uniform"),
                                    RandomMarkov(3, alpha=0.3, initial=[0.2, 0.3, 0.5])])
def test_blocked_monte_carlo_gives_the_same_bits(monkeypatch, source):
    vocab, n_ctx = source.vocab, source.vocab**source.order
    kernel = theory.KernelExpectations(1.0, 0.01, 1.1, 0.01, "monte carlo")

    def mc() -> theory.KernelExpectations:  # one chunk of 2**18 kernels
        return theory._mc_kernel_expectations(vocab, source.order, source.alpha, 1, tol=1.0)

    def in_context() -> dict:  # 300 sequences, with the first-state gain's 32 posterior draws where stationary
        return theory._in_context_references(source, 17, kernel, seed=2, tol=1.0, n_sequences=300)

    monkeypatch.setattr(chains, "BLOCK_BYTES", 1 << 40)  # every array in one block: the unblocked computation
    whole = mc(), in_context()
    # uneven blocks: 2**18 kernels in 6; 300 sequences in 7 (and each posterior draw's 300 solves in 2)
    monkeypatch.setattr(chains, "BLOCK_BYTES", chains.kernel_bytes(n_ctx, vocab) * 50_000)
    blocked_mc = mc()
    monkeypatch.setattr(chains, "BLOCK_BYTES", 8 * 17 * (vocab * n_ctx + 1) * 47)
    assert (blocked_mc, in_context()) == whole


@pytest.mark.parametrize("source", [BinaryChain(0.2, 0.3), MarkovChain([[0.9, 0.1, 0.0], [0.2, 0.5, 0.3], [0, 0.4, 0.6]]),
                                    MarkovChain([[[0.9, 0.1], [0.4, 0.6]], [[0.3, 0.7], [0.5, 0.5]]], order=2),
                                    RandomMarkov(2), RandomMarkov(3, order=2, initial="uniform")])
def test_blocked_sampler_gives_the_same_tokens(monkeypatch, source):
    def draw() -> torch.Tensor:
        return source.sample(50, 40, torch.Generator().manual_seed(5))

    monkeypatch.setattr(chains, "BLOCK_BYTES", 1 << 40)
    whole = draw()
    n_ctx = source.vocab**source.order
    monkeypatch.setattr(chains, "BLOCK_BYTES", 8 * (40 - source.order) * n_ctx * source.vocab * 7)  # 7 a block
    assert chains.block_sizes(50, 8 * (40 - source.order) * n_ctx * source.vocab) == [7] * 7 + [1]
    assert torch.equal(draw(), whole)


MEMORY_SCRIPT = """
import torch
torch.set_num_threads(1)
from markov_interp import theory
from markov_interp.sources import RandomMarkov
def peak():  # VmHWM: this process's own peak (ru_maxrss would start at the parent's size, inherited at fork)
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("VmHWM:")) / 1024
theory._mc_kernel_expectations(3, 1, 1.0, 0, tol=1.0)  # warm up torch and numpy
kernel = theory.KernelExpectations(3.0, 0.0, 3.0, 0.0, "monte carlo")
theory._in_context_references(RandomMarkov(3), 33, kernel, seed=0, tol=1.0, n_sequences=16)
base = peak()
theory._mc_kernel_expectations(20, 1, 1.0, 0, tol=1.0)  # one chunk of 2**18 kernels: 0.84 GB per array unblocked
mc = peak() - base
theory._in_context_references(RandomMarkov(20), 257, kernel, seed=0, tol=1.0, n_sequences=1024)
print(mc, peak() - base)
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak resident size from /proc")
def test_monte_carlo_memory_is_bounded():
    # unblocked, each of these computations held several 0.84 GB arrays: 3.2 GB above the imports
    done = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT], capture_output=True, text=True, env=ENV,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    kernel_mb, in_context_mb = map(float, done.stdout.split())
    # blocked: 35-400 MB above the imports over repeated runs (the allocator keeps freed blocks for a while)
    assert kernel_mb < 800 and in_context_mb < 800, done.stdout


def test_pool_cache_entry_is_read_back_and_checked(monkeypatch, tmp_path):
    monkeypatch.setenv("MARKOV_INTERP_CACHE", str(tmp_path))
    source = RandomMarkov(3, pool_size=4, pool_seed=1)
    _forget()
    fresh = theory.reference_losses(source, 10, n_sequences=64)
    assert fresh.pool_bayes_loss is not None
    _forget()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a valid pool entry passes the checks
        assert theory.reference_losses(source, 10, n_sequences=64) == fresh
    path = _entries(tmp_path)["in-context"]
    entry = json.loads(path.read_text())
    entry["value"]["pool_bayes_loss"] = 50.0  # above log 3: no predictor on 3 states does worse than uniform
    path.write_text(json.dumps(entry))
    _forget()
    with pytest.warns(UserWarning, match=r"pool_bayes_loss = 50.0 is outside"):
        assert theory.reference_losses(source, 10, n_sequences=64) == fresh
    _forget()
