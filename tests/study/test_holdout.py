"""Issue 25 items 2, 3 and 7: a winner that fails on held-out data is told and replaced, no silent
wrong result (a constraint on a missing output, a stale best.yaml, validation = eval data, advice
naming a key that does not exist), and the search ends with the one file to convert."""

import ast
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from cli import tuner as cli
from helpers import tiny_sample, write_tiny_space

from tuner.study.results import Closest, next_steps, rows
from tuner.study.validation import stored

N_TRIALS = 12


def overfit_space(root: Path, floor: float | None) -> Path:
    """The issue's setting on the tiny model: 3 eval samples like the calibration ones, and 6
    validation samples the search never scores, most of them on a larger scale (harder): the
    eval figures are ~0.999, the validation figures ~0.95."""
    space = write_tiny_space(root)
    for folder, n, offset in (("eval", 3, 0), ("val", 6, 50)):
        (root / "tiny" / folder).mkdir()
        for i in range(n):
            scale = 1.0 if folder == "eval" else 1.0 + 0.5 * (i % 3)
            (tiny_sample(100 + offset + i) * np.float32(scale)).tofile(root / "tiny" / folder / f"{i:04d}.bin")
    text = "eval_data: tiny/eval\nvalidation_data: tiny/val\n" + space.read_text()
    if floor is not None:
        text = text.replace("  mode: pareto\n", f"  mode: pareto\n  min_accuracy: {floor}\n")
    space.write_text(text)
    return space


def search(root: Path, *more: str):
    res = cli("search", "space.yaml", "--n-trials", N_TRIALS, *more, cwd=root)
    assert res.returncode == 0, res.stderr
    return res


def study_rows(root: Path):
    import optuna

    from tuner.study.storage import StudyPaths, make_storage

    study = optuna.load_study(study_name="tiny", storage=make_storage(None, StudyPaths(root / "results" / "tiny")))
    return study, {r.number: r for r in rows(study)}


# --------------------------------------------------------------------------- item 2: overfitting told
def test_a_winner_failing_its_floor_on_validation_is_replaced_by_one_that_holds_and_every_output_says_so(tmp_path):
    """Floor 0.95: every trial meets it on eval; the eval figure's cheapest choice misses it on
    the validation samples, some one-line fixes meet it there: best.yaml holds one of those."""
    overfit_space(tmp_path, 0.95)
    out = search(tmp_path).stdout
    study, rs = study_rows(tmp_path)
    vals = stored(study)
    # the one-line fixes (the warm start's all-int8 baselines) are validated like the front
    baselines = [n for n, r in rs.items() if (r.plan or "").startswith("baseline")]
    assert baselines and set(baselines) <= set(vals)
    by_eval = min((r for r in rs.values() if r.feasible), key=lambda r: (r.latency_ms, -r.accuracy, r.number))
    assert vals[by_eval.number].accuracy < 0.95 <= by_eval.accuracy          # the setting
    holding = [n for n, v in vals.items() if v.accuracy >= 0.95]
    assert holding
    expect = min((rs[n] for n in holding), key=lambda r: (r.latency_ms, -vals[r.number].accuracy, r.number))
    header = (tmp_path / "results/tiny/best.yaml").read_text()
    assert header.splitlines()[0].endswith(f"trial {expect.number}")
    assert f"HELD-OUT CHECK: the eval figure's choice (trial {by_eval.number}) misses min_accuracy" in header
    assert f"held-out check: the eval figure's choice, trial {by_eval.number}, misses min_accuracy" in out
    assert f"best.yaml holds trial {expect.number} instead" in out
    status = json.loads(cli("status", "tiny", "--json", cwd=tmp_path).stdout)
    h = status["held_out"]
    assert h["eval_choice"] == by_eval.number and h["eval_choice_fails"] and h["chosen"] == expect.number
    assert h["chosen_holds"] and not h["nothing_holds"] and status["best"]["trial"] == expect.number
    assert "held-out check" in cli("status", "tiny", cwd=tmp_path).stdout
    cli("report", "tiny", cwd=tmp_path)
    assert "Held-out check" in (tmp_path / "results/tiny/report.html").read_text()
    # the search's gain over the best one-line fix, on the held-out figure
    assert "on held-out data: best.yaml" in out and "the search's gain" in out


