"""Where a study lives: its folder, its Optuna storage, its tuner attributes.

The bottom layer of :mod:`tuner.study`: paths of the anytime outputs, the storage behind a
URL (journal file by default, any Optuna database URL), redaction of passwords for
messages, and opening a study that exists (``tuner status``/``export``/``report``/``verify``,
a joining worker). Nothing here knows about trials' contents.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock
from optuna.storages.journal._file import get_lock_file

from tuner.console import say
from tuner.errors import TunerError
from tuner.files import check_writable, disk_full, disk_full_error
from tuner.study.orphans import rdb_heartbeat_kwargs
from tuner.study.record import STUDY_ATTR, StudyInfo  # noqa: F401  (STUDY_ATTR: re-exported)

SENSITIVITY_ATTR = "tuner_sensitivity"  # the node ranking the space was resolved with (workers reuse it)
FINGERPRINTS = ("model", "data", "base_config", "space")


@dataclass
class StudyPaths:
    root: Path

    @property
    def journal(self) -> Path:
        return self.root / "study.journal"

    @property
    def best(self) -> Path:
        return self.root / "best.yaml"

    @property
    def closest(self) -> Path:
        """The trial nearest the constraints, written while no trial meets them."""
        return self.root / "closest.yaml"

    @property
    def best_minimal(self) -> Path:
        """best.yaml's trial trimmed to the decisions its floor needs (tuner.study.trim)."""
        return self.root / "best_minimal.yaml"

    @property
    def pareto(self) -> Path:
        return self.root / "pareto"

    @property
    def sensitivity(self) -> Path:
        return self.root / "sensitivity.json"

    @property
    def trials_csv(self) -> Path:
        return self.root / "trials.csv"

    @property
    def report(self) -> Path:
        return self.root / "report.html"


#: Seconds between a worker's heartbeats in a database storage; a RUNNING trial whose worker
#: has been silent for GRACE_FACTOR heartbeats is failed (and retried) by the next worker to ask.
HEARTBEAT_S = 20
GRACE_FACTOR = 3


def _check_scheme(url: str) -> None:
    scheme = url.split("://", 1)[0]
    if scheme == "postgres" or scheme.startswith("postgres+"):
        fixed = "postgresql" + scheme[len("postgres"):]
        raise TunerError(f"--storage: {redact(url)}: use {fixed}://... (SQLAlchemy does not accept the "
                         "Heroku-style postgres:// scheme)")


def check_storage(url: str | None, paths: StudyPaths, must_exist: bool) -> None:
    """One line for a storage tuner cannot use, before any work: ``postgres://`` (SQLAlchemy knows
    only postgresql://), a journal or SQLite file that does not exist where the study must exist
    (status, export, report, worker: they create nothing), a folder the study cannot be written to."""
    if url is not None and "://" in url:
        _check_scheme(url)
        if not url.startswith("sqlite:///"):
            return          # a database server: its own errors, when it is opened
        path = Path(url[len("sqlite:///"):].split("?", 1)[0])
        if not str(path) or str(path) in (".", ":memory:"):
            return
    else:
        path = paths.journal if url is None else Path(url)
    if must_exist and not path.is_file():
        if url is None:
            raise TunerError(f"no study: {path} does not exist; pass --storage URL or --results-dir")
        raise TunerError(f"--storage: {path} does not exist; check the path (this command reads a study and "
                         "creates nothing)")
    if not must_exist:
        check_writable(path.parent, "the study's storage")


def make_storage(url: str | None, paths: StudyPaths, heartbeat: float | None = HEARTBEAT_S,
                 max_retry: int = 1) -> JournalStorage | RDBStorage:
    """Default: an Optuna journal file in the study folder (multi-process safe, cheap writes);
    else any Optuna storage URL (sqlite:///..., postgresql://...) or a journal file path.

    Database storages get Optuna's heartbeat: a worker killed with ``kill -9`` or a machine
    lost mid-trial leaves a trial whose heartbeat stops, and the next worker to start a trial
    marks it failed and re-queues it (``max_retry`` times). Journal files have no heartbeat in
    Optuna; their orphans are found by process id instead (:mod:`tuner.study.orphans`)."""
    if url is not None and "://" in url:
        _check_scheme(url)
    if url is None:
        paths.root.mkdir(parents=True, exist_ok=True)
        return journal_storage(paths.journal)
    if "://" in url:
        kwargs = rdb_heartbeat_kwargs(heartbeat, GRACE_FACTOR, max_retry)
        engine = {"connect_args": {"timeout": 30}} if url.startswith("sqlite") else {"pool_pre_ping": True}
        try:
            return RDBStorage(url, engine_kwargs=engine, **kwargs)
        except Exception as exc:  # bad URL, missing driver, unreachable server
            hint = ("; install the driver: pip install 'tuner[postgres]'"
                    if isinstance(exc, ImportError) and url.startswith("postgres") else "")
            raise TunerError(f"--storage: cannot open {redact(url)}: {type(exc).__name__}: "
                             f"{_redact_text(str(exc), url)}{hint}") from None
    path = Path(url)
    path.parent.mkdir(parents=True, exist_ok=True)
    return journal_storage(path)


