"""What report.html costs on a real model, against what one trial costs, and what the search waits for.

    python benchmarks/report_time.py [--trials N] [--top-k K] [--out results/benchmarks]

Not a test: it prints a markdown table and writes it to ``results/benchmarks/report_time.md``.
The model is PP-OCRv4's text detector from ``rapidocr-onnxruntime`` (BN folded as hb_mapper
does), on the scikit-image photographs of ``tests/ppocr.py``, searched over every BPU node
(``--top-k`` to narrow it) with the calibration knobs, warm start on (so the node-sensitivity
bars are drawn too). After a small real study (``--trials``, run without a report) it times:

* one trial (the median of the trials' own ``seconds``): the baseline the other figures are
  divided by;
* the report's parts: the snapshot's study reads, the per-node traces (two evaluations with
  every node's output: the exported trial and the all-int8 baseline), the page (``render``)
  and each of its figures;
* the page drawn the old way, Optuna's plots on a study that deep-copies its trials
  (``optuna.create_study``), measured in the same run;
* what the search waits for: ``ReportFile.after_trial`` mid-run (the snapshot only; the page is
  drawn in a thread of its own, timed apart) and ``finish`` (the full report, traces not cached);
* the page at the size of the issue's 464-node model: the traces repeated to 464+ nodes.

Times are wall clock on a machine shared with other jobs: compare the ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # tests/ppocr.py: the detector's project, shared with the tests


def timed(fn, repeat: int = 1):
    """(median seconds, last result)."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def write_space(root: Path, top_k: int | None) -> Path:
    import yaml
    from ppocr import write_ppocr_project

    cfg = write_ppocr_project(root / "project", fold=True)
    space = root / "search.yaml"
    nodes: dict = {"select": "bpu"} | ({"top_k": top_k} if top_k else {})
    space.write_text(yaml.safe_dump({
        "base": str(cfg), "nodes": nodes,
        "calibration": {"calibration_type": ["max", "kl"], "max_percentile": [1.0, 0.9999], "per_channel": [False, True]},
        "objectives": {"mode": "pareto", "accuracy": "mean_cosine"},
        "study": {"name": "ppocr_det", "sampler": "tpe", "warm_start": True}}, sort_keys=False), encoding="utf-8")
    return space


