"""The budget gate and surplus with a stub objective on real Optuna storages (no simulator)."""

import optuna
import pytest
from optuna.trial import TrialState

from tuner.study.loop import budgeted_optimize, may_start, surplus
from tuner.study.storage import StudyPaths, make_storage


@pytest.fixture(params=["memory", "journal"])
def study(request, tmp_path):
    storage = None if request.param == "memory" else make_storage(None, StudyPaths(tmp_path / "s"))
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    return optuna.create_study(storage=storage, sampler=optuna.samplers.RandomSampler(seed=0))


def stub(trial):
    return trial.suggest_float("x", 0.0, 1.0)


def complete(study):
    return [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]


def test_the_study_ends_with_exactly_the_budget_and_a_rerun_adds_nothing(study):
    budgeted_optimize(stub, study, 5, None, [])
    assert len(complete(study)) == 5
    budgeted_optimize(stub, study, 5, None, [])
    assert len(study.get_trials(deepcopy=False)) == 5
    assert not may_start(study, 5)
    budgeted_optimize(stub, study, 7, None, [])           # a larger budget continues the study
    assert len(complete(study)) == 7


def test_failing_trials_do_not_count_against_the_budget(study):
    calls = []

    def flaky(trial):
        calls.append(trial.number)
        if len(calls) % 2:
            raise RuntimeError("onnxruntime said no")
        return stub(trial)

    budgeted_optimize(flaky, study, 3, None, [])
    assert len(complete(study)) == 3 and len(calls) == 6


def test_a_trial_started_in_a_race_for_the_last_slot_gives_way(study):
    budgeted_optimize(stub, study, 2, None, [])
    other = study.ask()                                 # another worker's running trial, started first
    study.enqueue_trial({"x": 0.25})
    mine = study.ask()                                  # takes the enqueued parameters
    assert surplus(mine, 3) and not surplus(other, 3)
    # the enqueued parameters were put back for when a slot frees up
    waiting = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.WAITING]
    assert [t.system_attrs.get("fixed_params") for t in waiting] == [{"x": 0.25}]
    assert not surplus(mine, 4)                          # room for both


def test_callbacks_see_each_trial_and_should_stop_ends_the_loop(study):
    seen = []
    budgeted_optimize(stub, study, 10, None, [lambda st, t: seen.append(t.number)], lambda: len(seen) >= 3)
    assert seen == [0, 1, 2] and len(complete(study)) == 3
