"""The typed sections of a search space file, each validated where it is built.

``search_spaces/default.yaml`` stays the one source of defaults: a section is built from the space
file's mapping after the defaults were merged in (:func:`tuner.study.space.load_space`), and every
value is checked here with the key's path in the message. The objectives section is
:class:`tuner.study.record.Objectives` (shared with the study's stored attribute); its validation
is :func:`objectives_section`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from tuner.errors import TunerError
from tuner.metrics.task import MetricSpec, higher_is_better, parse_metric_spec
from tuner.study.record import Constraint, Objectives

PLACEMENTS = ("BPU", "CPU")
PRECISIONS = {"int8": (None, None), "int16_input": ("int16", None), "int16_output": (None, "int16"),
              "int16": ("int16", "int16")}
CALIBRATION_TYPES = ("max", "kl", "default", "mix")
SAMPLERS = ("tpe", "random", "nsga2")
MODES = ("pareto", "accuracy", "latency")
#: Accuracy metrics computed from the outputs (anything else is a task metric).
ACCURACY = re.compile(r"^(mean_cosine|min_cosine|mean_sqnr|(cosine|sqnr):.+)$")


def parse_duration(text: Any, where: str) -> float | None:
    """Seconds from 3600, '90s', '30m', '8h', '1d' (None stays None)."""
    if text is None:
        return None
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text <= 0:
            raise TunerError(f"{where}: must be positive, got {text}")
        return float(text)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", str(text))
    if not m:
        raise TunerError(f"{where}: expected seconds or a duration like 30m / 8h, got {text!r}")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def checked_list(where: str, value: Any, allowed: tuple[Any, ...] | None = None,
                 kind: type | tuple[type, ...] = str) -> list[Any]:
    """A non-empty list of distinct values of ``kind`` (and in ``allowed``)."""
    if not isinstance(value, list) or not value:
        raise TunerError(f"{where}: expected a non-empty list, got {value!r}")
    for v in value:
        if isinstance(v, bool) and kind is not bool:
            raise TunerError(f"{where}: {v!r} is a boolean; quote it or use the values listed in search_spaces/README.md")
        if not isinstance(v, kind):
            raise TunerError(f"{where}: {v!r} has the wrong type")
        if allowed is not None and v not in allowed:
            raise TunerError(f"{where}: {v!r} is not one of {', '.join(map(str, allowed))}")
    if len(set(map(repr, value))) != len(value):
        raise TunerError(f"{where}: repeated values in {value!r}")
    return value


def _task_spec(where: str, text: Any) -> MetricSpec:
    try:
        return parse_metric_spec(str(text))
    except TunerError as exc:
        raise TunerError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class NodesRule:
    """``nodes``: which nodes are free, and the choices they may take."""

    select: str
    op_types: tuple[str, ...]
    pattern: str | None
    names: tuple[str, ...]
    exclude: tuple[str, ...]
    top_k: int | None
    tie_repeated: bool
    placement: tuple[str, ...]
    precision: tuple[str, ...]

    @classmethod
    def from_section(cls, n: dict[str, Any], where: str) -> NodesRule:
        if n["select"] not in ("bpu", "all"):
            raise TunerError(f"{where}.select: must be 'bpu' or 'all', got {n['select']!r}")
        for key in ("op_types", "names", "exclude"):
            if not isinstance(n[key], list) or not all(isinstance(v, str) for v in n[key]):
                raise TunerError(f"{where}.{key}: expected a list of strings, got {n[key]!r}")
        for key, text in [("pattern", n["pattern"])] + [(f"exclude[{i}]", t) for i, t in enumerate(n["exclude"])]:
            if text is not None:
                try:
                    re.compile(text)
                except re.error as exc:
                    raise TunerError(f"{where}.{key}: invalid regular expression {text!r}: {exc}") from None
        top_k = n["top_k"]
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise TunerError(f"{where}.top_k: expected a positive integer, got {top_k!r}")
        if not isinstance(n["tie_repeated"], bool):
            raise TunerError(f"{where}.tie_repeated: expected true or false, got {n['tie_repeated']!r}")
        placement = checked_list(f"{where}.placement", n["placement"], PLACEMENTS)
        precision = checked_list(f"{where}.precision", n["precision"], tuple(PRECISIONS))
        return cls(select=n["select"], op_types=tuple(n["op_types"]), pattern=n["pattern"], names=tuple(n["names"]),
                   exclude=tuple(n["exclude"]), top_k=top_k, tie_repeated=n["tie_repeated"],
                   placement=tuple(placement), precision=tuple(precision))


@dataclass(frozen=True)
class CalibrationKnobs:
    """``calibration``: the values each calibration parameter may take (first = the default)."""

    calibration_type: tuple[str, ...]
    max_percentile: tuple[float, ...]
    per_channel: tuple[bool, ...]

    @classmethod
    def from_section(cls, c: dict[str, Any], where: str) -> CalibrationKnobs:
        types = checked_list(f"{where}.calibration_type", c["calibration_type"], CALIBRATION_TYPES)
        pcts = checked_list(f"{where}.max_percentile", c["max_percentile"], None, (int, float))
        if not all(0.0 < float(p) <= 1.0 for p in pcts):
            raise TunerError(f"{where}.max_percentile: values must be in (0, 1], got {pcts}")
        pcs = checked_list(f"{where}.per_channel", c["per_channel"], (True, False), bool)
        return cls(calibration_type=tuple(types), max_percentile=tuple(float(p) for p in pcts), per_channel=tuple(pcs))

    def free(self) -> dict[str, list[Any]]:
        """The knobs with more than one value: the study's calibration parameters."""
        return {k: list(v) for k, v in (("calibration_type", self.calibration_type),
                                        ("max_percentile", self.max_percentile),
                                        ("per_channel", self.per_channel)) if len(v) > 1}


