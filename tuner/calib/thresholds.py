"""Thresholds memoised per (tensor, method, percentile, qmax), in memory and on disk.

kl costs ~20 ms a tensor of 1024 bins and more for grown histograms (tuner.calib.kl; the example's 52
tensors: ~1 s), so every process computing it again for the same statistics would waste a second or more
per calibration setting. The memo is a small JSON file next to the cached statistics: later runs and
parallel workers reuse it.
"""

from __future__ import annotations

import json
from pathlib import Path

from tuner.calib.kl import KL_VERSION
from tuner.calib.methods import threshold
from tuner.calib.stats import TensorStats
from tuner.files import write_atomic


class ThresholdMemo:
    def __init__(self, stats: dict[str, TensorStats], path: Path | None = None):
        self.stats = stats
        self.path = path
        self._values: dict[str, float] = {}
        self._new = False
        if path is not None and path.is_file():
            try:
                self._values = {k: float(v) for k, v in json.loads(path.read_text()).items()}
            except (OSError, ValueError, AttributeError):
                self._values = {}  # a damaged memo is rebuilt

    @staticmethod
    def _key(tensor: str, method: str, percentile: float | None, qmax: int) -> str:
        tag = f"kl.v{KL_VERSION}" if method == "kl" else method    # an older search's kl values are stale
        return f"{tag}|{percentile!r}|{qmax}|{tensor}"

    def get(self, tensor: str, method: str, percentile: float | None, qmax: int) -> float:
        key = self._key(tensor, method, percentile, qmax)
        if key not in self._values:
            self._values[key] = threshold(self.stats[tensor], method, percentile=percentile, qmax=qmax)
            self._new = self._new or method in ("kl", "mse")  # only the slow ones are worth a write
        return self._values[key]

    def flush(self) -> None:
        """Write new entries (merged with what other processes wrote meanwhile), atomically."""
        if self.path is None or not self._new:
            return
        try:
            merged = json.loads(self.path.read_text()) if self.path.is_file() else {}
        except (OSError, ValueError):
            merged = {}
        merged.update(self._values)
        try:
            write_atomic(self.path, json.dumps(merged))
            self._new = False
        except OSError:
            pass  # a read-only cache only costs time
