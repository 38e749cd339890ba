"""Run hb_mapper's ``*_calibrated_model.onnx`` in plain onnxruntime, without Horizon's runtime.

hb_quantizer_facts 4.2: each ``HzCalibration`` node becomes the equivalent fake quantization
(tuner's FakeQuant node, or QuantizeLinear/DequantizeLinear): switch OFF or a non-integer qtype is
an identity (float16: a round trip through float16); scale = threshold / qmax(qtype) per entry of
``thresholds`` along ``axis``; uint8 is [0, T] with zero point 0, or [min, max]; a node with
``dequantize_scale`` quantizes with its channel scales and dequantizes with that one value (the
Conv weight after it was pre-scaled by hb_mapper's equalization). Other ``horizon`` ops get float
stand-ins where their maths are known (the fused activations ``HzSwish``, ``HzHardSwish``,
``HzMish``, ``HzGelu``; ``HzPreprocess`` is an identity because tuner feeds the data already
normalized as the YAML says); any other is an error naming it. The result is the fake-quant model
hb_mapper itself scores, not the integer ``quantized_model.onnx``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from tuner.errors import TunerError
from tuner.inputs.calibrated import OP, QMAX, CalibratedModel, HzNode
from tuner.metrics import Similarity
from tuner.runtime import fakequant
from tuner.runtime.session import make_session, run_samples
from tuner.simulate.realscales import node_scale

HORIZON = "horizon"
MS = "com.microsoft"
FLOAT_STANDINS = ("HzSwish", "HzHardSwish", "HzMish", "HzGelu", "HzPreprocess")


def _const(name: str, value: float) -> TensorProto:
    return numpy_helper.from_array(np.array(value, np.float32), name)


def _standin(node: onnx.NodeProto, inits: list[TensorProto]) -> list[onnx.NodeProto]:
    """Float nodes computing what the fused ``horizon`` op ``node`` computes."""
    x, y, p = node.input[0], node.output[0], f"{node.name or node.output[0]}__float"
    kind = node.op_type
    if kind == "HzPreprocess":
        return [helper.make_node("Identity", [x], [y], name=p)]
    if kind == "HzSwish":
        return [helper.make_node("Sigmoid", [x], [f"{p}_s"], name=f"{p}_sigmoid"),
                helper.make_node("Mul", [x, f"{p}_s"], [y], name=f"{p}_mul")]
    if kind == "HzHardSwish":
        return [helper.make_node("HardSigmoid", [x], [f"{p}_s"], name=f"{p}_hsig", alpha=1.0 / 6.0, beta=0.5),
                helper.make_node("Mul", [x, f"{p}_s"], [y], name=f"{p}_mul")]
    if kind == "HzMish":
        return [helper.make_node("Softplus", [x], [f"{p}_sp"], name=f"{p}_softplus"),
                helper.make_node("Tanh", [f"{p}_sp"], [f"{p}_t"], name=f"{p}_tanh"),
                helper.make_node("Mul", [x, f"{p}_t"], [y], name=f"{p}_mul")]
    if kind == "HzGelu":
        inits += [_const(f"{p}_rsqrt2", 1.0 / math.sqrt(2.0)), _const(f"{p}_one", 1.0), _const(f"{p}_half", 0.5)]
        return [helper.make_node("Mul", [x, f"{p}_rsqrt2"], [f"{p}_a"], name=f"{p}_scale"),
                helper.make_node("Erf", [f"{p}_a"], [f"{p}_e"], name=f"{p}_erf"),
                helper.make_node("Add", [f"{p}_e", f"{p}_one"], [f"{p}_b"], name=f"{p}_add"),
                helper.make_node("Mul", [x, f"{p}_b"], [f"{p}_c"], name=f"{p}_mul"),
                helper.make_node("Mul", [f"{p}_c", f"{p}_half"], [y], name=f"{p}_half_mul")]
    raise TunerError(f"node {node.name!r} ({node.op_type}, domain horizon): no float stand-in is known for this "
                     f"Horizon op (known: HzCalibration, {', '.join(FLOAT_STANDINS)}), so the calibrated model "
                     "cannot run in plain onnxruntime")


def _fake_quant(hz: _WithInput, inits: list[TensorProto], fused: bool) -> list[onnx.NodeProto]:
    s = node_scale(hz.node, hz.qtype, channel=len(hz.thresholds) > 1)
    base = hz.name
    scale = np.asarray(s.scale, np.float32)
    inits.append(numpy_helper.from_array(scale, f"{base}__scale"))
    lo_hi = fakequant.bounds(s.zero_point) if fused else None
    if s.dequant is None and lo_hi is not None:
        return [fakequant.make_node(hz.tensor_input, f"{base}__scale", hz.output, f"{base}__FQ", *lo_hi, s.axis)]
    zp = np.asarray(s.zero_point)
    inits.append(numpy_helper.from_array(zp, f"{base}__zp"))
    axis: dict[str, Any] = {"axis": s.axis} if s.axis is not None else {}
    q = helper.make_node("QuantizeLinear", [hz.tensor_input, f"{base}__scale", f"{base}__zp"], [f"{base}__q"],
                         name=f"{base}__Q", domain=MS, **axis)
    if s.dequant is None:
        dq = helper.make_node("DequantizeLinear", [f"{base}__q", f"{base}__scale", f"{base}__zp"], [hz.output],
                              name=f"{base}__DQ", domain=MS, **axis)
    else:   # quantize per channel, dequantize with the one value (facts 4.2)
        inits.append(numpy_helper.from_array(np.array(s.dequant, np.float32), f"{base}__dqscale"))
        inits.append(numpy_helper.from_array(np.zeros((), zp.dtype), f"{base}__dqzp"))
        dq = helper.make_node("DequantizeLinear", [f"{base}__q", f"{base}__dqscale", f"{base}__dqzp"], [hz.output],
                              name=f"{base}__DQ", domain=MS)
    return [q, dq]


def runnable_model(cal: CalibratedModel, switch_off: bool = False, fused: bool | None = None) -> onnx.ModelProto:
    """``cal`` with every Horizon op replaced (module docstring); ``switch_off``: every calibration node
    an identity (the float model as hb_mapper has it, to check the stand-ins)."""
    fused = fakequant.library() is not None if fused is None else fused
    by_output = {n.output: n for n in cal.nodes}
    model = onnx.ModelProto()
    model.CopyFrom(cal.proto)
    g = model.graph
    inits: list[TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    for node in g.node:
        if node.op_type == OP:
            hz = _WithInput(by_output[node.output[0]], node.input[0])
            if (switch_off or not hz.quantizes) and hz.dequantize_scale is not None and hz.per_channel:
                # the float value the equalized Conv expects: x * dequantize_scale / s_c (its weight was
                # pre-scaled by s_c / dequantize_scale); a plain identity would leave that scaling in
                ratio = hz.dequantize_scale * QMAX.get(hz.qtype, 127) / np.array([max(abs(t), 1e-30) for t in hz.thresholds])
                inits.append(numpy_helper.from_array(ratio.astype(np.float32).reshape(-1, 1, 1), f"{hz.name}__unscale"))
                nodes.append(helper.make_node("Mul", [hz.tensor_input, f"{hz.name}__unscale"], [hz.output],
                                              name=f"{hz.name}__off"))
            elif switch_off or not hz.quantizes:
                if not switch_off and hz.on and hz.qtype == "float16":
                    nodes += [helper.make_node("Cast", [hz.tensor_input], [f"{hz.name}__f16"], name=f"{hz.name}__to16",
                                               to=TensorProto.FLOAT16),
                              helper.make_node("Cast", [f"{hz.name}__f16"], [hz.output], name=f"{hz.name}__to32",
                                               to=TensorProto.FLOAT)]
                else:
                    nodes.append(helper.make_node("Identity", [hz.tensor_input], [hz.output], name=f"{hz.name}__off"))
            else:
                nodes += _fake_quant(hz, inits, fused)
        elif node.domain == HORIZON or node.op_type.startswith("Hz"):
            nodes += _standin(node, inits)
        else:
            nodes.append(node)
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(inits)
    keep = [o for o in model.opset_import if o.domain != HORIZON]
    del model.opset_import[:]
    model.opset_import.extend(keep)
    have = {o.domain for o in model.opset_import}
    if not any(o.domain in ("", "ai.onnx") for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("", 13))
    for domain in sorted({n.domain for n in nodes} & {MS, fakequant.DOMAIN} - have):
        model.opset_import.append(helper.make_opsetid(domain, 1))
    return model


class _WithInput:
    """An HzNode with the tensor its ONNX node reads (another calibration node's output, maybe)."""

    def __init__(self, hz: HzNode, tensor_input: str):
        self._hz, self.tensor_input = hz, tensor_input

    @property
    def node(self) -> HzNode:
        return self._hz

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hz, name)


