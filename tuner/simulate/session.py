"""onnxruntime sessions configured for simulation."""

from __future__ import annotations

import os

import onnx
import onnxruntime as ort

# onnxruntime re-quantizes the float weights of nodes fed by a DequantizeLinear
# ("WeightBiasQuantization"). That would quantize CPU (float) nodes behind a BPU->CPU edge
# and re-quantize our per-channel weights per tensor, so it stays off.
DISABLED_OPTIMIZERS = ["WeightBiasQuantization"]


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def make_session(model: onnx.ModelProto | bytes, threads: int | None = None) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads or default_threads()
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    # No QDQ fusion into int8 kernels (QLinearConv, QLinearSigmoid lookup tables, ...): the
    # simulator needs exact fake-quant semantics for every dtype and per-channel activation
    # scales, which those kernels do not all take (QLinearSigmoid rejects per-channel scales).
    opts.add_session_config_entry("session.disable_quant_qdq", "1")
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, sess_options=opts, providers=["CPUExecutionProvider"],
                                disabled_optimizers=DISABLED_OPTIMIZERS)


def with_outputs(model: onnx.ModelProto, tensors: list[str]) -> onnx.ModelProto:
    """A copy of ``model`` that also returns ``tensors`` (for statistics and per-node tables)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    have = {o.name for o in out.graph.output}
    for t in tensors:
        if t not in have:
            out.graph.output.append(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None))
            have.add(t)
    return out
