"""What tuner prints on a terminal: aligned tables, one-line progress, messages on stderr."""

from __future__ import annotations

import sys
from collections.abc import Callable


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Left-aligned columns two spaces apart, a dashed rule under the headers."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep] + [line(r) for r in rows])


def progress_printer(label: str) -> Callable[[int, int], None]:
    """A one-line progress display on stderr (only when stderr is a terminal)."""
    tty = sys.stderr.isatty()

    def show(done: int, total: int) -> None:
        if tty:
            end = "\n" if done == total else ""
            print(f"\r{label}: {done}/{total}", end=end, file=sys.stderr, flush=True)

    return show


def say(text: str) -> None:
    """A message on stderr, at once (the results go to stdout)."""
    print(text, file=sys.stderr, flush=True)
