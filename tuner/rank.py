"""What ``tuner sensitivity`` ranks: the BPU nodes of an hb_mapper YAML, or the free nodes of a
search space, under one or more calibrations.

A space is ranked as its search ranks it (its data, accuracy metric and reference calibration);
its per-fix gains (CPU, int16) are the study's cached ones (``results/<study>/sensitivity.json``),
shared with the search's top-K, warm start and report.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.candidate import Calibration, Candidate
from tuner.files import cache_dir, check_writable
from tuner.inputs.config import read_yaml
from tuner.sensitivity import FIXES, Gains, Ranking, Sensitivity, cached_sensitivity, leave_one_fixed, sensitivity_table
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
        if use is None:     # kept in the cache folder as it goes: a stopped run continues there
            use = _cached_gains(ws, cand, nodes, metric, progress(f"leave-one-fixed {label}".rstrip()))
        rows = sensitivity_table(ws.simulator, cand, nodes, metric, progress(f"node sensitivity {label}".rstrip()),
                                 gains=use)
        runs.append(Ranking(label or cal.describe(), ws.simulator.resolve(cand)[0], rows))
    return Sensitivity(metric, runs, shared)


def _cached_gains(ws: Workspace, cand: Candidate, nodes: list[str], metric: str,
                  progress: Progress | None) -> dict[str, Gains]:
    """Per-fix gains (CPU, int16) of a YAML's nodes, in ``<cache>/sensitivity/`` keyed by everything they
    depend on, written partial as they are computed (Ctrl-C keeps the finished nodes)."""
    key = "|".join([ws.model.fingerprint, ws.calibration_data.fingerprint(), ws.eval_data.fingerprint(), cand.key(),
                    metric, ws.target.march, ",".join(nodes), "fixes=" + ",".join(FIXES)])
    path = cache_dir() / "sensitivity" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
    return cached_sensitivity(path, key, lambda done, save: leave_one_fixed(ws.simulator, cand, nodes, metric,
                                                                           progress, done, save))
