"""best_minimal.yaml: best.yaml's trial trimmed to the decisions its constraints need, and the
one-line fixes, computed with a study session's simulator (the algorithm is :mod:`tuner.study.trim`)."""

from __future__ import annotations

import math
from typing import Protocol

import optuna

from tuner.candidate import Candidate
from tuner.cost import CostModel
from tuner.metrics.accuracy import accuracy
from tuner.simulate import Evaluation
from tuner.study import results
from tuner.study.outputs import export_trial
from tuner.study.record import Objectives, TrialRecord
from tuner.study.space import ResolvedSpace, SearchSpace
from tuner.study.storage import StudyPaths
from tuner.study.trim import Simplest, TrimResult, accuracy_floor, criterion, one_line_fixes, trim
from tuner.study.validation import choose_best, stored
from tuner.workspace import Workspace


class Session(Protocol):
    """What the trim needs of :class:`tuner.study.session.StudySession`."""

    ws: Workspace
    cost: CostModel
    resolved: ResolvedSpace
    space: SearchSpace
    paths: StudyPaths
    name: str

    @property
    def objectives(self) -> Objectives: ...
    def fingerprints(self) -> dict[str, str]: ...
    def lookup(self, study: optuna.Study, key: str) -> tuple[int, list[float], TrialRecord] | None: ...
    def record(self, cand: Candidate, ev: Evaluation, acc: float) -> TrialRecord: ...


class MinimalFix:
    def __init__(self, session: Session) -> None:
        self.s = session
        self._scored: dict[str, TrialRecord] = {}     # candidates simulated outside a trial (the trim)
        self._trimmed: TrimResult | None = None
        self._last: Simplest | None = None            # as last computed (write at the end of a search)

    def score(self, study: optuna.Study, cand: Candidate) -> TrialRecord:
        """A candidate's record: the study's trial of the same candidate if there is one, else
        simulated (once: kept for the next call). Raises when the simulation fails."""
        key = cand.key()
        hit = self.s.lookup(study, key)
        if hit is not None:
            return hit[2]
        if key not in self._scored:
            ev = self.s.ws.simulator.evaluate(cand)
            acc = accuracy(ev.outputs, self.s.objectives.accuracy, ev.task)
            if not math.isfinite(acc):
                raise FloatingPointError(f"accuracy is {acc}")
            self._scored[key] = self.s.record(cand, ev, acc)
        return self._scored[key]

    def modeled_latency(self, cand: Candidate) -> float:
        """The cost model's latency of a candidate's plan (no simulation)."""
        return self.s.cost.latency(self.s.ws.simulator.plan(cand)).total_ms

    def simplest(self, study: optuna.Study) -> Simplest | None:
        """best.yaml's trial trimmed to the decisions the floor needs, and the one-line fixes
        (:mod:`tuner.study.trim`); None before a feasible trial exists. The trim is redone only
        when the best trial changes."""
        rs = results.rows(study)
        top, _ = choose_best(rs, stored(study), self.s.objectives)     # best.yaml's trial
        if top is None or top.trial is None:
            return None
        r = self.s.resolved
        if self._trimmed is None or self._trimmed.trial != top.number:
            self._trimmed = trim(r, top.number, dict(top.trial.params), top.trial_record, self.s.objectives,
                                 lambda c: self.score(study, c), self.modeled_latency)
        meets, _ = criterion(self.s.objectives, top.trial_record)
        floor = accuracy_floor(self.s.objectives, top.trial_record)
        self._last = Simplest(self._trimmed, tuple(one_line_fixes(r, rs, meets, floor)))
        return self._last

    @property
    def last(self) -> Simplest | None:
        """What :meth:`simplest` found last (the end of the search wrote best_minimal.yaml from it)."""
        return self._last

    def write(self, study: optuna.Study) -> Simplest | None:
        """Write results/<study>/best_minimal.yaml (best.yaml's trial trimmed, same header and
        checks as best.yaml); returns what the terminal and the report show."""
        found = self.simplest(study)
        if found is None:
            return None
        t = found.trim
        row = results.Row(number=t.trial, trial_record=t.minimal, feasible=True, plan=None)
        kept = "; ".join(f"{k.change.describe()}" for k in t.kept) or "none"
        removed = "; ".join(c.describe() for c in t.removed) or "none"
        export_trial(row, self.s.paths.best_minimal, self.s.space.base, self.s.ws.node_info_supported,
                     set(self.s.ws.graph.by_name), {"study": self.s.name, **self.s.fingerprints()},
                     comments=(f"trimmed: keeps {len(t.kept)} of trial {t.trial}'s {t.decisions} decision(s) "
                               f"away from the base YAML ({t.criterion}); kept: {kept}",
                               f"removed (not needed for the criterion): {removed}"))
        return found
