"""hb_mapper's table figures (tuner.metrics.hb) against values worked out by hand."""

import math

import numpy as np
import pytest

from tuner.metrics import HB_EPS, HbDistances, Similarity, hb_cosine


def test_the_four_figures_of_a_small_pair():
    # a = [1, 2, 3], b = [1, 5, 7]: a.b = 32, |a| |b| = sqrt(14 * 75) = sqrt(1050), d = [0, 3, 4]
    d = HbDistances.of(np.array([1.0, 5.0, 7.0]), np.array([1.0, 2.0, 3.0]))
    assert HB_EPS == 1e-5
    assert d.cosine == pytest.approx((32 + 1e-5) / (math.sqrt(1050) + 1e-5), rel=1e-12)
    assert d.l1 == pytest.approx(7 / 3, rel=1e-12)
    assert d.l2 == pytest.approx(5 / 3, rel=1e-12)         # |d| / n, not the RMS 5 / sqrt(3)
    assert d.chebyshev == 4.0
    assert hb_cosine([1, 2, 3], [1, 5, 7]) == pytest.approx(d.cosine, rel=1e-12)


def test_eps_decides_on_near_zero_tensors():
    # orthogonal, tiny: plain cosine 0; hb: 1e-5 / (1e-6 + 1e-5) = 1 / 1.1
    a, b = np.array([1e-3, 0.0]), np.array([0.0, 1e-3])
    assert hb_cosine(a, b) == pytest.approx(1 / 1.1, rel=1e-9)
    s = Similarity()
    s.update(a, b)
    assert s.cosine == 0.0 and HbDistances.from_similarity(s).cosine == pytest.approx(1 / 1.1, rel=1e-9)
    # a tensor quantized to all zeros: plain cosine 0, hb_mapper prints 1
    z = HbDistances.of(np.zeros(4), np.full(4, 1e-3))
    assert z.cosine == 1.0 and z.l1 == pytest.approx(1e-3) and z.l2 == pytest.approx(math.sqrt(4e-6) / 4)
    assert z.chebyshev == pytest.approx(1e-3)
    # on an ordinary tensor the eps is far below the printed 6 decimals
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1000)
    y = x + 0.05 * rng.standard_normal(1000)
    plain = float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))
    assert abs(hb_cosine(x, y) - plain) < 1e-7 and hb_cosine(x, y) != plain


def test_samples_accumulated_count_as_one_vector_and_empty_is_refused():
    rng = np.random.default_rng(1)
    r1, r2 = rng.standard_normal(50), rng.standard_normal(30) * 10
    q1, q2 = r1 + 0.1, r2 - 0.3
    s = Similarity()
    s.update(r1, q1)
    s.update(r2, q2)
    both = HbDistances.from_similarity(s)
    one = HbDistances.of(np.concatenate([q1, q2]), np.concatenate([r1, r2]))
    for k in ("cosine", "l1", "l2", "chebyshev"):
        assert getattr(both, k) == pytest.approx(getattr(one, k), rel=1e-12)
    assert both.as_dict().keys() == {"cosine", "l1", "l2", "chebyshev"}
    with pytest.raises(ValueError):
        HbDistances.from_similarity(Similarity())
    with pytest.raises(ValueError):
        hb_cosine(np.zeros(3), np.zeros(4))
