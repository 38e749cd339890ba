"""Simulate hb_mapper's quantization of a candidate with onnxruntime and score it."""

from tuner.simulate.plan import Plan, make_plan
from tuner.simulate.simulator import Evaluation, NodeRow, Resolved, Simulator

__all__ = ["Evaluation", "NodeRow", "Plan", "Resolved", "Simulator", "make_plan"]
