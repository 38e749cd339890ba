"""How much each node's quantization costs: the accuracy gained when it alone stays float.

One evaluation per node on top of the all-int8 baseline (the node is placed on the CPU, so
its inputs and weights stay float). The search uses the ranking to pick its top-K free
nodes and to build the usual manual plans for its warm start; results are cached in the
study folder, keyed by the fingerprints they came from.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tuner.candidate import Candidate, NodeSetting
from tuner.export.hb_yaml import write_atomic
from tuner.metrics.accuracy import accuracy
from tuner.simulate import Simulator


def leave_one_float(sim: Simulator, base: Candidate, nodes: list[str], metric: str = "mean_cosine",
                    progress: Callable[[int, int], None] | None = None) -> dict[str, float]:
    """accuracy(node on CPU) - accuracy(base), per node. Larger means more sensitive."""
    first = sim.evaluate(base)
    ref = accuracy(first.outputs, metric, first.task)
    out = {}
    for i, name in enumerate(nodes):
        settings = dict(base.nodes)
        settings[name] = NodeSetting(on="CPU")
        cand = Candidate.make(base.calibration, settings, base.optimization)
        ev = sim.evaluate(cand)
        out[name] = accuracy(ev.outputs, metric, ev.task) - ref
        if progress:
            progress(i + 1, len(nodes))
    return out


def cached_sensitivity(path: Path, key: str, compute: Callable[[], dict[str, float]]) -> dict[str, float]:
    """Read ``path`` when it was computed for ``key``, else compute and write it atomically."""
    if path.is_file():
        try:
            data = json.loads(path.read_text())
            if data.get("key") == key:
                return {k: float(v) for k, v in data["sensitivity"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    values = compute()
    write_atomic(path, json.dumps({"key": key, "sensitivity": values}, indent=1))
    return values
