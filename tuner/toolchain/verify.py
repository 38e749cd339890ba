"""``tuner verify``: run the real toolchain (or a board script) on a study's best trials.

For each chosen trial: export its YAML into ``<study>/verify/trial_NNNNN/`` (with
``working_dir: model_output`` there, so runs do not overwrite each other), run the user's
command in that folder with ``{yaml}`` (also ``{dir}``, ``{trial}``) substituted, then read
what it left: ``hb_mapper_makertbin.log`` in the folder (or a log printed on stdout), and/or
a JSON object printed as the last line of stdout (a board evaluation: ``{"accuracy": 0.71}``,
or keyed by the study's objective, e.g. ``{"miou:seg": 0.71, "latency_ms": 8.2}``).

What is stored (see :mod:`tuner.toolchain.records`): a :class:`RealRecord` under the study
user attribute ``real:N``, with the per-node comparison when a log was read. What is fed back:
when the record holds a real accuracy comparable with the study's objective (the JSON's,
or the log's output cosines for cosine objectives), a COMPLETE trial with the same
parameters and the real value is added (``study.add_trial``), so TPE learns that this
region is worse (or better) than simulated. The simulated trial stays; the sampler then
sees both values for these parameters.

A timeout, a failing command or output without anything usable is recorded for that trial
and the next trial runs.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml

from tuner.errors import TunerError
from tuner.export.hb_yaml import dump_yaml
from tuner.files import write_atomic
from tuner.simulate import Simulator
from tuner.study import results
from tuner.study.outcome import read_outcome
from tuner.study.outputs import export_trial
from tuner.study.space import load_space
from tuner.study.storage import study_info
from tuner.toolchain.compare import Comparison, output_rows
from tuner.toolchain.hblog import HbLog, parse_log, read_log
from tuner.toolchain.hbrun import CompileKnobs, convert
from tuner.toolchain.installed import Toolchain
from tuner.toolchain.logterms import compare_with_log, log_simulator
from tuner.toolchain.realrun import measure
from tuner.toolchain.records import RealRecord, real_record, save_real
from tuner.workspace import Workspace

LOG_NAME = "hb_mapper_makertbin.log"
COSINE_OBJECTIVES = ("mean_cosine", "min_cosine")


# --------------------------------------------------------------------------- running


@dataclass
class RunResult:
    returncode: int | None
    output: str
    seconds: float
    timed_out: bool


def run_command(command: str, cwd: Path, timeout: float | None) -> RunResult:
    """Run ``command`` in a shell in its own process group; on timeout the whole group is killed."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, shell=True, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = proc.communicate()
        timed_out = True
    return RunResult(returncode=None if timed_out else proc.returncode,
                     output=out.decode("utf-8", errors="replace"), seconds=time.perf_counter() - t0,
                     timed_out=timed_out)


def substitute(template: str, yaml_path: Path, folder: Path, number: int) -> str:
    if "{yaml}" not in template:
        raise TunerError("--command must contain {yaml} (the exported YAML's path), e.g. "
                         "--command 'hb_mapper makertbin --config {yaml} --model-type onnx'")
    return (template.replace("{yaml}", shlex.quote(str(yaml_path))).replace("{dir}", shlex.quote(str(folder)))
            .replace("{trial}", str(number)))


