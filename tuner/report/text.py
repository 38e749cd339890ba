"""Terminal tables and JSON for an evaluation, in the shape hb_mapper's log uses."""

from __future__ import annotations

import json
import math
from typing import Any

from tuner.candidate import Calibration
from tuner.console import table
from tuner.graph.softmax import SOFTMAX_PART_INPUTS, SOFTMAX_PARTS, softmax_part
from tuner.simulate import Evaluation, Resolved
from tuner.simulate.calibrate import MixedCalibration
from tuner.simulate.realscales import RealCalibration


def _fmt(value: float | None, digits: int = 6) -> str:
    if value is None:
        return "--"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.{digits}f}"


def node_table(ev: Evaluation) -> str:
    rows = [[r.name, r.on, f"id({r.subgraph})" if r.subgraph is not None else "--", r.op_type,
             _fmt(r.cosine), _fmt(r.threshold), f"{r.in_dtype}/{r.out_dtype}"] for r in ev.nodes]
    return table(["Node", "ON", "Subgraph", "Type", "Cosine Similarity", "Threshold", "In/Out DataType"], rows)


def accumulated_rows(ev: Evaluation, graph) -> list[dict[str, Any]]:
    """Per node in topological order: its output cosine, the change from the worst of its
    inputs (negative: error enters at this node), and the CPU/BPU switches that feed it.
    Where a large drop sits on a switch, the boundary's requantization is the culprit."""
    by = {r.name: r for r in ev.nodes}
    out = []
    for i, r in enumerate(ev.nodes):
        preds = [by[p] for p in _row_inputs(r.name, graph, by) if p in by]
        in_cos = [c for c in (p.cosine for p in preds) if c is not None]
        change = None if r.cosine is None else r.cosine - (min(in_cos) if in_cos else 1.0)
        switches = sorted({f"{p.on}->{r.on}" for p in preds if p.on != r.on})
        out.append({"index": i, "node": r.name, "on": r.on, "type": r.op_type, "cosine": r.cosine, "change": change,
                    "switch": ",".join(switches)})
    return out


def _row_inputs(name: str, graph, rows: dict) -> list[str]:
    """The rows a row reads: its producers' rows (a BPU Softmax's is its last part, ``..._mul``), and
    for a part of a BPU Softmax, the parts before it (the graph holds one Softmax node, not its parts)."""
    def row_of(tensor: str) -> list[str]:
        p = graph.producer.get(tensor)
        if p is None or not graph.is_activation(tensor):
            return []
        return [p.name if p.name in rows else softmax_part(p.name, "mul")]

    node = graph.by_name.get(name)
    if node is not None:
        return [n for t in node.inputs for n in row_of(t)]
    for part in SOFTMAX_PARTS:
        suffix = softmax_part("", part)
        if name.endswith(suffix) and name[: -len(suffix)] in graph.by_name:
            softmax = name[: -len(suffix)]
            return [n for q in SOFTMAX_PART_INPUTS[part]
                    for n in (row_of(graph.by_name[softmax].inputs[0]) if q == "x" else [softmax_part(softmax, q)])]
    return []


def accumulated_table(ev: Evaluation, graph, mark: int = 5) -> str:
    rows = accumulated_rows(ev, graph)
    worst = sorted((r for r in rows if r["change"] is not None and r["change"] < -1e-6), key=lambda r: r["change"])
    marked = {r["index"] for r in worst[:mark]}
    return table(["#", "Node", "ON", "Type", "Cosine", "Change", "Switch", ""],
                 [[str(r["index"]), r["node"], r["on"], r["type"], _fmt(r["cosine"]),
                   "--" if r["change"] is None else f"{r['change']:+.6f}", r["switch"],
                   "<< error enters" if r["index"] in marked else ""] for r in rows])


def output_table(ev: Evaluation) -> str:
    rows = [[name, _fmt(m["cosine"]), _fmt(m["sqnr_db"], 2), _fmt(m["max_abs"]), _fmt(m["l1"]), _fmt(m["l2"])]
            for name, m in ev.outputs.items()]
    return table(["Output", "Cosine Similarity", "SQNR (dB)", "Chebyshev (max abs)", "L1", "L2"], rows)


#: The parts of the loss split of an image input_type_rt (Evaluation.split), in the order shown.
SPLIT_PARTS = (("input_path", "input path alone"), ("network", "network alone"), ("both", "both"))


def split_dict(ev: Evaluation) -> dict[str, dict[str, Any]] | None:
    """The loss split with the whole (``both``: the outputs' own figures), or None (no input path)."""
    if ev.split is None:
        return None
    return {**ev.split, "both": {"outputs": ev.outputs, "task": ev.task}}


