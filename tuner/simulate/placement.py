"""Where each node runs: the placement a candidate asks for, then hb_mapper's own moves.

``node_info``'s ``ON`` forces a node (an op the march's BPU cannot run stays on the CPU, with hb's
warning), else the march's defaults decide (Softmax on the BPU only when asked by an optimization
option, or under set_all_nodes_int16 over the last axis). hb_mapper then moves nodes itself: a
Relu/Clip fused after a BPU Conv stays with it, a split Where's Cast joins a BPU comparison, and
pulled ops whose readers are all on the CPU follow them (each rule a function below, with its
measurements). A configuration with no BPU node is refused, as hb_mapper refuses it, and so is one that
puts a fused activation on the CPU, whose runtime has no such operator (:func:`cpu_runtime_refusal`).
"""

from __future__ import annotations

from tuner.candidate import Candidate
from tuner.errors import TunerError
from tuner.graph import Graph, Node, Target, fusion_groups
from tuner.simulate.int16 import clip_entries_unfuse, shared_input_slice


def place(graph: Graph, target: Target, candidate: Candidate) -> tuple[dict[str, str], list[str]]:
    """node -> "BPU" or "CPU" under ``candidate`` (its node_info already in hb's graph's names), and the
    notes of every request hb_mapper does not follow."""
    placement, notes = requested_placement(graph, target, candidate)
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
    refusal = cpu_runtime_refusal(graph, placement)
    if refusal:
        raise TunerError(refusal)
    return placement, notes


#: Fused activations (tuner.graph.optimize) the CPU runtime has no operator for. hb_mapper runs such a
#: node on the CPU when its ``node_info`` says ``ON: CPU`` (and never moves it back), calibrates and compiles
#: the model, and then refuses it while writing the runtime model: "HorizonRT not support these cpu
#: operators: HzHardSwish" (exit 255; horizon_tc_ui/hbdtort/onnx2horizonrt.py checks each CPU node's type
#: against its table of 144 runtime ops, which has HardSwish and HardSigmoid but no fused Hz kind). Measured
#: with toys Conv -> activation -> Conv at O0 (docs/hb_rules/placement.md section 8): x * hardsigmoid(x),
#: x * clip(x + 3, 0, 6) / 6, x * sigmoid(x), x * tanh(softplus(x)) and the erf GELU each refused with their
#: kind (HzHardSwish, HzSwish, HzMish, HzGelu); PP-OCR's classifier with ``Mul@3: ON: CPU`` too (search
#: quality run). A lowered Mul by a constant (HzChannelScale) is a float Conv on the CPU: accepted.
CPU_RUNTIME_LACKS = frozenset({"HzSwish", "HzHardSwish", "HzMish", "HzGelu"})


def cpu_runtime_refusal(graph: Graph, placement: dict[str, str]) -> str | None:
    """Why hb_mapper refuses ``placement`` at its last step, or None: a fused activation on the CPU."""
    bad = [(n.name, n.op_type) for n in graph if placement.get(n.name) == "CPU" and n.op_type in CPU_RUNTIME_LACKS]
    if not bad:
        return None
    kinds = " ".join(sorted({k for _, k in bad}))
    nodes = ", ".join(f"{name} ({kind})" for name, kind in bad)
    return (f"hb_mapper refuses this configuration: {nodes} on the CPU (\"HorizonRT not support these cpu "
            f"operators: {kinds}\", after calibrating and compiling); a fused activation runs on the BPU only")


def requested_placement(graph: Graph, target: Target, candidate: Candidate) -> tuple[dict[str, str], list[str]]:
    """The placement node_info asks for: ``ON: CPU`` always, ``ON: BPU`` where the march's BPU runs the op
    (else the CPU, with a note), the march's BPU ops otherwise; a Softmax goes to the BPU only under
    set_Softmax_input_int8 / set_Softmax_output_int8, or set_all_nodes_int16 over its last axis."""
    opts = set(candidate.optimization)
    all_int16 = "set_all_nodes_int16" in opts
    softmax_bpu = bool({"set_Softmax_input_int8", "set_Softmax_output_int8"} & opts)
    placement: dict[str, str] = {}
    notes: list[str] = []
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
    return placement, notes


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


