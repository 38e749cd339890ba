"""What one BPU layer costs in hbdk's O3 estimate, from the plan: per op kind and precision, per size.

hbdk compiles each fusion group (a Conv with its BatchNormalization, residual Add and activation;
a chain of lookup-table ops) into one layer; its per-layer table gives the layer's computing cost
without DDR and its load/store cost (:mod:`tuner.cost.hbdk`). This module turns a node of tuner's
graph into the few numbers that cost depends on, computed once per graph, and prices them with the
target's fitted coefficients (``cost.bpu`` in ``search_spaces/targets/<march>.yaml``):

* ``kind``: the op's cost class (:data:`KINDS`); the BPU runs a Conv on its MAC array, a Resize,
  a pooling or an element-wise op on its vector units, a Concat/Slice/Reshape as data movement;
* ``macs`` (MAC array work, a Conv's channels padded to 16: :func:`bpu_macs`) and the input and output
  elements as the BPU lays them out (NHWC, the channels padded to 8 below 8 and to 16 above, the width
  to 8: the ``aligned output shape`` column of hbdk's table for the example's Convs and element-wise ops);
* the precision of its inputs and of its output, from the plan (int16 where hb_mapper makes it
  int16), priced separately: an int16 input slows a Conv's MAC array, an int16 output doubles the
  bytes a layer writes; MaxPool in int16 was measured 10-28x its int8 time.

A layer costs ``fixed + max(per_mmac x MACs, per_kelem_in x input elements, per_kelem_out x output
elements)`` microseconds, each coefficient per kind and precision (:class:`LayerPrice`): the slowest
of the MAC array and the two streams bounds a layer. Measured on the example at O3 (int16 input):
``/dec1/conv/Conv`` (93 M MACs) 97 us, MAC-bound; ``/stem/conv/Conv`` (3.3 M MACs, its input
96x160x3 padded to 8 channels) 27 us, input-bound; in int8 the same Convs take 31 and 2 us.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tuner.graph import Graph, Node, Target, fusion_groups

#: Cost classes. Unknown BPU ops cost as ``other``.
KINDS = ("conv", "dwconv", "deconv", "matmul", "scale", "eltwise", "lut", "maxpool", "avgpool", "gpool", "resize",
         "concat", "move", "softmax", "other")

#: Kinds that run on the MAC array (the others have no per-MAC term).
MAC_KINDS = ("conv", "dwconv", "deconv", "matmul", "avgpool")

_KIND_OF = {
    "Conv": "conv", "HzChannelScale": "scale", "Gemm": "matmul", "MatMul": "matmul", "ConvTranspose": "deconv",
    "Add": "eltwise", "Sub": "eltwise", "Mul": "eltwise", "Div": "eltwise", "Max": "eltwise", "Min": "eltwise",
    "Sum": "eltwise", "Pow": "eltwise", "PRelu": "eltwise", "Equal": "eltwise", "Greater": "eltwise",
    "Less": "eltwise", "GreaterOrEqual": "eltwise", "LessOrEqual": "eltwise", "Where": "eltwise",
    "MaxPool": "maxpool", "AveragePool": "avgpool", "GlobalAveragePool": "gpool", "GlobalMaxPool": "gpool",
    "ReduceMax": "gpool", "ReduceMean": "gpool", "ReduceSum": "gpool", "ArgMax": "gpool", "ArgMin": "gpool",
    "Resize": "resize", "Upsample": "resize", "GridSample": "resize",
    "Concat": "concat", "Split": "move", "Slice": "move", "Reshape": "move", "Flatten": "move", "Squeeze": "move",
    "Unsqueeze": "move", "Transpose": "move", "DepthToSpace": "move", "SpaceToDepth": "move", "Pad": "move",
    "Expand": "move", "Tile": "move", "Gather": "move", "GatherElements": "move", "TopK": "move",
    "Softmax": "softmax",
}


def op_kind(graph: Graph, node: Node) -> str:
    """The cost class of ``node``: a depthwise Conv (one input channel per group) apart from a dense one,
    a single-activation-input element-wise op (the others constant) as a lookup table."""
    op = node.op_type
    if op == "Conv":
        group = int(node.attr("group", 1) or 1)
        return "dwconv" if group > 1 and group == _channels(graph, node.inputs[0]) else "conv"
    if op in _KIND_OF:
        kind = _KIND_OF[op]
        if kind == "eltwise" and sum(1 for t in node.inputs if graph.is_activation(t)) <= 1:
            return "lut"
        return kind
    if op.startswith("Hz") or op in ("Sigmoid", "Tanh", "Relu", "Clip", "LeakyRelu", "HardSigmoid", "Exp", "Log",
                                     "Sqrt", "Reciprocal", "Abs", "Erf", "Elu", "Selu", "Softplus", "Softsign",
                                     "Sin", "Cos", "Neg", "Floor", "Ceil", "Round", "Sign"):
        return "lut"
    return "other"


def _channels(graph: Graph, tensor: str) -> int | None:
    shape = graph.shapes.get(tensor)
    return shape[1] if shape and len(shape) > 1 else None


def aligned_elements(shape: Any) -> int:
    """Elements of a tensor as the BPU lays it out: NHWC with the channels padded to 8 (up to 8) or to a
    multiple of 16, and the width to a multiple of 8 (hbdk's ``aligned output shape`` column)."""
    if not shape or any(d is None for d in shape):
        return 0
    dims = [int(d) for d in shape]
    if len(dims) < 3:
        return math.prod(dims) if dims else 1
    n, c, rest = dims[0], dims[1], dims[2:]
    c_al = 8 if c <= 8 else -(-c // 16) * 16
    w = rest[-1]
    rest = rest[:-1] + [-(-w // 8) * 8]
    return n * c_al * math.prod(rest)


def elements(shape: Any) -> int:
    if not shape or any(d is None for d in shape):
        return 0
    return int(math.prod(int(d) for d in shape))


@dataclass(frozen=True)
class Layer:
    """The static part of one BPU layer (a fusion group, or a node alone): computed once per graph."""

    head: str                      # the group's first node (the layer's name in hbdk's table)
    members: tuple[str, ...]
    kind: str
    macs: int
    elements: int                  # the output as laid out on the BPU
    in_elements: int               # the activation inputs, as laid out on the BPU
    out_tensor: str


def node_macs(graph: Graph, node: Node) -> int:
    """Multiply-accumulates of one node (element-wise ops count one per output element)."""
    out = elements(graph.shapes.get(node.outputs[0])) if node.outputs else 0
    if node.op_type in ("Conv", "ConvTranspose", "HzChannelScale") and len(node.inputs) > 1:
        w = graph.shapes.get(node.inputs[1])
        dims = [d for d in w[1:] if d is not None] if w else []
        if w and len(dims) == len(w) - 1 and w[0] is not None:
            if node.op_type != "ConvTranspose":  # w: [Cout, Cin/group, kh, kw]
                return out * math.prod(dims)
            # ConvTranspose w: [Cin, Cout/group, kh, kw]: every input element feeds Cout/group*kh*kw outputs
            return elements(graph.shapes.get(node.inputs[0])) * math.prod(dims)
    if node.op_type in ("Gemm", "MatMul") and node.inputs:
        a = graph.shapes.get(node.inputs[0])
        if a and a[-1] is not None:
            k = a[0] if node.op_type == "Gemm" and node.attr("transA", 0) else a[-1]
            if k is not None:
                return out * k
    if node.op_type in ("AveragePool", "MaxPool"):
        return out * math.prod(node.attr("kernel_shape", [1]))
    if node.op_type.startswith("Reduce") or node.op_type.startswith("Global") or node.op_type == "Softmax":
        return elements(graph.shapes.get(node.inputs[0])) if node.inputs else out
    return out


def _al16(c: int) -> int:
    return -(-int(c) // 16) * 16


def bpu_macs(graph: Graph, node: Node) -> int:
    """MACs of a layer as the BPU's MAC array runs it: a Conv's input and output channels padded to 16
    (a dense Conv; a depthwise one's channels). Per million raw MACs the example's and PP-OCRv4's
    int8 Convs took 0.53-6.0 us (PP-OCRv4's 3-channel stem the outlier), per million padded ones
    0.40-1.1 us; other ops: :func:`node_macs`."""
    if node.op_type in ("Conv", "HzChannelScale") and len(node.inputs) > 1:
        w = graph.shapes.get(node.inputs[1])
        o = graph.shapes.get(node.outputs[0]) if node.outputs else None
        wd = [int(d) for d in w if d is not None] if w else []
        od = [int(d) for d in o if d is not None] if o else []
        if w and o and len(wd) == len(w) >= 3 and len(od) == len(o) >= 3:
            cout, cin_g, k = wd[0], wd[1], math.prod(wd[2:])
            spatial = math.prod(od[2:])
            group = int(node.attr("group", 1) or 1)
            per_out = _al16(cin_g) if group == 1 else cin_g
            return od[0] * spatial * _al16(cout) * per_out * k
    return node_macs(graph, node)


def layers(graph: Graph, target: Target) -> dict[str, Layer]:
    """Every node's layer, keyed by node name (the members of a layer share it): the fusion groups, with
    the per-channel affine ops hbdk folds into a Conv (:func:`_folded_groups`)."""
    key = ("cost.layers", target.march, target.fusion_patterns, target.lut_ops)
    if key in graph.cache:
        return graph.cache[key]
    out: dict[str, Layer] = {}
    for head, group in _folded_groups(graph, target):
        inside = {n.name for n in group}
        last = next(n for n in reversed(group) if not any(c.name in inside for o in n.outputs
                                                          for c, _ in graph.consumers.get(o, [])))
        ins = sum(aligned_elements(graph.shapes.get(t)) for t in head.inputs if graph.is_activation(t))
        kind = op_kind(graph, head)
        lay = Layer(head=head.name, members=tuple(n.name for n in group), kind=kind,
                    macs=bpu_macs(graph, head) if kind in MAC_KINDS else 0,
                    elements=aligned_elements(graph.shapes.get(last.outputs[0])), in_elements=ins,
                    out_tensor=last.outputs[0])
        for n in group:
            out[n.name] = lay
    graph.cache[key] = out
    return out


def _affine(graph: Graph, node: Node) -> bool:
    """A per-channel scale (``HzChannelScale``) or an Add/Sub/Mul of a constant: what hbdk folds."""
    if node.op_type == "HzChannelScale":
        return True
    return node.op_type in ("Add", "Sub", "Mul") and sum(1 for t in node.inputs if graph.is_activation(t)) == 1


def _only_reader(graph: Graph, node: Node) -> Node | None:
    t = node.outputs[0] if node.outputs else None
    if t is None or t in graph.output_names:
        return None
    readers = graph.consumers.get(t, [])
    return readers[0][0] if len(readers) == 1 else None


def _pointwise(node: Node) -> bool:
    """A 1x1 Conv without padding, stride or groups: an affine op before it folds into its weights."""
    k = node.attr("kernel_shape", None)
    return (node.op_type == "Conv" and k is not None and all(int(x) == 1 for x in k)
            and not any(int(x) for x in node.attr("pads", [0]) or [0]) and int(node.attr("group", 1) or 1) == 1
            and all(int(x) == 1 for x in node.attr("strides", [1]) or [1]))


def _folded_groups(graph: Graph, target: Target) -> list[tuple[Node, list[Node]]]:
    """(head, members) of every layer: the fusion groups, then per-channel affine ops folded the way
    hbdk's O3 layer table of PP-OCRv4's detector shows them (its blocks are Conv -> HzChannelScale -> Add
    -> HardSwish -> HzChannelScale -> Add -> Conv): after a Conv (or a per-channel scale) whose only
    reader they are, they join its layer (``p2o.Conv.1`` has no ``p2o.Mul.0``/``p2o.Add.2`` rows after
    it; an Add heading a chain of table ops leaves the chain for the Conv); before a pointwise Conv that
    is their only reader, they join that Conv (``p2o.Mul.4``/``p2o.Add.6`` before the 1x1 ``p2o.Conv.2``
    have no rows); before a 3x3 Conv they stay a layer of their own (``p2o.Mul.10`` before the padded
    depthwise ``p2o.Conv.3``: one Conv row, its Add folded in as the bias)."""
    group_of: dict[str, list[Node]] = {}
    head_of: dict[int, Node] = {}
    groups: list[list[Node]] = []

    def new(g: list[Node]) -> list[Node]:
        groups.append(g)
        head_of[id(g)] = g[0]
        for n in g:
            group_of[n.name] = g
        return g

    for group in fusion_groups(graph, target):
        new(list(group))
    for node in graph:
        if node.name not in group_of:
            new([node])
    # backward: an affine op joins the Conv-like layer before it
    for node in graph:
        g = group_of[node.name]
        if not _affine(graph, node) or g[0] is not node or (len(g) > 1 and op_kind(graph, node) != "lut"):
            continue
        data = [t for t in node.inputs if graph.is_activation(t)]
        producer = graph.producer.get(data[0]) if data else None
        if producer is None:
            continue
        pg = group_of[producer.name]
        if op_kind(graph, head_of[id(pg)]) not in ("conv", "dwconv", "deconv", "matmul", "scale") \
                or _only_reader(graph, producer) is not node:
            continue
        g.remove(node)          # an Add heading a chain of table ops leaves the chain
        if g:
            head_of[id(g)] = g[0]
        else:
            groups.remove(g)
        pg.append(node)
        group_of[node.name] = pg
    # forward: a layer of affine ops joins the pointwise Conv that reads it alone
    for g in list(reversed(groups)):
        if not all(_affine(graph, n) for n in g):
            continue
        inside = {n.name for n in g}
        outs = [n for n in g if not any(c.name in inside for o in n.outputs for c, _ in graph.consumers.get(o, []))]
        reader = _only_reader(graph, outs[-1]) if len(outs) == 1 else None
        if reader is None or not _pointwise(reader) or head_of[id(group_of[reader.name])] is not reader:
            continue
        rg = group_of[reader.name]
        rg[:0] = g
        for n in g:
            group_of[n.name] = rg
        groups.remove(g)
    return [(head_of[id(g)], g) for g in groups]


@dataclass(frozen=True)
class LayerPrice:
    """One kind's price in one precision, microseconds: ``fixed + max(per_mmac x MACs / 1e6, per_kelem_in x
    input elements / 1e3, per_kelem_out x output elements / 1e3)``."""

    fixed: float = 0.0
    per_mmac: float = 0.0
    per_kelem_in: float = 0.0
    per_kelem_out: float = 0.0

    FIELDS = ("fixed", "per_mmac", "per_kelem_in", "per_kelem_out")

    def us(self, macs: float, in_elems: float, out_elems: float) -> float:
        return self.fixed + max(self.per_mmac * macs / 1e6, self.per_kelem_in * in_elems / 1e3,
                                self.per_kelem_out * out_elems / 1e3)

    def scaled(self, k: float) -> LayerPrice:
        return LayerPrice(*(k * v for v in self.as_list()))

    def as_list(self) -> list[float]:
        return [self.fixed, self.per_mmac, self.per_kelem_in, self.per_kelem_out]

    @classmethod
    def from_list(cls, values: Any) -> LayerPrice:
        return cls(*(float(v) for v in values))
