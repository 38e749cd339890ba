"""Resolve a candidate against the graph and the target: what runs where, in which dtype.

This is where hb_mapper's rules live, separate from running anything: placement (forced
by ``node_info``, else the march's defaults), int16 requests honoured only where the march
supports them (else int8, as hb_mapper falls back), fusion groups, and the resulting
quantization points:

* a BPU node quantizes each of its activation inputs (int8, or int16 where asked and allowed),
  except on edges inside a fusion group;
* a BPU->CPU edge and a BPU-produced model output dequantize the producer's output, which
  was rounded to the producer's output dtype (accumulating ops such as Conv leave the BPU
  in int32 and are not rounded);
* a CPU->BPU edge quantizes again, with that tensor's scale (the first rule);
* passive data-movement ops (Slice, Reshape, MaxPool, ...) keep their input's scale, so
  their consumers do not round again; same-scale ops (Resize, AveragePool) keep the scale
  but leave the grid, so their output is rounded again with the input's scale;
* weights of BPU Conv/Gemm/MatMul nodes are int8 per output channel;
* int16 is resolved per threshold group, as hb_mapper spreads it (:meth:`_Rules.spread`): a request
  on any member makes the whole group int16; each reader then takes int16 where its input may be
  (MatMul: input 0 only; not Resize, GlobalAveragePool, ConvTranspose) and each producer emits it
  where its output may (not Resize, ConvTranspose, a dilated Conv); a refused request falls back to
  int8 with hb_mapper's warning text. An OutputType is handed to the readers of the fusion group's
  output (an InputType on a fused Relu too), which take it where they may (:meth:`_Rules.request_output`);
  a function table whose output is int16 reads int16. A Conv whose int16 input hb cannot quantize is
  set back to int8 at quantization (:meth:`_Rules.conv_int16_dropped`), an int16 input of a residual
  Add or of its Conv unfuses Conv+Add(+Relu), an int16 entry on the Clip of Conv+Clip unfuses it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from tuner.candidate import Candidate
from tuner.graph import Graph, Node, Target
from tuner.graph.softmax import SOFTMAX_PARTS, softmax_part, softmax_tensors
from tuner.simulate.fixed import fixed_thresholds, softmax_fixed, unsigned_tensors
from tuner.simulate.int16 import INT8, INT16, REQUANTIZING_PASSIVE, _Rules, resolve_groups
from tuner.simulate.placement import place
from tuner.simulate.scales import Derived, Fixed
from tuner.simulate.sharing import THROUGH_SAME_SCALE, threshold_sources


@dataclass
class Plan:
    """The resolved quantization of one candidate. ``edges`` maps (consumer, input index) to dtype."""

    placement: dict[str, str]
    edges: dict[tuple[str, int], tuple[str, str]]          # (node, k) -> (tensor, dtype)
    outputs: dict[str, str]                                # quantized model outputs: tensor -> dtype
    cpu_reads: dict[tuple[str, int], tuple[str, str]]     # BPU->CPU edges: (node, k) -> (tensor, dtype)
    weights: list[str]                                     # BPU nodes whose weights are int8 per channel
    subgraph: dict[str, int]
    in_dtype: dict[str, str]
    out_dtype: dict[str, str]
    # BPU inputs already on their grid (behind passive ops): (node, k) -> (tensor whose scale applies, dtype)
    passthrough: dict[tuple[str, int], tuple[str, str]] = field(default_factory=dict)
    # Outputs of same-scale ops (Resize, ...) are rounded with their input's scale: tensor -> scale source
    scale_of: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # Tensors a BPU producer emits in int8 although int16 readers read them (a Resize or ConvTranspose
    # in an int16 group: hb requantizes its int8 output to int16): tensor -> "int8", rounded first
    emitted: dict[str, str] = field(default_factory=dict)
    # hb's calibrated model (its log's per-node cosines) where it differs from the quantized one: inputs
    # hb sets back to int8 only at quantization (a Conv's dropped int16, a Resize's), int16 there
    calibrated: dict[tuple[str, int], tuple[str, str]] = field(default_factory=dict)
    # BPU table ops compute hb's own functions (a HardSigmoid's slope 1/6: tuner.simulate.qdq.HB_TABLES);
    # False in hb's calibrated model, which runs the graph's float ops
    bpu_tables: bool = True

    def as_calibrated(self) -> Plan:
        """The plan of hb's calibrated model: the late int8 fallbacks undone (``calibrated``), no int8
        rounding of refusing producers (``emitted``), the float ops instead of hb's tables
        (``bpu_tables``). Dtypes (``in_dtype``) stay the quantized model's."""
        if not self.calibrated and not self.emitted:
            return dataclasses.replace(self, bpu_tables=False) if self.bpu_tables else self
        edges = dict(self.edges)
        edges.update(self.calibrated)
        passthrough = {k: v for k, v in self.passthrough.items() if k not in self.calibrated}
        return dataclasses.replace(self, edges=edges, passthrough=passthrough, emitted={}, calibrated={},
                                   bpu_tables=False)
    # BPU Softmaxes, run as hb_mapper's six parts (tuner.graph.optimize.softmax_parts): node -> dtype
    # of the parts, and the quantization points between the parts: (part, k) -> (tensor, dtype)
    softmax: dict[str, str] = field(default_factory=dict)
    internal: dict[tuple[str, int], tuple[str, str]] = field(default_factory=dict)
    # hb's thresholds that calibration does not give (tuner.simulate.fixed): scale source -> rule
    fixed: dict[str, Fixed] = field(default_factory=dict)
    derived: dict[str, Derived] = field(default_factory=dict)
    # the scale sources an asymmetric calibration makes uint8 (tuner.simulate.fixed.unsigned_tensors)
    unsigned: frozenset[str] = frozenset()
    # the fusion groups in effect, as (member, next member) edges (no quantization between them)
    fused: frozenset[tuple[str, str]] = frozenset()

    @property
    def n_subgraphs(self) -> int:
        return len(set(self.subgraph.values()))

    @property
    def cpu_nodes(self) -> list[str]:
        return [n for n, p in self.placement.items() if p == "CPU"]

    def quantized_tensors(self) -> set[str]:
        return ({t for t, _ in self.edges.values()} | set(self.outputs) | {t for t, _ in self.cpu_reads.values()}
                | {t for t, _ in self.internal.values()})


