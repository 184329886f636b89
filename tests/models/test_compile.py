"""The compiled engine: `TrainConfig.compile` against eager (the reference) within a stated tolerance, compiled
once per shapes, a compiled resume bit for bit, the fallback to eager with one warning, and a step whose host reads
and operations do not grow with the number of members (the same for 1 and 16 on the counter stream)."""

import collections
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from markov_interp.cli import _train_run, build_parser
from markov_interp.sources import RandomMarkov, SourceConfig, stacked_sampler
from markov_interp.models import _compile, preset
from markov_interp.training import RunConfig, TrainConfig, loop, train_many
from tests.devicesim import host_work

BINARY = SourceConfig(kind="binary", p=0.5, q=0.8)
# Compiled and eager kernels round differently (inductor fuses and reorders float operations). Measured on the
# CPU over 50 AdamW steps of these shapes: at most 1.8e-7 apart in a logged training loss; the bound leaves room
# for other CPUs' vector widths while staying far below what a wrong update would give (~1e-3 after 50 steps).
LOSS_TOLERANCE = 1e-5


def tiny_run(seed=0, compile="off", **train_kwargs) -> RunConfig:
    kwargs = dict(steps=50, batch_size=4, seq_len=16, log_every=1, eval_every=25, eval_batches=1, n_checkpoints=0,
                  device="cpu", seed=seed, compile=compile)
    kwargs.update(train_kwargs)
    return RunConfig(source=BINARY, model=preset("paper-1layer", n_ctx=16), train=TrainConfig(**kwargs))


# ------------------------------------------------------------------------------------------------- config
def test_compile_is_a_later_field_and_refuses_unknown_modes():
    """compile="off" leaves config.json (and so run ids and sweep cells) as it was before the field existed."""
    assert "compile" not in TrainConfig().to_dict() and TrainConfig(compile="default").to_dict()["compile"] == "default"
    assert TrainConfig.from_json(TrainConfig(compile="max").to_json()).compile == "max"
    with pytest.raises(ValueError, match="compile must be one of"):
        TrainConfig(compile="yes")
    args = build_parser().parse_args(["train", "--out", "x", "--compile", "default"])
    assert _train_run(args).train.compile == "default"


def _fallback_rows(monkeypatch, also_max: bool = False) -> tuple[list, list, list[str]]:
    """Eager rows of two tiny runs, their rows with compile="default" (and, with `also_max`, one more run with
    "max"), and the fallback warnings given meanwhile."""
    monkeypatch.setattr(_compile, "_WARNED", [])
    _compile.clear()
    runs = [tiny_run(seed=s, steps=6, eval_every=3) for s in (0, 1)]
    eager = train_many(runs, progress=False, models_out=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fallen = train_many([r.replace(train=r.train.replace(compile="default")) for r in runs], progress=False,
                            models_out=False)
        if also_max:
            train_many([runs[0].replace(train=runs[0].train.replace(compile="max"))], progress=False,
                       models_out=False)
    _compile.clear()
    messages = [str(w.message) for w in caught if "runs eagerly" in str(w.message)]
    return [r.metrics for r in eager], [r.metrics for r in fallen], messages


def test_fallback_runs_eagerly_with_one_warning(monkeypatch):
    """Without a compiler the compiled mode is eager arithmetic, bit for bit, after one warning per process."""
    monkeypatch.setattr(_compile, "unavailable", lambda device_type: "no C++ compiler found (simulated)")
    eager, fallen, messages = _fallback_rows(monkeypatch, also_max=True)
    assert len(messages) == 1 and "simulated" in messages[0] and "not available" in messages[0]
    assert fallen == eager


def test_a_function_that_fails_to_compile_runs_eagerly_with_one_warning(monkeypatch):
    """A compile error at the first call (here simulated for every function) makes that function eager for the
    process, with one warning naming it (the first compiled: the training step, which on the counter stream draws
    its batch inside the graph); the results are eager's, bit for bit."""
    def failing_compile(fn, **options):
        def run(*args, **kwargs):
            raise torch._dynamo.exc.TorchDynamoException("simulated inductor failure")
        return run

    monkeypatch.setattr(torch, "compile", failing_compile)
    eager, fallen, messages = _fallback_rows(monkeypatch)
    assert len(messages) == 1 and "failed on sampled_step_losses" in messages[0] and "simulated" in messages[0]
    assert fallen == eager


# ---------------------------------------------------------------------------------------- compiled = eager
def _compiled_case(case: str, tmp_path) -> dict:
    """tests/compile_runs.py CASE in a fresh process (without the suite's jaxtyping wrappers, which TorchDynamo
    cannot trace): its JSON, after checking that it compiled (no fallback warning)."""
    root = Path(__file__).parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "compile_runs.py"), case, str(tmp_path)],
                          capture_output=True, text=True, timeout=1500, cwd=root, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["compile_warnings"] == []
    return result


def _column(rows: list[dict], key: str) -> list[float]:
    return [row[key] for row in rows if key in row]


