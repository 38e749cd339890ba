"""The accuracy objective: one number from an evaluation's per-output metrics."""

from __future__ import annotations

import math

import numpy as np

from tuner.errors import TunerError


def accuracy(outputs: dict[str, dict[str, float]], spec: str = "mean_cosine", task: dict[str, float] | None = None) -> float:
    """``mean_cosine`` | ``min_cosine`` | ``mean_sqnr`` | ``cosine:<output>`` | ``sqnr:<output>``, or a
    task metric computed during the evaluation (``miou:seg``, ``seg_agreement:seg``, ...)."""
    if task and spec in task:
        return float(task[spec])
    if spec == "mean_cosine":
        return float(np.mean([m["cosine"] for m in outputs.values()]))
    if spec == "min_cosine":
        return float(min(m["cosine"] for m in outputs.values()))
    if spec == "mean_sqnr":
        return float(np.mean([min(m["sqnr_db"], 200.0) for m in outputs.values()]))
    kind, _, name = spec.partition(":")
    if name not in outputs:
        raise TunerError(f"objectives.accuracy: the model has no output {name!r}; it has {', '.join(outputs)}")
    value = outputs[name]["cosine" if kind == "cosine" else "sqnr_db"]
    return float(min(value, 200.0)) if kind == "sqnr" and math.isinf(value) else float(value)
