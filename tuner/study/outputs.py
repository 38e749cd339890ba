"""The anytime outputs: best.yaml, pareto/, trials.csv, and the report's snapshot.

Handed to the loop as callbacks (:class:`ResultFiles`, :class:`ReportFile`): after every
completed trial that may change the result they rewrite their files atomically, so a run
stopped at 3 a.m. still leaves the best configuration found so far. The report itself is
rendered elsewhere (:func:`tuner.report.html.render`, a pure function of a
:class:`ReportSnapshot`); this module only gathers the snapshot, and writes the report of a
study without a session (:func:`study_report`: ``tuner report`` when the model is gone).
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import optuna
import yaml
from optuna.trial import FrozenTrial, TrialState

from tuner import __version__
from tuner.errors import TunerError
from tuner.export.hb_yaml import check_rules, dump_yaml, merged_config, write_atomic
from tuner.study import results
from tuner.study.record import TrialRecord, direction_name
from tuner.study.results import ReportSnapshot, Trace
from tuner.study.storage import StudyPaths, study_info
from tuner.toolchain.records import real_records


class Output(Protocol):
    """A callback of the loop (:class:`ResultFiles`, :class:`ReportFile`): ``after_trial`` may
    return the best row so far (for the progress bar)."""

    def after_trial(self, study: optuna.Study, trial: FrozenTrial) -> results.Row | None: ...
    def on_progress(self, study: optuna.Study) -> None: ...
    def finish(self, study: optuna.Study) -> None: ...


def snapshot(study: optuna.Study, paths: StudyPaths, storage: str, sensitivity: dict[str, float] | None = None,
             traces: Callable[[list[results.Row]], list[Trace]] | None = None,
             notes: list[str] | tuple[str, ...] = ()) -> ReportSnapshot:
    """The report's view of ``study``; ``traces`` (given the rows) when a simulator is at hand."""
    rs = results.rows(study)
    return ReportSnapshot(name=study.study_name, info=study_info(study), storage=storage,
                          directions=[direction_name(d) for d in study.directions],
                          trials=study.get_trials(deepcopy=False), rows=rs, real=real_records(study),
                          sensitivity=dict(sensitivity or {}), traces=traces(rs) if traces is not None and rs else [],
                          best_yaml=paths.best.read_text(encoding="utf-8") if paths.best.is_file() else None,
                          notes=list(notes))


