"""The worker loop: trials until the study holds exactly its budget, with any number of workers.

Five layers, outermost first: :func:`run` (a search in this process: resume, warm start,
progress, outputs, Ctrl-C), :func:`_run_workers` (``--jobs N`` worker processes),
:func:`work` (one worker on a shared study), :func:`optimize_until` (a session's objective
under the budget) and :func:`budgeted_optimize`, the core: the budget gate
(:func:`may_start`) before each trial and :func:`surplus` inside it, over any objective
and any Optuna storage. Outputs are callbacks with the :class:`tuner.study.outputs.Output`
protocol.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, NotRequired, Protocol, TypedDict

import optuna
from optuna.storages import fail_stale_trials
from optuna.trial import FrozenTrial, TrialState

from tuner.console import LineProgress
from tuner.errors import DiskFull
from tuner.files import disk_full_cause
from tuner.study.orphans import fail_own_running, reap, stale_enabled, unverifiable
from tuner.study.outputs import Output
from tuner.study.record import DUPLICATE_OF
from tuner.study.sections import parse_duration
from tuner.study.session import StudySession

#: An Optuna ``study.optimize`` callback.
Callback = Callable[[optuna.Study, FrozenTrial], None]
#: What an objective returns: one value, or one per objective.
Values = float | Sequence[float]


class ProgressBar(Protocol):
    """The part of a tqdm bar the loop uses."""

    disable: bool

    def update(self, n: float | None = 1) -> bool | None: ...
    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None: ...
    def write(self, s: str, file: Any = None) -> None: ...
    def close(self) -> None: ...


class RunInfo(TypedDict):
    """What :func:`run` reports besides the study."""

    zombies: list[int]          # trials of dead processes failed (and re-queued)
    enqueued: int               # warm-start trials enqueued
    completed_before: int       # completed trials when the run started
    interrupted: bool           # Ctrl-C / SIGTERM
    failed: NotRequired[int]    # trials that failed in this run
    stopped: NotRequired[str]   # why the run stopped early (failed trials in a row)
    best_text: NotRequired[str]  # the best trial so far, for the progress bar and lines
    exhausted: NotRequired[str]  # why the run ended before n_trials: only repeats were proposed


def duration(text: Any) -> float | None:
    return parse_duration(text, "--timeout")


def run(search: StudySession, n_trials: int, timeout: float | None, jobs: int, seed: int | None,
        progress: bool = True, outputs: Sequence[Output] | None = None) -> tuple[optuna.Study, RunInfo]:
    """Create or resume the study and optimise until it holds ``n_trials`` completed trials.

    ``outputs`` (default: the session's result files and report) are called after each trial
    run here (``after_trial``), when other processes' trials complete (``on_progress``) and at
    the end (``finish``)."""
    outputs = search.outputs() if outputs is None else outputs
    study = search.study(seed)
    zombies = reap_dead(study, search.place.max_retry)
    enqueued = search.enqueue_warm_start(study)
    search.scorer.index(study)
    done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    info: RunInfo = {"zombies": zombies, "enqueued": enqueued, "completed_before": done, "interrupted": False}
    bar = _progress(n_trials, done, timeout) if progress else None
    lines = LineProgress("trials", n_trials, done) if bar is not None and bar.disable else None   # not a TTY

    def on_trial(st: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.state == TrialState.COMPLETE:
            best = None
            for out in outputs:
                best = out.after_trial(st, trial) or best
            if bar is not None:
                bar.update(1)
            if best is not None:
                info["best_text"] = f"best #{best.number}: acc {best.accuracy:.4f}, {best.latency_ms:.3f} ms"
                if bar is not None:
                    bar.set_postfix_str(info["best_text"])
            if lines is not None and lines.due():
                completed = len(st.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
                lines(min(completed, n_trials), extra=str(info.get("best_text", "")))
        elif trial.state == TrialState.FAIL:
            info["failed"] = info.get("failed", 0) + 1
            if "error" in trial.user_attrs:
                _say(f"trial {trial.number} failed: {trial.user_attrs['error']}", bar)
            streak = 0
            for t in reversed(st.get_trials(deepcopy=False)):
                if t.state == TrialState.FAIL:
                    streak += 1
                elif t.state == TrialState.COMPLETE:
                    break
            if streak >= 20:
                info["stopped"] = f"20 trials in a row failed (last: {trial.user_attrs.get('error', '?')})"
                st.stop()

    try:
        if n_trials > done:
            if jobs <= 1:
                exhausted = optimize_until(search, study, n_trials, timeout, [search.tracker, on_trial],
                                           lambda: "stopped" in info)
                if exhausted:
                    info["exhausted"] = exhausted
            else:
                info["zombies"] += _run_workers(search, study, n_trials, timeout, jobs, seed, bar, outputs)
                exhausted = workers_exhausted(study, n_trials)
                if exhausted and not STOP.is_set():
                    info["exhausted"] = exhausted
    except KeyboardInterrupt:
        info["interrupted"] = True
    except Exception:
        # An interrupt that lands inside Optuna's own trial bookkeeping can surface as another
        # exception (optuna 5.0 _run_trial: UnboundLocalError); it is still the user's stop.
        if not STOP.is_set():
            raise
    finally:
        if bar is not None:
            bar.close()
    if STOP.is_set():
        info["interrupted"] = True
        fail_own_running(study)
    for out in outputs:
        out.finish(study)
    return study, info


#: Set by the first Ctrl-C / SIGTERM: the study stops after the running trial.
STOP = threading.Event()


def install_stop_handlers(say: Callable[[str], None] | None = None) -> None:
    """First Ctrl-C or SIGTERM: finish the running trial, then stop. Second: abort it now.

    A KeyboardInterrupt raised at an arbitrary point can land inside Optuna's bookkeeping; a
    flag checked between trials cannot, so the common case leaves nothing half-written.
    """
    def handler(signum: int, frame: FrameType | None) -> None:
        if STOP.is_set():
            raise KeyboardInterrupt
        STOP.set()
        if say:
            say("stopping after the running trial (Ctrl-C again to abort it)")

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _say(text: str, bar: ProgressBar | None) -> None:
    if bar is not None and not bar.disable:
        bar.write(text, file=sys.stderr)
    else:
        print(text, file=sys.stderr)


def _progress(total: int, done: int, timeout: float | None) -> ProgressBar:
    from tqdm import tqdm

    bar: ProgressBar = tqdm(total=total, initial=min(done, total), unit="trial", file=sys.stderr, dynamic_ncols=True,
                disable=not sys.stderr.isatty(), desc="trials")
    return bar


def surplus(trial: optuna.Trial, budget: int) -> bool:
    """Whether this just-started trial is one too many: the completed trials and the running
    ones started before it (lower numbers) already fill the budget. Two workers that passed
    the budget gate at the same moment both start a trial; the later-numbered one gives way."""
    ts = trial.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
    n = sum(t.state == TrialState.COMPLETE or t.number < trial.number for t in ts)
    if n < budget:
        return False
    fixed = trial.study._storage.get_trial_system_attrs(trial._trial_id).get("fixed_params")
    if fixed:  # an enqueued trial (warm start, retry): put it back for when a slot frees up
        trial.study.enqueue_trial(fixed, user_attrs={k: v for k, v in trial.user_attrs.items() if k != "worker"})
    return True


def reap_dead(study: optuna.Study, max_retry: int = 1) -> list[int]:
    """Orphans of dead processes on this host, for storages without Optuna's heartbeat (journal
    files). A database storage with heartbeats is left to them: another machine may share this
    host name, and its live workers' process ids mean nothing here."""
    return [] if stale_enabled(study) else reap(study, max_retry)


