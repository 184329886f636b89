"""Command-line interface: a thin layer over the Python API.

Each sub-command is one `_add_<name>` function that registers its arguments and a handler; handlers only
parse, call the library and print. Errors a user can cause (`ValueError`, `FileNotFoundError`) are printed
as one line on stderr with exit code 2, never as a traceback.
"""

import argparse
import sys


def _add_train(sub: argparse._SubParsersAction) -> None:
    # Owned by the models/training work (issue 3).
    pass


def _add_probe(sub: argparse._SubParsersAction) -> None:
    # Owned by the probes work (issue 4).
    pass


def _add_report(sub: argparse._SubParsersAction) -> None:
    # Owned by the report work (issue 6).
    pass


def _add_sweep(sub: argparse._SubParsersAction) -> None:
    # Owned by the sweep work (issue 7): `sweep SPEC` and `reproduce [--quick]`.
    pass


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
