"""What the edges of trained three-layer models carry, and what `classify_mechanism` names them (docs/circuits.md,
"Trained models: what their edges carry").

Three models of the phase diagram's standard recipe (`experiments/phases.py` STANDARD: attention-only with
LayerNorm, 3 layers x 1 head, d_model 16, d_head 8, sequences of 64, batch 32, lr 1e-2 constant, 3000 steps) on
random kernels of order 1: two seeds on two states (`binary-s0`, `binary-s1`: the cell where the phase diagram
labelled 5 of 6 seeds `other`) and one on three (`ternary-s0`). Their weights and configs are committed beside
`results.json` (docs/circuits/edge-content/<name>/), so the numbers can be re-measured without training:

    python docs/circuits/edge_content.py --remeasure            # classify the committed weights (and the
                                                                # hand-built circuits) again
    python docs/circuits/edge_content.py --train /tmp/runs      # train them again (about 35 s per seed, one core)

Each model is classified on the default probe batch (64 sequences of 64 states, seed 0; path patching on the first
16; edge content with donors from 512 sequences) and `results.json` holds per model the label, the circuit axis,
the kept circuit's faithfulness, the graded gains and, for every kept edge out of a head, what it carries (the
explained fraction of every variable tried; and again with donors from the 64 probe sequences alone). The
hand-built circuits of tests/handbuilt.py are classified too, with and without the edge content.
"""

import argparse
import json
import shutil
import time
from pathlib import Path

import torch

from markov_interp._io import atomic_write

HERE = Path(__file__).parent / "edge-content"
MODELS = {"binary-s0": (2, 0), "binary-s1": (2, 1), "ternary-s0": (3, 0)}  # name: (states, seed)


def run_config(vocab: int, seed: int):
    """The phase diagram's standard recipe for one L3 x1 order-1 seed on `vocab` states."""
    from markov_interp.sources import SourceConfig
    from markov_interp.models import preset
    from markov_interp.training import RunConfig, TrainConfig

    model = preset("attn-only-2layer", n_layers=3, n_heads=1, d_model=16, d_head=8, n_ctx=64, normalization="LN",
                   d_vocab=vocab)
    train = TrainConfig(steps=3000, seq_len=64, batch_size=32, lr=1e-2, schedule="constant", eval_every=50,
                        eval_batches=4, log_every=50, n_checkpoints=0, seed=seed, device="cpu")
    return RunConfig(source=SourceConfig(kind="random", vocab=vocab, alpha=1.0, order=1), model=model, train=train)


def train(out: Path) -> None:
    """Train the three models into `out/<name>` and copy their weights and configs next to this script."""
    from markov_interp.training import train as train_run

    for name, (vocab, seed) in MODELS.items():
        start = time.perf_counter()
        train_run(run_config(vocab, seed), out / name)
        print(f"{name}: trained in {time.perf_counter() - start:.1f} s", flush=True)
        (HERE / name).mkdir(parents=True, exist_ok=True)
        for file in ("model.safetensors", "config.json"):
            shutil.copyfile(out / name / file, HERE / name / file)


def measure(name: str) -> dict:
    """The classifier's verdict on one committed model, with what each kept edge carries."""
    from markov_interp import probes
    from markov_interp.probes._common import json_safe
    from markov_interp.runs import load_model, read_config

    model, source = load_model(HERE / name), read_config(HERE / name).source.build()
    start = time.perf_counter()
    report = probes.classify_mechanism(model, source, seed=0, progress=False)
    seconds = time.perf_counter() - start
    # the same edges with donors from the 64 probe sequences alone (no more of the source): what the pool does
    batch = probes.sample_batch(source, n_sequences=64, seq_len=int(model.cfg.n_ctx), seed=0)
    small = probes.edge_content(model, batch, report.graph.kept, seed=0)
    edges = {e.edge: {"carries": e.carries, "kind": e.kind, "effect": e.effect,
                      "explained": {k: round(v, 4) for k, v in e.explained.items()},
                      "interval": {k: [round(x, 4) for x in v] for k, v in e.interval.items()},
                      "mismatch": {k: round(v, 3) for k, v in e.mismatch.items()},
                      "carries_with_64_donors": small[e.edge].carries,
                      "explained_with_64_donors": {k: round(v, 4) for k, v in small[e.edge].explained.items()}}
             for e in report.content.edges if e.measured}
    return json_safe({
        "label": report.label, "confident": report.confident, "circuit": report.circuit.kind,
        "description": report.circuit.describe(), "faithfulness": report.faithfulness,
        "gains": report.gains.to_dict(),
        "law": report.law.describe(), "kept": list(report.graph.kept_names), "carried": report.induction.carried,
        "edges": edges, "why": report.reasons[0], "seconds": round(seconds, 1),
        "sink": report.attention.sink.tolist(), "previous_token_excess": report.attention.lag_excess(1).tolist(),
        "same_token_excess": report.attention.excess("same_token").tolist(),
        "log_odds_fit": log_odds_fit(model, source) if source.vocab == 2 else None,
    })


