"""The one streaming pass over the calibration data that every calibration method shares.

The float model is run once per sample with every activation tensor exposed; each tensor's
``StatsCollector`` is updated and the sample is dropped. The result is cached on disk,
keyed by the model and data fingerprints, so a second run makes no data pass at all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from tuner.calib.stats import StatsCollector, TensorStats, load_stats, save_stats
from tuner.errors import TunerError
from tuner.files import cache_dir
from tuner.graph.softmax import expand_softmax
from tuner.inputs.data import DataSet
from tuner.runtime.session import make_session, run_samples, with_outputs

STATS_VERSION = "3"   # 2: running-max histograms for max-percentile; 3: graph inputs counted once


def stats_key(model_fp: str, data_fp: str, tensors: list[str]) -> str:
    h = hashlib.sha256(f"v{STATS_VERSION}|{model_fp}|{data_fp}|".encode())
    h.update("\n".join(tensors).encode())
    return h.hexdigest()[:24]


def collect_statistics(model, data: DataSet, tensors: list[str], threads: int | None = None,
                       progress: Callable[[int, int], None] | None = None) -> dict[str, TensorStats]:
    """Run the float model over ``data`` once and return the statistics of ``tensors``."""
    # A Softmax as its parts, so that their tensors have statistics should it run on the BPU.
    session = make_session(with_outputs(expand_softmax(model.proto), tensors))
    names = [o.name for o in session.get_outputs()]
    # Graph inputs come from the samples themselves (not again as outputs: they were counted twice).
    inputs = set(model.input_names)
    wanted = [n for n in names if n in set(tensors) and n not in inputs]
    collectors = {t: StatsCollector() for t in tensors}
    # onnxruntime runs the next samples on the other threads while this one updates histograms.
    for i, (sample, outs) in enumerate(run_samples(session, wanted, data, threads, with_inputs=True)):
        for name, value in sample.items():
            if name in collectors:
                collectors[name].update(value)
        for name, value in zip(wanted, outs):
            try:
                collectors[name].update(value)
            except ValueError as exc:
                files = ", ".join(str(p) for p in data.sample_files(i))
                raise TunerError(f"the float model produced {exc} at tensor {name!r} on sample {files}; "
                                 "check that sample's values and the model") from None
        if progress:
            progress(i + 1, len(data))
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
