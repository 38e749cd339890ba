"""How much each node's quantization costs, and how much of it one fix on that node gets back.

``leave_one_fixed``: per node, the accuracy gained over the all-int8 baseline by each fix the
search can apply to that node alone: placing it on the CPU (``cpu``) and, where the march honours
it, int16 (``int16``: ``InputType``/``OutputType`` int16, :func:`int16_setting`). One to two
evaluations per node. A node's *sensitivity* is the gain of its best fix (:func:`best_gain`): the
search's top-K free nodes, the warm start's manual plans and the report rank by it; results are
cached in the study folder, keyed by the fingerprints they came from.

Why both fixes, measured on the real toolchain (``docs/hb_rules/placement.md`` 1, 2): a CPU node
reads the tensor its BPU neighbours read, quantized once, so "on the CPU" often recovers nothing
(the example's three input Slices: CPU gain 0.000000 each, real and simulated), while int16 on any
one of them takes the 5-channel input's group to int16 and recovers the radar channels (int16 gain
+0.04 mean cosine). Ranking by the CPU gain alone left those Slices out of a top-12 and the search
missed the example's goal (``benchmarks/search_quality.py --quick``, stop 27).

``sensitivity_table`` (``tuner sensitivity``) adds the other view: the accuracy when a node
alone is quantized (everything else float), in int8 and, where the march allows, int16.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.candidate import Candidate, NodeSetting
from tuner.files import write_atomic
from tuner.graph import Graph, Target
from tuner.metrics.accuracy import accuracy
from tuner.simulate import Resolved, Simulator
from tuner.simulate.placement import CPU_RUNTIME_LACKS

#: Seconds between writes of a partial ranking (a run killed with kill -9 loses at most this much).
SAVE_EVERY_S = 5.0
#: The fixes one node's gain is measured for, in the order they are tried.
FIXES = ("cpu", "int16")

Gains = dict[str, float]            # fix -> accuracy gain over the all-int8 base
Partial = Callable[[dict[str, Gains]], None]


def int16_setting(graph: Graph, target: Target, name: str, on: str = "BPU") -> NodeSetting | None:
    """The int16 ``node_info`` request the march honours on ``name``: ``InputType`` int16 (MatMul:
    ``InputType<k>`` on its int16-capable inputs only) and ``OutputType`` int16 where the op may
    emit it; None when the march takes no int16 input on this op."""
    node = graph.by_name[name]
    op = node.op_type
    if not target.int16_input(op):
        return None
    out16 = "int16" if target.int16_output(op, node.proto) else None
    only = target.int16_input_indices(op)   # MatMul: input 0 only
    if only is None:
        return NodeSetting(on=on, input_type="int16", output_type=out16)
    return NodeSetting(on=on, input_types=tuple((k, "int16") for k in sorted(only)), output_type=out16)


def everything_else_on_cpu(graph: Graph) -> dict[str, NodeSetting]:
    """``ON: CPU`` for every node the CPU runtime runs, the base of the "alone quantized" analyses. A fused
    activation stays on the BPU (int8): on the CPU hb_mapper refuses it, and so does the simulation
    (placement.CPU_RUNTIME_LACKS)."""
    return {n.name: NodeSetting(on="CPU") for n in graph if n.op_type not in CPU_RUNTIME_LACKS}


def best_gain(gains: Mapping[str, float | None]) -> float:
    """A node's sensitivity: the gain of its best fix (0.0 when none was measured)."""
    values = [float(v) for v in gains.values() if v is not None and math.isfinite(v)]
    return max(values) if values else 0.0


