"""Modeled latency of a plan on the target: hbdk's BPU estimate, the CPU nodes, and the switches.

**BPU** (``bpu_ms``): what hbdk, the X5 compiler, estimates for the compiled ``.bin`` at
``optimize_level: O3`` (what a board runs), scaled to the board. It is a sum over the plan's BPU
subgraphs of

* one term per layer (a fusion group, :mod:`tuner.cost.bpu`): a fixed cost, a cost per MAC and a cost
  per output element, per op kind and per precision of the layer's input (int8, int16), plus the
  extra write of an int16 output;
* a requantize layer wherever one tensor is read in two precisions (hbdk's ``..._Requantize`` rows);
* the DDR traffic of the subgraph's inputs and outputs (a CPU cut writes the tensor on one side and
  reads it on the other) and a fixed cost per subgraph.

Every term is linear in its coefficient, so the coefficients are fitted by least squares to hbdk's
estimates (``benchmarks/latency_fidelity.py``, :mod:`tuner.cost.fit`) and shipped in
``search_spaces/targets/<march>.yaml`` (``cost.bpu``); ``tuner latency fit`` refines three scales
of them (int8 layers, int16 layers, subgraph I/O) for one model from a handful of real compiles,
kept by model fingerprint (:class:`ModelFit`). The int16 spread is the plan's (hb_mapper's rules in
:mod:`tuner.simulate.plan`): an int16 request that climbs to a producer costs there too.

**CPU** (``cpu_ms``) and **switches** (``switch_ms``) are not in hbdk's estimate and are modeled as
before this fit: CPU nodes run in float on one Cortex-A55 core (a roofline of MACs and bytes plus a
per-op overhead), every tensor crossing between CPU and BPU is (de)quantized and copied, every BPU
subgraph costs a launch. A measured per-node profile (``{node: {bpu_ms, cpu_ms}}``) replaces the
estimate where present. A board measurement (``tuner latency board``) rescales hbdk's estimate to
that board and firmware (:class:`BoardFit`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from tuner.cost.bpu import KINDS, MAC_KINDS, Layer, aligned_elements, elements, layers, node_macs, op_kind
from tuner.errors import TunerError
from tuner.graph import Graph, Target
from tuner.simulate.plan import Plan

__all__ = ["COEFFICIENTS", "BoardFit", "BpuCoefficients", "CostModel", "LatencyBreakdown", "ModelFit", "load_profile",
           "node_macs"]

#: The CPU side's coefficients (seconds, MACs, bytes, elements), unchanged by the hbdk fit.
COEFFICIENTS = ("cpu_macs_per_s", "cpu_bytes_per_s", "cpu_op_overhead_s", "switch_elements_per_s",
                "switch_overhead_s", "subgraph_overhead_s")
PRECISIONS = ("int8", "int16")
#: The per-layer terms of one kind and precision: a count, MACs (millions), output elements (thousands).
TERMS = ("fixed", "mmac", "kelem")
#: The subgraph-level terms: an int16 output's write (thousand elements), a requantized tensor (thousand
#: elements), the DDR traffic in and out of a subgraph (kilobytes), a subgraph.
GLOBAL_TERMS = ("out16_kelem", "requant_kelem", "io_kbyte", "subgraph")
#: The scales ``tuner latency fit`` refines per model, and the terms each scales.
SCALES = ("int8", "int16", "io")
_BYTES = {"int8": 1, "uint8": 1, "int16": 2, "int32": 4, "float": 4}


def term_names() -> list[str]:
    return [f"{k}.{p}.{t}" for k in KINDS for p in PRECISIONS for t in TERMS] + list(GLOBAL_TERMS)


def scale_of(term: str) -> str:
    """Which per-model scale a term belongs to."""
    if term in ("io_kbyte", "subgraph"):
        return "io"
    if term in ("out16_kelem", "requant_kelem") or ".int16." in term:
        return "int16"
    return "int8"


@dataclass(frozen=True)
class BpuCoefficients:
    """hbdk O3 estimate = sum over terms of coefficient x feature, in microseconds (see the module doc).
    ``values``: term name -> microseconds per unit; a term missing costs nothing."""

    values: Mapping[str, float]
    source: str = ""

    @classmethod
    def from_target(cls, target: Target) -> BpuCoefficients:
        """The target's ``cost.bpu``; a target without one (no compiler fit for its march) has its
        roofline estimates (``bpu_macs_per_s``, ``bpu_bytes_per_s``, ...) in the same terms."""
        cost = target.raw.get("cost") or {}
        raw = cost.get("bpu")
        if isinstance(raw, dict):
            return cls.from_dict(raw)
        need = ("bpu_macs_per_s", "bpu_bytes_per_s", "bpu_op_overhead_s", "int16_mac_factor", "int16_byte_factor")
        if not all(k in cost for k in need):
            raise TunerError(f"target {target.march}: cost.bpu (hbdk's fitted coefficients) or the roofline "
                             f"estimates ({', '.join(need)}) missing")
        return cls.from_roofline({k: float(cost[k]) for k in need}, target.march)

    @classmethod
    def from_roofline(cls, c: Mapping[str, float], march: str) -> BpuCoefficients:
        """A MAC rate and a byte rate (int16 slower by its factors), a fixed cost per layer: the model
        tuner had before hbdk was fitted, for marches without a fit."""
        fixed = c["bpu_op_overhead_s"] * 1e6
        us_mmac = 1e12 / c["bpu_macs_per_s"]
        us_kbyte = 1e9 / c["bpu_bytes_per_s"]
        values: dict[str, float] = {}
        for kind in KINDS:
            for prec, mac_f, byte_f in (("int8", 1.0, 1.0), ("int16", c["int16_mac_factor"], c["int16_byte_factor"])):
                values[f"{kind}.{prec}.fixed"] = fixed
                values[f"{kind}.{prec}.mmac"] = us_mmac * mac_f if kind in MAC_KINDS else 0.0
                values[f"{kind}.{prec}.kelem"] = 2 * us_kbyte * byte_f     # read and written
        values["io_kbyte"] = us_kbyte
        return cls(values=values, source=f"roofline estimates for {march} (no compiler fit)")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> BpuCoefficients:
        values: dict[str, float] = {}
        for kind, per in (raw.get("layers") or {}).items():
            if kind not in KINDS:
                raise TunerError(f"cost.bpu.layers: unknown kind {kind!r} (known: {', '.join(KINDS)})")
            for prec, triple in (per or {}).items():
                if prec not in PRECISIONS or not isinstance(triple, (list, tuple)) or len(triple) != 3:
                    raise TunerError(f"cost.bpu.layers.{kind}.{prec}: expected [fixed_us, us_per_mmac, us_per_kelem]")
                for t, v in zip(TERMS, triple):
                    values[f"{kind}.{prec}.{t}"] = float(v)
        for t in GLOBAL_TERMS:
            if t in raw:
                values[t] = float(raw[t])
        return cls(values=values, source=str(raw.get("source", "")))

    def to_dict(self) -> dict[str, Any]:
        lay: dict[str, dict[str, list[float]]] = {}
        for kind in KINDS:
            for prec in PRECISIONS:
                triple = [round(self.values.get(f"{kind}.{prec}.{t}", 0.0), 6) for t in TERMS]
                if any(triple):
                    lay.setdefault(kind, {})[prec] = triple
        out: dict[str, Any] = {"source": self.source, "layers": lay}
        out.update({t: round(self.values.get(t, 0.0), 6) for t in GLOBAL_TERMS})
        return out

    def scaled(self, scales: Mapping[str, float]) -> BpuCoefficients:
        return replace(self, values={k: v * scales.get(scale_of(k), 1.0) for k, v in self.values.items()})

    def us(self, features: Mapping[str, float]) -> float:
        v = self.values
        return sum(v.get(k, 0.0) * x for k, x in features.items())


@dataclass(frozen=True)
class ModelFit:
    """``tuner latency fit``'s result for one model: scales of the shipped coefficients (int8 layers,
    int16 layers, subgraph I/O) that make them reproduce hbdk on that model's compiles."""

    model_sha256: str
    march: str
    scales: Mapping[str, float]
    samples: tuple[dict[str, Any], ...] = ()      # per compile: name, hbdk_ms, modeled_ms before / after
    toolchain: str = ""
    created: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "scales": dict(self.scales), "samples": list(self.samples)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ModelFit:
        return cls(model_sha256=str(d["model_sha256"]), march=str(d["march"]),
                   scales={str(k): float(v) for k, v in dict(d["scales"]).items()},
                   samples=tuple(dict(s) for s in d.get("samples", ())), toolchain=str(d.get("toolchain", "")),
                   created=str(d.get("created", "")))

    def describe(self) -> str:
        s = ", ".join(f"{k} x{v:.2f}" for k, v in self.scales.items())
        return f"fitted to {len(self.samples)} real compile(s) of this model ({s})"


