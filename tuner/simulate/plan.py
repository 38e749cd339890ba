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

import numpy as np

from tuner.candidate import Candidate
from tuner.errors import TunerError
from tuner.graph import Graph, Node, Target, fusion_groups
from tuner.graph.softmax import SOFTMAX_PARTS, softmax_part, softmax_tensors
from tuner.simulate.fixed import fixed_thresholds, softmax_fixed, unsigned_tensors
from tuner.simulate.scales import Derived, Fixed
from tuner.simulate.sharing import SPLIT_OPS, THROUGH_SAME_SCALE, threshold_sources

INT8, INT16 = "int8", "int16"
ACTIVATIONS = {"Relu", "Clip", "LeakyRelu", "PRelu"}


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
    candidate, notes = hb_candidate(graph, candidate)
    _check_names(graph, candidate)
    opts = set(candidate.optimization)
    all_int16 = "set_all_nodes_int16" in opts
    softmax_bpu = bool({"set_Softmax_input_int8", "set_Softmax_output_int8"} & opts)

    placement: dict[str, str] = {}
    for node in graph:
        s = candidate.setting(node.name)
        if s.on == "CPU":
            placement[node.name] = "CPU"
        elif s.on == "BPU":
            if target.bpu_capable(node.op_type):
                placement[node.name] = "BPU"
            else:
                placement[node.name] = "CPU"
                notes.append(f"{node.name} ({node.op_type}): cannot run on the BPU of {target.march}; stays on CPU")
        elif node.op_type in target.bpu_ops or (node.op_type == "Softmax" and target.bpu_capable("Softmax") and (
                softmax_bpu or (all_int16 and _softmax_over_last_axis(graph, node)))):
            placement[node.name] = "BPU"
        else:
            placement[node.name] = "CPU"

    notes += _fused_activation_stays(graph, target, candidate, placement)
    notes += _where_cast_on_bpu(graph, placement)
    notes += _follow_the_cpu(graph, target, candidate, placement)

    if placement and not any(p == "BPU" for p in placement.values()):
        # hb_mapper converts such a YAML up to the compile step and then stops (exit 255): "There is no
        # node can execute on BPU in this model, please make sure the model has at least one
        # (Conv/Gemm/MatMul) node which is also supported by BPU." (hmct/compiler/hybrid_build.py,
        # measured; one BPU Add is enough to pass).
        raise TunerError("hb_mapper refuses this configuration: there is no node on the BPU (\"There is no node "
                         "can execute on BPU in this model\"); keep at least one node on the BPU")
    # Fusion groups, less the Conv+Add(+Relu) groups an int16 residual input unfuses (which changes the
    # int16 groups in turn: two rounds at most in practice).
    all_groups = fusion_groups(graph, target)
    unfused = {i for i, g in enumerate(all_groups) if _clip_entries_unfuse(g, candidate)}
    while True:
        rules = _Rules(graph, target, candidate, placement, [g for i, g in enumerate(all_groups) if i not in unfused],
                       all_int16, all_groups)
        wide = rules.spread()
        newly = {i for i, g in enumerate(all_groups) if i not in unfused and rules.unfuses(g, wide)}
        if not newly:
            break
        unfused |= newly
    notes += rules.notes
    fused = rules.fused

    # a tensor an op reads that refuses int16 when hb calibrates (GlobalAveragePool) stays int8 for every
    # reader: one calibration node per tensor (PP-OCRv4 under set_all_nodes_int16: the tensors read by a GAP
    # and an int16 Mul are int8 in its calibrated model); other refusals come at quantization
    pinned = {t for n in graph if placement[n.name] == "BPU" and n.op_type in target.int16_refused_at_calibration
              for _, t in graph.data_inputs(n)}

    def is16(tensor: str) -> bool:
        return rules.find(tensor) in wide and tensor not in pinned

    edges: dict[tuple[str, int], tuple[str, str]] = {}
    cpu_reads: dict[tuple[str, int], tuple[str, str]] = {}
    in_dtype: dict[str, str] = {}
    out16: dict[str, bool] = {}
    emitted: dict[str, str] = {}
    calibrated: dict[tuple[str, int], tuple[str, str]] = {}
    passthrough: dict[tuple[str, int], tuple[str, str]] = {}
    scale_of: dict[str, str] = {}
    refused_out: set[str] = set()

    # Tensors already on a quantization grid: outputs of passive BPU ops whose input was
    # quantized. tensor -> (tensor whose scale applies, dtype).
    grid: dict[str, tuple[str, str]] = {}
    for node in graph:
        s = candidate.setting(node.name)
        on_bpu = placement[node.name] == "BPU"
        data = graph.data_inputs(node)
        passive = on_bpu and node.op_type in target.passive_ops and len(data) == 1 and not (
            (p0 := graph.producer.get(data[0][1])) is not None and (p0.name, node.name) in fused)
        dtypes = []
        for k, tensor in data:
            producer = graph.producer.get(tensor)
            p_bpu = producer is not None and placement[producer.name] == "BPU"
            if on_bpu:
                if producer is not None and p_bpu and (producer.name, node.name) in fused:
                    continue
                dtype = INT8
                if is16(tensor) and target.int16_input(node.op_type, k):
                    dtype = INT16
                    if producer is not None and p_bpu and not out16[producer.name]:
                        if passive and node.op_type not in REQUANTIZING_PASSIVE:
                            dtype = INT8   # a Slice/Reshape/... passes its producer's int8 values through
                            calibrated[(node.name, k)] = (tensor, INT16)
                        else:
                            emitted[tensor] = INT8   # hb requantizes the producer's int8 output to int16
                            # (a pass-through producer only passes on another's int8: that one was named)
                            if producer.name not in refused_out and not all_int16 \
                                    and producer.op_type not in target.passive_ops:
                                refused_out.add(producer.name)
                                notes.append(f"The output of Node(name:{producer.name}, type:{producer.op_type}) does "
                                             f"not support data type: int16 (on {target.march}; it stays int8 and is "
                                             "requantized to int16 for its int16 readers, as hb_mapper does)")
                    if dtype == INT16 and k == 0 and rules.conv_int16_dropped(node):
                        dtype = INT8
                        calibrated[(node.name, k)] = (tensor, INT16)
                        notes.append(f"the quantization parameters of conv int16 is not supported, the input datatype "
                                     f"of node:{node.name} will be set back to int8. (hb_mapper's warning at "
                                     f"quantization on {target.march}; its calibrated model still shows int16)")
                elif is16(tensor) and node.op_type in THROUGH_SAME_SCALE:
                    calibrated[(node.name, k)] = (tensor, INT16)   # a Resize: int16 until quantization
                if dtype == INT8 and s.input_dtype(k) == INT16 and not target.int16_input(node.op_type, k):
                    # hb_mapper's own warning (docs/hb_rules/ops.md §3, S8)
                    notes.append(f"The input{k} of Node(name:{node.name}, type:{node.op_type}) does not "
                                 f"support data type: int16 (on {target.march}; stays int8, as hb_mapper "
                                 "falls back)")
                dtypes.append(dtype)
                if grid.get(tensor, (None, None))[1] == dtype:
                    passthrough[(node.name, k)] = grid[tensor]
                    continue
                edges[(node.name, k)] = (tensor, dtype)
            elif producer is not None and p_bpu and not rules.leaves_in_int32(producer.name):
                cpu_reads[(node.name, k)] = (tensor, INT16 if out16[producer.name] else INT8)
        if on_bpu:
            in_dtype[node.name] = INT16 if INT16 in dtypes else INT8
            if passive:
                # a passive op writes what it reads: int16 out only from an int16 input
                out16[node.name] = in_dtype[node.name] == INT16 and any(is16(o) for o in node.outputs)
            else:
                out16[node.name] = rules.at_end(node) and any(is16(o) for o in node.outputs if o) \
                    and rules.emits16(node)
            if len(data) == 1:
                k, tensor = data[0]
                source = edges.get((node.name, k)) or passthrough.get((node.name, k))
                if source is not None and node.op_type in target.passive_ops:
                    for out in node.outputs:
                        grid[out] = source
                elif source is not None and node.op_type in target.same_scale_ops and not out16[node.name]:
                    for out in node.outputs:
                        scale_of[out] = scale_of.get(source[0], source[0])
        else:
            in_dtype[node.name] = "float"
            out16[node.name] = False
    for node in graph:
        # a fused member reads its group's internal value, which leaves the group in the tail's dtype (hb's
        # table shows a fused Relu as the HzRequantize of that tensor, in its dtype)
        if placement[node.name] == "BPU" and node.name in rules.group and rules.group[node.name][0].name != node.name \
                and not any(
                    (node.name, k) in edges or (node.name, k) in passthrough for k, _ in graph.data_inputs(node)):
            in_dtype[node.name] = INT16 if out16[rules.tail(node).name] else INT8

    # One quantizer per tensor (measured, notes 1a): a CPU node reads a tensor that a BPU node also reads
    # as that BPU node reads it (the same int8/int16 values), whoever produced it: a model input too.
    # (int16 when its calibration is: a Conv that hb set back to int8 reads it through a requantize.)
    quantized_as: dict[str, str] = {}
    if target.post_calibration:
        for t, d in edges.values():
            if quantized_as.get(t) != INT16:
                quantized_as[t] = d
    for node in graph:
        if placement[node.name] == "BPU":
            continue
        for k, tensor in graph.data_inputs(node):
            if (node.name, k) not in cpu_reads and tensor in quantized_as:
                cpu_reads[(node.name, k)] = (tensor, quantized_as[tensor])

    outputs: dict[str, str] = {}
    model_out16 = "set_model_output_int16" in opts
    for out in graph.output_names:
        producer = graph.producer.get(out)
        if producer is None or placement[producer.name] != "BPU" or rules.leaves_in_int32(producer.name):
            continue
        outputs[out] = INT16 if (out16[producer.name] or model_out16) else INT8

    softmax, internal = _softmax_parts(graph, placement, in_dtype)

    out_dtype = {}
    for node in graph:
        if placement[node.name] != "BPU":
            out_dtype[node.name] = "float"
        elif rules.int32_out(node):
            out_dtype[node.name] = "int32"
        else:
            out_dtype[node.name] = INT16 if out16[node.name] else INT8
    for node in graph:   # a fused member's output is the group's: it leaves in the tail's dtype
        if placement[node.name] == "BPU" and not rules.at_end(node):
            out_dtype[node.name] = out_dtype[rules.tail(node).name]

    weights = [n.name for n in graph if placement[n.name] == "BPU" and n.op_type in target.weight_ops
               and len(n.inputs) > target.weight_ops[n.op_type][0]
               and n.inputs[target.weight_ops[n.op_type][0]] in graph.initializers]

    subgraph = _subgraphs(graph, placement)
    fixed: dict[str, Fixed] = {}
    derived: dict[str, Derived] = {}
    unsigned: frozenset[str] = frozenset()
    if target.post_calibration:
        scale_of = threshold_sources(graph, target, candidate, placement, scale_of, fused)
        rounded = {t for t, _ in list(edges.values()) + list(cpu_reads.values())} | set(outputs)
        fixed, derived = fixed_thresholds(graph, target, placement, edges, passthrough, scale_of, rounded)
        fixed.update(softmax_fixed(softmax))
        groups_in_effect = [g for i, g in enumerate(all_groups) if i not in unfused]
        unsigned = unsigned_tensors(graph, target, placement, groups_in_effect, edges, passthrough, scale_of)
    return Plan(placement=placement, edges=edges, outputs=outputs, cpu_reads=cpu_reads, weights=weights,
                subgraph=subgraph, in_dtype=in_dtype, out_dtype=out_dtype, passthrough=passthrough,
                scale_of=scale_of, notes=notes, emitted=emitted, calibrated=calibrated, softmax=softmax,
                internal=internal, fixed=fixed, derived=derived, unsigned=unsigned, fused=frozenset(fused))


