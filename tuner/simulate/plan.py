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
* int16 is resolved per input (MatMul: input 0 only) and per node (a dilated Conv emits int8
  only); an int16 input also needs a producer that can emit int16 (x5_op_facts section 3, S4);
  an explicit request that cannot be met falls back to int8 with hb_mapper's warning text; on
  bayes/bayes-e an int16-input Conv gets an int16, floored output (AdjustConvQuantParams).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tuner.candidate import Candidate
from tuner.errors import TunerError
from tuner.graph import Graph, Node, Target, fused_edges, fusion_groups
from tuner.graph.softmax import SOFTMAX_PARTS, softmax_part, softmax_tensors
from tuner.simulate.fixed import fixed_thresholds, unsigned_tensors
from tuner.simulate.scales import Derived, Fixed
from tuner.simulate.sharing import threshold_sources

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
    # AdjustConvQuantParams: Conv output tensor -> (its int16 input tensor, its weight initializer);
    # the output threshold is floored at max|w| x the input's threshold (see _adjust_int16_conv)
    conv_floors: dict[str, tuple[str, str]] = field(default_factory=dict)
    # BPU Softmaxes, run as hb_mapper's six parts (tuner.graph.optimize.softmax_parts): node -> dtype
    # of the parts, and the quantization points between the parts: (part, k) -> (tensor, dtype)
    softmax: dict[str, str] = field(default_factory=dict)
    internal: dict[tuple[str, int], tuple[str, str]] = field(default_factory=dict)
    # hb's thresholds that calibration does not give (tuner.simulate.fixed): scale source -> rule
    fixed: dict[str, Fixed] = field(default_factory=dict)
    derived: dict[str, Derived] = field(default_factory=dict)
    # the scale sources an asymmetric calibration makes uint8 (tuner.simulate.fixed.unsigned_tensors)
    unsigned: frozenset[str] = frozenset()
    # tensors rounded first on their own calibrated threshold in this dtype, before the int16 point that
    # reads them (a ConvTranspose's int8 output ahead of hb's separate bias Add, see _bias_split)
    pre_round: dict[str, str] = field(default_factory=dict)

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
    nodes, notes = graph.names.translate(tuple((n, s.to_dict()) for n, s in candidate.nodes), set(graph.by_name))
    return Candidate.make(candidate.calibration, nodes, candidate.optimization), notes


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
        elif node.op_type in target.bpu_ops or (softmax_bpu and node.op_type == "Softmax"):
            placement[node.name] = "BPU"
        else:
            placement[node.name] = "CPU"

    if placement and not any(p == "BPU" for p in placement.values()):
        # hb_mapper converts such a YAML up to the compile step and then stops (exit 255): "There is no
        # node can execute on BPU in this model, please make sure the model has at least one
        # (Conv/Gemm/MatMul) node which is also supported by BPU." (hmct/compiler/hybrid_build.py,
        # measured; one BPU Add is enough to pass).
        raise TunerError("hb_mapper refuses this configuration: there is no node on the BPU (\"There is no node "
                         "can execute on BPU in this model\"); keep at least one node on the BPU")
    groups_list = fusion_groups(graph, target)
    groups = {n.name: g for g in groups_list for n in g}

    def emits16(node: Node) -> bool:
        """Whether the tensor a BPU node writes may be int16: the node and, at the end of a fusion
        group, the group's head (a ConvTranspose+Relu or dilated Conv+Relu group leaves in int8).
        A chain of LUT ops is one table, whose int16 form exists (HzLut2Layer, x5_op_facts S7):
        only its last op counts."""
        group = groups.get(node.name)
        head = group[0] if group and group[-1].name == node.name else node
        head_ok = head.op_type in target.lut_ops or target.int16_output(head.op_type, head.proto)
        return target.int16_output(node.op_type, node.proto) and head_ok

    def wants_out16(node: Node) -> bool:
        s = candidate.setting(node.name)
        asked = s.output_type == INT16 or (all_int16 and target.int16_output(node.op_type, node.proto))
        if s.output_type == INT16 and not target.int16_output(node.op_type, node.proto):
            # Modelled on hb_mapper's input warning (x5_op_facts section 3, S8); the output form of
            # the text has not been seen in a real log.
            notes.append(f"The output of Node(name:{node.name}, type:{node.op_type}) does not support data type: "
                         f"int16 (on {target.march}; stays int8, as hb_mapper falls back)")
            return False
        return asked and emits16(node)

    def leaves_in_int32(name: str) -> bool:
        node = graph.by_name[name]
        group = groups.get(name)
        head = group[0] if group and group[-1].name == name else node
        tail_ok = node.op_type not in ACTIVATIONS
        return head.op_type in target.int32_output_ops and tail_ok and not target.output_int8_only(head.proto)

    outputs_set = set(graph.output_names)

    def high_precision(node: Node) -> bool:
        """A BPU node whose output no BPU node reads (its readers are CPU nodes, or it is a model
        output) leaves the BPU in high precision: a Conv group in int32 (leaves_in_int32), any other op
        that may emit int16 in int16 with the same threshold (hb's ``<out>_before`` int16 node at a model
        output). A Sigmoid's or HardSigmoid's table output read only by CPU nodes stays int8 (A2_cpu_addy;
        PP-OCR's p2o.HardSigmoid.0 before a CPU Mul: int8 at 1.0); at a model output it is int16
        (``<out>_before`` int16, threshold 0.999985: a toy Conv -> Sigmoid -> output and PP-OCR's
        detector). Measured on the real toolchain (notes on hmct's placement rules, 1b: A_cpu_conv4,
        A2_cpu_mulout; the example's ``depth_before`` and ``/Sub_1_output_0`` are int16 in every
        configuration)."""
        table_to_cpu = node.op_type in ("Sigmoid", "HardSigmoid") and not any(o in outputs_set for o in node.outputs)
        if not target.post_calibration or table_to_cpu or not node.outputs \
                or leaves_in_int32(node.name) or not emits16(node):
            return False
        if not target.int16_output(node.op_type, node.proto):
            return False
        for o in node.outputs:
            readers = graph.consumers.get(o, [])
            if any(placement[c.name] == "BPU" for c, _ in readers) or not (readers or o in outputs_set):
                return False
        return True

    out16 = {n.name: placement[n.name] == "BPU" and (wants_out16(n) or high_precision(n)) for n in graph}
    fused = fused_edges(graph, target)
    edges: dict[tuple[str, int], tuple[str, str]] = {}
    cpu_reads: dict[tuple[str, int], tuple[str, str]] = {}
    in_dtype: dict[str, str] = {}
    refused: set[tuple[str, int]] = set()
    passthrough: dict[tuple[str, int], tuple[str, str]] = {}
    scale_of: dict[str, str] = {}
    conv_floors: dict[str, tuple[str, str]] = {}
    pre_round: dict[str, str] = {}

    # Tensors already on a quantization grid: outputs of passive BPU ops whose input was
    # quantized. tensor -> (tensor whose scale applies, dtype).
    grid: dict[str, tuple[str, str]] = {}
    for node in graph:
        s = candidate.setting(node.name)
        on_bpu = placement[node.name] == "BPU"
        dtypes = []
        for k, tensor in graph.data_inputs(node):
            producer = graph.producer.get(tensor)
            p_bpu = producer is not None and placement[producer.name] == "BPU"
            if on_bpu:
                if producer is not None and p_bpu and (producer.name, node.name) in fused:
                    continue
                asked = s.input_dtype(k) == INT16 or (all_int16 and target.int16_input(node.op_type, k)) \
                    or _lut_reads_int16(graph, target, node, out16)
                from_producer = producer is not None and out16[producer.name]
                # S4: an int16 input asks its producer for an int16 output too; a BPU producer
                # that cannot give one (Resize, ConvTranspose, ...) makes the request fall back.
                producer_ok = producer is None or not p_bpu or emits16(producer)
                bias_add = p_bpu and producer is not None and _bias_split(graph, producer)
                dtype = INT8
                if asked or from_producer:
                    if target.int16_input(node.op_type, k) and (producer_ok or bias_add):
                        dtype = INT16
                        if not producer_ok:
                            pre_round[tensor] = INT8
                    elif s.input_dtype(k) == INT16 and (node.name, k) not in refused:
                        refused.add((node.name, k))
                        if not target.int16_input(node.op_type, k):
                            # hb_mapper's own warning (x5_op_facts section 3, S8)
                            notes.append(f"The input{k} of Node(name:{node.name}, type:{node.op_type}) does not "
                                         f"support data type: int16 (on {target.march}; stays int8, as hb_mapper "
                                         "falls back)")
                        elif producer is not None:  # hb_mapper's text for this case is not known
                            notes.append(f"{node.name} ({node.op_type}): int16 input{k} needs an int16 output of "
                                         f"{producer.name} ({producer.op_type}), which {target.march} does not "
                                         "support; stays int8")
                dtypes.append(dtype)
                if grid.get(tensor, (None, None))[1] == dtype:
                    passthrough[(node.name, k)] = grid[tensor]
                    continue
                edges[(node.name, k)] = (tensor, dtype)
            elif producer is not None and p_bpu and not leaves_in_int32(producer.name):
                cpu_reads[(node.name, k)] = (tensor, INT16 if out16[producer.name] else INT8)
        if on_bpu:
            in_dtype[node.name] = INT16 if INT16 in dtypes else INT8
            if target.adjust_int16_conv_output and node.op_type == "Conv":
                _adjust_int16_conv(graph, node, groups, edges, passthrough, out16, emits16, conv_floors)
            data = graph.data_inputs(node)
            if len(data) == 1 and not out16[node.name]:
                k, tensor = data[0]
                source = edges.get((node.name, k)) or passthrough.get((node.name, k))
                if source is not None and node.op_type in target.passive_ops:
                    for out in node.outputs:
                        grid[out] = source
                elif source is not None and node.op_type in target.same_scale_ops:
                    for out in node.outputs:
                        scale_of[out] = scale_of.get(source[0], source[0])
        else:
            in_dtype[node.name] = "float"

    # One quantizer per tensor (measured, notes 1a): a CPU node reads a tensor that a BPU node also reads
    # as that BPU node reads it (the same int8/int16 values), whoever produced it: a model input too.
    quantized_as = {t: d for t, d in edges.values()} if target.post_calibration else {}
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
        if producer is None or placement[producer.name] != "BPU" or leaves_in_int32(producer.name):
            continue
        outputs[out] = INT16 if (out16[producer.name] or model_out16) else INT8

    softmax, internal = _softmax_parts(graph, placement, in_dtype)

    out_dtype = {}
    for node in graph:
        if placement[node.name] != "BPU":
            out_dtype[node.name] = "float"
        elif leaves_in_int32(node.name) and not any(
                placement[c.name] == "BPU" for o in node.outputs for c, _ in graph.consumers.get(o, [])):
            out_dtype[node.name] = "int32"
        else:
            out_dtype[node.name] = INT16 if out16[node.name] else INT8

    weights = [n.name for n in graph if placement[n.name] == "BPU" and n.op_type in target.weight_ops
               and len(n.inputs) > target.weight_ops[n.op_type][0]
               and n.inputs[target.weight_ops[n.op_type][0]] in graph.initializers]

    subgraph = _subgraphs(graph, placement)
    fixed: dict[str, Fixed] = {}
    derived: dict[str, Derived] = {}
    unsigned: frozenset[str] = frozenset()
    if target.post_calibration:
        scale_of = threshold_sources(graph, target, candidate, placement, scale_of)
        _int16_groups(graph, target, edges, passthrough, scale_of, in_dtype)
        rounded = {t for t, _ in list(edges.values()) + list(cpu_reads.values())} | set(outputs)
        fixed, derived = fixed_thresholds(graph, target, placement, edges, passthrough, scale_of, rounded)
        unsigned = unsigned_tensors(graph, target, placement, list(groups_list), edges, passthrough, scale_of)
    return Plan(placement=placement, edges=edges, outputs=outputs, cpu_reads=cpu_reads, weights=weights,
                subgraph=subgraph, in_dtype=in_dtype, out_dtype=out_dtype, passthrough=passthrough,
                scale_of=scale_of, notes=notes, conv_floors=conv_floors, softmax=softmax, internal=internal,
                fixed=fixed, derived=derived, unsigned=unsigned, pre_round=pre_round)


