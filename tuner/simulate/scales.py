"""Quantization scales for a calibration setting, computed from the cached statistics.

Every method is a cheap function of the one-pass statistics (``tuner.calib``), so switching
method costs no data pass. Thresholds are memoised per (tensor, method, dtype).

Two of hb_mapper's rules live here (hb_quantizer_facts section 1, read from horizon_nn's source):

* **per_channel** activation scales exist only in front of a Conv, where hb_mapper deploys them by
  equalization (``ActivationEqualization``, src 24558990649 / 24271918369): every other use of a
  tensor stays per-tensor. :meth:`ScaleTable.get` gives per-channel scales only when asked for a
  Conv input (``channel=True``); :mod:`tuner.simulate.qdq` folds them into the Conv's weights.
* **asymmetric** does not compute min/max affine ranges: the asymmetric variants reuse the
  symmetric thresholds (src 24313449169), and the eligible calibration nodes become ``uint8`` with
  scale ``T / 255`` and zero point 0, i.e. the range [0, T] (src 24364465367). Which nodes are
  eligible is decided in C++; tuner takes the non-negative tensors (min >= 0, e.g. after a ReLU)
  [inferred, hb_quantizer_facts 1.6]. Signed tensors stay int8 symmetric. The method's clipping
  (max-percentile, kl) is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tuner.calib.methods import channel_thresholds
from tuner.calib.stats import TensorStats
from tuner.calib.thresholds import ThresholdMemo
from tuner.candidate import Calibration

QMAX = {"int8": 127, "int16": 32767, "uint8": 255}


@dataclass(frozen=True)
class Scale:
    """Symmetric (zero point 0) or asymmetric uint8 quantization of one tensor."""

    scale: np.ndarray | np.floating[Any]       # scalar, or [C] along axis 1
    zero_point: np.ndarray | np.integer[Any]   # same shape; int8/int16/uint8 dtype
    axis: int | None
    threshold: float           # the per-tensor threshold (for tables)
    dequant: float | None = None   # an explicit dequantize_scale (real thresholds), else the largest channel's

    @property
    def dequantize_scale(self) -> float:
        """The single scale an equalized Conv input is dequantized with: the largest channel's
        (HzCalibration's ``dequantize_scale``, hb_quantizer_facts 4.1), unless given."""
        return float(self.dequant) if self.dequant is not None else float(np.max(self.scale))


def method_of(cal: Calibration) -> tuple[str, float | None]:
    """Map hb_mapper's calibration_type (+ max_percentile) to a statistics method."""
    if cal.max_percentile is not None:   # normalised by Calibration: max only, below 1
        return "max-percentile", cal.max_percentile   # hb_mapper's reading (tuner.calib.methods)
    if cal.type in ("max", "kl"):
        return cal.type, None
    raise ValueError(f"calibration_type {cal.type!r} has no direct threshold rule; resolve it first")


class Scales(Protocol):
    """What the simulated graph reads its scales from: a :class:`ScaleTable`, or mix's and the
    real thresholds' tables (tuner.simulate.calibrate.MixScales, tuner.simulate.realscales.RealScales)."""

    stats: dict[str, TensorStats]

    def get(self, tensor: str, dtype: str, channel: bool = False) -> Scale: ...

    def threshold(self, tensor: str, dtype: str = "int8") -> float: ...


class ScaleTable:
    """Scales of every tensor under one explicit calibration (max / max-percentile / kl)."""

    def __init__(self, stats: dict[str, TensorStats], calibration: Calibration, memo: ThresholdMemo | None = None):
        self.stats = stats
        self.memo = memo or ThresholdMemo(stats)
        self.calibration = calibration
        self.method, self.percentile = method_of(calibration)
        self._cache: dict[tuple[str, str, bool], Scale] = {}

    def threshold(self, tensor: str, dtype: str = "int8") -> float:
        return self.get(tensor, dtype).threshold

    def get(self, tensor: str, dtype: str, channel: bool = False) -> Scale:
        """The scale of ``tensor`` in ``dtype``; per-channel (axis 1) only with ``channel`` (a Conv
        input) under a per_channel calibration and when the tensor has several channels."""
        channel = channel and self.calibration.per_channel
        key = (tensor, dtype, channel)
        if key not in self._cache:
            self._cache[key] = self._compute(tensor, dtype, channel)
        return self._cache[key]

    def unsigned(self, tensor: str, dtype: str) -> bool:
        """Asymmetric calibration turns this tensor's int8 node into uint8 (range [0, T])."""
        return self.calibration.asymmetric and dtype == "int8" and self.stats[tensor].min >= 0.0

    def _compute(self, tensor: str, dtype: str, channel: bool) -> Scale:
        st = self.stats[tensor]
        unsigned = self.unsigned(tensor, dtype)
        qmax = QMAX["uint8" if unsigned else dtype]
        zdtype = np.uint8 if unsigned else np.int16 if dtype == "int16" else np.int8
        # Thresholds are those of the signed grid: the asymmetric variant copies them (1.6).
        t = self.memo.get(tensor, self.method, self.percentile, QMAX[dtype])
        if channel and st.channel_absmax is not None and st.channel_absmax.size > 1:
            ct = channel_thresholds(st, self.method, percentile=self.percentile, qmax=QMAX[dtype])
            ct = np.where(ct > 0, ct, max(t, 1e-30))
            scales = (ct / qmax).astype(np.float32)
            return Scale(scales, np.zeros(scales.shape, zdtype), 1, t)
        scale = np.float32(t / qmax) if t > 0 else np.float32(1.0)
        return Scale(scale, zdtype(0), None, t)
