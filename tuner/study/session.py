"""The study session: what a search in this process is made of, and the orchestration between them.

:class:`StudySession` holds four values: the :class:`~tuner.study.problem.Problem` (the inputs,
loaded once), the :class:`~tuner.study.problem.Place` (where its study lives), the
:class:`~tuner.study.scorer.Scorer` (the objective: a candidate to a trial record, one cache)
and the :class:`~tuner.study.outcome.Tracker` (the loop's callback keeping the study's
:class:`~tuner.study.outcome.Outcome`). It opens the study, enqueues the warm start, and
builds the loop's outputs (:mod:`tuner.study.outputs`) from those values: none of them holds
the session. The loop itself is :mod:`tuner.study.loop`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import optuna

from tuner.candidate import Calibration
from tuner.study.minimal import MinimalFix
from tuner.study.opening import AtFinish
from tuner.study.outcome import Tracker
from tuner.study.outputs import Exporter, Output, ReportFile, ResultFiles, default_renderer
from tuner.study.problem import InputsCheck, Place, Problem, create_study, join_study, load_problem
from tuner.study.results import ReportSnapshot
from tuner.study.scorer import Scorer
from tuner.study.source import Page, ReportSource, warn
from tuner.study.space import SearchSpace, load_space
from tuner.study.storage import StudyPaths
from tuner.study.trim import fix_rows
from tuner.study.validation import Validator, validation_data
from tuner.study.warmstart import best_baseline_calibration
from tuner.workspace import progress_printer


@dataclass
class StudySession:
    problem: Problem
    place: Place
    scorer: Scorer
    tracker: Tracker
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
             check: InputsCheck | None = None, heartbeat: float | None = None, max_retry: int = 1) -> StudySession:
        """``sensitivity``: the study's stored ranking (a worker joining it), instead of computing one;
        ``check``: run on the base YAML and model as loaded (:func:`tuner.study.problem.load_problem`);
        ``heartbeat``, ``max_retry``: how the study's workers are watched (:class:`Place`)."""
        space = space_path if isinstance(space_path, SearchSpace) else load_space(space_path)
        name = name or space.name
        paths = StudyPaths(Path(results_dir) / name)
        problem = load_problem(space, paths, storage, threads, quiet, sensitivity, check)
        scorer = Scorer(problem.ws, problem.cost, problem.resolved, problem.objectives)
        return cls(problem=problem, place=Place(name, paths, storage, heartbeat, max_retry), scorer=scorer,
                   tracker=Tracker(problem.objectives), render=render, notices=list(problem.notices))

    def study(self, seed: int | None = None, create: bool = True) -> optuna.Study:
        """The study: created or resumed (:func:`~tuner.study.problem.create_study`, what it changed
        goes to :attr:`notices`), or joined (``create=False``: :func:`~tuner.study.problem.join_study`)."""
        if create:
            return create_study(self.problem, self.place, seed, self.notices)
        return join_study(self.problem, self.place, seed)

    def with_sensitivity(self, sensitivity: dict[str, float]) -> None:
        """Take a node ranking computed after opening (``tuner report`` of a study that had none)."""
        if self._report is not None:
            raise RuntimeError("the report was built from the old sensitivity")
        self.problem = replace(self.problem, sensitivity=dict(sensitivity))

    # ---------------------------------------------------------------- warm start
    def manual_calibration(self) -> Calibration:
        """The calibration of the manual plans (:func:`~tuner.study.warmstart.best_baseline_calibration`).
        Costs one evaluation per baseline; the scorer keeps each for its enqueued trial."""
        if self._manual_cal is None:
            self._manual_cal = best_baseline_calibration(self.problem.resolved, self.problem.warm_start_plans(),
                                                         self.scorer.accuracy)
        return self._manual_cal

    def enqueue_warm_start(self, study: optuna.Study) -> int:
        if study.get_trials(deepcopy=False):
            return 0
        p = self.problem
        plans = p.warm_start_plans(self.manual_calibration() if p.space.settings.warm_start and p.sensitivity
                                   else None)
        # The plans are distinct candidates and the study is empty: no skip_if_exists, whose float
        # test (np.isclose, rtol 1e-5) takes max_percentile 0.99999 for 1.0 and drops that baseline.
        for label, params in plans:
            study.enqueue_trial(params, user_attrs={"plan": label})
        return len(plans)

    # ---------------------------------------------------------------- outputs (values, holding no session)
    def outputs(self) -> list[Output]:
        """The loop's outputs of a search in this process: result files, best_minimal.yaml at the
        end (before the report, which shows it), and the report. The tracker they read is the
        loop's callback (:func:`tuner.study.loop.run`)."""
        return [self.result_files, AtFinish(self.minimal.write), self.report_file]

    @property
    def exporter(self) -> Exporter:
        """Writes a trial's YAML."""
        p = self.problem
        return Exporter(p.space.base, p.base_raw, p.ws.node_info_supported, frozenset(p.ws.graph.by_name),
                        {"study": self.place.name, **p.fingerprints}, p.objectives, p.ws.config.text)

    @property
    def result_files(self) -> ResultFiles:
        if self._results is None:
            v = self.validator
            self._results = ResultFiles(self.place.paths, self.tracker, self.exporter,
                                        None if v is None else partial(v.validate, progress=progress_printer("validation of the front")),
                                        partial(fix_rows, self.problem.resolved))
        return self._results

    @property
    def validator(self) -> Validator | None:
        """Scores the winners on data the search did not select on (None when there is none)."""
        if self._validator is None:
            p = self.problem
            found = validation_data(p.space, p.ws)
            if found is None:
                return None
            self._validator = Validator(p.ws, found[0], found[1], p.objectives.accuracy, self.scorer,
                                        p.objectives.metric_names_needed)
        return self._validator

    @property
    def minimal(self) -> MinimalFix:
        """best.yaml's trial trimmed, and the one-line fixes (:class:`tuner.study.minimal.MinimalFix`)."""
        if self._minimal is None:
            self._minimal = MinimalFix(self.scorer, self.exporter, self.place.paths.best_minimal, self.tracker)
        return self._minimal

    @property
    def report_source(self) -> ReportSource:
        """What report.html is drawn from (:class:`tuner.study.source.ReportSource`)."""
        return ReportSource(self.problem, self.place, self.scorer, self.tracker, self.minimal)

    @property
    def report_file(self) -> ReportFile:
        if self._report is None:
            # The default renderer is imported here, in the caller's thread: mid-run draws run in a
            # thread of their own, and an import there would run beside the trial loop.
            page = Page(self.place.paths.report, self.render or default_renderer())
            self._report = ReportFile(self.report_source, page, warn=warn)
        return self._report
