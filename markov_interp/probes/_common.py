"""Shared pieces of the probes: axis names, hook names, the device, one probe batch, total variation.

Every probe works on any TransformerLens hooked model (a `TransformerBridge` from `markov_interp.models`, a
hand-built bridge, or a `HookedTransformer`): it only uses `model.cfg` (n_layers, n_heads, d_vocab),
`run_with_cache(names_filter=...)`, `run_with_hooks(fwd_hooks=...)` and the standard hook names below, which
both TransformerLens model families share. States are integer tokens 0..V-1; there is no tokenizer and no BOS.
"""

import dataclasses
import math
from typing import Any, Optional

import torch
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp import theory
from markov_interp.data import MarkovChain, RandomMarkov

Tokens = Int[Tensor, "batch pos"]
Probs = Float[Tensor, "batch pos vocab"]
HeadScores = Float[Tensor, "layer head"]
Model = Any  # a TransformerLens hooked model (TransformerBridge or HookedTransformer)


# ------------------------------------------------------------------------------------------- hook names
def pattern_hook(layer: int) -> str:
    """Attention pattern of a layer, [batch head query_pos key_pos]."""
    return f"blocks.{layer}.attn.hook_pattern"


def z_hook(layer: int) -> str:
    """Per-head attention output before W_O (the attended values), [batch pos head d_head]."""
    return f"blocks.{layer}.attn.hook_z"


def attn_out_hook(layer: int) -> str:
    """A whole attention layer's contribution to the residual stream, [batch pos d_model]."""
    return f"blocks.{layer}.hook_attn_out"


def mlp_out_hook(layer: int) -> str:
    """An MLP's contribution to the residual stream, [batch pos d_model]."""
    return f"blocks.{layer}.hook_mlp_out"


def embed_hook() -> str:
    """The token embedding's contribution to the residual stream (positions excluded), [batch pos d_model]."""
    return "hook_embed"


def channel_hook(layer: int, channel: str) -> str:
    """A head input after its projection: the queries ("q"), keys ("k") or values ("v") of a layer, [batch pos
    head d_head]."""
    if channel not in ("q", "k", "v"):
        raise ValueError(f"a head's input channel must be 'q', 'k' or 'v', got {channel!r}")
    return f"blocks.{layer}.attn.hook_{channel}"


def resid_pre_hook(layer: int) -> str:
    """The residual stream a block reads (before its attention), [batch pos d_model]."""
    return f"blocks.{layer}.hook_resid_pre"


def resid_mid_hook(layer: int) -> str:
    """The residual stream a block's MLP reads (after its attention), [batch pos d_model]."""
    return f"blocks.{layer}.hook_resid_mid"


def resid_post_hook(layer: int) -> str:
    """The residual stream after a block (the last block's is what the unembedding reads), [batch pos d_model]."""
    return f"blocks.{layer}.hook_resid_post"


def has_mlp(model: Model, layer: int) -> bool:
    """Whether block `layer` has an MLP (attention-only models have none)."""
    return not getattr(model.cfg, "attn_only", False) and mlp_out_hook(layer) in model.hook_dict


DEFAULT_PROBE_LENGTH = 128  # probe length for a model whose training length is unknown (capped at n_ctx)


def probe_length(model: Model, seq_len: Optional[int] = None) -> int:
    """The sequence length a probe runs at: `seq_len` when given, else the model's training length when known
    (`model.markov_train_seq_len`, set when a model is loaded from a run folder), else
    min(n_ctx, DEFAULT_PROBE_LENGTH). Every entry point (Python probes, `probe`, `report`, sweeps) uses this rule.
    """
    if seq_len is not None:
        return int(seq_len)
    trained = getattr(model, "markov_train_seq_len", None)
    if trained is not None:
        return min(int(trained), int(model.cfg.n_ctx))
    return min(int(model.cfg.n_ctx), DEFAULT_PROBE_LENGTH)


def model_device(model: Model) -> torch.device:
    """The device the model's weights live on (tokens are moved there before a forward pass)."""
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


