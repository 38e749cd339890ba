"""best_minimal.yaml: best.yaml's trial trimmed to the decisions its constraints need, and the
one-line fixes, scored by the search's :class:`~tuner.study.scorer.Scorer` (the algorithm is
:mod:`tuner.study.trim`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import optuna

from tuner.study import results
from tuner.study.outcome import Outcome, Tracker
from tuner.study.outputs import Exporter
from tuner.study.scorer import Scorer
from tuner.study.trim import Simplest, TrimResult, accuracy_floor, criterion, one_line_fixes, trim
from tuner.study.validation import usable


class MinimalFix:
    """best.yaml's trial trimmed (candidates scored by the :class:`~tuner.study.scorer.Scorer`) and
    written by the :class:`~tuner.study.outputs.Exporter` to ``out``; best.yaml's trial is the
    :class:`~tuner.study.outcome.Outcome` the ``tracker`` keeps. Holds no session."""

    def __init__(self, scorer: Scorer, export: Exporter, out: Path, tracker: Tracker) -> None:
        self.scorer, self.export, self.out, self.tracker = scorer, export, out, tracker
        self._trimmed: TrimResult | None = None
        self._last: Simplest | None = None            # as last computed (write at the end of a search)

    def simplest(self, study: optuna.Study, found: Outcome | None = None) -> Simplest | None:
        """best.yaml's trial trimmed to the decisions the floor needs, and the one-line fixes
        (:mod:`tuner.study.trim`); None before a feasible trial exists. The trim is redone only
        when the best trial changes. ``found``: default the tracker's (with the study's stored
        validations)."""
        found = found if found is not None else self.tracker.stored_outcome(study)
        rs, top = list(found.rows), found.best     # best.yaml's trial
        if top is None or top.trial is None:
            return None
        r = self.scorer.resolved
        if self._trimmed is None or self._trimmed.trial != top.number:
            self._trimmed = trim(r, top.number, dict(top.trial.params), top.trial_record, self.scorer.objectives,
                                 lambda c: self.scorer.score(c, study), self.scorer.modeled_latency)
        meets, _ = criterion(self.scorer.objectives, top.trial_record)
        floor = accuracy_floor(self.scorer.objectives, top.trial_record)
        vals = usable(found.validations, self.scorer.objectives)
        fixes = tuple(replace(f, validation=vals[f.trial].accuracy if f.trial in vals else None)
                      for f in one_line_fixes(r, rs, meets, floor))
        self._last = Simplest(self._trimmed, fixes, vals[top.number].accuracy if top.number in vals else None)
        return self._last

    @property
    def last(self) -> Simplest | None:
        """What :meth:`simplest` found last (the end of the search wrote best_minimal.yaml from it)."""
        return self._last

    def write(self, study: optuna.Study, found: Outcome | None = None) -> Simplest | None:
        """Write results/<study>/best_minimal.yaml (best.yaml's trial trimmed, same header and
        checks as best.yaml); returns what the terminal and the report show."""
        simplest = self.simplest(study, found)
        if simplest is None:
            return None
        t = simplest.trim
        row = results.Row(number=t.trial, trial_record=t.minimal, feasible=True, plan=None)
        kept = "; ".join(f"{k.change.describe()}" for k in t.kept) or "none"
        removed = "; ".join(c.describe() for c in t.removed) or "none"
        self.export(row, self.out, margins=False,
                    comments=(f"trimmed: keeps {len(t.kept)} of trial {t.trial}'s {t.decisions} decision(s) "
                               f"away from the base YAML ({t.criterion}); kept: {kept}",
                              f"removed (not needed for the criterion): {removed}"))
        return simplest
