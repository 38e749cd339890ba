"""The model as hb_mapper sees it: named nodes in topological order, tensors and their users."""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import onnx

from tuner.errors import TunerError
from tuner.graph.hz import hz_kind
from tuner.graph.names import NameMap
from tuner.graph.softmax import softmax_tensors

# Inputs that carry data (and so get quantized on the BPU); other inputs are shapes, indices,
# scales or conditions. Ops not listed: every input is a data input.
DATA_INPUTS: dict[str, tuple[int, ...]] = {
    "Resize": (0,), "Upsample": (0,), "Clip": (0,), "Pad": (0,), "Slice": (0,), "Reshape": (0,),
    "Expand": (0,), "Tile": (0,), "Gather": (0,), "GatherElements": (0,), "GatherND": (0,),
    "ScatterND": (0, 2), "ScatterElements": (0, 2), "Where": (1, 2), "TopK": (0,),
    "Conv": (0,), "ConvTranspose": (0,), "BatchNormalization": (0,), "Split": (0,),
    "Squeeze": (0,), "Unsqueeze": (0,), "ReduceMax": (0,), "ReduceMean": (0,), "ReduceSum": (0,),
    "ReduceMin": (0,), "PRelu": (0,), "Dropout": (0,), "LSTM": (0,), "GridSample": (0, 1),
}


