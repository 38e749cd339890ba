"""Calibration methods: symmetric thresholds (and an asymmetric range) from TensorStats.

Each method is a cheap function of the statistics gathered in the single data pass, so the
search can try every method and percentile without touching the calibration data again.
The quantizer uses ``scale = T / qmax`` and clips to ``[-T, T]`` for a threshold ``T``.
"""

from __future__ import annotations

import math

import numpy as np

from tuner.calib.stats import TensorStats

METHODS = ("max", "percentile", "max-percentile", "kl", "mse")

#: hb_mapper's kl parameters (``kl:num_bin=1024,max_num_bin=16384``, hb_quantizer_facts 1.4, src
#: 24739346373 / 24921638862): the |x| histogram has num_bin bins and candidate cut points from 128
#: bins (the int8 half-range; num_bin is raised to at least 129) upward [inferred: the search itself
#: is C++]. tuner's exact histogram is merged to bins of hist_max / KL_BINS, hist_max being the power
#: of two above abs-max, so 513..1024 bins hold the data. Cut points from 128 bins up, with a stride
#: that keeps at most KL_MAX_CANDIDATES of them (every 4th bin at most: 0.4% of the range; every cut
#: point made the first kl trial on PP-OCRv4's detector 1.6x dearer, 0.37 s vs 0.23 s of thresholds).
KL_BINS = 1024
KL_MAX_NUM_BIN = 16384
KL_MAX_CANDIDATES = 256
KL_EPS = 1e-4  # smoothing constant of the TensorRT/MXNet/onnxruntime implementations
KL_TAYLOR_MAX_E = 1e-2  # above this smoothing shift, _kl_divergences sums exactly instead of by series
MSE_CANDIDATES = 200


