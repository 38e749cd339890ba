"""Which Conv inputs hb_mapper quantizes per channel under ``per_channel: True``, and with which scales.

hmct's Python (``hmct/quantizer/calibrater/activation/activation_perchannel.py``) runs one per-channel
``max`` pass over the calibration data and hands each calibration node's channel abs-maxima to the C++
``quantizer.set_calibration_channel_scale``, which writes ``channel_scales`` on the nodes it selects;
``activation_equalization.py`` then folds those into the weights of the Conv readers. The selection
and the scales were measured by calling that C++ function from the toolchain's interpreter with
controlled maxima and weights (on toy models converted by hb_mapper 1.24.3 at O0, some 3000 probes)
and by full conversions of toy models (docs/hb_rules/calibration.md section 5). In our words:

* **Which tensors** (:func:`candidates`, structure only): a tensor written by a Conv (one of hb's
  Conv forms: a Conv, a lowered Mul ``HzChannelScale``, a Conv group ending in its residual Add or
  its Relu) or a model input, whose every reader is a Conv data input (any group), a lowered Mul, or
  the residual input of a Conv+Add group; at least :data:`MIN_PIXELS` values per channel
  (H x W: 10 selected, 9 not, whatever the channel count); more than one channel. A MaxPool,
  Resize, Split, Concat, Mul of two maps, LUT or ConvTranspose writer, or any other reader (Abs,
  GlobalAveragePool, Concat, ConvTranspose, an Add of two maps), keeps the tensor per tensor.
* **Only where it matters** (:func:`equalization`): the largest channel maximum ``A`` must reach
  :data:`MIN_MAX` (16.0 exactly: 15.9999 is not selected, 16.0 is; the same on every tensor of
  PP-OCRv4's detector scaled by 2^(k/8)). That is why the bundled example, whose Conv inputs stay
  below 16, converts to the same calibrated model with and without ``per_channel``.
* **The scales** ``cs_c`` (threshold of channel c = ``T / cs_c``, T the tensor's threshold; the
  channel with the largest maximum keeps ``cs = 1`` and ``dequantize_scale = T / 127``): each reader
  proposes scales and the node takes their element-wise maximum.

  - the activation bound ``r_c = (A + e) / (a_c + e)``, ``e = A / 1000``: what makes channel c as
    wide as the widest (exact to float32 on PP-OCRv4's ``p2o.Add.15``, ``.43``, ``.183``);
  - a depthwise Conv, a lowered Mul and a residual Add take ``r`` itself;
  - any other Conv takes, per group of input channels, ``min(r)`` over the group times the
    weight-limited scales of :func:`weight_limited`: the input channels' weight ranges (max |w| over
    the group's output channels and taps, plus a thousandth of the whole weight's max) are lowered
    towards one another in steps, from the largest down, for as long as every channel already
    scaled keeps three times its current scale within its activation bound; a step the bound
    limits is shortened to it and is the last; ranges within 0.1 % of the last one are stepped over.
    So a g=1 Conv often leaves a tensor at all ones (PP-OCRv4's ``conv2d_469/470/472.tmp_0``: per
    channel in name only).

The functions are pure: the statistics (channel abs-maxima) and the weights in, the scales out.
Not covered by the measurements, and kept per tensor here: a tensor a CPU node reads or a CPU node
writes, an AveragePool reader (hb runs it as a depthwise Conv). The threshold T under a clipping method
is approximated (:func:`tuner.simulate.scales.channelwise`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import numpy_helper

from tuner.calib.stats import TensorStats
from tuner.graph import Graph, Node
from tuner.simulate.plan import Plan

#: The largest channel maximum below which hb keeps a tensor per tensor (measured: 16.0 selected,
#: 15.9999 not, on a model input and on PP-OCRv4's p2o.Add.15 rescaled).
MIN_MAX = 16.0
#: Values per channel (H x W) a tensor needs (measured: 2x5, 1x10, 10x1 selected; 3x3, 1x9, 2x2, 1x1
#: not, with 8 and 16 channels; PP-OCRv4's SE-block tensors are 1x1).
MIN_PIXELS = 10
#: The relative offset of both ranges (activation and weight): ``e = max / 1000``.
EPS = 1e-3
#: A weight step goes on while every channel already scaled keeps this factor within its bound.
HEADROOM = 3.0
#: Weight ranges closer than this ratio to the last step's are stepped over.
TIE = 1.001

#: Writers whose output hb may scale per channel: its Conv forms (a fused group is followed back to
#: its head) and, at a group's end, its residual Add or Relu (measured: LeakyRelu is a table of its own).
CONV_HEADS = frozenset({"Conv", "HzChannelScale"})
GROUP_TAILS = frozenset({"Conv", "HzChannelScale", "Add", "Relu"})


@dataclass(frozen=True)
class Reader:
    """One reader of a tensor, as the equalization sees it: ``weight`` (initializer name) and ``group``
    for a Conv; ``weight`` None for a reader that takes the activation bound itself (a lowered Mul,
    the residual input of a Conv+Add group)."""

    weight: str | None = None
    group: int = 1


def activation_bound(absmax: np.ndarray) -> np.ndarray:
    """``(A + e) / (a_c + e)``, ``e = A / 1000``: the scale that makes channel c as wide as the widest."""
    a = np.asarray(absmax, np.float64)
    top = float(a.max())
    e = top * EPS
    return (top + e) / (a + e)


def weight_limited(bound: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    """The scales one group of a Conv's input channels takes: ``ranges`` (max |w| of each input
    channel plus the weight's offset) are brought down towards one another, step by step from the
    largest, each step scaling every channel whose range is above the new level by old/new level,
    for as long as ``HEADROOM`` times each such channel's current scale stays within its ``bound``;
    a step the bound would exceed is shortened to it and ends the walk; a level within ``TIE`` of
    the current one is passed over (measured on hb's C++ with 4- and 8-channel Convs: exact)."""
    b = np.asarray(ranges, np.float64)
    bound = np.asarray(bound, np.float64)
    cs = np.ones_like(b)
    levels = sorted(set(b.tolist()), reverse=True)
    level = levels[0] if levels else 0.0
    for nxt in levels[1:]:
        if nxt <= 0 or level / nxt < TIE:
            continue
        above = b > nxt
        if np.any(HEADROOM * cs[above] > bound[above]):
            break
        step = min(level / nxt, float(np.min(bound[above] / cs[above])))
        cs[above] *= step
        level /= step
    return cs


def conv_scales(bound: np.ndarray, weight: np.ndarray, group: int) -> np.ndarray:
    """The scales a Conv reader proposes for its input: per group of input channels, the group's
    smallest activation bound times :func:`weight_limited` on the group's own bound (relative to the
    group's widest channel) and weight ranges. A depthwise Conv (one channel per group) thus takes the
    activation bound itself, a g=1 Conv only the weight-limited part (measured; grouped g=2 Convs
    with 4 channels a group: exact on 120 probes)."""
    w = np.abs(np.asarray(weight, np.float64))
    cout, per_group = w.shape[0], w.shape[1]
    bound = np.asarray(bound, np.float64)
    out = np.ones(per_group * group)
    offset = float(w.max()) * EPS if w.size else 0.0
    rows = cout // max(group, 1)
    for g in range(group):
        sl = slice(g * per_group, (g + 1) * per_group)
        part = bound[sl]
        local = np.ones(per_group)
        if per_group > 1:
            wg = w[g * rows:(g + 1) * rows]
            ranges = wg.max(axis=tuple(i for i in range(wg.ndim) if i != 1)) + offset
            local = weight_limited(part / part.min(), ranges)
        out[sl] = part.min() * local
    return out


def equalization(absmax: np.ndarray | None, readers: Iterable[Reader],
                 weight: Callable[[str], np.ndarray]) -> np.ndarray | None:
    """The channel scales hb gives a tensor with channel abs-maxima ``absmax`` read by ``readers``
    (all of them eligible: :func:`candidates`), or None when it stays per tensor (a largest maximum
    below :data:`MIN_MAX`, one channel). ``weight(name)`` returns a Conv reader's weight."""
    if absmax is None:
        return None
    a = np.asarray(absmax, np.float64).ravel()
    if a.size < 2 or not float(a.max()) >= MIN_MAX:
        return None
    bound = activation_bound(a)
    out = np.ones_like(bound)
    for r in readers:
        if r.weight is None:
            proposal = bound
        else:
            w = weight(r.weight)
            if w.ndim < 2 or w.shape[1] * r.group != a.size:
                return None
            proposal = conv_scales(bound, w, r.group)
        out = np.maximum(out, proposal)
    return out


def fusion_heads(graph: Graph, plan: Plan) -> dict[str, Node]:
    """Each fused member -> the member before it (what :func:`head` walks back)."""
    return {b: graph.by_name[a] for a, b in plan.fused}


def head(node: Node, into: Mapping[str, Node]) -> Node:
    """The first node of the fusion group ``node`` ends (``into``: member -> the member before it)."""
    seen = 0
    while node.name in into and seen < 16:
        node = into[node.name]
        seen += 1
    return node


def candidates(graph: Graph, plan: Plan) -> dict[str, tuple[Reader, ...]]:
    """The tensors hb may quantize per channel under this plan, each with its readers (structure
    only; :func:`equalization` decides with the statistics). See the module docstring for the rule;
    a tensor quantized with another's threshold (``plan.scale_of``: hb's shared groups), a model output,
    a tensor a CPU node reads or one whose writer runs on the CPU stay per tensor. (A tensor lending its
    threshold has a pass-through or Concat reader, which the reader rule already refuses, or lends it
    to the inside of its own fusion group.)"""
    into = fusion_heads(graph, plan)
    shared = set(plan.scale_of)
    outputs = set(graph.output_names)
    out: dict[str, tuple[Reader, ...]] = {}
    for tensor in sorted({t for t, _ in plan.edges.values()}):
        if tensor in shared or tensor in outputs or tensor in graph.initializers:
            continue
        shape = graph.shapes.get(tensor)
        if shape is None or len(shape) != 4 or not shape[1] or shape[1] < 2 \
                or not (shape[2] and shape[3]) or shape[2] * shape[3] < MIN_PIXELS:
            continue
        producer = graph.producer.get(tensor)
        if producer is not None:
            if plan.placement.get(producer.name) != "BPU" or producer.op_type not in GROUP_TAILS \
                    or head(producer, into).op_type not in CONV_HEADS:
                continue
        readers = _readers(graph, plan, tensor, into)
        if readers:
            out[tensor] = readers
    return out


def _readers(graph: Graph, plan: Plan, tensor: str, into: Mapping[str, Node]) -> tuple[Reader, ...]:
    found: list[Reader] = []
    producer = graph.producer.get(tensor)
    for node, k in graph.consumers.get(tensor, []):
        if plan.placement.get(node.name) != "BPU" or (node.name, k) not in plan.edges:
            return ()
        if node.op_type == "Conv" and k == 0:
            w = node.inputs[1] if len(node.inputs) > 1 else ""
            if w not in graph.initializers:
                return ()
            found.append(Reader(w, int(node.attr("group", 1))))
        elif node.op_type == "HzChannelScale" and k == 0:
            found.append(Reader())
        elif node.op_type == "Add" and node.name in into and head(node, into).op_type in CONV_HEADS \
                and (producer is None or into[node.name].name != producer.name):
            found.append(Reader())      # the residual input of a Conv+Add group
        else:
            return ()
    return tuple(found)


def channel_scales(graph: Graph, plan: Plan, stats: Mapping[str, TensorStats],
                   memo: dict[Any, Any] | None = None) -> dict[str, np.ndarray]:
    """tensor -> its channel scales, for every tensor hb quantizes per channel under ``plan`` (a
    per_channel calibration). ``memo`` (kept across builds of one model) keeps each tensor's scales:
    they depend only on its statistics and its readers' weights."""
    memo = {} if memo is None else memo
    weights: dict[str, np.ndarray] = {}

    def weight(name: str) -> np.ndarray:
        if name not in weights:
            weights[name] = numpy_helper.to_array(graph.initializers[name])
        return weights[name]

    out: dict[str, np.ndarray] = {}
    for tensor, readers in candidates(graph, plan).items():
        key = ("per_channel", tensor, readers)
        if key not in memo:
            st = stats.get(tensor)
            memo[key] = equalization(None if st is None else st.channel_absmax, readers, weight)
        if memo[key] is not None:
            out[tensor] = memo[key]
    return out


def channel_top(stats: Mapping[str, TensorStats], tensor: str) -> float | None:
    """The largest channel maximum of ``tensor`` (what its channel-scaled form reaches), if known."""
    st = stats.get(tensor)
    if st is None or st.channel_absmax is None or not np.size(st.channel_absmax):
        return None
    return float(np.max(st.channel_absmax))
