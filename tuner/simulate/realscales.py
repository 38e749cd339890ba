"""Scales from hb_mapper's real thresholds (its ``*_calibrated_model.onnx``) instead of tuner's calibration.

:class:`RealScales` has the interface of :class:`~tuner.simulate.scales.ScaleTable` (``get``,
``threshold``, ``stats``, ``calibration``) so that :func:`~tuner.simulate.qdq.build_sim_model` takes it
as it is. Per tensor it uses the tensor's ``HzCalibration`` node (docs/hb_rules/quantizer.md §4.1-4.2):

* scale = threshold / qmax(qtype); several thresholds are per channel (axis 1), used as such on an
  equalized Conv input (``channel=True``) and with ``dequantize_scale`` as the one dequantization
  scale when the node has it; anywhere else the largest channel's threshold applies;
* a ``uint8`` node is the range [0, T] (zero point 0), or [min, max] when it holds two thresholds
  with a negative first one (the asymmetric form);
* qtypes: with ``honour_qtypes`` (``eval --thresholds``: the calibrated model is the YAML's own) the
  node's qtype is the dtype, whatever tuner's plan asked; without it (a search around the real
  calibration) the plan's int8/int16 choice stands and only uint8 nodes stay uint8;
* a tensor hb_mapper did not calibrate, or left unquantized (``switch: OFF``, a float qtype), takes
  tuner's own scale (``fallback``); ``tuner import-calibrated`` lists those differences;
* weights: the real per-output-channel thresholds of ``<weight>_<consumer>_HzCalibration``
  (:meth:`weight_thresholds`), else tuner's max |w|.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tuner.candidate import Calibration
from tuner.graph import Graph
from tuner.inputs.calibrated import HzNode
from tuner.inputs.calibrated_map import MappedThresholds
from tuner.simulate.plan import Plan
from tuner.simulate.scales import QMAX, Scale, Scales

_ZP: dict[str, type[np.integer[Any]]] = {"int8": np.int8, "int16": np.int16, "uint8": np.uint8}


@dataclass(frozen=True)
class RealCalibration:
    """The calibration "as hb_mapper chose it": keys sessions and scale caches like a Calibration."""

    real: MappedThresholds
    fallback: Any = Calibration("max")     # a Calibration (or default's resolved choice)
    honour_qtypes: bool = True

    type = "real"
    max_percentile = None
    per_channel = False
    asymmetric = False

    def describe(self) -> str:
        return f"real thresholds ({len(self.real.activations)} tensor(s) from {self.real.source})"


def refine(t: float) -> float:
    """hb_mapper's RefineThreshold (docs/hb_rules/quantizer.md §1.8): a threshold <= 0 becomes 1.0, inf float32's
    max."""
    if not t > 0:
        return 1.0
    return min(t, float(np.finfo(np.float32).max))


def node_scale(node: HzNode, qtype: str, channel: bool) -> Scale:
    """The Scale of one calibration node on the ``qtype`` grid; per channel (along the node's axis)
    only with ``channel``, else the largest threshold."""
    zdt = _ZP[qtype]
    qmax = QMAX[qtype]
    thr = [float(t) for t in node.thresholds]
    if qtype == "uint8" and node.asymmetric:
        lo, hi = thr
        scale = np.float32((hi - lo) / 255.0 if hi > lo else 1.0)
        zp = np.uint8(np.clip(round(-lo / float(scale)), 0, 255))
        return Scale(scale, zp, None, max(abs(lo), abs(hi)))
    t_max = refine(max(abs(t) for t in thr))
    if channel and len(thr) > 1:
        scales = (np.array([refine(abs(t)) for t in thr], np.float64) / qmax).astype(np.float32)
        return Scale(scales, np.zeros(scales.shape, zdt), node.axis, t_max,
                     dequant=float(node.dequantize_scale) if node.dequantize_scale else None)
    return Scale(np.float32(t_max / qmax), zdt(0), None, t_max)


class RealScales:
    """Scales of every tensor from the real thresholds, tuner's ``fallback`` where there are none."""

    def __init__(self, calibration: RealCalibration, fallback: Scales):
        self.calibration = calibration
        self.real = calibration.real
        self.fallback = fallback
        self.stats = fallback.stats
        self._cache: dict[tuple[str, str, bool], Scale] = {}

    def node_for(self, tensor: str, channel: bool = False) -> HzNode | None:
        """The calibration node whose thresholds apply to ``tensor`` (the equalized one for a Conv
        input), or None when hb_mapper does not round it to an integer grid."""
        nodes = [n for n in self.real.activations.get(tensor, ()) if n.quantizes]
        if not nodes:
            return None
        equalized = [n for n in nodes if n.dequantize_scale is not None and n.per_channel and n.axis == 1]
        plain = [n for n in nodes if n.dequantize_scale is None]
        if channel and equalized:
            return equalized[0]
        return (plain or nodes)[0]

    def qtype(self, node: HzNode, dtype: str) -> str:
        if self.calibration.honour_qtypes:
            return node.qtype
        return "uint8" if node.qtype == "uint8" and dtype == "int8" else dtype

    def get(self, tensor: str, dtype: str, channel: bool = False) -> Scale:
        key = (tensor, dtype, channel)
        if key not in self._cache:
            node = self.node_for(tensor, channel)
            if node is None:
                self._cache[key] = self.fallback.get(tensor, dtype, False)
            else:
                self._cache[key] = node_scale(node, self.qtype(node, dtype), channel)
        return self._cache[key]

    def threshold(self, tensor: str, dtype: str = "int8") -> float:
        return self.get(tensor, dtype).threshold

    def weight_values(self, consumer: str) -> np.ndarray | None:
        """``consumer``'s fake-quantized weight where hb_mapper quantized a folded form of it
        (MappedThresholds.folded), or None."""
        return self.real.folded.get(consumer)

    def weight_thresholds(self, consumer: str) -> np.ndarray | None:
        """Real per-output-channel thresholds of ``consumer``'s weight (int8, axis 0), or None."""
        node = self.real.weights.get(consumer)
        if node is None or not node.quantizes or node.qtype != "int8":
            return None
        return np.array([refine(abs(t)) for t in node.thresholds], np.float64)


def _grid(node: HzNode) -> str:
    """The plan's dtype label of a calibration node (its scale comes from the node, uint8 included)."""
    return "int16" if node.qtype == "int16" else "int8"


def real_plan(plan: Plan, graph: Graph, real: MappedThresholds) -> Plan:
    """``plan`` with hb_mapper's quantization points where its calibrated model shows them (``eval
    --thresholds``: the file is the YAML's own).

    * An input of a node hb_mapper's graph has under the same name reads what it reads there: the
      value of a rounding calibration node (a quantization point, with that node's qtype), or the
      tensor unrounded (no point: a switch-OFF node, the Add of a fused Conv + Add, ...).
    * Any other input of a tensor hb_mapper rounds is rounded; of a tensor its graph has and rounds
      nowhere, left float (:meth:`MappedThresholds.leaves_float`).
    * A model output hb_mapper rounds (``<out>_before`` -> ``<out>``) is rounded in its qtype; one it
      leaves float is not.
    * A tensor no tensor of hb_mapper's graph holds (matched by float values: hb_mapper folded it
      away, e.g. the per-channel Mul/Add of PP-OCRv4's blocks folded into the Conv before them) is
      left float: hb_mapper cannot round a tensor it does not compute. Matched by names only, such
      a tensor keeps tuner's plan and tuner's scale for the YAML's calibration (:class:`RealScales`'
      fallback), as every tensor does in a search around the real thresholds.

    A rounded tensor takes its own node's scale, not one lent by a same-scale op upstream.
    BPU Softmax parts keep tuner's plan.
    """
    def rounding(tensor: str) -> HzNode | None:
        return next((n for n in real.activations.get(tensor, ()) if n.quantizes), None)

    edges = dict(plan.edges)
    cpu_reads = dict(plan.cpu_reads)
    passthrough = dict(plan.passthrough)
    outputs = dict(plan.outputs)
    for node in graph:
        if node.name in plan.softmax:
            continue
        cpu = plan.placement.get(node.name) == "CPU"
        for k, tensor in enumerate(node.inputs):
            key = (node.name, k)
            if not graph.is_activation(tensor):
                continue
            if key in real.reads:
                hz = real.reads[key]
                hz = hz if hz is not None and hz.quantizes else None
            elif rounding(tensor) is not None:
                hz = rounding(tensor)
            elif real.leaves_float(tensor) or (real.by_value and tensor not in real.present):
                hz = None
            else:
                continue              # unknown to the file: tuner's plan stands
            edges.pop(key, None)
            cpu_reads.pop(key, None)
            passthrough.pop(key, None)
            if hz is not None:
                (cpu_reads if cpu else edges)[key] = (tensor, _grid(hz))
    for out in graph.output_names:
        hz = rounding(out)
        if hz is not None:
            outputs[out] = _grid(hz)
        elif real.leaves_float(out):
            outputs.pop(out, None)
    own = {t for t in real.activations if rounding(t) is not None}
    return replace(without_real_rules(plan, real), edges=edges, cpu_reads=cpu_reads, passthrough=passthrough,
                   outputs=outputs, scale_of={t: v for t, v in plan.scale_of.items() if t not in own},
                   emitted={t: v for t, v in plan.emitted.items() if t not in own}, notes=list(plan.notes))


def without_real_rules(plan: Plan, real: MappedThresholds) -> Plan:
    """``plan`` without tuner's fixed, derived and uint8 rules (tuner.simulate.fixed) for the tensors
    hb_mapper's calibrated model rounds itself: its real thresholds and qtypes stand there unchanged,
    and tuner's rules apply only to tensors the file does not know."""
    own = {t for t, nodes in real.activations.items() if any(n.quantizes for n in nodes)}
    if not own & (set(plan.fixed) | set(plan.derived) | plan.unsigned):
        return plan
    return replace(plan, fixed={t: f for t, f in plan.fixed.items() if t not in own},
                   derived={t: d for t, d in plan.derived.items() if t not in own},
                   unsigned=frozenset(plan.unsigned - own))
