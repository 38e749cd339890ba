"""The optimizer's clean-up passes (:mod:`tuner.graph.optimize`): constants folded, no-op nodes removed.

* **constants folded** (:func:`fold_constants`): a node whose inputs are all constants (``Constant``,
  a ``Shape`` of a tensor whose shape is static, arithmetic on them) becomes an initializer, so shape
  computations do not appear as CPU nodes that split BPU subgraphs.
* **no-op nodes removed** (:func:`drop_noops`): ``Identity`` and ``Dropout`` (inference), and shape ops
  whose output has their input's shape, disappear; their consumers read the input directly.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tuner.graph.edit import static_shapes
from tuner.graph.names import NameMap, Rewrite

NOOP_OPS = ("Identity", "Dropout")


#: Shape ops that are no-ops when their output has their input's shape (hb's optimized graph drops
#: them: the example's Expand + Reshape before its ScatterND are gone there).
SAME_SHAPE_NOOPS = ("Expand", "Reshape", "Flatten", "Squeeze", "Unsqueeze")


_NONDETERMINISTIC = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                               "Multinomial", "Bernoulli"})


#: Folding stops at constants larger than this (a graph's weights are not recomputed).
_FOLD_MAX_ELEMENTS = 1 << 22


def fold_constants(model: onnx.ModelProto, names: NameMap) -> None:
    """Replace nodes computable from constants alone by initializers (one pass in graph order)."""
    graph = model.graph
    consts = {t.name: t for t in graph.initializer}
    shapes = static_shapes(model)
    outputs = {o.name for o in graph.output}
    opset = [o for o in model.opset_import]
    keep = []
    for node in graph.node:
        value: list[np.ndarray] | None = None
        if node.domain in ("", "ai.onnx") and node.op_type not in _NONDETERMINISTIC and not (set(node.output) & outputs):
            if node.op_type == "Shape" and node.input[0] in shapes and not node.attribute:
                value = [np.array(shapes[node.input[0]], dtype=np.int64)]
            elif node.op_type == "Size" and node.input[0] in shapes:
                value = [np.array(int(np.prod(shapes[node.input[0]])), dtype=np.int64)]
            elif node.input and all((not t) or t in consts for t in node.input) and node.op_type != "Constant":
                if sum(int(np.prod(consts[t].dims)) for t in node.input if t) <= _FOLD_MAX_ELEMENTS:
                    try:
                        feeds = {t: numpy_helper.to_array(consts[t]) for t in node.input if t}
                        body = helper.make_graph([node], "fold", [helper.make_tensor_value_info(t, consts[t].data_type, None)
                                                                  for t in feeds], [helper.make_tensor_value_info(o, 0, None)
                                                                                    for o in node.output if o])
                        # run(None, ...) returns the list of outputs
                        value = list(cast(list[np.ndarray],
                                          ReferenceEvaluator(helper.make_model(body, opset_imports=opset)).run(None, feeds)))
                    except Exception:
                        value = None   # an op the reference cannot run stays (hb_mapper may fold it; rare)
        if value is None:
            keep.append(node)
            continue
        for out, v in zip([o for o in node.output if o], value):
            t = numpy_helper.from_array(np.asarray(v), out)
            graph.initializer.append(t)
            consts[out] = t
        names.rewrites[node.name] = Rewrite(node.name, node.op_type, (), (), None, "constant folded")
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)
    used = {t for n in graph.node for t in n.input} | outputs
    unused = [t for t in graph.initializer if t.name not in used]
    for t in unused:
        graph.initializer.remove(t)


def drop_noops(model: onnx.ModelProto, names: NameMap) -> None:
    graph = model.graph
    outputs = {o.name for o in graph.output}
    inputs = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    rename: dict[str, str] = {}
    keep = []
    producer = {o: n for n in graph.node for o in n.output}
    shapes = static_shapes(model)
    for node in graph.node:
        noop = node.op_type in NOOP_OPS and node.domain in ("", "ai.onnx") and node.input and node.input[0]
        if node.op_type in SAME_SHAPE_NOOPS and node.domain in ("", "ai.onnx") and node.input and node.output:
            src_shape = shapes.get(node.input[0])
            noop = src_shape is not None and src_shape == shapes.get(node.output[0])
        if noop and node.op_type == "Dropout" and (len(node.output) > 1 and node.output[1]):
            noop = False   # its mask is read: keep it (CPU)
        if not noop:
            keep.append(node)
            continue
        src, out = node.input[0], node.output[0]
        while src in rename:
            src = rename[src]
        if out in outputs:
            # A graph output: the producer writes it under the output's name instead.
            p = producer.get(src)
            if p is None or src in outputs or src in inputs or any(src in n.input for n in graph.node if n is not node):
                keep.append(node)
                continue
            p.output[list(p.output).index(src)] = out
            producer[out] = p
            rename[src] = out
        else:
            rename[out] = src
        names.rewrites[node.name] = Rewrite(node.name, node.op_type, (), (), None, f"{node.op_type} removed")
    if len(keep) == len(graph.node):
        return
    for node in keep:
        for k, t in enumerate(node.input):
            while t in rename:
                t = rename[t]
            node.input[k] = t
    del graph.node[:]
    graph.node.extend(keep)
