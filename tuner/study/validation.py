"""The winners re-scored on data the search did not select on.

A search picks, among hundreds of candidates, the ones that score best on ``eval_data``; with
few evaluation samples the winners are partly tuned to those samples. (Measured on a text
detector with 4 evaluation images: the most accurate trials of a 400-trial study were worse
than the untouched YAML on the 8 calibration images the search never scored, 0.9756 vs 0.9826.)
So the Pareto trials and the best one are scored again on ``validation_data`` (default: the
calibration data when ``eval_data`` is another folder), with the per-sample worst case next
to the pooled figure on both data sets, and best.yaml is chosen by the validation figure
unless ``objectives.select: eval``.

A validation is stored as the study user attribute ``validation:N`` (Optuna 5 refuses to
change finished trials), keyed by the candidate and the validation data's fingerprint, so it
is computed once per trial and data.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import optuna

from tuner.inputs.data import DataSet, dataset_from_config
from tuner.metrics.accuracy import accuracy
from tuner.simulate import Evaluation, Simulator
from tuner.study import results
from tuner.study.record import Objectives
from tuner.study.sections import ACCURACY, accuracy_range
from tuner.study.space import SearchSpace
from tuner.workspace import Workspace

if TYPE_CHECKING:
    from tuner.study.scorer import Scorer

PREFIX = "validation:"


@dataclass(frozen=True)
class Validation:
    """One trial scored on the validation data (and its eval worst case)."""

    trial: int
    key: str                    # the candidate's key
    data: str                   # the validation data's fingerprint
    metric: str                 # the study's accuracy metric, or mean_cosine when that needs labels
    accuracy: float             # pooled over the validation samples
    worst_sample: float         # the lowest per-sample figure on the validation data
    eval_worst_sample: float    # the lowest per-sample figure on the evaluation data
    samples: int
    # the label-free metrics the constraints read (cosine:seg, ...), on the validation data
    # (validations stored before they were recorded have none: those constraints are judged by eval)
    metrics: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["metrics"] = dict(self.metrics)
        if not self.metrics:
            del out["metrics"]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Validation:
        return cls(trial=int(d["trial"]), key=str(d["key"]), data=str(d["data"]), metric=str(d["metric"]),
                   accuracy=float(d["accuracy"]), worst_sample=float(d["worst_sample"]),
                   eval_worst_sample=float(d["eval_worst_sample"]), samples=int(d["samples"]),
                   metrics={str(k): float(v) for k, v in (d.get("metrics") or {}).items()})


def stored(study: optuna.Study) -> dict[int, Validation]:
    """trial number -> its stored validation."""
    out = {}
    for k, v in study.user_attrs.items():
        if k.startswith(PREFIX) and k[len(PREFIX):].isdigit() and isinstance(v, dict):
            out[int(k[len(PREFIX):])] = Validation.from_json(v)
    return dict(sorted(out.items()))


def label_free(metric: str) -> str:
    """The metric validation scores: the objective when it needs no labels, else mean_cosine
    (validation samples have no label files)."""
    return metric if ACCURACY.match(metric) else "mean_cosine"


def sample_contents(data: DataSet) -> list[str]:
    """Each sample's content (sha256 over its files' bytes, every input): what makes two samples
    the same sample, whatever their folder or file names."""
    out = []
    for i in range(len(data)):
        h = hashlib.sha256()
        for path in data.sample_files(i):
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        out.append(h.hexdigest())
    return out


def selected_on(data: DataSet, ws: Workspace) -> int:
    """How many of ``data``'s samples the search scores (are eval samples too, by content)."""
    seen = set(sample_contents(ws.eval_data))
    return sum(c in seen for c in sample_contents(data))


def same_as_eval_warning(space: SearchSpace, ws: Workspace) -> str | None:
    """A warning when ``validation_data`` holds samples ``eval_data`` holds too (by content): those
    the search did select on, so they are not held out; None otherwise."""
    if space.validation_data is None:
        return None
    data = dataset_from_config(ws.config.inputs, ws.model.input_shapes, folders=space.validation_data,
                               limit=space.raw.get("validation_limit"))
    n = selected_on(data, ws)
    if n == 0:
        return None
    if n == len(data):
        return ("validation_data holds the same samples as eval_data (by content): the search selects on them, so "
                "nothing is held out and the winners are not validated; give validation_data samples the search "
                "does not score")
    return (f"{n} of validation_data's {len(data)} sample(s) are eval_data samples too (by content): the search "
            "selects on those, so the validation figure is partly selected on; keep validation_data to samples the "
            "search does not score")


