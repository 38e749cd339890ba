"""What ``tuner sensitivity`` ranks: the BPU nodes of an hb_mapper YAML, or the free nodes of a
search space, under one or more calibrations.

A space is ranked as its search ranks it (its data, accuracy metric and reference calibration);
its per-fix gains (CPU, int16) are the study's cached ones (``results/<study>/sensitivity.json``),
shared with the search's top-K, warm start and report.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner import __version__
from tuner.calib.kl import KL_VERSION
from tuner.candidate import Calibration, Candidate
from tuner.files import cache_dir, check_writable, write_atomic
from tuner.inputs.config import read_yaml
from tuner.sensitivity import (
    FIXES,
    Gains,
    Ranking,
    Sensitivity,
    SensitivityRow,
    cached_sensitivity,
    leave_one_fixed,
    sensitivity_table,
)
from tuner.study.space import free_nodes, load_space
from tuner.study.storage import StudyPaths
from tuner.study.warmstart import node_gains, reference_calibration
from tuner.workspace import Workspace

Progress = Callable[[int, int], None]


def is_space(raw: Any) -> bool:
    """A search space YAML (``base:`` naming an hb_mapper YAML), not an hb_mapper YAML."""
    return isinstance(raw, dict) and "base" in raw and "model_parameters" not in raw


def rank(path: str | Path, calibrations: list[str] | None = None, metric: str | None = None,
         data: list[Path] | None = None, limit: int | None = None, march: str | None = None,
         threads: int | None = None, study: str | None = None, results_dir: str | Path = "results",
         progress: Callable[[str], Progress | None] = lambda label: None,
         say: Callable[[str], None] = lambda text: None) -> Sensitivity:
    """Rank the nodes of the hb_mapper YAML or search space at ``path``: one :class:`Ranking` per
    calibration spec (``max``, ``kl``, ``max:0.99995+pc``, ...), else one under the YAML's (a
    space: its reference) calibration. ``progress(label)`` makes a progress display."""
    specs = [t for t in calibrations or [] if t.strip()]
    cals = [Calibration.parse(t) for t in specs]
    raw = read_yaml(Path(path), "an hb_mapper YAML or a search space YAML")
    gains = None
    shared = None
    if is_space(raw):
        space = load_space(path)
        if (metric or space.objective.accuracy) == space.objective.accuracy:   # the gains go to the study's cache
            check_writable(Path(results_dir) / (study or space.name), "the sensitivity ranking")
        ws = Workspace.for_space(space, data=data, limit=limit, march=march, threads=threads,
                                 progress=progress("calibration statistics"))
        b = ws.base_candidate()
        base = Candidate.make(reference_calibration(space, b), dict(b.nodes), b.optimization)
        metric = metric or space.objective.accuracy
        nodes = free_nodes(space, ws.graph, ws.target)
        if metric == space.objective.accuracy:
            paths = StudyPaths(Path(results_dir) / (study or space.name))
            gains = node_gains(space, ws, paths.sensitivity, progress("node sensitivity"))
            shared = paths.sensitivity
            say(f"per-node fix gains: {paths.sensitivity} (shared with the search)")
    else:
        ws = Workspace.open(path, data=data, limit=limit, march=march, threads=threads,
                            progress=progress("calibration statistics"))
        nodes = [n.name for n in ws.graph if ws.target.bpu_capable(n.op_type) and ws.graph.data_inputs(n)]
        base = ws.base_candidate()
        metric = metric or "mean_cosine"
    runs = []
    for label, cal in ([(t.strip(), c) for t, c in zip(specs, cals)] or [("", base.calibration)]):
        cand = base.with_calibration(cal)
        use = gains if cal == base.calibration else None
        rows_path, rows_key = _cache_entry("rows", ws, cand, nodes, metric)
        rows = _cached_rows(rows_path, rows_key)
        if rows is not None and (use is None or all(dict(r.gains) == dict(use.get(r.node, {})) for r in rows)):
            say(f"node sensitivity{' ' + label if label else ''}: from the cache ({rows_path})")
        else:
            if use is None:     # kept in the cache folder as it goes: a stopped run continues there
                use = _cached_gains(ws, cand, nodes, metric, progress(f"leave-one-fixed {label}".rstrip()))
            rows = sensitivity_table(ws.simulator, cand, nodes, metric,
                                     progress(f"node sensitivity {label}".rstrip()), gains=use)
            write_atomic(rows_path, json.dumps({"key": rows_key, "rows": [r.as_dict() for r in rows]}, indent=1))
        runs.append(Ranking(label or cal.describe(), ws.simulator.resolve(cand)[0], rows))
    return Sensitivity(metric, runs, shared)


def _cache_entry(kind: str, ws: Workspace, cand: Candidate, nodes: list[str], metric: str) -> tuple[Path, str]:
    """Where one half of a YAML's ranking is cached (``gains``: the per-fix gains, ``rows``: the whole
    table with the alone-quantized accuracies), and its key: the model, the calibration and evaluation
    data, the YAML's decisions, the metric, march, nodes and tuner's version."""
    key = "|".join([ws.model.fingerprint, ws.calibration_data.fingerprint(), ws.eval_data.fingerprint(), cand.key(),
                    metric, ws.target.march, ",".join(nodes), "fixes=" + ",".join(FIXES), f"tuner {__version__}",
                    f"kl.v{KL_VERSION}"]
                   + ([kind] if kind != "gains" else []))
    return cache_dir() / "sensitivity" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json", key


def _cached_rows(path: Path, key: str) -> list[SensitivityRow] | None:
    """The cached table of ``key``, or None (absent, another key, unreadable)."""
    try:
        data = json.loads(path.read_text())
        if data.get("key") != key:
            return None
        return [SensitivityRow(node=r["node"], op_type=r["op_type"],
                               gains={f: float(r[f"{f}_gain"]) for f in FIXES if r.get(f"{f}_gain") is not None},
                               alone_int8={k: float(v) for k, v in r["alone_int8"].items()},
                               alone_int16=None if r["alone_int16"] is None else
                               {k: float(v) for k, v in r["alone_int16"].items()}) for r in data["rows"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _cached_gains(ws: Workspace, cand: Candidate, nodes: list[str], metric: str,
                  progress: Progress | None) -> dict[str, Gains]:
    """Per-fix gains (CPU, int16) of a YAML's nodes, in ``<cache>/sensitivity/`` keyed by everything they
    depend on, written partial as they are computed (Ctrl-C keeps the finished nodes)."""
    path, key = _cache_entry("gains", ws, cand, nodes, metric)
    return cached_sensitivity(path, key, lambda done, save: leave_one_fixed(ws.simulator, cand, nodes, metric,
                                                                           progress, done, save))
