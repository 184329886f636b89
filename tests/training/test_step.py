"""The whole step (`training.step`): the optimiser's update counts and bias corrections on the device give the host
floats' numbers, the whole step gives the loop's weights bit for bit on the CPU, run folders written before it
resume byte for byte, the step traces as one graph with no host read, a run that cannot capture says why, and on
CUDA (the device plan: `scripts/gpu_check.sh` runs `-k cuda`) one CUDA graph per step."""

import collections
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jaxtyping
import pytest
import torch

from markov_interp import runs
from markov_interp.clamps import Freeze
from markov_interp.models import preset
from markov_interp.models.optim import StackedOptimizer
from markov_interp.models.stack import build_stack
from markov_interp.sources import SourceConfig
from markov_interp.training import RunConfig, TrainConfig, loop, train, train_many

BINARY = SourceConfig(kind="binary", p=0.5, q=0.8)
RANDOM3 = SourceConfig(kind="random", vocab=3)
ATTN3 = preset("attn-only-2layer", n_ctx=16, d_vocab=3)
ROOT = Path(__file__).resolve().parents[2]
BEFORE = Path(__file__).parents[1] / "data" / "old_runs" / "before_capture"  # written by main before this code
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the device plan runs it)")
RECIPE = {"adamw": dict(), "sgd-clip": dict(optimizer="sgd", momentum=0.9, grad_clip=0.1),
          "random": dict(source=RANDOM3, model=ATTN3)}


def tiny_runs(n: int = 3, source=BINARY, model=None, device: str = "cpu", **train_kwargs) -> list[RunConfig]:
    kwargs = dict(steps=30, batch_size=4, seq_len=16, log_every=5, eval_every=15, eval_batches=1, n_checkpoints=0,
                  device=device)
    kwargs.update(train_kwargs)
    return [RunConfig(source=source, model=model or preset("paper-1layer", n_ctx=16),
                      train=TrainConfig(seed=s, **kwargs)) for s in range(n)]


def _captured(rs: list[RunConfig], capture: str = "graph") -> list[RunConfig]:
    return [r.replace(train=r.train.replace(capture=capture)) for r in rs]


def _weights(result) -> dict:
    return {k: v.detach().cpu() for k, v in result.model.state_dict().items()}


# ------------------------------------------------------------------------------------------------ optimiser
def test_the_bias_corrections_on_the_device_are_the_host_floats():
    """Row t of the table is (1 - beta1^t, sqrt(1 - beta2^t)) as Python computes them, bit for bit, for every t a
    run of 3000 steps reaches; `torch.pow` on a tensor (what a device-side formula would use) differs in the last
    bit at some t, which is why the table exists."""
    opt = StackedOptimizer(build_stack([preset("paper-1layer", n_ctx=16)], [0]), kind="adamw", betas=(0.9, 0.95))
    opt.reserve(3000)
    t = torch.arange(len(opt.corrections), dtype=torch.float64)
    host = torch.tensor([(1 - 0.9**i, (1 - 0.95**i) ** 0.5) for i in range(len(t))], dtype=torch.float64)
    assert len(t) > 3000 and torch.equal(opt.corrections, host)
    assert not torch.equal(1 - torch.pow(0.95, t), host[:, 1] ** 2) or not torch.equal(1 - torch.pow(0.9, t), host[:, 0])


def test_update_counts_live_on_the_device_and_checkpoint_as_before():
    """A frozen parameter skips its count (torch's per-parameter `step`); the checkpoint holds each count as a
    float32 `step`, and loading it back sets the device counts."""
    stack = build_stack([preset("paper-1layer", n_ctx=16)] * 2, [0, 1])
    opt = StackedOptimizer(stack, kind="adamw")
    for p in stack.parameters():
        p.grad = torch.ones_like(p)
    lr = torch.full((2,), 1e-3, dtype=torch.float64)
    for frozen in (frozenset(), frozenset({"embed.weight"}), frozenset()):
        opt.step(lr, lr, torch.ones(2, dtype=torch.bool), frozen)
    assert opt.counts.device == stack.device and opt.param_steps["embed.weight"] == 2
    assert set(opt.param_steps.values()) == {2, 3}
    saved = opt.member_state_dict(1, lr=1e-3, weight_decay=1e-3)
    other = StackedOptimizer(build_stack([preset("paper-1layer", n_ctx=16)] * 2, [0, 1]), kind="adamw")
    other.load_member_state(1, saved)
    assert other.param_steps == opt.param_steps


