"""The search's inputs, loaded, checked and fingerprinted once, and the one way to open its study.

A :class:`Problem` is what a study is about: the space file, the base YAML (parsed once: the
exports merge into it), the model, the data, the references its relative constraints scale,
the node sensitivity and the fingerprints a study is tied to. :func:`load_problem` builds it;
nothing reads those files again. Its study is opened in Optuna's style, by module functions:
:func:`create_study` (create, or resume one made from the same inputs), :func:`join_study`
(a worker: the study must exist and be of the same inputs) and :func:`read_study` (status,
export, report: the storage alone).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna

from tuner import __version__
from tuner.cost import CostModel
from tuner.cost.board import check_board, require_board_fit
from tuner.cost.latency import load_fit, load_profile
from tuner.errors import TunerError
from tuner.inputs.config import HbConfig
from tuner.inputs.model import LoadedModel, file_fingerprint
from tuner.study.opening import check_outputs, name_metrics, resume_seed, with_references
from tuner.study.orphans import tag_trials
from tuner.study.record import STUDY_ATTR, Direction, Objectives, StudyInfo
from tuner.study.sections import check_metric_outputs
from tuner.study.space import ResolvedSpace, SearchSpace, load_space, resolve
from tuner.study.storage import (
    FINGERPRINTS,
    HEARTBEAT_S,
    SENSITIVITY_ATTR,
    StudyPaths,
    make_storage,
    open_existing,
    redact,
)
from tuner.study.validation import same_as_eval_warning
from tuner.study.warmstart import Plan, node_sensitivity, warm_start_plans
from tuner.workspace import Workspace, progress_printer

#: A check of the loaded base YAML and model before the statistics pass (``tuner search``'s data check).
InputsCheck = Callable[[HbConfig, LoadedModel], None]


@dataclass(frozen=True)
class Problem:
    """A search's inputs, loaded once (:func:`load_problem`)."""

    space: SearchSpace
    ws: Workspace
    cost: CostModel
    resolved: ResolvedSpace
    objectives: Objectives                      # the space's, with the references its relative bounds scale
    base_raw: Mapping[str, Any]                 # the base YAML as parsed (what exports merge into)
    fingerprints: Mapping[str, str]             # model, data, eval_data, base_config, space
    legacy_space: str                           # the space's fingerprint as studies before floors stored it
    sensitivity: Mapping[str, float] = field(default_factory=dict)
    notices: tuple[str, ...] = ()               # what loading found, for the terminal

    @property
    def mode(self) -> str:
        return self.objectives.mode

    def directions(self) -> list[Direction]:
        return self.objectives.directions()

    def changed_inputs(self, stored: Mapping[str, str]) -> list[str]:
        """The fingerprints of this problem that are not the study's ``stored`` ones. The space's
        may also be of the whole space file (studies made before the floors were left out of it)."""
        return [k for k in FINGERPRINTS if stored.get(k) != self.fingerprints[k]
                and not (k == "space" and stored.get(k) == self.legacy_space)]

    def input_path(self, key: str) -> str:
        """The local file(s) behind a fingerprint, for messages."""
        if key == "model":
            return f"model {self.ws.model.path}"
        if key == "data":
            return "calibration data " + ", ".join(str(i.folder) for i in self.ws.calibration_data.inputs)
        if key == "base_config":
            return f"base YAML {self.space.base}"
        return f"search space {self.space.path} (as resolved on this model)"

    def warm_start_plans(self, manual_calibration: Any = None) -> list[Plan]:
        """See :func:`tuner.study.warmstart.warm_start_plans`."""
        return warm_start_plans(self.resolved, dict(self.sensitivity), manual_calibration)

    def with_sensitivity(self, sensitivity: Mapping[str, float]) -> Problem:
        return replace(self, sensitivity=dict(sensitivity))

    def info(self, name: str) -> StudyInfo:
        return StudyInfo(version=__version__, name=name, objectives=self.objectives,
                         space_path=str(self.space.path.resolve()), base_path=str(self.space.base),
                         march=self.ws.target.march, node_info_supported=self.ws.node_info_supported,
                         fingerprints=dict(self.fingerprints))


