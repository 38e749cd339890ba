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
  and ``HzGelu`` are in horizon_nn's engine table (src 24962597350) [inferred for Mish and GELU: no
  real log shows them fused; the patterns are the usual exporter forms; HardSwish measured]. The
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

* **constants folded into Convs** (:func:`_fold_into_convs`, :func:`_fold_channel_scales`): scales,
  shifts and BatchNormalization after a Conv, a lowered Mul's Add, and a lowered Mul before an
  unpadded Conv become Conv weights and biases, as hb's optimized graphs show (toy models measured
  on hb_mapper 1.24.3; docs/hb_rules/placement.md section 6).

:class:`tuner.graph.names.NameMap` remembers every rewrite, so that ``node_info`` may use either name.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from typing import cast

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tuner.graph.names import NameMap, Rewrite

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
#: Kinds of fused node this module writes (their op_type in :class:`tuner.graph.Graph`).
HZ_KINDS = ("HzSwish", "HzHardSwish", "HzMish", "HzGelu", "HzChannelScale")

NOOP_OPS = ("Identity", "Dropout")
#: Shape ops that are no-ops when their output has their input's shape (hb's optimized graph drops
#: them: the example's Expand + Reshape before its ScatterND are gone there).
SAME_SHAPE_NOOPS = ("Expand", "Reshape", "Flatten", "Squeeze", "Unsqueeze")
#: Element-wise ops a fused activation region may contain.
_REGION_OPS = frozenset({"Sigmoid", "HardSigmoid", "Tanh", "Softplus", "Erf", "Exp", "Log", "Clip", "Relu",
                         "Add", "Sub", "Mul", "Div", "Pow", "Sqrt"})
_NONDETERMINISTIC = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                               "Multinomial", "Bernoulli"})
#: Folding stops at constants larger than this (a graph's weights are not recomputed).
_FOLD_MAX_ELEMENTS = 1 << 22


def optimize(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, NameMap]:
    """The optimized copy of a prepared model (named nodes, static input shapes, shapes inferred).

    Pure: ``proto`` is not changed. The result computes the same function (onnxruntime inlines the
    fused nodes' functions; a decomposed Div differs from the original by float rounding only).
    """
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    names = NameMap()
    original = {n.name for n in model.graph.node}
    _fold(model, names)
    _drop_noops(model, names)
    _fold_into_convs(model, names)
    _fuse_activations(model, names)
    _split_div(model, names)
    _split_where(model, names)
    _lower_channel_scales(model, names, original)
    _fold_channel_scales(model, names)
    if any(r.nodes for r in names.rewrites.values()) or model.functions:
        if model.ir_version < 8:
            model.ir_version = 8   # model-local functions need IR 8 (simulation only: never exported)
    return model, names


# -- helpers ---------------------------------------------------------------------------------


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    users: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for n in graph.node:
        for t in n.input:
            if t:
                users[t].append(n)
    return users


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    out = {}
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            out[vi.name] = tuple(d.dim_value for d in tt.shape.dim)
    return out


# -- constant folding ------------------------------------------------------------------------


def _fold(model: onnx.ModelProto, names: NameMap) -> None:
    """Replace nodes computable from constants alone by initializers (one pass in graph order)."""
    graph = model.graph
    consts = {t.name: t for t in graph.initializer}
    shapes = _shapes(model)
    outputs = {o.name for o in graph.output}
    opset = [o for o in model.opset_import]
    keep = []
    for node in graph.node:
        value: list[np.ndarray] | None = None
        if node.domain in ("", "ai.onnx") and node.op_type not in _NONDETERMINISTIC and not (set(node.output) & outputs):
            if node.op_type == "Shape" and node.input[0] in shapes and not node.attribute:
                value = [np.array(shapes[node.input[0]], dtype=np.int64)]
            elif node.op_type == "Size" and node.input[0] in shapes:
                value = [np.array(int(np.prod(shapes[node.input[0]])), dtype=np.int64)]
            elif node.input and all((not t) or t in consts for t in node.input) and node.op_type != "Constant":
                if sum(int(np.prod(consts[t].dims)) for t in node.input if t) <= _FOLD_MAX_ELEMENTS:
                    try:
                        feeds = {t: numpy_helper.to_array(consts[t]) for t in node.input if t}
                        body = helper.make_graph([node], "fold", [helper.make_tensor_value_info(t, consts[t].data_type, None)
                                                                  for t in feeds], [helper.make_tensor_value_info(o, 0, None)
                                                                                    for o in node.output if o])
                        # run(None, ...) returns the list of outputs
                        value = list(cast(list[np.ndarray],
                                          ReferenceEvaluator(helper.make_model(body, opset_imports=opset)).run(None, feeds)))
                    except Exception:
                        value = None   # an op the reference cannot run stays (hb_mapper may fold it; rare)
        if value is None:
            keep.append(node)
            continue
        for out, v in zip([o for o in node.output if o], value):
            t = numpy_helper.from_array(np.asarray(v), out)
            graph.initializer.append(t)
            consts[out] = t
        names.rewrites[node.name] = Rewrite(node.name, node.op_type, (), (), None, "constant folded")
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)
    used = {t for n in graph.node for t in n.input} | outputs
    unused = [t for t in graph.initializer if t.name not in used]
    for t in unused:
        graph.initializer.remove(t)


