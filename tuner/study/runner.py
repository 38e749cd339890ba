"""The search: an Optuna study over a resolved space, run, resumed and exported as it goes.

``Search`` loads everything once (workspace, cost model, sensitivity, decisions), then
creates or resumes the study (refusing to resume one made from other inputs), enqueues the
baselines, and optimises. After every completed trial that changes the result, ``best.yaml``
and ``pareto/`` are rewritten atomically, so a run stopped at 3 a.m. still leaves the best
configuration found so far.
"""

from __future__ import annotations

import csv
import io
import math
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any, cast

import optuna
from optuna.storages import JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock
from optuna.trial import TrialState

from tuner import __version__
from tuner.candidate import Calibration, Candidate
from tuner.cost import CostModel
from tuner.cost.latency import load_profile
from tuner.errors import TunerError
from tuner.export.hb_yaml import check_rules, dump_yaml, merged_config, write_atomic
from tuner.inputs.model import file_fingerprint
from tuner.metrics.accuracy import accuracy
from tuner.sensitivity import cached_sensitivity, leave_one_float
from tuner.study import results
from tuner.study.space import ResolvedSpace, SearchSpace, load_space, parse_duration, resolve
from tuner.workspace import Workspace

STUDY_ATTR = "tuner"
SENSITIVITY_ATTR = "tuner_sensitivity"  # the node ranking the space was resolved with (workers reuse it)
FINGERPRINTS = ("model", "data", "base_config", "space")


@dataclass
class StudyPaths:
    root: Path

    @property
    def journal(self) -> Path:
        return self.root / "study.journal"

    @property
    def best(self) -> Path:
        return self.root / "best.yaml"

    @property
    def pareto(self) -> Path:
        return self.root / "pareto"

    @property
    def sensitivity(self) -> Path:
        return self.root / "sensitivity.json"

    @property
    def trials_csv(self) -> Path:
        return self.root / "trials.csv"

    @property
    def report(self) -> Path:
        return self.root / "report.html"


#: Seconds between a worker's heartbeats in a database storage; a RUNNING trial whose worker
#: has been silent for GRACE_FACTOR heartbeats is failed (and retried) by the next worker to ask.
HEARTBEAT_S = 20
GRACE_FACTOR = 3


def make_storage(url: str | None, paths: StudyPaths, heartbeat: float | None = HEARTBEAT_S,
                 max_retry: int = 1) -> Any:
    """Default: an Optuna journal file in the study folder (multi-process safe, cheap writes);
    else any Optuna storage URL (sqlite:///..., postgresql://...) or a journal file path.

    Database storages get Optuna's heartbeat: a worker killed with ``kill -9`` or a machine
    lost mid-trial leaves a trial whose heartbeat stops, and the next worker to start a trial
    marks it failed and re-queues it (``max_retry`` times). Journal files have no heartbeat in
    Optuna; their orphans are found by process id instead (:mod:`tuner.study.orphans`)."""
    if url is None:
        paths.root.mkdir(parents=True, exist_ok=True)
        return journal_storage(paths.journal)
    if "://" in url:
        from tuner.study.orphans import rdb_heartbeat_kwargs

        kwargs = rdb_heartbeat_kwargs(heartbeat, GRACE_FACTOR, max_retry)
        engine = {"connect_args": {"timeout": 30}} if url.startswith("sqlite") else {"pool_pre_ping": True}
        try:
            return RDBStorage(url, engine_kwargs=engine, **kwargs)
        except Exception as exc:  # bad URL, missing driver, unreachable server
            hint = ("; install the driver: pip install 'tuner[postgres]'"
                    if isinstance(exc, ImportError) and url.startswith("postgres") else "")
            raise TunerError(f"--storage: cannot open {redact(url)}: {type(exc).__name__}: "
                             f"{_redact_text(str(exc), url)}{hint}") from None
    path = Path(url)
    path.parent.mkdir(parents=True, exist_ok=True)
    return journal_storage(path)


def journal_storage(path: Path) -> JournalStorage:
    """A journal file storage that survives ``kill -9`` of a writer.

    The path is made absolute: Optuna's symlink lock stats its target through the link, and a
    relative target resolves against the link's folder, so a stale lock left by a killed
    process was never recognised and the next writer spun forever. A live writer holds the
    lock for milliseconds, so a lock older than 10 s is reclaimed.
    """
    path = path.resolve()
    lock = JournalFileSymlinkLock(str(path), grace_period=10)
    return JournalStorage(JournalFileBackend(str(path), lock_obj=lock))


def redact(url: str) -> str:
    """A storage URL without its password, for messages and reports."""
    if "://" in url and "@" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}"
    return url


def _redact_text(text: str, url: str) -> str:
    """``text`` (a driver's error message) with the URL's password replaced."""
    if "://" in url and "@" in url:
        creds = url.split("://", 1)[1].rsplit("@", 1)[0]
        if ":" in creds:
            password = creds.split(":", 1)[1]
            if password:
                text = text.replace(password, "***")
    return text.replace(url, redact(url))