def last_json(output: str) -> dict[str, Any] | None:
    """The last line of the output that is a JSON object (a board script's result)."""
    for line in reversed(output.strip().splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def find_log(folder: Path, output: str, log_name: str, started: float) -> HbLog | None:
    """The conversion log the command left: ``folder/log_name`` (written during this run), else stdout."""
    path = folder / log_name
    if path.is_file() and path.stat().st_mtime >= started - 1:
        try:
            return read_log(path)
        except TunerError:
            pass
    try:
        log = parse_log(output, "stdout")
    except TunerError:
        return None
    return log if log.has_tables or log.errors else None


# --------------------------------------------------------------------------- figures


def real_accuracy(objective: str, log: HbLog | None, data: dict[str, Any] | None,
                  producers: Mapping[str, str] | None = None) -> tuple[float | None, str | None]:
    """A real value comparable with the study's accuracy objective, and where it came from.
    ``producers`` (model output -> its node) reads ``cosine:<output>`` from a log whose output
    table names nodes (hb_mapper before 1.24; :func:`tuner.toolchain.compare.output_rows`)."""
    if data:
        for key in (objective, "accuracy"):
            v = data.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                return float(v), f"json:{key}"
    if log is not None and log.outputs:
        cos = {o.name: o.cosine for o in log.outputs if o.cosine is not None}
        if cos and objective == "mean_cosine":
            return sum(cos.values()) / len(cos), "log:mean_cosine"
        if cos and objective == "min_cosine":
            return min(cos.values()), "log:min_cosine"
        kind, _, name = objective.partition(":")
        row = output_rows(log, [name], producers).get(name) if kind == "cosine" else None
        if row is not None and row.cosine is not None:
            return row.cosine, f"log:{objective}"
    return None, None


def _log_summary(log: HbLog) -> dict[str, Any]:
    return {"path": log.path, "nodes": len(log.nodes), "outputs": {o.name: o.cosine for o in log.outputs},
            "method": log.method, "succeeded": log.succeeded, "versions": log.versions,
            "int16_set": [e.node for e in log.int16 if e.status == "set"],
            "int16_refused_messages": [e.text for e in log.refused()][:20], "errors": log.errors[-3:],
            "warnings": log.warnings[:10]}


# --------------------------------------------------------------------------- the study side


class StudyContext:
    """A study plus what it takes to simulate its trials per node (opened on first use)."""

    def __init__(self, study: optuna.Study, paths, threads: int | None = None):
        self.study = study
        self.paths = paths
        self.info = study_info(study)
        self.threads = threads
        self._ws = None
        self._log_sim: Simulator | None = None     # the simulator on the log's terms (tuner.toolchain.logterms)

    @property
    def objective(self) -> str:
        return self.info.objectives.accuracy

    @property
    def mode(self) -> str:
        return self.info.mode

    def workspace(self):
        if self._ws is None:
            space_path = Path(self.info.space_path)
            if space_path.is_file():
                self._ws = Workspace.for_space(load_space(space_path), threads=self.threads)
            else:
                self._ws = Workspace.open(self.info.base_path, march=self.info.march, threads=self.threads)
        return self._ws

    def producers(self) -> dict[str, str]:
        """Model output -> the node computing it, in the graph hb_mapper converts."""
        ws = self.workspace()
        return {o: ws.graph.producer[o].name for o in ws.model.output_names if o in ws.graph.producer}

    def compare(self, row: results.Row, log: HbLog) -> Comparison:

        cand = row.trial_record.candidate
        ws = self.workspace()
        if self._log_sim is None:
            self._log_sim = log_simulator(ws)
        # on the log's terms (first calibration sample, hb's formulas); pooled over the study's data as well
        return compare_with_log(self._log_sim, cand, log, pooled_sim=ws.simulator, pooled_data="evaluation data")

    def export(self, row: results.Row, folder: Path) -> Path:
        """The trial's YAML in ``folder``, building into ``folder/model_output``."""
        out = folder / f"trial_{row.number:05d}.yaml"
        export_trial(row, out, Path(self.info.base_path), self.info.node_info_supported, None,
                     {"study": self.study.study_name, **self.info.fingerprints})
        text = out.read_text(encoding="utf-8")
        header = [line for line in text.splitlines() if line.startswith("#")]
        cfg = yaml.safe_load(text)
        cfg.setdefault("model_parameters", {})["working_dir"] = "model_output"
        write_atomic(out, "\n".join(header) + "\n" + dump_yaml(cfg))
        return out

    def feed_back(self, row: results.Row, accuracy: float, latency_ms: float | None, record: RealRecord) -> int:
        """Add a COMPLETE trial with the trial's parameters and the real value; returns its number.
        The constraints read the real metrics where the run measured them (--local), else the simulated."""
        obj = self.info.objectives
        lat = latency_ms if latency_ms is not None else row.latency_ms
        values = obj.values(accuracy, lat)
        metrics = row.trial_record.metrics(obj.metric_names_needed)
        if record.metrics:
            metrics.update(record.metrics)
        constraints = obj.constraints(accuracy, lat, metrics)
        summary = record.summary()
        if row.trial is None:
            raise ValueError(f"trial {row.number}: a row made by hand has no parameters to feed back")
        trial = optuna.trial.create_trial(
            params=dict(row.trial.params), distributions=dict(row.trial.distributions), values=values,
            constraints=constraints or None,
            user_attrs={"verified_from": row.number, "real": summary,
                        "plan": f"real toolchain value of trial {row.number}"})
        self.study.add_trial(trial)
        return max(t.number for t in self.study.get_trials(deepcopy=False)
                   if t.user_attrs.get("verified_from") == row.number)

    def finish(self, row: results.Row, record: RealRecord, log: HbLog | None, data: dict | None,
               feedback: bool, measured: tuple[float, str] | None = None) -> RealRecord:
        """``record`` with the real figures filled in (comparison, accuracy), stored, fed back.
        ``measured``: (accuracy, source) measured on the study's own data (verify --local), which
        wins over what the log or a JSON gives."""
        record = record.with_(sim_accuracy=row.accuracy, objective=self.objective)
        if log is not None:
            record = record.with_(log_summary=_log_summary(log), output_cosine=log.mean_output_cosine,
                                  method=log.method)
            if log.has_tables:
                try:
                    record = record.with_(comparison=self.compare(row, log))
                except (TunerError, OSError, ValueError) as exc:
                    record = record.with_(comparison_error=str(exc))
        if data is not None:
            record = record.with_(board=data)
            lat = data.get("latency_ms")
            if isinstance(lat, (int, float)) and not isinstance(lat, bool) and math.isfinite(lat):
                record = record.with_(latency_ms=float(lat))
        producers = self.producers() if log is not None and log.outputs_by == "node" else None
        acc, source = measured if measured is not None else real_accuracy(self.objective, log, data, producers)
        record = record.with_(accuracy=acc, accuracy_source=source)
        if record.ok and acc is None and not (log is not None and log.has_tables):
            record = record.with_(status="unusable", error=(
                "the command printed neither an hb_mapper log with its tables nor a JSON object with "
                f"'accuracy' or {self.objective!r}"))
        if record.ok and acc is not None and feedback:
            record = record.with_(feedback_trial=self.feed_back(row, acc, record.latency_ms, record))
        save_real(self.study, row.number, record)
        return record


def _now() -> str:
    return _dt.datetime.now().isoformat(timespec="seconds")


# --------------------------------------------------------------------------- choosing and running


def choose(rows: list[results.Row], mode: str, top: int | None, numbers: list[int] | None) -> list[results.Row]:
    """Explicit trial numbers; else the Pareto front (most accurate first), cut to ``top`` and
    topped up with the next most accurate feasible trials. Repeats of a simulated candidate are skipped."""
    originals = [r for r in rows if not r.duplicate]
    if numbers:
        by_number = {r.number: r for r in rows}
        missing = [n for n in numbers if n not in by_number]
        if missing:
            raise TunerError(f"trial(s) {', '.join(map(str, missing))} are not completed trials of the study")
        return [by_number[n] for n in numbers]
    key = (lambda r: (r.latency_ms, -r.accuracy, r.number)) if mode == "latency" else \
        (lambda r: (-r.accuracy, r.latency_ms, r.number))
    front = sorted(results.pareto(originals), key=key)
    if top is None:
        return front
    on_front = {r.number for r in front}
    rest = sorted((r for r in originals if r.feasible and r.number not in on_front), key=key)
    return (front + rest)[:top]


def _export_for_verify(ctx: StudyContext, row: results.Row) -> tuple[Path, RealRecord, Path | None]:
    """The trial's verify folder, its record so far and its exported YAML (None: the export failed,
    the record says why)."""
    folder = ctx.paths.root / "verify" / f"trial_{row.number:05d}"
    record = RealRecord(status="ok", when=_now(), dir=str(folder))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return folder, record, ctx.export(row, folder)
    except (TunerError, OSError) as exc:
        return folder, record.with_(status="error", error=f"export failed: {exc}"), None


def _stored(ctx: StudyContext, row: results.Row, record: RealRecord) -> RealRecord:
    save_real(ctx.study, row.number, record)
    return record


def verify_trial(ctx: StudyContext, row: results.Row, command: str, timeout: float | None,
                 log_name: str = LOG_NAME, feedback: bool = True) -> RealRecord:
    folder, record, yaml_path = _export_for_verify(ctx, row)
    if yaml_path is None:
        return _stored(ctx, row, record)
    (folder / log_name).unlink(missing_ok=True)     # never import a stale log from an earlier run
    cmd = substitute(command, yaml_path.resolve(), folder.resolve(), row.number)
    started = time.time()
    res = run_command(cmd, folder, timeout)
    (folder / "output.txt").write_text(res.output, encoding="utf-8")
    record = record.with_(yaml=str(yaml_path), command=cmd, returncode=res.returncode, seconds=round(res.seconds, 3))
    log = find_log(folder, res.output, log_name, started)
    data = last_json(res.output)
    if res.timed_out:
        record = record.with_(status="timeout", error=f"no result within {timeout:g} s; the command was killed")
        log, data = None, None
    elif res.returncode != 0:
        last = next((s.strip() for s in reversed(res.output.strip().splitlines()) if s.strip()), "no output")
        tail = log.errors[-1] if log is not None and log.errors and log.path != "stdout" else last
        record = record.with_(status="failed", error=f"exit code {res.returncode}: {tail[-300:]}")
        log, data = None, None
    return ctx.finish(row, record, log, data, feedback)


def verify_trial_local(ctx: StudyContext, row: results.Row, local: LocalTool, timeout: float | None,
                       feedback: bool = True, say=None) -> RealRecord:
    """The trial's YAML converted by the installed toolchain (cached run), its quantized and calibrated
    models run on the study's evaluation data and scored like the simulation (the same samples, float
    reference and metrics): the real value of the objective and of every constraint's metric."""
    folder, record, yaml_path = _export_for_verify(ctx, row)
    if yaml_path is None:
        return _stored(ctx, row, record)
    conv = convert(local.toolchain, yaml_path, local.knobs, timeout=timeout, say=say)
    record = record.with_(yaml=str(yaml_path), command=f"hb_mapper makertbin (local toolchain {conv.toolchain})",
                          returncode=conv.returncode, seconds=0.0 if conv.cached else conv.seconds,
                          compiler_ms=conv.bpu_latency_ms)
    if not conv.ok:
        status = "timeout" if conv.folder.endswith(".timeout") else "failed"
        return _stored(ctx, row, record.with_(status=status, error=f"hb_mapper refused the YAML: {conv.error}"))
    try:
        run = measure(local.toolchain, conv, ctx.workspace().simulator, str(yaml_path), "evaluation data")
    except TunerError as exc:
        return _stored(ctx, row, record.with_(status="failed", error=str(exc)))
    write_atomic(folder / "real_run.json", json.dumps(run.to_json(), indent=1, default=str))
    q, c = run.quantized, run.calibrated
    if q is None:
        return _stored(ctx, row, record.with_(status="failed", error=run.error or "no figures"))
    obj = ctx.info.objectives
    metrics = {}
    for name in obj.metric_names_needed:
        try:
            metrics[name] = q.value(name)
        except (TunerError, KeyError, ValueError):
            pass
    record = record.with_(metrics=metrics or None, local=run.to_json(), seconds=round(run.seconds, 2),
                          calibrated_accuracy=c.value(ctx.objective) if c is not None else None)
    log = None
    try:
        log = conv.log()
    except TunerError:
        pass
    return ctx.finish(row, record, log, None, feedback, measured=(q.value(ctx.objective), "local:quantized"))


@dataclass(frozen=True)
class LocalTool:
    """The installed toolchain and the compile knobs ``verify --local`` converts with."""

    toolchain: Toolchain
    knobs: CompileKnobs


def verify_study(ctx: StudyContext, command: str | None, top: int | None = None, numbers: list[int] | None = None,
                 timeout: float | None = None, again: bool = False, feedback: bool = True,
                 log_name: str = LOG_NAME, say=None, local: LocalTool | None = None
                 ) -> list[tuple[results.Row, RealRecord]]:
    rows = list(read_outcome(ctx.study, ctx.info.objectives).rows)
    chosen = choose(rows, ctx.mode, top, numbers)
    if not chosen:
        raise TunerError(f"study {ctx.study.study_name!r} has no feasible completed trial to verify yet")
    done = []
    for i, row in enumerate(chosen, 1):
        old = real_record(ctx.study, row.number)
        if old is not None and old.ok and not again and not numbers:
            if say:
                say(f"[{i}/{len(chosen)}] trial {row.number}: verified before ({old.when}); --again to rerun")
            done.append((row, old))
            continue
        if local is not None:
            rec = verify_trial_local(ctx, row, local, timeout, feedback,
                                     say=(lambda m, i=i, n=row.number: say(f"[{i}/{len(chosen)}] trial {n}: {m}")) if say else None)
        else:
            if say:
                say(f"[{i}/{len(chosen)}] trial {row.number}: running the command")
            if command is None:
                raise TunerError("give --command 'hb_mapper makertbin --config {yaml} --model-type onnx' or --local")
            rec = verify_trial(ctx, row, command, timeout, log_name, feedback)
        if say:
            say(f"[{i}/{len(chosen)}] trial {row.number}: {rec.status}" + (f" ({rec.error})" if rec.error else ""))
        done.append((row, rec))
    return done


def attach_log(ctx: StudyContext, number: int, log: HbLog, feedback: bool = True) -> RealRecord:
    """``tuner import-log LOG --study S --trial N``: a log from a run made by hand, stored like verify's."""
    by_number = {r.number: r for r in read_outcome(ctx.study, ctx.info.objectives).rows}
    if number not in by_number:
        raise TunerError(f"trial {number} is not a completed trial of study {ctx.study.study_name!r}")
    return ctx.finish(by_number[number], RealRecord(status="ok", when=_now(), imported=log.path), log, None, feedback)
