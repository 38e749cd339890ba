"""The node names of an hb_mapper YAML's model, as ``node_info`` takes them (``tuner nodes``).

Names are hb_mapper's, as tuner's graph has them after :mod:`tuner.graph.optimize` (a fused SiLU
is one node named after its last op; a Div of two feature maps is ``<name>_reciprocal`` and
``<name>_mul``), with the op type, where the march places the node without a ``node_info`` entry,
and the int16 ``node_info`` keys the march honours for it. Only the model is read, not the data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tuner.graph.graph import Graph
from tuner.graph.target import load_target
from tuner.inputs.config import load_config
from tuner.inputs.model import load_model


@dataclass(frozen=True)
class NodeRow:
    name: str
    op_type: str
    default: str            # BPU / CPU: hb_mapper's placement without a node_info entry
    placements: tuple[str, ...]   # where node_info 'ON' may put it
    int16: tuple[str, ...]  # node_info keys that may be int16 ('InputType', 'InputType0', 'OutputType')
    node_info: dict[str, str] | None    # the YAML's entry for it, if any

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "op_type": self.op_type, "default": self.default,
                "placements": list(self.placements), "int16": list(self.int16), "node_info": self.node_info}


def list_nodes(config_path: str | Path, op: str | None = None, march: str | None = None) -> list[NodeRow]:
    """Every node of the YAML's model in graph order (``op``: only that op type, case-insensitive)."""
    config = load_config(config_path)
    target = load_target(march or config.march)
    shapes = {s.name: s.shape for s in config.inputs if s.shape is not None}
    model = load_model(config.onnx_model, shapes, target.max_opset, target.max_ir_version)
    graph = Graph(model.proto, model.names)
    rows = []
    for node in graph:
        if op is not None and node.op_type.lower() != op.lower():
            continue
        bpu = target.bpu_capable(node.op_type) and bool(graph.data_inputs(node))
        int16: list[str] = []
        if bpu and target.int16_input(node.op_type):
            only = target.int16_input_indices(node.op_type)
            int16 += [f"InputType{k}" for k in sorted(only)] if only is not None else ["InputType"]
        if bpu and target.int16_output(node.op_type, node.proto):
            int16.append("OutputType")
        entry = config.node_info.get(node.name)
        rows.append(NodeRow(node.name, node.op_type, "BPU" if node.op_type in target.bpu_ops and bpu else "CPU",
                            ("BPU", "CPU") if bpu else ("CPU",), tuple(int16),
                            dict(entry) if entry is not None else None))
    return rows

