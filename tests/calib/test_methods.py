"""Tests of the calibration methods against plain reference implementations on the raw data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hb_probes import DATA as PROBE_DATA
from hb_probes import measured, probe_calls

from tuner.calib.methods import (
    METHODS,
    asymmetric_range,
    channel_thresholds,
    threshold,
)
from tuner.calib.stats import NBINS, StatsCollector, TensorStats

DATA_DIR = PROBE_DATA.parent


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


# ---------------------------------------------------------------- kl (docs/hb_rules/calibration.md 1b)


def test_kl_matches_hmcts_kernel_on_generated_probes():
    """110 probes (11 distributions x 2 seeds x 5 call patterns: one call, growing and shrinking
    ranges, batches of 8, a 20x range jump past max_num_bin) measured on hmct's kernel: bit-equal."""
    probes = measured()["probes"]
    off = []
    for r in probes:
        c = StatsCollector()
        for x in probe_calls(r["dist"], r["seed"], r["pattern"]):
            c.update(x)
        s = c.result()
        assert threshold(s, "max") == r["max"]
        got = threshold(s, "kl")
        if got != r["kl"]:
            off.append((r["dist"], r["seed"], r["pattern"], got, r["kl"]))
    assert not off, off
    assert len(probes) == 110
    assert min(r["kl"] / r["max"] for r in probes) < 0.3       # the probes do clip (t3, lognormal)


def test_kl_ignores_bin_zero():
    """Exact zeros (and anything below one bin) do not count: ReLU outputs are calibrated as if their
    zeros did not exist (measured: 50 % zeros or 50 % values of 1e-6 change nothing)."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal(20_000).astype(np.float32)
    base = collect(x.reshape(1, -1))
    with_zeros = collect(np.concatenate([x, np.zeros(20_000, np.float32)]).reshape(1, -1))
    with_tiny = collect(np.concatenate([x, np.full(20_000, 1e-6, np.float32)]).reshape(1, -1))
    assert threshold(base, "kl") == threshold(with_zeros, "kl") == threshold(with_tiny, "kl")
    shifted = np.concatenate([x, np.full(20_000, 3.5 * base.kl_width, np.float32)])   # the same mass in bin 3
    assert threshold(collect(shifted.reshape(1, -1)), "kl") != threshold(base, "kl")


def test_kl_clips_outliers_but_max_does_not():
    x = gaussian_with_outliers()
    s = collect(x)
    t_kl = threshold(s, "kl")
    assert threshold(s, "max") == s.absmax == 62.0
    # the bulk is N(0, 1), outliers reach 62: the 1024 bins of 62 / 1024 put the bulk in ~70 bins,
    # below the 128-level floor of the search, which clips to about bin 128 (7.8)
    assert 7.5 <= t_kl < 0.3 * s.absmax
    s2 = collect(np.stack([x, x / 1000.0], axis=1))
    np.testing.assert_array_equal(channel_thresholds(s2, "max"), [62.0, np.float32(62.0) / 1000.0])
    ct = channel_thresholds(s2, "kl")
    assert ct[0] == threshold(s2, "kl") < 0.3 * 62.0
    assert ct[1] == s2.channel_absmax[1]


def test_kl_int16_is_the_int8_threshold():
    """hmct's kernel ignores the node's qtype, and hb_mapper keeps the kl thresholds on int16 nodes
    (a toy: an int16 Conv input 12.294 = its kl threshold, max 12.496)."""
    s = collect(gaussian_with_outliers())
    assert threshold(s, "kl", qmax=32767) == threshold(s, "kl") < s.absmax


def test_kl_without_its_histogram_reads_the_exact_one():
    s = collect(DATASETS["relu"]().astype(np.float32).reshape(1, -1))
    bare = TensorStats(count=s.count, min=s.min, max=s.max, channel_absmax=None, hist=s.hist, hist_max=s.hist_max)
    assert threshold(bare, "kl") == pytest.approx(threshold(s, "kl"), rel=0.01)


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


# ---------------------------------------------------------------- max-percentile (docs/hb_rules/calibration.md 2)


def test_hb_kernel_percentile_is_the_notes_p_prime():
    """hmct's add_calibration_methods: p' = max(0.5, 1 - (1 - p) N)."""
    from tuner.calib.methods import hb_kernel_percentile

    for n, want in ((50, 0.9975), (100, 0.995), (500, 0.975), (10_000, 0.5), (20_000, 0.5)):
        assert hb_kernel_percentile(0.99995, n) == pytest.approx(want, abs=1e-12)


def kth_largest_rule(calls: list[np.ndarray], p_kernel: float) -> float:
    """The k-th largest |x| over every value, k = n - ceil(p' n) + 1, n values per sample."""
    values = np.sort(np.abs(np.concatenate([c.ravel() for c in calls])))
    n = calls[0][0].size
    k = n - math.ceil(float(np.float32(p_kernel)) * n) + 1
    return float(values[-k])


def test_max_percentile_matches_hmcts_kernel_on_generated_probes():
    """The rule is bit-equal to the kernel on the 110 probes; tuner reads it off its exact histogram,
    within one bin. The running-max reading (the p'-quantile of the element-wise max over samples)
    is not the kernel: it differs where the same positions are large in every sample."""
    for r in measured()["probes"]:
        calls = probe_calls(r["dist"], r["seed"], r["pattern"])
        assert kth_largest_rule(calls, r["kernel_percentile"]) == r["max_percentile_threshold"], r
        c = StatsCollector()
        for x in calls:
            c.update(x)
        s = c.result()
        assert s.samples == r["samples"]
        got = threshold(s, "max-percentile", percentile=r["max_percentile"])
        assert abs(got - r["max_percentile_threshold"]) <= s.bin_width, (r, got)
    hot = [r for r in measured()["probes"] if r["dist"] == "hot_positions" and r["samples"] == 16]
    for r in hot:
        calls = probe_calls(r["dist"], r["seed"], r["pattern"])
        running = np.max(np.abs(np.concatenate(calls)), axis=0)
        reading = np.sort(running)[math.ceil(float(np.float32(r["kernel_percentile"])) * running.size) - 1]
        assert reading < 0.9 * r["max_percentile_threshold"]


def test_max_percentile_is_the_pooled_kth_largest():
    rng = np.random.default_rng(3)
    samples = [rng.standard_normal((1, 2, 16, 16)).astype(np.float32) * (1 + 4 * (i == 7)) for i in range(40)]
    samples[3][0, 0, :4, :4] = 9.0 + rng.random((4, 4))            # one sample's hot corner
    c = StatsCollector()
    for x in samples:
        c.update(x)
    s = c.result()
    assert s.samples == 40
    for p in (0.9999, 0.99995, 0.999, 0.99):
        want = kth_largest_rule(samples, max(0.5, 1 - (1 - p) * 40))
        got = threshold(s, "max-percentile", percentile=p)
        assert abs(got - want) <= s.bin_width, (p, got, want)
    assert threshold(s, "max-percentile", percentile=1.0) == s.absmax


def test_max_percentile_without_samples_falls_back_to_the_pooled_reading():
    s = collect(gaussian_with_outliers())
    bare = TensorStats(count=s.count, min=s.min, max=s.max, channel_absmax=None, hist=s.hist, hist_max=s.hist_max)
    assert threshold(bare, "max-percentile", percentile=0.999) == threshold(s, "percentile", percentile=0.999)
