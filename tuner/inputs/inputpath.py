"""The camera input path hb_mapper builds for an image input, simulated on the data side.

For an image input (``input_type_rt`` nv12 / yuv444 / rgb / bgr / gray) hb_mapper puts a
``HZ_PREPROCESS_FOR_<input>`` node in front of the network (docs/hb_rules/input.md, measured on toys
at O0 with hmct 1.1.0). Its input is the runtime colour format minus 128, as int8; it computes, per
output channel (the training colour order), ``W[o] . v + b[o]`` where ``W`` folds the runtime ->
training colour matrix and ``scale_value``, and ``b`` folds the 128 offsets and ``mean_value``. The
quantized model runs ``W`` as int8, one threshold per output row (``max |W[o]|``), and quantizes the
result like any activation (its threshold calibrated as the model input's would be).

So the whole path is a pure function of one sample, and tuner applies it when reading the samples
(:class:`tuner.inputs.data.DataSet`): the simulated network (its first tensor quantized as usual) sees
what the BPU's first layer sees; the model side does not change.

* :func:`runtime_values` -- a training-format sample (0..255, ``input_type_train`` order and layout)
  as hb's calibration loader gives it to the model, minus 128: for nv12 BT.601 full range (the coefficients of
  horizon_tc_ui/data/transformer.py), truncated to uint8 as hb's ``RGB2NV12Transformer`` does,
  chroma kept at the top-left pixel of every 2x2 block and repeated back (its
  ``NV12ToYUV444Transformer``, nearest); for rgb <-> bgr the channels swapped.
* :class:`InputPath` -- the preprocess node: ``W`` and ``b`` exactly as hb writes them into
  ``*_original_float_model.onnx`` (measured: nv12 from rgb with mean/scale gives
  ``W[R] = scale_R * (1, 0, 1.4017)``, ``b[R] = scale_R * (128 - mean_R)``), ``W`` int8-quantized per row
  as in ``*_quantized_model.onnx`` (nv12 rgb: rows (91, 0, 127), (127, -44, -91), (72, 127, 0)).

hb calibrates the preprocess output with the float ``W`` (the toy's max threshold 3.98759 equals the
float path's max to 6 digits; with the int8 ``W`` it would be 3.99243, +0.12 %), and its calibrated and
quantized models run the int8 ``W`` (the calibrated model's preprocess output equals :class:`InputPath`'s
with the float ``b`` to 4e-7 on PP-OCRv4's detector); the quantized model also rounds ``b`` to whole
weight steps, the calibrated one does not: tuner's statistics read the samples with the float ``W`` and ``b``
(:meth:`tuner.inputs.data.DataSet.for_calibration`), its evaluation with the int8 ``W`` and the bias in
whole weight steps, as the quantized model adds it (:attr:`InputPath.bias_int`), and requantizes the sum with
its own integer multiplier and shifts (:meth:`InputPath.requantize`, applied by the simulator at each trial's
input threshold: tuner.simulate.simdata.SimData.board_samples).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

#: Part of the data fingerprint (tuner.inputs.data): a change of the arithmetic below invalidates
#: statistics cached on the old one.
PATH_FORMAT = 4

#: YUV -> RGB the preprocess node applies to (Y - 128, U - 128, V - 128), rows R, G, B, and the constant
#: term, read back from ``HZ_PREPROCESS_FOR_data_weight`` / ``_bias`` of toys converted with
#: ``norm_type: data_mean`` (regular) and data_mean_and_scale with ``bt601_video`` (divided by the scale).
YUV2RGB_FULL = np.array([[1.0, 0.0, 1.4017], [1.0, -0.3437, -0.7142], [1.0, 1.7722, 0.0]])
YUV2RGB_VIDEO = np.array([[1.164, 0.0, 1.596], [1.164, -0.391, -0.813], [1.164, 2.018, 0.0]])
#: The YUV formats' own offsets (Y, U, V): R = A . (YUV - offsets); the preprocess node's constant is
#: A . (128, 128, 128) - A . offsets (128, and 1.164 x 112 for video range).
YUV_OFFSETS_FULL = np.array([0.0, 128.0, 128.0])
YUV_OFFSETS_VIDEO = np.array([16.0, 128.0, 128.0])

#: (input_type_train, input_type_rt) pairs hb_mapper converts (horizon_tc_ui/helper.py's
#: get_raw_transformer; any other pair it only shifts by -128, with a warning).
PAIRS = {(t, r) for t in ("rgb", "bgr") for r in ("nv12", "yuv444", "rgb", "bgr")} | {
    ("yuv444", "yuv444"), ("yuv444", "nv12"), ("gray", "gray")}

SWAP = np.array([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])   # RGB <-> BGR


def round_half_away(x: np.ndarray) -> np.ndarray:
    """Round to the nearest integer, ties away from zero (190.5 -> 191, -63.5 -> -64): how hb rounds the
    preprocess bias to weight steps (:attr:`InputPath.bias_int`)."""
    x = np.asarray(x, dtype=np.float64)
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def _channels_first(x: np.ndarray, axis: int) -> np.ndarray:
    return np.moveaxis(np.asarray(x, dtype=np.float64), axis, 1)


def _to_uint8(x: np.ndarray) -> np.ndarray:
    """numpy's ``astype(np.uint8)`` of values in 0..255.5 (truncation), as hb's RGB2NV12Transformer writes NV12."""
    return np.clip(np.trunc(x), 0.0, 255.0)


def _subsample_420(c: np.ndarray) -> np.ndarray:
    """4:2:0 chroma of a (..., H, W) plane: the top-left pixel of every 2x2 block, repeated back (nearest)."""
    h, w = c.shape[-2:]
    small = c[..., ::2, ::2]
    return np.repeat(np.repeat(small, 2, axis=-2), 2, axis=-1)[..., :h, :w]


@dataclass(frozen=True)
class InputPath:
    """The preprocess node of one image input: ``W`` (out x in) and ``b`` as hb_mapper builds them.

    ``type_train`` / ``type_rt`` / ``video`` name the colour conversion; ``channel_axis`` is the
    training layout's (1 for NCHW, 3 for NHWC)."""

    type_train: str
    type_rt: str
    video: bool
    channel_axis: int
    weight: np.ndarray        # float, (C_train, C_rt): scale folded in
    bias: np.ndarray          # float, (C_train,)

    @cached_property
    def _weight_steps(self) -> np.ndarray:
        """The int8 weight step of each output row, ``max |W[o]| / 127`` (1 for an all-zero row)."""
        t = np.abs(self.weight).max(axis=1)
        return np.where(t > 0, t / 127.0, 1.0)

    @cached_property
    def weight_int8(self) -> np.ndarray:
        """``W`` as the quantized model holds it: int8 per output row, threshold ``max |row|``."""
        step = self._weight_steps[:, None]
        return np.clip(np.rint(self.weight / step), -127, 127) * step

    @cached_property
    def bias_int(self) -> np.ndarray:
        """``b`` as the quantized model adds it: a whole number of weight steps, ties away from zero.

        ``HzSQuantizedPreprocess`` computes ``clip((W_int8 . x + B + H) * M >> n)``: ``B`` = ``b`` in
        weight steps rounded half away from zero, ``H`` = half an output step in weight steps rounded on
        its own, ``M / 2^n`` = weight step / output step with ``M`` in [2^14, 2^15). Read back from the nine
        conversions in the test cache (camera toy, PP-OCRv4 nv12 / rgb / bgr) and exact on every int8 input
        (PP-OCRv4 rgb: all 256 values; nv12: 245760 random pixels). Toy rgb -> rgb, scale 127/128
        (weight step 1/128), means 126.5 / 128.5 / 127.5: ``b / step`` = 190.5 / -63.5 / 63.5, ``H`` 64.25
        -> 64, stored 255 / 0 / 128 (half to even would give 254, half up 1, one rounding of the sum 1 / 127).

        ``B`` is a property of the YAML; ``H`` and ``M / 2^n`` depend on the output threshold (each trial's
        calibration): :meth:`requantize` applies them to these values, once per threshold. PP-OCRv4 through rgb (mean 127.5,
        scale 1/127.5): ``b / step`` = 63.5 -> 64, so the pixel value 128 (input 0) comes out as one output
        step where the calibrated model (float ``b``) gives 0; feeding the real quantized model input -1
        there instead (which it maps to 0) takes its output cosine from 0.9722 to 0.9750 (calibrated
        0.9785). Over 200 thresholds (0.7..1 x the max) the float ``b`` misses the real integer on 1699
        (nv12) / 3848 (rgb) per million values and ``B`` on 1235 / 1935; at a given threshold ``H``'s
        rounding may undo it (PP-OCRv4 nv12 max: 767 -> 999 of 737280)."""
        step = self._weight_steps
        return round_half_away(self.bias / step) * step

    def requant_params(self, threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(H, M, n)`` per output row: how ``HzSQuantizedPreprocess`` requantizes ``W_int8 . x + B`` (in
        weight steps) to the int8 grid of output ``threshold``, ``clip((acc + H) * M >> n, -128, 127)``.

        ``H`` = half an output step in weight steps, rounded on its own; ``M / 2^n`` = weight step / output
        step with ``M`` rounded to an integer in [2^14, 2^15). Equal to hb's ``bias`` - ``B``, ``scale`` and
        ``out_shift`` attributes on all nine conversions of the test cache (camera toy nv12 rgb/bgr, rgb
        -> rgb, the ties toy, PP-OCRv4 nv12 max / default / per_channel, rgb, bgr)."""
        ratio = self._weight_steps / (float(threshold) / 127.0)
        shift = np.floor(np.log2(2.0 ** 15 / ratio)).astype(np.int64)
        mult = np.rint(ratio * 2.0 ** shift).astype(np.int64)
        half = np.rint(0.5 / ratio).astype(np.int64)
        return half, mult, shift

    def requantize(self, y: np.ndarray, threshold: float, scale: np.floating) -> np.ndarray:
        """:meth:`__call__`'s output ``y`` (int8 ``W``, integer bias) as the quantized model's preprocess node
        emits it for output ``threshold``: its int8 values times ``scale`` (the simulator's float32 step of
        that tensor, so that its quantization point on the input leaves them as they are), float32.

        The simulator rounds ``y`` half to even at ``threshold / 127``; hb adds ``H`` and multiplies by
        ``M / 2^n``, both rounded (:meth:`requant_params`), and floors. Near a half step they part:
        PP-OCRv4 through nv12 (``max``, threshold 1.683) on 8 photos, hmct's executor with the preprocess
        output as an extra graph output: 8720 of 1966080 values differ by one step (6498 below, 2222
        above; all with the exact value within 0.0039 of a half step) and tuner's output cosine on the text
        photo is 0.9805 against the real 0.9836; fed hb's int8 values instead it is 0.9838. Through rgb and
        bgr (``acc`` = 127 x + 64) none of those 1966080 values differ. ``y`` holds whole weight
        steps to float32 precision (0.002 of a step at most), so they are recovered exactly."""
        half, mult, shift = self.requant_params(threshold)
        shape = (1, -1) + (1,) * (y.ndim - 2)
        c = np.moveaxis(np.asarray(y, np.float64), self.channel_axis, 1)
        acc = np.rint(c / self._weight_steps.reshape(shape)).astype(np.int64)
        q = np.clip(((acc + half.reshape(shape)) * mult.reshape(shape)) >> shift.reshape(shape), -128, 127)
        out = q.astype(np.float32) * np.float32(scale)
        return np.moveaxis(out, 1, self.channel_axis)

    def runtime_values(self, x: np.ndarray) -> np.ndarray:
        """The board's input for training-format sample ``x`` (channels first), minus 128."""
        return runtime_values(x, self.type_train, self.type_rt, self.video, self.channel_axis)

    def feed(self, x: np.ndarray) -> np.ndarray:
        """:meth:`runtime_values` in the training layout, float32: the calibrated model's input."""
        return np.moveaxis(self.runtime_values(x), 1, self.channel_axis).astype(np.float32)

    def __call__(self, x: np.ndarray, float_weights: bool = False) -> np.ndarray:
        """What the network's first layer sees for training-format sample ``x`` (float32, same layout):
        the int8 ``W`` and the integer bias of the quantized model; ``float_weights``: ``W`` and ``b`` in
        float, as hb's calibration pass computes it."""
        v = self.runtime_values(x)
        w, b = (self.weight, self.bias) if float_weights else (self.weight_int8, self.bias_int)
        y = np.einsum("oc,nc...->no...", w, v) + b.reshape((1, -1) + (1,) * (v.ndim - 2))
        return np.moveaxis(y, 1, self.channel_axis).astype(np.float32)


def runtime_values(x: np.ndarray, type_train: str, type_rt: str, video: bool, channel_axis: int) -> np.ndarray:
    """Training-format sample ``x`` (0..255) as hb_mapper's calibration loader turns it into the
    ``type_rt`` input, minus 128, channels first (float64): horizon_tc_ui/helper.py's
    get_raw_transformer, which its tools use to feed the models too. Only nv12 from rgb/bgr (regular
    range) goes through NV12 bytes (uint8, 4:2:0); yuv444 from rgb/bgr and nv12 ``bt601_video`` are
    converted in float at full resolution, yuv444 -> nv12 is only shifted. A board fed real NV12
    frames subsamples the chroma in those three cases too: not simulated (the thresholds would no
    longer be hb's: nv12 from yuv444 with 4:2:0 puts conv2's max 2 % off on the toy)."""
    c = _channels_first(x, channel_axis)
    if type_rt == type_train:
        return c - 128.0
    if type_train in ("rgb", "bgr") and type_rt in ("rgb", "bgr"):
        return c[:, ::-1] - 128.0
    if type_train in ("rgb", "bgr"):
        r, g, b = (c[:, 0], c[:, 1], c[:, 2]) if type_train == "rgb" else (c[:, 2], c[:, 1], c[:, 0])
        # term by term in float64, in hb's order: truncation is exact to the last bit (a grey pixel's Y
        # is 0.299 r + 0.587 r + 0.114 r, one ulp either side of r)
        if video:
            yuv = np.stack([0.257 * r + 0.504 * g + 0.098 * b + 16, -0.148 * r - 0.291 * g + 0.439 * b + 128,
                            0.439 * r - 0.368 * g - 0.071 * b + 128], axis=1)
        else:
            yuv = np.stack([0.299 * r + 0.587 * g + 0.114 * b, -0.169 * r - 0.331 * g + 0.5 * b + 128,
                            0.5 * r - 0.419 * g - 0.081 * b + 128], axis=1)
        if type_rt == "nv12" and not video:      # only this one goes through NV12 bytes
            yuv = _to_uint8(yuv)
            yuv = np.concatenate([yuv[:, :1], _subsample_420(yuv[:, 1:])], axis=1)
        return yuv - 128.0
    if type_train == "yuv444":                   # yuv444 -> nv12: shifted only, no 4:2:0
        return c - 128.0
    raise ValueError(f"no input path from input_type_train {type_train!r} to input_type_rt {type_rt!r}")


def _colour_matrix(type_train: str, type_rt: str, video: bool) -> tuple[np.ndarray, np.ndarray]:
    """(A, o): training colour = A . (runtime - 128) + A . (128, 128, 128) - A . o, rows in the training
    order; ``o`` the runtime format's own offsets (YUV: U and V centred on 128, video-range Y on 16)."""
    n = 1 if type_train == "gray" else 3
    if type_rt in ("nv12", "yuv444") and type_train in ("rgb", "bgr"):
        a, offsets = (YUV2RGB_VIDEO, YUV_OFFSETS_VIDEO) if video else (YUV2RGB_FULL, YUV_OFFSETS_FULL)
        return (a if type_train == "rgb" else a[::-1]), offsets
    if type_train in ("rgb", "bgr") and type_rt in ("rgb", "bgr") and type_rt != type_train:
        return SWAP, np.zeros(3)
    return np.eye(n), np.zeros(n)


def _constant(a: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The constant term of each row as hb computes it, in float32: ``A . (128, 128, 128) - A . o``, each dot
    product summed left to right (128 for rgb, bgr and gray; 128 to within float32 rounding from YUV).
    Bitwise hb's bias on the nv12 conversions of the test cache: PP-OCRv4 (BGR rows, mean 127.5, scale
    1/127.5) has the B row's constant 128 + 1.53e-5 and the G row's 128 - 7.6e-6, which puts the G row's
    bias at 63.499 weight steps (hb's integer bias 63) where the exact 128 gives 63.5 (64)."""
    a32 = a.astype(np.float32)
    def dot(v: np.ndarray) -> np.ndarray:
        acc = np.zeros(a32.shape[0], np.float32)
        for k in range(a32.shape[1]):
            acc = (acc + a32[:, k] * np.float32(v[k])).astype(np.float32)
        return acc
    return (dot(np.full(a32.shape[1], 128.0)) - dot(offsets)).astype(np.float32)


def input_path(type_train: str, type_rt: str | None, space_and_range: str | None, layout_train: str,
               shape: tuple[int, ...], mean: tuple[float, ...] | None,
               scale: tuple[float, ...] | None) -> InputPath | None:
    """The preprocess node hb_mapper inserts for this input, or None (featuremap, or not 4-D).

    Every image runtime type gets one, even rgb -> rgb with ``no_preprocess`` (``W = 1``, ``b = 128``:
    the int8 input plus 128), so the runtime's int8 input is always the colour value minus 128. ``W`` and
    ``b`` are computed in float32 as hb computes them, ``W = scale x A``, ``b = scale x (c - mean)`` with
    ``c`` from :func:`_constant`: bitwise equal to the ``HzPreprocess`` initializers of the seven distinct
    conversions in the test cache (camera toy nv12 rgb / bgr, rgb -> rgb, the ties toy; PP-OCRv4 nv12,
    rgb, bgr); the same products in float64 rounded once miss ``W`` by an ulp and ``b`` by up to 257 ulps
    (PP-OCRv4 nv12's B row, where ``c`` is not 128). The video-range constant follows the same rule,
    not read back bitwise."""
    if type_rt is None or (type_train, type_rt) not in PAIRS or len(shape) != 4:
        return None
    video = type_rt == "nv12" and space_and_range == "bt601_video"
    axis = 1 if layout_train == "NCHW" else 3
    a, offsets = _colour_matrix(type_train, type_rt, video)
    n = a.shape[0]
    if shape[axis] != n:
        return None
    m = np.zeros(n) if mean is None else np.broadcast_to(np.asarray(mean, np.float64), (n,))
    s = np.ones(n) if scale is None else np.broadcast_to(np.asarray(scale, np.float64), (n,))
    m32, s32 = m.astype(np.float32), s.astype(np.float32)
    weight = (s32[:, None] * a.astype(np.float32)).astype(np.float64)
    bias = (s32 * (_constant(a, offsets) - m32)).astype(np.float32).astype(np.float64)
    return InputPath(type_train=type_train, type_rt=type_rt, video=video, channel_axis=axis,
                     weight=weight, bias=bias)
