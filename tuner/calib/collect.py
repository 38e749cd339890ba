"""The one streaming pass over the calibration data that every calibration method shares.

The float model is run once per sample with every activation tensor exposed; each tensor's
``StatsCollector`` is updated and the sample is dropped. The result is cached on disk,
keyed by the model and data fingerprints, so a second run makes no data pass at all.

hmct's kl histogram depends on how hb_mapper batches the calibration data (its bin width is set by
the first kernel call's max, ``tuner.calib.stats``). The batch is hmct's rule
(``hmct/quantizer/calibrater/activation/base.py``, ``get_calibration_thresholds``): 8 samples a call
when every model input has batch 1 (and no custom op), falling back to 1 when the batch-8 model fails
to run (``hmct/executor/ort.py``, ``forward_with_batch``): the example's ScatterND with constant
indices fails at batch 8 ("Reset batch_size=1" in its log), PP-OCRv4's detector runs at 8.
:func:`calibration_batch` reproduces that; with a batch of 8 a short pass over the first 8 samples
reads each tensor's first-call max before the main pass (PP-OCRv4's detector, 8 samples of 256x320:
the statistics pass went from ~2.8 s to ~3.1 s; the example, batch 1, pays only the batch probe).
The samples are in sorted file order, as hb_mapper reads ``cal_data_dir`` (``tuner.inputs.data``).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from tuner.calib.stats import StatsCollector, TensorStats, load_stats, save_stats
from tuner.errors import TunerError
from tuner.files import cache_dir
from tuner.graph.softmax import expand_softmax
from tuner.inputs.data import DataSet
from tuner.runtime.session import make_session, run_samples, with_outputs

STATS_VERSION = "4"   # 2: running-max histograms; 3: graph inputs counted once; 4: hmct's kl histogram

#: hmct's calibration batch when the model allows it (``get_calibration_thresholds``).
HB_CALIBRATION_BATCH = 8


def stats_key(model_fp: str, data_fp: str, tensors: list[str]) -> str:
    h = hashlib.sha256(f"v{STATS_VERSION}|{model_fp}|{data_fp}|".encode())
    h.update("\n".join(tensors).encode())
    return h.hexdigest()[:24]


def calibration_batch(model, data: DataSet) -> int:
    """How many samples hmct feeds its calibration kernels at once: 8 when every model input has
    batch 1 and the model runs with a batch dimension that is free, else 1.

    hmct frees the inputs' first dimension, re-infers shapes and runs batches of 8, and on any
    failure starts again one sample at a time. Here the float model, its inputs' first dimension
    freed and its inferred shapes dropped, runs two copies of the first sample: a graph that only
    runs at batch 1 (a Reshape or ScatterND with a constant shape) fails on any batch above 1.
    """
    if len(data) < 2 or any(len(shape) == 0 or shape[0] != 1 for shape in model.input_shapes.values()):
        return 1
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    del proto.graph.value_info[:]
    for vi in list(proto.graph.input) + list(proto.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if len(dims):
            dims[0].ClearField("dim_value")
            dims[0].dim_param = "hb_calibration_batch"
    quiet = ort.RunOptions()
    quiet.log_severity_level = 4          # the failure is the answer, not an error to print
    try:
        session = make_session(proto)
        sample = next(iter(data))
        session.run(None, {name: np.concatenate([value, value]) for name, value in sample.items()}, quiet)
    except Exception:
        return 1
    return HB_CALIBRATION_BATCH


def first_call_max(session, names: list[str], data: DataSet, batch: int, threads: int | None) -> dict[str, float]:
    """max |x| of every tensor (outputs ``names`` and the graph inputs) over the first ``batch`` samples."""
    out: dict[str, float] = {}
    for sample, outs in run_samples(session, names, itertools.islice(iter(data), batch), threads, with_inputs=True):
        for name, value in list(sample.items()) + list(zip(names, outs)):
            top = float(np.max(np.abs(value))) if np.size(value) else 0.0
            out[name] = max(out.get(name, 0.0), top)
    return out


def collect_statistics(model, data: DataSet, tensors: list[str], threads: int | None = None,
                       progress: Callable[[int, int], None] | None = None,
                       batch: int | None = None) -> dict[str, TensorStats]:
    """Run the float model over ``data`` once and return the statistics of ``tensors``.

    ``batch``: hmct's calibration batch (default: :func:`calibration_batch`); every ``batch``
    samples end one kernel call of the kl histogram."""
    # A Softmax as its parts, so that their tensors have statistics should it run on the BPU.
    session = make_session(with_outputs(expand_softmax(model.proto), tensors))
    names = [o.name for o in session.get_outputs()]
    # Graph inputs come from the samples themselves (not again as outputs: they were counted twice).
    inputs = set(model.input_names)
    wanted = [n for n in names if n in set(tensors) and n not in inputs]
    batch = batch or calibration_batch(model, data)
    first = first_call_max(session, wanted, data, batch, threads) if batch > 1 else {}
    collectors = {t: StatsCollector(kl_first_max=first.get(t)) for t in tensors}
    n = len(data)
    # onnxruntime runs the next samples on the other threads while this one updates histograms.
    for i, (sample, outs) in enumerate(run_samples(session, wanted, data, threads, with_inputs=True)):
        call_end = (i + 1) % batch == 0 or i + 1 == n
        for name, value in sample.items():
            if name in collectors:
                collectors[name].update(value, call_end)
        for name, value in zip(wanted, outs):
            try:
                collectors[name].update(value, call_end)
            except ValueError as exc:
                files = ", ".join(str(p) for p in data.sample_files(i))
                raise TunerError(f"the float model produced {exc} at tensor {name!r} on sample {files}; "
                                 "check that sample's values and the model") from None
        if progress:
            progress(i + 1, n)
    return {t: c.result() for t, c in collectors.items()}


def cached_statistics(model, data: DataSet, tensors: list[str], threads: int | None = None,
                      progress: Callable[[int, int], None] | None = None,
                      data_fingerprint: str | None = None) -> tuple[dict[str, TensorStats], bool, Path]:
    """Statistics from the disk cache when present, else one data pass (then cached).

    Returns (stats, from_cache, cache path); the path also names the threshold memo beside it.
    """
    key = stats_key(model.fingerprint, data_fingerprint or data.fingerprint(), tensors)
    path = cache_dir() / "stats" / f"{key}.npz"
    if path.is_file():
        try:
            stats, _ = load_stats(path)
            if set(stats) >= set(tensors):
                return stats, True, path
        except Exception:
            pass  # a damaged cache entry is recomputed and overwritten
    stats = collect_statistics(model, data, tensors, threads, progress)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_stats(path, stats, {"model": model.fingerprint, "key": key})
    except OSError:
        pass  # a read-only cache only costs time
    return stats, False, path
