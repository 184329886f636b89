"""How much memory a model needs, estimated before anything is allocated, and the refusal of absurd sizes.

`parameter_count(cfg)` counts from `init.state_shapes` (nothing allocated); `model_needs` and `forward_needs`
estimate the bytes of the parameters with their gradients and optimiser state, and of one forward (and
backward) pass, as `Need`s: a quantity, its bytes, and the config fields it grows with. `check_needs` compares
their sum with the memory of the device (`memory_limit`: physical memory, or a cgroup limit below it, on the CPU;
the GPU's memory on CUDA) and raises `PlanTooLarge` naming the field behind the largest need and the memory it
would take, before a byte of it is allocated (`training.plan` for training, the CLI for probes; docs/faults.md).

The estimates are lower bounds of the order of magnitude (float32 activations, the largest tensors of each
block), meant to refuse absurd sizes (`d_model=10**9`, `n_ctx=10**9`, `vocab=10**6`), not to predict a peak.
"""

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any, Optional

from markov_interp.models.config import ModelConfig
from markov_interp.models.init import state_shapes

__all__ = ["Need", "PlanTooLarge", "parameter_count", "model_needs", "forward_needs", "memory_limit",
           "check_needs", "check_probe", "human_bytes"]

_FLOAT = 4  # bytes of a float32


class PlanTooLarge(ValueError):
    """A run or probe would need more memory (or disk) than the machine has; the message names the field."""


@dataclasses.dataclass(frozen=True)
class Need:
    """Memory one part of a plan needs: `what` it is, its `bytes`, and the fields it grows with as
    ((field, value), ...), largest value first: the first is the one a refusal names."""

    what: str
    bytes: int
    fields: tuple

    @classmethod
    def of(cls, what: str, n_bytes: "int | float", fields: Sequence[tuple[str, Any]]) -> "Need":
        """A need whose fields are sorted by value (the largest is the likeliest culprit)."""
        ordered = tuple(sorted(fields, key=lambda fv: -float(fv[1])))
        return cls(what=what, bytes=int(min(n_bytes, 2**62)), fields=ordered)


def human_bytes(n: "int | float") -> str:
    """`n` bytes in binary units ("1.5 GiB")."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def parameter_count(cfg: ModelConfig) -> int:
    """Weights of a model of `cfg` (a tied unembedding counted once), from the shapes alone.

    Args:
        cfg: the model config.

    Returns:
        The number of parameters.
    """
    return sum(math.prod(shape) for shape in state_shapes(cfg).values())


def _size_fields(cfg: ModelConfig) -> list[tuple[str, int]]:
    """The size fields of `cfg` that the user sets (d_head and d_mlp only when not derived from d_model)."""
    fields = [("model.d_model", cfg.d_model), ("model.d_vocab", cfg.d_vocab), ("model.n_layers", cfg.n_layers),
              ("model.n_heads", cfg.max_heads)]
    if cfg.positional == "standard":
        fields.append(("model.n_ctx", cfg.n_ctx))
    if not cfg.d_head_is_default:
        fields.append(("model.d_head", cfg.d_head))
    if not cfg.attn_only and cfg.d_mlp != 4 * cfg.d_model:
        fields.append(("model.d_mlp", cfg.d_mlp))
    return fields


def model_needs(cfg: ModelConfig, *, members: int = 1, state_floats: int = 0) -> Need:
    """The parameters of `members` models of `cfg`, with `state_floats` more floats per parameter (gradients and
    optimiser state: 3 for AdamW, 1 or 2 for SGD, 0 to only hold the weights)."""
    fields = _size_fields(cfg) + ([("members", members)] if members > 1 else [])
    what = "the parameters" + (", their gradients and optimiser state" if state_floats else "")
    return Need.of(what, members * parameter_count(cfg) * _FLOAT * (1 + state_floats), fields)


def forward_needs(cfg: ModelConfig, *, batch: int, seq_len: int, members: int = 1, backward: bool = True,
                  batch_field: str = "train.batch_size", seq_field: str = "train.seq_len") -> Need:
    """The activations of one forward pass of `members` models on `batch` x `seq_len` tokens (kept for the
    backward pass when `backward`, which then needs about as much again): per block the residual stream, the
    queries, keys, values and outputs of every head, the attention scores and pattern, the MLP's hidden layer;
    the logits with their log-softmax.

    Args:
        cfg: the model config.
        batch, seq_len: the input size.
        members: models run at once (a stack).
        backward: training (activations kept, gradients of the same size).
        batch_field, seq_field: how a refusal names the batch and the length.

    Returns:
        The `Need`.
    """
    heads = sum(cfg.heads_per_layer)
    per_token = cfg.n_layers * 6 * cfg.d_model + heads * 4 * cfg.d_head + 3 * cfg.d_vocab
    if not cfg.attn_only:
        per_token += cfg.n_layers * 2 * cfg.d_mlp
    floats = batch * seq_len * (per_token + heads * 2 * seq_len) * members
    fields = [(batch_field, batch), (seq_field, seq_len), ("model.d_model", cfg.d_model),
              ("model.d_vocab", cfg.d_vocab), ("model.n_layers", cfg.n_layers)] + (
        [("members", members)] if members > 1 else [])
    return Need.of("the activations", floats * _FLOAT * (2 if backward else 1), fields)


def memory_limit(device: Any) -> tuple[int, str]:
    """(bytes, description) of the memory a plan on `device` may use: the GPU's memory on CUDA; on the CPU the
    physical memory, or the cgroup (container) limit when lower."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return int(total), f"the {human_bytes(total)} of {device}"
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - platforms without sysconf
        total = 2**62
    try:
        with open("/sys/fs/cgroup/memory.max") as handle:
            text = handle.read().strip()
        if text.isdigit():
            total = min(total, int(text))
    except OSError:
        pass
    return int(total), f"the {human_bytes(total)} of memory of this machine"


