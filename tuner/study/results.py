"""Reading a study's outcome: feasible trials, the Pareto front, the trial to export.

Pure functions over Optuna's FrozenTrials (or hand-made :class:`Row` values), shared by the
anytime outputs, the report, ``tuner status``, ``export`` and ``verify``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.candidate import Candidate
from tuner.study.record import (  # noqa: F401  (RECORD: re-exported, its old home)
    RECORD,
    STUDY_ATTR,
    Counts,
    Direction,
    Margin,
    Objectives,
    StudyInfo,
    TrialRecord,
    binding,
)

if TYPE_CHECKING:
    from tuner.simulate import Evaluation
    from tuner.toolchain.records import RealRecord


@dataclass(frozen=True)
class Row:
    """One completed trial, flattened for tables and choices."""

    number: int
    trial_record: TrialRecord
    feasible: bool
    plan: str | None
    trial: FrozenTrial | None = None    # None for rows made by hand (tests, benchmarks)

    @property
    def accuracy(self) -> float:
        return self.trial_record.accuracy

    @property
    def latency_ms(self) -> float:
        return self.trial_record.latency_ms

    @property
    def counts(self) -> Counts:
        return self.trial_record.counts

    @property
    def calibration(self) -> str:
        """The calibration method string (what hb_mapper logs)."""
        return self.trial_record.calibration.method

    @property
    def duplicate(self) -> bool:
        return self.trial_record.duplicate_of is not None

    @property
    def record(self) -> dict[str, Any]:
        """The record's JSON as stored (what optuna-dashboard shows); code reads :attr:`trial_record`."""
        return self.trial_record.to_json()


def row(t: FrozenTrial, objectives: Objectives | None = None) -> Row | None:
    """The row of a completed trial, or None when it has no record (a trial added by hand).

    Feasible: by ``objectives`` (the study's current floors) applied to the stored values, else
    by the constraints the trial was run under."""
    rec = TrialRecord.of_trial(t)
    if rec is None:
        return None
    if objectives is not None:
        feasible = objectives.feasible_record(rec)
    else:
        feasible = all(v <= 0 for v in (t.constraints or {}).values()) if hasattr(t, "constraints") else True
    return Row(number=t.number, trial_record=rec, feasible=feasible, plan=t.user_attrs.get("plan"), trial=t)


def study_objectives(study: optuna.Study) -> Objectives | None:
    """The objectives in the study's ``tuner`` attribute (updated when a resumed search changes a
    floor), or None for a study tuner did not make."""
    blob = study.user_attrs.get(STUDY_ATTR)
    return StudyInfo.from_json(blob).objectives if isinstance(blob, dict) and blob else None


def rows(study: optuna.Study, objectives: Objectives | None = None) -> list[Row]:
    """The completed trials with a record; feasibility by ``objectives`` (default: the study's)."""
    objectives = objectives if objectives is not None else study_objectives(study)
    return [r for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if (r := row(t, objectives)) is not None]


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


def margins(r: Row, objectives: Objectives) -> list[Margin]:
    """Each constraint's value, limit and margin for this trial."""
    return objectives.margins(r.accuracy, r.latency_ms, r.trial_record.metrics(objectives.metric_names_needed))


def latency_ratio(r: Row, objectives: Objectives) -> float | None:
    """Modeled latency as a multiple of the all-BPU int8 plan's (when the study measured it)."""
    ref = objectives.reference("latency_ms:int8")
    return r.latency_ms / ref if ref else None


def margin_comments(r: Row, objectives: Objectives) -> tuple[str, ...]:
    """Header lines of an exported YAML: each constraint's value and margin, and which binds."""
    ms = margins(r, objectives)
    if not ms:
        return ()
    bind = binding(ms)
    return tuple(f"constraint {m.text()}" + ("  <- binds" if m is bind and len(ms) > 1 else "") for m in ms)


def front_of_all(rs: list[Row]) -> list[Row]:
    """The Pareto front of every non-repeat row, feasible or not (what to show when none is)."""
    return pareto([replace(r, feasible=True) for r in rs if not r.duplicate])


@dataclass(frozen=True)
class Closest:
    """The trial nearest the constraints when none meets them, and by how much it misses."""

    row: Row
    gaps: dict[str, float]      # constraint -> how far over it (> 0), in the constraint's unit

    def text(self) -> str:
        parts = [f"{name.replace('_', ' ')} missed by {gap:.6g}" for name, gap in self.gaps.items() if gap > 0]
        return (f"trial {self.row.number}: accuracy {self.row.accuracy:.6f}, {self.row.latency_ms:.3f} ms; "
                + ", ".join(parts))


