"""The experiments' work after training with the models on another device than the CPU (see
tests/probes/test_devices.py for the probes themselves and tests/devicesim.py for the simulation).

What a GPU budget does after training: the factorial (`scripts/gpu_factorial.sh`) scores every run at its end and
at its checkpoints (loaded on the final model's device) under its arm's clamp and discovers circuits there; the
phase diagram and the diversity sweep (`docs/reproduction/icl/gpu_full.sh`) load each finished run on the CPU and
measure it there. On the simulated device the factorial's results must equal the CPU's bit for bit (its runs
trained on the CPU, then loaded on the device); with CUDA (`python -m pytest tests/experiments/test_devices.py -k
cuda`) each experiment runs end to end at a tiny budget with its runs trained on the GPU.
"""

import json

import pytest
import torch

import handbuilt as hb
from devicesim import DEVICE, SimulatedDevice

from markov_interp import experiments, probes
from markov_interp.sources import RandomMarkov
from markov_interp.experiments import diversity, factorial, phases

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TINY_FACTORIAL = factorial.QUICK.replace(
    name="tiny", seeds=2, steps=4, heads=(2,), data=("zero-diagonal",), arms=("free", "clamped"), eval_every=2,
    eval_batches=1, score_checkpoints=2, discovered=1, cuts="a test")


def _result(out):
    """results.json's result, without the seconds it took."""
    result = json.loads((out / "results.json").read_text())["result"]
    for cell in result.values():
        cell.pop("seconds", None)
    return result


@pytest.mark.slow  # ~15 s: 4 tiny runs trained, scored at 2 checkpoints and discovered on the CPU, then again
def test_factorial_scores_and_circuits_with_the_runs_loaded_on_another_device(tmp_path):
    experiment = experiments.get("factorial")
    experiments.run(experiment, tmp_path, budget=TINY_FACTORIAL)
    on_cpu = _result(tmp_path)
    sim = SimulatedDevice()
    with sim:  # the finished runs are loaded where the budget says, the checkpoints where the final model is
        experiments.run(experiment, tmp_path, budget=TINY_FACTORIAL.replace(device=str(DEVICE)))
    runs = TINY_FACTORIAL.seeds * len(TINY_FACTORIAL.arms)
    assert len(sim.moved) >= runs * (1 + TINY_FACTORIAL.score_checkpoints)  # final models and every checkpoint
    assert _result(tmp_path) == on_cpu


@pytest.mark.parametrize("device", ["simulated", pytest.param("cuda", marks=cuda)])
def test_phase_and_diversity_measures_of_a_model_on_another_device(device):
    """Their runs are measured on the CPU (loaded there); the measures still hold for a model elsewhere."""
    source, pool = RandomMarkov(2, order=1), RandomMarkov(3, pool_size=4, pool_seed=0)
    batch = probes.sample_batch(source, n_sequences=16, seq_len=48, seed=3)
    inside = probes.sample_batch(pool, n_sequences=16, seq_len=48, seed=1)
    outside = probes.sample_batch(RandomMarkov(3), n_sequences=16, seq_len=48, seed=2)

    def measures(where=None):
        two, three = hb.induction_circuit(2, n_ctx=48), hb.induction_circuit(3, n_ctx=48)
        if where is not None:
            two.to(where, print_details=False), three.to(where, print_details=False)
        return (phases.measure_model(two, batch, source, classify=True),
                diversity.measure_model(three, inside, outside, pool))

    reference = measures()
    if device == "simulated":
        with SimulatedDevice():
            assert measures(DEVICE) == reference
        return
    (phase, div), (phase_ref, div_ref) = measures(torch.device("cuda")), reference
    assert phase["classified"]["mechanism"] == phase_ref["classified"]["mechanism"] == "induction"
    assert phase["gains"] == {k: pytest.approx(v, abs=1e-4) for k, v in phase_ref["gains"].items()}
    assert div["phase"] == div_ref["phase"]
    assert div["swap_fraction"] == pytest.approx(div_ref["swap_fraction"], abs=1e-4)


# ----------------------------------------------------------------------------------------------- on a GPU
@cuda
def test_cuda_factorial_end_to_end_at_a_tiny_budget(tmp_path):
    """`scripts/gpu_factorial.sh` stage 2 in small: trained on the GPU, scored over training, circuits found."""
    done = experiments.run(experiments.get("factorial"), tmp_path, budget=TINY_FACTORIAL.replace(device="cuda"))
    (cell,) = done.result.cells
    free, clamped = cell.arms
    assert clamped.at_end.previous_token == pytest.approx((1.0, 1.0), abs=1e-6)  # probed under its clamp
    for arm in cell.arms:
        assert len(arm.over_training) == TINY_FACTORIAL.score_checkpoints and len(arm.circuits) == 1
        assert all(0.0 <= v <= 1.0 for x in arm.over_training for v in (*x.previous_token, *x.induction))
    assert "device cuda" in (tmp_path / "summary.md").read_text()


@cuda
@pytest.mark.parametrize("name", ["phases", "diversity"])
def test_cuda_icl_experiments_end_to_end_at_the_tiny_budget(tmp_path, name):
    """`docs/reproduction/icl/gpu_full.sh` in small: trained on the GPU, measured on the CPU."""
    experiment = experiments.get(name)
    finished = experiments.run(experiment, tmp_path, budget=experiment.budget("tiny", workers=1, device="cuda"))
    assert finished.failed == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["result"]["runs"] and all(r["status"] == "ok" for r in data["result"]["runs"])
    assert "device cuda" in (tmp_path / "summary.md").read_text()
