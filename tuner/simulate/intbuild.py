"""The opt-in integer kernels' part of a simulated model's build (tuner.simulate.intconv: hb's BPU Conv
requantization, its lowered Mul and its HardSigmoid table, ``TUNER_INTCONV=1``): the methods of
:class:`tuner.simulate.qdq._Build` that write them, apart so that the build's module keeps to one role."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from functools import cached_property
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tuner.graph import Graph, Node, Target
from tuner.simulate import intadd
from tuner.simulate.intconv import emulation, hard_sigmoid_table, requant, residual_gain
from tuner.simulate.perchannel import fusion_heads
from tuner.simulate.plan import Plan
from tuner.simulate.scales import Scale, Scales
from tuner.simulate.weights import WeightCache, weight_axis, weight_rule


def _chain(base: str, steps: list[tuple[str, str, list[str]]]) -> list[onnx.NodeProto]:
    """Nodes ``(suffix, op, inputs)``, each writing ``<base>_<suffix>`` (the tensor the later steps read)."""
    return [onnx.NodeProto(op_type=op, name=f"{base}_{k}", input=ins, output=[f"{base}_{k}"]) for k, op, ins in steps]


class IntKernels:
    """Mixed into the build: what these rules read of it is declared here, the build sets it."""

    graph: Graph
    target: Target
    plan: Plan
    scales: Scales
    weights: WeightCache
    memo: dict[Any, Any]
    plain: bool
    new_inits: dict[str, onnx.TensorProto]
    qdq_after: dict[str, list[onnx.NodeProto]]
    residual_gains: dict[tuple[str, int], onnx.TensorProto]
    before: dict[str, list[onnx.NodeProto]]
    inputs_of: dict[tuple[str, int], str]
    per_channel: dict[str, np.ndarray]
    equalized: Any
    made: dict[tuple[str, str, bool], str]
    point_scale: Callable[[str, str, bool], Scale]

    @cached_property
    def _into(self) -> dict[str, Node]:
        """Each fused member -> the member before it, once per build (not per quantization point)."""
        return fusion_heads(self.graph, self.plan)

    @cached_property
    def _read_as(self) -> dict[str, list[str]]:
        """Tensor -> the dtypes BPU nodes read it in (plan.edges), once per build."""
        return _dtypes_by_tensor(self.plan.edges.values())

    @cached_property
    def _cpu_read_as(self) -> dict[str, list[str]]:
        """Tensor -> the dtypes CPU nodes read it in (plan.cpu_reads), once per build."""
        return _dtypes_by_tensor(self.plan.cpu_reads.values())

    def _register(self, inits: list[onnx.TensorProto]) -> None:
        for t in inits:
            self.new_inits.setdefault(t.name, t)

    def int_conv(self, tensor: str, dtype: str, src: str, s: Scale) -> str:
        """``src`` as hb's integer Conv kernel leaves it (tuner.simulate.intconv), where ``tensor`` is the output
        of a BPU Conv group with an int8 input (:meth:`_int_conv_head`); else ``src`` itself."""
        found = self._int_conv_head(tensor, dtype, s)
        if found is None:
            return src
        conv, residual = found
        s_res = residual[2] if residual is not None else None
        source = self.plan.edges[(conv.name, 0)]
        s_in = self.point_scale(source[0], source[1], False)
        if not s_in.per_tensor_symmetric:
            return src
        shape = self.graph.shapes.get(tensor)
        if shape is None or len(shape) != 4 or not shape[1]:
            return src
        if conv.op_type == "HzChannelScale":   # its constant k is the weight, on |k| / 127 (an int8 weight of 127)
            gain = np.abs(numpy_helper.to_array(self.graph.initializers[conv.inputs[1]]).astype(np.float64)).ravel()
            s_w = np.broadcast_to(gain / 127.0, (int(shape[1]),)).copy() if gain.size in (1, shape[1]) else gain[:0]
        else:
            idx, axis = self.target.weight_ops[conv.op_type]
            qw = weight_rule(conv, self.graph.initializers[conv.inputs[idx]],
                             weight_axis(conv.proto, conv.op_type, axis), s_in, self.scales, self.weights, self.memo)
            s_w = np.asarray(qw.scales, np.float64).ravel()
        if shape[1] != s_w.size:
            return src
        key = ("intconv", tensor, dtype, src, float(s_in.scale), s_w.tobytes(), float(s.scale), s_res)
        if key not in self.memo:
            s_out = float(s.scale)
            rq = requant(float(s_in.scale), s_w, s_out, dtype)
            consts = emulation(rq, float(s_in.scale) * s_w, s_out, s_res)
            base = f"{tensor}__ic_{dtype}"
            inits = [numpy_helper.from_array(v.astype(np.float32).reshape(1, -1, 1, 1), f"{base}_{k}")
                     for k, v in zip("acm", consts)]
            inits.append(numpy_helper.from_array(np.asarray(s_out, np.float32), f"{base}_s"))
            nodes = _chain(base, [("x", "Mul", [src, inits[0].name]), ("xc", "Add", [f"{base}_x", inits[1].name]),
                                  ("u", "Floor", [f"{base}_xc"]), ("um", "Mul", [f"{base}_u", inits[2].name]),
                                  ("v", "Floor", [f"{base}_um"]), ("y", "Mul", [f"{base}_v", inits[3].name])])
            self.memo[key] = (inits, nodes)
        inits, nodes = self.memo[key]
        self._register(inits)
        self.qdq_after[src] += nodes
        if residual is not None:
            add, k_res, s_r = residual
            gain_key = ("intconv_res", add, k_res, float(s_in.scale), s_w.tobytes(), s_r)
            if gain_key not in self.memo:
                g_res = residual_gain(float(s_in.scale) * s_w, s_r).astype(np.float32).reshape(1, -1, 1, 1)
                self.memo[gain_key] = numpy_helper.from_array(g_res, f"{add}__ic_res{k_res}")
            self.residual_gains[(add, k_res)] = self.memo[gain_key]
        return str(nodes[-1].output[0])

    def int_table(self, n: Node, proto: onnx.NodeProto) -> onnx.NodeProto | None:
        """A BPU HardSigmoid between int8 points as hb's table (tuner.simulate.intconv.hard_sigmoid_table): the
        input's integer picks the table's value, already on the output's grid; None where a point is not
        int8 per tensor."""
        src = self.plan.edges.get((n.name, 0))
        out = n.outputs[0]
        reads = self._read_as.get(out, [])
        if src is None or src[1] != "int8" or not reads or any(d != "int8" for d in reads):
            return None
        s_in = self.point_scale(src[0], "int8", False)
        s_out = self.point_scale(out, "int8", False)
        if not (s_in.per_tensor_symmetric and s_out.per_tensor_symmetric):
            return None
        key = ("inttable", n.name, float(s_in.scale), float(s_out.scale))
        if key not in self.memo:
            values = hard_sigmoid_table(s_in.threshold, s_out.threshold).astype(np.float32) * np.float32(s_out.scale)
            base = f"{n.name}__lut"
            inits = [numpy_helper.from_array(values, f"{base}_t"),
                     numpy_helper.from_array(np.asarray(1.0 / float(s_in.scale), np.float32), f"{base}_inv"),
                     numpy_helper.from_array(np.asarray(128.0, np.float32), f"{base}_off")]
            x = proto.input[0]
            nodes = _chain(base, [("q", "Mul", [x, inits[1].name]), ("r", "Round", [f"{base}_q"]),
                                  ("i", "Add", [f"{base}_r", inits[2].name])])
            nodes.append(helper.make_node("Cast", [f"{base}_i"], [f"{base}_idx"], name=f"{base}_idx",
                                          to=onnx.TensorProto.INT64))
            gather = onnx.NodeProto(op_type="Gather", name=n.name, input=[inits[0].name, f"{base}_idx"],
                                    output=list(proto.output))
            self.memo[key] = (inits, nodes, gather)
        inits, nodes, gather = self.memo[key]
        self._register(inits)
        self.before[n.name] = list(nodes)
        g = onnx.NodeProto()
        g.CopyFrom(gather)
        del g.output[:]
        g.output.extend(proto.output)
        return g

    def int_add(self, n: Node, proto: onnx.NodeProto) -> onnx.NodeProto | None:
        """A BPU Add of two int8 / int16 tensors, not fused into a Conv, as hb's HzSElementwiseAdd computes it
        (tuner.simulate.intadd), in float64 (exact: an int16 input shifted by x_shift reaches 2^38): the inputs'
        integers, the floored sum on hb's grid, the output rounded half up on ``output_scale /
        2^output_right_shift`` (float32 would round ``t m`` onto the half below an integer: 150 and 73 of 200000
        int16 outputs off in tests/simulate/test_intadd.py), times the output's step (its point then clips). The
        nodes before it go into ``before``; None where the Add keeps tuner's float sum."""
        found = self._int_add_steps(n)
        if found is None:
            return None
        (s0, s1), (s_out, dtype) = found
        rq = intadd.requant(s0, s1, s_out, dtype)
        if rq.accu_right_shift < 0:
            return None
        key = ("intadd", n.name, s0, s1, s_out, dtype)
        if key not in self.memo:
            g_a, g_b, m = intadd.emulation(rq)
            gains = (g_a, g_b) if rq.first == 0 else (g_b, g_a)
            base = f"{n.name}__iadd"
            values = {"inv0": 1.0 / s0, "inv1": 1.0 / s1, "g0": gains[0], "g1": gains[1], "m": m, "h": 0.5}
            inits = [numpy_helper.from_array(np.asarray(v, np.float64), f"{base}_{k}") for k, v in values.items()]
            inits.append(numpy_helper.from_array(np.asarray(s_out, np.float32), f"{base}_s"))
            steps = [(f"{op}{k}", op_type, ins) for k in "01" for op, op_type, ins in
                     (("c", "Cast", [proto.input[int(k)]]), ("q", "Mul", [f"{base}_c{k}", f"{base}_inv{k}"]),
                      ("r", "Round", [f"{base}_q{k}"]), ("p", "Mul", [f"{base}_r{k}", f"{base}_g{k}"]))]
            steps += [("u", "Add", [f"{base}_p0", f"{base}_p1"]), ("t", "Floor", [f"{base}_u"]),
                      ("tm", "Mul", [f"{base}_t", f"{base}_m"]), ("th", "Add", [f"{base}_tm", f"{base}_h"]),
                      ("v64", "Floor", [f"{base}_th"]), ("v", "Cast", [f"{base}_v64"])]
            nodes = _chain(base, steps)
            for node in nodes:
                if node.op_type == "Cast":
                    to = onnx.TensorProto.FLOAT if node.name.endswith("_v") else onnx.TensorProto.DOUBLE
                    node.attribute.append(helper.make_attribute("to", to))
            self.memo[key] = (inits, nodes)
        inits, nodes = self.memo[key]
        self._register(inits)
        self.before[n.name] = list(nodes)
        return onnx.NodeProto(op_type="Mul", name=n.name, input=[f"{n.name}__iadd_v", f"{n.name}__iadd_s"],
                              output=list(proto.output))

    def _int_add_steps(self, n: Node) -> tuple[tuple[float, float], tuple[float, str]] | None:
        """((s0, s1), (s_out, dtype)) of an Add hb's integer kernel computes as measured: on the BPU, outside any
        fusion group, both inputs int8 / int16 activations read at their shared per-tensor point, its output read
        in one dtype (int8 or int16) on a per-tensor step, not a model output. None otherwise."""
        if len(n.inputs) != 2 or any(n.name in pair for pair in self.plan.fused):
            return None
        steps = []
        for k, name in enumerate(n.inputs):
            edge = self.plan.edges.get((n.name, k))
            if name in self.graph.initializers or edge is None or edge[1] not in intadd.OUTPUT_SHIFT \
                    or self.inputs_of.get((n.name, k)) != self.made.get((edge[0], edge[1], False)):
                return None
            s = self.point_scale(edge[0], edge[1], False)
            if not s.per_tensor_symmetric or not float(s.scale) > 0:
                return None
            steps.append(float(s.scale))
        out = n.outputs[0]
        reads = set(self._read_as.get(out, [])) | set(self._cpu_read_as.get(out, []))
        if len(reads) != 1 or out in self.plan.outputs or out in self.graph.output_names \
                or out in self.per_channel or out in self.plan.emitted:
            return None
        dtype = reads.pop()
        s_out = self.point_scale(out, dtype, False) if dtype in intadd.OUTPUT_SHIFT else None
        if s_out is None or not s_out.per_tensor_symmetric or not float(s_out.scale) > 0:
            return None
        return (steps[0], steps[1]), (float(s_out.scale), dtype)

    def scale_residuals(self) -> None:
        """Each fused residual Add that :meth:`int_conv` simulates reads its residual times the gain that puts
        it on hb's ``e_scale / 2^sh`` grid (tuner.simulate.intconv.residual_gain), one Mul before the Add."""
        for (add, k), gain in self.residual_gains.items():
            src = self.inputs_of[(add, k)]
            out = f"{gain.name}_y"
            self.new_inits[gain.name] = gain
            self.before[add].append(onnx.NodeProto(op_type="Mul", name=out, input=[src, gain.name], output=[out]))
            self.inputs_of[(add, k)] = out

    def _int_conv_head(self, tensor: str, dtype: str,
                       s: Scale) -> tuple[Node, tuple[str, int, float] | None] | None:
        """The Conv of the BPU group writing ``tensor`` whose requantization hb's integer kernel does, as
        measured (tuner.simulate.intconv): a Conv, alone or with a fused residual Add, then a fused Relu or
        none, or a lowered Mul (HzChannelScale) with or without a Relu; int8 input, int8/int16 output, a
        Conv's bias (if any) on the int32 grid. With it (the Add, the
        residual's input index, its step), None without an Add. None where tuner's rounding stays (a model output, an equalized input,
        a per-channel residual, another group)."""
        if not self.target.quantize_bias or dtype not in ("int8", "int16") or np.asarray(s.zero_point).any() \
                or tensor in self.plan.outputs or tensor in self.graph.output_names or self.plain:
            return None
        producer = self.graph.producer.get(tensor)
        if producer is None:
            return None
        into = self._into
        chain = [producer]
        while chain[-1].name in into and len(chain) < 4:
            chain.append(into[chain[-1].name])
        chain.reverse()
        kinds = [n.op_type for n in chain]
        conv = chain[0]
        if kinds[0] == "HzChannelScale":       # a Mul by a constant (+ a constant Add): a 1x1 depthwise Conv in hb
            if kinds not in (["HzChannelScale"], ["HzChannelScale", "Relu"]) or len(conv.inputs) < 2 \
                    or conv.inputs[1] not in self.graph.initializers or self.plan.placement.get(conv.name) != "BPU":
                return None
            source = self.plan.edges.get((conv.name, 0))
            return (conv, None) if source is not None and source[1] == "int8" else None
        if kinds not in (["Conv"], ["Conv", "Relu"], ["Conv", "Add"], ["Conv", "Add", "Relu"]):
            return None
        if conv.name not in self.plan.weights or conv.name in self.equalized or self.plan.placement.get(conv.name) != "BPU":
            return None
        source = self.plan.edges.get((conv.name, 0))
        if source is None or source[1] != "int8":
            return None
        bias = conv.inputs[2] if len(conv.inputs) > 2 else ""
        if bias and bias not in self.graph.initializers:
            return None
        if len(chain) < 2 or chain[1].op_type != "Add":
            return conv, None
        add = chain[1]
        if len(add.inputs) != 2 or conv.outputs[0] not in add.inputs:
            return None
        k = 1 - list(add.inputs).index(conv.outputs[0])
        residual = self.plan.edges.get((add.name, k))
        if residual is None or residual[0] in self.per_channel or residual[1] != "int8":
            return None
        s_r = self.point_scale(residual[0], residual[1], False)
        if not s_r.per_tensor_symmetric:
            return None
        return conv, (add.name, k, float(s_r.scale))


def _dtypes_by_tensor(reads: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """``(tensor, dtype)`` reads -> tensor: the dtypes it is read in."""
    out: dict[str, list[str]] = defaultdict(list)
    for t, d in reads:
        out[t].append(d)
    return out
