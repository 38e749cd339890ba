"""Modeled latency of a plan on the target: hbdk's BPU estimate, the CPU nodes, and the switches.

**BPU** (``bpu_ms``): what hbdk, the X5 compiler, estimates for the compiled ``.bin`` at
``optimize_level: O3`` (what a board runs), scaled to the board. It is a sum over the plan's BPU
subgraphs of

* one term per layer (a fusion group, :mod:`tuner.cost.bpu`): a fixed cost plus the largest of a MAC
  term, an input term and an output term, per op kind and per precision of the layer's input (int8,
  int16), plus the extra write of an int16 output;
* hbdk's Requantize layers: where an int16 tensor meets an op that refuses int16, where one tensor is
  read in two precisions, after an int16-input Conv;
* the DDR traffic of the model's inputs and outputs and of the tensors cut between a subgraph and the
  rest, a cost per cut tensor (hbdk's layers next to a cut slow down), the layout conversions of a
  tensor handed from one BPU subgraph to another (per pixel, on both sides: PP-OCRv4's and the example's
  writers and readers of such tensors grow ~6 us per thousand pixels, a 1-channel 96x160 one ~95 us), a
  fixed cost per subgraph, and a constant per model.

The prices are fitted to hbdk's per-layer tables and totals (``benchmarks/latency_fidelity.py``,
:mod:`tuner.cost.fit`) and shipped in ``search_spaces/targets/<march>.yaml`` (``cost.bpu``);
``tuner latency fit`` refines this model's constant and scales of the int16 and I/O terms from three
real compiles, kept by model fingerprint (:class:`ModelFit`); the prices and fits are values of
:mod:`tuner.cost.coefficients`. The int16 spread and the subgraphs are the
plan's (hb_mapper's rules in :mod:`tuner.simulate.plan`): an int16 request that climbs to a producer
costs there too. Agreement with hbdk: ``results/benchmarks/latency_fidelity.md``.

**CPU** (``cpu_ms``) and **switches** (``switch_ms``) are not in hbdk's estimate and are modeled as
before this fit: CPU nodes run in float on one Cortex-A55 core (a roofline of MACs and bytes plus a
per-op overhead), every tensor crossing between CPU and BPU is (de)quantized and copied, every BPU
subgraph costs a launch. A measured per-node profile (``{node: {bpu_ms, cpu_ms}}``) replaces the
estimate where present. A board measurement (``tuner latency board``) rescales hbdk's estimate to
that board and firmware and prices the outputs' transfer and the fixed cost per run (:class:`BoardFit`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.cost.bpu import (
    MAC_KINDS,
    Layer,
    aligned_elements,
    bpu_macs,
    elements,
    layers,
    node_macs,
    op_kind,
)
from tuner.cost.coefficients import (  # noqa: F401  (re-exported: their old home)
    GLOBAL_TERMS,
    PRECISIONS,
    SCALES,
    BoardFit,
    BpuCoefficients,
    ModelFit,
    fit_path,
    fits_dir,
    load_fit,
    load_profile,
    scale_of,
)
from tuner.errors import TunerError
from tuner.graph import Graph, Target
from tuner.simulate.plan import Plan

__all__ = ["COEFFICIENTS", "BoardFit", "BpuCoefficients", "CostModel", "LatencyBreakdown", "ModelFit", "load_profile",
           "node_macs"]

#: The CPU side's coefficients (seconds, MACs, bytes, elements), unchanged by the hbdk fit.
COEFFICIENTS = ("cpu_macs_per_s", "cpu_bytes_per_s", "cpu_op_overhead_s", "switch_elements_per_s",
                "switch_overhead_s", "subgraph_overhead_s")
_BYTES = {"int8": 1, "uint8": 1, "int16": 2, "int32": 4, "float": 4}


@dataclass
class LatencyBreakdown:
    bpu_ms: float
    cpu_ms: float
    switch_ms: float
    subgraphs: int
    boundary_tensors: int
    compiler_ms: float = 0.0              # the modeled hbdk O3 estimate (what `hb_mapper` prints), BPU only
    subgraph_ms: tuple[float, ...] = ()   # the same per BPU subgraph
    int16_layers: int = 0
    fitted: str = ""                      # how the BPU coefficients were refined for this model ("": shipped)

    @property
    def total_ms(self) -> float:
        return self.bpu_ms + self.cpu_ms + self.switch_ms

    def as_dict(self) -> dict[str, Any]:
        return {"total_ms": self.total_ms, "bpu_ms": self.bpu_ms, "cpu_ms": self.cpu_ms,
                "switch_ms": self.switch_ms, "subgraphs": self.subgraphs, "boundary_tensors": self.boundary_tensors,
                "compiler_ms": self.compiler_ms, "subgraph_ms": list(self.subgraph_ms),
                "int16_layers": self.int16_layers, "fitted": self.fitted}


@dataclass(frozen=True)
class Precision:
    """What runs where in which precision, for the BPU estimate: the plan's, or (fitting) the real tool's."""

    placement: Mapping[str, str]
    subgraph: Mapping[str, int]
    in16: frozenset[str]                 # BPU nodes with an int16 activation input
    out16: frozenset[str]                # BPU nodes with an int16 output
    reads: Mapping[str, frozenset[str]] = field(default_factory=dict)   # tensor -> the dtypes BPU nodes read it in
    out_dtype: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of_plan(cls, plan: Plan) -> Precision:
        in16 = {n for n, d in plan.in_dtype.items() if d == "int16"}
        reads: dict[str, set[str]] = {}
        for (node, _), (tensor, dtype) in list(plan.edges.items()) + list(plan.passthrough.items()):
            if dtype == "int16":
                in16.add(node)
            reads.setdefault(tensor, set()).add(dtype)
        out16 = {n for n, d in plan.out_dtype.items() if d == "int16"}
        return cls(placement=plan.placement, subgraph=plan.subgraph, in16=frozenset(in16), out16=frozenset(out16),
                   reads={t: frozenset(d) for t, d in reads.items()}, out_dtype=plan.out_dtype)


@dataclass(frozen=True)
class LayerUse:
    """One BPU layer of one plan (:meth:`CostModel.layer_terms`)."""

    head: str            # the layer's name in hbdk's table (a fused Conv's row is ``<head>-conv``)
    subgraph: int
    kind: str
    prec: str            # the precision of its input: int8 or int16
    macs: int
    in_elements: int
    elements: int        # its output, as laid out on the BPU
    out16: bool


class CostModel:
    """Latency of plans of one graph on one target. Per-node work is computed once per graph.

    ``fit``: this model's refinement (:class:`ModelFit`, from ``tuner latency fit``); ``board``: a
    board's measured relation to hbdk's estimate (default: the target's ``cost.board``)."""

    def __init__(self, graph: Graph, target: Target, profile: dict[str, dict[str, float]] | None = None,
                 fit: ModelFit | None = None, board: BoardFit | None = None):
        raw = target.raw.get("cost") or {}
        missing = [k for k in COEFFICIENTS if k not in raw]
        if missing:
            raise TunerError(f"target {target.march}: cost coefficients missing: {', '.join(missing)}")
        self.c = {k: float(raw[k]) for k in COEFFICIENTS}
        self.graph = graph
        self.target = target
        self.profile = profile or {}
        self.shipped = BpuCoefficients.from_target(target)
        self.fit = fit
        self.bpu = self.shipped.scaled(fit.scales) if fit is not None else self.shipped
        self.board = board or BoardFit.from_dict(raw.get("board") or {})
        self.layers: dict[str, Layer] = layers(graph, target)
        self.macs = {n.name: node_macs(graph, n) for n in graph}
        self.elements = {n.name: sum(elements(graph.shapes.get(t)) for t in list(n.inputs) + list(n.outputs)
                                     if t and t not in graph.initializers) for n in graph}
        self._aligned = {t: aligned_elements(s) for t, s in graph.shapes.items()}

    # ------------------------------------------------------------------ BPU (hbdk's estimate)
    def layer_terms(self, p: Precision) -> list[LayerUse]:
        """Every BPU layer of the plan: its name in hbdk's table, subgraph, kind, input precision, work."""
        g = self.graph
        out = []
        seen: set[str] = set()
        for node in g:
            if p.placement.get(node.name) != "BPU":
                continue
            lay = self.layers[node.name]
            # a fused member on the BPU with its head on the CPU is a layer of its own
            whole = p.placement.get(lay.head) == "BPU"
            head = lay.head if whole else node.name
            if head in seen:
                continue
            seen.add(head)
            if whole:
                last = [m for m in lay.members if p.placement.get(m) == "BPU"][-1]
                kind, macs, ins, elems = lay.kind, lay.macs, lay.in_elements, lay.elements
            else:
                last = node.name
                kind = op_kind(g, node)
                macs = bpu_macs(g, node) if kind in MAC_KINDS else 0
                ins = sum(self._aligned.get(t, 0) for t in node.inputs if g.is_activation(t))
                elems = self._aligned.get(node.outputs[0], 0) if node.outputs else 0
            out.append(LayerUse(head, p.subgraph.get(node.name, 0), kind, "int16" if head in p.in16 else "int8",
                                macs, ins, elems, last in p.out16))
        return out

    def features(self, p: Precision, coefficients: BpuCoefficients | None = None) -> list[dict[str, float]]:
        """Per BPU subgraph (in the order of their ids): the layers' microseconds by input precision
        (``int8``, ``int16``, priced with ``coefficients``) and the subgraph-level amounts (:data:`GLOBAL_TERMS`)."""
        return price_features(self.layer_terms(p), self.extras(p), coefficients or self.bpu)

    def extras(self, p: Precision) -> dict[int, dict[str, float]]:
        """Per BPU subgraph id: the amounts of the subgraph-level terms (requantized tensors, I/O, the
        subgraph itself); the int16 writes are per layer (:meth:`layer_terms`)."""
        g = self.graph
        subs: dict[int, dict[str, float]] = {sub: {} for sub in {p.subgraph.get(n, 0) for n, w in p.placement.items()
                                                                  if w == "BPU"}}

        def add(sub: int, term: str, x: float) -> None:
            f = subs.setdefault(sub, {})
            f[term] = f.get(term, 0.0) + x

        # hbdk's Requantize layers: an int16 tensor read by a BPU op that refuses int16 there (Resize,
        # ConvTranspose, GlobalAveragePool: placement.md 3b), or written by an op that cannot emit int16;
        # and a tensor the plan reads in two precisions. PP-OCRv4 under set_all_nodes_int16: 61 rows,
        # 373 us; its int8 compile: none.
        t = self.target
        for tensor, dtypes in p.reads.items():
            producer = g.producer.get(tensor)
            bpu = producer if producer is not None and p.placement.get(producer.name) == "BPU" else None
            have = set(dtypes)
            if bpu is not None:
                d = p.out_dtype.get(bpu.name)
                if d in ("int8", "int16"):
                    have.add(d)
            wide = "int16" in have
            accumulates = bpu is not None and self.layers[bpu.name].kind in MAC_KINDS   # rescales in the layer
            refused = wide and (
                (bpu is not None and not accumulates and not t.int16_output(bpu.op_type, bpu.proto)
                 and bpu.name not in p.out16)
                or any(p.placement.get(c.name) == "BPU" and not t.int16_input(c.op_type, k)
                       for c, k in g.consumers.get(tensor, [])))
            if refused or (len(have & {"int8", "int16"}) > 1 and not (accumulates and len(dtypes) == 1)):
                sub = p.subgraph.get(producer.name, 0) if producer is not None else min(subs or {0: {}})
                add(sub, "requant_kelem", self._aligned.get(tensor, 0) / 1e3)
        # an int16-input Conv's output gets a rescale of its own (AdjustConvQuantParams' extra int16
        # calibration: placement.md 3c): PP-OCRv4 under set_all_nodes_int16 has one variable_N_Requantize
        # row after most of its Convs
        for u in self.layer_terms(p):
            if u.prec == "int16" and u.kind in ("conv", "dwconv", "scale"):
                add(u.subgraph, "requant_kelem", u.elements / 1e3)
        # DDR traffic in and out of every subgraph
        for (sub, term), kbytes in self._io_kbytes(p).items():
            add(sub, term, kbytes)
        # tensors cut between the BPU and a CPU node or between two BPU subgraphs, once per tensor and
        # subgraph that writes or reads it (model inputs and outputs are not cuts): PP-OCRv4's backbone
        # cut from its neck hands the neck its three skip features through DDR as well
        cut: set[tuple[str, int]] = set()
        relayout: set[tuple[str, int, str]] = set()
        for node in g:
            here = p.placement.get(node.name)
            for t in node.inputs:
                producer = g.producer.get(t)
                if producer is None or not g.is_activation(t):
                    continue
                there = p.placement.get(producer.name)
                sides = []
                if here != there:
                    sides = [p.subgraph.get((producer if there == "BPU" else node).name, 0)]
                elif here == "BPU" and p.subgraph.get(producer.name) != p.subgraph.get(node.name):
                    sides = [p.subgraph.get(producer.name, 0), p.subgraph.get(node.name, 0)]
                for sub in sides:
                    if (t, sub) not in cut:
                        cut.add((t, sub))
                        add(sub, "cut_tensor", 1.0)
                if here == "BPU" and there == "BPU" and len(sides) == 2:
                    # a tensor handed from one BPU subgraph to another is converted out of the BPU's layout
                    # where it is written and into it where it is read, per pixel whatever its channels;
                    # a 1-channel tensor is read as it is (docs/hb_rules/latency.md, 10)
                    pix, channels = self._pixels(t)
                    for sub, side in ((sides[0], "out"), (sides[1], "in")):
                        if (side == "out" or channels > 1) and (t, sub, side) not in relayout:
                            relayout.add((t, sub, side))
                            add(sub, "relayout_kpix", pix / 1e3)
        for sub in subs:
            add(sub, "subgraph", 1.0)
        if subs:
            add(min(subs), "model", 1.0)
        return subs

    def cut_layers(self, p: Precision) -> set[str]:
        """The BPU layers (by head) that read or write a tensor cut between their subgraph and a CPU node or
        another subgraph: hbdk's rows for them carry the transfer and the layout conversion, which the
        subgraph-level terms price (the per-layer fit leaves them out)."""
        g = self.graph
        out: set[str] = set()
        for node in g:
            if p.placement.get(node.name) != "BPU":
                continue
            sub = p.subgraph.get(node.name, 0)
            head = self.layers[node.name].head
            head = head if p.placement.get(head) == "BPU" else node.name   # as layer_terms names it
            for t in node.inputs:
                producer = g.producer.get(t)
                if producer is not None and g.is_activation(t) and (
                        p.placement.get(producer.name) != "BPU" or p.subgraph.get(producer.name, 0) != sub):
                    out.add(head)
            for t in node.outputs:
                if any(p.placement.get(c.name) != "BPU" or p.subgraph.get(c.name, 0) != sub
                       for c, _ in g.consumers.get(t, [])):
                    out.add(head)
        return out

    def _pixels(self, tensor: str) -> tuple[int, int]:
        """(pixels, channels) of an activation: N x H x W of an NCHW tensor (its elements over its channels)."""
        shape = self.graph.shapes.get(tensor)
        if not shape or any(d is None for d in shape):
            return 0, 0
        dims = [int(d) for d in shape if d is not None]
        if len(dims) < 3:
            return dims[0], dims[-1]
        return elements(dims) // max(dims[1], 1), dims[1]

    def _io_kbytes(self, p: Precision) -> dict[tuple[int, str], float]:
        """Kilobytes each subgraph loads and stores at its edges, as (subgraph, term): the model's own inputs
        and outputs (``io_kbyte``), and tensors to and from CPU nodes or other subgraphs (``cut_kbyte``)."""
        g = self.graph
        out: dict[tuple[int, str], float] = {}
        counted: set[tuple[str, int]] = set()
        for node in g:
            if p.placement.get(node.name) != "BPU":
                continue
            sub = p.subgraph.get(node.name, 0)
            for t in node.inputs:
                if not g.is_activation(t) or (t, sub) in counted:
                    continue
                producer = g.producer.get(t)
                if producer is None or p.placement.get(producer.name) != "BPU" or p.subgraph.get(producer.name) != sub:
                    counted.add((t, sub))
                    d = "int16" if node.name in p.in16 else "int8"
                    key = (sub, "io_kbyte" if producer is None else "cut_kbyte")
                    out[key] = out.get(key, 0.0) + elements(g.shapes.get(t)) * _BYTES[d] / 1e3
            for t in node.outputs:
                readers = g.consumers.get(t, [])
                cut = any(p.placement.get(c.name) != "BPU" or p.subgraph.get(c.name) != sub for c, _ in readers)
                if (t in g.output_names or cut) and (t, -1 - sub) not in counted:
                    counted.add((t, -1 - sub))
                    d = p.out_dtype.get(node.name, "int8")
                    key = (sub, "io_kbyte" if t in g.output_names else "cut_kbyte")
                    out[key] = out.get(key, 0.0) + elements(g.shapes.get(t)) * _BYTES.get(d, 1) / 1e3
        return out

    def compiler_us(self, p: Precision, coefficients: BpuCoefficients | None = None) -> list[float]:
        """The modeled hbdk estimate per BPU subgraph, in microseconds."""
        c = coefficients or self.bpu
        return [c.us(f) for f in self.features(p, c)]

    # ------------------------------------------------------------------ the whole
    def bpu_seconds(self, name: str, int16: bool) -> float:
        """A profiled node's BPU time (``profile``), int16 at the shipped int16/int8 ratio of its kind."""
        ms = self.profile[name]["bpu_ms"]
        if not int16:
            return ms / 1e3
        ratio = self._layer_us(name, "int16", self.shipped) / max(self._layer_us(name, "int8", self.shipped), 1e-9)
        return ms / 1e3 * max(ratio, 1.0)

    def cpu_seconds(self, name: str) -> float:
        if name in self.profile and "cpu_ms" in self.profile[name]:
            return self.profile[name]["cpu_ms"] / 1e3
        c = self.c
        return max(self.macs[name] / c["cpu_macs_per_s"], 4 * self.elements[name] / c["cpu_bytes_per_s"]) \
            + c["cpu_op_overhead_s"]

    def latency(self, plan: Plan) -> LatencyBreakdown:
        c = self.c
        p = Precision.of_plan(plan)
        if self.profile and any("bpu_ms" in v for v in self.profile.values()):
            per_sub = self._profiled_us(p)
        else:
            per_sub = self.compiler_us(p)
        compiler_ms = sum(per_sub) / 1e3
        cpu = sum(self.cpu_seconds(n.name) for n in self.graph if plan.placement[n.name] != "BPU")
        # Tensors that cross between CPU and BPU: quantized/dequantized and copied at run time.
        boundary = set()
        for node in self.graph:
            here = plan.placement[node.name]
            for t in node.inputs:
                if not self.graph.is_activation(t):
                    continue
                prod = self.graph.producer.get(t)
                if (prod is None and here == "BPU") or (prod is not None and plan.placement[prod.name] != here):
                    boundary.add(t)
        outputs = {t for t in self.graph.output_names if (prod := self.graph.producer.get(t)) is not None
                   and plan.placement[prod.name] == "BPU"}
        b = self.board
        if b.label:
            # a board fit measured the model outputs' transfer and the fixed cost per run on that board: they
            # replace the estimates for those two; the CPU nodes and the tensors between them and the BPU
            # keep tuner's estimates
            inner = boundary - outputs
            out_mb = sum(4 * elements(self.graph.shapes.get(t)) for t in outputs) / 1e6
            switch = sum(elements(self.graph.shapes.get(t)) for t in inner) / c["switch_elements_per_s"] \
                + len(inner) * c["switch_overhead_s"] + (b.per_output_mb * out_mb + b.fixed_ms) / 1e3
        else:
            boundary |= outputs
            switch = sum(elements(self.graph.shapes.get(t)) for t in boundary) / c["switch_elements_per_s"] \
                + len(boundary) * c["switch_overhead_s"] + plan.n_subgraphs * c["subgraph_overhead_s"]
        boundary |= outputs
        int16_layers = len({self.layers[n].head for n in p.in16 | p.out16 if plan.placement.get(n) == "BPU"})
        return LatencyBreakdown(bpu_ms=b.per_estimate * compiler_ms, cpu_ms=cpu * 1e3,
                                switch_ms=switch * 1e3, subgraphs=plan.n_subgraphs,
                                boundary_tensors=len(boundary), compiler_ms=compiler_ms,
                                subgraph_ms=tuple(u / 1e3 for u in per_sub), int16_layers=int16_layers,
                                fitted=self.fit.describe() if self.fit is not None else "")

    def _profiled_us(self, p: Precision) -> list[float]:
        """The hbdk estimate with measured per-node BPU times where the profile has them."""
        per_sub = self.compiler_us(p)
        subs = sorted({p.subgraph.get(n, 0) for n, w in p.placement.items() if w == "BPU"})
        index = {s: i for i, s in enumerate(subs)}
        for name, entry in self.profile.items():
            if "bpu_ms" not in entry or p.placement.get(name) != "BPU" or name not in self.layers:
                continue
            lay = self.layers[name]
            if lay.head != name:
                continue
            i = index.get(p.subgraph.get(name, 0))
            if i is None:
                continue
            prec = "int16" if name in p.in16 else "int8"
            per_sub[i] += self.bpu_seconds(name, prec == "int16") * 1e6 - self._layer_us(name, prec, self.bpu)
        return per_sub

    def _layer_us(self, name: str, prec: str, c: BpuCoefficients) -> float:
        lay = self.layers[name]
        return c.price(lay.kind, prec).us(lay.macs, lay.in_elements, lay.elements)


def price_features(uses: Iterable[LayerUse], extras: Mapping[int, Mapping[str, float]], c: BpuCoefficients
                   ) -> list[dict[str, float]]:
    """Per subgraph (by id): the layers priced with ``c`` (microseconds, by input precision), the int16
    writes, and ``extras``."""
    subs: dict[int, dict[str, float]] = {k: dict(v) for k, v in extras.items()}
    for u in uses:
        f = subs.setdefault(u.subgraph, {})
        f[u.prec] = f.get(u.prec, 0.0) + c.price(u.kind, u.prec).us(u.macs, u.in_elements, u.elements)
        if u.out16:
            f["out16_kelem"] = f.get("out16_kelem", 0.0) + u.elements / 1e3
    return [subs[k] for k in sorted(subs)]


