"""hmct's kl threshold search, computed as its compiled kernel computes it.

Read from the kernel's machine code (``hmct/executor/onnxruntime_pybind11_state.so``, the function
``onnxruntime::horizon::entropy_calibration``, hmct 1.1.0) and checked against the bins the kernel
picked on every histogram measured so far: 3613 of 3613 (docs/hb_rules/calibration.md 1b). The
float64 closed form tuner used before missed 284 of the 2000 generated near-ties, 73 of 200 spike
probes and PP-OCRv4's p2o.Mul.30 (1.4 %): the kernel's float32 arithmetic, and two steps the probes
had not separated:

* every divergence is truncated to six decimals (``floor(D * 1e6) / 1e6``) before the window
  averages, so candidates within 1e-6 of one another tie and the first window of a plateau wins;
* P and Q are smoothed (zero bins get 5e-10, the nonzero ones lose ``5e-10 * zeros / nonzeros``,
  as MXNet's ``_smooth_distribution``), P's bins past bin 125 are differences of a running float32
  tail, and all sums are float32 in bin order (the totals: float64 in bin order).

The search, per candidate ``i = 128 .. n-1`` (candidate i keeps bins ``[0, i)``):

1. ``p = h / total`` in float32, ``total`` the float64 sum of the counts rounded to float32;
2. P: ``p[0:i]`` with the clipped mass in its last bin. The clipped mass is a running float32 tail
   ``t``: the float64 sum of ``p[127:]`` at the start, less ``p[i - 1]`` after each candidate; the
   last bin of one candidate becomes ``t_before - t_after`` for the next (``p[126]``: ``(p + t) - t``);
3. Q: 128 levels of ``i // 128`` bins (the last takes the rest); a level's raw counts summed in
   float32 and divided by the number of its bins where P is nonzero, on those bins; then Q divided by
   its float64 total (rounded to float32);
4. both smoothed (above), ``D = sum P * log(P / Q)`` in float32, in bin order;
5. the first candidate's D (not truncated) is the first best; then every window of 9 truncated
   divergences, centred on 132 .. n-5, in order: its float64 mean replaces the best (kept as float32)
   when it is strictly lower. The threshold is ``(k + 0.5) * width`` for the best centre k (128 when
   no window beats the first candidate's D).

A smoothed bin that turns negative makes its D NaN: that candidate and every later window are never
picked (the windows are a running sum). The kernel's ``logf`` is glibc's; numpy's float32 log differs
from it on ~37 % of values, the float64 log rounded to float32 on ~0.6 % (by one ulp): the latter is
used, and changes no pick on the 3613 histograms.

Cost: every candidate's D is a float32 sum over its own bins in order, so the work grows as
``n^2 / 2``: ~20 ms for 1024 bins, ~0.1 s for 2048, ~5 s at ``max_num_bin`` (16384); thresholds are
memoised (``tuner.calib.thresholds``).
"""

from __future__ import annotations

import numpy as np

KL_LEVELS = 128
KL_HALF_WINDOW = 4
#: MXNet-style smoothing constant of the kernel (a float32 5e-10)
KL_SMOOTH_EPS = np.float32(5e-10)
#: the kernel truncates each divergence to this many parts (six decimals) before averaging
KL_TRUNCATE = 1e6
#: Histogram counts are float32 in the kernel (each value adds 1.0): a bin stops counting at 2**24.
KL_COUNT_LIMIT = 2**24
#: bump when the search's arithmetic changes: memoised kl thresholds computed otherwise are stale
KL_VERSION = 2

_f32 = np.float32


