"""Tests of the calibration methods against plain reference implementations on the raw data."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.calib.methods import METHODS, _kl_divergences, asymmetric_range, channel_thresholds, kl_layout, threshold
from tuner.calib.stats import NBINS, StatsCollector, TensorStats


def collect(*chunks, nbins: int = NBINS) -> TensorStats:
    c = StatsCollector(nbins)
    for x in chunks:
        c.update(x)
    return c.result()


def gaussian_with_outliers(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(60_000).astype(np.float32)
    # Far enough out that the 128-bin minimum candidate of kl (hist_max / 8 = 8) can clip them.
    x[:5] = [60.0, -50.0, 56.0, -62.0, 58.0]
    return x


def relu_like(seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.maximum(rng.gamma(2.0, 1.5, size=40_000) * rng.choice([-1, 1], size=40_000), 0.0)


DATASETS = {
    "gaussian": lambda: np.random.default_rng(2).standard_normal(50_000),
    "gaussian_outliers": gaussian_with_outliers,
    "relu": relu_like,
    "cauchy": lambda: np.random.default_rng(3).standard_cauchy(30_000),  # sparse tails
    "tiny": lambda: np.array([0.0, -0.3, 1.7, 0.01, -5.5, 2.2, 0.0]),
}


# ---------------------------------------------------------------- percentile


@pytest.mark.parametrize("nbins", [NBINS, 64])
@pytest.mark.parametrize("name", DATASETS)
@pytest.mark.parametrize("p", [1e-4, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999, 0.99999])
def test_percentile_within_one_bin_of_np_quantile(name, p, nbins):
    x = DATASETS[name]()
    s = collect(x.reshape(-1, 1), nbins=nbins)
    ref = float(np.quantile(np.abs(x.astype(np.float64)), p))  # 'linear' interpolation
    got = threshold(s, "percentile", percentile=p)
    # Each order statistic is estimated inside its own bin, and both interpolate the same way
    # between ranks floor(p(n-1)) and +1, so the error is below one bin width (+ rounding).
    assert abs(got - ref) <= s.bin_width * (1 + 1e-9), (got, ref, s.bin_width)
    assert got <= s.absmax


def test_percentile_one_is_max_and_monotone():
    for make in DATASETS.values():
        s = collect(make())
        assert threshold(s, "percentile", percentile=1.0) == threshold(s, "max") == s.absmax
        ps = [0.5, 0.9, 0.99, 0.999, 0.99999, 0.9999999, 1.0]
        ts = [threshold(s, "percentile", percentile=p) for p in ps]
        assert ts == sorted(ts) and ts[-1] == s.absmax


@pytest.mark.parametrize("p", [None, 0.0, -0.1, 1.5, float("nan")])
def test_percentile_needs_valid_p(p):
    s = collect(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="percentile"):
        threshold(s, "percentile", percentile=p)


# ---------------------------------------------------------------- kl


def _smooth(d, eps=1e-4):
    zeros = d == 0
    nz = zeros.sum()
    nnz = d.size - nz
    if nnz == 0:
        return None
    out = d + np.where(zeros, eps, -eps * nz / nnz)
    return None if (out <= 0).any() else out


def reference_kl(abs_values: np.ndarray, width: float, nbins: int, candidates, nq: int = 128):
    """MXNet/TensorRT-style entropy calibration with plain loops, on an np.histogram of the raw values."""
    hist, edges = np.histogram(abs_values, bins=nbins, range=(0.0, width * nbins))
    divs = reference_divergences(hist, candidates, nq)
    best = int(np.argmin(divs))
    return min(float(edges[candidates[best]]), float(abs_values.max())), divs


def reference_divergences(hist: np.ndarray, candidates, nq: int = 128) -> np.ndarray:
    """KL(P || Q) per candidate bin count, one candidate and one level at a time."""
    hist = np.asarray(hist, dtype=np.float64)
    divs = []
    for i in candidates:
        p = hist[:i].copy()
        p[i - 1] += hist[i:].sum()  # outliers clipped into the last bin
        m = i // nq
        levels = [hist[j * m : (j + 1) * m].sum() for j in range(nq)]
        levels[-1] += hist[nq * m : i].sum()
        q = np.zeros(i)
        for j in range(nq):
            start = j * m
            stop = i if j == nq - 1 else start + m
            nonzero = p[start:stop] != 0
            if nonzero.any():
                q[start:stop] = np.where(nonzero, levels[j] / nonzero.sum(), 0.0)
        ps, qs = _smooth(p), _smooth(q)
        if ps is None or qs is None:
            divs.append(np.inf)
            continue
        ps, qs = ps / ps.sum(), qs / qs.sum()
        divs.append(float(np.sum(ps * np.log(ps / qs))))
    return np.array(divs)


def _histograms():
    rng = np.random.default_rng(7)
    dense = np.histogram(np.abs(rng.standard_normal(200_000)), bins=2048)[0]
    outliers = dense.copy()
    outliers[-3:] += [1, 0, 2]
    sparse = np.where(rng.random(2048) < 0.004, rng.integers(1, 50, 2048), 0)  # smoothing shift > 0.01
    gappy = dense.copy()
    gappy[300:900] = 0                                       # whole empty levels for many candidates
    relu = np.zeros(2048, np.int64)
    relu[0], relu[1:400] = 100_000, rng.integers(0, 30, 399)  # a spike at zero, a thin tail
    return {"dense": dense, "outliers": outliers, "sparse": sparse, "gappy": gappy, "relu": relu}


@pytest.mark.parametrize("name", list(_histograms()))
def test_kl_divergences_equal_a_loop_over_candidates(name):
    h = _histograms()[name]
    candidates = np.arange(2048, 127, -7)[::-1]
    got = _kl_divergences(h, 128, candidates)
    ref = reference_divergences(h, candidates)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(ref))
    assert np.isfinite(ref).any()
    finite = np.isfinite(ref)
    np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-9, atol=1e-12)
    # the same pick, or one whose divergence ties the minimum to rounding (the sparse one has
    # exact ties at 0: with so few nonzero bins Q equals P for many candidates)
    assert ref[np.argmin(got)] <= ref.min() + 1e-9 * abs(ref.min()) + 1e-12


@pytest.mark.parametrize("name", ["gaussian_outliers", "relu"])
def test_kl_matches_reference(name):
    x = DATASETS[name]()
    s = collect(x[:1000].reshape(10, 100), x[1000:].reshape(-1, 100))
    abs_x = np.abs(x.astype(np.float64))
    h, width, candidates = kl_layout(s)
    ref, divs = reference_kl(abs_x, width, h.size, candidates)
    got = threshold(s, "kl")
    # The histograms are identical (exact streaming), so the picks agree unless two candidates'
    # divergences tie to within float rounding of differently ordered sums.
    if got != ref:
        c = int(np.flatnonzero(candidates == round(got / width))[0])
        assert abs(divs[c] - divs.min()) <= 1e-9 * abs(divs.min())
    assert 0 < got <= s.absmax


def test_kl_layout_is_hb_mappers_1024_bins_with_cut_points_from_128():
    """hb_mapper's kl:num_bin=1024 (hb_quantizer_facts 1.4): bins of hist_max / 1024, cut points from
    128 bins (the int8 half-range) to the full range, every 4th bin at most."""
    for name in ("gaussian_outliers", "relu"):
        s = collect(DATASETS[name]())
        h, width, candidates = kl_layout(s)
        assert h.sum() == s.hist.sum()                       # merging and trimming lose no mass
        assert width == s.hist_max / 1024
        assert s.absmax <= h.size * width < s.absmax + width + 1e-12
        assert 512 < h.size <= 1024
        assert candidates[-1] == h.size                      # no clipping is always a candidate
        step = candidates[1] - candidates[0]
        assert 128 <= candidates[0] < 128 + step and 1 <= step <= 4 and (np.diff(candidates) == step).all()


def test_kl_clips_outliers_but_max_does_not():
    x = gaussian_with_outliers()
    s = collect(x)
    t_kl = threshold(s, "kl")
    assert threshold(s, "max") == s.absmax == 62.0
    # the bulk is N(0, 1); outliers reach 62. hb_mapper's 1024-bin layout clips to 1/8 of the
    # power-of-two range at most (8.0 here), TensorRT's 2048-bin one went to 1/16.
    assert 8.0 <= t_kl < 0.3 * s.absmax
    # channel_thresholds on the same stats: clipped for kl, untouched for max
    s2 = collect(np.stack([x, x / 1000.0], axis=1))
    np.testing.assert_array_equal(channel_thresholds(s2, "max"), [62.0, np.float32(62.0) / 1000.0])
    ct = channel_thresholds(s2, "kl")
    assert ct[0] == threshold(s2, "kl") < 0.3 * 62.0
    assert ct[1] == s2.channel_absmax[1]


def test_kl_can_pick_the_full_range():
    # Equal counts in every bin: at the full range Q equals P and KL is exactly 0, while any
    # smaller i piles outlier mass into P's last bin. The full range must be a candidate.
    x = np.repeat((np.arange(2048) + 0.5) / 2048, 3)
    s = collect(x)
    h, width, candidates = kl_layout(s)
    ref, _ = reference_kl(x, width, h.size, candidates)
    assert threshold(s, "kl") == ref == s.absmax


def test_kl_int16_is_absmax():
    s = collect(gaussian_with_outliers())
    assert threshold(s, "kl", qmax=32767) == s.absmax


# ---------------------------------------------------------------- mse


def fake_quant_error(abs_values: np.ndarray, t: float, qmax: int) -> float:
    s = t / qmax
    return float(np.sum((np.clip(np.round(abs_values / s), -qmax, qmax) * s - abs_values) ** 2))


def reference_mse(values: np.ndarray, qmax: int = 127):
    """Brute force over the raw values and the same 200 candidates."""
    amax = float(np.abs(values).max())
    cands = [amax * (k + 1) / 200 for k in range(200)]
    errs = np.array([fake_quant_error(np.abs(values), t, qmax) for t in cands])
    return cands, errs


@pytest.mark.parametrize("nbins", [NBINS, 64])
@pytest.mark.parametrize("qmax", [127, 32767, 7])
def test_mse_exact_when_values_sit_at_bin_centres(qmax, nbins):
    # With every value at a bin centre the histogram model is exact, so the expected errors
    # agree up to summation order; allow only ties within float rounding. (64 coarse bins make
    # the test sensitive to where inside a bin the mass is placed.)
    rng = np.random.default_rng(4)
    hist_max = 8.0
    w = hist_max / nbins
    idx = np.concatenate([rng.integers(0, nbins // 8, 5000), rng.integers(nbins // 8, nbins, 20)])
    idx[0] = nbins - 1  # pin the range
    x = (idx + 0.5) * w * rng.choice([-1.0, 1.0], idx.size)
    s = collect(x, nbins=nbins)
    assert s.hist_max == hist_max
    cands, errs = reference_mse(x, qmax)
    got = threshold(s, "mse", qmax=qmax)
    k = cands.index(got)
    assert errs[k] <= errs.min() * (1 + 1e-9)


@pytest.mark.parametrize("name", ["gaussian", "gaussian_outliers", "relu"])
def test_mse_close_to_brute_force_on_raw_values(name):
    # Placing each bin's mass at its centre moves every value by < bin_width / 2 (absmax / 8192
    # at most), tiny next to the quantization step T / 127 at any sensible threshold, so the pick
    # is near-optimal on the raw data: 1% slack and 3 candidates cover the centre approximation.
    x = DATASETS[name]()
    s = collect(x)
    cands, errs = reference_mse(x)
    got = threshold(s, "mse")
    assert got in cands
    assert errs[cands.index(got)] <= errs.min() * 1.01
    assert abs(cands.index(got) - int(np.argmin(errs))) <= 3


# ---------------------------------------------------------------- common


def test_all_zero_tensor_gives_zero():
    for s in (collect(np.zeros((4, 3, 2))), StatsCollector().result()):
        for m in METHODS:
            assert threshold(s, m, percentile=0.99) == 0.0
    s = collect(np.zeros((4, 3, 2)))
    for m in METHODS:
        np.testing.assert_array_equal(channel_thresholds(s, m, percentile=0.99), np.zeros(3))


def test_unknown_method_lists_methods():
    s = collect(np.array([1.0]))
    with pytest.raises(ValueError) as e:
        threshold(s, "entropy")
    for m in METHODS:
        assert m in str(e.value)
    with pytest.raises(ValueError, match="percentile"):
        channel_thresholds(s, "minmax")


def test_channel_thresholds():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((50, 4, 10)) * np.array([0.01, 1.0, 5.0, 20.0])[None, :, None]
    s = collect(x)
    np.testing.assert_array_equal(channel_thresholds(s, "max"), np.abs(x).max(axis=(0, 2)))
    for m in ("percentile", "kl", "mse"):
        t = threshold(s, m, percentile=0.999)
        got = channel_thresholds(s, m, percentile=0.999)
        assert got.dtype == np.float64 and got.shape == (4,)
        np.testing.assert_array_equal(got, np.minimum(s.channel_absmax, t))
    with pytest.raises(ValueError, match="rank"):
        channel_thresholds(collect(np.array([1.0, 2.0])), "max")


def test_asymmetric_range():
    assert asymmetric_range(collect(np.array([0.5, 2.0]))) == (0.0, 2.0)
    assert asymmetric_range(collect(np.array([-0.5, -2.0]))) == (-2.0, 0.0)
    assert asymmetric_range(collect(np.array([-0.5, 3.0]))) == (-0.5, 3.0)
    assert asymmetric_range(collect(np.zeros(3))) == (0.0, 0.0)


def test_thresholds_never_exceed_absmax():
    for make in DATASETS.values():
        s = collect(make())
        for m in METHODS:
            for qmax in (127, 32767):
                assert 0.0 < threshold(s, m, percentile=0.9999, qmax=qmax) <= s.absmax


# ---------------------------------------------------------------- max-percentile (hb_mapper's reading)


def test_hb_kernel_percentile_is_the_notes_p_prime():
    """hb_quantizer_facts 1.3: p' = max(0.5, 1 - (1 - p) N)."""
    from tuner.calib.methods import hb_kernel_percentile

    for n, want in ((50, 0.9975), (100, 0.995), (500, 0.975), (10_000, 0.5), (20_000, 0.5)):
        assert hb_kernel_percentile(0.99995, n) == pytest.approx(want, abs=1e-12)