def validation_data(space: SearchSpace, ws: Workspace) -> tuple[DataSet, str] | None:
    """The validation samples and what they are, or None when there is nothing the search did
    not select on (``eval_data`` is the calibration data and no ``validation_data`` is given, or
    ``validation_data`` holds the eval samples: :func:`same_as_eval_warning`)."""
    limit = space.raw.get("validation_limit")
    if space.validation_data is not None:
        data = dataset_from_config(ws.config.inputs, ws.model.input_shapes, folders=space.validation_data, limit=limit)
        if selected_on(data, ws) == len(data):
            return None
        return data, "validation_data"
    if space.eval_data is not None and ws.eval_data.fingerprint() != ws.calibration_data.fingerprint() and not (
            len(ws.eval_data) == len(ws.calibration_data)
            and sample_contents(ws.eval_data) == sample_contents(ws.calibration_data)):
        data = ws.calibration_data if limit is None else dataset_from_config(ws.config.inputs, ws.model.input_shapes,
                                                                             limit=limit)
        return data, "the calibration data (not scored by the search)"
    return None


def worst(ev: Evaluation, metric: str) -> float:
    return min(accuracy(s, metric) for s in ev.samples) if ev.samples else float("nan")


class Validator:
    """Scores trials on the validation data with the workspace's statistics and thresholds."""

    def __init__(self, ws: Workspace, data: DataSet, what: str, metric: str, scorer: Scorer | None = None,
                 constraint_metrics: tuple[str, ...] = ()) -> None:
        """``scorer``: the study's (:class:`tuner.study.scorer.Scorer`), else one of its own over ``ws``;
        ``constraint_metrics``: the constraints' metrics (those that need no labels are scored too)."""
        self.ws, self.data, self.what, self.metric = ws, data, what, label_free(metric)
        self.constraint_metrics = tuple(m for m in constraint_metrics if ACCURACY.match(m))
        self.scorer = scorer
        self.fingerprint = data.fingerprint()
        self._sim: Simulator | None = None

    @property
    def simulator(self) -> Simulator:
        if self._sim is None:
            self._sim = self.ws.simulator_on(self.data)
        return self._sim

    def score(self, row: results.Row) -> Validation:
        cand = row.trial_record.candidate
        if self.scorer is not None:
            ev, on_eval = self.scorer.per_sample(cand, self.simulator), self.scorer.per_sample(cand)
        else:
            ev = self.simulator.evaluate(cand, per_sample=True)
            on_eval = self.ws.simulator.evaluate(cand, per_sample=True)
        return Validation(trial=row.number, key=row.trial_record.key, data=self.fingerprint, metric=self.metric,
                          accuracy=accuracy(ev.outputs, self.metric), worst_sample=worst(ev, self.metric),
                          eval_worst_sample=worst(on_eval, self.metric), samples=len(self.data),
                          metrics={m: accuracy(ev.outputs, m) for m in self.constraint_metrics})

    def validate(self, study: optuna.Study, rows: list[results.Row],
                 progress: Callable[[int, int], None] | None = None) -> dict[int, Validation]:
        """Validations of ``rows`` (stored ones reused), each new one stored on the study."""
        have = stored(study)
        out = {r.number: have[r.number] for r in rows
               if r.number in have and have[r.number].key == r.trial_record.key and have[r.number].data == self.fingerprint}
        todo = [r for r in rows if r.number not in out]
        for i, r in enumerate(todo):
            v = self.score(r)
            study.set_user_attr(f"{PREFIX}{r.number}", v.to_json())
            out[r.number] = v
            if progress is not None:
                progress(i + 1, len(todo))
        return out


def judged(r: results.Row, v: Validation, objectives: Objectives) -> results.Row:
    """``r`` as its validation figures make it: the accuracy and the label-free constraint metrics
    measured on the validation data (the latency, and metrics that need labels, as on eval), and
    its feasibility under ``objectives`` by them."""
    metrics = {**r.trial_record.metrics(objectives.metric_names_needed), **v.metrics}
    return replace(r, trial_record=replace(r.trial_record, accuracy=v.accuracy),
                   feasible=objectives.feasible(v.accuracy, r.latency_ms, metrics))


def validation_gaps(r: results.Row, v: Validation, objectives: Objectives) -> dict[str, float]:
    """The constraints ``r`` misses on the validation data, each by how much (in its unit)."""
    metrics = {**r.trial_record.metrics(objectives.metric_names_needed), **v.metrics}
    return {m.name: -m.margin for m in objectives.margins(v.accuracy, r.latency_ms, metrics) if m.margin < 0}


