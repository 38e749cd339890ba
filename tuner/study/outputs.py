"""The anytime outputs: best.yaml, pareto/, trials.csv, and the report's snapshot.

Handed to the loop as callbacks (:class:`ResultFiles`, :class:`ReportFile`): after every
completed trial that may change the result they rewrite their files atomically, so a run
stopped at 3 a.m. still leaves the best configuration found so far. The report itself is
rendered elsewhere (:func:`tuner.report.html.render`, a pure function of a
:class:`ReportSnapshot`); this module gathers the snapshot, draws the report during the search
in a thread of its own (:class:`ReportFile`), and writes the report of a study without a
session (:func:`study_report`: ``tuner report`` when the model is gone).
"""

from __future__ import annotations

import csv
import io
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import optuna
import yaml
from optuna.trial import FrozenTrial, TrialState

from tuner import __version__
from tuner.errors import DiskFull, TunerError
from tuner.export.hb_yaml import check_rules, dump_yaml, merged_config, round_trip_yaml, write_atomic
from tuner.study import results
from tuner.study.outcome import Outcome, Tracker, read_outcome
from tuner.study.record import Objectives, TrialRecord, direction_name
from tuner.study.results import ReportSnapshot, Trace
from tuner.study.storage import StudyPaths, study_info
from tuner.study.validation import Validation, stored
from tuner.toolchain.records import RealRecord, real_records


class Output(Protocol):
    """A callback of the loop (:class:`ResultFiles`, :class:`ReportFile`): ``after_trial`` may
    return the best row so far (for the progress bar)."""

    def after_trial(self, study: optuna.Study, trial: FrozenTrial) -> results.Row | None: ...
    def on_progress(self, study: optuna.Study) -> None: ...
    def finish(self, study: optuna.Study) -> None: ...


def snapshot(study: optuna.Study, paths: StudyPaths, storage: str, sensitivity: Mapping[str, float] | None = None,
             traces: Callable[[list[results.Row], results.Row | None], list[Trace]] | None = None,
             notes: list[str] | tuple[str, ...] = (), found: Outcome | None = None) -> ReportSnapshot:
    """The report's view of ``study``: its :class:`~tuner.study.outcome.Outcome` (``found``, when the
    caller keeps one; else read once); ``traces`` (given the rows and best.yaml's trial) when a
    simulator is at hand."""
    info = study_info(study)
    found = found if found is not None else read_outcome(study, info.objectives)
    rs, chosen = list(found.rows), found.best
    return ReportSnapshot(name=study.study_name, info=info, storage=storage,
                          directions=[direction_name(d) for d in study.directions],
                          trials=study.get_trials(deepcopy=False), rows=rs, real=dict(found.real),
                          sensitivity=dict(sensitivity or {}), traces=traces(rs, chosen) if traces is not None and rs else [],
                          best_yaml=paths.best.read_text(encoding="utf-8") if paths.best.is_file() else None,
                          notes=list(notes), validations=dict(found.validations),
                          best_number=None if chosen is None else chosen.number, held_out=found.held_out)


@dataclass(frozen=True)
class Exporter:
    """What writing a trial's YAML needs of a study's problem, as a value (no session)."""

    base_path: Path
    base_raw: Mapping[str, Any]
    node_info_supported: bool
    node_names: frozenset[str]
    provenance: Mapping[str, str]        # study name and the input fingerprints, for the header
    objectives: Objectives
    base_text: str | None = None         # the base YAML as written (read at set-up; exports keep it)

    def __call__(self, row: results.Row, out: Path, comments: tuple[str, ...] = (), margins: bool = True) -> list[str]:
        """Write ``row``'s YAML to ``out``; ``margins``: each constraint's margin in its header."""
        more = results.margin_comments(row, self.objectives) if margins else ()
        return export_trial(row, out, self.base_path, self.node_info_supported, set(self.node_names),
                            dict(self.provenance), tuple(comments) + more, base_raw=self.base_raw,
                            base_text=self.base_text)


