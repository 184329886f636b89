"""Belief-state geometry: do transformers trained on hidden Markov processes hold the Bayesian belief over the
hidden states linearly in their residual stream, and do they use it?

Shai et al. 2024 ("Transformers represent belief state geometry in their residual stream", arXiv 2405.15943)
trained small transformers (4 layers, d_model 64, context 10 for Mess3) and found, by linear regression of the
forward filter's belief on the residual stream, two claims read here beside the numbers:

- **Mess3**: the belief (a fractal in the simplex) is linear in the final layer's residual stream;
- **RRXOR**: the belief is linear only across the layers together (the concatenated residual streams), not in any
  one layer.

Per process (`budget.processes`, `sources.hmm_preset` at its defaults) `budget.seeds` models are trained (one
stack per process, `sweep.run`). Per model, on one probe batch per process (the same for every seed; sequences of
seq_len + 1 tokens, the first seq_len the model's input):

- **loss against Bayes**: the model's log-loss at each position beside the forward filter's on the same tokens
  (`excess` = their difference, averaged over positions), and the exact per-position Bayes loss of `theory`;
- **belief R^2**: `probes.beliefs.belief_probes` (ridge, held-out half of the sequences, R^2 pooled over the hidden
  states, shuffled control) at the residual stream entering the first block (the embeddings), after each block,
  and on all of them concatenated ("all layers"); per seed its R^2 and the gaps "all layers" - final layer and
  "all layers" - best single layer;
- **causal test**: `probes.beliefs.belief_patch` after each block, on fresh sequences: the probe's subspace (its
  activation pattern's span) taken from a counterfactual sequence; the effect (the law's move towards the
  counterfactual's Bayes prediction, 1 = as far as Bayes) beside a random subspace of the same dimension, and the
  decoder-span variant (`subspace="weights"`).

Statistics over seeds: means with bootstrap 95% intervals (`_shared.mean_interval`). The claims' verdicts
(`claims`): "linear in the final layer" holds when the final layer's R^2 interval lies above `HIGH` and the gain
of "all layers" over it below `GAP`; "needs the layers together" holds when the gain of "all layers" over the best
single layer lies above `GAP` and "all layers" above `HIGH` ("partly" when the gain holds and "all layers" does
not reach `HIGH`); each rule is applied to both processes, the other process as the contrast. A process whose
models' excess loss (upper bound over seeds) exceeds `LEARNT` of the step from the unigram loss to the exact Bayes
loss is "not tested": its models have not learnt it, so their residual stream says nothing about the claims. The final weights of
every model are copied to out/models/<process>-seed<k>/ (model.safetensors, config.json) for probing again.
"""

import dataclasses
import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch

from markov_interp.experiments import Budget, Experiment, Section, Table, _shared, register
from markov_interp.sweep import SweepSpec

if TYPE_CHECKING:  # annotations only: probes and models load TransformerLens
    from markov_interp.models import HookedModel
    from markov_interp.sources import HiddenMarkov

__all__ = ["HiddenBudget", "QUICK", "STANDARD", "FULL", "TINY", "HIGH", "GAP", "LEARNT", "EXPERIMENT", "hidden_specs",
           "measure_model", "process_summary", "claims", "HiddenResult", "run", "read"]

HIGH = 0.9  # R^2 at or above which the belief counts as linearly there
GAP = 0.05  # R^2 points of gain that count as "needs more than one layer"
LEARNT = 0.25  # a process is tested when its models' excess loss is at most this share of the unigram-to-Bayes step
_PROBE_SEED = 9_000  # the probe batch of every model of a process: hmm.sample(generator seeded _PROBE_SEED)
_PATCH_SEED = 9_001  # the fresh batch of the causal test
_SIMPLEX_POINTS = 1500  # held-out points of seed 0 kept for the simplex figure