def load_problem(space: SearchSpace | str | Path, paths: StudyPaths, storage: str | None = None,
                 threads: int | None = None, quiet: bool = False, sensitivity: Mapping[str, float] | None = None,
                 check: InputsCheck | None = None) -> Problem:
    """Load, check and fingerprint a search's inputs, each file read once. ``sensitivity``: the
    study's stored ranking (a worker joining it), instead of computing one; ``check``: run on the
    base YAML and model before the statistics pass."""
    space = space if isinstance(space, SearchSpace) else load_space(space)
    check_outputs(paths, storage)      # before the statistics pass and the sensitivity ranking
    if space.board:
        check_board(space.board)
    ws = Workspace.for_space(space, threads=threads, check=check,
                             progress=None if quiet else progress_printer("calibration statistics"))
    check_metric_outputs(space.objective, ws.model.output_names)    # before the references and the sensitivity
    base = ws.base_candidate()
    fit = load_fit(ws.model.fingerprint, ws.target.march)
    board = require_board_fit(space.board, ws.target.raw) if space.board else None
    cost = CostModel(ws.graph, ws.target, load_profile(space.profile) if space.profile else None, fit=fit,
                     board=board)
    # what relative constraints scale, measured before the sensitivity pass (a bound that means
    # nothing is one line, not minutes later)
    objectives = with_references(space.objective, ws, cost)
    space.objective = objectives       # the space's readers (warm start, rank) see the same references
    if sensitivity is None:
        sensitivity = {}
        if space.rule.top_k is not None or space.settings.warm_start:
            sensitivity = node_sensitivity(space, ws, paths.sensitivity,
                                           None if quiet else progress_printer("node sensitivity"))
    resolved = resolve(space, ws.graph, ws.target, base, dict(sensitivity))
    n_eval, least = len(ws.eval_data), space.settings.min_eval_samples
    if n_eval < least:
        ws.warnings.append(
            f"eval_data has {n_eval} sample(s), fewer than study.min_eval_samples ({least}): the search selects "
            "on these samples, so its front is tuned to them; add samples, or set validation_data so that the "
            "winners are re-scored on others")
    same = same_as_eval_warning(space, ws)
    if same is not None:
        ws.warnings.append(same)
    fingerprints = {"model": ws.model.fingerprint, "data": ws.calibration_data.fingerprint(),
                    "eval_data": ws.eval_data.fingerprint(), "base_config": file_fingerprint(space.base),
                    "space": resolved.fingerprint()}
    return Problem(space=space, ws=ws, cost=cost, resolved=resolved, objectives=objectives,
                   base_raw=ws.config.raw, fingerprints=fingerprints,
                   legacy_space=resolved.fingerprint(legacy=True), sensitivity=dict(sensitivity),
                   notices=(f"latency: BPU model {fit.describe()} (tuner latency fit)",) if fit is not None else ())


# --------------------------------------------------------------------------- opening its study
@dataclass(frozen=True)
class Place:
    """Where a study lives: its name, results folder and storage, and how its workers are watched."""

    name: str
    paths: StudyPaths
    storage_url: str | None = None
    heartbeat: float | None = None    # database storages: seconds between heartbeats (None: HEARTBEAT_S)
    max_retry: int = 1                # times a trial orphaned by a dead worker is re-queued

    def where(self) -> str:
        return redact(self.storage_url) if self.storage_url else str(self.paths.journal)

    def storage(self) -> optuna.storages.BaseStorage:
        return make_storage(self.storage_url, self.paths, HEARTBEAT_S if self.heartbeat is None else self.heartbeat,
                            self.max_retry)


def sampler(problem: Problem, seed: int | None) -> optuna.samplers.BaseSampler:
    """The space's sampler, recording each trial's worker when the trial is created."""
    kind = problem.space.settings.sampler
    if kind == "random":
        return tag_trials(optuna.samplers.RandomSampler(seed=seed))
    if kind == "nsga2":
        return tag_trials(optuna.samplers.NSGAIISampler(seed=seed))
    # Multivariate TPE models interactions between node decisions (the 5.0 multi-objective
    # default is independent TPE, ~8x slower per trial at 200 parameters); constant_liar keeps
    # parallel workers from proposing the same candidate.
    return tag_trials(optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                                 n_startup_trials=max(10, len(problem.warm_start_plans()))))


def create_study(problem: Problem, place: Place, seed: int | None = None,
                 notices: list[str] | None = None) -> optuna.Study:
    """The problem's study at ``place``: created, or resumed when it exists and was made from the
    same inputs (a changed floor is adopted; ``notices`` gets what changed)."""
    return _open(problem, place, seed, True, notices)


def join_study(problem: Problem, place: Place, seed: int | None = None) -> optuna.Study:
    """A worker's way in: the study must exist and be of this machine's same inputs."""
    return _open(problem, place, seed, False, None)


def read_study(name_or_dir: str, storage: str | None, results_dir: str | Path = "results"
               ) -> tuple[optuna.Study, StudyPaths]:
    """A study read from its storage alone (status, export, report): no model, no data."""
    return open_existing(name_or_dir, storage, results_dir)


