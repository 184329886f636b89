"""Models whose mechanism is known by construction (hand-set weights), for testing the probes.

- `induction_model`: two attention-only layers. Residual stream = [current state one-hot | previous state
  one-hot | output | position one-hot]. Layer 0's previous-token head attends from i to i - 1 by matching
  position one-hots (huge logits) and copies x_{i-1} into the "previous" slot; layer 1's induction head matches
  the current state against the "previous" slot of every key (x_{j-1} = x_i) and copies x_j into the output
  slot, so the logits are c times the in-context frequencies of what followed the current state (key 0, which
  holds no transition, is masked by a large negative score). The other
  head of each layer (when n_heads = 2) is a decoy that writes nothing: in layer 0 it attends to itself, in
  layer 1 uniformly.
- `kernel_model`: one layer, attention that writes nothing, logits = log P[x_t, .] read from the token
  embedding (optionally with an all-zero MLP).
- `unigram_model`: logits = log pi whatever the input (output bias; everything else zero).
"""

import math

import torch

from markov_interp.models import ModelConfig, build


def _params(model) -> dict:
    """The native model's parameters by their plain names (the bridge's wrappers stripped)."""
    return {
        name.replace("._original_component", ""): param for name, param in model.original_model.named_parameters()
    }


@torch.no_grad()
def _set(model, values: dict) -> None:
    params = _params(model)
    for param in params.values():
        param.zero_()
    for name, value in values.items():
        params[name].copy_(value)


@torch.no_grad()
def induction_model(vocab: int, *, n_ctx: int = 48, n_heads: int = 2, prev_head: int = 1, induction_head: int = 0,
                    sharpness: float = 25.0, logit_scale: float = 2.0):
    """Two-layer attention-only induction circuit: previous-token head L0H{prev_head}, induction head
    L1H{induction_head}."""
    assert n_ctx > vocab and prev_head < n_heads and induction_head < n_heads
    V, N, dh = vocab, n_ctx, n_ctx
    T, P, O, POS = 0, V, 2 * V, 3 * V
    d_model = 3 * V + N
    cfg = ModelConfig(n_layers=2, n_heads=n_heads, d_model=d_model, d_head=dh, attn_only=True, normalization=None,
                      tie_weights=False, unembed_bias=True, d_vocab=V, n_ctx=N)
    model = build(cfg, seed=0)
    big = sharpness * math.sqrt(dh)
    hd = n_heads * dh
    emb = torch.zeros(V, d_model)
    emb[torch.arange(V), T + torch.arange(V)] = 1
    pos = torch.zeros(N, d_model)
    pos[torch.arange(N), POS + torch.arange(N)] = 1
    q0, k0, v0, q1, k1, v1 = (torch.zeros(hd, d_model) for _ in range(6))
    o0, o1 = torch.zeros(d_model, hd), torch.zeros(d_model, hd)
    # layer 0, previous-token head: query i carries position i - 1, key j carries position j
    base = prev_head * dh
    q0[base + torch.arange(N - 1), POS + torch.arange(1, N)] = big
    k0[base + torch.arange(N), POS + torch.arange(N)] = 1
    v0[base + torch.arange(V), T + torch.arange(V)] = 1
    o0[P + torch.arange(V), base + torch.arange(V)] = 1
    for h in range(n_heads):  # decoys in layer 0: attend to self, write nothing
        if h != prev_head:
            q0[h * dh + torch.arange(N), POS + torch.arange(N)] = big
            k0[h * dh + torch.arange(N), POS + torch.arange(N)] = 1
    # layer 1, induction head: query = current state, key = previous state, value = current state
    base = induction_head * dh
    q1[base + torch.arange(V), T + torch.arange(V)] = big
    k1[base + torch.arange(V), P + torch.arange(V)] = 1
    v1[base + torch.arange(V), T + torch.arange(V)] = 1
    o1[O + torch.arange(V), base + torch.arange(V)] = logit_scale
    # key 0 holds no real transition (layer 0 could only copy x_0 onto itself there): push it away
    q1[base + V, T + torch.arange(V)] = big  # the current-state one-hot always sums to 1: a constant query
    k1[base + V, POS] = -1
    unembed = torch.zeros(V, d_model)
    unembed[torch.arange(V), O + torch.arange(V)] = 1
    _set(model, {
        "tok_embed.weight": emb, "pos.weight": pos,
        "layers.0.attn.q.weight": q0, "layers.0.attn.k.weight": k0,
        "layers.0.attn.v.weight": v0, "layers.0.attn.o.weight": o0,
        "layers.1.attn.q.weight": q1, "layers.1.attn.k.weight": k1,
        "layers.1.attn.v.weight": v1, "layers.1.attn.o.weight": o1,
        "head.weight": unembed,
    })
    return model


@torch.no_grad()
def kernel_model(kernel, *, n_ctx: int = 128, n_heads: int = 1, with_mlp: bool = False):
    """One layer whose logits are log P[x_t, .]: the kernel stored in the weights, attention writing nothing."""
    kernel = torch.as_tensor(kernel, dtype=torch.float64)
    V = kernel.shape[-1]
    d_model = V + 2
    cfg = ModelConfig(n_layers=1, n_heads=n_heads, d_model=d_model, d_head=2, attn_only=not with_mlp,
                      normalization=None, tie_weights=False, unembed_bias=True, d_vocab=V, n_ctx=n_ctx)
    model = build(cfg, seed=0)
    emb = torch.zeros(V, d_model)
    emb[torch.arange(V), torch.arange(V)] = 1
    unembed = torch.zeros(V, d_model)
    unembed[:, :V] = kernel.clamp_min(1e-12).log().T.float()  # logits[x] = sum_s onehot(s) log P[s, x]
    _set(model, {"tok_embed.weight": emb, "head.weight": unembed})
    return model


@torch.no_grad()
def unigram_model(pi, *, n_ctx: int = 128, n_layers: int = 1, n_heads: int = 1):
    """Logits = log pi at every position, whatever the input."""
    pi = torch.as_tensor(pi, dtype=torch.float64)
    V = pi.shape[0]
    cfg = ModelConfig(n_layers=n_layers, n_heads=n_heads, d_model=V + 2, d_head=2, attn_only=True,
                      normalization=None, tie_weights=False, unembed_bias=True, d_vocab=V, n_ctx=n_ctx)
    model = build(cfg, seed=0)
    _set(model, {"head.bias": pi.log().float()})
    return model
