"""Fusion groups: chains like Conv+BN+Add+ReLU that the BPU runs as one instruction.

No quantization happens on the edges inside a group, so the simulator must not insert a
quantizer there. A chain only fuses while each member's output feeds just the next member
(otherwise the intermediate value is needed elsewhere and must be materialized).
"""

from __future__ import annotations

from tuner.graph.graph import Graph, Node
from tuner.graph.target import FusionStep, Target


def _match(graph: Graph, head: Node, steps: tuple[FusionStep, ...]) -> list[Node]:
    if head.op_type not in steps[0].ops:
        return []
    chain = [head]
    for step in steps[1:]:
        last = chain[-1]
        users = graph.consumers.get(last.outputs[0], []) if last.outputs else []
        if len(users) != 1 or last.outputs[0] in graph.output_names:
            break
        nxt, _ = users[0]
        if nxt.op_type in step.ops:
            chain.append(nxt)
        elif not step.optional:
            return []
    if head.op_type == "MatMul" and graph.rank(head.inputs[0]) == 2:
        chain = chain[:1]
    return chain if len(chain) > 1 else []


def fusion_groups(graph: Graph, target: Target) -> list[list[Node]]:
    """Static fusion groups (longest pattern match from each head), in topological order.

    They depend only on the graph and the patterns, so they are computed once per graph."""
    key = ("fusion_groups", target.fusion_patterns, target.lut_ops)
    if key not in graph.cache:
        graph.cache[key] = _fusion_groups(graph, target)
    return graph.cache[key]


def _fusion_groups(graph: Graph, target: Target) -> list[list[Node]]:
    taken: set[str] = set()
    groups = []
    for node in graph:
        if node.name in taken:
            continue
        best: list[Node] = []
        for pattern in target.fusion_patterns:
            chain = _match(graph, node, pattern)
            if len(chain) > len(best):
                best = chain
        if best:
            groups.append(best)
            taken.update(n.name for n in best)
    # Single-input element-wise ops are not chained into one table: hb_mapper runs each as its own HzLut
    # with a calibration node between them (measured on hb_mapper 1.24.3 with toy models at O0: Conv ->
    # Abs -> Sigmoid, Sigmoid -> Sigmoid and Tanh -> Exp each quantize the tensor between the two tables,
    # e.g. 5.499 between two Sigmoids and 1.0 between Tanh and Exp; and PP-OCRv4's ConvTranspose -> Add of
    # a constant -> Sigmoid runs the Add as HzSElementwiseAdd with an int16 output, then the Sigmoid).
    # A MatMul whose input is 2-D ([N, C] x [C, K], a classifier's head) keeps its bias Add apart: its own output
    # is quantized (int8, its own threshold) and the Add is an HzSElementwiseAdd (toy GlobalAveragePool ->
    # Reshape -> MatMul -> Add: int8 at 0.6488, then an int16 Add; PP-OCR's classifier: MatMul@0 int8 at 1.6444,
    # Add@43 int16 at 1.6379, both clipping its logits); on a 3-D input hb folds the Add into the lowered
    # Conv's bias (toy Reshape -> Transpose -> MatMul -> Add: one HzSQuantizedConv with the bias, int32 out).
    groups.sort(key=lambda g: g[0].index)
    return groups


def fused_edges(graph: Graph, target: Target) -> set[tuple[str, str]]:
    """(producer name, consumer name) pairs inside a fusion group."""
    edges = set()
    for group in fusion_groups(graph, target):
        for a, b in zip(group, group[1:]):
            edges.add((a.name, b.name))
    return edges
