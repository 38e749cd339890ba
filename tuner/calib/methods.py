"""Calibration methods: symmetric thresholds (and an asymmetric range) from TensorStats.

Each method is a cheap function of the statistics gathered in the single data pass, so the
search can try every method and percentile without touching the calibration data again.
The quantizer uses ``scale = T / qmax`` and clips to ``[-T, T]`` for a threshold ``T``.
"""

from __future__ import annotations

import math

import numpy as np

from tuner.calib.kl import kl_bin
from tuner.calib.stats import KL_NUM_BIN, TensorStats

METHODS = ("max", "percentile", "max-percentile", "kl", "mse")

MSE_CANDIDATES = 200


def threshold(stats: TensorStats, method: str, *, percentile: float | None = None, qmax: int = 127) -> float:
    """Symmetric clipping threshold T of one tensor under ``method``.

    ``percentile`` (p in (0, 1], Horizon's ``max_percentile``) is required by, and only used by,
    the ``percentile`` and ``max-percentile`` methods. An all-zero (or empty) tensor gives 0.0 for
    every method.

    * ``percentile``: the p-quantile of |x| pooled over every value of every sample.
    * ``max-percentile``: hb_mapper's kernel (:func:`_max_percentile`).
    * ``kl``: hb_mapper's kernel on its own histogram (:func:`kl_bin`); the same threshold for an
      int16 node (measured: a toy with an int16 Conv input under kl, and set_all_nodes_int16, keeps
      the kl thresholds, 12.294 and 8.816 where max is 12.496 and 11.949; hmct's kernel ignores the
      node's qtype), so ``qmax`` does not change it.
    """
    _check_method(method)
    if qmax < 1:
        raise ValueError(f"qmax must be >= 1, got {qmax}")
    if method in ("percentile", "max-percentile"):
        _check_percentile(percentile)
    amax = stats.absmax
    if amax == 0.0:
        return 0.0
    if method == "max":
        return amax
    if method == "percentile":
        return _percentile(stats, float(percentile))  # type: ignore[arg-type]
    if method == "max-percentile":
        return _max_percentile(stats, float(percentile))  # type: ignore[arg-type]
    if method == "kl":
        return _kl(stats)
    return _mse(stats, qmax)


def channel_thresholds(
    stats: TensorStats, method: str, *, percentile: float | None = None, qmax: int = 127
) -> np.ndarray:
    """Per-channel thresholds (float64 [C]) along axis 1.

    ``max`` is exact. For the clipping methods this is an approximation: per-channel histograms
    are not kept (C x 16384 int64 per tensor would cost too much memory), so each channel gets
    ``min(channel abs-max, per-tensor threshold)``.
    """
    _check_method(method)
    if stats.channel_absmax is None:
        raise ValueError("no per-channel statistics: the tensor has rank < 2")
    ch = np.array(stats.channel_absmax, dtype=np.float64)
    if method == "max":
        return ch
    return np.minimum(ch, threshold(stats, method, percentile=percentile, qmax=qmax))


def asymmetric_range(stats: TensorStats) -> tuple[float, float]:
    """(min, max) widened to include 0, so that 0 is exactly representable after quantization."""
    return min(stats.min, 0.0), max(stats.max, 0.0)


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown calibration method {method!r}; expected one of {', '.join(METHODS)}")


def _check_percentile(p: float | None) -> None:
    if p is None:
        raise ValueError("method 'percentile' needs percentile=p with p in (0, 1]")
    if not 0.0 < p <= 1.0:
        raise ValueError(f"percentile must be in (0, 1], got {p}")


def hb_kernel_percentile(p: float, samples: int) -> float:
    """What hb_mapper hands its max-percentile kernel for ``max_percentile = p`` and N samples
    (``add_calibration_methods`` in hmct/quantizer/calibrater/activation/base.py)."""
    return max(0.5, 1.0 - (1.0 - p) * samples)


def _max_percentile(stats: TensorStats, p: float) -> float:
    """hmct's max-percentile kernel: the k-th largest |x| over every value of every sample, with
    ``k = n - ceil(p' n) + 1`` for n values per sample and p' = :func:`hb_kernel_percentile` (float32).

    Measured with the kernel on the example's and PP-OCRv4's tensors (their 205 raw thresholds,
    bit-equal; docs/hb_rules/calibration.md 2): e.g. PP-OCRv4's hardswish_58, n = 327680, N = 8,
    p' = 0.9996: k = 132, the 132nd largest of the 8 x 327680 values, 26.044 (the running-max reading
    tuner had gave 19.73; the two agree where the k largest values sit at k distinct positions,
    as in i.i.d. Gaussian probes). Read off the exact histogram: within one bin (absmax / 8192).
    Statistics without a sample count fall back to the pooled p-quantile.
    """
    if p == 1.0 or stats.samples < 1 or stats.count % stats.samples:
        return stats.absmax if p == 1.0 else _percentile(stats, p)
    n = stats.count // stats.samples
    k = n - math.ceil(float(np.float32(hb_kernel_percentile(p, stats.samples))) * n) + 1
    return _order_statistic(stats, stats.count - max(k, 1))


