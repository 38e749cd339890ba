"""What a trial found, as typed values with one JSON codec.

A completed trial stores its :class:`TrialRecord` as the user attribute ``record`` (JSON:
what every Optuna storage keeps, and what optuna-dashboard shows). Everything that reads a
study (the anytime outputs, ``tuner status``/``export``/``verify``, the report) decodes it
with :meth:`TrialRecord.from_json` and reads attributes, never string keys; the JSON shape
is the one studies have always stored, so old studies still open
(tests/study/fixtures/records_main_a8e95c4.json holds records as they were written).

:class:`Objectives` is the space's ``objectives`` section as one value: the study's
directions, a trial's objective values and its constraints are derived here and nowhere else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from tuner.candidate import Candidate
from tuner.errors import TunerError
from tuner.metrics.accuracy import accuracy

if TYPE_CHECKING:
    from optuna.study import StudyDirection
    from optuna.trial import BaseTrial

RECORD = "record"   # the trial user attribute holding TrialRecord.to_json()
#: The trial system attribute holding the list of constraint values (<= 0: met), in the order of
#: :meth:`Objectives.constraints`: Optuna's own format, the one optuna-dashboard reads.
CONSTRAINTS = "constraints"
#: The user attribute of a repeat: a trial whose candidate a completed trial already scored. It
#: is answered from that trial and pruned (not simulated, not a completed trial: it does not
#: count toward ``n_trials`` and is on no front); the value is that trial's number.
DUPLICATE_OF = "duplicate_of"

MODES = ("pareto", "accuracy", "latency")

#: An objective's direction as Optuna's ``create_study(directions=...)`` takes it.
Direction = Literal["maximize", "minimize"]


def direction_name(d: StudyDirection) -> Direction:
    """A study's direction as :meth:`Objectives.directions` names it."""
    if d.name == "MAXIMIZE":
        return "maximize"
    if d.name == "MINIMIZE":
        return "minimize"
    raise ValueError(f"a study direction that is not set: {d!r}")


@dataclass(frozen=True)
class Latency:
    """The modeled latency breakdown (:meth:`tuner.cost.latency.Latency.as_dict`)."""

    total_ms: float
    bpu_ms: float
    cpu_ms: float
    switch_ms: float
    subgraphs: int
    boundary_tensors: int
    compiler_ms: float | None = None     # the modeled hbdk estimate (records before issue 23 have none)

    _KEYS = ("total_ms", "bpu_ms", "cpu_ms", "switch_ms", "subgraphs", "boundary_tensors")

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Latency:
        return cls(**{k: d[k] for k in cls._KEYS}, compiler_ms=d.get("compiler_ms"))

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self._KEYS}
        if self.compiler_ms is not None:
            out["compiler_ms"] = self.compiler_ms
        return out


@dataclass(frozen=True)
class Counts:
    """BPU subgraphs, CPU nodes and int16 nodes of the simulated plan."""

    subgraphs: int
    cpu_nodes: int
    int16_nodes: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Counts:
        return cls(subgraphs=d["subgraphs"], cpu_nodes=d["cpu_nodes"], int16_nodes=d["int16_nodes"])

    def to_json(self) -> dict[str, int]:
        return {"subgraphs": self.subgraphs, "cpu_nodes": self.cpu_nodes, "int16_nodes": self.int16_nodes}


@dataclass(frozen=True)
class CalibrationUsed:
    """The method string hb_mapper would log (``method``: what default/mix chose) and the one asked for."""

    method: str
    requested: str

    def to_json(self) -> dict[str, str]:
        return {"method": self.method, "requested": self.requested}