@dataclass
class Search:
    space: SearchSpace
    ws: Workspace
    resolved: ResolvedSpace
    cost: CostModel
    paths: StudyPaths
    name: str
    storage_url: str | None
    sensitivity: dict[str, float] = field(default_factory=dict)
    heartbeat: float | None = None  # database storages: seconds between heartbeats (None: HEARTBEAT_S)
    max_retry: int = 1              # times a trial orphaned by a dead worker is re-queued
    budget: int | None = None       # completed trials the study should end with (set by optimize_until)
    _done: dict[str, tuple[int, list[float], dict[str, Any]]] = field(default_factory=dict)
    _seen: set[int] = field(default_factory=set)
    _last_written: tuple[Any, ...] | None = None
    _last_front: list[tuple[float, float]] = field(default_factory=list)
    _last_best: results.Row | None = None
    _traces: dict[str, Any] = field(default_factory=dict)
    _report_at: float | None = None
    _manual_cal: Calibration | None = None
    _evaluated: dict[str, Any] = field(default_factory=dict)  # baselines evaluated before their trials ran

    def _may_change(self, trial: optuna.trial.FrozenTrial) -> bool:
        rec = trial.user_attrs.get(results.RECORD)
        if not rec or "duplicate_of" in rec or any(v > 0 for v in (trial.constraints or {}).values()):
            return False
        acc, lat = rec["accuracy"], rec["latency"]["total_ms"]
        return not any(a >= acc and t <= lat and (a > acc or t < lat) for a, t in self._last_front)

    # ---------------------------------------------------------------- set-up
    @classmethod
    def open(cls, space_path: str | Path, name: str | None = None, storage: str | None = None,
             results_dir: str | Path = "results", threads: int | None = None, quiet: bool = False,
             sensitivity: dict[str, float] | None = None) -> "Search":
        """``sensitivity``: the study's stored ranking (a worker joining it), instead of computing one."""
        from tuner.workspace import progress_printer

        space = load_space(space_path)
        name = name or space.name
        paths = StudyPaths(Path(results_dir) / name)
        ws = Workspace.for_space(space, threads=threads,
                                 progress=None if quiet else progress_printer("calibration statistics"))
        base = ws.base_candidate()
        cost = CostModel(ws.graph, ws.target, load_profile(space.profile) if space.profile else None)
        if sensitivity is None:
            sensitivity = {}
            if space.nodes["top_k"] is not None or space.study["warm_start"]:
                sensitivity = node_sensitivity(space, ws, paths, quiet)
        resolved = resolve(space, ws.graph, ws.target, base, sensitivity)
        return cls(space=space, ws=ws, resolved=resolved, cost=cost, paths=paths, name=name, storage_url=storage,
                   sensitivity=sensitivity)

    def fingerprints(self) -> dict[str, str]:
        return {"model": self.ws.model.fingerprint, "data": self.ws.calibration_data.fingerprint(),
                "eval_data": self.ws.eval_data.fingerprint(), "base_config": file_fingerprint(self.space.base),
                "space": self.resolved.fingerprint()}

    @property
    def mode(self) -> str:
        return str(self.space.objectives["mode"])

    def directions(self) -> list[Any]:
        return {"pareto": ["maximize", "minimize"], "accuracy": ["maximize"], "latency": ["minimize"]}[self.mode]

    def sampler(self, seed: int | None) -> optuna.samplers.BaseSampler:
        """The space's sampler, recording each trial's worker when the trial is created."""
        from tuner.study.orphans import tag_trials

        kind = self.space.study["sampler"]
        if kind == "random":
            return tag_trials(optuna.samplers.RandomSampler(seed=seed))
        if kind == "nsga2":
            return tag_trials(optuna.samplers.NSGAIISampler(seed=seed))
        # Multivariate TPE models interactions between node decisions (the 5.0 multi-objective
        # default is independent TPE, ~8x slower per trial at 200 parameters); constant_liar keeps
        # parallel workers from proposing the same candidate.
        return tag_trials(optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                                     n_startup_trials=max(10, len(self.warm_start_plans()))))

    def study(self, seed: int | None = None, create: bool = True) -> optuna.Study:
        storage = make_storage(self.storage_url, self.paths, HEARTBEAT_S if self.heartbeat is None else self.heartbeat,
                               self.max_retry)
        attrs: dict[str, Any] = {"version": __version__, "name": self.name, "mode": self.mode,
                 "objectives": self.space.objectives, "space_path": str(self.space.path.resolve()),
                 "base_path": str(self.space.base), "march": self.ws.target.march,
                 "node_info_supported": self.ws.node_info_supported, "fingerprints": self.fingerprints()}
        try:
            study = optuna.load_study(study_name=self.name, storage=storage, sampler=self.sampler(seed))
        except KeyError:
            if not create:
                raise TunerError(f"no study named {self.name!r} in {self._where()}") from None
            study = optuna.create_study(study_name=self.name, storage=storage, directions=self.directions(),
                                        sampler=self.sampler(seed))
            study.set_user_attr(STUDY_ATTR, attrs)
            study.set_user_attr(SENSITIVITY_ATTR, self.sensitivity)
            return study
        stored = study.user_attrs.get(STUDY_ATTR)
        if not stored:
            raise TunerError(f"study {self.name!r} in {self._where()} was not made by tuner; use another --study name")
        changed = [k for k in FINGERPRINTS if stored["fingerprints"].get(k) != attrs["fingerprints"][k]]
        if changed and not create:
            # A worker joining a study: say which of this machine's files differ.
            detail = "; ".join(f"{self._input_path(k)} (sha256 {attrs['fingerprints'][k][:12]}) is not the study's "
                               f"{k.replace('_', ' ')} (sha256 {str(stored['fingerprints'].get(k, '?'))[:12]})"
                               for k in changed)
            raise TunerError(f"cannot join study {self.name!r}: {detail}; copy the study's files to this machine "
                             "(same model, data, base YAML and space), or point --space at the right space file")
        if changed:
            detail = ", ".join(f"{k} {stored['fingerprints'].get(k, '?')[:12]} -> {attrs['fingerprints'][k][:12]}"
                               for k in changed)
            raise TunerError(f"study {self.name!r} was made from other inputs ({detail}); continuing would mix results "
                             f"of different problems: restore the inputs, or start a new study with --study NEW_NAME")
        if [d.name.lower() for d in study.directions] != self.directions():
            raise TunerError(f"study {self.name!r} optimises {[d.name.lower() for d in study.directions]}, the space "
                             f"asks for {self.directions()}; use --study NEW_NAME")
        n = len(study.get_trials(deepcopy=False))
        if seed is not None and n:
            # Resuming: a sampler seeded as at the start would make its first proposals again
            # (RandomSampler, TPE's random draws); they come back as duplicates that use up the
            # budget. Seed from (seed, trials so far) instead: reproducible, never a replay.
            study.sampler = self.sampler(_resume_seed(seed, n))
        return study

    def _input_path(self, key: str) -> str:
        """The local file(s) behind a fingerprint, for messages."""
        if key == "model":
            return f"model {self.ws.model.path}"
        if key == "data":
            return "calibration data " + ", ".join(str(i.folder) for i in self.ws.calibration_data.inputs)
        if key == "base_config":
            return f"base YAML {self.space.base}"
        return f"search space {self.space.path} (as resolved on this model)"

    def _where(self) -> str:
        return redact(self.storage_url) if self.storage_url else str(self.paths.journal)

    # ---------------------------------------------------------------- warm start
    def warm_start_plans(self, manual_calibration: Calibration | None = None) -> list[tuple[str, dict[str, Any]]]:
        """Baselines first: all-BPU int8 under each calibration, then the usual manual fixes under
        ``manual_calibration`` (default: the reference calibration of the sensitivity ranking)."""
        r = self.resolved
        c = self.space.calibration
        plans: list[tuple[str, dict[str, Any]]] = []
        seen = set()

        def add(label: str, params: dict[str, Any]) -> None:
            key = r.candidate(params).key()
            if key not in seen:
                seen.add(key)
                plans.append((label, params))

        pcts = [p for p in c["max_percentile"] if float(p) < 1.0]
        for ctype in c["calibration_type"]:
            for pc in (c["per_channel"] if ctype in ("max", "kl") else [False]):
                cal = Calibration(type=ctype, per_channel=pc)
                add(f"baseline: all-BPU int8, {cal.describe()}", r.params_for(cal))
                if ctype == "max" and pcts:
                    cal = Calibration(type="max", max_percentile=float(pcts[-1]), per_channel=pc)
                    add(f"baseline: all-BPU int8, {cal.describe()}", r.params_for(cal))
        if not self.space.study["warm_start"] or not self.sensitivity:
            return plans
        ref = manual_calibration or _reference_calibration(self.space, r.base)
        by_param = {n: d for d in r.decisions for n in d.nodes}
        ranked = [n for n in sorted(self.sensitivity, key=lambda n: -self.sensitivity[n]) if n in by_param]
        for k in (1, 3, 5):
            choices = {}
            for n in ranked:
                d = by_param[n]
                for want in ("BPU:int16", "BPU:int16_input"):
                    if want in d.choices:
                        choices[d.param] = want
                        break
                if len(choices) >= k:
                    break
            if choices:
                add(f"manual: {len(choices)} most sensitive node(s) int16", r.params_for(ref, choices))
        order = {n.name: i for i, n in enumerate(self.ws.graph)}
        tail_start = int(0.8 * len(order))
        tail = [n for n in ranked if order[n] >= tail_start and "CPU" in by_param[n].choices]
        for k in (1, 2):
            if len(tail) >= k:
                add(f"manual: {k} most sensitive tail node(s) on CPU",
                    r.params_for(ref, {by_param[n].param: "CPU" for n in tail[:k]}))
        return plans

    def manual_calibration(self) -> Calibration:
        """The calibration of the manual warm-start plans: the most accurate of the baselines'
        all-int8 calibrations, as a user (and Horizon's recipe) starts from the best one. The
        base YAML's can be far worse (PP-OCRv4 det: max per-tensor 0.948 vs per-channel 0.997),
        and int16 on a few nodes cannot make up for it. Costs one evaluation per baseline."""
        if self._manual_cal is None:
            r = self.resolved
            best, best_acc = _reference_calibration(self.space, r.base), -math.inf
            for label, params in self.warm_start_plans():
                if not label.startswith("baseline"):
                    continue    # the manual plans are built from this choice, not part of it
                cand = r.candidate(params)
                try:
                    ev = self.ws.simulator.evaluate(cand)
                    self._evaluated[cand.key()] = ev     # its enqueued trial takes it, not a second run
                    acc = accuracy(ev.outputs, self.space.objectives["accuracy"], ev.task)
                except Exception:  # its trial records the error; it just cannot be the best
                    continue
                if math.isfinite(acc) and acc > best_acc:
                    best, best_acc = cand.calibration, acc
            self._manual_cal = best
        return self._manual_cal

    def enqueue_warm_start(self, study: optuna.Study) -> int:
        if study.get_trials(deepcopy=False):
            return 0
        plans = self.warm_start_plans(self.manual_calibration() if self.space.study["warm_start"] and self.sensitivity
                                      else None)
        for label, params in plans:
            study.enqueue_trial(params, user_attrs={"plan": label}, skip_if_exists=True)
        return len(plans)

    # ---------------------------------------------------------------- trials
    def clean_zombies(self, study: optuna.Study, pids: list[int] | None = None) -> list[int]:
        """RUNNING trials whose worker process on this host is gone -> FAIL (re-queued ``max_retry`` times)."""
        from tuner.study.orphans import reap

        return reap(study, self.max_retry, pids)

    def fail_own_running(self, study: optuna.Study) -> None:
        """After an abort: this process's trials still RUNNING become FAIL (storage consistent)."""
        host, pid = socket.gethostname(), os.getpid()
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            w = t.user_attrs.get("worker") or {}
            if w.get("host") == host and w.get("pid") == pid:
                try:
                    study.tell(t.number, state=TrialState.FAIL)
                except Exception:
                    pass

    def load_done(self, study: optuna.Study) -> None:
        """Index the completed trials not indexed yet by candidate key (incremental: other
        workers' trials arrive between calls; the storage is read, not re-simulated)."""
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.number in self._seen:
                continue
            self._seen.add(t.number)
            rec = t.user_attrs.get(results.RECORD)
            if rec and t.values is not None and "duplicate_of" not in rec:
                self._done.setdefault(rec["key"], (t.number, list(t.values), rec))

    def lookup(self, study: optuna.Study, key: str) -> tuple[int, list[float], dict[str, Any]] | None:
        """The stored result of a candidate already evaluated, by this worker or any other."""
        if key not in self._done:
            self.load_done(study)
        return self._done.get(key)

    def objective(self, trial: optuna.Trial) -> list[float] | float:
        # Who runs this trial is recorded by the study's sampler when the trial is created
        # (``tag_trials`` in :meth:`sampler`; a trial of a dead process is an orphan, see orphans.py).
        if self.budget is not None and _surplus(trial, self.budget):
            raise optuna.TrialPruned("the budget was reached by other workers' trials")
        r = self.resolved
        params = {d.param: trial.suggest_categorical(d.param, list(d.choices)) for d in r.decisions}
        for name, values in r.calibration_params.items():
            params[name] = trial.suggest_categorical(name, values)
        cand = r.candidate(params)
        key = cand.key()
        obj = self.space.objectives
        hit = self.lookup(trial.study, key)
        if hit is not None:
            # The same configuration was already simulated (here or by another worker):
            # answer from the stored result.
            number, values, source = hit
            self._constrain(trial, source["accuracy"], source["latency"]["total_ms"])
            trial.set_user_attr(results.RECORD, dict(source, duplicate_of=number))
            return values if len(values) > 1 else values[0]
        try:
            ev = self._evaluated.pop(key, None) or self.ws.simulator.evaluate(cand)
            acc = accuracy(ev.outputs, obj["accuracy"], ev.task)
            if not math.isfinite(acc):
                raise FloatingPointError(f"accuracy is {acc}")
        except Exception as exc:
            trial.set_user_attr("error", f"{type(exc).__name__}: {exc}")
            raise
        lat = self.cost.latency(ev.plan)
        record = {"key": key, "accuracy": acc, "outputs": ev.outputs, "task": ev.task, "latency": lat.as_dict(),
                  "counts": ev.counts(),
                  "calibration": {"method": ev.calibration.describe(), "requested": cand.calibration.describe()},
                  "candidate": cand.to_yaml_fields(), "cpu_nodes": ev.plan.cpu_nodes, "notes": ev.notes[:20],
                  "seconds": ev.seconds}
        trial.set_user_attr(results.RECORD, record)
        self._constrain(trial, acc, lat.total_ms)
        values = {"pareto": [acc, lat.total_ms], "accuracy": [acc], "latency": [lat.total_ms]}[self.mode]
        self._done[key] = (trial.number, values, record)
        self._seen.add(trial.number)
        return values if len(values) > 1 else values[0]

    def _constrain(self, trial: optuna.Trial, acc: float, lat_ms: float) -> None:
        obj = self.space.objectives
        if obj["min_accuracy"] is not None:
            trial.set_constraint("min_accuracy", float(obj["min_accuracy"]) - acc)
        if obj["max_latency_ms"] is not None:
            trial.set_constraint("max_latency_ms", lat_ms - float(obj["max_latency_ms"]))

    # ---------------------------------------------------------------- anytime results
    def write_results(self, study: optuna.Study, force: bool = False,
                      trial: optuna.trial.FrozenTrial | None = None) -> results.Row | None:
        """Rewrite best.yaml, pareto/ and trials.csv when the result changed.

        With the just-finished ``trial``: a trial that is infeasible, a repeat, or strictly
        dominated by the last written front cannot change the front or the best, so the study
        is not re-read (that read grows with the study and would run after every trial)."""
        if not force and trial is not None and self._last_written is not None and not self._may_change(trial):
            return self._last_best
        rows = results.rows(study)
        front = results.pareto(rows)
        best = results.best(rows, self.mode, self.space.objectives["min_accuracy"])
        self._last_front = [(r.accuracy, r.latency_ms) for r in front]
        self._last_best = best
        state = (best.number if best else None, tuple(r.number for r in front))
        if not force and state == self._last_written:
            return best
        self._last_written = state
        if best is not None:
            self.export(best, self.paths.best)
        self.paths.pareto.mkdir(parents=True, exist_ok=True)
        keep = set()
        for r in front:
            out = self.paths.pareto / f"trial_{r.number:05d}.yaml"
            keep.add(out.name)
            if not out.exists():
                self.export(r, out)
        for old in self.paths.pareto.glob("trial_*.yaml"):
            if old.name not in keep:
                old.unlink(missing_ok=True)
        write_atomic(self.paths.trials_csv, trials_csv(rows))
        return best

    # ---------------------------------------------------------------- report
    def traces(self, rs: list[results.Row]) -> list[Any]:
        """Per-node cosine along the graph for the exported trial and the all-int8 baseline
        (two evaluations with every node's output; cached by candidate, so a rewrite that
        does not change the best costs nothing)."""
        from tuner.report.html import Trace

        want: list[tuple[str, int | None, Any]] = []
        best = results.best(rs, self.mode, self.space.objectives["min_accuracy"])
        if best is not None:
            want.append((f"trial {best.number} (exported)", best.number, best.record["candidate"]))
        base = [r for r in rs if r.plan and r.plan.startswith("baseline")]
        if base:
            b = min(base, key=lambda r: r.number)
            want.append((f"all-BPU int8 baseline ({b.calibration}, trial {b.number})", b.number, b.record["candidate"]))
        else:
            ref = self.resolved.candidate(self.resolved.params_for(_reference_calibration(self.space,
                                                                                           self.resolved.base)))
            want.append(("all-BPU int8 baseline", None, ref.to_yaml_fields()))
        out = []
        for label, number, fields in want:
            cand = Candidate.from_yaml_fields(fields)
            key = cand.key()
            if key not in self._traces:
                self._traces[key] = self.ws.simulator.evaluate(cand, per_node=True)
            out.append(Trace.from_evaluation(label, number, self._traces[key]))
        return out

    def write_report(self, study: optuna.Study, force: bool = False, every: float = 30.0) -> Path | None:
        """Rewrite ``report.html`` (at most every ``every`` seconds, or ten times as long as the
        last one took, unless ``force``). A report that fails to draw is a warning, never the end
        of an overnight search."""
        now = time.monotonic()
        if not force and self._report_at is not None and now < self._report_at:
            return None
        self._report_at = now + every
        try:
            out = study_report(study, self.paths, self._where(), self)
            # On a big model the per-node traces take seconds: keep the report under ~10% of the search.
            self._report_at = max(self._report_at, now + 10 * (time.monotonic() - now))
            return out
        except TunerError:
            raise
        except Exception as exc:
            _say(f"warning: report.html not written: {type(exc).__name__}: {exc}", None)
            return None

    def export(self, row: results.Row, out: Path) -> list[str]:
        return export_trial(row, out, self.space.base, self.ws.node_info_supported, set(self.ws.graph.by_name),
                            {"study": self.name, **self.fingerprints()})


