"""Per-tensor calibration statistics, gathered in one streaming pass over the calibration data.

Every calibration method (see ``methods.py``) is a cheap function of these statistics, so trying
another method or percentile never needs another pass over the data.

Two |x| histograms are kept, both exact:

* ``hist``: its range is always a power of two and grows by doubling, merging adjacent bin pairs.
  Bin edges stay aligned under doubling, so the final histogram equals the one obtained by binning
  all the data at once over the final range, whatever the order and size of the batches. The
  percentile, max-percentile and mse methods read it.
* ``kl_hist``: hmct's own kl histogram, which is *not* order-free (docs/hb_rules/calibration.md 1a,
  measured with hmct's kernel on 205 tensors of the example and PP-OCRv4 and on synthetic probes:
  bit-equal thresholds). Its bin width is fixed by the first kernel call that holds a nonzero
  value: ``w = max|x| of that call / 1024`` (float32); a later call with a larger max appends whole
  bins of that width (``ceil(max / w)`` bins, the call's top value clipped into the last one); when
  a call would need more than 16384 bins (``max_num_bin``), groups of ``f = need // 8192`` bins are
  merged first and the width becomes ``f * w``. A kernel call is one calibration batch (hmct calls
  it with 8 samples at a time when the model allows it, else 1: ``tuner.calib.collect``), so the
  collector is told where calls end (``update(x, call_end=...)``). The kernel's bins are float32
  counters: a bin stops at 2**24 values, and merged bins are float32 sums (``tuner.calib.kl``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuner.calib.kl import KL_COUNT_LIMIT, saturating_add
from tuner.files import atomic_file

NBINS = 16384

#: hmct's kl histogram (``kl:num_bin=1024,max_num_bin=16384``, the only kl setting hb_mapper's YAML
#: reaches): bins of the first call's max / KL_NUM_BIN, merged when a call needs more than
#: KL_MAX_NUM_BIN bins (measured: docs/hb_rules/calibration.md 1a).
KL_NUM_BIN = 1024
KL_MAX_NUM_BIN = 16384

# Bin widths below 2**-1022 would be subnormal and 1/width would overflow; data that tiny gets a
# slightly wider range than "smallest power of two above abs-max" (exactness is unaffected).
_MIN_EXP_OFFSET = -1022
# 2**1024 is not a float: abs-max must stay below 2**1023 (float32/float16 data always does).
_MAX_EXP = 1023

_FORMAT_VERSION = 3


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
    samples: int = 0  # batch entries seen (hb_mapper's N for max-percentile); 0 for statistics without it
    # hmct's kl histogram of |x| (see the module docstring): int64 counts, bin 0 included, and its bin
    # width (a float32 value). None / 0.0 for statistics without it or an all-zero tensor.
    kl_hist: np.ndarray | None = None
    kl_width: float = 0.0

    @property
    def absmax(self) -> float:
        """Largest |x| seen (0.0 for an empty or all-zero tensor)."""
        return max(abs(self.min), abs(self.max))

    @property
    def bin_width(self) -> float:
        """Width of one histogram bin (exact: a power of two divided by a power of two)."""
        return self.hist_max / self.hist.size


class StatsCollector:
    """Accumulates TensorStats of one tensor over a stream of arrays.

    ``kl_first_max``: the max |x| of the first kernel call (calibration batch), when the caller
    knows it before the call's arrays arrive one by one (``tuner.calib.collect`` reads it in a short
    pass over the first batch). Without it, the first call's values are held until the call ends.
    """

    def __init__(self, nbins: int = NBINS, kl_first_max: float | None = None) -> None:
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
        self._samples = 0
        self._kl = _KLHistogram(kl_first_max)

    def update(self, x: np.ndarray, call_end: bool = True) -> None:
        """Add one batch (batch axis first, channel axis 1; any float dtype).

        ``call_end``: this array ends a kernel call of hmct's (the default: every array is a call of
        its own); a call made of several arrays is passed with ``call_end=False`` on all but the last.
        Raises ValueError on NaN/Inf or a channel count different from earlier batches; the
        collector is left unchanged in that case.
        """
        x = np.asarray(x)
        if x.ndim == 0:
            x = x.reshape(1)  # ufuncs on 0-d arrays return scalars, not arrays
        if x.size == 0:
            if call_end:
                self._kl.end_call()
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
        self._kl.add(a, call_end, amax)
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
        """Snapshot of the statistics so far (an empty stream gives count 0 and min == max == 0).

        A kernel call still open (last update with ``call_end=False``) is ended first."""
        self._kl.end_call()
        hist = self._hist.copy()
        hist[0] += self._pending_zeros
        hist.setflags(write=False)
        ch = None
        if self._channel_absmax is not None:
            ch = self._channel_absmax.copy()
            ch.setflags(write=False)
        empty = self._count == 0
        kl_hist = None
        if self._kl.hist is not None:
            kl_hist = self._kl.hist.copy()
            kl_hist.setflags(write=False)
        return TensorStats(
            count=self._count,
            min=0.0 if empty else self._min,
            max=0.0 if empty else self._max,
            channel_absmax=ch,
            hist=hist,
            hist_max=0.0 if self._exp is None else math.ldexp(1.0, self._exp),
            samples=self._samples,
            kl_hist=kl_hist,
            kl_width=0.0 if self._kl.width is None else float(self._kl.width),
        )


class _KLHistogram:
    """hmct's kl histogram of |x|, fed call by call (rule: the module docstring).

    Within a call, arrays are binned as they come with the current width into bins that may run
    past the histogram's end; at the call's end the histogram takes its real length,
    ``max(length before the call, ceil(call max / w))``, so that only the call's top value can be
    clipped (when ``call max / w`` is an integer), as in the kernel, which sees the call at once.
    A call that needs more than KL_MAX_NUM_BIN bins keeps its values aside until it ends, when the
    merge factor (from the call's max) is known; so does the first call when its max is not given.
    Arithmetic in float32, as the kernel's thresholds show (a width of max / 1024, exact).
    """

    def __init__(self, first_max: float | None = None) -> None:
        self.width: np.float32 | None = None
        self.hist: np.ndarray | None = None   # int64 counts, kept as the kernel's float32 bins count (kl.saturating_add)
        self._given = None if first_max is None or not first_max > 0 else np.float32(first_max)
        self._call_max = np.float32(0.0)
        self._length = 0                      # the histogram's real length before this call
        self._held: list[np.ndarray] = []      # |x| (float32, nonzero) waiting for the call's end
        self._held_zeros = 0

    def add(self, a: np.ndarray, call_end: bool, amax: float) -> None:
        """``a``: |x| of one array; ``amax``: its max (the caller has it)."""
        a = np.asarray(a, dtype=np.float32).ravel()
        top = np.float32(amax)
        self._call_max = max(self._call_max, top)
        if self.width is None and self._given is not None and top > 0:
            self._start(self._given)
        if self.width is None or self._held or (top > 0 and self._needed(top) > KL_MAX_NUM_BIN):
            nz = a[a > 0]
            if nz.size:
                self._held.append(nz)
            self._held_zeros += a.size - nz.size
        else:
            self._bin(a, top)
        if call_end:
            self.end_call()

    def end_call(self) -> None:
        top = self._call_max
        if self.width is None:
            if top == 0:                      # an all-zero call sets nothing (measured)
                self._held, self._held_zeros = [], 0
                return
            self._start(top)
        assert self.width is not None and self.hist is not None
        need = self._needed(top) if top > 0 else 0
        if need > KL_MAX_NUM_BIN:
            f = need // (KL_MAX_NUM_BIN // 2)
            self.hist = _merge(self.hist, f)
            self._length = -(-self._length // f)
            self.width = np.float32(self.width * np.float32(f))
            need = self._needed(top)
        held, self._held = self._held, []
        for a in held:
            self._bin(a, np.float32(a.max()))
        if self._held_zeros:
            self.hist[0] += self._held_zeros
            self._held_zeros = 0
        length = max(self._length, need)
        if self.hist.size > length:           # only the call's top value can sit past the end
            self.hist[length - 1] = saturating_add(self.hist[length - 1], int(self.hist[length:].sum()))
            self.hist = self.hist[:length]
        elif self.hist.size < length:
            self.hist = np.concatenate((self.hist, np.zeros(length - self.hist.size, np.int64)))
        self._length = length
        self._call_max = np.float32(0.0)

    def _start(self, first_max: np.float32) -> None:
        self.width = np.float32(first_max / np.float32(KL_NUM_BIN))
        self.hist = np.zeros(KL_NUM_BIN, np.int64)
        self._length = KL_NUM_BIN

    def _needed(self, top: np.float32) -> int:
        assert self.width is not None
        return int(np.ceil(np.float32(top) / self.width))

    def _bin(self, a: np.ndarray, top: np.float32) -> None:
        """Bin ``a`` (float32, max ``top``) with the current width, growing the bins to hold it."""
        assert self.width is not None and self.hist is not None
        if a.size == 0:
            return
        size = int(top / self.width) + 1                 # the same float32 division as every value's
        if size > self.hist.size:
            self.hist = np.concatenate((self.hist, np.zeros(size - self.hist.size, np.int64)))
        idx = (a / self.width).astype(np.intp)           # float32 division, truncation == floor
        self.hist = saturating_add(self.hist, np.bincount(idx, minlength=self.hist.size))


def _merge(hist: np.ndarray, f: int) -> np.ndarray:
    """Groups of ``f`` bins summed as the kernel merges them: in float32, bin by bin (exact below 2**24)."""
    starts = np.arange(0, hist.size, f)
    if int(hist.sum()) <= KL_COUNT_LIMIT:               # no partial sum can round
        return np.add.reduceat(hist, starts)
    return np.array([np.add.accumulate(hist[a : a + f].astype(np.float32), dtype=np.float32)[-1]
                     for a in starts]).astype(np.int64)


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
        "kl_width": np.array([s.kl_width for s in stats.values()], dtype=np.float64),
        "meta_keys": np.array(list(meta), dtype=np.str_),
        "meta_values": np.array(list(meta.values()), dtype=np.str_),
    }
    for i, s in enumerate(stats.values()):
        arrays[f"hist_{i}"] = np.asarray(s.hist, dtype=np.int64)
        if s.channel_absmax is not None:
            arrays[f"channel_absmax_{i}"] = np.asarray(s.channel_absmax, dtype=np.float64)
        if s.kl_hist is not None:
            arrays[f"kl_hist_{i}"] = np.asarray(s.kl_hist, dtype=np.int64)

    with atomic_file(path, binary=True, fsync=True) as f:
        np.savez_compressed(f, allow_pickle=False, **arrays)  # histograms are mostly zeros: compresses well


def load_stats(path: str | os.PathLike) -> tuple[dict[str, TensorStats], dict[str, str]]:
    """Read a file written by :func:`save_stats`; returns (stats by tensor name, meta)."""
    with np.load(path, allow_pickle=False) as z:
        if "format_version" not in z.files or int(z["format_version"]) != _FORMAT_VERSION:
            raise ValueError(f"{path}: not a tuner stats file of format version {_FORMAT_VERSION}")
        names = [str(n) for n in z["names"]]
        count, mn, mx, hist_max, samples = z["count"], z["min"], z["max"], z["hist_max"], z["samples"]
        kl_width = z["kl_width"]
        stats: dict[str, TensorStats] = {}
        for i, name in enumerate(names):
            hist = z[f"hist_{i}"].astype(np.int64, copy=False)
            hist.setflags(write=False)
            key = f"channel_absmax_{i}"
            ch = None
            if key in z.files:
                ch = z[key].astype(np.float64, copy=False)
                ch.setflags(write=False)
            kh = None
            if f"kl_hist_{i}" in z.files:
                kh = z[f"kl_hist_{i}"].astype(np.int64, copy=False)
                kh.setflags(write=False)
            stats[name] = TensorStats(
                count=int(count[i]),
                min=float(mn[i]),
                max=float(mx[i]),
                channel_absmax=ch,
                hist=hist,
                hist_max=float(hist_max[i]),
                samples=int(samples[i]),
                kl_hist=kh,
                kl_width=float(kl_width[i]),
            )
        meta = {str(k): str(v) for k, v in zip(z["meta_keys"], z["meta_values"])}
    return stats, meta
