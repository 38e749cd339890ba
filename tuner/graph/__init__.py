"""The model as hb_mapper sees it: names, order, fusion groups, and the target's op tables."""

from tuner.graph.fusion import fused_edges, fusion_groups
from tuner.graph.graph import Graph, Node
from tuner.graph.target import Target, load_target

__all__ = ["Graph", "Node", "Target", "fused_edges", "fusion_groups", "load_target"]
