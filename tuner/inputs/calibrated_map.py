"""hb_mapper's calibration nodes (:mod:`tuner.inputs.calibrated`) addressed to tuner's graph.

hb_mapper calibrates its own optimized graph (:class:`HbGraph`); :func:`map_to_graph` maps each
node's tensor to tuner's (by name, else by the node that writes it), checks per-channel counts, and
turns a weight hb_mapper folded a BatchNormalization or constant into into what tuner's graph must use
(:func:`_unfolded`). The result, :class:`MappedThresholds`, is what the real-threshold simulation
(:mod:`tuner.simulate.realscales`) reads.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from tuner.errors import TunerError
from tuner.graph import Graph, Node
from tuner.inputs.calibrated import OP, CalibratedModel, HzNode


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
    mapper = _Mapper(cal, graph, onnx_model, matches)
    for n in cal.nodes:
        if n.kind == "activation":
            mapper.activation(n)
        else:
            mapper.weight(n)
    tensors, hb = mapper.tensors, mapper.hb
    if matches is not None:       # by value: the tuner tensors some tensor of hb_mapper's graph is
        present = frozenset(t for t in matches.values() if t is not None) | frozenset(mapper.acts)
    else:
        present = frozenset(t for t in tensors if t in hb.tensors or t in mapper.acts
                            or _counterpart_of_tuner(t, hb, graph) is not None)
    return MappedThresholds(source=str(cal.path), digest=_digest(cal.nodes),
                            activations={t: tuple(v) for t, v in mapper.acts.items()}, weights=mapper.weights,
                            unmapped=tuple(mapper.unmapped), present=present, renamed=mapper.renamed,
                            by_value=matches is not None, folded=mapper.folded,
                            reads=_reads(cal, hb, graph, tensors))


class _Mapper:
    """What :func:`map_to_graph` collects, node by node: activation tensor -> its nodes, weight
    consumer -> its node, the nodes tolerated without a counterpart, renamed tensors, unfolded weights."""

    def __init__(self, cal: CalibratedModel, graph: Graph, onnx_model: onnx.ModelProto | None,
                 matches: dict[str, str | None] | None):
        self.graph = graph
        self.known_onnx: set[str] = set()
        onnx_nodes: set[str] = set()
        if onnx_model is not None:
            self.known_onnx = {t for n in onnx_model.graph.node for t in list(n.input) + list(n.output)}
            self.known_onnx |= {i.name for i in onnx_model.graph.input} | {t.name for t in onnx_model.graph.initializer}
            onnx_nodes = {n.name for n in onnx_model.graph.node if n.name}
        self.known_nodes = onnx_nodes | set(graph.by_name) | set(graph.names.rewrites)
        self.tensors = set(graph.activation_tensors())
        self.hb = HbGraph(cal.proto, matches)
        self.by_weight: dict[str, list[str]] = {}
        for node in graph:
            for t in node.inputs:
                if t in graph.initializers:
                    self.by_weight.setdefault(t, []).append(node.name)
        self.acts: dict[str, list[HzNode]] = {}
        self.weights: dict[str, HzNode] = {}
        self.unmapped: list[Unmapped] = []
        self.renamed: dict[str, str] = {}
        self.folded: dict[str, np.ndarray] = {}
        # Conv nodes reading an equalized input: their weights were pre-scaled by hb_mapper
        # (docs/hb_rules/quantizer.md §1.5)
        # and tuner's simulation takes thresholds of the pre-scaled weight
        eq_outputs = {n.output for n in cal.nodes if n.dequantize_scale is not None}
        self.equalized = {hn.name for hn in self.hb.nodes if any(t in eq_outputs for t in hn.input)}

    def activation(self, n: HzNode) -> None:
        """An activation node: to its tensor's counterpart, else tolerated with the reason, else an error."""
        mine = counterpart(n.tensor, self.hb, self.graph, self.tensors)
        if mine is not None:
            _check_channels(n, self.graph.shapes.get(mine))
            self.acts.setdefault(mine, []).append(n)
            if mine != n.tensor:
                self.renamed[mine] = n.tensor
            return
        reason = _why_not(n, self.hb, self.known_nodes, self.known_onnx)
        if reason is None:
            raise TunerError(f"HzCalibration node {n.name!r}: its tensor {n.tensor!r} is neither in the model nor "
                             "in the graph tuner calibrates; is this the calibrated model of this YAML's onnx_model?")
        self.unmapped.append(Unmapped(n, reason))

    def consumer(self, n: HzNode) -> str | None:
        """The tuner node a weight node's weight is for: by the node reading it, else by the weight's
        name, else by what tuner's optimizer made of the consumer."""
        graph = self.graph
        consumer = n.consumer if n.consumer in graph.by_name else None
        if consumer is None and n.tensor in self.by_weight:
            consumer = self.by_weight[n.tensor][0]
        if consumer is None and n.consumer is not None:
            r = graph.names.rewrites.get(n.consumer)
            consumer = r.nodes[0] if r is not None and r.nodes else None
        return consumer

    def weight(self, n: HzNode) -> None:
        """A weight node: to its consumer (its weight unfolded when hb_mapper's optimizer changed it),
        else tolerated when the weight or consumer is the user's, else an error."""
        graph, hb = self.graph, self.hb
        consumer = self.consumer(n)
        if consumer is not None and consumer not in self.equalized and n.tensor in graph.initializers \
                and n.tensor in hb.initializers and not _same_array(hb.initializers[n.tensor], graph.initializers[n.tensor]):
            folded_w = _unfolded(hb.initializers[n.tensor], graph.initializers[n.tensor], n)
            if folded_w is not None:
                self.folded[consumer] = folded_w
            else:
                self.unmapped.append(Unmapped(n, f"weight {n.tensor!r} of {consumer!r}: hb_mapper's optimizer changed "
                                                 "it (a BatchNormalization or a constant Mul/Add folded into it) and not "
                                                 "by a factor per element; tuner keeps max |w| of its own"))
            return
        if consumer is not None:
            user = graph.by_name.get(consumer)
            if user is not None and n.tensor in graph.initializers:
                _check_weight_channels(n, user, tuple(graph.initializers[n.tensor].dims))
            self.weights[consumer] = n
        elif n.tensor in self.known_onnx or (n.consumer is not None and n.consumer in self.known_nodes | self.known_onnx):
            self.unmapped.append(Unmapped(n, f"weight {n.tensor!r}: its consumer is not in the graph tuner calibrates"))
        else:
            raise TunerError(f"HzCalibration node {n.name!r}: weight {n.tensor!r} (consumer {n.consumer!r}) is not in "
                             "the model tuner loaded; is this the calibrated model of this YAML's onnx_model?")


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
