"""Modeled on-chip latency of a candidate: BPU and CPU time plus the price of every switch."""

from tuner.cost.latency import CostModel, LatencyBreakdown

__all__ = ["CostModel", "LatencyBreakdown"]
