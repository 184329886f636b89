"""Command-line interface: a thin layer over the Python API.

Each sub-command is one `_add_<name>` function that registers its arguments and a handler; handlers only
parse, call the library and print. Every error is printed as one line on stderr naming the problem (and
the path, for file-system errors) with exit code 2, never as a traceback unless `--debug` is given; a run
whose training diverged (non-finite loss) gives exit code 3, from `train`, `probe` and `report` alike. Warnings
are printed as one line each; a reader that closes the output early (`| head -1`) ends the command quietly with
exit code 141.
"""

import argparse
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any

from markov_interp.cli._train_options import _TRAIN_SHORTCUTS, _TrainHelpFormatter
from markov_interp.config import shown

if TYPE_CHECKING:  # for annotations only: the commands import what they run, so `--help` stays fast
    from markov_interp.probes import MechanismReport
    from markov_interp.training import RunConfig

EXIT_ERROR = 2
EXIT_DIVERGED = 3
EXIT_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a program whose reader closed the pipe


def _folder_arg(text: str) -> str:
    """A folder or file argument (`--out`): the empty name is refused (`runs.folder_path`; `Path("")` is the current
    folder)."""
    from markov_interp.runs import folder_path

    try:
        folder_path(text, "the path")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).replace("the path is empty", "empty")) from None
    return text


def _parse_set(items: list[str]) -> dict:
    """`--set section.field=value` pairs as {dotted key: value} (`config.parse_setting`, the one `--set` form: a
    value is read as JSON when it is JSON, else taken as text)."""
    from markov_interp.config import parse_setting
    from markov_interp.training import split_key

    out = {}
    for item in items:
        key, value = parse_setting(item)
        split_key(key, where="--set")
        out[key] = value
    return out


_SET_HELP = "values as JSON or text; repeatable"  # the one `--set KEY=VALUE` form, for every command that has it


def _add_process_options(p: argparse.ArgumentParser, *, device: bool = True) -> Any:
    """The options of this process, the same in every command that has them: --device (default auto), --threads,
    --no-progress. Returns their argument group."""
    group = p.add_argument_group("this process")
    if device:
        group.add_argument("--device", default="auto", metavar="DEVICE",
                           help="auto (default: cuda when available, else cpu), cpu, cuda, cuda:1, ...")
    group.add_argument("--threads", type=int, default=None, metavar="N",
                       help="CPU threads for torch (default: 1 for models under a million parameters, as every "
                       "model `train` builds by default; torch's choice above)")
    group.add_argument("--no-progress", action="store_true", help="no progress bar")
    return group


