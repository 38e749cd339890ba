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

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from tuner.errors import TunerError
from tuner.graph import Graph, Node

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


@dataclass(frozen=True)
class Unmapped:
    """A calibration node on a tensor tuner's graph has no counterpart for (tuner's optimizer fused or
    removed it, or hb_mapper's optimizer made it: the parts of a split ``Where``, ...): tolerated,
    reported as "not compared" with the reason."""

    node: HzNode
    reason: str


@dataclass(frozen=True)
class MappedThresholds:
    """The calibration nodes addressed to tuner's graph: activation tensor -> its nodes (an equalized
    Conv input has a per-tensor node and a per-channel one), weight consumer -> its node.

    ``present``: tuner's activation tensors that exist in hb_mapper's calibrated graph (under their
    name or a mapped one); one of them without a rounding node is a tensor hb_mapper leaves float.
    A tensor tuner has and hb_mapper's graph lacks is unknown to the file (tuner's own scale applies).
    ``renamed``: tuner tensor -> the calibrated model's name for it, where they differ."""

    source: str
    digest: str
    activations: dict[str, tuple[HzNode, ...]]
    weights: dict[str, HzNode]
    unmapped: tuple[Unmapped, ...] = ()
    notes: tuple[str, ...] = ()
    present: frozenset[str] = frozenset()
    by_value: bool = False        # tensors matched by their float values (else by names only)
    # consumer -> its weight as tuner's graph must use it to compute what hb_mapper's quantized folded
    # weight computes (hb_mapper folded a BatchNormalization / constant Mul, Add into it): see _unfolded
    folded: dict[str, np.ndarray] = field(default_factory=dict)
    renamed: dict[str, str] = field(default_factory=dict)
    # per input of a tuner node that hb_mapper's graph has under the same name: the calibration node
    # that input reads there, or None when it reads the tensor unrounded (the Add of a fused
    # Conv + Add, a CPU ScatterND reading a Resize output, ...)
    reads: dict[tuple[str, int], HzNode | None] = field(default_factory=dict)

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other) -> bool:
        return isinstance(other, MappedThresholds) and other.digest == self.digest

    def leaves_float(self, tensor: str) -> bool:
        """Whether hb_mapper's graph has ``tensor`` and rounds it nowhere (no calibration node on it, or
        only switched-off / float ones)."""
        return tensor in self.present and not any(n.quantizes for n in self.activations.get(tensor, ()))


def _digest(nodes: tuple[HzNode, ...]) -> str:
    return hashlib.sha256(json.dumps([n.as_dict() for n in nodes], sort_keys=True).encode()).hexdigest()[:16]


def _check_channels(n: HzNode, shape: tuple[int | None, ...] | None) -> None:
    """Per-channel thresholds must be one per channel of the tensor along the node's axis (a
    calibrated model of another width of the same network has the same tensor names)."""
    if not n.per_channel or shape is None or not -len(shape) <= n.axis < len(shape):
        return
    channels = shape[n.axis]
    if channels is not None and channels != len(n.thresholds):
        raise TunerError(f"HzCalibration node {n.name!r}: {len(n.thresholds)} per-channel thresholds along axis "
                         f"{n.axis}, but tensor {n.tensor!r} has {channels} channels there in the YAML's model; is "
                         "this the calibrated model of this YAML's onnx_model?")


def _check_weight_channels(n: HzNode, user: Node, dims: tuple[int, ...]) -> None:
    """A weight's per-channel thresholds are one per output channel of its consumer: Conv
    ``[Cout, Cin/g, k...]`` along axis 0, ConvTranspose ``[Cin, Cout/g, k...]`` g * Cout/g of them
    (docs/hb_rules/quantizer.md §1.7). Without this, a mismatch would leave the simulation on tuner's max |w|
    unsaid."""
    if not n.per_channel or len(dims) < 2:
        return
    if user.op_type == "Conv":
        _check_channels(n, dims)
        return
    if user.op_type == "ConvTranspose":
        group = int(user.attr("group", 1)) or 1
        if len(n.thresholds) != dims[1] * group:
            raise TunerError(f"HzCalibration node {n.name!r}: {len(n.thresholds)} per-channel weight thresholds, but "
                             f"ConvTranspose {user.name!r} has {dims[1] * group} output channels in the YAML's model; "
                             "is this the calibrated model of this YAML's onnx_model?")


