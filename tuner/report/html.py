"""``results/<study>/report.html``: one self-contained page that shows where accuracy is lost
and what the search did about it.

Plotly's JavaScript is embedded once, so the file opens offline and can be mailed. The
optimization history and parameter importances come from Optuna's visualization module;
the Pareto plot is drawn here because it marks the baselines and the exported trial, and
works for single-objective studies too. :func:`render` is a pure function of a
:class:`~tuner.study.outputs.ReportSnapshot` (gathered by :func:`tuner.study.outputs.snapshot`),
so it is tested without a run. The page records in ``#tuner-status`` how many
plots drew and which script errors happened, so a headless browser test can check it.
"""

from __future__ import annotations

import datetime as _dt
import html
import math
from collections.abc import Container
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner import __version__
from tuner.export.hb_yaml import write_atomic
from tuner.report.figures import (  # benchmarks/report_time.py times them from here
    _is_baseline,
    history_figure,
    importance_figure,
    pareto_figure,
    sensitivity_figure,
    trace_figure,
)
from tuner.study import results
from tuner.study.record import TrialRecord, binding
from tuner.study.results import ReportSnapshot, Row, Trace
from tuner.toolchain.records import RealRecord

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2430;background:#f6f7f9}
header{background:#1d2430;color:#fff;padding:18px 28px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;color:#c9d1dc;font-size:13px}
main{padding:12px 28px 40px;max-width:1500px}
section{background:#fff;border:1px solid #e1e5ea;border-radius:6px;margin:16px 0;padding:14px 18px}
h2{font-size:17px;margin:0 0 8px}p.why{color:#5a6472;font-size:13px;margin:0 0 8px}
table{border-collapse:collapse;font-size:13px}td,th{border-bottom:1px solid #e6e9ee;padding:3px 10px;text-align:left}
th{background:#f0f2f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.best td{background:#fff4d6;font-weight:600}
pre{background:#f0f2f5;padding:10px;overflow:auto;font-size:12px;max-height:480px}
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{border:1px solid #e1e5ea;border-radius:6px;padding:8px 14px;min-width:130px}
.card b{display:block;font-size:20px}.card span{color:#5a6472;font-size:12px}
.note{color:#8a5a00;font-size:13px}.grid{display:grid;grid-template-columns:1fr 1fr;gap:12px}
@media (max-width:1100px){.grid{grid-template-columns:1fr}}
"""

_STATUS_JS = """
window.__tunerErrors = [];
window.addEventListener('error', function (e) { window.__tunerErrors.push(String(e.message || e)); });
window.addEventListener('load', function () {
  var plots = document.querySelectorAll('.js-plotly-plot');
  var drawn = 0;
  plots.forEach(function (p) { if (p._fullLayout && p.querySelector('svg.main-svg')) { drawn += 1; } });
  var s = document.getElementById('tuner-status');
  s.setAttribute('data-drawn', String(drawn));
  s.setAttribute('data-errors', window.__tunerErrors.join(' | '));
  s.setAttribute('data-done', '1');
});
"""




def _table(headers: list[str], rows: list[list[str]], numeric: frozenset[int] | set[int] = frozenset(),
           highlight: int | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for i, r in enumerate(rows):
        cls = ' class="best"' if highlight is not None and i == highlight else ""
        body.append(f"<tr{cls}>" + "".join(f'<td class="num">{html.escape(c)}</td>' if j in numeric
                                          else f"<td>{html.escape(c)}</td>" for j, c in enumerate(r)) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def node_info_rows(record: TrialRecord) -> list[list[str]]:
    """The chosen node_info as rows: node, ON, InputType (incl. per-input), OutputType."""
    node_info = record.node_info
    rows = []
    for name, d in sorted(node_info.items()):
        inputs = [f"{k}: {v}" for k, v in sorted(d.items()) if k.startswith("InputType")]
        rows.append([name, d.get("ON", ""), ", ".join(inputs), d.get("OutputType", "")])
    return rows


def simplest_html(s: results.Simplest) -> str:
    """best.yaml's decisions, what best_minimal.yaml keeps (each one's contribution), the one-line fixes."""
    t = s.trim
    st, m = t.start, t.minimal
    out = (f"<p>best.yaml (trial {t.trial}): {st.counts.cpu_nodes} CPU and {st.counts.int16_nodes} int16 node(s), "
           f"calibration {html.escape(st.calibration.method)}: <b>{t.decisions}</b> decision(s) away from the base "
           f"YAML; accuracy {st.accuracy:.6f}, {st.latency_ms:.3f} ms.</p>"
           f"<p>best_minimal.yaml keeps <b>{len(t.kept)}</b> of them and still meets {html.escape(t.criterion)}: "
           f"accuracy {m.accuracy:.6f}, {m.latency_ms:.3f} ms, {m.counts.cpu_nodes} CPU, {m.counts.int16_nodes} int16 "
           f"({t.scored} candidate(s) scored).</p>")
    if t.kept:
        out += _table(["kept decision", "accuracy without it", "latency it costs (ms)"],
                      [[k.change.describe(), "fails" if math.isinf(k.accuracy_drop) else f"-{k.accuracy_drop:.6f}",
                        f"{k.latency_ms:+.3f}"] for k in t.kept], {1, 2})
    if t.removed:
        out += ("<p>not needed: " + html.escape("; ".join(c.describe() for c in t.removed)) + "</p>")
    if s.fixes:
        task = list(dict.fromkeys(k for f in s.fixes for k in f.record.task))
        out += "<h3>One-line fixes (calibration only, nodes as in the base YAML)</h3>"
        out += _table(["change", "trial", "accuracy", "latency ms", *task, "meets the floor"],
                      [[f.change, str(f.trial), f"{f.record.accuracy:.6f}", f"{f.record.latency_ms:.3f}",
                        *(f"{f.record.task[k]:.4f}" if k in f.record.task else "" for k in task),
                        "yes" if f.feasible else f"no ({f.below:.2g} below)" if f.below is not None else "no"]
                       for f in s.fixes],
                      set(range(1, 4 + len(task))), 0 if s.fixes[0].feasible else None)
    return out


def verification_html(real: dict[int, RealRecord]) -> str:
    """A table of verified trials, then each attached log's side-by-side comparison."""
    def f(v: Any, digits: int = 6, sign: bool = False) -> str:
        if not isinstance(v, (int, float)) or not math.isfinite(v):
            return "--"
        return f"{v:+.{digits}f}" if sign else f"{v:.{digits}f}"

    rows, details = [], []
    for number, rec in real.items():
        cmp = rec.comparison
        acc, sim = rec.accuracy, rec.sim_accuracy
        rows.append([str(number), rec.status, f(sim), f(acc),
                     f(acc - sim, sign=True) if acc is not None and sim is not None else "--",
                     f(cmp.output_cosine_gap if cmp else None, sign=True), f(cmp.spearman if cmp else None, 3),
                     str(len(cmp.int16_refused)) if cmp else "--", str(len(cmp.placement_differs)) if cmp else "--",
                     (rec.error or "")[:120]])
        if cmp is not None:
            details.append(f"<details><summary>trial {number}: per-node comparison</summary>"
                           f"<pre>{html.escape(cmp.text())}</pre></details>")
    return _table(["trial", "status", "simulated acc", "real acc", "real - sim", "output cosine gap",
                   "rank corr. (nodes)", "int16 refused", "placement differs", "error"], rows,
                  {2, 3, 4, 5, 6, 7, 8}) + "".join(details)


def split_html(traces: list[Trace]) -> str:
    """The loss split of the traced candidates (Trace.split), one table; "" when none has one."""
    rows = []
    for tr in traces:
        for out, parts in (tr.split or {}).items():
            rows.append([tr.label, out] + [f"{parts[k][m]:.6f}" if m == "cosine" else f"{parts[k][m]:.2f}"
                                           for k in ("input_path", "network", "both") for m in ("cosine", "sqnr_db")])
    if not rows:
        return ""
    heads = ["candidate", "output"] + [f"{m} ({k})" for k in ("input path alone", "network alone", "both")
                                       for m in ("cosine", "SQNR dB")]
    return _table(heads, rows, set(range(2, 8)))


def _fig_html(fig, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


class _ReadOnlyStudy(optuna.Study):
    """A study the report only reads: its trials are handed out without a deep copy.

    Optuna's importance plot reads ``study.trials`` (a deep copy of every trial) once per
    parameter for its hover text: parameters x trials x trial size. On PP-OCRv4 det (253 node
    decisions, 11 trials) the page took 4.7 s, nearly all of it in those copies; 0.2 s without."""

    def get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        return super().get_trials(deepcopy=False, states=states)


def _study_of(snap: ReportSnapshot) -> optuna.Study:
    """An in-memory study holding the snapshot's trials, for Optuna's own plots."""
    storage = optuna.storages.InMemoryStorage()
    storage.create_new_study([optuna.study.StudyDirection[d.upper()] for d in snap.directions], snap.name)
    study = _ReadOnlyStudy(study_name=snap.name, storage=storage)
    study.add_trials(snap.trials)
    return study


class _Page:
    """The report's sections, in order, and the notes shown above them."""

    def __init__(self, snap: ReportSnapshot):
        self.snap = snap
        self.sections: list[str] = []
        self.notes = list(snap.notes)

    def section(self, title: str, body: str, why: str = "") -> None:
        self.sections.append(f"<section><h2>{html.escape(title)}</h2>"
                             + (f'<p class="why">{html.escape(why)}</p>' if why else "") + body + "</section>")

    @staticmethod
    def plot(fig_fn: Any, div_id: str, *args: Any) -> str:
        try:
            return _fig_html(fig_fn(*args), div_id)
        except Exception as exc:  # too few trials for importances, a single-valued parameter, ...
            return f'<p class="note">{html.escape(div_id)}: not available yet ({html.escape(str(exc))})</p>'


def render(snap: ReportSnapshot) -> str:
    """The whole page as one string."""
    info = snap.info
    rs = snap.rows
    best = (next((r for r in rs if r.number == snap.best_number), None) if snap.best_number is not None
            else results.best(rs, info.mode, info.objectives.floor))
    front = results.pareto(rs)
    page = _Page(snap)
    _summary(page, best, front)
    if rs:
        _front_sections(page, best, front)
    else:
        page.notes.append("no completed trial yet")
    if snap.sensitivity:
        page.section("Node sensitivity", page.plot(sensitivity_figure, "sensitivity", snap.sensitivity),
                     "How much accuracy each node's int8 quantization costs: the gain when that node alone stays "
                     "float.")
    if snap.traces:
        page.section("Accumulated error along the graph", page.plot(trace_figure, "trace", snap.traces),
                     "Per-node output cosine against the float model, in topological order. Where the curve jumps, "
                     "error enters; dotted lines mark CPU/BPU switches of the first curve.")
    split = split_html(snap.traces)
    if split:
        page.section("Input path and network", split,
                     "The YAML's input_type_rt puts the board's input path (colour conversion, 4:2:0 chroma, int8 "
                     "preprocess weights) in front of the network. Per output: the float model fed the path's values "
                     "against the float model on the float mean/scale (the input path alone), the quantized network "
                     "against the float one on the path's values (the network alone), and both (the trial's figure). "
                     "A loss the input path explains cannot be won back by quantization settings.")
    if best is not None:
        _chosen(page, best)
    if snap.best_yaml is not None:
        page.section("Exported YAML (best.yaml)", f"<pre>{html.escape(snap.best_yaml)}</pre>")
    if snap.real:
        page.section("Simulation vs the real toolchain", verification_html(snap.real),
                     "Trials checked with 'tuner verify' or an imported hb_mapper log: the real figures next to the "
                     "simulated ones, and per node where a log was attached.")
    prov = [["study", snap.name], ["storage", snap.storage], ["march", str(info.march or "?")],
            ["tuner", info.version]] + [[f"{k} sha256", v] for k, v in info.fingerprints.items()]
    page.section("Provenance", _table(["", ""], prov))
    if page.notes:
        page.sections.insert(0, "<section>" + "".join(f'<p class="note">{html.escape(n)}</p>' for n in page.notes)
                             + "</section>")
    return _document(snap, page.sections)


def _summary(page: _Page, best: Row | None, front: list[Row]) -> None:
    """The summary cards: trial counts, the exported trial's figures, the best all-int8 baseline."""
    rs = page.snap.rows
    n_fail = sum(t.state == optuna.trial.TrialState.FAIL for t in page.snap.trials)
    cards = [("completed trials", str(len(rs))), ("failed", str(n_fail)), ("on the Pareto front", str(len(front)))]
    if best is not None:
        c = best.counts
        cards += [("exported trial", str(best.number)), ("accuracy", f"{best.accuracy:.6f}"),
                  ("modeled latency", f"{best.latency_ms:.3f} ms"), ("BPU subgraphs", str(c.subgraphs)),
                  ("CPU nodes", str(c.cpu_nodes)), ("int16 nodes", str(c.int16_nodes))]
    base = [r for r in rs if _is_baseline(r)]
    if base:
        top = max(base, key=lambda r: r.accuracy)
        cards.append(("best all-int8 baseline", f"{top.accuracy:.6f}"))
    page.section("Summary", '<div class="cards">' + "".join(f"<div class=\"card\"><b>{html.escape(v)}</b>"
                                                            f"<span>{html.escape(k)}</span></div>" for k, v in cards)
                 + "</div>")


def _front_sections(page: _Page, best: Row | None, front: list[Row]) -> None:
    """The Pareto front (plot and table), the constraints' margins, the closest trial when none is
    feasible, the simplest fix and the search's history."""
    snap, rs, objectives = page.snap, page.snap.rows, page.snap.info.objectives
    page.section("Pareto front", page.plot(pareto_figure, "pareto", rs, best, objectives.min_accuracy, snap.real),
                 "Every completed trial; the red diamonds are hb_mapper's defaults (all nodes BPU int8), the star "
                 "is the trial best.yaml holds.")
    headers, table_rows = results.front_table(front, best, snap.validations, objectives)
    hi = next((i for i, r in enumerate(front) if best is not None and r.number == best.number), None)
    for cells in table_rows:
        cells[0] = cells[0].lstrip("* ")
    page.sections[-1] = page.sections[-1][:-len("</section>")] + _table(
        headers, table_rows, set(range(1, headers.index("calibration"))), hi) + "</section>"
    if snap.validations and best is not None:
        v = snap.validations.get(best.number)
        if v is not None:
            page.notes.append(f"validation: the front and the best re-scored on {v.samples} sample(s) the search did "
                              f"not select on ({v.metric}); best.yaml holds trial {best.number}")
    if snap.held_out is not None and snap.held_out.lines():
        page.section("Held-out check", "<ul>" + "".join(f"<li>{html.escape(t)}</li>" for t in snap.held_out.lines())
                     + "</ul>", "The constraints judged on the validation data, which the search did not select on.")
        page.notes.append(snap.held_out.lines()[0])
    ms = results.margins(best, objectives) if best is not None else []
    if best is not None and ms:
        bind = binding(ms)
        page.section("Constraints", _table(
            ["constraint", "limit", f"trial {best.number}", "margin", ""],
            [[m.name, "--" if m.limit is None else f"{m.limit:.6g}", "--" if m.value is None else f"{m.value:.6g}",
              f"{m.margin:+.4g}", "binds" if m is bind and len(ms) > 1 else ""] for m in ms], {1, 2, 3}),
            "Every constraint of the space for the exported trial: its limit (relative ones: times the float "
            "model's value on the evaluation data), the trial's value and the margin (> 0: met).")
    if not front:
        found = results.closest(rs, objectives)
        if found is not None:
            headers2, rows2 = results.front_table(results.front_of_all(rs), found.row, snap.validations, objectives)
            page.section("No trial meets the constraints", f"<p>closest: {html.escape(found.text())} "
                         "(results/&lt;study&gt;/closest.yaml)</p>" + _table(headers2, rows2, set())
                         + "<ul>" + "".join(f"<li>{html.escape(t)}</li>"
                                            for t in results.next_steps(found, snap.name)) + "</ul>",
                         "The Pareto front of all trials, none feasible, the closest marked; and what to try next.")
    if snap.simplest is not None:
        page.section("The simplest fix", simplest_html(snap.simplest),
                     "best.yaml is the cheapest feasible trial, with every decision the sampler made on the way. "
                     "best_minimal.yaml reverts them one at a time (most modeled latency saved first, calibration "
                     "last) while the floor holds; the one-line fixes change only the base YAML's calibration.")
    _search(page)


def _search(page: _Page) -> None:
    """Optuna's history and PED-ANOVA importance plots of the snapshot's trials."""
    study = _study_of(page.snap)
    why = "Optimization history (accuracy per trial and best so far) and which knobs mattered (PED-ANOVA)."
    if page.snap.simplest is not None:
        why += (" PED-ANOVA ranks a knob by how it separates the best trials from the rest; a knob whose effect "
                "shows in the warm-start baselines but that every good trial shares ranks low even when it is "
                "the fix: the accuracy each kept decision contributes (above, 'The simplest fix') is the direct "
                "measure.")
    mode = page.snap.info.mode
    page.section("Search", '<div class="grid">' + page.plot(history_figure, "history", study, mode)
                 + page.plot(importance_figure, "importances", study, mode) + "</div>", why)


def _chosen(page: _Page, best: Row) -> None:
    """The exported trial's node_info, calibration and task metrics."""
    rows = node_info_rows(best.trial_record)
    body = (_table(["node", "ON", "InputType", "OutputType"], rows) if rows
            else "<p>no node_info: every node keeps hb_mapper's default placement and int8</p>")
    body += (f"<p>calibration: <b>{html.escape(best.calibration)}</b>"
             f" (requested {html.escape(best.trial_record.calibration.requested)})</p>")
    task = best.trial_record.task
    if task:
        body += _table(["task metric", "value"], [[k, f"{v:.6f}"] for k, v in task.items()], {1})
    page.section(f"Chosen configuration (trial {best.number})", body)


def _document(snap: ReportSnapshot, sections: list[str]) -> str:
    """The HTML document around the sections (styles, status script, plotly inline)."""
    from plotly.offline import get_plotlyjs

    info = snap.info
    now = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    title = f"tuner study {snap.name}"
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style><script>{_STATUS_JS}</script>"
            f"<script type=\"text/javascript\">{get_plotlyjs()}</script></head><body>"
            f"<header><h1>{html.escape(title)}</h1><p>mode {html.escape(info.mode)}, march "
            f"{html.escape(str(info.march or '?'))}; written {now} by tuner {__version__}</p></header>"
            f"<main><div id=\"tuner-status\" data-done=\"0\"></div>{''.join(sections)}</main></body></html>")


def write_report(path: Path, snap: ReportSnapshot) -> Path:
    write_atomic(path, render(snap))
    return path


__all__ = ["ReportSnapshot", "Trace", "render", "write_report", "node_info_rows"]
