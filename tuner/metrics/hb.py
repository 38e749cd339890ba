"""hb_mapper's own similarity figures, defined as it computes the tables it prints.

horizon_nn's reporter (file id 24226422292 in the public code collection; called by the model
builder, 24861267739) flattens each tensor of the calibrated model and of the same model with
calibration switched off to one vector and prints, for each pair (a, b) of n values:

* cosine    = (a . b + 1e-5) / (|a| |b| + 1e-5)   -- the eps makes an all-zero pair score 1 and
  pulls a near-zero pair towards 1, where a plain cosine would say 0 or anything;
* L1        = sum |a - b| / n                     (a mean absolute error);
* L2        = |a - b| / n                         (the norm divided by n, *not* an RMS);
* Chebyshev = max |a - b|.

tuner computes the sums in float64 (hb_mapper in float32); the printed 6 decimals agree.
Several samples accumulated in one :class:`~tuner.metrics.similarity.Similarity` count as one
long vector, as a batch of them would in hb_mapper.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from tuner.metrics.similarity import Similarity

#: The eps hb_mapper adds to the dot product and to the product of norms.
HB_EPS = 1e-5


def hb_cosine(a: np.ndarray, b: np.ndarray, eps: float = HB_EPS) -> float:
    """hb_mapper's cosine of two tensors (flattened): (a.b + eps) / (|a| |b| + eps)."""
    x = np.asarray(a, dtype=np.float64).ravel()
    y = np.asarray(b, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError(f"shape mismatch {np.shape(a)} vs {np.shape(b)}")
    return float((np.dot(x, y) + eps) / (np.linalg.norm(x) * np.linalg.norm(y) + eps))


@dataclass(frozen=True)
class HbDistances:
    """The four figures of one row of hb_mapper's tables."""

    cosine: float
    l1: float
    l2: float
    chebyshev: float

    @classmethod
    def of(cls, quantized: np.ndarray, reference: np.ndarray) -> HbDistances:
        """The figures of one pair of tensors (flattened; the same shape)."""
        s = Similarity()
        s.update(reference, quantized)
        return cls.from_similarity(s)

    @classmethod
    def from_similarity(cls, s: Similarity, eps: float = HB_EPS) -> HbDistances:
        """The figures of everything ``s`` accumulated, as one vector."""
        if not s.count:
            raise ValueError("no values: hb_mapper prints '--' for an empty tensor")
        cosine = (s.dot + eps) / (math.sqrt(s.ref_sq) * math.sqrt(s.q_sq) + eps)
        return cls(cosine=float(cosine), l1=s.err_abs / s.count, l2=math.sqrt(s.err_sq) / s.count,
                   chebyshev=s.max_abs)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)
