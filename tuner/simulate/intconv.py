"""hb's integer Conv kernel: how a BPU Conv's int32 accumulator becomes its int8 / int16 output.

The real quantized model (``HzSQuantizedConv``, every tensor read back as an extra output with hmct's
executor) computes, per output channel::

    y = clip(floor(floor((acc + B) / 2^rs) * M / 2^os), lo, qmax)

``acc`` the sum of input x weight integers, ``B`` the int32 bias, ``lo`` 0 with a fused Relu (else
-qmax - 1). The integers are pure functions of the input, weight and output steps ``s_in``, ``s_w[c]``,
``s_out``, with ``r = s_in s_w / s_out``:

* ``n = rs + os = floor(log2(2^15 / r))``, ``M = rint(r 2^n)`` (in [2^14, 2^15));
* ``os`` 22 for an int8 output (23 where ``M > 32512``), 14 for an int16 one, ``rs = n - os`` (0 at least:
  ``os = n`` when ``n`` is smaller). This split is for an int8 input; Convs reading int16 split otherwise
  (``rs`` 8 with ``os`` 15 to 18 on segdepth's stem) and are not simulated;
* ``B = rint(b / (s_in s_w)) + H``, ``H = rint(s_out / (2 s_in s_w))``: half an output step sits in the
  bias, so the two floors round half up, except that the first drops ``(acc + B) mod 2^rs`` (up to
  ``2^rs - 1`` accumulator units: the output is one step below the rounded value where the float
  value's fraction lies within that loss of the half);
* a fused residual Add (``use_sumin``) adds its integers times ``e_scale / 2^sh`` (``e_shift = -sh``;
  ``e_scale = rint(2^sh s_res / (s_in s_w))`` in [2^14, 2^15)) to ``acc + B`` before the first floor.

Measured (scratch experiment ``exp-intconv``; toy of opset 11, max, converted at O0: a Conv with bias, Conv +
Relu, depthwise, Conv + residual Add, int16 output without bias, whose ``B`` is ``H`` alone, a Conv reading
int16): 0 of 16384 outputs differ on each of the seven Convs over 4 samples; a rounding pre-shift misses 14
to 52 per Conv, a rounding final shift 4051 to 8292. ``M``, ``rs``, ``os`` and ``H`` from the calibrated
model's thresholds equal hb's on all 112 toy channels but 4 ``H`` (the int16-reading Conv, ``b / (s_in s_w)``
near 5e5); on PP-OCRv4 max's 10352 channels but 14 whose weights are ~0 (hb writes ``M`` 16384, ``rs`` 15
there: :attr:`Requant.kept`) and 7 ``M``, 1 ``os``, 3 ``H``; on the classifier's 3148 but 5 ``M`` and 1 ``H``.
Over every HzSQuantizedConv of the fidelity suite's real models (~0-weight channels aside) the ``rs``/``os``
split holds on 163642 of 163645 int8-output and 1178 of 1178 int16-output channels, Convs with ``rs`` >= 8
throughout (the int16-reading ones) set apart: the rule misses 1502 of their 14585.

Simulated where :func:`enabled` (build_sim_model's ``int_conv``): the float Conv reads its inputs and
weights on their grids and its bias on ``s_in s_w``, so ``y / (s_in s_w)`` is ``acc + rint(b / (s_in s_w))``
up to float32 error, well below one unit; :func:`emulation` gives ``a``, ``c``, ``m`` with
``v = floor(floor(y a + c) m)``, and ``v s_out`` goes into the output's quantization point, which clips.
On PP-OCR's classifier (max, 2 strips) every int8 tensor then equals hb's up to its 45th node (HardSigmoid@3,
whose table differs in 1 of 88 values; before: 93 of 18432 differ at the second Conv already), and 3.29M
against 4.98M values of PP-OCRv4's 149 int8/int16 tensors differ on a photo.

Why it is off by default: on the fidelity suite the outputs' real - sim cosine does not improve overall
(PP-OCRv4 max +0.0017 -> -0.0007 and rgb -0.0046 -> -0.0036, but the classifier's seven configurations
mean |gap| 0.0018 -> 0.0028, nv12 max +0.0004 -> +0.0015, PP-OCRv4 int16_2convs +0.0011 -> +0.0045, its
order check 1.000 -> 0.818): with the Convs exact, the remaining kernels (tables, int16 Convs, the lowered
Mul, Resize, ConvTranspose) no longer cancel. The trial cost: six element-wise ops per Conv output
(segdepth, benchmarks/trial_cost.py: evaluate / float pass in CPU time 1.27x -> 1.47x and 1.54x in two runs).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

#: out_shift of an int8 / int16 output, and the multiplier above which an int8 output shifts one more.
OUT_SHIFT = {"int8": 22, "int16": 14}
M_HIGH = 32512
RS_MAX = 16


def enabled() -> bool:
    """``TUNER_INTCONV=1``: simulate the kernel (off by default; the module docstring says why)."""
    return os.environ.get("TUNER_INTCONV", "0").strip().lower() in ("1", "yes", "true", "on")


@dataclass(frozen=True)
class Requant:
    """The integers of one Conv's requantization, per output channel (see the module docstring)."""

    multiplier: np.ndarray    # M
    right_shift: np.ndarray   # rs
    out_shift: np.ndarray     # os
    half: np.ndarray          # H, the half output step hb adds to the bias
    kept: np.ndarray          # channels the rule covers (not those whose rs would pass RS_MAX: ~0 weights)


