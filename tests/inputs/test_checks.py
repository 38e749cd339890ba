import json
import shutil
from dataclasses import replace

import numpy as np
import onnx
import pytest
import yaml
from helpers import write_example_project
from onnx import TensorProto, helper

import tuner.inputs.checks as checks
from tuner.errors import TunerError
from tuner.inputs.checks import (
    ERROR,
    FEW_SAMPLES_WARNING,
    INFO,
    WARNING,
    ChannelStats,
    DataReport,
    Finding,
    check_data,
    format_report,
)

SHAPE = (1, 3, 8, 8)


def write_project(root, samples, *, names=("x",), shape=SHAPE, type_train="featuremap", layout="NCHW",
                  norm="no_preprocess", mean=None, scale=None, cal_type="float32", per_channel=False, conv=False):
    """A one-op model (Relu, a 1x1 Conv with ``conv``, or Add of two inputs), its YAML, and ``samples``
    written with tofile().

    ``samples``: per sample an array (one input) or a tuple of arrays (one per input). The YAML
    describes the first input only (see ``two_inputs``).
    """
    root.mkdir(parents=True, exist_ok=True)
    vis = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n in names]
    op = helper.make_node("Add", list(names), ["y"], name="/add") if len(names) == 2 else \
        helper.make_node("Relu", [names[0]], ["y"], name="/relu")
    inits = []
    if conv:
        w = np.eye(shape[1], dtype=np.float32).reshape(shape[1], shape[1], 1, 1)
        inits = [onnx.numpy_helper.from_array(w, "w")]
        op = helper.make_node("Conv", [names[0], "w"], ["y"], name="/conv")
    model = helper.make_model(helper.make_graph([op], "g", vis, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                            list(shape))], inits),
                              opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    onnx.save(model, str(root / "m.onnx"))
    dirs = [f"cal_{n}" for n in names]
    for d in dirs:
        (root / d).mkdir(exist_ok=True)
    for i, s in enumerate(samples):
        for d, arr in zip(dirs, s if isinstance(s, tuple) else (s,)):
            arr.tofile(root / d / f"{i:04d}.bin")
    j = lambda v: v  # noqa: E731
    rt = "featuremap" if type_train == "featuremap" else type_train
    lines = f"""\
model_parameters:
  onnx_model: 'm.onnx'
  march: 'bayes-e'
input_parameters:
  input_name: '{names[0]}'
  input_type_train: '{j(type_train)}'
  input_layout_train: '{j(layout)}'
  input_type_rt: '{j(rt)}'
  input_layout_rt: '{j(layout)}'
  input_shape: '{j("x".join(map(str, shape)))}'
  norm_type: '{norm}'
"""
    if mean:
        lines += f"  mean_value: '{mean}'\n"
    if scale:
        lines += f"  scale_value: '{scale}'\n"
    lines += f"""\
calibration_parameters:
  cal_data_dir: '{dirs[0]}'
  cal_data_type: '{j(cal_type)}'
  calibration_type: 'max'
  per_channel: {per_channel}
compiler_parameters:
  optimize_level: 'O3'
"""
    (root / "hb.yaml").write_text(lines)
    return root / "hb.yaml"


def normal(n, seed=0, shape=SHAPE):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


def by_code(report, code):
    return [f for f in report.findings if f.code == code]


def test_clean_featuremap_data_has_no_warnings(tmp_path):
    report = check_data(write_project(tmp_path, normal(30)))
    assert report.exit_code() == 0
    assert report.samples == 30 and report.inputs == ["x"]
    assert [(f.severity, f.code) for f in report.findings] == [(INFO, "few_samples")]   # 30 < 100: info only
    assert len(report.stats) == 3
    s = report.stats[1]
    assert isinstance(s, ChannelStats) and s.input == "x" and s.channel == 1
    assert abs(s.mean) < 0.1 and 0.9 < s.std < 1.1 and s.nan == 0 and s.inf == 0 and s.zero_share == 0.0


def test_stats_are_those_the_model_sees_after_mean_and_scale(tmp_path):
    samples = [np.full(SHAPE, v, np.float32) + np.arange(64, dtype=np.float32).reshape(8, 8) for v in (10.0, 20.0)]
    report = check_data(write_project(tmp_path, samples, type_train="rgb", norm="data_mean_and_scale",
                                      mean="10 10 10", scale="0.5 0.5 0.5"))
    s = report.stats[0]
    assert (s.raw_min, s.raw_max) == (10.0, 83.0)
    assert (s.min, s.max) == (0.0, 36.5)
    assert s.mean == pytest.approx((np.arange(64).mean() + 5.0) * 0.5)
    assert "raw min..max" in format_report(report)


