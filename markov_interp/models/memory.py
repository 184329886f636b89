"""How much memory a model needs, estimated before anything is allocated, and the refusal of absurd sizes.

`parameter_count(cfg)` counts from `init.state_shapes` (nothing allocated); `model_needs` and `forward_needs`
estimate the bytes of the parameters with their gradients and optimiser state, and of one forward (and
backward) pass, as `Need`s: a quantity, its bytes, and the config fields it grows with. `check_needs` compares
their sum with the memory of the device (`memory_limit`: physical memory, or a cgroup limit below it, on the CPU;
the GPU's memory on CUDA) and raises `PlanTooLarge` naming the field behind the largest need and the memory it
would take, before a byte of it is allocated (`training.plan` for training, the CLI and the probes' entry check
for probes; docs/faults.md). `Need`, `check_needs`, `memory_limit` and `PlanTooLarge` are `markov_interp._plan`'s
(samplers and theory use them too), re-exported here.

The estimates are lower bounds of the order of magnitude (float32 activations, the largest tensors of each
block), meant to refuse absurd sizes (`d_model=10**9`, `n_ctx=10**9`, `vocab=10**6`), not to predict a peak.
"""

import math
from typing import Any

# the plan's pieces live in `_plan` (samplers and theory use them too); re-exported here
from markov_interp._plan import Need, PlanTooLarge, check_needs, human_bytes, memory_limit
from markov_interp.models.config import ModelConfig
from markov_interp.models.init import state_shapes

__all__ = ["Need", "PlanTooLarge", "parameter_count", "model_needs", "forward_needs", "hooked_needs", "memory_limit",
           "check_needs", "check_probe", "human_bytes"]

_FLOAT = 4  # bytes of a float32


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
    floats = _activation_floats(n_layers=cfg.n_layers, heads=sum(cfg.heads_per_layer), d_model=cfg.d_model,
                                d_head=cfg.d_head, d_vocab=cfg.d_vocab, d_mlp=0 if cfg.attn_only else cfg.d_mlp,
                                batch=batch, seq_len=seq_len) * members
    fields = [(batch_field, batch), (seq_field, seq_len), ("model.d_model", cfg.d_model),
              ("model.d_vocab", cfg.d_vocab), ("model.n_layers", cfg.n_layers)] + (
        [("members", members)] if members > 1 else [])
    return Need.of("the activations", floats * _FLOAT * (2 if backward else 1), fields)


def _activation_floats(*, n_layers: int, heads: int, d_model: int, d_head: int, d_vocab: int, d_mlp: int,
                       batch: int, seq_len: int) -> int:
    """Floats of one forward pass's activations (`forward_needs`): per block the residual stream, every head's
    queries, keys, values and outputs, the attention scores and pattern, the MLP's hidden layer; the logits."""
    per_token = n_layers * 6 * d_model + heads * 4 * d_head + 3 * d_vocab + n_layers * 2 * d_mlp
    return batch * seq_len * (per_token + heads * 2 * seq_len)


def hooked_needs(model: Any, *, batch: int, seq_len: int, fields: list[tuple[str, Any]]) -> list[Need]:
    """The weights of a built hooked model (any TransformerLens model: its `cfg` and parameters) and one forward
    pass without gradients over `batch` x `seq_len` tokens: the probes' entry plan (`probes._common.probe_needs`).

    Args:
        model: the hooked model.
        batch, seq_len: the probe batch (0: no forward pass planned).
        fields: the probe's arguments the batch comes from (how a refusal names them).

    Returns:
        The needs.
    """
    cfg = model.cfg
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    needs = [Need.of("the weights", weights, [("model.d_model", cfg.d_model), ("model.n_layers", cfg.n_layers)])]
    if batch and seq_len:
        d_mlp = 0 if getattr(cfg, "attn_only", False) else int(getattr(cfg, "d_mlp", None) or 0)
        floats = _activation_floats(n_layers=cfg.n_layers, heads=cfg.n_layers * cfg.n_heads, d_model=cfg.d_model,
                                    d_head=cfg.d_head, d_vocab=cfg.d_vocab, d_mlp=d_mlp, batch=batch,
                                    seq_len=seq_len)
        needs.append(Need.of("the activations", floats * _FLOAT, fields or [("sequences", batch),
                                                                            ("positions", seq_len)]))
    return needs


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
