"""What ``tuner status`` says about a study, as one typed value (text for people, JSON for scripts).

Read from the storage alone (no model, no data): trial counts, the objectives and floors the
study holds now, the best trial and the Pareto front (feasibility derived from the stored
values, :func:`tuner.study.results.rows`), the closest trial and next steps when nothing is
feasible, the result files that exist, and the trials checked with the real toolchain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.files import jsonable
from tuner.study import results
from tuner.study.outcome import Outcome, read_outcome
from tuner.study.record import StudyInfo, TrialRecord, binding
from tuner.study.storage import StudyPaths, study_info
from tuner.study.trim import Simplest
from tuner.study.validation import HeldOut, Validation


def row_json(r: results.Row) -> dict[str, Any]:
    """One trial as ``status --json`` lists it."""
    rec = r.trial_record
    return {"trial": r.number, "accuracy": rec.accuracy, "latency_ms": rec.latency_ms, "feasible": r.feasible,
            "subgraphs": rec.counts.subgraphs, "cpu_nodes": rec.counts.cpu_nodes,
            "int16_nodes": rec.counts.int16_nodes, "calibration": rec.calibration.method, "plan": r.plan,
            "task": dict(rec.task), "outputs": {k: dict(v) for k, v in rec.outputs.items()}}


@dataclass(frozen=True)
class StudyStatus:
    name: str
    info: StudyInfo
    completed: int
    failed: int
    running: int
    best: results.Row | None
    front: list[results.Row]
    closest: results.Closest | None = None
    next_steps: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)        # what exists: best, closest, pareto, trials_csv, report
    verified: dict[int, dict[str, Any]] = field(default_factory=dict)   # trial -> real-toolchain summary
    validations: dict[int, Validation] = field(default_factory=dict)   # trial -> its re-scoring
    chosen_by: str = "eval"                                            # the figure best was chosen by
    front_of_all: list[results.Row] = field(default_factory=list)      # with nothing feasible: all trials' front
    held_out: HeldOut | None = None                                    # the constraints judged on the validation data

    def _row(self, r: results.Row) -> dict[str, Any]:
        v = self.validations.get(r.number)
        o = self.info.objectives
        ms = results.margins(r, o)
        bind = binding(ms)
        return {**row_json(r), "latency_ratio": results.latency_ratio(r, o),
                "constraints": [{"name": m.name, "value": m.value, "limit": m.limit, "margin": m.margin,
                                 "binds": m is bind} for m in ms],
                "validation": v.to_json() if v is not None else None}

    def to_json(self) -> dict[str, Any]:
        o = self.info.objectives
        out: dict[str, Any] = jsonable({
            "study": self.name, "mode": o.mode, "march": self.info.march, "base": self.info.base_path,
            "metric_names": o.metric_names(),
            "objectives": {"accuracy": o.accuracy, "min_accuracy": o.min_accuracy, "max_latency_ms": o.max_latency_ms,
                           "max_latency_ratio": o.max_latency_ratio, "constraints": [c.name for c in o.constraints_],
                           "references": dict(o.references)},
            "trials": {"completed": self.completed, "failed": self.failed, "running": self.running},
            "best": self._row(self.best) if self.best is not None else None, "chosen_by": self.chosen_by,
            "held_out": None if self.held_out is None else self.held_out.to_json(),
            "front": [self._row(r) for r in self.front],
            "closest": None if self.closest is None else {**self._row(self.closest.row), "gaps": self.closest.gaps},
            "next_steps": self.next_steps, "files": self.files,
            "verified": {str(k): v for k, v in self.verified.items()},
            "fingerprints": self.info.fingerprints})
        return out


def study_status(study: optuna.Study, paths: StudyPaths, found: Outcome | None = None) -> StudyStatus:
    """``found``: the study's outcome as a search keeps it (:class:`~tuner.study.outcome.Tracker`),
    else read from the storage once."""
    info = study_info(study)
    found = found if found is not None else read_outcome(study, info.objectives)
    rs = list(found.rows)
    states = [t.state for t in study.get_trials(deepcopy=False)]
    files = {k: str(p) for k, p in (("best", paths.best), ("closest", paths.closest), ("pareto", paths.pareto),
                                    ("trials_csv", paths.trials_csv), ("report", paths.report)) if Path(p).exists()}
    near = found.closest
    return StudyStatus(
        name=study.study_name, info=info, completed=len(rs), failed=sum(s == TrialState.FAIL for s in states),
        running=sum(s == TrialState.RUNNING for s in states),
        best=found.best, chosen_by=found.chosen_by, validations=dict(found.validations), front=list(found.front),
        closest=near, next_steps=results.next_steps(near, study.study_name) if near is not None else [], files=files,
        front_of_all=results.front_of_all(rs) if near is not None else [],
        verified={n: rec.summary() for n, rec in found.real.items()}, held_out=found.held_out)


def same_outcome(a: TrialRecord, b: TrialRecord) -> bool:
    """Whether two records are the same result for a user: the same candidate, or the same
    accuracy and modeled latency (to the figures the tables print) and task metrics."""
    if a.key == b.key:
        return True
    return (f"{a.accuracy:.6f}" == f"{b.accuracy:.6f}" and f"{a.latency_ms:.3f}" == f"{b.latency_ms:.3f}"
            and dict(a.task) == dict(b.task))


def no_worse(a: TrialRecord, b: TrialRecord) -> bool:
    """Whether ``a`` is at least as accurate and at most as slow as ``b`` (to the printed figures)."""
    return (round(a.accuracy, 6) >= round(b.accuracy, 6) and round(a.latency_ms, 3) <= round(b.latency_ms, 3))


def convert_lines(paths: StudyPaths, study_name: str, found: Outcome, simplest: Simplest | None,
                  toolchain: bool) -> list[str]:
    """The end of a search: the one file to convert and the next command (``toolchain``: the real
    toolchain is installed, so ``tuner verify --local`` can check the file first)."""
    best = found.best
    if best is None or not paths.best.is_file():
        if paths.closest.is_file():
            return [f"nothing to convert yet: no trial meets the constraints ({paths.closest} is the closest, and "
                    "misses them; see the next steps above)"]
        return []
    target, why = paths.best, f"trial {best.number}"
    if simplest is not None and simplest.trim.trial == best.number and paths.best_minimal.is_file():
        t = simplest.trim
        if same_outcome(t.start, t.minimal):
            target = paths.best_minimal
            why = (f"best_minimal.yaml has the same outcome as best.yaml (accuracy {t.minimal.accuracy:.6f}, "
                   f"{t.minimal.latency_ms:.3f} ms) with {len(t.removed)} fewer change(s) to the base YAML: "
                   "convert it, best.yaml is the same result")
        elif no_worse(t.minimal, t.start):
            target = paths.best_minimal
            why = (f"best_minimal.yaml is as good as best.yaml with {len(t.removed)} fewer change(s) to the base "
                   f"YAML: accuracy {t.minimal.accuracy:.6f} against {t.start.accuracy:.6f}, "
                   f"{t.minimal.latency_ms:.3f} ms against {t.start.latency_ms:.3f} ms"
                   + ("; simulated on the evaluation data only, best.yaml was checked on held-out data"
                      if found.validations else ""))
        else:
            why = (f"trial {best.number}; best_minimal.yaml is the trimmed alternative (accuracy "
                   f"{t.minimal.accuracy:.6f}, {t.minimal.latency_ms:.3f} ms"
                   + (", not validated on held-out data)" if found.validations else ")"))
    h = found.held_out
    if h is not None and h.chosen == best.number and not h.chosen_holds:
        why += "; it misses the constraints on the held-out data (see above)"
    out = [f"file to convert: {target} ({why})", "next:"]
    if toolchain:
        out.append(f"  tuner verify {study_name} --local      (the real toolchain on the front, best first)")
    out.append(f"  hb_mapper makertbin --config {target} --model-type onnx")
    return out
