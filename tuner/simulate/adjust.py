"""hb's ``AdjustConvQuantParams`` on a per-channel (equalized) Conv output: the int16 node it inserts
dequantizes with the int8 node's scale, and the tensor reaches its reader multiplied by up to ~258.

What hmct does (``hmct/quantizer/calibrater/post/adjust_conv_quant_params.py``, run after
``ActivationEqualization`` on bayes-e; in our words): for every Conv in hb's graph (a Conv, a lowered
Mul ``UNIT_WEIGHT_FOR_<mul>``) whose input calibration is int16, it computes per output channel
``max(w_c x in_thr, T_c)`` (``w_c`` the weight threshold of channel c, ``in_thr`` the largest input
threshold, ``T_c`` the output calibration's threshold of channel c); if any channel changed, it inserts a
new calibration node in front of the output calibration, a copy of that node's attributes with qtype
int16 and those thresholds. On a per-tensor output this is a harmless int16 rounding
(docs/hb_rules/placement.md 3c). On a tensor hb quantizes per channel and a Conv reads equalized, the
output calibration carries ``dequantize_scale`` = T / qmax (its own qtype's qmax), and so does the copy:
the copy quantizes channel c at ``thr_c / 32767`` and dequantizes at ``T / qmax``, i.e. multiplies the
tensor by ``gain_c = (T / qmax) x 32767 / thr_c``; the reader's node then quantizes that at its own
``T_c`` and saturates.

Measured (docs/hb_rules/calibration.md section 5, "int16 into a per-channel tensor"): PP-OCRv4's detector
with int16 on ``p2o.Mul.8`` (the HardSwish before the lowered ``p2o.Mul.10``, whose output
``p2o.Add.15`` is per channel, read by the depthwise ``p2o.Conv.3``): calibrated model output cosine
0.0053, quantized 0.0049 (8 images, O0), the copy's thresholds 43.89 (= 0.633 x 69.35) and its
``dequantize_scale`` 0.3622 (= 46.0 / 127): gain 270; a helper-API toy (Conv -> Sigmoid int16 out ->
Mul by 8 channel constants -> depthwise Conv -> Relu -> Conv): 0.4287 (int8 reader) and 0.5063 (int16
reader, gain up to 2 = the channel scale, then clipped), 0.9998 without the int16 entry or without
per_channel.
"""

from __future__ import annotations

import numpy as np

#: The inserted node's grid (hmct sets its qtype to int16 whatever the output's).
QMAX16 = 32767
#: Relative margin under which ``w_c x in_thr`` counts as equal to ``T_c`` (hmct compares float32
#: attributes; tuner's thresholds are float64 recomputations of them).
SAME = 1e-6


def adjustment(w_thr: np.ndarray, in_thr: float, out_thr: np.ndarray, dequantize_scale: float
               ) -> tuple[np.ndarray, np.ndarray] | None:
    """(thresholds of the inserted int16 node, the gain it leaves on each channel) for a Conv with an
    int16 input of largest threshold ``in_thr``, output channel weight thresholds ``w_thr`` and an
    equalized per-channel output calibration with thresholds ``out_thr`` and ``dequantize_scale``; None
    when hmct inserts nothing (no channel's ``w_c x in_thr`` above its ``T_c``)."""
    out_thr = np.asarray(out_thr, np.float64).ravel()
    w = np.broadcast_to(np.asarray(w_thr, np.float64).ravel(), out_thr.shape)
    want = w * float(in_thr)
    if not np.any(want > out_thr * (1 + SAME)):
        return None
    thr = np.maximum(want, out_thr)
    gain = float(dequantize_scale) * QMAX16 / np.where(thr > 0, thr, 1.0)
    return thr, gain
