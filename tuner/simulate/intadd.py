"""hb's integer element-wise Add (``HzSElementwiseAdd``): how two int8 / int16 inputs become its int8 / int16 output.

The kernel, measured on PP-OCRv4's 11 Adds (max, a photo; every tensor of the real quantized model read back
with hmct's executor: 0 of 1.46M outputs differ), with ``a`` and ``b`` the inputs' integers::

    t = floor((a 2^x_shift + b e_scale 2^e_shift) / 2^accu_right_shift)
    y = clip(floor((t output_scale + 2^(output_right_shift - 1)) / 2^output_right_shift))

(the first shift floors, the second rounds half up). Its integers are pure functions of the steps ``s_a``,
``s_b`` (``a`` the input with the larger step) and ``s_out``, with ``norm(r)`` = (``m``, ``n``),
``n = floor(log2(2^15 / r))``, ``m = rint(r 2^n)``, and ``n - 1``, ``m = rint(r 2^(n-1))`` where that rint
reaches 2^15 (a ratio of exactly 1 or 1/2: hb writes 16384)::

    (e_scale, x_shift) = norm(s_b / s_a),   e_shift = 0
    (output_scale, n_out) = norm(s_a / s_out)
    output_right_shift = 22 for an int8 output, 14 for an int16 one
    accu_right_shift = n_out + x_shift - output_right_shift

Measured (scratch experiment ``exp-intadd``) against every HzSElementwiseAdd of the fidelity suite's real
models whose two inputs are activations on one threshold each (199 nodes, thresholds from the calibrated model;
PP-OCRv4 det, the classifier, segdepth, int8 and int16 inputs and outputs): all six integers equal hb's on 197;
hb splits ``n_out`` 17 / 15 instead of 18 / 14 on one int8 + int16 -> int16 Add, and writes 32766 with shifts
15 / 15 for a ratio of exactly 1 on one int16 one. Adds of a constant (a ConvTranspose's bias) are set apart.

Simulated where ``TUNER_INTCONV=1`` (tuner.simulate.intbuild ``int_add``) for a BPU Add not fused into a Conv
whose two inputs are int8 / int16 per tensor, in float64 from the dequantized float32 inputs (exact: an int16
input shifted by ``x_shift`` reaches 2^38): the inputs' integers (Round of the values over their steps), the
floored sum, the final shift (float32 would round ``t output_scale / 2^output_right_shift`` onto the half below
an integer: 150 and 73 of 200000 random int16 outputs off), then times ``s_out`` into the output's point, which
clips. Fed the same input, the simulated tensors then equal hb's on the three Adds of
tests/simulate/test_intadd.py's toy (int8 + int8 into int8 and into int16, int16 + int8 into int8), and 796
instead of 600639 of PP-OCRv4's (max, a photo) 12.9M int8/int16 values differ (its 11 Adds: 0 to 2 each).
Fifteen element-wise ops per Add output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tuner.simulate.intconv import fixed_point

#: output_right_shift of an int8 / int16 output
OUTPUT_SHIFT = {"int8": 22, "int16": 14}


def norm(r: float) -> tuple[int, int]:
    """(m, n): ``r`` as ``m / 2^n`` with ``m`` in [2^14, 2^15), as hb writes an Add's multipliers."""
    m_, n_ = fixed_point(r)
    m, n = int(m_), int(n_)
    if m >= 2 ** 15:
        n -= 1
        m = int(np.rint(r * 2.0 ** n))
    return m, n


@dataclass(frozen=True)
class AddRequant:
    """The integers of one HzSElementwiseAdd (see the module docstring); ``first`` the input index that is
    ``a`` (the larger step)."""

    first: int
    x_shift: int
    e_scale: int
    accu_right_shift: int
    output_scale: int
    output_right_shift: int


def requant(s0: float, s1: float, s_out: float, out_dtype: str) -> AddRequant:
    """hb's integers for an Add of inputs on steps ``s0``, ``s1`` into an ``out_dtype`` output on ``s_out``."""
    first = 0 if s0 >= s1 else 1
    s_a, s_b = (s0, s1) if first == 0 else (s1, s0)
    e_scale, x_shift = norm(s_b / s_a)
    out_scale, n_out = norm(s_a / s_out)
    out_shift = OUTPUT_SHIFT[out_dtype]
    return AddRequant(first, x_shift, e_scale, n_out + x_shift - out_shift, out_scale, out_shift)


def emulation(rq: AddRequant) -> tuple[float, float, float]:
    """(g_a, g_b, m): with ``a``, ``b`` the inputs' integers, ``floor(floor(a g_a + b g_b) m + 1/2)`` is the
    kernel's output before the clip: ``g_a = 2^(x_shift - accu_right_shift)``,
    ``g_b = e_scale / 2^accu_right_shift``, ``m = output_scale / 2^output_right_shift`` (all exact in float32)."""
    return (2.0 ** (rq.x_shift - rq.accu_right_shift), rq.e_scale * 2.0 ** -rq.accu_right_shift,
            rq.output_scale * 2.0 ** -rq.output_right_shift)


def reference(x0: np.ndarray, x1: np.ndarray, rq: AddRequant, qmax: int) -> np.ndarray:
    """The kernel in numpy integers (for tests): inputs in the node's order, int64."""
    a, b = (x0, x1) if rq.first == 0 else (x1, x0)
    t = (a.astype(np.int64) * 2 ** rq.x_shift + b.astype(np.int64) * rq.e_scale) >> rq.accu_right_shift
    y = (t * rq.output_scale + (1 << (rq.output_right_shift - 1))) >> rq.output_right_shift
    out: np.ndarray = np.clip(y, -qmax - 1, qmax)
    return out
