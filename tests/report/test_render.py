"""report.html rendered from a hand-made snapshot: no run, no simulator, no storage."""

import json
from pathlib import Path

import optuna

from tuner.report.html import render
from tuner.study.outputs import ReportSnapshot, Trace
from tuner.study.record import RECORD, StudyInfo
from tuner.study.results import row

RECORDS = json.loads((Path(__file__).parents[1] / "study" / "fixtures" / "records_main_a8e95c4.json").read_text())


def snapshot(**kw):
    dists = {"x": optuna.distributions.CategoricalDistribution(["a", "b"])}
    study = optuna.create_study(directions=["maximize", "minimize"])    # only to number the trials
    for i, (name, plan) in enumerate((("original", "baseline: all-BPU int8, max"), ("node_info", None))):
        rec = RECORDS[name]
        study.add_trial(optuna.trial.create_trial(params={"x": "ab"[i]}, distributions=dists,
                                                  values=[rec["accuracy"], rec["latency"]["total_ms"]],
                                                  user_attrs={RECORD: rec, **({"plan": plan} if plan else {})}))
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL))
    trials = study.get_trials()
    info = StudyInfo.from_json({"mode": "pareto", "objectives": {"min_accuracy": None}, "march": "bayes-e",
                                "version": "test", "fingerprints": {"model": "ab12"}})
    base = dict(name="hand", info=info, storage="results/hand/study.journal", directions=["maximize", "minimize"],
                trials=trials, rows=[r for t in trials if t.state.name == "COMPLETE" and (r := row(t))])
    return ReportSnapshot(**{**base, **kw})


def test_render_shows_the_study_from_the_snapshot_alone():
    page = render(snapshot(sensitivity={"/stem/Conv": 0.1, "/res/Conv": 0.001},
                           traces=[Trace("trial 1 (exported)", 1, [
                               {"name": "/stem/Conv", "op_type": "Conv", "on": "BPU", "subgraph": 0, "cosine": 0.999},
                               {"name": "/res/Conv", "op_type": "Conv", "on": "CPU", "subgraph": None,
                                "cosine": 0.998}])],
                           best_yaml="model_parameters: {}\n", notes=["drawn by a test"]))
    assert "tuner study hand" in page and "drawn by a test" in page
    assert "Chosen configuration (trial 1)" in page and "/res/Conv" in page     # the node_info table
    for div in ("pareto", "history", "importances", "sensitivity", "trace"):
        assert f'id="{div}"' in page or f"{div}: not available yet" in page
    assert 'id="pareto"' in page and 'id="sensitivity"' in page and 'id="trace"' in page
    assert "<b>1</b><span>failed</span>" in page and "Exported YAML (best.yaml)" in page
    assert "results/hand/study.journal" in page and "ab12" in page


def test_an_empty_snapshot_renders_with_a_note():
    page = render(snapshot(trials=[], rows=[]))
    assert "no completed trial yet" in page and "<h2>Pareto front</h2>" not in page


def test_the_trace_shades_cpu_nodes_and_marks_switches_in_one_layout():
    """CPU nodes of the first trace are shaded and each CPU/BPU switch is a dotted line; they are
    given to Plotly as one shape list (one by one it took ~200 s for a 464-node model)."""
    from tuner.report.html import trace_figure
    from tuner.study.outputs import Trace

    on = ["BPU", "CPU", "CPU", "BPU", "CPU", "BPU"]
    nodes = [{"name": f"n{k}", "op_type": "Conv", "on": p, "cosine": 0.999} for k, p in enumerate(on)]
    fig = trace_figure([Trace(label="best", trial=3, nodes=nodes)])
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert sorted((r.x0 + r.x1) / 2 for r in rects) == [1, 2, 4]
    assert sorted(ln.x0 for ln in lines) == [0.5, 2.5, 3.5, 4.5]


def test_the_simplest_fix_section_and_the_front_table_columns():
    """best_minimal.yaml's kept decisions and the one-line fixes are shown; the Pareto table has the
    task metrics the trials record, and no plan column when no front row came from the warm start."""
    from dataclasses import replace

    from tuner.study.record import TrialRecord
    from tuner.study.results import Change, Fix, Kept, Simplest, TrimResult, front_table

    start = TrialRecord.from_json(RECORDS["node_info"])
    fix = TrialRecord.from_json(RECORDS["original"])
    trim = TrimResult(trial=1, start=start, minimal=start, params={}, criterion="mean_cosine >= 0.9999", scored=4,
                      kept=(Kept(Change("node:/Slice", "BPU:int16", "BPU", ("/Slice",)), 0.012, 0.05),),
                      removed=(Change("per_channel", True, False), Change("node:/a", "CPU", "BPU", ("/a",))))
    page = render(snapshot(simplest=Simplest(trim, (Fix("per_channel: True", 0, fix, True),))))
    assert "<h2>The simplest fix</h2>" in page and "/Slice: int16" in page and "-0.012000" in page
    assert "not needed: per_channel: True; /a: CPU" in page
    assert "One-line fixes" in page and "<td>per_channel: True</td>" in page
    assert "the direct measure" in page          # the importance plot's caveat

    rows = [r for t in snapshot().trials if t.state.name == "COMPLETE" and (r := row(t))]
    plain = [replace(r, plan=None, trial_record=replace(r.trial_record, task={"miou:seg": 0.75})) for r in rows]
    headers, cells = front_table(plain, plain[0])
    assert "plan" not in headers and "miou:seg" in headers and cells[0][0] == "*0"
    assert cells[0][headers.index("miou:seg")] == "0.7500"
    assert front_table(rows, None)[0][-1] == "plan"


def test_the_report_shows_the_loss_split_of_a_camera_input(tmp_path):
    """A trace evaluated on data with an input path carries the split (Trace.from_evaluation of a real
    simulation of the camera toy), and the page shows it; traces without one show no section."""
    from camera_toys import write_camera_project

    from tuner.workspace import Workspace

    ws = Workspace.open(write_camera_project(tmp_path / "cam"))
    ev = ws.simulator.evaluate(ws.base_candidate(), per_node=True, split=True)
    tr = Trace.from_evaluation("trial 1 (exported)", 1, ev)
    assert tr.split is not None and tr.split["out"]["both"]["cosine"] == ev.outputs["out"]["cosine"]
    page = render(snapshot(traces=[tr]))
    assert "Input path and network" in page and f"{tr.split['out']['input_path']['cosine']:.6f}" in page
    assert "Input path and network" not in render(snapshot(traces=[Trace("t", 1, tr.nodes)]))