@dataclass(frozen=True)
class TrialRecord:
    """One simulated candidate's outcome. Treat the mappings as read-only."""

    key: str                                   # Candidate.key()
    accuracy: float                            # the objective's accuracy metric
    outputs: Mapping[str, Mapping[str, float]]  # per model output: cosine, sqnr_db, max_abs, l1, l2
    task: Mapping[str, float]                  # task metrics (objective's and objectives.report)
    latency: Latency
    counts: Counts
    calibration: CalibrationUsed
    candidate_fields: Mapping[str, Any]        # Candidate.to_yaml_fields()
    cpu_nodes: tuple[str, ...]
    notes: tuple[str, ...]
    seconds: float
    duplicate_of: int | None = None            # answered from this earlier trial's result
    extra: Mapping[str, Any] = field(default_factory=dict)   # keys this version does not know, kept as found

    @property
    def latency_ms(self) -> float:
        return self.latency.total_ms

    @property
    def candidate(self) -> Candidate:
        return Candidate.from_yaml_fields(dict(self.candidate_fields))

    @property
    def node_info(self) -> dict[str, dict[str, str]]:
        return dict((self.candidate_fields.get("model_parameters") or {}).get("node_info") or {})

    def as_duplicate_of(self, number: int) -> TrialRecord:
        return replace(self, duplicate_of=number)

    def metric(self, name: str) -> float | None:
        """A metric of this trial: a task metric it recorded, or one of its outputs' figures
        (``cosine:seg``, ``mean_cosine``, ...); None when it recorded neither."""
        if name in self.task:
            return float(self.task[name])
        try:
            return accuracy({k: dict(v) for k, v in self.outputs.items()}, name)
        except (KeyError, ValueError, TunerError):
            return None

    def metrics(self, names: tuple[str, ...]) -> dict[str, float]:
        return {n: v for n in names if (v := self.metric(n)) is not None}

    # ------------------------------------------------------------------ the codec
    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TrialRecord:
        known = {"key", "accuracy", "outputs", "task", "latency", "counts", "calibration", "candidate",
                 "cpu_nodes", "notes", "seconds", "duplicate_of"}
        cal = d.get("calibration") or {}
        return cls(key=d["key"], accuracy=d["accuracy"], outputs=d.get("outputs", {}), task=d.get("task", {}),
                   latency=Latency.from_json(d["latency"]), counts=Counts.from_json(d["counts"]),
                   calibration=CalibrationUsed(method=cal["method"], requested=cal.get("requested", cal["method"])),
                   candidate_fields=d["candidate"], cpu_nodes=tuple(d.get("cpu_nodes", ())),
                   notes=tuple(d.get("notes", ())), seconds=d.get("seconds", 0.0),
                   duplicate_of=d.get("duplicate_of"), extra={k: v for k, v in d.items() if k not in known})

    def to_json(self) -> dict[str, Any]:
        """The stored shape, key order included (a record written before this codec existed
        comes back unchanged)."""
        out = {"key": self.key, "accuracy": self.accuracy, "outputs": _plain(self.outputs), "task": dict(self.task),
               "latency": self.latency.to_json(), "counts": self.counts.to_json(),
               "calibration": self.calibration.to_json(), "candidate": _plain(self.candidate_fields),
               "cpu_nodes": list(self.cpu_nodes), "notes": list(self.notes), "seconds": self.seconds,
               **_plain(self.extra)}
        if self.duplicate_of is not None:
            out["duplicate_of"] = self.duplicate_of
        return out

    @classmethod
    def of_trial(cls, trial: BaseTrial) -> TrialRecord | None:
        """The record of an Optuna trial (Frozen or live), or None when it has none."""
        d = trial.user_attrs.get(RECORD)
        return cls.from_json(d) if d else None


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


@dataclass(frozen=True)
class Constraint:
    """One bound on a metric, absolute (``cosine:seg >= 0.999``) or relative to the float model's
    value of the same metric on the same data (``miou:seg >= 0.99 x float``: at least 99 % of
    float's mIoU; ``absrel:depth <= 1.02 x float``: at most 2 % more error than float's)."""

    metric: str
    op: Literal[">=", "<="]
    bound: float
    relative: bool = False

    @property
    def name(self) -> str:
        return f"{self.metric} {self.op} {self.bound:g}" + (" x float" if self.relative else "")

    def limit(self, float_value: float | None) -> float | None:
        """The bound in the metric's unit (None: relative, and the float value is not known)."""
        if not self.relative:
            return self.bound
        return None if float_value is None else self.bound * float_value

    def violation(self, value: float | None, float_value: float | None) -> float:
        """<= 0 when met (Optuna's convention), in the metric's unit; +inf when the value or the
        float reference is missing (a trial that did not record the metric cannot meet it)."""
        lim = self.limit(float_value)
        if value is None or lim is None:
            return math.inf
        return lim - value if self.op == ">=" else value - lim

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Constraint:
        op: Literal[">=", "<="] = ">=" if d["op"] == ">=" else "<="
        return cls(metric=str(d["metric"]), op=op, bound=float(d["bound"]), relative=bool(d.get("relative", False)))

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "op": self.op, "bound": self.bound, "relative": self.relative}


