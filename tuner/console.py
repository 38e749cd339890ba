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


def progress_every() -> float:
    """Seconds between progress lines when stderr is not a terminal (``$TUNER_PROGRESS_EVERY``, default 10)."""
    import os

    try:
        return max(0.0, float(os.environ.get("TUNER_PROGRESS_EVERY", "10")))
    except ValueError:
        return 10.0


def _eta(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class LineProgress:
    """Progress for a log file or a pipe: one line every :func:`progress_every` seconds (and at the
    end), with the rate since the start and an ETA, instead of a bar that needs a terminal."""

    def __init__(self, label: str, total: int, done: int = 0, every: float | None = None):
        import time

        self.label, self.total, self.start_done = label, total, done
        self.every = progress_every() if every is None else every
        self.t0 = self.last = time.monotonic()

    def due(self) -> bool:
        """Whether the next call prints (the caller may skip counting otherwise)."""
        import time

        return time.monotonic() - self.last >= self.every

    def __call__(self, done: int, total: int | None = None, extra: str = "") -> None:
        import time

        total = self.total if total is None else total
        now = time.monotonic()
        if done < total and now - self.last < self.every:
            return
        self.last = now
        rate = (done - self.start_done) / max(now - self.t0, 1e-9)
        eta = f", ETA {_eta((total - done) / rate)}" if rate > 0 and done < total else ""
        more = f", {extra}" if extra else ""
        print(f"{self.label}: {done}/{total} ({100 * done / max(total, 1):.0f}%){more}{eta}", file=sys.stderr,
              flush=True)


def progress_printer(label: str) -> Callable[[int, int], None]:
    """A one-line progress display on stderr: redrawn in place on a terminal, else a line every
    few seconds (:class:`LineProgress`), so a long run in a log shows it is alive."""
    tty = sys.stderr.isatty()
    lines: LineProgress | None = None

    def show(done: int, total: int) -> None:
        nonlocal lines
        if tty:
            end = "\n" if done == total else ""
            print(f"\r{label}: {done}/{total}", end=end, file=sys.stderr, flush=True)
            return
        if lines is None:
            lines = LineProgress(label, total, 0)
        lines(done, total)

    return show


def say(text: str) -> None:
    """A message on stderr, at once (the results go to stdout)."""
    print(text, file=sys.stderr, flush=True)