def _add_probe_options(p: argparse.ArgumentParser, run_dir_help: str, *, several: bool = False) -> None:
    """What `probe` and `report` share: the run folder (`several`: one or more), the probe batch (--n-sequences,
    --seq-len, --seed: the probes' one length rule, `probes.probe_length`) and the process options."""
    p.add_argument("run_dir", metavar="RUN_DIR", help=run_dir_help, nargs="+" if several else None)
    p.add_argument("--n-sequences", type=int, default=64, help="sequences in the probe batch (default 64)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="length of the probe sequences (default: the run's training length; longer warns, beyond "
                   "n_ctx is refused)")
    p.add_argument("--seed", type=int, default=0, help="seed of the probe batch (default 0)")
    _add_process_options(p)


def _set_threads(args: argparse.Namespace) -> None:
    """--threads N: `markov_interp.set_threads(N)`; without it the package's rule (one thread for tiny models)."""
    if args.threads is not None:
        from markov_interp import set_threads
        from markov_interp.config import MAX_PARALLEL, check_int

        check_int("--threads", args.threads, minimum=1, maximum=MAX_PARALLEL)  # 100000 threads crashed torch
        set_threads(args.threads)


def _progress(args: argparse.Namespace) -> bool:
    """Progress bars for `probe` and `report`: on a terminal, unless --no-progress."""
    return not args.no_progress and sys.stderr.isatty()


def _train_overrides(args: argparse.Namespace) -> dict:
    """The run options the command line sets: the shortcut flags given, then `--set` (a clash is an error)."""
    import json

    from markov_interp._io import loads_json

    options = {}
    for _, flag, key, _ in _TRAIN_SHORTCUTS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            options[key] = value
    if "source.kernel" in options:
        try:
            options["source.kernel"] = loads_json(options["source.kernel"], "--kernel")  # depth-limited
        except json.JSONDecodeError as err:
            raise ValueError(f"--kernel is not valid JSON ({err.msg}): {shown(args.kernel)}") from None
    for key, value in _parse_set(args.set or []).items():
        if key in options and options[key] != value:
            raise ValueError(f"--set {key}={value!r} contradicts the flag that set it to {options[key]!r}")
        options[key] = value
    return options


def _train_run(args: argparse.Namespace):  # -> training.RunConfig (imported lazily: --help stays fast)
    """The run config the command line describes: --config's run (or `training.default_run`) with the options."""
    from pathlib import Path

    from markov_interp.training import RunConfig, default_run, override_run

    options = _train_overrides(args)
    if args.config is not None:
        from markov_interp._io import read_json

        path = Path(args.config)
        if not path.is_file():
            raise FileNotFoundError(f"no run config at {path}")
        try:
            base = RunConfig.from_dict(read_json(path, "run config"))  # a regular file, bounded, depth-limited
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None
        return _with_interventions(override_run(base, options, where="--set"), args)
    return _with_interventions(default_run(**options), args)


def _with_interventions(run: "RunConfig", args: argparse.Namespace) -> "RunConfig":
    """`run` with the --freeze and --clamp entries appended to train.interventions (in the order given)."""
    from markov_interp import clamps

    added = []
    for flag, parse, items in (("--freeze", clamps.parse_freeze, args.freeze),
                               ("--clamp", clamps.parse_clamp, args.clamp)):
        for item in items or []:
            try:
                added.append(parse(item))
            except ValueError as err:
                raise ValueError(f"{flag} {item}: {err}") from None
    if not added:
        return run
    return run.replace(train=run.train.replace(interventions=run.train.interventions + tuple(added)))


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        formatter_class=_TrainHelpFormatter,
        help="train a transformer on a Markov source into a run folder (resumes / skips when possible)",
        description="Train a transformer on fresh Markov batches. With no flags: the paper's one-layer model "
        "on the binary chain p=0.2, q=0.3, 300 steps of 16 x 256 states (about 10 s on a CPU core); the "
        "defaults are markov_interp.training.default_run's. --config RUN/config.json retrains a run bit for bit; "
        "--set section.field=value sets any option (repeatable; the flags below are shortcuts for common ones). "
        "Re-running on the same --out resumes from the newest checkpoint; a finished run is not retrained; "
        "a folder holding a different config is refused.",
    )
    p.add_argument("--out", required=True, metavar="RUN_DIR", type=_folder_arg,
                   help="run folder (config.json, metrics.jsonl, model.safetensors)")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="a run config (JSON, e.g. a run folder's config.json) to start from instead of the defaults")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="set any run option SECTION.FIELD, e.g. --set train.lr=0.01 --set model.n_heads=2 --set "
                   f"source.initial='\"uniform\"' (sections source, model, train; {_SET_HELP})")
    p.add_argument("--freeze", action="append", metavar="GLOB[@START:END]",
                   help="freeze the parameters matching GLOB (state-dict names, e.g. 'blocks.1.*') for updates "
                   "START..END-1 (default: all); repeatable; appended to train.interventions")
    p.add_argument("--clamp", action="append", metavar="HOOK[HEADS]=VALUE[@START:END]",
                   help="clamp a hook point while training, e.g. blocks.0.attn.hook_pattern=previous_token@:200, "
                   "blocks.0.attn.hook_z[1]=zero, blocks.0.hook_attn_out=mean, or =FILE.safetensors; repeatable")
    _add_train_shortcuts(p)

    def handler(args: argparse.Namespace) -> int:
        _set_threads(args)
        run = _train_run(args)
        # One run or many, through the one engine (a single run is a stack of one; a seed gives the same weights
        # alone or among others): it writes the run folders, locks them, records a diverged run and, needing no
        # hooked model, never imports transformer_lens (seconds of start-up).
        import dataclasses
        from pathlib import Path

        from markov_interp.training import train_many

        seeds = [run.train.seed] if args.seeds is None else _parse_seeds(args.seeds)
        runs = [dataclasses.replace(run, train=dataclasses.replace(run.train, seed=s)) for s in seeds]
        outs = [Path(args.out)] if args.seeds is None else [Path(args.out) / f"seed-{s}" for s in seeds]
        if args.seeds is not None:  # OUT/seed-N are the package's names: a planted link there is refused
            from markov_interp.runs import check_contents

            check_contents(args.out, depth=1)
        results = train_many(runs, outs, progress=not args.no_progress, models_out=False)
        diverged = 0
        for seed, out, result in zip(seeds, outs, results):
            label = "" if args.seeds is None else f"seed {seed}: "
            if result.failed:
                diverged += 1
                print(f"{label}diverged: {result.failed} -> {out}", file=sys.stderr)
            else:
                print(label + _train_summary(result, out))
        return EXIT_DIVERGED if diverged else 0

    p.set_defaults(handler=handler)