@dataclass(frozen=True)
class Margin:
    """How far a trial is inside (+) or outside (-) one constraint."""

    name: str
    value: float | None      # the trial's figure
    limit: float | None      # the bound in the figure's unit
    margin: float            # -violation: > 0 inside, < 0 outside

    @property
    def relative(self) -> float:
        """The margin as a fraction of the limit (what "binds" compares)."""
        return self.margin / max(abs(self.limit or 0.0), 1e-12) if math.isfinite(self.margin) else self.margin

    def text(self) -> str:
        v = "--" if self.value is None else f"{self.value:.6g}"
        lim = "--" if self.limit is None else f"{self.limit:.6g}"
        return f"{self.name} (limit {lim}): {v}, margin {self.margin:+.3g}"


def binding(ms: list[Margin]) -> Margin | None:
    """The constraint with the least room (relative to its limit), or None without constraints."""
    return min(ms, key=lambda m: m.relative) if ms else None


@dataclass(frozen=True)
class Objectives:
    """The space's ``objectives`` section: what is optimised and what is feasible."""

    mode: str = "pareto"                 # pareto: accuracy up, latency down | accuracy | latency
    accuracy: str = "mean_cosine"        # the accuracy metric (tuner.metrics.accuracy)
    report: tuple[str, ...] = ()         # task metrics recorded with every trial
    min_accuracy: float | None = None    # feasibility floor
    max_latency_ms: float | None = None  # feasibility ceiling
    select: str | None = None            # best.yaml by "eval" or "validation" (None: validation when there is one)
    constraints_: tuple[Constraint, ...] = ()   # objectives.constraints: per-metric bounds
    max_latency_ratio: float | None = None      # at most this x the all-BPU int8 plan's modeled latency
    # measured once per study: the float model's value of each relative constraint's metric, and
    # "latency_ms:int8", the all-BPU int8 plan's modeled latency (for max_latency_ratio)
    references: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"objectives.mode: must be one of {', '.join(MODES)}, got {self.mode!r}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Objectives:
        """From a space file's section or a study's stored ``objectives`` attribute."""
        return cls(mode=d.get("mode", "pareto"), accuracy=d.get("accuracy", "mean_cosine"),
                   report=tuple(d.get("report") or ()), min_accuracy=d.get("min_accuracy"),
                   max_latency_ms=d.get("max_latency_ms"), select=d.get("select"),
                   constraints_=tuple(Constraint.from_json(c) for c in d.get("constraints") or ()),
                   max_latency_ratio=d.get("max_latency_ratio"),
                   references=tuple((str(k), float(v)) for k, v in (d.get("references") or {}).items()))

    def to_dict(self) -> dict[str, Any]:
        """The section as a study stores it (``tuner`` study attribute, key ``objectives``)."""
        out: dict[str, Any] = {"mode": self.mode, "accuracy": self.accuracy, "report": list(self.report),
                               "min_accuracy": self.min_accuracy, "max_latency_ms": self.max_latency_ms}
        # absent unless set, as in studies made before they existed
        if self.select is not None:
            out["select"] = self.select
        if self.constraints_:
            out["constraints"] = [c.to_json() for c in self.constraints_]
        if self.max_latency_ratio is not None:
            out["max_latency_ratio"] = self.max_latency_ratio
        if self.references:
            out["references"] = dict(self.references)
        return out

    @property
    def floor(self) -> float | None:
        """What :func:`tuner.study.results.best` takes as "an accuracy floor": ``min_accuracy``, or
        (with accuracy constraints and no floor) -inf: then too the cheapest feasible trial is best."""
        if self.min_accuracy is not None:
            return float(self.min_accuracy)
        return -math.inf if self.constraints_ else None

    @property
    def metric_names_needed(self) -> tuple[str, ...]:
        """The metrics the constraints read."""
        return tuple(dict.fromkeys(c.metric for c in self.constraints_))

    def reference(self, key: str) -> float | None:
        return dict(self.references).get(key)

    def margins(self, accuracy: float, latency_ms: float, metrics: Mapping[str, float] | None = None) -> list[Margin]:
        """Each constraint's value, limit and margin (the floor and ceilings too)."""
        out = []
        if self.min_accuracy is not None:
            out.append(Margin("min_accuracy", accuracy, float(self.min_accuracy), accuracy - float(self.min_accuracy)))
        if self.max_latency_ms is not None:
            out.append(Margin("max_latency_ms", latency_ms, float(self.max_latency_ms),
                              float(self.max_latency_ms) - latency_ms))
        ref = self.reference("latency_ms:int8")
        if self.max_latency_ratio is not None:
            lim = None if ref is None else self.max_latency_ratio * ref
            out.append(Margin(f"max_latency_ratio {self.max_latency_ratio:g}", latency_ms, lim,
                              -math.inf if lim is None else lim - latency_ms))
        for c in self.constraints_:
            fv = self.reference(c.metric) if c.relative else None
            value = (metrics or {}).get(c.metric)
            out.append(Margin(c.name, value, c.limit(fv), -c.violation(value, fv)))
        return out

    def directions(self) -> list[Direction]:
        by_mode: dict[str, list[Direction]] = {"pareto": ["maximize", "minimize"], "accuracy": ["maximize"],
                                               "latency": ["minimize"]}
        return by_mode[self.mode]

    def values(self, accuracy: float, latency_ms: float) -> list[float]:
        """A trial's objective values, in the order of :meth:`directions`."""
        return {"pareto": [accuracy, latency_ms], "accuracy": [accuracy], "latency": [latency_ms]}[self.mode]

    def metric_names(self) -> list[str]:
        """Optuna's names of the objective values (optuna-dashboard and ``optuna.visualization``
        show them instead of "Objective 0/1")."""
        return {"pareto": [self.accuracy, "latency_ms"], "accuracy": [self.accuracy],
                "latency": ["latency_ms"]}[self.mode]

    def feasible(self, accuracy: float, latency_ms: float, metrics: Mapping[str, float] | None = None) -> bool:
        """Whether a trial with these stored values meets every constraint (derived again from the
        values, so a floor changed after the trials ran applies to them too)."""
        return all(v <= 0 for v in self.constraints(accuracy, latency_ms, metrics).values())

    def feasible_record(self, rec: TrialRecord) -> bool:
        return self.feasible(rec.accuracy, rec.latency_ms, rec.metrics(self.metric_names_needed))

    def constraints(self, accuracy: float, latency_ms: float,
                    metrics: Mapping[str, float] | None = None) -> dict[str, float]:
        """Optuna constraints (feasible when every value is <= 0); empty without any. ``metrics``:
        the trial's values of :attr:`metric_names_needed` (one missing: that constraint is not met)."""
        return {m.name: -m.margin for m in self.margins(accuracy, latency_ms, metrics)}