def journal_storage(path: Path, notice: Callable[[str], None] = say) -> JournalStorage:
    """A journal file storage that survives ``kill -9`` of a writer and a full disk.

    The path is made absolute: Optuna's symlink lock stats its target through the link, and a
    relative target resolves against the link's folder, so a stale lock left by a killed
    process was never recognised and the next writer spun forever. A live writer holds the
    lock for milliseconds, so a lock older than 10 s is reclaimed.

    A torn record (a write cut short by a full disk or a killed writer) is cut off before
    Optuna reads the file (:func:`repair_journal`, ``notice`` says what was dropped), and an
    append never follows one (:class:`SafeJournalFileBackend`).
    """
    path = path.resolve()
    lock = JournalFileSymlinkLock(str(path), grace_period=10)
    if path.is_file() and not _intact(path.read_bytes()):      # the lock only to repair: a read-only folder reads
        try:
            with get_lock_file(lock):
                text = repair_journal(path)
        except OSError as exc:      # a read-only folder: Optuna skips a torn last record when it reads
            text = (f"{path} ends with a torn record that cannot be cut off here ({exc.strerror}); reading the "
                    "complete ones")
        if text:
            notice(f"note: {text}")
    return JournalStorage(SafeJournalFileBackend(str(path), lock_obj=lock))


def _record(line: bytes) -> bool:
    """Whether ``line`` (with its newline) is one complete journal record."""
    if not line.endswith(b"\n"):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


#: How every record Optuna's journal writes begins (json.dumps of a dict whose first key is op_code).
RECORD_START = b'{"op_code":'


def repair_journal(path: Path) -> str | None:
    """Cut torn records out of the journal at ``path`` (the caller holds its lock); what was
    dropped, in one line, or None when every record is complete.

    A torn last record (a writer stopped by a full disk or ``kill -9`` mid-write) is cut off.
    A torn record with a complete one appended after it on the same line (what an older tuner
    wrote when it re-ran after a full disk, which Optuna then refused to read) keeps the complete
    record: no completed trial is lost, and the records keep their order."""
    data = path.read_bytes()
    if not data or _intact(data):
        return None
    kept: list[bytes] = []
    dropped = 0
    for line in data.splitlines(keepends=True):
        if _record(line):
            kept.append(line)
            continue
        start = line.rfind(RECORD_START)
        if start > 0 and _record(line[start:]):
            kept.append(line[start:])
            dropped += start
        else:
            dropped += len(line)
    if not dropped:
        return None
    fixed = b"".join(kept)
    if data.startswith(fixed):       # only a torn tail: cut it off in place
        with open(path, "r+b") as f:
            f.truncate(len(fixed))
            f.flush()
            os.fsync(f.fileno())
    else:
        from tuner.files import write_atomic

        write_atomic(path, fixed)
    return (f"{path}: dropped {dropped} byte(s) of a torn journal record (a write cut short by a full disk or a "
            f"killed process); the {len(kept)} complete record(s) and every completed trial are intact")


def _intact(data: bytes) -> bool:
    """The cheap check of a whole journal (the common case: nothing to repair): it ends with a
    newline and every line, and only a line, begins a record. (JSON escapes the quotes of a
    string value, so the bytes of :data:`RECORD_START` occur only where a record begins.)"""
    lines = data.count(b"\n")
    starts = data.count(b"\n" + RECORD_START) + data.startswith(RECORD_START)
    return data.endswith(b"\n") and lines == starts == data.count(RECORD_START)