def split_table(ev: Evaluation) -> str:
    """Per output, the cosine and SQNR of the input path alone, the network alone and both, then the task
    metrics the same way; "" without an input path."""
    parts = split_dict(ev)
    if parts is None:
        return ""
    heads = ["Output"]
    for _, label in SPLIT_PARTS:
        heads += [f"Cosine ({label})", f"SQNR dB ({label})"]
    rows = []
    for name in ev.outputs:
        row = [name]
        for key, _ in SPLIT_PARTS:
            m = parts[key]["outputs"][name]
            row += [_fmt(m["cosine"]), _fmt(m["sqnr_db"], 2)]
        rows.append(row)
    for metric in ev.task:
        rows.append([metric] + [c for key, _ in SPLIT_PARTS for c in (_fmt(parts[key]["task"].get(metric)), "")])
    return ("loss split (the input path alone: the float model fed the board's path values; the network alone: "
            "the quantized network against the float one on those values)\n" + table(heads, rows))


def summary_line(ev: Evaluation) -> str:
    c = ev.counts()
    bpu = sum(1 for p in ev.plan.placement.values() if p == "BPU")
    return (f"{c['subgraphs']} BPU subgraph(s), {bpu} BPU node(s), {c['cpu_nodes']} CPU node(s), "
            f"{c['int16_nodes']} int16 node(s)")


def _method_dict(cal: Calibration | RealCalibration) -> dict[str, Any]:
    return {"type": cal.type, "max_percentile": cal.max_percentile, "per_channel": cal.per_channel,
            "asymmetric": cal.asymmetric, "method": cal.describe()}


def calibration_dict(cal: Resolved) -> dict[str, Any]:
    """The simulated calibration; for ``mix`` also its base, the nodes that took another method
    and hb's Merge_Info table (every sensitive node's single-node cosine under each method)."""
    if not isinstance(cal, MixedCalibration):
        return _method_dict(cal)
    return {"type": "mix", "method": cal.describe(), "base": _method_dict(cal.base),
            "merged": [{"node": t, "method": m.describe()} for t, m in cal.merged],
            "ranking": [{"method": m.describe(), "score": v} for m, v in cal.ranking],
            "merge_info": cal.merge_rows()}


def merge_info_table(ev: Evaluation) -> str:
    """hb_mapper's "Merge_Info(cosine-similarity)" table of a ``mix`` evaluation ("" otherwise):
    one row per sensitive node, its single-node cosine under each method, the selected one marked."""
    cal = ev.calibration
    if not isinstance(cal, MixedCalibration) or not cal.merge_info:
        return ""
    methods = [m for m, _ in cal.ranking] or list(dict.fromkeys(m for _, vals in cal.merge_info for m, _ in vals))
    rows = []
    for row in cal.merge_rows():
        cells = [_fmt(row["cosine"].get(m.describe())) + ("(select)" if m.describe() == row["selected"] else "")
                 for m in methods]
        rows.append([row["node"]] + cells)
    return "Merge_Info(cosine-similarity)\n" + table(["Node"] + [m.describe() for m in methods], rows)


def evaluation_dict(ev: Evaluation, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
        return v

    out: dict[str, Any] = dict(extra or {})
    out.update({
        "calibration": calibration_dict(ev.calibration),
        "requested": ev.candidate.to_yaml_fields(),
        "outputs": {k: {m: clean(v) for m, v in d.items()} for k, d in ev.outputs.items()},
        "mean_output_cosine": ev.mean_cosine,
        "counts": ev.counts(),
        "cpu_nodes": ev.plan.cpu_nodes,
        "nodes": [{"node": r.name, "on": r.on, "subgraph": r.subgraph, "type": r.op_type,
                   "cosine": clean(r.cosine), "threshold": r.threshold, "in_dtype": r.in_dtype,
                   "out_dtype": r.out_dtype} for r in ev.nodes],
        "notes": ev.notes,
        "seconds": ev.seconds,
    })
    parts = split_dict(ev)
    if parts is not None:
        out["loss_split"] = {k: {"outputs": {o: {m: clean(v) for m, v in d.items()} for o, d in p["outputs"].items()},
                                 "task": {m: clean(v) for m, v in p["task"].items()}} for k, p in parts.items()}
    return out


def to_json(ev: Evaluation, extra: dict[str, Any] | None = None) -> str:
    return json.dumps(evaluation_dict(ev, extra), indent=2)
