"""``tuner sensitivity``'s outputs: the CSV of every row, the terminal tables, the JSON."""

from __future__ import annotations

import csv
import io
from typing import Any

from tuner.console import table
from tuner.sensitivity import Sensitivity

CSV_COLUMNS = ["node", "op_type", "gain", "cpu_gain", "int16_gain", "alone_int8_accuracy", "alone_int8_cosine", "alone_int8_sqnr_db",
               "alone_int16_accuracy", "alone_int16_cosine", "alone_int16_sqnr_db", "calibration"]


def csv_text(result: Sensitivity) -> str:
    """Every row of every calibration, one line each."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(CSV_COLUMNS)
    for run in result.runs:
        for r in run.rows:
            a16 = r.alone_int16 or {}
            w.writerow([r.node, r.op_type, f"{r.gain:.8f}"] + [_num(r.gains.get(f), "{:.8f}") for f in ("cpu", "int16")]
                       + [f"{r.alone_int8[k]:.8f}" for k in ("accuracy", "cosine", "sqnr_db")]
                       + [f"{a16[k]:.8f}" if k in a16 else "" for k in ("accuracy", "cosine", "sqnr_db")]
                       + [run.calibration.describe()])
    return buf.getvalue()


def _num(v: float | None, fmt: str, missing: str = "") -> str:
    return missing if v is None else fmt.format(v)


def as_dict(result: Sensitivity) -> dict[str, Any]:
    first = result.runs[0]
    return {"metric": result.metric, "calibration": first.calibration.describe(),
            "nodes": [r.as_dict() for r in first.rows],
            "by_calibration": [{"calibration": run.calibration.describe(), "nodes": [r.as_dict() for r in run.rows]}
                               for run in result.runs]}


def text(result: Sensitivity, top: int | None = None) -> str:
    """One calibration: its table; several: gains and alone-int8 accuracies side by side, ranked
    by the largest gain under any of them."""
    metric, runs = result.metric, result.runs
    if len(runs) == 1:
        cal, rows = runs[0].calibration, runs[0].rows
        shown = rows[:top] if top else rows
        return "\n".join([
            f"sensitivity of {len(rows)} BPU node(s) ({metric}; calibration {cal.describe()}); most sensitive first",
            table(["node", "type", "gain if CPU", "gain if int16", "alone int8", "alone int16", "alone int8 SQNR dB"],
                  [[r.node, r.op_type, _num(r.gains.get("cpu"), "{:+.6f}", "--"),
                    _num(r.gains.get("int16"), "{:+.6f}", "--"), f"{r.alone_int8['accuracy']:.6f}",
                    f"{r.alone_int16['accuracy']:.6f}" if r.alone_int16 else "--", f"{r.alone_int8['sqnr_db']:.1f}"]
                   for r in shown])])
    by = [{r.node: r for r in run.rows} for run in runs]
    order = sorted(by[0], key=lambda n: -max(b[n].gain for b in by))
    shown_nodes = order[:top] if top else order
    return "\n".join([
        f"sensitivity of {len(order)} BPU node(s) ({metric}) under {len(runs)} calibrations; most sensitive "
        "first (largest gain of a fix, CPU or int16, under any of them)",
        table(["node", "type"] + [f"gain {run.label}" for run in runs] + [f"alone int8 {run.label}" for run in runs],
              [[n, by[0][n].op_type] + [f"{b[n].gain:+.6f}" for b in by]
               + [f"{b[n].alone_int8['accuracy']:.6f}" for b in by] for n in shown_nodes]),
        "\n" + "; ".join(f"{run.label} = {run.calibration.describe()}" for run in runs)])
