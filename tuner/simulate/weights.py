"""The weights of the simulated model: hb_mapper's int8 per-channel weight quantization and its variants.

Weights do not depend on the candidate's calibration, except where hb_mapper scales them (activation
equalization of a per-channel input) or a calibrated model of hb_mapper's gives its own thresholds or
values: :class:`WeightCache` keeps the plain ones once per model; :func:`weight_rule` picks, for one
weighted node of a build, which of hb_mapper's rules applies (each a function below, with its reason).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from tuner.graph import Node
from tuner.simulate.scales import Scale, Scales


def fake_quant_weight(w: np.ndarray, axis: int, thresholds: np.ndarray | None = None) -> np.ndarray:
    """Symmetric int8 per-channel fake quantization along ``axis`` (scale = max|w_c| / 127, or
    ``thresholds[c]`` / 127 when given: hb_mapper's own weight thresholds)."""
    axis = axis % w.ndim
    reduce_axes = tuple(i for i in range(w.ndim) if i != axis)
    if thresholds is not None:
        shape = [1] * w.ndim
        shape[axis] = w.shape[axis]
        amax = np.asarray(thresholds, np.float64).reshape(shape)
    else:
        amax = np.abs(w).max(axis=reduce_axes, keepdims=True) if reduce_axes else np.abs(w)
    scale = np.where(amax > 0, amax / 127.0, 1.0)
    return (np.clip(np.round(w / scale), -127, 127) * scale).astype(w.dtype)


def weight_axis(node: onnx.NodeProto, op_type: str, default_axis: int) -> int:
    if op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    return default_axis


def weight_scales(w: np.ndarray, axis: int) -> np.ndarray:
    """Per-channel int8 weight scales along ``axis`` (1-D)."""
    axis = axis % w.ndim
    amax = np.abs(np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)).max(axis=1)
    return np.where(amax > 0, amax / 127.0, 1.0)