def check_tokens(model: Model, tokens: Tensor) -> Tensor:
    """Validate a token batch against the model (2-D integer states in 0..V-1, at most n_ctx long)."""
    if not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"tokens must be an integer tensor [batch, pos], got {_describe(tokens)}")
    vocab, n_ctx = int(model.cfg.d_vocab), int(model.cfg.n_ctx)
    if tokens.shape[1] > n_ctx:
        raise ValueError(f"sequences of length {tokens.shape[1]} exceed the model's n_ctx={n_ctx}")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise ValueError(f"tokens must lie in 0..{vocab - 1}, got values {int(tokens.min())}..{int(tokens.max())}")
    return tokens.to(model_device(model), torch.long)


def _describe(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


# ------------------------------------------------------------------------------------------ predictions
@torch.no_grad()
def next_state_probs(model: Model, tokens: Tokens, *, fwd_hooks: Optional[list] = None) -> Probs:
    """The model's predicted law of x_{t+1} after x_0..x_t at every position t (float64, rows sum to 1).

    `fwd_hooks` (TransformerLens `(hook_name, fn)` pairs) run during the forward pass, e.g. ablations.

    >>> # probs = next_state_probs(model, BinaryChain(0.2, 0.3).sample(8, 64)); probs.shape == (8, 64, 2)
    """
    tokens = check_tokens(model, tokens)
    if fwd_hooks:
        logits = model.run_with_hooks(tokens, fwd_hooks=fwd_hooks)
    else:
        logits = model(tokens)
    return torch.softmax(logits.double(), dim=-1)


def total_variation(p: Float[Tensor, "*#batch vocab"], q: Float[Tensor, "*#batch vocab"]) -> Float[Tensor, "..."]:
    """Total-variation distance 1/2 sum |p - q| between two laws over the last axis (0: equal, 1: disjoint).

    Leading axes broadcast against each other.

    >>> float(total_variation(torch.tensor([0.8, 0.2]), torch.tensor([0.3, 0.7])))
    0.5
    """
    return 0.5 * (p - q).abs().sum(-1)


# ------------------------------------------------------------------------------------------- probe batch
@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class ProbeBatch:
    """Sequences a probe runs on, with the kernel each sequence was drawn from.

    `kernels[b]` is sequence b's kernel as [V**order, V] (rows indexed by the base-V number of the last
    `order` states, oldest first): the same fixed kernel for every row of a `MarkovChain`, a fresh Dirichlet
    draw per row of a `RandomMarkov`. `initial[b]` is the law sequence b's first `order` states were drawn from,
    over contexts (`theory.initial_context_laws`); None stands for each kernel's stationary context law.
    """

    tokens: Int[Tensor, "batch pos"]
    kernels: Float[Tensor, "batch context vocab"]
    vocab: int
    order: int
    random_kernel: bool  # True for RandomMarkov sources (no fixed kernel to learn in weights)
    beta: float  # add-beta smoothing of the in-context references: alpha for RandomMarkov, 1/2 otherwise
    initial: Optional[Float[Tensor, "batch context"]] = None


def sample_batch(source: Any, *, n_sequences: int, seq_len: int, seed: int) -> ProbeBatch:
    """Draw `n_sequences` sequences of `seq_len` states from `source` with a CPU generator seeded by `seed`."""
    for name, value, minimum in (("n_sequences", n_sequences, 2), ("seq_len", seq_len, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    gen = torch.Generator().manual_seed(seed)
    if isinstance(source, RandomMarkov):
        tokens, kernels = source.sample(n_sequences, seq_len, gen, return_kernels=True)
        return ProbeBatch(
            tokens=tokens, kernels=kernels, vocab=source.vocab, order=source.order, random_kernel=True,
            beta=default_beta(source), initial=theory.initial_context_laws(source, kernels),
        )
    if isinstance(source, MarkovChain):
        tokens = source.sample(n_sequences, seq_len, gen)
        flat = source.kernel.reshape(-1, source.vocab)
        kernels = flat.expand(n_sequences, -1, -1).contiguous()
        return ProbeBatch(
            tokens=tokens, kernels=kernels, vocab=source.vocab, order=source.order, random_kernel=False,
            beta=default_beta(source), initial=theory.initial_context_laws(source, kernels),
        )
    raise ValueError(f"source must be a MarkovChain, BinaryChain or RandomMarkov, got {type(source).__name__}")


def check_source_matches(model: Model, source: Any) -> None:
    """Refuse a source whose number of states differs from the model's vocabulary."""
    if int(source.vocab) != int(model.cfg.d_vocab):
        raise ValueError(f"source has {source.vocab} states but the model's d_vocab is {model.cfg.d_vocab}")


def contexts(tokens: Tokens, *, vocab: int, order: int) -> Int[Tensor, "batch pos"]:
    """Base-V index of the last `order` states at every position (-1 where fewer than `order` states)."""
    return theory.context_index(tokens, vocab, order)


def kernel_probs(batch: ProbeBatch) -> Probs:
    """The true next-state law at every position given each sequence's kernel (`theory.kernel_predictions`, the
    same computation as `theory.true_predictions` for a fixed chain): the kernel row of the current context.

    Positions with fewer than `order` states (order > 1 only) get the exact law of the next state given the
    states so far under the sequence's initial context law. (Before this was shared with `theory`, they got the
    stationary law pi instead; probe values at those first positions of order-k chains moved.)
    """
    initial = batch.initial
    if initial is None:
        initial = theory.stationary_context_laws(_distinct_kernels(batch).cpu()).to(batch.kernels.device)
    return theory.kernel_predictions(_distinct_kernels(batch), batch.tokens, initial)


def _distinct_kernels(batch: ProbeBatch) -> Float[Tensor, "kernels context vocab"]:
    """The kernels as [1, V**k, V] for a fixed chain (one kernel serves every row), else one per sequence."""
    return batch.kernels if batch.random_kernel else batch.kernels[:1]


def stationary_laws(batch: ProbeBatch) -> Float[Tensor, "batch vocab"]:
    """The stationary law pi of each sequence's kernel (one law for a fixed chain, one per row otherwise)."""
    pis = theory.stationary_state_laws(_distinct_kernels(batch).cpu())
    return pis.to(batch.kernels.device).expand(batch.kernels.shape[0], -1)


def stationary_probs(batch: ProbeBatch) -> Probs:
    """The stationary law pi broadcast to every position: the best predictor that ignores the context
    (`theory.stationary_predictions`, the same computation as `theory.plateau_predictions` for a fixed chain)."""
    return theory.stationary_predictions(_distinct_kernels(batch), batch.tokens)


def in_context_unigram_probs(tokens: Tokens, vocab: int, *, beta: float | int) -> Probs:
    """In-context add-beta estimate of the next state from state counts x_0..x_t (ignores the current state).

    The best predictor that uses the context but not the current state (Edelman et al.'s unigram phase);
    `theory.add_beta_predictions` with order 0.
    """
    return theory.add_beta_predictions(tokens, vocab, order=0, beta=beta)


target_losses = theory.target_log_loss


def json_safe(value: Any) -> Any:
    """`value` with tensors turned into lists and NaN / infinities into None (strict JSON has neither)."""
    if isinstance(value, Tensor):
        value = value.detach().cpu().tolist()
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def default_beta(source: Any) -> float:
    """The add-beta smoothing used for in-context references: the source's alpha for RandomMarkov, else 1/2."""
    return float(source.alpha) if isinstance(source, RandomMarkov) else 0.5


def ratio_of_means(numerator: Float[Tensor, " batch"], denominator: Float[Tensor, " batch"]) -> tuple[float, float]:
    """mean(numerator) / mean(denominator) over sequences and its standard error (delta method: the SE of
    mean(numerator - r x denominator) / mean(denominator)); NaN when the denominator's mean is 0.

    >>> ratio_of_means(torch.tensor([1.0, 3.0]), torch.tensor([2.0, 2.0]))
    (1.0, 0.5)
    """
    num, den = numerator.double(), denominator.double()
    mean_den = float(den.mean())
    if mean_den == 0 or not math.isfinite(mean_den):
        return math.nan, math.nan
    ratio = float(num.mean()) / mean_den
    n = num.shape[0]
    spread = float((num - ratio * den).std()) if n > 1 else math.nan
    return ratio, spread / math.sqrt(n) / abs(mean_den)
