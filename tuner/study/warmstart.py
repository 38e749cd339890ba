"""The warm start: the trials a study begins with, from a resolved space and the node ranking.

Baselines first (all-BPU int8 under each calibration setting of the space's grid:
:func:`baseline_calibrations`), then the usual manual fixes (the most sensitive nodes to
int16, sensitive tail nodes to the CPU) under the calibration a user would start from. Pure functions of the resolved space, the
sensitivity ranking and, for choosing that calibration, a scoring function (the session
passes one that simulates).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.calib.kl import KL_VERSION
from tuner.candidate import Calibration, Candidate
from tuner.sensitivity import FIXES, cached_sensitivity, leave_one_fixed, ranking
from tuner.simulate import intconv
from tuner.study.sections import CalibrationKnobs
from tuner.study.space import ResolvedSpace, SearchSpace, free_nodes
from tuner.workspace import Workspace

Plan = tuple[str, dict[str, Any]]   # (label, Optuna parameters)

#: int16 on the k most sensitive decisions, k escalating up to every decision that allows it (10**6),
#: then that with the 1 and 2 most sensitive on the CPU: Horizon's recipe promotes most of a model's
#: sensitive nodes at once before any CPU fallback, and where int16 is cheap on the BPU and the CPU is
#: not (PP-OCR's classifier) that is the cheapest way to the goal (results/benchmarks/search_quality.md).
ESCALATION = (1, 3, 5, 10, 10**6)


def reference_calibration(space: SearchSpace, base: Candidate) -> Calibration:
    """The calibration the sensitivity ranking and manual plans use: the base YAML's if it is
    an explicit method in the space, else the space's first."""
    k = space.knobs
    if base.calibration.type in ("max", "kl") and base.calibration.type in k.calibration_type:
        return Calibration(type=base.calibration.type, max_percentile=base.calibration.max_percentile,
                           per_channel=base.calibration.per_channel if base.calibration.per_channel in k.per_channel
                           else k.per_channel[0])
    ctype = next((t for t in k.calibration_type if t in ("max", "kl")), "max")
    return Calibration(type=ctype, per_channel=k.per_channel[0])


def baseline_calibrations(knobs: CalibrationKnobs) -> list[Calibration]:
    """Every calibration setting of the space's grid, once: for ``max`` each percentile (1.0 is
    plain max) x each per_channel value, for ``kl`` each per_channel value, for ``default`` and
    ``mix`` one (neither takes a percentile or per_channel). At most
    len(max_percentile) x len(per_channel) + len(per_channel) + 2 settings (the example: 3 x 2 + 2
    = 8), so the warm start stays a few trials and "the best all-int8 baseline" is the best of the
    whole grid, not of one percentile."""
    out: list[Calibration] = []
    for ctype in knobs.calibration_type:
        for pc in (knobs.per_channel if ctype in ("max", "kl") else (False,)):
            for pct in (knobs.max_percentile if ctype == "max" else (None,)):
                cal = Calibration(type=ctype, max_percentile=pct, per_channel=pc)
                if cal not in out:
                    out.append(cal)
    return out


