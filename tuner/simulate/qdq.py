"""Build the simulated quantized model of a plan: the float graph with quantization points inserted.

Each quantization point becomes QuantizeLinear -> DequantizeLinear (``com.microsoft``
domain, which takes int8 and int16 at any opset, per-tensor or per-channel), or, with
``fused=True``, one ``tuner.sim`` FakeQuant node computing the same values in one pass
(:mod:`tuner.runtime.fakequant`). BPU weights are replaced by their int8 per-channel
fake-quantized values. The graph is built in memory from cached scales (milliseconds);
onnxruntime then runs it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tuner.graph import Graph, Node, Target
from tuner.graph.hz import HB_HARD_SIGMOID
from tuner.graph.softmax import softmax_parts
from tuner.runtime import fakequant
from tuner.simulate.adjust import QMAX16, adjustment
from tuner.simulate.intbuild import IntKernels
from tuner.simulate.perchannel import CONV_HEADS, channel_scales, channel_top, fusion_heads, head
from tuner.simulate.plan import Plan
from tuner.simulate.scales import PlanScales, Scale, Scales, channelwise
from tuner.simulate.weights import (
    ExternalWeights,
    QuantWeight,
    WeightCache,
    quantize_bias,
    weight_axis,
    weight_rule,
)

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
                    fused: bool = False, plain_per_channel: bool = False, int_conv: bool = False) -> onnx.ModelProto:
    """The simulated model of ``plan``; ``extra_outputs`` exposes intermediate tensors (for per-node tables).

    ``int_conv``: BPU Convs (and lowered Muls) with an int8 input requantize as hb's integer kernel does, and
    BPU HardSigmoids read hb's table (tuner.simulate.intconv; off by default: see there why).

    ``plain_per_channel``: the model ``default``'s comparison scores a per-channel method on
    (docs/hb_rules/quantizer.md §1.5: "during default's comparison the per-channel candidates are evaluated
    without equalization"): every quantization point with channel thresholds fake-quantizes per
    channel (axis 1) and dequantizes per channel, and weights are max-calibrated unscaled. The
    deployed model (the default, False) has channel scales only in front of a Conv, by equalization.

    ``memo`` (a dict kept by the caller across builds of one model) reuses the Q/DQ node and scale
    protos and quantized biases of earlier builds: they depend only on the values in the key.
    ``fused`` writes FakeQuant nodes, which need the library of :func:`tuner.runtime.fakequant.library`.
    """
    build = _Build(graph, target, plan, scales, weights, {} if memo is None else memo, fused, plain_per_channel,
                   int_conv)
    nodes = build.nodes(base)
    return _assemble(base, nodes, build.new_inits, build.weight_names, build.raw, extra_outputs or [], external)


class _Build(IntKernels):
    """One build of a simulated model: what its rules share (the quantization points made so far, the
    initializers it adds) and the rules themselves, one method each."""

    def __init__(self, graph: Graph, target: Target, plan: Plan, scales: Scales, weights: WeightCache,
                 memo: dict[Any, Any], fused: bool, plain_per_channel: bool, int_conv: bool = False):
        self.graph, self.target, self.plan, self.weights = graph, target, plan, weights
        self.memo, self.fused, self.plain, self.int_conv_on = memo, fused, plain_per_channel, int_conv
        self.own_scales = scales
        self.scales = plan_scales(scales, plan)
        self.new_inits: dict[str, onnx.TensorProto] = {}
        self.qdq_after: dict[str, list[onnx.NodeProto]] = defaultdict(list)  # Q/DQ pairs, keyed by the tensor they read
        self.made: dict[tuple[str, str, bool], str] = {}
        self.adjusted_points: dict[tuple[str, str], str | None] = {}
        self.weight_names: set[str] = set()
        # Quantized model outputs: the producer writes "<out>__raw"; Q/DQ writes "<out>".
        self.raw = {out: f"{out}__raw" for out in plan.outputs}
        # Per-channel points. hb's calibrated model says which (real thresholds: every Conv input is asked and
        # the file answers), or default's comparison model of a per-channel method (every point), or hb's
        # per_channel rule (tuner.simulate.perchannel: the tensors it selects, with its channel scales).
        calibration = getattr(scales, "calibration", None)
        self.file_decides = getattr(scales, "real", None) is not None
        self.per_channel: dict[str, np.ndarray] = {}
        if not plain_per_channel and not self.file_decides and getattr(calibration, "per_channel", False):
            self.per_channel = channel_scales(graph, plan, self.scales.stats, memo)
        self.equalized = self._equalized()
        self.inputs_of: dict[tuple[str, int], str] = {}
        self.residual_gains: dict[tuple[str, int], onnx.TensorProto] = {}   # fused Adds' residual reads (int_conv)
        self.before: dict[str, list[onnx.NodeProto]] = defaultdict(list)

    # -- quantization points -------------------------------------------------------------
    def emit(self, tensor: str, dtype: str, src: str, s: Scale, after: str) -> str:
        """One quantization point reading ``src``, emitted right behind the node that writes ``after``."""
        zp = np.asarray(s.zero_point)
        point_key = ("qdq", self.fused, tensor, dtype, src, s.axis, np.asarray(s.scale).tobytes(), zp.dtype.char,
                     zp.tobytes())
        if point_key not in self.memo:
            self.memo[point_key] = _quant_point(tensor, dtype, src, s, self.memo, self.fused)
        point: QuantPoint = self.memo[point_key]
        inits, point_nodes, out = point
        for t in inits:
            self.new_inits.setdefault(t.name, t)
        self.qdq_after[after] += point_nodes
        return out

    def point_scale(self, tensor: str, dtype: str, channel: bool) -> Scale:
        """The scale ``tensor`` is quantized with in ``dtype`` (per channel where ``channel`` and hb has one)."""
        source = self.plan.scale_of.get(tensor, tensor)
        if channel and tensor in self.per_channel:
            return channelwise(self.scales.get(source, dtype), self.per_channel[tensor],
                               channel_top(self.scales.stats, source))
        return self.scales.get(source, dtype, channel and (self.plain or self.file_decides))

    def quantized(self, tensor: str, dtype: str, source: str | None = None, channel: bool = False) -> str:
        """The name of ``tensor`` quantized in ``dtype``: one point per (tensor, dtype, channel), shared by its readers."""
        key = (tensor, dtype, channel)
        if key in self.made:
            return self.made[key]
        s = self.point_scale(tensor, dtype, channel)
        if s.axis is not None and (self.plain or tensor in self.plan.scale_of):
            shape = self.graph.shapes.get(tensor)   # a scale lent by another tensor (scale_of) must fit this one
            if shape is None or len(shape) < 2 or shape[1] != np.size(s.scale):
                s = self.scales.get(self.plan.scale_of.get(tensor, tensor), dtype, False)
        if s.axis is None and channel:   # per-tensor after all: share the per-tensor point
            self.made[key] = self.quantized(tensor, dtype, source)
            return self.made[key]
        src = source or tensor
        pre = self.plan.emitted.get(tensor)
        if pre is not None and pre != dtype:
            src = self._producer_rounded(tensor, pre, src, source)
        elif self.int_conv_on and s.axis is None and source is None:
            src = self.int_conv(tensor, dtype, src, s)
        self.made[key] = self.emit(tensor, dtype, src, s, source or tensor)
        return self.made[key]

    def _producer_rounded(self, tensor: str, pre: str, src: str, source: str | None) -> str:
        """The producer emits another dtype (a Resize's or a ConvTranspose's int8 read in int16): hb rounds
        to it on the producer's calibrated threshold first (PP-OCR: int8 at the ConvTranspose's own
        140.33 ahead of the int16 Sigmoid input), then requantizes."""
        origin = self.plan.scale_of.get(tensor, tensor)
        own = self.own_scales.get(origin, pre)
        if own.threshold == self.scales.get(origin, pre).threshold:
            return self.quantized(tensor, pre, source)      # the int8 point other readers share
        return self.emit(f"{tensor}__pre", pre, src, own, src)   # a fixed threshold for the reader, not the producer

    def _equalized(self) -> set[str]:
        """The Conv nodes whose input is deployed per channel, by equalizing their weights (hb's
        ActivationEqualization); the input's other readers (a lowered Mul, a Conv+Add group's residual
        input) read it per channel. A tensor that takes another's threshold (hb's shared groups,
        plan.scale_of) stays per-tensor."""
        plan, weighted = self.plan, set(self.plan.weights)
        if self.plain:
            return set()
        if self.file_decides:
            return {node for (node, k), (t, _) in plan.edges.items() if k == 0 and node in weighted
                    and t not in plan.scale_of and self.graph.by_name[node].op_type == "Conv"}
        return {node for (node, k), (t, _) in plan.edges.items() if k == 0 and node in weighted
                and t in self.per_channel and self.graph.by_name[node].op_type == "Conv"}

    def quantize_reads(self) -> dict[str, str]:
        """Every quantized read of the plan (BPU edges, CPU reads of BPU tensors) into ``inputs_of``;
        returns model output -> its dequantized value."""
        plan, raw = self.plan, self.raw
        for (node, k), (tensor, dtype) in plan.edges.items():
            channel = self.plain or (k == 0 and node in self.equalized) or tensor in self.per_channel
            adjusted = self.adjusted(tensor, dtype) if channel and k == 0 and node in self.equalized else None
            self.inputs_of[(node, k)] = adjusted or self.quantized(tensor, dtype, raw.get(tensor), channel=channel)
        for (node, k), (tensor, dtype) in plan.cpu_reads.items():
            self.inputs_of[(node, k)] = self.quantized(tensor, dtype, raw.get(tensor), channel=self.plain)
        return {out: self.quantized(out, dtype, raw[out], channel=self.plain) for out, dtype in plan.outputs.items()}

    def adjusted(self, tensor: str, dtype: str) -> str | None:
        """The per-channel point of ``tensor`` behind hb's AdjustConvQuantParams copy (tuner.simulate.adjust),
        where its writer is a Conv group (a Conv, a lowered Mul) with an int16 input and every reader an
        equalized Conv: the writer's output rounded on the copy's int16 grid, multiplied by the copy's gain,
        then quantized as the readers' point is. None where hb inserts nothing (or tuner does not model it:
        hb's own thresholds in use, a tensor its writer emits in another dtype)."""
        key = (tensor, dtype)
        if key in self.adjusted_points:
            return self.adjusted_points[key]
        self.adjusted_points[key] = None
        found = self._adjustment(tensor, dtype)
        if found is None:
            return None
        thr, gain = found
        channels = thr.size
        base = self.raw.get(tensor, tensor)
        s16 = Scale((thr / QMAX16).astype(np.float32), np.zeros(channels, np.int16), 1, float(thr.max()))
        rounded = self.emit(f"{tensor}__adj16", "int16", base, s16, base)
        g = numpy_helper.from_array(gain.astype(np.float32).reshape((1, channels, 1, 1)), f"{tensor}__adj_gain")
        self.new_inits[g.name] = g
        self.qdq_after[base].append(helper.make_node("Mul", [rounded, g.name], [f"{tensor}__adj"],
                                                     name=f"{tensor}__adj_Mul"))
        point = self.emit(tensor, dtype, f"{tensor}__adj", self.point_scale(tensor, dtype, True), base)
        self.adjusted_points[key] = point
        return point

    def _adjustment(self, tensor: str, dtype: str) -> tuple[np.ndarray, np.ndarray] | None:
        graph, plan = self.graph, self.plan
        if tensor not in self.per_channel or self.file_decides or plan.emitted.get(tensor, dtype) != dtype \
                or tensor in plan.scale_of:
            return None
        producer = graph.producer.get(tensor)
        if producer is None:
            return None
        writer = head(producer, fusion_heads(graph, plan))
        src = plan.edges.get((writer.name, 0))
        if writer.op_type not in CONV_HEADS or src is None or src[1] != "int16" \
                or plan.placement.get(writer.name) != "BPU":
            return None
        readers = graph.consumers.get(tensor, [])
        if not readers or any(k != 0 or n.name not in self.equalized for n, k in readers):
            return None
        w_thr = self._weight_thresholds(writer, src)
        if w_thr is None:
            return None
        # the readers' node as hb's calibrated model has it: int16 also where a Conv is set back to int8 at
        # quantization (a stride-2 depthwise reader: PP-OCRv4's p2o.Conv.3), and its dequantize_scale with it
        calibrated = plan.calibrated.get((readers[0][0].name, 0), (tensor, dtype))[1]
        out = self.point_scale(tensor, calibrated, True)
        qmax = QMAX16 if calibrated == "int16" else 127
        in_thr = self.point_scale(src[0], "int16", writer.name in self.equalized).threshold
        return adjustment(w_thr, in_thr, np.asarray(out.scale, np.float64) * qmax, out.dequantize_scale)

    def _weight_thresholds(self, writer: Node, src: tuple[str, str]) -> np.ndarray | None:
        """The writer's weight thresholds per output channel as hb calibrates them: |k| of a lowered Mul's
        constant, the max |w| of a Conv's (equalized) weight."""
        if len(writer.inputs) < 2 or writer.inputs[1] not in self.graph.initializers:
            return None
        if writer.op_type == "HzChannelScale":
            return np.abs(numpy_helper.to_array(self.graph.initializers[writer.inputs[1]]).astype(np.float64))
        if writer.name not in self.plan.weights:
            return None
        idx, axis = self.target.weight_ops[writer.op_type]
        w_init = self.graph.initializers[writer.inputs[idx]]
        s_in = self.point_scale(src[0], src[1], writer.name in self.equalized)
        qw = weight_rule(writer, w_init, weight_axis(writer.proto, writer.op_type, axis), s_in, self.scales,
                         self.weights, self.memo)
        return np.asarray(qw.scales, np.float64) * 127.0

    # -- nodes ---------------------------------------------------------------------------
    def nodes(self, base: onnx.ModelProto) -> list[onnx.NodeProto]:
        """The simulated graph's nodes, in topological order: graph inputs' Q/DQ first, each node followed
        by the Q/DQ pairs that read its outputs, the outputs' Identity nodes last."""
        out_dq = self.quantize_reads()
        self.scale_residuals()
        nodes: list[onnx.NodeProto] = [q for name in self.graph.input_names for q in self.qdq_after.get(name, [])]
        opset = next((o.version for o in base.opset_import if o.domain in ("", "ai.onnx")), 11)
        for n in self.graph:
            if n.name in self.plan.softmax:   # hb_mapper's six quantized parts (tuner.graph.optimize.softmax_parts)
                nodes += self.softmax_parts(n, opset)
                continue
            proto = self.node(n)
            nodes.extend(self.before.get(n.name, []))
            nodes.append(proto)
            for out in proto.output:
                nodes.extend(self.qdq_after.get(out, []))
        nodes.extend(helper.make_node("Identity", [dq], [out], name=f"{out}__out") for out, dq in out_dq.items())
        return nodes

    def softmax_parts(self, n: Node, opset: int) -> list[onnx.NodeProto]:
        """A BPU Softmax as hb_mapper's six quantized parts, each followed by the points reading it."""
        parts, part_inits = softmax_parts(n.proto, self.graph.rank(n.inputs[0]) or 4, opset)
        for t in part_inits:
            self.new_inits[t.name] = t
        x_in = self.inputs_of.get((n.name, 0), self.raw.get(n.inputs[0], n.inputs[0]))
        # every point first: each is emitted right behind the part that writes its tensor
        q_in = {(p.name, k): self.quantized(*self.plan.internal[(p.name, k)]) for p in parts
                for k in range(len(p.input)) if (p.name, k) in self.plan.internal}
        nodes = []
        for part in parts:
            for k, name in enumerate(part.input):
                if (part.name, k) in q_in:
                    part.input[k] = q_in[(part.name, k)]
                elif name == n.inputs[0]:
                    part.input[k] = x_in
            for k, name in enumerate(part.output):
                if name in self.raw:
                    part.output[k] = self.raw[name]
            nodes.append(part)
            for out in part.output:
                nodes.extend(self.qdq_after.get(out, []))
        return nodes

    def node(self, n: Node) -> onnx.NodeProto:
        """``n`` reading its quantized inputs, with hb's comparison constants, table functions and weights."""
        proto = onnx.NodeProto()
        proto.CopyFrom(n.proto)
        for k, name in enumerate(proto.input):
            if (n.name, k) in self.inputs_of:
                proto.input[k] = self.inputs_of[(n.name, k)]
            elif name in self.raw:
                proto.input[k] = self.raw[name]
        on_bpu = self.plan.placement.get(n.name) == "BPU"
        if n.op_type in COMPARISONS and on_bpu:
            for k, c in _comparison_constants(n, self.graph, self.plan, self.point_scale, self.own_scales,
                                              self.memo).items():
                proto.input[k] = c.name
                self.new_inits[c.name] = c
        for k, name in enumerate(proto.output):
            if name in self.raw:
                proto.output[k] = self.raw[name]
        if self.plan.bpu_tables and n.op_type in HB_TABLES and on_bpu:
            set_hb_table(proto, HB_TABLES[n.op_type])
            table = self.int_table(n, proto) if self.int_conv_on else None
            if table is not None:
                return table
        if self.int_conv_on and n.op_type == "Add" and on_bpu:
            added = self.int_add(n, proto)
            if added is not None:
                return added
        if n.name in self.plan.weights:
            self.weight(n, proto)
        return proto

    def weight(self, n: Node, proto: onnx.NodeProto) -> None:
        """A weighted node reads its fake-quantized weight (tuner.simulate.weights.weight_rule) and its int32 bias."""
        idx, axis = self.target.weight_ops[n.op_type]
        w_init, w_axis = self.graph.initializers[n.inputs[idx]], weight_axis(n.proto, n.op_type, axis)
        source = self.plan.edges.get((n.name, 0)) or self.plan.passthrough.get((n.name, 0))
        # The scale the input's Q/DQ actually uses (a same-scale op upstream lends its own).
        s_in = self.point_scale(source[0], source[1], n.name in self.equalized) if source is not None else None
        qw = weight_rule(n, w_init, w_axis, s_in, self.scales, self.weights, self.memo)
        proto.input[idx] = qw.tensor.name
        self.new_inits[qw.tensor.name] = qw.tensor
        self.weight_names.add(qw.tensor.name)
        bias_name = n.inputs[2] if len(n.inputs) > 2 and n.op_type in BIAS_OPS else ""
        if self.target.quantize_bias and bias_name in self.graph.initializers and qw.in_scale is not None \
                and s_in is not None and not np.asarray(s_in.zero_point).any():
            bq = self._bias(n, bias_name, qw, w_axis)
            self.new_inits[bq.name] = bq
            proto.input[2] = bq.name

    def _bias(self, n: Node, bias_name: str, qw: QuantWeight, w_axis: int) -> onnx.TensorProto:
        """The int32 bias on the grid input scale x weight scale, as the BPU keeps it (:func:`quantize_bias`)."""
        assert qw.in_scale is not None
        bias_key = ("bias", bias_name, n.name, qw.tensor.name, w_axis, qw.in_scale)
        if bias_key not in self.memo:
            b = numpy_helper.to_array(self.graph.initializers[bias_name])
            self.memo[bias_key] = numpy_helper.from_array(quantize_bias(b, qw.in_scale, qw.scales),
                                                          name=f"{bias_name}__b32_{n.name}")
        bq: onnx.TensorProto = self.memo[bias_key]
        return bq


def _assemble(base: onnx.ModelProto, nodes: list[onnx.NodeProto], new_inits: dict[str, onnx.TensorProto],
              weight_names: set[str], raw: dict[str, str], extra_outputs: list[str],
              external: ExternalWeights | None) -> onnx.ModelProto:
    """The model around ``nodes``: ``base``'s metadata, inputs, outputs and the initializers some node reads."""
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
    for extra in extra_outputs:
        if extra not in {o.name for o in mg.output}:
            mg.output.append(helper.make_tensor_value_info(raw.get(extra, extra), onnx.TensorProto.FLOAT, None))
    domains = {o.domain for o in model.opset_import}
    for domain in sorted({n.domain for n in nodes} & {MS, fakequant.DOMAIN} - domains):
        model.opset_import.append(helper.make_opsetid(domain, 1))
    return model