def threshold(stats: TensorStats, method: str, *, percentile: float | None = None, qmax: int = 127) -> float:
    """Symmetric clipping threshold T of one tensor under ``method``.

    ``percentile`` (p in (0, 1], Horizon's ``max_percentile``) is required by, and only used by,
    the ``percentile`` and ``max-percentile`` methods. An all-zero (or empty) tensor gives 0.0 for
    every method.

    * ``percentile``: the p-quantile of |x| pooled over every value of every sample.
    * ``max-percentile``: hb_mapper's reading (hb_quantizer_facts 1.3, src 24654149289): its kernel
      receives ``p' = max(0.5, 1 - (1 - p) * N)`` for N calibration samples, which is the first-order
      correction for taking the p'-quantile of the element-wise running max of |x| over the samples
      (one value per tensor position); that quantile approximates the pooled p-quantile. The
      kernel is C++, so this reading is **inferred** (the note argues for it: the pooled reading
      of p' would clip 10-50 % of values at the documented sweep values); ``tuner import-calibrated``
      checks it against a real calibrated model. Statistics without the running max fall back to
      ``percentile``.
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


def hb_kernel_percentile(p: float, samples: int) -> float:
    """What hb_mapper hands its max-percentile kernel for ``max_percentile = p`` and N samples."""
    return max(0.5, 1.0 - (1.0 - p) * samples)


def _max_percentile(stats: TensorStats, p: float) -> float:
    if stats.max_hist is None or stats.samples < 1 or p == 1.0:
        return _percentile(stats, p)
    return _hist_quantile(stats.max_hist, stats.bin_width, stats.absmax, hb_kernel_percentile(p, stats.samples))


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


def _kl_divergences(hist: np.ndarray, nq: int, candidates: np.ndarray, eps: float = KL_EPS) -> np.ndarray:
    """KL(P || Q) for each candidate bin count i (TensorRT entropy calibration); inf where undefined.

    P is hist[:i] with the outlier mass hist[i:] added to its last bin. Q is hist[:i] (without
    the outliers, so clipping mass is penalised) merged into ``nq`` levels of i // nq bins (the
    last level takes the remainder), each level's count spread evenly over the bins where P is
    nonzero; bins where P is zero stay zero. Both are smoothed (``eps`` moved onto each zero bin,
    taken evenly from the nonzero ones; undefined if a nonzero bin would drop to <= 0, as in
    MXNet's reference implementation) and normalised.

    All candidates at once, from prefix sums: on P's zero bins both sides are ``eps`` and add
    nothing; Q is constant over a level's nonzero bins, so its term is a per-level sum; and the
    sum of (p - e) log(p - e) over P's nonzero bins (e: the smoothing taken from each) is a
    Taylor series in e over prefix sums of h log h, log h and 1/h^k, exact to ~1e-13 for
    e <= 0.01 (computed directly above that). ~12x faster than a loop over candidates, same picks.
    """
    h = np.asarray(hist, dtype=np.float64)
    i = np.asarray(candidates, dtype=np.int64)
    out = np.full(i.size, np.inf)
    if i.size == 0:
        return out
    nzh = h != 0
    C = np.concatenate(([0.0], np.cumsum(h)))               # prefix mass (exact: integer counts)
    Z = np.concatenate(([0], np.cumsum(nzh)))               # prefix count of nonzero bins
    total = C[-1]
    tail = total - C                                        # tail[i] == h[i:].sum()
    hv = np.where(nzh, h, 1.0)
    log_h = np.log(hv)

    def prefix(a: np.ndarray) -> np.ndarray:                # sums over nonzero bins of h[:j]
        return np.concatenate(([0.0], np.cumsum(np.where(nzh, a, 0.0))))

    g0, g1 = prefix(h * log_h), prefix(log_h + 1.0)
    r1, r2, r3, r4 = (prefix(hv ** -k) for k in (1, 2, 3, 4))
    min_h = np.concatenate(([np.inf], np.minimum.accumulate(np.where(nzh, h, np.inf))))  # min nonzero h[:j]

    # Per candidate (rows) and level (columns): its bins are [start, stop).
    width = i // nq
    start = np.arange(nq)[None, :] * width[:, None]
    stop = start + width[:, None]
    stop[:, -1] = i
    level = C[stop] - C[start]                              # Q's mass per level (no outliers)
    nnz = Z[stop] - Z[start]                                # P's nonzero bins per level
    last = h[i - 1] + tail[i]                               # P's last bin takes the outliers
    nnz[:, -1] += (last != 0).astype(np.int64) - nzh[i - 1]
    p_mass = level.copy()
    p_mass[:, -1] += tail[i]
    q_value = np.where(nnz > 0, level / np.maximum(nnz, 1), 0.0)  # Q on each of the level's nonzero bins
    q_pos = q_value > 0
    nnz_p = nnz.sum(axis=1)
    nnz_q = np.where(q_pos, nnz, 0).sum(axis=1)
    ok = (nnz_p > 0) & (nnz_q > 0)
    e_p = np.where(ok, eps * (i - nnz_p) / np.maximum(nnz_p, 1), 0.0)  # what smoothing takes per nonzero bin
    e_q = np.where(ok, eps * (i - nnz_q) / np.maximum(nnz_q, 1), 0.0)
    min_p = np.minimum(min_h[i - 1], np.where(last != 0, last, np.inf))
    ok &= (min_p - e_p > 0) & (np.where(q_pos, q_value, np.inf).min(axis=1) - e_q > 0)  # smoothing defined

    # sum of ps * log qs over P's nonzero bins, level by level (qs = eps where Q is 0)
    a = p_mass - e_p[:, None] * nnz
    log_q = np.log(np.where(q_pos, q_value - e_q[:, None], 1.0), where=q_pos, out=np.zeros_like(q_value))
    cross = (a * log_q).sum(axis=1) + np.where(q_pos, 0.0, a).sum(axis=1) * math.log(eps)
    # sum of ps * log ps over P's nonzero bins: below the last by series in e_p, then the last
    j, e = i - 1, e_p
    s = g0[j] - e * g1[j] + e**2 / 2 * r1[j] + e**3 / 6 * r2[j] + e**4 / 12 * r3[j] + e**5 / 20 * r4[j]
    for c in np.flatnonzero(ok & (e > KL_TAYLOR_MAX_E)):    # the series would converge slowly: sum exactly
        x = h[: j[c]][nzh[: j[c]]] - e[c]
        s[c] = float(x @ np.log(x))
    x_last = np.where(last != 0, last - e, 1.0)
    s += np.where(last != 0, x_last * np.log(np.where(x_last > 0, x_last, 1.0)), 0.0)
    # KL of the normalised distributions: sum(ps log(ps/qs)) / P + log(Q / P), as sum(ps) = P, sum(qs) = Q
    with np.errstate(divide="ignore"):
        kl = (s - cross) / total + np.log(C[i] / total)
    out[ok] = kl[ok]
    return out


def kl_layout(stats: TensorStats, qmax: int = 127) -> tuple[np.ndarray, float, np.ndarray]:
    """The histogram KL works on: (counts, bin width, candidate bin counts).

    hb_mapper's num_bin = 1024 bins, read as bins of ``hist_max / 1024`` over the exact power-of-two
    histogram (merged by 16, exact) trimmed to the bins that hold data: 513..1024 bins spanning
    ~absmax. Candidates are bin counts from 128 (= qmax + 1 levels, so KL can clip down to about
    an eighth of the range) to the full range, at most ``KL_MAX_CANDIDATES`` of them.
    """
    merge = max(1, stats.hist.size // KL_BINS)
    used = int(np.flatnonzero(stats.hist)[-1]) + 1
    used = -(-used // merge) * merge
    h = stats.hist[:used].reshape(-1, merge).sum(axis=1)
    nq = qmax + 1
    start = min(nq, h.size)
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
