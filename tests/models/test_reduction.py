"""The canonical (e, w, b) family as a training constraint (`models.reduction`, `train.reduction`), Adam on the
reduced loss (`landscape.adam_descent`) and the experiment `reduction` (issue 22, item 3)."""

import math

import numpy as np
import pytest
import torch

from markov_interp import landscape
from markov_interp.sources import SourceConfig
from markov_interp.experiments import reduction as exp
from markov_interp.models import initial_state, preset
from markov_interp.models.reduction import CanonicalConstraint
from markov_interp.models.stack import Stack, stacked_forward
from markov_interp.training import RunConfig, TrainConfig, train, train_many
from tests.training.test_resume import _killed  # train, stopped after a step

P, Q = 0.5, 0.8
BINARY = SourceConfig(kind="binary", p=P, q=Q)


def exact_model(w0=-0.8, e0=0.1, b0=0.0, n_ctx=16, **changes):
    return preset("paper-1layer", n_ctx=n_ctx, normalization=None, act_fn="relu", init="canonical", canonical_e=e0,
                  canonical_w=w0, canonical_b=b0, canonical_v_std=0.0, **changes)


def reduced_run(w0=-0.8, seed=0, release=(), e0=0.1, n_ctx=16, **train_kwargs) -> RunConfig:
    kwargs = dict(steps=12, batch_size=8, seq_len=16, lr=0.5, optimizer="sgd", weight_decay=0.0, schedule="constant",
                  log_every=2, eval_every=6, eval_batches=1, n_checkpoints=3, device="cpu", seed=seed,
                  reduction="canonical", release=list(release))
    kwargs.update(train_kwargs)
    return RunConfig(source=BINARY, model=exact_model(w0, e0, n_ctx=n_ctx), train=TrainConfig(**kwargs))


def weights(model) -> dict:
    from markov_interp.models import state_dict_for_save

    return state_dict_for_save(model)


# ------------------------------------------------------------------------------- the projection is the chain rule
def _exact_loss_gradient(cfg, seed: int) -> tuple[Stack, CanonicalConstraint]:
    """Backward of the network's exact expected loss at position 0 (every (x, y) pair weighted by pi(x) P(x, y)),
    then the projection: the stack's family gradients are then dL/d(e, w, b) along (D_e, D_w, D_b)."""
    stack = Stack.from_states([cfg], [initial_state(cfg, seed)])
    pi = torch.tensor([Q, P], dtype=torch.float64) / (P + Q)
    kernel = torch.tensor([[1 - P, P], [Q, 1 - Q]], dtype=torch.float64)
    logits = stacked_forward(stack, torch.tensor([[[0], [1]]]))[0, :, 0].double()  # [x, y]
    loss = -(pi[:, None] * kernel * torch.log_softmax(logits, -1)).sum()
    loss.backward()
    constraint = CanonicalConstraint([cfg], [seed], (), device=torch.device("cpu"))
    for name, param in stack.params.items():
        if name in constraint.fixed_names(stack.params):
            param.grad = None
    constraint.project_(stack.params)
    return stack, constraint


@pytest.mark.parametrize("e0,w0,b0", [(0.3, -0.8, 0.2), (0.7, 0.4, -0.5), (1.1, -0.3, 0.0)])
def test_the_projected_gradient_is_the_reduced_loss_gradient(e0, w0, b0):
    """Independent reference: `landscape.canonical_gradient`, the closed-form derivative of the reduced loss."""
    cfg = exact_model(w0, e0, b0)
    stack, constraint = _exact_loss_gradient(cfg, seed=3)
    u = constraint.u[0].double()
    g_e = float(stack.params["embed.weight"].grad[0, 1].double() @ u)
    # D_w's squared norm is c^2 (d_mlp + d_mlp) = 8, and the projected W_out gradient is g_w c u 1^T
    c = 2 / math.sqrt(cfg.d_mlp)
    g_w = float(stack.params["blocks.0.mlp.out.weight"].grad[0].double().sum(-1) @ u) / (c * cfg.d_mlp)
    g_b = float(stack.params["unembed.bias"].grad[0, 1])
    expected = landscape.canonical_gradient(e0, w0, b0, p=P, q=Q)
    np.testing.assert_allclose([g_e, g_w, g_b], np.asarray(expected, dtype=float), rtol=2e-4, atol=1e-6)
    # and every other weight is fixed
    assert stack.params["blocks.0.attn.q.weight"].grad is None
    assert torch.equal(stack.params["embed.weight"].grad[0, 0], torch.zeros(cfg.d_model))
    assert float(stack.params["unembed.bias"].grad[0, 0]) == 0.0


