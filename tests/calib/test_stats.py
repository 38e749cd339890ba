"""Tests of the streaming statistics: the histogram must be exact, not approximate."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from tuner.calib import stats as stats_mod
from tuner.calib.stats import KL_NUM_BIN, NBINS, StatsCollector, TensorStats, load_stats, save_stats


def collect(chunks, nbins: int = NBINS) -> TensorStats:
    c = StatsCollector(nbins)
    for x in chunks:
        c.update(x)
    return c.result()


def all_abs(chunks) -> np.ndarray:
    return np.concatenate([np.abs(np.asarray(x, dtype=np.float64)).ravel() for x in chunks])


def reference_hist(values: np.ndarray, hist_max: float, nbins: int = NBINS) -> np.ndarray:
    """Bin everything at once over the final range.

    Float32 data puts many values exactly on bin edges (edges are multiples of a power of two).
    np.histogram's bins are half-open [e_k, e_{k+1}) and, with a power-of-two range, its edges
    are computed exactly, so an edge value lands in bin floor(|x| / w) just as in the collector.
    """
    hist, edges = np.histogram(values, bins=nbins, range=(0.0, hist_max))
    assert np.array_equal(edges, np.arange(nbins + 1) * (hist_max / nbins))  # edges really exact
    return hist


def smallest_pow2_above(v: float) -> float:
    p = 2.0 ** math.floor(math.log2(v))
    while p <= v:
        p *= 2
    while p / 2 > v:
        p /= 2
    return p


def test_streaming_with_growing_range_equals_binning_everything_at_once():
    rng = np.random.default_rng(1)
    chunks = [
        (rng.standard_normal((3, 4, 5, 6)) * 0.01).astype(np.float32),
        (rng.standard_normal((2, 4, 7, 3)) * 1.0).astype(np.float32),
        np.zeros((1, 4, 2, 2), np.float32),
        (rng.standard_normal((5, 4, 4, 4)) * 0.001).astype(np.float16),  # smaller: no growth
        (rng.standard_normal((2, 4, 8, 8)) * 300.0),  # float64, several doublings at once
        np.array([0.5, -1.0, 2.0, 0.25]).reshape(1, 4, 1, 1),  # values exactly on bin edges
        (rng.standard_normal((2, 4, 3, 3)) * 1e4).astype(np.float32),
    ]
    s = collect(chunks)
    values = all_abs(chunks)
    assert s.count == values.size
    assert s.hist.dtype == np.int64 and s.hist.shape == (NBINS,)
    assert s.hist_max == smallest_pow2_above(values.max())
    assert s.absmax == values.max()
    expected = reference_hist(values, s.hist_max)
    assert np.array_equal(s.hist, expected)
    # independent floor-based reference, to be sure edge values are counted where specified
    floor_idx = np.floor(values / s.bin_width).astype(np.int64)
    assert np.array_equal(s.hist, np.bincount(floor_idx, minlength=NBINS))


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_streaming_random_chunk_order_and_size(seed):
    rng = np.random.default_rng(seed)
    data = rng.standard_cauchy(20_000)  # heavy tails: the range grows many times
    cuts = np.sort(rng.choice(np.arange(1, data.size), size=15, replace=False))
    chunks = [c[:, None] for c in np.split(data, cuts)]  # rank 2, one channel
    s = collect(chunks)
    assert s.hist_max == smallest_pow2_above(np.abs(data).max())
    assert np.array_equal(s.hist, reference_hist(np.abs(data), s.hist_max))
    assert s.min == data.min() and s.max == data.max()


def test_huge_range_jump_merges_everything_into_bin_zero():
    chunks = [np.full(10, 1e-6), np.array([1e6, -3e-7])]
    s = collect(chunks)
    assert s.hist_max == smallest_pow2_above(1e6)
    assert np.array_equal(s.hist, reference_hist(all_abs(chunks), s.hist_max))
    assert s.hist[0] == 11 and s.hist.sum() == 12


def test_range_only_grows_when_abs_max_reaches_hist_max():
    c = StatsCollector()
    c.update(np.array([3.0]))
    assert c.result().hist_max == 4.0
    c.update(np.array([-3.999]))
    assert c.result().hist_max == 4.0
    c.update(np.array([4.0]))  # abs-max >= hist_max: strictly greater power of two
    assert c.result().hist_max == 8.0


def test_zeros_before_the_range_exists_are_counted():
    c = StatsCollector()
    c.update(np.zeros((2, 3, 4)))
    c.update(np.zeros((1, 3, 1), np.float32))
    s0 = c.result()
    assert s0.count == 27 and s0.hist_max == 0.0 and s0.absmax == 0.0
    assert s0.hist.sum() == 27 and s0.hist[0] == 27
    assert s0.min == 0.0 and s0.max == 0.0
    np.testing.assert_array_equal(s0.channel_absmax, np.zeros(3))

    x = np.array([[[0.3, 0.0, -0.7]]]).repeat(3, axis=1)  # shape (1, 3, 3), three more zeros
    c.update(x)
    s = c.result()
    assert s.count == 36
    values = np.concatenate([np.zeros(27), np.abs(x).ravel()])
    assert np.array_equal(s.hist, reference_hist(values, s.hist_max))
    assert s.hist[0] == 30


def test_zero_batches_after_the_range_exists_go_to_bin_zero():
    c = StatsCollector()
    c.update(np.array([5.0]))
    c.update(np.zeros(4))
    s = c.result()
    assert s.hist[0] == 4 and s.hist.sum() == 5 == s.count


def test_min_max_and_absmax():
    s = collect([np.array([-2.5, 1.0]), np.array([0.5, 3.25])])
    assert (s.min, s.max, s.absmax) == (-2.5, 3.25, 3.25)
    s = collect([np.array([-7.0, 1.0])])
    assert s.absmax == 7.0
    assert s.bin_width == s.hist_max / NBINS


def test_per_channel_absmax():
    rng = np.random.default_rng(5)
    chunks = [rng.standard_normal((n, 6, 5, 4)) * rng.uniform(0.1, 10, size=(1, 6, 1, 1)) for n in (1, 3, 2)]
    s = collect(chunks)
    expected = np.abs(np.concatenate(chunks)).max(axis=(0, 2, 3))
    assert s.channel_absmax.dtype == np.float64
    np.testing.assert_array_equal(s.channel_absmax, expected)

    s2 = collect([np.array([[1.0, -4.0], [-3.0, 2.0]])])  # rank 2: (N, C)
    np.testing.assert_array_equal(s2.channel_absmax, [3.0, 4.0])

    assert collect([np.array([1.0, -2.0])]).channel_absmax is None  # rank 1
    assert collect([np.array(3.0)]).channel_absmax is None  # rank 0


def test_channel_count_change_raises():
    c = StatsCollector()
    c.update(np.ones((2, 3, 4)))
    with pytest.raises(ValueError, match="channel"):
        c.update(np.ones((2, 4, 4)))
    with pytest.raises(ValueError, match="channel"):
        c.update(np.ones(5))
    assert c.result().count == 24  # failed updates leave the collector unchanged


@pytest.mark.parametrize(
    "bad, word",
    [(np.nan, "NaN"), (np.inf, "Inf"), (-np.inf, "Inf")],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_nan_and_inf_raise(bad, word, dtype):
    c = StatsCollector()
    c.update(np.ones((1, 2, 2), dtype))
    x = np.ones((1, 2, 2), dtype)
    x[0, 1, 0] = bad
    with pytest.raises(ValueError, match=word):
        c.update(x)
    s = c.result()
    assert s.count == 4 and s.max == 1.0 and s.hist.sum() == 4


def test_empty_array_is_a_noop():
    c = StatsCollector()
    c.update(np.ones((2, 3)))
    c.update(np.zeros((0, 5)))  # would be a channel change if it counted
    c.update(np.array([]))
    s = c.result()
    assert s.count == 6 and s.channel_absmax.shape == (3,)


def test_empty_stream():
    s = StatsCollector().result()
    assert s.count == 0 and s.absmax == 0.0 and s.hist_max == 0.0 and s.hist.sum() == 0
    assert s.channel_absmax is None


def test_result_is_a_snapshot_and_read_only():
    c = StatsCollector()
    c.update(np.ones((1, 2)))
    s = c.result()
    c.update(np.full((1, 2), 3.0))
    assert s.count == 2 and s.hist.sum() == 2 and s.channel_absmax.max() == 1.0
    with pytest.raises(ValueError):
        s.hist[0] = 5


def test_bad_nbins():
    with pytest.raises(ValueError):
        StatsCollector(1000)


def test_small_nbins_is_exact_too():
    rng = np.random.default_rng(6)
    chunks = [rng.standard_normal(50) * 10.0**k for k in range(-2, 3)]
    s = collect(chunks, nbins=64)
    assert np.array_equal(s.hist, reference_hist(all_abs(chunks), s.hist_max, nbins=64))


def _sample_stats() -> dict[str, TensorStats]:
    rng = np.random.default_rng(7)
    return {
        "conv1/Relu:0": collect([np.maximum(rng.standard_normal((2, 3, 4, 4)), 0)]),
        "/backbone/layer.1/Add_output_0": collect([rng.standard_normal(10)]),
        "a:b/c:d": collect([np.zeros((1, 2))]),
        "naïve ünïcode": collect([]),
    }


def assert_same(a: TensorStats, b: TensorStats) -> None:
    assert (a.count, a.min, a.max, a.hist_max, a.samples) == (b.count, b.min, b.max, b.hist_max, b.samples)
    assert np.array_equal(a.hist, b.hist) and b.hist.dtype == np.int64
    assert (a.kl_hist is None) == (b.kl_hist is None) and a.kl_width == b.kl_width
    if a.kl_hist is not None:
        assert np.array_equal(a.kl_hist, b.kl_hist) and b.kl_hist.dtype == np.int64 and a.kl_hist.sum() > 0
    if a.channel_absmax is None:
        assert b.channel_absmax is None
    else:
        np.testing.assert_array_equal(a.channel_absmax, b.channel_absmax)


def test_save_load_round_trip(tmp_path):
    stats = _sample_stats()
    meta = {"model": "net.onnx", "calib_dir": "/data/calib:v2", "n": "100"}
    path = tmp_path / "stats.npz"
    save_stats(path, stats, meta)
    loaded, loaded_meta = load_stats(path)
    assert list(loaded) == list(stats)
    for name in stats:
        assert_same(stats[name], loaded[name])
    assert loaded_meta == meta

    save_stats(str(tmp_path / "no_meta.npz"), stats)
    assert load_stats(tmp_path / "no_meta.npz")[1] == {}


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path, monkeypatch):
    stats = _sample_stats()
    path = tmp_path / "stats.npz"
    save_stats(path, stats, {"v": "1"})
    save_stats(path, stats, {"v": "2"})  # overwrite
    assert sorted(os.listdir(tmp_path)) == ["stats.npz"]
    assert load_stats(path)[1] == {"v": "2"}

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(stats_mod.np, "savez_compressed", boom)
    with pytest.raises(RuntimeError):
        save_stats(path, stats, {"v": "3"})
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["stats.npz"]  # no temp file left behind
    assert load_stats(path)[1] == {"v": "2"}  # the old file is intact


def test_load_rejects_other_npz(tmp_path):
    path = tmp_path / "other.npz"
    np.savez(path, a=np.arange(3))
    with pytest.raises(ValueError, match="stats file"):
        load_stats(path)


# ---------------------------------------------------------------- hmct's kl histogram (docs/hb_rules/calibration.md 1a)


def kl_reference(calls: list[np.ndarray]) -> tuple[np.ndarray, np.float32]:
    """The rule, call by call on whole calls: width from the first nonzero call, whole bins appended,
    groups of need // 8192 bins merged past 16384 bins, the top value clipped into the last bin."""
    w, hist = None, None
    for call in calls:
        a = np.abs(np.asarray(call, np.float32)).ravel()
        top = np.float32(a.max())
        if w is None:
            if top == 0:
                continue
            w, hist = np.float32(top / np.float32(1024)), np.zeros(1024, np.int64)
        need = int(np.ceil(top / w))
        if need > 16384:
            f = need // 8192
            hist = np.add.reduceat(hist, np.arange(0, hist.size, f))
            w = np.float32(w * np.float32(f))
            need = int(np.ceil(top / w))
        if need > hist.size:
            hist = np.concatenate([hist, np.zeros(need - hist.size, np.int64)])
        hist += np.bincount(np.minimum((a / w).astype(np.int64), hist.size - 1), minlength=hist.size)
    return hist, w


