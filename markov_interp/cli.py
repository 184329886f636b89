"""Command-line interface: a thin layer over the Python API.

Each sub-command is one `_add_<name>` function that registers its arguments and a handler; handlers only
parse, call the library and print. Errors a user can cause (`ValueError`, `FileNotFoundError`) are printed
as one line on stderr with exit code 2, never as a traceback.
"""

import argparse
import sys


def _add_train(sub: argparse._SubParsersAction) -> None:
    # Owned by the models/training work (issue 3).
    p = sub.add_parser(
        "train",
        help="train a transformer on a Markov source into a run folder (resumes / skips when possible)",
        description="Train a transformer on fresh Markov batches. With no flags: the paper's one-layer model "
        "on the binary chain p=0.2, q=0.3, 300 steps of 16 x 256 states (about 10 s on a CPU core). "
        "Re-running on the same --out resumes from the newest checkpoint; a finished run is not retrained; "
        "a folder holding a different config is refused.",
    )
    p.add_argument("--out", required=True, help="run folder (config.json, metrics.jsonl, model.safetensors)")
    g = p.add_argument_group("data")
    g.add_argument("--source", choices=["binary", "markov", "random"], default="binary",
                   help="binary: fixed two-state chain (--p, --q); markov: any fixed kernel (--kernel, --order); "
                   "random: a fresh Dirichlet kernel per sequence")
    g.add_argument("--p", type=float, default=0.2, help="binary: P(0 -> 1) (default 0.2)")
    g.add_argument("--q", type=float, default=0.3, help="binary: P(1 -> 0) (default 0.3)")
    g.add_argument("--vocab", type=int, default=2, help="random: number of states (default 2)")
    g.add_argument("--alpha", type=float, default=1.0, help="random: Dirichlet concentration (default 1)")
    g.add_argument("--kernel", default=None,
                   help="markov: the kernel as JSON, e.g. '[[0.9,0.1,0],[0.2,0.5,0.3],[0,0.4,0.6]]' (rows: "
                   "current state, columns: next state; for order k, nested k+1 deep or flat [V**k, V])")
    g.add_argument("--order", type=int, default=1, help="markov / random: chain order k (default 1)")
    g = p.add_argument_group("model (a preset, then overrides; d_vocab follows the source)")
    g.add_argument("--preset", default=None,
                   help="paper-1layer (default for fixed kernels), paper-2layer, attn-only-2layer (default for random)")
    g.add_argument("--layers", type=int, help="number of blocks")
    g.add_argument("--heads", type=int, help="attention heads per block")
    g.add_argument("--d-model", type=int, help="residual width (d_head, d_mlp follow unless set)")
    g.add_argument("--d-mlp", type=int, help="MLP hidden width")
    g.add_argument("--attn-only", action="store_true", help="no MLPs")
    g.add_argument("--no-tie", action="store_true", help="untie the unembedding from the embedding")
    g.add_argument("--init", choices=["standard", "canonical"], help="initialisation (see models.ModelConfig)")
    g.add_argument("--n-ctx", type=int, help="context length of the model (default 1024)")
    g = p.add_argument_group("training")
    g.add_argument("--seq-len", type=int, default=256, help="input length (default 256; the paper: 1024)")
    g.add_argument("--batch-size", type=int, default=16, help="sequences per step (default 16)")
    g.add_argument("--steps", type=int, default=None,
                   help="optimiser steps (default 300 for fixed kernels, 1000 for random)")
    g.add_argument("--lr", type=float, default=None,
                   help="peak learning rate (default 2e-3, the paper's, for fixed kernels; 1e-2 for random, where the "
                   "two-layer attention-only model then reaches the Bayes loss within ~1000 steps)")
    g.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    g.add_argument("--schedule", choices=["one-cycle", "constant"], default="one-cycle")
    g.add_argument("--seed", type=int, default=0, help="model init and data seed (default 0)")
    g.add_argument("--seeds", default=None,
                   help="train several seeds as one stacked model into OUT/seed-N/, e.g. 0-7 or 0,3,5 (overrides "
                   "--seed; each member equals its solo run up to float rounding)")
    g.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32",
                   help="fp32 (default) or autocast fp16 / bf16; precision changes the paper's outcome")
    g.add_argument("--loss-scaling", action="store_true", help="fp16 with dynamic loss scaling")
    g.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    g.add_argument("--eval-every", type=int, default=100, help="evaluate every N steps (0: only at the end)")
    g.add_argument("--checkpoints", type=int, default=8, help="log-spaced checkpoints to keep (default 8)")
    g.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (default: torch's choice; 1 is often fastest for tiny models)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")

    def handler(args: argparse.Namespace) -> int:
        import json

        import torch

        from markov_interp.data import SourceConfig
        from markov_interp.models import preset
        from markov_interp.training import RunConfig, TrainConfig

        if args.threads is not None:
            if args.threads < 1:
                raise ValueError(f"--threads must be >= 1, got {args.threads}")
            torch.set_num_threads(args.threads)
        if args.kernel is not None and args.source != "markov":
            raise ValueError("--kernel needs --source markov")
        if args.source == "binary":
            source = SourceConfig(kind="binary", p=args.p, q=args.q)
        elif args.source == "markov":
            if args.kernel is None:
                raise ValueError("--source markov needs --kernel (a JSON array of transition probabilities)")
            try:
                kernel = json.loads(args.kernel)
            except json.JSONDecodeError as err:
                raise ValueError(f"--kernel is not valid JSON ({err.msg}): {args.kernel!r}") from None
            source = SourceConfig(kind="markov", kernel=kernel, order=args.order)
        else:
            source = SourceConfig(kind="random", vocab=args.vocab, alpha=args.alpha, order=args.order)
        name = args.preset or ("attn-only-2layer" if args.source == "random" else "paper-1layer")
        overrides = {"d_vocab": source.vocab_size}
        for flag, field in (("layers", "n_layers"), ("heads", "n_heads"), ("d_model", "d_model"),
                            ("d_mlp", "d_mlp"), ("init", "init"), ("n_ctx", "n_ctx")):
            if getattr(args, flag) is not None:
                overrides[field] = getattr(args, flag)
        if args.attn_only:
            overrides["attn_only"] = True
        if args.no_tie:
            overrides["tie_weights"] = False
        model = preset(name, **overrides)
        binary = args.source != "random"  # fixed kernels: the paper's recipe
        steps = args.steps if args.steps is not None else (300 if binary else 1000)
        lr = args.lr if args.lr is not None else (2e-3 if binary else 1e-2)
        train_cfg = TrainConfig(
            steps=steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=lr,
            optimizer=args.optimizer, schedule=args.schedule, seed=args.seed, precision=args.precision,
            loss_scaling=args.loss_scaling, device=args.device, eval_every=args.eval_every,
            n_checkpoints=args.checkpoints,
        )
        run = RunConfig(source=source, model=model, train=train_cfg)
        # One run or many, through the stacked path (a single run is a stack of one; members equal solo
        # `training.train` up to float rounding): it writes the same run folders and, needing no hooked model,
        # never imports transformer_lens (seconds of start-up).
        import dataclasses
        from pathlib import Path

        from markov_interp.stacked_training import train_many

        seeds = [args.seed] if args.seeds is None else _parse_seeds(args.seeds)
        runs = [dataclasses.replace(run, train=dataclasses.replace(train_cfg, seed=s)) for s in seeds]
        outs = [Path(args.out)] if args.seeds is None else [Path(args.out) / f"seed-{s}" for s in seeds]
        results = train_many(runs, outs, progress=not args.no_progress, models_out=False)
        failed = 0
        for seed, out, result in zip(seeds, outs, results):
            label = "" if args.seeds is None else f"seed {seed}: "
            if result.failed:
                failed += 1
                print(f"{label}FAILED, {result.failed} -> {out}")
            else:
                print(label + _train_summary(result, out))
        return 1 if failed else 0

    p.set_defaults(handler=handler)


def _parse_seeds(text: str) -> list[int]:
    """Seeds from "0-7" (inclusive range), "0,3,5" or a mix ("1,4-6"); ValueError naming --seeds otherwise."""
    seeds: list[int] = []
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"--seeds must look like 0-7 or 0,3,5 (seeds >= 0), got {text!r}")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise ValueError(f"--seeds range {part.strip()!r} is empty (end before start)")
        seeds += range(first, last + 1)
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds lists a seed twice: {text!r}")
    return seeds