def test_gradient_descent_on_the_exact_loss_through_the_network_is_the_flow():
    """Plain GD on the network's exact expected loss, gradients projected: the same (e, w, b) path as
    `landscape.gradient_flow` step for step (no sampling noise, so to float32 rounding), across the escape."""
    cfg = exact_model(-1.0, 0.1, 0.0)
    steps, lr = 60, 0.5
    stack = Stack.from_states([cfg], [initial_state(cfg, 1)])
    constraint = CanonicalConstraint([cfg], [1], (), device=torch.device("cpu"))
    fixed = constraint.fixed_names(stack.params)
    pi = torch.tensor([Q, P]) / (P + Q)
    kernel = torch.tensor([[1 - P, P], [Q, 1 - Q]])
    path = []
    for _ in range(steps + 1):
        path.append(landscape.canonical_coordinates({k: v[0].detach() for k, v in stack.params.items()},
                                                    direction=constraint.u[0].numpy()))
        logits = stacked_forward(stack, torch.tensor([[[0], [1]]]))[0, :, 0]
        loss = -(pi[:, None] * kernel * torch.log_softmax(logits, -1)).sum()
        for param in stack.params.values():
            param.grad = None
        loss.backward()
        constraint.project_(stack.params)
        with torch.no_grad():
            for name, param in stack.params.items():
                if name not in fixed:
                    param -= lr * param.grad
    flow = landscape.gradient_flow(0.1, -1.0, 0.0, p=P, q=Q, steps=steps, lr=lr)
    np.testing.assert_allclose(np.array(path), flow.points, atol=2e-5)
    assert flow.points[-1][0] > 0.3  # the path left the unigram line: the test covers the escape, not only the start


def _family_residual(state: dict, u: torch.Tensor) -> float:
    """How far a state is from the canonical family along u (0 on it): the largest deviation of any tensor."""
    e = float(state["embed.weight"][1] @ u)
    m = state["blocks.0.mlp.in.weight"].shape[0]
    c_out = float(state["blocks.0.mlp.out.weight"].sum(-1) @ u) / m
    c_in = float(state["blocks.0.mlp.in.weight"].sum(0) @ u) / m
    on = {"embed.weight": torch.stack([torch.zeros_like(u), e * u]),
          "pos_embed.weight": (-e / 2 * u).expand_as(state["pos_embed.weight"]),
          "blocks.0.mlp.in.weight": c_in * torch.ones(m)[:, None] * u,
          "blocks.0.mlp.out.weight": c_out * u[:, None] * torch.ones(m)}
    return max(max(float((state[k] - v).abs().max()) for k, v in on.items()), abs(abs(c_in) - abs(c_out)),
               float(state["unembed.bias"][0].abs()))


def test_reduced_training_stays_on_the_family_with_momentum_and_clipping():
    run = reduced_run(-0.8, momentum=0.9, grad_clip=0.05, steps=20)
    result = train(run, progress=False)
    state, init = weights(result.model), initial_state(run.model, 0)
    u = init["embed.weight"][1] / init["embed.weight"][1].norm()
    assert _family_residual(state, u) < 1e-6
    for name in ("blocks.0.attn.q.weight", "blocks.0.attn.k.weight", "blocks.0.attn.v.weight", "blocks.0.attn.o.weight"):
        assert torch.equal(state[name], init[name]), name
    proj = landscape.canonical_projection(state, direction=u.numpy())
    assert proj.e != pytest.approx(0.1, abs=1e-4) and proj.embedding_alignment == pytest.approx(1.0, abs=1e-9)


def test_free_training_leaves_the_family():
    """The control: the same recipe without the constraint moves positions and embedding row 0 off it."""
    run = reduced_run(-0.8, steps=20)
    run = run.replace(train=run.train.replace(reduction=None, release=()))
    state, init = weights(train(run, progress=False).model), initial_state(run.model, 0)
    u = init["embed.weight"][1] / init["embed.weight"][1].norm()
    assert _family_residual(state, u) > 1e-3


