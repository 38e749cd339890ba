"""Compare quantized outputs with the float reference."""

from tuner.metrics.similarity import Similarity

__all__ = ["Similarity"]
