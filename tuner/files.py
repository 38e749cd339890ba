"""Files tuner writes: the cache folder, and writing a file atomically.

Every result (YAML, CSV, JSON, report, statistics, thresholds) is written to a hidden
temporary file beside its target and renamed over it, so a reader (another worker, a user
opening the file, a run killed half way) sees the old file or the new one, never a part.
"""

from __future__ import annotations

import errno
import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from tuner.errors import DiskFull, TunerError


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
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        if disk_full(exc):
            raise disk_full_error(exc, path) from None
        raise
    try:
        with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
            os.fchmod(f.fileno(), path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError) and disk_full(exc):
            raise disk_full_error(exc, path) from None
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


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a write refused for lack of space: the disk is full (ENOSPC) or the
    user's quota on it is used up (EDQUOT)."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


def disk_full_cause(exc: BaseException) -> DiskFull | None:
    """The full disk behind ``exc``, if any: ``exc`` itself, or what it was raised while handling
    (Optuna, for one, raises its own AssertionError while a failed write is unwinding)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, DiskFull):
            return e
        if disk_full(e):
            assert isinstance(e, OSError)
            return disk_full_error(e, Path(e.filename or "."))
        e = e.__cause__ or e.__context__
    return None


def mount_point(path: Path) -> Path:
    """The mount point of the file system ``path`` (or its nearest existing parent) is on."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return p


def disk_full_error(exc: OSError, path: Path, what: str = "") -> DiskFull:
    """One line for a write refused for lack of space: which file, which file system and how
    much it has free, and the fix."""
    import shutil

    disk = mount_point(Path(path))
    try:
        free = f", {shutil.disk_usage(disk).free // 1024} KB free"
    except OSError:
        free = ""
    why = ("your disk quota on the file system at" if exc.errno == getattr(errno, "EDQUOT", None)
           else "the file system at")
    return DiskFull(f"cannot write {path}" + (f" ({what})" if what else "") + f": {why} {disk} is full{free}; "
                    "free some space there (or write elsewhere), then run the same command again")


#: A folder tuner is about to fill must have at least this much space left.
MIN_FREE_BYTES = 16 * 1024 * 1024


def check_writable(folder: Path, what: str, fix: str = "make it writable or choose another folder") -> None:
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
                         f"{probe_dir}); {fix}") from None
    import shutil

    free = shutil.disk_usage(probe_dir).free
    if free < MIN_FREE_BYTES:
        raise TunerError(f"{folder}: cannot write {what} there: its file system is full ({free // 1024} KB free); "
                         f"free some space, or {fix.removeprefix('make it writable or ')}")


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