@dataclasses.dataclass(frozen=True, kw_only=True)
class HiddenBudget(Budget):
    """Seeds, models and recipe of the belief-state experiment."""

    processes: tuple[str, ...] = ("mess3", "rrxor")
    n_layers: int = 4
    d_model: int = 64
    seq_len: int = 10  # the model's context (Shai et al.: 10 for Mess3)
    batch_size: int = 64
    lr: float = 3e-3  # peak of the one-cycle schedule (AdamW)
    eval_every: int = 500
    eval_batches: int = 4
    probe_sequences: int = 1000  # the probes' batch (half held out)
    patch_sequences: int = 200  # the causal test's fresh batch
    n_bootstrap: int = 200  # per-model intervals (the claims use the intervals over seeds)
    workers: Optional[int] = 1  # training processes (a shared 2-core machine: one)

    def check(self) -> None:
        from markov_interp.sources.hmm import PRESETS

        unknown = [p for p in self.processes if p not in PRESETS]
        if unknown:
            raise ValueError(f"budget {self.name!r}: processes must be presets of sources.hmm.PRESETS, got {unknown}")
        if self.seq_len < 2:
            raise ValueError(f"budget {self.name!r}: seq_len must be at least 2, got {self.seq_len}")


FULL = HiddenBudget(name="full", seeds=8, steps=20000)
STANDARD = HiddenBudget(
    name="standard", seeds=8, steps=1000,
    cuts="1000 steps of 64 sequences (full: 20000; Shai et al. train far longer), sized to a shared 2-core CPU; "
         "Shai et al.'s model shape (4 layers, one head, d_model 64, context 10)")
QUICK = HiddenBudget(
    name="quick", seeds=2, steps=300, d_model=16, n_layers=2, probe_sequences=200, patch_sequences=64,
    n_bootstrap=50, eval_every=100,
    cuts="2 seeds, 2 layers of d_model 16, 300 steps, 200 probe sequences: a smoke test of the code path")
TINY = HiddenBudget(name="tiny", seeds=2, steps=4, d_model=8, n_layers=2, batch_size=4, probe_sequences=8,
                    patch_sequences=4, n_bootstrap=10, eval_every=2, eval_batches=1,
                    cuts="a smoke test of the code path; its numbers show nothing")


def hidden_specs(budget: HiddenBudget) -> list[SweepSpec]:
    """One sweep per process: `budget.seeds` seeds of the model and recipe of `budget` (one stack)."""
    model = {"n_layers": budget.n_layers, "d_model": budget.d_model, "n_heads": 1, "n_ctx": budget.seq_len,
             "tie_weights": False}
    train = {"steps": budget.steps, "seq_len": budget.seq_len, "batch_size": budget.batch_size, "lr": budget.lr,
             "eval_every": budget.eval_every, "eval_batches": budget.eval_batches, "log_every": budget.eval_every,
             "n_checkpoints": 0, "device": budget.device}
    return [SweepSpec(name=f"hidden-{process}", base={"source": {"kind": "hmm", "process": process},
                                                       "model": model, "train": train},
                      seeds=tuple(range(budget.seeds)), probe=False) for process in budget.processes]


# --------------------------------------------------------------------------------------------- measures
def _batch(source: "HiddenMarkov", n: int, length: int, seed: int) -> torch.Tensor:
    return source.sample(n, length, generator=torch.Generator().manual_seed(seed))


def _losses(model: "HookedModel", source: "HiddenMarkov", tokens: torch.Tensor) -> dict:
    """The model's and the forward filter's log-loss per position on the same tokens (inputs tokens[:, :-1])."""
    from markov_interp import probes, theory

    probs = probes.next_state_probs(model, tokens[:, :-1])  # [batch, seq_len, vocab]: the model's context
    # target_log_loss drops the last position's law (it has no target): a copy of the model's last one stands there
    model_loss = theory.target_log_loss(torch.cat([probs, probs[:, -1:]], dim=1), tokens)
    bayes_loss = theory.target_log_loss(source.predictive(tokens), tokens)
    return {"model_curve": model_loss.mean(0).tolist(), "bayes_curve": bayes_loss.mean(0).tolist(),
            "model_loss": float(model_loss.mean()), "bayes_loss": float(bayes_loss.mean()),
            "excess": float((model_loss - bayes_loss).mean())}


def _fit_json(fit: Any) -> dict:
    return {"site": fit.site, "r2": fit.score, "r2_ci": list(fit.score_ci), "control": fit.control,
            "selectivity": fit.selectivity, "per_state": list(fit.per_output)}


def _patch_json(patch: Any, weights: Any) -> dict:
    return {"site": patch.site, "dimension": patch.dimension, "effect": patch.effect, "effect_ci": list(patch.effect_ci),
            "control": patch.control, "control_ci": list(patch.control_ci), "difference_ci": list(patch.difference_ci),
            "bayes_move": patch.bayes_move, "weights_effect": weights.effect}