def test_kl_width_is_the_first_calls_max_over_1024():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    s = collect([x])
    w = np.float32(np.abs(x).max()) / np.float32(KL_NUM_BIN)
    assert s.kl_width == float(w) and s.kl_hist.size == KL_NUM_BIN
    np.testing.assert_array_equal(s.kl_hist, np.bincount(np.minimum((np.abs(x) / w).astype(np.int64).ravel(), 1023),
                                                         minlength=1024))
    assert s.kl_hist[-1] >= 1 and s.kl_hist.sum() == x.size       # the max itself lands in the last bin


def test_kl_histogram_grows_by_whole_bins_of_the_first_width():
    rng = np.random.default_rng(12)
    calls = [rng.standard_normal((1, 500)) * k for k in (1.0, 0.5, 2.44, 1.7)]
    s = collect(calls)
    hist, w = kl_reference(calls)
    assert s.kl_width == float(w) == float(np.float32(np.abs(calls[0]).max().astype(np.float32) / np.float32(1024)))
    np.testing.assert_array_equal(s.kl_hist, hist)
    assert s.kl_hist.size == int(np.ceil(np.float32(np.abs(calls[2]).max()) / w)) > 2400


def test_kl_histogram_depends_on_the_order_of_the_calls():
    """Unlike the power-of-two histogram: the first call sets the resolution."""
    rng = np.random.default_rng(13)
    small, large = rng.standard_normal((1, 2000)), rng.standard_normal((1, 2000)) * 3.0
    a, b = collect([small, large]), collect([large, small])
    assert np.array_equal(a.hist, b.hist)                          # order-free
    assert a.kl_width != b.kl_width and a.kl_hist.size > 2 * b.kl_hist.size == 2 * 1024
    for s, calls in ((a, [small, large]), (b, [large, small])):
        np.testing.assert_array_equal(s.kl_hist, kl_reference(calls)[0])


