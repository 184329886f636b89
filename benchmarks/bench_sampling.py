"""Sampling speed: the vectorised scan sampler against a loop that draws one position at a time.

The reference is the obvious vectorised-over-batch loop (one Python step per position for the whole batch),
measured in the same process on the same shapes. Prints seconds per batch and the speed ratio.

    python benchmarks/bench_sampling.py [--batch 16] [--seq-len 1024] [--repeats 50] [--device cpu] [--threads N]
"""

import argparse
import time

import torch

from markov_interp.sources import BinaryChain, RandomMarkov


def loop_sample(kernel: torch.Tensor, batch: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """The reference: x_t drawn from kernel[x_{t-1}] one position at a time, vectorised over the batch."""
    device = generator.device
    pi1 = kernel[0, 1] / (kernel[0, 1] + kernel[1, 0])
    x = torch.empty(batch, seq_len, dtype=torch.long, device=device)
    x[:, 0] = (torch.rand(batch, generator=generator, device=device, dtype=torch.float64) < pi1).long()
    p_one = kernel[:, 1].to(device)
    for t in range(1, seq_len):
        u = torch.rand(batch, generator=generator, device=device, dtype=torch.float64)
        x[:, t] = (u < p_one[x[:, t - 1]]).long()
    return x


def timed(fn, repeats: int, device: str) -> float:
    fn()  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    g = torch.Generator(device=args.device).manual_seed(0)
    chain = BinaryChain(0.5, 0.8)
    reference = timed(lambda: loop_sample(chain.kernel, args.batch, args.seq_len, g), args.repeats, args.device)
    ours = timed(lambda: chain.sample(args.batch, args.seq_len, g), args.repeats, args.device)
    random3 = RandomMarkov(3)
    rand_time = timed(lambda: random3.sample(args.batch, args.seq_len, g), args.repeats, args.device)
    pool3 = RandomMarkov(3, pool_size=1024)
    pool_time = timed(lambda: pool3.sample(args.batch, args.seq_len, g), args.repeats, args.device)
    print(f"device {args.device}, threads {torch.get_num_threads()}, batch {args.batch} x seq_len {args.seq_len}")
    print(f"  per-position loop (reference) : {reference * 1e3:8.3f} ms / batch")
    print(f"  BinaryChain.sample            : {ours * 1e3:8.3f} ms / batch   speed-up x{reference / ours:.1f}")
    print(f"  RandomMarkov(3).sample        : {rand_time * 1e3:8.3f} ms / batch   speed-up x{reference / rand_time:.1f}")
    print(f"  RandomMarkov(3, pool_size=1024): {pool_time * 1e3:7.3f} ms / batch   speed-up x{reference / pool_time:.1f}")


if __name__ == "__main__":
    main()
