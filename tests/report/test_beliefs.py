"""The report of a run on a hidden Markov source (`report.beliefs`): the "Belief states" section on a model whose
belief is known by construction, and `report.build` on a trained run."""

import re

from markov_interp import report, training
from markov_interp.report import beliefs
from tests.handbuilt import BELIEF_KERNEL, belief_model, chain_hmm


def test_belief_section_reads_the_planted_belief_and_its_causal_use():
    """The hand-built model's stream holds the belief and its logits read it: R^2 1 at every site, the causal
    effect near 1 and the random plane's well below."""
    section = beliefs.belief_section(belief_model(BELIEF_KERNEL), chain_hmm(BELIEF_KERNEL), n_sequences=200,
                                     seq_len=16, seed=0)
    assert (section.id, section.title) == ("beliefs", "Belief states")
    body = section.body()
    for site in ("L0.resid_pre", "L0.resid_post", "all layers"):
        assert re.search(rf"<td>{site}</td><td>1\.000 \[", body), site
    effect, control = (float(v) for v in re.findall(r"(?:moves the next-token law|moves it) (-?[0-9.]+) \[", body))
    assert effect > 0.95 and control < 0.5
    assert "<svg" in body and "held-out positions" in body


def test_build_gives_a_hidden_run_its_belief_states(tmp_path):
    run = training.default_run(kind="hmm", process="mess3", n_layers=2, d_model=8, n_heads=1, tie_weights=False,
                               n_ctx=10, seq_len=10, batch_size=8, steps=4, seed=0, eval_every=2, n_checkpoints=0,
                               log_every=2)
    training.train(run, tmp_path / "run", progress=False)
    rep = report.build(tmp_path / "run", device="cpu")
    assert tuple(s.id for s in rep.sections) == beliefs.HIDDEN_SECTION_IDS and rep.mechanism is None
    summary = rep.section("summary").body()
    assert "Bayes-optimal loss at the training length is 0.8025" in summary  # theory's exact Mess3 reference
    assert "Loss during training" in summary and rep.to_dict()["mechanism"] is None
    assert "belief states" in repr(rep)
    assert rep.save().read_text(encoding="utf-8") == rep.html