def _train_summary(result, out) -> str:
    f = result.final
    parts = [f"final eval loss {f['eval_loss']:.4f} nats", f"entropy rate {f['entropy_rate']:.4f}",
             f"unigram loss {f['unigram_loss']:.4f}"]
    if "bayes_loss" in f:
        parts.append(f"in-context Bayes loss {f['bayes_loss']:.4f}")
    status = "already trained" if result.already_done else (
        f"resumed from step {result.resumed_from}" if result.resumed_from else "trained")
    return f"{status} ({f['step']} steps): " + ", ".join(parts) + f" -> {out}"


def _add_probe(sub: argparse._SubParsersAction) -> None:
    # Owned by the probes work (issue 4).
    p = sub.add_parser(
        "probe",
        help="name the mechanism of a trained model (unigram, kernel or induction) with the evidence",
        description="Load the model of a run folder and run markov_interp.probes.classify_mechanism on fresh "
        "sequences from the run's source: losses beside theory's references, state / context dependence, "
        "per-head previous-token / induction / same-token scores beside chance, head ablations, implied kernel.",
    )
    p.add_argument("run_dir", help="run folder written by `markov-interp train` (config.json, model.safetensors)")
    p.add_argument("--json", action="store_true", help="print the full report as JSON instead of a summary")
    p.add_argument("--seq-len", type=int, default=None,
                   help="probe sequence length (default: the run's training length, at most 256)")
    p.add_argument("--n-sequences", type=int, default=64, help="probe sequences (default 64)")
    p.add_argument("--seed", type=int, default=0, help="seed of the probe sequences (default 0)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, ...")

    def handler(args: argparse.Namespace) -> int:
        import json
        from pathlib import Path

        from markov_interp import models
        from markov_interp.probes import classify_mechanism
        from markov_interp.training import CONFIG_FILE, RunConfig

        run_dir = Path(args.run_dir)
        config_path = run_dir / CONFIG_FILE
        if not config_path.is_file():
            raise FileNotFoundError(f"{config_path} not found: is {run_dir} a run folder written by `train`?")
        run = RunConfig.from_json(config_path.read_text())
        model = models.load(run_dir, device=args.device, expect=run.model)
        seq_len = args.seq_len if args.seq_len is not None else min(run.train.seq_len, 256)
        report = classify_mechanism(model, run.source.build(), seq_len=seq_len, n_sequences=args.n_sequences,
                                    seed=args.seed)
        if args.json:
            print(json.dumps(report.to_dict(), indent=2, sort_keys=True))
            return 0
        refs = ", ".join(f"{k} {v:.4f}" for k, v in sorted(report.references.items()))
        print(f"mechanism: {report.mechanism}{'' if report.confident else ' (not confident)'}")
        print(f"eval loss {report.eval_loss:.4f} nats ({refs})")
        for reason in report.reasons:
            print(f"  - {reason}")
        scores, heads = report.attention, report.ablation.head_grid()
        print(f"head  prev-token (chance {scores.previous_token_chance:.3f})  induction (chance "
              f"{scores.induction_chance:.3f})  same-token (chance {scores.same_token_chance:.3f})  "
              "mean-ablation dloss")
        for layer in range(scores.previous_token.shape[0]):
            for head in range(scores.previous_token.shape[1]):
                print(f"L{layer}H{head}  {float(scores.previous_token[layer, head]):24.3f}  "
                      f"{float(scores.induction[layer, head]):22.3f}  {float(scores.same_token[layer, head]):23.3f}"
                      f"  {float(heads[layer, head]):+19.4f}")
        return 0

    p.set_defaults(handler=handler)


