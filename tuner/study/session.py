"""The study session: one process's view of a study over a resolved space.

:class:`StudySession` loads everything once (workspace, cost model, sensitivity,
decisions), creates or resumes the study (refusing to resume one made from other inputs),
enqueues the warm start, and is the objective: each trial's candidate is simulated, or
answered from the stored result when an equal candidate ran before (here or in another
worker). Its outputs (:mod:`tuner.study.outputs`) are the loop's callbacks; the loop
itself is :mod:`tuner.study.loop`.
"""

from __future__ import annotations

import math
import os
import socket
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner import __version__
from tuner.candidate import Calibration, Candidate
from tuner.cost import CostModel
from tuner.cost.board import check_board, require_board_fit
from tuner.cost.latency import load_fit, load_profile
from tuner.errors import TunerError
from tuner.export.hb_yaml import write_atomic
from tuner.inputs.model import file_fingerprint
from tuner.metrics.accuracy import accuracy
from tuner.simulate import Evaluation
from tuner.study import results
from tuner.study.minimal import MinimalFix
from tuner.study.opening import AtFinish, check_outputs, name_metrics, resume_seed, with_references
from tuner.study.orphans import reap, tag_trials
from tuner.study.outputs import Output, ReportFile, ResultFiles, default_renderer, export_trial, snapshot
from tuner.study.record import (
    RECORD,
    STUDY_ATTR,
    CalibrationUsed,
    Counts,
    Direction,
    Latency,
    Objectives,
    StudyInfo,
    TrialRecord,
)
from tuner.study.results import ReportSnapshot, Trace
from tuner.study.space import ResolvedSpace, SearchSpace, load_space, resolve
from tuner.study.storage import (
    FINGERPRINTS,
    HEARTBEAT_S,
    SENSITIVITY_ATTR,
    StudyPaths,
    make_storage,
    redact,
)
from tuner.study.trim import Simplest
from tuner.study.validation import Validator, validation_data
from tuner.study.warmstart import (
    Plan,
    best_baseline_calibration,
    node_sensitivity,
    reference_calibration,
    warm_start_plans,
)
from tuner.workspace import Workspace, progress_printer