def closest(rs: list[Row], objectives: Objectives) -> Closest | None:
    """The row nearest the constraints: the least total violation, each constraint's measured
    relative to its bound (an accuracy 0.1 % under its floor and a latency 0.1 % over its
    ceiling weigh the same); None without rows or when a row is feasible."""
    cands = [r for r in rs if not r.duplicate]
    if not cands or any(r.feasible for r in cands):
        return None

    def score(r: Row) -> tuple[float, float, int]:
        return sum(-m.relative for m in margins(r, objectives) if m.margin < 0), -r.accuracy, r.number

    r = min(cands, key=score)
    return Closest(row=r, gaps={m.name: max(0.0, -m.margin) for m in margins(r, objectives)})


def next_steps(found: Closest, study_name: str) -> list[str]:
    """What a user can do when no trial meets the constraints."""
    r, out = found.row, []
    if found.gaps.get("min_accuracy", 0) > 0:
        out.append(f"a floor within reach: objectives.min_accuracy <= {r.accuracy:.6f} makes trial {r.number} "
                   "feasible (resume the same study with the new floor: nothing is re-run)")
    if found.gaps.get("max_latency_ms", 0) > 0:
        out.append(f"a ceiling within reach: objectives.max_latency_ms >= {r.latency_ms:.3f}")
    out += ["more freedom: a larger nodes.top_k, or more int16 choices (nodes.precision: [int8, int16_input, "
            "int16_output, int16]), then resume",
            f"take the closest anyway: tuner export {study_name} --trial {r.number}"]
    return out


def best(rs: list[Row], mode: str, min_accuracy: float | None) -> Row | None:
    """The trial to export. With an accuracy floor: the cheapest feasible trial. Without one:
    the most accurate (mode accuracy/pareto), cheaper on ties."""
    feas = [r for r in rs if r.feasible]
    if not feas:
        return None
    if mode == "latency" or (mode == "pareto" and min_accuracy is not None):
        return min(feas, key=lambda r: (r.latency_ms, -r.accuracy, r.number))
    return max(feas, key=lambda r: (r.accuracy, -r.latency_ms, -r.number))


def front_table(front: list[Row], best: Row | None, vals: Mapping[int, Any] | None = None,
                objectives: Objectives | None = None) -> tuple[list[str], list[list[str]]]:
    """The Pareto table (terminal and report): the best marked with ``*``, the latency as a
    multiple of the all-int8 plan's (when the study measured it), the validation figures of
    ``vals`` (:class:`tuner.study.validation.Validation` by trial), the task metrics the trials
    record after the counts, and the warm-start plan column only when a row on the front came
    from one."""
    task = list(dict.fromkeys(k for r in front for k in r.trial_record.task))
    with_plan = any(r.plan for r in front)
    ratio = objectives is not None and objectives.reference("latency_ms:int8") is not None
    headers = ["trial", "accuracy", "latency ms"] + (["x int8"] if ratio else [])
    headers += ["validation", "worst val", "worst eval"] if vals else []
    headers += ["subgraphs", "CPU", "int16", *task, "calibration"] + (["plan"] if with_plan else [])
    out = []
    for r in front:
        t = r.trial_record.task
        row = [("*" if best is not None and r.number == best.number else " ") + str(r.number),
               f"{r.accuracy:.6f}", f"{r.latency_ms:.3f}"]
        if ratio and objectives is not None:
            lr = latency_ratio(r, objectives)
            row.append("--" if lr is None else f"{lr:.2f}")
        if vals:
            v = vals.get(r.number)
            row += [f"{v.accuracy:.6f}", f"{v.worst_sample:.6f}", f"{v.eval_worst_sample:.6f}"] if v else ["--"] * 3
        row += [str(r.counts.subgraphs), str(r.counts.cpu_nodes), str(r.counts.int16_nodes),
                *(f"{t[k]:.4f}" if k in t else "" for k in task), r.calibration]
        out.append(row + ([r.plan or ""] if with_plan else []))
    return headers, out


@dataclass
class Trace:
    """Per-node output cosine along the topological order, for one candidate."""

    label: str
    trial: int | None
    nodes: list[dict[str, Any]]     # name, op_type, on, subgraph, cosine
    # an image input_type_rt: output -> {"input_path", "network", "both"} -> {"cosine", "sqnr_db"}
    split: dict[str, dict[str, dict[str, float]]] | None = None

    @classmethod
    def from_evaluation(cls, label: str, trial: int | None, ev: Evaluation) -> Trace:
        split = None
        if ev.split is not None:
            parts = {**ev.split, "both": {"outputs": ev.outputs}}
            split = {o: {k: {m: p["outputs"][o][m] for m in ("cosine", "sqnr_db")} for k, p in parts.items()}
                     for o in ev.outputs}
        return cls(label, trial, [{"name": r.name, "op_type": r.op_type, "on": r.on, "subgraph": r.subgraph,
                                   "cosine": r.cosine} for r in ev.nodes], split)