@dataclass
class PcCheck:
    """The calibrated model run on the PC against the float model, per output, on the YAML's data."""

    outputs: dict[str, dict[str, float]]
    samples: int
    switched_off_cosine: float           # min over outputs: the calibrated model with calibration off
    replaced: int                        # HzCalibration nodes turned into fake quantization
    identities: int                      # switch OFF / non-integer qtype
    standins: dict[str, int] = field(default_factory=dict)   # Horizon op type -> count
    notes: list[str] = field(default_factory=list)

    @property
    def mean_cosine(self) -> float:
        return float(np.mean([m["cosine"] for m in self.outputs.values()])) if self.outputs else math.nan

    def as_dict(self) -> dict:
        return {"outputs": self.outputs, "samples": self.samples, "switched_off_cosine": self.switched_off_cosine,
                "replaced": self.replaced, "identities": self.identities, "standins": self.standins,
                "notes": self.notes, "mean_cosine": self.mean_cosine}

    @classmethod
    def from_dict(cls, d: dict) -> PcCheck:
        return cls(outputs=d["outputs"], samples=d["samples"], switched_off_cosine=d["switched_off_cosine"],
                   replaced=d["replaced"], identities=d["identities"], standins=dict(d.get("standins", {})),
                   notes=list(d.get("notes", [])))