def _int16_groups(graph: Graph, target: Target, edges: dict[tuple[str, int], tuple[str, str]],
                  passthrough: dict[tuple[str, int], tuple[str, str]], scale_of: dict[str, str],
                  in_dtype: dict[str, str]) -> None:
    """One quantizer per threshold group: when a tensor of a group (hb's shared thresholds, or one tensor
    read by several nodes) is quantized in int16 anywhere, every BPU reader that may take int16 reads it
    in int16 (measured: int16 on one of the example's input Slices makes the input and every Slice output
    int16 at the input's threshold, and the Slices' consumers read int16: B_s1_16, the example's best.yaml)."""
    wide = {scale_of.get(t, t) for t, d in list(edges.values()) + list(passthrough.values()) if d == INT16}
    if not wide:
        return
    for (name, k), (tensor, dtype) in list(edges.items()):
        node = graph.by_name.get(name)
        if dtype == INT8 and node is not None and scale_of.get(tensor, tensor) in wide \
                and target.int16_input(node.op_type, k):
            edges[(name, k)] = (tensor, INT16)
            in_dtype[name] = INT16


#: LUT ops that are arithmetic with a constant rather than a table of a function: not covered by
#: _lut_reads_int16 (an int16 Sub by a constant at a model output has not been measured).
ARITHMETIC_LUTS = frozenset({"Add", "Sub", "Mul", "Div", "Clip", "Relu", "LeakyRelu", "Pow"})