def _fused_activation_stays(graph: Graph, target: Target, candidate: Candidate, placement: dict[str, str]) -> list[str]:
    """An ``ON: CPU`` on a Relu or Clip fused right after a Conv that runs on the BPU does nothing: hb fuses
    it all the same (toys Q1, Q2: the Conv's output has no calibration node, the activation no row; the
    latency benchmark's pareto_t37 on the example: ``/radar/act/Clip`` with ``ON: CPU`` is not among hb's
    CPU nodes)."""
    notes = []
    for group in fusion_groups(graph, target):
        if len(group) < 2 or group[0].op_type != "Conv" or placement.get(group[0].name) != "BPU":
            continue
        act = group[1]
        if act.op_type in CONV_ACTIVATIONS and placement.get(act.name) == "CPU" and candidate.setting(act.name).on == "CPU":
            placement[act.name] = "BPU"
            notes.append(f"{act.name} ({act.op_type}): 'ON': 'CPU' has no effect on an activation fused into its Conv "
                         f"{group[0].name}, which runs on the BPU (hb_mapper fuses them all the same)")
    return notes


def _where_cast_on_bpu(graph: Graph, placement: dict[str, str]) -> list[str]:
    """The Cast a split Where starts with (``<name>_cast``, tuner.graph.optimize) is not in hb's graph when
    the comparison it reads runs on the BPU: the comparison (``HzQuantizedComparison``) feeds the Where's
    ``_mul_x`` and ``_equal`` itself, so ``_mul_x`` joins the comparison's BPU subgraph (the latency benchmark's
    Pareto trials on the example, ``/Greater`` with ``ON: BPU``: no ``/Where_cast`` row, ``/Where_mul_x`` in
    id(0) with the trunk, ``/Where_mul_y`` after the CPU ``/Where_equal`` in id(1)). tuner keeps the Cast (it
    changes no value: 0/1 read with scale 1) and runs it on the BPU beside the comparison."""
    notes = []
    for rw in graph.names.rewrites.values():
        if rw.op_type != "Where" or not rw.nodes or rw.nodes[0] not in graph.by_name:
            continue
        cast = graph.by_name[rw.nodes[0]]
        p = graph.producer.get(cast.inputs[0]) if cast.op_type == "Cast" and cast.inputs else None
        if p is not None and placement.get(p.name) == "BPU" and placement.get(cast.name) == "CPU":
            placement[cast.name] = "BPU"
            notes.append(f"{cast.name} (Cast): hb_mapper has no such node when {p.name} ({p.op_type}) runs on the "
                         "BPU; it is simulated there, beside it")
    return notes