def test_a_call_of_several_arrays_is_one_call():
    """hb_mapper calls its kernel with 8 samples at once: the width is the max over all 8."""
    rng = np.random.default_rng(14)
    samples = [rng.standard_normal((1, 4, 6, 6)) * (1 + k) for k in range(8)] + [rng.standard_normal((1, 4, 6, 6)) * 20]
    one_call = np.concatenate(samples[:8])
    want = kl_reference([one_call, samples[8]])
    for first in (None, float(np.abs(one_call).max())):   # held until the call ends, or the max given up front
        c = StatsCollector(kl_first_max=first)
        for k, x in enumerate(samples):
            c.update(x, call_end=k >= 7)
        s = c.result()
        assert s.kl_width == float(want[1])
        np.testing.assert_array_equal(s.kl_hist, want[0])
    per_sample = collect(samples)                        # nine calls: a different (finer) histogram
    assert per_sample.kl_width < s.kl_width


def test_kl_top_value_is_clipped_only_when_it_is_its_calls_max():
    c = StatsCollector()
    c.update(np.array([1.0, 0.25]))                        # w = 1/1024
    c.update(np.array([2.0, 0.5]))                         # 2.0 / w = 2048 exactly: into bin 2047
    s = c.result()
    assert s.kl_hist.size == 2048 and s.kl_hist[2047] == 1
    c.update(np.array([2.0, 3.0]), call_end=False)         # same call as the next: 2048 bins are too few
    c.update(np.array([3.5]))
    s = c.result()
    assert s.kl_hist.size == 3584 and s.kl_hist[2048] == 1 and s.kl_hist[3583] == 1 and s.kl_hist[2047] == 1


