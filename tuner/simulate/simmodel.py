"""What a simulator needs of the model alone, built once per model and shared by every data set.

The graph hb_mapper calibrates (tuner.graph), the fake-quantized weights (they do not depend on the
candidate), the static tensors handed to onnxruntime once (:class:`~tuner.simulate.weights.ExternalWeights`)
and the float model with every node's output. A simulator over other samples (the log's calibration
samples, another evaluation set) reuses all of it: only :class:`~tuner.simulate.simdata.SimData` is new.
"""

from __future__ import annotations

from typing import Any

import onnx
import onnxruntime as ort

from tuner.graph import Graph, Target
from tuner.graph.softmax import expand_softmax
from tuner.inputs.model import LoadedModel
from tuner.runtime import fakequant
from tuner.runtime.session import make_session, with_outputs
from tuner.simulate import intconv
from tuner.simulate.plan import Plan
from tuner.simulate.qdq import build_sim_model
from tuner.simulate.scales import Scales
from tuner.simulate.weights import ExternalWeights, WeightCache, deconv_group, weight_axis


class SimModel:
    """The model side of a simulator: ``graph``, ``weights``, ``external``, ``fused`` and :meth:`build`."""

    def __init__(self, model: LoadedModel, target: Target):
        self.model = model
        self.target = target
        self.graph = Graph(model.proto, model.names)
        # One FakeQuant node per quantization point when its kernel builds here, else Q/DQ pairs
        # (same values, bit for bit; tuner.runtime.fakequant).
        self.fused = fakequant.library() is not None
        # hb's integer Conv requantization and HardSigmoid table (tuner.simulate.intconv): opt-in, TUNER_INTCONV=1
        self.int_conv = intconv.enabled()
        self.weights = WeightCache()
        self.external = ExternalWeights()
        # the float model with every node's output, by (tensors, softmax expanded): one at a time
        self._float_node_sessions: dict[tuple[tuple[str, ...], bool], ort.InferenceSession] = {}
        # Weights do not depend on the candidate: fake-quantize them all once, here.
        for node in self.graph:
            if node.op_type in target.weight_ops:
                idx, axis = target.weight_ops[node.op_type]
                if len(node.inputs) > idx and node.inputs[idx] in self.graph.initializers:
                    self.weights.get(self.graph.initializers[node.inputs[idx]],
                                     weight_axis(node.proto, node.op_type, axis), deconv_group(node))

    def build(self, plan: Plan, scales: Scales, memo: dict[Any, Any], extra: list[str] | None = None,
              plain: bool = False) -> onnx.ModelProto:
        """The simulated model of ``plan`` under ``scales`` (tuner.simulate.qdq.build_sim_model); ``memo``
        is the caller's (its entries depend on the calibration statistics too)."""
        return build_sim_model(self.model.proto, self.graph, self.target, plan, scales, self.weights,
                               extra_outputs=extra, external=self.external, memo=memo, fused=self.fused,
                               plain_per_channel=plain, int_conv=self.int_conv)

    def session(self, proto: onnx.ModelProto) -> ort.InferenceSession:
        """An onnxruntime session of a model :meth:`build` made (its static tensors passed once)."""
        return make_session(proto, external=self.external)

    def float_nodes(self, extra: tuple[str, ...], softmax: bool) -> ort.InferenceSession:
        """The float model with every node's output, for per-node rows: built once per set of
        tensors (the report's two traces and the log comparisons ask for the same set)."""
        cache = self._float_node_sessions
        key = (extra, softmax)
        if key not in cache:
            cache.clear()      # one at a time: a session with every output is the model's size again
            cache[key] = make_session(with_outputs(expand_softmax(self.model.proto) if softmax else self.model.proto,
                                                   list(extra)))
        return cache[key]
