"""Reading a study's outcome: feasible trials, the Pareto front, the trial to export.

Pure functions over Optuna's FrozenTrials, shared by the anytime writer, ``tuner status``
and ``tuner export``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

RECORD = "record"


@dataclass(frozen=True)
class Row:
    """One completed trial, flattened for tables and choices."""

    number: int
    accuracy: float
    latency_ms: float
    feasible: bool
    counts: dict[str, int]
    calibration: str
    plan: str | None
    trial: FrozenTrial

    @property
    def record(self) -> dict[str, Any]:
        record: dict[str, Any] = self.trial.user_attrs[RECORD]
        return record


def rows(study: optuna.Study) -> list[Row]:
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        rec = t.user_attrs.get(RECORD)
        if not rec:
            continue
        feasible = all(v <= 0 for v in (t.constraints or {}).values()) if hasattr(t, "constraints") else True
        out.append(Row(number=t.number, accuracy=rec["accuracy"], latency_ms=rec["latency"]["total_ms"],
                       feasible=feasible, counts=rec["counts"], calibration=rec["calibration"]["method"],
                       plan=t.user_attrs.get("plan"), trial=t))
    return out


def pareto(rs: list[Row]) -> list[Row]:
    """Feasible rows not dominated on (accuracy up, latency down), sorted by latency.

    One sort and a sweep (O(n log n); it runs after every trial that may change the front):
    a row is on the front when it is more accurate than every cheaper row. Identical
    (accuracy, latency) points keep the first trial."""
    front: list[Row] = []
    for r in sorted((r for r in rs if r.feasible), key=lambda r: (r.latency_ms, -r.accuracy, r.number)):
        if not front or r.accuracy > front[-1].accuracy:
            front.append(r)
    return front


def best(rs: list[Row], mode: str, min_accuracy: float | None) -> Row | None:
    """The trial to export. With an accuracy floor: the cheapest feasible trial. Without one:
    the most accurate (mode accuracy/pareto), cheaper on ties."""
    feas = [r for r in rs if r.feasible]
    if not feas:
        return None
    if mode == "latency" or (mode == "pareto" and min_accuracy is not None):
        return min(feas, key=lambda r: (r.latency_ms, -r.accuracy, r.number))
    return max(feas, key=lambda r: (r.accuracy, -r.latency_ms, -r.number))