def accuracy_range(metric: str) -> tuple[float, float] | None:
    """The values the accuracy objective ``metric`` can take; None when unbounded (SQNR, user scores)."""
    kind = metric.partition(":")[0].strip().lower()
    if kind in ("mean_cosine", "min_cosine", "cosine"):
        return (-1.0, 1.0)
    if kind in ("miou", "delta1", "top1", "seg_agreement"):
        return (0.0, 1.0)
    return None


def objectives_section(o: dict[str, Any], where: str) -> Objectives:
    """``objectives``, validated: the accuracy metric and what the trials report, floor and ceiling."""
    if o["mode"] not in MODES:
        raise TunerError(f"{where}.mode: must be one of {', '.join(MODES)}, got {o['mode']!r}")
    if not isinstance(o["accuracy"], str):
        raise TunerError(f"{where}.accuracy: expected a metric name, got {o['accuracy']!r}")
    if not ACCURACY.match(o["accuracy"]):
        try:
            spec = parse_metric_spec(o["accuracy"])
        except TunerError as exc:
            raise TunerError(f"{where}.accuracy: expected mean_cosine, min_cosine, mean_sqnr, "
                             f"cosine:<output>, sqnr:<output> or a task metric; {exc}") from None
        if not higher_is_better(spec.kind):
            raise TunerError(f"{where}.accuracy: {o['accuracy']!r} is an error (lower is better); the "
                             "accuracy objective is maximised: use delta1, seg_agreement, miou, top1 or a user score, "
                             "and list error metrics under objectives.report")
    if not isinstance(o["report"], list):
        raise TunerError(f"{where}.report: expected a list of metrics, got {o['report']!r}")
    for i, text in enumerate(o["report"]):
        _task_spec(f"{where}.report[{i}]", text)
    for key in ("min_accuracy", "max_latency_ms"):
        if o[key] is not None and (isinstance(o[key], bool) or not isinstance(o[key], (int, float))):
            raise TunerError(f"{where}.{key}: expected a number, got {o[key]!r}")
    bounds = accuracy_range(o["accuracy"])
    if o["min_accuracy"] is not None and bounds is not None and not bounds[0] <= o["min_accuracy"] <= bounds[1]:
        pct = f" (for {o['min_accuracy']}% write {o['min_accuracy'] / 100:g})" if 1 < o["min_accuracy"] <= 100 else ""
        raise TunerError(f"{where}.min_accuracy: {o['min_accuracy']} is outside {o['accuracy']}'s range "
                         f"[{bounds[0]:g}, {bounds[1]:g}]{pct}; no trial could meet it")
    constraints = _constraints(o["constraints"], f"{where}.constraints")
    r = o["max_latency_ratio"]
    if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float)) or r <= 0):
        raise TunerError(f"{where}.max_latency_ratio: expected a positive number (1.2: at most 1.2x the all-BPU int8 "
                         f"plan's modeled latency), got {r!r}")
    if o["select"] not in (None, "eval", "validation"):
        raise TunerError(f"{where}.select: must be eval or validation (the figure best.yaml is chosen by), "
                         f"got {o['select']!r}")
    if o["mode"] == "latency" and o["min_accuracy"] is None:
        raise TunerError(f"{where}.mode latency minimises latency subject to an accuracy floor: "
                         "set objectives.min_accuracy")
    return replace(Objectives.from_dict({k: v for k, v in o.items() if k != "constraints"}), constraints_=constraints)


