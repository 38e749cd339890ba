"""Which tensor's statistics give a quantization point its threshold: hb_mapper's post-calibration.

hmct puts a calibration node on each tensor a compute op reads (looking through pass-through ops),
calibrates every node on its own, then its post-calibration pass (compiled code,
``create_post_calibrated_model``, called from ``hmct/quantizer/calibrater/activation/post_calibration.py``)
makes groups of tensors that must share one grid use one threshold. Measured with the real
toolchain (hb_mapper 1.24.3, hmct 1.1.0) on controlled models, from the calibrated models'
``HzCalibration`` thresholds (notes on hmct's placement rules, sections 2a-2d), and on the example:

* **Pass-through groups.** A pass-through op on the BPU (Slice, Split, Gather, Reshape, Transpose,
  MaxPool, Resize, ...; hmct's ``can_be_skipped`` list in ``hmct/common/misc/find_calibration_node.py``,
  plus Resize, observed) joins its input and its outputs into one group. A splitting op (Slice,
  Split, Gather) on the CPU joins too while the tensor it reads has a BPU reader.
* **A standalone Clip** (on the BPU, not fused into a Conv before it) joins its input's group too: hb runs
  it as a table whose output keeps the input's threshold (toys X4, X6, Y3, Y4, W5: a Clip(0, 6) after an
  Add or an unfused Conv prints its input's 12.2, 19.3, 18.6, 9.72 on both sides, int8 and int16 alike;
  the example's pareto_t22, whose int16 entry on ``/radar/act/Clip`` unfuses it: 33.839, not 6).
* **Concat.** A Concat input that only the Concat reads joins the Concat's output (its producer
  quantizes straight at the Concat's scale); an input another op reads keeps its own threshold and
  is requantized to the Concat's (``HzRequantize``), which the consumer's rounding of the Concat output
  models; so is one whose group reaches the input of a Relu that is not fused into its producer (a
  table on the BPU, whose input keeps its own calibration; the example under set_all_nodes_int16). A
  Concat with a node_info entry of its own joins none of its inputs: each keeps its threshold and is
  requantized to the Concat's (the example's latency configurations: with int16 in and out on ``/Concat_4``
  its Resize input keeps 4.647 against the Concat's 11.484, with int16 on ``/stem/conv/Conv`` and
  ``/fuse/conv/Conv`` instead it takes 11.484; ``/Concat_1`` with an entry: ``/Mul_1`` 5.570, the Concat
  6.0; without: both 6.0).
* **The group's threshold.** The group's root (the tensor no member produces) when it has a
  calibration node of its own: a compute op on the BPU reads it directly, or one of its pass-through
  readers carries a ``node_info`` entry other than ``ON: CPU`` (an ``InputType``, ``OutputType`` or
  ``ON: BPU`` each put one there). Otherwise the **first** calibrated member in graph order: the
  tensor a compute op reads, whose producer comes first. On the bundled example the 5-channel input
  is read by three Slices, the first taking RGB (0..1): the radar range (0..80 m) is quantized with
  threshold 1.0 under ``max``, and per_channel, set_all_nodes_int16 (the group becomes int16 with
  the same threshold) and ``ON: CPU`` on one Slice change nothing (all measured). The depth head's
  Conv output, read through a Resize and two Slices by two Sigmoids, takes the first Sigmoid input's
  threshold (5.49897 there). A MaxPool calibrates its input like a compute op (:data:`CALIBRATED_INPUT`),
  so a group rooted at a MaxPool's input takes the root's threshold.

:func:`threshold_sources` returns tensor -> the tensor whose statistics it is quantized with, resolved
to the end of each chain, merged into :attr:`tuner.simulate.plan.Plan.scale_of`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from tuner.candidate import Candidate
from tuner.graph import Graph, Node, Target

#: Readers that split a tensor into parts sharing its grid; they join a group on the CPU too.
SPLIT_OPS = frozenset({"Slice", "Split", "Gather"})
#: Same-scale ops that join a group like the passive ones (Resize observed; AveragePool computes).
THROUGH_SAME_SCALE = frozenset({"Resize", "Upsample"})
#: Pass-through ops in front of which hmct puts a calibration node: their input is calibrated like a compute
#: op's, so it is its group's root threshold. Measured (kl, toy Conv -> MaxPool -> Conv: the input's 23.69 on
#: both calibration nodes, the output's own kl is 19.37; Conv -> MaxPool -> GlobalAveragePool: a node on the
#: input only; PP-OCR's classifier: HardSwish -> MaxPool -> GlobalAveragePool takes the HardSwish output's
#: 0.9608 under kl and 2.904 under max_percentile 0.99995, not the MaxPool output's 3.626 and 3.413).
CALIBRATED_INPUT = frozenset({"MaxPool"})


class _Groups:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


def shared_groups(graph: Graph, target: Target, candidate: Candidate, placement: Mapping[str, str],
                  fused: Collection[tuple[str, str]] = ()) -> dict[str, str]:
    """tensor -> the group member whose threshold it takes (only tensors of groups of two or more).

    ``fused``: (producer, reader) edges inside fusion groups. A Relu that is not fused into its producer
    is a table on the BPU (hb's ``HzLut`` / ``HzLut2Layer`` rows): it joins its input's group but its input
    keeps a calibration of its own, which the group then takes (measured: the example under
    set_all_nodes_int16, whose int16 residual unfuses ``/enc4/enc4.1`` Conv+Add+Relu, gives the Relu, the
    Resize after it and ``/Concat_2`` the Add output's threshold 6.49927, not the Concat's 10.94)."""
    entries = {name for name, s in candidate.nodes if s.on != "CPU" and s.to_dict()}
    fused_pairs = set(fused)
    tables = _table_nodes(graph, placement, fused_pairs)
    groups, joined = _join(graph, target, placement, fused_pairs, entries, tables)
    # outputs of the joining nodes: a member they write is derived from the group, not its root
    derived = {o for name, _ in joined for o in graph.by_name[name].outputs}
    members: dict[str, list[str]] = {}
    for t in list(groups.parent):
        members.setdefault(groups.find(t), []).append(t)
    order = {n.name: i for i, n in enumerate(graph)}
    out: dict[str, str] = {}
    for group in members.values():
        if len(group) < 2:
            continue
        source = _group_source(graph, placement, group, derived, joined, tables, entries, fused_pairs, order)
        if source is None:
            continue
        for t in group:
            if t != source:
                out[t] = source
    return out


def _standalone_clip(graph: Graph, placement: Mapping[str, str], fused_pairs: set[tuple[str, str]],
                     node: Node) -> bool:
    """A BPU Clip not fused into its producer: a table of its own, like an unfused Relu."""
    p = graph.producer.get(node.inputs[0]) if node.inputs else None
    return node.op_type == "Clip" and placement[node.name] == "BPU" and not (
        p is not None and (p.name, node.name) in fused_pairs)


def _table_nodes(graph: Graph, placement: Mapping[str, str], fused_pairs: set[tuple[str, str]]) -> set[str]:
    """The BPU Relus not fused into their producer (hb's ``HzLut`` / ``HzLut2Layer`` rows) and the
    standalone Clips: their input is calibrated, and their group takes that threshold."""
    tables = set()
    for n in graph:
        p = graph.producer.get(n.inputs[0]) if n.op_type == "Relu" and n.inputs else None
        if p is not None and placement[n.name] == "BPU" and (p.name, n.name) not in fused_pairs:
            tables.add(n.name)
    # a standalone Clip is such a table too: its input is calibrated, and the group takes that threshold
    tables |= {n.name for n in graph if _standalone_clip(graph, placement, fused_pairs, n)}
    return tables


def _join(graph: Graph, target: Target, placement: Mapping[str, str], fused_pairs: set[tuple[str, str]],
          entries: set[str], tables: set[str]) -> tuple[_Groups, set[tuple[str, str]]]:
    """The groups of tensors that share one threshold: a pass-through op's input and outputs (on the
    BPU, or a split op a BPU node reads), a BPU Concat without a node_info entry and its inputs that only
    it reads (not one calibrated for a table Relu). Also the (reader, tensor) edges that are group links,
    not reads."""
    through = set(target.passive_ops) | THROUGH_SAME_SCALE
    groups = _Groups()
    joined: set[tuple[str, str]] = set()

    def has_bpu_reader(t: str) -> bool:
        return any(placement[c.name] == "BPU" for c, _ in graph.consumers.get(t, []))

    def own_root(t: str) -> bool:
        """``t`` reaches (through pass-through ops) a tensor a table Relu reads, which keeps its threshold: a
        Concat input so calibrated is requantized to the Concat's scale, not joined (the example under
        set_all_nodes_int16: ``/up/Resize_output_0`` 6.49927, ``/up/Resize_output_0_calibrated_Requantize``,
        ``/Concat_2`` output 10.9431)."""
        root = groups.find(t)
        return any(groups.find(m) == root and any(c.name in tables for c, _ in graph.consumers.get(m, []))
                   for m in list(groups.parent))

    for node in graph:
        data = graph.data_inputs(node)
        if (node.op_type in through or _standalone_clip(graph, placement, fused_pairs, node)) and data and node.outputs:
            t = data[0][1]
            if placement[node.name] == "BPU" or (node.op_type in SPLIT_OPS and has_bpu_reader(t)):
                for o in node.outputs:
                    groups.union(t, o)
                joined.add((node.name, t))
        elif node.op_type == "Concat" and placement[node.name] == "BPU" and node.outputs and node.name not in entries:
            for _, t in data:
                if len(graph.consumers.get(t, [])) == 1 and not own_root(t):
                    groups.union(node.outputs[0], t)
                    joined.add((node.name, t))
    return groups, joined


def _group_source(graph: Graph, placement: Mapping[str, str], group: list[str], derived: set[str],
                  joined: set[tuple[str, str]], tables: set[str], entries: set[str],
                  fused_pairs: set[tuple[str, str]], order: Mapping[str, int]) -> str | None:
    """The member whose threshold the group takes: its first root (a member no joining node writes)
    that is calibrated or read by a pass-through node with a node_info entry, else its calibrated
    member written first; None when no member is calibrated."""

    def calibrated(t: str) -> bool:
        for c, _ in graph.consumers.get(t, []):
            if placement[c.name] == "BPU" and ((c.name, t) not in joined or c.name in tables
                                               or c.op_type in CALIBRATED_INPUT):
                return True
        return False

    def entry_reader(t: str) -> bool:
        """A pass-through reader of ``t`` with a node_info entry; not an activation fused into the Conv
        that writes ``t`` (no calibration node there: toys V1, V3, U7, U9, an int16 entry on such a Relu
        leaves the Relu output's threshold as it was, 9.594 and 16.2 in V1 and V3 as in V0)."""
        p = graph.producer.get(t)
        return any(c.name in entries for c, _ in graph.consumers.get(t, [])
                   if (c.name, t) in joined and not (p is not None and (p.name, c.name) in fused_pairs))

    for root in (t for t in group if t not in derived):
        if calibrated(root) or entry_reader(root):
            return root
    cands = [t for t in group if calibrated(t)]
    if not cands:
        return None
    return min(cands, key=lambda t: (order[p.name] if (p := graph.producer.get(t)) is not None else -1, t))


def threshold_sources(graph: Graph, target: Target, candidate: Candidate, placement: Mapping[str, str],
                      scale_of: Mapping[str, str], fused: Collection[tuple[str, str]] = ()) -> dict[str, str]:
    """``scale_of`` (a plan's same-scale links) with hb's threshold sharing, every entry resolved to
    the tensor at the end of its chain. The groups win over the same-scale links they cover."""
    links = dict(scale_of)
    shared = shared_groups(graph, target, candidate, placement, fused)
    links.update(shared)
    for source in set(shared.values()):     # a group's source is its own threshold, even behind a Resize
        if shared.get(links.get(source, "")) == source:
            del links[source]

    def resolve(t: str) -> str:
        seen = {t}
        while t in links and links[t] not in seen:
            t = links[t]
            seen.add(t)
        return t

    return {t: r for t in links if (r := resolve(t)) != t}
