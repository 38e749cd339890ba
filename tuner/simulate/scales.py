"""Quantization scales for a calibration setting, computed from the cached statistics.

Every method is a cheap function of the one-pass statistics (``tuner.calib``), so switching
method costs no data pass. Thresholds are memoised per (tensor, method, dtype).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tuner.calib.methods import asymmetric_range, channel_thresholds
from tuner.calib.thresholds import ThresholdMemo
from tuner.calib.stats import TensorStats
from tuner.candidate import Calibration

QMAX = {"int8": 127, "int16": 32767}


@dataclass(frozen=True)
class Scale:
    """Symmetric (zero point 0) or asymmetric uint8 quantization of one tensor."""

    scale: np.ndarray          # scalar, or [C] along axis 1
    zero_point: np.ndarray     # same shape; int8/int16/uint8 dtype
    axis: int | None
    threshold: float           # the per-tensor threshold (for tables)


def method_of(cal: Calibration) -> tuple[str, float | None]:
    """Map hb_mapper's calibration_type (+ max_percentile) to a statistics method."""
    if cal.type == "max" and cal.max_percentile is not None and cal.max_percentile < 1.0:
        return "percentile", cal.max_percentile
    if cal.type in ("max", "kl"):
        return cal.type, None
    raise ValueError(f"calibration_type {cal.type!r} has no direct threshold rule; resolve it first")


class ScaleTable:
    """Scales of every tensor under one explicit calibration (max / max-percentile / kl)."""

    def __init__(self, stats: dict[str, TensorStats], calibration: Calibration, memo: ThresholdMemo | None = None):
        self.stats = stats
        self.memo = memo or ThresholdMemo(stats)
        self.calibration = calibration
        self.method, self.percentile = method_of(calibration)
        self._cache: dict[tuple[str, str], Scale] = {}

    def threshold(self, tensor: str, dtype: str = "int8") -> float:
        return self.get(tensor, dtype).threshold

    def get(self, tensor: str, dtype: str) -> Scale:
        key = (tensor, dtype)
        if key not in self._cache:
            self._cache[key] = self._compute(tensor, dtype)
        return self._cache[key]

    def _compute(self, tensor: str, dtype: str) -> Scale:
        st = self.stats[tensor]
        qmax = QMAX[dtype]
        zdtype = np.int16 if dtype == "int16" else np.int8
        t = self.memo.get(tensor, self.method, self.percentile, qmax)
        if self.calibration.asymmetric and dtype == "int8":
            lo, hi = asymmetric_range(st)
            scale = (hi - lo) / 255.0 if hi > lo else 1.0
            zp = np.uint8(np.clip(np.round(-lo / scale), 0, 255))
            return Scale(np.float32(scale), zp, None, t)
        if self.calibration.per_channel and st.channel_absmax is not None and st.channel_absmax.size > 1:
            ct = channel_thresholds(st, self.method, percentile=self.percentile, qmax=qmax)
            ct = np.where(ct > 0, ct, max(t, 1e-30))
            scales = (ct / qmax).astype(np.float32)
            return Scale(scales, np.zeros(scales.shape, zdtype), 1, t)
        scale = np.float32(t / qmax) if t > 0 else np.float32(1.0)
        return Scale(scale, zdtype(0), None, t)


def floor_threshold(s: Scale, floor: np.ndarray, dtype: str) -> Scale:
    """``s`` with its threshold(s) raised to at least ``floor`` (hb_mapper's AdjustConvQuantParams).

    ``floor`` is per output channel (max|w_c| x input threshold); a per-tensor scale takes its
    max, a per-channel one (axis 1, one entry per channel) each channel's own. Asymmetric uint8
    scales are returned unchanged: the pass concerns int16 outputs, which are never asymmetric.
    """
    if np.asarray(s.zero_point).dtype == np.uint8:
        return s
    qmax = QMAX[dtype]
    floor = np.asarray(floor, np.float64).ravel()
    t = max(s.threshold, float(floor.max()))
    if s.axis is not None and np.size(s.scale) == floor.size:
        scale = np.maximum(np.asarray(s.scale, np.float64), floor / qmax).astype(np.float32)
    elif s.axis is not None:
        scale = np.maximum(np.asarray(s.scale, np.float64), floor.max() / qmax).astype(np.float32)
    else:
        scale = np.float32(max(float(s.scale), float(floor.max()) / qmax))
    return Scale(scale, s.zero_point, s.axis, t)
