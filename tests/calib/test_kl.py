"""hmct's kl search (tuner.calib.kl) against a plain loop and against the bins hmct's kernel picked.

The kernel's picks are committed measurements (tests/calib/data, docs/hb_rules/calibration.md 1b):
every one of them must be reproduced.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hb_probes import DATA as PROBE_DATA
from kl_neartie import near_tie_histogram, spike_histogram

from tuner.calib.kl import KL_COUNT_LIMIT, kernel_counts, kl_bin, kl_divergences, saturating_add
from tuner.calib.stats import StatsCollector

DATA_DIR = PROBE_DATA.parent
f32 = np.float32


def _in_order(values, dtype) -> float:
    """A sum in index order (numpy's accumulate adds one element at a time; its sum() is pairwise)."""
    values = np.asarray(values, dtype)
    return np.add.accumulate(values, dtype=dtype)[-1] if values.size else dtype(0)


def _smoothed(v: np.ndarray) -> np.ndarray:
    zeros = int((v == 0).sum())
    eps = f32(5e-10)
    eps1 = f32(f32(eps * f32(zeros)) / f32(v.size - zeros)) if zeros < v.size else f32(0)
    return np.where(v == 0, eps, v - eps1).astype(f32)


def loop_divergences(hist: np.ndarray) -> np.ndarray:
    """The search of docs/hb_rules/calibration.md 1b, one candidate, level and bin at a time."""
    h = np.asarray(hist, f32).copy()
    h[0] = 0
    total = f32(_in_order(h, np.float64))
    p = (h / total).astype(f32)
    kept = list(p[:127])
    tail = f32(_in_order(p[127:], np.float64))
    kept[126] = f32(kept[126] + tail)
    out = []
    for i in range(128, h.size):
        kept[i - 2] = f32(kept[i - 2] - tail)     # the bin gets its own mass back, as a difference
        kept.append(tail)
        tail = f32(tail - p[i - 1])
        P = np.array(kept, f32)
        w = i // 128
        Q = np.zeros(i, f32)
        for level in range(128):
            lo, hi = level * w, (i if level == 127 else (level + 1) * w)
            used = int((P[lo:hi] != 0).sum())
            if used:
                mass = f32(_in_order(h[lo:hi], f32) / f32(used))
                Q[lo:hi] = np.where(P[lo:hi] != 0, mass, f32(0))
        q_total = f32(_in_order(Q, np.float64))
        if q_total > 0:
            Q = (Q / q_total).astype(f32)
        Ps, Qs = _smoothed(P), _smoothed(Q)
        with np.errstate(all="ignore"):
            terms = Ps * np.log((Ps / Qs).astype(np.float64)).astype(f32)   # logf: the float64 log, rounded
        out.append(_in_order(terms, f32))
    return np.array(out, f32)


def _histograms() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    dense = np.histogram(np.abs(rng.standard_normal(200_000)), bins=1024)[0]
    outliers = dense.copy()
    outliers[-3:] += [1, 0, 2]
    sparse = np.where(rng.random(1300) < 0.02, rng.integers(1, 50, 1300), 0)
    sparse[-1] = 1
    gappy = np.concatenate([dense[:300], np.zeros(900, np.int64), [3]])   # Q's last level empty
    mask = np.zeros(1024, np.int64)
    mask[0], mask[-1] = 5000, 40
    spike = spike_histogram(3_000_000, [(950, 1)])                         # smoothing turns a bin negative
    return {"dense": dense, "outliers": outliers, "sparse": sparse, "gappy": gappy, "mask": mask, "spike": spike}


@pytest.mark.parametrize("name", list(_histograms()))
def test_divergences_equal_a_loop_over_candidates(name):
    h = _histograms()[name]
    i, got = kl_divergences(h)
    np.testing.assert_array_equal(i, np.arange(128, h.size))
    np.testing.assert_array_equal(got, loop_divergences(h))


def test_matches_the_kernel_on_model_histograms():
    """Every 5th of the 205 activation histograms of the example (batch 1) and PP-OCRv4's detector
    (batch 8), with the bin hmct's kernel picked: all 41 (the float64 closed form before: 40; its miss,
    hardsigmoid_13.tmp_0, is a tie every candidate's truncated divergence shares)."""
    with np.load(DATA_DIR / "hb_kl_model_histograms.npz") as z:
        kernel = z["kernel_bin"]
        off = [j for j in range(len(kernel)) if kl_bin(z[f"h{j}"]) != kernel[j]]
    assert len(kernel) == 41 and not off, off


def test_window_and_candidate_range():
    """Designed histograms, the kernel's bins measured: equal counts (the last window is centred 4
    candidates before the end: 1019 of 1024); a flat bulk and one value at the top (the first whole
    window on the plateau from 512: 516), the same with 1000 values at the top (406); a 0/1 mask, whose
    candidates differ only by rounding: 1015 of 1024, 419 of 512, 1849 of 2048."""
    uniform = np.full(1024, 50, np.int64)
    assert kl_bin(uniform) == 1019
    step = np.zeros(1024, np.int64)
    step[1:401], step[-1] = 1000, 1
    assert kl_bin(step) == 516
    step[-1] = 1000
    assert kl_bin(step) == 406
    for n, k in ((1024, 1015), (512, 419), (2048, 1849)):
        mask = np.zeros(n, np.int64)
        mask[0], mask[-1] = 900, 100
        assert kl_bin(mask) == k, n


@pytest.mark.slow
def test_the_kernels_picks_on_near_tie_histograms():
    """2000 histograms shaped like PP-OCRv4's p2o.Mul.30 (a bulk, lone tail values, the max at the
    top): the closed form picked the kernel's bin on 1716, every float32 variant tried on <= 1810."""
    picks = json.loads((DATA_DIR / "hb_kl_neartie_picks.json").read_text())
    first = picks["seeds"][0]
    off = [first + j for j, k in enumerate(picks["kernel_bin"]) if kl_bin(near_tie_histogram(first + j)) != k]
    assert len(picks["kernel_bin"]) == 2000 and not off, off[:10]


def _spike_probe(n, tail, spikes, first):
    # the probes were fed value by value: the kernel's float32 bins stop at 2**24
    return saturating_add(0, spike_histogram(n, [tuple(t) for t in tail], spikes, first))


def test_the_kernels_picks_on_designed_spike_probes():
    """200 probes: spikes 7 bins apart and lone tail values, n from 1e4 to 1.6e7 (closed form: 127)."""
    probes = json.loads((DATA_DIR / "hb_kl_spike_picks.json").read_text())["probes"]
    off = [p for p in probes if kl_bin(_spike_probe(*p[:4])) != p[4]]
    assert len(probes) == 200 and not off, off[:5]


@pytest.mark.slow
def test_the_kernels_picks_on_dominant_spike_probes():
    """1262 probes: one spike holding all values but k x 2^-24 of them, lone tail values, n up to
    2^25 (closed form: 524 of the 1102 with a tail; the smoothing model alone: 601 of 607 above the
    sawtooth). The 27 with more than 2^24 values in the spike need the kernel's saturated count."""
    probes = json.loads((DATA_DIR / "hb_kl_dominant_picks.json").read_text())["probes"]
    off = [p for p in probes if kl_bin(_spike_probe(*p[:4])) != p[4]]
    assert len(probes) == 1262 and not off, off[:5]
    big = [p for p in probes if spike_histogram(p[0], [tuple(t) for t in p[1]], p[2], p[3]).max() > KL_COUNT_LIMIT]
    assert len(big) == 27
    assert any(kl_bin(spike_histogram(p[0], [tuple(t) for t in p[1]], p[2], p[3])) != p[4] for p in big)


@pytest.mark.parametrize("start", [100, 2**24 - 5, 2**24, 2**24 + 2, 2**24 + 4, 2**24 + 6, 2**25, 2**25 + 4])
def test_saturating_add_counts_as_float32_bins(start):
    for added in (0, 1, 2, 3, 10):
        v = f32(start)
        for _ in range(added):
            v = f32(v + f32(1))
        assert int(saturating_add(np.array([start]), np.array([added]))[0]) == int(v), added


def test_collected_bins_stop_at_two_to_the_24():
    """2**24 + 100 values in one bin (one call): hmct's float32 bin holds 2**24, and so does tuner's."""
    x = np.full(KL_COUNT_LIMIT + 100, 0.5, np.float32)
    x[0] = 1.0                                                  # the max: width 1 / 1024, the values in bin 512
    c = StatsCollector()
    c.update(x)
    hist = c.result().kl_hist
    assert hist[512] == KL_COUNT_LIMIT and hist[-1] == 1
    assert kernel_counts(hist)[0] == 0


def test_a_candidate_whose_smoothed_bin_turns_negative_is_never_picked():
    """One spike holding all but 2 of 3e6 values: for the candidates past the lone value, P's clipped
    bin loses more to the smoothing than it holds, D is NaN, and so is every later window."""
    h = spike_histogram(3_000_000, [(950, 1)])
    i, d = kl_divergences(h)
    nan = np.flatnonzero(np.isnan(d))
    assert nan.size and kl_bin(h) + 4 < i[nan[0]]