def pick(rows: list[results.Row], vals: Mapping[int, Validation], objectives: Objectives) -> results.Row | None:
    """The best of the validated rows by their validation figure (feasibility too: a floor
    applies to the figure best.yaml is chosen by), with :func:`tuner.study.results.best`'s rule."""
    chosen = results.best([judged(r, vals[r.number], objectives) for r in rows if r.number in vals],
                          objectives.mode, objectives.floor)
    return None if chosen is None else next(r for r in rows if r.number == chosen.number)


def usable(vals: Mapping[int, Validation], objectives: Objectives) -> dict[int, Validation]:
    """The validations of the study's own metric (a task metric needs labels the validation
    samples lack: its trials are validated by mean_cosine, which no floor of it applies to)."""
    return {n: v for n, v in vals.items() if v.metric == objectives.accuracy}


def choose_best(rows: list[results.Row], vals: Mapping[int, Validation],
                objectives: Objectives) -> tuple[results.Row | None, str]:
    """best.yaml's trial and the figure it was chosen by ("eval" or "validation").

    By validation unless ``objectives.select: eval``, when validations of the study's metric
    exist (a task metric needs labels the validation samples lack: then by eval). When no
    validated trial meets the constraints on the validation data, the eval figure's choice
    stays, and :func:`held_out` says so (every output shows it)."""
    by_eval = results.best(rows, objectives.mode, objectives.floor)
    use = usable(vals, objectives)
    if objectives.select == "eval" or not use:
        return by_eval, "eval"
    chosen = pick(rows, use, objectives)
    return (chosen, "validation") if chosen is not None else (by_eval, "eval")


@dataclass(frozen=True)
class HeldOut:
    """What the validation data say of the constraints (the floor, ceilings and
    ``objectives.constraints``): whether the trial the eval figure alone picks meets them there,
    which validated trials do, best.yaml's trial, and with none holding, the nearest and what
    would help. Made by :func:`held_out`; every output (the summary, best.yaml's header,
    ``status``/``--json``, the report) shows :meth:`lines`."""

    samples: int                            # validation samples
    metric: str
    eval_choice: int | None                 # the trial the eval figure alone picks
    eval_gaps: Mapping[str, float] | None   # the constraints it misses on validation (empty: it holds; None: not validated)
    holding: tuple[int, ...]                # the validated trials meeting every constraint on validation
    chosen: int | None                      # best.yaml's trial
    chosen_by: str                          # the figure it was chosen by
    select: str | None                      # objectives.select
    closest: int | None = None              # with none holding: the validated trial nearest the constraints there
    closest_gaps: Mapping[str, float] = field(default_factory=dict)
    floor: float | None = None              # objectives.min_accuracy

    @property
    def eval_choice_fails(self) -> bool:
        return bool(self.eval_gaps)

    @property
    def nothing_holds(self) -> bool:
        return not self.holding

    @property
    def chosen_holds(self) -> bool:
        return self.chosen is not None and self.chosen in self.holding

    @property
    def ok(self) -> bool:
        """Nothing to warn about: best.yaml's trial meets the constraints on validation too, and
        so does the eval figure's own choice."""
        return self.chosen_holds and not self.eval_choice_fails

    def header(self) -> str:
        """One line for best.yaml's header (empty when all is well)."""
        if self.ok:
            return ""
        if self.chosen_holds:
            return (f"HELD-OUT CHECK: the eval figure's choice (trial {self.eval_choice}) misses "
                    f"{_gaps(self.eval_gaps or {})} on the {self.samples} validation sample(s); this trial meets "
                    "the constraints there too")
        if self.chosen is not None and self.chosen not in self.holding:
            return (f"HELD-OUT CHECK FAILED: this trial misses {_gaps(self._chosen_gaps())} on the {self.samples} "
                    "validation sample(s) the search did not select on"
                    + ("; no validated trial meets the constraints there" if self.nothing_holds else
                       f"; objectives.select: eval kept it (trial(s) {_list(self.holding)} meet them there)"))
        return ""

    def _chosen_gaps(self) -> Mapping[str, float]:
        if self.chosen == self.eval_choice and self.eval_gaps is not None:
            return self.eval_gaps
        if self.chosen == self.closest:
            return self.closest_gaps
        return {}

    def lines(self) -> list[str]:
        """What the summary, ``status`` and the report say (empty when all is well)."""
        if self.ok:
            return []
        out = []
        where = f"the {self.samples} validation sample(s) the search did not select on ({self.metric})"
        if self.eval_choice_fails:
            out.append(f"held-out check: the eval figure's choice, trial {self.eval_choice}, misses "
                       f"{_gaps(self.eval_gaps or {})} on {where}: it is tuned to the eval samples")
        if self.chosen_holds:
            out.append(f"best.yaml holds trial {self.chosen} instead: the cheapest validated trial that meets the "
                       "constraints on the validation data too")
            return out
        if self.nothing_holds:
            out.append(f"no validated trial meets the constraints on {where}; best.yaml keeps trial {self.chosen} "
                       "(the eval figure's choice), marked as failing there")
            if self.closest is not None:
                out.append(f"closest on validation: trial {self.closest}, misses {_gaps(self.closest_gaps)}")
            out += [f"what would help: {s}" for s in self.advice()]
        elif self.chosen is not None:
            out.append(f"best.yaml holds trial {self.chosen} (objectives.select: {self.select}), which misses "
                       f"{_gaps(self._chosen_gaps())} on the validation data; trial(s) {_list(self.holding)} meet "
                       "the constraints there")
        return out

    def advice(self) -> list[str]:
        out = ["more eval_data samples (the search selects on them; with few, its winners are tuned to them), "
               "then resume"]
        gap = (self.closest_gaps or self.eval_gaps or {}).get("min_accuracy")
        top = accuracy_range(self.metric)
        if self.floor is not None and gap:
            if top is None or self.floor + gap < top[1]:
                out.append(f"a floor with a margin for held-out data: objectives.min_accuracy: "
                           f"{self.floor + gap:.6g} (the floor + the {gap:.2g} the closest misses by on validation), "
                           "so the winners keep room on other samples")
            if set(self.closest_gaps) == {"min_accuracy"}:
                out.append(f"or accept less: objectives.min_accuracy: {self.floor - gap:.6g} holds trial "
                           f"{self.closest} on validation")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "samples": self.samples, "metric": self.metric, "eval_choice": self.eval_choice,
                "eval_choice_fails": self.eval_choice_fails,
                "eval_choice_gaps": None if self.eval_gaps is None else dict(self.eval_gaps),
                "holding": list(self.holding), "nothing_holds": self.nothing_holds, "chosen": self.chosen,
                "chosen_holds": self.chosen_holds, "closest": self.closest,
                "closest_gaps": dict(self.closest_gaps), "lines": self.lines()}


