"""Cost of a clamped attention pattern in stacked training: one training step (forward, backward, optimiser) of a
stack whose layer-0 pattern is clamped (`clamps.clamp_hooks`: the explicit attention path, scores -> causal
softmax -> hook -> pattern @ v) against the same step with the fused attention, in this process, same shapes.

    python benchmarks/bench_intervene.py                                   # CPU, one thread, small shapes
    python benchmarks/bench_intervene.py --device cuda --members 64 --seq-len 1024

Prints seconds per step of both and the ratio clamped / free. A clamp that replaces every head by a constant
(here previous_token) forms no scores or softmax (`models.stack.pattern_input`): the pattern is a zero-stride view and
z = pattern @ v. A per-head clamp (`--heads 0`) forms the full [member * batch, head, seq, seq] pattern, whose
cost grows with seq^2 where the fused kernel's memory does not.

Measured (CPU, one thread, shared 2-core machine, 8 members x batch 16, attn-only 2 layers, 10 steps): seq 256
previous_token on all heads 0.72x the free step's time; seq 128: all heads 0.70x, one head (`--heads 0`,
the full pattern formed) 1.55x.
"""

import argparse
import time

import torch

from markov_interp import clamps
from markov_interp.models import stack as stacked
from markov_interp.models.optim import StackedOptimizer
from markov_interp.models import preset


def step_time(stack, optimizer, tokens, hooks, steps: int, device: str) -> float:
    lr = torch.full((stack.n_members,), 1e-3, dtype=torch.float64, device=tokens.device)
    wd = torch.zeros_like(lr)
    alive = torch.ones(stack.n_members, dtype=torch.bool, device=tokens.device)

    def one() -> None:
        logits = stacked.stacked_forward(stack, tokens[..., :-1], hooks)
        optimizer.zero_grad()
        stacked.stacked_loss(logits, tokens[..., 1:]).sum().backward()
        for param in stack.parameters():
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        optimizer.step(lr, wd, alive)

    one()  # warm-up
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        one()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--heads", default=None, help="clamp only these heads, e.g. 0 (forms the full pattern)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = preset("attn-only-2layer", n_ctx=args.seq_len + 1)
    stack = stacked.build_stack([cfg] * args.members, list(range(args.members)), device=args.device)
    optimizer = StackedOptimizer(stack, kind="adamw")
    tokens = torch.randint(0, cfg.d_vocab, (args.members, args.batch, args.seq_len + 1),
                           generator=torch.Generator().manual_seed(0)).to(args.device)
    heads = f"[{args.heads}]" if args.heads is not None else ""
    items = clamps.parse_interventions([f"blocks.0.attn.hook_pattern{heads}=previous_token"])
    hooks = clamps.clamp_hooks(items, 0, state=clamps.ClampState(), update=True, member_axis=True)
    free = step_time(stack, optimizer, tokens, {}, args.steps, args.device)
    clamped = step_time(stack, optimizer, tokens, hooks, args.steps, args.device)
    free_again = step_time(stack, optimizer, tokens, {}, args.steps, args.device)  # drift check
    print(f"{args.device}, {args.members} members x batch {args.batch} x seq {args.seq_len}, attn-only 2 layers")
    print(f"free step    {1e3 * free:8.2f} ms (again: {1e3 * free_again:.2f} ms)")
    print(f"clamped step {1e3 * clamped:8.2f} ms")
    print(f"ratio clamped / free: {clamped / ((free + free_again) / 2):.2f}")


if __name__ == "__main__":
    main()
