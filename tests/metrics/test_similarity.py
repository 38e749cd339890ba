"""The similarity sums: per-sample accumulations merge into the pooled ones exactly."""

import numpy as np

from tuner.metrics.similarity import Similarity


def test_merged_per_sample_sums_are_the_pooled_ones_and_cosine_only_agrees():
    rng = np.random.default_rng(0)
    pairs = [(rng.standard_normal(50).astype(np.float32), rng.standard_normal(50).astype(np.float32)) for _ in range(3)]
    pooled, merged, cos = Similarity(), Similarity(), Similarity()
    for r, q in pairs:
        pooled.update(r, q)
        one = Similarity()
        one.update(r, q)
        merged.merge(one)
        cos.update_cosine(r, q)
    assert merged.as_dict() == pooled.as_dict() and cos.cosine == pooled.cosine
