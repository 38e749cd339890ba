"""Simulate hb_mapper makertbin's quantization (RDK X5) and search for the YAML that keeps a float ONNX accurate.

The first line above is ``tuner --help``'s description (plain text: argparse prints it as it is).
One subcommand per library call; bad input raises ``TunerError``, printed as one line, exit code 2.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from tuner import __version__, commands
from tuner.errors import TunerError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tuner", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--version", action="version", version=f"tuner {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.register(sub)
    return parser


#: Options whose value may be written negative by mistake (``--timeout -5m``): argparse would take
#: ``-5m`` for an option and say only "expected one argument"; it is passed as ``--timeout=-5m``,
#: so the option's own check names the value and the rule.
SIGNED_VALUE_OPTIONS = ("--timeout",)


def _negative_values_attached(argv: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(argv):
        if (argv[i] in SIGNED_VALUE_OPTIONS and i + 1 < len(argv)
                and re.match(r"-[\d.]", argv[i + 1])):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        if argv[i] == "--":
            return out + argv[i:]
        out.append(argv[i])
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_negative_values_attached(sys.argv[1:] if argv is None else list(argv)))
    try:
        import optuna

        # Optuna's INFO line per trial drowns the progress bar, and its WARNING for a failed trial
        # carries a traceback; tuner reports failures itself, in one line with the reason.
        optuna.logging.set_verbosity(optuna.logging.ERROR)
    except ImportError:
        pass
    try:
        code: int = args.func(args)
        sys.stdout.flush()   # inside the try: a reader that stopped early (| head) is seen here
        return code
    except BrokenPipeError:
        # `tuner ... --json | head`: the reader has what it wanted. Python's advice: point stdout at
        # devnull so the interpreter's own flush at exit does not raise again, and exit quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141   # 128 + SIGPIPE, what a C tool killed by the pipe would return
    except TunerError as exc:
        print(f"tuner: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        # a full disk (or quota) where no tuner code could name it: a library's own write, or an
        # error a library raised while one unwound
        from tuner.files import disk_full_cause

        full = disk_full_cause(exc)
        if full is None:
            raise
        print(f"tuner: error: {full}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tuner: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