def log_odds_fit(model, source) -> dict:
    """On two states: the share of the variance of the model's log-odds (state 1 against 0, positions 8..63 of 512
    sequences) that a least-squares fit explains from (current state, state-1 frequency, switch rate and their
    products with the state), and from the in-context bigram law's log-odds (add-1/2) alone."""
    from markov_interp import probes

    tokens = probes.sample_batch(source, n_sequences=512, seq_len=64, seed=3).tokens
    with torch.no_grad():
        logits = model(tokens).double()
    y = (logits[..., 1] - logits[..., 0])[:, 8:].reshape(-1)
    x, n = tokens.double(), torch.arange(1, 65, dtype=torch.float64)
    freq = x.cumsum(1) / n
    switch = torch.cat([torch.zeros(512, 1), (tokens[:, 1:] != tokens[:, :-1]).double().cumsum(1)], 1) / n
    moves = torch.nn.functional.one_hot(tokens[:, :-1] * 2 + tokens[:, 1:], 4).double().cumsum(1)
    moves = torch.cat([torch.zeros(512, 1, 4, dtype=torch.float64), moves], 1)
    p0, p1 = (moves[..., 1] + .5) / (moves[..., 0] + moves[..., 1] + 1), (moves[..., 3] + .5) / (
        moves[..., 2] + moves[..., 3] + 1)
    law = torch.where(tokens == 0, p0, p1)

    def explained(*features) -> float:
        design = torch.stack([f[:, 8:].reshape(-1) for f in features] + [torch.ones_like(y)], 1)
        residual = y - design @ (torch.linalg.pinv(design) @ y)
        return round(1 - float(residual.pow(2).sum() / (y - y.mean()).pow(2).sum()), 4)

    return {"state_frequency_switch_rate": explained(x, freq, switch, x * freq, x * switch),
            "state_frequency": explained(x, freq, x * freq), "bigram_law": explained((law / (1 - law)).log())}


def handbuilt() -> dict:
    """The hand-built circuits of tests/handbuilt.py that the roles by content are tested on, classified as the
    trained models are (RandomMarkov of their states, the default probe batch at length 64, seed 0)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parents[2] / "tests"))
    import handbuilt as hb
    from markov_interp import probes
    from markov_interp.sources import RandomMarkov

    cases = {
        "induction, 3 states": (hb.induction_circuit(3, n_ctx=64), 3),
        "previous-token head with a sink (0.15 on i - 1), 3 states": (hb.sink_induction_circuit(3), 3),
        "the same, 2 states": (hb.sink_induction_circuit(2), 2),
        "relayed previous state (3 layers)": (hb.relay_circuit(3), 3),
        "sink-only decoy (0.001 on i - 1)": (hb.sink_decoy_circuit(3), 3),
        "previous-token pattern copying counts": (hb.copy_decoy_circuit(3), 3),
        "switch counting, current state's positions": (hb.switch_counting_circuit(), 2),
        "switch counting, the other state's positions": (hb.switch_counting_circuit(attend="other"), 2),
    }
    out = {}
    for name, (model, vocab) in cases.items():
        for content in (False, True):
            report = probes.classify_mechanism(model, RandomMarkov(vocab), seq_len=64, seed=0, progress=False,
                                               content=content)
            key = "label" if content else "label_by_attention"
            out.setdefault(name, {})[key] = report.label + ("" if report.confident else ", not confident")
            if content:
                out[name].update(circuit=report.circuit.kind, faithfulness=round(report.faithfulness, 3),
                                 carried={e.edge: e.carries for e in report.content.edges if e.measured},
                                 explained={e.edge: round(e.explained[e.carries], 3) for e in report.content.edges
                                            if e.measured and e.carries})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=Path, default=None, help="train the models again into this folder first")
    parser.add_argument("--remeasure", action="store_true", help="classify the committed weights (the default)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.train is not None:
        train(args.train)
    results = {name: measure(name) for name in MODELS}
    results["handbuilt"] = handbuilt()
    for name, r in results["handbuilt"].items():
        print(f"{name}: {r['label']} (by attention: {r['label_by_attention']}); {r['carried']}")
    for name, r in ((n, results[n]) for n in MODELS):
        print(f"{name}: {r['label']} ({'confident' if r['confident'] else 'not confident'}), faithfulness "
              f"{r['faithfulness']:.2f}; {r['description']}")
    atomic_write(HERE / "results.json", json.dumps(results, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