# --------------------------------------------------------------------------- the simplest fix
# (computed by tuner.study.trim; here because the report shows them)
_CHOICE_TEXT = {"CPU": "CPU", "BPU": "BPU int8", "BPU:int16": "int16", "BPU:int16_input": "int16 input",
                "BPU:int16_output": "int16 output"}


@dataclass(frozen=True)
class Change:
    """One decision of the winner: an Optuna parameter whose value differs from the base YAML's."""

    param: str                     # node:/Slice, tie:/blocks.*/Conv, per_channel, max_percentile, calibration_type
    value: Any                     # the winner's
    base: Any                      # the base YAML's (what a revert sets)
    nodes: tuple[str, ...] = ()    # the nodes a node decision sets; () for a calibration knob

    @property
    def kind(self) -> str:
        return "node" if self.nodes else "calibration"

    def describe(self) -> str:
        """``/Slice: int16``, ``/a/Conv (+3 tied): CPU``, ``per_channel: True``."""
        if not self.nodes:
            return f"{self.param}: {self.value}"
        where = self.nodes[0] + (f" (+{len(self.nodes) - 1} tied)" if len(self.nodes) > 1 else "")
        return f"{where}: {_CHOICE_TEXT.get(str(self.value), self.value)}"


@dataclass(frozen=True)
class Kept:
    """A decision the floor needs: what the minimal candidate loses without it."""

    change: Change
    accuracy_drop: float    # minimal's accuracy minus its accuracy without this decision (inf: the simulation fails)
    latency_ms: float       # minimal's modeled latency minus its latency without it


@dataclass(frozen=True)
class TrimResult:
    """The winner trimmed to the decisions its floor needs."""

    trial: int                         # the trial trimmed (best.yaml's)
    start: TrialRecord                 # its record
    minimal: TrialRecord               # the trimmed candidate's
    params: Mapping[str, Any]          # the trimmed candidate's Optuna parameters
    kept: tuple[Kept, ...]             # in the order tried
    removed: tuple[Change, ...]        # in the order tried
    criterion: str                     # what "still meets the floor" meant
    scored: int                        # distinct candidates scored (the winner's included)

    @property
    def candidate(self) -> Candidate:
        return self.minimal.candidate

    @property
    def decisions(self) -> int:
        return len(self.kept) + len(self.removed)


@dataclass(frozen=True)
class Fix:
    """A completed trial that is the base YAML with only its calibration_parameters changed."""

    change: str             # the YAML lines that differ: ``per_channel: True``
    trial: int
    record: TrialRecord
    feasible: bool          # meets the criterion best_minimal.yaml had to meet
    below: float | None = None   # how far its accuracy is below that criterion's floor (None: met, or no floor)
    validation: float | None = None   # its accuracy on the validation data (None: not validated)


@dataclass(frozen=True)
class Simplest:
    """What the terminal summary and the report show next to best.yaml."""

    trim: TrimResult
    fixes: tuple[Fix, ...]
    validation: float | None = None    # best.yaml's trial's accuracy on the validation data (None: not validated)

    def feasible_fixes(self) -> list[Fix]:
        return [f for f in self.fixes if f.feasible]



@dataclass
class ReportSnapshot:
    """Everything report.html shows, read from a study at one moment (no storage, no simulator)."""

    name: str
    info: StudyInfo                            # the study's tuner attribute (mode, objectives, march, ...)
    storage: str                               # where the study lives, password redacted
    directions: list[Direction]                # "maximize" / "minimize" per objective
    trials: list[FrozenTrial]                  # all trials (history, importances, failures)
    rows: list[Row]                    # the completed trials with a record
    real: dict[int, RealRecord] = field(default_factory=dict)   # trial -> real toolchain record
    sensitivity: dict[str, float] = field(default_factory=dict)
    traces: list[Trace] = field(default_factory=list)
    best_yaml: str | None = None
    notes: list[str] = field(default_factory=list)
    simplest: Simplest | None = None           # best.yaml trimmed, the one-line fixes (tuner.study.trim)
    validations: dict[int, Any] = field(default_factory=dict)   # trial -> tuner.study.validation.Validation
    best_number: int | None = None             # best.yaml's trial (chosen by validation when there is one)
    held_out: Any = None                       # tuner.study.validation.HeldOut: the constraints on validation
    convert: list[str] = field(default_factory=list)   # the file to convert and the next command
