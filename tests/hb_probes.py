"""Probe inputs for hmct's calibration kernels: generated here (our arrays), measured on the real
kernel once (``data/hb_kernel_probes.json``: facts; how they were measured is in its ``how`` field).

Each probe is a list of kernel calls (float32 arrays, batch axis first): a distribution, a seed and
a call pattern. Regenerating a probe gives bit-identical arrays (numpy's Generator streams).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

DATA = Path(__file__).parent / "calib" / "data" / "hb_kernel_probes.json"

SIZE = 8192  # values per call


def _draw(name: str, rng: np.random.Generator, n: int) -> np.ndarray:
    if name == "gauss":
        return rng.standard_normal(n)
    if name == "relu":
        return np.maximum(rng.standard_normal(n) + 0.3, 0.0)
    if name == "uniform":
        return rng.uniform(-1.0, 1.0, n)
    if name == "lognormal":
        return rng.lognormal(0.0, 1.0, n)
    if name == "laplace":
        return rng.laplace(0.0, 1.0, n)
    if name == "t3":
        return rng.standard_t(3, n)
    if name == "outliers":
        x = rng.standard_normal(n)
        x[:5] *= 6.0
        return x
    if name == "cluster":   # 1 % of the mass in a tight cluster far beyond the bulk
        x = rng.standard_normal(n)
        x[: n // 100] = 8.0 + 0.1 * rng.standard_normal(n // 100)
        return x
    if name == "sparse_relu":
        return np.maximum(rng.standard_normal(n) - 1.5, 0.0)
    if name == "mask":
        return (rng.random(n) < 0.05).astype(np.float64)
    if name == "hot_positions":   # a few positions large in every sample: running max != pooled top-k
        x = rng.standard_normal(n)
        x[:4] = 5.0 + rng.random(4)
        return x
    raise ValueError(name)


DISTRIBUTIONS = ("gauss", "relu", "uniform", "lognormal", "laplace", "t3", "outliers", "cluster", "sparse_relu",
                 "mask", "hot_positions")
#: call patterns: (calls, batch entries per call, range growth per call)
PATTERNS = {"one": (1, 1, 0.0), "grow4": (4, 1, 0.5), "shrink3": (3, 1, -0.3), "batch8x2": (2, 8, 0.0),
            "jump20": (2, 1, 19.0)}


def probe_calls(dist: str, seed: int, pattern: str) -> list[np.ndarray]:
    calls, per_call, growth = PATTERNS[pattern]
    rng = np.random.default_rng([seed, DISTRIBUTIONS.index(dist), list(PATTERNS).index(pattern)])
    out = []
    for j in range(calls):
        x = np.stack([_draw(dist, rng, SIZE) for _ in range(per_call)])
        out.append((x * (1.0 + growth * j)).astype(np.float32))
    return out


def measured() -> dict:
    return json.loads(DATA.read_text())
