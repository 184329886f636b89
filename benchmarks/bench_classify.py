"""`classify_mechanism` and `discover_circuit` wall time, against one forward (and one forward + backward) pass of
the same batch, measured in the same process.

Two tables:

1. **classify**: the README's models (untrained weights: the probes do the same work whatever the weights; the
   kept-edge rule may try a few more circuit-only runs on a model whose edges all matter a little): the paper's
   one-layer model on the binary chain at lengths 128 / 256 / 1024 and the two-layer attention-only model on
   random 3-state kernels at 32 and 128, `--n-sequences` (64) probe sequences. The issue's bar: the two-layer
   model at length 128 under 2 s on one thread. Each row also times `classify_mechanism(..., content=False)` in
   the same process: the ratio is the cost of the edge content (`probes.edge_content`); `--trained RUN ...` adds
   rows for trained run folders (whose kept edges the content measures: random weights keep few).
2. **discovery**: `discover_circuit` on random-init attention-only models on RandomMarkov(3) (the issue's table:
   2 x 2 d16, 4 x 4 d32, 6 x 4 d64 at seq 64; 2 x 2 at seq 128; 12 x 12 d256 (d_head 21) at seq 128, GPT-2-small's layers and heads)
   with its default 16 sequences, by each method ("exact" where it fits the `--exact-limit` seconds, else
   skipped; "attribution+verify"; "auto", the default); the ratio to one forward + backward pass of the same batch
   is the number to hold as the machine changes. The bars: 6 x 4 at seq 64 under 5 s, 12 x 12 at seq 128 under
   60 s, 2 x 2 at seq 128 under 1 s (default method, one thread). Whether attribution+verify keeps exactly the
   edges exact patching keeps is printed where both ran.

    python benchmarks/bench_classify.py [--repeats 3] [--threads 1] [--only classify|discovery] [--cases 12x12/128]

On a GPU (`--device cuda`) the models live there, the timings synchronise, and `--compare-cpu` also runs each
discovery on a CPU copy of the model and says whether both keep the same edges.
"""

import argparse
import os
import statistics
import time

import torch

from markov_interp import models
from markov_interp.sources import BinaryChain, RandomMarkov
from markov_interp.probes import classify_mechanism, discover_circuit, sample_batch
from markov_interp.probes.paths import graph_edges

CASES = (
    ("paper-1layer, binary p=0.2 q=0.3", "paper-1layer", {}, BinaryChain(0.2, 0.3), 128),
    ("paper-1layer, binary p=0.2 q=0.3", "paper-1layer", {}, BinaryChain(0.2, 0.3), 256),
    ("paper-1layer, binary p=0.2 q=0.3", "paper-1layer", {}, BinaryChain(0.2, 0.3), 1024),
    ("attn-only-2layer, RandomMarkov(3)", "attn-only-2layer", dict(d_vocab=3, n_ctx=32), RandomMarkov(3), 32),
    ("attn-only-2layer, RandomMarkov(3)", "attn-only-2layer", dict(d_vocab=3), RandomMarkov(3), 128),
)
DISCOVERY = (  # (layers, heads, d_model, seq_len)
    (2, 2, 16, 64), (4, 4, 32, 64), (6, 4, 64, 64), (2, 2, 16, 128), (12, 12, 256, 128),
)


DEVICE = ["cpu"]  # --device


def _sync() -> None:
    if DEVICE[0].startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn):
    """(seconds, result) of one call, the device's queue drained on both sides."""
    _sync()
    start = time.perf_counter()
    result = fn()
    _sync()
    return time.perf_counter() - start, result


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    return statistics.median(timed(fn)[0] for _ in range(repeats))


def forward_backward(model, tokens) -> None:
    logits = model(tokens)
    torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)).backward()
    model.zero_grad(set_to_none=True)


def classify_table(args: argparse.Namespace) -> None:
    print(f"classify_mechanism: {args.n_sequences} probe sequences, median of {args.repeats}")
    for label, name, overrides, source, seq_len in CASES:
        if seq_len > args.max_length:
            continue
        model = models.build(models.preset(name, **overrides), seed=0, device=DEVICE[0])
        batch = sample_batch(source, n_sequences=args.n_sequences, seq_len=seq_len, seed=0)
        with torch.no_grad():
            forward = median_time(lambda: model(batch.tokens.to(DEVICE[0])), args.repeats)
        full = median_time(lambda: classify_mechanism(model, source, batch=batch, progress=False), args.repeats)
        bare = median_time(lambda: classify_mechanism(model, source, batch=batch, progress=False, content=False),
                           args.repeats)
        graph = median_time(lambda: discover_circuit(model, source, batch=batch, progress=False), args.repeats)
        print(f"{label:36s} length {seq_len:4d}: classify {full:6.3f} s = {full / forward:6.1f} forward passes "
              f"({forward * 1e3:.1f} ms each); circuit discovery {graph:6.3f} s ({graph / full:.0%}); without the "
              f"edge content {bare:6.3f} s (content: {full / bare:.2f}x)", flush=True)
    for path in args.trained:
        trained_row(path, args)