@pytest.mark.parametrize("part,moved,kept", [
    ("positions", "pos_embed.weight", "embed.weight[0]"),
    ("embedding_row0", "embed.weight[0]", "pos_embed.weight"),
    ("attention", "blocks.0.attn.v.weight", "embed.weight[0]"),
])
def test_a_released_part_leaves_the_family_and_the_rest_stays(part, moved, kept):
    run = reduced_run(-0.8, release=(part,), steps=20, e0=0.6)  # the value matrix's gradient grows with e
    state, init = weights(train(run, progress=False).model), initial_state(run.model, 0)
    u = init["embed.weight"][1] / init["embed.weight"][1].norm()
    e = float(state["embed.weight"][1] @ u)
    on_family = {"embed.weight[0]": lambda s: s["embed.weight"][0],
                 "pos_embed.weight": lambda s: s["pos_embed.weight"] + e / 2 * u,
                 "blocks.0.attn.v.weight": lambda s: s["blocks.0.attn.v.weight"]}
    assert float(on_family[moved](state).abs().max()) > 1e-4
    assert float(on_family[kept](state).abs().max()) < 1e-6


def test_reduced_sgd_follows_gradient_flow_whole_trajectory(tmp_path):
    """Not only the outcome: every checkpoint's (e, w, b) is the flow's at that step, within sampling noise
    (batches of 64 x 32 tokens; the flow is plain GD on the exact reduced loss at the same lr)."""
    from markov_interp import runs

    steps, lr = 120, 0.5
    run = reduced_run(-1.0, steps=steps, batch_size=64, seq_len=32, n_ctx=32, lr=lr, n_checkpoints=6, eval_every=0)
    result = train(run, tmp_path, progress=False)
    assert result.final.eval_loss < landscape.reference_losses(P, Q)["unigram_loss"] - 0.02  # it escaped
    found = runs.list_checkpoints(tmp_path)
    steps_seen = [0] + [s for s, _ in found]
    traj = landscape.coordinates_trajectory([initial_state(run.model, 0)] +
                                            [runs.read_checkpoint(tmp_path, s)[0] for s, _ in found], p=P, q=Q)
    assert len(steps_seen) >= 5 and steps_seen[-1] == steps
    flow = landscape.gradient_flow(0.1, -1.0, 0.0, p=P, q=Q, steps=steps, lr=lr)
    np.testing.assert_allclose(traj.points, flow.points[steps_seen], atol=0.05)
    # that tolerance tells a wrong metric apart (GD on theta projected orthogonally: e at 1/(1 + n_ctx/4) speed)
    slow = landscape.gradient_flow(0.1, -1.0, 0.0, p=P, q=Q, steps=steps, lr=lr / (1 + 32 / 4))
    assert np.abs(traj.points - slow.points[steps_seen]).max() > 0.1


def test_reduced_runs_are_the_same_alone_in_a_stack_and_after_a_resume(tmp_path, monkeypatch):
    run = reduced_run(-0.7, release=("positions",))
    alone = train_many([run], progress=False)[0]
    stacked = train_many([reduced_run(w, seed=s, release=("positions",)) for w, s in ((-0.5, 4), (-0.7, 0))],
                         progress=False)[1]
    assert alone.metrics == stacked.metrics
    for name, value in weights(alone.model).items():
        assert torch.equal(weights(stacked.model)[name], value), name
    reference = train(run, tmp_path / "a", progress=False)
    _killed(monkeypatch, [run], [tmp_path / "b"], at=9)
    resumed = train(run, tmp_path / "b", progress=False)
    assert resumed.resumed_from is not None and resumed.metrics == reference.metrics
    for name, value in weights(reference.model).items():
        assert torch.equal(weights(resumed.model)[name], value), name


