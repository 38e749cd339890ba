"""Histograms shaped like the kl near-ties (docs/hb_rules/calibration.md section 1b): a bulk of
values over the first few hundred bins, a few lone tail values and the max in the last bin. Where the
search's divergence plateaus between lone values differ by a fraction of one value's probability, the
kernel's float arithmetic picks the plateau; tests/calib/data/hb_kl_neartie_picks.json holds its picks
for seeds 1000-2999."""

import numpy as np


def near_tie_histogram(seed: int) -> np.ndarray:
    """One 1024-bin |x| histogram (bin 0: values below one bin), deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    n = int(np.exp(rng.uniform(np.log(5e4), np.log(4e6))))
    bulk = int(rng.integers(400, 900))
    kind = rng.integers(3)
    x = np.arange(1, bulk + 1) / bulk
    if kind == 0:
        p = np.exp(-0.5 * (x * rng.uniform(2, 5)) ** 2)
    elif kind == 1:
        p = np.exp(-x * rng.uniform(4, 12))
    else:
        p = np.exp(-0.5 * ((x - 0.2) * rng.uniform(3, 8)) ** 2) + 0.05 * np.exp(-x * 3)
    p /= p.sum()
    h = np.zeros(1024, np.int64)
    h[1:bulk + 1] = rng.multinomial(n, p)
    h[0] = rng.integers(0, n // 10 + 1)
    lone = rng.choice(np.arange(bulk + 1, 1023), size=int(rng.integers(1, 7)), replace=False)
    h[lone] += rng.integers(1, 3, size=lone.size)
    h[1023] += 1
    return h


def spike_histogram(n: int, tail: list[tuple[int, int]], spikes: int = 1, first: float | None = None) -> np.ndarray:
    """A designed probe (section 1b, session 29): ``spikes`` spikes at bins 10, 17, 24, ... (7 apart,
    so no Q level of a candidate >= 128 holds two and the bulk adds no divergence) sharing ``n``
    values (equally, or ``first`` of them in the first spike and the rest equally), the ``tail``
    (bin, count) values and the max at 1023: the search's divergences come from the tail alone."""
    w = np.ones(spikes) if first is None else np.r_[first, np.full(spikes - 1, (1 - first) / max(spikes - 1, 1))]
    h = np.zeros(1024, np.int64)
    h[7 * np.arange(1, spikes + 1) + 3] = np.floor(n * w / w.sum()).astype(np.int64)
    for b, c in tail:
        h[b] += c
    h[1023] += 1
    return h
