"""The report's figures (Plotly), each a pure function of the study's rows or snapshot: the Pareto
plot (baselines and the exported trial marked), Optuna's history and importances, the sensitivity
ranking and the per-node error traces. :mod:`tuner.report.html` lays them out."""

from __future__ import annotations

import html
import warnings
from typing import Any

import optuna

from tuner.study import results
from tuner.study.results import Trace
from tuner.toolchain.records import RealRecord


def _is_baseline(r: results.Row) -> bool:
    return r.plan is not None and r.plan.startswith("baseline")


def pareto_figure(rs: list[results.Row], best: results.Row | None, min_accuracy: float | None,
                  real: dict[int, RealRecord] | None = None):
    """Accuracy vs modeled latency. For cosine-like metrics (all <= 1) the y axis is 1 - accuracy
    on a log scale: the all-int8 baselines sit at 0.6 and the front at 0.9999, and on a linear
    axis the front is a flat line."""
    import plotly.graph_objects as go

    fig = go.Figure()
    front = results.pareto(rs)
    on_front = {r.number for r in front}
    log = all(r.accuracy <= 1.0 for r in rs)
    y = (lambda a: max(1.0 - a, 1e-9)) if log else (lambda a: a)   # noqa: E731

    def hover(r: results.Row) -> str:
        c = r.counts
        return (f"trial {r.number}<br>accuracy {r.accuracy:.6f}<br>latency {r.latency_ms:.3f} ms<br>"
                f"{c.subgraphs} subgraph(s), {c.cpu_nodes} CPU, {c.int16_nodes} int16<br>"
                f"{html.escape(r.calibration)}" + (f"<br>{html.escape(r.plan)}" if r.plan else ""))

    def scatter(sel: list[results.Row], **kw):
        return go.Scatter(x=[r.latency_ms for r in sel], y=[y(r.accuracy) for r in sel],
                          hovertext=[hover(r) for r in sel], hoverinfo="text", **kw)

    groups = [("other trials", [r for r in rs if r.feasible and r.number not in on_front and not _is_baseline(r)],
               dict(color="#9aa5b1", size=6)),
              ("infeasible", [r for r in rs if not r.feasible and not _is_baseline(r)],
               dict(color="#c3c9d0", size=6, symbol="x")),
              ("baselines (all-BPU int8)", [r for r in rs if _is_baseline(r)],
               dict(color="#d1495b", size=11, symbol="diamond", line=dict(width=1, color="#222")))]
    for name, sel, marker in groups:
        if sel:
            fig.add_trace(scatter(sel, mode="markers", name=name, marker=marker))
    if front:
        fig.add_trace(scatter(front, mode="lines+markers", line=dict(shape="hv", color="#2e86ab"),
                              marker=dict(size=9, color="#2e86ab"), name="Pareto front"))
    if best is not None:
        fig.add_trace(scatter([best], mode="markers", name=f"exported (trial {best.number})",
                              marker=dict(size=18, symbol="star", color="#f4a259", line=dict(width=1, color="#222"))))
    # (row, real latency, real accuracy) of each trial with a real accuracy
    verified = [(r, rec.latency_ms if rec.latency_ms is not None else r.latency_ms, rec.accuracy, rec.accuracy_source)
                for r in rs if real and (rec := real.get(r.number)) is not None and rec.accuracy is not None]
    if verified:
        xs: list[float | None] = []
        ys: list[float | None] = []
        for r, lat, acc, _ in verified:      # a segment from the simulated point to the real one
            xs += [r.latency_ms, lat, None]
            ys += [y(r.accuracy), y(acc), None]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color="#3b8b5a", dash="dot"),
                                 hoverinfo="skip", showlegend=False))
        fig.add_trace(go.Scatter(
            x=[lat for _, lat, _, _ in verified], y=[y(acc) for _, _, acc, _ in verified],
            mode="markers", name="real toolchain (tuner verify)",
            marker=dict(size=11, symbol="circle-open", color="#3b8b5a", line=dict(width=2)),
            hovertext=[f"trial {r.number}: real {acc:.6f} ({html.escape(str(src))})<br>simulated {r.accuracy:.6f}"
                       for r, _, acc, src in verified], hoverinfo="text"))
    if min_accuracy is not None:
        fig.add_hline(y=y(float(min_accuracy)), line_dash="dot", line_color="#d1495b",
                      annotation_text=f"min_accuracy {min_accuracy}", annotation_position="top right")
    fig.update_layout(title="Accuracy vs modeled latency", xaxis_title="modeled latency (ms)",
                      yaxis_title="1 - accuracy (log; lower is better)" if log else "accuracy",
                      yaxis_type="log" if log else "linear", yaxis_exponentformat="e", height=460, margin=dict(l=60, r=20, t=50, b=50),
                      legend=dict(orientation="h", y=-0.18))
    return fig


