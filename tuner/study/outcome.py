"""What a study says, as one typed value: its rows, front, best (and the figure it was chosen by),
validations, closest trial and real-toolchain records.

:func:`outcome` is the one place best.yaml's trial is chosen (:func:`~tuner.study.validation.choose_best`);
:func:`read_outcome` reads a study once into an :class:`Outcome`, and a :class:`Tracker` keeps
one up to date as trials finish, decoding each trial's record once. best.yaml, pareto/,
best_minimal.yaml, trials.csv, the report, ``status`` and ``export`` all read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.study import results
from tuner.study.record import Objectives
from tuner.study.validation import HeldOut, Validation, choose_best, held_out, stored
from tuner.toolchain.records import RealRecord, real_records


@dataclass(frozen=True)
class Outcome:
    """A study's result at one moment (no storage, no simulator)."""

    objectives: Objectives
    rows: tuple[results.Row, ...]                    # completed trials with a record, by number
    front: tuple[results.Row, ...]                   # feasible and not dominated, by latency
    best: results.Row | None                         # best.yaml's trial
    chosen_by: str = "eval"                          # the figure best was chosen by: eval or validation
    validations: Mapping[int, Validation] = field(default_factory=dict)
    closest: results.Closest | None = None           # the nearest miss when nothing is feasible
    real: Mapping[int, RealRecord] = field(default_factory=dict)
    held_out: HeldOut | None = None                  # the constraints judged on the validation data

    @property
    def state(self) -> tuple[int | None, tuple[int, ...]]:
        """(best, front) by trial number: what the result files show."""
        return (self.best.number if self.best is not None else None, tuple(r.number for r in self.front))


def outcome(rows: list[results.Row] | tuple[results.Row, ...], objectives: Objectives,
            validations: Mapping[int, Validation] | None = None,
            real: Mapping[int, RealRecord] | None = None) -> Outcome:
    """The outcome of ``rows`` under ``objectives``; best chosen by :func:`choose_best` (here only)."""
    vals = dict(validations or {})
    best, chosen_by = choose_best(list(rows), vals, objectives)
    front = results.pareto(list(rows))
    return Outcome(objectives=objectives, rows=tuple(rows), front=tuple(front), best=best, chosen_by=chosen_by,
                   validations=vals, closest=results.closest(list(rows), objectives), real=dict(real or {}),
                   held_out=held_out(list(rows), vals, objectives, best, chosen_by))


def read_outcome(study: optuna.Study, objectives: Objectives | None = None,
                 rows: list[results.Row] | None = None) -> Outcome:
    """A study's outcome from its storage: ``rows`` (default: read once, :func:`results.rows`),
    its stored validations and real records; ``objectives`` default to the study's."""
    objectives = objectives if objectives is not None else results.study_objectives(study)
    if objectives is None:
        raise ValueError(f"study {study.study_name!r} was not made by tuner")
    rs = rows if rows is not None else results.rows(study, objectives)
    return outcome(rs, objectives, stored(study), real_records(study))


class Tracker:
    """A study's rows and :class:`Outcome`, kept as its trials finish: an Optuna callback
    (``tracker(study, frozen_trial)``, registered on the loop) that decodes each completed
    trial's record once, when it finishes, and holds nothing back. The outcome is recomputed
    only when the rows, the validations or the real records it is asked with changed."""

    def __init__(self, objectives: Objectives) -> None:
        self.objectives = objectives
        self._rows: dict[int, results.Row] = {}
        self._seen: set[int] = set()
        self.validations: dict[int, Validation] = {}      # this process's validations of the winners
        self._last: tuple[int, dict[int, Validation], dict[int, RealRecord], Outcome] | None = None

    def __call__(self, study: optuna.Study, trial: FrozenTrial | None = None) -> None:
        if trial is not None and trial.state == TrialState.COMPLETE and trial.number not in self._seen:
            self._add(trial)
            return
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.number not in self._seen:
                self._add(t)

    def _add(self, t: FrozenTrial) -> None:
        self._seen.add(t.number)
        r = results.row(t, self.objectives)
        if r is not None:
            self._rows[t.number] = r

    def rows(self, study: optuna.Study) -> list[results.Row]:
        """The completed trials' rows, by number (trials of other workers read in first)."""
        self(study)
        return [self._rows[n] for n in sorted(self._rows)]

    def outcome(self, study: optuna.Study, validations: Mapping[int, Validation] | None = None,
                real: Mapping[int, RealRecord] | None = None) -> Outcome:
        """The study's outcome now: its rows as kept, with ``validations`` (default: this process's,
        :attr:`validations`) and ``real`` records (default none)."""
        rs = self.rows(study)
        vals = dict(self.validations if validations is None else validations)
        recs = dict(real or {})
        if self._last is not None and self._last[0] == len(rs) and self._last[1] == vals and self._last[2] == recs:
            return self._last[3]
        found = outcome(rs, self.objectives, vals, recs)
        self._last = (len(rs), vals, recs, found)
        return found

    def stored_outcome(self, study: optuna.Study) -> Outcome:
        """The outcome with the study's stored validations and real records (what :func:`read_outcome`
        reads), from the rows kept: the report's and the final summary's view."""
        return self.outcome(study, stored(study), real_records(study))
