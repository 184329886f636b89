"""A run's random stream (`TrainConfig.stream`, `training.batches`): new runs on "counter-1", files written before it
read as "torch-1" with their JSON and cell ids unchanged, old folders resume on their stream bit for bit (against
the fixtures main's code wrote, tests/data/make_torch1_runs.py), a member alone equals the same member in stacks of
4 and 16, a counter-stream checkpoint holds no generator state and resumes bit for bit, and a sweep folder of old
cells stays on their stream."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from markov_interp import sweep, training
from markov_interp import runs as runfolder
from markov_interp.cli import _train_run, build_parser
from markov_interp.models import preset
from markov_interp.sources import SourceConfig
from markov_interp.training import RunConfig, TrainConfig, default_run, loop, override_run, train, train_many
from tests.training.test_engine import _same, _weights  # weights of a model or a run folder, compared exactly

DATA = Path(__file__).parents[1] / "data"
OLD_RUNS = DATA / "old_runs"
RANDOM = SourceConfig(kind="random", vocab=3, alpha=0.5)


def tiny_run(seed=0, source=RANDOM, **train_kwargs) -> RunConfig:
    kwargs = dict(steps=6, batch_size=4, seq_len=12, log_every=1, eval_every=3, eval_batches=2, n_checkpoints=0,
                  device="cpu", seed=seed)
    kwargs.update(train_kwargs)
    model = preset("attn-only-2layer", n_ctx=12, d_vocab=source.vocab_size)
    return RunConfig(source=source, model=model, train=TrainConfig(**kwargs))


# -------------------------------------------------------------------------------------------------- config
def test_new_runs_are_on_the_counter_stream_and_old_files_read_as_torch_1():
    assert TrainConfig().stream == "counter-1" and TrainConfig().to_dict()["stream"] == "counter-1"
    assert default_run().train.stream == "counter-1"
    assert "stream" not in TrainConfig(stream="torch-1").to_dict()  # an old file's JSON, byte for byte
    with pytest.raises(ValueError, match="stream must be one of"):
        TrainConfig(stream="philox")
    for path in [*sorted((DATA / "run_configs").glob("*.json")), OLD_RUNS / "unfinished" / "config.json"]:
        text = path.read_text()
        run = RunConfig.from_json(text)
        assert run.train.stream == "torch-1" and run.to_json() + ("\n" if text.endswith("\n") else "") == text
    new = RunConfig.from_json(tiny_run().to_json())
    assert new.train.stream == "counter-1" and new == tiny_run()


def test_override_run_and_the_cli_keep_an_old_runs_stream(tmp_path):
    """`--config OLD/config.json --set ...` retrains on the old run's stream; `--set train.stream=...` changes it."""
    old = runfolder.read_config(OLD_RUNS / "unfinished")
    assert override_run(old, {}) == old
    assert override_run(old, {"train.steps": 20}).train.stream == "torch-1"
    assert override_run(old, {"train.stream": "counter-1"}).train.stream == "counter-1"
    config = str(OLD_RUNS / "unfinished" / "config.json")
    args = build_parser().parse_args(["train", "--out", str(tmp_path), "--config", config, "--set", "train.lr=0.01"])
    assert _train_run(args).train.stream == "torch-1"
    assert _train_run(build_parser().parse_args(["train", "--out", str(tmp_path)])).train.stream == "counter-1"


def test_runs_on_two_streams_cannot_share_a_stack():
    with pytest.raises(ValueError, match="train.stream differs"):
        train_many([tiny_run(0), tiny_run(1, stream="torch-1")], progress=False)


# ------------------------------------------------------------------------------------------ old folders
def _copy(name: str, tmp_path: Path) -> Path:
    folder = tmp_path / name
    shutil.copytree(OLD_RUNS / name, folder)
    return folder


@pytest.mark.parametrize("name, expected", [("unfinished", "unfinished_resumed"),
                                            ("random_unfinished", "random_final")])
def test_old_folders_resume_on_their_stream_bit_for_bit(name, expected, tmp_path):
    """Folders main's code wrote before counter streams (a binary chain with a clamp's running mean; fresh
    Dirichlet(0.5) kernels, whose Gamma rejection rounds and alpha < 1 boost come from the generators) resume from
    their checkpoint on "torch-1" and end where main's code ended them: the same weights and metrics, bit for bit."""
    folder = _copy(name, tmp_path)
    run = runfolder.read_config(folder)
    assert run.train.stream == "torch-1"
    resumed = train(run, folder, progress=False)
    assert resumed.resumed_from == 3
    assert _same(_weights(resumed.model), _weights(OLD_RUNS / expected / "model.safetensors"))
    assert resumed.metrics == runfolder.load_metrics(OLD_RUNS / expected)
    assert json.loads((folder / "config.json").read_text()) == json.loads((OLD_RUNS / name / "config.json").read_text())