class HbGraph:
    """The graph hb_mapper calibrated (its optimized graph: the calibrated model without its
    calibration nodes), for addressing its tensors to tuner's.

    hb_mapper's optimizer renames and adds tensors (docs/hb_rules/quantizer.md §4.1, and the real 1.24.3
    files): a model output ``<out>`` is written as ``<out>_before`` and its calibration node writes
    ``<out>``; a ReduceMean over H, W becomes a GlobalAveragePool of the same name writing
    ``<name>_output``; ``Where`` becomes ``<name>_cast``, ``<name>_equal``, ``<name>_mul_x``, ... on
    new tensors; Identity and Dropout disappear; a Mul by a constant is a Conv of the same name
    with weight ``UNIT_WEIGHT_FOR_<name>``. So a tensor maps by its name, else by its producer: a
    node of the same name in tuner's graph (or one tuner's optimizer renamed, tuner.graph.names),
    whose output of the same index is the tensor."""

    def __init__(self, proto: onnx.ModelProto, matches: dict[str, str | None] | None = None):
        self.matches = dict(matches or {})
        g = proto.graph
        source = {n.output[0]: n.input[0] for n in g.node if n.op_type == OP and n.input and n.output}

        def raw(t: str) -> str:       # the tensor a (chain of) calibration node(s) reads
            while t in source:
                t = source[t]
            return t

        self.outputs = {o.name for o in g.output}
        self.inputs = {i.name for i in g.input}
        self.producer: dict[str, tuple[onnx.NodeProto, int]] = {}
        self.by_node: dict[str, list[str]] = {}        # node name -> its outputs (before their calibration)
        self.tensors: set[str] = set()
        for n in g.node:
            if n.op_type == OP:
                continue
            outs = [raw(t) for t in n.output]
            for k, t in enumerate(outs):
                self.producer[t] = (n, k)
                self.tensors.add(t)
            if n.name:
                self.by_node[n.name] = outs
            self.tensors.update(raw(t) for t in n.input if t)
        self.tensors |= self.inputs
        self.raw = raw
        self.nodes = [n for n in g.node if n.op_type != OP]
        self.initializers = {t.name: t for t in g.initializer}
        # a model output's last node writes <out>_before, its calibration node <out>
        self.before = {n.input[0]: n.output[0] for n in g.node if n.op_type == OP and n.output[0] in self.outputs}


def counterpart(t: str, hb: HbGraph, graph: Graph, tensors: set[str]) -> str | None:
    """tuner's name for the calibrated model's tensor ``t``, or None. With float values
    (:func:`match_by_value`), what they say wins over the names."""
    if t in hb.matches:
        return hb.matches[t]
    if t in tensors:
        return t
    out = hb.before.get(t)
    if out is not None and out in tensors:
        return out
    made = hb.producer.get(t)
    if made is None:
        return None
    node, k = made
    name = node.name
    if name not in graph.by_name:
        r = graph.names.rewrites.get(name)
        name = (r.output if r is not None else None) or ""
    mine = graph.by_name.get(name)
    if mine is not None and k < len(mine.outputs) and mine.outputs[k] in tensors:
        return mine.outputs[k]
    return None


def _derived_from(name: str, known: set[str]) -> str | None:
    """The known node (ONNX or tuner) an hb_mapper node named ``name`` was made from, by its naming
    (``/Where_cast`` from ``/Where``, ``UNIT_WEIGHT_FOR_/Mul`` from ``/Mul``): the longest match."""
    best = None
    for k in known:
        if k and (name.startswith(k + "_") or name.endswith("_" + k) or name == k) and (best is None or len(k) > len(best)):
            best = k
    return best


def _why_not(n: HzNode, hb: HbGraph, known_nodes: set[str], known_tensors: set[str]) -> str | None:
    """Why a node on a tensor without a counterpart is not compared, or None: a foreign tensor."""
    t = n.tensor
    if t in hb.matches and t in known_tensors:   # the name's tensor, checked by value: other values
        made = hb.producer.get(t)
        by = f" (written by {made[0].op_type} {made[0].name!r})" if made else ""
        return (f"tensor {t!r}{by}: tuner's tensor of that name holds other values (hb_mapper's optimizer folded "
                "a node into its producer) and no tensor of the graph tuner calibrates holds its float values")
    if t in known_tensors:
        return (f"tensor {t!r} is not in the graph tuner calibrates (tuner's optimizer fused or removed it)")
    made = hb.producer.get(t)
    if made is None:
        return None
    node, _ = made
    if node.name in known_nodes:
        return (f"tensor {t!r} (output of {node.op_type} {node.name!r}) has no counterpart in the graph tuner "
                "calibrates")
    origin = _derived_from(node.name or "", known_nodes)
    if origin is None:
        return None
    return (f"tensor {t!r} is written by {node.op_type} {node.name!r}, which hb_mapper's optimizer made from "
            f"{origin!r}; tuner's graph has no such tensor")