def study_report(study: optuna.Study, paths: StudyPaths, storage: str, search: Search | None = None,
                 notes: list[str] | tuple[str, ...] = ()) -> Path:
    """Write ``paths.report`` from the study. The simulated views (node sensitivity, per-node
    traces) come from ``search``; without one (model or data gone) they are left out."""
    from tuner.report.html import ReportInputs, write_report

    rs = results.rows(study)
    inp = ReportInputs(study=study, info=study_info(study), storage=storage,
                       sensitivity=search.sensitivity if search is not None else {},
                       traces=search.traces(rs) if search is not None and rs else [],
                       best_yaml=paths.best.read_text(encoding="utf-8") if paths.best.is_file() else None,
                       notes=list(notes))
    return write_report(paths.report, inp)


def node_sensitivity(space: SearchSpace, ws: Workspace, paths: StudyPaths, quiet: bool = True) -> dict[str, float]:
    """Leave-one-float gains of the space's free nodes, cached in the study folder and keyed
    by everything they depend on: the search's top-K, its warm start, ``tuner sensitivity
    SPACE`` and the report all read the same file instead of recomputing."""
    from tuner.study.space import free_nodes
    from tuner.workspace import progress_printer

    base = ws.base_candidate()
    metric = space.objectives["accuracy"]
    nodes = free_nodes(space, ws.graph, ws.target)
    ref = Candidate.make(_reference_calibration(space, base), dict(base.nodes), base.optimization)
    key = "|".join([ws.model.fingerprint, ws.calibration_data.fingerprint(), ws.eval_data.fingerprint(),
                    ref.key(), metric, ws.target.march, ",".join(nodes)])
    return cached_sensitivity(
        paths.sensitivity, key,
        lambda: leave_one_float(ws.simulator, ref, nodes, metric,
                                None if quiet else progress_printer("node sensitivity")))


