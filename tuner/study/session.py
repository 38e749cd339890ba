"""The study session: one process's view of a study over a resolved space.

:class:`StudySession` loads everything once (workspace, cost model, sensitivity,
decisions), creates or resumes the study (refusing to resume one made from other inputs),
enqueues the warm start, and is the objective: each trial's candidate is simulated, or
answered from the stored result when an equal candidate ran before (here or in another
worker). Its outputs (:mod:`tuner.study.outputs`) are the loop's callbacks; the loop
itself is :mod:`tuner.study.loop`.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner.candidate import Calibration, Candidate
from tuner.cost import CostModel
from tuner.export.hb_yaml import write_atomic
from tuner.study import results
from tuner.study.minimal import MinimalFix
from tuner.study.opening import AtFinish
from tuner.study.orphans import reap
from tuner.study.outcome import Outcome, read_outcome
from tuner.study.outputs import Exporter, Output, ReportFile, ResultFiles, default_renderer, snapshot
from tuner.study.problem import InputsCheck, Place, Problem, create_study, join_study, load_problem, sampler
from tuner.study.record import (
    Direction,
    Objectives,
    TrialRecord,
)
from tuner.study.results import ReportSnapshot, Trace
from tuner.study.scorer import Scorer
from tuner.study.space import ResolvedSpace, SearchSpace, load_space
from tuner.study.storage import (
    StudyPaths,
)
from tuner.study.trim import Simplest
from tuner.study.validation import Validator, validation_data
from tuner.study.warmstart import (
    Plan,
    best_baseline_calibration,
    reference_calibration,
)
from tuner.workspace import Workspace, progress_printer


@dataclass
class StudySession:
    problem: Problem
    place: Place
    scorer: Scorer
    render: Callable[[ReportSnapshot], str] | None = None   # report.html from a snapshot (the caller's)
    notices: list[str] = field(default_factory=list)   # what opening the study changed, for the terminal
    _results: ResultFiles | None = None
    _validator: Validator | None = None
    _report: ReportFile | None = None
    _manual_cal: Calibration | None = None
    _minimal: MinimalFix | None = None

    # ---------------------------------------------------------------- set-up
    @classmethod
    def open(cls, space_path: str | Path | SearchSpace, name: str | None = None, storage: str | None = None,
             results_dir: str | Path = "results", threads: int | None = None, quiet: bool = False,
             sensitivity: dict[str, float] | None = None,
             render: Callable[[ReportSnapshot], str] | None = None,
             check: InputsCheck | None = None) -> StudySession:
        """``sensitivity``: the study's stored ranking (a worker joining it), instead of computing one;
        ``check``: run on the base YAML and model as loaded (:func:`tuner.study.problem.load_problem`)."""
        space = space_path if isinstance(space_path, SearchSpace) else load_space(space_path)
        name = name or space.name
        paths = StudyPaths(Path(results_dir) / name)
        problem = load_problem(space, paths, storage, threads, quiet, sensitivity, check)
        scorer = Scorer(problem.ws, problem.cost, problem.resolved, problem.objectives)
        return cls(problem=problem, place=Place(name, paths, storage), scorer=scorer, render=render,
                   notices=list(problem.notices))

    # the problem's and the place's parts, by their old names
    @property
    def space(self) -> SearchSpace:
        return self.problem.space

    @property
    def ws(self) -> Workspace:
        return self.problem.ws

    @property
    def resolved(self) -> ResolvedSpace:
        return self.problem.resolved

    @property
    def cost(self) -> CostModel:
        return self.problem.cost

    @property
    def name(self) -> str:
        return self.place.name

    @property
    def paths(self) -> StudyPaths:
        return self.place.paths

    @property
    def storage_url(self) -> str | None:
        return self.place.storage_url


    @property
    def sensitivity(self) -> dict[str, float]:
        return dict(self.problem.sensitivity)

    @sensitivity.setter
    def sensitivity(self, value: dict[str, float]) -> None:
        self.problem = self.problem.with_sensitivity(value)

    @property
    def heartbeat(self) -> float | None:
        return self.place.heartbeat

    @heartbeat.setter
    def heartbeat(self, value: float | None) -> None:
        self.place = replace(self.place, heartbeat=value)

    @property
    def max_retry(self) -> int:
        return self.place.max_retry

    @max_retry.setter
    def max_retry(self, value: int) -> None:
        self.place = replace(self.place, max_retry=value)

    def fingerprints(self) -> dict[str, str]:
        return dict(self.problem.fingerprints)

    def changed_inputs(self, stored: dict[str, str]) -> list[str]:
        return self.problem.changed_inputs(stored)

    @property
    def objectives(self) -> Objectives:
        return self.problem.objectives

    @property
    def mode(self) -> str:
        return self.objectives.mode

    def directions(self) -> list[Direction]:
        return self.objectives.directions()

    def sampler(self, seed: int | None) -> optuna.samplers.BaseSampler:
        return sampler(self.problem, seed)

    def study(self, seed: int | None = None, create: bool = True) -> optuna.Study:
        """The study: created or resumed (:func:`~tuner.study.problem.create_study`), or joined
        (``create=False``: :func:`~tuner.study.problem.join_study`)."""
        if create:
            return create_study(self.problem, self.place, seed, self.notices)
        return join_study(self.problem, self.place, seed)

    def _where(self) -> str:
        return self.place.where()

    # ---------------------------------------------------------------- warm start
    def warm_start_plans(self, manual_calibration: Calibration | None = None) -> list[Plan]:
        """See :func:`tuner.study.warmstart.warm_start_plans`."""
        return self.problem.warm_start_plans(manual_calibration)

    def manual_calibration(self) -> Calibration:
        """The calibration of the manual plans (:func:`~tuner.study.warmstart.best_baseline_calibration`).
        Costs one evaluation per baseline; the scorer keeps each for its enqueued trial."""
        if self._manual_cal is None:
            self._manual_cal = best_baseline_calibration(self.resolved, self.warm_start_plans(), self.scorer.accuracy)
        return self._manual_cal

    def enqueue_warm_start(self, study: optuna.Study) -> int:
        if study.get_trials(deepcopy=False):
            return 0
        plans = self.warm_start_plans(self.manual_calibration() if self.space.settings.warm_start and self.sensitivity
                                      else None)
        # The plans are distinct candidates and the study is empty: no skip_if_exists, whose float
        # test (np.isclose, rtol 1e-5) takes max_percentile 0.99999 for 1.0 and drops that baseline.
        for label, params in plans:
            study.enqueue_trial(params, user_attrs={"plan": label})
        return len(plans)

    # ---------------------------------------------------------------- trials
    def clean_zombies(self, study: optuna.Study, pids: Iterable[int] | None = None) -> list[int]:
        """RUNNING trials whose worker process on this host is gone -> FAIL (re-queued ``max_retry`` times)."""
        return reap(study, self.max_retry, pids)

    def fail_own_running(self, study: optuna.Study) -> None:
        """After an abort: this process's trials still RUNNING become FAIL (storage consistent)."""
        host, pid = socket.gethostname(), os.getpid()
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            w = t.user_attrs.get("worker") or {}
            if w.get("host") == host and w.get("pid") == pid:
                try:
                    study.tell(t.number, state=TrialState.FAIL)
                except Exception:
                    pass

    def load_done(self, study: optuna.Study) -> None:
        """Index the study's completed trials in the scorer (:meth:`tuner.study.scorer.Scorer.index`)."""
        self.scorer.index(study)

    def objective(self, trial: optuna.Trial) -> list[float] | float:
        """:meth:`tuner.study.scorer.Scorer.objective`."""
        return self.scorer.objective(trial)

    # ---------------------------------------------------------------- outputs
    def outputs(self) -> list[Output]:
        """The loop's callbacks of a search in this process: result files, best_minimal.yaml at the
        end (before the report, which shows it), and the report."""
        return [self.result_files, AtFinish(self.write_minimal), self.report_file]

    @property
    def result_files(self) -> ResultFiles:
        if self._results is None:
            v = self.validator
            show = progress_printer("validation of the front")
            self._results = ResultFiles(self.paths, self.objectives, self.exporter,
                                        None if v is None else (lambda study, rows: v.validate(study, rows, show)))
        return self._results

    @property
    def validator(self) -> Validator | None:
        """Scores the winners on data the search did not select on (None when there is none)."""
        if self._validator is None:
            found = validation_data(self.space, self.ws)
            if found is None:
                return None
            self._validator = Validator(self.ws, found[0], found[1], self.objectives.accuracy, self.scorer)
        return self._validator

    @property
    def report_file(self) -> ReportFile:
        if self._report is None:
            # The default renderer is imported here, in the caller's thread: mid-run draws run in a
            # thread of their own, and an import there would run beside the trial loop.
            default = default_renderer()

            def draw(snap: ReportSnapshot) -> Path:
                write_atomic(self.paths.report, (self.render or default)(snap))
                return self.paths.report

            self._report = ReportFile(self.report_snapshot, draw, warn=lambda text: print(text, file=sys.stderr))
        return self._report

    def write_results(self, study: optuna.Study, force: bool = False,
                      trial: optuna.trial.FrozenTrial | None = None) -> results.Row | None:
        """Rewrite best.yaml, pareto/ and trials.csv when the result changed (:class:`ResultFiles`)."""
        return self.result_files.write(study, force=force, trial=trial)

    def write_report(self, study: optuna.Study, force: bool = False) -> Path | None:
        """Rewrite report.html: ``force``, the full report now (its path, None if it failed); else a
        mid-run rewrite in the background when one is due (:class:`ReportFile`)."""
        return self.report_file.write(study, force=force)

    def report_snapshot(self, study: optuna.Study, full: bool = True) -> ReportSnapshot:
        """The report's view of ``study``. ``full``: with the per-node traces, evaluated on the
        simulator when not cached; else (mid-run, the trial loop is using the simulator) only
        the traces already cached, and the page says where the others are drawn."""
        skipped = 0

        def draw(rs: list[results.Row], best: results.Row | None) -> list[Trace]:
            nonlocal skipped
            drawn, skipped = self._draw_traces(rs, full, best)
            return drawn

        snap = snapshot(study, self.paths, self._where(), self.sensitivity, draw,
                        rows=self.result_files.tracker.rows(study))
        if not full and snap.rows and skipped:
            snap.notes.append("the per-node error along the graph is drawn at the end of the search and by "
                              f"'tuner report {self.name}' (it needs the simulator, which the search is using)")
        snap.simplest = self.last_simplest
        return snap

    def _trace_candidates(self, rs: list[results.Row],
                          best: results.Row | None = None) -> list[tuple[str, int | None, Candidate]]:
        """(label, trial, candidate) of the per-node traces: the exported trial (``best``, default the
        best by the eval figure) and the all-int8 baseline."""
        want: list[tuple[str, int | None, Candidate]] = []
        best = best if best is not None else results.best(rs, self.mode, self.objectives.floor)
        if best is not None:
            want.append((f"trial {best.number} (exported)", best.number, best.trial_record.candidate))
        base = [r for r in rs if r.plan and r.plan.startswith("baseline")]
        if base:
            b = max(base, key=lambda r: (r.accuracy, -r.number))
            want.append((f"best all-BPU int8 baseline ({b.calibration}, trial {b.number})", b.number,
                         b.trial_record.candidate))
        else:
            ref = self.resolved.candidate(self.resolved.params_for(reference_calibration(self.space,
                                                                                          self.resolved.base)))
            want.append(("all-BPU int8 baseline", None, ref))
        return want

    def traces(self, rs: list[results.Row], evaluate: bool = True, best: results.Row | None = None) -> list[Trace]:
        """Per-node cosine along the graph for the exported trial (``best``: best.yaml's, when the
        caller knows it) and the all-int8 baseline (two evaluations with every node's output; cached
        by candidate, so a rewrite that does not change the best costs nothing). ``evaluate=False``:
        only the cached ones."""
        return self._draw_traces(rs, evaluate, best)[0]

    def _draw_traces(self, rs: list[results.Row], evaluate: bool,
                     best: results.Row | None) -> tuple[list[Trace], int]:
        """(the traces, how many were skipped as not cached): see :meth:`traces`."""
        out, skipped = [], 0
        for label, number, cand in self._trace_candidates(rs, best):
            ev = self.scorer.per_node(cand, evaluate)
            if ev is None:
                skipped += 1
                continue
            out.append(Trace.from_evaluation(label, number, ev))
        return out, skipped

    # ---------------------------------------------------------------- the simplest fix
    @property
    def minimal(self) -> MinimalFix:
        """best.yaml's trial trimmed, and the one-line fixes (:class:`tuner.study.minimal.MinimalFix`)."""
        if self._minimal is None:
            self._minimal = MinimalFix(self.scorer, self.exporter, self.paths.best_minimal)
        return self._minimal

    def outcome(self, study: optuna.Study) -> Outcome:
        """The study's outcome from the rows this process keeps (:mod:`tuner.study.outcome`)."""
        return read_outcome(study, self.objectives, self.result_files.tracker.rows(study))

    def simplest(self, study: optuna.Study) -> Simplest | None:
        return self.minimal.simplest(study, self.outcome(study))

    def score(self, study: optuna.Study, cand: Candidate) -> TrialRecord:
        return self.minimal.score(study, cand)

    def modeled_latency(self, cand: Candidate) -> float:
        return self.minimal.modeled_latency(cand)

    @property
    def last_simplest(self) -> Simplest | None:
        return self.minimal.last

    def write_minimal(self, study: optuna.Study) -> Simplest | None:
        return self.minimal.write(study, self.outcome(study))

    @property
    def exporter(self) -> Exporter:
        """Writes a trial's YAML (a value: the result files hold it, not the session)."""
        p = self.problem
        return Exporter(self.space.base, p.base_raw, self.ws.node_info_supported, frozenset(self.ws.graph.by_name),
                        {"study": self.name, **p.fingerprints}, self.objectives)

    def export(self, row: results.Row, out: Path, comments: tuple[str, ...] = ()) -> list[str]:
        return self.exporter(row, out, comments)