def _activations_follow(graph: Graph, target: Target, candidate: Candidate,
                        placement: dict[str, str]) -> list[tuple[str, str]]:
    """A Relu/Clip fused after a CPU Conv goes with it (in place; (node, why) for each moved)."""
    moved: list[tuple[str, str]] = []
    for group in fusion_groups(graph, target):
        head = group[0]
        if placement.get(head.name) != "CPU" or head.op_type not in ("Conv", "ConvTranspose") or len(group) < 2:
            continue
        nxt = group[1]
        # an int16 entry does not keep a Relu (the latency benchmark's pareto_t23 on the example:
        # ``/enc3/enc3.0/act/Relu`` with InputType int16 is on the CPU with its ``ON: CPU`` Conv), but it
        # unfuses a Conv+Clip (int16.clip_entries_unfuse) and that Clip stays on the BPU
        # (tests/toolchain/test_placement_real.py: InputType or OutputType int16 on the Clip; `tuner verify
        # --local` on the example, ``/radar/act/Clip`` InputType int16 after an ``ON: CPU`` ``/radar/conv/Conv``)
        if nxt.op_type in CONV_ACTIVATIONS and placement.get(nxt.name) == "BPU" \
                and candidate.setting(nxt.name).on is None and not clip_entries_unfuse(group, candidate):
            placement[nxt.name] = "CPU"
            moved.append((nxt.name, f"follows its Conv {head.name} to the CPU"))
    return moved


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
    moved = _activations_follow(graph, target, candidate, placement)

    def free(name: str) -> bool:
        return not candidate.setting(name).to_dict()

    tail_of = {g[-1].name: g[0] for g in fusion_groups(graph, target)}
    # the ops that go: the largest set of free pulled BPU ops each of whose readers is on the CPU or in the set,
    # and each of whose inputs is a model input, a CPU node's, a Conv group's (which leaves the BPU as its int32
    # accumulator) or one of the set's
    # a Slice of a model input that other BPU nodes read too stays on the BPU (the input's quantization is
    # shared) and hands its slice over as a model input would (toys x -> two Slices, one -> Mul by a constant ->
    # Concat -> CPU Conv: hb moves the Concat, not the Slice, with or without an int16 entry on the Slice; x ->
    # Slice -> CPU Conv: the Slice goes with one Slice, stays with two; the example's /Concat of /Mul and
    # /Slice_2 before the CPU /radar/conv/Conv; tests/toolchain/test_placement_real.py)
    input_slices = {n.name for n in graph if shared_input_slice(graph, n, placement)}
    going = {n.name for n in graph if placement.get(n.name) == "BPU" and n.op_type in CPU_PULLED_OPS and free(n.name)
             and n.name not in input_slices}

    def readers(node: Node) -> list[Node]:
        return [c for o in node.outputs if o for c, _ in graph.consumers.get(o, [])]

    def pulls(node: Node, seen: frozenset[str] = frozenset()) -> bool:
        """A reader on the CPU pulls: a pulled op that is on the CPU (by an entry of its own, or moved
        before) only when its own readers pull in turn (toy: Conv+Relu -> Resize -> Concat -> Conv with
        ``ON: CPU`` on the Concat alone leaves the Resize on the BPU, with the Conv after it on the CPU too the
        Resize goes; the example's Pareto trials with ``/Concat_3`` and ``/Concat_4`` on the CPU: their
        Resizes stay, tests/toolchain/test_placement_real.py)."""
        if node.name in going:
            return True
        if placement[node.name] != "CPU":
            return False
        if node.op_type not in CPU_PULLED_OPS or node.name in seen:
            return True
        return all(pulls(r, seen | {node.name}) for r in readers(node))

    def stays(node: Node) -> bool:
        rs = readers(node)
        if not rs or not all(pulls(c) for c in rs):
            return True
        for _, t in graph.data_inputs(node):
            p = graph.producer.get(t)
            if p is not None and placement[p.name] == "BPU" and p.name not in going and p.name not in input_slices \
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


def _softmax_over_last_axis(graph: Graph, node: Node) -> bool:
    """A Softmax over its input's last axis, which set_all_nodes_int16 puts on the BPU (six int16 parts); over
    another axis it stays on the CPU ("does not support data type: int16"). Measured with toy Softmaxes under
    set_all_nodes_int16: 2-D axis 1, 3-D axis 2, 4-D axis 3 and -1 on the BPU; 3-D axis 1 and 4-D axis 1 on
    the CPU; PP-OCR's classifier's [1, 2] Softmax on the BPU (on the CPU in int8)."""
    rank = graph.rank(node.inputs[0]) if node.inputs else None
    axis = int(node.attr("axis", 1))     # opset <= 11 (hb's), where the default is 1
    return rank is not None and axis % rank == rank - 1