def _resume_seed(seed: int, n_trials: int) -> int:
    import numpy as np

    return int(np.random.SeedSequence([seed, n_trials]).generate_state(1)[0])


def _reference_calibration(space: SearchSpace, base: Candidate) -> Calibration:
    """The calibration the sensitivity ranking and manual plans use: the base YAML's if it is
    an explicit method in the space, else the space's first."""
    c = space.calibration
    if base.calibration.type in ("max", "kl") and base.calibration.type in c["calibration_type"]:
        return Calibration(type=base.calibration.type, max_percentile=base.calibration.max_percentile,
                           per_channel=base.calibration.per_channel if base.calibration.per_channel in c["per_channel"]
                           else c["per_channel"][0])
    ctype = next((t for t in c["calibration_type"] if t in ("max", "kl")), "max")
    return Calibration(type=ctype, per_channel=c["per_channel"][0])


def export_trial(row: results.Row, out: Path, base_path: Path, node_info_supported: bool,
                 node_names: set[str] | None, provenance: dict[str, str]) -> list[str]:
    """Write the trial's hb_mapper YAML to ``out`` (checked, atomic); returns notes."""
    import yaml

    if not base_path.is_file():
        raise TunerError(f"{base_path}: the study's base YAML is gone; it is needed to export (its other fields are kept)")
    base_raw = yaml.safe_load(base_path.read_text(encoding="utf-8"))
    cand = Candidate.from_yaml_fields(row.record["candidate"])
    cfg, notes = merged_config(base_raw, base_path, cand, out, node_info_supported)
    check_rules(cfg, out, node_names)
    rec = row.record
    header = [f"# hb_mapper makertbin config exported by tuner {__version__} from study {provenance.get('study')!r}, "
              f"trial {row.number}",
              f"# simulated accuracy {rec['accuracy']:.6f}, modeled latency {rec['latency']['total_ms']:.3f} ms, "
              f"{rec['counts']['subgraphs']} BPU subgraph(s), {rec['counts']['cpu_nodes']} CPU node(s), "
              f"{rec['counts']['int16_nodes']} int16 node(s); calibration {rec['calibration']['method']}"]
    header += [f"# {k} sha256 {v}" for k, v in provenance.items() if k != "study"]
    header += [f"# note: {n}" for n in notes]
    write_atomic(out, "\n".join(header) + "\n" + dump_yaml(cfg), protect=(base_path,))
    return notes


