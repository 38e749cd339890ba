"""Synthetic hb_mapper calibrated models, built exactly per docs/hb_rules/quantizer.md §4.1 (no public one exists).

:func:`calibrate` inserts ``HzCalibration`` nodes (domain ``horizon``) into a float model the way
hb_mapper's ``*_calibrated_model.onnx`` holds them: ``<tensor>_HzCalibration`` on an activation,
``<weight>_<consumer>_HzCalibration`` on a weight (axis 0), and for an equalized Conv input a
per-channel node with ``dequantize_scale`` in front of that Conv, whose weight is pre-scaled along
its input channels by s_c / max(s) (docs/hb_rules/quantizer.md §1.5).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

#: attributes a real node carries that tuner's reader must ignore
UNKNOWN = {"quant_attrs": 1234, "cali_attrs": "max", "num_bins": 1024, "percentiles": [0.99995], "bits": 8}


def _cal_node(tensor: str, out: str, name: str, attrs: dict) -> onnx.NodeProto:
    a = {"qtype": "int8", "switch": "ON", "constant": 0, "axis": 1, **UNKNOWN, **attrs}
    a["thresholds"] = [float(t) for t in np.atleast_1d(a["thresholds"])]
    return helper.make_node("HzCalibration", [tensor], [out], name=name, domain="horizon", **a)


def calibrate(model: onnx.ModelProto, acts: dict[str, dict], weights: dict[tuple[str, str], dict] | None = None,
              equalized: dict[tuple[str, str], dict] | None = None,
              reads: set[tuple[str, int]] | None = None) -> onnx.ModelProto:
    """``model`` with calibration nodes: ``acts`` {tensor: attrs}, ``weights`` {(weight, consumer): attrs},
    ``equalized`` {(tensor, conv): attrs with per-channel thresholds}; attrs are HzCalibration attributes.
    ``reads``: the (consumer, input index) pairs that read the calibrated value (default: every
    consumer of a calibrated tensor); the others read it unrounded, as a real file's Add of a fused
    Conv + Add does."""
    weights, equalized = weights or {}, equalized or {}
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    out_of = {t: f"{t}_HzCalibration_out" for t in acts}
    before: dict[str, list[onnx.NodeProto]] = {}   # calibration nodes emitted before a node (by name)
    after: dict[str, list[onnx.NodeProto]] = {}    # after the producer of a tensor
    producers = {o: n.name for n in g.node for o in n.output}
    for t, attrs in acts.items():
        after.setdefault(producers.get(t, ""), []).append(_cal_node(t, out_of[t], f"{t}_HzCalibration", attrs))
    for node in g.node:
        for k, t in enumerate(node.input):
            if (t, node.name) in equalized:
                attrs = equalized[(t, node.name)]
                name = f"{t}_{node.name}_HzCalibration"
                before.setdefault(node.name, []).append(_cal_node(t, f"{name}_out", name, attrs))
                node.input[k] = f"{name}_out"
                # hb_mapper's equalization: the Conv weight pre-scaled along its input channels
                s = np.asarray(attrs["thresholds"], np.float64) / 127.0
                w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
                w = w * (s / attrs["dequantize_scale"]).reshape(1, -1, *([1] * (w.ndim - 2)))
                inits[node.input[1]].CopyFrom(numpy_helper.from_array(w.astype(np.float32), node.input[1]))
            elif (t, node.name) in weights:
                name = f"{t}_{node.name}_HzCalibration"
                before.setdefault(node.name, []).append(_cal_node(t, f"{name}_out", name,
                                                                  {"axis": 0, **weights[(t, node.name)]}))
                node.input[k] = f"{name}_out"
            elif t in out_of and (reads is None or (node.name, k) in reads):
                node.input[k] = out_of[t]
    nodes = list(after.get("", []))
    for node in g.node:
        nodes += before.get(node.name, []) + [node] + after.get(node.name, [])
    del g.node[:]
    g.node.extend(nodes)
    m.opset_import.append(helper.make_opsetid("horizon", 1))
    return m


def weight_max(model: onnx.ModelProto, weight: str) -> list[float]:
    """max |w| per output channel (axis 0): hb_mapper's weight thresholds."""
    w = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == weight))
    return np.abs(w.reshape(w.shape[0], -1)).max(axis=1).tolist()