def map_to_graph(cal: CalibratedModel, graph: Graph, onnx_model: onnx.ModelProto | None = None,
                 matches: dict[str, str | None] | None = None) -> MappedThresholds:
    """Address every calibration node to tuner's graph (:class:`tuner.graph.Graph`).

    hb_mapper calibrates its own optimized graph (:class:`HbGraph`: the model output's
    ``<out>_before``, the tensors of its rewrites). A tensor maps by its name, else by the node
    that writes it (:func:`counterpart`). A node on a tensor without a counterpart is tolerated
    (``unmapped``: "not compared", with the reason) when the tensor is one of the user's ONNX
    (tuner's optimizer fused or removed it) or is written by a node of the ONNX or of tuner's graph,
    or by one hb_mapper's optimizer named after such a node (``/Where_cast``); any other is an error
    naming the node: the file is not the calibrated model of this model. A weight node maps to its
    consumer: by the node reading it, else by the weight's name, else by the
    ``<weight>_<consumer>_HzCalibration`` name.
    """
    known_onnx: set[str] = set()
    onnx_nodes: set[str] = set()
    if onnx_model is not None:
        known_onnx = {t for n in onnx_model.graph.node for t in list(n.input) + list(n.output)}
        known_onnx |= {i.name for i in onnx_model.graph.input} | {t.name for t in onnx_model.graph.initializer}
        onnx_nodes = {n.name for n in onnx_model.graph.node if n.name}
    known_nodes = onnx_nodes | set(graph.by_name) | set(graph.names.rewrites)
    tensors = set(graph.activation_tensors())
    hb = HbGraph(cal.proto, matches)
    by_weight: dict[str, list[str]] = {}
    for node in graph:
        for t in node.inputs:
            if t in graph.initializers:
                by_weight.setdefault(t, []).append(node.name)
    acts: dict[str, list[HzNode]] = {}
    weights: dict[str, HzNode] = {}
    unmapped: list[Unmapped] = []
    renamed: dict[str, str] = {}
    folded: dict[str, np.ndarray] = {}
    # Conv nodes reading an equalized input: their weights were pre-scaled by hb_mapper
    # (docs/hb_rules/quantizer.md §1.5)
    # and tuner's simulation takes thresholds of the pre-scaled weight
    eq_outputs = {n.output for n in cal.nodes if n.dequantize_scale is not None}
    equalized = {hn.name for hn in hb.nodes if any(t in eq_outputs for t in hn.input)}
    for n in cal.nodes:
        if n.kind == "activation":
            mine = counterpart(n.tensor, hb, graph, tensors)
            if mine is not None:
                _check_channels(n, graph.shapes.get(mine))
                acts.setdefault(mine, []).append(n)
                if mine != n.tensor:
                    renamed[mine] = n.tensor
                continue
            reason = _why_not(n, hb, known_nodes, known_onnx)
            if reason is None:
                raise TunerError(f"HzCalibration node {n.name!r}: its tensor {n.tensor!r} is neither in the model nor "
                                 "in the graph tuner calibrates; is this the calibrated model of this YAML's onnx_model?")
            unmapped.append(Unmapped(n, reason))
            continue
        consumer = n.consumer if n.consumer in graph.by_name else None
        if consumer is None and n.tensor in by_weight:
            consumer = by_weight[n.tensor][0]
        if consumer is None and n.consumer is not None:
            r = graph.names.rewrites.get(n.consumer)
            consumer = r.nodes[0] if r is not None and r.nodes else None
        if consumer is not None and consumer not in equalized and n.tensor in graph.initializers \
                and n.tensor in hb.initializers and not _same_array(hb.initializers[n.tensor], graph.initializers[n.tensor]):
            folded_w = _unfolded(hb.initializers[n.tensor], graph.initializers[n.tensor], n)
            if folded_w is not None:
                folded[consumer] = folded_w
            else:
                unmapped.append(Unmapped(n, f"weight {n.tensor!r} of {consumer!r}: hb_mapper's optimizer changed it "
                                            "(a BatchNormalization or a constant Mul/Add folded into it) and not by a "
                                            "factor per element; tuner keeps max |w| of its own"))
            continue
        if consumer is not None:
            user = graph.by_name.get(consumer)
            if user is not None and n.tensor in graph.initializers:
                _check_weight_channels(n, user, tuple(graph.initializers[n.tensor].dims))
            weights[consumer] = n
        elif n.tensor in known_onnx or (n.consumer is not None and n.consumer in known_nodes | known_onnx):
            unmapped.append(Unmapped(n, f"weight {n.tensor!r}: its consumer is not in the graph tuner calibrates"))
        else:
            raise TunerError(f"HzCalibration node {n.name!r}: weight {n.tensor!r} (consumer {n.consumer!r}) is not in "
                             "the model tuner loaded; is this the calibrated model of this YAML's onnx_model?")
    if matches is not None:       # by value: the tuner tensors some tensor of hb_mapper's graph is
        present = frozenset(t for t in matches.values() if t is not None) | frozenset(acts)
    else:
        present = frozenset(t for t in tensors if t in hb.tensors or t in acts
                            or _counterpart_of_tuner(t, hb, graph) is not None)
    return MappedThresholds(source=str(cal.path), digest=_digest(cal.nodes),
                            activations={t: tuple(v) for t, v in acts.items()}, weights=weights,
                            unmapped=tuple(unmapped), present=present, renamed=renamed, by_value=matches is not None,
                            folded=folded,
                            reads=_reads(cal, hb, graph, tensors))