@dataclass(frozen=True)
class BoardFit:
    """board_ms = per_estimate x hbdk estimate + per_output_mb x MB of float32 model outputs + fixed_ms,
    for one board and firmware (``tuner latency board``, :mod:`tuner.cost.board`). The default is the
    public zoo campaign's fit (the target's ``cost.board``)."""

    per_estimate: float = 1.0
    per_output_mb: float = 0.0
    fixed_ms: float = 0.0
    label: str = ""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BoardFit:
        return cls(per_estimate=float(d.get("per_estimate", 1.0)), per_output_mb=float(d.get("per_output_mb", 0.0)),
                   fixed_ms=float(d.get("fixed_ms", 0.0)), label=str(d.get("label", d.get("source", ""))))


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
    def layer_terms(self, p: Precision) -> list[tuple[str, int, dict[str, float]]]:
        """Per BPU layer: (its name in hbdk's table, its subgraph, term -> amount)."""
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
                members = [m for m in lay.members if p.placement.get(m) == "BPU"]
                kind, macs, elems = lay.kind, lay.macs, lay.elements
            else:
                members = [node.name]
                kind = op_kind(g, node)
                macs = self.macs[node.name] if kind in MAC_KINDS else 0
                elems = self._aligned.get(node.outputs[0], 0) if node.outputs else 0
            prec = "int16" if head in p.in16 else "int8"
            terms = {f"{kind}.{prec}.fixed": 1.0, f"{kind}.{prec}.mmac": macs / 1e6, f"{kind}.{prec}.kelem": elems / 1e3}
            if members[-1] in p.out16:
                terms["out16_kelem"] = elems / 1e3
            out.append((head, p.subgraph.get(node.name, 0), terms))
        return out

    def features(self, p: Precision) -> list[dict[str, float]]:
        """Per BPU subgraph (in the order of their ids): term -> amount (:func:`term_names`)."""
        g = self.graph
        subs: dict[int, dict[str, float]] = {}

        def add(sub: int, term: str, x: float) -> None:
            f = subs.setdefault(sub, {})
            f[term] = f.get(term, 0.0) + x

        for _, sub, terms in self.layer_terms(p):
            for t, x in terms.items():
                add(sub, t, x)
        # tensors read in two precisions on the BPU: hbdk's Requantize layers
        for tensor, dtypes in p.reads.items():
            producer = g.producer.get(tensor)
            have = set(dtypes)
            if producer is not None and p.placement.get(producer.name) == "BPU":
                d = p.out_dtype.get(producer.name)
                if d in ("int8", "int16"):
                    have.add(d)
            if len(have & {"int8", "int16"}) > 1:
                sub = p.subgraph.get(producer.name, 0) if producer is not None else min(subs or {0: {}})
                add(sub, "requant_kelem", self._aligned.get(tensor, 0) / 1e3)
        # DDR traffic in and out of every subgraph
        for sub, kbytes in self._io_kbytes(p).items():
            add(sub, "io_kbyte", kbytes)
        for sub in subs:
            add(sub, "subgraph", 1.0)
        return [subs[k] for k in sorted(subs)]

    def _io_kbytes(self, p: Precision) -> dict[int, float]:
        g = self.graph
        out: dict[int, float] = {}
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
                    out[sub] = out.get(sub, 0.0) + elements(g.shapes.get(t)) * _BYTES[d] / 1e3
            for t in node.outputs:
                readers = g.consumers.get(t, [])
                leaves = t in g.output_names or any(p.placement.get(c.name) != "BPU"
                                                    or p.subgraph.get(c.name) != sub for c, _ in readers)
                if leaves and (t, -1 - sub) not in counted:
                    counted.add((t, -1 - sub))
                    d = p.out_dtype.get(node.name, "int8")
                    out[sub] = out.get(sub, 0.0) + elements(g.shapes.get(t)) * _BYTES.get(d, 1) / 1e3
        return out

    def compiler_us(self, p: Precision, coefficients: BpuCoefficients | None = None) -> list[float]:
        """The modeled hbdk estimate per BPU subgraph, in microseconds."""
        c = coefficients or self.bpu
        return [c.us(f) for f in self.features(p)]

    # ------------------------------------------------------------------ the whole
    def bpu_seconds(self, name: str, int16: bool) -> float:
        """A profiled node's BPU time (``profile``), int16 at the shipped int16/int8 ratio of its kind."""
        ms = self.profile[name]["bpu_ms"]
        if not int16:
            return ms / 1e3
        lay = self.layers[name]
        v = self.shipped.values

        def at(prec: str) -> float:
            return (v.get(f"{lay.kind}.{prec}.fixed", 0.0) + v.get(f"{lay.kind}.{prec}.mmac", 0.0) * lay.macs / 1e6
                    + v.get(f"{lay.kind}.{prec}.kelem", 0.0) * lay.elements / 1e3)

        ratio = at("int16") / at("int8") if at("int8") > 0 else 1.0
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
        for t in self.graph.output_names:
            prod = self.graph.producer.get(t)
            if prod is not None and plan.placement[prod.name] == "BPU":
                boundary.add(t)
        switch_elems = sum(elements(self.graph.shapes.get(t)) for t in boundary)
        switch = switch_elems / c["switch_elements_per_s"] + len(boundary) * c["switch_overhead_s"] \
            + plan.n_subgraphs * c["subgraph_overhead_s"]
        b = self.board
        int16_layers = len({self.layers[n].head for n in p.in16 | p.out16 if plan.placement.get(n) == "BPU"})
        return LatencyBreakdown(bpu_ms=b.per_estimate * compiler_ms, cpu_ms=cpu * 1e3,
                                switch_ms=switch * 1e3 + b.fixed_ms, subgraphs=plan.n_subgraphs,
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
            v = self.bpu.values
            modeled = (v.get(f"{lay.kind}.{prec}.fixed", 0.0) + v.get(f"{lay.kind}.{prec}.mmac", 0.0) * lay.macs / 1e6
                       + v.get(f"{lay.kind}.{prec}.kelem", 0.0) * lay.elements / 1e3)
            per_sub[i] += self.bpu_seconds(name, prec == "int16") * 1e6 - modeled
        return per_sub


def load_profile(path: str | Path) -> dict[str, dict[str, float]]:
    """A measured per-node profile: ``{node: {bpu_ms: float, cpu_ms: float}}`` (YAML or JSON)."""
    path = Path(path)
    if not path.is_file():
        raise TunerError(f"{path}: profile file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise TunerError(f"{path}: invalid YAML/JSON: {exc}") from None
    if not isinstance(data, dict):
        raise TunerError(f"{path}: expected a mapping of node name to {{bpu_ms, cpu_ms}}")
    out = {}
    for name, entry in data.items():
        if not isinstance(entry, dict) or not set(entry) <= {"bpu_ms", "cpu_ms"}:
            raise TunerError(f"{path}: {name}: expected {{bpu_ms: number, cpu_ms: number}}")
        try:
            out[str(name)] = {k: float(v) for k, v in entry.items()}
        except (TypeError, ValueError):
            raise TunerError(f"{path}: {name}: times must be numbers (milliseconds)") from None
    return out


def fits_dir() -> Path:
    from tuner.files import cache_dir

    return cache_dir() / "latency"


def fit_path(model_sha256: str, march: str) -> Path:
    return fits_dir() / f"{model_sha256[:32]}-{march}.json"


def load_fit(model_sha256: str, march: str) -> ModelFit | None:
    """``tuner latency fit``'s result for this model and march, when one was made (None otherwise)."""
    path = fit_path(model_sha256, march)
    try:
        return ModelFit.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None

