"""Compiled and eager training runs for tests/models/test_compile.py, in a process of their own.

The test suite wraps every function of the package in jaxtyping's runtime checks (`--jaxtyping-packages`), which
TorchDynamo cannot trace; this script imports the package plainly, as a user's process does, trains the runs of
one case compiled and eager, and prints what the test compares as one JSON object.

    python tests/compile_runs.py adamw-resume OUT_FOLDER
    python tests/compile_runs.py sgd-bf16 OUT_FOLDER
    python tests/compile_runs.py random-kernels OUT_FOLDER
"""

import hashlib
import json
import sys
from pathlib import Path


def _run(seed, compile="off", **train_kwargs):
    from markov_interp.sources import SourceConfig
    from markov_interp.models import preset
    from markov_interp.training import RunConfig, TrainConfig

    kwargs = dict(steps=50, batch_size=4, seq_len=16, log_every=1, eval_every=25, eval_batches=1, n_checkpoints=0,
                  device="cpu", seed=seed, compile=compile)
    kwargs.update(train_kwargs)
    return RunConfig(source=SourceConfig(kind="binary", p=0.5, q=0.8), model=preset("paper-1layer", n_ctx=16),
                     train=TrainConfig(**kwargs))


def _train(runs, outs=None):
    from markov_interp.training import train_many

    return [r.metrics for r in train_many(runs, outs, progress=False, models_out=False)]


def _weights(folder: Path) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def adamw_resume(out: Path) -> dict:
    """Eager and compiled stacks of three (50 AdamW steps); the compiled runs again into folders, whole and killed
    after step 30 then resumed; the number of graphs compiled after each."""
    import torch._dynamo.utils as dynamo_utils

    from markov_interp.training import loop

    runs = [_run(s) for s in (0, 1, 2)]
    compiled_runs = [r.replace(train=r.train.replace(compile="default", n_checkpoints=3)) for r in runs]
    result = {"eager": _train(runs), "compiled": _train(compiled_runs)}
    result["graphs_first"] = dynamo_utils.counters["stats"]["unique_graphs"]
    whole = [out / "whole" / str(k) for k in range(3)]
    result["whole"] = _train(compiled_runs, whole)
    result["graphs_second"] = dynamo_utils.counters["stats"]["unique_graphs"]

    class Killed(Exception):
        pass

    def kill(step):
        if step == 30:
            raise Killed

    killed = [out / "killed" / str(k) for k in range(3)]
    loop._on_step = kill
    try:
        _train(compiled_runs, killed)
    except Killed:
        pass
    loop._on_step = lambda step: None
    result["resumed"] = _train(compiled_runs, killed)
    result["same_weights"] = [_weights(a) == _weights(b) for a, b in zip(whole, killed)]
    result["alone"] = _train([compiled_runs[1].replace(train=compiled_runs[1].train.replace(n_checkpoints=0))])[0]
    return result


def sgd_bf16(out: Path) -> dict:
    """SGD with momentum and clipping under bf16 autocast, eager and compiled (30 steps, two members)."""
    runs = [_run(s, steps=30, optimizer="sgd", momentum=0.9, lr=0.05, grad_clip=0.05, precision="bf16") for s in (0, 1)]
    return {"eager": _train(runs), "compiled": _train([r.replace(train=r.train.replace(compile="default"))
                                                      for r in runs])}


def random_kernels(out: Path) -> dict:
    """Fresh Dirichlet(0.5) kernels over 3 states and a pool of 8 kernels, stacks of two on the counter stream,
    eager and compiled (the batch drawn inside the compiled graph: Gamma rejection rounds, pool indices, chain
    steps), 20 steps; then stacks of two other seeds, compiled (the graphs compiled before and after); and the
    in-graph sampler alone against the eager one, the tokens of 3 steps."""
    import torch
    import torch._dynamo.utils as dynamo_utils

    from markov_interp import streams
    from markov_interp.models import preset
    from markov_interp.sources import SourceConfig, stream_sampler

    model = preset("attn-only-2layer", d_vocab=3, n_ctx=16)
    sources = {"fresh": SourceConfig(kind="random", vocab=3, alpha=0.5),
               "pool": SourceConfig(kind="random", vocab=3, pool_size=8)}
    result = {}
    for name, source in sources.items():
        runs = [_run(s, steps=20).replace(source=source, model=model) for s in (0, 1)]
        compiled = [r.replace(train=r.train.replace(compile="default")) for r in runs]
        result[name] = {"eager": _train(runs), "compiled": _train(compiled)}
        before = dynamo_utils.counters["stats"]["unique_graphs"]
        _train([r.replace(train=r.train.replace(seed=r.train.seed + 5)) for r in compiled])
        result[name]["new_graphs_for_other_seeds"] = dynamo_utils.counters["stats"]["unique_graphs"] - before
        sample = stream_sampler([source.build() for _ in range(2)], 4, 17, streams.member_keys([3, 4]))
        program = torch.compile(lambda step: sample(step), fullgraph=True, dynamic=False)
        result[name]["same_tokens"] = [bool(torch.equal(program(torch.tensor(t)), sample(torch.tensor(t))))
                                       for t in range(3)]
    return result


CASES = {"adamw-resume": adamw_resume, "sgd-bf16": sgd_bf16, "random-kernels": random_kernels}


def main() -> None:
    import warnings

    import torch

    torch.set_num_threads(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = CASES[sys.argv[1]](Path(sys.argv[2]))
    fallback = "runs eagerly (the compile='off' arithmetic"  # models._compile's one warning
    result["compile_warnings"] = [str(w.message) for w in caught if fallback in str(w.message)]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