def _reads(cal: CalibratedModel, hb: HbGraph, graph: Graph, tensors: set[str]) -> dict[tuple[str, int], HzNode | None]:
    """Per activation input of the tuner nodes hb_mapper's graph has under the same name (and op
    arity), the calibration node it reads there (None: the tensor unrounded)."""
    by_output = {n.output: n for n in cal.nodes}
    out: dict[tuple[str, int], HzNode | None] = {}
    for hn in hb.nodes:
        mine = graph.by_name.get(hn.name)
        if mine is None:
            continue
        for k, t in enumerate(hn.input):
            if not t or k >= len(mine.inputs) or mine.inputs[k] not in tensors:
                continue
            if counterpart(hb.raw(t), hb, graph, tensors) != mine.inputs[k]:
                continue          # another tensor at this index (a rewrite reordered the inputs)
            out[(hn.name, k)] = by_output.get(t)
    return out


def _unfolded(hb_w: onnx.TensorProto, w: onnx.TensorProto, n: HzNode) -> np.ndarray | None:
    """tuner's weight ``w`` fake-quantized the way hb_mapper quantized its folded weight ``hb_w``.

    hb_mapper folds a BatchNormalization after a Conv (a factor per output channel) and a constant
    per-channel Mul/Add before one (a factor per input channel) into the Conv's weight, and
    calibrates the folded weight per output channel. Where the folded weight is the user's times a
    factor per element (c = hb_w / w), tuner's graph, which keeps the Mul/BatchNormalization as float
    nodes, computes hb_mapper's quantized product with ``fq(hb_w) / c``. None when the weights are not
    related so (other shapes, a zero where the other is not, a non-int8 or switched-off node)."""
    if not n.quantizes or n.qtype != "int8":
        return None
    a, b = numpy_helper.to_array(hb_w).astype(np.float64), numpy_helper.to_array(w).astype(np.float64)
    if a.shape != b.shape or a.ndim < 2 or len(n.thresholds) not in (1, a.shape[n.axis % a.ndim]):
        return None
    if np.any((a == 0) != (b == 0)):
        return None
    thr = np.asarray([max(abs(t), 1e-30) for t in n.thresholds], np.float64)
    shape = [1] * a.ndim
    if thr.size > 1:
        shape[n.axis % a.ndim] = thr.size
    scale = (thr / 127.0).reshape(shape)
    q = np.clip(np.round(a / scale), -127, 127) * scale
    ratio = np.divide(q, a, out=np.ones_like(a), where=a != 0)
    return (b * ratio).astype(np.float32)


def _same_array(a: onnx.TensorProto, b: onnx.TensorProto) -> bool:
    x, y = numpy_helper.to_array(a), numpy_helper.to_array(b)
    return x.shape == y.shape and bool(np.allclose(x, y, rtol=1e-5, atol=1e-8))


def _counterpart_of_tuner(t: str, hb: HbGraph, graph: Graph) -> str | None:
    """The calibrated model's tensor for tuner's ``t`` when its name differs there: the output of the
    node of the same name (a GlobalAveragePool's ``<name>_output``)."""
    node = graph.producer.get(t)
    if node is None:
        return None
    made = hb.by_node.get(node.name)
    if made is None:
        return None
    k = list(node.outputs).index(t)
    return made[k] if k < len(made) else None
