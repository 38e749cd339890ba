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
    # Chains of single-input element-wise ops evaluate as one lookup table.
    for node in graph:
        if node.name in taken or not _unary(graph, node, target):
            continue
        chain = [node]
        while True:
            last = chain[-1]
            users = graph.consumers.get(last.outputs[0], [])
            if len(users) != 1 or last.outputs[0] in graph.output_names:
                break
            nxt = users[0][0]
            if nxt.name in taken or not _unary(graph, nxt, target):
                break
            chain.append(nxt)
        if len(chain) > 1:
            groups.append(chain)
            taken.update(n.name for n in chain)
    groups.sort(key=lambda g: g[0].index)
    return groups


def _unary(graph: Graph, node: Node, target: Target) -> bool:
    return node.op_type in target.lut_ops and len(graph.data_inputs(node)) == 1 and len(node.outputs) == 1


def fused_edges(graph: Graph, target: Target) -> set[tuple[str, str]]:
    """(producer name, consumer name) pairs inside a fusion group."""
    edges = set()
    for group in fusion_groups(graph, target):
        for a, b in zip(group, group[1:]):
            edges.add((a.name, b.name))
    return edges
