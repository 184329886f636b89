"""`train`'s options: the shortcut flags (each one run-config option, as `--set option=value` would set it), the
registered source kinds as `--source`'s choices (read when first used: importing the sources imports torch, which
`--help` does not need) and the parsing of `--heads`."""

import argparse
from typing import Any, Optional


def _parse_heads(text: str) -> "int | tuple[int, ...]":
    """`--heads`: "2" (every block) or "1,2" (one count per block); an argparse error naming the value otherwise."""
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"must be a count such as 2 or one count per layer such as 1,2, got {text!r}")
    counts = tuple(int(part) for part in parts)
    return counts[0] if len(counts) == 1 else counts


class _SourceKinds:
    """`--source`'s choices: the registered source kinds (`sources.source_kinds`), read when first used, since
    importing the sources imports torch, which the help of the other commands does not need."""

    def _kinds(self) -> tuple:
        from markov_interp.sources import source_kinds

        return source_kinds()

    def help(self) -> str:
        """`--source`'s help: each kind with its one-line help (`SourceConfig.summary`)."""
        from markov_interp.sources import source_config_class

        kinds = "; ".join(f"{kind}: {source_config_class(kind).summary()}" for kind in self._kinds())
        return f"the source kind, one of {kinds}. Any option of a kind: --set source.FIELD=VALUE"

    def __iter__(self) -> Any:
        return iter(self._kinds())

    def __contains__(self, kind: object) -> bool:
        return kind in self._kinds()

    def __len__(self) -> int:
        return len(self._kinds())


class _TrainHelpFormatter(argparse.HelpFormatter):
    """`train --help`: `--source`'s help lists the registered kinds, read only when the help is printed."""

    def _get_help_string(self, action: argparse.Action) -> Optional[str]:
        if isinstance(action.choices, _SourceKinds):
            return action.choices.help().replace("%", "%%")  # argparse formats help strings with %
        return super()._get_help_string(action)


# Shortcut flags of `train`: (flag, dotted option, argparse keywords). Each sets one run-config option,
# exactly as `--set option=value` would; defaults come from `training.default_run`, not from here.
_TRAIN_SHORTCUTS = (
    ("data", "--source", "source.kind", dict(choices=_SourceKinds(), metavar="KIND", help="the source kind")),
    ("data", "--p", "source.p", dict(type=float, help="binary: P(0 -> 1)")),
    ("data", "--q", "source.q", dict(type=float, help="binary: P(1 -> 0)")),
    ("data", "--vocab", "source.vocab", dict(type=int, help="random: number of states")),
    ("data", "--alpha", "source.alpha", dict(type=float, help="random: Dirichlet concentration (default 1)")),
    ("data", "--kernel", "source.kernel", dict(
        help="markov: the kernel as JSON, e.g. '[[0.9,0.1,0],[0.2,0.5,0.3],[0,0.4,0.6]]' (rows: current state, "
        "columns: next state; for order k, nested k+1 deep or flat [V**k, V])")),
    ("data", "--order", "source.order", dict(type=int, help="markov / random: chain order k (default 1)")),
    ("data", "--pool-size", "source.pool_size", dict(type=int, help="random: N kernels, one drawn per sequence")),
    ("data", "--process", "source.process", dict(
        help="hmm: mess3 (default), rrxor, z1r, random (parameters: --set source.params='{\"x\": 0.1}'), or custom "
        "with --set source.matrices=T[x][i][j]")),
    ("model", "--preset", "model.preset", dict(
        help="paper-1layer (default for fixed kernels), paper-2layer, attn-only-2layer (default for random)")),
    ("model", "--layers", "model.n_layers", dict(type=int, help="number of blocks")),
    ("model", "--heads", "model.n_heads", dict(type=_parse_heads, metavar="N|N0,N1,...",
     help="attention heads per block, or one count per block (e.g. 1,2: layer 0 with one head, layer 1 with two; "
     "d_head then defaults to d_model // the largest count)")),
    ("model", "--d-model", "model.d_model", dict(type=int, help="residual width (d_head, d_mlp follow unless set)")),
    ("model", "--d-mlp", "model.d_mlp", dict(type=int, help="MLP hidden width")),
    ("model", "--attn-only", "model.attn_only", dict(action="store_const", const=True, help="no MLPs")),
    ("model", "--no-tie", "model.tie_weights", dict(action="store_const", const=False,
                                                    help="untie the unembedding from the embedding")),
    ("model", "--init", "model.init", dict(choices=["standard", "canonical"],
                                           help="initialisation (see models.ModelConfig)")),
    ("model", "--n-ctx", "model.n_ctx", dict(type=int, help="context length of the model (default 1024)")),
    ("training", "--seq-len", "train.seq_len", dict(type=int, help="input length (default 256; the paper: 1024)")),
    ("training", "--batch-size", "train.batch_size", dict(type=int, help="sequences per step (default 16)")),
    ("training", "--steps", "train.steps", dict(
        type=int, help="optimiser steps (default 300 for fixed kernels, 1000 for random)")),
    ("training", "--lr", "train.lr", dict(
        type=float, help="peak learning rate (default 2e-3, the paper's, for fixed kernels; 1e-2 for random, where "
        "the two-layer attention-only model then reaches the Bayes loss within ~1000 steps)")),
    ("training", "--optimizer", "train.optimizer", dict(choices=["adamw", "sgd"], help="default adamw")),
    ("training", "--schedule", "train.schedule", dict(choices=["one-cycle", "constant"], help="default one-cycle")),
    ("training", "--seed", "train.seed", dict(type=int, help="model init and data seed (default 0)")),
    ("training", "--precision", "train.precision", dict(
        choices=["fp32", "fp16", "bf16"],
        help="fp32 (default) or autocast fp16 / bf16; precision changes the paper's outcome")),
    ("training", "--loss-scaling", "train.loss_scaling", dict(action="store_const", const=True,
                                                              help="fp16 with dynamic loss scaling")),
    ("training", "--compile", "train.compile", dict(
        choices=["off", "default", "max"],
        help="torch.compile the training step: off (default, eager), default or max (autotuned); equal to eager up "
        "to float rounding (docs/training.md#compiled-steps)")),
    ("training", "--capture", "train.capture", dict(
        choices=["off", "graph"],
        help="graph: run the whole training step as one CUDA graph (CUDA only; elsewhere the run says why not; "
        "docs/training.md#captured-steps)")),
    ("training", "--device", "train.device", dict(help="auto (default: cuda if available), cpu, cuda, cuda:1, ...")),
    ("training", "--eval-every", "train.eval_every", dict(
        type=int, help="evaluate every N steps (default 100; 0: only at the end)")),
    ("training", "--checkpoints", "train.n_checkpoints", dict(type=int,
                                                              help="log-spaced checkpoints to keep (default 8)")),
)
