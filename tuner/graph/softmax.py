"""A Softmax on the BPU as hb_mapper runs it: six quantized parts.

Real 1.24.3 log (docs/hb_rules/quantizer.md §5, log 22843858307): ReduceMax, Sub, Exp (LUT),
ReduceSum, Reciprocal (LUT), Mul, each with its own calibration, named
``<name>_<part>_FROM_QUANTIZED_SOFTMAX``. Whether a Softmax runs on the BPU depends on the candidate
(it defaults to the CPU), so the graph keeps one Softmax node; :func:`softmax_parts` is what the
simulator substitutes for a BPU Softmax, and the statistics pass runs :func:`expand_softmax`'s model
so that the parts' tensors (:func:`softmax_tensors`) have statistics.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

#: hb_mapper's parts of a BPU Softmax, in order (real 1.24.3 log, docs/hb_rules/quantizer.md §5).
SOFTMAX_PARTS = ("reducemax", "sub", "exp", "reducesum", "reciprocal", "mul")
#: What each part reads: other parts, or ``"x"`` (the Softmax's input), as :func:`softmax_parts` wires them.
SOFTMAX_PART_INPUTS = {"reducemax": ("x",), "sub": ("x", "reducemax"), "exp": ("sub",), "reducesum": ("exp",),
                       "reciprocal": ("reducesum",), "mul": ("exp", "reciprocal")}


def softmax_part(node_name: str, part: str) -> str:
    """The name hb_mapper's log gives a part: ``<name>_<part>_FROM_QUANTIZED_SOFTMAX``."""
    return f"{node_name}_{part}_FROM_QUANTIZED_SOFTMAX"


def softmax_tensors(node_name: str) -> list[str]:
    """The tensors between the parts (what the parts quantize besides the Softmax's own input)."""
    return [f"{softmax_part(node_name, part)}_out" for part in SOFTMAX_PARTS[:-1]]


def softmax_parts(node: onnx.NodeProto, rank: int, opset: int) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """(nodes, initializers) computing ``node`` (a Softmax) as hb_mapper's six parts.

    max over the softmax axes, x - max, exp, sum, reciprocal, exp * reciprocal: the same function
    (opset < 13 normalises over every axis from ``axis`` on, opset >= 13 over ``axis`` only).
    """
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1 if opset >= 13 else 1) % rank
    axes = [axis] if opset >= 13 else list(range(axis, rank))
    x, y = node.input[0], node.output[0]
    m, d, e, s, r = softmax_tensors(node.name)
    name = {part: softmax_part(node.name, part) for part in SOFTMAX_PARTS}
    inits: list[onnx.TensorProto] = []
    nodes = [helper.make_node("ReduceMax", [x], [m], name=name["reducemax"], axes=axes, keepdims=1),
             helper.make_node("Sub", [x, m], [d], name=name["sub"]),
             helper.make_node("Exp", [d], [e], name=name["exp"])]
    if opset >= 13:
        axes_t = numpy_helper.from_array(np.array(axes, np.int64), f"{name['reducesum']}_axes")
        inits.append(axes_t)
        nodes.append(helper.make_node("ReduceSum", [e, axes_t.name], [s], name=name["reducesum"], keepdims=1))
    else:
        nodes.append(helper.make_node("ReduceSum", [e], [s], name=name["reducesum"], axes=axes, keepdims=1))
    nodes += [helper.make_node("Reciprocal", [s], [r], name=name["reciprocal"]),
              helper.make_node("Mul", [e, r], [y], name=name["mul"])]
    return nodes, inits


def softmax_rank(model: onnx.ModelProto, node: onnx.NodeProto) -> int | None:
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        if vi.name == node.input[0] and vi.type.tensor_type.HasField("shape"):
            return len(vi.type.tensor_type.shape.dim)
    return None


def expand_softmax(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with every Softmax as its six parts (same outputs; for statistics)."""
    softmaxes = [n for n in model.graph.node if n.op_type == "Softmax" and n.domain in ("", "ai.onnx")]
    if not softmaxes:
        return model
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 11)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for n in out.graph.node:
        rank = softmax_rank(model, n) if n.op_type == "Softmax" and n.domain in ("", "ai.onnx") else None
        if rank is None:
            nodes.append(n)
            continue
        parts, inits = softmax_parts(n, rank, opset)
        nodes.extend(parts)
        out.graph.initializer.extend(inits)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out