def trials_csv(rows: list[results.Row]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    task = list(dict.fromkeys(k for r in rows for k in r.record.get("task", {})))
    w.writerow(["trial", "accuracy", "latency_ms", "feasible", "subgraphs", "cpu_nodes", "int16_nodes"] + task
               + ["calibration", "plan"])
    for r in sorted(rows, key=lambda r: r.number):
        values = [f"{r.record['task'][k]:.6f}" if k in r.record.get("task", {}) else "" for k in task]
        w.writerow([r.number, f"{r.accuracy:.6f}", f"{r.latency_ms:.4f}", r.feasible, r.counts["subgraphs"],
                    r.counts["cpu_nodes"], r.counts["int16_nodes"]] + values + [r.calibration, r.plan or ""])
    return buf.getvalue()


def study_info(study: optuna.Study) -> dict[str, Any]:
    info = study.user_attrs.get(STUDY_ATTR)
    if not info:
        raise TunerError(f"study {study.study_name!r} was not made by tuner")
    return cast(dict[str, Any], info)


def open_existing(name_or_dir: str, storage: str | None, results_dir: str | Path = "results") -> tuple[optuna.Study, StudyPaths]:
    """A study by name (``results/<name>``) or by its folder, for status and export."""
    p = Path(name_or_dir)
    if p.is_dir() and (p / "study.journal").exists() and storage is None:
        paths = StudyPaths(p)
        name = p.name
    else:
        paths = StudyPaths(Path(results_dir) / name_or_dir)
        name = name_or_dir
        if storage is None and not paths.journal.exists():
            raise TunerError(f"no study {name_or_dir!r}: {paths.journal} does not exist (pass --storage URL for a "
                             "study in a database)")
    return _load_study(name, storage, paths), paths


def _load_study(name: str, storage: str | None, paths: StudyPaths, hint: str = "",
                heartbeat: float | None = HEARTBEAT_S) -> optuna.Study:
    """The study ``name`` in ``storage`` (default: the journal in ``paths``), or one line naming
    the studies that storage does hold (then ``hint``)."""
    stor = make_storage(storage, paths, heartbeat=heartbeat)
    try:
        return optuna.load_study(study_name=name, storage=stor)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(stor)]
        raise TunerError(f"no study named {name!r} in {redact(storage) if storage else paths.journal}; "
                         f"it has {', '.join(names) or 'none'}{hint}") from None


