"""What opening a study needs besides the session: the references relative constraints scale,
Optuna's metric names, the seed of a resumed sampler, the writability check, and the output that
writes best_minimal.yaml at the end.

Functions of their arguments (a workspace, a cost model, a study), so :mod:`tuner.study.session`
stays the session's own code.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import optuna

from tuner.candidate import Candidate
from tuner.cost import CostModel
from tuner.errors import DiskFull, TunerError
from tuner.files import check_writable
from tuner.study.record import Objectives
from tuner.study.sections import ACCURACY
from tuner.study.storage import StudyPaths, check_storage
from tuner.workspace import Workspace


def with_references(objectives: Objectives, ws: Workspace, cost: CostModel) -> Objectives:
    """``objectives`` with what its relative constraints scale: the float model's value of each
    relative constraint's metric on the evaluation data, and the all-BPU int8 plan's modeled
    latency for ``max_latency_ratio`` (the base YAML's calibration, no node_info)."""
    refs: dict[str, float] = {}
    rel = [c for c in objectives.constraints_ if c.relative]
    if rel:
        task = ws.simulator.float_task()
        for c in rel:
            if c.metric in task:
                refs[c.metric] = task[c.metric]
            elif ACCURACY.match(c.metric):
                refs[c.metric] = 1.0     # a cosine of float against itself
            if refs.get(c.metric) == 0.0:
                raise TunerError(f"objectives.constraints: {c.name!r}: the float model's {c.metric} is 0 on the "
                                 "evaluation data (no labels for that output?), so a bound relative to it means "
                                 "nothing; give an absolute bound or labels")
    if objectives.max_latency_ratio is not None:
        base = ws.base_candidate()
        int8 = Candidate.make(base.calibration, {}, ())
        refs["latency_ms:int8"] = cost.latency(ws.simulator.plan(int8)).total_ms
    return replace(objectives, references=tuple(sorted(refs.items()))) if refs else objectives


def name_metrics(study: optuna.Study, objectives: Objectives) -> None:
    """Optuna's metric names (experimental since Optuna 3.2, stable in use: the dashboard reads them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(objectives.metric_names())


class AtFinish:
    """A loop output that does its work once, at the end of the search (``finish``). A failure is
    a warning: the search's other results are written."""

    def __init__(self, finish: Callable[[optuna.Study], object]) -> None:
        self._finish = finish

    def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        return None

    def on_progress(self, study: optuna.Study) -> None:
        return None

    def finish(self, study: optuna.Study) -> None:
        try:
            self._finish(study)
        except DiskFull:
            raise
        except Exception as exc:
            print(f"warning: best_minimal.yaml not written: {type(exc).__name__}: {exc}", file=sys.stderr)


def resume_seed(seed: int, n_trials: int) -> int:
    return int(np.random.SeedSequence([seed, n_trials]).generate_state(1)[0])


def check_outputs(paths: StudyPaths, storage: str | None) -> None:
    """The study's folder (best.yaml, pareto/, trials.csv, sensitivity.json, report) and its storage
    can be written: one line now instead of a traceback after minutes of statistics and sensitivity."""
    check_writable(paths.root, "the study's results")
    check_storage(storage, paths, must_exist=False)
