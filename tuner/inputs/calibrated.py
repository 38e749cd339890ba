"""Read hb_mapper's ``*_calibrated_model.onnx``: every ``HzCalibration`` node as a frozen value.

Format (docs/hb_rules/quantizer.md §4.1, src 24364465367 / 24573545063 / 24271918369): one node per
quantized tensor, op type ``HzCalibration`` (domain ``horizon``), one data input, its output the
fake-quantized tensor (``switch == "ON"``) or the tensor unchanged (``"OFF"``). Names are
``<tensor>_HzCalibration`` for activations and ``<weight>_<consumer>_HzCalibration`` for weights.
Attributes read here: ``thresholds`` (1 value: per tensor; C: per channel along ``axis``; 2 on a
uint8 node: [min, max]), ``qtype`` (``int8`` when absent), ``axis`` (default 1), ``switch``,
``constant``, ``dequantize_scale`` (an equalized Conv input: quantize with the channel scales,
dequantize with this one value, docs/hb_rules/quantizer.md §1.5) and ``group``. Every other attribute (``quant_attrs``,
``cali_attrs``, ``num_bins``, ``percentiles``, legacy ``bits``/``info_strings``...) is ignored, so a
newer toolchain's extra fields do not break the reader. A malformed node is an error naming it.

Checked against the real files of hb_mapper 1.24.3 (tests/toolchain/test_calibrated_real.py): their
tensor names are those of hb_mapper's optimized graph, which tuner.inputs.realmatch.address maps
to tuner's (by name, by producer, checked by float value); the synthetic files of the other tests
follow these notes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import numpy_helper

from tuner.errors import TunerError

OP = "HzCalibration"
SUFFIX = "_HzCalibration"
#: Integer grids a calibration node can fake-quantize to, and their largest level (docs/hb_rules/quantizer.md §1.1).
QMAX = {"int8": 127, "int16": 32767, "uint8": 255}


@dataclass(frozen=True)
class HzNode:
    """One ``HzCalibration`` node. ``tensor`` is what it reads (through other calibration nodes);
    ``kind`` is ``weight`` when that is an initializer (``consumer``: the node that reads the
    fake-quantized weight), else ``activation``; ``output`` is the tensor the node writes."""

    name: str
    tensor: str
    kind: str
    thresholds: tuple[float, ...]
    qtype: str = "int8"
    axis: int = 1
    switch: str = "ON"
    constant: int = 0
    dequantize_scale: float | None = None
    consumer: str | None = None
    output: str = ""
    group: int = 1

    @property
    def on(self) -> bool:
        return self.switch == "ON"

    @property
    def quantizes(self) -> bool:
        """Whether the node rounds to an integer grid (ON, with an int8/int16/uint8 qtype)."""
        return self.on and self.qtype in QMAX and bool(self.thresholds)

    @property
    def threshold(self) -> float:
        """The per-tensor figure: the largest |threshold| (of [min, max] on an asymmetric node)."""
        return max(abs(t) for t in self.thresholds) if self.thresholds else math.nan

    @property
    def asymmetric(self) -> bool:
        return self.qtype == "uint8" and len(self.thresholds) == 2 and self.thresholds[0] < 0

    @property
    def per_channel(self) -> bool:
        return len(self.thresholds) > 1 and not self.asymmetric

    def as_dict(self) -> dict:
        return {"name": self.name, "tensor": self.tensor, "kind": self.kind, "thresholds": list(self.thresholds),
                "qtype": self.qtype, "axis": self.axis, "switch": self.switch, "constant": self.constant,
                "dequantize_scale": self.dequantize_scale, "consumer": self.consumer, "output": self.output,
                "group": self.group}

    @classmethod
    def from_dict(cls, d: dict) -> HzNode:
        return cls(**{**d, "thresholds": tuple(d["thresholds"])})


@dataclass(frozen=True)
class CalibratedModel:
    """The calibrated model file: its proto and its calibration nodes in graph order."""

    path: Path
    proto: onnx.ModelProto
    nodes: tuple[HzNode, ...]

    def activations(self) -> list[HzNode]:
        return [n for n in self.nodes if n.kind == "activation"]

    def weights(self) -> list[HzNode]:
        return [n for n in self.nodes if n.kind == "weight"]


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _attribute(node: onnx.NodeProto, attr: onnx.AttributeProto):
    """The value of one attribute, whatever type the writer chose (floats, a float, ints, a tensor)."""
    try:
        value = onnx.helper.get_attribute_value(attr)
    except Exception as exc:  # an attribute type onnx itself cannot decode
        raise TunerError(f"HzCalibration node {node.name!r}: attribute {attr.name!r} cannot be read ({exc})") from None
    if isinstance(value, onnx.TensorProto):
        value = numpy_helper.to_array(value).ravel().tolist()
    return value


def _floats(node: onnx.NodeProto, name: str, value) -> tuple[float, ...]:
    items = value if isinstance(value, (list, tuple)) else [value]
    try:
        out = tuple(float(v) for v in items)
    except (TypeError, ValueError):
        raise TunerError(f"HzCalibration node {node.name!r}: attribute {name!r} must be numbers, got "
                         f"{value!r}") from None
    if any(math.isnan(v) for v in out):
        raise TunerError(f"HzCalibration node {node.name!r}: attribute {name!r} holds NaN (hb_mapper stops on a NaN "
                         "threshold too); the calibration data or the model produce NaN there")
    return out


def _node(node: onnx.NodeProto, source: dict[str, str], initializers: set[str],
          readers: dict[str, list[str]]) -> HzNode:
    if not node.input or not node.input[0]:
        raise TunerError(f"HzCalibration node {node.name!r} has no data input")
    if not node.output or not node.output[0]:
        raise TunerError(f"HzCalibration node {node.name!r} has no output")
    attrs = {a.name: _attribute(node, a) for a in node.attribute}
    qtype = _text(attrs.get("qtype", "int8")).strip().lower() or "int8"
    switch = _text(attrs.get("switch", "ON")).strip().upper() or "ON"
    if switch not in ("ON", "OFF"):
        raise TunerError(f"HzCalibration node {node.name!r}: switch must be ON or OFF, got {switch!r}")
    thresholds = _floats(node, "thresholds", attrs["thresholds"]) if "thresholds" in attrs else ()
    if switch == "ON" and qtype in QMAX and not thresholds:
        raise TunerError(f"HzCalibration node {node.name!r} ({qtype}, switch ON) has no thresholds")
    dq = attrs.get("dequantize_scale")
    if dq is not None:
        values = _floats(node, "dequantize_scale", dq)
        if len(values) != 1 or not values[0] > 0:
            raise TunerError(f"HzCalibration node {node.name!r}: dequantize_scale must be one positive number, "
                             f"got {list(values)}")
        dq = values[0]
    try:
        axis = int(attrs.get("axis", 1))
        constant = int(attrs.get("constant", 0))
        group = int(attrs.get("group", 1))
    except (TypeError, ValueError):
        raise TunerError(f"HzCalibration node {node.name!r}: axis, constant and group must be integers") from None
    tensor = node.input[0]
    while tensor in source:           # a calibration node behind another one reads the same tensor
        tensor = source[tensor]
    kind = "weight" if tensor in initializers else "activation"
    consumer = None
    if kind == "weight":
        users = readers.get(node.output[0], [])
        consumer = users[0] if users else None
        if consumer is None and node.name.endswith(SUFFIX) and node.name.startswith(tensor + "_"):
            consumer = node.name[len(tensor) + 1: -len(SUFFIX)] or None
    return HzNode(name=node.name or f"{tensor}{SUFFIX}", tensor=tensor, kind=kind, thresholds=thresholds,
                  qtype=qtype, axis=axis, switch=switch, constant=constant, dequantize_scale=dq,
                  consumer=consumer, output=node.output[0], group=group)


def parse_calibrated(proto: onnx.ModelProto, path: Path) -> CalibratedModel:
    g = proto.graph
    calib = [n for n in g.node if n.op_type == OP]
    if not calib:
        domains = sorted({n.domain for n in g.node if n.domain})
        raise TunerError(f"{path}: no HzCalibration node: this is not an hb_mapper *_calibrated_model.onnx"
                         + (f" (custom domains: {', '.join(domains)})" if domains else " (a plain ONNX model?)")
                         + "; give the file hb_mapper left in working_dir")
    initializers = {t.name for t in g.initializer}
    initializers |= {n.output[0] for n in g.node if n.op_type == "Constant" and n.output}
    source = {n.output[0]: n.input[0] for n in calib if n.input and n.output}
    readers: dict[str, list[str]] = {}
    for n in g.node:
        for t in n.input:
            readers.setdefault(t, []).append(n.name)
    return CalibratedModel(path=path, proto=proto, nodes=tuple(_node(n, source, initializers, readers) for n in calib))


def read_calibrated(path: str | Path) -> CalibratedModel:
    """Load and parse ``path``; bad input is a :class:`TunerError` naming the file or the node."""
    path = Path(path)
    if not path.is_file():
        raise TunerError(f"{path}: no such file (hb_mapper writes <prefix>_calibrated_model.onnx into working_dir)")
    try:
        proto = onnx.load(str(path))
    except Exception as exc:
        raise TunerError(f"{path}: not an ONNX model ({str(exc).splitlines()[0][:200]})") from None
    return parse_calibrated(proto, path)


