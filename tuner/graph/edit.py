"""Small ONNX graph edits the optimizer's passes share (:mod:`tuner.graph.optimize`): who reads a
tensor, static shapes, fresh names, per-channel constants, node replacement and removal."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import numpy as np
import onnx


def consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """Tensor -> the nodes that read it, in graph order."""
    users: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for n in graph.node:
        for t in n.input:
            if t:
                users[t].append(n)
    return users


def static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Tensor -> its shape, for the inputs, value infos and outputs whose every dimension is known."""
    out = {}
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            out[vi.name] = tuple(d.dim_value for d in tt.shape.dim)
    return out


def unique_name(name: str, used: set[str]) -> str:
    """``name``, or ``name_1``, ``name_2``, ... the first not in ``used`` (added to it)."""
    out, k = name, 1
    while out in used:
        out, k = f"{name}_{k}", k + 1
    used.add(out)
    return out


def per_channel(value: np.ndarray, c_out: int, rank: int) -> np.ndarray | None:
    """A constant that broadcasts over a rank-``rank`` [N, C, ...] map as one value, or one value per
    channel C = ``c_out``: its ``c_out`` values, float64. None for any other shape (a (C,) vector
    broadcasts along the last axis, not the channels)."""
    if value.size == 1 and value.ndim <= rank:
        return np.full(c_out, float(value.reshape(-1)[0]))
    if value.ndim > rank or value.ndim < 2:
        return None
    shape = (1,) * (rank - value.ndim) + value.shape
    if shape[1] != c_out or any(d != 1 for k, d in enumerate(shape) if k != 1):
        return None
    return value.reshape(-1).astype(np.float64)


def rewrite_each(graph: onnx.GraphProto, rewrite: Callable[[onnx.NodeProto], list[onnx.NodeProto] | None]) -> None:
    """Replace each node by the nodes ``rewrite`` returns for it, in place (None: the node stays)."""
    new_nodes: list[onnx.NodeProto] = []
    changed = False
    for n in graph.node:
        out = rewrite(n)
        if out is None:
            new_nodes.append(n)
        else:
            new_nodes.extend(out)
            changed = True
    if changed:
        del graph.node[:]
        graph.node.extend(new_nodes)


def remove_nodes(graph: onnx.GraphProto, drop: set[int]) -> None:
    """Remove the nodes whose ``id`` is in ``drop`` (if any), then the initializers nothing reads."""
    if not drop:
        return
    keep = [n for n in graph.node if id(n) not in drop]
    del graph.node[:]
    graph.node.extend(keep)
    used = {t for n in graph.node for t in n.input} | {o.name for o in graph.output}
    for t in [t for t in graph.initializer if t.name not in used]:
        graph.initializer.remove(t)
