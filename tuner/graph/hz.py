"""hb_mapper's fused node kinds as tuner's optimized graph writes them (``Hz*`` nodes, domain ``tuner.hz``).

The passes of :mod:`tuner.graph.optimize` write a fused activation or a lowered Mul as a node of an
ONNX model-local function in :data:`HZ_DOMAIN`; :func:`hz_kind` is the op type
:class:`tuner.graph.Graph` reports for such a node.
"""

from __future__ import annotations

import onnx

#: The domain of the fused nodes' model-local functions.
HZ_DOMAIN = "tuner.hz"

#: (alpha, beta) of the HardSigmoid hb's BPU table computes, whatever the node's own attributes: the
#: int8 ``HzLut`` and int16 ``HzLut2Layer`` tables of HardSigmoid nodes with alpha/beta 0.2/0.5, 0.5/0.3
#: and 0.1/0.4 all equal min(1, max(0, x/6 + 1/2)) within one output step (toy Conv -> HardSigmoid ->
#: Conv converted at O0: the tables read from the quantized models, the int16 one run with hmct's
#: executor), and hb's derived output threshold is that function of the input threshold (2.2898 ->
#: 0.8816 with alpha 0.2). Only such a HardSigmoid makes ``x * hardsigmoid(x)`` a HardSwish: with alpha
#: 0.2 hb keeps the HardSigmoid and the Mul (toy x * HardSigmoid(x; 0.2, 0.5): two nodes in its
#: optimized model; 1/6: one ``HzHardSwish``).
HB_HARD_SIGMOID = (1.0 / 6.0, 0.5)


def is_hb_hard_sigmoid(node: onnx.NodeProto) -> bool:
    """Whether a HardSigmoid node computes the function hb's table computes (alpha 1/6, beta 1/2;
    exporters write 1/6 rounded, 0.1666667, so within 1e-5)."""
    attrs = {a.name: a.f for a in node.attribute}
    return (abs(attrs.get("alpha", 0.2) - HB_HARD_SIGMOID[0]) < 1e-5
            and abs(attrs.get("beta", 0.5) - HB_HARD_SIGMOID[1]) < 1e-5)


#: Kinds of fused node the optimizer's passes write (their op_type in :class:`tuner.graph.Graph`).
HZ_KINDS = ("HzSwish", "HzHardSwish", "HzMish", "HzGelu", "HzChannelScale")


def hz_kind(op_type: str, domain: str) -> str:
    """The op type :class:`tuner.graph.Graph` reports for a node: a fused node's kind (``HzSwish``)."""
    if domain == HZ_DOMAIN:
        return op_type.split("__", 1)[0]
    return op_type