# ------------------------------------------------------------------------------------------ counter stream
def test_a_member_trains_the_same_alone_and_in_stacks_of_4_and_16():
    """Random kernels on the counter stream: a member's metrics (training and evaluation losses, the latter on its
    own evaluation batches) and weights alone and in stacks of 4 and 16, bit for bit on the CPU."""
    runs = [tiny_run(seed=s, steps=3, eval_every=3) for s in range(16)]
    sixteen = train_many(runs, progress=False)
    four = train_many(runs[4:8], progress=False)
    for k in (0, 5, 15):
        alone = train(runs[k], progress=False)
        for result in [sixteen[k]] + ([four[k - 4]] if 4 <= k < 8 else []):
            assert result.metrics == alone.metrics
            assert _same(_weights(result.model), _weights(alone.model))


def test_a_stack_draws_its_batches_from_the_stream_of_each_members_seed():
    """The training batch of update t is `stream_sampler` of the member's "train-data" key at step t, and the
    evaluation batches count on from 0 over the run's evaluations, whatever the stack."""
    from markov_interp import streams
    from markov_interp.sources import stream_sampler
    from markov_interp.training.batches import derive_seed

    runs = [tiny_run(seed=s) for s in (3, 8)]
    group = loop._Group.create(runs, [None, None], torch.device("cpu"))
    source = RANDOM.build()
    for name, draw in (("train-data", lambda: group.data.train(4)), ("eval-data", group.data.evaluation)):
        keys = streams.member_keys([derive_seed(s, name) for s in (3, 8)])
        assert torch.equal(draw(), stream_sampler([source] * 2, 4, 13, keys)(4 if name == "train-data" else 0))
    assert group.data.eval_batches == 1


class _Kill(Exception):
    pass


def test_a_counter_stream_checkpoint_holds_no_generator_and_resumes_bit_for_bit(tmp_path, monkeypatch):
    runs = [tiny_run(seed=s, steps=8, eval_every=2, n_checkpoints=3) for s in (0, 1)]
    reference = train_many(runs, progress=False)
    outs = [tmp_path / "a", tmp_path / "b"]
    monkeypatch.setattr(loop, "_on_step", lambda step: (_ for _ in ()).throw(_Kill) if step == 5 else None)
    with pytest.raises(_Kill):
        train_many(runs, outs, progress=False)
    monkeypatch.undo()
    _, state = runfolder.read_checkpoint(outs[0], 3)
    # one evaluation (step 2) of two batches before step 3
    assert "train_generator" not in state and state["stream"] == "counter-1" and state["eval_batches"] == 2
    resumed = train_many(runs, outs, progress=False)
    for ref, res in zip(reference, resumed):
        assert res.resumed_from == 3 and res.metrics == ref.metrics
        assert _same(_weights(res.model), _weights(ref.model))
    assert json.loads((outs[0] / "config.json").read_text())["train"]["stream"] == "counter-1"


# ------------------------------------------------------------------------------------------------- sweeps
def _spec(**base_train) -> sweep.SweepSpec:
    return sweep.SweepSpec(name="streams", base={"source": {"kind": "binary", "p": 0.5, "q": 0.8},
                                                 "model": {"preset": "paper-1layer", "n_ctx": 8},
                                                 "train": {"steps": 2, "seq_len": 8, "batch_size": 2,
                                                           "n_checkpoints": 0, **base_train}},
                           seeds=(0, 1), probe=False)