def saturating_add(counts: np.ndarray | int, added: np.ndarray | int) -> np.ndarray:
    """``counts + added`` as the kernel's float32 bins count one value at a time (1.0 each).

    Below 2**24 a bin counts exactly and stops at 2**24; a bin at or above it (after a merge) moves
    at most once, to the even neighbour that round-half-even gives ``c + 1``.
    """
    c = np.asarray(counts, dtype=np.int64)
    a = np.asarray(added, dtype=np.int64)
    lim = KL_COUNT_LIMIT
    out = np.where(c < lim, np.minimum(c + a, lim), c)
    # 2**24 <= c < 2**25: spacing 2, c + 1 rounds to the even mantissa
    odd = (c >= lim) & (c < 2 * lim) & (a > 0) & ((c // 2) % 2 == 1)
    return np.where(odd, c + 2, out)


def kernel_counts(hist: np.ndarray) -> np.ndarray:
    """The kernel's float32 histogram (bin 0 zeroed: the kernel clears it after every call).

    ``hist`` holds counts as the kernel keeps them (``tuner.calib.stats`` counts with
    :func:`saturating_add`); integer counts of another origin: ``saturating_add(0, counts)`` first."""
    h = np.asarray(hist).astype(_f32)
    h[0] = 0
    return h


def _tail(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the running tail t_k of candidate 128 + k, P's bins 0 .. n-2 once they are not the last)."""
    n = p.size
    t0 = _f32(np.add.accumulate(p[KL_LEVELS - 1:].astype(np.float64))[-1])
    tail = np.subtract.accumulate(np.concatenate(([t0], p[KL_LEVELS - 1 : n - 1])).astype(_f32), dtype=_f32)
    fixed = p[: n - 1].copy()
    fixed[KL_LEVELS - 2] = _f32(_f32(p[KL_LEVELS - 2] + t0) - t0)
    fixed[KL_LEVELS - 1 :] = tail[:-1] - tail[1:]
    return tail, fixed


def _eps1(zeros: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """What each nonzero bin loses to the smoothing: ``eps * zeros / nonzeros`` in float32, per row."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return ((KL_SMOOTH_EPS * zeros.astype(_f32)).astype(_f32) / (kept - zeros).astype(_f32)).astype(_f32)


def _terms(P: np.ndarray, Q: np.ndarray, eps1_p: np.ndarray, eps1_q: np.ndarray) -> np.ndarray:
    """``P log(P / Q)`` per bin after the smoothing (zero bins get eps, the others lose eps1), float32.

    ``P`` may be one row shared by every candidate (the head levels), ``Q`` one row per candidate."""
    with np.errstate(divide="ignore", invalid="ignore"):
        Ps = np.where(P == 0, KL_SMOOTH_EPS, P - eps1_p[:, None])
        Qs = np.where(Q == 0, KL_SMOOTH_EPS, Q - eps1_q[:, None])
        ratio = Ps / Qs
        return Ps * np.log(ratio, dtype=np.float64).astype(_f32)


def _block(h, p_fixed, tail, nz_prefix, w: int, ii: np.ndarray) -> np.ndarray:
    """Divergences of the candidates ``ii`` (all with level width ``w``), float32.

    Levels 0..126 (bins ``[0, 127 w)``) are the same bins for every candidate of the block; only the
    last level ``[127 w, i)`` and the per-candidate totals and smoothing differ."""
    nq = KL_LEVELS
    rows, head, width = ii.size, (nq - 1) * w, int(ii[-1])
    t = tail[ii - nq]
    # levels 0 .. 126: Q is each level's float32 count sum over its bins where P is nonzero
    nzf = p_fixed[:head] != 0
    sums = np.add.accumulate(h[:head].reshape(nq - 1, w), axis=1, dtype=_f32)[:, -1]
    used = nzf.reshape(nq - 1, w).sum(axis=1).astype(_f32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q_head = np.where(nzf, np.repeat(sums / used, w), _f32(0)).astype(_f32)
    # the last level, bins [head, i): P's fixed bins, then the running tail in bin i - 1
    cols = np.arange(head, width)
    last = ii - 1
    valid = cols[None, :] < ii[:, None]
    P_last = np.where(cols[None, :] < last[:, None], p_fixed[head:width], _f32(0)).astype(_f32)
    P_last[np.arange(rows), last - head] = t
    run = np.add.accumulate(h[head:width], dtype=_f32)
    q_used = (nz_prefix[last] - nz_prefix[head]) + (t != 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        q_level = (run[last - head] / q_used.astype(_f32)).astype(_f32)
    Q_last = np.where(valid & (P_last != 0), q_level[:, None], _f32(0)).astype(_f32)
    # Q's float64 total in bin order: the shared head, then each candidate's last level
    head_total = np.add.accumulate(q_head.astype(np.float64))[-1] if head else 0.0
    q_total = np.add.accumulate(np.concatenate((np.full((rows, 1), head_total), Q_last), axis=1),
                                axis=1)[:, -1].astype(_f32)
    scale = np.where(q_total > 0, q_total, _f32(1)).astype(_f32)[:, None]
    Q_head = (q_head[None, :] / scale).astype(_f32)
    Q_last = (Q_last / scale).astype(_f32)
    # smoothing counts: zero bins among the kept ones
    p_zeros = ii - (nz_prefix[last] + (t != 0))
    q_zeros = (q_head == 0).sum() + ((Q_last == 0) & valid).sum(axis=1)
    e_p, e_q = _eps1(p_zeros, ii), _eps1(q_zeros, ii)
    d_head = np.add.accumulate(_terms(p_fixed[None, :head], Q_head, e_p, e_q), axis=1, dtype=_f32)[:, -1]
    t_last = np.where(valid, _terms(P_last, Q_last, e_p, e_q), _f32(0))
    return np.add.accumulate(np.concatenate((d_head[:, None], t_last), axis=1), axis=1, dtype=_f32)[:, -1]


def kl_divergences(hist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(candidates i = 128 .. len(hist) - 1, the kernel's float32 divergence of each), before truncation.

    ``hist``: the kernel's histogram of |x| (:func:`kernel_counts`; bin 0 is dropped). Candidates with
    the same level width are computed together.
    """
    h = kernel_counts(hist)
    n, nq = h.size, KL_LEVELS
    i = np.arange(nq, n)
    if i.size == 0:
        return i, np.zeros(0, _f32)
    total = _f32(np.add.accumulate(h.astype(np.float64))[-1])
    if total == 0:
        return i, np.full(i.size, np.nan, _f32)
    p = (h / total).astype(_f32)
    tail, fixed = _tail(p)
    nz_prefix = np.concatenate(([0], np.cumsum(fixed != 0)))
    d = np.empty(i.size, _f32)
    for w in range(1, n // nq + 1):
        ii = i[(i // nq) == w]
        if ii.size:
            d[ii - nq] = _block(h, fixed, tail, nz_prefix, w, ii)
    return i, d


def kl_bin(hist: np.ndarray) -> int:
    """The bin k of hmct's kl threshold ``(k + 0.5) * width`` for its |x| histogram (the scan above)."""
    i, d = kl_divergences(hist)
    m, half = d.size, KL_HALF_WINDOW
    if m == 0:
        return max(np.asarray(hist).size - 1, 0)
    if m - half <= half:
        return KL_LEVELS
    truncated = (np.floor(d.astype(np.float64) * KL_TRUNCATE) / KL_TRUNCATE).astype(_f32).astype(np.float64).tolist()
    best, pick = float(d[0]), 0
    window = 0.0
    for v in truncated[: 2 * half]:        # in order (Python's sum() compensates since 3.12)
        window += v
    for c in range(half, m - half):
        window += truncated[c + half]
        mean = window / (2 * half + 1)
        if best > mean:
            best, pick = float(_f32(mean)), c
        window -= truncated[c - half]
    return int(i[pick])