def export_trial(row: results.Row, out: Path, base_path: Path, node_info_supported: bool,
                 node_names: set[str] | None, provenance: dict[str, str],
                 extra_header: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Write the trial's hb_mapper YAML to ``out`` (checked, atomic); returns notes.
    ``extra_header``: comment lines after the accuracy line (best_minimal.yaml says what it kept)."""
    if not base_path.is_file():
        raise TunerError(f"{base_path}: the study's base YAML is gone; it is needed to export (its other fields are kept)")
    base_raw = yaml.safe_load(base_path.read_text(encoding="utf-8"))
    rec = row.trial_record
    cfg, notes = merged_config(base_raw, base_path, rec.candidate, out, node_info_supported)
    check_rules(cfg, out, node_names)
    header = [f"# hb_mapper makertbin config exported by tuner {__version__} from study {provenance.get('study')!r}, "
              f"trial {row.number}",
              f"# simulated accuracy {rec.accuracy:.6f}, modeled latency {rec.latency_ms:.3f} ms, "
              f"{rec.counts.subgraphs} BPU subgraph(s), {rec.counts.cpu_nodes} CPU node(s), "
              f"{rec.counts.int16_nodes} int16 node(s); calibration {rec.calibration.method}"]
    header += list(extra_header)
    header += [f"# {k} sha256 {v}" for k, v in provenance.items() if k != "study"]
    header += [f"# note: {n}" for n in notes]
    write_atomic(out, "\n".join(header) + "\n" + dump_yaml(cfg), protect=(base_path,))
    return notes


def trials_csv(rows: list[results.Row]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    task = list(dict.fromkeys(k for r in rows for k in r.trial_record.task))
    w.writerow(["trial", "accuracy", "latency_ms", "feasible", "subgraphs", "cpu_nodes", "int16_nodes"] + task
               + ["calibration", "plan"])
    for r in sorted(rows, key=lambda r: r.number):
        values = [f"{r.trial_record.task[k]:.6f}" if k in r.trial_record.task else "" for k in task]
        w.writerow([r.number, f"{r.accuracy:.6f}", f"{r.latency_ms:.4f}", r.feasible, r.counts.subgraphs,
                    r.counts.cpu_nodes, r.counts.int16_nodes] + values + [r.calibration, r.plan or ""])
    return buf.getvalue()


def default_renderer() -> Callable[[ReportSnapshot], str]:
    """:func:`tuner.report.html.render`, for a session opened without ``render=``. The one place
    :mod:`tuner.study` reaches the report layer, at call time: the report imports this module
    (for :class:`ReportSnapshot`), so a module-level import would be a cycle."""
    from tuner.report.html import render

    return render


def study_report(study: optuna.Study, paths: StudyPaths, storage: str, notes: list[str] | tuple[str, ...] = ()) -> Path:
    """Write ``paths.report`` from the study alone, without a session (``tuner report`` when the
    model or data is gone): the simulated views (node sensitivity, per-node traces) are left
    out. With a session, :meth:`tuner.study.session.StudySession.write_report` draws them."""
    write_atomic(paths.report, default_renderer()(snapshot(study, paths, storage, notes=notes)))
    return paths.report


#: trials.csv is rewritten when the front changes, and otherwise at least every this many trials
#: finished in this process or this many seconds (each rewrite reads the whole study).
CSV_EVERY_TRIALS = 10
CSV_EVERY_S = 30.0


class ResultFiles:
    """best.yaml, pareto/trial_NNNNN.yaml and trials.csv, rewritten when the result changes.

    ``export(row, path)`` writes one trial's YAML (the session's :meth:`export`)."""

    def __init__(self, paths: StudyPaths, mode: str, min_accuracy: float | None,
                 export: Callable[[results.Row, Path], Any]) -> None:
        self.paths, self.mode, self.min_accuracy, self.export = paths, mode, min_accuracy, export
        self._last_written: tuple[int | None, tuple[int, ...]] | None = None   # (best, front) as last written
        self._last_front: list[tuple[float, float]] = []
        self._last_best: results.Row | None = None
        self._csv_at = time.monotonic()   # when trials.csv was last written
        self._csv_pending = 0             # trials finished here since then

    def _csv_due(self) -> bool:
        """trials.csv lags the study by at most CSV_EVERY_TRIALS trials or CSV_EVERY_S seconds, even
        while the front does not change (a kill -9 then loses little of it)."""
        return self._csv_pending > 0 and (self._csv_pending >= CSV_EVERY_TRIALS
                                          or time.monotonic() - self._csv_at >= CSV_EVERY_S)

    def _write_csv(self, rows: list[results.Row]) -> None:
        write_atomic(self.paths.trials_csv, trials_csv(rows))
        self._csv_at, self._csv_pending = time.monotonic(), 0

    # the loop's callback protocol
    def after_trial(self, study: optuna.Study, trial: FrozenTrial) -> results.Row | None:
        return self.write(study, trial=trial) if trial.state == TrialState.COMPLETE else None

    def on_progress(self, study: optuna.Study) -> None:
        """Other processes' trials: they write these files themselves."""

    def finish(self, study: optuna.Study) -> None:
        self.write(study, force=True)

    def _may_change(self, trial: FrozenTrial) -> bool:
        rec = TrialRecord.of_trial(trial)
        if rec is None or rec.duplicate_of is not None or any(v > 0 for v in (trial.constraints or {}).values()):
            return False
        acc, lat = rec.accuracy, rec.latency_ms
        return not any(a >= acc and t <= lat and (a > acc or t < lat) for a, t in self._last_front)

    def write(self, study: optuna.Study, force: bool = False, trial: FrozenTrial | None = None) -> results.Row | None:
        """Rewrite best.yaml, pareto/ and trials.csv when the result changed.

        With the just-finished ``trial``: a trial that is infeasible, a repeat, or strictly
        dominated by the last written front cannot change the front or the best, so the study
        is not re-read (that read grows with the study and would run after every trial)."""
        if trial is not None:
            self._csv_pending += 1
        if not force and trial is not None and self._last_written is not None and not self._may_change(trial):
            if self._csv_due():
                self._write_csv(results.rows(study))
            return self._last_best
        rows = results.rows(study)
        front = results.pareto(rows)
        best = results.best(rows, self.mode, self.min_accuracy)
        self._last_front = [(r.accuracy, r.latency_ms) for r in front]
        self._last_best = best
        state = (best.number if best else None, tuple(r.number for r in front))
        if not force and state == self._last_written:
            if self._csv_due():
                self._write_csv(rows)
            return best
        self._last_written = state
        if best is not None:
            self.export(best, self.paths.best)
        self.paths.pareto.mkdir(parents=True, exist_ok=True)
        keep: set[str] = set()
        for r in front:
            out = self.paths.pareto / f"trial_{r.number:05d}.yaml"
            keep.add(out.name)
            if not out.exists():
                self.export(r, out)
        for old in self.paths.pareto.glob("trial_*.yaml"):
            if old.name not in keep:
                old.unlink(missing_ok=True)
        self._write_csv(rows)
        return best


class ReportFile:
    """report.html, rewritten at most every ``every`` seconds (or ten times as long as the last
    one took) and at the end. ``write(force)`` draws it; a report that fails to draw is a
    warning, never the end of an overnight search."""

    def __init__(self, write: Callable[[optuna.Study], Path | None], every: float = 30.0,
                 warn: Callable[[str], None] | None = None) -> None:
        self._write, self.every, self.warn = write, every, warn
        self._at: float | None = None

    def after_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if trial.state == TrialState.COMPLETE:
            self.write(study)

    def on_progress(self, study: optuna.Study) -> None:
        self.write(study)

    def finish(self, study: optuna.Study) -> None:
        self.write(study, force=True)

    def write(self, study: optuna.Study, force: bool = False) -> Path | None:
        now = time.monotonic()
        if not force and self._at is not None and now < self._at:
            return None
        self._at = now + self.every
        try:
            out = self._write(study)
            # On a big model the per-node traces take seconds: keep the report under ~10% of the search.
            self._at = max(self._at, now + 10 * (time.monotonic() - now))
            return out
        except TunerError:
            raise
        except Exception as exc:
            if self.warn is not None:
                self.warn(f"warning: report.html not written: {type(exc).__name__}: {exc}")
            return None