def _check_names(graph: Graph, candidate: Candidate) -> None:
    unknown = [name for name, _ in candidate.nodes if name not in graph.by_name]
    if unknown:
        graph.node(unknown[0])  # raises a TunerError with close matches


def hb_candidate(graph: Graph, candidate: Candidate) -> tuple[Candidate, list[str]]:
    """``candidate`` with node_info addressed to the graph hb_mapper calibrates (tuner.graph.optimize):
    entries under ONNX names the optimizer replaced go to the nodes standing for them."""
    if not any(name in graph.names.rewrites for name, _ in candidate.nodes):
        return candidate, []
    entries, notes = [], []
    for name, setting in candidate.nodes:
        fields = setting.to_dict()
        r = graph.names.rewrites.get(name)
        if r is not None and name not in graph.by_name and r.nodes and _BIAS_FOLD in r.reason:
            # hb folds an Add of a constant into the bias of the lowered Mul before it: the Add is gone when
            # node_info is applied, so its int16 fields do nothing (PP-OCRv4's int16_top10 of the latency
            # benchmark: ``p2o.Add.98``, int16 in and out, left ``p2o.Mul.70`` int8 in hb's calibrated model)
            dropped = [k for k in fields if k.startswith(("InputType", "OutputType"))]
            if dropped:
                notes.append(f"node_info {name!r} ({r.op_type}): {r.reason} by hb_mapper's optimizer before "
                             f"calibration; its {', '.join(dropped)} has no effect")
                fields = {k: v for k, v in fields.items() if k not in dropped}
                if not fields:
                    continue
        entries.append((name, fields))
    nodes, more = graph.names.translate(tuple(entries), set(graph.by_name))
    return Candidate.make(candidate.calibration, nodes, candidate.optimization), notes + more


#: The reason tuner.graph.optimize gives an Add/Sub of a constant folded into a lowered Mul's bias.
_BIAS_FOLD = "of a constant folded into"