#: Ops hb_mapper moves to the CPU when every node reading their output is on the CPU and they carry no
#: ``node_info`` entry (measured, hb_mapper 1.24.3, toy models at O0): MaxPool, AveragePool, Concat, Resize
#: and Slice went to the CPU (also with a model output beside the CPU reader); Transpose, Reshape, Split,
#: GlobalAveragePool, Sigmoid, Abs, Relu, Clip, Add and Mul of two feature maps stayed on the BPU; a reader
#: left on the BPU, an ``ON: BPU`` or an ``InputType`` entry kept them there.
CPU_PULLED_OPS = frozenset({"MaxPool", "AveragePool", "Concat", "Resize", "Slice"})
#: Activations that follow a Conv of theirs to the CPU (measured: Relu and Clip(0, 6) fused after a Conv
#: with ``ON: CPU`` are on the CPU in hb's node table; a residual Add after such a Conv stays on the BPU).
CONV_ACTIVATIONS = frozenset({"Relu", "Clip"})


def _follow_the_cpu(graph: Graph, target: Target, candidate: Candidate, placement: dict[str, str]) -> list[str]:
    """hb_mapper's own moves after the requested placement (in place), with a note for each node moved:
    a Relu/Clip fused after a CPU Conv goes with it, and an op of :data:`CPU_PULLED_OPS` whose readers are
    all on the CPU goes there too, repeatedly (the bundled example with its two decoder Convs on the CPU:
    their Relus, ``/up/Resize`` and ``/Concat_2`` are on the CPU in the real node table: 12 CPU nodes where
    the YAML names 8), when every input it reads is a model input, a CPU node's output or a Conv group's
    (toys P1, P2, P3: a Concat of a Mul or Add and a Conv+Clip, read by a CPU Conv, stays on the BPU, a
    Concat of two Conv groups goes (Z6); the latency benchmark's cpu_shallow on the example: ``/Concat_1``,
    of ``/Mul_1`` and ``/radar/act/Clip``, stays on the BPU before the CPU ``/fuse/conv/Conv``)."""
    if not target.post_calibration:
        return []
    moved: list[tuple[str, str]] = []

    def free(name: str) -> bool:
        return not candidate.setting(name).to_dict()

    for group in fusion_groups(graph, target):
        head = group[0]
        if placement.get(head.name) == "CPU" and head.op_type in ("Conv", "ConvTranspose") and len(group) > 1:
            nxt = group[1]
            # an int16 entry does not keep it (the latency benchmark's pareto_t23 on the example:
            # ``/enc3/enc3.0/act/Relu`` with InputType int16 is on the CPU with its ``ON: CPU`` Conv)
            if nxt.op_type in CONV_ACTIVATIONS and placement.get(nxt.name) == "BPU" \
                    and candidate.setting(nxt.name).on is None:
                placement[nxt.name] = "CPU"
                moved.append((nxt.name, f"follows its Conv {head.name} to the CPU"))
    tail_of = {g[-1].name: g[0] for g in fusion_groups(graph, target)}
    # the ops that go: the largest set of free pulled BPU ops each of whose readers is on the CPU or in the set,
    # and each of whose inputs is a model input, a CPU node's, a Conv group's (which leaves the BPU as its int32
    # accumulator) or one of the set's
    going = {n.name for n in graph if placement.get(n.name) == "BPU" and n.op_type in CPU_PULLED_OPS and free(n.name)}

    def stays(node: Node) -> bool:
        readers = [c for o in node.outputs if o for c, _ in graph.consumers.get(o, [])]
        if not readers or any(placement[c.name] != "CPU" and c.name not in going for c in readers):
            return True
        for _, t in graph.data_inputs(node):
            p = graph.producer.get(t)
            if p is not None and placement[p.name] == "BPU" and p.name not in going \
                    and tail_of.get(p.name, p).op_type not in target.int32_output_ops:
                return True
        return False

    changed = True
    while changed:
        out = {name for name in going if stays(graph.by_name[name])}
        going -= out
        changed = bool(out)
    for node in reversed(list(graph)):
        if node.name in going:
            placement[node.name] = "CPU"
            moved.append((node.name, "every node reading it is on the CPU: hb_mapper runs it there too"))
    return [f"{name} ({graph.by_name[name].op_type}): {why}" for name, why in moved]


