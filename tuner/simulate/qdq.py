"""Build the simulated quantized model of a plan: the float graph with quantization points inserted.

Each quantization point becomes QuantizeLinear -> DequantizeLinear (``com.microsoft``
domain, which takes int8 and int16 at any opset, per-tensor or per-channel), or, with
``fused=True``, one ``tuner.sim`` FakeQuant node computing the same values in one pass
(:mod:`tuner.runtime.fakequant`). BPU weights are replaced by their int8 per-channel
fake-quantized values. The graph is built in memory from cached scales (milliseconds);
onnxruntime then runs it.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from tuner.graph import Graph, Node, Target
from tuner.graph.optimize import HB_HARD_SIGMOID
from tuner.graph.softmax import softmax_parts
from tuner.runtime import fakequant
from tuner.simulate.perchannel import channel_scales, channel_top
from tuner.simulate.plan import Plan
from tuner.simulate.scales import PlanScales, Scale, Scales, channelwise

MS = "com.microsoft"
BIAS_OPS = ("Conv", "ConvTranspose", "Gemm")
#: Half an output step is rounded up by hb's HardSigmoid table, mostly: with its input fixed at 3.0 and its
#: output at 1.0 (an SE block's gate) every other entry of the int8 table is an exact half (x/2 + 63.5), and
#: PP-OCR's classifier's table (the same in its nine SE blocks) differs from float32 x/6 + 1/2 rounded half to
#: even in 57 of 256 entries (mean +0.21 steps), from the same with 3e-7 added in 13 (mean -0.05). 3e-7 is
#: 4e-5 of the int8 output step and 0.01 of the int16 one at threshold 1, far above float32's error at 1/2.
HALF_UP = 3e-7
#: The attributes of table ops whose BPU table computes another function than the node's float op
#: (tuner.graph.optimize.HB_HARD_SIGMOID: hb's HardSigmoid table is x/6 + 1/2 whatever the node's alpha and
#: beta). PP-OCR mobile v2.0's text-direction classifier has nine SE-block HardSigmoids with alpha 0.2: hb's
#: quantized model computes them with slope 1/6 and ends 0.03 below its calibrated model in output cosine
#: (0.9628 against 0.9930 under max on 112 strips); its calibrated model with alpha set to 1/6 agrees with the
#: quantized one to cosine 0.99999 at the logits (16 strips, every intermediate dequantized and compared).
HB_TABLES: dict[str, dict[str, float]] = {"HardSigmoid": {"alpha": HB_HARD_SIGMOID[0], "beta": HB_HARD_SIGMOID[1] + HALF_UP}}


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


def _node(op: str, inputs: list[str], output: str, name: str, axis: int | None) -> onnx.NodeProto:
    """A com.microsoft Q/DQ node (what helper.make_node makes, without its per-call overhead)."""
    node = onnx.NodeProto(op_type=op, domain=MS, name=name, input=inputs, output=[output])
    if axis is not None:
        node.attribute.append(helper.make_attribute("axis", axis))
    return node


_ZP_TYPES = {"b": "int8", "B": "uint8", "h": "int16"}


QuantPoint = tuple[tuple[onnx.TensorProto, ...], tuple[onnx.NodeProto, ...], str]


def _quant_point(tensor: str, dtype: str, src: str, s: Scale, memo: dict[Any, Any], fused: bool) -> QuantPoint:
    """(initializers, nodes, output) of one quantization point: a FakeQuant node when ``fused``
    and its zero point allows, else QuantizeLinear and DequantizeLinear."""
    base_name = f"{tensor}__{dtype}" + ("_pc" if s.axis is not None else "")
    scale = np.asarray(s.scale, np.float32)
    scale_t = onnx.TensorProto(name=f"{base_name}_scale", data_type=onnx.TensorProto.FLOAT, dims=scale.shape,
                               raw_data=scale.tobytes())
    zp = np.asarray(s.zero_point)
    lo_hi = fakequant.bounds(zp) if fused else None
    if lo_hi is not None:
        node = fakequant.make_node(src, scale_t.name, f"{base_name}_dq", f"{base_name}_FQ", *lo_hi, s.axis)
        return (scale_t,), (node,), node.output[0]
    if zp.any():
        zp_t = numpy_helper.from_array(zp, f"{base_name}_zp")
    else:
        # Zero points are nearly all 0: one shared tensor per (dtype, shape) when they are, which
        # makes onnxruntime's session set-up ~5 ms faster on PP-OCR's 216 quantization points.
        key = ("zp0", zp.dtype.char, zp.shape)
        if key not in memo:
            name = f"__zp0_{_ZP_TYPES.get(zp.dtype.char, zp.dtype.char)}_{'x'.join(map(str, zp.shape))}"
            memo[key] = numpy_helper.from_array(zp, name)
        zp_t = memo[key]
    q = _node("QuantizeLinear", [src, scale_t.name, zp_t.name], f"{base_name}_q", f"{base_name}_Q", s.axis)
    dq = _node("DequantizeLinear", [f"{base_name}_q", scale_t.name, zp_t.name], f"{base_name}_dq",
               f"{base_name}_DQ", s.axis)
    return (scale_t, zp_t), (q, dq), dq.output[0]


#: Comparisons hb runs on the BPU as ``HzQuantizedComparison`` (integer compares).
COMPARISONS = frozenset({"Greater", "Less", "GreaterOrEqual", "LessOrEqual"})


def _comparison_constants(n: Node, graph: Graph, plan: Plan, point_scale: Any, own_scales: Scales,
                          memo: dict[Any, Any]) -> dict[int, onnx.TensorProto]:
    """A BPU comparison with a constant compares integers: the quantized input against the constant rounded
    on a grid of its own, the compared tensor's own threshold (its calibration node: ``constant: 1``),
    whatever grid the input was quantized on. Measured (toy GU: x -> Slice -> Greater(., 0.5) -> Where, the
    Greater ``ON: BPU``): int16 at 80.0, the constant is 205 and the mask ``x > 205 * 80/32767``, not
    ``x > 0.5`` (output cosine 0.99769 against 0.99992 with the Greater on the CPU); int8 with the input
    quantized at its Slice group's 3.464, the constant is 1 (0.5 at 80/127) compared with the input's
    integers, ``x > 1 * 3.464/127`` (0.8677). The example's ``/Greater`` (``ON: BPU`` in the latency
    benchmark's Pareto trials): radar depth > 0.5 at 79.955 int16, depth SQNR 37.99 dB against 44.36 dB
    with it on the CPU. Returns input index -> the constant's replacement, the integer on the input's grid."""
    out: dict[int, onnx.TensorProto] = {}
    if len(n.inputs) != 2:
        return out
    for kc in (0, 1):
        c_name, x_name = n.inputs[kc], n.inputs[1 - kc]
        src = plan.edges.get((n.name, 1 - kc)) or plan.passthrough.get((n.name, 1 - kc))
        if c_name not in graph.initializers or src is None:
            continue
        dtype = src[1]
        if dtype not in ("int8", "int16"):
            continue
        s_x = point_scale(src[0], dtype, False)
        own = own_scales.get(x_name, dtype)
        if s_x.axis is not None or own.axis is not None:
            continue
        key = ("cmp", n.name, kc, float(s_x.scale), float(own.scale))
        if key not in memo:
            c = numpy_helper.to_array(graph.initializers[c_name]).astype(np.float64)
            qmax = 127 if dtype == "int8" else 32767
            c_int = np.clip(np.round(c / float(own.scale)), -qmax, qmax)
            value = (c_int * float(s_x.scale)).astype(numpy_helper.to_array(graph.initializers[c_name]).dtype)
            memo[key] = numpy_helper.from_array(value, name=f"{c_name}__cmp_{n.name}_{kc}")
        out[kc] = memo[key]
    return out


def set_hb_table(proto: onnx.NodeProto, attrs: dict[str, float]) -> None:
    """Set a table op's float attributes to the function hb's BPU table computes (:data:`HB_TABLES`)."""
    kept = [a for a in proto.attribute if a.name not in attrs]
    del proto.attribute[:]
    proto.attribute.extend(kept)
    proto.attribute.extend(helper.make_attribute(k, float(v)) for k, v in attrs.items())


def plan_scales(scales: Scales, plan: Plan) -> Scales:
    """``scales`` under ``plan``'s fixed and derived thresholds and its uint8 choice (tuner.simulate.fixed),
    or ``scales`` itself when the plan has none."""
    if not (plan.fixed or plan.derived or plan.unsigned):
        return scales
    return PlanScales(scales, plan.fixed, plan.derived, plan.unsigned)


def build_sim_model(base: onnx.ModelProto, graph: Graph, target: Target, plan: Plan, scales: Scales,
                    weights: WeightCache, extra_outputs: list[str] | None = None,
                    external: ExternalWeights | None = None, memo: dict[Any, Any] | None = None,
                    fused: bool = False, plain_per_channel: bool = False) -> onnx.ModelProto:
    """The simulated model of ``plan``; ``extra_outputs`` exposes intermediate tensors (for per-node tables).

    ``plain_per_channel``: the model ``default``'s comparison scores a per-channel method on
    (docs/hb_rules/quantizer.md §1.5: "during default's comparison the per-channel candidates are evaluated
    without equalization"): every quantization point with channel thresholds fake-quantizes per
    channel (axis 1) and dequantizes per channel, and weights are max-calibrated unscaled. The
    deployed model (the default, False) has channel scales only in front of a Conv, by equalization.

    ``memo`` (a dict kept by the caller across builds of one model) reuses the Q/DQ node and scale
    protos and quantized biases of earlier builds: they depend only on the values in the key.
    ``fused`` writes FakeQuant nodes, which need the library of :func:`tuner.runtime.fakequant.library`.
    """
    memo = {} if memo is None else memo
    new_inits: dict[str, onnx.TensorProto] = {}
    qdq_after: dict[str, list[onnx.NodeProto]] = defaultdict(list)  # Q/DQ pairs, keyed by the tensor they read
    made: dict[tuple[str, str, bool], str] = {}
    own_scales = scales
    scales = plan_scales(scales, plan)

    def emit(tensor: str, dtype: str, src: str, s: Scale, after: str) -> str:
        zp = np.asarray(s.zero_point)
        point_key = ("qdq", fused, tensor, dtype, src, s.axis, np.asarray(s.scale).tobytes(), zp.dtype.char,
                     zp.tobytes())
        if point_key not in memo:
            memo[point_key] = _quant_point(tensor, dtype, src, s, memo, fused)
        point: QuantPoint = memo[point_key]
        inits, point_nodes, out = point
        for t in inits:
            new_inits.setdefault(t.name, t)
        qdq_after[after] += point_nodes
        return out

    # Per-channel points. hb's calibrated model says which (real thresholds: every Conv input is asked and
    # the file answers), or default's comparison model of a per-channel method (every point), or hb's
    # per_channel rule (tuner.simulate.perchannel: the tensors it selects, with its channel scales).
    calibration = getattr(own_scales, "calibration", None)
    file_decides = getattr(own_scales, "real", None) is not None
    per_channel: dict[str, np.ndarray] = {}
    if not plain_per_channel and not file_decides and getattr(calibration, "per_channel", False):
        per_channel = channel_scales(graph, plan, scales.stats, memo)

    def point_scale(tensor: str, dtype: str, channel: bool) -> Scale:
        source = plan.scale_of.get(tensor, tensor)
        if channel and tensor in per_channel:
            return channelwise(scales.get(source, dtype), per_channel[tensor], channel_top(scales.stats, source))
        return scales.get(source, dtype, channel and (plain_per_channel or file_decides))

    def quantized(tensor: str, dtype: str, source: str | None = None, channel: bool = False) -> str:
        key = (tensor, dtype, channel)
        if key in made:
            return made[key]
        s = point_scale(tensor, dtype, channel)
        if s.axis is not None and (plain_per_channel or tensor in plan.scale_of):
            shape = graph.shapes.get(tensor)   # a scale lent by another tensor (scale_of) must fit this one
            if shape is None or len(shape) < 2 or shape[1] != np.size(s.scale):
                s = scales.get(plan.scale_of.get(tensor, tensor), dtype, False)
        if s.axis is None and channel:   # per-tensor after all: share the per-tensor point
            made[key] = quantized(tensor, dtype, source)
            return made[key]
        src = source or tensor
        after = src
        pre = plan.emitted.get(tensor)
        if pre is not None and pre != dtype:
            # the producer emits another dtype (a Resize's or a ConvTranspose's int8 read in int16): hb rounds
            # to it on the producer's calibrated threshold first (PP-OCR: int8 at the ConvTranspose's own
            # 140.33 ahead of the int16 Sigmoid input), then requantizes
            origin = plan.scale_of.get(tensor, tensor)
            own = own_scales.get(origin, pre)
            if own.threshold == scales.get(origin, pre).threshold:
                src = quantized(tensor, pre, source)     # the int8 point other readers share
            else:                                        # a fixed threshold for the reader, not the producer
                src = emit(f"{tensor}__pre", pre, src, own, after)
        made[key] = emit(tensor, dtype, src, s, after)
        return made[key]

    # Quantized model outputs: the producer writes "<out>__raw"; Q/DQ writes "<out>".
    raw = {out: f"{out}__raw" for out in plan.outputs}
    inputs_of: dict[tuple[str, int], str] = {}
    weighted = set(plan.weights)
    # A per-channel Conv input is deployed by equalizing that Conv's weights (hb's ActivationEqualization);
    # its other readers (a lowered Mul, a Conv+Add group's residual input) read it per channel.
    # A tensor that takes another's threshold (hb's shared groups, plan.scale_of) stays per-tensor.
    if plain_per_channel:
        equalized: set[str] = set()
    elif file_decides:
        equalized = {node for (node, k), (t, _) in plan.edges.items() if k == 0 and node in weighted
                     and t not in plan.scale_of and graph.by_name[node].op_type == "Conv"}
    else:
        equalized = {node for (node, k), (t, _) in plan.edges.items() if k == 0 and node in weighted
                     and t in per_channel and graph.by_name[node].op_type == "Conv"}
    for (node, k), (tensor, dtype) in plan.edges.items():
        channel = plain_per_channel or (k == 0 and node in equalized) or tensor in per_channel
        inputs_of[(node, k)] = quantized(tensor, dtype, raw.get(tensor), channel=channel)
    for (node, k), (tensor, dtype) in plan.cpu_reads.items():
        inputs_of[(node, k)] = quantized(tensor, dtype, raw.get(tensor), channel=plain_per_channel)

    out_dq = {out: quantized(out, dtype, raw[out], channel=plain_per_channel) for out, dtype in plan.outputs.items()}

    weight_names: set[str] = set()
    # Emitted in topological order: graph inputs' Q/DQ first, each node followed by the Q/DQ
    # pairs that read its outputs.
    nodes: list[onnx.NodeProto] = [q for name in graph.input_names for q in qdq_after.get(name, [])]
    opset = next((o.version for o in base.opset_import if o.domain in ("", "ai.onnx")), 11)
    for n in graph:
        if n.name in plan.softmax:   # hb_mapper's six quantized parts (tuner.graph.optimize.softmax_parts)
            parts, part_inits = softmax_parts(n.proto, graph.rank(n.inputs[0]) or 4, opset)
            for t in part_inits:
                new_inits[t.name] = t
            x_in = inputs_of.get((n.name, 0), raw.get(n.inputs[0], n.inputs[0]))
            # every point first: each is emitted right behind the part that writes its tensor
            q_in = {(p.name, k): quantized(*plan.internal[(p.name, k)]) for p in parts for k in range(len(p.input))
                    if (p.name, k) in plan.internal}
            for part in parts:
                for k, name in enumerate(part.input):
                    if (part.name, k) in q_in:
                        part.input[k] = q_in[(part.name, k)]
                    elif name == n.inputs[0]:
                        part.input[k] = x_in
                for k, name in enumerate(part.output):
                    if name in raw:
                        part.output[k] = raw[name]
                nodes.append(part)
                for out in part.output:
                    nodes.extend(qdq_after.get(out, []))
            continue
        proto = onnx.NodeProto()
        proto.CopyFrom(n.proto)
        for k, name in enumerate(proto.input):
            if (n.name, k) in inputs_of:
                proto.input[k] = inputs_of[(n.name, k)]
            elif name in raw:
                proto.input[k] = raw[name]
        if n.op_type in COMPARISONS and plan.placement.get(n.name) == "BPU":
            for k, c in _comparison_constants(n, graph, plan, point_scale, own_scales, memo).items():
                proto.input[k] = c.name
                new_inits[c.name] = c
        for k, name in enumerate(proto.output):
            if name in raw:
                proto.output[k] = raw[name]
        if plan.bpu_tables and n.op_type in HB_TABLES and plan.placement.get(n.name) == "BPU":
            set_hb_table(proto, HB_TABLES[n.op_type])
        if n.name in weighted:
            idx, axis = target.weight_ops[n.op_type]
            w_init, w_axis = graph.initializers[n.inputs[idx]], weight_axis(n.proto, n.op_type, axis)
            source = plan.edges.get((n.name, 0)) or plan.passthrough.get((n.name, 0))
            s_in: Scale | None = None
            in_scale: float | None
            if source is not None:
                # The scale the input's Q/DQ actually uses (a same-scale op upstream lends its own).
                s_in = point_scale(source[0], source[1], n.name in equalized)
            # hb_mapper's own weight thresholds (tuner.simulate.realscales), where the scales have them
            real_w = getattr(scales, "weight_thresholds", None)
            w_thr = real_w(n.name) if real_w is not None else None
            if w_thr is not None and w_thr.size != tuple(w_init.dims)[w_axis % len(w_init.dims)]:
                w_thr = None
            real_v = getattr(scales, "weight_values", None)
            w_val = real_v(n.name) if real_v is not None else None
            if w_val is not None and tuple(w_val.shape) == tuple(w_init.dims) and (s_in is None or s_in.axis is None):
                # hb_mapper's quantized folded weight, unfolded (tuner.inputs.calibrated._unfolded)
                digest = hashlib.sha256(w_val.tobytes()).hexdigest()[:12]
                key_v = ("wfold", w_init.name, digest)
                if key_v not in memo:
                    memo[key_v] = numpy_helper.from_array(w_val, name=f"{w_init.name}__w8fold{digest}")
                g = deconv_group(n)
                wq, w_scales = memo[key_v], weights.scales(w_init, w_axis, g)
                in_scale = float(s_in.scale) if s_in is not None else None
            elif s_in is not None and s_in.axis is not None:
                ratio = np.asarray(s_in.scale, np.float64) / s_in.dequantize_scale
                group = int(n.attr("group", 1))
                thr_bytes = w_thr.tobytes() if w_thr is not None else b""
                eq_key = ("eq", w_init.name, group, ratio.tobytes(), thr_bytes)
                if eq_key not in memo:
                    w_eq, w_scales = equalized_weight(numpy_helper.to_array(w_init), ratio, group, w_thr)
                    digest = hashlib.sha256(ratio.tobytes() + thr_bytes).hexdigest()[:12]
                    memo[eq_key] = (numpy_helper.from_array(w_eq, name=f"{w_init.name}__w8eq{digest}"), w_scales)
                wq, w_scales = memo[eq_key]
                in_scale = s_in.dequantize_scale
            elif w_thr is not None:
                real_key = ("wreal", w_init.name, w_axis, w_thr.tobytes())
                if real_key not in memo:
                    w = numpy_helper.to_array(w_init)
                    digest = hashlib.sha256(w_thr.tobytes()).hexdigest()[:12]
                    memo[real_key] = (numpy_helper.from_array(fake_quant_weight(w, w_axis, w_thr),
                                                              name=f"{w_init.name}__w8hb{digest}"),
                                      np.where(w_thr > 0, w_thr / 127.0, 1.0))
                wq, w_scales = memo[real_key]
                in_scale = float(s_in.scale) if s_in is not None else None
            else:
                g = deconv_group(n)
                wq, w_scales = weights.get(w_init, w_axis, g), weights.scales(w_init, w_axis, g)
                in_scale = float(s_in.scale) if s_in is not None else None
            proto.input[idx] = wq.name
            new_inits[wq.name] = wq
            weight_names.add(wq.name)
            bias_name = n.inputs[2] if len(n.inputs) > 2 and n.op_type in BIAS_OPS else ""
            if target.quantize_bias and bias_name in graph.initializers and in_scale is not None \
                    and s_in is not None and not np.asarray(s_in.zero_point).any():
                bias_key = ("bias", bias_name, n.name, wq.name, w_axis, in_scale)
                if bias_key not in memo:
                    b = numpy_helper.to_array(graph.initializers[bias_name])
                    memo[bias_key] = numpy_helper.from_array(quantize_bias(b, in_scale, w_scales),
                                                             name=f"{bias_name}__b32_{n.name}")
                bq = memo[bias_key]
                new_inits[bq.name] = bq
                proto.input[2] = bq.name
        nodes.append(proto)
        for out in proto.output:
            nodes.extend(qdq_after.get(out, []))
    nodes.extend(helper.make_node("Identity", [dq], [out], name=f"{out}__out") for out, dq in out_dq.items())

    model = onnx.ModelProto()
    for field_name in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(model, field_name, getattr(base, field_name))
    model.opset_import.extend(base.opset_import)
    model.functions.extend(base.functions)   # fused activations (tuner.graph.optimize)
    g, mg = base.graph, model.graph
    mg.name = g.name
    mg.input.extend(g.input)
    mg.output.extend(g.output)
    mg.value_info.extend(g.value_info)
    # Only initializers some node reads (onnxruntime drops the others before it would take
    # their external values). Static tensors (the model's, fake-quantized weights) go external;
    # per-candidate ones (scales, zero points, int32 biases) stay inline.
    used = {i for n in nodes for i in n.input}
    static = external.stub if external is not None else (lambda t: t)
    mg.initializer.extend(static(t) for t in g.initializer if t.name in used)
    mg.node.extend(nodes)
    mg.initializer.extend(static(t) if t.name in weight_names else t for t in new_inits.values() if t.name in used)
    for extra in extra_outputs or []:
        if extra not in {o.name for o in mg.output}:
            mg.output.append(helper.make_tensor_value_info(raw.get(extra, extra), onnx.TensorProto.FLOAT, None))
    domains = {o.domain for o in model.opset_import}
    for domain in sorted({n.domain for n in nodes} & {MS, fakequant.DOMAIN} - domains):
        model.opset_import.append(helper.make_opsetid(domain, 1))
    return model
