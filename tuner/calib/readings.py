"""The second reading of hb_mapper's ``max_percentile`` (hb_quantizer_facts 1.3), for one comparison.

horizon_nn does not hand the user's p to its kernel but p' = max(0.5, 1 - (1 - p) * N), N the number
of calibration samples (src 24654149289). What the C++ kernel does with p' is not visible. tuner's
simulation reads it as the pooled p-quantile of |x| (``tuner.calib.methods``); the other reading,
which the N-scaling suggests, keeps an element-wise running max of |x| over the samples and takes
its p'-quantile. This module computes that reading with one extra pass over the data; only
``tuner import-calibrated`` calls it (it is not in the simulation's hot path), to see which reading
a real calibrated model's thresholds support.
"""

from __future__ import annotations

import numpy as np


def kernel_percentile(p: float, n_samples: int) -> float:
    """p' = max(0.5, 1 - (1 - p) * N), what horizon_nn passes to its kernel."""
    return max(0.5, 1.0 - (1.0 - p) * n_samples)


def running_max_thresholds(model, data, tensors: list[str], p: float,
                           threads: int | None = None) -> tuple[dict[str, float], float, int]:
    """({tensor: p'-quantile of the element-wise running max of |x|}, p', N) over ``data``."""
    from tuner.simulate.session import make_session, run_samples, with_outputs

    session = make_session(with_outputs(model.proto, tensors))
    names = [o.name for o in session.get_outputs() if o.name in set(tensors)]
    inputs = set(model.input_names)
    running: dict[str, np.ndarray] = {}
    n = 0
    for sample, outs in run_samples(session, names, data, threads, with_inputs=True):
        values = dict(zip(names, outs))
        values.update({k: v for k, v in sample.items() if k in inputs and k in set(tensors)})
        for t, v in values.items():
            a = np.abs(np.asarray(v, np.float32))
            if t in running and running[t].shape == a.shape:
                np.maximum(running[t], a, out=running[t])
            elif t not in running:
                running[t] = a.copy()
        n += 1
    q = kernel_percentile(p, n)
    return {t: float(np.quantile(m.ravel(), q)) for t, m in running.items()}, q, n
