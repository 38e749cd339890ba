"""hb_mapper's dtype rules over fusion groups: which groups stay fused, what each BPU node may emit, and
how an int16 request spreads over a threshold group (:class:`_Rules`, each rule a method with its
measurements). :func:`resolve_groups` runs them to a fixed point for one candidate's placement.
"""

from __future__ import annotations

import numpy as np

from tuner.candidate import Candidate
from tuner.graph import Graph, Node, Target, fusion_groups
from tuner.simulate.sharing import SPLIT_OPS, THROUGH_SAME_SCALE

INT8, INT16 = "int8", "int16"
ACTIVATIONS = {"Relu", "Clip", "LeakyRelu", "PRelu"}


def resolve_groups(graph: Graph, target: Target, candidate: Candidate, placement: dict[str, str],
                   all_int16: bool) -> tuple[_Rules, set[str], list[list[Node]]]:
    """(the rules, the int16 groups' roots, the fusion groups in effect): the fusion groups less the
    Conv+Add(+Relu) groups an int16 residual input unfuses (which changes the int16 groups in turn: two
    rounds at most in practice), and the Conv+Clip groups an int16 entry on the Clip unfuses."""
    all_groups = fusion_groups(graph, target)
    unfused = {i for i, g in enumerate(all_groups) if clip_entries_unfuse(g, candidate)}
    while True:
        rules = _Rules(graph, target, candidate, placement, [g for i, g in enumerate(all_groups) if i not in unfused],
                       all_int16, all_groups)
        wide = rules.spread()
        newly = {i for i, g in enumerate(all_groups) if i not in unfused and rules.unfuses(g, wide)}
        if not newly:
            break
        unfused |= newly
    return rules, wide, [g for i, g in enumerate(all_groups) if i not in unfused]


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
#: alone is unfused by such an entry instead (:func:`clip_entries_unfuse`).
GROUP_OUTPUT_ACTS = frozenset({"Relu", "Clip", "Add"})


def shared_input_slice(graph: Graph, node: Node, placement: dict[str, str]) -> bool:
    """A Slice of a model input that another BPU node reads too: hb keeps it on the BPU, in the input's int8,
    whatever reads it (tuner.simulate.int16's high precision does not apply: the example with
    ``/stem/conv/Conv`` on the CPU keeps ``/Slice`` int8 on the BPU, its outputs' real cosine 0.643 / 0.900
    as all-BPU int8)."""
    if node.op_type != "Slice" or not node.inputs or node.inputs[0] not in graph.input_names:
        return False
    return any(c.name != node.name and placement.get(c.name) == "BPU" for c, _ in graph.consumers.get(node.inputs[0], []))


def clip_entries_unfuse(group: list[Node], candidate: Candidate) -> bool:
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
        if not self.target.int16_output(node.op_type, node.proto) or shared_input_slice(self.graph, node, self.placement):
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
