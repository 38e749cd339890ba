"""Ops hb_mapper's optimizer rewrites into its own (:mod:`tuner.graph.optimize`): Div, Where, Mul by a constant.

* :func:`split_div`: ``Div(a, b)`` becomes ``<name>_reciprocal`` + ``<name>_mul`` (a Div by a constant:
  ``<name>_mul``, a Mul by the reciprocal constant);
* :func:`split_where`: a float ``Where`` becomes hb's Cast/Equal/Cast (CPU) and Mul/Mul/Add (BPU);
* :func:`lower_channel_scales`: a Mul of a feature map by a scalar or per-channel constant becomes a
  node of kind ``HzChannelScale`` (a weight-quantized 1x1 convolution on the BPU).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tuner.graph.edit import rewrite_each, unique_name
from tuner.graph.hz import HZ_DOMAIN
from tuner.graph.names import NameMap, Rewrite


def split_div(model: onnx.ModelProto, names: NameMap) -> None:
    graph = model.graph
    consts = {t.name: t for t in graph.initializer}
    used = {n.name for n in graph.node}

    def split(n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        if n.op_type != "Div" or n.domain not in ("", "ai.onnx") or len(n.input) != 2:
            return None
        a, b = n.input
        mul_name = unique_name(f"{n.name}_mul", used)
        if b in consts:
            arr = numpy_helper.to_array(consts[b])
            if not np.issubdtype(arr.dtype, np.floating) or not np.all(arr != 0):
                return None
            rc = numpy_helper.from_array((1.0 / arr).astype(arr.dtype), unique_name(f"{b}_reciprocal", set(consts)))
            graph.initializer.append(rc)
            consts[rc.name] = rc
            names.rewrites[n.name] = Rewrite(n.name, "Div", (mul_name,), ((0, mul_name, 0),), mul_name,
                                             "Div by a constant became a Mul")
            return [helper.make_node("Mul", [a, rc.name], list(n.output), name=mul_name)]
        rec_name = unique_name(f"{n.name}_reciprocal", used)
        rec_out = f"{n.output[0]}__reciprocal"
        names.rewrites[n.name] = Rewrite(n.name, "Div", (rec_name, mul_name), ((0, mul_name, 0), (1, rec_name, 0)),
                                         mul_name, "Div split into Reciprocal + Mul")
        return [helper.make_node("Reciprocal", [b], [rec_out], name=rec_name),
                helper.make_node("Mul", [a, rec_out], list(n.output), name=mul_name)]

    rewrite_each(graph, split)


def split_where(model: onnx.ModelProto, names: NameMap) -> None:
    """``Where(c, a, b)`` of float tensors becomes ``c' * a + (c' == 0) * b`` with ``c' = Cast(c)``, as
    hb's optimized graph has it (the example's ``/Where``): CPU ``<name>_cast`` (Cast),
    ``<name>_equal`` (Equal with the constant ``<name>_equal_zeroinput``) and
    ``<name>_equal_output_cast`` (Cast), BPU ``<name>_mul_x``, ``<name>_mul_y`` (Mul) and ``<name>_add``
    (Add, which writes the Where's output). The float values are the same for c in {0, 1}."""
    graph = model.graph
    consts = {t.name for t in graph.initializer}
    float_types = {vi.name: vi.type.tensor_type.elem_type for vi in list(graph.input) + list(graph.value_info)
                   + list(graph.output)}
    used = {n.name for n in graph.node}

    def split(n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        if n.op_type != "Where" or n.domain not in ("", "ai.onnx") or len(n.input) != 3:
            return None
        c, a, b = n.input
        if a in consts or b in consts or float_types.get(a) != onnx.TensorProto.FLOAT \
                or float_types.get(b) != onnx.TensorProto.FLOAT:
            return None
        base = n.name
        cast, mul_x, equal, ecast, mul_y, add = (unique_name(f"{base}_{p}", used) for p in
                                                 ("cast", "mul_x", "equal", "equal_output_cast", "mul_y", "add"))
        zero = unique_name(f"{base}_equal_zeroinput", consts)
        consts.add(zero)
        graph.initializer.append(numpy_helper.from_array(np.zeros((), np.float32), zero))
        t_cast, t_mx, t_eq, t_ecast, t_my = (f"{base}_cast_output", f"{base}_mul_x_output", f"{base}_equal_output",
                                            f"{base}_equal_output_cast_output", f"{base}_mul_y_output")
        names.rewrites[n.name] = Rewrite(n.name, "Where", (cast, mul_x, equal, ecast, mul_y, add),
                                         ((0, cast, 0), (1, mul_x, 1), (2, mul_y, 1)), add,
                                         "Where split into Cast/Equal/Cast (CPU) and Mul/Mul/Add (BPU)")
        return [helper.make_node("Cast", [c], [t_cast], name=cast, to=onnx.TensorProto.FLOAT),
                helper.make_node("Mul", [t_cast, a], [t_mx], name=mul_x),
                helper.make_node("Equal", [t_cast, zero], [t_eq], name=equal),
                helper.make_node("Cast", [t_eq], [t_ecast], name=ecast, to=onnx.TensorProto.FLOAT),
                helper.make_node("Mul", [t_ecast, b], [t_my], name=mul_y),
                helper.make_node("Add", [t_mx, t_my], list(n.output), name=add)]

    rewrite_each(graph, split)


def _channel_constant(shape: tuple[int, ...], rank: int | None) -> bool:
    """A constant that broadcasts as one value, or one value per channel (axis 1) of a rank-4 map."""
    size = int(np.prod(shape)) if shape else 1
    if size == 1:
        return True
    if rank != 4 or len(shape) > 4:
        return False
    full = (1,) * (4 - len(shape)) + tuple(shape)
    return full[0] == 1 and full[2] == 1 and full[3] == 1


def lower_channel_scales(model: onnx.ModelProto, names: NameMap, original: set[str]) -> None:
    graph = model.graph
    consts = {t.name: t for t in graph.initializer}
    ranks = {vi.name: len(vi.type.tensor_type.shape.dim) for vi in list(graph.input) + list(graph.value_info)
             if vi.type.tensor_type.HasField("shape")}
    fn = None
    onnx_names = set(original) - set(names.rewrites)
    for n in graph.node:
        if n.op_type != "Mul" or n.domain not in ("", "ai.onnx") or len(n.input) != 2:
            continue
        const = [k for k, t in enumerate(n.input) if t in consts]
        if len(const) != 1:
            continue
        c, x = n.input[const[0]], n.input[1 - const[0]]
        if consts[c].data_type != onnx.TensorProto.FLOAT or not _channel_constant(tuple(consts[c].dims), ranks.get(x)):
            continue
        if ranks.get(x) != 4 and int(np.prod(consts[c].dims) if consts[c].dims else 1) != 1:
            continue
        if fn is None:
            fn = helper.make_function(HZ_DOMAIN, "HzChannelScale__0", ["i0", "i1"], ["y"],
                                      [helper.make_node("Mul", ["i0", "i1"], ["y"])],
                                      [o for o in model.opset_import if o.domain in ("", "ai.onnx")])
        if n.name in onnx_names:
            # The feature map is input 0 of the lowered node (the user's InputType<k> of it follows).
            names.rewrites[n.name] = Rewrite(n.name, "Mul", (n.name,), ((1 - const[0], n.name, 0),), n.name,
                                             "Mul by a constant lowered to a 1x1 convolution")
        del n.input[:]
        n.input.extend([x, c])
        n.op_type, n.domain = fn.name, HZ_DOMAIN
    if fn is not None:
        model.functions.append(fn)
        if not any(o.domain == HZ_DOMAIN for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid(HZ_DOMAIN, 1))