def warm_start_plans(r: ResolvedSpace, sensitivity: dict[str, float],
                     manual_calibration: Calibration | None = None) -> list[Plan]:
    """Baselines first: all-BPU int8 under each calibration setting of the grid, then the usual manual fixes under
    ``manual_calibration`` (default: the reference calibration of the sensitivity ranking).
    Plans that make the same candidate are listed once."""
    space = r.space
    knobs = space.knobs
    plans: list[Plan] = []
    seen = set()

    def add(label: str, params: dict[str, Any]) -> None:
        key = r.candidate(params).key()
        if key not in seen:
            seen.add(key)
            plans.append((label, params))

    for cal in baseline_calibrations(knobs):
        add(f"baseline: all-BPU int8, {cal.describe()}", r.params_for(cal))
    if not space.settings.warm_start or not sensitivity:
        return plans
    ref = manual_calibration or reference_calibration(space, r.base)
    by_param = {n: d for d in r.decisions for n in d.nodes}
    ranked = [n for n in sorted(sensitivity, key=lambda n: -sensitivity[n]) if n in by_param]
    int16 = {}
    for n in ranked:
        d = by_param[n]
        want = next((c for c in ("BPU:int16", "BPU:int16_input") if c in d.choices), None)
        if want is not None and d.param not in int16:
            int16[d.param] = want
    for k in ESCALATION:
        choices = dict(list(int16.items())[:k])
        if choices:
            add(f"manual: {len(choices)} most sensitive node(s) int16", r.params_for(ref, choices))
    # the recipe's last step: everything promoted, then the most sensitive nodes to the CPU
    cpu = list(dict.fromkeys(by_param[n].param for n in ranked
                             if "CPU" in by_param[n].choices and by_param[n].default_choice != "CPU"))
    for k in (1, 2):
        if int16 and len(cpu) >= k:
            add(f"manual: every ranked node int16, the {k} most sensitive on CPU",
                r.params_for(ref, {**int16, **{p: "CPU" for p in cpu[:k]}}))
    order = {n.name: i for i, n in enumerate(r.graph)}
    tail_start = int(0.8 * len(order))
    tail = [n for n in ranked if order[n] >= tail_start and "CPU" in by_param[n].choices]
    for k in (1, 2):
        if len(tail) >= k:
            add(f"manual: {k} most sensitive tail node(s) on CPU",
                r.params_for(ref, {by_param[n].param: "CPU" for n in tail[:k]}))
    return plans


def best_baseline_calibration(r: ResolvedSpace, plans: list[Plan], score: Callable[[Candidate], float]) -> Calibration:
    """The calibration of the manual plans: the most accurate of the baselines' all-int8
    calibrations, as a user (and Horizon's recipe) starts from the best one. The base YAML's
    can be far worse (PP-OCRv4 det: max per-tensor 0.948 vs per-channel 0.997), and int16 on a
    few nodes cannot make up for it. ``score`` gives a candidate's accuracy; a baseline whose
    score raises or is not finite cannot be the best (its trial records the error)."""
    best, best_acc = reference_calibration(r.space, r.base), -math.inf
    for label, params in plans:
        if not label.startswith("baseline"):
            continue    # the manual plans are built from this choice, not part of it
        cand = r.candidate(params)
        try:
            acc = score(cand)
        except Exception:
            continue
        if math.isfinite(acc) and acc > best_acc:
            best, best_acc = cand.calibration, acc
    return best


def node_sensitivity(space: SearchSpace, ws: Workspace, cache: Path,
                     progress: Callable[[int, int], None] | None = None) -> dict[str, float]:
    """Each free node's sensitivity (the gain of its best fix, CPU or int16: tuner.sensitivity) under
    the space's reference calibration, cached in ``cache`` (the study folder's sensitivity.json)
    and keyed by everything it depends on: the search's top-K, its warm start, ``tuner sensitivity
    SPACE`` and the report all read the same file."""
    return ranking(node_gains(space, ws, cache, progress))


def node_gains(space: SearchSpace, ws: Workspace, cache: Path,
               progress: Callable[[int, int], None] | None = None) -> dict[str, dict[str, float]]:
    """The per-fix gains behind :func:`node_sensitivity` (node -> {fix: gain})."""
    base = ws.base_candidate()
    metric = space.objective.accuracy
    nodes = free_nodes(space, ws.graph, ws.target)
    ref = Candidate.make(reference_calibration(space, base), dict(base.nodes), base.optimization)
    # the opt-in integer kernels change every gain; "+add" since tuner.simulate.intadd (older rankings are stale)
    key = "|".join([ws.model.fingerprint, ws.calibration_data.fingerprint(), ws.eval_data.fingerprint(),
                    ref.key(), metric, ws.target.march, ",".join(nodes), "fixes=" + ",".join(FIXES), f"kl.v{KL_VERSION}"]
                   + (["intconv+add"] if intconv.enabled() else []))
    return cached_sensitivity(cache, key, lambda done, save: leave_one_fixed(ws.simulator, ref, nodes, metric,
                                                                          progress, done, save))