def test_kl_histogram_past_max_num_bin_merges_groups_of_bins():
    """need > 16384: groups of f = need // 8192 bins merge and the width becomes f * w (measured:
    need 40960 -> f 5, 100000 -> 12, 1e6 -> 122)."""
    rng = np.random.default_rng(15)
    first = rng.uniform(0, 1, 3000).astype(np.float32)
    first[0] = 1.0
    for need, f in ((16384, 1), (16385, 2), (40960, 5), (100000, 12), (1000000, 122)):
        second = np.array([(need - 0.5) / 1024, 0.3, 7.0], np.float32)
        s = collect([first, second])
        hist, w = kl_reference([first, second])
        assert s.kl_width == float(w) == f / 1024
        np.testing.assert_array_equal(s.kl_hist, hist)
        assert s.kl_hist.sum() == 3003 and s.kl_hist.size <= 16384


def test_kl_all_zero_calls_set_nothing_and_zeros_go_to_bin_zero():
    g = np.random.default_rng(16).standard_normal((1, 1000))
    s = collect([np.zeros((1, 1000)), g, np.zeros((2, 1000))])
    ref = collect([g])
    assert s.kl_width == ref.kl_width
    assert s.kl_hist[0] == ref.kl_hist[0] + 2000 and np.array_equal(s.kl_hist[1:], ref.kl_hist[1:])
    zero = collect([np.zeros((3, 4))])
    assert zero.kl_hist is None and zero.kl_width == 0.0


def test_kl_bins_merge_as_float32_sums():
    """Past max_num_bin hmct merges bins into float32 sums, bin by bin: exact below 2**24 in all,
    rounded above (2**24 + 1 -> 2**24, 2**24 + 3 -> 2**24 + 4), as numpy's float32 gives."""
    from tuner.calib.stats import _merge

    small = np.array([0, 5, 7, 1, 2])
    assert _merge(small, 2).tolist() == [5, 8, 2]
    big = np.array([2**24, 1, 2**24, 3, 9])
    assert _merge(big, 2).tolist() == [2**24, 2**24 + 4, 9]
