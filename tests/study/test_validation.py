"""The winners re-scored on samples the search did not select on."""

import csv
import json

import numpy as np
import pytest
from cli import tuner as cli
from helpers import tiny_sample, write_tiny_space

from tuner.study.loop import run
from tuner.study.results import pareto, rows
from tuner.study.session import StudySession
from tuner.study.validation import Validator, choose_best, label_free, stored


def eval_space(root, n_eval=3, extra=""):
    """The tiny space scored on ``n_eval`` samples of their own (tiny/eval), the 8 calibration
    samples left for validation."""
    space = write_tiny_space(root, extra=extra)
    (root / "tiny" / "eval").mkdir()
    for i in range(n_eval):
        (tiny_sample(100 + i) * np.float32(1.0 + 0.5 * i)).tofile(root / "tiny" / "eval" / f"{i:04d}.bin")
    space.write_text("eval_data: tiny/eval\n" + space.read_text())
    return space


def test_the_front_and_best_are_validated_and_shown_everywhere(tmp_path):
    space = eval_space(tmp_path)
    search = StudySession.open(space, results_dir=tmp_path / "results", quiet=True)
    assert any("eval_data has 3 sample(s), fewer than study.min_eval_samples (8)" in w for w in search.problem.ws.warnings)
    v = search.validator
    assert v is not None and len(v.data) == 8 and "calibration data" in v.what
    study, _ = run(search, n_trials=10, timeout=None, jobs=1, seed=3, progress=False)
    rs = rows(study)
    front = pareto(rs)
    vals = stored(study)
    assert {r.number for r in front} <= set(vals)
    for val in vals.values():
        assert val.metric == "mean_cosine" and val.samples == 8
        assert val.worst_sample <= val.accuracy + 1e-9 and val.eval_worst_sample <= 1.0
    # the validation figure is the same candidate on other samples: recomputed, it agrees
    r0 = front[0]
    again = Validator(search.problem.ws, v.data, v.what, "mean_cosine").score(r0)
    assert again.accuracy == pytest.approx(vals[r0.number].accuracy, abs=1e-12)
    assert again.accuracy != pytest.approx(r0.accuracy, abs=1e-9)          # other data, another figure
    # best.yaml is the validation choice, and says so
    chosen, by = choose_best(rs, vals, search.problem.objectives)
    assert by == "validation"
    text = search.place.paths.best.read_text()
    assert f"trial {chosen.number}" in text.splitlines()[0] and "chosen by the validation figure" in text
    with open(search.place.paths.trials_csv) as f:
        table = {int(r["trial"]): r for r in csv.DictReader(f)}
    assert float(table[r0.number]["validation_accuracy"]) == pytest.approx(vals[r0.number].accuracy, abs=1e-6)
    status = cli("status", "tiny", "--json", cwd=tmp_path)
    out = json.loads(status.stdout)
    assert out["chosen_by"] == "validation" and out["best"]["trial"] == chosen.number
    assert all(t["validation"]["samples"] == 8 for t in out["front"])
    text = cli("status", "tiny", cwd=tmp_path).stdout
    assert "validation" in text and "worst val" in text and "chosen by the validation figure" in text


def test_select_eval_keeps_the_eval_choice_and_no_validation_without_other_data(tmp_path):
    space = eval_space(tmp_path, extra="")
    space.write_text(space.read_text().replace("  mode: pareto\n", "  mode: pareto\n  select: eval\n"))
    search = StudySession.open(space, results_dir=tmp_path / "results", quiet=True)
    study, _ = run(search, n_trials=6, timeout=None, jobs=1, seed=3, progress=False)
    rs = rows(study)
    assert choose_best(rs, stored(study), search.problem.objectives)[1] == "eval"
    plain = StudySession.open(write_tiny_space(tmp_path / "plain"), results_dir=tmp_path / "plain" / "results",
                              quiet=True)
    assert plain.validator is None          # eval data = calibration data: nothing held out


def test_a_task_metric_is_validated_by_mean_cosine():
    assert label_free("miou:seg") == "mean_cosine" and label_free("cosine:seg") == "cosine:seg"