# -- no-op nodes -----------------------------------------------------------------------------


def _drop_noops(model: onnx.ModelProto, names: NameMap) -> None:
    graph = model.graph
    outputs = {o.name for o in graph.output}
    inputs = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    rename: dict[str, str] = {}
    keep = []
    producer = {o: n for n in graph.node for o in n.output}
    shapes = _shapes(model)
    for node in graph.node:
        noop = node.op_type in NOOP_OPS and node.domain in ("", "ai.onnx") and node.input and node.input[0]
        if node.op_type in SAME_SHAPE_NOOPS and node.domain in ("", "ai.onnx") and node.input and node.output:
            src_shape = shapes.get(node.input[0])
            noop = src_shape is not None and src_shape == shapes.get(node.output[0])
        if noop and node.op_type == "Dropout" and (len(node.output) > 1 and node.output[1]):
            noop = False   # its mask is read: keep it (CPU)
        if not noop:
            keep.append(node)
            continue
        src, out = node.input[0], node.output[0]
        while src in rename:
            src = rename[src]
        if out in outputs:
            # A graph output: the producer writes it under the output's name instead.
            p = producer.get(src)
            if p is None or src in outputs or src in inputs or any(src in n.input for n in graph.node if n is not node):
                keep.append(node)
                continue
            p.output[list(p.output).index(src)] = out
            producer[out] = p
            rename[src] = out
        else:
            rename[out] = src
        names.rewrites[node.name] = Rewrite(node.name, node.op_type, (), (), None, f"{node.op_type} removed")
    if len(keep) == len(graph.node):
        return
    for node in keep:
        for k, t in enumerate(node.input):
            while t in rename:
                t = rename[t]
            node.input[k] = t
    del graph.node[:]
    graph.node.extend(keep)


# -- BatchNormalization folded into its Conv ------------------------------------------------


def _per_channel(value: np.ndarray, c_out: int, rank: int) -> np.ndarray | None:
    """A constant that broadcasts over a rank-``rank`` [N, C, ...] map as one value, or one value per
    channel C = ``c_out``: its ``c_out`` values, float64. None for any other shape (a (C,) vector
    broadcasts along the last axis, not the channels)."""
    if value.size == 1 and value.ndim <= rank:
        return np.full(c_out, float(value.reshape(-1)[0]))
    if value.ndim > rank or value.ndim < 2:
        return None
    shape = (1,) * (rank - value.ndim) + value.shape
    if shape[1] != c_out or any(d != 1 for k, d in enumerate(shape) if k != 1):
        return None
    return value.reshape(-1).astype(np.float64)