def check_node_names(graph: Graph, candidate: Candidate) -> None:
    """Every node_info name is a node of the graph (or one the optimizer replaced): the one-line error
    with close matches, cheap enough to run before the statistics pass."""
    _check_names(graph, hb_candidate(graph, candidate)[0])


def make_plan(graph: Graph, target: Target, candidate: Candidate) -> Plan:
    """What runs where, in which dtype, and every quantization point, for ``candidate`` on ``graph``
    (hb_mapper's rules: module docstring)."""
    candidate, notes = hb_candidate(graph, candidate)
    _check_names(graph, candidate)
    opts = set(candidate.optimization)
    all_int16 = "set_all_nodes_int16" in opts
    placement, placed = place(graph, target, candidate)
    notes += placed
    rules, wide, groups_in_effect = resolve_groups(graph, target, candidate, placement, all_int16)
    notes += rules.notes
    points = _Points(graph, target, candidate, placement, rules, wide, all_int16)
    points.walk()
    notes += points.notes
    outputs = _model_outputs(graph, placement, rules, points.out16, "set_model_output_int16" in opts)
    softmax, internal = _softmax_parts(graph, placement, points.in_dtype)
    plan = Plan(placement=placement, edges=points.edges, outputs=outputs, cpu_reads=points.cpu_reads,
                weights=_weighted(graph, target, placement), subgraph=_subgraphs(graph, placement),
                in_dtype=points.in_dtype, out_dtype=_out_dtypes(graph, placement, rules, points.out16),
                passthrough=points.passthrough, scale_of=points.scale_of, notes=notes, emitted=points.emitted,
                calibrated=points.calibrated, softmax=softmax, internal=internal, fused=frozenset(rules.fused))
    if target.post_calibration:
        plan = _post_calibration_thresholds(plan, graph, target, candidate, groups_in_effect)
    return plan