def _add_train_shortcuts(p: argparse.ArgumentParser) -> None:
    """`train`'s shortcut flags (grouped by the config section they set), its process options and --seeds."""
    groups = {name: p.add_argument_group(title) for name, title in (
        ("data", "data (shortcuts for source.*)"),
        ("model", "model (shortcuts for model.*: a preset, then overrides; d_vocab follows the source)"),
        ("training", "training (shortcuts for train.*)"))}
    for group, flag, key, kwargs in _TRAIN_SHORTCUTS:
        groups[group].add_argument(flag, default=None, **kwargs)
    run = _add_process_options(p, device=False)  # --device is the shortcut for train.device above
    run.add_argument("--seeds", default=None, metavar="SEEDS",
                     help="train several seeds as one stacked model into RUN_DIR/seed-N/, e.g. 0-7 or 0,3,5 "
                     "(overrides --seed; each seed gets the weights it gets alone)")


def _parse_seeds(text: str) -> list[int]:
    """Seeds from "0-7" (inclusive range), "0,3,5" or a mix ("1,4-6"); ValueError naming --seeds otherwise. At most
    `training.plan.MAX_RUNS` seeds, each at most `config.SEED_MAX`, counted before any is listed (`0-1000000` used
    to build configs for minutes)."""
    from markov_interp.config import check_seed
    from markov_interp.training.plan import MAX_RUNS

    spans: list[tuple[int, int]] = []
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"--seeds must look like 0-7 or 0,3,5 (seeds >= 0), got {shown(text)}")
        first, last = int(lo), int(hi) if dash else int(lo)
        for seed in (first, last):
            check_seed("each of --seeds", seed)
        if last < first:
            raise ValueError(f"--seeds range {shown(part.strip())} is empty (end before start)")
        spans.append((first, last))
    count = sum(last - first + 1 for first, last in spans)
    if count > MAX_RUNS:
        raise ValueError(f"--seeds {shown(text)} names {count} seeds, more than the {MAX_RUNS} one command trains; "
                         "train them in batches")
    seeds = [seed for first, last in spans for seed in range(first, last + 1)]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds lists a seed twice: {shown(text)}")
    return seeds


def _train_summary(result, out) -> str:
    """One line: the final eval loss beside theory's references (`ReferenceLosses.describe`: each named for what it
    is, with its standard error where it shows)."""
    f = result.final
    status = "already trained" if result.already_done else (
        f"resumed from step {result.resumed_from}" if result.resumed_from else "trained")
    return f"{status} ({f.step} steps): final eval loss {f.eval_loss:.4f} nats, {f.references.describe()} -> {out}"


