"""What one BPU layer costs in hbdk's O3 estimate, from the plan: per op kind and precision, per size.

hbdk compiles each fusion group (a Conv with its BatchNormalization, residual Add and activation;
a chain of lookup-table ops) into one layer; its per-layer table gives the layer's computing cost
without DDR and its load/store cost (:mod:`tuner.cost.hbdk`). This module turns a node of tuner's
graph into the few numbers that cost depends on, computed once per graph, and prices them with the
target's fitted coefficients (``cost.bpu`` in ``search_spaces/targets/<march>.yaml``):

* ``kind``: the op's cost class (:data:`KINDS`); the BPU runs a Conv on its MAC array, a Resize,
  a pooling or an element-wise op on its vector units, a Concat/Slice/Reshape as data movement;
* ``macs`` (MAC array work) and ``elements``: the output tensor as the BPU lays it out (NHWC, the
  channels padded to 8 below 8 and to 16 above, the width to 8: the ``aligned output shape`` column
  of hbdk's table for the example's Convs and element-wise ops);
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
KINDS = ("conv", "dwconv", "deconv", "matmul", "eltwise", "lut", "maxpool", "avgpool", "gpool", "resize",
         "concat", "move", "softmax", "other")

#: Kinds that run on the MAC array (the others have no per-MAC term).
MAC_KINDS = ("conv", "dwconv", "deconv", "matmul", "avgpool")

_KIND_OF = {
    "Conv": "conv", "HzChannelScale": "conv", "Gemm": "matmul", "MatMul": "matmul", "ConvTranspose": "deconv",
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


def layers(graph: Graph, target: Target) -> dict[str, Layer]:
    """Every node's layer, keyed by node name (the members of a fusion group share their group's)."""
    key = ("cost.layers", target.march, target.fusion_patterns, target.lut_ops)
    if key in graph.cache:
        return graph.cache[key]
    out: dict[str, Layer] = {}
    group_of: dict[str, list[Node]] = {}
    for group in fusion_groups(graph, target):
        for n in group:
            group_of[n.name] = group
    for node in graph:
        if node.name in out:
            continue
        group = group_of.get(node.name, [node])
        head, last = group[0], group[-1]
        ins = sum(aligned_elements(graph.shapes.get(t)) for t in head.inputs if graph.is_activation(t))
        kind = op_kind(graph, head)
        lay = Layer(head=head.name, members=tuple(n.name for n in group), kind=kind,
                    macs=node_macs(graph, head) if kind in MAC_KINDS else 0, elements=aligned_elements(graph.shapes.get(last.outputs[0])),
                    in_elements=ins, out_tensor=last.outputs[0])
        for n in group:
            out[n.name] = lay
    graph.cache[key] = out
    return out


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