def test_example_radar_range_channel_is_named(tmp_path):
    report = check_data(write_example_project(tmp_path / "ex", n_cal=12, n_eval=1))
    ratio = by_code(report, "range_ratio")
    assert [(f.input, f.channel, f.severity) for f in ratio] == [("input", 3, WARNING)]
    msg = ratio[0].message
    assert "channel 3 spans |x| <= 79" in msg and "channels 0, 1, 2, 4" in msg
    assert "int16" in msg and "InputType" in msg and "rescale channel 3" in msg
    # only Slices read it: hb gives it the first Slice's (RGB) range, so the radar channel is clipped
    assert "first Slice, '/Slice' (channels 0-2), |x| <= 1," in msg and "channel 3 is clipped at 1" in msg
    # the example's input feeds Slices: hb_mapper's per-channel scales reach Conv inputs only
    assert "set per_channel: True" not in msg and "per_channel does not help" in msg and "Slice" in msg
    assert report.exit_code() == 1


def test_range_ratio_names_the_first_slice_threshold_and_an_int16_request_lifts_it(tmp_path):
    cfg = write_example_project(tmp_path / "ex", n_cal=12, n_eval=1)
    raw = yaml.safe_load(cfg.read_text())
    raw["model_parameters"]["node_info"] = {"/Slice_2": {"InputType": "int16"}}
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False))
    (f,) = by_code(check_data(cfg), "range_ratio")
    # a node_info entry on a Slice gives the input its own calibration (measured): no clipping, the old story
    assert "clipped" not in f.message and "one per-tensor int8 scale" in f.message


def test_range_ratio_below_threshold_is_silent_and_per_channel_downgrades(tmp_path):
    samples = normal(25)
    for s in samples:
        s[:, 2] *= 20.0                       # 20x: below the 30x rule
    assert not by_code(check_data(write_project(tmp_path / "a", samples)), "range_ratio")
    for s in samples:
        s[:, 2] *= 5.0                        # now 100x
    (f,) = by_code(check_data(write_project(tmp_path / "b", samples, conv=True)), "range_ratio")
    assert f.channel == 2 and f.severity == WARNING and "set per_channel: True" in f.message
    (f,) = by_code(check_data(write_project(tmp_path / "c", samples, per_channel=True, conv=True)), "range_ratio")
    assert f.severity == INFO and "per_channel is already True" in f.message
    # an input no Conv reads: per_channel would not help it (docs/hb_rules/quantizer.md §1.5), so it is not suggested
    (f,) = by_code(check_data(write_project(tmp_path / "d", samples, per_channel=True)), "range_ratio")
    assert f.severity == WARNING and "per_channel does not help" in f.message and "Relu" in f.message


def test_constant_channel_and_constant_mask(tmp_path):
    samples = normal(25)
    for s in samples:
        s[:, 1] = 0.5
        s[:, 2] = 0.0                         # a 0/1 mask that is never set
    report = check_data(write_project(tmp_path, samples))
    const = {f.channel: f for f in by_code(report, "constant_channel")}
    assert set(const) == {1, 2}
    assert "channel 1 is constant (0.5) in all 25 samples" in const[1].message
    assert "0/1 mask" in const[2].message and "never sees it set" in const[2].message
    assert report.stats[1].std == 0.0 and report.stats[2].zero_share == 1.0
    assert report.exit_code() == 1


def test_nhwc_channel_axis(tmp_path):
    samples = normal(25, shape=(1, 8, 8, 3))
    for s in samples:
        s[..., 2] = 7.0
    report = check_data(write_project(tmp_path, samples, shape=(1, 8, 8, 3), layout="NHWC"))
    assert [f.channel for f in by_code(report, "constant_channel")] == [2]
    assert report.stats[2].min == report.stats[2].max == 7.0


def pixels(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, SHAPE).astype(np.uint8) for _ in range(n)]