def export_trial(row: results.Row, out: Path, base_path: Path, node_info_supported: bool,
                 node_names: set[str] | None, provenance: Mapping[str, str], comments: tuple[str, ...] = (),
                 base_raw: Mapping[str, Any] | None = None, base_text: str | None = None) -> list[str]:
    """Write the trial's hb_mapper YAML to ``out`` (checked, atomic); returns notes. ``comments``
    go into the header after the figures (closest.yaml says what it misses, best_minimal.yaml
    what it kept). ``base_raw``, ``base_text``: the base YAML as already parsed and as written
    (else read from ``base_path``; the output keeps the text's comments and spelling)."""
    if base_text is None and (base_raw is None or base_path.is_file()):
        base_text = base_path.read_text(encoding="utf-8") if base_path.is_file() else None
    if base_raw is None:
        if base_text is None:
            raise TunerError(f"{base_path}: the study's base YAML is gone; it is needed to export (its other fields "
                             "are kept)")
        base_raw = yaml.safe_load(base_text)
    rec = row.trial_record
    cfg, notes = merged_config(dict(base_raw), base_path, rec.candidate, out, node_info_supported)
    check_rules(cfg, out, node_names)
    header = [f"# hb_mapper makertbin config exported by tuner {__version__} from study {provenance.get('study')!r}, "
              f"trial {row.number}",
              f"# simulated accuracy {rec.accuracy:.6f}, modeled latency {rec.latency_ms:.3f} ms, "
              f"{rec.counts.subgraphs} BPU subgraph(s), {rec.counts.cpu_nodes} CPU node(s), "
              f"{rec.counts.int16_nodes} int16 node(s)",
              f"# {calibration_text(rec)}"]
    header += [f"# {c}" for c in comments]
    header += [f"# {k} sha256 {v}" for k, v in provenance.items() if k != "study"]
    header += [f"# note: {n}" for n in notes]
    # the user's file as written, only tuner's keys changed (the base as parsed when it is gone)
    body = round_trip_yaml(base_text, cfg) if base_text is not None else None
    write_if_changed(out, "\n".join(header) + "\n" + (body or dump_yaml(cfg)), protect=(base_path,))
    return notes


#: Why ``default`` resolves as it does (tuner.simulate.calibrate, hb_mapper's model-wise search).
DEFAULT_RULE = ("hb_mapper's default tries max, max-percentile 0.99995 and kl, then their per-channel and "
                "asymmetric variants unless one already reaches output cosine 0.995, and keeps the best output "
                "cosine on calibration sample 0")
MIX_RULE = ("hb_mapper's mix takes the best of max, max-percentile 0.99995 and kl by output cosine on calibration "
            "sample 0, and gives each sensitive node (alone-quantized cosine below 0.999) its own best of the three")


def calibration_text(rec: TrialRecord) -> str:
    """The calibration as the exported YAML writes it (``calibration_parameters``), and for
    ``default`` / ``mix`` what the simulation resolved it to and why; never another method than
    the YAML's ``calibration_type``."""
    cp = dict(rec.candidate_fields.get("calibration_parameters") or {})
    written = ", ".join(f"{k}: {cp[k]}" for k in ("calibration_type", "max_percentile", "per_channel", "optimization")
                        if k in cp) or "calibration_type: (hb_mapper's default)"
    kind = str(cp.get("calibration_type", "default"))
    if kind in ("default", "mix"):
        rule = DEFAULT_RULE if kind == "default" else MIX_RULE
        return f"calibration {written} (resolved by the simulation to {rec.calibration.method}: {rule})"
    return f"calibration {written} (hb_mapper logs it as {rec.calibration.method})"


def write_if_changed(out: Path, text: str, protect: tuple[Path, ...] = ()) -> bool:
    """:func:`write_atomic` unless ``out`` already holds ``text``; whether it wrote."""
    if out.is_file() and not any(p.exists() and out.resolve() == p.resolve() for p in protect) \
            and out.read_text(encoding="utf-8") == text:
        return False
    write_atomic(out, text, protect=protect)
    return True