def may_start(study: optuna.Study, n_trials: int, deadline: float | None = None, poll: float = 0.5,
              max_retry: int = 1) -> bool:
    """Wait until a trial may start: True when the completed and running trials leave room in the
    budget, False once the study holds ``n_trials`` completed ones (or a stop was asked for).

    While others' trials fill the budget this worker waits rather than starts one more: one of
    them may fail (or be orphaned, which this loop detects), and then a trial is still needed.
    A running trial whose worker cannot be checked from here (a journal storage, another host)
    is not waited for: this worker leaves the remaining slots to it."""
    while not STOP.is_set() and (deadline is None or time.monotonic() < deadline):
        ts = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
        complete = sum(t.state == TrialState.COMPLETE for t in ts)
        if complete >= n_trials:
            return False
        if len(ts) < n_trials:
            return True
        heartbeat = stale_enabled(study)
        if not heartbeat and any(unverifiable(t) for t in ts if t.state == TrialState.RUNNING):
            return False
        time.sleep(poll)
        if heartbeat:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fail_stale_trials(study)
        else:
            reap_dead(study, max_retry)
    return False


#: Proposals in a row that repeat a scored candidate before a worker stops: the space (or what
#: the sampler still proposes of it) holds no new candidate. A repeat costs a proposal, no
#: simulation, and is no completed trial (:meth:`tuner.study.scorer.Scorer.objective`).
REPEATS_IN_A_ROW = 50