def test_unnormalized_pixels_without_preprocess(tmp_path):
    report = check_data(write_project(tmp_path / "a", pixels(25), type_train="rgb", cal_type="uint8"))
    (f,) = by_code(report, "unnormalized_image")
    assert f.input == "x" and "integer pixels 0..255" in f.message and "norm_type: data_mean_and_scale" in f.message
    # the same files with the normalization in the YAML are fine
    ok = check_data(write_project(tmp_path / "b", pixels(25), type_train="rgb", cal_type="uint8",
                                  norm="data_scale", scale="0.003921568627451"))
    assert not by_code(ok, "unnormalized_image") and not by_code(ok, "double_normalization")
    # a featuremap input of 0..255 integers is flagged too (it gets no normalization at all)
    fm = check_data(write_project(tmp_path / "c", [p.astype(np.float32) for p in pixels(25)]))
    (f,) = by_code(fm, "unnormalized_image")
    assert "(featuremap) holds integers 0..255, like 0..255 pixels" in f.message
    assert "write the files normalized as in training" in f.message and fm.exit_code() == 1
    # small integer features (a 0/1 mask, class ids) and normalized floats are not pixels
    rng = np.random.default_rng(1)
    ids = check_data(write_project(tmp_path / "d", [rng.integers(0, 10, SHAPE).astype(np.float32) for _ in range(25)]))
    assert not by_code(ids, "unnormalized_image")
    norm = check_data(write_project(tmp_path / "e", [p.astype(np.float32) / 255 for p in pixels(25)]))
    assert not by_code(norm, "unnormalized_image")


def test_double_normalization(tmp_path):
    normalized = [((p.astype(np.float32) / 255.0) - 0.45) / 0.225 for p in pixels(25)]
    report = check_data(write_project(tmp_path, normalized, type_train="rgb", norm="data_mean_and_scale",
                                      mean="123.675 116.28 103.53", scale="0.01712475 0.017507 0.01742919"))
    (f,) = by_code(report, "double_normalization")
    assert "the files look already normalized" in f.message
    # input_type_rt rgb: the board feeds pixels whatever the norm type, so the fix is the pixels
    assert "input_type_rt is rgb" in f.message and "write the pixels before mean/scale" in f.message
    assert report.exit_code() == 1


def test_jpeg_and_wrong_size_are_errors_naming_both_files(tmp_path):
    cfg = write_project(tmp_path, normal(25))
    (tmp_path / "cal_x" / "0100_photo.jpg").write_bytes(b"\xff\xd8\xff\xe0" + b"\x00" * 500)
    np.zeros(SHAPE, np.uint8).tofile(tmp_path / "cal_x" / "0101_small.bin")
    report = check_data(cfg)
    assert report.exit_code() == 2
    (img,) = by_code(report, "image_file")
    (size,) = by_code(report, "wrong_size")
    assert img.severity == size.severity == ERROR
    assert "0100_photo.jpg: is a JPEG image" in img.message
    assert "0101_small.bin: 192 bytes" in size.message and "fits cal_data_type 'uint8'" in size.message
    assert report.findings[0].severity == ERROR                      # errors listed first
    assert report.samples == 25 and report.stats[0].mean is not None  # the good files still count


def test_nan_and_inf_files_are_errors(tmp_path):
    samples = normal(25)
    samples[3][0, 1, 2, 2] = np.nan
    samples[7][0, 0, 0, 0] = np.inf
    report = check_data(write_project(tmp_path, samples))
    errors = {f.message.split(":")[0].rsplit("/", 1)[-1]: f for f in by_code(report, "non_finite")}
    assert set(errors) == {"0003.bin", "0007.bin"}
    assert errors["0003.bin"].channel == 1 and "1 NaN" in errors["0003.bin"].message
    assert "1 Inf" in errors["0007.bin"].message
    assert report.exit_code() == 2 and report.samples == 23
    assert report.stats[1].nan == 1 and report.stats[0].inf == 1


def two_inputs(monkeypatch, root):
    """Make check_data see inputs 'a' and 'b' (folders cal_a, cal_b) of the Add model.

    Built from the parsed single-input YAML because load_config currently rejects ';'-separated
    input_type_train/input_layout_train values (its CHOICES check sees the whole string).
    """
    real = checks.load_config

    def load(path):
        cfg = real(path)
        a = cfg.inputs[0]
        return replace(cfg, inputs=[replace(a, name=n, cal_dir=root / f"cal_{n}") for n in ("a", "b")])

    monkeypatch.setattr(checks, "load_config", load)


def test_empty_folder_and_count_mismatch(tmp_path, monkeypatch):
    cfg = write_project(tmp_path / "a", [(a, b) for a, b in zip(normal(25), normal(25, seed=1))], names=("a", "b"))
    two_inputs(monkeypatch, tmp_path / "a")
    assert check_data(cfg).exit_code() == 0
    for p in sorted((tmp_path / "a" / "cal_b").iterdir())[-2:]:
        p.unlink()
    report = check_data(cfg)
    (f,) = by_code(report, "count_mismatch")
    assert "'a': 25, 'b': 23" in f.message and "0023.bin, 0024.bin" in f.message
    assert report.exit_code() == 2 and report.samples == 23

    monkeypatch.undo()
    cfg = write_project(tmp_path / "b", [])
    report = check_data(cfg)
    assert [f.code for f in report.findings] == ["empty_folder"] and report.exit_code() == 2
    assert report.samples == 0 and report.stats[0].mean is None
    json.dumps(report.as_dict(), allow_nan=False)