def _open(problem: Problem, place: Place, seed: int | None, create: bool, notices: list[str] | None) -> optuna.Study:
    storage = place.storage()
    try:
        study = optuna.load_study(study_name=place.name, storage=storage, sampler=sampler(problem, seed))
    except KeyError:
        if not create:
            raise TunerError(f"no study named {place.name!r} in {place.where()}") from None
        study = optuna.create_study(study_name=place.name, storage=storage, directions=problem.directions(),
                                    sampler=sampler(problem, seed))
        name_metrics(study, problem.objectives)
        study.set_user_attr(STUDY_ATTR, problem.info(place.name).to_json())
        study.set_user_attr(SENSITIVITY_ATTR, dict(problem.sensitivity))
        return study
    blob = study.user_attrs.get(STUDY_ATTR)
    if not blob or not isinstance(blob, dict):
        raise TunerError(f"study {place.name!r} in {place.where()} was not made by tuner; use another --study name")
    before = StudyInfo.from_json(blob)
    _check_same_inputs(problem, place, before.fingerprints, create)
    if [d.name.lower() for d in study.directions] != problem.directions():
        raise TunerError(f"study {place.name!r} optimises {[d.name.lower() for d in study.directions]}, the space "
                         f"asks for {problem.directions()}; use --study NEW_NAME")
    if study.metric_names is None:         # a study made before tuner named its metrics
        name_metrics(study, problem.objectives)
    said = _adopt_floors(study, place.name, before, problem.objectives)
    if said and notices is not None:
        notices.append(said)
    n = len(study.get_trials(deepcopy=False))
    if seed is not None and n:
        # Resuming: a sampler seeded as at the start would make its first proposals again
        # (RandomSampler, TPE's random draws); they come back as duplicates that use up the
        # budget. Seed from (seed, trials so far) instead: reproducible, never a replay.
        study.sampler = sampler(problem, resume_seed(seed, n))
    return study


def _check_same_inputs(problem: Problem, place: Place, stored: Mapping[str, str], create: bool) -> None:
    changed = problem.changed_inputs(stored)
    if not changed:
        return
    mine = problem.fingerprints
    if not create:
        # A worker joining a study: say which of this machine's files differ.
        detail = "; ".join(f"{problem.input_path(k)} (sha256 {mine[k][:12]}) is not the study's "
                           f"{k.replace('_', ' ')} (sha256 {stored.get(k, '?')[:12]})" for k in changed)
        raise TunerError(f"cannot join study {place.name!r}: {detail}; copy the study's files to this machine "
                         "(same model, data, base YAML and space), or point --space at the right space file")
    detail = ", ".join(f"{k} {stored.get(k, '?')[:12]} -> {mine[k][:12]}" for k in changed)
    raise TunerError(f"study {place.name!r} was made from other inputs ({detail}); continuing would mix results "
                     f"of different problems: restore the inputs, or start a new study with --study NEW_NAME")


def _adopt_floors(study: optuna.Study, name: str, before: StudyInfo, new: Objectives) -> str | None:
    """A resumed search whose space changed a floor (``min_accuracy``, ``max_latency_ms``):
    the study's attribute takes the new objectives, so status, export and the report derive
    feasibility from the stored values under the new floor (:func:`tuner.study.results.rows`);
    no trial is re-run and no sensitivity recomputed. Optuna's own ``trial.constraints`` of
    trials already run cannot change (Optuna 5 refuses to modify finished trials): its
    ``best_trials`` keeps the floor each trial ran under. Returns the notice to print."""
    old = before.objectives
    if old == new:
        return None
    changes = [f"{k} {getattr(old, k)} -> {getattr(new, k)}"
               for k in ("min_accuracy", "max_latency_ms", "max_latency_ratio") if getattr(old, k) != getattr(new, k)]
    if old.constraints_ != new.constraints_:
        changes.append(f"constraints [{', '.join(c.name for c in old.constraints_)}] -> "
                       f"[{', '.join(c.name for c in new.constraints_)}]")
    n = len(study.get_trials(deepcopy=False))
    history = list(before.extra.get("floor_changes", [])) + [
        {"at_trial": n, **{k: getattr(new, k) for k in ("min_accuracy", "max_latency_ms")}}]
    extra = {**before.extra, "floor_changes": history}
    study.set_user_attr(STUDY_ATTR, replace(before, objectives=new, extra=extra).to_json())
    return (f"study {name!r}: {', '.join(changes) or 'objectives changed'}; feasibility of its "
            f"{n} trial(s) is derived again from their stored values (nothing is re-run)")
