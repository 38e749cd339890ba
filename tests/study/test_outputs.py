"""Pareto front, best trial and trials.csv on hand-made rows; report.html drawn beside the trial loop."""

import csv
import io
import re
import threading
import time

from helpers import write_tiny_space
from optuna.trial import TrialState

from tuner.study.loop import run
from tuner.study.outputs import trials_csv
from tuner.study.record import CalibrationUsed, Counts, Latency, TrialRecord
from tuner.study.results import Row, best, pareto
from tuner.study.session import StudySession


def row(number, acc, lat, feasible=True, plan=None, task=None):
    rec = TrialRecord(key=f"k{number}", accuracy=acc, outputs={}, task=task or {},
                      latency=Latency(lat, lat, 0.0, 0.0, 1, 0), counts=Counts(1, 0, number % 3),
                      calibration=CalibrationUsed("max", "max"), candidate_fields={}, cpu_nodes=(), notes=(),
                      seconds=0.01)
    return Row(number=number, trial_record=rec, feasible=feasible, plan=plan)


ROWS = [row(0, 0.90, 1.0, plan="baseline: all-BPU int8, max"), row(1, 0.95, 2.0), row(2, 0.94, 2.5),
        row(3, 0.99, 4.0), row(4, 0.999, 3.0, feasible=False), row(5, 0.95, 2.0), row(6, 0.97, 3.5)]


def test_the_front_is_feasible_non_dominated_and_sorted_by_latency():
    assert [r.number for r in pareto(ROWS)] == [0, 1, 6, 3]     # 2 dominated by 1, 5 ties 1 (first kept), 4 infeasible
    assert pareto([]) == [] and pareto([row(0, 1.0, 1.0, feasible=False)]) == []


def test_best_most_accurate_without_a_floor_cheapest_feasible_with_one():
    assert best(ROWS, "pareto", None).number == 3
    assert best(ROWS, "accuracy", None).number == 3
    assert best(ROWS, "pareto", 0.95).number == 0         # all rows are feasible by their own flag here
    assert best(ROWS, "latency", 0.95).number == 0
    assert best([r for r in ROWS if r.number != 0], "latency", 0.95).number == 1   # ties on latency: lower number
    assert best([row(0, 0.9, 1.0, feasible=False)], "pareto", None) is None


def test_trials_csv_lists_every_row_with_its_task_metrics():
    rs = [row(1, 0.95, 2.0, task={"miou:seg": 0.5}), row(0, 0.9, 1.0, plan="baseline: all-BPU int8, max")]
    table = list(csv.reader(io.StringIO(trials_csv(rs))))
    assert table[0] == ["trial", "accuracy", "latency_ms", "feasible", "subgraphs", "cpu_nodes", "int16_nodes",
                        "miou:seg", "calibration", "plan"]
    assert [t[0] for t in table[1:]] == ["0", "1"]
    assert table[1][7] == "" and table[2][7] == "0.500000" and table[1][-1] == "baseline: all-BPU int8, max"


# ------------------------------------------------------------------ report.html during the search
class Renderer:
    """The real renderer behind a gate: a draw starts, then waits (up to ``hold`` s) for ``release``;
    records how many draws ran at once, whether each was released or gave up waiting, and when
    each ran."""

    def __init__(self, hold: float = 5.0, fail_first: bool = False):
        from tuner.report.html import render

        self.render, self.hold, self.fail_first = render, hold, fail_first
        self.release = threading.Event()
        self.started = threading.Event()
        self.lock = threading.Lock()
        self.running = self.most = 0
        self.calls: list[dict] = []     # {"released": bool, "start": s, "end": s, "thread": name}

    def __call__(self, snap):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        call = {"start": time.time(), "thread": threading.current_thread().name}
        self.started.set()
        try:
            call["released"] = self.release.wait(self.hold)
            if self.fail_first and len(self.calls) == 0:
                raise RuntimeError("plotly fell over")
            return self.render(snap)
        finally:
            call["end"] = time.time()
            self.calls.append(call)
            with self.lock:
                self.running -= 1


