"""Per-tensor calibration statistics, gathered in one streaming pass over the calibration data.

Every calibration method (see ``methods.py``) is a cheap function of these statistics, so trying
another method or percentile never needs another pass over the data.

The |x| histogram is kept *exactly*: its range is always a power of two and grows by doubling,
merging adjacent bin pairs. Bin edges stay aligned under doubling, so the final histogram equals
the one obtained by binning all the data at once over the final range, whatever the order and
size of the batches.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuner.files import atomic_file

NBINS = 16384

# Bin widths below 2**-1022 would be subnormal and 1/width would overflow; data that tiny gets a
# slightly wider range than "smallest power of two above abs-max" (exactness is unaffected).
_MIN_EXP_OFFSET = -1022
# 2**1024 is not a float: abs-max must stay below 2**1023 (float32/float16 data always does).
_MAX_EXP = 1023

_FORMAT_VERSION = 2


@dataclass(frozen=True, eq=False)  # eq=False: field-wise == on ndarrays would be ambiguous
class TensorStats:
    """Summary of every value one tensor took over the calibration set.

    Invariant: ``hist.sum() == count`` (exact zeros are in bin 0, even while ``hist_max == 0``).
    Arrays are read-only so the frozen dataclass is really immutable.
    """

    count: int  # number of scalar values seen
    min: float
    max: float
    channel_absmax: np.ndarray | None  # float64 [C], abs-max per channel (axis 1); None if rank < 2
    hist: np.ndarray  # int64 [nbins], histogram of |x| over [0, hist_max), equal-width bins
    hist_max: float  # upper edge of the histogram, a power of two (0.0 while every value was 0)
    # hb_mapper's max-percentile reading (tuner.calib.methods): the element-wise running max of |x|
    # over the samples (one value per position of a sample), as a histogram on the same bins as
    # ``hist``; and the number of samples (batch entries) seen. None / 0 for statistics without it.
    max_hist: np.ndarray | None = None
    samples: int = 0

    @property
    def absmax(self) -> float:
        """Largest |x| seen (0.0 for an empty or all-zero tensor)."""
        return max(abs(self.min), abs(self.max))

    @property
    def bin_width(self) -> float:
        """Width of one histogram bin (exact: a power of two divided by a power of two)."""
        return self.hist_max / self.hist.size


class StatsCollector:
    """Accumulates TensorStats of one tensor over a stream of arrays."""

    def __init__(self, nbins: int = NBINS) -> None:
        if nbins < 2 or nbins & (nbins - 1):
            raise ValueError(f"nbins must be a power of two >= 2, got {nbins}")
        self._nbins = nbins
        self._log2_nbins = nbins.bit_length() - 1
        self._count = 0
        self._min = math.inf
        self._max = -math.inf
        # Channel layout, fixed by the first non-empty update: 0 for rank < 2, else the size of axis 1.
        self._layout: int | None = None
        self._channel_absmax: np.ndarray | None = None
        self._hist = np.zeros(nbins, dtype=np.int64)
        self._exp: int | None = None  # hist_max == 2**_exp once a nonzero value has been seen
        self._pending_zeros = 0  # exact zeros seen before the range existed
        self._running_max: np.ndarray | None = None  # |x| max per position over the samples (float32)
        self._samples = 0
        self._running_ok = True

    def update(self, x: np.ndarray) -> None:
        """Add one batch (batch axis first, channel axis 1; any float dtype).

        Raises ValueError on NaN/Inf or a channel count different from earlier batches; the
        collector is left unchanged in that case.
        """
        x = np.asarray(x)
        if x.ndim == 0:
            x = x.reshape(1)  # ufuncs on 0-d arrays return scalars, not arrays
        if x.size == 0:
            return
        if not np.issubdtype(x.dtype, np.floating):
            x = x.astype(np.float64)  # e.g. abs() of int8 -128 would overflow
        elif x.dtype.itemsize < 4:
            x = x.astype(np.float32)  # exact, and numpy's float16 arithmetic is slow
        # min/max/abs are exact in the input dtype (cheaper than float64 for float16/32 data);
        # min/max propagate NaN, so these two reductions also check finiteness.
        lo = float(x.min())
        hi = float(x.max())
        if math.isnan(lo) or math.isnan(hi):
            raise ValueError("tensor contains NaN")
        if math.isinf(lo) or math.isinf(hi):
            raise ValueError("tensor contains Inf")
        layout = x.shape[1] if x.ndim >= 2 else 0
        if self._layout is not None and layout != self._layout:
            raise ValueError(
                f"channel count changed between batches: {_describe(self._layout)} "
                f"then {_describe(layout)} (shape {x.shape})"
            )
        amax = max(-lo, hi)
        exp = None
        if amax > 0.0:
            exp = max(math.frexp(amax)[1], _MIN_EXP_OFFSET + self._log2_nbins)  # 2**exp > amax
            if exp > _MAX_EXP:
                raise ValueError(f"tensor abs-max {amax:g} is too large for the histogram (>= 2**1023)")

        # Validation done: from here on, mutate.
        a = np.abs(x)
        if self._running_ok:
            m = (a.max(axis=0) if x.ndim >= 2 else a).astype(np.float32, copy=False)
            if self._running_max is None:
                self._running_max = np.array(m, dtype=np.float32)
            elif self._running_max.shape == m.shape:
                np.maximum(self._running_max, m, out=self._running_max)
            else:   # samples of different shapes have no positions in common: no running max
                self._running_ok, self._running_max = False, None
        self._samples += x.shape[0] if x.ndim >= 2 else 1
        if layout:
            ch = a.reshape(x.shape[0], layout, -1).max(axis=(0, 2)).astype(np.float64)
            if self._channel_absmax is None:
                self._channel_absmax = ch
            else:
                np.maximum(self._channel_absmax, ch, out=self._channel_absmax)
        self._layout = layout
        self._count += x.size
        self._min = min(self._min, lo)
        self._max = max(self._max, hi)

        if exp is None:  # the whole batch is exact zeros
            if self._exp is None:
                self._pending_zeros += x.size
            else:
                self._hist[0] += x.size
            return
        if self._exp is None:
            self._exp = exp
            self._hist[0] += self._pending_zeros
            self._pending_zeros = 0
        elif exp > self._exp:
            self._grow(exp)
        # Bin index = floor(|x| / bin_width) in float64: multiplying by a power of two is exact,
        # and truncation == floor for |x| >= 0.
        scale = math.ldexp(float(self._nbins), -self._exp)  # == 1 / bin_width
        if a.dtype == np.float64:
            np.multiply(a, scale, out=a)  # a is our own copy
        else:
            a = np.multiply(a, scale, dtype=np.float64)
        idx = a.astype(np.intp).ravel()
        self._hist += np.bincount(idx, minlength=self._nbins)

    def _grow(self, exp: int) -> None:
        """Double the range (exp - self._exp) times: merge groups of 2**k adjacent bins at once."""
        assert self._exp is not None   # the range exists once a nonzero value was seen
        k = min(exp - self._exp, self._log2_nbins)
        merged = self._hist.reshape(-1, 1 << k).sum(axis=1)
        self._hist = np.zeros(self._nbins, dtype=np.int64)
        self._hist[: merged.size] = merged
        self._exp = exp

    def result(self) -> TensorStats:
        """Snapshot of the statistics so far (an empty stream gives count 0 and min == max == 0)."""
        hist = self._hist.copy()
        hist[0] += self._pending_zeros
        hist.setflags(write=False)
        ch = None
        if self._channel_absmax is not None:
            ch = self._channel_absmax.copy()
            ch.setflags(write=False)
        empty = self._count == 0
        max_hist: np.ndarray | None = None
        if self._running_max is not None:
            max_hist = np.zeros(self._nbins, dtype=np.int64)
            if self._exp is None:
                max_hist[0] = self._running_max.size
            else:
                scale = math.ldexp(float(self._nbins), -self._exp)
                idx = np.minimum(np.multiply(self._running_max, scale, dtype=np.float64).astype(np.intp).ravel(),
                                 self._nbins - 1)
                max_hist += np.bincount(idx, minlength=self._nbins)
            max_hist.setflags(write=False)
        return TensorStats(
            count=self._count,
            min=0.0 if empty else self._min,
            max=0.0 if empty else self._max,
            channel_absmax=ch,
            hist=hist,
            hist_max=0.0 if self._exp is None else math.ldexp(1.0, self._exp),
            max_hist=max_hist,
            samples=self._samples,
        )


def _describe(layout: int) -> str:
    return "no channel axis (rank < 2)" if layout == 0 else f"{layout} channels"


def save_stats(path: str | os.PathLike, stats: dict[str, TensorStats], meta: dict[str, str] | None = None) -> None:
    """Write ``stats`` (and string ``meta``) to an .npz file, atomically.

    The file is written next to ``path`` and then renamed over it, so a crash or Ctrl-C never
    leaves a truncated stats file that a later run would trust. Tensor names are stored as data,
    not as archive member names, so any name ('/', ':', unicode) round-trips.
    """
    path = Path(path)
    meta = dict(meta or {})
    for k, v in meta.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"meta keys and values must be str, got {k!r}: {v!r}")
    names = list(stats)
    arrays: dict[str, np.ndarray] = {
        "format_version": np.array(_FORMAT_VERSION, dtype=np.int64),
        "names": np.array(names, dtype=np.str_),
        "count": np.array([s.count for s in stats.values()], dtype=np.int64),
        "min": np.array([s.min for s in stats.values()], dtype=np.float64),
        "max": np.array([s.max for s in stats.values()], dtype=np.float64),
        "hist_max": np.array([s.hist_max for s in stats.values()], dtype=np.float64),
        "samples": np.array([s.samples for s in stats.values()], dtype=np.int64),
        "meta_keys": np.array(list(meta), dtype=np.str_),
        "meta_values": np.array(list(meta.values()), dtype=np.str_),
    }
    for i, s in enumerate(stats.values()):
        arrays[f"hist_{i}"] = np.asarray(s.hist, dtype=np.int64)
        if s.channel_absmax is not None:
            arrays[f"channel_absmax_{i}"] = np.asarray(s.channel_absmax, dtype=np.float64)
        if s.max_hist is not None:
            arrays[f"max_hist_{i}"] = np.asarray(s.max_hist, dtype=np.int64)

    with atomic_file(path, binary=True, fsync=True) as f:
        np.savez_compressed(f, allow_pickle=False, **arrays)  # histograms are mostly zeros: compresses well


def load_stats(path: str | os.PathLike) -> tuple[dict[str, TensorStats], dict[str, str]]:
    """Read a file written by :func:`save_stats`; returns (stats by tensor name, meta)."""
    with np.load(path, allow_pickle=False) as z:
        if "format_version" not in z.files or int(z["format_version"]) != _FORMAT_VERSION:
            raise ValueError(f"{path}: not a tuner stats file of format version {_FORMAT_VERSION}")
        names = [str(n) for n in z["names"]]
        count, mn, mx, hist_max, samples = z["count"], z["min"], z["max"], z["hist_max"], z["samples"]
        stats: dict[str, TensorStats] = {}
        for i, name in enumerate(names):
            hist = z[f"hist_{i}"].astype(np.int64, copy=False)
            hist.setflags(write=False)
            key = f"channel_absmax_{i}"
            ch = None
            if key in z.files:
                ch = z[key].astype(np.float64, copy=False)
                ch.setflags(write=False)
            mh = None
            if f"max_hist_{i}" in z.files:
                mh = z[f"max_hist_{i}"].astype(np.int64, copy=False)
                mh.setflags(write=False)
            stats[name] = TensorStats(
                count=int(count[i]),
                min=float(mn[i]),
                max=float(mx[i]),
                channel_absmax=ch,
                hist=hist,
                hist_max=float(hist_max[i]),
                max_hist=mh,
                samples=int(samples[i]),
            )
        meta = {str(k): str(v) for k, v in zip(z["meta_keys"], z["meta_values"])}
    return stats, meta
