"""Calibration methods: symmetric thresholds (and an asymmetric range) from TensorStats.

Each method is a cheap function of the statistics gathered in the single data pass, so the
search can try every method and percentile without touching the calibration data again.
The quantizer uses ``scale = T / qmax`` and clips to ``[-T, T]`` for a threshold ``T``.
"""

from __future__ import annotations

import math

import numpy as np

from tuner.calib.stats import KL_NUM_BIN, TensorStats

METHODS = ("max", "percentile", "max-percentile", "kl", "mse")

#: hmct's kl search, measured with its kernel (docs/hb_rules/calibration.md 1b: bit-equal thresholds
#: on 198 of 205 tensors of the example and PP-OCRv4's detector, 121 of 126 synthetic probes): 128
#: target levels; each candidate's divergence is averaged with its 4 neighbours on either side;
#: a bin holding mass that Q lacks costs p * log(p / KL_EMPTY_EPS) (any eps in 1e-12..1e-8 fits the
#: probes, 1e-30 and 1e-6 do not).
KL_LEVELS = 128
KL_HALF_WINDOW = 4
KL_EMPTY_EPS = 1e-10
#: A histogram whose only nonzero bin (bin 0 aside) is its last: every candidate has the same
#: divergence and the kernel's rounding picks bin 1015 of 1024 (a 0/1 mask: threshold 0.9917 x max,
#: measured on the example's mask tensors and probes); other lengths pick rounding-dependent bins.
KL_LONE_TOP_BIN = {1024: 1015}
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


def _xlogx(a: np.ndarray) -> np.ndarray:
    return np.where(a > 0, a * np.log(np.where(a > 0, a, 1.0)), 0.0)


def kl_divergences(hist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(candidates i = 128 .. len(hist) - 1, hmct's divergence of each) for an |x| histogram.

    Candidate i keeps bins [0, i). Bin 0 (|x| < one bin, exact zeros) is dropped first. P is the
    kept bins with everything beyond added to the last kept bin; Q merges the *unclipped* kept bins
    into 128 levels of i // 128 bins (the last level takes the rest) and spreads each level's mass
    evenly over the level's bins where P is nonzero; KL(P/sum P || Q/sum Q), where a bin with P > 0
    and Q = 0 (only the last kept bin, when its level holds nothing but the clipped mass) adds
    p * log(p / KL_EMPTY_EPS). Measured (docs/hb_rules/calibration.md 1b); the variants that fit worse
    on the 205 tensors: Q from the folded P (121 exact), smoothing with eps 1e-4 (34), 127 levels (37).

    All candidates at once: the first 127 levels of candidates with the same i // 128 are the same
    bins, so their terms P log(P / Q) are computed once per level width, bin by bin (a bin where P
    equals Q adds exactly 0, so candidates that differ only by such bins tie exactly, as they do in
    the kernel: a plateau's first window wins); the last level, per candidate, from prefix sums.
    ~0.2 ms for 1024 bins (the head grows as len(hist)^2 / 256 terms: ~20 ms at 16384 bins).
    """
    h = np.asarray(hist, dtype=np.float64).copy()
    h[0] = 0.0
    n, nq = h.size, KL_LEVELS
    i = np.arange(nq, n)
    if i.size == 0:
        return i, np.zeros(0)
    nz = h != 0
    C = np.concatenate(([0.0], np.cumsum(h)))               # prefix mass (exact: integer counts)
    Z = np.concatenate(([0], np.cumsum(nz)))                # prefix count of nonzero bins
    G = np.concatenate(([0.0], np.cumsum(_xlogx(h))))       # prefix sum of h log h
    total = C[-1]
    if total == 0:
        return i, np.zeros(i.size)
    per = i // nq
    head = np.zeros(int(per[-1]) + 1)                       # sum of P log(P / Q) over levels 0..126, per width
    for w in range(1, head.size):
        b = np.arange((nq - 1) * w)
        lo = (b // w) * w
        mass, used = C[lo + w] - C[lo], Z[lo + w] - Z[lo]
        with np.errstate(divide="ignore", invalid="ignore"):
            head[w] = np.where(nz[b], h[b] * np.log(h[b] * used / np.where(mass > 0, mass, 1.0)), 0.0).sum()
    start = (nq - 1) * per                                  # the last level: bins [start, i)
    kept = C[i]
    tail = total - kept                                     # clipped into bin i - 1
    last = h[i - 1] + tail                                  # P's last bin
    q_mass = kept - C[start]                                # Q's last level (unclipped)
    q_bins = (Z[i - 1] - Z[start]) + (last > 0)             # P's nonzero bins in the last level
    with np.errstate(divide="ignore", invalid="ignore"):
        q_mass1 = np.where(q_mass > 0, q_mass, 1.0)
        inner = (G[i - 1] - G[start]) - (C[i - 1] - C[start]) * np.log(q_mass1 / q_bins)
        own = last * np.log(np.where(last > 0, last * q_bins / q_mass1, 1.0))
        full = (head[per] + inner + own) / total + np.log(kept / total)
        # Q's last level empty: P's last bin alone has no Q; the rest is KL over the other bins
        p_tail = tail / total
        empty = (head[per] / total + _xlogx(kept / total)
                 + p_tail * np.log(np.where(p_tail > 0, p_tail, 1.0) / KL_EMPTY_EPS))
    return i, np.where(q_mass > 0, full, empty)


def kl_bin(hist: np.ndarray) -> int:
    """The bin k of hmct's kl threshold ``(k + 0.5) * width`` for its |x| histogram.

    Each candidate's divergence is averaged over the candidates within 4 of it (fewer at the
    start: 128 averages 128..132), and the candidate with the smallest average is k, among those at
    least 4 candidates before the last (so k <= len - 5: a uniform histogram of 1024 bins gives
    1019). The same picks as a loop over candidates on every measured histogram; exact ties go to
    the first (sums in a fixed order, so equal windows are bit-equal, as on the kernel's plateaus).
    """
    h = np.asarray(hist)
    i, d = kl_divergences(h)
    m, half = d.size, KL_HALF_WINDOW
    if m <= half:
        return h.size - 1
    nonzero = np.flatnonzero(h[1:])
    if nonzero.size == 1 and nonzero[0] == h.size - 2 and h.size in KL_LONE_TOP_BIN:
        return KL_LONE_TOP_BIN[h.size]
    padded = np.concatenate((np.zeros(half), d, np.zeros(half)))
    sums = np.zeros(m)
    for o in range(2 * half + 1):
        sums = sums + padded[o : o + m]
    j = np.arange(m)
    counts = np.minimum(j, half) + 1 + np.minimum(m - 1 - j, half)
    return int(i[int(np.argmin((sums / counts)[: m - half]))])


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