@dataclass
class StudySession:
    space: SearchSpace
    ws: Workspace
    resolved: ResolvedSpace
    cost: CostModel
    paths: StudyPaths
    name: str
    storage_url: str | None
    sensitivity: dict[str, float] = field(default_factory=dict)
    heartbeat: float | None = None  # database storages: seconds between heartbeats (None: HEARTBEAT_S)
    max_retry: int = 1              # times a trial orphaned by a dead worker is re-queued
    _done: dict[str, tuple[int, list[float], TrialRecord]] = field(default_factory=dict)
    _seen: set[int] = field(default_factory=set)
    render: Callable[[ReportSnapshot], str] | None = None   # report.html from a snapshot (the caller's)
    notices: list[str] = field(default_factory=list)   # what opening the study changed, for the terminal
    _results: ResultFiles | None = None
    _validator: Validator | None = None
    _report: ReportFile | None = None
    _traces: dict[str, Evaluation] = field(default_factory=dict)
    _manual_cal: Calibration | None = None
    _evaluated: dict[str, Evaluation] = field(default_factory=dict)  # baselines evaluated before their trials ran
    _minimal: MinimalFix | None = None

    # ---------------------------------------------------------------- set-up
    @classmethod
    def open(cls, space_path: str | Path, name: str | None = None, storage: str | None = None,
             results_dir: str | Path = "results", threads: int | None = None, quiet: bool = False,
             sensitivity: dict[str, float] | None = None,
             render: Callable[[ReportSnapshot], str] | None = None) -> StudySession:
        """``sensitivity``: the study's stored ranking (a worker joining it), instead of computing one."""
        space = load_space(space_path)
        name = name or space.name
        paths = StudyPaths(Path(results_dir) / name)
        check_outputs(paths, storage)      # before the statistics pass and the sensitivity ranking
        if space.board:
            check_board(space.board)
        ws = Workspace.for_space(space, threads=threads,
                                 progress=None if quiet else progress_printer("calibration statistics"))
        base = ws.base_candidate()
        fit = load_fit(ws.model.fingerprint, ws.target.march)
        board = require_board_fit(space.board, ws.target.raw) if space.board else None
        cost = CostModel(ws.graph, ws.target, load_profile(space.profile) if space.profile else None, fit=fit,
                         board=board)
        # what relative constraints scale, measured before the sensitivity pass (a bound that means
        # nothing is one line, not minutes later)
        space.objective = with_references(space.objective, ws, cost)
        if sensitivity is None:
            sensitivity = {}
            if space.rule.top_k is not None or space.settings.warm_start:
                sensitivity = node_sensitivity(space, ws, paths.sensitivity,
                                               None if quiet else progress_printer("node sensitivity"))
        resolved = resolve(space, ws.graph, ws.target, base, sensitivity)
        n_eval, least = len(ws.eval_data), space.settings.min_eval_samples
        if n_eval < least:
            ws.warnings.append(
                f"eval_data has {n_eval} sample(s), fewer than study.min_eval_samples ({least}): the search selects "
                "on these samples, so its front is tuned to them; add samples, or set validation_data so that the "
                "winners are re-scored on others")
        session = cls(space=space, ws=ws, resolved=resolved, cost=cost, paths=paths, name=name, storage_url=storage,
                      sensitivity=sensitivity, render=render)
        if fit is not None:
            session.notices.append(f"latency: BPU model {fit.describe()} (tuner latency fit)")
        return session

    def fingerprints(self) -> dict[str, str]:
        return {"model": self.ws.model.fingerprint, "data": self.ws.calibration_data.fingerprint(),
                "eval_data": self.ws.eval_data.fingerprint(), "base_config": file_fingerprint(self.space.base),
                "space": self.resolved.fingerprint()}

    def changed_inputs(self, stored: dict[str, str]) -> list[str]:
        """The fingerprints of this session that are not the study's ``stored`` ones. The space's
        may also be of the whole space file (studies made before the floors were left out of it)."""
        mine = self.fingerprints()
        return [k for k in FINGERPRINTS if stored.get(k) != mine[k]
                and not (k == "space" and stored.get(k) == self.resolved.fingerprint(legacy=True))]

    @property
    def objectives(self) -> Objectives:
        return self.space.objective

    @property
    def mode(self) -> str:
        return self.objectives.mode

    def directions(self) -> list[Direction]:
        return self.objectives.directions()

    def sampler(self, seed: int | None) -> optuna.samplers.BaseSampler:
        """The space's sampler, recording each trial's worker when the trial is created."""
        kind = self.space.settings.sampler
        if kind == "random":
            return tag_trials(optuna.samplers.RandomSampler(seed=seed))
        if kind == "nsga2":
            return tag_trials(optuna.samplers.NSGAIISampler(seed=seed))
        # Multivariate TPE models interactions between node decisions (the 5.0 multi-objective
        # default is independent TPE, ~8x slower per trial at 200 parameters); constant_liar keeps
        # parallel workers from proposing the same candidate.
        return tag_trials(optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                                     n_startup_trials=max(10, len(self.warm_start_plans()))))

    def study(self, seed: int | None = None, create: bool = True) -> optuna.Study:
        storage = make_storage(self.storage_url, self.paths, HEARTBEAT_S if self.heartbeat is None else self.heartbeat,
                               self.max_retry)
        fingerprints = self.fingerprints()
        info = StudyInfo(version=__version__, name=self.name, objectives=self.objectives,
                         space_path=str(self.space.path.resolve()), base_path=str(self.space.base),
                         march=self.ws.target.march, node_info_supported=self.ws.node_info_supported,
                         fingerprints=fingerprints)
        try:
            study = optuna.load_study(study_name=self.name, storage=storage, sampler=self.sampler(seed))
        except KeyError:
            if not create:
                raise TunerError(f"no study named {self.name!r} in {self._where()}") from None
            study = optuna.create_study(study_name=self.name, storage=storage, directions=self.directions(),
                                        sampler=self.sampler(seed))
            name_metrics(study, self.objectives)
            study.set_user_attr(STUDY_ATTR, info.to_json())
            study.set_user_attr(SENSITIVITY_ATTR, self.sensitivity)
            return study
        blob = study.user_attrs.get(STUDY_ATTR)
        if not blob or not isinstance(blob, dict):
            raise TunerError(f"study {self.name!r} in {self._where()} was not made by tuner; use another --study name")
        before = StudyInfo.from_json(blob)
        stored = before.fingerprints
        changed = self.changed_inputs(stored)
        if changed and not create:
            # A worker joining a study: say which of this machine's files differ.
            detail = "; ".join(f"{self._input_path(k)} (sha256 {fingerprints[k][:12]}) is not the study's "
                               f"{k.replace('_', ' ')} (sha256 {stored.get(k, '?')[:12]})"
                               for k in changed)
            raise TunerError(f"cannot join study {self.name!r}: {detail}; copy the study's files to this machine "
                             "(same model, data, base YAML and space), or point --space at the right space file")
        if changed:
            detail = ", ".join(f"{k} {stored.get(k, '?')[:12]} -> {fingerprints[k][:12]}"
                               for k in changed)
            raise TunerError(f"study {self.name!r} was made from other inputs ({detail}); continuing would mix results "
                             f"of different problems: restore the inputs, or start a new study with --study NEW_NAME")
        if [d.name.lower() for d in study.directions] != self.directions():
            raise TunerError(f"study {self.name!r} optimises {[d.name.lower() for d in study.directions]}, the space "
                             f"asks for {self.directions()}; use --study NEW_NAME")
        if study.metric_names is None:         # a study made before tuner named its metrics
            name_metrics(study, self.objectives)
        self._adopt_floors(study, before)
        n = len(study.get_trials(deepcopy=False))
        if seed is not None and n:
            # Resuming: a sampler seeded as at the start would make its first proposals again
            # (RandomSampler, TPE's random draws); they come back as duplicates that use up the
            # budget. Seed from (seed, trials so far) instead: reproducible, never a replay.
            study.sampler = self.sampler(resume_seed(seed, n))
        return study

    def _adopt_floors(self, study: optuna.Study, before: StudyInfo) -> None:
        """A resumed search whose space changed a floor (``min_accuracy``, ``max_latency_ms``):
        the study's attribute takes the new objectives, so status, export and the report derive
        feasibility from the stored values under the new floor (:func:`tuner.study.results.rows`);
        no trial is re-run and no sensitivity recomputed. Optuna's own ``trial.constraints`` of
        trials already run cannot change (Optuna 5 refuses to modify finished trials): its
        ``best_trials`` keeps the floor each trial ran under."""
        old, new = before.objectives, self.objectives
        if old == new:
            return
        changes = [f"{k} {getattr(old, k)} -> {getattr(new, k)}"
                   for k in ("min_accuracy", "max_latency_ms", "max_latency_ratio") if getattr(old, k) != getattr(new, k)]
        if old.constraints_ != new.constraints_:
            changes.append(f"constraints [{', '.join(c.name for c in old.constraints_)}] -> "
                           f"[{', '.join(c.name for c in new.constraints_)}]")
        history = list(before.extra.get("floor_changes", [])) + [
            {"at_trial": len(study.get_trials(deepcopy=False)), **{k: getattr(new, k)
                                                                 for k in ("min_accuracy", "max_latency_ms")}}]
        extra = {**before.extra, "floor_changes": history}
        study.set_user_attr(STUDY_ATTR, replace(before, objectives=new, extra=extra).to_json())
        self.notices.append(f"study {self.name!r}: {', '.join(changes) or 'objectives changed'}; feasibility of its "
                            f"{len(study.get_trials(deepcopy=False))} trial(s) is derived again from their stored "
                            "values (nothing is re-run)")

    def _input_path(self, key: str) -> str:
        """The local file(s) behind a fingerprint, for messages."""
        if key == "model":
            return f"model {self.ws.model.path}"
        if key == "data":
            return "calibration data " + ", ".join(str(i.folder) for i in self.ws.calibration_data.inputs)
        if key == "base_config":
            return f"base YAML {self.space.base}"
        return f"search space {self.space.path} (as resolved on this model)"

    def _where(self) -> str:
        return redact(self.storage_url) if self.storage_url else str(self.paths.journal)

    # ---------------------------------------------------------------- warm start
    def warm_start_plans(self, manual_calibration: Calibration | None = None) -> list[Plan]:
        """See :func:`tuner.study.warmstart.warm_start_plans`."""
        return warm_start_plans(self.resolved, self.sensitivity, manual_calibration)

    def manual_calibration(self) -> Calibration:
        """The calibration of the manual plans (:func:`~tuner.study.warmstart.best_baseline_calibration`).
        Costs one evaluation per baseline; each is kept for its enqueued trial."""
        if self._manual_cal is None:
            def score(cand: Candidate) -> float:
                ev = self.ws.simulator.evaluate(cand)
                self._evaluated[cand.key()] = ev     # its enqueued trial takes it, not a second run
                return accuracy(ev.outputs, self.objectives.accuracy, ev.task)

            self._manual_cal = best_baseline_calibration(self.resolved, self.warm_start_plans(), score)
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
        """Index the completed trials not indexed yet by candidate key (incremental: other
        workers' trials arrive between calls; the storage is read, not re-simulated)."""
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.number in self._seen:
                continue
            self._seen.add(t.number)
            rec = TrialRecord.of_trial(t)
            if rec is not None and t.values is not None and rec.duplicate_of is None:
                self._done.setdefault(rec.key, (t.number, list(t.values), rec))

    def lookup(self, study: optuna.Study, key: str) -> tuple[int, list[float], TrialRecord] | None:
        """The stored result of a candidate already evaluated, by this worker or any other."""
        if key not in self._done:
            self.load_done(study)
        return self._done.get(key)

    def objective(self, trial: optuna.Trial) -> list[float] | float:
        # Who runs this trial is recorded by the study's sampler when the trial is created
        # (``tag_trials`` in :meth:`sampler`; a trial of a dead process is an orphan, see orphans.py).
        r = self.resolved
        params = {d.param: trial.suggest_categorical(d.param, list(d.choices)) for d in r.decisions}
        for name, values in r.calibration_params.items():
            params[name] = trial.suggest_categorical(name, values)
        cand = r.candidate(params)
        key = cand.key()
        hit = self.lookup(trial.study, key)
        if hit is not None:
            # The same configuration was already simulated (here or by another worker):
            # answer from the stored result.
            number, values, source = hit
            self._constrain(trial, source)
            trial.set_user_attr(RECORD, source.as_duplicate_of(number).to_json())
            return values if len(values) > 1 else values[0]
        try:
            ev = self._evaluated.pop(key, None) or self.ws.simulator.evaluate(cand)
            acc = accuracy(ev.outputs, self.objectives.accuracy, ev.task)
            if not math.isfinite(acc):
                raise FloatingPointError(f"accuracy is {acc}")
        except Exception as exc:
            trial.set_user_attr("error", f"{type(exc).__name__}: {exc}")
            raise
        record = self.record(cand, ev, acc)
        trial.set_user_attr(RECORD, record.to_json())
        self._constrain(trial, record)
        values = self.objectives.values(acc, record.latency_ms)
        self._done[key] = (trial.number, values, record)
        self._seen.add(trial.number)
        return values if len(values) > 1 else values[0]

    def record(self, cand: Candidate, ev: Evaluation, acc: float) -> TrialRecord:
        lat = self.cost.latency(ev.plan)
        return TrialRecord(key=cand.key(), accuracy=acc, outputs=ev.outputs, task=ev.task,
                           latency=Latency.from_json(lat.as_dict()), counts=Counts.from_json(ev.counts()),
                           calibration=CalibrationUsed(method=ev.calibration.describe(),
                                                       requested=cand.calibration.describe()),
                           candidate_fields=cand.to_yaml_fields(), cpu_nodes=tuple(ev.plan.cpu_nodes),
                           notes=tuple(ev.notes[:20]), seconds=ev.seconds)

    def _constrain(self, trial: optuna.Trial, record: TrialRecord) -> None:
        o = self.objectives
        for name, value in o.constraints(record.accuracy, record.latency_ms,
                                         record.metrics(o.metric_names_needed)).items():
            trial.set_constraint(name, min(value, 1e30))    # a missing metric (inf) as a large violation

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
            self._results = ResultFiles(self.paths, self.objectives, self.export,
                                        None if v is None else (lambda study, rows: v.validate(study, rows, show)))
        return self._results

    @property
    def validator(self) -> Validator | None:
        """Scores the winners on data the search did not select on (None when there is none)."""
        if self._validator is None:
            found = validation_data(self.space, self.ws)
            if found is None:
                return None
            self._validator = Validator(self.ws, found[0], found[1], self.objectives.accuracy)
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

        snap = snapshot(study, self.paths, self._where(), self.sensitivity, draw)
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
            key = cand.key()
            if key not in self._traces:
                if not evaluate:
                    skipped += 1
                    continue
                self._traces[key] = self.ws.simulator.evaluate(cand, per_node=True)
            out.append(Trace.from_evaluation(label, number, self._traces[key]))
        return out, skipped

    # ---------------------------------------------------------------- the simplest fix
    @property
    def minimal(self) -> MinimalFix:
        """best.yaml's trial trimmed, and the one-line fixes (:class:`tuner.study.minimal.MinimalFix`)."""
        if self._minimal is None:
            self._minimal = MinimalFix(self)
        return self._minimal

    def simplest(self, study: optuna.Study) -> Simplest | None:
        return self.minimal.simplest(study)

    def score(self, study: optuna.Study, cand: Candidate) -> TrialRecord:
        return self.minimal.score(study, cand)

    def modeled_latency(self, cand: Candidate) -> float:
        return self.minimal.modeled_latency(cand)

    @property
    def last_simplest(self) -> Simplest | None:
        return self.minimal.last

    def write_minimal(self, study: optuna.Study) -> Simplest | None:
        return self.minimal.write(study)

    def export(self, row: results.Row, out: Path, comments: tuple[str, ...] = ()) -> list[str]:
        return export_trial(row, out, self.space.base, self.ws.node_info_supported, set(self.ws.graph.by_name),
                            {"study": self.name, **self.fingerprints()},
                            tuple(comments) + results.margin_comments(row, self.objectives))
