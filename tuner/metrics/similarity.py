"""Streaming similarity of a quantized tensor to its float reference, over many samples.

Cosine is computed over all values of all samples together (one long vector), as hb_mapper
computes it per output; a per-sample mean would let empty samples (an OCR probability map
of a photo without text) dominate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass
class Similarity:
    dot: float = 0.0
    ref_sq: float = 0.0
    q_sq: float = 0.0
    err_sq: float = 0.0
    err_abs: float = 0.0
    max_abs: float = 0.0
    count: int = 0

    @staticmethod
    def square_sum(ref: np.ndarray) -> float:
        """The reference's share of ``ref_sq``: pass it to :meth:`update` when the same reference
        is compared again (the simulator scores every candidate against the same float outputs)."""
        r = np.asarray(ref).ravel().astype(np.float64)
        return float(np.einsum("i,i->", r, r))

    def update(self, ref: np.ndarray, q: np.ndarray, ref_sq: float | None = None) -> None:
        r, x = self._cosine_terms(ref, q, ref_sq)
        x -= r                      # x is now the error; no extra array
        self.err_sq += float(np.einsum("i,i->", x, x))
        np.abs(x, out=x)
        self.err_abs += float(x.sum())
        if x.size:
            self.max_abs = max(self.max_abs, float(x.max()))

    def update_cosine(self, ref: np.ndarray, q: np.ndarray) -> None:
        """:meth:`update` for :attr:`cosine` alone (the same dot and squares, so the same cosine;
        the error sums stay 0): the per-node rows need only the cosine, and on a 253-node detector
        the three error reductions were ~40 % of a per-node pass."""
        self._cosine_terms(ref, q, None)

    def _cosine_terms(self, ref: np.ndarray, q: np.ndarray, ref_sq: float | None) -> tuple[np.ndarray, np.ndarray]:
        """Adds the dot product, both squares and the count; returns both as float64 copies."""
        r = np.asarray(ref).ravel().astype(np.float64)
        x = np.asarray(q).ravel().astype(np.float64)
        if r.shape != x.shape:
            raise ValueError(f"shape mismatch {np.shape(ref)} vs {np.shape(q)}")
        # einsum, not BLAS: OpenBLAS threads fight onnxruntime's (measured 31 ms vs 0.35 ms a call)
        self.dot += float(np.einsum("i,i->", r, x))
        self.ref_sq += float(np.einsum("i,i->", r, r)) if ref_sq is None else ref_sq
        self.q_sq += float(np.einsum("i,i->", x, x))
        self.count += r.size
        return r, x

    def merge(self, other: Similarity) -> None:
        """Adds another accumulation's sums (one sample's into the pooled figure)."""
        self.dot += other.dot
        self.ref_sq += other.ref_sq
        self.q_sq += other.q_sq
        self.err_sq += other.err_sq
        self.err_abs += other.err_abs
        self.max_abs = max(self.max_abs, other.max_abs)
        self.count += other.count

    @property
    def finite(self) -> bool:
        """Whether every quantized value so far was finite (squares of float32 values cannot
        overflow float64, so a non-finite value is the only way ``q_sq`` becomes inf or NaN)."""
        return math.isfinite(self.q_sq)

    @property
    def cosine(self) -> float:
        """Cosine similarity; 1.0 when both are all-zero, NaN if the result is not finite."""
        if self.ref_sq == 0.0 and self.q_sq == 0.0:
            return 1.0
        if self.ref_sq == 0.0 or self.q_sq == 0.0:
            return 0.0
        return self.dot / math.sqrt(self.ref_sq * self.q_sq)

    @property
    def sqnr_db(self) -> float:
        """Signal-to-quantization-noise ratio in dB (inf when exact)."""
        if self.err_sq == 0.0:
            return math.inf
        if self.ref_sq == 0.0:
            return -math.inf
        return 10.0 * math.log10(self.ref_sq / self.err_sq)

    @property
    def l1(self) -> float:
        return self.err_abs / self.count if self.count else 0.0

    @property
    def l2(self) -> float:
        return math.sqrt(self.err_sq / self.count) if self.count else 0.0

    def as_dict(self) -> dict[str, float]:
        return {"cosine": self.cosine, "sqnr_db": self.sqnr_db, "max_abs": self.max_abs,
                "l1": self.l1, "l2": self.l2}
