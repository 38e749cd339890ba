"""The simplest fix: which of the winner's decisions the floor needs, and the one-line fixes.

best.yaml is the cheapest feasible trial the sampler found, with every decision it happened
to make on the way: on the example 8 CPU nodes and 41 int16 nodes where one calibration change
and an int16 input do the work. Two views make that visible:

* :func:`trim`: start from the winner and revert its decisions (the Optuna parameters whose
  value differs from the base YAML's: a node's CPU placement or int16, a calibration knob) one
  at a time, greedily, keeping a revert when the candidate still meets the space's floor and
  ceiling (:meth:`Objectives.constraints`; without either, the winner's accuracy minus
  :data:`TOLERANCE`) and its modeled latency does not grow: a base YAML's CPU placement that the
  winner moved to the BPU is not put back for the sake of fewer changes (on the tiny model the
  trimmed file was 0.769 ms against the winner's 0.665 ms before this rule: two Where parts back on
  the CPU). Order: the decision whose revert saves the most modeled latency first
  (the latency model needs no simulation), calibration knobs (which cost no latency) last. One
  pass, one evaluation per decision (each candidate scored once; the caller answers candidates
  the study already holds from its trials), plus one per kept decision for what it contributes.
  The result is exported as ``best_minimal.yaml``.
* :func:`one_line_fixes`: the completed trials that are the base YAML with only its
  calibration changed (the warm start's all-int8 baselines cover the space's grid), with their
  accuracy and latency: no new evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tuner.candidate import Candidate
from tuner.study.record import Objectives, TrialRecord
from tuner.study.results import Change, Fix, Kept, Row, Simplest, TrimResult
from tuner.study.space import ResolvedSpace, setting_choice

__all__ = ["TOLERANCE", "Change", "Fix", "Kept", "Simplest", "TrimResult", "accuracy_floor", "base_params", "changes",
           "criterion", "fix_rows", "one_line_fixes", "summary_lines", "trim"]

#: Without a floor (or ceiling) in the space, a trimmed candidate must keep the winner's
#: accuracy within this much (absolute, in the accuracy metric's units).
TOLERANCE = 1e-4

#: A candidate's record (the session simulates it, or answers from the study's trials); raises
#: when the simulation fails (such a candidate never meets the floor).
Evaluate = Callable[[Candidate], TrialRecord]
#: A candidate's modeled latency in ms (no simulation).
LatencyOf = Callable[[Candidate], float]

# --------------------------------------------------------------------------- the criterion
def criterion(objectives: Objectives, winner: TrialRecord) -> tuple[Callable[[TrialRecord], bool], str]:
    """When a trimmed candidate is still good enough, and how to say it. The space's floor and
    ceiling when it has one; else the winner's accuracy minus :data:`TOLERANCE`."""
    metric = objectives.accuracy
    if objectives.constraints(winner.accuracy, winner.latency_ms, winner.metrics(objectives.metric_names_needed)):
        def meets(rec: TrialRecord) -> bool:
            return math.isfinite(rec.accuracy) and objectives.feasible_record(rec)

        parts = []
        if objectives.min_accuracy is not None:
            parts.append(f"{metric} >= {objectives.min_accuracy:g}")
        if objectives.max_latency_ms is not None:
            parts.append(f"latency <= {objectives.max_latency_ms:g} ms")
        if objectives.max_latency_ratio is not None:
            parts.append(f"latency <= {objectives.max_latency_ratio:g}x all-int8")
        parts += [c.name for c in objectives.constraints_]
        return meets, " and ".join(parts)
    floor = winner.accuracy - TOLERANCE

    def within(rec: TrialRecord) -> bool:
        return math.isfinite(rec.accuracy) and rec.accuracy >= floor

    return within, f"{metric} >= {floor:.6f} (no floor in the space: the winner's {winner.accuracy:.6f} - {TOLERANCE:g})"


def accuracy_floor(objectives: Objectives, winner: TrialRecord) -> float | None:
    """The accuracy :func:`criterion` asks for (None when the space has only a latency ceiling)."""
    if objectives.min_accuracy is not None:
        return float(objectives.min_accuracy)
    if objectives.max_latency_ms is not None or objectives.max_latency_ratio is not None or objectives.constraints_:
        return None
    return winner.accuracy - TOLERANCE