def bench(root: Path, n_trials: int, top_k: int | None, repeat: int) -> list[str]:
    import onnx
    import optuna

    import tuner.report.html as report_html
    from tuner.study.loop import run
    from tuner.study.outputs import snapshot
    from tuner.study.record import TrialRecord
    from tuner.study.results import Trace
    from tuner.study.session import StudySession

    space = write_space(root, top_k)
    raw_nodes = len(onnx.load(str(root / "project" / "ch_PP-OCRv4_det_infer.onnx"), load_external_data=False).graph.node)
    open_s, search = timed(lambda: StudySession.open(space, results_dir=root / "results", quiet=True))
    search_s, (study, _) = timed(lambda: run(search, n_trials=n_trials, timeout=None, jobs=1, seed=0, progress=False,
                                             outputs=[search.result_files]))
    recs = [r for t in study.get_trials(deepcopy=False) if (r := TrialRecord.of_trial(t)) is not None
            and r.duplicate_of is None]
    trial_s = statistics.median(r.seconds for r in recs)
    n_all = len(study.get_trials(deepcopy=False))

    snap_s, snap = timed(lambda: snapshot(study, search.place.paths, "x", search.problem.sensitivity), repeat)
    traces_s, traces = timed(lambda: search.report_source.draw_traces(snap.rows)[0])   # two per-node evaluations (first: not cached)
    snap.traces = traces
    render_s, page = timed(lambda: report_html.render(snap), repeat)

    # Each figure alone (the page is these plus fixed HTML and Plotly's 4.6 MB script).
    study_s, mem = timed(lambda: report_html._study_of(snap), repeat)
    rs, info = snap.rows, snap.info
    best = report_html.results.best(rs, info.mode, info.objectives.min_accuracy)
    figures = {
        "pareto": lambda: report_html.pareto_figure(rs, best, info.objectives.min_accuracy, snap.real),
        "history": lambda: report_html.history_figure(mem, info.mode),
        "importances": lambda: report_html.importance_figure(mem, info.mode),
        "sensitivity": lambda: report_html.sensitivity_figure(snap.sensitivity),
        "trace": lambda: report_html.trace_figure(snap.traces),
    }
    fig_s = {k: timed(lambda f=f, k=k: report_html._fig_html(f(), k), repeat)[0] for k, f in figures.items()}

    # The old way, same run: Optuna's plots on a study that deep-copies its trials on every read.
    new_study_of = report_html._study_of

    def deep_copying(s):
        st = optuna.create_study(study_name=s.name, directions=s.directions)
        st.add_trials(s.trials)
        return st

    report_html._study_of = deep_copying
    try:
        old_render_s, _ = timed(lambda: report_html.render(snap))
    finally:
        report_html._study_of = new_study_of

    # What the search waits for. Mid-run: the snapshot without simulating, the page in a thread.
    rf = search.report_file
    last = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE][-1]
    def forget_traces() -> None:   # the per-node evaluations the scorer keeps
        sc = search.scorer
        sc._cache.update({k: dataclasses.replace(e, per_node=None) for k, e in sc._cache.items()})

    forget_traces()                           # as in a search: no trace evaluated yet
    t0 = time.perf_counter()
    rf.after_trial(study, last)
    after_trial_s = time.perf_counter() - t0
    rf.join()
    mid_draw_s = time.perf_counter() - t0
    mid_page = search.place.paths.report.read_text(encoding="utf-8")
    forget_traces()
    finish_s, _ = timed(lambda: rf.finish(study))   # the full report, traces evaluated: end of search, Ctrl-C
    trace_drawn = 'id="trace"' in search.place.paths.report.read_text(encoding="utf-8")

    # The page at the issue's size: the traces' nodes repeated until there are 464 or more.
    k = -(-464 // len(traces[0].nodes))
    big = [Trace(t.label, t.trial, [dict(n, name=f"{n['name']}#{i}") for i in range(k) for n in t.nodes]) for t in traces]
    snap.traces = big
    big_render_s, _ = timed(lambda: report_html.render(snap), repeat)
    big_trace_s, _ = timed(lambda: report_html._fig_html(report_html.trace_figure(big), "trace"), repeat)
    snap.traces = traces

    full_s = snap_s + traces_s + render_s
    n_nodes = len(search.problem.ws.graph)
    lines = [
        f"### PP-OCRv4 det: {raw_nodes} ONNX nodes, {n_nodes} after tuner's graph rewrites, "
        f"{len(search.problem.resolved.decisions)} node decisions",
        "",
        f"{len(search.problem.ws.eval_data)} evaluation samples at 1x3x256x320; study of {n_trials} trials ({n_all} created, "
        f"{len(recs)} simulated, the rest repeats); session open {open_s:.1f} s (statistics + node sensitivity), "
        f"search {search_s:.1f} s.",
        "",
        "| step | seconds | / one trial | note |",
        "|---|---|---|---|",
        f"| one trial (median of {len(recs)}) | {trial_s:.3f} | 1.0 | the baseline |",
        f"| snapshot: study reads | {snap_s:.4f} | {snap_s / trial_s:.3f} | rows, trials, real records, best.yaml |",
        f"| snapshot: per-node traces | {traces_s:.3f} | {traces_s / trial_s:.1f} | two evaluations with all "
        f"{n_nodes} node outputs on {len(search.problem.ws.eval_data)} samples |",
        f"| render (whole page) | {render_s:.3f} | {render_s / trial_s:.2f} | {len(page) / 1e6:.1f} MB |",
        f"| render, old (deep-copying study) | {old_render_s:.3f} | {old_render_s / trial_s:.1f} | same run; "
        f"{old_render_s / render_s:.0f}x the new |",
        f"| **full report** (snapshot + traces + render) | **{full_s:.3f}** | {full_s / trial_s:.1f} | target < 5 s |",
        f"| in-memory study for Optuna's plots | {study_s:.4f} | {study_s / trial_s:.3f} | |",
    ]
    lines += [f"| figure: {k} | {v:.4f} | {v / trial_s:.3f} | |" for k, v in fig_s.items()]
    lines += [
        f"| **search waits mid-run** (`after_trial`) | **{after_trial_s:.4f}** | {after_trial_s / trial_s:.3f} | "
        "snapshot only; the page is drawn in a thread |",
        f"| mid-run draw, in its thread | {mid_draw_s:.3f} | {mid_draw_s / trial_s:.2f} | no traces "
        f"(page says so: {'drawn at the end of the search' in mid_page}) |",
        f"| search waits at the end (`finish`) | {finish_s:.3f} | {finish_s / trial_s:.1f} | full report, traces "
        f"evaluated (drawn: {trace_drawn}) |",
        f"| render with traces of {len(big[0].nodes)} nodes | {big_render_s:.3f} | {big_render_s / trial_s:.2f} | "
        "the issue's 464-node size |",
        f"| figure: trace of {len(big[0].nodes)} nodes | {big_trace_s:.4f} | {big_trace_s / trial_s:.3f} | |",
        "",
        f"The full report is {full_s:.1f} s here, {traces_s / full_s:.0%} of it the two per-node trace "
        f"evaluations ({traces_s / 2:.2f} s each, {traces_s / 2 / trial_s:.1f} trials' worth: every node's output "
        "is fetched and compared with a float pass of its own). The search no longer waits for any of it mid-run; "
        "it waits once at the end (and `tuner report` draws it).",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=8, help="trials of the study (default 8)")
    p.add_argument("--top-k", type=int, default=None, help="search only the K most sensitive nodes (default: all)")
    p.add_argument("--repeat", type=int, default=3, help="runs per cheap timing, the median is shown (default 3)")
    p.add_argument("--out", default=str(REPO / "results" / "benchmarks"), help="folder of the markdown table")
    a = p.parse_args(argv)
    sys.path.insert(0, str(REPO / "tests"))
    from ppocr import det_model_path

    if det_model_path() is None:
        print("skipped: pip install --no-deps rapidocr-onnxruntime==1.4.4")
        return 0
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cmd = " ".join(["python benchmarks/report_time.py"] + (argv if argv is not None else sys.argv[1:]))
    out = ["# report.html: what it costs and what the search waits for", "",
           f"`{cmd}`; {os.cpu_count()} CPUs, load average at start {os.getloadavg()[0]:.1f} (shared machine: "
           "compare the ratios).", ""]
    with tempfile.TemporaryDirectory(prefix="report_time.") as tmp:
        os.environ["TUNER_CACHE_DIR"] = str(Path(tmp) / "cache")
        out += bench(Path(tmp), a.trials, a.top_k, a.repeat)
    text = "\n".join(out) + "\n"
    print(text)
    folder = Path(a.out)
    folder.mkdir(parents=True, exist_ok=True)
    from tuner.files import write_atomic

    path = folder / "report_time.md"
    write_atomic(path, text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
