"""How much each node's quantization costs.

``leave_one_float``: the accuracy gained when a node alone stays float (on the CPU) on top of
the all-int8 baseline: one evaluation per node. The search uses this ranking to pick its
top-K free nodes and to build the usual manual plans for its warm start; results are cached
in the study folder, keyed by the fingerprints they came from.

``sensitivity_table`` (``tuner sensitivity``) adds the other view: the accuracy when a node
alone is quantized (everything else float), in int8 and, where the march allows, int16.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tuner.candidate import Candidate, NodeSetting
from tuner.files import write_atomic
from tuner.metrics.accuracy import accuracy
from tuner.simulate import Resolved, Simulator

#: Seconds between writes of a partial ranking (a run killed with kill -9 loses at most this much).
SAVE_EVERY_S = 5.0

Partial = Callable[[dict[str, float]], None]


def leave_one_float(sim: Simulator, base: Candidate, nodes: list[str], metric: str = "mean_cosine",
                    progress: Callable[[int, int], None] | None = None, done: dict[str, float] | None = None,
                    save: Partial | None = None) -> dict[str, float]:
    """accuracy(node on CPU) - accuracy(base), per node. Larger means more sensitive.

    ``done``: gains already computed (a stopped run's), not recomputed. ``save(partial)`` is called
    every :data:`SAVE_EVERY_S` seconds and when the loop is interrupted (Ctrl-C), so the finished
    part survives and the next run continues where this one stopped."""
    out = {n: float(v) for n, v in (done or {}).items() if n in set(nodes)}
    todo = [n for n in nodes if n not in out]
    if not todo:
        return {n: out[n] for n in nodes}
    first = sim.evaluate(base)
    ref = accuracy(first.outputs, metric, first.task)
    last = time.monotonic()
    try:
        for name in todo:
            settings = dict(base.nodes)
            settings[name] = NodeSetting(on="CPU")
            cand = Candidate.make(base.calibration, settings, base.optimization)
            ev = sim.evaluate(cand)
            out[name] = accuracy(ev.outputs, metric, ev.task) - ref
            if progress:
                progress(len(out), len(nodes))
            if save is not None and time.monotonic() - last >= SAVE_EVERY_S:
                save(dict(out))
                last = time.monotonic()
    except BaseException:
        if save is not None and out:
            save(dict(out))
        raise
    return {n: out[n] for n in nodes}


def cached_sensitivity(path: Path, key: str,
                       compute: Callable[[dict[str, float], Partial], dict[str, float]]) -> dict[str, float]:
    """Read ``path`` when it was computed for ``key``, else ``compute(done, save)`` and write it
    atomically. A partial file (``"partial": true``, written by ``save`` as the computation goes
    and when it is interrupted) for the same ``key`` hands its finished nodes to ``compute``."""
    done: dict[str, float] = {}
    if path.is_file():
        try:
            data = json.loads(path.read_text())
            if data.get("key") == key:
                values = {k: float(v) for k, v in data["sensitivity"].items()}
                if not data.get("partial"):
                    return values
                done = values
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass

    def save(partial: dict[str, float]) -> None:
        write_atomic(path, json.dumps({"key": key, "partial": True, "sensitivity": partial}, indent=1))

    values = compute(done, save)
    write_atomic(path, json.dumps({"key": key, "sensitivity": values}, indent=1))
    return values


@dataclass
class SensitivityRow:
    node: str
    op_type: str
    float_gain: float            # accuracy(node float, rest int8) - accuracy(all int8)
    alone_int8: dict[str, float]     # only this node quantized: accuracy, mean cosine, mean SQNR
    alone_int16: dict[str, float] | None

    def as_dict(self) -> dict:
        return {"node": self.node, "op_type": self.op_type, "float_gain": self.float_gain,
                "alone_int8": self.alone_int8, "alone_int16": self.alone_int16}


def _scores(ev, metric: str) -> dict[str, float]:
    outs = ev.outputs.values()
    return {"accuracy": accuracy(ev.outputs, metric, ev.task),
            "cosine": float(sum(o["cosine"] for o in outs) / len(ev.outputs)),
            "sqnr_db": float(sum(min(o["sqnr_db"], 200.0) for o in outs) / len(ev.outputs))}


def sensitivity_table(sim: Simulator, base: Candidate, nodes: list[str], metric: str = "mean_cosine",
                      progress: Callable[[int, int], None] | None = None,
                      gains: dict[str, float] | None = None) -> list[SensitivityRow]:
    """Per node: the gain of leaving it float, and the accuracy with it alone quantized (int8,
    int16 where allowed). Sorted most sensitive first. About 2-3 evaluations per node; 1-2
    when the leave-one-float ``gains`` come from a study's cache."""
    if gains is None or any(n not in gains for n in nodes):
        gains = leave_one_float(sim, base, nodes, metric)
    graph, target = sim.graph, sim.target
    all_cpu = {n.name: NodeSetting(on="CPU") for n in graph}
    rows = []
    for i, name in enumerate(nodes):
        op = graph.by_name[name].op_type
        alone = dict(all_cpu)
        alone[name] = NodeSetting(on="BPU")
        int8 = _scores(sim.evaluate(Candidate.make(base.calibration, alone, base.optimization)), metric)
        int16 = None
        if target.int16_input(op):
            alone16 = dict(alone)
            out16 = "int16" if target.int16_output(op, graph.by_name[name].proto) else None
            only = target.int16_input_indices(op)   # MatMul: input 0 only
            alone16[name] = (NodeSetting(on="BPU", input_type="int16", output_type=out16) if only is None else
                             NodeSetting(on="BPU", input_types=tuple((k, "int16") for k in sorted(only)),
                                         output_type=out16))
            int16 = _scores(sim.evaluate(Candidate.make(base.calibration, alone16, base.optimization)), metric)
        rows.append(SensitivityRow(node=name, op_type=op, float_gain=gains[name], alone_int8=int8, alone_int16=int16))
        if progress:
            progress(i + 1, len(nodes))
    rows.sort(key=lambda r: (-r.float_gain, r.alone_int8["accuracy"]))
    return rows


@dataclass
class Ranking:
    label: str                   # as asked for (--calibration), else the calibration's description
    calibration: Resolved        # the calibration simulated (``default``/``mix`` resolved)
    rows: list[SensitivityRow]   # most sensitive first


@dataclass
class Sensitivity:
    metric: str
    runs: list[Ranking]
    shared: Path | None = None   # a space's cached leave-one-float gains, when they were used