@torch.no_grad()
def measure_model(model: "HookedModel", source: "HiddenMarkov", budget: HiddenBudget, *,
                  points: bool = False) -> dict:
    """Loss against Bayes, belief R^2 at every layer and across them, and the causal test of one trained model
    (module docstring); with `points`, the held-out simplex points too.

    Args:
        model: a trained model.
        source: its hidden Markov source.
        budget: the probe sizes.
        points: keep the simplex points (seed 0).

    Returns:
        {"loss": ..., "probes": [per site], "gaps": {"all_minus_final", "all_minus_best"}, "patches": [per
        layer], "points": ... or None}.
    """
    from markov_interp import probes
    from markov_interp.probes import beliefs

    tokens = _batch(source, budget.probe_sequences, budget.seq_len + 1, _PROBE_SEED)
    inputs = tokens[:, :-1]
    table = probes.beliefs.belief_probes(model, inputs, source, n_bootstrap=budget.n_bootstrap, seed=0)
    fresh = _batch(source, budget.patch_sequences, budget.seq_len, _PATCH_SEED)
    patches = []
    for fit in table.fits[1:-1]:  # after each block
        patch = probes.beliefs.belief_patch(model, fresh, source, fit, n_bootstrap=budget.n_bootstrap)
        weights = probes.beliefs.belief_patch(model, fresh, source, fit, subspace="weights", n_bootstrap=0)
        patches.append(_patch_json(patch, weights))
    layers = [fit.score for fit in table.fits[:-1]]
    together = table[probes.beliefs.ALL_LAYERS].score
    return {"loss": _losses(model, source, tokens), "probes": [_fit_json(f) for f in table.fits],
            "gaps": {"all_minus_final": together - layers[-1], "all_minus_best": together - max(layers)},
            "patches": patches,
            "points": beliefs.simplex_points(model, inputs, source, table, limit=_SIMPLEX_POINTS) if points else None}


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """One trained model: its process, seed, status and measures (None unless it finished)."""

    process: str
    seed: int
    status: str
    measure: Optional[dict]

    def to_json(self) -> dict:
        return {"process": self.process, "seed": self.seed, "status": self.status, "measure": self.measure}


def _measure_key(budget: HiddenBudget) -> str:
    return (f"hidden-1:{budget.probe_sequences}x{budget.seq_len}:{budget.patch_sequences}:boot{budget.n_bootstrap}:"
            f"seeds{_PROBE_SEED},{_PATCH_SEED}")


def measure_rows(rows: list, work: Path, budget: HiddenBudget, *, progress: bool = False) -> list[RunRecord]:
    """Each sweep row as a `RunRecord`, its model loaded from its folder and measured (cached in work/measures)."""
    from tqdm.auto import tqdm

    from markov_interp import runs

    records = []
    for row in tqdm(rows, disable=not progress, desc="measure", unit="run"):
        cfg = row.config
        where = dict(process=cfg.source.process, seed=cfg.train.seed, status=row.status)
        if row.status != "ok":
            records.append(RunRecord(**where, measure=None))
            continue
        folder, points = work / row.run_dir, cfg.train.seed == 0

        def measure() -> dict:
            return measure_model(runs.load_model(folder, device="cpu"), cfg.source.build(), budget, points=points)

        key = _measure_key(budget) + f":points{points}"
        records.append(RunRecord(**where, measure=_shared.cached_measure(work, row.cell_id, key, measure)))
    return records


def export_weights(rows: list, work: Path, out: Path) -> list[Path]:
    """Copy every finished model's final weights and config.json to out/<process>-seed<k>/ (what is committed
    beside results.json, so the findings can be probed again: `runs.load_model(folder)`)."""
    from markov_interp.runs.folder import CONFIG_FILE, WEIGHTS_FILE

    written = []
    for row in rows:
        if row.status != "ok":
            continue
        target = out / f"{row.config.source.process}-seed{row.config.train.seed}"
        target.mkdir(parents=True, exist_ok=True)
        for name in (WEIGHTS_FILE, CONFIG_FILE):
            shutil.copyfile(work / row.run_dir / name, target / name)
        written.append(target)
    return written


# ------------------------------------------------------------------------------------------------ summaries
def _stat(values: list[float]) -> dict:
    return {"mean": _shared.mean(values), "interval": list(_shared.mean_interval(values)), "n": len(values)}