class _Points:
    """The quantization points of one plan, node by node in graph order: the dtype each BPU read takes
    (int16 where its group is int16 and the op may read it, else int8 with hb's warning), the reads
    that stay on a passive op's grid, the CPU reads of BPU tensors, and what each BPU node emits."""

    def __init__(self, graph: Graph, target: Target, candidate: Candidate, placement: dict[str, str],
                 rules: _Rules, wide: set[str], all_int16: bool):
        self.graph, self.target, self.candidate, self.placement = graph, target, candidate, placement
        self.rules, self.wide, self.all_int16 = rules, wide, all_int16
        self.notes: list[str] = []
        self.edges: dict[tuple[str, int], tuple[str, str]] = {}
        self.cpu_reads: dict[tuple[str, int], tuple[str, str]] = {}
        self.in_dtype: dict[str, str] = {}
        self.out16: dict[str, bool] = {}
        self.emitted: dict[str, str] = {}
        self.calibrated: dict[tuple[str, int], tuple[str, str]] = {}
        self.passthrough: dict[tuple[str, int], tuple[str, str]] = {}
        self.scale_of: dict[str, str] = {}
        self.refused_out: set[str] = set()
        # Tensors already on a quantization grid: outputs of passive BPU ops whose input was
        # quantized. tensor -> (tensor whose scale applies, dtype).
        self.grid: dict[str, tuple[str, str]] = {}
        # a tensor an op reads that refuses int16 when hb calibrates (GlobalAveragePool) stays int8 for every
        # reader: one calibration node per tensor (PP-OCRv4 under set_all_nodes_int16: the tensors read by a GAP
        # and an int16 Mul are int8 in its calibrated model); other refusals come at quantization
        self.pinned = {t for n in graph if placement[n.name] == "BPU"
                       and n.op_type in target.int16_refused_at_calibration for _, t in graph.data_inputs(n)}

    def is16(self, tensor: str) -> bool:
        return self.rules.find(tensor) in self.wide and tensor not in self.pinned

    def walk(self) -> None:
        for node in self.graph:
            self.node(node)
        self._fused_member_inputs()
        self._cpu_reads_share_the_bpu_point()

    def node(self, node: Node) -> None:
        """``node``'s reads (edges, passthroughs, CPU reads) and, on the BPU, its dtypes and output grid."""
        graph, placement = self.graph, self.placement
        on_bpu = placement[node.name] == "BPU"
        data = graph.data_inputs(node)
        passive = on_bpu and node.op_type in self.target.passive_ops and len(data) == 1 and not (
            (p0 := graph.producer.get(data[0][1])) is not None and (p0.name, node.name) in self.rules.fused)
        dtypes = []
        for k, tensor in data:
            producer = graph.producer.get(tensor)
            p_bpu = producer is not None and placement[producer.name] == "BPU"
            if on_bpu:
                if producer is not None and p_bpu and (producer.name, node.name) in self.rules.fused:
                    continue
                dtype = self._read_dtype(node, k, tensor, producer if p_bpu else None, passive)
                dtypes.append(dtype)
                if self.grid.get(tensor, (None, None))[1] == dtype:
                    self.passthrough[(node.name, k)] = self.grid[tensor]
                    continue
                self.edges[(node.name, k)] = (tensor, dtype)
            elif producer is not None and p_bpu and not self.rules.leaves_in_int32(producer.name):
                self.cpu_reads[(node.name, k)] = (tensor, INT16 if self.out16[producer.name] else INT8)
        if on_bpu:
            self._bpu_output(node, data, dtypes, passive)
        else:
            self.in_dtype[node.name] = "float"
            self.out16[node.name] = False

    def _read_dtype(self, node: Node, k: int, tensor: str, bpu_producer: Node | None, passive: bool) -> str:
        """The dtype a BPU node reads input ``k`` in: int16 where the tensor's group is int16 and the op may
        read it, else int8 (with hb_mapper's own warning when node_info asked for int16)."""
        dtype = INT8
        if self.is16(tensor) and self.target.int16_input(node.op_type, k):
            dtype = INT16
            if bpu_producer is not None and not self.out16[bpu_producer.name]:
                dtype = self._int8_producer(node, k, tensor, bpu_producer, passive)
            if dtype == INT16 and k == 0 and self.rules.conv_int16_dropped(node):
                dtype = INT8
                self.calibrated[(node.name, k)] = (tensor, INT16)
                self.notes.append(f"the quantization parameters of conv int16 is not supported, the input datatype "
                                  f"of node:{node.name} will be set back to int8. (hb_mapper's warning at "
                                  f"quantization on {self.target.march}; its calibrated model still shows int16)")
        elif self.is16(tensor) and node.op_type in THROUGH_SAME_SCALE:
            self.calibrated[(node.name, k)] = (tensor, INT16)   # a Resize: int16 until quantization
        if dtype == INT8 and self.candidate.setting(node.name).input_dtype(k) == INT16 \
                and not self.target.int16_input(node.op_type, k):
            # hb_mapper's own warning (docs/hb_rules/ops.md §3, S8)
            self.notes.append(f"The input{k} of Node(name:{node.name}, type:{node.op_type}) does not "
                              f"support data type: int16 (on {self.target.march}; stays int8, as hb_mapper "
                              "falls back)")
        return dtype

    def _int8_producer(self, node: Node, k: int, tensor: str, producer: Node, passive: bool) -> str:
        """An int16 read of a BPU producer that emits int8: a Slice/Reshape/... passes the int8 values
        through (int8, int16 only in the calibrated model); any other reader has hb requantize the
        producer's int8 output to int16, with hb's warning on the producer (once)."""
        if passive and node.op_type not in REQUANTIZING_PASSIVE:
            self.calibrated[(node.name, k)] = (tensor, INT16)
            return INT8
        self.emitted[tensor] = INT8
        # (a pass-through producer only passes on another's int8: that one was named)
        if producer.name not in self.refused_out and not self.all_int16 \
                and producer.op_type not in self.target.passive_ops:
            self.refused_out.add(producer.name)
            self.notes.append(f"The output of Node(name:{producer.name}, type:{producer.op_type}) does "
                              f"not support data type: int16 (on {self.target.march}; it stays int8 and is "
                              "requantized to int16 for its int16 readers, as hb_mapper does)")
        return INT16

    def _bpu_output(self, node: Node, data: list[tuple[int, str]], dtypes: list[str], passive: bool) -> None:
        """A BPU node's input and output dtypes, and the grid or scale its output keeps: a passive op
        writes what it reads (its output stays on the input's grid), a same-scale op keeps the scale."""
        self.in_dtype[node.name] = INT16 if INT16 in dtypes else INT8
        if passive:
            # a passive op writes what it reads: int16 out only from an int16 input
            self.out16[node.name] = self.in_dtype[node.name] == INT16 and any(self.is16(o) for o in node.outputs)
        else:
            self.out16[node.name] = self.rules.at_end(node) and any(self.is16(o) for o in node.outputs if o) \
                and self.rules.emits16(node)
        if len(data) == 1:
            k, tensor = data[0]
            source = self.edges.get((node.name, k)) or self.passthrough.get((node.name, k))
            if source is not None and node.op_type in self.target.passive_ops:
                for out in node.outputs:
                    self.grid[out] = source
            elif source is not None and node.op_type in self.target.same_scale_ops and not self.out16[node.name]:
                for out in node.outputs:
                    self.scale_of[out] = self.scale_of.get(source[0], source[0])

    def _fused_member_inputs(self) -> None:
        """A fused member reads its group's internal value, which leaves the group in the tail's dtype (hb's
        table shows a fused Relu as the HzRequantize of that tensor, in its dtype)."""
        rules = self.rules
        for node in self.graph:
            if self.placement[node.name] == "BPU" and node.name in rules.group \
                    and rules.group[node.name][0].name != node.name and not any(
                        (node.name, k) in self.edges or (node.name, k) in self.passthrough
                        for k, _ in self.graph.data_inputs(node)):
                self.in_dtype[node.name] = INT16 if self.out16[rules.tail(node).name] else INT8

    def _cpu_reads_share_the_bpu_point(self) -> None:
        """One quantizer per tensor (measured, notes 1a): a CPU node reads a tensor that a BPU node also reads
        as that BPU node reads it (the same int8/int16 values), whoever produced it: a model input too.
        (int16 when its calibration is: a Conv that hb set back to int8 reads it through a requantize.)"""
        quantized_as: dict[str, str] = {}
        if self.target.post_calibration:
            for t, d in self.edges.values():
                if quantized_as.get(t) != INT16:
                    quantized_as[t] = d
        for node in self.graph:
            if self.placement[node.name] == "BPU":
                continue
            for k, tensor in self.graph.data_inputs(node):
                if (node.name, k) not in self.cpu_reads and tensor in quantized_as:
                    self.cpu_reads[(node.name, k)] = (tensor, quantized_as[tensor])


