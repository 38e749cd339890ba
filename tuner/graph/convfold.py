"""Constants hb_mapper's optimizer folds into convolutions (:mod:`tuner.graph.optimize`).

* :func:`fold_into_convs`: a scale, shift or BatchNormalization that alone reads a Conv's output
  becomes that Conv's weights and bias;
* :func:`fold_channel_scales`: a lowered Mul (``HzChannelScale``) takes the Add of a constant after it
  as its bias, then folds into an unpadded Conv that alone reads it.

Measured with toy models on hb_mapper 1.24.3 (docs/hb_rules/placement.md section 6).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tuner.graph.edit import consumers, per_channel, remove_nodes, static_shapes, unique_name
from tuner.graph.hz import HZ_DOMAIN, hz_kind
from tuner.graph.names import NameMap, Rewrite


def fold_into_convs(model: onnx.ModelProto, names: NameMap) -> None:
    """What hb's optimizer folds into a Conv or ConvTranspose that writes it (``fuse_mul_into_conv``,
    ``fuse_div_into_conv``, ``fuse_add_or_sub_into_conv``, ``fuse_bn_into_conv``, ... in horizon_nn's
    C++ optimizer; the real toolchain's optimized graphs): a ``Mul`` or ``Div`` by a scalar or
    per-channel constant, an ``Add`` (either order) or ``Sub`` (``x - c``) of one, and a
    BatchNormalization, each read from a Conv's output that nothing else reads, one after the other
    (PP-OCRv4's ``Conv -> Mul(k) -> Add(b)`` blocks are one Conv there, biased ``<conv><b>_fuse_add_sub``).
    The Conv writes the folded node's output (a Div's consumers read the Conv's instead, as hb
    leaves it). Measured with toy models on hb_mapper 1.24.3 (``optimized_float_model.onnx``):
    Conv+Mul(0.5)+Add(0.1) and Conv+Sub, Conv+Div(2), ConvTranspose+Mul folded; an Add into a Conv with a
    **single output channel** is not (Conv and ConvTranspose, constant [1] or [1,1,1,1]; PP-OCR's last
    ConvTranspose keeps its ``Add``), a Mul is; a Conv whose output has a second reader folds nothing.
    Unfolded, tuner quantized between them: PP-OCRv4's detector (BNs after two Convs and after a
    ConvTranspose + bias Add) simulated set_all_nodes_int16 to cosine 0 (the real quantized model: 0.988)."""
    graph = model.graph
    consts = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    drop: set[int] = set()
    changed = True
    while changed:
        changed = False
        users = consumers(graph)
        for conv in graph.node:
            if id(conv) in drop or conv.op_type not in ("Conv", "ConvTranspose") or len(conv.input) < 2 \
                    or conv.input[1] not in consts or conv.output[0] in outputs:
                continue
            readers = [u for u in users.get(conv.output[0], []) if id(u) not in drop]
            if len(readers) != 1:
                continue
            node = readers[0]
            folded = _fold_one(graph, consts, conv, node)
            if folded is None:
                continue
            drop.add(id(node))
            if node.op_type == "Div" and node.output[0] not in outputs:
                for u in users.get(node.output[0], []):     # hb keeps the Conv's output name
                    for k, t in enumerate(u.input):
                        if t == node.output[0]:
                            u.input[k] = conv.output[0]
            else:
                conv.output[0] = node.output[0]
            names.rewrites[node.name] = Rewrite(node.name, node.op_type, (), (), None,
                                                f"{folded} folded into {conv.name}")
            changed = True
            break
    remove_nodes(graph, drop)


def _fold_one(graph: onnx.GraphProto, consts: dict[str, onnx.TensorProto], conv: onnx.NodeProto,
              node: onnx.NodeProto) -> str | None:
    """Fold ``node`` (the only reader of ``conv``'s output) into ``conv``'s weight and bias: what was
    folded (for the rewrite's note), or None when hb's optimizer leaves it."""
    if node.domain not in ("", "ai.onnx"):
        return None
    x = conv.output[0]
    group = next((a.i for a in conv.attribute if a.name == "group"), 1)
    w = numpy_helper.to_array(consts[conv.input[1]]).astype(np.float64)
    transpose = conv.op_type == "ConvTranspose"
    axis = 1 if transpose else 0
    c_out = w.shape[axis] * (group if transpose else 1)
    has_bias = len(conv.input) > 2 and bool(conv.input[2])
    if has_bias and conv.input[2] not in consts:
        return None
    b = numpy_helper.to_array(consts[conv.input[2]]).astype(np.float64) if has_bias else np.zeros(c_out)
    scale: np.ndarray | None = None
    shift = np.zeros(c_out)
    what = node.op_type
    if node.op_type in ("Mul", "Div", "Add", "Sub") and len(node.input) == 2:
        k = [i for i, t in enumerate(node.input) if t in consts]
        if len(k) != 1 or node.input[1 - k[0]] != x or (node.op_type in ("Div", "Sub") and k[0] != 1):
            return None
        value = per_channel(numpy_helper.to_array(consts[node.input[k[0]]]), c_out, w.ndim)
        if value is None:
            return None
        if node.op_type in ("Mul", "Div"):
            if node.op_type == "Div" and not np.all(value != 0):
                return None
            scale = value if node.op_type == "Mul" else 1.0 / value
        else:
            if c_out == 1:
                return None     # measured: hb leaves an Add after a single-output-channel Conv
            shift = value if node.op_type == "Add" else -value
            what = f"{node.op_type} of a constant"
    elif node.op_type == "BatchNormalization" and len(node.input) >= 5 and all(t in consts for t in node.input[1:5]) \
            and not any(node.output[1:]):
        gamma, beta, mean, var = (numpy_helper.to_array(consts[t]).astype(np.float64).reshape(-1)
                                  for t in node.input[1:5])
        if gamma.size != c_out:
            return None
        eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
        scale = gamma / np.sqrt(var + eps)
        shift = beta - mean * scale
        what = "BatchNormalization"
    else:
        return None
    if scale is not None:
        if transpose and group != 1:
            return None     # its output channels are not one weight axis
        shape = [1] * w.ndim
        shape[axis] = c_out
        w = w * scale.reshape(shape)
        b = b * scale
    b = b + shift
    base = conv.name or conv.output[0]
    if scale is not None:
        w_name = unique_name(f"{base}_hz_weight", set(consts))
        consts[w_name] = numpy_helper.from_array(w.astype(np.float32), w_name)
        graph.initializer.append(consts[w_name])
        conv.input[1] = w_name
    b_name = unique_name(f"{base}_hz_bias", set(consts))
    consts[b_name] = numpy_helper.from_array(b.astype(np.float32), b_name)
    graph.initializer.append(consts[b_name])
    del conv.input[2:]
    conv.input.append(b_name)
    return what


def fold_channel_scales(model: onnx.ModelProto, names: NameMap) -> None:
    """What hb's optimizer does to a lowered Mul (its 1x1 "unit" convolution, ``UNIT_WEIGHT_FOR_<mul>``),
    measured with toy models on hb_mapper 1.24.3 (``optimized_float_model.onnx``), as on PP-OCRv4's
    ``HardSwish -> Mul(k) -> Add(b) -> Conv`` blocks:

    * an ``Add`` (or ``Sub``) of a scalar or per-channel constant that alone reads it becomes its bias
      (``<mul>UNIT_BIAS_FOR_<mul>_fuse_add_sub``), unless the map has a single channel (as for a Conv);
    * then, when a Conv with **no padding** and one group alone reads it, it is folded into that Conv's
      weights and bias (``fuse_unit_conv_into_conv``): the Conv reads the Mul's input. With padding
      (3x3, pads 1) it is not folded (padding zeros would take the bias), nor into a depthwise Conv.

    On PP-OCRv4's detector this puts about twenty Conv inputs at the HardSwish output's threshold (real
    28.3 for ``p2o.Conv.2``, 13.5 where the scale 0.476 stayed in front of it) and removes two quantization
    points per block."""
    graph = model.graph
    consts = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    shapes = static_shapes(model)
    users = consumers(graph)
    biased: onnx.FunctionProto | None = None
    drop: set[int] = set()
    for n in list(graph.node):
        if n.domain != HZ_DOMAIN or hz_kind(n.op_type, n.domain) != "HzChannelScale" or len(n.input) != 2:
            continue
        x, c = n.input
        shape = shapes.get(x)
        if shape is None or len(shape) < 2:
            continue
        scale = per_channel(numpy_helper.to_array(consts[c]), shape[1], len(shape))
        if scale is None:
            continue
        shift = np.zeros(shape[1])
        add = _sole_reader(n, users, outputs)
        bias = _add_as_bias(add, consts, shape) if add is not None else None
        if add is not None and bias is not None:
            shift, k = bias
            if biased is None:
                opset = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
                biased = helper.make_function(HZ_DOMAIN, "HzChannelScale__1", ["i0", "i1", "i2"], ["y"],
                                              [helper.make_node("Mul", ["i0", "i1"], ["t"]),
                                               helper.make_node("Add", ["t", "i2"], ["y"])], opset)
            _take_bias(graph, consts, n, add, k, shift, len(shape), biased.name, names)
            drop.add(id(add))
        conv = _sole_reader(n, users, outputs)
        if conv is not None and _fold_scale_into_conv(graph, consts, n, conv, scale, shift, names):
            drop.add(id(n))
    if biased is not None:
        model.functions.append(biased)
    remove_nodes(graph, drop)


def _sole_reader(n: onnx.NodeProto, users: dict[str, list[onnx.NodeProto]], outputs: set[str]) -> onnx.NodeProto | None:
    """The one node that reads ``n``'s output, None when it has several readers or is a graph output."""
    readers = users.get(n.output[0], [])
    return readers[0] if len(readers) == 1 and n.output[0] not in outputs else None


def _add_as_bias(add: onnx.NodeProto, consts: dict[str, onnx.TensorProto],
                 shape: tuple[int, ...]) -> tuple[np.ndarray, int] | None:
    """The shift an ``Add`` (either order) or ``Sub`` (``x - c``) of a scalar or per-channel constant
    adds to a map of ``shape`` with more than one channel, and the index of its constant input; None
    for any other node (hb leaves an Add after a single-channel map, as after a Conv)."""
    channels = shape[1]
    if add.op_type not in ("Add", "Sub") or add.domain not in ("", "ai.onnx") or channels <= 1 or len(add.input) != 2:
        return None
    k = [i for i, t in enumerate(add.input) if t in consts]
    if len(k) != 1 or (add.op_type == "Sub" and k[0] != 1):
        return None
    value = per_channel(numpy_helper.to_array(consts[add.input[k[0]]]), channels, len(shape))
    if value is None:
        return None
    return (value if add.op_type == "Add" else -value), k[0]


def _take_bias(graph: onnx.GraphProto, consts: dict[str, onnx.TensorProto], n: onnx.NodeProto, add: onnx.NodeProto,
               k: int, shift: np.ndarray, rank: int, biased: str, names: NameMap) -> None:
    """The lowered Mul ``n`` becomes ``x * c + shift`` (function ``biased``) and writes ``add``'s output
    (``<mul>UNIT_BIAS_FOR_<mul>_fuse_add_sub`` in hb's graph); ``add`` is left for the caller to drop."""
    channels = shift.shape[0]
    b_name = unique_name(f"{n.name}_hz_bias", set(consts))
    consts[b_name] = numpy_helper.from_array(shift.reshape((1, channels) + (1,) * (rank - 2)).astype(np.float32), b_name)
    graph.initializer.append(consts[b_name])
    n.op_type = biased
    n.input.append(b_name)
    n.output[0] = add.output[0]
    names.rewrites[add.name] = Rewrite(add.name, add.op_type, (n.name,), ((1 - k, n.name, 0),), n.name,
                                       f"{add.op_type} of a constant folded into {n.name}'s bias")


def _fold_scale_into_conv(graph: onnx.GraphProto, consts: dict[str, onnx.TensorProto], n: onnx.NodeProto,
                          conv: onnx.NodeProto, scale: np.ndarray, shift: np.ndarray, names: NameMap) -> bool:
    """Fold the lowered Mul ``n`` (``x * scale + shift``) into ``conv``, its only reader, when that Conv
    has no padding and one group (``fuse_unit_conv_into_conv``): the Conv reads ``x`` with scaled weights
    and a shifted bias. False (nothing changed) when hb's optimizer leaves it."""
    x, channels = n.input[0], scale.shape[0]
    if conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx") or conv.input[0] != n.output[0] \
            or len(conv.input) < 2 or conv.input[1] not in consts \
            or (len(conv.input) > 2 and conv.input[2] and conv.input[2] not in consts):
        return False
    attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    if attrs.get("group", 1) != 1 or any(attrs.get("pads", [])) or auto_pad not in (b"NOTSET", b"VALID"):
        return False
    w = numpy_helper.to_array(consts[conv.input[1]]).astype(np.float64)
    if w.shape[1] != channels:
        return False
    b = numpy_helper.to_array(consts[conv.input[2]]).astype(np.float64) if len(conv.input) > 2 and conv.input[2] \
        else np.zeros(w.shape[0])
    spread = (1, channels) + (1,) * (w.ndim - 2)
    b = b + (w * shift.reshape(spread)).reshape(w.shape[0], -1).sum(axis=1)
    w = w * scale.reshape(spread)
    base = conv.name or conv.output[0]
    w_name, b_name = unique_name(f"{base}_hz_weight", set(consts)), unique_name(f"{base}_hz_bias", set(consts))
    for name, value in ((w_name, w), (b_name, b)):
        consts[name] = numpy_helper.from_array(value.astype(np.float32), name)
        graph.initializer.append(consts[name])
    del conv.input[:]
    conv.input.extend([x, w_name, b_name])
    for name, r in list(names.rewrites.items()):
        if r.nodes == (n.name,):
            names.rewrites[name] = Rewrite(name, r.op_type, (), (), None, f"{r.reason}, then into {conv.name}")
    if n.name not in names.rewrites:
        names.rewrites[n.name] = Rewrite(n.name, "Mul", (), (), None, f"Mul by a constant folded into {conv.name}")
    return True
