"""Horizon's ops in hb_mapper's ``*_calibrated_model.onnx`` as plain ONNX, for onnxruntime.

docs/hb_rules/quantizer.md §4.2: the fused activations ``HzSwish``, ``HzHardSwish``, ``HzMish``, ``HzGelu``
get float stand-ins; ``HzPreprocess`` is an identity (tuner feeds the data already normalized as
the YAML says); any other Horizon op is an error naming it. A calibration node becomes what the
caller asks (tuner.toolchain.calibrated_run: fake quantization) or an identity; an equalized
per-channel input switched off is multiplied back by ``dequantize_scale / s_c`` (its Conv's
weight was pre-scaled by hb_mapper). :func:`plain_model` without a quantizer is the float graph
hb_mapper calibrated (its ``*_optimized_float_model.onnx``), which tuner.inputs.calibrated runs
to match its tensors to tuner's by value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tuner.errors import TunerError
from tuner.inputs.calibrated import OP, QMAX, CalibratedModel, HzNode

HORIZON = "horizon"
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


class WithInput:
    """An HzNode with the tensor its ONNX node reads (another calibration node's output, maybe)."""

    def __init__(self, hz: HzNode, tensor_input: str):
        self._hz, self.tensor_input = hz, tensor_input

    @property
    def node(self) -> HzNode:
        return self._hz

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hz, name)



#: a rounding calibration node (with the tensor its ONNX node reads) -> the nodes replacing it; it may
#: add initializers to the list
Quantize = Callable[[WithInput, list[TensorProto]], list[onnx.NodeProto]]


def plain_model(cal: CalibratedModel, quantize: Quantize | None = None) -> onnx.ModelProto:
    """``cal`` with every Horizon op replaced: each rounding calibration node by ``quantize(node,
    initializers)`` (None: every calibration node switched off, the float graph hb_mapper
    calibrated), the others by an identity, the fused ops by their float stand-ins."""
    switch_off = quantize is None
    by_output = {n.output: n for n in cal.nodes}
    model = onnx.ModelProto()
    model.CopyFrom(cal.proto)
    g = model.graph
    inits: list[TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    for node in g.node:
        if node.op_type == OP:
            hz = WithInput(by_output[node.output[0]], node.input[0])
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
                assert quantize is not None
                nodes += quantize(hz, inits)
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
    for domain in sorted({n.domain for n in nodes if n.domain not in ("", "ai.onnx")} - have):
        model.opset_import.append(helper.make_opsetid(domain, 1))
    return model