class SafeJournalFileBackend(JournalFileBackend):
    """Optuna's journal file, whose append never leaves or follows a torn record: a write that
    fails (a full disk) is cut back to the file's length before it, and a torn tail left by a
    killed writer is cut off before the next append. A full disk is one TunerError."""

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        text = ("\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n").encode("utf-8")
        with get_lock_file(self._lock):
            fd = os.open(self._file_path, os.O_RDWR)
            try:
                size = os.lseek(fd, 0, os.SEEK_END)
                if size and os.pread(fd, 1, size - 1) != b"\n":   # a writer killed mid-record: cut it off first
                    repair_journal(Path(self._file_path))
                    size = os.lseek(fd, 0, os.SEEK_END)
                try:
                    done = 0
                    while done < len(text):     # unbuffered: a short write is seen, and undone below
                        done += os.pwrite(fd, text[done:], size + done)
                    os.fsync(fd)
                except OSError as exc:
                    try:
                        os.ftruncate(fd, size)
                    except OSError:
                        pass            # the next open cuts the torn record off (repair_journal)
                    if disk_full(exc):
                        raise disk_full_error(exc, Path(self._file_path),
                                              "the study's journal; every completed trial in it is kept") from None
                    raise
            finally:
                os.close(fd)


def redact(url: str) -> str:
    """A storage URL without its password, for messages and reports."""
    if "://" in url and "@" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}"
    return url


def _redact_text(text: str, url: str) -> str:
    """``text`` (a driver's error message) with the URL's password replaced where the URL, or its
    ``user:password@`` part, appears: only there (with password ``p``, "Can't load plugin" stays)."""
    text = text.replace(url, redact(url))
    if "://" in url and "@" in url:
        creds = url.split("://", 1)[1].rsplit("@", 1)[0]
        if ":" in creds:
            user, password = creds.split(":", 1)
            if password:
                text = text.replace(f"{user}:{password}@", f"{user}:***@")
    return text


def study_info(study: optuna.Study) -> StudyInfo:
    """The ``tuner`` attribute a study was created with (inputs, objectives, fingerprints)."""
    info = study.user_attrs.get(STUDY_ATTR)
    if not info or not isinstance(info, dict):
        raise TunerError(f"study {study.study_name!r} was not made by tuner")
    return StudyInfo.from_json(info)


def open_existing(name_or_dir: str, storage: str | None, results_dir: str | Path = "results") -> tuple[optuna.Study, StudyPaths]:
    """A study by name (``results/<name>``) or by its folder, for status and export."""
    p = Path(name_or_dir)
    if p.is_dir() and (p / "study.journal").exists() and storage is None:
        paths = StudyPaths(p)
        name = p.name
    else:
        paths = StudyPaths(Path(results_dir) / name_or_dir)
        name = name_or_dir
        if storage is None and not paths.journal.exists():
            found = closest_first(name_or_dir, [d.name for d in _subfolders(Path(results_dir))
                                                if (d / "study.journal").is_file()])
            there = (f"the studies in {results_dir}: {', '.join(found)}" if found else
                     f"{results_dir} holds no study (pass --results-dir for another folder")
            raise TunerError(f"no study {name_or_dir!r}: {paths.journal} does not exist; {there}"
                             + (" (pass" if found else ",") + " --storage URL for a study in a database)")
    return load_study(name, storage, paths), paths


def _subfolders(folder: Path) -> list[Path]:
    try:
        return [d for d in folder.iterdir() if d.is_dir()]
    except OSError:
        return []


def closest_first(name: str, names: list[str]) -> list[str]:
    """``names``, the ones most like ``name`` first (a typo'd study name finds its study)."""
    from difflib import SequenceMatcher

    return sorted(names, key=lambda n: (-SequenceMatcher(None, name.lower(), n.lower()).ratio(), n))


def load_study(name: str, storage: str | None, paths: StudyPaths, hint: str = "",
                heartbeat: float | None = HEARTBEAT_S) -> optuna.Study:
    """The study ``name`` in ``storage`` (default: the journal in ``paths``), or one line naming
    the studies that storage does hold (then ``hint``)."""
    check_storage(storage, paths, must_exist=True)
    stor = make_storage(storage, paths, heartbeat=heartbeat)
    try:
        return optuna.load_study(study_name=name, storage=stor)
    except KeyError:
        names = closest_first(name, [s.study_name for s in optuna.get_all_study_summaries(stor)])
        raise TunerError(f"no study named {name!r} in {redact(storage) if storage else paths.journal}; "
                         f"it has {', '.join(names) or 'none'}{hint}") from None