#: LUT ops that are arithmetic with a constant rather than a table of a function: not covered by
#: _Rules.reads_int16_table (an int16 Sub by a constant at a model output has not been measured).
ARITHMETIC_LUTS = frozenset({"Add", "Sub", "Mul", "Div", "Clip", "Relu", "LeakyRelu", "Pow"})
#: Passive ops that do not pass an int8 producer's values through into an int16 group: hb requantizes them to
#: int16 in front (toys W4, W8: a MaxPool behind a Resize of an int16 group reads int16 through
#: ``u0_Requantize``, its row int16; a Slice passes the int8 values on).
REQUANTIZING_PASSIVE = frozenset({"MaxPool"})
#: Members fused after a Conv whose InputType int16 hb takes as a request on the group's output (toys U2, U5: a
#: Relu of Conv+Relu; V6: the Relu of Conv+Add+Relu; X5: the Clip of Conv+Add+Clip; R7: the Add of
#: Conv+Add+Relu, which its int16 inputs unfuse as well: its Relu output int16). A Clip fused after a Conv
#: alone is unfused by such an entry instead (:func:`_clip_entries_unfuse`).
GROUP_OUTPUT_ACTS = frozenset({"Relu", "Clip", "Add"})


def _clip_entries_unfuse(group: list[Node], candidate: Candidate) -> bool:
    """A Conv+Clip group whose Clip carries an int16 ``InputType``/``OutputType`` in node_info is not fused:
    the Conv's output gets an int16 calibration of its own and the Clip is a table with its input's
    threshold (toys W5, X4: ``c0`` out int16 at 9.72 and 18.6, the Clip a row of its own; the example's
    pareto_t22 and pareto_t23, ``/radar/act/Clip`` with int16 in and out: ``/radar/conv/Conv``'s output int16
    at 33.839 and an ``HzLut2Layer`` row). set_all_nodes_int16 leaves it fused (the example's all_int16:
    no Clip rows), and so does the same entry on the Clip of Conv+Add+Clip (X5)."""
    if len(group) != 2 or group[0].op_type != "Conv" or group[1].op_type != "Clip":
        return False
    s = candidate.setting(group[1].name)
    return s.output_type == INT16 or any(s.input_dtype(k) == INT16 for k in range(3))


