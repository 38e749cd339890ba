"""The names ``tuner.study.runner`` exported before the study was split by role.

Kept so the CLI (being restructured into ``tuner/commands/`` in parallel) and scripts keep
importing them unchanged; new code imports from :mod:`tuner.study` or the role modules:
storage (paths, storages, redaction, opening), warmstart (plans), session (the study
session), outputs (anytime files, report snapshot), loop (the worker loop). Also the
report of an existing study without a session (``tuner report`` when the model is gone).
"""

from __future__ import annotations

from pathlib import Path

import optuna

from tuner.console import progress_printer
from tuner.study.loop import (
    STOP,
    budgeted_optimize,
    duration,
    install_stop_handlers,
    may_start,
    optimize_until,
    reap_dead,
    run,
    surplus,
    work,
)
from tuner.study.outputs import default_renderer, export_trial, snapshot, trials_csv
from tuner.study.results import ReportSnapshot, Trace
from tuner.study.session import StudySession, join_study
from tuner.study.space import SearchSpace
from tuner.study.storage import (
    FINGERPRINTS,
    GRACE_FACTOR,
    HEARTBEAT_S,
    SENSITIVITY_ATTR,
    STUDY_ATTR,
    StudyPaths,
    journal_storage,
    make_storage,
    open_existing,
    redact,
    study_info,
)
from tuner.study.warmstart import node_sensitivity as _node_sensitivity
from tuner.study.warmstart import reference_calibration, warm_start_plans
from tuner.workspace import Workspace

Search = StudySession                      # the old name
_reference_calibration = reference_calibration


def node_sensitivity(space: SearchSpace, ws: Workspace, paths: StudyPaths, quiet: bool = True) -> dict[str, float]:
    """The old signature of :func:`tuner.study.warmstart.node_sensitivity` (cached in ``paths.sensitivity``)."""
    return _node_sensitivity(space, ws, paths.sensitivity, None if quiet else progress_printer("node sensitivity"))


def study_report(study: optuna.Study, paths: StudyPaths, storage: str, search: StudySession | None = None,
                 notes: list[str] | tuple[str, ...] = ()) -> Path:
    """Write ``paths.report`` from the study. The simulated views (node sensitivity, per-node
    traces) come from ``search``; without one (model or data gone) they are left out."""
    from tuner.report.html import write_report

    snap = snapshot(study, paths, storage, search.sensitivity if search is not None else {},
                    search.traces if search is not None else None, notes)
    return write_report(paths.report, snap)


__all__ = ["FINGERPRINTS", "GRACE_FACTOR", "HEARTBEAT_S", "ReportSnapshot", "SENSITIVITY_ATTR", "STOP", "STUDY_ATTR",
           "Search", "StudyPaths", "StudySession", "Trace", "budgeted_optimize", "default_renderer", "duration",
           "export_trial", "install_stop_handlers", "join_study", "journal_storage", "make_storage", "may_start",
           "node_sensitivity", "open_existing", "optimize_until", "reap_dead", "redact", "run", "study_info",
           "study_report", "surplus", "trials_csv", "warm_start_plans", "work"]
