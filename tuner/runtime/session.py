"""onnxruntime sessions configured for simulation."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnxruntime as ort

from tuner.runtime import fakequant

# Graph transformers that rewrite Q/DQ nodes. In a simulated graph every Q/DQ pair is a
# quantization point of the plan, which none of them may move, merge, fuse or re-type:
# "WeightBiasQuantization" would quantize the float weights of CPU nodes behind a BPU->CPU
# edge (and our per-channel weights again, per tensor), "DoubleQDQPairsRemover" would merge
# two consecutive rounding steps into one, "QDQPropagationTransformer" would move points
# across data-movement ops. (``session.disable_quant_qdq`` below stops the int8-kernel fusions.)
# "ConstantSharing" only merges equal small constants (memory, not speed): on a simulated
# graph, with a scale per quantization point, it costs ~3 ms a session for nothing.
DISABLED_OPTIMIZERS = ["WeightBiasQuantization", "DoubleQDQPairsRemover", "QDQPropagationTransformer",
                       "QDQS8ToU8Transformer", "QDQFinalCleanupTransformer", "QDQSelectorActionTransformer",
                       "EnsureUniqueDQForNodeUnit", "ConstantSharing"]

# Fusions that only rewrite patterns containing one of these op types. Each walks the whole
# graph at session creation, and a simulated graph has about twice the float model's nodes
# (860 on PP-OCR's detector), so on a model without any of those ops they are skipped, which
# changes no value since the patterns are absent. Names onnxruntime does not know are ignored.
PATTERN_OPS: dict[str, frozenset[str]] = {name: frozenset(ops) for name, ops in {
    "LayerNormFusion": ("ReduceMean",), "SimplifiedLayerNormFusion": ("ReduceMean",),
    "SkipLayerNormFusion": ("ReduceMean", "LayerNormalization"),
    "GeluFusion": ("Erf",), "BiasGeluFusion": ("Erf", "Gelu"), "FastGeluFusion": ("Tanh",),
    "QuickGeluFusion": ("Sigmoid",), "AttentionFusion": ("Softmax",), "GroupQueryAttentionFusion": ("Softmax",),
    "EmbedLayerNormFusion": ("Gather",), "BiasSoftmaxFusion": ("Softmax",), "BiasDropoutFusion": ("Dropout",),
    "MatMulScaleFusion": ("MatMul", "Gemm"), "MatmulTransposeFusion": ("MatMul",), "MatMulAddFusion": ("MatMul",),
    "MatMulActivationFusion": ("MatMul",), "DynamicQuantizeMatMulFusion": ("MatMul", "MatMulInteger"),
    "MatMulIntegerToFloatFusion": ("MatMulInteger",), "MatMulNBitsFusion": ("MatMul", "MatMulNBits"),
    "GemmActivationFusion": ("Gemm",), "ReshapeFusion": ("Reshape",), "GatherSliceToSplitFusion": ("Gather", "Slice"),
    "NotWhereFusion": ("Not",), "IsInfReduceSumFusion": ("IsInf",), "PadFusion": ("Pad",),
    "ConcatSliceElimination": ("Slice",), "TransposeOptimizer": ("Transpose",),
}.items()}


def disabled_optimizers(model: onnx.ModelProto | None) -> list[str]:
    """The transformers a session of ``model`` skips: the Q/DQ ones, and the fusions whose op
    types the model does not have (all kept when the model has subgraphs, which are not scanned)."""
    disabled = list(DISABLED_OPTIMIZERS)
    if model is None:
        return disabled
    ops: set[str] = set()
    for node in model.graph.node:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            return disabled
        ops.add(node.op_type)
    return disabled + [name for name, needs in PATTERN_OPS.items() if not needs & ops]


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def make_session(model: onnx.ModelProto | bytes, threads: int | None = 1, external=None) -> ort.InferenceSession:
    """A CPU session; ``threads`` is onnxruntime's intra-op pool (1: parallelism comes from
    running several samples at once, see :func:`run_samples`, which measured faster here)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads or default_threads()
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    # No QDQ fusion into int8 kernels (QLinearConv, QLinearSigmoid lookup tables, ...): the
    # simulator needs exact fake-quant semantics for every dtype and per-channel activation
    # scales, which those kernels do not all take (QLinearSigmoid rejects per-channel scales).
    opts.add_session_config_entry("session.disable_quant_qdq", "1")
    if not isinstance(model, bytes) and fakequant.uses_kernel(model):
        path = fakequant.library()
        if path is None:
            raise RuntimeError("this simulated graph has FakeQuant nodes but the kernel library is unavailable")
        opts.register_custom_ops_library(path)
    if external is not None and not isinstance(model, bytes):
        # stubs in the graph, values handed over once (tuner.simulate.qdq.ExternalWeights)
        names = [t.name for t in model.graph.initializer
                 if t.data_location == onnx.TensorProto.EXTERNAL and t.name in external.values]
        if names:
            opts.add_external_initializers(names, [external.values[n] for n in names])
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, sess_options=opts, providers=["CPUExecutionProvider"],
                                disabled_optimizers=disabled_optimizers(None if isinstance(model, bytes) else model))


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


def run_samples(session: ort.InferenceSession, names: list[str], samples: Iterable[dict[str, np.ndarray]],
                workers: int | None = None, with_inputs: bool = False) -> Iterator:
    """Run ``session`` on every sample, ``workers`` at a time, yielding outputs in order.

    onnxruntime releases the GIL while it runs, so a small thread pool keeps every core busy
    on small models where one sample cannot (measured on the example model: 2 threads of
    single-threaded sessions beat one session with 2 intra-op threads by ~1.5x). At most
    2 x workers samples are in memory at once: the data set is still streamed.
    With ``with_inputs`` it yields (sample, outputs) pairs.
    """
    if with_inputs:
        def run(sample):
            return sample, session.run(names, sample)
    else:
        def run(sample):
            return session.run(names, sample)
    workers = workers or default_threads()
    if workers <= 1:
        for sample in samples:
            yield run(sample)
        return
    with ThreadPoolExecutor(workers) as pool:
        pending: deque = deque()
        for sample in samples:
            pending.append(pool.submit(run, sample))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
