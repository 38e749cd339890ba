"""Joining a study that exists: ``tuner worker`` on this or another machine, and the checks
``tuner search`` makes before it reads any data."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tuner.errors import TunerError
from tuner.inputs.config import load_config
from tuner.inputs.model import file_fingerprint
from tuner.study.opening import check_outputs
from tuner.study.results import ReportSnapshot
from tuner.study.session import StudySession
from tuner.study.space import SearchSpace, load_space
from tuner.study.storage import SENSITIVITY_ATTR, StudyPaths, load_study, study_info


def preflight(space: SearchSpace | str | Path, name: str | None, storage: str | None, results_dir: str | Path) -> None:
    """:func:`check_outputs` for ``tuner search`` before anything reads the data."""
    if name is None:
        name = (space if isinstance(space, SearchSpace) else load_space(space)).name
    check_outputs(StudyPaths(Path(results_dir) / name), storage)


def join_study(name: str, storage: str | None, space: str | Path | None = None, results_dir: str | Path = "results",
               threads: int | None = None, heartbeat: float | None = None, max_retry: int = 1,
               quiet: bool = True, render: Callable[[ReportSnapshot], str] | None = None) -> StudySession:
    """A worker's view of an existing study, made from this machine's files.

    The space file is the one given, else the path the study recorded (the same machine, or
    the same layout). Its model, data, base YAML and resolved space are fingerprinted here and
    compared with the study's: a worker with other inputs would add results of another problem."""
    paths = StudyPaths(Path(results_dir) / name)
    if storage is None and not paths.journal.exists():
        raise TunerError(f"no study {name!r}: {paths.journal} does not exist; pass --storage URL (the study's "
                         "database) or --results-dir")
    study = load_study(name, storage, paths, " (start it with 'tuner search SPACE --storage URL')", heartbeat=None)
    info = study_info(study)
    space_path = Path(space) if space is not None else Path(info.space_path)
    if not space_path.is_file():
        raise TunerError(f"the study's space file {space_path} is not on this machine; pass --space PATH to this "
                         "machine's copy (with the model, data and base YAML beside it as on the first machine)")
    _check_files_early(name, space_path, info.fingerprints)
    return StudySession.open(space_path, name, storage, results_dir, threads, quiet=quiet,
                             sensitivity=study.user_attrs.get(SENSITIVITY_ATTR), render=render, heartbeat=heartbeat,
                             max_retry=max_retry)


def _check_files_early(name: str, space_path: Path, stored: dict[str, str]) -> None:
    """The model and base YAML are compared before the workspace is built (calibration
    statistics of a big model take minutes); data and the resolved space are checked after."""
    space = load_space(space_path)
    files = {"base_config": ("base YAML", space.base)}
    files["model"] = ("model", load_config(space.base).onnx_model)
    for key, (what, path) in files.items():
        have = file_fingerprint(path) if path is not None and path.is_file() else "missing"
        if key in stored and have != stored[key]:
            raise TunerError(f"cannot join study {name!r}: {what} {path} (sha256 {have[:12]}) is not the study's "
                             f"{what} (sha256 {stored[key][:12]}); copy the study's files to this machine (same "
                             "model, data, base YAML and space), or point --space at the right space file")
