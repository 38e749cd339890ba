"""Run hb_mapper's ``*_calibrated_model.onnx`` in plain onnxruntime, without Horizon's runtime.

docs/hb_rules/quantizer.md §4.2: each ``HzCalibration`` node becomes the equivalent fake quantization
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
from tuner.inputs.calibrated import OP, CalibratedModel
from tuner.inputs.hzops import HORIZON, WithInput, plain_model
from tuner.metrics import Similarity
from tuner.runtime import fakequant
from tuner.runtime.session import make_session, run_samples
from tuner.simulate.realscales import node_scale

MS = "com.microsoft"


def _fake_quant(hz: WithInput, inits: list[TensorProto], fused: bool) -> list[onnx.NodeProto]:
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
    else:   # quantize per channel, dequantize with the one value (docs/hb_rules/quantizer.md §4.2)
        inits.append(numpy_helper.from_array(np.array(s.dequant, np.float32), f"{base}__dqscale"))
        inits.append(numpy_helper.from_array(np.zeros((), zp.dtype), f"{base}__dqzp"))
        dq = helper.make_node("DequantizeLinear", [f"{base}__q", f"{base}__dqscale", f"{base}__dqzp"], [hz.output],
                              name=f"{base}__DQ", domain=MS)
    return [q, dq]


def runnable_model(cal: CalibratedModel, switch_off: bool = False, fused: bool | None = None) -> onnx.ModelProto:
    """``cal`` with every Horizon op replaced (module docstring); ``switch_off``: every calibration node
    an identity (the float model as hb_mapper has it, to check the stand-ins)."""
    fused = fakequant.library() is not None if fused is None else fused
    if switch_off:
        return plain_model(cal)
    return plain_model(cal, lambda hz, inits: _fake_quant(hz, inits, fused))


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