def join_study(name: str, storage: str | None, space: str | Path | None = None, results_dir: str | Path = "results",
               threads: int | None = None, heartbeat: float | None = None, max_retry: int = 1,
               quiet: bool = True) -> Search:
    """A worker's view of an existing study, made from this machine's files.

    The space file is the one given, else the path the study recorded (the same machine, or
    the same layout). Its model, data, base YAML and resolved space are fingerprinted here and
    compared with the study's: a worker with other inputs would add results of another problem."""
    paths = StudyPaths(Path(results_dir) / name)
    if storage is None and not paths.journal.exists():
        raise TunerError(f"no study {name!r}: {paths.journal} does not exist; pass --storage URL (the study's "
                         "database) or --results-dir")
    study = _load_study(name, storage, paths, " (start it with 'tuner search SPACE --storage URL')", heartbeat=None)
    info = study_info(study)
    space_path = Path(space) if space is not None else Path(info["space_path"])
    if not space_path.is_file():
        raise TunerError(f"the study's space file {space_path} is not on this machine; pass --space PATH to this "
                         "machine's copy (with the model, data and base YAML beside it as on the first machine)")
    _check_files_early(name, space_path, info.get("fingerprints", {}))
    search = Search.open(space_path, name, storage, results_dir, threads, quiet=quiet,
                         sensitivity=study.user_attrs.get(SENSITIVITY_ATTR))
    search.heartbeat, search.max_retry = heartbeat, max_retry
    return search


def _check_files_early(name: str, space_path: Path, stored: dict[str, str]) -> None:
    """The model and base YAML are compared before the workspace is built (calibration
    statistics of a big model take minutes); data and the resolved space are checked after."""
    from tuner.inputs.config import load_config

    space = load_space(space_path)
    files = {"base_config": ("base YAML", space.base)}
    files["model"] = ("model", load_config(space.base).onnx_model)
    for key, (what, path) in files.items():
        have = file_fingerprint(path) if path is not None and path.is_file() else "missing"
        if key in stored and have != stored[key]:
            raise TunerError(f"cannot join study {name!r}: {what} {path} (sha256 {have[:12]}) is not the study's "
                             f"{what} (sha256 {stored[key][:12]}); copy the study's files to this machine (same "
                             "model, data, base YAML and space), or point --space at the right space file")