def repeat_of(trial: FrozenTrial) -> int | None:
    """The completed trial this pruned trial repeats (None: not a repeat)."""
    n = trial.user_attrs.get(DUPLICATE_OF) if trial.state == TrialState.PRUNED else None
    return n if isinstance(n, int) else None


def workers_exhausted(study: optuna.Study, n_trials: int, max_repeats: int = REPEATS_IN_A_ROW) -> str | None:
    """Why worker processes ended before ``n_trials`` completed trials, when it was the repeats:
    the study's last ``max_repeats`` finished trials are all repeats (each worker stops after that
    many in a row, and says so only in its own process). None otherwise."""
    trials = study.get_trials(deepcopy=False)
    done = sum(t.state == TrialState.COMPLETE for t in trials)
    tail = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)][-max_repeats:]
    if done >= n_trials or len(tail) < max_repeats or any(repeat_of(t) is None for t in tail):
        return None
    return _exhausted(max_repeats, done, n_trials)


def _exhausted(repeats: int, done: int, n_trials: int) -> str:
    """Why a search ended before ``n_trials``: the sampler proposed only candidates already scored."""
    return (f"the last {repeats} proposals repeated candidates already scored: the space holds no new "
            f"one the sampler finds ({done} distinct candidate(s) of the {n_trials} asked for)")


def budgeted_optimize(objective: Callable[[optuna.Trial], Values], study: optuna.Study, n_trials: int,
                      timeout: float | None, callbacks: Sequence[Callback],
                      should_stop: Callable[[], bool] = lambda: False,
                      max_retry: int = 1, max_repeats: int = REPEATS_IN_A_ROW) -> str | None:
    """Run ``objective`` until the study holds exactly ``n_trials`` completed trials, with any
    number of workers (processes, machines) doing the same: each trial starts only when the
    budget has room (:func:`may_start`), and a trial started in a race for the last slot gives
    way (:func:`surplus`). Optuna's MaxTrialsCallback alone lets every worker finish one more.
    After each trial the trials of dead workers on this host are failed (and re-queued).

    A repeat (a pruned trial with :data:`DUPLICATE_OF`) is not a completed trial, so the budget
    is ``n_trials`` distinct candidates; after ``max_repeats`` repeats in a row this worker
    stops and says why (returned; None when it stopped for another reason)."""
    full: list[DiskFull] = []     # a full disk inside a trial: Optuna would record a failed trial and go on

    def gated(trial: optuna.Trial) -> Values:
        if surplus(trial, n_trials):
            raise optuna.TrialPruned("the budget was reached by other workers' trials")
        try:
            return objective(trial)
        except Exception as exc:
            cause = disk_full_cause(exc)
            if cause is not None:
                full.append(cause)
            raise

    repeats = 0

    def reaper(st: optuna.Study, trial: FrozenTrial) -> None:
        nonlocal repeats
        repeats = repeats + 1 if repeat_of(trial) is not None else 0 if trial.state == TrialState.COMPLETE else repeats
        reap_dead(st, max_retry)

    deadline = None if timeout is None else time.monotonic() + timeout
    every: list[Callback] = [*callbacks, reaper]
    while not should_stop() and (deadline is None or time.monotonic() < deadline):
        if repeats >= max_repeats:
            done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
            return _exhausted(repeats, done, n_trials)
        if not may_start(study, n_trials, deadline, max_retry=max_retry):
            break
        try:
            study.optimize(gated, n_trials=1, catch=(Exception,), callbacks=every, gc_after_trial=False)
        except Exception as exc:   # a write of Optuna's own: its bookkeeping may raise something else on top
            cause = disk_full_cause(exc)
            if cause is None:
                raise
            raise cause from None
        if full:
            raise full[0]
    return None


def optimize_until(search: StudySession, study: optuna.Study, n_trials: int, timeout: float | None,
                   callbacks: Sequence[Callback], should_stop: Callable[[], bool] = lambda: False) -> str | None:
    """:func:`budgeted_optimize` with the session's objective (its scorer's)."""
    return budgeted_optimize(search.scorer.objective, study, n_trials, timeout, callbacks, should_stop,
                             search.place.max_retry)