# ------------------------------------------------------------------------------------------- whole step (CPU)
@pytest.mark.parametrize("recipe", list(RECIPE), ids=list(RECIPE))
def test_the_whole_step_gives_the_loops_weights_bit_for_bit(recipe):
    """capture="graph" on the CPU runs the whole step uncaptured (the code a GPU captures): the same weights and
    metrics as the loop's step, bit for bit in fp32, and the run says why it was not captured."""
    rs = tiny_runs(**RECIPE[recipe])
    plain = train_many(rs, progress=False)
    whole = train_many(_captured(rs), progress=False)
    for a, b in zip(plain, whole):
        assert a.metrics == b.metrics
        assert all(torch.equal(x, y) for x, y in zip(_weights(a).values(), _weights(b).values()))
    assert plain[0].engine == "uncaptured"
    assert whole[0].engine == "not captured: CUDA graphs need a CUDA device (this run trains on cpu)"
    assert whole[0].to_dict()["engine"] == whole[0].engine


@pytest.mark.parametrize("name", ["counter-adamw", "torch1-sgd"])
@pytest.mark.parametrize("capture", ["off", "graph"])
def test_a_folder_written_before_device_counts_resumes_byte_for_byte(name, capture, tmp_path):
    """A finished folder written by main before this code (tests/data/make_capture_fixtures.py), cut back to its
    checkpoint of step 3 (final weights and later checkpoints removed), resumes with device counts, captured or
    not, to the same final weights and metrics, byte for byte."""
    folder = tmp_path / name
    shutil.copytree(BEFORE / name, folder)
    (folder / runs.WEIGHTS_FILE).unlink()
    for step, path in runs.list_checkpoints(folder):
        if step > 3:
            path.unlink()
            path.with_suffix(".pt").unlink()
    run = runs.read_config(folder)
    resumed = train(run.replace(train=run.train.replace(capture=capture)), folder, progress=False)
    assert resumed.resumed_from == 3
    for file in (runs.WEIGHTS_FILE, runs.METRICS_FILE):
        assert (folder / file).read_bytes() == (BEFORE / name / file).read_bytes(), file


# TorchDynamo's account of the whole step of a stack of 2 after its first step, in a fresh process: pytest's
# test-time jaxtyping hook wraps every function of the package, and TorchDynamo cannot trace those wrappers where a
# traced step constructs an object (the optimiser's per-step scalars); a run outside pytest has no hook.
_EXPLAIN = """
import json, sys, torch
from markov_interp.training import loop
from markov_interp.training.step import whole_step
from tests.training.test_step import RECIPE, _captured, tiny_runs
torch.set_num_threads(1)
recipe, control = sys.argv[1], sys.argv[2] == "host-read"
group = loop._Group.create(_captured(tiny_runs(2, **RECIPE[recipe])), [None] * 2, torch.device("cpu"))
lr, alive = torch.full((2,), 1e-3, dtype=torch.float64), torch.ones(2, dtype=torch.bool)
group._step(lr, lr, alive, 0)
if control:  # a host read in the finite check, as the loop's CPU-only bool(alive.all()) would be
    finite = type(group.optimizer).member_finite
    type(group.optimizer).member_finite = lambda self, grads=None: (lambda ok: ok if bool(ok.all()) else ok)(
        finite(self, grads))
with torch.no_grad():
    out = torch._dynamo.explain(whole_step)(group.stack.params, group.data.capturable, group.optimizer,
                                            group.data.step(1), lr, lr, alive, **group.whole.fn.keywords)
print(json.dumps([out.graph_count, out.graph_break_count, [str(b.reason)[:200] for b in out.break_reasons]]))
"""


