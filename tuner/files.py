"""Files tuner writes: the cache folder, and writing a file atomically.

Every result (YAML, CSV, JSON, report, statistics, thresholds) is written to a hidden
temporary file beside its target and renamed over it, so a reader (another worker, a user
opening the file, a run killed half way) sees the old file or the new one, never a part.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from tuner.errors import TunerError


def cache_dir() -> Path:
    """``$TUNER_CACHE_DIR``, else ``$XDG_CACHE_HOME/tuner``, else ``~/.cache/tuner``."""
    if os.environ.get("TUNER_CACHE_DIR"):
        return Path(os.environ["TUNER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tuner"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_file(path: Path, binary: bool = False, fsync: bool = False) -> Iterator[IO[Any]]:
    """A file object on a hidden temporary file beside ``path``, renamed onto ``path`` when the
    block ends without an exception (removed otherwise). The new file gets the mode an existing
    ``path`` has, else the user's default (mkstemp alone would make it 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
            os.fchmod(f.fileno(), path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_atomic(path: Path, text: str | bytes, protect: tuple[Path, ...] = ()) -> None:
    """Write ``text`` (UTF-8) or bytes to ``path`` via a hidden temporary file and rename; never
    onto a protected file."""
    path = Path(path)
    for p in protect:
        if p.exists() and path.exists() and path.resolve() == p.resolve():
            raise TunerError(f"{path}: refusing to overwrite your input YAML; choose another --out")
    with atomic_file(path, binary=isinstance(text, bytes)) as f:
        f.write(text)


#: A folder tuner is about to fill must have at least this much space left.
MIN_FREE_BYTES = 16 * 1024 * 1024


def check_writable(folder: Path, what: str) -> None:
    """Raise one TunerError unless tuner can create files in ``folder`` (created later if missing):
    checked up front, before minutes of statistics or sensitivity, by writing and removing a
    probe file in it (or in its nearest existing parent), which also catches read-only mounts."""
    folder = Path(folder)
    probe_dir = folder
    while not probe_dir.exists() and probe_dir != probe_dir.parent:
        probe_dir = probe_dir.parent
    if not probe_dir.is_dir():
        raise TunerError(f"{folder}: cannot write {what} there: {probe_dir} is a file, not a folder; "
                         "choose another folder")
    try:
        fd, tmp = tempfile.mkstemp(dir=probe_dir, prefix=".tuner-write-check.", suffix=".tmp")
        try:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(tmp)
    except OSError as exc:
        raise TunerError(f"{folder}: cannot write {what} there ({exc.strerror or type(exc).__name__} in "
                         f"{probe_dir}); make it writable or choose another folder") from None
    import shutil

    free = shutil.disk_usage(probe_dir).free
    if free < MIN_FREE_BYTES:
        raise TunerError(f"{folder}: cannot write {what} there: its file system is full ({free // 1024} KB free); "
                         "free some space or choose another folder")


def jsonable(v: Any) -> Any:
    """``v`` as plain JSON (what every storage keeps): non-finite floats become None, keys strings,
    tuples lists, anything else its ``str``."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)