def _model_outputs(graph: Graph, placement: dict[str, str], rules: _Rules, out16: dict[str, bool],
                   model_out16: bool) -> dict[str, str]:
    """Model outputs a BPU node writes (not as its int32 accumulator) -> their dtype: the producer's, or
    int16 under set_model_output_int16."""
    outputs: dict[str, str] = {}
    for out in graph.output_names:
        producer = graph.producer.get(out)
        if producer is None or placement[producer.name] != "BPU" or rules.leaves_in_int32(producer.name):
            continue
        outputs[out] = INT16 if (out16[producer.name] or model_out16) else INT8
    return outputs


def _out_dtypes(graph: Graph, placement: dict[str, str], rules: _Rules, out16: dict[str, bool]) -> dict[str, str]:
    """Each node's output dtype as hb's table shows it: float on the CPU, int32 for an accumulator that
    leaves the BPU, else int8/int16; a fused member's output is the group's, in the tail's dtype."""
    out_dtype = {}
    for node in graph:
        if placement[node.name] != "BPU":
            out_dtype[node.name] = "float"
        elif rules.int32_out(node):
            out_dtype[node.name] = "int32"
        else:
            out_dtype[node.name] = INT16 if out16[node.name] else INT8
    for node in graph:
        if placement[node.name] == "BPU" and not rules.at_end(node):
            out_dtype[node.name] = out_dtype[rules.tail(node).name]
    return out_dtype


def _weighted(graph: Graph, target: Target, placement: dict[str, str]) -> list[str]:
    """BPU nodes whose weight is an initializer: int8 per output channel."""
    return [n.name for n in graph if placement[n.name] == "BPU" and n.op_type in target.weight_ops
            and len(n.inputs) > target.weight_ops[n.op_type][0]
            and n.inputs[target.weight_ops[n.op_type][0]] in graph.initializers]