def _add_probe(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "probe",
        help="name the mechanism of a trained model (uniform, unigram, in_context_unigram, state_and_counts, "
        "kernel, induction or other) with the evidence",
        description="Load the model of a run folder and run markov_interp.probes.classify_mechanism on fresh "
        "sequences from the run's source: the law the model follows (KL to every candidate law and the gaps "
        "between them), graded gains, the kernel-swap in-context fraction, the circuit found by path patching "
        "(every edge's effect, the kept edges), per-head scores beside chance, head ablations, implied kernel.",
    )
    _add_probe_options(p, "run folder written by `markov-interp train` (config.json, model.safetensors)")
    p.add_argument("--json", action="store_true", help="print the full report as JSON instead of a summary")

    def handler(args: argparse.Namespace) -> int:
        import json
        from pathlib import Path

        from tqdm.auto import tqdm

        from markov_interp.probes import classify_mechanism
        from markov_interp import runs
        from markov_interp.devices import resolve_device

        _set_threads(args)
        run_dir = Path(args.run_dir)
        run = runs.read_config(run_dir)
        device = resolve_device(args.device)
        diverged = runs.divergence(run_dir)
        if diverged is not None:  # no model to classify: say so instead of naming a mechanism
            if args.json:
                print(json.dumps({**diverged, "run_dir": str(run_dir)}, indent=2, sort_keys=True))
            else:
                print(f"diverged: {runs.diverged_message(run_dir, diverged)}")
            return EXIT_DIVERGED
        _check_probe_size(run, args, device, "probe")
        with tqdm(total=2, desc="probe", unit="stage", disable=not _progress(args), leave=False) as bar:
            bar.set_postfix_str("loading the model")
            model = runs.load_model(run_dir, device=device, expect=run.model)
            bar.update()
            bar.set_postfix_str("classify_mechanism")
            # the length rule is the probes' (probes._common.probe_length): the loaded model knows its training
            # length
            report = classify_mechanism(model, run.source.build(), seq_len=args.seq_len,
                                        n_sequences=args.n_sequences, seed=args.seed, progress=_progress(args))
            bar.update()
        if args.json:
            print(json.dumps(report.to_dict(), indent=2, sort_keys=True))
            return 0
        _print_probe(report)
        return 0

    p.set_defaults(handler=handler)


def _check_probe_size(run: "RunConfig", args: argparse.Namespace, device: Any, command: str) -> None:
    """Refuse `--n-sequences` x `--seq-len` (default by the probes' one rule, `probes._common.probe_length_for`: the
    run's training length) that cannot fit, before the model is loaded (`models.memory.check_probe`)."""
    from markov_interp.models.memory import check_probe
    from markov_interp.probes._common import probe_length_for

    seq_len = probe_length_for(run.model.n_ctx, run.train.seq_len, args.seq_len)
    check_probe(run.model, n_sequences=args.n_sequences, seq_len=seq_len, device=device, where=command)


def _print_edges(graph: Any) -> None:
    """The kept edges, each with its effect (+- se, nats) in the pass that moves it: the token pass (`corruption`)
    and, for the edges out of positions and the heads that compute them, the positional pass."""
    passes = f"{graph.corruption} pass" + ("; positional pass" if graph.position is not None else "")
    from markov_interp.probes.discovery import faithfulness_text

    print(f"circuit: {len(graph.kept)} of {len(graph.edges)} edges kept ({graph.corruption} corruption, "
          f"faithfulness {faithfulness_text(graph.faithfulness, short=True)}); edge  effect +- se (nats) in the "
          f"{passes}")

    def cell(effect: float, se: float) -> str:
        return "not measured".ljust(18) if effect != effect else f"{effect:+.4f} +- {se:.4f}".ljust(18)

    for edge in graph.kept:
        row = cell(edge.effect, edge.se)
        if graph.position is not None:
            row += "  " + cell(edge.position_effect, edge.position_se)
        print(f"  {edge.name:24s} {row.rstrip()}")