def process_summary(process: str, records: list[RunRecord]) -> dict:
    """Over the seeds of one process: loss against Bayes, R^2 and control per site, the gaps, the causal test per
    layer (means with bootstrap 95% intervals over seeds)."""
    done = [r.measure for r in records if r.process == process and r.measure is not None]
    if not done:
        return {"process": process, "n": 0}
    sites = [p["site"] for p in done[0]["probes"]]
    layers = [p["site"] for p in done[0]["patches"]]
    return {
        "process": process, "n": len(done),
        "excess": _stat([m["loss"]["excess"] for m in done]),
        "model_loss": _stat([m["loss"]["model_loss"] for m in done]),
        "bayes_loss": _stat([m["loss"]["bayes_loss"] for m in done]),
        "r2": {s: _stat([m["probes"][i]["r2"] for m in done]) for i, s in enumerate(sites)},
        "control": {s: _stat([m["probes"][i]["control"] for m in done]) for i, s in enumerate(sites)},
        "gaps": {g: _stat([m["gaps"][g] for m in done]) for g in ("all_minus_final", "all_minus_best")},
        "patch": {s: {k: _stat([m["patches"][i][k] for m in done]) for k in ("effect", "control", "weights_effect")}
                  for i, s in enumerate(layers)},
        "curves": {k: [_shared.mean([m["loss"][k][t] for m in done]) for t in range(len(done[0]["loss"][k]))]
                   for k in ("model_curve", "bayes_curve")},
    }


def _lo(stat: dict) -> float:
    return stat["interval"][0]


def _hi(stat: dict) -> float:
    return stat["interval"][1]


def _final_layer_verdict(summary: dict) -> str:
    final = summary["r2"][list(summary["r2"])[-2]]  # the last site before "all layers"
    gain = summary["gaps"]["all_minus_final"]
    if not math.isfinite(_lo(final)) or not math.isfinite(_lo(gain)):
        return "not resolved (too few seeds)"
    if _lo(final) >= HIGH and _hi(gain) < GAP:
        return "holds"
    if _hi(final) < HIGH or _lo(gain) > GAP:
        return "fails at this budget"
    return "not resolved"


def _together_verdict(summary: dict) -> str:
    together = summary["r2"]["all layers"]
    gain = summary["gaps"]["all_minus_best"]
    if not math.isfinite(_lo(together)) or not math.isfinite(_lo(gain)):
        return "not resolved (too few seeds)"
    if _lo(gain) > GAP:
        return "holds" if _lo(together) >= HIGH else (
            "partly: the layers together read more than any one, but not the whole belief")
    if _hi(gain) < GAP:
        return "fails at this budget: one layer reads as much as all together"
    return "not resolved"


_CLAIMS = (("Mess3", "mess3", "the belief is linear in the final layer", _final_layer_verdict),
           ("RRXOR", "rrxor", "the belief is linear only across the layers together", _together_verdict))


def _unlearnt(summary: dict, references: Optional[dict]) -> Optional[str]:
    """Why a process's claims cannot be tested (its models are still far from the Bayes loss), or None.

    The excess loss's upper bound over seeds is compared with the step from the unigram loss to the exact Bayes
    loss: a model more than `LEARNT` of that step above Bayes has not learnt the process, and what its residual
    stream holds says nothing about Shai et al.'s trained models."""
    refs = (references or {}).get(summary["process"])
    if refs is None:
        return None
    step, excess = refs["unigram_loss"] - refs["bayes_loss"], _hi(summary["excess"])
    if not math.isfinite(excess) or excess <= LEARNT * step:
        return None
    return (f"not tested: the models have not learnt the process (excess loss up to {excess:.3f} nats, "
            f"{excess / step:.0%} of the {step:.3f} nats from the unigram to the Bayes loss)")


