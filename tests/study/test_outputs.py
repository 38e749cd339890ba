"""Pareto front, best trial and trials.csv on hand-made rows."""

import csv
import io

from tuner.study.outputs import trials_csv
from tuner.study.record import CalibrationUsed, Counts, Latency, TrialRecord
from tuner.study.results import Row, best, pareto


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
