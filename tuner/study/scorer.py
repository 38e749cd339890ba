"""The one place a candidate becomes a trial record.

:class:`Scorer` simulates a candidate, scores it and prices its plan into a
:class:`~tuner.study.record.TrialRecord`, with one cache by candidate key that also indexes the
study's completed trials (this worker's and every other's). Its users: the objective (a trial
of a candidate already scored is answered from the stored result), the warm start (the
baselines it scores to pick the manual plans' calibration are not simulated again by their
trials), the trim behind best_minimal.yaml, the per-node traces of the report and the validation
of the winners (the evaluation data's per-sample figures).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import optuna
from optuna.trial import TrialState

from tuner.candidate import Candidate
from tuner.cost import CostModel
from tuner.metrics.accuracy import accuracy
from tuner.simulate import Evaluation, Simulator
from tuner.study.record import (
    CONSTRAINTS,
    DUPLICATE_OF,
    RECORD,
    CalibrationUsed,
    Counts,
    Latency,
    Objectives,
    TrialRecord,
)
from tuner.study.space import ResolvedSpace
from tuner.workspace import Workspace


@dataclass(frozen=True)
class Entry:
    """What is known of one candidate: its record (and the completed trial holding it, with that
    trial's values), and its per-node evaluation once the report drew it."""

    record: TrialRecord | None = None
    trial: int | None = None                  # None: scored outside a trial (warm start, trim)
    values: tuple[float, ...] = ()
    per_node: Evaluation | None = None


class Scorer:
    """Candidates to trial records, each simulated at most once per process."""

    def __init__(self, ws: Workspace, cost: CostModel, resolved: ResolvedSpace, objectives: Objectives) -> None:
        self.ws, self.cost, self.resolved, self.objectives = ws, cost, resolved, objectives
        self._cache: dict[str, Entry] = {}    # candidate key -> what is known of it
        self._seen: set[int] = set()          # completed trials indexed

    # ------------------------------------------------------------------ the cache
    def index(self, study: optuna.Study) -> None:
        """Index the completed trials not indexed yet by candidate key (incremental: other
        workers' trials arrive between calls; the storage is read, not re-simulated)."""
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.number in self._seen:
                continue
            self._seen.add(t.number)
            rec = TrialRecord.of_trial(t)
            if rec is not None and t.values is not None and rec.duplicate_of is None:
                self._keep(rec.key, rec, t.number, tuple(t.values))

    def _keep(self, key: str, rec: TrialRecord, trial: int | None, values: tuple[float, ...] = ()) -> None:
        old = self._cache.get(key, Entry())
        if old.trial is None:       # the first trial of a candidate stays its source
            self._cache[key] = replace(old, record=rec, trial=trial, values=values)

    def stored(self, study: optuna.Study, key: str) -> Entry | None:
        """The completed trial of a candidate, by this worker or any other (None: none yet)."""
        e = self._cache.get(key)
        if e is None or e.trial is None:
            self.index(study)
            e = self._cache.get(key)
        return e if e is not None and e.trial is not None else None

    # ------------------------------------------------------------------ scoring
    def record(self, cand: Candidate, ev: Evaluation, acc: float) -> TrialRecord:
        lat = self.cost.latency(ev.plan)
        return TrialRecord(key=cand.key(), accuracy=acc, outputs=ev.outputs, task=ev.task,
                           latency=Latency.from_json(lat.as_dict()), counts=Counts.from_json(ev.counts()),
                           calibration=CalibrationUsed(method=ev.calibration.describe(),
                                                       requested=cand.calibration.describe()),
                           candidate_fields=cand.to_yaml_fields(), cpu_nodes=tuple(ev.plan.cpu_nodes),
                           notes=tuple(ev.notes[:20]), seconds=ev.seconds)

    def _simulate(self, cand: Candidate) -> TrialRecord:
        ev = self.ws.simulator.evaluate(cand)
        acc = accuracy(ev.outputs, self.objectives.accuracy, ev.task)
        if not math.isfinite(acc):
            raise FloatingPointError(f"accuracy is {acc}")
        return self.record(cand, ev, acc)

    def score(self, cand: Candidate, study: optuna.Study | None = None) -> TrialRecord:
        """A candidate's record: the study's trial of the same candidate if there is one, else
        simulated (once: kept for the next call and for its trial). Raises when the simulation fails."""
        key = cand.key()
        if study is not None and (hit := self.stored(study, key)) is not None and hit.record is not None:
            return hit.record
        e = self._cache.get(key)
        if e is None or e.record is None:
            rec = self._simulate(cand)
            self._cache[key] = replace(e or Entry(), record=rec)
            return rec
        return e.record

    def accuracy(self, cand: Candidate) -> float:
        """A candidate's accuracy (the warm start's baselines); nan when it is not finite."""
        try:
            return self.score(cand).accuracy
        except FloatingPointError:
            return math.nan

    def modeled_latency(self, cand: Candidate) -> float:
        """The cost model's latency of a candidate's plan (no simulation)."""
        return self.cost.latency(self.ws.simulator.plan(cand)).total_ms

    def objective(self, trial: optuna.Trial) -> list[float] | float:
        """Optuna's objective: the trial's candidate scored. A candidate a completed trial (here
        or in another worker) already scored is a repeat: it costs nothing and is no new trial,
        so it is pruned with :data:`DUPLICATE_OF` naming that trial (the budget counts completed
        trials; the samplers see a pruned trial as no better than the completed ones, so TPE
        moves away from it; a front, trials.csv and optuna-dashboard list completed trials)."""
        r = self.resolved
        params = {d.param: trial.suggest_categorical(d.param, list(d.choices)) for d in r.decisions}
        for name, values in r.calibration_params.items():
            params[name] = trial.suggest_categorical(name, values)
        cand = r.candidate(params)
        key = cand.key()
        hit = self.stored(trial.study, key)
        if hit is not None and hit.record is not None and hit.trial is not None:
            trial.set_user_attr(DUPLICATE_OF, hit.trial)
            raise optuna.TrialPruned(f"a repeat of trial {hit.trial}")
        try:
            record = self.score(cand)
        except Exception as exc:
            trial.set_user_attr("error", f"{type(exc).__name__}: {exc}")
            raise
        trial.set_user_attr(RECORD, record.to_json())
        self._constrain(trial, record)
        values = self.objectives.values(record.accuracy, record.latency_ms)
        self._keep(key, record, trial.number, tuple(values))
        self._seen.add(trial.number)
        return values if len(values) > 1 else values[0]

    def _constrain(self, trial: optuna.Trial, record: TrialRecord) -> None:
        """The trial's constraint values, <= 0 when met, stored twice: one key per constraint
        (``constraints:<name>``, what ``trial.set_constraint`` writes: Optuna's
        ``FrozenTrial.constraints`` names them) and the single list ``constraints`` in the same
        order, as Optuna's samplers write it for a ``constraints_func``: the one key
        optuna-dashboard reads (0.21: its feasible/infeasible split and its Pareto plot). Optuna
        reads both formats into ``FrozenTrial.constraints``; TPE ranks infeasible trials by the sum
        of their positive values, which both keys double alike (the order and so the proposals
        are unchanged)."""
        o = self.objectives
        values = {name: min(value, 1e30)        # a missing metric (inf) as a large violation
                  for name, value in o.constraints(record.accuracy, record.latency_ms,
                                                   record.metrics(o.metric_names_needed)).items()}
        for name, value in values.items():
            trial.set_constraint(name, value)
        if values:
            trial.storage.set_trial_system_attr(trial._trial_id, CONSTRAINTS, list(values.values()))

    # ------------------------------------------------------------------ other views of a candidate
    def per_node(self, cand: Candidate, evaluate: bool = True) -> Evaluation | None:
        """The candidate evaluated with every node's output (the report's traces) and, for an image
        ``input_type_rt``, the loss split (Simulator.evaluate), kept; without
        ``evaluate`` only one already kept (None otherwise)."""
        key = cand.key()
        e = self._cache.get(key, Entry())
        if e.per_node is None and evaluate:
            e = replace(e, per_node=self.ws.simulator.evaluate(cand, per_node=True, split=True))
            self._cache[key] = e
        return e.per_node

    def per_sample(self, cand: Candidate, simulator: Simulator | None = None) -> Evaluation:
        """The candidate's per-sample figures on the evaluation data (or on ``simulator``'s):
        the validation's, computed once per trial and stored on the study, so not kept here."""
        return (simulator or self.ws.simulator).evaluate(cand, per_sample=True)