def requant(s_in: float, s_w: np.ndarray, s_out: float, out_dtype: str) -> Requant:
    """hb's (M, rs, os, H) for a Conv whose int8 input / weights / output are on ``s_in`` / ``s_w`` / ``s_out``."""
    acc_unit = np.float64(s_in) * np.asarray(s_w, np.float64)
    live = acc_unit > 0
    r = np.where(live, acc_unit, 1.0) / np.float64(s_out)
    n = np.floor(np.log2(2.0 ** 15 / r)).astype(np.int64)
    m = np.rint(r * np.exp2(n)).astype(np.int64)
    top = m >= 2 ** 15                     # rint up to 2^15: one shift less
    n, m = np.where(top, n - 1, n), np.where(top, m // 2, m)
    os_cap = np.full(n.shape, OUT_SHIFT[out_dtype], np.int64)
    if out_dtype == "int8":
        os_cap = np.where(m > M_HIGH, os_cap + 1, os_cap)
    kept = (n - os_cap <= RS_MAX) & live
    rs = np.clip(n - os_cap, 0, RS_MAX)
    half = np.rint(0.5 / r).astype(np.int64)
    return Requant(m, rs, n - rs, half, kept)


def emulation(rq: Requant, acc_unit: np.ndarray, s_out: float,
              s_res: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, c, m) with ``floor(floor(y a + c) m)`` hb's output integer for the float Conv output y
    (``acc_unit`` = s_in s_w): ``a = 1 / (acc_unit 2^rs)``, ``c = (H + 1/2) / 2^rs``, ``m = M / 2^os`` (exact
    in float32: M has 15 bits). A channel the rule does not cover is rounded half up: ``a = 1 / s_out``,
    ``c = 1/2``, ``m = 1``.

    ``s_res``: a fused residual Add's input step. y is then the Add's output, its residual read times
    :func:`residual_gain`, and ``y / acc_unit`` not an integer but a multiple of ``2^-sh``: ``c`` takes half
    of ``2^-sh`` in place of 1/2."""
    shift = np.exp2(-rq.right_shift.astype(np.float64))
    unit = np.where(rq.kept, np.asarray(acc_unit, np.float64), 1.0)
    guard = np.full(unit.shape, 0.5)
    if s_res is not None:
        guard = np.exp2(-np.maximum(residual_shift(unit, s_res)[1], 0).astype(np.float64) - 1.0)
    a = np.where(rq.kept, shift / unit, 1.0 / s_out)
    c = np.where(rq.kept, (rq.half.astype(np.float64) + guard) * shift, 0.5)
    m = np.where(rq.kept, rq.multiplier.astype(np.float64) * np.exp2(-rq.out_shift.astype(np.float64)), 1.0)
    return a, c, m


def residual_shift(acc_unit: np.ndarray, s_res: float) -> tuple[np.ndarray, np.ndarray]:
    """(e_scale, sh) of a fused residual Add: the residual's step in accumulator units, ``s_res / acc_unit``,
    as ``e_scale / 2^sh`` with ``e_scale`` in [2^14, 2^15) (hb writes ``e_shift = -sh``)."""
    ratio = np.float64(s_res) / np.asarray(acc_unit, np.float64)
    sh = np.floor(np.log2(2.0 ** 15 / ratio)).astype(np.int64)
    return np.rint(ratio * np.exp2(sh)).astype(np.int64), sh


def residual_gain(acc_unit: np.ndarray, s_res: float) -> np.ndarray:
    """What the simulation multiplies the dequantized residual by so that the Add's float output over
    ``acc_unit`` is ``acc + B + s e_scale / 2^sh`` (s the residual's integer), as hb adds it."""
    e_scale, sh = residual_shift(acc_unit, s_res)
    gain: np.ndarray = e_scale * np.exp2(-sh.astype(np.float64)) * np.asarray(acc_unit, np.float64) / np.float64(s_res)
    return gain


def reference(acc_plus_bias: np.ndarray, rq: Requant, qmax: int, relu: bool) -> np.ndarray:
    """hb's integer output for ``acc + rint(b / (s_in s_w))`` (int64, channels on axis 1): the rule in
    numpy integers, for tests."""
    shape = (1, -1) + (1,) * (acc_plus_bias.ndim - 2)
    t = (acc_plus_bias + rq.half.reshape(shape)) >> rq.right_shift.reshape(shape)
    v = (t * rq.multiplier.reshape(shape)) >> rq.out_shift.reshape(shape)
    out: np.ndarray = np.clip(v, 0 if relu else -qmax - 1, qmax)
    return out
