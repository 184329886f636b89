"""A run folder's checkpoints: checkpoints/step_NNNNNNN.safetensors (the weights, `models.save_state`, with the
model config, training length and step in the file's metadata) and step_NNNNNNN.pt (optimiser, loss scaler,
generators, pending losses, clamp means; read back with `torch.load(..., weights_only=True)`), at log-spaced steps.

A checkpoint is complete only with both files (`list_checkpoints`); `read_checkpoint` checks it (readable, of the
run's model, finite, of its step) and `read_newest_checkpoint` falls back past damaged ones with one warning.
Which checkpoint a run resumes from, given its metrics, is training's (`training.resume`).

A **resume point** is the same pair of files in resume/ instead of checkpoints/ (`resume_point=True` here), written
by training at a cadence of its own (`TrainConfig.resume_every`) so that a run without checkpoints resumes too. It
is training's alone: `list_checkpoints`, and so formation, reports and every reader of checkpoints, never see it;
a run keeps at most one at rest and removes it when it ends (`remove_resume_points`).
"""

import contextlib
import io
import os
import warnings
from pathlib import Path
from typing import Optional

import torch

from markov_interp._io import atomic_write, read_regular
from markov_interp.models import ModelConfig, check_state, read_weights_file, save_state, weights_step
from markov_interp.models.memory import memory_limit
from markov_interp.runs.folder import CHECKPOINT_DIR, RESUME_DIR, CheckpointDamaged, RunFolderError

__all__ = [
    "checkpoint_paths",
    "list_checkpoints",
    "list_resume_points",
    "remove_resume_points",
    "save_checkpoint",
    "weights_problem",
    "read_checkpoint",
    "read_newest_checkpoint",
]

def _what(resume_point: bool) -> str:
    return "resume point" if resume_point else "checkpoint"


def checkpoint_paths(run_dir: "str | os.PathLike", step: int, *, resume_point: bool = False) -> tuple[Path, Path]:
    """(weights file, training-state file) of the checkpoint of `step` (with `resume_point`: of the resume point)."""
    base = Path(run_dir) / (RESUME_DIR if resume_point else CHECKPOINT_DIR) / f"step_{step:07d}"
    return base.with_suffix(".safetensors"), base.with_suffix(".pt")


def _list_saved(run_dir: "str | os.PathLike", resume_point: bool) -> list[tuple[int, Path]]:
    """(step, weights file) of every complete pair of files in checkpoints/ (resume/), by step."""
    folder = Path(run_dir) / (RESUME_DIR if resume_point else CHECKPOINT_DIR)
    if not folder.is_dir():
        return []
    with os.scandir(folder) as entries:
        names = {entry.name for entry in entries}
    found = []
    for name in names:
        step_text = name[len("step_"):-len(".pt")] if name.startswith("step_") and name.endswith(".pt") else ""
        if step_text.isdigit():
            weights, _ = checkpoint_paths(run_dir, int(step_text), resume_point=resume_point)
            if weights.name in names:
                found.append((int(step_text), weights))
    return sorted(found)


def list_checkpoints(run_dir: "str | os.PathLike") -> list[tuple[int, Path]]:
    """(step, weights file) of every complete checkpoint in a run folder (weights and training state), by step.

    The checkpoints sit at log-spaced steps, for studying the training dynamics (probe each one); resume points
    are not checkpoints (`list_resume_points`). The folder is listed with `os.scandir`, so an unreadable
    checkpoints/ raises PermissionError naming it (`Path.glob` read it as empty, and training then started over).
    """
    return _list_saved(run_dir, False)


def list_resume_points(run_dir: "str | os.PathLike") -> list[tuple[int, Path]]:
    """(step, weights file) of every complete resume point in a run folder's resume/, by step: one at rest, two
    while a new one is written over the old, none once the run has ended (training's, see the module docstring).

    Args:
        run_dir: a run folder.

    Returns:
        The resume points, oldest first.
    """
    return _list_saved(run_dir, True)