def check_on_pc(cal: CalibratedModel, float_model: onnx.ModelProto, data, threads: int | None = None) -> PcCheck:
    """Run the calibrated model (fake quant) and the float model on ``data`` (the YAML's samples)."""
    fq = runnable_model(cal)
    off = runnable_model(cal, switch_off=True)
    names = [o.name for o in float_model.graph.output]
    have = {o.name for o in cal.proto.graph.output}
    missing = [n for n in names if n not in have]
    if missing:
        raise TunerError(f"{cal.path}: has no output {missing[0]!r} of the float model (outputs: "
                         f"{', '.join(sorted(have))}); is it the calibrated model of this YAML's onnx_model?")
    try:
        sessions = [make_session(m) for m in (fq, off)]
    except (ort.capi.onnxruntime_pybind11_state.Fail, RuntimeError, ValueError) as exc:
        raise TunerError(f"{cal.path}: onnxruntime cannot run it after the Horizon ops were replaced: "
                         f"{str(exc).splitlines()[0][:300]}") from None
    inputs = {i.name for i in sessions[0].get_inputs()}
    ref_session = make_session(float_model)
    sims = {o: Similarity() for o in names}
    off_sims = {o: Similarity() for o in names}
    n = 0
    for sample, ref in run_samples(ref_session, names, data, threads, with_inputs=True):
        unknown = inputs - set(sample)
        if unknown:
            raise TunerError(f"{cal.path}: input {sorted(unknown)[0]!r} is not an input of the YAML's model "
                             f"({', '.join(sample)})")
        feed = {k: v for k, v in sample.items() if k in inputs}
        try:
            got = sessions[0].run(names, feed)
            got_off = sessions[1].run(names, feed)
        except Exception as exc:
            raise TunerError(f"{cal.path}: onnxruntime failed running it: {str(exc).splitlines()[0][:300]}") from None
        for o, r, q, q0 in zip(names, ref, got, got_off):
            sims[o].update(r, q)
            off_sims[o].update(r, q0)
        n += 1
    ops = [node.op_type for node in cal.proto.graph.node if node.op_type != OP
           and (node.domain == HORIZON or node.op_type.startswith("Hz"))]
    standins = {k: ops.count(k) for k in sorted(set(ops))}
    notes = []
    if "HzPreprocess" in standins:
        notes.append("HzPreprocess run as an identity: tuner feeds the data already normalized with the YAML's "
                     "mean/scale")
    off_cos = min(s.cosine for s in off_sims.values()) if off_sims else math.nan
    if off_cos < 0.99999:
        notes.append(f"with every calibration node switched off it matches the float model only to cosine "
                     f"{off_cos:.6f}: a stand-in or a graph rewrite differs from the float model")
    return PcCheck(outputs={o: s.as_dict() for o, s in sims.items()}, samples=n, switched_off_cosine=off_cos,
                   replaced=sum(1 for h in cal.nodes if h.quantizes), identities=sum(1 for h in cal.nodes
                                                                                    if not h.quantizes),
                   standins=standins, notes=notes)
