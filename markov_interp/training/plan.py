"""The plan check: refuse a training plan that cannot fit, before anything is allocated or written.

`check_plan(runs, outs, device)` runs first in `train_many` (so in `train`, `markov-interp train`, `--seeds`,
sweeps and `reproduce`), before a run folder is created or its config.json written, so a refused command leaves
nothing behind that would then refuse the corrected one. It estimates (`models.memory`):

- the parameters with their gradients and optimiser state, and the activations of a step, for the whole stack;
- the data: the transition kernels and the sampler's arrays (fixed chains: [member, batch, seq, context, vocab]
  comparisons; random chains: one kernel per sequence, the sampler's blocks; on the counter stream also its words
  and the Gamma draws' rejection rounds, all at once), and theory's reference losses (a stationary solve per
  kernel; 1024 kernels at once for random sources);
- the metrics rows held in memory (`schedule.max_rows`, by arithmetic);

and refuses (`models.memory.PlanTooLarge`, a ValueError) when they exceed the device's memory, naming the field
behind the largest need and the memory it would take. It also refuses more than `MAX_CHECKPOINTS` checkpoints
per run, plans whose files still to be written (metrics, the checkpoints not yet on disk, resume points, final
weights) exceed the free disk under the run folder (`check_disk`, naming free space as the cause), and more run
folders than the open-file limit allows (each holds a lock and a metrics file open while it trains;
the soft limit is raised towards the hard one first). docs/faults.md states the guarantees and their tests.
"""

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import torch

from markov_interp.sources.sampling import sampler_bytes
from markov_interp.models.memory import (Need, PlanTooLarge, check_needs, forward_needs, human_bytes, memory_limit,
                                         model_needs, parameter_count)
from markov_interp.runs.config import RunConfig
from markov_interp.sources import SourceConfig
from markov_interp.streams import COUNTER_STREAM, GAMMA_ROUNDS, LEGACY_STREAM
from markov_interp.runs import list_checkpoints, list_resume_points
from markov_interp.theory import reference_needs
from markov_interp.training.schedule import checkpoint_steps, max_rows

__all__ = ["check_plan", "check_disk", "MAX_CHECKPOINTS", "MAX_RUNS", "FILES_PER_RUN", "PlanTooLarge"]

MAX_CHECKPOINTS = 10_000  # checkpoints one run may plan (two files each)
MAX_RUNS = 4096  # runs one `train_many` call trains (`--seeds`): each is a folder, a stack member, two open files
FILES_PER_RUN = 2  # descriptors a run folder holds open while it trains: its lock and its metrics file
_SPARE_FILES = 64  # descriptors left for torch, tqdm, checkpoint writes and the caller
_ROW_BYTES = 1024  # a metrics row in memory (a dict of about a dozen floats)
_ROW_FILE_BYTES = 400  # a metrics row in metrics.jsonl
# A checkpoint's bytes beyond weights and optimiser state, by stream: measured 21 KB for the one-layer paper model
# on "torch-1" (two CPU generators' states of 5 KB each, pending losses, torch.save's archive), 10.3 KB on
# "counter-1" (no generator states: a d_model 8 run's 82,356-byte .pt holds 72,016 bytes of state); with a margin
_CHECKPOINT_EXTRA = {LEGACY_STREAM: 32 * 1024, COUNTER_STREAM: 14 * 1024}
# The counter stream's peak bytes ("counter-1"), measured on the CPU (live tensor storages during the call): 25 per
# word of `streams.words` with its uniforms, 96 per draw and rejection round of `streams.gamma`; with a margin
_WORD_BYTES = 32
_GAMMA_ROUND_BYTES = 130


def check_plan(runs: Sequence[RunConfig], outs: Sequence[Optional[Path]], device: torch.device) -> None:
    """Refuse a stack of compatible `runs` (one per folder of `outs`, None: in memory) that cannot fit.

    Args:
        runs: the runs of one stack (`loop.check_compatible` already passed).
        outs: their run folders.
        device: where they train.

    Raises:
        PlanTooLarge: naming the field, the memory (or disk, or open files) it would need and what there is.
    """
    run, members = runs[0], len(runs)
    if members > MAX_RUNS:
        raise PlanTooLarge(f"train: {members} runs at once is too many: at most {MAX_RUNS} a call (each is a run "
                           "folder and a member of one stacked model); train them in batches")
    tc = run.train
    if all(o is not None and _nothing_to_train(o) for o in outs):
        return  # finished or diverged folders are loaded, not trained: their plan ran where they were trained
    n_checkpoints = min(tc.n_checkpoints, tc.steps)
    if n_checkpoints > MAX_CHECKPOINTS:
        raise PlanTooLarge(f"train: train.n_checkpoints={tc.n_checkpoints} is too large: at most {MAX_CHECKPOINTS} "
                           f"checkpoints a run (each writes two files); lower train.n_checkpoints")
    optimiser_floats = 3 if tc.optimizer == "adamw" else (2 if tc.momentum else 1)
    rows = max_rows(tc)
    needs = [model_needs(run.model, members=members, state_floats=optimiser_floats),
             forward_needs(run.model, batch=tc.batch_size, seq_len=tc.seq_len, members=members),
             *_data_needs(run, members),
             Need.of("the metrics rows", rows * members * _ROW_BYTES, _row_fields(run, members))]
    check_needs(needs, memory_limit(device), where="train")
    written = [o for o in outs if o is not None]
    if written:
        check_disk(run, written, n_checkpoints, optimiser_floats)
        check_open_files(len(written))