# --------------------------------------------------------------------------- the trim
def base_params(r: ResolvedSpace) -> dict[str, Any]:
    """The Optuna parameters of the base YAML: each free node as the base's node_info sets it
    (hb_mapper's default without an entry), the base's calibration."""
    choices = {d.param: setting_choice(r.base.setting(d.nodes[0]), r.graph.by_name[d.nodes[0]].op_type, r.target)
               for d in r.decisions}
    return r.params_for(r.base.calibration, choices)


def changes(r: ResolvedSpace, params: Mapping[str, Any]) -> list[Change]:
    """The winner's decisions: parameters that differ from the base's and whose revert changes the
    candidate (a percentile under ``kl``, or per_channel under ``default``, is no decision)."""
    base = base_params(r)
    key = r.candidate(dict(params)).key()
    out = []
    for d in r.decisions:
        value = params.get(d.param, d.default_choice)
        if value != base[d.param] and r.candidate({**params, d.param: base[d.param]}).key() != key:
            out.append(Change(d.param, value, base[d.param], d.nodes))
    for name, values in r.calibration_params.items():
        value = params.get(name, values[0])
        if value != base.get(name) and r.candidate({**params, name: base.get(name)}).key() != key:
            out.append(Change(name, value, base.get(name)))
    return out


def trim(r: ResolvedSpace, trial: int, params: Mapping[str, Any], start: TrialRecord, objectives: Objectives,
         evaluate: Evaluate, latency: LatencyOf) -> TrimResult:
    """Revert the winner's decisions one at a time while it still meets the criterion (see the
    module docstring). ``params``: the winner's Optuna parameters; ``start``: its record."""
    meets, text = criterion(objectives, start)
    cache: dict[str, TrialRecord | None] = {start.key: start}

    def score(p: Mapping[str, Any]) -> TrialRecord | None:
        cand = r.candidate(dict(p))
        key = cand.key()
        if key not in cache:
            try:
                cache[key] = evaluate(cand)
            except Exception:     # an onnxruntime error, a non-finite output: never good enough
                cache[key] = None
        return cache[key]

    todo = changes(r, params)
    start_lat = latency(r.candidate(dict(params)))
    saved = {c.param: start_lat - latency(r.candidate({**params, c.param: c.base})) for c in todo}
    order = sorted(range(len(todo)), key=lambda i: (todo[i].kind == "calibration", -saved[todo[i].param], i))
    current: dict[str, Any] = dict(params)
    current_lat = start_lat
    removed: list[Change] = []
    needed: list[Change] = []
    for i in order:
        c = todo[i]
        without = {**current, c.param: c.base}
        without_lat = latency(r.candidate(without))
        if without_lat > current_lat + 1e-9:
            needed.append(c)          # the revert would cost latency: the winner's choice stays
            continue
        rec = score(without)
        if rec is not None and meets(rec):
            current, current_lat = without, without_lat
            removed.append(c)
        else:
            needed.append(c)
    minimal = score(current)
    assert minimal is not None, "the winner, or a revert that met the criterion"
    min_lat = current_lat
    kept = []
    for c in needed:
        without = {**current, c.param: c.base}
        rec = score(without)
        kept.append(Kept(c, minimal.accuracy - rec.accuracy if rec is not None else math.inf,
                         min_lat - latency(r.candidate(without))))
    return TrimResult(trial=trial, start=start, minimal=minimal, params=current, kept=tuple(kept),
                      removed=tuple(removed), criterion=text, scored=len(cache))


