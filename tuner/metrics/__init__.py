"""Compare quantized outputs with the float reference."""

from tuner.metrics.hb import HB_EPS, HbDistances, hb_cosine
from tuner.metrics.similarity import Similarity

__all__ = ["HB_EPS", "HbDistances", "Similarity", "hb_cosine"]
