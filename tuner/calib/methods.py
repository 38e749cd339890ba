"""Calibration methods: symmetric thresholds (and an asymmetric range) from TensorStats.

Each method is a cheap function of the statistics gathered in the single data pass, so the
search can try every method and percentile without touching the calibration data again.
The quantizer uses ``scale = T / qmax`` and clips to ``[-T, T]`` for a threshold ``T``.
"""

from __future__ import annotations

import math

import numpy as np

from tuner.calib.stats import TensorStats

METHODS = ("max", "percentile", "kl", "mse")

KL_BINS = 2048  # TensorRT's entropy calibration works on a 2048-bin |x| histogram
KL_MAX_CANDIDATES = 256  # ~0.4% of absmax resolution; cost is linear in it (~10 ms a tensor)
KL_EPS = 1e-4  # smoothing constant of the TensorRT/MXNet/onnxruntime implementations
MSE_CANDIDATES = 200


def threshold(stats: TensorStats, method: str, *, percentile: float | None = None, qmax: int = 127) -> float:
    """Symmetric clipping threshold T of one tensor under ``method``.

    ``percentile`` (p in (0, 1], Horizon's ``max_percentile``) is required by, and only used by,
    the ``percentile`` method. An all-zero (or empty) tensor gives 0.0 for every method.
    """
    _check_method(method)
    if qmax < 1:
        raise ValueError(f"qmax must be >= 1, got {qmax}")
    if method == "percentile":
        _check_percentile(percentile)
    amax = stats.absmax
    if amax == 0.0:
        return 0.0
    if method == "max":
        return amax
    if method == "percentile":
        return _percentile(stats, float(percentile))  # type: ignore[arg-type]
    if method == "kl":
        # KL against 128 levels models int8; int16 has so many levels that clipping never pays.
        return amax if qmax > 127 else _kl(stats, qmax)
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


def _percentile(stats: TensorStats, p: float) -> float:
    """The p-quantile of |x| with np.quantile's 'linear' definition, read off the histogram.

    Order statistic j is placed inside its bin as if the bin's values were evenly spread
    (at (k + 0.5) / c of the bin for the k-th of its c values), then we interpolate between the
    two order statistics around rank p * (n - 1) exactly as np.quantile does. Each estimated
    order statistic lies in the same bin as the true one, so the result is within one bin width
    of np.quantile(|x|, p).
    """
    amax = stats.absmax
    if p == 1.0:
        return amax
    hist = stats.hist
    cum = np.cumsum(hist)
    n = int(cum[-1])
    w = stats.bin_width

    def order_stat(j: int) -> float:
        i = int(np.searchsorted(cum, j, side="right"))  # first bin with cum > j
        before = int(cum[i - 1]) if i else 0
        return (i + (j - before + 0.5) / int(hist[i])) * w

    r = p * (n - 1)
    j = math.floor(r)
    v0 = order_stat(j)
    v1 = order_stat(min(j + 1, n - 1))
    return min(v0 + (r - j) * (v1 - v0), amax)


def _smooth(d: np.ndarray, eps: float = KL_EPS) -> np.ndarray | None:
    """Move ``eps`` onto each zero bin, taken evenly from the nonzero ones (the sum is kept).

    Returns None when impossible (all zeros, or a nonzero bin would go <= 0), which the callers
    treat as an infinite divergence, as MXNet's reference implementation does.
    """
    zeros = d == 0
    n_zeros = int(zeros.sum())
    n_nonzeros = d.size - n_zeros
    if n_nonzeros == 0:
        return None
    eps1 = eps * n_zeros / n_nonzeros
    out = d + np.where(zeros, eps, -eps1)
    if (out <= 0).any():
        return None
    return out


def _kl_divergences(hist: np.ndarray, nq: int, candidates: np.ndarray) -> np.ndarray:
    """KL(P || Q) for each candidate bin count i (TensorRT entropy calibration).

    P is hist[:i] with the outlier mass hist[i:] added to its last bin. Q is hist[:i] (without
    the outliers, so clipping mass is penalised) merged into ``nq`` levels of i // nq bins (the
    last level takes the remainder), each level's count spread evenly over the bins where P is
    nonzero; bins where P is zero stay zero. Both are smoothed and normalised.
    """
    h = np.asarray(hist, dtype=np.float64)
    nb = h.size
    tail = np.concatenate((np.cumsum(h[::-1])[::-1], [0.0]))  # tail[i] == h[i:].sum()
    bins = np.arange(nb)
    out = np.full(len(candidates), np.inf)
    for c, i in enumerate(candidates):
        sliced = h[:i]
        p = sliced.copy()
        p[-1] += tail[i]
        nz = p != 0
        group = np.minimum(bins[:i] // (i // nq), nq - 1)
        level = np.bincount(group, weights=sliced, minlength=nq)
        norm = np.bincount(group, weights=nz, minlength=nq)
        q = np.zeros(i)
        q[nz] = level[group[nz]] / norm[group[nz]]
        ps, qs = _smooth(p), _smooth(q)
        if ps is None or qs is None:
            continue
        ps /= ps.sum()
        qs /= qs.sum()
        out[c] = float(np.sum(ps * np.log(ps / qs)))
    return out


def kl_layout(stats: TensorStats, qmax: int = 127) -> tuple[np.ndarray, float, np.ndarray]:
    """The histogram KL works on: (counts, bin width, candidate bin counts).

    TensorRT bins [0, absmax] into 2048 bins and tries i = 128..2048, so it can clip down to
    absmax/16. Our exact histogram spans a power of two up to 2*absmax; trimmed to the bins
    that hold data and merged by 4 (exact), it spans ~absmax in 2048..4096 bins. Candidates
    start at 1/16 of that range, like TensorRT, with a stride that keeps at most
    ``KL_MAX_CANDIDATES`` of them (a threshold resolution of ~0.2% of absmax).
    """
    merge = max(1, stats.hist.size // (2 * KL_BINS))
    used = int(np.flatnonzero(stats.hist)[-1]) + 1
    used = -(-used // merge) * merge
    h = stats.hist[:used].reshape(-1, merge).sum(axis=1)
    nq = qmax + 1
    start = max(nq, -(-h.size // 16))
    step = max(1, -(-(h.size - start) // KL_MAX_CANDIDATES))
    candidates = np.arange(h.size, start - 1, -step)[::-1]  # always includes the full range
    return h, stats.bin_width * merge, candidates


def _kl(stats: TensorStats, qmax: int) -> float:
    """Threshold minimising KL divergence between the |x| histogram and its quantized version."""
    nq = qmax + 1
    h, width, candidates = kl_layout(stats, qmax)
    if nq > h.size or len(candidates) == 0:
        return stats.absmax
    div = _kl_divergences(h, nq, candidates)
    if not np.isfinite(div).any():
        return stats.absmax
    i = int(candidates[int(np.argmin(div))])
    return min(i * width, stats.absmax)  # upper edge of bin i - 1


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