def _explain(recipe: str, control: str = "") -> tuple[int, int, list]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _EXPLAIN, recipe, control], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return tuple(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("recipe", ["sgd-clip", pytest.param("random", marks=pytest.mark.slow)])
def test_the_whole_step_traces_as_one_graph_without_host_reads(recipe):
    """TorchDynamo traces sampling, forward, backward, finite check, clipping and update as one graph with no break
    (what `fullgraph` compiling and a CUDA graph need); the control: a host read put into the finite check breaks
    it."""
    graphs, breaks, reasons = _explain(recipe)
    assert (graphs, breaks) == (1, 0), reasons
    graphs, breaks, reasons = _explain(recipe, "host-read")
    assert breaks >= 1 and graphs >= 2


@pytest.mark.parametrize("why, kwargs", [
    ("interventions", dict(interventions=[Freeze(freeze="embed.weight")])),
    ("the batch is not drawn from the step tensor", dict(stream="torch-1")),
    ("fp16 loss scaling", dict(precision="fp16", loss_scaling=True))])
def test_a_run_that_cannot_capture_says_why_and_trains_as_before(why, kwargs):
    rs = tiny_runs(2, steps=6, **kwargs)
    plain, asked = train_many(rs, progress=False), train_many(_captured(rs), progress=False)
    assert asked[0].engine.startswith(f"not captured: {why}")
    assert plain[0].metrics == asked[0].metrics


def test_capture_is_how_a_run_executes_not_what_it_is():
    """capture is left out of config.json at "off" (earlier folders and sweep cells unchanged) and out of the
    comparison of a folder's config with the run asked for (a folder may resume captured or not)."""
    assert "capture" not in TrainConfig().to_dict() and TrainConfig(capture="graph").to_dict()["capture"] == "graph"
    with pytest.raises(ValueError, match="capture must be one of"):
        TrainConfig(capture="yes")
    assert "capture" in runs.EXECUTION_FIELDS


# ------------------------------------------------------------------------------------------------- CUDA
@CUDA
@pytest.mark.parametrize("members", [1, 16])
def test_a_captured_step_on_cuda_is_one_graph_launch(members):
    """On CUDA the steady-state step is one CUDA graph replay plus a few copies of its inputs and outputs, the same
    for 1 and 16 members, and trains to the uncaptured numbers (equal kernels; float atomics in some backward
    kernels make CUDA runs not bit-identical, so within 1e-5)."""
    rs = tiny_runs(members, device="cuda", steps=12)
    plain = train_many(rs, progress=False)
    captured = train_many(_captured(rs), progress=False)
    assert captured[0].engine == "one CUDA graph per step"
    for a, b in zip(plain, captured):
        assert max((x - y).abs().max().item() for x, y in zip(_weights(a).values(), _weights(b).values())) < 1e-5
    group = loop._Group.create(_captured(rs), [None] * members, torch.device("cuda"))
    lr = torch.full((members,), 1e-3, dtype=torch.float64, device="cuda")
    alive = torch.ones(members, dtype=torch.bool, device="cuda")
    for t in range(4):  # the first step, two warm-up steps, then the capture and its first replay
        group._step(lr, lr, alive, t)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        group._step(lr, lr, alive, 4)
        torch.cuda.synchronize()
    calls = collections.Counter(e.name for e in prof.events())
    assert calls["cudaGraphLaunch"] == 1 and calls["cudaLaunchKernel"] <= 8, calls


@CUDA
def test_a_captured_compiled_bf16_step_on_cuda_trains_like_the_uncaptured_one(monkeypatch):
    """compile="default" in bf16 (the setting of large sweeps), captured: within bf16 rounding of the uncaptured
    compiled run (logged training losses within 2e-2 nats after 20 steps)."""
    monkeypatch.setattr(jaxtyping.config, "jaxtyping_disable", True)  # as outside pytest: compiled, not eager
    rs = tiny_runs(4, device="cuda", steps=20, precision="bf16", compile="default")
    plain = train_many(rs, progress=False)
    captured = train_many(_captured(rs), progress=False)
    assert captured[0].engine == "one CUDA graph per step"
    for a, b in zip(plain, captured):
        assert abs(a.metrics[-1]["train_loss"] - b.metrics[-1]["train_loss"]) < 2e-2
