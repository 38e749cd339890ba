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

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import optuna

from tuner.inputs.data import DataSet, dataset_from_config
from tuner.metrics.accuracy import accuracy
from tuner.simulate import Evaluation, Simulator
from tuner.study import results
from tuner.study.record import Objectives
from tuner.study.sections import ACCURACY
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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Validation:
        return cls(trial=int(d["trial"]), key=str(d["key"]), data=str(d["data"]), metric=str(d["metric"]),
                   accuracy=float(d["accuracy"]), worst_sample=float(d["worst_sample"]),
                   eval_worst_sample=float(d["eval_worst_sample"]), samples=int(d["samples"]))


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


def validation_data(space: SearchSpace, ws: Workspace) -> tuple[DataSet, str] | None:
    """The validation samples and what they are, or None when there is nothing the search did
    not select on (``eval_data`` is the calibration data and no ``validation_data`` is given)."""
    limit = space.raw.get("validation_limit")
    if space.validation_data is not None:
        data = dataset_from_config(ws.config.inputs, ws.model.input_shapes, folders=space.validation_data, limit=limit)
        return data, "validation_data"
    if space.eval_data is not None and ws.eval_data.fingerprint() != ws.calibration_data.fingerprint():
        data = ws.calibration_data if limit is None else dataset_from_config(ws.config.inputs, ws.model.input_shapes,
                                                                             limit=limit)
        return data, "the calibration data (not scored by the search)"
    return None


def worst(ev: Evaluation, metric: str) -> float:
    return min(accuracy(s, metric) for s in ev.samples) if ev.samples else float("nan")


class Validator:
    """Scores trials on the validation data with the workspace's statistics and thresholds."""

    def __init__(self, ws: Workspace, data: DataSet, what: str, metric: str, scorer: Scorer | None = None) -> None:
        """``scorer``: the study's (:class:`tuner.study.scorer.Scorer`), else one of its own over ``ws``."""
        self.ws, self.data, self.what, self.metric = ws, data, what, label_free(metric)
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
                          eval_worst_sample=worst(on_eval, self.metric), samples=len(self.data))

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


def pick(rows: list[results.Row], vals: dict[int, Validation], objectives: Objectives) -> results.Row | None:
    """The best of the validated rows by their validation figure (feasibility too: a floor
    applies to the figure best.yaml is chosen by), with :func:`tuner.study.results.best`'s rule."""
    judged = [replace(r, trial_record=replace(r.trial_record, accuracy=vals[r.number].accuracy),
                      feasible=objectives.feasible(vals[r.number].accuracy, r.latency_ms,
                                                   r.trial_record.metrics(objectives.metric_names_needed)))
              for r in rows if r.number in vals]
    chosen = results.best(judged, objectives.mode, objectives.floor)
    return None if chosen is None else next(r for r in rows if r.number == chosen.number)


def choose_best(rows: list[results.Row], vals: dict[int, Validation],
                objectives: Objectives) -> tuple[results.Row | None, str]:
    """best.yaml's trial and the figure it was chosen by ("eval" or "validation").

    By validation unless ``objectives.select: eval``, when validations of the study's metric
    exist (a task metric needs labels the validation samples lack: then by eval)."""
    by_eval = results.best(rows, objectives.mode, objectives.floor)
    usable = {n: v for n, v in vals.items() if v.metric == objectives.accuracy}
    if objectives.select == "eval" or not usable:
        return by_eval, "eval"
    chosen = pick(rows, usable, objectives)
    return (chosen, "validation") if chosen is not None else (by_eval, "eval")