def trials_csv(rows: list[results.Row], vals: Mapping[int, Validation] | None = None,
               objectives: Objectives | None = None, real: Mapping[int, RealRecord] | None = None) -> str:
    """One line per completed trial; with ``vals``, the validation figures of the trials re-scored
    (blank for the others) and each one's per-sample worst case; with ``objectives``, the latency
    as a multiple of the all-int8 plan's and each constraint's margin (> 0: met); with ``real``
    (``tuner verify``'s records, when there are any), the real toolchain's figures beside the
    simulated ones: status, the objective on the quantized model (and on the calibrated model),
    hbdk's BPU milliseconds and every constraint metric measured (``--local``)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    task = list(dict.fromkeys(k for r in rows for k in r.trial_record.task))
    extra = ["validation_accuracy", "validation_worst_sample", "eval_worst_sample"] if vals else []
    ratio = objectives is not None and objectives.reference("latency_ms:int8") is not None
    names = [m.name for m in objectives.margins(1.0, 1.0, {})] if objectives is not None else []
    extra += (["latency_ratio"] if ratio else []) + [f"margin {n}" for n in names]
    real = {n: rec for n, rec in (real or {}).items()}
    real_metrics = list(dict.fromkeys(k for rec in real.values() for k in (rec.metrics or {})))
    if real:
        extra += ["real_status", "real_accuracy", "real_calibrated_accuracy", "real_compiler_ms"] + \
            [f"real {k}" for k in real_metrics]
    w.writerow(["trial", "accuracy", "latency_ms", "feasible", "subgraphs", "cpu_nodes", "int16_nodes"] + task
               + extra + ["calibration", "plan"])
    for r in sorted(rows, key=lambda r: r.number):
        values = [f"{r.trial_record.task[k]:.6f}" if k in r.trial_record.task else "" for k in task]
        v = (vals or {}).get(r.number)
        checked = [f"{v.accuracy:.6f}", f"{v.worst_sample:.6f}", f"{v.eval_worst_sample:.6f}"] if v else ["", "", ""]
        more = checked if vals else []
        if objectives is not None:
            lr = results.latency_ratio(r, objectives)
            more += ([f"{lr:.4f}"] if ratio and lr is not None else [""] if ratio else [])
            more += [f"{m.margin:.6g}" for m in results.margins(r, objectives)]
        if real:
            rec = real.get(r.number)
            more += ([rec.status, _cell(rec.real_accuracy), _cell(rec.calibrated_accuracy), _cell(rec.compiler_ms, 4)]
                     + [_cell((rec.metrics or {}).get(k)) for k in real_metrics] if rec is not None
                     else [""] * (4 + len(real_metrics)))
        w.writerow([r.number, f"{r.accuracy:.6f}", f"{r.latency_ms:.4f}", r.feasible, r.counts.subgraphs,
                    r.counts.cpu_nodes, r.counts.int16_nodes] + values + more
                   + [r.calibration, r.plan or (f"repeat of trial {r.trial_record.duplicate_of}" if r.duplicate else "")])
    return buf.getvalue()


def _cell(v: float | None, digits: int = 6) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def rewrite_trials_csv(study: optuna.Study, paths: StudyPaths) -> Path:
    """trials.csv from the study alone (its stored validations and real records): what ``tuner
    verify`` calls after it adds real figures, so the file shows them without another search."""
    objectives = results.study_objectives(study)
    write_atomic(paths.trials_csv, trials_csv(results.rows(study, objectives), stored(study) or None, objectives,
                                              real_records(study)))
    return paths.trials_csv


def default_renderer() -> Callable[[ReportSnapshot], str]:
    """:func:`tuner.report.html.render`, for a session opened without ``render=``. The one place
    :mod:`tuner.study` reaches the report layer, at call time: the report imports this module
    (for :class:`ReportSnapshot`), so a module-level import would be a cycle."""
    from tuner.report.html import render

    return render


def study_report(study: optuna.Study, paths: StudyPaths, storage: str, notes: list[str] | tuple[str, ...] = ()) -> Path:
    """Write ``paths.report`` from the study alone, without a session (``tuner report`` when the
    model or data is gone): the simulated views (node sensitivity, per-node traces) are left
    out. With a session, the :class:`tuner.study.source.ReportSource` draws them."""
    write_atomic(paths.report, default_renderer()(snapshot(study, paths, storage, notes=notes)))
    return paths.report


#: trials.csv is rewritten when the front changes, and otherwise at least every this many trials
#: finished in this process or this many seconds (each rewrite reads the whole study).
CSV_EVERY_TRIALS = 10
CSV_EVERY_S = 30.0


class ResultFiles:
    """best.yaml, pareto/trial_NNNNN.yaml and trials.csv, rewritten when the result changes.

    They read the :class:`~tuner.study.outcome.Outcome` the ``tracker`` keeps (the loop's
    callback, fed each trial as it finishes); ``export(row, path)`` writes one trial's YAML
    (an :class:`Exporter`)."""

    def __init__(self, paths: StudyPaths, tracker: Tracker, export: Callable[..., Any],
                 validate: Callable[[optuna.Study, list[results.Row]], dict[int, Validation]] | None = None,
                 also_validate: Callable[[list[results.Row]], list[results.Row]] | None = None) -> None:
        """``validate``: re-scores rows on the validation data (:class:`tuner.study.validation.Validator`);
        at the end (``finish``) the front and the best are validated (kept as the tracker's
        validations) and best.yaml is chosen by :func:`tuner.study.outcome.outcome`;
        ``also_validate``: more rows validated with them (the one-line fixes,
        :func:`tuner.study.trim.fix_rows`), which then compete on the held-out figure."""
        self.paths, self.tracker, self.export, self.validate = paths, tracker, export, validate
        self.also_validate = also_validate
        self.objectives = tracker.objectives
        self._outcome: Outcome | None = None
        self._last_written: tuple[int | None, tuple[int, ...]] | None = None   # (best, front) as last written
        self._last_front: list[tuple[float, float]] = []
        self._last_best: results.Row | None = None
        self._csv_at = time.monotonic()   # when trials.csv was last written
        self._csv_pending = 0             # trials finished here since then
        self.stale: str | None = None     # what retire_stale moved aside, for the summary

    def _csv_due(self) -> bool:
        """trials.csv lags the study by at most CSV_EVERY_TRIALS trials or CSV_EVERY_S seconds, even
        while the front does not change (a kill -9 then loses little of it)."""
        return self._csv_pending > 0 and (self._csv_pending >= CSV_EVERY_TRIALS
                                          or time.monotonic() - self._csv_at >= CSV_EVERY_S)

    @property
    def vals(self) -> dict[int, Validation]:
        """This process's validations of the winners (the tracker's)."""
        return self.tracker.validations

    @property
    def outcome(self) -> Outcome | None:
        """The outcome as last written from (None before the first write)."""
        return self._outcome

    def _write_csv(self, rows: list[results.Row], study: optuna.Study) -> None:
        write_atomic(self.paths.trials_csv, trials_csv(rows, self.vals, self.objectives, real_records(study)))
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
        if rec is None or rec.duplicate_of is not None or not self.objectives.feasible_record(rec):
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
                self._write_csv(self.tracker.rows(study), study)
            return self._last_best
        rows = self.tracker.rows(study)
        comments: tuple[str, ...] = ()
        if force and self.validate is not None and rows:
            front = results.pareto(rows)
            by_eval = results.best(rows, self.objectives.mode, self.objectives.floor)
            if front:
                # the one-line fixes compete on the same held-out figure as the front
                more = self.also_validate(rows) if self.also_validate is not None else []
                self.tracker.validations = self.validate(
                    study, list({r.number: r for r in front + ([by_eval] if by_eval else []) + more}.values()))
        found = self.tracker.outcome(study)
        self._outcome = found
        front, best = list(found.front), found.best
        v = self.vals.get(best.number) if best is not None and force and self.validate is not None else None
        if v is not None:
            comments = (f"validation ({v.samples} sample(s) the search did not select on): {v.metric} "
                        f"{v.accuracy:.6f}, worst sample {v.worst_sample:.6f}; chosen by the "
                        f"{found.chosen_by} figure",)
            warning = found.held_out.header() if found.held_out is not None else ""
            comments += (warning,) if warning else ()
        self._last_front = [(r.accuracy, r.latency_ms) for r in front]
        self._last_best = best
        state = (best.number if best else None, tuple(r.number for r in front))
        if not force and state == self._last_written:
            if self._csv_due():
                self._write_csv(rows, study)
            return best
        self._last_written = state
        if best is not None:
            self.export(best, self.paths.best, comments=comments)
            self.paths.closest.unlink(missing_ok=True)     # a feasible answer replaces the closest one
        else:
            self._write_closest(found)
            self.stale = retire_stale(self.paths) or self.stale
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
        self._write_csv(rows, study)
        return best

    def _write_closest(self, result: Outcome) -> None:
        """closest.yaml while no trial meets the constraints: an answer, marked as one that misses."""
        found = result.closest
        if found is None:
            return
        self.export(found.row, self.paths.closest,
                    comments=(f"NOT FEASIBLE: the trial nearest the constraints ({found.text()})",
                              "no trial of the study meets them yet; see 'tuner status' for next steps"))


def stale_path(paths: StudyPaths, name: str) -> Path:
    """Where a result file no longer true of the study is moved (``best.yaml`` -> ``best.stale.yaml``)."""
    p = paths.root / name
    return p.with_name(p.stem + ".stale" + p.suffix)


def retire_stale(paths: StudyPaths) -> str | None:
    """With no trial meeting the constraints (a floor raised on resume, say), best.yaml and
    best_minimal.yaml describe an answer the study no longer has: move them aside as
    ``*.stale.yaml`` so that nothing lists them as the best; returns what was moved, or None."""
    moved = []
    for p in (paths.best, paths.best_minimal):
        if p.is_file():
            p.replace(stale_path(paths, p.name))
            moved.append(p.name)
    if not moved:
        return None
    return (f"{' and '.join(moved)} moved to {', '.join(stale_path(paths, n).name for n in moved)}: no trial meets "
            "the constraints now (they changed since the file was written), so it is not the study's best")


#: ``finish`` waits this long for a mid-run draw still running, then draws the final report anyway.
JOIN_S = 120.0


class ReportFile:
    """report.html: redrawn during the search without holding up the trial loop, and in full at the end.

    ``gather(study, full)`` reads the page's :class:`ReportSnapshot` in the caller's thread (the
    trial loop's: the study and the simulator are its own); mid-run (``full=False``) it may only
    use what is at hand, not simulate (no new per-node traces). ``draw(snapshot)`` renders and
    writes the page. Mid-run, ``draw`` runs in a thread of its own, at most every ``every``
    seconds (or ten times as long as the last draw took, so the report stays a small share of
    the machine), one at a time: a rewrite that falls due while one is drawing waits for a later
    trial. ``finish`` (the end of the search, also after Ctrl-C) waits for a running draw, then
    gathers and draws the full report in the caller's thread. A report that fails to draw is a
    warning, never the end of an overnight search."""

    def __init__(self, gather: Callable[[optuna.Study, bool], ReportSnapshot],
                 draw: Callable[[ReportSnapshot], Path], every: float = 30.0,
                 warn: Callable[[str], None] | None = None) -> None:
        self._gather, self._draw, self.every, self.warn = gather, draw, every, warn
        self._at: float | None = None              # no mid-run draw starts before this (monotonic)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()               # _at, written by the drawing thread too
        self.full: DiskFull | None = None           # a mid-run draw's full disk, raised in the loop's thread

    def after_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if self.full is not None:       # a mid-run draw found the disk full: stop the search with it
            raise self.full
        if trial.state == TrialState.COMPLETE:
            self.write(study)

    def on_progress(self, study: optuna.Study) -> None:
        self.write(study)

    def finish(self, study: optuna.Study) -> None:
        self.write(study, force=True)

    @property
    def drawing(self) -> bool:
        """Whether a mid-run draw is running."""
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for a running mid-run draw; whether none is left running."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.drawing

    def write(self, study: optuna.Study, force: bool = False) -> Path | None:
        """``force``: the full report, now, in this thread (returns its path, None if it failed).
        Else a mid-run rewrite when one is due, started in the background (returns None)."""
        if force:
            if not self.join(JOIN_S):
                self._warning(f"a report draw started during the search is still running after {JOIN_S:.0f} s; "
                              "drawing the final report anyway")
            try:
                return self._draw(self._gather(study, True))
            except TunerError:
                raise
            except Exception as exc:
                self._warning(f"report.html not written: {type(exc).__name__}: {exc}")
                return None
        now = time.monotonic()
        with self._lock:
            if (self._at is not None and now < self._at) or self.drawing:
                return None
            self._at = now + self.every
        try:
            snap = self._gather(study, False)
        except Exception as exc:
            self._warning(f"report.html not written: {type(exc).__name__}: {exc}")
            return None
        self._thread = threading.Thread(target=self._draw_mid_run, args=(snap,), name="tuner-report", daemon=True)
        self._thread.start()
        return None

    def _draw_mid_run(self, snap: ReportSnapshot) -> None:
        t0 = time.monotonic()
        try:
            self._draw(snap)
        except DiskFull as exc:
            self.full = exc
        except Exception as exc:   # TunerError too: nobody above this thread could report it
            self._warning(f"report.html not written: {type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._at = max(self._at or 0.0, t0 + 10 * (time.monotonic() - t0))

    def _warning(self, text: str) -> None:
        if self.warn is not None:
            self.warn(f"warning: {text}")