def test_duplicates(tmp_path):
    samples = normal(25)
    samples[10] = samples[2].copy()                                                  # identical
    samples[20] = samples[5] + np.float32(1e-4) * normal(1, seed=9)[0]               # near-identical
    report = check_data(write_project(tmp_path, samples))
    (f,) = by_code(report, "duplicate_samples")
    assert "2 of 25 samples repeat an earlier one (1 identical, 1 near-identical" in f.message
    assert "0010.bin = 0002.bin" in f.message and "0020.bin ~ 0005.bin" in f.message
    assert "behaves like 23 samples" in f.message
    assert not by_code(check_data(write_project(tmp_path / "clean", normal(25))), "duplicate_samples")


def test_too_few_samples(tmp_path):
    (f,) = by_code(check_data(write_project(tmp_path / "a", normal(5))), "few_samples")
    assert f.severity == WARNING and "only 5 usable" in f.message and "~100" in f.message
    (f,) = by_code(check_data(write_project(tmp_path / "b", normal(FEW_SAMPLES_WARNING))), "few_samples")
    assert f.severity == INFO


def test_limit_reads_fewer_but_judges_the_folder(tmp_path):
    report = check_data(write_project(tmp_path, normal(25)), limit=4)
    assert report.samples == 4
    (f,) = by_code(report, "few_samples")
    assert "only 25 usable" in f.message and f.severity == INFO


def test_data_dirs_override_and_missing_yaml(tmp_path):
    cfg = write_project(tmp_path, normal(25))
    other = tmp_path / "other"
    other.mkdir()
    for i, s in enumerate(normal(3)):
        s.tofile(other / f"{i}.bin")
    assert check_data(cfg, data_dirs=[other]).samples == 3
    report = check_data(cfg, data_dirs=[tmp_path / "nowhere"])
    assert [f.code for f in report.findings] == ["missing_folder"] and report.exit_code() == 2
    with pytest.raises(TunerError, match="no such file"):
        check_data(tmp_path / "missing.yaml")
    shutil.copy(cfg, tmp_path / "nomodel.yaml")
    (tmp_path / "m.onnx").unlink()
    with pytest.raises(TunerError, match="model file not found"):
        check_data(tmp_path / "nomodel.yaml")


def test_as_dict_and_format_report_cover_every_finding(tmp_path):
    samples = normal(8)
    samples[1] = samples[0].copy()
    for s in samples:
        s[:, 1] = 0.0
        s[:, 2] *= 100.0
    samples[4][0, 0, 0, 0] = np.nan
    cfg = write_project(tmp_path, samples)
    (tmp_path / "cal_x" / "zz.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 100)
    report = check_data(cfg)
    assert {"image_file", "non_finite", "constant_channel", "range_ratio", "duplicate_samples",
            "few_samples"} <= report.codes()
    d = json.loads(json.dumps(report.as_dict(), allow_nan=False))
    assert d["exit_code"] == 2 and d["samples"] == 7 and len(d["stats"]) == 3
    assert {f["code"] for f in d["findings"]} == report.codes()
    text = format_report(report)
    for f in report.findings:
        assert f.code in text and f.message in text
    assert "input  ch" in text and "errors" in text and "(exit code 2)" in text


def test_report_exit_codes():
    r = DataReport(config=None, samples=1, inputs=["x"], stats=[], findings=[])
    assert r.exit_code() == 0
    r.findings.append(Finding(INFO, "few_samples", None, None, "m"))
    assert r.exit_code() == 0
    r.findings.append(Finding(WARNING, "constant_channel", "x", 0, "m"))
    assert r.exit_code() == 1
    r.findings.append(Finding(ERROR, "image_file", "x", None, "m"))
    assert r.exit_code() == 2


def test_same_layout_different_texture_is_not_a_duplicate(tmp_path):
    # every 2x2 block has mean 0, so the coarse block means of all samples agree exactly
    samples = []
    for s in normal(25, shape=(1, 3, 16, 16)):
        blocks = s.reshape(1, 3, 8, 2, 8, 2)
        samples.append((blocks - blocks.mean(axis=(3, 5), keepdims=True)).reshape(1, 3, 16, 16))
    report = check_data(write_project(tmp_path, samples, shape=(1, 3, 16, 16)))
    assert not by_code(report, "duplicate_samples")
