"""Floors and ceilings: what Optuna sees, an answer when nothing is feasible, a floor changed on a study."""

import json

import optuna
import pytest
import yaml
from cli import tuner as cli
from helpers import write_tiny_space

from tuner.study.loop import run
from tuner.study.results import closest, front_of_all, pareto, rows
from tuner.study.session import StudySession
from tuner.study.storage import StudyPaths, make_storage


def with_floor(space, floor):
    text = space.read_text()
    head, _, _ = text.partition("objectives:\n")
    rest = text.split("objectives:\n  mode: pareto\n", 1)[1]
    lines = [ln for ln in rest.splitlines(keepends=True) if not ln.startswith("  min_accuracy:")]
    space.write_text(head + "objectives:\n  mode: pareto\n" + (f"  min_accuracy: {floor}\n" if floor is not None
                                                             else "") + "".join(lines))
    return space


def study_of(root, name="tiny"):
    return optuna.load_study(study_name=name, storage=make_storage(None, StudyPaths(root / "results" / name)))


@pytest.fixture(scope="module")
def unconstrained(tmp_path_factory):
    """Accuracies of the tiny study without a floor: the floors below are set between them."""
    root = tmp_path_factory.mktemp("free")
    space = write_tiny_space(root)
    study, _ = run(StudySession.open(space, results_dir=root / "results", quiet=True), n_trials=10, timeout=None,
                   jobs=1, seed=3, progress=False)
    return sorted(r.accuracy for r in rows(study))


def test_optuna_sees_the_metric_names_and_the_feasible_front(tmp_path, unconstrained):
    floor = unconstrained[len(unconstrained) // 2]
    space = with_floor(write_tiny_space(tmp_path), floor)
    run(StudySession.open(space, results_dir=tmp_path / "results", quiet=True), n_trials=10, timeout=None, jobs=1,
        seed=3, progress=False)
    study = study_of(tmp_path)
    assert study.metric_names == ["mean_cosine", "latency_ms"]
    front = pareto(rows(study))
    assert front and all(r.accuracy >= floor for r in front)
    assert any(r.accuracy < floor for r in rows(study))          # the floor did cut trials
    assert {tuple(t.values) for t in study.best_trials} == {(r.accuracy, r.latency_ms) for r in front}


def test_an_unreachable_floor_leaves_the_closest_trial_and_next_steps_then_a_lower_floor_is_feasible(
        tmp_path, unconstrained, monkeypatch):
    space = with_floor(write_tiny_space(tmp_path), 0.99999999)
    search = StudySession.open(space, results_dir=tmp_path / "results", quiet=True)
    study, _ = run(search, n_trials=8, timeout=None, jobs=1, seed=3, progress=False)
    paths = search.place.paths
    rs = rows(study)
    assert not any(r.feasible for r in rs) and not paths.best.exists()
    found = closest(rs, search.problem.objectives)
    assert found.row.accuracy == max(r.accuracy for r in rs if not r.duplicate)
    assert found.gaps["min_accuracy"] == pytest.approx(0.99999999 - found.row.accuracy)
    text = paths.closest.read_text()
    assert f"trial {found.row.number}" in text and "NOT FEASIBLE" in text
    assert yaml.safe_load(text)["model_parameters"]                        # a YAML hb_mapper reads
    assert found.row.number in {r.number for r in front_of_all(rs)}
    status = cli("status", "tiny", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert f"closest: trial {found.row.number}" in status.stdout and "Pareto front of all trials" in status.stdout
    assert f"objectives.min_accuracy <= {found.row.accuracy:.6f}" in status.stdout
    assert f"tuner export tiny --trial {found.row.number}" in status.stdout
    page = paths.report.read_text()
    assert "<h2>No trial meets the constraints</h2>" in page and f"closest: trial {found.row.number}" in page
    exp = cli("export", "tiny", cwd=tmp_path)
    assert exp.returncode == 2 and f"--trial {found.row.number}" in exp.stderr

    # the same study with a floor within reach: feasible from the stored values, nothing re-run,
    # no sensitivity recomputed
    import tuner.study.warmstart as warmstart

    monkeypatch.setattr(warmstart, "leave_one_fixed", lambda *a, **k: pytest.fail("sensitivity was recomputed"))
    n_before = len(study.trials)
    lower = unconstrained[0] - 1e-9
    with_floor(space, lower)
    again = StudySession.open(space, results_dir=tmp_path / "results", quiet=True)
    study2, _ = run(again, n_trials=8, timeout=None, jobs=1, seed=3, progress=False)
    assert len(study2.trials) == n_before
    assert any("min_accuracy 0.99999999 ->" in n for n in again.notices)
    rs2 = rows(study2)
    assert all(r.feasible for r in rs2 if r.accuracy >= lower) and paths.best.exists()
    assert not paths.closest.exists()
    info = json.loads(json.dumps(study2.user_attrs["tuner"]))
    assert info["objectives"]["min_accuracy"] == lower and info["floor_changes"][0]["at_trial"] == n_before
    assert cli("export", "tiny", "--out", tmp_path / "b.yaml", cwd=tmp_path).returncode == 0


def test_another_metric_is_still_refused_on_the_same_study(tmp_path):
    space = write_tiny_space(tmp_path)
    run(StudySession.open(space, results_dir=tmp_path / "results", quiet=True), n_trials=3, timeout=None, jobs=1,
        seed=3, progress=False)
    space.write_text(space.read_text().replace("  mode: pareto\n", "  mode: pareto\n  accuracy: min_cosine\n"))
    with pytest.raises(Exception, match="other inputs"):
        StudySession.open(space, results_dir=tmp_path / "results", quiet=True).study(3)


def test_status_json_holds_what_the_terminal_shows(tmp_path, unconstrained):
    floor = unconstrained[len(unconstrained) // 2]
    space = with_floor(write_tiny_space(tmp_path), floor)
    study, _ = run(StudySession.open(space, results_dir=tmp_path / "results", quiet=True), n_trials=6, timeout=None,
                   jobs=1, seed=3, progress=False)
    r = cli("status", "tiny", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    front = pareto(rows(study))
    assert out["study"] == "tiny" and out["metric_names"] == ["mean_cosine", "latency_ms"]
    assert out["objectives"]["min_accuracy"] == floor and out["trials"]["completed"] == 6
    assert [t["trial"] for t in out["front"]] == [r.number for r in front]
    assert out["best"]["accuracy"] >= floor and out["best"]["feasible"] is True
    assert set(out["best"]["outputs"]) == {"seg", "depth"} and out["closest"] is None
    assert out["files"]["best"].endswith("best.yaml")