# --------------------------------------------------------------------------- one-line fixes
def one_line_fixes(r: ResolvedSpace, rows: Sequence[Row], meets: Callable[[TrialRecord], bool],
                   floor: float | None = None) -> list[Fix]:
    """The completed trials whose candidate is the base YAML with only calibration_parameters
    changed, each candidate once, those that meet ``meets`` first, most accurate first; a fix
    that misses says by how much it is below ``floor`` (:func:`accuracy_floor`)."""
    want = r.candidate(base_params(r))
    base_fields = want.with_calibration(r.base.calibration).to_yaml_fields()["calibration_parameters"]
    seen: set[str] = set()
    out = []
    for row in sorted(rows, key=lambda x: x.number):
        rec = row.trial_record
        cand = rec.candidate
        if row.duplicate or cand.nodes != want.nodes or cand.optimization != want.optimization or rec.key in seen:
            continue
        seen.add(rec.key)
        fields = cand.to_yaml_fields()["calibration_parameters"]
        diff = [f"{k}: {v}" for k, v in fields.items() if base_fields.get(k) != v]
        diff += [f"{k}: (removed)" for k in base_fields if k not in fields]
        ok = meets(rec)
        below = floor - rec.accuracy if floor is not None and not ok and rec.accuracy < floor else None
        out.append(Fix(", ".join(diff) or "(the base YAML as it is)", row.number, rec, ok, below))
    return sorted(out, key=lambda f: (not f.feasible, -f.record.accuracy, f.record.latency_ms, f.trial))


def fix_rows(r: ResolvedSpace, rows: Sequence[Row]) -> list[Row]:
    """The completed trials that are one-line fixes (each candidate once): validated with the
    front, so that they compete on the same held-out figure."""
    by = {row.number: row for row in rows}
    return [by[f.trial] for f in one_line_fixes(r, rows, lambda rec: True)]


# --------------------------------------------------------------------------- text
def _task(rec: TrialRecord) -> str:
    return "".join(f", {k} {v:.4f}" for k, v in rec.task.items())


def summary_lines(s: Simplest, minimal_path: str | None = None) -> list[str]:
    """The terminal block: best.yaml's decisions, what best_minimal.yaml keeps, the one-line fixes."""
    t = s.trim
    st, m = t.start, t.minimal
    lines = [f"best.yaml (trial {t.trial}): {st.counts.cpu_nodes} CPU, {st.counts.int16_nodes} int16 node(s), "
             f"calibration {st.calibration.method}: {t.decisions} decision(s) away from the base YAML; "
             f"acc {st.accuracy:.6f}{_task(st)}, {st.latency_ms:.3f} ms"]
    where = minimal_path or "best_minimal.yaml"
    if t.removed:
        cheaper = (f" ({st.latency_ms - m.latency_ms:.3f} ms cheaper than best.yaml)"
                   if m.latency_ms < st.latency_ms - 0.0005 else "")
        lines.append(f"{where} keeps {len(t.kept)} of them, still meeting {t.criterion}: acc {m.accuracy:.6f}"
                     f"{_task(m)}, {m.latency_ms:.3f} ms{cheaper}, {m.counts.cpu_nodes} CPU, {m.counts.int16_nodes} int16"
                     + (":" if t.kept else " (the base YAML's own calibration and placement)"))
    else:
        lines.append(f"{where}: every decision is needed to meet {t.criterion}" + (":" if t.kept else ""))
    for k in t.kept:
        drop = "fails without it" if math.isinf(k.accuracy_drop) else f"acc -{k.accuracy_drop:.6f} without it"
        cost = (f"costs {k.latency_ms:+.3f} ms" if k.latency_ms >= 0
                else f"saves {-k.latency_ms:.3f} ms: kept for latency")
        lines.append(f"  {k.change.describe()}  ({drop}, {cost})")
    good = s.feasible_fixes()
    head = "one-line fixes (calibration only, nodes as in the base YAML)"
    if good:
        lines.append(f"{head}, meeting {t.criterion}:")
    elif s.fixes:
        lines.append(f"{head}: none meets {t.criterion}; the closest:")
    for f in (good or list(s.fixes))[:3]:
        below = f" ({f.below:.2g} below)" if f.below is not None else ""
        held = f", held-out {f.validation:.6f}" if f.validation is not None else ""
        lines.append(f"  {f.change} -> acc {f.record.accuracy:.6f}{below}{held}, latency {f.record.latency_ms:.3f} ms"
                     f"{_task(f.record)} (trial {f.trial})")
    top = max((f for f in s.fixes if f.validation is not None), key=lambda f: f.validation or 0.0, default=None)
    if s.validation is not None and top is not None and top.validation is not None:
        lines.append(f"on held-out data: best.yaml (trial {t.trial}) {s.validation:.6f} vs the best one-line fix "
                     f"(trial {top.trial}, {top.change}) {top.validation:.6f}: the search's gain "
                     f"{s.validation - top.validation:+.6f}")
    return lines