def test_nothing_holding_on_validation_is_said_with_the_closest_and_what_would_help(tmp_path):
    """Floor 0.9995: met on the 3 eval samples by the int16 plans, by no trial on validation."""
    overfit_space(tmp_path, 0.9995)
    out = search(tmp_path).stdout
    study, rs = study_rows(tmp_path)
    vals = stored(study)
    assert vals and all(v.accuracy < 0.9995 for v in vals.values())
    best_eval = min((r for r in rs.values() if r.feasible), key=lambda r: (r.latency_ms, -r.accuracy, r.number))
    header = (tmp_path / "results/tiny/best.yaml").read_text()
    assert f"trial {best_eval.number}" in header.splitlines()[0]
    assert "HELD-OUT CHECK FAILED: this trial misses min_accuracy by" in header
    assert "no validated trial meets the constraints on the 6 validation sample(s)" in out
    near = max(vals.values(), key=lambda v: (v.accuracy, -v.trial))
    assert f"closest on validation: trial {near.trial}, misses min_accuracy by {0.9995 - near.accuracy:.3g}" in out
    assert "what would help: more eval_data samples" in out
    assert f"objectives.min_accuracy: {near.accuracy:.6g} holds trial {near.trial} on validation" in out
    assert "it misses the constraints on the held-out data" in out          # the file to convert says it too
    h = json.loads(cli("status", "tiny", "--json", cwd=tmp_path).stdout)["held_out"]
    assert h["nothing_holds"] and not h["chosen_holds"] and h["closest"] == near.trial
    assert any("no validated trial" in line for line in h["lines"])


# --------------------------------------------------------------------------- item 3: nothing silent
@pytest.mark.parametrize("constraint", ["cosine:nosuch >= 0.9", "sqnr:nosuch >= 20"])
def test_a_constraint_on_an_output_the_model_lacks_is_refused_before_any_trial(tmp_path, constraint):
    space = write_tiny_space(tmp_path)
    space.write_text(space.read_text().replace("  mode: pareto\n", f"  mode: pareto\n  constraints: ['{constraint}']\n"))
    res = cli("search", "space.yaml", "--n-trials", 3, cwd=tmp_path)
    assert res.returncode == 2
    err = [ln for ln in res.stderr.splitlines() if ln.startswith("tuner: error")]
    assert err == [f"tuner: error: objectives.constraints '{constraint}': the model has no output 'nosuch'; it has "
                   "seg, depth"]
    assert not (tmp_path / "results/tiny/study.journal").exists()


def test_a_floor_that_leaves_nothing_feasible_does_not_leave_best_yaml_listed_as_best(tmp_path):
    space = write_tiny_space(tmp_path)
    search(tmp_path)
    paths = tmp_path / "results/tiny"
    assert (paths / "best.yaml").is_file()
    space.write_text(space.read_text().replace("  mode: pareto\n", "  mode: pareto\n  min_accuracy: 0.99999999\n"))
    out = search(tmp_path).stdout
    assert not (paths / "best.yaml").exists() and (paths / "best.stale.yaml").is_file()
    assert "best.yaml and best_minimal.yaml moved to best.stale.yaml, best_minimal.stale.yaml" in out
    assert "\nbest: " not in out and "closest (not feasible)" in out
    status = cli("status", "tiny", cwd=tmp_path).stdout
    assert "\nbest: " not in status
    # a best.yaml left by an older version is not listed as the best either
    shutil.copy(paths / "best.stale.yaml", paths / "best.yaml")
    status = cli("status", "tiny", cwd=tmp_path).stdout
    assert "\nbest: " not in status and "best.yaml is stale" in status


@pytest.mark.parametrize("how", ["same folder", "copied files"])
def test_validation_data_equal_to_eval_data_is_not_called_held_out(tmp_path, how):
    space = overfit_space(tmp_path, None)
    if how == "same folder":
        space.write_text(space.read_text().replace("validation_data: tiny/val", "validation_data: tiny/eval"))
    else:
        shutil.rmtree(tmp_path / "tiny/val")
        shutil.copytree(tmp_path / "tiny/eval", tmp_path / "tiny/val")
        for i, f in enumerate(sorted((tmp_path / "tiny/val").iterdir())):
            f.rename(f.with_name(f"copy_{i}.bin"))
    res = search(tmp_path)
    assert "validation_data holds the same samples as eval_data (by content)" in res.stderr
    assert "did not select on" not in res.stdout + (tmp_path / "results/tiny/best.yaml").read_text()
    study, _ = study_rows(tmp_path)
    assert stored(study) == {}
    assert "did not select on" not in cli("status", "tiny", cwd=tmp_path).stdout