def _post_calibration_thresholds(plan: Plan, graph: Graph, target: Target, candidate: Candidate,
                                 groups: list[list[Node]]) -> Plan:
    """A march that sets thresholds after calibration (X5): shared thresholds (tuner.simulate.sharing),
    fixed and derived ones (tuner.simulate.fixed), the uint8 tensors."""
    scale_of = threshold_sources(graph, target, candidate, plan.placement, plan.scale_of, plan.fused)
    rounded = {t for t, _ in list(plan.edges.values()) + list(plan.cpu_reads.values())} | set(plan.outputs)
    fixed, derived = fixed_thresholds(graph, target, plan.placement, plan.edges, plan.passthrough, scale_of, rounded)
    fixed.update(softmax_fixed(plan.softmax))
    unsigned = unsigned_tensors(graph, target, plan.placement, groups, plan.edges, plan.passthrough, scale_of)
    return dataclasses.replace(plan, scale_of=scale_of, fixed=fixed, derived=derived, unsigned=unsigned)


def _softmax_parts(graph: Graph, placement: dict[str, str], in_dtype: dict[str, str]
                   ) -> tuple[dict[str, str], dict[tuple[str, int], tuple[str, str]]]:
    """A Softmax on the BPU runs as hb_mapper's six parts, each quantizing its inputs in the
    Softmax's input dtype (real log 22843858307: all six int16 under an int16 Softmax; the Mul's
    output, the Softmax's, follows its consumers as usual)."""
    softmax: dict[str, str] = {}
    internal: dict[tuple[str, int], tuple[str, str]] = {}
    for node in graph:
        if node.op_type != "Softmax" or placement[node.name] != "BPU" or graph.rank(node.inputs[0]) is None:
            continue
        dtype = in_dtype[node.name] if in_dtype[node.name] in (INT8, INT16) else INT8
        softmax[node.name] = dtype
        m, d, e, s, r = softmax_tensors(node.name)
        part = {p: softmax_part(node.name, p) for p in SOFTMAX_PARTS}
        for key, tensor in (((part["sub"], 1), m), ((part["exp"], 0), d), ((part["reducesum"], 0), e),
                            ((part["mul"], 0), e), ((part["reciprocal"], 0), s), ((part["mul"], 1), r)):
            internal[key] = (tensor, dtype)
    return softmax, internal


def _subgraphs(graph: Graph, placement: dict[str, str]) -> dict[str, int]:
    """BPU subgraph ids, as hb_mapper numbers them in its node table: by level.

    A BPU node's level is the largest, over its inputs, of its BPU producer's level and one more than the
    level of a CPU producer that has a BPU node upstream (a CPU node takes the largest level of its
    inputs); every BPU node of one level is one subgraph, connected or not. So no path leaves a subgraph
    through a CPU node and comes back, and a CPU node that only reads model inputs (an input-side Slice)
    starts no new subgraph. Measured on the example's real node tables (hb_mapper 1.24.3): all-BPU, the
    Where split's Mul/Mul/Add after its CPU Cast are id(1), the rest id(0); with ``/Mul_1`` on the CPU the
    Where part joins the encoder-decoder after it in id(1) while ``/Mul_5`` (reading an input Slice) stays
    id(0); with ``/Slice`` on the CPU everything but the Where part is id(0); with ``/Mul_1`` and
    ``/dec1/conv/Conv`` on the CPU three ids, the heads and the Where part in id(2).
    """
    level: dict[str, int] = {}
    upstream_bpu: dict[str, bool] = {}
    for node in graph:
        on_bpu = placement[node.name] == "BPU"
        lvl, bpu_above = 0, False
        for tensor in node.inputs:
            p = graph.producer.get(tensor)
            if p is None:
                continue
            p_bpu = placement[p.name] == "BPU"
            bpu_above = bpu_above or p_bpu or upstream_bpu[p.name]
            step = 1 if on_bpu and not p_bpu and upstream_bpu[p.name] else 0
            lvl = max(lvl, level[p.name] + step)
        level[node.name], upstream_bpu[node.name] = lvl, bpu_above
    ids: dict[int, int] = {}
    return {n.name: ids.setdefault(level[n.name], len(ids)) for n in graph if placement[n.name] == "BPU"}
