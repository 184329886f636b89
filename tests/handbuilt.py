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
- `belief_model` with `chain_hmm`: a model whose residual stream holds the belief of a chain written as an HMM,
  and that HMM (the belief after x_t is onehot(x_t)); `BELIEF_KERNEL` is the chain the belief tests use.
"""

import math
from typing import Optional

import torch

from markov_interp.models import ModelConfig, hooked_model, state_shapes
from markov_interp.sources import HiddenMarkov

BELIEF_KERNEL = [[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.3, 0.3, 0.4]]  # the chain of the belief tests


def hand_set(cfg: ModelConfig, values: dict):
    """The hooked model of `cfg` (the installed TransformerLens's kind: the same on every version) whose weights
    are `values` ({on-disk name: tensor}, `models.state_shapes`) and zero everywhere else."""
    state = {name: torch.zeros(shape) for name, shape in state_shapes(cfg).items()}
    for name, value in values.items():
        assert state[name].shape == value.shape, (name, tuple(value.shape), state[name].shape)
        state[name] = value.float()
    return hooked_model(cfg, state)


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
    return hand_set(cfg, {
        "embed.weight": emb, "pos_embed.weight": pos,
        "blocks.0.attn.q.weight": q0, "blocks.0.attn.k.weight": k0,
        "blocks.0.attn.v.weight": v0, "blocks.0.attn.o.weight": o0,
        "blocks.1.attn.q.weight": q1, "blocks.1.attn.k.weight": k1,
        "blocks.1.attn.v.weight": v1, "blocks.1.attn.o.weight": o1,
        "unembed.weight": unembed,
    })


@torch.no_grad()
def kernel_model(kernel, *, n_ctx: int = 128, n_heads: int = 1, with_mlp: bool = False):
    """One layer whose logits are log P[x_t, .]: the kernel stored in the weights, attention writing nothing."""
    kernel = torch.as_tensor(kernel, dtype=torch.float64)
    V = kernel.shape[-1]
    d_model = V + 2
    cfg = ModelConfig(n_layers=1, n_heads=n_heads, d_model=d_model, d_head=2, attn_only=not with_mlp,
                      normalization=None, tie_weights=False, unembed_bias=True, d_vocab=V, n_ctx=n_ctx)
    emb = torch.zeros(V, d_model)
    emb[torch.arange(V), torch.arange(V)] = 1
    unembed = torch.zeros(V, d_model)
    unembed[:, :V] = kernel.clamp_min(1e-12).log().T.float()  # logits[x] = sum_s onehot(s) log P[s, x]
    return hand_set(cfg, {"embed.weight": emb, "unembed.weight": unembed})


@torch.no_grad()
def unigram_model(pi, *, n_ctx: int = 128, n_layers: int = 1, n_heads: int = 1):
    """Logits = log pi at every position, whatever the input."""
    pi = torch.as_tensor(pi, dtype=torch.float64)
    V = pi.shape[0]
    cfg = ModelConfig(n_layers=n_layers, n_heads=n_heads, d_model=V + 2, d_head=2, attn_only=True,
                      normalization=None, tie_weights=False, unembed_bias=True, d_vocab=V, n_ctx=n_ctx)
    return hand_set(cfg, {"unembed.bias": pi.log().float()})


# ---------------------------------------------------------------------------------- general circuit builder
# Residual stream of `circuit_model`: [T: x_i one-hot | P_1..P_K: x_{i-l} one-hots (written by lag-l heads) |
# O: output (read by the unembedding) | U: unread scratch (decoys write here) | POS: position one-hot |
# S: a position one-hot written by a "position" head (only with `position_slot`)].
# A head is given by a role tuple:
#   ("prev", lag, weight[, slot]) attends from i to i - lag, writes weight * onehot(x_{i-lag}) into P_lag (or
#                               P_slot)
#   ("prev-sink", lag, share, w) attends `share` to i - lag and the rest to position 0 (an attention sink), writes
#                               w x (share onehot(x_{i-lag}) + (1 - share) onehot(x_0)) into P_lag
#   ("relay", src, dst, w)      attends to itself, copies P_src into P_dst (a relayed lagged state)
#   ("prev-copy", lag, src, dst, w)  attends from i to i - lag like "prev" but copies P_src (not the state) into P_dst
#   ("switch", w, "same" | "other")  query x_i, key the key's own state: attends to the positions holding the current
#                               state (or the others), reads P_1 (the state before each) and writes w x its mean
#                               into O: for two states the switch counts, the in-context bigram law (key 0 pushed
#                               away)
#   ("induction", order, w)     query [x_i, x_{i-1}, ..]; key [x_{j-1}, .., x_{j-order}] from P_1..P_order; value
#                               x_j; writes w * onehot(x_j) into O (w = logit scale; keys j < order pushed away)
#   ("count", w[, slot])        uniform causal attention, writes w * onehot(x_j) into O (or P_slot): an in-context
#                               counter
#   ("self",), ("same",), ("prev-decoy", lag), ("uniform",)   decoys writing into U (nobody reads it)
#   ("position",)               attends to itself and copies its position one-hot into S (needs `position_slot`)
#   ("prev-slot", lag, w)       as "prev", but its query reads the position from S (a position head's output)
#   ("prev-mix", lags, w)       attends equally to every lag in `lags`, writes w x the mix into P_1 (one role
#                               spread over lags)
# `kernel` (order 1) adds logits log P[x_i, .] read straight from T: the kernel stored in the weights.
@torch.no_grad()
def circuit_model(vocab: int, heads: dict, *, n_layers: int, n_heads: int, n_ctx: int = 48, max_lag: int = 2,
                  sharpness: float = 25.0, kernel=None, bias=None, with_mlp: bool = False, extra=None,
                  position_slot: bool = False):
    V, N, K = vocab, n_ctx, max_lag
    T, P, O = 0, V, V + K * V
    U = O + V
    POS = U + V
    S = POS + N
    d_model, dh = S + (N if position_slot else 0), N
    assert N > K * V + 1
    cfg = ModelConfig(n_layers=n_layers, n_heads=n_heads, d_model=d_model, d_head=dh, attn_only=not with_mlp,
                      normalization=None, tie_weights=False, unembed_bias=True, d_vocab=V, n_ctx=N, act_fn="relu",
                      d_mlp=V * V)
    big = sharpness * math.sqrt(dh)
    hd = n_heads * dh
    values = {"embed.weight": torch.zeros(V, d_model), "pos_embed.weight": torch.zeros(N, d_model)}
    values["embed.weight"][torch.arange(V), T + torch.arange(V)] = 1
    values["pos_embed.weight"][torch.arange(N), POS + torch.arange(N)] = 1
    for layer in range(n_layers):
        for name in "qkv":
            values[f"blocks.{layer}.attn.{name}.weight"] = torch.zeros(hd, d_model)
        values[f"blocks.{layer}.attn.o.weight"] = torch.zeros(d_model, hd)
    slots = dict(T=T, P=P, O=O, U=U, POS=POS, S=S, V=V, N=N, big=big, dh=dh, sharpness=sharpness)
    for (layer, head), role in heads.items():
        assert layer < n_layers and head < n_heads, (layer, head)
        _write_head(values, layer, head * dh, role, slots)
    unembed = torch.zeros(V, d_model)
    unembed[torch.arange(V), O + torch.arange(V)] = 1
    if kernel is not None:
        kern = torch.as_tensor(kernel, dtype=torch.float64)
        unembed[:, T:T + V] = kern.clamp_min(1e-12).log().T.float()
    values["unembed.weight"] = unembed
    if bias is not None:
        values["unembed.bias"] = torch.as_tensor(bias, dtype=torch.float32)
    if extra is not None:  # a caller's own weights (e.g. an MLP), given the residual layout
        values.update(extra(slots, d_model))
    return hand_set(cfg, values)


def _write_head(values: dict, layer: int, base: int, role: tuple, s: dict) -> None:
    q, k, v = (values[f"blocks.{layer}.attn.{n}.weight"] for n in "qkv")
    o = values[f"blocks.{layer}.attn.o.weight"]
    V, N, ar = s["V"], s["N"], torch.arange
    if role[0] == "position":  # attends to itself, copies its position one-hot into S
        q[base + ar(N), s["POS"] + ar(N)] = s["big"]
        k[base + ar(N), s["POS"] + ar(N)] = 1
        v[base + ar(N), s["POS"] + ar(N)] = 1
        o[s["S"] + ar(N), base + ar(N)] = 1
        return
    _attend(q, k, base, role, s)
    src, dst, weight = _value_path(role, s)
    v[base + ar(V), src + ar(V)] = 1
    if role[0] == "switch-step":  # the value 2 P_1 - e(x_j) = e(x_{j-1}): the state before the key
        v[base + ar(V), src + ar(V)] = 2
        v[base + ar(V), s["T"] + ar(V)] = -1
    o[dst + ar(V), base + ar(V)] = weight


def _attend(q: torch.Tensor, k: torch.Tensor, base: int, role: tuple, s: dict) -> None:
    """The query and key weights of a head's role (`circuit_model`); zero for "count" and "uniform"."""
    V, N, big, T, POS, ar = s["V"], s["N"], s["big"], s["T"], s["POS"], torch.arange
    kind = role[0]
    if kind in ("prev", "prev-decoy", "prev-slot", "prev-copy", "prev-sink"):  # query i: position i - lag
        lag = role[1]
        scale = big / s["sharpness"]  # one unit of attention score
        share = role[2] if kind == "prev-sink" else 1.0
        q[base + ar(N - lag), (s["S"] if kind == "prev-slot" else POS) + ar(lag, N)] = big + math.log(share) * scale
        if kind == "prev-sink":  # the rest on position 0 (queries past the lag)
            q[base, POS + ar(lag + 1, N)] = big + math.log1p(-share) * scale
        k[base + ar(N), POS + ar(N)] = 1
    elif kind == "prev-mix":  # query i carries positions i - l for every l: the lags share its attention
        for lag in role[1]:
            q[base + ar(N - lag), POS + ar(lag, N)] = big
        k[base + ar(N), POS + ar(N)] = 1
    elif kind in ("self", "relay"):
        q[base + ar(N), POS + ar(N)] = big
        k[base + ar(N), POS + ar(N)] = 1
    elif kind == "same":  # query and key = current state
        q[base + ar(V), T + ar(V)] = big
        k[base + ar(V), T + ar(V)] = 1
    elif kind in ("switch", "switch-step"):  # query = current state, key = the key's own state (same) or the others
        q[base + ar(V), T + ar(V)] = big
        k[base: base + V, T: T + V] = torch.eye(V) if role[2] == "same" else 1 - torch.eye(V)
        q[base + V, T + ar(V)] = big  # a constant query pushing key 0 away (no state before it)
        k[base + V, POS] = -2.0
        if kind == "switch-step":  # ... and the step into the key, read from a mixed slot P_1 (x_j and x_{j-1})
            k[base: base + V, s["P"]: s["P"] + V] = role[3] * torch.eye(V)
    elif kind == "induction":
        order = role[1]
        for m in range(order):  # query slot m holds x_{i-m} (T for m = 0, else P_m); key slot m holds x_{j-1-m}
            src = T if m == 0 else s["P"] + (m - 1) * V
            q[base + m * V + ar(V), src + ar(V)] = big
            k[base + m * V + ar(V), s["P"] + m * V + ar(V)] = 1
        q[base + order * V, T + ar(V)] = big  # a constant query (the state one-hot sums to 1) ...
        k[base + order * V, POS + ar(order)] = -float(order) - 1  # ... pushes away keys j < order


def _value_path(role: tuple, s: dict) -> tuple[int, int, float]:
    """(the slot a head's value reads, the slot its output writes, its weight) for a role (`circuit_model`)."""
    slot = lambda lag: s["P"] + (lag - 1) * s["V"]  # noqa: E731  (P_lag: where lag-`lag` copies go)
    kind = role[0]
    if kind in ("prev", "prev-slot"):
        return s["T"], slot(role[3] if len(role) > 3 else role[1]), role[2]
    if kind == "prev-sink":
        return s["T"], slot(role[1]), role[3]
    if kind == "prev-mix":
        return s["T"], slot(1), role[2]
    if kind == "relay":
        return slot(role[1]), slot(role[2]), role[3]
    if kind == "prev-copy":
        return slot(role[2]), slot(role[3]), role[4]
    if kind == "induction":
        return s["T"], s["O"], role[2]
    if kind == "count":
        return s["T"], slot(role[2]) if len(role) > 2 else s["O"], role[1]
    if kind in ("switch", "switch-step"):
        return slot(1), s["O"], role[1]
    return s["T"], s["U"], 1.0  # decoys: copy the attended state into the unread slot


def counting_circuit(vocab: int, *, n_ctx: int = 48, n_layers: int = 1, n_heads: int = 1, split: int = 1,
                     logit_scale: Optional[float] = None, decoys: bool = False):
    """A uniform-attention state counter: logits = logit_scale x in-context state frequencies (in-context
    unigram), spread over `split` heads of the last layer; `decoys` adds a previous-token and a self head."""
    scale = float(vocab) if logit_scale is None else logit_scale
    last = n_layers - 1
    heads = {(last, h): ("count", scale / split) for h in range(split)}
    if decoys:
        heads[(0, n_heads - 1)] = ("prev-decoy", 1)
        if n_heads > 1 or n_layers > 1:
            heads[(0 if n_layers == 1 else 1, n_heads - 1 if n_layers > 1 else 0)] = ("self",)
    return circuit_model(vocab, heads, n_layers=n_layers, n_heads=n_heads, n_ctx=n_ctx)


def induction_circuit(vocab: int, *, order: int = 1, n_ctx: int = 128, per_role: int = 1, n_layers: int = 2,
                      logit_scale: float = 2.0, spread_layers: bool = False, decoys: bool = False):
    """An order-`order` induction circuit: previous-token heads at lags 1..order (each role spread over
    `per_role` heads, writing 1/per_role of the copy) feeding `per_role` induction heads of that order in the
    last layer (each writing logit_scale/per_role). The logits are logit_scale x the frequencies of what
    followed the current context: a linear read-out of counts, not the add-beta law itself; scale 2 is
    closest to it over 128 states (measured: fit ratio 0.2-0.3 of the gap to the in-context law of the
    next lower order for order 1, 0.4 for order 2). `spread_layers` puts the previous-token heads in
    different layers (needs n_layers >= 3); `decoys` fills a free head with a self-attention decoy."""
    heads, n_heads = {}, 0
    last = n_layers - 1
    slot = 0
    for lag in range(1, order + 1):
        for r in range(per_role):
            layer = (slot % last) if spread_layers else 0
            head = slot // last if spread_layers else slot
            heads[(layer, head)] = ("prev", lag, 1.0 / per_role)
            slot += 1
    n_heads = max(h for _, h in heads) + 1
    for r in range(per_role):
        heads[(last, r)] = ("induction", order, logit_scale / per_role)
    n_heads = max(n_heads, per_role)
    if decoys:
        n_heads += 1
        heads[(0, n_heads - 1)] = ("self",)
        heads[(last, n_heads - 1)] = ("uniform",)
    return circuit_model(vocab, heads, n_layers=n_layers, n_heads=n_heads, n_ctx=n_ctx, max_lag=max(order, 2))


def decoy_kernel_model(kernel, *, n_ctx: int = 48, n_layers: int = 1):
    """Logits = log P[x_t, .] from the embedding, plus decoy heads (previous-token, self, same-token) that
    write into dimensions nobody reads: the kernel in the weights, with attention that looks like a circuit."""
    kernel = torch.as_tensor(kernel, dtype=torch.float64)
    heads = {(0, 0): ("prev-decoy", 1), (0, 1): ("self",), (0, 2): ("same",)}
    if n_layers > 1:
        heads[(n_layers - 1, 0)] = ("same",)
        heads[(n_layers - 1, 1)] = ("prev-decoy", 2)
    return circuit_model(kernel.shape[-1], heads, n_layers=n_layers, n_heads=3, n_ctx=n_ctx, kernel=kernel)


def pair_kernel_model(kernel, *, n_ctx: int = 48):
    """An order-2 kernel in the weights: a previous-token head copies x_{t-1} into P_1, the MLP detects the pair
    (h_ab = relu(P_1[a] - sum_{c != b} T[c]) = [x_{t-1} = a, x_t = b]) and the unembedding reads
    log P[a, b, .] from h. One layer; the previous-token head is real and needed (its ablation costs)."""
    kernel = torch.as_tensor(kernel, dtype=torch.float64)
    V = kernel.shape[-1]
    log_kernel = kernel.clamp_min(1e-12).log().reshape(V * V, V)

    def mlp(s: dict, d_model: int) -> dict:
        fc_in, fc_out = torch.zeros(V * V, d_model), torch.zeros(d_model, V * V)
        unread = s["P"] + V  # the P_2.. slots (no head writes there) hold the pair one-hot h
        assert s["O"] - unread >= V * V
        for a in range(V):
            for b in range(V):
                unit = a * V + b
                fc_in[unit, s["P"] + a] = 1
                fc_in[unit, [s["T"] + c for c in range(V) if c != b]] = -1
                fc_out[unread + unit, unit] = 1
        head = torch.zeros(V, d_model)
        head[:, unread: unread + V * V] = log_kernel.T.float()
        return {"blocks.0.mlp.in.weight": fc_in, "blocks.0.mlp.out.weight": fc_out, "unembed.weight": head}

    return circuit_model(V, {(0, 0): ("prev", 1, 1.0)}, n_layers=1, n_heads=1, n_ctx=n_ctx, with_mlp=True,
                         max_lag=V + 1, extra=mlp)


def constant_model(law=None, *, vocab: int = 2, n_ctx: int = 48, n_layers: int = 1, n_heads: int = 1,
                   with_mlp: bool = False):
    """Logits = log(law) at every position (law=None: all-zero weights, the uniform law on `vocab` states)."""
    V = len(law) if law is not None else vocab
    bias = None if law is None else torch.as_tensor(law, dtype=torch.float64).log()
    return circuit_model(V, {}, n_layers=n_layers, n_heads=n_heads, n_ctx=n_ctx, bias=bias, with_mlp=with_mlp)


def skipping_circuit(vocab: int, *, order: int = 1, n_ctx: int = 48):
    """An order-`order` induction circuit that skips a layer: previous-token heads at lags 1..order in layer 0,
    decoys in layer 1 (a previous-token and a self-attending head writing into the unread slot), the induction
    head in layer 2. The intended edges run from layer 0 straight to layer 2."""
    heads = {(0, lag - 1): ("prev", lag, 1.0) for lag in range(1, order + 1)}
    heads[(1, 0)] = ("prev-decoy", 1)
    heads[(1, 1)] = ("self",)
    heads[(2, 0)] = ("induction", order, 2.0)
    return circuit_model(vocab, heads, n_layers=3, n_heads=max(2, order), n_ctx=n_ctx, max_lag=max(order, 2))


def intended_induction_edges(order: int, *, prev: dict, induction: tuple) -> set:
    """The edge names an order-`order` hand-built induction circuit needs: each previous-token head copies its
    state (embed -> prev.v), the induction heads' keys read every previous-token head (prev -> ind.k), their
    queries read the current state (embed -> ind.q) and, for order 2, the lag-1 copy (lag-1 heads -> ind.q),
    their values copy the key's state (embed -> ind.v) and they write the logits. `prev` maps lag -> head names."""
    out = set()
    for lag, names in prev.items():
        for p in names:
            out.add(f"embed->{p}.v")
            out |= {f"{p}->{i}.k" for i in induction}
            if lag < order:  # the query holds x_{i-m} for m < order, read from the lag-m copies
                out |= {f"{p}->{i}.q" for i in induction}
    for i in induction:
        out |= {f"embed->{i}.q", f"embed->{i}.v", f"{i}->logits"}
    return out


# ------------------------------------------------------------------------- circuits for the verdict's axes
def cancelling_circuit(vocab: int, *, n_ctx: int = 48, weight: float = 3.0):
    """The order-1 induction circuit plus two counting heads in layer 1 (L1H1, L1H2) whose outputs cancel
    exactly (+weight and -weight times the in-context state frequencies): each costs much when corrupted alone,
    nothing together."""
    heads = {(0, 0): ("prev", 1, 1.0), (1, 0): ("induction", 1, 2.0), (1, 1): ("count", weight),
             (1, 2): ("count", -weight)}
    return circuit_model(vocab, heads, n_layers=2, n_heads=3, n_ctx=n_ctx)


def position_circuit(vocab: int, *, n_ctx: int = 32):
    """An order-1 induction circuit whose previous-token head (L1H0) finds the previous position through a
    position head (L0H0: it copies each position's one-hot into S, a head output that depends on the positions
    alone); the induction head is L2H0. Under token corruptions L0H0's output never changes."""
    heads = {(0, 0): ("position",), (1, 0): ("prev-slot", 1, 1.0), (2, 0): ("induction", 1, 2.0)}
    return circuit_model(vocab, heads, n_layers=3, n_heads=1, n_ctx=n_ctx, position_slot=True)


def mixed_lag_circuit(vocab: int, *, n_ctx: int = 48, lags: tuple = (1, 2)):
    """One layer-0 head attending equally to lags 1 and 2 (one previous-token role spread over two lags) feeding
    an order-1 induction head's keys: one lag channel, whatever the data's order."""
    heads = {(0, 0): ("prev-mix", tuple(lags), 1.0), (1, 0): ("induction", 1, 2.0)}
    return circuit_model(vocab, heads, n_layers=2, n_heads=1, n_ctx=n_ctx, max_lag=max(lags))


def position_edges(prev: dict) -> set:
    """The position edges of previous-token heads (`prev`: lag -> head names): their queries and keys read the
    position embedding."""
    return {f"pos->{p}.{c}" for names in prev.values() for p in names for c in "qk"}


# ------------------------------------------------------------------ what edges carry (roles by content)
def sink_induction_circuit(vocab: int, *, share: float = 0.15, n_ctx: int = 64, logit_scale: float = 2.0):
    """An order-1 induction circuit whose previous-token head L0H0 gives i - 1 only `share` of its attention and
    parks the rest on position 0 (an attention sink), as trained heads do; it writes its mix at weight 1 / share, so
    the induction head L1H0 matches x_{j-1} at the usual sharpness (the sink's part, x_0, is the same for every
    key)."""
    heads = {(0, 0): ("prev-sink", 1, share, 1.0 / share), (1, 0): ("induction", 1, logit_scale)}
    return circuit_model(vocab, heads, n_layers=2, n_heads=1, n_ctx=n_ctx)


def relay_circuit(vocab: int, *, n_ctx: int = 64, logit_scale: float = 2.0):
    """An order-1 induction circuit whose previous state reaches the keys through a relay: the previous-token head
    L0H0 writes x_{j-1} into a slot the induction head does not read (P_2), L1H0 attends to itself and copies it
    into the slot it reads (P_1), the induction head is L2H0. L1H0's pattern is no previous-token pattern."""
    heads = {(0, 0): ("prev", 1, 1.0, 2), (1, 0): ("relay", 2, 1, 1.0), (2, 0): ("induction", 1, logit_scale)}
    return circuit_model(vocab, heads, n_layers=3, n_heads=1, n_ctx=n_ctx)


def sink_decoy_circuit(vocab: int, *, n_ctx: int = 64, share: float = 1e-3):
    """A decoy for the attention scores: L0H0 parks all but `share` of its attention on position 0 and puts the
    rest on i - 1 (beyond the sink it is a perfect previous-token head), writing into the slot an induction-shaped
    head L1H0 reads with its keys; what it writes is x_0 up to `share`, so no previous state reaches the keys."""
    heads = {(0, 0): ("prev-sink", 1, share, 1.0), (1, 0): ("induction", 1, 2.0)}
    return circuit_model(vocab, heads, n_layers=2, n_heads=1, n_ctx=n_ctx)


def copy_decoy_circuit(vocab: int, *, n_ctx: int = 64):
    """A head whose pattern is a perfect previous-token pattern but whose value path writes something else: a
    counting head L0H0 writes the state frequencies into P_2, L1H0 attends from i to i - 1 and copies them (not the
    state) into P_1, which an induction-shaped head L2H0 reads with its keys."""
    heads = {(0, 0): ("count", 1.0, 2), (1, 0): ("prev-copy", 1, 2, 1, 1.0), (2, 0): ("induction", 1, 2.0)}
    return circuit_model(vocab, heads, n_layers=3, n_heads=1, n_ctx=n_ctx)


def switch_counting_circuit(*, n_ctx: int = 64, attend: str = "same", logit_scale: float = 2.0):
    """Switch counting on two states, no induction head: a previous-token head L0H0 writes x_{j-1} into P_1; L1H0
    queries the current state and keys each position by its own state (`attend` "same": the positions holding the
    current state a; "other": the other state's) and reads the state before each. With "same" its output is (a -> a,
    b -> a transitions) / n_a, and since n_ba = n_ab + [x_0 = b] on two states this is the in-context bigram row of a
    (times `logit_scale`): the bigram law from switch counts. With "other" it reads (a -> b, b -> b) / n_b, the
    switch rate of the other state, which needs the counts (and a division) to give the law."""
    heads = {(0, 0): ("prev", 1, 1.0), (1, 0): ("switch", logit_scale, attend)}
    return circuit_model(2, heads, n_layers=2, n_heads=1, n_ctx=n_ctx)


def chain_hmm(kernel):
    """A first-order chain as an HMM that emits the state it moves to (hidden state = the last token):
    T[x, i, j] = K[i, x] [j = x], so the belief after x_t is onehot(x_t) and the Bayes prediction K[x_t]."""
    k = torch.as_tensor(kernel, dtype=torch.float64)
    v = k.shape[0]
    t = torch.zeros(v, v, v, dtype=torch.float64)
    for x in range(v):
        t[x, :, x] = k[:, x]
    return HiddenMarkov(t)


def step_keyed_circuit(*, n_ctx: int = 64, logit_scale: float = 2.0, step_weight: float = -0.04):
    """Switch counting keyed by the step into each key, as the trained two-layer binary models do it: L0H0 attends
    equally to itself and the position before (a mixed head) and writes (e(x_j) + e(x_{j-1})) / 2 into P_1, which
    carries the step (x_{j-1}, x_j) and no state alone; L1H0 queries the current state a, keys each position by its
    own state (the embedding) and by P_1 at `step_weight` (a position of a entered by a switch, b -> a, scores
    -step_weight x sharpness / 2 units above one entered from a, a -> a), and reads 2 P_1 - e(x_j) = e(x_{j-1}):
    its output is the (weighted) share of a's positions entered from each state, (n_aa, n_ba) / n_a, and since
    n_ba = n_ab +- 1 on two states this is the bigram row of a, the switches slightly over-weighted. Its keys as a
    whole carry the step (the state with the switch into it), not the lagged state alone: no induction head."""
    heads = {(0, 0): ("prev-mix", (0, 1), 1.0), (1, 0): ("switch-step", logit_scale, "same", step_weight)}
    return circuit_model(2, heads, n_layers=2, n_heads=1, n_ctx=n_ctx)


@torch.no_grad()
def mixed_induction_circuit(*, n_ctx: int = 64, logit_scale: float = 2.0):
    """An order-1 induction circuit on two states whose previous-token head is mixed, as `step_keyed_circuit`'s:
    L0H0 attends equally to itself and the position before and writes (e(x_j) + e(x_{j-1})) / 2 into P_1 (the step
    into j, no lagged state alone); the induction head L1H0 keys by twice P_1 less the key's own state (the
    embedding), 2 P_1 - e(x_j) = e(x_{j-1}): its keys as a whole match on the lagged state, though its K-edge
    carries the step."""
    heads = {(0, 0): ("prev-mix", (0, 1), 1.0), (1, 0): ("induction", 1, logit_scale)}
    model = circuit_model(2, heads, n_layers=2, n_heads=1, n_ctx=n_ctx)
    model.blocks[1].attn.W_K[0, torch.arange(2), torch.arange(2)] -= 1.0  # key slot a: 2 P_1 - e(x_j) (T = 0)
    model.blocks[1].attn.W_K[0, 2 + torch.arange(2), torch.arange(2)] *= 2.0
    return model


@torch.no_grad()
def belief_model(kernel, *, d_model: int = 12, n_ctx: int = 32, seed: int = 0, echo: float = 0.0):
    """One layer whose residual stream holds the belief of a chain written as an HMM (hidden state = the last
    token: the belief after x_t is onehot(x_t)) in its first V dimensions, nuisance position values (N(0, 1),
    seeded) in the others, and attention that writes nothing: logits = log P[x_t, .] = the belief times log P, a
    known linear function of the embedded belief (the Bayes prediction itself). With `echo` > 0 a second copy of
    the belief, `echo` times as large, sits in dimensions V..2V-1, which the unembedding does not read."""
    kernel = torch.as_tensor(kernel, dtype=torch.float64)
    V = kernel.shape[-1]
    copies = 2 if echo else 1
    assert d_model > copies * V
    cfg = ModelConfig(n_layers=1, n_heads=1, d_model=d_model, d_head=2, attn_only=True, normalization=None,
                      tie_weights=False, unembed_bias=True, d_vocab=V, n_ctx=n_ctx)
    emb = torch.zeros(V, d_model)
    emb[torch.arange(V), torch.arange(V)] = 1
    if echo:
        emb[torch.arange(V), V + torch.arange(V)] = echo
    pos = torch.zeros(n_ctx, d_model)
    pos[:, copies * V:] = torch.randn(n_ctx, d_model - copies * V, generator=torch.Generator().manual_seed(seed))
    unembed = torch.zeros(V, d_model)
    unembed[:, :V] = kernel.clamp_min(1e-12).log().T.float()
    return hand_set(cfg, {"embed.weight": emb, "pos_embed.weight": pos, "unembed.weight": unembed})