def _fold_into_convs(model: onnx.ModelProto, names: NameMap) -> None:
    """What hb's optimizer folds into a Conv or ConvTranspose that writes it (``fuse_mul_into_conv``,
    ``fuse_div_into_conv``, ``fuse_add_or_sub_into_conv``, ``fuse_bn_into_conv``, ... in horizon_nn's
    C++ optimizer; the real toolchain's optimized graphs): a ``Mul`` or ``Div`` by a scalar or
    per-channel constant, an ``Add`` (either order) or ``Sub`` (``x - c``) of one, and a
    BatchNormalization, each read from a Conv's output that nothing else reads, one after the other
    (PP-OCRv4's ``Conv -> Mul(k) -> Add(b)`` blocks are one Conv there, biased ``<conv><b>_fuse_add_sub``).
    The Conv writes the folded node's output (a Div's consumers read the Conv's instead, as hb
    leaves it). Measured with toy models on hb_mapper 1.24.3 (``optimized_float_model.onnx``):
    Conv+Mul(0.5)+Add(0.1) and Conv+Sub, Conv+Div(2), ConvTranspose+Mul folded; an Add into a Conv with a
    **single output channel** is not (Conv and ConvTranspose, constant [1] or [1,1,1,1]; PP-OCR's last
    ConvTranspose keeps its ``Add``), a Mul is; a Conv whose output has a second reader folds nothing.
    Unfolded, tuner quantized between them: PP-OCRv4's detector (BNs after two Convs and after a
    ConvTranspose + bias Add) simulated set_all_nodes_int16 to cosine 0 (the real quantized model: 0.988)."""
    graph = model.graph
    consts = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    drop: set[int] = set()
    changed = True
    while changed:
        changed = False
        users = _consumers(graph)
        for conv in graph.node:
            if id(conv) in drop or conv.op_type not in ("Conv", "ConvTranspose") or len(conv.input) < 2 \
                    or conv.input[1] not in consts or conv.output[0] in outputs:
                continue
            readers = [u for u in users.get(conv.output[0], []) if id(u) not in drop]
            if len(readers) != 1:
                continue
            node = readers[0]
            folded = _fold_one(graph, consts, conv, node)
            if folded is None:
                continue
            drop.add(id(node))
            if node.op_type == "Div" and node.output[0] not in outputs:
                for u in users.get(node.output[0], []):     # hb keeps the Conv's output name
                    for k, t in enumerate(u.input):
                        if t == node.output[0]:
                            u.input[k] = conv.output[0]
            else:
                conv.output[0] = node.output[0]
            names.rewrites[node.name] = Rewrite(node.name, node.op_type, (), (), None,
                                                f"{folded} folded into {conv.name}")
            changed = True
            break
    if drop:
        keep = [n for n in graph.node if id(n) not in drop]
        del graph.node[:]
        graph.node.extend(keep)
        used = {t for n in graph.node for t in n.input} | outputs
        for t in [t for t in graph.initializer if t.name not in used]:
            graph.initializer.remove(t)


def _fold_one(graph: onnx.GraphProto, consts: dict[str, onnx.TensorProto], conv: onnx.NodeProto,
              node: onnx.NodeProto) -> str | None:
    """Fold ``node`` (the only reader of ``conv``'s output) into ``conv``'s weight and bias: what was
    folded (for the rewrite's note), or None when hb's optimizer leaves it."""
    if node.domain not in ("", "ai.onnx"):
        return None
    x = conv.output[0]
    group = next((a.i for a in conv.attribute if a.name == "group"), 1)
    w = numpy_helper.to_array(consts[conv.input[1]]).astype(np.float64)
    transpose = conv.op_type == "ConvTranspose"
    axis = 1 if transpose else 0
    c_out = w.shape[axis] * (group if transpose else 1)
    has_bias = len(conv.input) > 2 and bool(conv.input[2])
    if has_bias and conv.input[2] not in consts:
        return None
    b = numpy_helper.to_array(consts[conv.input[2]]).astype(np.float64) if has_bias else np.zeros(c_out)
    scale: np.ndarray | None = None
    shift = np.zeros(c_out)
    what = node.op_type
    if node.op_type in ("Mul", "Div", "Add", "Sub") and len(node.input) == 2:
        k = [i for i, t in enumerate(node.input) if t in consts]
        if len(k) != 1 or node.input[1 - k[0]] != x or (node.op_type in ("Div", "Sub") and k[0] != 1):
            return None
        value = _per_channel(numpy_helper.to_array(consts[node.input[k[0]]]), c_out, w.ndim)
        if value is None:
            return None
        if node.op_type in ("Mul", "Div"):
            if node.op_type == "Div" and not np.all(value != 0):
                return None
            scale = value if node.op_type == "Mul" else 1.0 / value
        else:
            if c_out == 1:
                return None     # measured: hb leaves an Add after a single-output-channel Conv
            shift = value if node.op_type == "Add" else -value
            what = f"{node.op_type} of a constant"
    elif node.op_type == "BatchNormalization" and len(node.input) >= 5 and all(t in consts for t in node.input[1:5]) \
            and not any(node.output[1:]):
        gamma, beta, mean, var = (numpy_helper.to_array(consts[t]).astype(np.float64).reshape(-1)
                                  for t in node.input[1:5])
        if gamma.size != c_out:
            return None
        eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
        scale = gamma / np.sqrt(var + eps)
        shift = beta - mean * scale
        what = "BatchNormalization"
    else:
        return None
    if scale is not None:
        if transpose and group != 1:
            return None     # its output channels are not one weight axis
        shape = [1] * w.ndim
        shape[axis] = c_out
        w = w * scale.reshape(shape)
        b = b * scale
    b = b + shift
    base = conv.name or conv.output[0]
    if scale is not None:
        w_name = _unique(f"{base}_hz_weight", set(consts))
        consts[w_name] = numpy_helper.from_array(w.astype(np.float32), w_name)
        graph.initializer.append(consts[w_name])
        conv.input[1] = w_name
    b_name = _unique(f"{base}_hz_bias", set(consts))
    consts[b_name] = numpy_helper.from_array(b.astype(np.float32), b_name)
    graph.initializer.append(consts[b_name])
    del conv.input[2:]
    conv.input.append(b_name)
    return what


