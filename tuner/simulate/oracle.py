"""onnxruntime's own static quantizer, configured to a plan: the oracle and the naive baseline.

``quantize_static`` builds a QDQ model from scratch (calibration pass, Q/DQ insertion) for
every call. With the simulator's scales forced through ``TensorQuantOverrides`` it must
produce the same quantized model the simulator runs; tests use that as an independent
check, and ``benchmarks/trial_cost.py`` times it as the naive per-trial path.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import version_converter
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

from tuner.graph import Graph, Target
from tuner.inputs.data import DataSet
from tuner.simulate.plan import Plan
from tuner.simulate.qdq import HB_TABLES, set_hb_table
from tuner.simulate.scales import ScaleTable


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """quantize_static logs advice ("consider pre-processing", per-axis fallbacks) on the root
    logger for every call; for an oracle and a baseline that is noise."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


class _Reader(CalibrationDataReader):  # type: ignore[misc]  # onnxruntime has no type stubs
    def __init__(self, data: DataSet, limit: int):
        self._it = iter(data)
        self._left = limit

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._left <= 0:
            return None
        self._left -= 1
        return next(self._it, None)


def ort_quantize(model: onnx.ModelProto, graph: Graph, plan: Plan, scales: ScaleTable, data: DataSet,
                 calib_samples: int = 2) -> onnx.ModelProto:
    """QDQ model from ``quantize_static`` with the plan's BPU op types and the table's int8 scales."""
    overrides = {}
    for tensor in graph.activation_tensors():
        if tensor in scales.stats:
            s = scales.get(tensor, "int8")
            if s.axis is None:
                overrides[tensor] = [{"scale": np.array(s.scale, np.float32), "zero_point": np.array(0, np.int8)}]
    op_types = sorted({n.op_type for n in graph if plan.placement[n.name] == "BPU"})
    tables = {n.name: HB_TABLES[n.op_type] for n in graph if plan.bpu_tables and n.op_type in HB_TABLES
              and plan.placement[n.name] == "BPU"}
    if tables:   # the function hb's BPU table computes, as the simulator runs it (qdq.HB_TABLES)
        model = copy.deepcopy(model)
        for node in model.graph.node:
            if node.name in tables:
                set_hb_table(node, tables[node.name])
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 13:
        # Per-channel DequantizeLinear (axis) needs opset 13; below it quantize_static writes an
        # invalid model, so upgrade first (the upgrade does not change the math).
        model = version_converter.convert_version(model, 13)
    with tempfile.TemporaryDirectory() as tmp, _quiet_root_logger():
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "qdq.onnx"
        onnx.save(model, str(src))
        quantize_static(str(src), str(dst), _Reader(data, calib_samples), quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=op_types, per_channel=True, activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
                        nodes_to_exclude=[n.name for n in graph if plan.placement[n.name] != "BPU"],
                        # QuantizeBias: the simulator keeps Conv biases in float; int32 biases would
                        # shift rounding at every later quantizer (output cosine 0.9925 on PP-OCRv4 det).
                        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True,
                                       # data-movement ops (Slice, Reshape, ...) fed by a graph input
                                       # are otherwise left float; every BPU op quantizes its input
                                       "ForceQuantizeNoInputCheck": True, "QuantizeBias": False,
                                       "TensorQuantOverrides": overrides})
        return onnx.load(str(dst))


def ort_semantics(target: Target) -> Target:
    """``target`` with the quantization points onnxruntime's quantizer uses.

    quantize_static knows no Horizon fusion groups and no int32 outputs; its data-movement
    ops (QDQDirect8BitOp and friends) quantize their output "same as input", Resize and
    AveragePool included; Relu and Clip get their own output scale; and, with scales forced
    through overrides, Conv biases stay float. It shares no thresholds across groups, rounds
    outputs in int8 and lets a CPU node read float (hb's post-calibration rules off). Comparing
    the simulator with it like for like needs the same rules.
    """
    return dataclasses.replace(
        target, fusion_patterns=(), lut_ops=frozenset(), int32_output_ops=frozenset(), quantize_bias=False,
        post_calibration=False,
        passive_ops=frozenset({"Slice", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Split",
                               "Gather", "GatherElements", "MaxPool", "TopK"}),
        same_scale_ops=frozenset({"Resize", "AveragePool"}))