@pytest.mark.slow
def test_compiled_training_matches_eager_and_resumes_bit_for_bit(tmp_path):
    """50 AdamW steps of a stack of three, compiled against eager: every logged loss within LOSS_TOLERANCE. A
    second compiled call (run folders now) reuses the compiled code (no new graph) and gives the same rows; a
    compiled run killed after step 30 and resumed ends bit-identical (rows and weights) to the uninterrupted one."""
    result = _compiled_case("adamw-resume", tmp_path)
    for eager, compiled in zip(result["eager"], result["compiled"]):
        for key in ("train_loss", "eval_loss"):
            a, b = _column(eager, key), _column(compiled, key)
            assert len(a) == len(b) > 0 and max(abs(x - y) for x, y in zip(a, b)) < LOSS_TOLERANCE
    assert result["graphs_first"] >= 3  # forward + backward, evaluation, optimiser update
    assert result["graphs_second"] == result["graphs_first"]  # compiled once per shapes, not per run
    assert result["whole"] == result["compiled"]
    assert result["resumed"] == result["whole"] and all(result["same_weights"])
    # the compiled code differs with the member count (K is a static shape): stack invariance is eager's guarantee;
    # compiled, a run alone and in a stack of three agree within the same tolerance (docs/training.md)
    alone, member = _column(result["alone"], "train_loss"), _column(result["compiled"][1], "train_loss")
    assert max(abs(x - y) for x, y in zip(alone, member)) < LOSS_TOLERANCE


@pytest.mark.slow
def test_compiled_sgd_with_clipping_bf16_matches_eager(tmp_path):
    """The other update (SGD with momentum, clipping) and bf16 autocast, compiled against eager over 30 steps."""
    result = _compiled_case("sgd-bf16", tmp_path)
    for eager, compiled in zip(result["eager"], result["compiled"]):
        a, b = _column(eager, "train_loss"), _column(compiled, "train_loss")
        # bf16 keeps 8 bits of mantissa (~4e-3 relative): compiled and eager may round an activation apart
        assert len(a) == len(b) == 30 and max(abs(x - y) for x, y in zip(a, b)) < 2e-2
        assert abs(a[-1] - b[-1]) < 5e-3


@pytest.mark.slow
def test_random_kernels_drawn_inside_the_compiled_step_match_eager(tmp_path):
    """On the counter stream the compiled step draws its batch inside the graph: fresh Dirichlet(0.5) kernels (the
    Gamma rounds computed at once) and a pool of kernels compile without a fallback, train within LOSS_TOLERANCE of
    eager, a stack of other seeds reuses the code (no new graph: keys and tables are the graph's inputs), and the
    compiled sampler draws the eager sampler's tokens bit for bit on the CPU."""
    result = _compiled_case("random-kernels", tmp_path)
    for name in ("fresh", "pool"):
        case = result[name]
        for eager, compiled in zip(case["eager"], case["compiled"]):
            a, b = _column(eager, "train_loss"), _column(compiled, "train_loss")
            assert len(a) == len(b) == 20 and max(abs(x - y) for x, y in zip(a, b)) < LOSS_TOLERANCE, name
        assert case["new_graphs_for_other_seeds"] == 0, name
        assert case["same_tokens"] == [True] * 3, name


# ----------------------------------------------------------------------------------- host work per step
def _group(n_members: int, source=BINARY, model=None, **train_kwargs) -> "loop._Group":
    runs = [tiny_run(seed=s, steps=4, **train_kwargs) for s in range(n_members)]
    if source is not BINARY or model is not None:
        runs = [r.replace(source=source, model=model or r.model) for r in runs]
    return loop._Group.create(runs, [None] * n_members, torch.device("cpu"))


def _step_counts(n_members: int, monkeypatch, **kwargs) -> tuple[collections.Counter, int]:
    """(operations, host reads) of one training step of a stack of `n_members` (sampling, forward, backward,
    update), after a first step (state created)."""
    group = _group(n_members, **kwargs)
    lr = torch.full((n_members,), 1e-3, dtype=torch.float64)
    wd = torch.full((n_members,), 1e-3, dtype=torch.float64)
    alive = torch.ones(n_members, dtype=torch.bool)
    group._step(lr, wd, alive, 0)
    return host_work(lambda: group._step(lr, wd, alive, 1), monkeypatch)


RANDOM3 = SourceConfig(kind="random", vocab=3)
ATTN3 = preset("attn-only-2layer", n_ctx=16, d_vocab=3)


@pytest.mark.parametrize("recipe", [dict(), dict(optimizer="sgd", momentum=0.9, grad_clip=0.1),
                                    dict(precision="fp16", loss_scaling=True),
                                    dict(source=RANDOM3, model=ATTN3),
                                    dict(source=SourceConfig(kind="random", vocab=2, order=2, alpha=0.5)),
                                    dict(source=SourceConfig(kind="random", vocab=3, pool_size=8), model=ATTN3)],
                         ids=["binary", "sgd-clip", "fp16-scaling", "random", "random-order2-alpha0.5", "pool"])
