"""The manual recipes the benchmark compares the search with, on the tiny model and the real simulator."""

import pytest
from helpers import write_tiny_space

from tuner.candidate import Calibration
from tuner.study.baselines import Goal, Scorer, all_int8, alone_int8, greedy_revert, staged_escalation
from tuner.study.session import StudySession

MAX = Calibration("max")
NEVER = Goal(min_accuracy=1.5)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("baselines")
    search = StudySession.open(write_tiny_space(tmp), results_dir=tmp / "results", quiet=True)
    nodes = [n for d in search.problem.resolved.decisions if d.default_choice != "CPU" for n in d.nodes]
    alone = alone_int8(search.problem.ws.simulator, "mean_cosine", MAX, nodes)
    return search, alone


def scorer(search):
    return Scorer(search.problem.ws.simulator, search.problem.cost, "mean_cosine")


def test_greedy_reverts_one_node_per_step_in_sensitivity_order_and_stops_at_the_goal(tiny):
    search, _ = tiny
    r, gains = search.problem.resolved, search.problem.sensitivity
    full = greedy_revert(r, scorer(search), NEVER, MAX, gains)
    assert not full.reached and full.steps[0][0] == "all int8"
    cpu = [{n for n, s in score.candidate.nodes if s.on == "CPU"} for _, score in full.steps]
    for before, after in zip(cpu, cpu[1:]):
        assert before < after and len(after - before) == 1      # one more node on the CPU per step
    moved = [next(iter(b - a)) for a, b in zip(cpu, cpu[1:])]
    assert [gains[n] for n in moved] == sorted((gains[n] for n in moved), reverse=True)
    # a goal first met at step k: the recipe stops exactly there, with the same steps
    accs = [s.accuracy for _, s in full.steps]
    k = next(i for i in range(2, len(accs)) if accs[i] > max(accs[:i]))
    goal = Goal(min_accuracy=accs[k])
    stopped = greedy_revert(r, scorer(search), goal, MAX, gains)
    assert stopped.reached and len(stopped.steps) == k + 1
    assert [s.candidate.key() for _, s in stopped.steps] == [s.candidate.key() for _, s in full.steps[: k + 1]]
    assert stopped.final.accuracy >= goal.min_accuracy > max(accs[:k])
    # deterministic: the same steps again
    again = greedy_revert(r, scorer(search), goal, MAX, gains)
    assert [s.candidate.key() for _, s in again.steps] == [s.candidate.key() for _, s in stopped.steps]


def test_staged_promotes_cumulatively_then_falls_back_to_cpu(tiny):
    search, alone = tiny
    r = search.problem.resolved
    res = staged_escalation(r, scorer(search), NEVER, MAX, alone, stages=(0.9999, 0.99999))
    labels = [label for label, _ in res.steps]
    assert labels[0] == "all int8" and labels[1].startswith("int16 below 0.9999 ") \
        and labels[2].startswith("int16 below 0.99999 ")
    int16 = [{n for n, s in score.candidate.nodes if s.input_type == "int16"} for _, score in res.steps]
    promotable = {n for d in r.decisions if "BPU:int16" in d.choices or "BPU:int16_input" in d.choices
                  for n in d.nodes if n in alone}
    assert int16[1] == {n for n in promotable if alone[n] < 0.9999}
    assert int16[2] == {n for n in promotable if alone[n] < 0.99999} and int16[1] < int16[2]
    # then CPU fallback, most sensitive first, one node per step, until one BPU node is left: the next
    # step would leave none, which hb_mapper refuses ("There is no node can execute on BPU")
    cpu = [{n for n, s in score.candidate.nodes if s.on == "CPU"} for _, score in res.steps[2:]]
    moved = [next(iter(b - a)) for a, b in zip(cpu, cpu[1:])]
    assert [alone[n] for n in moved] == sorted(alone[n] for n in moved)
    # (hb moves a CPU Conv's Relu and the pass-through ops feeding only the CPU along, so the last BPU node
    # standing may be one the recipe never named: at least one named node is left)
    assert len(set(alone) - set(moved)) >= 1 and set(moved) < set(alone)
    last = res.steps[-1][1].candidate
    assert "BPU" in search.problem.ws.simulator.plan(last).placement.values()
    # a goal met by the first stage stops there
    goal = Goal(min_accuracy=res.steps[1][1].accuracy)
    if not goal.met(res.steps[0][1].accuracy):
        early = staged_escalation(r, scorer(search), goal, MAX, alone, stages=(0.9999, 0.99999))
        assert early.reached and len(early.steps) == 2
    again = staged_escalation(r, scorer(search), NEVER, MAX, alone, stages=(0.9999, 0.99999))
    assert [s.candidate.key() for _, s in again.steps] == [s.candidate.key() for _, s in res.steps]


def test_all_int8_uses_the_given_calibration_and_goals_check_task_floors(tiny):
    search, _ = tiny
    sc = scorer(search)
    kl = all_int8(search.problem.resolved, sc, NEVER, Calibration("kl")).final
    mx = all_int8(search.problem.resolved, sc, NEVER, MAX).final
    assert kl.calibration.startswith("kl") and mx.calibration == "max" and kl.accuracy != mx.accuracy
    assert sc.evaluations == 2
    assert Goal(min_accuracy=0.9).met(0.95, {"top1:y": 0.5})   # no floor on the task metric
    g = Goal(min_accuracy=0.9, task_floors=(("top1:y", 0.9),))
    assert g.met(0.95, {"top1:y": 0.91}) and not g.met(0.95, {"top1:y": 0.89}) and not g.met(0.95, {})
    assert not g.met(float("nan"), {"top1:y": 1.0})