def duration(text: Any) -> float | None:
    return parse_duration(text, "--timeout")


def run(search: Search, n_trials: int, timeout: float | None, jobs: int, seed: int | None,
        progress: bool = True) -> tuple[optuna.Study, dict[str, Any]]:
    """Create or resume the study and optimise until it holds ``n_trials`` completed trials."""
    study = search.study(seed)
    zombies = _reap_dead(search, study)
    enqueued = search.enqueue_warm_start(study)
    search.load_done(study)
    done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    info: dict[str, Any] = {"zombies": zombies, "enqueued": enqueued, "completed_before": done, "interrupted": False}
    bar = _progress(n_trials, done, timeout) if progress else None

    def on_trial(st: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.state == TrialState.COMPLETE:
            best = search.write_results(st, trial=trial)
            search.write_report(st)
            if bar is not None:
                bar.update(1)
                if best is not None:
                    bar.set_postfix_str(f"best #{best.number}: acc {best.accuracy:.4f}, {best.latency_ms:.3f} ms")
        elif trial.state == TrialState.FAIL:
            info["failed"] = info.get("failed", 0) + 1
            if "error" in trial.user_attrs:
                _say(f"trial {trial.number} failed: {trial.user_attrs['error']}", bar)
            streak = 0
            for t in reversed(st.get_trials(deepcopy=False)):
                if t.state == TrialState.FAIL:
                    streak += 1
                elif t.state == TrialState.COMPLETE:
                    break
            if streak >= 20:
                info["stopped"] = f"20 trials in a row failed (last: {trial.user_attrs.get('error', '?')})"
                st.stop()

    try:
        if n_trials > done:
            if jobs <= 1:
                optimize_until(search, study, n_trials, timeout, [on_trial], lambda: "stopped" in info)
            else:
                info["zombies"] += _run_workers(search, study, n_trials, timeout, jobs, seed, bar)
    except KeyboardInterrupt:
        info["interrupted"] = True
    except Exception:
        # An interrupt that lands inside Optuna's own trial bookkeeping can surface as another
        # exception (optuna 5.0 _run_trial: UnboundLocalError); it is still the user's stop.
        if not STOP.is_set():
            raise
    finally:
        if bar is not None:
            bar.close()
    if STOP.is_set():
        info["interrupted"] = True
        search.fail_own_running(study)
    search.write_results(study, force=True)
    search.write_report(study, force=True)
    return study, info


#: Set by the first Ctrl-C / SIGTERM: the study stops after the running trial.
STOP = threading.Event()


def install_stop_handlers(say: Callable[[str], None] | None = None) -> None:
    """First Ctrl-C or SIGTERM: finish the running trial, then stop. Second: abort it now.

    A KeyboardInterrupt raised at an arbitrary point can land inside Optuna's bookkeeping; a
    flag checked between trials cannot, so the common case leaves nothing half-written.
    """
    import signal

    def handler(signum: int, frame: Any) -> None:
        if STOP.is_set():
            raise KeyboardInterrupt
        STOP.set()
        if say:
            say("stopping after the running trial (Ctrl-C again to abort it)")

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _say(text: str, bar: Any) -> None:
    import sys

    if bar is not None and not bar.disable:
        bar.write(text, file=sys.stderr)
    else:
        print(text, file=sys.stderr)


def _progress(total: int, done: int, timeout: float | None) -> Any:
    from tqdm import tqdm

    import sys

    return tqdm(total=total, initial=min(done, total), unit="trial", file=sys.stderr, dynamic_ncols=True,
                disable=not sys.stderr.isatty(), desc="trials")


def _reap_dead(search: Search, study: optuna.Study) -> list[int]:
    """Orphans of dead processes on this host, for storages without Optuna's heartbeat (journal
    files). A database storage with heartbeats is left to them: another machine may share this
    host name, and its live workers' process ids mean nothing here."""
    from tuner.study.orphans import stale_enabled

    return [] if stale_enabled(study) else search.clean_zombies(study)


def _surplus(trial: optuna.Trial, budget: int) -> bool:
    """Whether this just-started trial is one too many: the completed trials and the running
    ones started before it (lower numbers) already fill the budget. Two workers that passed
    the budget gate at the same moment both start a trial; the later-numbered one gives way."""
    ts = trial.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
    n = sum(t.state == TrialState.COMPLETE or t.number < trial.number for t in ts)
    if n < budget:
        return False
    fixed = trial.study._storage.get_trial_system_attrs(trial._trial_id).get("fixed_params")
    if fixed:  # an enqueued trial (warm start, retry): put it back for when a slot frees up
        trial.study.enqueue_trial(fixed, user_attrs={k: v for k, v in trial.user_attrs.items() if k != "worker"})
    return True


def _may_start(search: Search, study: optuna.Study, n_trials: int, deadline: float | None = None,
               poll: float = 0.5) -> bool:
    """Wait until a trial may start: True when the completed and running trials leave room in the
    budget, False once the study holds ``n_trials`` completed ones (or a stop was asked for).

    While others' trials fill the budget this worker waits rather than starts one more: one of
    them may fail (or be orphaned, which this loop detects), and then a trial is still needed.
    A running trial whose worker cannot be checked from here (a journal storage, another host)
    is not waited for: this worker leaves the remaining slots to it."""
    from optuna.storages import fail_stale_trials

    from tuner.study.orphans import stale_enabled, unverifiable

    while not STOP.is_set() and (deadline is None or time.monotonic() < deadline):
        ts = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
        complete = sum(t.state == TrialState.COMPLETE for t in ts)
        if complete >= n_trials:
            return False
        if len(ts) < n_trials:
            return True
        heartbeat = stale_enabled(study)
        if not heartbeat and any(unverifiable(t) for t in ts if t.state == TrialState.RUNNING):
            return False
        time.sleep(poll)
        if heartbeat:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fail_stale_trials(study)
        else:
            _reap_dead(search, study)
    return False


def optimize_until(search: Search, study: optuna.Study, n_trials: int, timeout: float | None,
                   callbacks: list[Any], should_stop: Callable[[], bool] = lambda: False) -> None:
    """Run trials until the study holds exactly ``n_trials`` completed ones, with any number of
    workers (processes, machines) doing the same: each trial starts only when the budget has
    room (``_may_start``), and a trial started in a race for the last slot gives way
    (``_surplus``). Optuna's MaxTrialsCallback alone lets every worker finish one more."""
    search.budget = n_trials
    deadline = None if timeout is None else time.monotonic() + timeout
    callbacks = [*callbacks, _reaper(search)]
    while not should_stop() and (deadline is None or time.monotonic() < deadline):
        if not _may_start(search, study, n_trials, deadline):
            break
        study.optimize(search.objective, n_trials=1, catch=(Exception,), callbacks=callbacks, gc_after_trial=False)


def _reaper(search: Search) -> Callable[[optuna.Study, optuna.trial.FrozenTrial], None]:
    """An Optuna callback: after each trial, fail (and re-queue) the trials of dead workers."""
    def callback(st: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        _reap_dead(search, st)

    return callback


def work(search: Search, study: optuna.Study, n_trials: int, timeout: float | None) -> None:
    """One worker's loop on a shared study, until it holds ``n_trials`` completed trials."""
    search.load_done(study)
    _reap_dead(search, study)

    def after(st: optuna.Study, t: optuna.trial.FrozenTrial) -> None:
        if t.state == TrialState.COMPLETE:
            search.write_results(st, trial=t)

    try:
        optimize_until(search, study, n_trials, timeout, [after])
    except KeyboardInterrupt:
        pass
    except Exception:
        if not STOP.is_set():
            raise
    if STOP.is_set():
        search.fail_own_running(study)


def _worker(spec: dict[str, Any]) -> None:
    install_stop_handlers()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        search = Search.open(spec["space"], spec["name"], spec["storage"], spec["results_dir"], spec["threads"],
                             quiet=True)
        search.heartbeat, search.max_retry = spec["heartbeat"], spec["max_retry"]
        study = search.study(spec["seed"], create=False)
    except KeyboardInterrupt:
        return
    work(search, study, spec["n_trials"], spec["timeout"])


def _run_workers(search: Search, study: optuna.Study, n_trials: int, timeout: float | None, jobs: int,
                 seed: int | None, bar: Any) -> list[int]:
    """``jobs`` worker processes on one study (processes, not threads: the simulator is CPU-bound).

    Each worker gets cores // jobs onnxruntime threads, so the workers together do not
    oversubscribe the machine. A worker that dies (``kill -9``, out of memory) has its running
    trial failed and re-queued at once; returns those trial numbers."""
    import multiprocessing as mp

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = search.ws.threads or max(1, cores // jobs)
    ctx = mp.get_context("spawn")
    procs = []
    for i in range(jobs):
        spec = {"space": str(search.space.path), "name": search.name, "storage": search.storage_url,
                "results_dir": str(search.paths.root.parent), "threads": threads,
                "seed": None if seed is None else seed + i, "n_trials": n_trials, "timeout": timeout,
                "heartbeat": search.heartbeat, "max_retry": search.max_retry}
        p = ctx.Process(target=_worker, args=(spec,), daemon=False)
        p.start()
        procs.append(p)
    orphans: list[int] = []
    reaped: set[int] = set()

    def reap_children() -> None:
        dead = [p.pid for p in procs if p.exitcode not in (None, 0) and p.pid is not None and p.pid not in reaped]
        if dead:
            reaped.update(dead)
            search.clean_zombies(study, pids=dead)
            # the dead workers' trials, failed here or already by a surviving worker
            for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
                if (t.user_attrs.get("worker") or {}).get("pid") in dead and "error" not in t.user_attrs:
                    orphans.append(t.number)

    try:
        seen = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
        forwarded = False
        while any(p.is_alive() for p in procs):
            time.sleep(0.5)
            reap_children()
            if STOP.is_set() and not forwarded:
                forwarded = True
                for p in procs:
                    if p.is_alive():
                        p.terminate()  # SIGTERM: each worker finishes its running trial, then stops
            now = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
            if bar is not None and now > seen:
                bar.update(min(now, n_trials) - min(seen, n_trials))
            if now > seen:
                search.write_report(study)     # the workers write best.yaml; the parent the report
            seen = now
    except KeyboardInterrupt:  # second Ctrl-C: abort the workers' trials too
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(30)
        raise
    for p in procs:
        p.join()
    reap_children()
    return orphans


__all__ = ["Search", "StudyPaths", "export_trial", "open_existing", "redact", "run", "study_info", "work"]