def _gaps(gaps: Mapping[str, float]) -> str:
    return ", ".join(f"{name} by {gap:.3g}" for name, gap in gaps.items()) or "the constraints"


def _list(ns: tuple[int, ...]) -> str:
    return ", ".join(str(n) for n in ns[:8]) + (" ..." if len(ns) > 8 else "")


def held_out(rows: list[results.Row], vals: Mapping[int, Validation], objectives: Objectives,
             best: results.Row | None, chosen_by: str) -> HeldOut | None:
    """The constraints judged on the validation data (:class:`HeldOut`); None without
    constraints (nothing to fail), or without validations of the study's metric."""
    use = usable(vals, objectives)
    if not use or not objectives.margins(1.0, 1.0, {}):
        return None
    by_eval = results.best(rows, objectives.mode, objectives.floor)
    validated = [r for r in rows if r.number in use]
    gaps = {r.number: validation_gaps(r, use[r.number], objectives) for r in validated}
    holding = tuple(r.number for r in validated if not gaps[r.number])
    eval_gaps = None if by_eval is None or by_eval.number not in gaps else gaps[by_eval.number]
    closest, closest_gaps = None, {}
    if not holding and validated:
        def total(r: results.Row) -> tuple[float, float, int]:
            lims = {m.name: m.limit for m in objectives.margins(1.0, 1.0, {})}
            return sum(g / max(abs(lims.get(k) or 1.0), 1e-12) for k, g in gaps[r.number].items()), \
                -use[r.number].accuracy, r.number
        near = min(validated, key=total)
        closest, closest_gaps = near.number, gaps[near.number]
    return HeldOut(samples=next(iter(use.values())).samples, metric=next(iter(use.values())).metric,
                   eval_choice=None if by_eval is None else by_eval.number, eval_gaps=eval_gaps, holding=holding,
                   chosen=None if best is None else best.number, chosen_by=chosen_by, select=objectives.select,
                   closest=closest, closest_gaps=closest_gaps,
                   floor=None if objectives.min_accuracy is None else float(objectives.min_accuracy))