@pytest.mark.parametrize("model,train_changes,match", [
    (dict(normalization="LN"), {}, "normalization=None"),
    (dict(act_fn="gelu"), {}, "act_fn='relu'"),
    (dict(tie_weights=False), {}, "tie_weights=True"),
    (dict(init="standard"), {}, "init='canonical'"),
    ({}, dict(optimizer="adamw"), "optimizer='sgd'"),
    ({}, dict(release=["bogus"]), "unknown part"),
    ({}, dict(release=[1]), "release must be a list of part names"),
    ({}, dict(reduction="linear"), "reduction must be"),
    ({}, dict(reduction=None, release=["positions"]), "set reduction='canonical'"),
])
def test_a_reduction_the_model_cannot_keep_is_refused(model, train_changes, match):
    base = reduced_run()
    cfg = base.model.replace(**model) if model else base.model
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace("[", r"\[")):
        RunConfig(source=BINARY, model=cfg, train=base.train.replace(**train_changes))


def test_reduction_fields_left_at_defaults_keep_old_config_json():
    text = RunConfig(source=BINARY, model=exact_model(n_ctx=256), train=TrainConfig()).to_json()
    assert "reduction" not in text and "release" not in text
    assert RunConfig.from_json(reduced_run(release=("mlp",)).to_json()).train.release == ("mlp",)


# ------------------------------------------------------------------------------------- Adam on (e, w, b)
def test_adam_descent_is_adam_on_the_closed_form_gradient():
    """Independent reference: Adam written out on `landscape.canonical_gradient` in numpy."""
    lr, (b1, b2), eps, steps = 0.01, (0.9, 0.95), 1e-8, 25
    inits = np.array([[0.1, -0.5, 0.0], [0.4, 0.3, -0.2]])
    got = landscape.adam_descent(inits[:, 0], inits[:, 1], inits[:, 2], p=P, q=Q, steps=steps, lr=lr)
    x, m, v = inits.copy(), np.zeros_like(inits), np.zeros_like(inits)
    for t in range(1, steps + 1):
        g = np.stack([np.asarray(landscape.canonical_gradient(*row, p=P, q=Q), dtype=float) for row in x])
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        x = x - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    np.testing.assert_allclose(got.points[-1], x, rtol=1e-9, atol=1e-12)
    assert got.points.shape == (steps + 1, 2, 3) and got.loss.shape == (steps + 1, 2)
    with pytest.raises(ValueError, match="lr"):
        landscape.adam_descent(0.1, -0.5, p=P, q=Q, steps=3, lr=0)


# ------------------------------------------------------------------------------------------- the experiment
def test_separatrix_interval_reads_where_the_escaped_fraction_drops():
    w0 = (-0.9, -0.7, -0.5, -0.3)
    assert exp.separatrix_interval(w0, [1.0, 1.0, 0.25, 0.0]) == (-0.7, -0.5)
    assert exp.separatrix_interval(w0, [1.0, 0.5, 0.5, 0.4]) == (-0.5, -0.3)
    assert exp.separatrix_interval(w0, [1.0] * 4) is None
    assert exp.separatrix_interval(w0, [0.0] * 4) is None


def test_the_predicted_boundary_separates_the_flows_outcomes():
    budget = exp.QUICK
    w_star = exp.predicted_boundary(budget)
    assert landscape.W_SADDLE < w_star < 0
    for w, outcome in ((w_star - 0.01, "bigram"), (w_star + 0.01, "unigram")):
        assert landscape.predict_outcome(budget.e0, w, 0.0, p=budget.p, q=budget.q) == outcome


@pytest.mark.parametrize("change,match", [
    (dict(p=0.2, q=0.3), "p \\+ q > 1"), (dict(w0=(-0.5, -0.6)), "increasing"), (dict(arms=("flow",)), "arms"),
    (dict(e0=0.0), "e0 > 0"),
])
def test_bad_reduction_budgets_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        exp.QUICK.replace(**change)


def test_every_arm_spec_is_a_valid_run_with_its_recipe():
    for arm in exp.NETWORK_ARMS:
        cells = exp.arm_spec(exp.QUICK, arm).cells()
        assert len(cells) == len(exp.QUICK.w0) * exp.QUICK.seeds
        train_cfg = cells[0].config.train
        assert (train_cfg.reduction is None) == arm.startswith("free-"), arm
        assert train_cfg.optimizer == ("adamw" if arm == "free-adam" else "sgd"), arm
        assert train_cfg.release == ((arm,) if arm not in ("reduced", "free-sgd", "free-adam") else ()), arm