def claims(summaries: list[dict], references: Optional[dict] = None) -> list[dict]:
    """One row per claim and process: the claim's own process, then the other as the contrast (the same rule).

    Args:
        summaries: `process_summary` per process.
        references: theory's references per process (`HiddenResult.references`): a process whose models are more
            than `LEARNT` of the unigram-to-Bayes step above the Bayes loss is not tested (`_unlearnt`).

    Returns:
        Rows {"claim", "process", "role", "final_site", "final_r2", "all_r2", "gap_final", "gap_best", "verdict"}.
    """
    found = {s["process"]: s for s in summaries if s["n"]}
    rows = []
    for name, own, claim, verdict in _CLAIMS:
        for process in [own] + [p for p in found if p != own]:
            summary = found.get(process)
            final = list(summary["r2"])[-2] if summary else None
            said = (_unlearnt(summary, references) or verdict(summary)) if summary else "not tested at this budget"
            rows.append({"claim": f"{name}: {claim}", "process": process, "role": "claim" if process == own
                         else "contrast", "final_site": final,
                         "final_r2": summary["r2"][final] if summary else None,
                         "all_r2": summary["r2"]["all layers"] if summary else None,
                         "gap_final": summary["gaps"]["all_minus_final"] if summary else None,
                         "gap_best": summary["gaps"]["all_minus_best"] if summary else None,
                         "verdict": said})
    return rows


def _fmt(stat: Optional[dict], digits: int = 3) -> str:
    if not stat or not stat.get("n"):
        return "—"
    lo, hi = stat["interval"]
    ci = "" if not math.isfinite(lo) else f" [{lo:.{digits}f}, {hi:.{digits}f}]"
    return f"{stat['mean']:.{digits}f}{ci}"


def claims_table(rows: list[dict]) -> Table:
    return Table(("claim (Shai et al. 2024)", "process", "final layer R^2", "all layers R^2",
                  "all - final", "all - best layer", "at this budget"),
                 [(r["claim"], f"{r['process']} ({r['role']})", _fmt(r["final_r2"]), _fmt(r["all_r2"]),
                   _fmt(r["gap_final"]), _fmt(r["gap_best"]), r["verdict"]) for r in rows])


def r2_table(summaries: list[dict]) -> Table:
    """Belief R^2 per site and process (mean over seeds, 95% interval) beside its shuffled control."""
    rows = []
    for s in summaries:
        for site, stat in s.get("r2", {}).items():
            rows.append((s["process"], site, _fmt(stat), _fmt(s["control"][site])))
    return Table(("process", "site", "belief R^2 [95% CI over seeds]", "shuffled control"), rows)


def patch_table(summaries: list[dict]) -> Table:
    """The causal test per layer: the effect of the probe's pattern span, of a random span, of the decoder's."""
    rows = []
    for s in summaries:
        for site, p in s.get("patch", {}).items():
            rows.append((s["process"], site, _fmt(p["effect"]), _fmt(p["control"]), _fmt(p["weights_effect"])))
    return Table(("process", "site", "effect: probe's pattern span", "random span (control)",
                  "decoder's span"), rows)


def loss_table(summaries: list[dict], references: dict) -> Table:
    rows = []
    for s in summaries:
        if not s["n"]:
            continue
        refs = references[s["process"]]
        rows.append((s["process"], str(s["n"]), _fmt(s["model_loss"], 4), _fmt(s["bayes_loss"], 4),
                     _fmt(s["excess"], 4), f"{refs['bayes_loss']:.4f}", f"{refs['entropy_rate']:.4f} "
                     f"({refs['entropy_rate_method']})", f"{refs['unigram_loss']:.4f}"))
    return Table(("process", "seeds", "model loss", "Bayes on the same tokens", "excess", "exact Bayes loss",
                  "entropy rate", "unigram loss"), rows)


def setup_text(budget: HiddenBudget) -> str:
    return (f"Sources: {', '.join(budget.processes)} (`sources.hmm_preset`, defaults; Mess3 x = 0.05, alpha = "
            f"0.85). Models: {budget.n_layers} layers, one head, d_model {budget.d_model}, MLP 4 x d_model, "
            f"pre-LayerNorm, untied unembedding, context {budget.seq_len} (Shai et al.: 4 layers, d_model 64, "
            f"context 10). Training: {budget.steps} steps of {budget.batch_size} fresh sequences, AdamW, one-cycle "
            f"to lr {budget.lr:g}, fp32, seeds 0..{budget.seeds - 1}. Probes: {budget.probe_sequences} sequences per "
            f"process (the same for every seed), ridge on half of them, R^2 on the other half; the causal test on "
            f"{budget.patch_sequences} fresh sequences. Verdict thresholds: R^2 >= {HIGH} counts as linearly there, "
            f"a gain above {GAP} as needing more than one layer; a process is tested when its models' excess loss is "
            f"at most {LEARNT:.0%} of the step from the unigram to the Bayes loss.")