def check_disk(run: RunConfig, outs: Sequence[Path], n_checkpoints: int, optimiser_floats: int) -> None:
    """Refuse runs whose files still to be written exceed the free disk under their folders, naming free space as
    the cause.

    What is left to write: the checkpoints after the newest complete one each folder holds (a resume starts there;
    those on disk are not written again), the metrics rows (a resume rewrites the kept ones into a fresh file), the
    final weights, and unless `train.resume_every=0` the resume points: a checkpoint's files each, two per run at
    most at once (the one kept and the one written over it), one fewer where one is on disk. A run stopped by a full
    disk and resumed once there is space again is checked against what it has left, not its whole plan (the whole
    plan used to be counted, and the refusal named a model field whose change would make the run incompatible with
    its own folder).

    Args:
        run: one run of the stack (they share the plan's sizes).
        outs: their run folders.
        n_checkpoints: checkpoints a run writes (capped at its steps).
        optimiser_floats: floats of optimiser state per parameter.

    Raises:
        PlanTooLarge: naming the free space, where, and what is left to write.
    """
    tc = run.train
    params = parameter_count(run.model) * 4
    planned = checkpoint_steps(tc.steps, n_checkpoints)  # at most MAX_CHECKPOINTS (checked before)
    done = [_newest_checkpoint(out) for out in outs]
    left = sum(sum(1 for step in planned if step > newest) for newest in done)
    # a checkpoint: the weights and the optimiser state (as many floats as gradients and state less one), and the
    # rest of its training state (generators, pending losses, the format's own bytes); a resume point is one too
    checkpoint = params * optimiser_floats + _CHECKPOINT_EXTRA[tc.stream]
    on_disk = [min(1, _resume_points(out)) for out in outs]
    points = 0 if tc.resume_every == 0 else sum(2 - held for held in on_disk)
    parts = [("metrics.jsonl", max_rows(tc) * len(outs) * _ROW_FILE_BYTES),
             (f"{left} checkpoint(s)", left * checkpoint),
             (f"{points} resume point(s)", points * checkpoint),
             ("the final weights", len(outs) * params)]
    total = sum(size for _, size in parts)
    base = _existing(outs[0])
    free = shutil.disk_usage(base).free
    if total <= free:
        return
    resumed = any(done) or any(on_disk)
    what = ", ".join(f"{name} {human_bytes(size)}" for name, size in parts if size)
    smaller = "" if resumed else f" (or plan a smaller run: {_smaller(run, parts)})"
    raise PlanTooLarge(
        f"train: not enough free disk space: {human_bytes(free)} free at {base}, but the run"
        f"{'s' if len(outs) > 1 else ''} still {'have' if len(outs) > 1 else 'has'} {human_bytes(total)} to write "
        f"({what}{'; the checkpoints already on disk are not counted' if resumed else ''}); free some space there, "
        f"or train into a folder on another disk{smaller} (refused before anything was written)")


def _newest_checkpoint(out: Path) -> int:
    """The step of the newest complete checkpoint in a run folder (0: none, or unreadable: then `loop` says so)."""
    try:
        found = list_checkpoints(out)
    except OSError:
        return 0
    return found[-1][0] if found else 0


def _resume_points(out: Path) -> int:
    """How many resume points a run folder holds (0 when unreadable: then `loop` says so)."""
    try:
        return len(list_resume_points(out))
    except OSError:
        return 0


def _smaller(run: RunConfig, parts: list[tuple[str, int]]) -> str:
    """How a fresh run writes less: the field behind its largest file ("lower train.n_checkpoints=12")."""
    largest = max(parts, key=lambda part: part[1])[0]
    if "checkpoint" in largest:
        return f"lower train.n_checkpoints={run.train.n_checkpoints}"
    if "resume point" in largest:
        return "set train.resume_every=0 (no resume points: only checkpoints resume)"
    if largest == "metrics.jsonl":
        return f"raise train.log_every={run.train.log_every}"
    field, value = model_needs(run.model).fields[0]
    return f"lower {field}={value}"