def trained_row(path: str, args: argparse.Namespace) -> None:
    """A trained run folder (`--trained`): classify_mechanism with and without the edge content, and one forward."""
    from markov_interp.runs import load_model, read_config

    model, source = load_model(path, device=DEVICE[0]), read_config(path).source.build()
    batch = sample_batch(source, n_sequences=args.n_sequences, seq_len=int(model.cfg.n_ctx), seed=0)
    with torch.no_grad():
        forward = median_time(lambda: model(batch.tokens.to(DEVICE[0])), args.repeats)
    full = median_time(lambda: classify_mechanism(model, source, batch=batch, progress=False), args.repeats)
    bare = median_time(lambda: classify_mechanism(model, source, batch=batch, progress=False, content=False),
                       args.repeats)
    print(f"{path} (trained, length {model.cfg.n_ctx}): classify {full:6.3f} s = {full / forward:6.1f} forward passes; "
          f"without the edge content {bare:6.3f} s (content: {full / bare:.2f}x)", flush=True)


def discovery_table(args: argparse.Namespace) -> None:
    print(f"discover_circuit: random-init attention-only models, RandomMarkov(3), 16 sequences, median of "
          f"{args.repeats} (one run for calls over 20 s)")
    source = RandomMarkov(3)
    for layers, heads, d_model, seq in DISCOVERY:
        if args.cases and f"{layers}x{heads}/{seq}" not in args.cases:
            continue
        cfg = models.preset("attn-only-2layer", n_layers=layers, n_heads=heads, d_model=d_model,
                            d_head=d_model // heads, d_vocab=3, n_ctx=seq)
        model = models.build(cfg, seed=0, device=DEVICE[0])  # the same weights on any device
        batch = sample_batch(source, n_sequences=64, seq_len=seq, seed=0)
        tokens = batch.tokens[:16].to(DEVICE[0])
        fb = median_time(lambda: forward_backward(model, tokens), args.repeats)
        n_edges = len(graph_edges(model))
        row = f"{layers:2d} x {heads:2d} d{d_model:<3d} seq {seq:3d}, {n_edges:6d} edges: fwd+bwd {fb * 1e3:7.1f} ms;"
        kept = {}
        for method in ("exact", "attribution+verify", "auto"):
            if method == "exact" and n_edges > args.exact_edges:
                row += " exact skipped;"
                continue
            call = lambda m=method: discover_circuit(model, source, batch=batch, method=m, progress=False)  # noqa: E731
            first, graph = timed(call)
            seconds = first if first > 20 else median_time(call, args.repeats)
            kept[method] = set(graph.kept_names)
            row += (f" {method} {seconds:7.2f} s = {seconds / fb:7.1f} fwd+bwd ({graph.n_verified} measured, "
                    f"{len(graph.kept)} kept);")
        if "exact" in kept:
            row += f" verify keeps the exact set: {kept['attribution+verify'] == kept['exact']};"
        if args.compare_cpu and DEVICE[0] != "cpu":
            on_cpu = set(discover_circuit(models.build(cfg, seed=0), source, batch=batch, progress=False).kept_names)
            row += f" the CPU keeps the same edges: {on_cpu == kept['auto']}" + (
                "" if on_cpu == kept["auto"] else f" (only on {DEVICE[0]}: {sorted(kept['auto'] - on_cpu)}, "
                f"only on the CPU: {sorted(on_cpu - kept['auto'])})")
        print(row, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--n-sequences", type=int, default=64)
    parser.add_argument("--exact-edges", type=int, default=2000, help="skip the exact method above this many edges")
    parser.add_argument("--only", choices=("classify", "discovery"), default=None)
    parser.add_argument("--cases", nargs="*", default=None,
                        help="discovery: only these cases, as LAYERSxHEADS/SEQ (e.g. 12x12/128)")
    parser.add_argument("--max-length", type=int, default=1024, help="classify: skip longer probe lengths")
    parser.add_argument("--trained", nargs="*", default=[], help="classify: run folders of trained models to time too")
    parser.add_argument("--device", default="cpu", help="where the models run (cuda: timings synchronise)")
    parser.add_argument("--compare-cpu", action="store_true",
                        help="discovery on a GPU: also run it on a CPU copy and compare the kept edges")
    args = parser.parse_args()
    DEVICE[0] = args.device
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"torch {torch.__version__}, {where}, {torch.get_num_threads()} thread(s), {os.cpu_count()} CPUs, load "
          f"average {load:.1f} at the start")
    if args.only in (None, "classify"):
        classify_table(args)
    if args.only in (None, "discovery"):
        discovery_table(args)
    print(f"load average {os.getloadavg()[0]:.1f} at the end" if hasattr(os, "getloadavg") else "")


if __name__ == "__main__":
    main()