def remove_resume_points(run_dir: "str | os.PathLike", *, keep: Optional[int] = None) -> None:
    """Delete a run folder's resume points (both files, and a lone file of an interrupted write) but the one of
    step `keep`, and resume/ itself once empty. Call it holding the folder's lock (training does)."""
    folder = Path(run_dir) / RESUME_DIR
    if folder.is_symlink() or not folder.is_dir():  # never delete inside a folder a link leads to
        return
    kept = {path.name for path in checkpoint_paths(run_dir, keep, resume_point=True)} if keep is not None else set()
    with os.scandir(folder) as entries:
        names = [entry.name for entry in entries if entry.is_file(follow_symlinks=False)]
    for name in names:
        if name.startswith("step_") and name not in kept:
            (folder / name).unlink(missing_ok=True)
    if not kept:
        with contextlib.suppress(OSError):  # not empty (a temporary file of a write): left for the next call
            folder.rmdir()


def save_checkpoint(run_dir: "str | os.PathLike", step: int, cfg: ModelConfig, weights: dict[str, torch.Tensor],
                    state: dict, *, train_seq_len: Optional[int] = None, resume_point: bool = False) -> None:
    """Write the checkpoint of `step`, each file atomically; the training state last, so a checkpoint is complete
    (`list_checkpoints`) only with both.

    Args:
        run_dir: the run folder.
        step: the step (updates done; recorded in the weights file's metadata and in `state["step"]`).
        cfg: the model config (in the weights file's metadata).
        weights: the weights in the on-disk layout (`models.save_state`).
        state: optimiser, scaler, generators, pending losses, clamp means (tensors and plain values, `torch.save`;
            `read_checkpoint` loads it with weights_only=True).
        train_seq_len: the run's training length, recorded in the weights file (`models.save_state`).
        resume_point: write it as a resume point (resume/) instead of a checkpoint: the same files.
    """
    weights_path, state_path = checkpoint_paths(run_dir, step, resume_point=resume_point)
    weights_path.parent.mkdir(exist_ok=True)
    save_state(cfg, weights, weights_path, train_seq_len=train_seq_len, step=step)
    try:
        buffer = io.BytesIO()  # serialised in memory, then written by the one atomic writer (errors name the file)
        torch.save(state, buffer)
        atomic_write(state_path, buffer.getvalue())
    except BaseException:
        # both files or neither: a disk that fills between them leaves no weights file behind, which would take
        # space the resumed run's disk check does not count (it plans only complete checkpoints)
        weights_path.unlink(missing_ok=True)
        raise


def weights_problem(path: "str | os.PathLike", cfg: ModelConfig, *, step: Optional[int] = None) -> Optional[str]:
    """Why the weights file at `path` cannot be the weights of a model of `cfg` (at `step`), or None if it can:
    unreadable or truncated, another model's names or shapes, non-finite values, or another step recorded.

    Args:
        path: a weights file written by training.
        cfg: the run's model config.
        step: the step the file should hold (checked when the file records one), or None.

    Returns:
        The problem in words, or None. A file this process may not read raises PermissionError naming it.
    """
    try:
        saved, state, metadata = read_weights_file(path)
    except ValueError as err:
        return str(err)
    recorded = weights_step(metadata)
    if step is not None and recorded is not None and recorded != step:
        return f"the weights of step {recorded}"
    return _content_problem(path, cfg, saved, state)


def _content_problem(path: "str | os.PathLike", cfg: ModelConfig, saved: ModelConfig,
                     state: dict[str, torch.Tensor]) -> Optional[str]:
    """What makes weights read from `path` unusable for a model of `cfg`, or None."""
    if saved != cfg:
        return "the weights of another model config"
    try:
        check_state(cfg, state, source=str(path))
    except ValueError as err:
        return str(err)
    bad = [name for name, tensor in state.items() if not torch.isfinite(tensor).all()]
    if bad:
        return f"non-finite values in {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}"
    return None