def input_channel_of(w_shape: tuple[int, ...], group: int) -> np.ndarray:
    """For a Conv weight [Cout, Cin/g, ...], the input channel each (o, j) reads: (o // (Cout/g)) * Cin/g + j."""
    cout, cin_g = w_shape[0], w_shape[1]
    per_group = max(1, cout // max(1, group))
    o = np.arange(cout)[:, None]
    j = np.arange(cin_g)[None, :]
    return (o // per_group) * cin_g + j


def equalized_weight(w: np.ndarray, ratio: np.ndarray, group: int,
                     thresholds: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """hb_mapper's activation equalization of a Conv whose input has channel scales s_c.

    ``ActivationEqualization`` (docs/hb_rules/quantizer.md §1.5, src 24558990649 / 24271918369) multiplies the
    Conv weight along its input-channel axis by ``ratio_c = s_c / max(s)``, quantizes the input with
    the channel scales and dequantizes it with ``max(s)``; the weights are calibrated afterwards, on the
    scaled weights (per output channel). Returns (the weight the float Conv must use so that it
    computes exactly that with a per-channel fake-quantized input: ``fq(W * ratio) / ratio``, the
    int8 weight scales of ``W * ratio``). ``thresholds``: hb_mapper's own thresholds of the scaled
    weight, per output channel, instead of max |W * ratio|.
    """
    r = ratio[input_channel_of(w.shape, group)].reshape(w.shape[:2] + (1,) * (w.ndim - 2)).astype(np.float64)
    scaled = w.astype(np.float64) * r
    fq = fake_quant_weight(scaled, 0, thresholds)
    scales = weight_scales(scaled, 0) if thresholds is None else np.where(thresholds > 0, thresholds / 127.0, 1.0)
    return (fq / r).astype(w.dtype), scales


def grouped_deconv_weight(w: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """A grouped ConvTranspose weight [Cin, Cout/g, k...], int8 per output channel as hb_mapper
    calibrates it: reshaped to (g, Cin/g, Cout/g, k...) first, so each of the g * Cout/g output
    channels has its own threshold (docs/hb_rules/quantizer.md §1.7, src 25011497354), not one per Cout/g
    column shared by every group. Returns (fake-quantized weight, scales in output-channel order)."""
    cin, cout_g = w.shape[:2]
    v = w.reshape((group, cin // group, cout_g) + w.shape[2:])
    reduce_axes = (1,) + tuple(range(3, v.ndim))
    amax = np.abs(v).max(axis=reduce_axes, keepdims=True)
    scale = np.where(amax > 0, amax / 127.0, 1.0)
    fq = (np.clip(np.round(v / scale), -127, 127) * scale).astype(w.dtype).reshape(w.shape)
    return fq, scale.reshape(-1)


def deconv_group(node: Node) -> int:
    """The group of a ConvTranspose (1 for every other op)."""
    return int(node.attr("group", 1)) if node.op_type == "ConvTranspose" else 1


class WeightCache:
    """Fake-quantized weights and their scales, computed once per model (they do not depend on
    calibration)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int, int], tuple[onnx.TensorProto, np.ndarray]] = {}  # (name, axis, deconv group)

    def get(self, init: onnx.TensorProto, axis: int, deconv_group: int = 1) -> onnx.TensorProto:
        return self._entry(init, axis, deconv_group)[0]

    def scales(self, init: onnx.TensorProto, axis: int, deconv_group: int = 1) -> np.ndarray:
        return self._entry(init, axis, deconv_group)[1]

    def _entry(self, init: onnx.TensorProto, axis: int, deconv_group: int) -> tuple[onnx.TensorProto, np.ndarray]:
        key = (init.name, axis, deconv_group)
        if key not in self._cache:
            w = numpy_helper.to_array(init)
            if deconv_group > 1:
                fq, sc = grouped_deconv_weight(w, deconv_group)
                t = numpy_helper.from_array(fq, name=f"{init.name}__w8g{deconv_group}")
            else:
                t = numpy_helper.from_array(fake_quant_weight(w, axis), name=f"{init.name}__w8pc{axis}")
                sc = weight_scales(w, axis)
            self._cache[key] = (t, sc)
        return self._cache[key]


class ExternalWeights:
    """Large initializers handed to onnxruntime once, as OrtValues, instead of being copied into
    and serialized with every candidate's graph (4.7 MB a candidate on PP-OCR's detector).

    The graph keeps a stub (``data_location: EXTERNAL``); :func:`tuner.runtime.session.make_session`
    passes the values with ``SessionOptions.add_external_initializers``.
    """

    MIN_BYTES = 4096

    def __init__(self) -> None:
        self.values: dict[str, object] = {}
        self._arrays: dict[str, np.ndarray] = {}   # the OrtValues borrow these buffers
        self._stubs: dict[str, onnx.TensorProto] = {}

    def stub(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        """For tensors whose value never changes under a name (the model's, fake-quantized weights)."""
        if tensor.name not in self._stubs:
            self._stubs[tensor.name] = self._make(tensor)
        return self._stubs[tensor.name]

    def _make(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            return tensor
        arr = numpy_helper.to_array(tensor)
        if arr.nbytes < self.MIN_BYTES or arr.dtype == object:
            return tensor
        arr = np.ascontiguousarray(arr)
        self._arrays[tensor.name] = arr
        self.values[tensor.name] = ort.OrtValue.ortvalue_from_numpy(arr)
        stub = onnx.TensorProto()
        stub.name, stub.data_type = tensor.name, tensor.data_type
        stub.dims.extend(tensor.dims)
        stub.data_location = onnx.TensorProto.EXTERNAL
        entry = stub.external_data.add()
        entry.key, entry.value = "location", "tuner-ortvalue"
        return stub


def quantize_bias(bias: np.ndarray, input_scale: float, w_scales: np.ndarray) -> np.ndarray:
    """int32 bias with scale input_scale * weight_scale[c], as the BPU (and onnxruntime's QDQ) keep it."""
    s = (input_scale * w_scales).astype(np.float64)
    return (np.round(bias.astype(np.float64) / s) * s).astype(bias.dtype)


@dataclass(frozen=True)
class QuantWeight:
    """The weight one node of a simulated model reads: its fake-quantized tensor, the int8 scales of its
    output channels and the input scale its int32 bias is on (None: its input is not quantized)."""

    tensor: onnx.TensorProto
    scales: np.ndarray
    in_scale: float | None


def hb_folded_weight(w_init: onnx.TensorProto, w_val: np.ndarray, s_in: Scale | None, scales: np.ndarray,
                     memo: dict[Any, Any]) -> QuantWeight:
    """hb_mapper's own quantized weight, where its calibrated model gives one (folded BN undone:
    tuner.inputs.calibrated_map._unfolded): the simulation then computes with exactly hb's integers. The
    scales stay those of max calibration (only the bias grid reads them)."""
    digest = hashlib.sha256(w_val.tobytes()).hexdigest()[:12]
    key = ("wfold", w_init.name, digest)
    if key not in memo:
        memo[key] = numpy_helper.from_array(w_val, name=f"{w_init.name}__w8fold{digest}")
    return QuantWeight(memo[key], scales, float(s_in.scale) if s_in is not None else None)


def hb_equalized_weight(w_init: onnx.TensorProto, s_in: Scale, group: int, w_thr: np.ndarray | None,
                        memo: dict[Any, Any]) -> QuantWeight:
    """A Conv whose input is quantized per channel: hb_mapper deploys that input by activation
    equalization (:func:`equalized_weight`), so the weight is scaled by the channel ratios before it
    is quantized, and the input (and the bias) are dequantized with the largest channel scale."""
    ratio = np.asarray(s_in.scale, np.float64) / s_in.dequantize_scale
    thr_bytes = w_thr.tobytes() if w_thr is not None else b""
    key = ("eq", w_init.name, group, ratio.tobytes(), thr_bytes)
    if key not in memo:
        w_eq, w_scales = equalized_weight(numpy_helper.to_array(w_init), ratio, group, w_thr)
        digest = hashlib.sha256(ratio.tobytes() + thr_bytes).hexdigest()[:12]
        memo[key] = (numpy_helper.from_array(w_eq, name=f"{w_init.name}__w8eq{digest}"), w_scales)
    tensor, w_scales = memo[key]
    return QuantWeight(tensor, w_scales, s_in.dequantize_scale)


def hb_threshold_weight(w_init: onnx.TensorProto, w_axis: int, w_thr: np.ndarray, s_in: Scale | None,
                        memo: dict[Any, Any]) -> QuantWeight:
    """hb_mapper's own per-channel weight thresholds (tuner.simulate.realscales) instead of max |w|:
    its calibrated model records them, and they differ from max where hb clips a weight channel."""
    key = ("wreal", w_init.name, w_axis, w_thr.tobytes())
    if key not in memo:
        w = numpy_helper.to_array(w_init)
        digest = hashlib.sha256(w_thr.tobytes()).hexdigest()[:12]
        memo[key] = (numpy_helper.from_array(fake_quant_weight(w, w_axis, w_thr), name=f"{w_init.name}__w8hb{digest}"),
                     np.where(w_thr > 0, w_thr / 127.0, 1.0))
    tensor, w_scales = memo[key]
    return QuantWeight(tensor, w_scales, float(s_in.scale) if s_in is not None else None)


def max_weight(w_init: onnx.TensorProto, w_axis: int, group: int, s_in: Scale | None,
               weights: WeightCache) -> QuantWeight:
    """The default: int8 per output channel at max |w| (a grouped ConvTranspose per group and
    output channel), computed once per model (:class:`WeightCache`)."""
    return QuantWeight(weights.get(w_init, w_axis, group), weights.scales(w_init, w_axis, group),
                       float(s_in.scale) if s_in is not None else None)


def weight_rule(node: Node, w_init: onnx.TensorProto, w_axis: int, s_in: Scale | None, scales: Scales,
                weights: WeightCache, memo: dict[Any, Any]) -> QuantWeight:
    """The weight ``node`` reads in the simulated model, by the first of hb_mapper's rules that applies:
    its own folded weight values, equalization of a per-channel input, its own weight thresholds, max.
    ``s_in``: the scale the node's input is quantized with (None: not quantized)."""
    real_w = getattr(scales, "weight_thresholds", None)
    w_thr = real_w(node.name) if real_w is not None else None
    if w_thr is not None and w_thr.size != tuple(w_init.dims)[w_axis % len(w_init.dims)]:
        w_thr = None
    real_v = getattr(scales, "weight_values", None)
    w_val = real_v(node.name) if real_v is not None else None
    if w_val is not None and tuple(w_val.shape) == tuple(w_init.dims) and (s_in is None or s_in.axis is None):
        return hb_folded_weight(w_init, w_val, s_in, weights.scales(w_init, w_axis, deconv_group(node)), memo)
    if s_in is not None and s_in.axis is not None:
        return hb_equalized_weight(w_init, s_in, int(node.attr("group", 1)), w_thr, memo)
    if w_thr is not None:
        return hb_threshold_weight(w_init, w_axis, w_thr, s_in, memo)
    return max_weight(w_init, w_axis, deconv_group(node), s_in, weights)
