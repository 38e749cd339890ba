"""Quantization scales for a calibration setting, computed from the cached statistics.

Every method is a cheap function of the one-pass statistics (``tuner.calib``), so switching
method costs no data pass. Thresholds are memoised per (tensor, method, dtype).

Two of hb_mapper's rules live here (docs/hb_rules/quantizer.md §1, read from horizon_nn's source):

* **per_channel** activation scales exist only on the tensors hb's C++ selects (a Conv's output or a model
  input read only by Convs, lowered Muls and residual Adds, H x W >= 10, largest channel maximum >= 16:
  :mod:`tuner.simulate.perchannel`), with its channel scales: :func:`channelwise` turns a tensor's
  per-tensor Scale into that form, and :mod:`tuner.simulate.qdq` folds it into the Conv readers' weights
  (``ActivationEqualization``, src 24558990649 / 24271918369). :meth:`ScaleTable.get` with
  ``channel=True`` gives plain per-channel thresholds (default's comparison model only).
* **asymmetric** does not compute min/max affine ranges: the asymmetric variants reuse the
  symmetric thresholds (src 24313449169), and the eligible calibration nodes become ``uint8`` with
  scale ``T / 255`` and zero point 0, i.e. the range [0, T] (src 24364465367). Which nodes are
  eligible is a property of the graph, decided where the plan is made
  (:func:`tuner.simulate.fixed.unsigned_tensors`, measured on the real toolchain); a ScaleTable
  gives the uint8 form when asked for dtype ``uint8`` and :class:`PlanScales` asks for it. The
  method's clipping (max-percentile, kl) is kept.

Thresholds hb_mapper does not take from calibration at all (:class:`Fixed`, :class:`Derived`:
a Sigmoid's input 5.49897, a Sigmoid's output sigmoid(input threshold), ...) are rules of the plan
too; :class:`PlanScales` lays them and the uint8 choice over any table (see
``docs/hb_rules/calibration.md`` section 6 and :mod:`tuner.simulate.fixed` for the measurements).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tuner.calib.methods import channel_thresholds
from tuner.calib.stats import TensorStats
from tuner.calib.thresholds import ThresholdMemo
from tuner.candidate import Calibration
from tuner.graph.hz import HB_HARD_SIGMOID

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
    def per_tensor_symmetric(self) -> bool:
        """One scale and zero point 0: the only points hb's integer kernels were measured on (intconv,
        intadd) and the input points its preprocess node requantizes (SimData.board_samples)."""
        return self.axis is None and not np.asarray(self.zero_point).any()

    @property
    def dequantize_scale(self) -> float:
        """The single scale an equalized Conv input is dequantized with: the largest channel's
        (HzCalibration's ``dequantize_scale``, docs/hb_rules/quantizer.md §4.1), unless given."""
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

    def _compute(self, tensor: str, dtype: str, channel: bool) -> Scale:
        st = self.stats[tensor]
        unsigned = dtype == "uint8"     # the asymmetric form of an int8 node (PlanScales asks for it)
        grid = "int8" if unsigned else dtype
        qmax = QMAX[dtype]
        zdtype = np.uint8 if unsigned else np.int16 if dtype == "int16" else np.int8
        # Thresholds are those of the signed grid: the asymmetric variant copies them (1.6).
        t = self.memo.get(tensor, self.method, self.percentile, QMAX[grid])
        if channel and st.channel_absmax is not None and st.channel_absmax.size > 1:
            ct = channel_thresholds(st, self.method, percentile=self.percentile, qmax=QMAX[grid])
            ct = np.where(ct > 0, ct, max(t, 1e-30))
            scales = (ct / qmax).astype(np.float32)
            return Scale(scales, np.zeros(scales.shape, zdtype), 1, t)
        scale = np.float32(t / qmax) if t > 0 else np.float32(1.0)
        return Scale(scale, zdtype(0), None, t)


def channelwise(s: Scale, ratios: np.ndarray, top: float | None = None) -> Scale:
    """The per-channel form hb gives a per-tensor Scale under ``per_channel`` (tuner.simulate.perchannel):
    channel c on threshold ``T / ratios[c]`` (axis 1), the same zero point; the widest channel (ratio 1)
    keeps ``T``, whose scale is the one an equalized Conv dequantizes with (``dequantize_scale``).

    ``T`` is the calibration method's threshold of the channel-scaled tensor (hb calibrates the node
    after the scales are set). With every ratio 1 that is ``s``'s own; otherwise tuner, which has no
    per-channel histograms, takes the scaled tensor's maximum ``top`` (the largest channel maximum:
    every scaled channel reaches about it). Exact under max; on PP-OCRv4 (the 3 tensors with ratios
    above 1) hb's max-percentile 0.99995 thresholds are 0.2-4 % below it, its kl ones 0.5-19 %, where
    the unscaled tensor's thresholds were 20-75 % below (detector output cosine under kl, per_channel:
    0.9787 against the real 0.9797, was 0.9388)."""
    ratios = np.asarray(ratios, np.float64)
    t = float(s.threshold)
    base = float(np.asarray(s.scale).max())
    if top is not None and np.any(ratios > 1) and t > 0:
        base, t = base * top / t, top
    scale = (base / ratios).astype(np.float32)
    zdtype = np.asarray(s.zero_point).dtype
    return Scale(scale, np.full(scale.shape, np.asarray(s.zero_point).max(), zdtype), 1, t)


def per_tensor(threshold: float, dtype: str) -> Scale:
    """The symmetric per-tensor Scale of ``threshold`` on the ``dtype`` grid."""
    zdtype = np.int16 if dtype == "int16" else np.int8
    return Scale(np.float32(threshold / QMAX[dtype]), zdtype(0), None, float(threshold))


#: hb_mapper's fixed input thresholds of a LUT op whose input node only it reads, by the dtype of that
#: input (float32 values read from real calibrated models, hmct 1.1.0; docs/hb_rules/calibration.md 6):
#: Sigmoid 5.49897 in int8 whatever the data (max 1.70 and 36.6 alike), 11.09031 in int16 (ln(65535)
#: as hb rounds it: sigmoid of it is 1 - 2^-16); HardSigmoid 3.0 in both.
FIXED_INPUT: dict[str, dict[str, float]] = {
    "Sigmoid": {"int8": 5.498970031738281, "int16": 11.090310096740723},
    "HardSigmoid": {"int8": 3.0, "int16": 3.0},
}
#: The input of a BPU Softmax's Exp table (its Sub part's output, x - max x): fixed like a LUT input, by the
#: Softmax's dtype, whatever the data (toy Conv -> GlobalAveragePool -> Reshape -> Softmax with input
#: thresholds 0.048, 0.94 and 9.36 under set_Softmax_input_int8 and int16, set_all_nodes_int16, and PP-OCR's
#: classifier under set_all_nodes_int16: its data gives 3.25). Not an op of the graph: keyed apart.
SOFTMAX_EXP = "SoftmaxExp"
FIXED_INPUT[SOFTMAX_EXP] = {"int8": 5.644179821014404, "int16": 11.090324401855469}


@dataclass(frozen=True)
class Fixed:
    """A threshold hb_mapper fixes instead of calibrating.

    ``kind`` is a LUT op of :data:`FIXED_INPUT` (its input, fixed by ``dtype``, the dtype the LUT reads
    it in: one number for every point of the tensor's group, as hb shares one threshold), or ``unit``:
    scale 1 on whatever grid reads it (threshold = the grid's qmax), what hb gives the 0/1 output of a
    Cast (the Where split's ``<name>_cast``: 127.0 in int8, 32767.0 under set_all_nodes_int16, measured
    on the example's calibrated models)."""

    kind: str
    dtype: str = "int8"

    def threshold(self, dtype: str) -> float:
        if self.kind == "unit":
            return float(QMAX[dtype])
        return FIXED_INPUT[self.kind][self.dtype]


def _hard_sigmoid(t: float) -> float:
    alpha, beta = HB_HARD_SIGMOID      # hb's table function, not the node's attributes
    return min(1.0, max(0.0, alpha * t + beta))


@dataclass(frozen=True)
class Derived:
    """A LUT op's output threshold as hb_mapper sets it: the op applied to its input's threshold
    (Sigmoid, HardSigmoid, Tanh, Softplus; measured: sigmoid(8.35089) = 0.999764 where the input is
    shared and calibrated, hard_sigmoid(2.01287) = 0.835479 (hb's slope 1/6 whatever the node's alpha:
    2.2898 -> 0.8816 with alpha 0.2, tuner.graph.optimize.HB_HARD_SIGMOID), softplus and tanh of the kl input
    threshold, not the output's own kl threshold). ``source`` is the tensor whose threshold the input
    point uses, ``dtype`` the dtype it is read in."""

    op: str
    source: str
    dtype: str

    def value(self, t_in: float) -> float:
        if self.op == "Sigmoid":
            return 1.0 / (1.0 + math.exp(-t_in))
        if self.op == "HardSigmoid":
            return _hard_sigmoid(t_in)
        if self.op == "Tanh":
            return math.tanh(t_in)
        if self.op == "Softplus":
            return t_in + math.log1p(math.exp(-t_in))
        raise ValueError(f"no derived threshold for {self.op}")


class PlanScales:
    """A table's scales under one plan's rules: :class:`Fixed` and :class:`Derived` thresholds win
    over calibration, and under an asymmetric calibration the plan's ``unsigned`` tensors (its uint8
    choice, tuner.simulate.fixed) take their int8 points in uint8. Every other lookup is the table's.
    Built per simulated model (cheap: the table keeps its cache)."""

    def __init__(self, inner: Scales, fixed: Mapping[str, Fixed], derived: Mapping[str, Derived],
                 unsigned: AbstractSet[str]):
        self.inner = inner
        self.stats = inner.stats
        self.calibration = getattr(inner, "calibration", None)
        self.fixed, self.derived, self.unsigned = fixed, derived, unsigned
        self.asymmetric = bool(getattr(self.calibration, "asymmetric", False))

    def get(self, tensor: str, dtype: str, channel: bool = False) -> Scale:
        f = self.fixed.get(tensor)
        if f is not None:
            return per_tensor(f.threshold(dtype), dtype)
        d = self.derived.get(tensor)
        if d is not None:
            return per_tensor(d.value(self.get(d.source, d.dtype).threshold), dtype)
        if self.asymmetric and dtype == "int8" and tensor in self.unsigned:
            return self.inner.get(tensor, "uint8", channel)
        return self.inner.get(tensor, dtype, channel)

    def threshold(self, tensor: str, dtype: str = "int8") -> float:
        return self.get(tensor, dtype).threshold