# ------------------------------------------------------------------------------------------------ result
@dataclasses.dataclass(frozen=True, kw_only=True)
class HiddenResult(_shared.GridResult):
    """The experiment at one budget: per-model records, per-process summaries, the claims, the references."""

    claims: list
    references: dict  # per process: theory's references at the training length (as_row)

    def sections(self) -> list[Section]:
        return [Section("Setup", setup_text(self.budget)),
                Section("Beside Shai et al.'s claims", "", claims_table(self.claims)),
                Section("Loss against the Bayes-optimal predictor", "Log-loss in nats per token, averaged over the "
                        "positions of the probe batch (mean over seeds, bootstrap 95% interval).",
                        loss_table(self.cells, self.references), figures=("loss_by_position.png",)),
                Section("Belief R^2 per layer", "L0.resid_pre is the embeddings (entering block 0); Lk.resid_post "
                        "the stream after block k; all layers the concatenation.", r2_table(self.cells),
                        figures=("belief_r2.png", "belief_simplex.png")),
                Section("Causal test", "Effect: how far the next-token law moves towards the counterfactual's Bayes "
                        "prediction when the stream's component in the subspace is taken from the counterfactual "
                        "sequence (1: as far as Bayes).", patch_table(self.cells))]

    def figures(self) -> dict[str, Any]:
        from markov_interp.experiments._figures_hidden import loss_by_position_figure, r2_by_layer_figure
        from markov_interp.report.beliefs import belief_simplex_figure

        drawn = {"loss_by_position.png": loss_by_position_figure(self.cells),
                 "belief_r2.png": r2_by_layer_figure(self.cells)}
        points = {r.process: r.measure["points"] for r in self.records
                  if r.measure is not None and r.measure.get("points")}
        if points:
            drawn["belief_simplex.png"] = belief_simplex_figure(points, title="seed 0 of each process")
        return drawn

    def tables(self) -> dict[str, Table]:
        return {"belief_r2.csv": r2_table(self.cells), "causal.csv": patch_table(self.cells)}

    def to_json(self) -> dict:
        return {"processes": self.cells, "claims": self.claims, "references": self.references,
                "runs": [r.to_json() for r in self.records]}


def _references(budget: HiddenBudget) -> dict:
    from markov_interp import theory
    from markov_interp.sources import hmm_preset

    return {p: theory.reference_losses(hmm_preset(p), budget.seq_len + 1).as_row() for p in budget.processes}


def _result(budget: HiddenBudget, records: list[RunRecord], n_failed: int) -> HiddenResult:
    summaries = [process_summary(p, records) for p in budget.processes]
    references = _references(budget)
    return HiddenResult(budget=budget, records=tuple(records), cells=summaries, claims=claims(summaries, references),
                        references=references, n_failed=n_failed)


def read(budget: HiddenBudget, result: dict) -> HiddenResult:
    """results.json's "result" read back (`experiments.load`): the per-model measures as records, every summary
    and claim recomputed by the current code."""
    records = [RunRecord(process=r["process"], seed=int(r["seed"]), status=r["status"], measure=r["measure"])
               for r in result["runs"]]
    return _result(budget, records, sum(r.status not in ("ok", "diverged") for r in records))


def run(budget: HiddenBudget, out: Path, *, progress: bool = False) -> HiddenResult:
    """Train every process's seeds into out/runs (restartable), measure every model (cached), copy the final
    weights to out/models and summarise.

    Args:
        budget: the processes, models and recipe.
        out: the experiment's folder.
        progress: tqdm bars.

    Returns:
        A `HiddenResult`.
    """
    work = Path(out) / "runs"
    trained = _shared.train_grid(hidden_specs(budget), work, workers=budget.workers, group=budget.seeds,
                                 progress=progress)
    records = measure_rows(trained.rows, work, budget, progress=progress)
    export_weights(trained.rows, work, Path(out) / "models")
    return _result(budget, records, trained.n_failed)


EXPERIMENT = register(Experiment(name="hidden", title="Belief states of hidden Markov sources (Shai et al. 2024)",
                                 budgets={"quick": QUICK, "standard": STANDARD, "full": FULL, "tiny": TINY},
                                 run=run, read=read, precision="fp32"))