def toposort(nodes: list[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
    """Kahn's algorithm, stable: among ready nodes the original order is kept."""
    waiting: dict[int, int] = {}
    users: dict[str, list[int]] = defaultdict(list)
    produced = {o for n in nodes for o in n.output}
    ready: list[int] = []
    for i, n in enumerate(nodes):
        missing = {t for t in n.input if t and t not in available}
        undefined = missing - produced
        if undefined:
            raise ValueError(f"node {n.name or n.op_type!r} reads undefined tensors {sorted(undefined)[:3]}")
        waiting[i] = len(missing)
        for t in missing:
            users[t].append(i)
        if not missing:
            ready.append(i)
    heapq.heapify(ready)
    out = []
    while ready:
        i = heapq.heappop(ready)
        out.append(nodes[i])
        for t in nodes[i].output:
            for j in users.pop(t, []):
                waiting[j] -= 1
                if waiting[j] == 0:
                    heapq.heappush(ready, j)
    if len(out) != len(nodes):
        raise ValueError("the graph has a cycle")
    return out


@dataclass
class Node:
    name: str
    op_type: str
    inputs: list[str]
    outputs: list[str]
    index: int
    proto: onnx.NodeProto = field(repr=False)

    def attr(self, name: str, default: Any = None) -> Any:
        """The value of the node's attribute ``name`` (onnx.helper.get_attribute_value), else ``default``."""
        for a in self.proto.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default


class Graph:
    """Nodes in topological order with producer/consumer maps. Read-only."""

    def __init__(self, model: onnx.ModelProto, names: NameMap | None = None):
        #: what hb_mapper's optimizer (tuner.graph.optimize) changed, for names of the user's ONNX
        self.names = names if names is not None else NameMap()
        g = model.graph
        self.initializers = {t.name: t for t in g.initializer}
        self.input_names = [i.name for i in g.input if i.name not in self.initializers]
        self.output_names = [o.name for o in g.output]
        self.dtypes: dict[str, int] = {}
        self.shapes: dict[str, tuple[int | None, ...]] = {}
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            tt = vi.type.tensor_type
            self.dtypes[vi.name] = tt.elem_type
            if tt.HasField("shape"):
                self.shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
        for t in g.initializer:
            self.dtypes[t.name] = t.data_type
            self.shapes[t.name] = tuple(t.dims)
        self.nodes = self._toposort(list(g.node))
        self.cache: dict = {}  # derived static facts (fusion groups per pattern set, ...)
        self.by_name = {n.name: n for n in self.nodes}
        self.producer: dict[str, Node] = {}
        self.consumers: dict[str, list[tuple[Node, int]]] = defaultdict(list)
        for node in self.nodes:
            for out in node.outputs:
                if out:
                    self.producer[out] = node
            for k, inp in enumerate(node.inputs):
                if inp:
                    self.consumers[inp].append((node, k))

    def _toposort(self, protos: list[onnx.NodeProto]) -> list[Node]:
        available = set(self.initializers) | set(self.input_names)
        try:
            ordered = toposort(protos, available)
        except ValueError as exc:
            raise TunerError(f"{exc}; check the model with onnx.checker") from None
        return [Node(p.name, hz_kind(p.op_type, p.domain), list(p.input), list(p.output), i, p)
                for i, p in enumerate(ordered)]

    def is_float(self, tensor: str) -> bool:
        return self.dtypes.get(tensor) == onnx.TensorProto.FLOAT

    def is_activation(self, tensor: str) -> bool:
        """A float tensor computed at run time (not a weight or constant)."""
        return bool(tensor) and tensor not in self.initializers and self.is_float(tensor)

    def data_inputs(self, node: Node) -> list[tuple[int, str]]:
        """(index, tensor) of the node's activation inputs, the ones a BPU op quantizes."""
        allowed = DATA_INPUTS.get(node.op_type)
        return [(k, t) for k, t in enumerate(node.inputs)
                if (allowed is None or k in allowed) and self.is_activation(t)]

    def activation_tensors(self) -> list[str]:
        """Every activation tensor that some quantization could touch, in topological order."""
        seen: dict[str, None] = {}
        for name in self.input_names:
            if self.is_float(name):
                seen[name] = None
        for node in self.nodes:
            if node.op_type == "Softmax" and self.shapes.get(node.inputs[0]) is not None:
                for t in softmax_tensors(node.name):   # its parts', should it run on the BPU
                    seen[t] = None
            for out in node.outputs:
                if self.is_activation(out):
                    seen[out] = None
        return list(seen)

    def rank(self, tensor: str) -> int | None:
        shape = self.shapes.get(tensor)
        return None if shape is None else len(shape)

    def channels(self, tensor: str) -> int | None:
        shape = self.shapes.get(tensor)
        if shape is None or len(shape) < 2:
            return None
        return shape[1]

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self):
        return iter(self.nodes)

    def node(self, name: str) -> Node:
        try:
            return self.by_name[name]
        except KeyError:
            removed = self.names.removed(name)
            if removed is not None:
                raise TunerError(f"node {name!r} ({removed.op_type}) is not in the graph hb_mapper calibrates: "
                                 f"{removed.reason} by its optimizer; drop it from node_info") from None
            rewrite = self.names.rewrites.get(name)
            if rewrite is not None:   # a name node_info accepts, but a search space must not list
                raise TunerError(f"node {name!r} ({rewrite.op_type}) is not in the graph hb_mapper calibrates: "
                                 f"{rewrite.reason}; name {', '.join(map(repr, rewrite.nodes))} instead") from None
            raise TunerError(f"node {name!r} is not in the model{self._name_hint(name)}. node_info keys are node "
                             "names of the input ONNX; 'tuner nodes CONFIG.yaml' lists them") from None

    def _name_hint(self, name: str) -> str:
        """Did-you-mean (substring, else difflib) and, for a name from another model (``Conv_170``),
        examples of this model's names, of the same op type where the name says one."""
        import difflib
        import re

        close = [n for n in self.by_name if name.lower() in n.lower()][:3]
        close = close or difflib.get_close_matches(name, list(self.by_name), n=3, cutoff=0.6)
        if close:
            return f" (did you mean {' or '.join(repr(n) for n in close)}?)"
        ops = {n.op_type for n in self.nodes}
        op = next((w for w in re.findall(r"[A-Za-z]+", name) if w in ops), None)
        examples = [n.name for n in self.nodes if op is None or n.op_type == op][:3]
        return f" (this model names its {op + ' ' if op else ''}nodes like {', '.join(map(repr, examples))})"