# -- fused activations -----------------------------------------------------------------------


def _kind(ops: Counter) -> str | None:
    """Which fused activation a single-source element-wise region computes (by its op multiset)."""
    kinds = {
        "HzSwish": [Counter({"Sigmoid": 1, "Mul": 1})],
        "HzHardSwish": [Counter({"HardSigmoid": 1, "Mul": 1}), Counter({"Add": 1, "Clip": 1, "Mul": 1, "Div": 1}),
                        Counter({"Add": 1, "Clip": 1, "Mul": 2}), Counter({"Add": 1, "Relu": 1, "Clip": 1, "Mul": 1, "Div": 1})],
        "HzMish": [Counter({"Softplus": 1, "Tanh": 1, "Mul": 1}), Counter({"Exp": 1, "Add": 1, "Log": 1, "Tanh": 1, "Mul": 1})],
    }
    for kind, forms in kinds.items():
        if ops in forms:
            return kind
    if ops["Erf"] == 1 and ops["Mul"] >= 2 and set(ops) <= {"Erf", "Mul", "Div", "Add"}:
        return "HzGelu"
    if ops["Tanh"] == 1 and ops["Pow"] + ops["Mul"] >= 4 and set(ops) <= {"Tanh", "Mul", "Add", "Pow"}:
        return "HzGelu"
    return None


def _region(end: onnx.NodeProto, producer: dict[str, onnx.NodeProto], users: dict[str, list[onnx.NodeProto]],
            consts: set[str], outputs: set[str]) -> tuple[list[onnx.NodeProto], str, str] | None:
    """The largest single-source element-wise region ending at ``end`` that computes a known fused
    activation: (nodes, source tensor, kind)."""
    closure = {id(end): end}
    stack = [end]
    while stack:
        n = stack.pop()
        for t in n.input:
            p = producer.get(t)
            if p is None or t in consts or id(p) in closure or p.op_type not in _REGION_OPS or t in outputs:
                continue
            if p.domain not in ("", "ai.onnx") or len(p.output) != 1:
                continue
            closure[id(p)] = p
            stack.append(p)
    members = list(closure.values())
    # Candidate sources: activation tensors read by the closure. For each, keep the members that
    # depend on it; the region is valid when every member reads only the source, constants or
    # other members, and every member except ``end`` is read only inside the region.
    best: tuple[list[onnx.NodeProto], str, str] | None = None
    for src in {t for n in members for t in n.input if t and t not in consts}:
        region_ids: set[int] = set()
        changed = True
        produced = {src}
        while changed:
            changed = False
            for n in members:
                if id(n) not in region_ids and any(t in produced for t in n.input):
                    region_ids.add(id(n))
                    produced.update(n.output)
                    changed = True
        region = [n for n in members if id(n) in region_ids]
        if end not in region or len(region) < 2:
            continue
        ok = all(all((not t) or t in consts or t == src or (t in produced and t != src) for t in n.input) for n in region)
        ok = ok and all(n is end or all(u in region for u in users.get(n.output[0], [])) for n in region)
        ok = ok and src not in {n.output[0] for n in region}
        # x * f(x): some Mul multiplies two values computed from the source (sigmoid(x) * 80 is no SiLU)
        ok = ok and any(n.op_type == "Mul" and all(t and t not in consts for t in n.input) for n in region)
        kind = _kind(Counter(n.op_type for n in region)) if ok else None
        if kind == "HzHardSwish" and not all(is_hb_hard_sigmoid(n) for n in region if n.op_type == "HardSigmoid"):
            kind = None     # x * hardsigmoid(x) with another slope is no HardSwish for hb (HB_HARD_SIGMOID)
        if kind is not None and (best is None or len(region) > len(best[0])):
            best = (region, src, kind)
    return best


