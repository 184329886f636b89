"""Does `discover_circuit(method="attribution+verify")` keep the edges `method="exact"` keeps, on the trained models
of docs/circuits.md? Prints one line per model and the count that agree.

For each run folder <runs>/<setting>/seed<k> (trained by docs/circuits/train_models.py) and each step of `--steps`
(the snapshot `measure.snapshot` loads), both methods run on the same batch with the same options: the first
`--circuit-sequences` (32) sequences of the probe batch docs/circuits.md's re-run used (`--n-sequences` 512 x the
training length, seed 1). `--only-in FILE.jsonl` restricts the models to the (setting, seed, step) of a results
file (docs/circuits/rerun-axes.jsonl: the 69-model re-run).

    nice python docs/circuits/verify_agreement.py --runs /path/to/runs --only-in docs/circuits/rerun-axes.jsonl
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import snapshot  # noqa: E402  (the one way docs/circuits loads a snapshot)

from markov_interp.probes import discover_circuit, probe_length, sample_batch  # noqa: E402


def compare(model, source, args: argparse.Namespace) -> dict:
    """Both methods on one batch: their kept sets, whether they agree, edges measured and seconds."""
    batch = sample_batch(source, n_sequences=args.n_sequences, seq_len=probe_length(model), seed=1)
    out = {}
    for method in ("exact", "attribution+verify"):
        start = time.perf_counter()
        graph = discover_circuit(model, source, batch=batch, n_sequences=args.circuit_sequences, seed=1,
                                 method=method, progress=False)
        out[method] = {"kept": sorted(graph.kept_names), "n_verified": graph.n_verified, "n_edges": len(graph.edges),
                       "seconds": time.perf_counter() - start}
    out["agrees"] = out["exact"]["kept"] == out["attribution+verify"]["kept"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", required=True, help="the folder train_models.py wrote")
    parser.add_argument("--steps", type=int, nargs="+", default=[186, 1500])
    parser.add_argument("--n-sequences", type=int, default=512)
    parser.add_argument("--circuit-sequences", type=int, default=32)
    parser.add_argument("--only-in", default=None, help="a results .jsonl: only its (setting, seed, step)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    wanted = None
    if args.only_in:
        rows = map(json.loads, Path(args.only_in).read_text().splitlines())
        wanted = {(r["setting"], r["seed"], r["step"]) for r in rows}
    agree, total = 0, 0
    for run_dir in sorted(Path(args.runs).glob("*/seed*")):
        for step in args.steps:
            key = (run_dir.parent.name, int(run_dir.name.removeprefix("seed")), step)
            if wanted is not None and key not in wanted:
                continue
            model, config = snapshot(run_dir, step)
            if model is None:
                continue
            row = compare(model, config.source.build(), args)
            total, agree = total + 1, agree + row["agrees"]
            exact, fast = row["exact"], row["attribution+verify"]
            print(f"{key[0]} seed {key[1]} step {step}: {'agree' if row['agrees'] else 'DIFFER'}; exact "
                  f"{len(exact['kept'])} kept of {exact['n_edges']} ({exact['seconds']:.1f} s), attribution+verify "
                  f"{len(fast['kept'])} kept, {fast['n_verified']} measured ({fast['seconds']:.1f} s)"
                  + ("" if row["agrees"] else f"; only exact: {sorted(set(exact['kept']) - set(fast['kept']))}, "
                     f"only attribution+verify: {sorted(set(fast['kept']) - set(exact['kept']))}"), flush=True)
    print(f"attribution+verify keeps the exact set on {agree} of {total} models")


if __name__ == "__main__":
    main()