SPACE_KEY = re.compile(r"(?<![\w./`])(nodes|objectives|calibration|study)\.([a-z_0-9]+)\b")
NOT_KEYS = {"study.journal"}      # a file name


def space_keys() -> set[str]:
    defaults = yaml.safe_load((Path(__file__).resolve().parents[2] / "search_spaces/default.yaml").read_text())
    return {f"{section}.{key}" for section, body in defaults.items() if isinstance(body, dict) for key in body}


def advice_strings() -> list[tuple[str, int, str]]:
    """Every string the package prints (docstrings left out) naming a space key, with its place."""
    out = []
    for f in sorted((Path(__file__).resolve().parents[2] / "tuner").rglob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and ast.get_docstring(n, clean=False) is not None}
        out += [(f.name, n.lineno, m.group(0)) for n in ast.walk(tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
                for m in SPACE_KEY.finditer(n.value) if m.group(0) not in NOT_KEYS]
    return out


def test_every_space_key_the_advice_names_exists():
    keys = space_keys()
    named = advice_strings()
    assert any(k == "nodes.top_k" for _, _, k in named)            # the scan sees the advice
    assert [(f, line, k) for f, line, k in named if k not in keys] == []
    from tuner.study.record import TrialRecord
    from tuner.study.results import Row

    rec = TrialRecord.from_json(json.loads((Path(__file__).parent / "fixtures/records_main_a8e95c4.json")
                                           .read_text())["original"])
    steps = next_steps(Closest(Row(3, rec, False, None), {"min_accuracy": 0.01, "max_latency_ms": 0.2}), "s")
    suggested = [m.group(0) for s in steps for m in SPACE_KEY.finditer(s)]
    assert suggested and set(suggested) <= keys


# --------------------------------------------------------------------------- item 7: the file to convert
def test_the_search_ends_with_the_one_file_to_convert_and_the_next_command(tmp_path):
    write_tiny_space(tmp_path)
    out = search(tmp_path).stdout
    tail = out[out.index("\nfile to convert: "):]
    target = tail.split("file to convert: ", 1)[1].split(" (", 1)[0]
    assert Path(tmp_path / target).is_file() or Path(target).is_file()
    assert f"hb_mapper makertbin --config {target} --model-type onnx" in tail
    best = (tmp_path / "results/tiny/best.yaml").read_text()
    minimal = (tmp_path / "results/tiny/best_minimal.yaml").read_text()
    fig = re.compile(r"^# simulated accuracy (\S+), modeled latency (\S+) ms", re.M)
    (acc_b, lat_b), (acc_m, lat_m) = fig.search(best).groups(), fig.search(minimal).groups()
    if (acc_b, lat_b) == (acc_m, lat_m):
        assert target.endswith("best_minimal.yaml") and "has the same outcome as best.yaml" in tail
    elif float(acc_m) >= float(acc_b) and float(lat_m) <= float(lat_b):
        assert target.endswith("best_minimal.yaml") and "is as good as best.yaml" in tail
    else:
        assert target.endswith("best.yaml") and "best_minimal.yaml is the trimmed alternative" in tail


def test_best_yaml_says_the_calibration_as_written_and_what_default_resolved_to(tmp_path):
    space = write_tiny_space(tmp_path)
    space.write_text(space.read_text().replace("calibration_type: [max, kl]", "calibration_type: [default]"))
    search(tmp_path)
    text = (tmp_path / "results/tiny/best.yaml").read_text()
    cfg = yaml.safe_load(text)
    assert cfg["calibration_parameters"]["calibration_type"] == "default"
    line = next(ln for ln in text.splitlines() if ln.startswith("# calibration "))
    assert line.startswith("# calibration calibration_type: default")
    resolved = re.search(r"resolved by the simulation to (\S+):", line)
    assert resolved and resolved.group(1).split(":")[0] in ("max", "max-percentile", "kl")
    assert "best output cosine on calibration sample 0" in line
    # the other trials say the calibration their YAML writes, never another method than its key
    for f in (tmp_path / "results/tiny/pareto").glob("*.yaml"):
        t = f.read_text()
        key = yaml.safe_load(t)["calibration_parameters"]["calibration_type"]
        assert f"# calibration calibration_type: {key}" in t