def _print_probe(report: "MechanismReport") -> None:
    """The `probe` summary: the label and why, every candidate law, the circuit's roles, per-head scores."""
    order = f" (order {report.order})" if report.order is not None else ""
    print(f"mechanism: {report.mechanism}{order}{'' if report.confident else ' (not confident)'}")
    # describe() names the plateau for what it is: H(pi), or the in-context unigram loss for random kernels
    print(f"eval loss {report.eval_loss:.4f} nats ({report.references.describe()})")
    for reason in report.reasons:
        print(f"  - {reason}")
    sim = report.strategies
    print("law                        KL(law || model)  gap to nearest law")
    for name, value in sim.divergences.items():
        alias = f"  (= {sim.aliases[name]})" if name in sim.aliases else ""
        print(f"{name:26s} {value:16.4f}  {sim.gaps[name]:18.4f}{alias}")
    _print_edges(report.circuit)
    if report.patching_vs_ablation():
        print(report.patching_vs_ablation())
    for role in report.induction.roles:
        heads = ", ".join(f"{h.name} {x:.2f}" for h, x in zip(role.heads, role.scores)) or "none"
        effect = "n/a" if role.effect is None else f"{role.effect:+.4f}"
        print(f"role {role.name}: {heads}; K-edge effect {effect}{' (confirmed)' if role.confirmed else ''}")
    scores, heads = report.attention, report.ablation.head_grid()
    print(f"head  prev-token (chance {scores.previous_token_chance:.3f})  induction excess over baseline  "
          f"same-token (chance {scores.same_token_chance:.3f})  mean-ablation dloss")
    for layer in range(scores.previous_token.shape[0]):
        for head in range(scores.previous_token.shape[1]):
            print(f"L{layer}H{head}  {float(scores.previous_token[layer, head]):24.3f}  "
                  f"{float(scores.excess('induction')[layer, head]):30.3f}  "
                  f"{float(scores.same_token[layer, head]):23.3f}  {float(heads[layer, head]):+19.4f}")


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="write a self-contained HTML report of a trained run, or of several runs side by side (offline)",
        description="Probe a run folder written by `markov-interp train` and write one HTML file holding its "
        "config, loss curves beside the theory's reference losses, the mechanism verdict with its evidence, "
        "per-head scores against chance, attention patterns (circuitsvis, inlined), ablations, the learned "
        "kernel against the true one, the canonical landscape (single-layer binary runs) and probe scores "
        "over training (runs with checkpoints). Several run folders, or a sweep folder (its runs/), give one "
        "comparison instead: the verdicts side by side, the loss curves overlaid against the references, kept "
        "edges as a runs x edges table, head scores per run and, for seeds of one config, their distribution.",
    )
    _add_probe_options(p, "run folder (config.json, metrics.jsonl, model.safetensors); several, or a sweep folder, "
                       "for a comparison", several=True)
    p.add_argument("--out", default=None, metavar="FILE", type=_folder_arg,
                   help="HTML file to write (default RUN_DIR/report.html; a sweep's SWEEP/compare.html)")
    p.add_argument("--max-checkpoints", type=int, default=8, help="checkpoints re-probed for the dynamics (default 8)")

    def handler(args: argparse.Namespace) -> int:
        from pathlib import Path

        from markov_interp import sweep

        _set_threads(args)
        if len(args.run_dir) == 1 and not (Path(args.run_dir[0]) / sweep.RUNS_DIR).is_dir():
            return _report_one(args, args.run_dir[0])  # one run (its errors name a folder that is not one)
        return _report_many(args)

    p.set_defaults(handler=handler)


def _report_one(args: argparse.Namespace, run_dir: str) -> int:
    """`report RUN_DIR`: one run's report."""
    from pathlib import Path

    from markov_interp._io import check_target
    from markov_interp.report import REPORT_FILE, build
    from markov_interp import runs
    from markov_interp.devices import resolve_device

    # everything that can fail cheaply is checked before the probes run
    run = runs.read_config(run_dir)
    _check_probe_size(run, args, resolve_device(args.device), "report")
    target = Path(args.out) if args.out else Path(run_dir) / REPORT_FILE
    check_target(target, "--out")  # a folder, link, FIFO or device is refused, never replaced
    runs.check_writable_dir(target.parent, "report folder")
    diverged = runs.divergence(run_dir)
    if diverged is not None:
        print(f"diverged: {runs.diverged_message(run_dir, diverged)}", file=sys.stderr)
        return EXIT_DIVERGED
    report = build(run_dir, n_sequences=args.n_sequences, seq_len=args.seq_len, seed=args.seed,
                   max_checkpoints=args.max_checkpoints, device=resolve_device(args.device), progress=_progress(args))
    path = report.save(args.out)
    size = path.stat().st_size / 1e6
    print(f"mechanism: {report.mechanism.mechanism} "
          f"({'confident' if report.mechanism.confident else 'not confident'}) -> {path} ({size:.1f} MB)")
    return 0