class _Rules:
    """hb_mapper's dtype rules for one candidate on one graph: its fusion groups (``groups``, without the
    ones an int16 residual input unfuses), what each BPU node may emit, and the int16 groups."""

    def __init__(self, graph: Graph, target: Target, candidate: Candidate, placement: dict[str, str],
                 groups: list[list[Node]], all_int16: bool, static_groups: list[list[Node]] | None = None):
        self.graph, self.target, self.candidate, self.placement = graph, target, candidate, placement
        self.all_int16 = all_int16
        self.group = {n.name: g for g in groups for n in g}
        self.static_group = {n.name: g for g in (groups if static_groups is None else static_groups) for n in g}
        self.fused = {(a.name, b.name) for g in groups for a, b in zip(g, g[1:])}
        self.notes: list[str] = []
        self.parent: dict[str, str] = {}
        self.outputs = set(graph.output_names)

    # -- what a node may emit ----------------------------------------------------------------
    def tail(self, node: Node) -> Node:
        group = self.group.get(node.name)
        return group[-1] if group else node

    def at_end(self, node: Node) -> bool:
        return self.tail(node).name == node.name

    def emits16(self, node: Node) -> bool:
        """Whether the tensor a BPU node writes may be int16: the node and, at the end of a fusion
        group, the group's head (a ConvTranspose+Relu or dilated Conv+Relu group leaves in int8).
        A chain of LUT ops is one table, whose int16 form exists (HzLut2Layer, docs/hb_rules/ops.md S7):
        only its last op counts."""
        group = self.group.get(node.name)
        head = group[0] if group and group[-1].name == node.name else node
        head_ok = head.op_type in self.target.lut_ops or self.target.int16_output(head.op_type, head.proto)
        return self.target.int16_output(node.op_type, node.proto) and head_ok

    def wants_out16(self, node: Node, explicit_only: bool = False) -> bool:
        """An OutputType int16 (or set_all_nodes_int16; not with ``explicit_only``) the node's group can
        honour: its tail's output. A fused Conv's OutputType reaches the output of its Relu (measured:
        OutputType int16 on a Conv+Add+Relu's Conv makes the Relu output int16)."""
        s = self.candidate.setting(node.name)
        tail = self.tail(node)
        if s.output_type == INT16 and not (self.target.int16_output(node.op_type, node.proto) and self.emits16(tail)):
            if not explicit_only:
                self.notes.append(f"The output of Node(name:{node.name}, type:{node.op_type}) does not support data "
                                  f"type: int16 (on {self.target.march}; stays int8, as hb_mapper falls back)")
            return False
        asked = s.output_type == INT16 or (not explicit_only and self.all_int16
                                           and self.target.int16_output(node.op_type, node.proto))
        return asked and self.emits16(tail)

    def leaves_in_int32(self, name: str) -> bool:
        """A Conv group (Conv [+ BN] [+ Relu/Clip] [+ residual Add]) may hand its int32 accumulator to the CPU
        or a model output: its output calibration is removed and it is dequantized with the Conv's scale,
        the activation applied in the accumulator (measured: A2_cpu_mulx, Conv+Relu and Conv+Clip read by a
        CPU Mul alone lost their calibration nodes; A_cpu_conv5, ``activation relu, output_bit 32``; the
        example's cpu_interior: ``/stem/act/Clip_output_0`` has no calibration node). A group ending in its
        activation at a model output is not one of them: it leaves in int16 like other ops (a toy Conv+Relu
        output with 576 taps kept its int16 input, which an int32 output of that width drops)."""
        node = self.graph.by_name[name]
        group = self.group.get(name)
        head = group[0] if group and group[-1].name == name else node
        if head is not node and node.op_type in ACTIVATIONS and any(o in self.outputs for o in node.outputs):
            return False
        return head.op_type in self.target.int32_output_ops and not self.target.output_int8_only(head.proto)

    def int32_out(self, node: Node) -> bool:
        """The node (a fusion group's tail) leaves the BPU as its int32 accumulator: no BPU node reads it."""
        return self.leaves_in_int32(node.name) and not any(
            self.placement[c.name] == "BPU" for o in node.outputs for c, _ in self.graph.consumers.get(o, []))

    def high_precision(self, node: Node) -> bool:
        """A BPU node whose output no BPU node reads (its readers are CPU nodes, or it is a model
        output) leaves the BPU in high precision: a Conv group in int32 (leaves_in_int32), any other op
        that may emit int16 in int16 with the same threshold (hb's ``<out>_before`` int16 node at a model
        output). A function table's output (Sigmoid, HardSigmoid, Tanh, HardSwish, ...) read by CPU nodes
        whose results come back to the BPU stays int8 (A2_cpu_addy; PP-OCR's p2o.HardSigmoid.0 before a
        CPU Mul: int8 at 1.0, its HardSwish ``p2o.Mul.2`` before the CPU ``p2o.Conv.2`` of the latency
        benchmark's cpu_shallow; toys Z8-Z10: Sigmoid, HardSwish, Tanh -> CPU Conv -> BPU Conv, int8);
        read by CPU nodes that lead only to model outputs, or a model output itself, it is int16 (toys
        Z1-Z5: HardSwish, Abs, Tanh, Sigmoid, Exp -> CPU Conv -> output, int16 and its input too;
        ``<out>_before`` int16, threshold 0.999985: a toy Conv -> Sigmoid -> output and PP-OCR's
        detector). Measured on the real toolchain (notes on hmct's placement rules, 1b: A_cpu_conv4,
        A2_cpu_mulout; the example's ``depth_before`` and ``/Sub_1_output_0`` are int16 in every
        configuration)."""
        if not self.target.post_calibration or not node.outputs \
                or self.leaves_in_int32(node.name) or not self.emits16(node):
            return False
        if not self.target.int16_output(node.op_type, node.proto):
            return False
        for o in node.outputs:
            readers = self.graph.consumers.get(o, [])
            if any(self.placement[c.name] == "BPU" for c, _ in readers) or not (readers or o in self.outputs):
                return False
        table = node.op_type in self.target.lut_ops and node.op_type not in ARITHMETIC_LUTS
        return not (table and self.back_to_bpu(node))

    def back_to_bpu(self, node: Node) -> bool:
        """Whether a path from ``node``'s outputs through CPU nodes reaches a BPU node."""
        seen: set[str] = set()
        todo = [o for o in node.outputs if o]
        while todo:
            for c, _ in self.graph.consumers.get(todo.pop(), []):
                if self.placement[c.name] == "BPU":
                    return True
                if c.name not in seen:
                    seen.add(c.name)
                    todo.extend(o for o in c.outputs if o)
        return False

    # -- the int16 groups --------------------------------------------------------------------
    def find(self, t: str) -> str:
        self.parent.setdefault(t, t)
        while self.parent[t] != t:
            self.parent[t] = self.parent[self.parent[t]]
            t = self.parent[t]
        return t

    def standalone_clip(self, node: Node) -> bool:
        """A Clip on the BPU that is not fused into its producer: hb runs it with its input's threshold and
        dtype, a pass-through op of the threshold groups (toys W5, X4, X6, Y3, Y4: the Clip(0, 6) output
        takes its input's 9.72, 18.6, 19.3, 12.2, also in int8; the example's ``/radar/act/Clip`` under an
        int16 entry: 33.839 on both sides, not 6)."""
        if node.op_type != "Clip" or self.placement[node.name] != "BPU":
            return False
        data = self.graph.data_inputs(node)
        p = self.graph.producer.get(data[0][1]) if data else None
        return not (p is not None and (p.name, node.name) in self.fused)

    def joins(self, node: Node) -> bool:
        """Whether ``node`` joins its first input and its outputs into one threshold group."""
        return node.op_type in self.target.passive_ops or node.op_type in THROUGH_SAME_SCALE \
            or self.standalone_clip(node)

    def spread(self) -> set[str]:
        """The roots of the int16 groups: hb's threshold groups (a pass-through op, a same-scale Resize and
        a standalone Clip join their input and outputs, a Concat every input and its output) with an int16
        request on any member. Measured on hb_mapper 1.24.3 (notes on hmct's placement rules, 3a; the
        example's int16_2convs: int16 on ``/stem/conv/Conv``'s input makes the model input, its three Slices,
        the Concat they feed and the lowered ``/Mul`` int16, and on ``/fuse/conv/Conv``'s output the Resize
        input two Concats away). A request is an InputType (or set_all_nodes_int16) an input may take, an
        OutputType as :meth:`request_output` places it, hb's high-precision output of a tensor no BPU node
        reads, and the input of a function table whose output is int16 (:meth:`table_reads_int16`)."""
        g, target = self.graph, self.target
        self.parent = {}

        def bpu(name: str) -> bool:
            return self.placement[name] == "BPU"

        for node in g:
            data = g.data_inputs(node)
            if self.joins(node) and data and node.outputs:
                t = data[0][1]
                p = g.producer.get(t)
                if p is not None and (p.name, node.name) in self.fused:
                    continue
                if bpu(node.name) or (node.op_type in SPLIT_OPS and any(bpu(c.name) for c, _ in g.consumers.get(t, []))):
                    for o in node.outputs:
                        self.parent[self.find(o)] = self.find(t)
            elif node.op_type == "Concat" and bpu(node.name) and node.outputs:
                for _, t in data:
                    self.parent[self.find(t)] = self.find(node.outputs[0])
        seeds: set[str] = set()
        for node in g:
            if not bpu(node.name):
                continue
            s = self.candidate.setting(node.name)
            # an InputType on a member after the head of a fusion group (as the graph has it, before int16
            # unfuses any) is a request on the group's output (toys U2, U5, V6, X5; R7, whose Add InputType
            # also unfuses the group; the example's pareto_t14 ``/enc3/enc3.0/act/Relu``)
            static = self.static_group.get(node.name)
            group_output = static is not None and static[0] is not node and node.op_type in GROUP_OUTPUT_ACTS \
                and any(s.input_dtype(k) == INT16 for k, _ in g.data_inputs(node))
            for k, t in g.data_inputs(node):
                p = g.producer.get(t)
                if p is not None and (p.name, node.name) in self.fused:
                    continue
                asked = s.input_dtype(k) == INT16 or (self.all_int16 and target.int16_input(node.op_type, k))
                if asked and target.int16_input(node.op_type, k):
                    seeds.add(t)
            if group_output and static is not None and self.emits16(self.tail(static[-1])):
                seeds.update(self.request_output(static[-1]))
            if self.wants_out16(node, explicit_only=True):
                seeds.update(self.request_output(node))
            elif self.wants_out16(node):     # set_all_nodes_int16 (a refused OutputType leaves its note)
                seeds.update(o for o in self.tail(node).outputs if o)
            if self.at_end(node) and self.high_precision(node):
                seeds.update(o for o in node.outputs if o)
        # a function table whose output is int16 reads its input in int16 (its int16 table), whichever request
        # made the output int16: until nothing changes (a table behind a table)
        tables = [n for n in g if bpu(n.name) and self.table_reads_int16(n)]
        while True:
            roots = {self.find(t) for t in seeds}
            more = {g.data_inputs(n)[0][1] for n in tables if any(self.find(o) in roots for o in n.outputs if o)}
            if more <= seeds:
                return roots
            seeds |= more

    def request_output(self, node: Node) -> set[str]:
        """The tensors an OutputType int16 on ``node`` makes int16. hb hands the request to the readers of what
        the node's fusion group writes (its tail: a fused Conv's OutputType reaches its Relu's output; an
        InputType on that Relu means the same), as an InputType on each: a reader that may read int16 takes
        it, one that may not (Resize, ConvTranspose, GlobalAveragePool) warns ``The input0 of Node(name:…,
        type:Resize) does not support data type: int16`` and takes nothing, so the request stops there
        (toys U1, U3, W1-W3, W6, W7: nothing becomes int16; the example's int16_top5 ``/dec3/act/Relu`` and
        pareto_t14 ``/dec2/conv/Conv``, whose groups only a Resize reads, stay int8). A model output takes
        it itself. A pass-through op (MaxPool, Slice, a standalone Clip) joins its input's group, which the
        request then reaches through it (toys Y2, Y3, X4: the MaxPool's or Clip's input int16 although only
        a Resize reads the output)."""
        g = self.graph
        tail = self.tail(node)
        out: set[str] = set()
        data = g.data_inputs(tail)
        if self.joins(tail) and data:
            out.add(data[0][1])
        for o in tail.outputs:
            if not o:
                continue
            if o in self.outputs:
                out.add(o)
            for c, k in g.consumers.get(o, []):
                if self.placement[c.name] != "BPU":
                    continue
                if self.target.int16_input(c.op_type, k):
                    out.add(o)
                else:
                    self.notes.append(f"The input{k} of Node(name:{c.name}, type:{c.op_type}) does not support data "
                                      f"type: int16 (the OutputType int16 of {node.name} on {self.target.march}; "
                                      "it stays int8, as hb_mapper falls back)")
        return out

    def table_reads_int16(self, node: Node) -> bool:
        """A table that reads its input in int16 when its output is int16: a function table
        (:meth:`reads_int16_table`; the example's pareto_t14: ``/Sigmoid_2``, whose output an int16 ``/Mul_3``
        reads, reads int16, and so does ``/Sigmoid_1`` beside it through the shared Resize output) and a
        Relu or LeakyRelu not fused into its producer (toy X8: a LeakyRelu with OutputType int16 reads
        int16; pareto_t14's ``/enc3/enc3.1/relu/Relu``)."""
        if not self.emits16(node) or not self.at_end(node):
            return False
        if self.reads_int16_table(node):
            return True
        data = self.graph.data_inputs(node)
        if node.op_type not in ("Relu", "LeakyRelu") or len(data) != 1 or not self.target.int16_input(node.op_type, 0):
            return False
        p = self.graph.producer.get(data[0][1])
        return not (p is not None and (p.name, node.name) in self.fused)

    def reads_int16_table(self, node: Node) -> bool:
        """A function table (Sigmoid, Abs, ...) whose output is int16 reads its input in int16 too (its
        int16 table, HzLut2Layer): measured for a Sigmoid at a model output (PP-OCR's detector, a toy
        Conv -> Sigmoid: input int16 at 11.0903) and for Abs (notes on hmct's placement rules,
        A2_cpu_mulout); the other function tables inferred alike."""
        return node.op_type in self.target.lut_ops and node.op_type not in ARITHMETIC_LUTS \
            and len(self.graph.data_inputs(node)) == 1 and self.target.int16_input(node.op_type, 0)

    def unfuses(self, group: list[Node], wide: set[str]) -> bool:
        """An int16 input of a fused residual Add, or of the Conv heading it, unfuses Conv+Add(+Relu): the
        Conv's output gets its own calibration, the Add is an element-wise op, the Relu a LUT. Measured with
        toy Conv+Add(+Relu/Clip) groups on hb_mapper 1.24.3: InputType int16 on the Add (R7), the residual
        int16 (R1, R2, V1: InputType on the Relu fused before it), the Conv's own input int16 with an int8
        residual (V3, V5, X3, X6: the Conv's output int8 at 28.0, the Add a row of its own); not OutputType
        on the Conv, the Add or the Relu (R3, R4, R6, V4). The example under set_all_nodes_int16:
        ``/enc2/enc2.1/Add`` ``HzSElementwiseAdd``, its Relu ``HzLut2Layer``; pareto_t14's
        ``/enc3/enc3.1/conv2/Conv`` (int16 in and out)."""
        head = group[0]
        if head.op_type == "Conv" and any(n.op_type == "Add" for n in group[1:]):
            data = self.graph.data_inputs(head)
            if data and self.find(data[0][1]) in wide and self.target.int16_input(head.op_type, 0):
                return True
        for i, n in enumerate(group):
            if n.op_type != "Add" or i == 0:
                continue
            s = self.candidate.setting(n.name)
            for k, t in self.graph.data_inputs(n):
                p = self.graph.producer.get(t)
                if s.input_dtype(k) == INT16 or (not (p is not None and p.name == group[i - 1].name)
                                                 and self.find(t) in wide):
                    return True
        return False

    def conv_int16_dropped(self, node: Node) -> bool:
        """hb_mapper sets a Conv's int16 input back to int8 at quantization ("the quantization parameters
        of conv int16 is not supported"; the calibrated model keeps int16) when the march's table says
        so (``conv_int16_input_drop``): on X5 a depthwise Conv with a stride above 1 and a Conv leaving
        the BPU in int32 with more than 256 taps (Cin/group x kh x kw), see search_spaces/targets."""
        rule = self.target.conv_int16_input_drop
        if not rule or node.op_type != "Conv" or len(node.inputs) < 2 or node.inputs[1] not in self.graph.initializers:
            return False
        dims = tuple(self.graph.initializers[node.inputs[1]].dims)
        if len(dims) < 3:
            return False
        group = int(node.attr("group", 1))
        strides = list(node.attr("strides", [1]))
        stride_limit = rule.get("depthwise_max_stride")
        if stride_limit is not None and group > 1 and dims[1] == 1 and max(strides) > stride_limit:
            return True
        taps = rule.get("int32_output_max_taps")
        if taps is not None and int(np.prod(dims[1:])) > taps:
            tail = self.tail(node)
            return self.int32_out(tail)
        return False


def _softmax_over_last_axis(graph: Graph, node: Node) -> bool:
    """A Softmax over its input's last axis, which set_all_nodes_int16 puts on the BPU (six int16 parts); over
    another axis it stays on the CPU ("does not support data type: int16"). Measured with toy Softmaxes under
    set_all_nodes_int16: 2-D axis 1, 3-D axis 2, 4-D axis 3 and -1 on the BPU; 3-D axis 1 and 4-D axis 1 on
    the CPU; PP-OCR's classifier's [1, 2] Softmax on the BPU (on the CPU in int8)."""
    rank = graph.rank(node.inputs[0]) if node.inputs else None
    axis = int(node.attr("axis", 1))     # opset <= 11 (hb's), where the default is 1
    return rank is not None and axis % rank == rank - 1


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