def history_figure(study: optuna.Study, mode: str):
    from optuna.visualization import plot_optimization_history

    if len(study.directions) > 1:
        fig = plot_optimization_history(study, target=lambda t: t.values[0], target_name="accuracy")
    else:
        fig = plot_optimization_history(study, target_name="latency (ms)" if mode == "latency" else "accuracy")
    fig.update_layout(height=420, margin=dict(l=60, r=20, t=50, b=50))
    return fig


def importance_figure(study: optuna.Study, mode: str):
    from optuna.importance import PedAnovaImportanceEvaluator
    from optuna.visualization import plot_param_importances

    # PED-ANOVA: fast and needs no scikit-learn (fANOVA's random forest does).
    # It ranks by what drives the target *low*: accuracy is negated.
    kwargs: dict[str, Any] = {"evaluator": PedAnovaImportanceEvaluator()}
    if len(study.directions) > 1 or mode != "latency":
        kwargs.update(target=lambda t: -t.values[0], target_name="accuracy")
    # PED-ANOVA warns on every call with a target that it ranks by low values (accuracy is negated
    # above), and while there are too few trials. Filters for those messages, not
    # warnings.catch_warnings() around the call: the search draws the report in a thread of its
    # own, and catch_warnings swaps the process-wide filters under the trial loop's feet
    # (filterwarnings of an existing filter adds no second one).
    for message in ("PedAnovaImportanceEvaluator computes the importances", "The number of trials is too small"):
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
    fig = plot_param_importances(study, **kwargs)
    fig.update_layout(height=max(300, 22 * len(fig.data[0].y) + 120) if fig.data else 300,
                      margin=dict(l=220, r=20, t=50, b=50))
    return fig


def sensitivity_figure(sensitivity: dict[str, float], top: int = 20):
    """Top nodes by the gain of their best fix (CPU or int16, tuner.sensitivity). One node often dominates by orders of magnitude, so
    the axis is logarithmic when the shown gains are positive and span more than 100x."""
    import plotly.graph_objects as go

    ranked = sorted(sensitivity.items(), key=lambda kv: -kv[1])[:top][::-1]
    values = [v for _, v in ranked]
    log = bool(values) and min(values) > 0 and max(values) / min(values) > 100
    fig = go.Figure(go.Bar(x=values, y=[k for k, _ in ranked], orientation="h", marker_color="#d1495b",
                           text=[f"{v:+.2e}" for v in values], textposition="outside", cliponaxis=False))
    fig.update_layout(title=f"Accuracy gained by the best fix of the node alone, CPU or int16 (top {len(ranked)})",
                      xaxis_title="accuracy gain" + (" (log)" if log else ""), xaxis_type="log" if log else "linear",
                      xaxis_exponentformat="e", height=max(300, 24 * len(ranked) + 110),
                      margin=dict(l=220, r=70, t=50, b=50))
    return fig


def trace_figure(traces: list[Trace]):
    """1 - cosine on a log axis along the graph: a drop at a CPU/BPU switch stands out."""
    import plotly.graph_objects as go

    fig = go.Figure()
    colors = ["#2e86ab", "#d1495b", "#3b8b5a"]
    for i, tr in enumerate(traces):
        pts = [(k, n) for k, n in enumerate(tr.nodes) if n["cosine"] is not None]
        fig.add_trace(go.Scatter(
            x=[k for k, _ in pts], y=[max(1.0 - n["cosine"], 1e-9) for _, n in pts], mode="lines+markers",
            name=tr.label, line=dict(color=colors[i % len(colors)]), marker=dict(size=5),
            hovertext=[f"{html.escape(n['name'])} ({n['op_type']}, {n['on']})<br>cosine {n['cosine']:.6f}"
                       for _, n in pts], hoverinfo="text"))
    if traces:
        # All shapes in one layout update: add_vrect/add_vline one by one re-validate every shape
        # added before (quadratic: ~55 s for the ~400 shapes of a 464-node model).
        first = traces[0]
        shapes = [dict(type="rect", xref="x", yref="paper", x0=k - 0.5, x1=k + 0.5, y0=0, y1=1, fillcolor="#f4a259",
                       opacity=0.25, line_width=0, layer="below")
                  for k, n in enumerate(first.nodes) if n["on"] == "CPU"]   # CPU nodes of the first trace shaded
        shapes += [dict(type="line", xref="x", yref="paper", x0=k - 0.5, x1=k - 0.5, y0=0, y1=1,
                        line=dict(dash="dot", color="#888", width=1))
                   for k in range(1, len(first.nodes)) if first.nodes[k]["on"] != first.nodes[k - 1]["on"]]
        fig.update_layout(shapes=shapes)
    fig.update_layout(title="Per-node error along the graph (1 - cosine, log; shaded: CPU nodes of "
                      f"{traces[0].label if traces else ''})", xaxis_title="node (topological order)",
                      yaxis_title="1 - cosine", yaxis_type="log", yaxis_exponentformat="e", height=440, margin=dict(l=60, r=20, t=50, b=50),
                      legend=dict(orientation="h", y=-0.2))
    return fig


# ------------------------------------------------------------------------------ page