def _report_many(args: argparse.Namespace) -> int:
    """`report RUN1 RUN2 ...` or `report SWEEP`: the comparison (`report.compare`)."""
    from pathlib import Path

    from markov_interp._io import check_target
    from markov_interp import runs
    from markov_interp._display import headline
    from markov_interp.devices import resolve_device
    from markov_interp.report._compare import COMPARE_FILE, compare, run_folders

    folders = run_folders(args.run_dir)  # a folder that is neither a run nor a sweep is named before any probe
    sweep_default = len(args.run_dir) == 1 and args.out is None
    if args.out is None and not sweep_default:
        raise ValueError("a comparison of several run folders needs --out FILE (e.g. --out compare.html)")
    target = Path(args.out) if args.out else Path(args.run_dir[0]) / COMPARE_FILE
    check_target(target, "--out")
    runs.check_writable_dir(target.parent, "report folder")
    device = resolve_device(args.device)
    for folder in folders:
        _check_probe_size(runs.read_config(folder), args, device, "report")
    seen = compare(folders, n_sequences=args.n_sequences, seq_len=args.seq_len, seed=args.seed, device=device,
                   progress=_progress(args), title=f"markov-interp comparison: {Path(args.run_dir[0]).name}"
                   if sweep_default else None)
    path = seen.save(target)
    print(f"{headline(seen)} -> {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


def _add_sweep(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="train every cell of a grid spec (TOML) in parallel into one results table (restartable)",
        description="Run the grid of training runs a spec file names (TOML: base config, [grid] of "
        "'section.field' = [values], seeds; see docs/sweeps.md). Cells already finished are skipped, so "
        "the same command resumes a stopped sweep; a failing cell is recorded with its error and the others go "
        "on. Writes OUT/results.csv (and results.parquet with pyarrow). Exit code 1 if any cell failed.",
    )
    p.add_argument("spec", metavar="SPEC", help="sweep spec file (.toml, or .json)")
    p.add_argument("--out", default=None, metavar="SWEEP_DIR", type=_folder_arg,
                   help="sweep folder (default runs/sweep-<spec file name>)")
    p.add_argument("--backend", choices=["local", "ray"], default="local",
                   help="local process pool (default) or Ray tasks on the cluster ray.init() finds")
    p.add_argument("--workers", type=int, default=None, metavar="N", help="local processes (default: all cores)")
    p.add_argument("--no-retry", action="store_true", help="do not retry cells that failed in an earlier call")
    p.add_argument("--group", type=int, default=None, metavar="N",
                   help="train up to N compatible cells as one stacked model (default: 1 on a CPU, 64 on a GPU)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=_run_sweep)


def _run_sweep(args: argparse.Namespace) -> int:
    """`markov-interp sweep`: run the spec, print the counts, and each failed or diverged cell to stderr."""
    from pathlib import Path

    from markov_interp import sweep
    from markov_interp import runs

    spec = sweep.load_spec(args.spec)
    out = args.out or str(Path("runs") / f"sweep-{Path(args.spec).stem}")
    runs.check_writable_dir(out, "sweep folder")
    result = sweep.run(spec, out, backend=args.backend, workers=args.workers, progress=not args.no_progress,
                       retry_failed=not args.no_retry, group=args.group)
    n_ok = len(result.rows) - result.n_failed - result.n_diverged
    print(f"{len(result.rows)} cells: {n_ok} ok ({result.n_run} run now, {result.n_skipped} already done), "
          f"{result.n_failed} failed, {result.n_diverged} diverged -> {result.table}")
    for kind, rows in (("failed", result.failed), ("diverged", result.diverged)):
        for row in rows:
            params = " ".join(f"{k}={v}" for k, v in row.params.items())
            print(f"  {kind} {row.cell_id} {params}: {row.error}", file=sys.stderr)
    return 1 if result.n_failed else 0


def _add_reproduce(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser(
        "reproduce",
        help="reproduce the paper's headline findings: results table, summary and phase-diagram figures",
        description="Run the seven sweeps of the reproduction (tied / untied (p, q) grids, a line across "
        "p + q = 1, depth, random kernels, precision, the exact reduction), then write results.csv, summary.csv, "
        "summary.md (escape times with intervals), results.json and PNG figures to --out: the registered "
        "experiment 'paper' (markov_interp.experiments.paper). --quick: 13 CPU-minutes, 14-19 min of wall time on a "
        "shared 2-core machine, with shorter sequences and runs (summary.md says what it cut). --extras adds every "
        "other registered experiment (`markov-interp experiment --list`) at its full budget, each in OUT/NAME. "
        "Training runs go to --work and are reused by a rerun.",
    )
    r.add_argument("--quick", action="store_true", help="the reduced budget (short sequences, few seeds and steps)")
    r.add_argument("--out", default=None, metavar="DIR",
                   help="folder for tables and figures (default runs/reproduce[-quick]/report)")
    r.add_argument("--work", default=None, metavar="SWEEP_DIR",
                   help="sweep folder for the training runs (default runs/reproduce[-quick])")
    r.add_argument("--backend", choices=["local", "ray"], default="local")
    r.add_argument("--workers", type=int, default=None, metavar="N", help="local processes (default: all cores)")
    r.add_argument("--device", default="auto", metavar="DEVICE",
                   help="where the runs train: auto (default: cuda when available, else cpu), cpu, cuda, cuda:1")
    r.add_argument("--group", type=int, default=None, metavar="N",
                   help="seeds trained as one stacked model (default 16 on a CPU, 64 on a GPU)")
    r.add_argument("--extras", action="store_true",
                   help="also every other registered experiment (markov_interp.experiments) into OUT/NAME")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")

    def handler(args: argparse.Namespace) -> int:
        from pathlib import Path

        from markov_interp import experiments
        from markov_interp.devices import check_device_name, resolve_device
        from markov_interp.experiments import paper

        # the device checked before the budget line is printed: a refusal is one line (on Ray, where cells run)
        (check_device_name if args.backend == "ray" else resolve_device)(args.device, what="--device")
        budget = paper.EXPERIMENT.budget("quick" if args.quick else "full", device=args.device)
        work = args.work or str(Path("runs") / ("reproduce-quick" if args.quick else "reproduce"))
        out = args.out or str(Path(work) / "report")
        print(f"reproduce ({budget.name}): {budget.cuts}", file=sys.stderr)
        command = _command_line("reproduce") or f"markov-interp reproduce{' --quick' if args.quick else ''} --out {out}"
        finished = experiments.run(paper.EXPERIMENT, out, budget=budget, command=command,
                                   progress=not args.no_progress, work=work, backend=args.backend,
                                   workers=args.workers, group=args.group)
        print(f"reproduction ({budget.name}) in {finished.provenance.seconds / 60:.1f} min, {finished.failed} "
              f"failed cells -> {out}/summary.md")
        failed = finished.failed
        if args.extras:
            others = [name for name in experiments.registered() if name != paper.EXPERIMENT.name]
            done = experiments.run_many(others, out, progress=not args.no_progress, command=command)
            failed += sum(f.failed for f in done)
        return 1 if failed else 0

    r.set_defaults(handler=handler)


def _command_line(command: str) -> "str | None":
    """This process's command line as `markov-interp COMMAND ...` when it was started as that command."""
    return "markov-interp " + " ".join(sys.argv[1:]) if sys.argv[1:2] == [command] else None


def _add_experiment(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "experiment",
        help="run a registered experiment (markov_interp.experiments) into OUT/NAME: summary, results, figures",
        description="Run the named experiments (each a module of markov_interp.experiments; --list names them) "
        "at their full budget (--quick: the quick one, whose cuts summary.md states), each into OUT/NAME: run "
        "folders (reused by a rerun), summary.md with its provenance, results.json, figures. Exit code 1 if a "
        "run failed.",
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="experiments to run (default: all)")
    p.add_argument("--list", action="store_true", help="list the registered experiments and their budgets")
    from markov_interp.experiments import add_arguments

    add_arguments(p)

    def handler(args: argparse.Namespace) -> int:
        from markov_interp import experiments

        if args.list:
            print("\n".join(experiments.describe_registered()))
            return 0
        names = args.names or list(experiments.registered())
        done = experiments.run_many(names, args.out, args=args, progress=not args.no_progress,
                                    command=_command_line("experiment") or "markov-interp experiment")
        return 1 if any(f.failed for f in done) else 0

    p.set_defaults(handler=handler)


class _Parser(argparse.ArgumentParser):
    """argparse's parser with a "did you mean" on a mistyped command or option, and a mistyped option of a
    command reported with that command's usage line (argparse hands it to the top-level parser)."""

    def error(self, message: str) -> Any:
        self.exit(EXIT_ERROR, f"{self.format_usage()}{self.prog}: error: {message}{_suggestion(self, message)}\n")

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:  # an option no parser knows: the command's parser reports it, with its own usage
            subs = [a.choices for a in self._actions if isinstance(a, argparse._SubParsersAction)]
            (subs[0] if subs else {}).get(getattr(parsed, "command", None), self).error(
                f"unrecognized arguments: {' '.join(extra)}")
        return parsed


def _suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    """"; did you mean --steps?" for the closest known command or option to what `message` names as unknown."""
    import difflib
    import re

    choice = re.search(r"invalid choice: '([^']*)'", message)
    if choice and "choose from" in message:
        known, typed = [c.strip("'") for c in re.findall(r"'[^']*'", message.split("choose from", 1)[1])], \
            choice.group(1)
    elif message.startswith("unrecognized arguments: "):
        typed = next((w for w in message.split()[2:] if w.startswith("-")), "").split("=")[0]
        known = [flag for a in parser._actions for flag in a.option_strings if flag.startswith("--")]
    else:
        return ""
    close = difflib.get_close_matches(typed, known, n=1, cutoff=0.6) if typed else []
    return f"; did you mean {close[0]}?" if close else ""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="markov-interp",
        description="Train transformers on Markov chains and probe how they predict.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for add in (_add_train, _add_probe, _add_report, _add_sweep, _add_reproduce, _add_experiment):
        add(sub)
    debug_help = "show the full traceback of an error instead of one line"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    for command in sub.choices.values():  # also accepted after the command; SUPPRESS keeps a global --debug
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
    return parser


def _one_line(err: BaseException) -> str:
    """An error as one line: the message of errors the package raises, the type too for anything else
    (OSError's text names the file: "[Errno 28] No space left on device: 'runs/a/metrics.jsonl'")."""
    from markov_interp.runs import RunFolderError, TrainingDiverged
    from markov_interp.sweep.executors import ClusterLost

    text = str(err) if isinstance(err, (ValueError, OSError, RunFolderError, TrainingDiverged, ClusterLost)) else (
        f"{type(err).__name__}: {err}")
    return _capped(" ".join(text.split())) or type(err).__name__


MAX_LINE = 2000  # the most characters of an error or warning line (a bad value is quoted whole nowhere)


def _capped(text: str) -> str:
    """`text` cut to `MAX_LINE` characters, its start and end kept (a message quoting a 60 MB value gives a line,
    not 60 MB on stderr)."""
    if len(text) <= MAX_LINE:
        return text
    return f"{text[:MAX_LINE - 300]} ... ({len(text) - MAX_LINE + 100} characters cut) ... {text[-200:]}"


def _quiet_stdout() -> None:
    """After a broken pipe (`markov-interp probe RUN | head -1`): point stdout at /dev/null so that the flush
    at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is no real file (a test's capture): nothing to do
        pass


def _print_warning(command: str) -> Any:
    """`warnings.showwarning` for the CLI: a warning is one line on stderr, like an error ("markov-interp CMD:
    warning: ...", whitespace collapsed, the category named unless it is a UserWarning or a subclass)."""
    def show(message: Any, category: type, *args: Any, **kwargs: Any) -> None:
        kind = "" if issubclass(category, UserWarning) else f"{category.__name__}: "
        print(f"markov-interp {command}: warning: {kind}{_capped(' '.join(str(message).split()))}", file=sys.stderr)

    return show


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default sys.argv[1:]); returns the exit code (0 ok, 1 failed sweep cells,
    2 error, 3 diverged, 130 interrupted, 141 output pipe closed early, as a program killed by SIGPIPE)."""
    try:
        with warnings.catch_warnings():
            try:
                return _main(argv)
            finally:  # also after --help's SystemExit: a closed pipe shows here, not in the interpreter's exit
                if sys.stdout is not None:
                    sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as `cat` would
        _quiet_stdout()
        return EXIT_PIPE


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    warnings.showwarning = _print_warning(args.command)  # restored by main's catch_warnings
    try:
        return int(args.handler(args) or 0)
    except BrokenPipeError:  # main stops quietly
        raise
    except KeyboardInterrupt:
        if getattr(args, "debug", False):
            raise
        print(f"markov-interp {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # one line for every error; the traceback only on request
        if getattr(args, "debug", False):
            raise
        from markov_interp.runs import TrainingDiverged

        print(f"markov-interp {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_DIVERGED if isinstance(err, TrainingDiverged) else EXIT_ERROR