def test_a_sweep_folder_of_old_cells_stays_on_their_stream(tmp_path):
    """A folder whose cells name no stream (trained before counter streams) restarts and is extended on "torch-1"
    with the old cell ids; a new folder runs on "counter-1"; a spec naming a stream is followed."""
    old = tmp_path / "old"
    first = sweep.run(_spec(stream="torch-1"), old, workers=1, progress=False)  # what main's code left
    assert all("stream" not in json.loads((old / r.run_dir / "config.json").read_text())["train"]
               for r in first.rows)
    assert sweep.folder_stream(old) == "torch-1" and sweep.folder_stream(tmp_path / "new") is None
    again = sweep.run(_spec(), old, workers=1, progress=False)
    assert again.n_run == 0 and [r.cell_id for r in again.rows] == [r.cell_id for r in first.rows]
    extended = sweep.SweepSpec.from_dict({**_spec().to_dict(), "seeds": [0, 1, 2]})
    grown = sweep.run(extended, old, workers=1, progress=False)
    assert grown.n_run == 1 and all(r.config.train.stream == "torch-1" for r in grown.rows)
    new = sweep.run(_spec(), tmp_path / "new", workers=1, progress=False)
    assert all(r.config.train.stream == "counter-1" for r in new.rows)
    assert not {r.cell_id for r in new.rows} & {r.cell_id for r in first.rows}
    assert sweep.folder_stream(tmp_path / "new") is None
    chosen = sweep.run(_spec(stream="counter-1"), old, workers=1, progress=False)
    assert chosen.n_run == 2 and all(r.config.train.stream == "counter-1" for r in chosen.rows)
    assert [r.cell_id for r in sweep.read_table(tmp_path / "new")] == [r.cell_id for r in new.rows]


def test_the_plan_counts_the_gamma_rounds_of_the_counter_stream(monkeypatch):
    """Fresh Dirichlet(2.5) kernels over 8 states, 16 members of batch 64: the rejection rounds computed at once
    (16 x 130 bytes per draw, 130 MiB) exceed a 100 MiB limit, which the generator stream and alpha = 1 (one
    round) fit; the refusal names them."""
    from markov_interp.training import plan

    monkeypatch.setattr(plan, "memory_limit", lambda device: (100 * 2**20, "100 MiB (the test's limit)"))

    def stack(alpha, **train_kwargs):
        source = SourceConfig(kind="random", vocab=8, alpha=alpha)
        return [tiny_run(seed=s, source=source, batch_size=64, **train_kwargs) for s in range(16)]

    cpu = torch.device("cpu")
    plan.check_plan(stack(2.5, stream="torch-1"), [None] * 16, cpu)
    plan.check_plan(stack(1.0), [None] * 16, cpu)
    with pytest.raises(plan.PlanTooLarge, match=r"train.batch_size=64 is too large: the counter stream's Gamma draws "
                                                r"\(16 rejection rounds each\) and words would need 130.\d MiB"):
        plan.check_plan(stack(2.5), [None] * 16, cpu)


# ------------------------------------------------------------------------------------------ a source without one
def test_an_hmm_on_the_counter_stream_draws_per_member_trains_and_resumes_bit_for_bit(tmp_path, monkeypatch):
    """A hidden Markov source has no `sample_stream`: on "counter-1" each member draws with `sample` from a
    generator seeded by its own key at the step (`sources.stream_sampler`'s fallback). A member's batch is the
    same alone and in a stack (beside another process), the same step gives the same numbers, and a run killed
    mid-way resumes to the uninterrupted run's folder byte for byte."""
    from markov_interp import streams
    from markov_interp.sources import hmm_preset, stream_sampler
    from tests.training.test_resume import _killed, _points, _same_folder

    mess3, other = hmm_preset("mess3"), hmm_preset("mess3", x=0.1, alpha=0.6)
    keys = streams.member_keys([5, 6, 7])
    stack = stream_sampler([mess3, other, mess3], 4, 10, keys)
    for step in (0, 3):
        batch = stack(step)
        for k, source in enumerate([mess3, other, mess3]):
            assert torch.equal(batch[k], stream_sampler([source], 4, 10, keys[k:k + 1])(step)[0])
        assert torch.equal(batch, stack(step))
    assert not torch.equal(stack(0), stack(3)) and not torch.equal(batch[0], batch[2])  # step and key both count
    assert int(batch.min()) >= 0 and int(batch.max()) < 3

    run = tiny_run(source=SourceConfig(kind="hmm", process="mess3"), steps=8, log_every=2, eval_every=4,
                   n_checkpoints=0, resume_every=3)
    assert run.train.stream == "counter-1"
    reference = train(run, tmp_path / "reference", progress=False)
    assert reference.final.references.hidden
    out = tmp_path / "killed"
    _killed(monkeypatch, [run], [out], at=7)
    resumed = train(run, out, progress=False)
    assert resumed.resumed_from == _points(7, 3, 2, set(), 8)[-1] == 4  # the resume point it left
    _same_folder(out, tmp_path / "reference")