def tiny_session(tmp_path, renderer, n_trials=3):
    space = write_tiny_space(tmp_path)
    search = StudySession.open(space, results_dir=tmp_path / "results", quiet=True, render=renderer)
    study, _ = run(search, n_trials=n_trials, timeout=None, jobs=1, seed=3, progress=False,
                   outputs=[search.result_files])          # trials without a report yet
    return search, study


def completed(study):
    return [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]


def plots(page):
    return re.findall(r'<div id="([a-z]+)" class="plotly-graph-div"', page)


def test_a_trial_does_not_wait_for_the_report_and_finish_draws_it_in_full_once(tmp_path):
    renderer = Renderer()
    search, study = tiny_session(tmp_path, renderer)
    report = search.report_file
    report.every = 0.0                                  # no rate limit: only "one draw at a time" holds it back
    last = completed(study)[-1]
    report.after_trial(study, last)                     # returns while the draw waits for the gate
    assert renderer.started.wait(10) and report.drawing and not search.place.paths.report.exists()
    report.after_trial(study, last)                     # due again, but one is drawing: no second draw
    report.on_progress(study)
    renderer.release.set()
    assert report.join(10)
    assert len(renderer.calls) == 1 and renderer.calls[0]["released"]      # released: nobody waited on it
    assert renderer.calls[0]["thread"] != threading.current_thread().name
    page = search.place.paths.report.read_text(encoding="utf-8")
    # mid-run: the traces need the simulator, which the trial loop is using
    assert "trace" not in plots(page) and "drawn at the end of the search and by" in page
    assert "pareto" in plots(page)

    report.finish(study)                                # the full report, in this thread
    assert len(renderer.calls) == 2 and renderer.most == 1
    assert renderer.calls[1]["thread"] == threading.current_thread().name
    page = search.place.paths.report.read_text(encoding="utf-8")
    assert "trace" in plots(page) and "drawn at the end of the search" not in page
    assert not list(search.place.paths.report.parent.glob("*.tmp*"))   # atomic writes leave no partial file


def test_finish_waits_for_a_running_draw_before_the_final_one(tmp_path):
    renderer = Renderer(hold=1.0)                       # nobody releases it: it gives up after 1 s
    search, study = tiny_session(tmp_path, renderer)
    report = search.report_file
    report.after_trial(study, completed(study)[-1])
    assert renderer.started.wait(10) and report.drawing
    assert report._thread is not None and report._thread.daemon   # a Ctrl-C'd process never waits on it
    report.finish(study)
    assert len(renderer.calls) == 2 and renderer.most == 1     # joined, then drawn once
    assert "trace" in plots(search.place.paths.report.read_text(encoding="utf-8"))


def test_the_search_goes_on_while_the_report_draws_and_a_failed_draw_is_a_warning(tmp_path, capsys):
    renderer = Renderer(hold=1.0, fail_first=True)      # each draw takes 1 s; the first one fails
    space = write_tiny_space(tmp_path)
    search = StudySession.open(space, results_dir=tmp_path / "results", quiet=True, render=renderer)
    search.report_file.every = 0.0
    study, _ = run(search, n_trials=6, timeout=None, jobs=1, seed=3, progress=False)
    assert "warning: report.html not written: RuntimeError: plotly fell over" in capsys.readouterr().err
    assert renderer.most == 1
    mid_run = [c for c in renderer.calls if c["thread"] == "tuner-report"]
    assert mid_run and len(renderer.calls) == len(mid_run) + 1          # + the final draw
    # trials completed while a draw was running: the loop did not wait for it
    done = [t.datetime_complete.timestamp() for t in completed(study)]
    assert any(c["start"] < d < c["end"] for c in mid_run for d in done)
    assert len(completed(study)) == 6
    assert "trace" in plots(search.place.paths.report.read_text(encoding="utf-8"))
