"""A roofline-style latency estimate of a plan on the target.

BPU time per fusion group is max(MACs / MAC rate, bytes / bandwidth) plus a per-instruction
overhead, with int16 slower on both; CPU nodes run float at CPU rates; every CPU<->BPU
boundary tensor costs a quantize/dequantize copy, and every BPU subgraph a launch. The
coefficients are estimates in ``search_spaces/targets/<march>.yaml``; a measured per-node
profile (``{node: {bpu_ms, cpu_ms}}``) replaces the estimate where present. The search only
needs the *ranking* of candidates to be right, which this captures: fewer switches, fewer
CPU nodes, fewer int16 nodes are faster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from tuner.errors import TunerError
from tuner.graph import Graph, Node, Target, fusion_groups
from tuner.simulate.plan import Plan

COEFFICIENTS = ("bpu_macs_per_s", "bpu_bytes_per_s", "bpu_op_overhead_s", "int16_mac_factor", "int16_byte_factor",
                "cpu_macs_per_s", "cpu_bytes_per_s", "cpu_op_overhead_s", "switch_elements_per_s",
                "switch_overhead_s", "subgraph_overhead_s")


@dataclass
class LatencyBreakdown:
    bpu_ms: float
    cpu_ms: float
    switch_ms: float
    subgraphs: int
    boundary_tensors: int

    @property
    def total_ms(self) -> float:
        return self.bpu_ms + self.cpu_ms + self.switch_ms

    def as_dict(self) -> dict[str, float]:
        return {"total_ms": self.total_ms, "bpu_ms": self.bpu_ms, "cpu_ms": self.cpu_ms,
                "switch_ms": self.switch_ms, "subgraphs": self.subgraphs, "boundary_tensors": self.boundary_tensors}


def _numel(shape) -> int:
    if not shape or any(d is None for d in shape):
        return 0
    return int(math.prod(shape))


def node_macs(graph: Graph, node: Node) -> int:
    """Multiply-accumulates of one node (elementwise ops count one per output element)."""
    out = _numel(graph.shapes.get(node.outputs[0])) if node.outputs else 0
    if node.op_type in ("Conv", "ConvTranspose") and len(node.inputs) > 1:
        w = graph.shapes.get(node.inputs[1])
        dims = [d for d in w[1:] if d is not None] if w else []
        if w and len(dims) == len(w) - 1 and w[0] is not None:
            if node.op_type == "Conv":  # w: [Cout, Cin/group, kh, kw]
                return out * math.prod(dims)
            # ConvTranspose w: [Cin, Cout/group, kh, kw]: every input element feeds Cout/group*kh*kw outputs
            return _numel(graph.shapes.get(node.inputs[0])) * math.prod(dims)
    if node.op_type in ("Gemm", "MatMul") and node.inputs:
        a = graph.shapes.get(node.inputs[0])
        if a and a[-1] is not None:
            k = a[0] if node.op_type == "Gemm" and node.attr("transA", 0) else a[-1]
            if k is not None:
                return out * k
    if node.op_type in ("AveragePool", "MaxPool"):
        return out * math.prod(node.attr("kernel_shape", [1]))
    if node.op_type.startswith("Reduce") or node.op_type.startswith("Global") or node.op_type == "Softmax":
        return _numel(graph.shapes.get(node.inputs[0])) if node.inputs else out
    return out


def node_bytes(graph: Graph, node: Node) -> int:
    """Bytes of activations read and written (4 per float element; scaled for int8 on the BPU)."""
    total = 0
    for t in list(node.inputs) + list(node.outputs):
        if t and t not in graph.initializers:
            total += _numel(graph.shapes.get(t))
    return total


class CostModel:
    """Latency of plans of one graph on one target. Per-node work is computed once."""

    def __init__(self, graph: Graph, target: Target, profile: dict[str, dict[str, float]] | None = None):
        raw = target.raw.get("cost") or {}
        missing = [k for k in COEFFICIENTS if k not in raw]
        if missing:
            raise TunerError(f"target {target.march}: cost coefficients missing: {', '.join(missing)}")
        self.c = {k: float(raw[k]) for k in COEFFICIENTS}
        self.graph = graph
        self.profile = profile or {}
        self.macs = {n.name: node_macs(graph, n) for n in graph}
        self.elements = {n.name: node_bytes(graph, n) for n in graph}
        self.group_of = {}
        for group in fusion_groups(graph, target):
            for n in group:
                self.group_of[n.name] = group[0].name

    def bpu_seconds(self, name: str, int16: bool) -> float:
        if name in self.profile and "bpu_ms" in self.profile[name]:
            return self.profile[name]["bpu_ms"] / 1e3 * (self.c["int16_mac_factor"] if int16 else 1.0)
        c = self.c
        mac_rate = c["bpu_macs_per_s"] / (c["int16_mac_factor"] if int16 else 1.0)
        byte_rate = c["bpu_bytes_per_s"] / (c["int16_byte_factor"] if int16 else 1.0)
        return max(self.macs[name] / mac_rate, self.elements[name] / byte_rate)

    def cpu_seconds(self, name: str) -> float:
        if name in self.profile and "cpu_ms" in self.profile[name]:
            return self.profile[name]["cpu_ms"] / 1e3
        c = self.c
        return max(self.macs[name] / c["cpu_macs_per_s"], 4 * self.elements[name] / c["cpu_bytes_per_s"]) \
            + c["cpu_op_overhead_s"]

    def latency(self, plan: Plan) -> LatencyBreakdown:
        c = self.c
        bpu = cpu = 0.0
        instructions: set[str] = set()
        for node in self.graph:
            if plan.placement[node.name] == "BPU":
                int16 = plan.in_dtype.get(node.name) == "int16" or plan.out_dtype.get(node.name) == "int16"
                bpu += self.bpu_seconds(node.name, int16)
                # a fused chain is one instruction only while all of it is on the BPU
                head = self.group_of.get(node.name, node.name)
                instructions.add(head if plan.placement.get(head) == "BPU" else node.name)
            else:
                cpu += self.cpu_seconds(node.name)
        bpu += len(instructions) * c["bpu_op_overhead_s"]
        # Tensors that cross between CPU and BPU: quantized/dequantized and copied at run time.
        boundary = set()
        for node in self.graph:
            here = plan.placement[node.name]
            for t in node.inputs:
                if not self.graph.is_activation(t):
                    continue
                p = self.graph.producer.get(t)
                if (p is None and here == "BPU") or (p is not None and plan.placement[p.name] != here):
                    boundary.add(t)
        for t in self.graph.output_names:
            p = self.graph.producer.get(t)
            if p is not None and plan.placement[p.name] == "BPU":
                boundary.add(t)
        switch_elems = sum(_numel(self.graph.shapes.get(t)) for t in boundary)
        switch = switch_elems / c["switch_elements_per_s"] + len(boundary) * c["switch_overhead_s"] \
            + plan.n_subgraphs * c["subgraph_overhead_s"]
        return LatencyBreakdown(bpu_ms=bpu * 1e3, cpu_ms=cpu * 1e3, switch_ms=switch * 1e3,
                                subgraphs=plan.n_subgraphs, boundary_tensors=len(boundary))


def load_profile(path: str | Path) -> dict[str, dict[str, float]]:
    """A measured per-node profile: ``{node: {bpu_ms: float, cpu_ms: float}}`` (YAML or JSON)."""
    path = Path(path)
    if not path.is_file():
        raise TunerError(f"{path}: profile file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise TunerError(f"{path}: invalid YAML/JSON: {exc}") from None
    if not isinstance(data, dict):
        raise TunerError(f"{path}: expected a mapping of node name to {{bpu_ms, cpu_ms}}")
    out = {}
    for name, entry in data.items():
        if not isinstance(entry, dict) or not set(entry) <= {"bpu_ms", "cpu_ms"}:
            raise TunerError(f"{path}: {name}: expected {{bpu_ms: number, cpu_ms: number}}")
        try:
            out[str(name)] = {k: float(v) for k, v in entry.items()}
        except (TypeError, ValueError):
            raise TunerError(f"{path}: {name}: times must be numbers (milliseconds)") from None
    return out