def _fuse_activations(model: onnx.ModelProto, names: NameMap) -> None:
    graph = model.graph
    consts = {t.name for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    producer = {o: n for n in graph.node for o in n.output}
    users = _consumers(graph)
    order = {id(n): i for i, n in enumerate(graph.node)}
    taken: set[int] = set()
    replace: dict[int, onnx.NodeProto | None] = {}
    functions: dict[bytes, onnx.FunctionProto] = {}
    per_kind: Counter = Counter()
    default_opset = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    for end in reversed(list(graph.node)):   # later ends first: the largest regions win
        if id(end) in taken or end.op_type not in ("Mul", "Div") or end.domain not in ("", "ai.onnx"):
            continue
        found = _region(end, producer, users, consts, outputs)
        if found is None:
            continue
        region, src, kind = found
        if any(id(n) in taken for n in region):
            continue
        region.sort(key=lambda n: order[id(n)])
        fn_inputs = [src] + sorted({t for n in region for t in n.input if t in consts})
        local = {t: f"i{k}" for k, t in enumerate(fn_inputs)}
        local[end.output[0]] = "y"
        body = []
        for n in region:
            b = onnx.NodeProto()
            b.CopyFrom(n)
            b.name = ""
            for k, t in enumerate(b.input):
                if t:
                    b.input[k] = local.setdefault(t, f"t{len(local)}")
            for k, t in enumerate(b.output):
                b.output[k] = local.setdefault(t, f"t{len(local)}")
            body.append(b)
        key = kind.encode() + b"|" + b"".join(b.SerializeToString() for b in body)
        if key not in functions:
            fname = f"{kind}__{per_kind[kind]}"
            per_kind[kind] += 1
            functions[key] = helper.make_function(HZ_DOMAIN, fname, [f"i{k}" for k in range(len(fn_inputs))], ["y"],
                                                  body, default_opset)
        fn = functions[key]
        # named after the region's last node (SiLU: its Mul), HardSwish after its x * f(x) Mul even when a
        # Div by 6 follows (measured: x * clip(x + 3, 0, 6) / 6 is hb's ``HzHardSwish <the Mul>``)
        head = next((n for n in region if n.op_type == "Mul" and all(t and t not in consts for t in n.input)), end) \
            if kind == "HzHardSwish" else end
        fused = helper.make_node(fn.name, fn_inputs, [end.output[0]], name=head.name, domain=HZ_DOMAIN)
        for n in region:
            taken.add(id(n))
            replace[id(n)] = None
            names.rewrites[n.name] = Rewrite(n.name, n.op_type, (head.name,),
                                             tuple((k, head.name, 0) for k, t in enumerate(n.input) if t == src),
                                             head.name if n is end or n is head else None, f"fused into {kind}")
        replace[id(end)] = fused
    if not replace:
        return
    new_nodes = []
    for n in graph.node:
        if id(n) in replace:
            if replace[id(n)] is not None:
                new_nodes.append(replace[id(n)])
        else:
            new_nodes.append(n)
    del graph.node[:]
    graph.node.extend(new_nodes)
    model.functions.extend(functions.values())
    if not any(o.domain == HZ_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(HZ_DOMAIN, 1))


# -- Div -------------------------------------------------------------------------------------


def _rewrite_each(graph: onnx.GraphProto, rewrite: Callable[[onnx.NodeProto], list[onnx.NodeProto] | None]) -> None:
    """Replace each node by the nodes ``rewrite`` returns for it, in place (None: the node stays)."""
    new_nodes: list[onnx.NodeProto] = []
    changed = False
    for n in graph.node:
        out = rewrite(n)
        if out is None:
            new_nodes.append(n)
        else:
            new_nodes.extend(out)
            changed = True
    if changed:
        del graph.node[:]
        graph.node.extend(new_nodes)


def _split_div(model: onnx.ModelProto, names: NameMap) -> None:
    graph = model.graph
    consts = {t.name: t for t in graph.initializer}
    used = {n.name for n in graph.node}

    def split(n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        if n.op_type != "Div" or n.domain not in ("", "ai.onnx") or len(n.input) != 2:
            return None
        a, b = n.input
        mul_name = _unique(f"{n.name}_mul", used)
        if b in consts:
            arr = numpy_helper.to_array(consts[b])
            if not np.issubdtype(arr.dtype, np.floating) or not np.all(arr != 0):
                return None
            rc = numpy_helper.from_array((1.0 / arr).astype(arr.dtype), _unique(f"{b}_reciprocal", set(consts)))
            graph.initializer.append(rc)
            consts[rc.name] = rc
            names.rewrites[n.name] = Rewrite(n.name, "Div", (mul_name,), ((0, mul_name, 0),), mul_name,
                                             "Div by a constant became a Mul")
            return [helper.make_node("Mul", [a, rc.name], list(n.output), name=mul_name)]
        rec_name = _unique(f"{n.name}_reciprocal", used)
        rec_out = f"{n.output[0]}__reciprocal"
        names.rewrites[n.name] = Rewrite(n.name, "Div", (rec_name, mul_name), ((0, mul_name, 0), (1, rec_name, 0)),
                                         mul_name, "Div split into Reciprocal + Mul")
        return [helper.make_node("Reciprocal", [b], [rec_out], name=rec_name),
                helper.make_node("Mul", [a, rec_out], list(n.output), name=mul_name)]

    _rewrite_each(graph, split)


def _split_where(model: onnx.ModelProto, names: NameMap) -> None:
    """``Where(c, a, b)`` of float tensors becomes ``c' * a + (c' == 0) * b`` with ``c' = Cast(c)``, as
    hb's optimized graph has it (the example's ``/Where``): CPU ``<name>_cast`` (Cast),
    ``<name>_equal`` (Equal with the constant ``<name>_equal_zeroinput``) and
    ``<name>_equal_output_cast`` (Cast), BPU ``<name>_mul_x``, ``<name>_mul_y`` (Mul) and ``<name>_add``
    (Add, which writes the Where's output). The float values are the same for c in {0, 1}."""
    graph = model.graph
    consts = {t.name for t in graph.initializer}
    float_types = {vi.name: vi.type.tensor_type.elem_type for vi in list(graph.input) + list(graph.value_info)
                   + list(graph.output)}
    used = {n.name for n in graph.node}

    def split(n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        if n.op_type != "Where" or n.domain not in ("", "ai.onnx") or len(n.input) != 3:
            return None
        c, a, b = n.input
        if a in consts or b in consts or float_types.get(a) != onnx.TensorProto.FLOAT \
                or float_types.get(b) != onnx.TensorProto.FLOAT:
            return None
        base = n.name
        cast, mul_x, equal, ecast, mul_y, add = (_unique(f"{base}_{p}", used) for p in
                                                 ("cast", "mul_x", "equal", "equal_output_cast", "mul_y", "add"))
        zero = _unique(f"{base}_equal_zeroinput", consts)
        consts.add(zero)
        graph.initializer.append(numpy_helper.from_array(np.zeros((), np.float32), zero))
        t_cast, t_mx, t_eq, t_ecast, t_my = (f"{base}_cast_output", f"{base}_mul_x_output", f"{base}_equal_output",
                                            f"{base}_equal_output_cast_output", f"{base}_mul_y_output")
        names.rewrites[n.name] = Rewrite(n.name, "Where", (cast, mul_x, equal, ecast, mul_y, add),
                                         ((0, cast, 0), (1, mul_x, 1), (2, mul_y, 1)), add,
                                         "Where split into Cast/Equal/Cast (CPU) and Mul/Mul/Add (BPU)")
        return [helper.make_node("Cast", [c], [t_cast], name=cast, to=onnx.TensorProto.FLOAT),
                helper.make_node("Mul", [t_cast, a], [t_mx], name=mul_x),
                helper.make_node("Equal", [t_cast, zero], [t_eq], name=equal),
                helper.make_node("Cast", [t_eq], [t_ecast], name=ecast, to=onnx.TensorProto.FLOAT),
                helper.make_node("Mul", [t_ecast, b], [t_my], name=mul_y),
                helper.make_node("Add", [t_mx, t_my], list(n.output), name=add)]

    _rewrite_each(graph, split)


def _unique(name: str, used: set[str]) -> str:
    out, k = name, 1
    while out in used:
        out, k = f"{name}_{k}", k + 1
    used.add(out)
    return out


# -- Mul by a channel constant -----------------------------------------------------------------


def _channel_constant(shape: tuple[int, ...], rank: int | None) -> bool:
    """A constant that broadcasts as one value, or one value per channel (axis 1) of a rank-4 map."""
    size = int(np.prod(shape)) if shape else 1
    if size == 1:
        return True
    if rank != 4 or len(shape) > 4:
        return False
    full = (1,) * (4 - len(shape)) + tuple(shape)
    return full[0] == 1 and full[2] == 1 and full[3] == 1


def _lower_channel_scales(model: onnx.ModelProto, names: NameMap, original: set[str]) -> None:
    graph = model.graph
    consts = {t.name: t for t in graph.initializer}
    ranks = {vi.name: len(vi.type.tensor_type.shape.dim) for vi in list(graph.input) + list(graph.value_info)
             if vi.type.tensor_type.HasField("shape")}
    fn = None
    onnx_names = set(original) - set(names.rewrites)
    for n in graph.node:
        if n.op_type != "Mul" or n.domain not in ("", "ai.onnx") or len(n.input) != 2:
            continue
        const = [k for k, t in enumerate(n.input) if t in consts]
        if len(const) != 1:
            continue
        c, x = n.input[const[0]], n.input[1 - const[0]]
        if consts[c].data_type != onnx.TensorProto.FLOAT or not _channel_constant(tuple(consts[c].dims), ranks.get(x)):
            continue
        if ranks.get(x) != 4 and int(np.prod(consts[c].dims) if consts[c].dims else 1) != 1:
            continue
        if fn is None:
            fn = helper.make_function(HZ_DOMAIN, "HzChannelScale__0", ["i0", "i1"], ["y"],
                                      [helper.make_node("Mul", ["i0", "i1"], ["y"])],
                                      [o for o in model.opset_import if o.domain in ("", "ai.onnx")])
        if n.name in onnx_names:
            # The feature map is input 0 of the lowered node (the user's InputType<k> of it follows).
            names.rewrites[n.name] = Rewrite(n.name, "Mul", (n.name,), ((1 - const[0], n.name, 0),), n.name,
                                             "Mul by a constant lowered to a 1x1 convolution")
        del n.input[:]
        n.input.extend([x, c])
        n.op_type, n.domain = fn.name, HZ_DOMAIN
    if fn is not None:
        model.functions.append(fn)
        if not any(o.domain == HZ_DOMAIN for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid(HZ_DOMAIN, 1))


def _fold_channel_scales(model: onnx.ModelProto, names: NameMap) -> None:
    """What hb's optimizer does to a lowered Mul (its 1x1 "unit" convolution, ``UNIT_WEIGHT_FOR_<mul>``),
    measured with toy models on hb_mapper 1.24.3 (``optimized_float_model.onnx``), as on PP-OCRv4's
    ``HardSwish -> Mul(k) -> Add(b) -> Conv`` blocks:

    * an ``Add`` (or ``Sub``) of a scalar or per-channel constant that alone reads it becomes its bias
      (``<mul>UNIT_BIAS_FOR_<mul>_fuse_add_sub``), unless the map has a single channel (as for a Conv);
    * then, when a Conv with **no padding** and one group alone reads it, it is folded into that Conv's
      weights and bias (``fuse_unit_conv_into_conv``): the Conv reads the Mul's input. With padding
      (3x3, pads 1) it is not folded (padding zeros would take the bias), nor into a depthwise Conv.

    On PP-OCRv4's detector this puts about twenty Conv inputs at the HardSwish output's threshold (real
    28.3 for ``p2o.Conv.2``, 13.5 where the scale 0.476 stayed in front of it) and removes two quantization
    points per block."""
    graph = model.graph
    consts = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    shapes = _shapes(model)
    users = _consumers(graph)
    opset = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    biased = None
    drop: set[int] = set()
    for n in list(graph.node):
        if n.domain != HZ_DOMAIN or hz_kind(n.op_type, n.domain) != "HzChannelScale" or len(n.input) != 2:
            continue
        x, c = n.input
        shape = shapes.get(x)
        if shape is None or len(shape) < 2:
            continue
        channels = shape[1]
        scale = _per_channel(numpy_helper.to_array(consts[c]), channels, len(shape))
        if scale is None:
            continue
        shift = np.zeros(channels)
        readers = users.get(n.output[0], [])
        add = readers[0] if len(readers) == 1 and n.output[0] not in outputs else None
        if add is not None and add.op_type in ("Add", "Sub") and add.domain in ("", "ai.onnx") and channels > 1 \
                and len(add.input) == 2:
            k = [i for i, t in enumerate(add.input) if t in consts]
            value = _per_channel(numpy_helper.to_array(consts[add.input[k[0]]]), channels, len(shape)) \
                if len(k) == 1 and not (add.op_type == "Sub" and k[0] != 1) else None
            if value is not None:
                shift = value if add.op_type == "Add" else -value
                b_name = _unique(f"{n.name}_hz_bias", set(consts))
                consts[b_name] = numpy_helper.from_array(shift.reshape((1, channels) + (1,) * (len(shape) - 2))
                                                         .astype(np.float32), b_name)
                graph.initializer.append(consts[b_name])
                if biased is None:
                    biased = helper.make_function(HZ_DOMAIN, "HzChannelScale__1", ["i0", "i1", "i2"], ["y"],
                                                  [helper.make_node("Mul", ["i0", "i1"], ["t"]),
                                                   helper.make_node("Add", ["t", "i2"], ["y"])], opset)
                n.op_type = biased.name
                n.input.append(b_name)
                n.output[0] = add.output[0]
                drop.add(id(add))
                names.rewrites[add.name] = Rewrite(add.name, add.op_type, (n.name,), ((1 - k[0], n.name, 0),), n.name,
                                                   f"{add.op_type} of a constant folded into {n.name}'s bias")
                readers = users.get(n.output[0], [])
        conv = readers[0] if len(readers) == 1 and n.output[0] not in outputs else None
        if conv is None or conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx") or conv.input[0] != n.output[0] \
                or len(conv.input) < 2 or conv.input[1] not in consts \
                or (len(conv.input) > 2 and conv.input[2] and conv.input[2] not in consts):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
        auto_pad = attrs.get("auto_pad", b"NOTSET")
        if attrs.get("group", 1) != 1 or any(attrs.get("pads", [])) or auto_pad not in (b"NOTSET", b"VALID"):
            continue
        w = numpy_helper.to_array(consts[conv.input[1]]).astype(np.float64)
        if w.shape[1] != channels:
            continue
        b = numpy_helper.to_array(consts[conv.input[2]]).astype(np.float64) if len(conv.input) > 2 and conv.input[2] \
            else np.zeros(w.shape[0])
        spread = (1, channels) + (1,) * (w.ndim - 2)
        b = b + (w * shift.reshape(spread)).reshape(w.shape[0], -1).sum(axis=1)
        w = w * scale.reshape(spread)
        base = conv.name or conv.output[0]
        w_name, b_name = _unique(f"{base}_hz_weight", set(consts)), _unique(f"{base}_hz_bias", set(consts))
        for name, value in ((w_name, w), (b_name, b)):
            consts[name] = numpy_helper.from_array(value.astype(np.float32), name)
            graph.initializer.append(consts[name])
        del conv.input[:]
        conv.input.extend([x, w_name, b_name])
        drop.add(id(n))
        for name, r in list(names.rewrites.items()):
            if r.nodes == (n.name,):
                names.rewrites[name] = Rewrite(name, r.op_type, (), (), None, f"{r.reason}, then into {conv.name}")
        if n.name not in names.rewrites:
            names.rewrites[n.name] = Rewrite(n.name, "Mul", (), (), None, f"Mul by a constant folded into {conv.name}")
    if biased is not None:
        model.functions.append(biased)
    if drop:
        keep = [n for n in graph.node if id(n) not in drop]
        del graph.node[:]
        graph.node.extend(keep)
        used = {t for n in graph.node for t in n.input} | outputs
        for t in [t for t in graph.initializer if t.name not in used]:
            graph.initializer.remove(t)


def hz_kind(op_type: str, domain: str) -> str:
    """The op type :class:`tuner.graph.Graph` reports for a node: a fused node's kind (``HzSwish``)."""
    if domain == HZ_DOMAIN:
        return op_type.split("__", 1)[0]
    return op_type
