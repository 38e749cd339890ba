"""The graph hb_mapper calibrates: what its optimizer does to the float model before calibration.

hb_mapper does not calibrate the ONNX the user exported. Its optimizer (C++, in horizon_nn) first
rewrites the graph, and every rewrite that adds, removes or merges nodes changes where the
quantization points are. tuner applies the rewrites that do, to the prepared float model, before
anything is planned or calibrated, so that the simulator quantizes the graph hb_mapper quantizes
and reports its nodes under the names hb_mapper's log prints:

* **no-op nodes removed**: ``Identity`` and ``Dropout`` (inference) disappear; their consumers read
  the input directly. On a PP-OCR export with 147 Identities, tuner put each on the CPU: 127 BPU
  subgraphs and a different accuracy (issue "Simulate hb_mapper's own quantizer").
* **constants folded**: a node whose inputs are all constants (``Constant``, a ``Shape`` of a tensor
  whose shape is static, arithmetic on them) becomes an initializer, so shape computations do not
  appear as CPU nodes that split BPU subgraphs.
* **fused activations**: ``x * sigmoid(x)`` (SiLU/Swish), ``x * hardsigmoid(x)`` (alpha 1/6, beta 1/2
  only: :data:`HB_HARD_SIGMOID`) and
  ``x * clip(x + 3, 0, 6) / 6`` (HardSwish), ``x * tanh(softplus(x))`` (Mish) and the erf / tanh
  forms of GELU are each one lookup table on the BPU: quantized once at the input and once at the
  output. Real X5 logs show SiLU as one ``HzLut`` row named after the Mul, with no Sigmoid row
  (docs/hb_rules/quantizer.md §5, log 22843858307); the fused kinds ``HzSwish``, ``HzHardSwish``, ``HzMish``
  and ``HzGelu`` are in horizon_nn's engine table (src 24962597350); toys at O0 show each form here fused
  (x * tanh(softplus(x)) -> ``HzMish``, the erf GELU -> ``HzGelu`` named after its last Mul, both HardSwish
  forms -> ``HzHardSwish``: docs/hb_rules/placement.md section 8). The
  fused node keeps the name of the region's last node (a HardSwish: its x * f(x) Mul, as hb names
  it, also before a Div by 6), and becomes an ONNX model-local function of that
  kind (domain ``tuner.hz``), which onnxruntime inlines: the float values are unchanged.
* **Div decomposed**: ``Div(a, b)`` with ``b`` computed at run time becomes ``<name>_reciprocal``
  (``Reciprocal(b)``, a LUT) and ``<name>_mul`` (``Mul(a, ·)``), as in real 1.24.3 logs
  (``…/Div_reciprocal HzLut`` + ``…/Div_mul HzSElementwiseMul``) and D-Robotics' own X5 YAMLs, which
  put int16 on ``…/Div_mul`` (docs/hb_rules/ops.md §2, Div row). A Div by a constant becomes
  ``<name>_mul``, a Mul by the reciprocal constant [inferred: the reciprocal of a constant is folded].
* **Mul by a constant lowered to a convolution**: a Mul of a feature map by a scalar or per-channel
  constant is a weight-quantized 1x1 convolution on the BPU (``HzSQuantizedConv`` in real logs, where
  it leaves the BPU as int32 before a CPU node: docs/hb_rules/ops.md §4.2 #12, #14). It becomes a node of kind
  ``HzChannelScale`` (same name as the Mul) that the target tables treat like a Conv: no LUT chaining,
  int32 output at a subgraph edge. Its constant, being scalar or one value per channel, is exact under
  per-output-channel int8 weight quantization (so the simulator keeps it float: not a plan weight).

* **Softmax on the BPU** is six quantized ops: :mod:`tuner.graph.softmax` (the graph keeps one
  Softmax, whose placement depends on the candidate).

* **constants folded into Convs** (:mod:`tuner.graph.convfold`): scales,
  shifts and BatchNormalization after a Conv, a lowered Mul's Add, and a lowered Mul before an
  unpadded Conv become Conv weights and biases, as hb's optimized graphs show (toy models measured
  on hb_mapper 1.24.3; docs/hb_rules/placement.md section 6).

:class:`tuner.graph.names.NameMap` remembers every rewrite, so that ``node_info`` may use either name.
"""

from __future__ import annotations

import onnx

from tuner.graph.activations import fuse_activations
from tuner.graph.cleanup import drop_noops, fold_constants
from tuner.graph.convfold import fold_channel_scales, fold_into_convs
from tuner.graph.hz import HB_HARD_SIGMOID, HZ_DOMAIN, HZ_KINDS, hz_kind, is_hb_hard_sigmoid
from tuner.graph.lower import lower_channel_scales, split_div, split_where
from tuner.graph.names import NameMap

#: re-exported from their own home, :mod:`tuner.graph.hz`
__all__ = ["HB_HARD_SIGMOID", "HZ_DOMAIN", "HZ_KINDS", "hz_kind", "is_hb_hard_sigmoid", "optimize"]


def optimize(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, NameMap]:
    """The optimized copy of a prepared model (named nodes, static input shapes, shapes inferred).

    Pure: ``proto`` is not changed. The result computes the same function (onnxruntime inlines the
    fused nodes' functions; a decomposed Div differs from the original by float rounding only).
    """
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    names = NameMap()
    original = {n.name for n in model.graph.node}
    fold_constants(model, names)
    drop_noops(model, names)
    fold_into_convs(model, names)
    fuse_activations(model, names)
    split_div(model, names)
    split_where(model, names)
    lower_channel_scales(model, names, original)
    fold_channel_scales(model, names)
    if any(r.nodes for r in names.rewrites.values()) or model.functions:
        if model.ir_version < 8:
            model.ir_version = 8   # model-local functions need IR 8 (simulation only: never exported)
    return model, names