def _lut_reads_int16(graph: Graph, target: Target, node: Node, out16: dict[str, bool]) -> bool:
    """A function table (Sigmoid, Abs, ...) whose output is int16 reads its input in int16 too (its
    int16 table, HzLut2Layer): measured for a Sigmoid at a model output (PP-OCR's detector, a toy
    Conv -> Sigmoid: input int16 at 11.0903) and for Abs (notes on hmct's placement rules,
    A2_cpu_mulout); the other function tables inferred alike."""
    return out16.get(node.name, False) and node.op_type in target.lut_ops \
        and node.op_type not in ARITHMETIC_LUTS and len(graph.data_inputs(node)) == 1


def _bias_split(graph: Graph, node: Node) -> bool:
    """A ConvTranspose with a bias, which emits int8 only: hb_mapper keeps its bias as an Add of its own
    when the reader wants int16 (PP-OCR's detector: ``HzSQuantizedConvTranspose`` int8 at its output
    threshold 140.33, then ``HzSElementwiseAdd`` ``output_bit 16`` feeding the int16 Sigmoid). The int16
    reader is granted, and the tensor is rounded to int8 on its own threshold first (``Plan.pre_round``)."""
    return node.op_type == "ConvTranspose" and len(node.inputs) > 2 and bool(node.inputs[2])


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


