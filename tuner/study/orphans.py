"""Trials whose worker died: found, marked failed, and re-queued once, with Optuna's own tools.

A worker killed with ``kill -9`` (or a machine that drops off the network) leaves its trial
RUNNING. Two detectors feed one retry rule:

* database storages (PostgreSQL, MySQL, SQLite): Optuna's heartbeat. Each worker's trial
  records a heartbeat every ``heartbeat_interval`` seconds (server clock); before asking for a
  trial, every worker fails the RUNNING trials silent for longer than the grace period and hands
  them to ``heartbeat_stale_trial_callback``. Works across machines.
* journal files: Optuna 5.0's ``JournalStorage`` implements no heartbeat (it is not a
  ``BaseHeartbeat``), and a journal file is one machine's storage, so a trial is an orphan when
  the process recorded in its ``worker`` attribute (same host; same start time, so a reused
  pid does not count) no longer runs. Checked by each worker between trials and while it waits
  for room in the budget, and at once by ``tuner search --jobs`` when one of its children dies.

Either way the retry is Optuna's ``RetryHeartbeatStaleTrialCallback``: a WAITING copy of the
trial (same parameters), at most ``max_retry`` times per original trial (its
``retry_history`` system attribute counts them), picked up by the next worker that asks.
"""

from __future__ import annotations

import copy
import datetime
import inspect
import os
import socket
import warnings
from collections.abc import Iterable
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

try:  # optuna >= 4.9; the older name is a deprecated alias there
    from optuna.storages import RetryHeartbeatStaleTrialCallback as _Retry
except ImportError:  # pragma: no cover - optuna < 4.9
    from optuna.storages import RetryFailedTrialCallback as _Retry

#: User attributes of the dead attempt that must not be carried into its retry: the worker
#: that ran it (a retry showing a dead pid would be reaped again before its new worker writes
#: its own) and the error it did not have.
_NOT_INHERITED = ("worker", "error")


class RetryOrphan(_Retry):
    """Optuna's retry of a stale trial, without the dead worker's identity, with a plan label."""

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        trial = copy.copy(trial)
        attrs = {k: v for k, v in trial.user_attrs.items() if k not in _NOT_INHERITED}
        first = trial.system_attrs.get("failed_trial", trial.number)
        attrs["plan"] = f"retry of trial {first}" + (f" ({attrs['plan']})" if attrs.get("plan") and
                                                      not str(attrs["plan"]).startswith("retry of") else "")
        trial.user_attrs = attrs
        super().__call__(study, trial)


def retry_callback(max_retry: int) -> RetryOrphan | None:
    if max_retry <= 0:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ExperimentalWarning: the callback is Optuna's own
        return RetryOrphan(max_retry=max_retry)


def rdb_heartbeat_kwargs(heartbeat: float | None, grace_factor: int, max_retry: int) -> dict[str, Any]:
    """``RDBStorage`` keyword arguments for heartbeats and the retry of stale trials."""
    if not heartbeat:
        return {}
    interval = max(1, int(round(heartbeat)))
    name = ("heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback"
            in inspect.signature(RDBStorage.__init__).parameters else "failed_trial_callback")
    warnings.filterwarnings("ignore", message=".*heartbeat_interval.*")  # ExperimentalWarning
    return {"heartbeat_interval": interval, "grace_period": grace_factor * interval, name: retry_callback(max_retry)}


def worker_identity() -> dict[str, Any]:
    """What a trial records about the process running it (``worker`` user attribute): host,
    pid, and (Linux) the process's start time, so a reused pid is not taken for the worker."""
    ident: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
    started = _proc_stat(os.getpid())[1]
    if started is not None:
        ident["started"] = started
    return ident


def tag_trials(sampler: optuna.samplers.BaseSampler) -> optuna.samplers.BaseSampler:
    """Make ``sampler`` record the worker on each trial as soon as Optuna creates it.

    Optuna calls ``before_trial`` right after the trial becomes RUNNING and before relative
    sampling (multivariate TPE can take a while there). Recorded later, in the objective, a
    worker killed while sampling left a RUNNING trial naming no process, which :func:`reap`
    could never attribute."""
    inner = sampler.before_trial

    def before_trial(study: optuna.Study, trial: FrozenTrial) -> None:
        study._storage.set_trial_user_attr(trial._trial_id, "worker", worker_identity())
        inner(study, trial)

    sampler.before_trial = before_trial  # type: ignore[method-assign]
    return sampler


def _proc_stat(pid: int) -> tuple[str | None, int | None]:
    """(state, start time in clock ticks since boot) from /proc/PID/stat, or Nones (not Linux)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None, None


def alive(pid: int, started: int | None = None) -> bool:
    """Whether process ``pid`` runs (not a zombie; given its start time, the same process)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    state, start = _proc_stat(pid)
    if state in ("Z", "X"):
        return False
    return started is None or start is None or start == started


def reap(study: optuna.Study, max_retry: int = 1, pids: Iterable[int] | None = None) -> list[int]:
    """RUNNING trials of dead processes on this host -> FAIL, each re-queued up to ``max_retry`` times.

    ``pids``: only these processes' trials, known dead (a parent's children); otherwise every
    trial whose recorded process on this host is gone. Returns the failed trial numbers. Safe
    to run in several workers at once: a trial another worker already failed is skipped.
    """
    host = socket.gethostname()
    known = set(pids) if pids is not None else None
    retry = retry_callback(max_retry)
    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        w = t.user_attrs.get("worker") or {}
        pid = w.get("pid")
        if w.get("host") != host or not isinstance(pid, int):
            continue
        if (pid not in known) if known is not None else alive(pid, w.get("started")):
            continue
        try:
            if not study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another worker got there first
        failed.append(t.number)
        if retry is not None and t.params:
            retry(study, study._storage.get_trial(t._trial_id))
    return failed


def unverifiable(trial: FrozenTrial, settle: float = 60.0) -> bool:
    """A RUNNING trial whose death :func:`reap` could not notice: its worker is on another host,
    or it has recorded no worker ``settle`` seconds after it started."""
    w = trial.user_attrs.get("worker")
    if w:
        return bool(w.get("host") != socket.gethostname())
    started = trial.datetime_start
    return started is not None and (datetime.datetime.now() - started).total_seconds() > settle


def stale_enabled(study: optuna.Study) -> bool:
    """Whether the study's storage runs Optuna's heartbeat (then pid checks are not needed)."""
    from optuna.storages._heartbeat import is_heartbeat_enabled

    return is_heartbeat_enabled(study._storage)


__all__ = ["RetryOrphan", "alive", "rdb_heartbeat_kwargs", "reap", "retry_callback", "stale_enabled",
           "tag_trials", "unverifiable", "worker_identity"]


def fail_own_running(study: optuna.Study) -> None:
    """After an abort: this process's trials still RUNNING become FAIL (storage consistent)."""
    host, pid = socket.gethostname(), os.getpid()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        w = t.user_attrs.get("worker") or {}
        if w.get("host") == host and w.get("pid") == pid:
            try:
                study.tell(t.number, state=TrialState.FAIL)
            except Exception:
                pass
