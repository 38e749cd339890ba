"""``tuner import-calibrated``: hb_mapper's real thresholds next to tuner's, and the PC check.

For one YAML and the ``*_calibrated_model.onnx`` hb_mapper made from it:

* per calibration node: the real threshold, tuner's for the YAML's calibration, their ratio, and
  which of tuner's methods (max, max-percentile, kl) comes closest;
* where hb_mapper's quantization plan differs from tuner's for the same YAML (a tensor one side
  quantizes and the other does not, or another dtype): each is a rule tuner has wrong;
* for a ``max_percentile`` calibration, which reading the thresholds support: the pooled p-quantile
  of |x|, or hmct's kernel as tuner simulates it (the k-th largest |x| over all samples with
  k = n - ceil(p' n) + 1, docs/hb_rules/calibration.md 2; close to the pooled one except at the top);
* the calibrated model itself run in onnxruntime against the float model (tuner.toolchain.calibrated_run).

The report is a typed value with a JSON codec (``as_dict`` / ``from_dict``) and a text form.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx

from tuner.calib.methods import hb_kernel_percentile
from tuner.console import table
from tuner.inputs.calibrated import QMAX, CalibratedModel, HzNode
from tuner.inputs.calibrated_map import MappedThresholds
from tuner.inputs.realmatch import address, load_thresholds
from tuner.toolchain.calibrated_run import PcCheck, check_on_pc

#: default's max-percentile candidate (docs/hb_rules/quantizer.md §2.1), used as "the" percentile when the YAML
#: names none
DEFAULT_PERCENTILE = 0.99995
#: thresholds within this relative distance count as the same
SAME = 1e-3


def _log_err(a: float, b: float) -> float:
    if not (a > 0 and b > 0):
        return math.inf
    return abs(math.log(a / b))


@dataclass(frozen=True)
class ThresholdRow:
    tensor: str
    node: str
    kind: str                   # activation | weight
    qtype: str
    switch: str
    channels: int               # 1: per tensor
    real: float
    tuner: float | None
    ratio: float | None         # real / tuner
    closest: str | None         # the tuner method nearest the real threshold
    closest_ratio: float | None
    methods: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PlanDifference:
    tensor: str
    real: str                   # hb_mapper's dtype, or "float", or "--" (no node)
    tuner: str
    what: str


@dataclass(frozen=True)
class ReadingRow:
    tensor: str
    real: float
    pooled: float
    kernel: float
    better: str                 # pooled | kernel | tie


@dataclass(frozen=True)
class PercentileReading:
    percentile: float
    kernel_percentile: float
    samples: int
    rows: tuple[ReadingRow, ...]
    pooled_wins: int
    kernel_wins: int
    pooled_median_error: float      # median |log(real / reading)|
    kernel_median_error: float
    verdict: str                    # pooled | kernel | undecided

    def as_dict(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "rows"}, "rows": [asdict(r) for r in self.rows]}

    @classmethod
    def from_dict(cls, d: dict) -> PercentileReading:
        return cls(**{**d, "rows": tuple(ReadingRow(**r) for r in d["rows"])})


@dataclass
class CalibratedReport:
    source: str
    config: str
    calibration: str                # the YAML's calibration as tuner simulates it
    nodes: int
    rows: list[ThresholdRow]
    differences: list[PlanDifference]
    unmapped: list[tuple[str, str]]  # (node, reason)
    percentile: PercentileReading | None = None
    pc_check: PcCheck | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return _clean({"source": self.source, "config": self.config, "calibration": self.calibration,
                       "nodes": self.nodes, "rows": [asdict(r) for r in self.rows],
                       "differences": [asdict(d) for d in self.differences],
                       "unmapped": [{"node": n, "reason": r} for n, r in self.unmapped],
                       "percentile": self.percentile.as_dict() if self.percentile else None,
                       "pc_check": self.pc_check.as_dict() if self.pc_check else None, "notes": self.notes})

    @classmethod
    def from_dict(cls, d: dict) -> CalibratedReport:
        d = _unclean(d)
        return cls(source=d["source"], config=d["config"], calibration=d["calibration"], nodes=d["nodes"],
                   rows=[ThresholdRow(**r) for r in d["rows"]],
                   differences=[PlanDifference(**x) for x in d["differences"]],
                   unmapped=[(u["node"], u["reason"]) for u in d["unmapped"]],
                   percentile=PercentileReading.from_dict(d["percentile"]) if d.get("percentile") else None,
                   pc_check=PcCheck.from_dict(d["pc_check"]) if d.get("pc_check") else None,
                   notes=list(d.get("notes", [])))

    def text(self) -> str:

        def f(v, digits=6):
            return "--" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}g}"

        lines = [f"calibrated model {self.source}: {self.nodes} HzCalibration node(s)",
                 f"tuner's calibration for {self.config}: {self.calibration}", ""]
        lines.append(table(["Tensor", "Kind", "qtype", "Ch", "Threshold real", "Threshold tuner", "real/tuner",
                            "Closest tuner method", "real/closest"],
                           [[r.tensor, r.kind, r.qtype + ("" if r.switch == "ON" else " OFF"), str(r.channels),
                             f(r.real), f(r.tuner), f(r.ratio, 4), r.closest or "--", f(r.closest_ratio, 4)]
                            for r in self.rows]))
        counts: dict[str, int] = {}
        for r in self.rows:
            if r.closest:
                counts[r.closest] = counts.get(r.closest, 0) + 1
        if counts:
            lines.append("closest method: " + ", ".join(f"{k} on {v} tensor(s)" for k, v in
                                                        sorted(counts.items(), key=lambda kv: -kv[1])))
        for node, reason in self.unmapped:
            lines.append(f"not compared: {node}: {reason}")
        lines.append("")
        if self.differences:
            lines.append(f"hb_mapper's quantization differs from tuner's plan on {len(self.differences)} tensor(s) "
                         "(each is a rule tuner has wrong):")
            lines.append(table(["Tensor", "hb_mapper", "tuner", "Difference"],
                               [[d.tensor, d.real, d.tuner, d.what] for d in self.differences]))
        else:
            lines.append("hb_mapper quantized the same tensors in the same dtypes as tuner's plan")
        if self.percentile is not None:
            p = self.percentile
            lines += ["", f"max_percentile {p.percentile!r}: kernel p' = {p.kernel_percentile:.6g} with N = {p.samples} "
                          "sample(s) (docs/hb_rules/quantizer.md §1.3)",
                      table(["Tensor", "Threshold real", "pooled p-quantile", "kernel k-th largest", "closer"],
                            [[r.tensor, f(r.real), f(r.pooled), f(r.kernel), r.better] for r in p.rows]),
                      f"pooled reading closer on {p.pooled_wins} tensor(s) (median |log ratio| "
                      f"{p.pooled_median_error:.4g}); kernel reading on {p.kernel_wins} "
                      f"({p.kernel_median_error:.4g}): the thresholds support "
                      + {"pooled": "the pooled p-quantile (tuner's simulation reads it the other way)",
                         "kernel": "the kernel's k-th largest (tuner's reading)",
                         "undecided": "neither reading clearly"}[p.verdict]]
        if self.pc_check is not None:
            c = self.pc_check
            lines += ["", f"PC check: the calibrated model in onnxruntime vs the float model, {c.samples} sample(s) of "
                          f"the YAML's data ({c.replaced} calibration node(s) as fake quant, {c.identities} identity"
                          + (", stand-ins: " + ", ".join(f"{k} x{v}" for k, v in c.standins.items()) if c.standins
                             else "") + ")",
                      table(["Output", "Cosine", "SQNR dB", "L1", "L2", "Chebyshev"],
                            [[o, f"{m['cosine']:.6f}", f"{m['sqnr_db']:.1f}", f(m["l1"]), f(m["l2"]), f(m["max_abs"])]
                             for o, m in c.outputs.items()]),
                      f"mean output cosine {c.mean_cosine:.6f}; with calibration switched off: cosine "
                      f"{c.switched_off_cosine:.6f} (checks the stand-ins)"]
            lines += [f"note: {n}" for n in c.notes]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def _unclean(v):
    if v in ("inf", "-inf"):
        return float(v)
    if isinstance(v, dict):
        return {k: _unclean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_unclean(x) for x in v]
    return v


def _dtype_of(nodes: tuple[HzNode, ...]) -> str:
    q = [n.qtype for n in nodes if n.quantizes]
    if not q:
        return "float"
    return "int16" if "int16" in q else "uint8" if "uint8" in q else q[0]


def plan_differences(mapped: MappedThresholds, plan, scales, graph) -> list[PlanDifference]:
    """Where hb_mapper's calibration nodes disagree with tuner's plan (tensors, dtypes, weights)."""
    tuner: dict[str, str] = {}
    for tensor, dtype in list(plan.edges.values()) + list(plan.cpu_reads.values()) + list(plan.outputs.items()):
        if tuner.get(tensor) != "int16":
            tuner[tensor] = dtype
    unsigned = getattr(scales, "unsigned", None)
    for t, d in tuner.items():
        if d == "int8" and unsigned is not None and unsigned(t, d):
            tuner[t] = "uint8"
    out = []
    for t in graph.activation_tensors():
        nodes = mapped.activations.get(t, ())
        real = _dtype_of(nodes) if nodes else "--"
        mine = tuner.get(t, "float")
        if real == mine or (real == "--" and mine == "float"):
            continue
        if real == "--":
            what = "tuner quantizes it; hb_mapper has no calibration node on it"
        elif real == "float" and mine != "float":
            what = "hb_mapper leaves it float (switch OFF or a float qtype); tuner quantizes it"
        elif mine == "float":
            what = "hb_mapper quantizes it; tuner does not"
        else:
            what = f"{real} in hb_mapper where tuner has {mine}"
        out.append(PlanDifference(t, real, mine, what))
    weighted = set(plan.weights)
    for consumer, n in mapped.weights.items():
        if n.quantizes and consumer not in weighted:
            out.append(PlanDifference(f"{n.tensor} ({consumer})", n.qtype, "float",
                                      "hb_mapper quantizes this weight; tuner keeps it float"))
    for consumer in plan.weights:
        if consumer not in mapped.weights:
            w = graph.by_name[consumer].inputs[1] if len(graph.by_name[consumer].inputs) > 1 else consumer
            out.append(PlanDifference(f"{w} ({consumer})", "--", "int8",
                                      "tuner quantizes this weight; hb_mapper has no calibration node on it"))
    return out


def build_report(ws, cal: CalibratedModel, run_pc: bool = True, reading: bool = True) -> CalibratedReport:
    """Compare ``cal`` with what tuner simulates for the workspace's YAML (tuner.workspace.Workspace)."""
    original = onnx.load(str(ws.model.path), load_external_data=False)
    mapped = address(cal, ws.graph, original, ws.model.proto, ws.first_sample())
    sim = ws.simulator
    candidate = ws.base_candidate()
    calibration, notes = sim.resolve(candidate)
    scales = sim.scales(calibration)
    memo = sim.thresholds
    yaml_cal = candidate.calibration
    p = yaml_cal.max_percentile if yaml_cal.max_percentile is not None else DEFAULT_PERCENTILE
    rows: list[ThresholdRow] = []
    for t, nodes in mapped.activations.items():
        for n in nodes:
            dtype = n.qtype if n.qtype in ("int8", "int16") else "int8"
            qmax = QMAX[dtype]
            mine = scales.threshold(t, dtype) if t in ws.stats else None
            methods = {}
            if t in ws.stats:
                # max-percentile as tuner simulates it (tuner.calib.methods: hmct's kernel); the
                # pooled reading is compared in percentile_reading
                methods = {"max": memo.get(t, "max", None, qmax),
                           f"max-percentile {p!r}": memo.get(t, "max-percentile", p, qmax),
                           "kl": memo.get(t, "kl", None, qmax)}
            real = n.threshold
            closest = min(methods, key=lambda m: _log_err(real, methods[m])) if methods and n.quantizes else None
            rows.append(ThresholdRow(tensor=t, node=n.name, kind="activation", qtype=n.qtype, switch=n.switch,
                                     channels=len(n.thresholds) if n.per_channel else 1, real=real, tuner=mine,
                                     ratio=real / mine if mine else None, closest=closest,
                                     closest_ratio=real / methods[closest] if closest and methods[closest] else None,
                                     methods=methods))
    for consumer, n in mapped.weights.items():
        node = ws.graph.by_name[consumer]
        w_name = n.tensor if n.tensor in ws.graph.initializers else next(
            (t for t in node.inputs if t in ws.graph.initializers), None)
        # tuner's weight threshold: max |w| (hb's are on the equalized weight when the input is per channel)
        mine = float(np.abs(onnx.numpy_helper.to_array(ws.graph.initializers[w_name])).max()) if w_name else None
        rows.append(ThresholdRow(tensor=f"{n.tensor} ({consumer})", node=n.name, kind="weight", qtype=n.qtype,
                                 switch=n.switch, channels=len(n.thresholds), real=n.threshold, tuner=mine,
                                 ratio=n.threshold / mine if mine else None, closest="max" if mine else None,
                                 closest_ratio=n.threshold / mine if mine else None))
    plan = sim.plan(candidate)
    report = CalibratedReport(source=str(cal.path), config=str(ws.config.path), calibration=calibration.describe(),
                              nodes=len(cal.nodes), rows=rows,
                              differences=plan_differences(mapped, plan, scales, ws.graph),
                              unmapped=[(u.node.name, u.reason) for u in mapped.unmapped],
                              notes=list(notes) + list(mapped.notes))
    if reading and yaml_cal.max_percentile is not None:
        report.percentile = percentile_reading(ws, mapped, yaml_cal.max_percentile)
    elif reading:
        report.notes.append("percentile reading (docs/hb_rules/quantizer.md §1.3) not checked: the YAML's calibration "
                            "is not max with max_percentile < 1")
    if run_pc:
        report.pc_check = check_on_pc(cal, ws.model.proto, ws.eval_data, ws.threads)
    return report