def _adjust_int16_conv(graph: Graph, node: Node, groups: dict[str, list[Node]], edges: dict[tuple[str, int], tuple[str, str]],
                       passthrough: dict[tuple[str, int], tuple[str, str]], out16: dict[str, bool],
                       emits16: Callable[[Node], bool], floors: dict[str, tuple[str, str]]) -> None:
    """hb_mapper's ``AdjustConvQuantParams`` (bayes, bayes-e): a Conv whose input is int16 gets an
    int16 output, whose threshold is raised to at least max(weight threshold) x input threshold.

    Source: horizon_nn 24629886507 (hb_quantizer_facts 3.3). That Python pass calls C++, so the
    exact floor is the note's reading, not read from the arithmetic. The output is the tensor
    after the Conv's fusion group (Conv+Relu, Conv+Add: where its calibration node sits); a Conv
    that may only emit int8 (dilated) keeps an int8 output but still gets the floor. The floor
    itself is applied where the simulated model looks up the tensor's scale (``conv_floors``).
    """
    source = edges.get((node.name, 0)) or passthrough.get((node.name, 0))
    if source is None or source[1] != INT16:
        return
    group = groups.get(node.name)
    tail = group[-1] if group and group[0].name == node.name else node
    if emits16(tail):
        out16[tail.name] = True
    if len(node.inputs) > 1 and node.inputs[1] in graph.initializers:
        for out in tail.outputs:
            floors[out] = (source[0], node.inputs[1])


def _subgraphs(graph: Graph, placement: dict[str, str]) -> dict[str, int]:
    """BPU subgraph ids, as hb_mapper splits them.

    A subgraph runs atomically, so no path may leave it through a CPU node and come back.
    ``stage`` counts device switches along the longest path to a node; BPU nodes joined by a
    BPU->BPU edge at the same stage share a subgraph (which makes every subgraph convex).
    """
    stage: dict[str, int] = {}
    for node in graph:
        s = 0
        for tensor in node.inputs:
            p = graph.producer.get(tensor)
            if p is not None:
                s = max(s, stage[p.name] + (placement[p.name] != placement[node.name]))
        stage[node.name] = s
    parent = {n.name: n.name for n in graph if placement[n.name] == "BPU"}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for node in graph:
        if node.name not in parent:
            continue
        for tensor in node.inputs:
            p = graph.producer.get(tensor)
            if p is not None and p.name in parent and stage[p.name] == stage[node.name]:
                parent[find(node.name)] = find(p.name)
    ids: dict[str, int] = {}
    return {n.name: ids.setdefault(find(n.name), len(ids)) for n in graph if n.name in parent}