def test_max_percentile_is_the_p_prime_quantile_of_the_running_max():
    rng = np.random.default_rng(3)
    samples = [rng.standard_normal((1, 2, 16, 16)).astype(np.float32) * (1 + 4 * (i == 7)) for i in range(40)]
    c = StatsCollector()
    for x in samples:
        c.update(x)
    s = c.result()
    assert s.samples == 40
    running = np.max(np.abs(np.concatenate(samples)), axis=0).astype(np.float64)
    for p in (0.9999, 0.99995, 0.999):
        p_kernel = max(0.5, 1 - (1 - p) * 40)
        want = float(np.quantile(running, p_kernel))
        got = threshold(s, "max-percentile", percentile=p)
        assert abs(got - want) <= s.bin_width + 1e-12, (p, got, want)
        # a different statistic from the pooled p-quantile of |x|
        assert got != threshold(s, "percentile", percentile=p)
    assert threshold(s, "max-percentile", percentile=1.0) == s.absmax


def test_max_percentile_without_running_max_falls_back_to_the_pooled_reading():
    s = collect(gaussian_with_outliers())
    bare = TensorStats(count=s.count, min=s.min, max=s.max, channel_absmax=None, hist=s.hist, hist_max=s.hist_max)
    assert threshold(bare, "max-percentile", percentile=0.999) == threshold(s, "percentile", percentile=0.999)
