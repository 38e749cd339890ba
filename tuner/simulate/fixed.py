"""Thresholds hb_mapper fixes instead of calibrating, and the tensors ``asymmetric`` makes uint8.

Both are properties of the graph and of the plan (placement, dtypes, hb's threshold groups), not of
the statistics, so they are decided here, once per plan, and applied to any table of scales by
:class:`tuner.simulate.scales.PlanScales`. Measured on the real toolchain (hb_mapper 1.24.3, hmct
1.1.0) with small ONNX models converted at O0 and their ``*_calibrated_model.onnx`` read back
(docs/hb_rules/calibration.md sections 4 and 6 hold the experiments and their numbers); the passes
themselves are compiled code (``create_post_calibrated_model``, ``convert_symq_to_asymq``).

**Fixed inputs** (:func:`fixed_thresholds`). A BPU Sigmoid whose input tensor has a calibration node
of its own that only the Sigmoid reads gets input threshold 5.49897 in int8 and 11.09031 in int16,
whatever the data (data max 1.70, 4.19 and 36.6 all gave 5.49897); a HardSigmoid 3.0 (data max 2.39
and 10.4 alike). "Only the Sigmoid reads it": a tensor also read by a Conv, an Add or a second
Sigmoid keeps its calibrated threshold (8.35, 10.33, 11.24 measured); so does a Sigmoid behind a
MaxPool, whose calibration node sits on the MaxPool's input; a Slice's output has its own node
(the example's depth head: Conv -> Resize -> two Slices -> two Sigmoids gets 5.49897 on the Conv
output, the Resize and both Slices). The model input read by one Sigmoid is fixed too.
A fixed tensor keeps its threshold inside a threshold group: the group takes it when it is the
group's first calibrated member; otherwise the others keep the group's and the fixed tensor its
own (Conv -> Slice0 -> Conv, Slice1 -> Sigmoid: 6.43 on the Conv output and Slice0, 5.49897 on Slice1).

**Derived outputs.** The output of a Sigmoid, HardSigmoid, Tanh or Softplus on the BPU takes the op
applied to its input's threshold (sigmoid(5.49897) = 0.995926; where the input is shared and
calibrated: sigmoid(8.35089) = 0.999764, hard_sigmoid(2.01287) = 0.835479, hb's HardSigmoid whatever the
node's alpha and beta: 2.2898 -> 0.8816 with alpha 0.2, tuner.graph.optimize.HB_HARD_SIGMOID; under kl, tanh and
softplus of the input's kl threshold, not the output's own). Exp, SiLU and HardSwish outputs are
calibrated as usual. A Sigmoid output that is itself a fixed input (Sigmoid -> Sigmoid) stays fixed.

**Integer-valued Cast outputs** (the Where split's ``<name>_cast``) are read with scale 1.

**uint8 under asymmetric** (:func:`unsigned_tensors`). The output of a Conv group ending in Relu or in
a Clip with a non-negative lower bound becomes uint8 when every reader takes uint8: a Conv (not a
depthwise Conv with padding: hb's mode is ``disable_dw_pad``; a depthwise Conv without padding, a
grouped, strided or dilated Conv take it), a lowered Mul by a constant, the residual Add of a Conv
group, an AveragePool, or a MaxPool whose own readers all do. Measured int8 (not uint8): the model
input (non-negative), Abs, Sigmoid and HardSigmoid outputs, a Clip(-1, 6), a standalone Relu (after
Concat, Resize or another Relu), and readers Concat, Resize, GlobalAveragePool, a Mul or Sub of two
feature maps, a standalone Add, Slice, Reshape, ConvTranspose. On the example this is the real
model's 9 uint8 tensors of 52.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tuner.graph import Graph, Node, Target
from tuner.graph.softmax import softmax_tensors
from tuner.simulate.scales import FIXED_INPUT, SOFTMAX_EXP, Derived, Fixed
from tuner.simulate.sharing import SPLIT_OPS

INT8 = "int8"
#: LUT ops whose output threshold is a function of their input threshold (measured).
DERIVED_OPS = frozenset({"Sigmoid", "HardSigmoid", "Tanh", "Softplus"})
#: Readers of a uint8 tensor (see the module's docstring); MaxPool passes it on to its own readers.
UINT8_READERS = frozenset({"Conv", "HzChannelScale", "AveragePool"})

Point = tuple[str, str]      # (tensor, dtype) of a quantization point


def fixed_thresholds(graph: Graph, target: Target, placement: Mapping[str, str],
                     edges: dict[tuple[str, int], Point], passthrough: dict[tuple[str, int], Point],
                     scale_of: dict[str, str], quantized: Iterable[str]) -> tuple[dict[str, Fixed], dict[str, Derived]]:
    """(fixed, derived) thresholds of a plan, keyed by the tensor whose threshold a point uses
    (``scale_of``'s sources). ``edges``, ``passthrough`` and ``scale_of`` are updated in place where a
    fixed or derived tensor keeps its own threshold inside a group (see the module's docstring).
    ``quantized``: every tensor the plan rounds somewhere (for Cast outputs)."""
    fixed: dict[str, Fixed] = {}
    derived: dict[str, Derived] = {}

    def point(node: Node) -> tuple[int, str, Point, bool] | None:
        data = graph.data_inputs(node)
        if placement.get(node.name) != "BPU" or len(data) != 1:
            return None
        k, t = data[0]
        if (node.name, k) in edges:
            return k, t, edges[(node.name, k)], False
        if (node.name, k) in passthrough:
            return k, t, passthrough[(node.name, k)], True
        return None            # not a quantization point (inside a fusion group)

    def keep_own(tensor: str, value: Fixed | Derived) -> None:
        """``tensor`` keeps its own threshold unless its group's source has the same one."""
        source = scale_of.get(tensor)
        if source is None:
            return
        if fixed.get(source) == value or derived.get(source) == value:
            return
        del scale_of[tensor]

    for node in graph:
        if node.op_type not in FIXED_INPUT:
            continue
        p = point(node)
        if p is None:
            continue
        k, t, (_, dtype), through = p
        if len(graph.consumers.get(t, [])) != 1 or t in graph.output_names:
            continue
        producer = graph.producer.get(t)
        if through and (producer is None or producer.op_type not in SPLIT_OPS):
            continue           # hb's node is in front of the pass-through op (MaxPool ...), not the Sigmoid's own
        fixed[t] = Fixed(node.op_type, dtype)
    for t, f in list(fixed.items()):
        keep_own(t, f)
    for node in graph:
        if node.op_type not in FIXED_INPUT:
            continue
        p = point(node)
        if p is None or p[1] not in fixed or not p[3]:
            continue
        k, t, (grid, dtype), _ = p
        grid_source = scale_of.get(grid, grid)
        if grid_source != t and fixed.get(grid_source) != fixed[t]:
            # a Slice output with a fixed threshold of its own, in a group calibrated otherwise: hb rounds
            # it again at that threshold (a node of its own)
            del passthrough[(node.name, k)]
            edges[(node.name, k)] = (t, dtype)

    for node in graph:
        if node.op_type not in DERIVED_OPS or not node.outputs:
            continue
        p = point(node)
        if p is None:
            continue
        _, _, (src, dtype), _ = p
        out = node.outputs[0]
        if out in fixed:
            continue
        derived[out] = Derived(node.op_type, scale_of.get(src, src), dtype)
        keep_own(out, derived[out])

    for t in set(quantized):
        producer = graph.producer.get(t)
        if producer is not None and producer.op_type == "Cast" and t not in fixed:
            fixed[t] = Fixed("unit")
            scale_of.pop(t, None)
    return fixed, derived


def _depthwise_padded(graph: Graph, node: Node) -> bool:
    group = int(node.attr("group", 1))
    w = graph.initializers.get(node.inputs[1]) if len(node.inputs) > 1 else None
    if group <= 1 or w is None or len(w.dims) < 2 or w.dims[1] != 1:
        return False
    pads = node.attr("pads", None) or ()
    auto = node.attr("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    return any(int(p) > 0 for p in pads) or auto in ("SAME_UPPER", "SAME_LOWER")


def _non_negative_tail(graph: Graph, node: Node) -> bool:
    if node.op_type == "Relu":
        return True
    if node.op_type != "Clip":
        return False
    lo = node.attr("min", None)
    if lo is None and len(node.inputs) > 1 and node.inputs[1] in graph.initializers:
        from onnx import numpy_helper
        lo = float(numpy_helper.to_array(graph.initializers[node.inputs[1]]).ravel()[0])
    return lo is not None and float(lo) >= 0.0


def unsigned_tensors(graph: Graph, target: Target, placement: Mapping[str, str], groups: list[list[Node]],
                     edges: Mapping[tuple[str, int], Point], passthrough: Mapping[tuple[str, int], Point],
                     scale_of: Mapping[str, str]) -> frozenset[str]:
    """The calibration tensors (``scale_of`` sources) an asymmetric method makes uint8 in this plan."""
    conv_adds = {n.name for g in groups if g[0].op_type == "Conv" for n in g[1:] if n.op_type == "Add"}
    int16 = {t for t, d in list(edges.values()) + list(passthrough.values()) if d != INT8}

    def readers_ok(t: str, seen: set[str]) -> bool:
        readers = graph.consumers.get(t, [])
        if not readers or t in graph.output_names or t in int16:
            return False
        for c, k in readers:
            if placement.get(c.name) != "BPU":
                return False
            if c.op_type == "MaxPool" and k == 0 and c.outputs and c.outputs[0] not in seen:
                seen.add(c.outputs[0])
                if not readers_ok(c.outputs[0], seen):
                    return False
            elif c.op_type == "AveragePool" and k == 0:
                seen.update(c.outputs)    # rounded again with this tensor's scale (a same-scale op)
            elif c.op_type == "Conv" and k == 0:
                if _depthwise_padded(graph, c):
                    return False
            elif not ((c.op_type in UINT8_READERS and k == 0) or c.name in conv_adds):
                return False
        return True

    eligible: set[str] = set()
    for g in groups:
        head, tail = g[0], g[-1]
        if head.op_type != "Conv" or not tail.outputs or not _non_negative_tail(graph, tail) \
                or any(placement.get(n.name) != "BPU" for n in g):
            continue
        seen: set[str] = set()
        if readers_ok(tail.outputs[0], seen):
            eligible.add(tail.outputs[0])
            eligible |= seen
    if not eligible:
        return frozenset()
    # a scale source is uint8 when every tensor rounded with its threshold is eligible (a MaxPool's output
    # shares its input's; a tensor inside a fusion group is never rounded)
    members: dict[str, set[str]] = {}
    for t in {t for t, _ in list(edges.values()) + list(passthrough.values())} | eligible:
        members.setdefault(scale_of.get(t, t), set()).add(t)
    return frozenset(s for s, m in members.items() if m <= eligible)


def softmax_fixed(softmax: Mapping[str, str]) -> dict[str, Fixed]:
    """The fixed input thresholds of the Exp tables of the BPU Softmaxes (``Plan.softmax``: node -> dtype):
    its Sub part's output, :data:`tuner.simulate.scales.SOFTMAX_EXP`."""
    return {softmax_tensors(name)[1]: Fixed(SOFTMAX_EXP, dtype) for name, dtype in softmax.items()}
