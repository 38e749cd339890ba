"""Repeats cost nothing: a proposal of a candidate a completed trial already scored is answered from
it (not simulated), pruned (no completed trial: the budget is n_trials distinct candidates, and no
front, trials.csv or optuna-dashboard lists it), and a space with fewer candidates than asked for
ends the search with a line saying so."""

import csv
import json

import pytest
from cli import tuner
from helpers import write_tiny_space
from optuna.trial import TrialState

from tuner.study.loop import repeat_of, run
from tuner.study.results import pareto, rows
from tuner.study.session import StudySession

# 2 node decisions (int8 / int16) x the tiny space's 8 calibration settings: 24 distinct candidates
# (kl ignores max_percentile), so a TPE search of 20 proposes repeats
SMALL = "nodes:\n  top_k: 2\n  placement: [BPU]\n  precision: [int8, int16]\n"


def test_n_trials_distinct_candidates_and_repeats_are_not_simulated(tmp_path):
    space = write_tiny_space(tmp_path, extra=SMALL)
    search = StudySession.open(space, results_dir=tmp_path / "results", quiet=True)
    simulated = []
    evaluate = search.problem.ws.simulator.evaluate

    def counting(cand, *a, **k):
        if not a and not k:            # a trial's simulation (not the report's per-node one)
            simulated.append(cand.key())
        return evaluate(cand, *a, **k)

    search.problem.ws.simulator.evaluate = counting
    study, info = run(search, n_trials=20, timeout=None, jobs=1, seed=3, progress=False)
    ts = study.get_trials(deepcopy=False)
    done = [t for t in ts if t.state == TrialState.COMPLETE]
    repeats = [t for t in ts if repeat_of(t) is not None]
    keys = [t.user_attrs["record"]["key"] for t in done]
    assert len(done) == 20 and len(set(keys)) == 20          # n_trials distinct candidates
    assert repeats and "exhausted" not in info               # the sampler did propose repeats
    assert set(keys) <= set(simulated) and len(simulated) == len(set(simulated))   # none simulated twice
    by_number = {t.number: t for t in done}
    for t in repeats:
        assert t.state == TrialState.PRUNED and repeat_of(t) in by_number and t.values is None
        assert search.problem.resolved.candidate(t.params).key() == by_number[repeat_of(t)].user_attrs["record"]["key"]
    # no listing holds a repeat: status's rows and front, trials.csv
    assert sorted(r.number for r in rows(study)) == sorted(by_number)
    assert len({(r.accuracy, r.latency_ms) for r in pareto(rows(study))}) == len(pareto(rows(study)))
    with open(search.place.paths.trials_csv, newline="") as f:
        assert sorted(int(r["trial"]) for r in csv.DictReader(f)) == sorted(by_number)


@pytest.mark.parametrize("jobs", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_space_smaller_than_n_trials_ends_with_one_line(tmp_path, jobs):
    """With ``--jobs 2`` each worker process stops on its own repeats; the parent says why."""
    space = write_tiny_space(tmp_path, extra=SMALL)
    r = tuner("search", space, "--n-trials", 40, "--jobs", jobs, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("stopped early:")]
    assert "repeated candidates already scored" in line and "of the 40 asked for" in line
    distinct = int(line.split("(")[1].split()[0])
    assert 0 < distinct < 40
    status = tuner("status", "tiny", "--json", cwd=tmp_path)
    assert json.loads(status.stdout)["trials"]["completed"] == distinct


def test_an_older_studys_completed_repeats_are_marked_and_on_no_front():
    """Studies made before repeats were pruned hold them as completed trials (record ``duplicate_of``)."""
    from pathlib import Path

    import optuna

    from tuner.study.outputs import trials_csv
    from tuner.study.record import RECORD
    from tuner.study.results import front_of_all

    records = json.loads((Path(__file__).parent / "fixtures" / "records_main_a8e95c4.json").read_text())
    study = optuna.create_study(directions=["maximize", "minimize"])
    dists = {"x": optuna.distributions.CategoricalDistribution(["a"])}
    original = records["original"]
    for rec in (original, dict(records["duplicate"], accuracy=original["accuracy"], latency=original["latency"])):
        study.add_trial(optuna.trial.create_trial(params={"x": "a"}, distributions=dists,
                                                  values=[rec["accuracy"], rec["latency"]["total_ms"]],
                                                  user_attrs={RECORD: rec}))
    rs = rows(study)
    assert [r.number for r in pareto(rs)] == [0] and [r.number for r in front_of_all(rs)] == [0]
    lines = list(csv.DictReader(trials_csv(rs).splitlines()))
    assert [(ln["trial"], ln["plan"]) for ln in lines] == [("0", ""), ("1", "repeat of trial 0")]