def work(search: StudySession, study: optuna.Study, n_trials: int, timeout: float | None) -> None:
    """One worker's loop on a shared study, until it holds ``n_trials`` completed trials: the
    session's tracker is the loop's callback, and the result files read its outcome."""
    search.scorer.index(study)
    reap_dead(study, search.place.max_retry)
    files = search.result_files       # the parent process draws the report

    def write_files(st: optuna.Study, trial: FrozenTrial) -> None:
        files.after_trial(st, trial)

    try:
        optimize_until(search, study, n_trials, timeout, [search.tracker, write_files])
    except KeyboardInterrupt:
        pass
    except Exception:
        if not STOP.is_set():
            raise
    if STOP.is_set():
        fail_own_running(study)


#: A worker process's exit code when a write failed for lack of space (errno ENOSPC); the one line
#: it would print goes to the parent through a queue, and the parent prints it once.
DISK_FULL_EXIT = 28


def _worker(spec: dict[str, Any], errors: Any = None) -> None:
    install_stop_handlers()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        try:
            search = StudySession.open(spec["space"], spec["name"], spec["storage"], spec["results_dir"],
                                       spec["threads"], quiet=True, heartbeat=spec["heartbeat"],
                                       max_retry=spec["max_retry"])
            study = search.study(spec["seed"], create=False)
        except KeyboardInterrupt:
            return
        work(search, study, spec["n_trials"], spec["timeout"])
    except Exception as exc:
        cause = disk_full_cause(exc)
        if cause is None:
            raise
        if errors is not None:
            errors.put(str(cause))
        sys.exit(DISK_FULL_EXIT)


def _run_workers(search: StudySession, study: optuna.Study, n_trials: int, timeout: float | None, jobs: int,
                 seed: int | None, bar: ProgressBar | None, outputs: Sequence[Output] = ()) -> list[int]:
    """``jobs`` worker processes on one study (processes, not threads: the simulator is CPU-bound).

    Each worker gets cores // jobs onnxruntime threads, so the workers together do not
    oversubscribe the machine. A worker that dies (``kill -9``, out of memory) has its running
    trial failed and re-queued at once; returns those trial numbers."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = search.problem.ws.threads or max(1, cores // jobs)
    place = search.place
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()        # a worker's one line about a full disk
    procs = []
    for i in range(jobs):
        spec = {"space": str(search.problem.space.path), "name": place.name, "storage": place.storage_url,
                "results_dir": str(place.paths.root.parent), "threads": threads,
                "seed": None if seed is None else seed + i, "n_trials": n_trials, "timeout": timeout,
                "heartbeat": place.heartbeat, "max_retry": place.max_retry}
        p = ctx.Process(target=_worker, args=(spec, errors), daemon=False)
        p.start()
        procs.append(p)
    orphans: list[int] = []
    reaped: set[int] = set()

    def reap_children() -> None:
        dead = [p.pid for p in procs if p.exitcode not in (None, 0) and p.pid is not None and p.pid not in reaped]
        if dead:
            reaped.update(dead)
            reap(study, place.max_retry, dead)
            # the dead workers' trials, failed here or already by a surviving worker
            for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
                if (t.user_attrs.get("worker") or {}).get("pid") in dead and "error" not in t.user_attrs:
                    orphans.append(t.number)

    try:
        seen = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
        lines = LineProgress("trials", n_trials, seen) if bar is not None and bar.disable else None  # not a TTY
        forwarded = False
        while any(p.is_alive() for p in procs):
            time.sleep(0.5)
            reap_children()
            full = any(p.exitcode == DISK_FULL_EXIT for p in procs)
            if (STOP.is_set() or full) and not forwarded:
                forwarded = True
                for p in procs:
                    if p.is_alive():
                        p.terminate()  # SIGTERM: each worker finishes its running trial, then stops
            now = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
            if bar is not None and now > seen:
                bar.update(min(now, n_trials) - min(seen, n_trials))
            if lines is not None and now > seen:
                lines(min(now, n_trials))
            if now > seen:
                for out in outputs:           # the workers write best.yaml; the parent the report
                    out.on_progress(study)
            seen = now
    except KeyboardInterrupt:  # second Ctrl-C: abort the workers' trials too
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(30)
        raise
    for p in procs:
        p.join()
    if any(p.exitcode == DISK_FULL_EXIT for p in procs):
        raise DiskFull(errors.get() if not errors.empty() else
                       f"a worker could not write in {place.paths.root}: the disk is full; free some space "
                       "there (or write elsewhere), then run the same command again")
    reap_children()
    return orphans
