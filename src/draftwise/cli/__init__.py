"""The ``draftwise`` command line: the only place that prints.

Every subcommand lives in its own module of this package exposing ``register(subparsers)``, which adds a parser
whose ``func(args) -> int`` runs the command. A :class:`DraftwiseError` becomes one line on
stderr and exit status 2; Ctrl-C exits with 130 after the command has shown what it has; a reader
that closes the pipe early (``draftwise policies | head -3``) ends the command quietly with 141.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from draftwise.errors import DraftwiseError

# Subcommand modules, in the order `draftwise --help` lists them.
COMMAND_MODULES = (
    "draftwise.cli.generate",
    "draftwise.cli.costs",
    "draftwise.cli.serve",
    "draftwise.cli.policies",
    "draftwise.cli.datastore",
    "draftwise.cli.sim",
    "draftwise.cli.zoo",
    "draftwise.cli.bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftwise",
        description="Lossless speculative decoding with a pool of drafters chosen online "
        "(MetaSD, BanditSpec, HedgeSpec, TapOut). Run 'draftwise COMMAND --help' for a command's options.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:  # a real missing dependency, not an absent command
                raise
            continue
        module.register(subparsers)
    return parser


def _quiet_dependencies(verbose: int) -> None:
    """transformers' loading bars and hub retry warnings drown the CLI's own output."""
    if verbose:
        return
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    # a first fetch of a named model: say what and why; a long prompt: how far it has been read
    for name in ("draftwise.models.named_models", "draftwise.models.cached_lm"):
        logging.getLogger(name).setLevel(min(level, logging.INFO))
    _quiet_dependencies(args.verbose)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code = int(args.func(args) or 0)
        if sys.stdout is not None:
            sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
        return code
    except BrokenPipeError:
        return _closed_pipe()
    except DraftwiseError as exc:
        print(f"draftwise {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


# 128 + SIGPIPE: what a shell reports for any Unix tool killed by a closed pipe (`yes | head`, git).
# Not 0: the output was cut short, and `set -o pipefail` scripts should see that as they would for
# coreutils; plain pipelines report the last command's status, so `draftwise policies | head` is quiet.
CLOSED_PIPE_EXIT = 141


def _closed_pipe() -> int:
    """The reader went away: say nothing (the pipe is the only place the user looks) and make the
    interpreter's final flush of the unwritten buffer go to /dev/null instead of raising again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout without a file descriptor (captured by a test harness)
        pass
    return CLOSED_PIPE_EXIT


if __name__ == "__main__":
    sys.exit(main())