def _nothing_to_train(out: Path) -> bool:
    """A folder holding final weights or a divergence record (what `loop` loads instead of training)."""
    return (out / "model.safetensors").is_file() or (out / "status.json").is_file()


def _row_fields(run: RunConfig, members: int) -> list[tuple[str, int]]:
    tc = run.train
    fields = [("train.steps", tc.steps), ("train.log_every", tc.log_every), ("train.eval_every", tc.eval_every),
              ("train.eval_log_points", tc.eval_log_points)]
    return fields + ([("members", members)] if members > 1 else [])


def _data_needs(run: RunConfig, members: int) -> list[Need]:
    """The sampler's arrays and theory's reference losses of `run`'s source: the source config's own estimate
    (`SourceConfig.data_bytes`), else a kernel source's (`sources.sampling.sampler_bytes`,
    `theory.reference_needs`, and on "counter-1" the stream's words)."""
    source, tc = run.source, run.train
    batch, length = tc.batch_size, tc.seq_len + 1
    vocab = source.vocab_size
    size = [(f"source.{source.states_option}", vocab)] if source.states_option is not None else []
    shape = [("train.batch_size", batch), ("train.seq_len", tc.seq_len)] + ([("members", members)] if members > 1
                                                                            else [])
    own = source.data_bytes(batch=batch, length=length, members=members)
    if own is not None:  # on "counter-1" such a source draws with `sample` (the stream's per-member fallback)
        return [Need.of("the data sampler", own[0], [*size, *shape]), Need.of("the reference losses", own[1], size)]
    order = source.order
    fields = [*size, ("source.order", order), *shape]
    sampler = sampler_bytes(vocab=vocab, order=order, batch=batch, length=length, random=source.in_context,
                            members=members)
    needs = [Need.of("the data sampler", sampler, fields),
             *reference_needs(vocab=vocab, order=order, random=source.in_context, seq_len=tc.seq_len,
                              pool_size=getattr(source, "pool_size", None), fields=[*size, ("source.order", order)])]
    if tc.stream == COUNTER_STREAM:
        needs.append(_stream_needs(source, members, batch, length, vocab ** order, vocab, fields))
    return needs


def _stream_needs(source: SourceConfig, members: int, batch: int, length: int, contexts: int, vocab: int,
                  fields: list) -> Need:
    """The counter stream's arrays at a step ("counter-1"): Philox's words for the first states and steps, and for
    fresh Dirichlet kernels the Gamma draws' rejection rounds, all computed at once (`streams.gamma`:
    `streams.GAMMA_ROUNDS` rounds per draw when alpha != 1, one when alpha = 1)."""
    words = members * batch * length * _WORD_BYTES
    alpha, pool = getattr(source, "alpha", None), getattr(source, "pool_size", None)
    if not source.in_context or alpha is None or pool is not None:
        return Need.of("the counter stream's words", words, fields)
    rounds = 1 if alpha == 1 else GAMMA_ROUNDS
    gamma = members * batch * contexts * vocab * rounds * _GAMMA_ROUND_BYTES
    return Need.of(f"the counter stream's Gamma draws ({rounds} rejection round{'s' * (rounds > 1)} each) and words",
                   words + gamma, fields)


def _existing(path: Path) -> Path:
    """`path` or its nearest existing ancestor (where the run folder's files will go)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def check_open_files(n_folders: int) -> None:
    """Make sure this process may hold `n_folders` run folders open (`FILES_PER_RUN` descriptors each) beside
    what it holds already: raise the soft open-file limit towards the hard one if needed, else refuse.

    Args:
        n_folders: run folders trained at once.

    Raises:
        PlanTooLarge: naming how many files the folders need and the limit (`ulimit -n`).
    """
    try:
        import resource
    except ModuleNotFoundError:  # pragma: no cover - Windows: no such limit to check
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    besides = _open_files() + _SPARE_FILES
    needed = besides + FILES_PER_RUN * n_folders
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return
    if hard == resource.RLIM_INFINITY or needed <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
        return
    raise PlanTooLarge(
        f"train: {n_folders} run folders trained at once hold {FILES_PER_RUN * n_folders} files open (a lock and a "
        f"metrics file each), {needed} with what this process holds and needs besides, but the open-file limit "
        f"(ulimit -n) is {hard}; raise it (ulimit -n {needed}) or train fewer runs at once (e.g. --seeds in "
        f"batches of {max(1, (hard - besides) // FILES_PER_RUN)}) (refused before "
        "anything was written)"
    )


def _open_files() -> int:
    """Descriptors this process holds now (Linux and macOS list them; elsewhere a guess)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return 16