def check_needs(needs: Sequence[Need], limit: tuple[int, str], *, where: str, hint: Optional[str] = None) -> None:
    """Refuse a plan whose needs add up to more than `limit` (`memory_limit`); free disk is `training.plan`'s.

    Args:
        needs: what the plan needs.
        limit: (bytes, description) of what there is.
        where: who refuses ("train", "probe", ...), the message's start.
        hint: what to do instead (default: lower the named field).

    Raises:
        PlanTooLarge: naming the field behind the largest need, its value, that need's bytes and the total.
    """
    total = sum(n.bytes for n in needs)
    if total <= limit[0]:
        return
    worst = max(needs, key=lambda n: n.bytes)
    field, value = worst.fields[0] if worst.fields else ("?", "?")
    others = ", ".join(f"{f}={v}" for f, v in worst.fields[1:4])
    raise PlanTooLarge(
        f"{where}: {field}={value} is too large: {worst.what} would need {human_bytes(worst.bytes)} of memory"
        f"{f' (with {others})' if others else ''}, {human_bytes(total)} in all, more than {limit[1]}; "
        f"{hint or f'lower {field}'} (refused before anything was written)"
    )


def check_probe(cfg: ModelConfig, *, n_sequences: int, seq_len: int, device: Any, where: str = "probe") -> None:
    """Refuse a probe batch of `n_sequences` x `seq_len` tokens that a model of `cfg` cannot run on `device`
    (the weights and one forward pass without gradients: a lower bound of what the probes hold), before the
    model is loaded or a sequence sampled.

    Args:
        cfg: the run's model config.
        n_sequences, seq_len: the probe batch (`--n-sequences`, `--seq-len`).
        device: where the probes run.
        where: the command, the message's start.

    Raises:
        PlanTooLarge: naming `--n-sequences` or `--seq-len` (or the model's field) and the memory needed.
    """
    needs = [model_needs(cfg), forward_needs(cfg, batch=n_sequences, seq_len=seq_len, backward=False,
                                             batch_field="--n-sequences", seq_field="--seq-len")]
    check_needs(needs, memory_limit(device), where=where)
