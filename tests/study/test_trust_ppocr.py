"""Issue 17's done-when on a real detector: PP-OCRv4 det (rapidocr-onnxruntime's file) on
scikit-image photographs, 4 evaluation and 8 calibration samples, as a user with few images has."""

import json

import pytest
from cli import tuner as cli
from ppocr import det_model_path, load_photo, preprocess, write_ppocr_project

pytestmark = pytest.mark.skipif(det_model_path() is None, reason="rapidocr-onnxruntime is not installed")

H, W = 128, 160
EVAL_PHOTOS = ("coins", "hubble_deep_field", "moon", "logo")


def space(root, floor=None):
    cfg = write_ppocr_project(root / "det", height=H, width=W)
    (root / "det" / "eval").mkdir(exist_ok=True)
    for i, name in enumerate(EVAL_PHOTOS):
        preprocess(load_photo(name), H, W).tofile(root / "det" / "eval" / f"{i:04d}.bin")
    path = root / "space.yaml"
    path.write_text(f"""\
base: {cfg.relative_to(root).as_posix()}
eval_data: det/eval
nodes:
  op_types: [Conv]
  precision: [int8, int16]
calibration:
  calibration_type: [max]
  max_percentile: [1.0, 0.9999]
  per_channel: [false, true]
objectives:
  mode: pareto
{'' if floor is None else f'  min_accuracy: {floor}'}
study:
  name: det
  seed: 1
  n_trials: 8
  warm_start: false
""")
    return path


@pytest.mark.slow
def test_validation_closest_and_a_lowered_floor_on_a_real_detector(tmp_path):
    root = tmp_path
    r = cli("search", space(root, floor=0.99999999), cwd=root)
    assert r.returncode == 0, r.stderr
    assert "eval_data has 4 sample(s), fewer than study.min_eval_samples (8)" in r.stderr
    # unreachable floor: the closest trial, its YAML and next steps
    assert (root / "results" / "det" / "closest.yaml").is_file() and not (root / "results" / "det" / "best.yaml").exists()
    assert "closest: trial" in r.stdout and "next steps:" in r.stdout and "objectives.min_accuracy <=" in r.stdout
    st = json.loads(cli("status", "det", "--json", cwd=root).stdout)
    assert st["best"] is None and st["closest"]["gaps"]["min_accuracy"] > 0 and st["next_steps"]
    reach = st["closest"]["accuracy"]
    # the same study with the floor the next steps named: feasible, nothing re-run
    r = cli("search", space(root, floor=reach), cwd=root)
    assert r.returncode == 0, r.stderr
    assert "feasibility of its 8 trial(s) is derived again" in r.stdout
    st = json.loads(cli("status", "det", "--json", cwd=root).stdout)
    assert st["trials"]["completed"] == 8 and st["best"] is not None and st["closest"] is None
    # eval and validation figures for the best and the front; best.yaml chosen by validation
    assert st["chosen_by"] == "validation"
    for t in [st["best"]] + st["front"]:
        v = t["validation"]
        assert v["samples"] == 8 and v["metric"] == "mean_cosine" and v["worst_sample"] <= v["accuracy"]
        assert t["accuracy"] != v["accuracy"]
    best_yaml = (root / "results" / "det" / "best.yaml").read_text()
    assert f"trial {st['best']['trial']}" in best_yaml.splitlines()[0] and "chosen by the validation figure" in best_yaml
    text = cli("status", "det", cwd=root).stdout
    assert "worst val" in text and "chosen by the validation figure" in text
