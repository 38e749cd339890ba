"""onnxruntime sessions configured for simulation."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnxruntime as ort

# onnxruntime re-quantizes the float weights of nodes fed by a DequantizeLinear
# ("WeightBiasQuantization"). That would quantize CPU (float) nodes behind a BPU->CPU edge
# and re-quantize our per-channel weights per tensor, so it stays off.
DISABLED_OPTIMIZERS = ["WeightBiasQuantization"]


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
    if external is not None and not isinstance(model, bytes):
        # stubs in the graph, values handed over once (tuner.simulate.qdq.ExternalWeights)
        names = [t.name for t in model.graph.initializer
                 if t.data_location == onnx.TensorProto.EXTERNAL and t.name in external.values]
        if names:
            opts.add_external_initializers(names, [external.values[n] for n in names])
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
