"""`report.build(run, device=...)` (`markov-interp report RUN --device cuda`) with the model and its checkpoints on
another device than the probe batches: on the simulated device (tests/devicesim.py) the report holds what the
CPU's holds; with CUDA (`python -m pytest tests/report/test_report_devices.py -k cuda`) it is built there."""

import pytest
import torch

from devicesim import DEVICE, SimulatedDevice

from markov_interp import report
from markov_interp.sources import SourceConfig
from markov_interp.models import preset
from markov_interp.training import RunConfig, TrainConfig, train

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _text(built):
    """The mechanism's evidence and every section's text (the figures aside)."""
    return built.mechanism.to_dict(), [(s.id, [p for p in s.parts if isinstance(p, str)]) for s in built.sections]


@pytest.mark.slow  # trains a tiny run with checkpoints, then builds its report twice
@pytest.mark.parametrize("device", ["simulated", pytest.param("cuda", marks=cuda)])
def test_report_with_the_model_on_another_device(tmp_path, device):
    # no final LayerNorm: the logit attribution's scale is made by the probe (it was a CPU tensor)
    run = RunConfig(source=SourceConfig(kind="random", vocab=3, alpha=1.0),
                    model=preset("attn-only-2layer", d_vocab=3, n_ctx=24, normalization=None),
                    train=TrainConfig(steps=6, seq_len=24, batch_size=8, eval_every=3, log_every=3, n_checkpoints=3,
                                      seed=0, device="cpu"))
    train(run, tmp_path, progress=False)
    on_cpu = _text(report.build(tmp_path, n_sequences=16, device="cpu"))
    if device == "cuda":
        built = report.build(tmp_path, n_sequences=16, device="cuda")
        assert [s for s, _ in _text(built)[1]] == [s for s, _ in on_cpu[1]]
        return
    sim = SimulatedDevice()
    with sim:
        built = report.build(tmp_path, n_sequences=16, device=DEVICE)
    assert sim.moved and _text(built) == on_cpu
