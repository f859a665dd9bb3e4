"""The `subic` command line: quickstart, train, train-instance, index
build/add/remove, search, duplicates, serve, evaluate, export.

Parsing, `--help` and argument errors load no TensorFlow (`parser`); a
command imports what it needs when it runs (`commands`), with TensorFlow's
start-up log lines hidden unless `--verbose` or `SUBIC_DEBUG=1` asks. A
user's mistake (a missing, unreadable or corrupt file, a directory where a
file belongs, a non-image, a bad value) is one line on standard error,
`subic <command>: error: <what went wrong> (<path>)`, with exit status 2;
`--verbose` or `SUBIC_DEBUG=1` shows the traceback instead.

A new command: its options in `parser.py` (training's in
`train_options.py`), what it does in `commands.py` (searching ones in
`search_commands.py`).
"""

from __future__ import annotations

import importlib

from subic_keras._quiet import show_native_logs
from subic_keras.cli import checks
from subic_keras.cli.console import (
    USER_ERRORS,
    debug_requested,
    describe,
    quiet_imports,
)
from subic_keras.cli.parser import build_parser

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    """Runs `subic` with `argv` (default: `sys.argv[1:]`); returns the exit
    status, or exits with 2 on a user's mistake."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.run is None:  # `subic` or `subic index` alone: what they offer
        args.help_of.print_help()
        return 2
    debug = debug_requested(args.verbose)
    if debug:
        show_native_logs()
    try:
        # Paths and values first: a mistake costs no TensorFlow start-up.
        checks.check(args)
        with quiet_imports(not debug):
            commands = importlib.import_module("subic_keras.cli.commands")
        return getattr(commands, args.run)(args)
    except USER_ERRORS as error:
        if debug:
            raise
        parser.exit(2, f"subic {args.command_name}: error: {describe(error)}\n")
    except Exception as error:
        # TensorFlow's out-of-memory error (e.g. `-M 100000 -K 1024`), told
        # by name so that this module never imports TensorFlow.
        if debug or type(error).__name__ != "ResourceExhaustedError":
            raise
        message = " ".join(str(error).split())[:300]
        parser.exit(
            2,
            f"subic {args.command_name}: error: out of memory building or "
            f"running the model ({message}); use fewer or smaller blocks "
            "(-M, -K) or a smaller --batch-size\n",
        )
    except KeyboardInterrupt:
        if debug:
            raise
        parser.exit(130, f"subic {args.command_name}: interrupted\n")