#: The study user attribute holding :meth:`StudyInfo.to_json`.
STUDY_ATTR = "tuner"


@dataclass(frozen=True)
class StudyInfo:
    """What a study was made from, stored once when tuner creates it (study attribute ``tuner``).

    Workers compare ``fingerprints`` with their own files before they join; ``status``,
    ``export``, ``verify`` and the report read the rest. The JSON is the shape studies have
    always stored (``mode`` beside ``objectives``); keys of another version stay in ``extra``.
    """

    version: str                         # tuner's version that created the study
    name: str
    objectives: Objectives
    space_path: str                      # the space file, resolved, on the machine that created the study
    base_path: str                       # the base hb_mapper YAML
    march: str | None
    node_info_supported: bool            # whether the hb_mapper version takes model_parameters.node_info
    fingerprints: dict[str, str]         # model / data / base_config / space -> sha256
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS = ("version", "name", "mode", "objectives", "space_path", "base_path", "march", "node_info_supported",
             "fingerprints")

    @property
    def mode(self) -> str:
        return self.objectives.mode

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "name": self.name, "mode": self.mode, "objectives": self.objectives.to_dict(),
                "space_path": self.space_path, "base_path": self.base_path, "march": self.march,
                "node_info_supported": self.node_info_supported, "fingerprints": dict(self.fingerprints),
                **self.extra}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StudyInfo:
        objectives = dict(d.get("objectives") or {})
        objectives.setdefault("mode", d.get("mode", "pareto"))
        return cls(version=str(d.get("version", "?")), name=str(d.get("name", "")),
                   objectives=Objectives.from_dict(objectives), space_path=str(d.get("space_path", "")),
                   base_path=str(d.get("base_path", "")), march=d.get("march"),
                   node_info_supported=bool(d.get("node_info_supported", True)),
                   fingerprints={str(k): str(v) for k, v in (d.get("fingerprints") or {}).items()},
                   extra={k: v for k, v in d.items() if k not in cls._KEYS})