def percentile_reading(ws, mapped: MappedThresholds, p: float) -> PercentileReading:
    """Which reading of max_percentile the real thresholds support, per tensor and overall."""
    tensors = [t for t, nodes in mapped.activations.items() if t in ws.stats
               and any(n.quantizes and not n.per_channel and n.qtype in ("int8", "uint8") for n in nodes)]
    # Both readings come from the one statistics pass (tuner.calib.stats).
    n_samples = max((ws.stats[t].samples for t in tensors), default=0)
    q = hb_kernel_percentile(p, n_samples)
    kernel = {t: ws.thresholds.get(t, "max-percentile", p, 127) for t in tensors}
    rows = []
    for t in tensors:
        node = next(n for n in mapped.activations[t] if n.quantizes and not n.per_channel)
        real = node.threshold
        pooled = ws.thresholds.get(t, "percentile", p, 127)
        rm = kernel.get(t, math.nan)
        ep, er = _log_err(real, pooled), _log_err(real, rm)
        better = "tie" if abs(ep - er) <= SAME else ("pooled" if ep < er else "kernel")
        rows.append(ReadingRow(t, real, pooled, rm, better))
    pw = sum(r.better == "pooled" for r in rows)
    rw = sum(r.better == "kernel" for r in rows)
    pe = float(np.median([_log_err(r.real, r.pooled) for r in rows])) if rows else math.nan
    re_ = float(np.median([_log_err(r.real, r.kernel) for r in rows])) if rows else math.nan
    verdict = "undecided"
    if pw > rw and pe <= re_:
        verdict = "pooled"
    elif rw > pw and re_ <= pe:
        verdict = "kernel"
    return PercentileReading(percentile=p, kernel_percentile=q, samples=n_samples, rows=tuple(rows), pooled_wins=pw,
                             kernel_wins=rw, pooled_median_error=pe, kernel_median_error=re_,
                             verdict=verdict)


def real_thresholds(ws, path) -> MappedThresholds:
    """The real thresholds of the calibrated model at ``path``, addressed to the workspace's graph."""
    return load_thresholds(path, ws.graph, ws.model.path, ws.model.proto, ws.first_sample())