CONSTRAINT = re.compile(r"^\s*(?P<metric>\S+)\s*(?P<op>>=|<=)\s*(?P<bound>[-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
                        r"\s*(?P<rel>(?:x|\*)\s*float)?\s*$")


def _constraints(items: Any, where: str) -> tuple[Constraint, ...]:
    """``objectives.constraints``: ``'<metric> >= <bound>'`` / ``'<metric> <= <bound> x float'``."""
    if not isinstance(items, list):
        raise TunerError(f"{where}: expected a list such as ['miou:seg >= 0.99 x float'], got {items!r}")
    out = []
    for i, text in enumerate(items):
        m = CONSTRAINT.match(str(text)) if isinstance(text, str) else None
        if m is None:
            raise TunerError(f"{where}[{i}]: {text!r} is not '<metric> >= <number>' or '<metric> <= <number> x float' "
                             "(e.g. 'miou:seg >= 0.99 x float', 'absrel:depth <= 1.02 x float', 'cosine:seg >= 0.999')")
        metric, op, rel = m["metric"], m["op"], m["rel"] is not None
        if not ACCURACY.match(metric):
            spec = _task_spec(f"{where}[{i}]", metric)
            better_high = higher_is_better(spec.kind)
            if better_high and op == "<=" or not better_high and op == ">=":
                word = "a score (higher is better)" if better_high else "an error (lower is better)"
                fix = ">=" if better_high else "<="
                raise TunerError(f"{where}[{i}]: {metric} is {word}: bound it with {fix}, e.g. '{metric} {fix} "
                                 f"{m['bound']}{' x float' if rel else ''}'")
        elif metric.startswith(("sqnr:", "mean_sqnr")) and rel:
            raise TunerError(f"{where}[{i}]: {metric} of the float model is infinite: give SQNR in dB, without x float")
        out.append(Constraint(metric=metric, op=">=" if op == ">=" else "<=", bound=float(m["bound"]), relative=rel))
    return tuple(out)


def check_metric_outputs(objectives: Objectives, outputs: list[str], where: str = "objectives") -> None:
    """Refuse, before any trial, an accuracy metric or a constraint on an output the model does not
    have (``cosine:<output>``, ``sqnr:<output>``; task metrics are checked when their evaluator is
    built): every trial would miss such a constraint and the whole search would run for nothing."""
    named = [("accuracy", objectives.accuracy)] + [(f"constraints {c.name!r}", c.metric)
                                                     for c in objectives.constraints_]
    for key, metric in named:
        kind, _, name = metric.partition(":")
        if ACCURACY.match(metric) and name and name not in outputs:
            raise TunerError(f"{where}.{key}: the model has no output {name!r}; it has {', '.join(outputs)}")


def task_metric_texts(objectives: Objectives) -> list[str]:
    """The task metrics the evaluations must compute: the objective's (if a task metric) and report's."""
    texts = list(objectives.report)
    if not ACCURACY.match(objectives.accuracy):
        texts.insert(0, objectives.accuracy)
    texts += [c.metric for c in objectives.constraints_ if not ACCURACY.match(c.metric)]
    return list(dict.fromkeys(texts))


@dataclass(frozen=True)
class StudySettings:
    """``study``: name, sampler, seed, budget, warm start."""

    name: str | None
    sampler: str
    seed: int | None
    n_trials: int | None
    timeout_s: float | None
    warm_start: bool
    min_eval_samples: int = 8

    @classmethod
    def from_section(cls, s: dict[str, Any], where: str) -> StudySettings:
        if s["sampler"] not in SAMPLERS:
            raise TunerError(f"{where}.sampler: must be one of {', '.join(SAMPLERS)}, got {s['sampler']!r}")
        for key in ("seed", "n_trials"):
            if s[key] is not None and (isinstance(s[key], bool) or not isinstance(s[key], int) or s[key] < 0):
                raise TunerError(f"{where}.{key}: expected a non-negative integer, got {s[key]!r}")
        timeout = parse_duration(s["timeout"], f"{where}.timeout")
        if s["name"] is not None and (not isinstance(s["name"], str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", s["name"])):
            raise TunerError(f"{where}.name: use letters, digits, '_', '-', '.', got {s['name']!r}")
        if not isinstance(s["warm_start"], bool):
            raise TunerError(f"{where}.warm_start: expected true or false")
        m = s["min_eval_samples"]
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise TunerError(f"{where}.min_eval_samples: expected a non-negative integer, got {m!r}")
        return cls(name=s["name"], sampler=s["sampler"], seed=s["seed"], n_trials=s["n_trials"], timeout_s=timeout,
                   warm_start=s["warm_start"], min_eval_samples=m)
