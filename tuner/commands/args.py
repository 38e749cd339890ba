"""Argument groups the commands share, each declared once (flag, type, default); a command may
word the help for its own use."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

Parser = argparse.ArgumentParser


def _count(minimum: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value
    parse.__name__ = what       # argparse names the type in its messages
    return parse


#: argparse types: a count of at least 1 / at least 0 (argparse exits with code 2 on a bad value)
positive_int = _count(1, "a positive integer")
count = _count(0, "an integer >= 0")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def duration_text(text: str) -> str:
    """``--timeout``: checked as the space file's ``study.timeout`` is (3600, 90s, 30m, 8h, 1d), kept as given."""
    from tuner.errors import TunerError
    from tuner.study.sections import parse_duration

    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"must be positive (seconds, or a duration like 30m / 8h), got {text!r}")
    try:
        seconds = parse_duration(text, "--timeout")
    except TunerError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--timeout: ")) from None
    if not seconds:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return text


def config(p: Parser, help: str = "the hb_mapper makertbin YAML") -> None:
    p.add_argument("config", help=help)


def study(p: Parser, help: str = "study name (results/<name>) or its folder") -> None:
    p.add_argument("study", help=help)


def data(p: Parser, help: str = "evaluate on this folder instead of cal_data_dir (';' between inputs)") -> None:
    p.add_argument("--data", help=help)


def data_dirs(text: str | None) -> list[Path] | None:
    """``--data``: folders, one per model input, ';' between them."""
    return [Path(p) for p in text.split(";")] if text else None


def limit(p: Parser, help: str = "use at most this many evaluation samples") -> None:
    p.add_argument("--limit", type=positive_int, help=help)


def march(p: Parser, help: str = "override model_parameters.march (bayes-e, ...)") -> None:
    p.add_argument("--march", help=help)


def threads(p: Parser, help: str = "evaluation threads (default: all cores)") -> None:
    p.add_argument("--threads", type=positive_int, help=help)


def json_output(p: Parser, help: str = "print the result as JSON") -> None:
    p.add_argument("--json", action="store_true", help=help)


def storage(p: Parser, help: str = "Optuna storage URL, when the study is not in results/") -> None:
    p.add_argument("--storage", help=help)


def results_dir(p: Parser, help: str = "where study folders are (default: results)") -> None:
    p.add_argument("--results-dir", default="results", help=help)


def timeout(p: Parser, help: str = "stop after this long (seconds, or 30m, 8h)") -> None:
    p.add_argument("--timeout", type=duration_text, help=help)


def n_trials(p: Parser, help: str) -> None:
    p.add_argument("--n-trials", type=count, help=help)


def no_feedback(p: Parser, help: str = "do not add the real values to the study") -> None:
    p.add_argument("--no-feedback", action="store_true", help=help)


def simulation(p: Parser) -> None:
    """What every command that simulates an hb_mapper YAML takes."""
    config(p, "the hb_mapper makertbin YAML (reads onnx_model, cal_data_dir, node_info, calibration_parameters); "
              "sensitivity also takes a search space")
    data(p)
    limit(p)
    march(p)
    threads(p)
    json_output(p)


def workers(p: Parser) -> None:
    """How workers survive each other's death."""
    p.add_argument("--max-retry", type=count, default=1, help="times a trial left running by a killed worker is "
                                                            "re-run (default 1; 0: never)")
    p.add_argument("--heartbeat", type=positive_float, help="database storages: seconds between a worker's heartbeats; a "
                                                   "trial silent for 3 heartbeats is failed (default 20)")


def preprocess(p: Parser) -> None:
    p.add_argument("--preprocess", help="your preprocessing: 'module:function' or 'path/to/file.py:function' "
                                        "(default: read and resize the images as the YAML's input parameters say)")


def optimize_level(p: Parser, prefix: str = "") -> None:
    """The compile level of a conversion by the real toolchain (tuner toolchain run, verify --local)."""
    p.add_argument("--optimize-level", choices=("O0", "O1", "O2", "O3"),
                   help=prefix + "compile at this level (O0 is fastest and gives the same quantized model; hbdk's "
                                 "latency estimate is then O0's; default: the YAML's)")