def _order_statistic(stats: TensorStats, j: int) -> float:
    """The j-th smallest |x| (0-based) over all values, placed inside its bin of the exact histogram
    as if the bin's values were evenly spread; the largest is exact."""
    if j >= stats.count - 1:
        return stats.absmax
    cum = np.cumsum(stats.hist)
    i = int(np.searchsorted(cum, j, side="right"))  # first bin with cum > j
    before = int(cum[i - 1]) if i else 0
    return min((i + (j - before + 0.5) / int(stats.hist[i])) * stats.bin_width, stats.absmax)


def _percentile(stats: TensorStats, p: float) -> float:
    """The p-quantile of |x| with np.quantile's 'linear' definition, read off the histogram.

    Order statistic j is placed inside its bin as if the bin's values were evenly spread
    (at (k + 0.5) / c of the bin for the k-th of its c values), then we interpolate between the
    two order statistics around rank p * (n - 1) exactly as np.quantile does. Each estimated
    order statistic lies in the same bin as the true one, so the result is within one bin width
    of np.quantile(|x|, p).
    """
    return _hist_quantile(stats.hist, stats.bin_width, stats.absmax, p)


def _hist_quantile(hist: np.ndarray, w: float, amax: float, p: float) -> float:
    if p == 1.0:
        return amax
    cum = np.cumsum(hist)
    n = int(cum[-1])

    def order_stat(j: int) -> float:
        i = int(np.searchsorted(cum, j, side="right"))  # first bin with cum > j
        before = int(cum[i - 1]) if i else 0
        return (i + (j - before + 0.5) / int(hist[i])) * w

    r = p * (n - 1)
    j = math.floor(r)
    v0 = order_stat(j)
    v1 = order_stat(min(j + 1, n - 1))
    return min(v0 + (r - j) * (v1 - v0), amax)


def _kl(stats: TensorStats) -> float:
    """hmct's kl threshold: ``(k + 0.5) * width`` in float32 on its own histogram (``stats.kl_hist``).

    Statistics without it (made by hand) get one from the exact histogram, each fine bin's count
    put in the kl bin of its centre, with the width of one call holding all the data."""
    if stats.kl_hist is not None and stats.kl_width > 0:
        hist, width = stats.kl_hist, np.float32(stats.kl_width)
    else:
        width = np.float32(np.float32(stats.absmax) / np.float32(KL_NUM_BIN))
        centres = ((np.flatnonzero(stats.hist) + 0.5) * stats.bin_width / float(width)).astype(np.int64)
        hist = np.bincount(np.minimum(centres, KL_NUM_BIN - 1), weights=stats.hist[stats.hist > 0],
                           minlength=KL_NUM_BIN)
    k = kl_bin(hist)
    return min(float((np.float32(k) + np.float32(0.5)) * width), stats.absmax)


def _mse(stats: TensorStats, qmax: int) -> float:
    """Candidate threshold minimising the expected squared fake-quant error of |x|.

    The histogram mass of each bin is placed at the bin centre. Candidates are
    absmax * (k + 1) / 200 for k = 0..199; ties go to the smallest threshold.
    """
    amax = stats.absmax
    nzb = np.flatnonzero(stats.hist)
    centres = (nzb + 0.5) * stats.bin_width
    weights = stats.hist[nzb].astype(np.float64)
    cands = amax * np.arange(1, MSE_CANDIDATES + 1, dtype=np.float64) / MSE_CANDIDATES
    errs = np.empty(MSE_CANDIDATES)
    step = max(1, (1 << 20) // max(1, centres.size))  # bound the temporary to ~1M elements
    for k0 in range(0, MSE_CANDIDATES, step):
        s = (cands[k0 : k0 + step] / qmax)[:, None]
        fq = np.minimum(np.round(centres[None, :] / s), qmax) * s  # |x| >= 0: only the upper clip
        errs[k0 : k0 + step] = ((fq - centres[None, :]) ** 2) @ weights
    return float(cands[int(np.argmin(errs))])