def test_a_step_launches_the_same_operations_for_1_and_16_members(recipe, monkeypatch):
    """The steady-state step of a stack on the counter stream (the default, "counter-1"): sampling (every member's
    kernels, pool indices, first states and steps in one pass), forward, backward and update dispatch the same
    operations (what would be kernel launches on a GPU) for 1 and 16 members, on fixed chains and random kernels.
    The one host read is the CPU's check that every member is alive (it lets the update skip restoring members;
    on accelerators the update masks without reading)."""
    ops1, reads1 = _step_counts(1, monkeypatch, **recipe)
    ops16, reads16 = _step_counts(16, monkeypatch, **recipe)
    assert ops1 == ops16, {op: (ops1[op], ops16[op]) for op in ops1.keys() | ops16.keys() if ops1[op] != ops16[op]}
    assert reads1 == reads16 <= 1


def test_a_step_on_the_generator_stream_draws_once_per_member(monkeypatch):
    """The control, stream "torch-1" (folders trained before counter streams): the same operations for 2 and 6
    members but one draw per member from its own generator (`aten.uniform_`)."""
    ops2, reads2 = _step_counts(2, monkeypatch, stream="torch-1")
    ops6, reads6 = _step_counts(6, monkeypatch, stream="torch-1")
    assert ops2.pop("aten.uniform_") == 2 and ops6.pop("aten.uniform_") == 6
    assert ops2 == ops6
    assert reads2 == reads6 <= 1


_DRAWS = ("aten.uniform_", "aten.randn", "aten.rand", "aten.randint")  # each member's own generator's draws


@pytest.mark.parametrize("source", [RandomMarkov(3), RandomMarkov(2, order=2, alpha=0.5),
                                    RandomMarkov(3, pool_size=8)], ids=repr)
def test_sampling_random_kernels_does_the_same_host_work_for_any_number_of_members(source, monkeypatch):
    """A stack of seeds on random kernels: besides each member's draws from its own generator, a sampling step
    dispatches the same operations and reads as many values on the host for 2 and 6 members, per rejection round
    of the Gamma sampler (the rounds run for all members together: one `nonzero` and one host read each; the
    same number of rounds here for both stacks, which the test checks first)."""
    counts = {}
    for k in (2, 6):
        sample = stacked_sampler([source] * k, 8, 17, [torch.Generator().manual_seed(s) for s in range(k)])
        sample()
        ops, reads = host_work(sample, monkeypatch)
        counts[k] = ({op: n for op, n in ops.items() if op not in _DRAWS}, reads)
    (ops2, reads2), (ops6, reads6) = counts[2], counts[6]
    assert ops2.get("aten.nonzero") == ops6.get("aten.nonzero")  # the same rejection rounds
    assert ops2 == ops6 and reads2 == reads6


@pytest.mark.parametrize("stream", ["counter-1", "torch-1"])
def test_an_evaluation_does_the_same_host_work_for_any_number_of_members(stream, monkeypatch):
    """An evaluation of a stack of seeds (one source) dispatches the same operations and reads as many values on
    the host for 2 and 6 members ("torch-1": but for each member's draws): the loop reads its [member, 3] sums
    once; `theory`'s references are computed once per distinct source (its own checks read a few values there)."""
    groups = {k: _group(k, eval_batches=2, stream=stream) for k in (2, 6)}
    for group in groups.values():
        group._evaluate(4)  # the first call makes the stream's constants
    counts = {k: host_work(lambda k=k: groups[k]._evaluate(4), monkeypatch) for k in (2, 6)}
    (ops2, reads2), (ops6, reads6) = counts[2], counts[6]
    if stream == "torch-1":
        assert ops2.pop("aten.uniform_") == 2 * 2 and ops6.pop("aten.uniform_") == 6 * 2
    assert ops2 == ops6 and reads2 == reads6


def test_paired_references_are_theory_paired_losses_for_every_member():
    """The evaluation's references, computed for all members of a source at once, are `theory.paired_losses` of
    each member's tokens, bit for bit (fixed chain, random kernels, a pool, order 2; members of two sources)."""
    from markov_interp import theory
    from markov_interp.sources import BinaryChain, RandomMarkov

    generator = torch.Generator().manual_seed(0)
    pairs = ((BinaryChain(0.5, 0.8), BinaryChain(0.2, 0.3)), (RandomMarkov(3), RandomMarkov(3, alpha=2)),
             (RandomMarkov(3, pool_size=4), RandomMarkov(3)), (RandomMarkov(2, order=2), BinaryChain(0.5, 0.5)))
    for source, other in pairs:
        sources = [source, other, source, source]
        tokens = torch.stack([s.sample(3, 33, generator=generator) for s in sources])
        got = loop._paired_references(sources, tokens)
        for k, s in enumerate(sources):
            assert tuple(got[k].tolist()) == theory.paired_losses(s, tokens[k]), (source, k)