def read_checkpoint(run_dir: "str | os.PathLike", step: int, cfg: Optional[ModelConfig] = None, *,
                    resume_point: bool = False) -> tuple[dict[str, torch.Tensor], dict]:
    """Read the checkpoint of `step`, checked.

    Args:
        run_dir: the run folder.
        step: the checkpoint's step.
        cfg: the run's model config: the weights must fit it and be finite (None: not checked).
        resume_point: read the resume point of `step` instead (the same files in resume/, the same checks).

    Returns:
        (weights in the on-disk layout, training state as `save_checkpoint` wrote it).

    Raises:
        CheckpointDamaged: a file is unreadable, truncated or of another model, or the weights are not finite
            (naming the file; a resume falls back to an older checkpoint).
        RunFolderError: the checkpoint holds another step (a file copied from another step's name): refused.
    """
    what = _what(resume_point)
    weights_path, state_path = checkpoint_paths(run_dir, step, resume_point=resume_point)
    try:
        saved, weights, metadata = read_weights_file(weights_path)
    except ValueError as err:
        raise CheckpointDamaged(f"{what} {err}") from None
    problem = _content_problem(weights_path, cfg, saved, weights) if cfg is not None else None
    if problem is not None:
        raise CheckpointDamaged(f"{what} {weights_path} is unusable: {problem}")
    try:
        # a regular file no larger than this machine's memory, read once (as the weights: `read_weights_file`)
        data = read_regular(state_path, "training state file", limit=memory_limit("cpu")[0])
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types on corrupt / truncated files
        raise CheckpointDamaged(f"{what} {state_path} is unreadable ({type(err).__name__}: {err})") from None
    if not isinstance(state, dict) or "optimizer" not in state:
        raise CheckpointDamaged(f"{what} {state_path} holds no training state")
    for path, recorded in ((weights_path, weights_step(metadata)), (state_path, state.get("step"))):
        if recorded is not None and recorded != step:
            raise RunFolderError(
                f"{path} holds the {what} of step {recorded}, not {step} (copied from another step?); training "
                f"cannot resume from it: remove {weights_path.name} and {state_path.name} from "
                f"{weights_path.parent} to resume from an older checkpoint")
    return weights, state


def read_newest_checkpoint(outs: list[Path], cfgs: list[ModelConfig], steps: "set[int] | list[int]", *,
                           stacklevel: int = 2, resume_points: "set[int] | frozenset[int]" = frozenset()
                           ) -> Optional[tuple[int, list[tuple[dict[str, torch.Tensor], dict]]]]:
    """The newest of `steps` whose checkpoint every folder of `outs` holds intact (`read_checkpoint`), read.

    Damaged checkpoints are skipped for the next older one; ONE warning names them all (the newest's problem in
    full) and says where training resumes, instead of one line per checkpoint (an edited model config used to
    print eleven).

    Args:
        outs: the run folders of a stack.
        cfgs: their model configs.
        steps: the checkpoint steps they all hold and their metrics cover (`loop`'s resume candidates).
        stacklevel: of the warning.
        resume_points: the steps of `steps` read from the folders' resume points instead of their checkpoints.

    Returns:
        (step, [(weights, training state) per folder]), or None: no intact checkpoint (training starts at step 0).
    """
    skipped: list[tuple[int, CheckpointDamaged]] = []
    found = None
    for step in sorted(steps, reverse=True):
        try:
            found = (step, [read_checkpoint(out, step, cfg, resume_point=step in resume_points)
                            for out, cfg in zip(outs, cfgs)])
            break
        except CheckpointDamaged as err:
            skipped.append((step, err))
    if skipped:
        then = (f"resuming from the {_what(found[0] in resume_points)} of step {found[0]}" if found
                else "training from step 0")
        first = skipped[0][1]
        if len(skipped) > 1:
            listed = ", ".join(str(step) for step, _ in skipped)
            first = f"{len(skipped)} checkpoints are unusable (steps {listed}); the newest: {first}"
        warnings.warn(f"{first}; {then}", stacklevel=stacklevel + 1)
    return found