def _add_report(sub: argparse._SubParsersAction) -> None:
    # Owned by the report work (issue 6).
    p = sub.add_parser(
        "report",
        help="write a self-contained HTML report of a trained run (opens with no network)",
        description="Probe a run folder written by `markov-interp train` and write one HTML file holding its "
        "config, loss curves beside the theory's reference losses, the mechanism verdict with its evidence, "
        "per-head scores against chance, attention patterns (circuitsvis, inlined), ablations, the learned "
        "kernel against the true one, the canonical landscape (single-layer binary runs) and probe scores "
        "over training (runs with checkpoints).",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="run folder (config.json, metrics.jsonl, model.safetensors)")
    p.add_argument("--out", default=None, help="HTML file to write (default RUN_DIR/report.html)")
    p.add_argument("--n-sequences", type=int, default=64, help="sequences in the probe batch (default 64)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="length of the probe sequences (default min(training length, n_ctx, 128))")
    p.add_argument("--seed", type=int, default=0, help="seed of the probe batch (default 0)")
    p.add_argument("--max-checkpoints", type=int, default=8, help="checkpoints re-probed for the dynamics (default 8)")
    p.add_argument("--device", default="cpu", help="device to probe on (default cpu)")

    def handler(args: argparse.Namespace) -> int:
        from markov_interp.report import build

        report = build(args.run_dir, n_sequences=args.n_sequences, seq_len=args.seq_len, seed=args.seed,
                       max_checkpoints=args.max_checkpoints, device=args.device)
        path = report.save(args.out)
        size = path.stat().st_size / 1e6
        print(f"mechanism: {report.mechanism.mechanism} "
              f"({'confident' if report.mechanism.confident else 'not confident'}) -> {path} ({size:.1f} MB)")
        return 0

    p.set_defaults(handler=handler)


def _add_sweep(sub: argparse._SubParsersAction) -> None:
    # Owned by the sweep work (issue 7): `sweep SPEC` and `reproduce [--quick]`.
    p = sub.add_parser(
        "sweep",
        help="train every cell of a grid spec (TOML) in parallel into one results table (restartable)",
        description="Run the grid of training runs a spec file names (TOML: base config, [grid] of "
        "'section.field' = [values], seeds; see markov_interp.sweep). Cells already finished are skipped, so "
        "the same command resumes a stopped sweep; a failing cell is recorded with its error and the others go "
        "on. Writes OUT/results.csv (and results.parquet with pyarrow). Exit code 1 if any cell failed.",
    )
    def _params(row: dict) -> str:
        return " ".join(f"{k[len('param.'):]}={v}" for k, v in row.items() if k.startswith("param."))

    p.add_argument("spec", help="sweep spec file (.toml, or .json)")
    p.add_argument("--out", default=None, help="sweep folder (default runs/sweep-<spec file name>)")
    p.add_argument("--backend", choices=["local", "ray"], default="local",
                   help="local process pool (default) or Ray tasks on the cluster ray.init() finds")
    p.add_argument("--workers", type=int, default=None, help="local processes (default: all cores)")
    p.add_argument("--no-retry", action="store_true", help="do not retry cells that failed in an earlier call")
    p.add_argument("--group", type=int, default=None,
                   help="train up to N compatible cells as one stacked model (default: 1 on a CPU, 64 on a GPU)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    def handler(args: argparse.Namespace) -> int:
        from pathlib import Path

        from markov_interp import sweep

        spec = sweep.load_spec(args.spec)
        out = args.out or str(Path("runs") / f"sweep-{Path(args.spec).stem}")
        result = sweep.run(spec, out, backend=args.backend, workers=args.workers, progress=not args.no_progress,
                           retry_failed=not args.no_retry, group=args.group)
        n_ok = len(result.rows) - result.n_failed
        print(f"{len(result.rows)} cells: {n_ok} ok ({result.n_run} run now, {result.n_skipped} already done), "
              f"{result.n_failed} failed -> {result.table}")
        for row in result.failed:
            print(f"  failed {row['cell_id']} {_params(row)}: {row.get('error')}", file=sys.stderr)
        return 1 if result.n_failed else 0

    p.set_defaults(handler=handler)

    r = sub.add_parser(
        "reproduce",
        help="reproduce the paper's headline findings: results table, summary and phase-diagram figures",
        description="Run the five experiments of the reproduction (tied / untied (p, q) grids, depth, random "
        "kernels, init and precision), then write results.csv, summary.csv, summary.md and PNG figures to "
        "--out. --quick runs in about 15 minutes on 2 CPU cores with fewer seeds and steps (summary.md says "
        "what it cut). Training runs go to --work and are reused by a rerun.",
    )
    r.add_argument("--quick", action="store_true", help="the reduced budget (short sequences, few seeds and steps)")
    r.add_argument("--out", default=None, help="folder for tables and figures (default runs/reproduce[-quick]/report)")
    r.add_argument("--work", default=None, help="sweep folder for the training runs (default runs/reproduce[-quick])")
    r.add_argument("--backend", choices=["local", "ray"], default="local")
    r.add_argument("--workers", type=int, default=None, help="local processes (default: all cores)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")

    def reproduce_handler(args: argparse.Namespace) -> int:
        from pathlib import Path

        from markov_interp.reproduce import QUICK, FULL, reproduce

        budget = QUICK if args.quick else FULL
        work = args.work or str(Path("runs") / ("reproduce-quick" if args.quick else "reproduce"))
        out = args.out or str(Path(work) / "report")
        print(f"reproduce ({budget.name}): {budget.cuts}", file=sys.stderr)
        command = "markov-interp " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["reproduce"] else None
        result = reproduce(out, quick=args.quick, work_dir=work, backend=args.backend, workers=args.workers,
                           progress=not args.no_progress, command=command)
        print(f"reproduction ({budget.name}) in {result['seconds'] / 60:.1f} min, {result['failed']} failed cells "
              f"-> {out}/summary.md")
        return 1 if result["failed"] else 0

    r.set_defaults(handler=reproduce_handler)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="markov-interp",
        description="Train transformers on Markov chains and probe how they predict.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_train, _add_probe, _add_report, _add_sweep):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        print(f"markov-interp {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