def leave_one_fixed(sim: Simulator, base: Candidate, nodes: list[str], metric: str = "mean_cosine",
                    progress: Callable[[int, int], None] | None = None, done: Mapping[str, Gains] | None = None,
                    save: Partial | None = None) -> dict[str, Gains]:
    """Per node, {fix: accuracy(base with that fix on the node alone) - accuracy(base)} for each of
    :data:`FIXES` the march allows there. Larger means more sensitive (:func:`best_gain`).

    ``done``: gains already computed (a stopped run's), not recomputed. ``save(partial)`` is called
    every :data:`SAVE_EVERY_S` seconds and when the loop is interrupted (Ctrl-C), so the finished
    part survives and the next run continues where this one stopped."""
    wanted = set(nodes)
    out = {n: dict(g) for n, g in (done or {}).items() if n in wanted}
    todo = [n for n in nodes if n not in out]
    if not todo:
        return {n: out[n] for n in nodes}
    first = sim.evaluate(base)
    ref = accuracy(first.outputs, metric, first.task)
    last = time.monotonic()
    try:
        for name in todo:
            # no CPU fix for a fused activation: hb_mapper refuses it there (placement.CPU_RUNTIME_LACKS)
            cpu_ok = sim.graph.by_name[name].op_type not in CPU_RUNTIME_LACKS
            fixes = {"cpu": NodeSetting(on="CPU") if cpu_ok else None,
                     "int16": int16_setting(sim.graph, sim.target, name)}
            gains: Gains = {}
            for fix in FIXES:
                setting = fixes[fix]
                if setting is None:
                    continue
                settings = dict(base.nodes)
                settings[name] = setting
                ev = sim.evaluate(Candidate.make(base.calibration, settings, base.optimization))
                gains[fix] = accuracy(ev.outputs, metric, ev.task) - ref
            out[name] = gains
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
                       compute: Callable[[dict[str, Gains], Partial], dict[str, Gains]]) -> dict[str, Gains]:
    """Read ``path`` when it was computed for ``key``, else ``compute(done, save)`` and write it
    atomically. A partial file (``"partial": true``, written by ``save`` as the computation goes
    and when it is interrupted) for the same ``key`` hands its finished nodes to ``compute``.
    The file: ``{"key": ..., "gains": {node: {fix: gain}}}``."""
    done: dict[str, Gains] = {}
    if path.is_file():
        try:
            data = json.loads(path.read_text())
            if data.get("key") == key:
                values = {n: {f: float(v) for f, v in g.items()} for n, g in data["gains"].items()}
                if not data.get("partial"):
                    return values
                done = values
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass

    def save(partial: dict[str, Gains]) -> None:
        write_atomic(path, json.dumps({"key": key, "partial": True, "gains": partial}, indent=1))

    values = compute(done, save)
    write_atomic(path, json.dumps({"key": key, "gains": values}, indent=1))
    return values


def ranking(gains: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """node -> its sensitivity (:func:`best_gain`), what the search's top-K and warm start sort by."""
    return {n: best_gain(g) for n, g in gains.items()}


@dataclass
class SensitivityRow:
    node: str
    op_type: str
    gains: Gains                     # fix -> accuracy(that fix on this node, rest int8) - accuracy(all int8)
    alone_int8: dict[str, float]     # only this node quantized: accuracy, mean cosine, mean SQNR
    alone_int16: dict[str, float] | None

    @property
    def gain(self) -> float:
        """The gain of the best fix: what the rows are sorted by."""
        return best_gain(self.gains)

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "op_type": self.op_type, "gain": self.gain,
                "cpu_gain": self.gains.get("cpu"), "int16_gain": self.gains.get("int16"),
                "alone_int8": self.alone_int8, "alone_int16": self.alone_int16}


def _scores(ev, metric: str) -> dict[str, float]:
    outs = ev.outputs.values()
    return {"accuracy": accuracy(ev.outputs, metric, ev.task),
            "cosine": float(sum(o["cosine"] for o in outs) / len(ev.outputs)),
            "sqnr_db": float(sum(min(o["sqnr_db"], 200.0) for o in outs) / len(ev.outputs))}


def sensitivity_table(sim: Simulator, base: Candidate, nodes: list[str], metric: str = "mean_cosine",
                      progress: Callable[[int, int], None] | None = None,
                      gains: Mapping[str, Gains] | None = None) -> list[SensitivityRow]:
    """Per node: the gain of each fix (CPU, int16), and the accuracy with it alone quantized (int8,
    int16 where allowed). Sorted most sensitive first (the best fix's gain). About 3-4 evaluations
    per node; 1-2 when the ``gains`` come from a study's cache."""
    if gains is None or any(n not in gains for n in nodes):
        gains = leave_one_fixed(sim, base, nodes, metric)
    graph, target = sim.graph, sim.target
    all_cpu = everything_else_on_cpu(graph)
    rows = []
    for i, name in enumerate(nodes):
        op = graph.by_name[name].op_type
        alone = dict(all_cpu)
        alone[name] = NodeSetting(on="BPU")
        int8 = _scores(sim.evaluate(Candidate.make(base.calibration, alone, base.optimization)), metric)
        int16 = None
        setting16 = int16_setting(graph, target, name)
        if setting16 is not None:
            alone16 = dict(alone)
            alone16[name] = setting16
            int16 = _scores(sim.evaluate(Candidate.make(base.calibration, alone16, base.optimization)), metric)
        rows.append(SensitivityRow(node=name, op_type=op, gains=dict(gains[name]), alone_int8=int8, alone_int16=int16))
        if progress:
            progress(i + 1, len(nodes))
    rows.sort(key=lambda r: (-r.gain, r.alone_int8["accuracy"]))
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
    shared: Path | None = None   # a space's cached per-fix gains, when they were used
