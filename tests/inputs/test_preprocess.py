"""make-cal-data / check-preprocess on real PNG files, a real preprocessing module and a real ONNX model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli import tuner as _run
from helpers import hb_yaml
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from tuner.errors import TunerError
from tuner.inputs.check_preprocess import check_preprocess, format_preprocess_report
from tuner.inputs.config import load_config
from tuner.inputs.data import dataset_from_config
from tuner.inputs.model import load_model
from tuner.inputs.preprocess import load_preprocess, make_cal_data

H = W = 16
PREP = f"""\
import numpy as np
from PIL import Image


def prep(path):
    img = Image.open(path).convert("RGB").resize(({W}, {H}))
    return (np.asarray(img, np.float32) / 255).transpose(2, 0, 1)[None]


def no_batch(path):
    return prep(path)[0]


def hwc(path):
    return prep(path)[0].transpose(1, 2, 0)


def with_nan(path):
    x = prep(path)
    x[0, 1, 2, 3] = np.nan
    return x


def a_list(path):
    return prep(path).tolist()


def broken(path):
    raise ValueError("cannot decode")


NOT_A_FUNCTION = 3
"""


def _images(folder: Path, n: int = 4) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    yy, xx = np.mgrid[0:H, 0:W]
    paths = []
    for i in range(n):
        r = (xx * 255 / (W - 1)).astype(np.uint8)
        g = ((yy * 13 + 40 * i) % 256).astype(np.uint8)
        b = (((xx // 4 + yy // 4 + i) % 2) * 200 + 20 + 5 * i).astype(np.uint8)
        path = folder / f"img_{chr(ord('a') + i)}.png"
        Image.fromarray(np.stack([r, g, b], axis=-1)).save(path)
        paths.append(path)
    return paths


def _model(path: Path) -> None:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((2, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.array([0.1, -0.1], np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="/conv", pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["y"], name="/relu")]
    graph = helper.make_graph(nodes, "prep", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, H, W])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, H, W])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    onnx.save(model, str(path))


@pytest.fixture
def project(tmp_path):
    """tmp/model.onnx, tmp/hb_config.yaml (cal_data_dir 'cal'), tmp/images/*.png, tmp/prep.py."""
    _model(tmp_path / "model.onnx")
    (tmp_path / "hb_config.yaml").write_text(hb_yaml("model.onnx", "x", f"1x3x{H}x{W}"))
    _images(tmp_path / "images")
    (tmp_path / "prep.py").write_text(PREP)
    return tmp_path


def _spec(project, fn="prep"):
    return f"{project / 'prep.py'}:{fn}"


def _reference(project) -> list[np.ndarray]:
    fn = load_preprocess(_spec(project))
    return [fn(p) for p in sorted((project / "images").glob("*.png"))]


def _write(project, tensors) -> None:
    (project / "cal").mkdir(exist_ok=True)
    for i, t in enumerate(tensors):
        np.asarray(t, np.float32).tofile(project / "cal" / f"{i:04d}.bin")


def _read_back(cfg: Path) -> list[np.ndarray]:
    config = load_config(cfg)
    model = load_model(config.onnx_model)
    return [s["x"] for s in dataset_from_config(config.inputs, model.input_shapes)]


# --------------------------------------------------------------------------- make-cal-data

def test_make_cal_data_writes_what_hb_mapper_reads(project):
    written = make_cal_data(project / "hb_config.yaml", project / "images", _spec(project), project / "cal")
    assert [p.name for p in written] == ["0000_img_a.bin", "0001_img_b.bin", "0002_img_c.bin", "0003_img_d.bin"]
    assert all(p.stat().st_size == 3 * H * W * 4 for p in written)
    got = _read_back(project / "hb_config.yaml")
    ref = _reference(project)
    assert len(got) == 4
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)
    assert not list((project / "cal").glob(".*"))          # no temp files left


def test_make_cal_data_limit_and_no_batch_dim(project):
    written = make_cal_data(project / "hb_config.yaml", project / "images", _spec(project, "no_batch"),
                            project / "cal", limit=2)
    assert len(written) == 2
    np.testing.assert_array_equal(_read_back(project / "hb_config.yaml")[1], _reference(project)[1])


def test_make_cal_data_never_overwrites_without_force(project):
    cfg, images, out = project / "hb_config.yaml", project / "images", project / "cal"
    make_cal_data(cfg, images, _spec(project), out)
    first = out / "0000_img_a.bin"
    first.write_bytes(b"\0" * first.stat().st_size)
    with pytest.raises(TunerError, match=r"4 file\(s\) exist already .*--force"):
        make_cal_data(cfg, images, _spec(project), out)
    assert first.read_bytes() == b"\0" * first.stat().st_size  # untouched
    make_cal_data(cfg, images, _spec(project), out, overwrite=True)
    np.testing.assert_array_equal(np.fromfile(first, np.float32).reshape(1, 3, H, W), _reference(project)[0])
    (out / "stale.bin").write_bytes(b"x")
    with pytest.raises(TunerError, match="stale.bin.*hb_mapper reads every file"):
        make_cal_data(cfg, images, _spec(project), out, overwrite=True)


def test_make_cal_data_integer_type_needs_integer_pixels(project):
    cfg = project / "hb_config.yaml"
    cfg.write_text(cfg.read_text().replace("cal_data_type: 'float32'", "cal_data_type: 'uint8'"))
    with pytest.raises(TunerError, match=r"non-integer values for .*img_a.png.*cal_data_type is 'uint8'"):
        make_cal_data(cfg, project / "images", _spec(project), project / "cal")
    assert not list((project / "cal").iterdir())          # nothing half-written


def test_make_cal_data_empty_folder_and_multi_input(project):
    (project / "empty").mkdir()
    with pytest.raises(TunerError, match="no images"):
        make_cal_data(project / "hb_config.yaml", project / "empty", _spec(project), project / "cal")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, H, W])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 3, H, W])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, H, W])
    add = helper.make_node("Add", ["x", "z"], ["y"], name="/add")
    m = helper.make_model(helper.make_graph([add], "two", [x, z], [y]), opset_imports=[helper.make_opsetid("", 11)])
    m.ir_version = 7
    onnx.save(m, str(project / "two.onnx"))
    text = hb_yaml("two.onnx", "x;z", f"1x3x{H}x{W};1x3x{H}x{W}").replace(
        "input_type_train: 'featuremap'", "input_type_train: 'featuremap;featuremap'").replace(
        "input_layout_train: 'NCHW'", "input_layout_train: 'NCHW;NCHW'").replace(
        "cal_data_dir: 'cal'", "cal_data_dir: 'cal_x;cal_z'").replace(
        "cal_data_type: 'float32'", "cal_data_type: 'float32;float32'")
    (project / "two.yaml").write_text(text)
    with pytest.raises(TunerError, match="single-input models; two.onnx has 2 inputs .*each input's folder"):
        make_cal_data(project / "two.yaml", project / "images", _spec(project), project / "cal")


# --------------------------------------------------------------------------- the callable

@pytest.mark.parametrize("fn, pattern", [
    ("hwc", r"returned shape 16x16x3 for .*img_a.png, but the model input needs 1x3x16x16.*input_layout_train"),
    ("with_nan", r"returned NaN values for .*img_a.png"),
    ("a_list", r"returned list for .*img_a.png; it must return a numpy array of shape 1x3x16x16"),
    ("broken", r"failed on .*img_a.png: ValueError: cannot decode"),
])
def test_bad_results_name_the_image(project, fn, pattern):
    with pytest.raises(TunerError, match=pattern):
        make_cal_data(project / "hb_config.yaml", project / "images", _spec(project, fn), project / "cal")


@pytest.mark.parametrize("spec, pattern", [
    ("nowhere.py:prep", r"preprocessing 'nowhere.py:prep': file .*nowhere.py' not found"),
    ("{dir}/prep.py:nope", r"preprocessing .* has no function 'nope'; it defines .*prep"),
    ("{dir}/prep.py:NOT_A_FUNCTION", r"is a int, not a function; .*fn\(image_path\) -> numpy array"),
    ("no_such_module_xyz:prep", r"module 'no_such_module_xyz' not found"),
    ("prep", r"preprocessing 'prep': expected 'package.module:function'"),
])
def test_bad_specs(project, spec, pattern):
    with pytest.raises(TunerError, match=pattern):
        load_preprocess(spec.format(dir=project))


# --------------------------------------------------------------------------- check-preprocess

def _check(project, **kw):
    return check_preprocess(project / "hb_config.yaml", project / "images", _spec(project), **kw)


def test_check_consistent_files(project):
    make_cal_data(project / "hb_config.yaml", project / "images", _spec(project), project / "cal")
    report = _check(project)
    assert report.exit_code() == 0, format_preprocess_report(report)
    assert report.compared == 4 and not report.findings
    assert all(c.max_abs == 0 for c in report.channels)
    assert report.outputs[0].output == "y" and report.outputs[0].cosine == pytest.approx(1.0)
    json.dumps(report.as_dict(), allow_nan=False)
    assert "consistent (exit code 0)" in format_preprocess_report(report)


def test_check_names_rgb_bgr_swap(project):
    _write(project, [r[:, ::-1] for r in _reference(project)])
    report = _check(project)
    assert report.exit_code() == 1
    assert report.codes() == {"rgb_bgr_swap"}, format_preprocess_report(report)
    msg = report.findings[0].message
    assert msg.startswith("calibration files were not produced by this preprocessing: "
                          "channel order swapped (RGB vs BGR)")
    assert "make-cal-data" in msg
    assert report.channels[1].max_abs == 0 and report.channels[0].max_abs > 0.1
    assert report.outputs[0].cosine < 0.9999


def test_check_names_x255_scale_and_counts(project):
    _write(project, [np.round(r * 255) for r in _reference(project)[:3]])    # 3 files for 4 images
    report = _check(project)
    assert report.exit_code() == 1
    assert "scale_255" in report.codes(), format_preprocess_report(report)
    assert "255 x the recomputed tensors" in format_preprocess_report(report)
    assert report.compared == 3 and "count_differs" in report.codes()
    assert report.channels[0].worst_file is not None


def test_check_names_swap_and_scale_together(project):
    _write(project, [np.round(r[:, ::-1] * 255) for r in _reference(project)])
    report = _check(project)
    assert report.codes() == {"rgb_bgr_swap+scale_255"}, format_preprocess_report(report)
    assert "RGB vs BGR" in report.findings[0].message and "255 x" in report.findings[0].message


def test_check_names_already_normalized_files(project):
    cfg = project / "hb_config.yaml"
    cfg.write_text(cfg.read_text().replace("input_type_train: 'featuremap'", "input_type_train: 'rgb'")
                   .replace("norm_type: 'no_preprocess'",
                            "norm_type: 'data_mean_and_scale'\n  mean_value: '0.5 0.4 0.3'\n  scale_value: '2 3 4'"))
    mean, scale = np.array([0.5, 0.4, 0.3]).reshape(1, 3, 1, 1), np.array([2, 3, 4.0]).reshape(1, 3, 1, 1)
    _write(project, [(r - mean) * scale for r in _reference(project)])
    report = _check(project)
    assert report.codes() == {"already_normalized"}, format_preprocess_report(report)
    assert "double normalisation" in report.findings[0].message


def test_check_tolerance(project):
    ref = _reference(project)
    _write(project, [r + 1e-6 for r in ref])                            # float noise: consistent
    assert _check(project).exit_code() == 0
    off = [r.copy() for r in ref]
    off[2][0, 1] += 2e-3                                                # one channel of one file slightly off
    _write(project, off)
    report = _check(project)
    assert report.exit_code() == 1 and report.codes() == {"tensors_differ"}
    assert report.channels[1].worst_file == "0002.bin" and report.channels[1].max_abs == pytest.approx(2e-3, rel=1e-3)


def test_check_other_difference_and_unusable_files(project):
    _write(project, [r[:, :, ::-1] for r in _reference(project)])     # flipped vertically: no simple relation
    report = _check(project)
    assert report.codes() == {"tensors_differ"} and report.exit_code() == 1
    (project / "cal" / "0000.bin").write_bytes(b"\0" * 10)
    report = _check(project)
    assert report.exit_code() == 2 and report.codes() == {"cal_files_unusable"}


# --------------------------------------------------------------------------- CLI

def test_cli_make_then_check(project):
    r = _run("make-cal-data", "hb_config.yaml", "images", "--preprocess", "prep.py:prep", "--out", "cal", cwd=project)
    assert r.returncode == 0, r.stderr
    assert "wrote cal/0003_img_d.bin" in r.stdout
    r = _run("check-preprocess", "hb_config.yaml", "images", "--preprocess", "prep.py:prep", "--json", cwd=project)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["compared"] == 4
    r = _run("make-cal-data", "hb_config.yaml", "images", "--preprocess", "prep.py:prep", "--out", "cal", cwd=project)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and "--force" in r.stderr


def test_cli_without_preprocess_on_a_featuremap_input_is_a_one_line_error(project):
    r = _run("check-preprocess", "hb_config.yaml", "images", cwd=project)
    assert r.returncode == 2
    assert r.stderr.startswith("tuner: error: input_type_train is featuremap") and r.stderr.count("\n") == 1
    assert "--preprocess" in r.stderr


@pytest.mark.parametrize("kind", ["rgb", "bgr"])
def test_images_read_as_the_yaml_describes(project, kind):
    """Without --preprocess: decoded, resized to input_shape, in input_type_train order, 0..255."""
    from PIL import Image

    text = hb_yaml("model.onnx", "x", f"1x3x{H}x{W}").replace("input_type_train: 'featuremap'",
                                                             f"input_type_train: '{kind}'")
    text = text.replace("input_type_rt: 'featuremap'", "input_type_rt: 'bgr'").replace(
        "norm_type: 'no_preprocess'", "norm_type: 'data_scale'\n  scale_value: 0.00392156862745098")
    (project / "hb_config.yaml").write_text(text)
    written = make_cal_data(project / "hb_config.yaml", project / "images", None, project / "cal")
    images = sorted((project / "images").glob("*.png"))
    assert len(written) == len(images)
    for path, image in zip(written, images):
        got = np.fromfile(path, np.float32).reshape(1, 3, H, W)
        with Image.open(image) as img:
            want = np.asarray(img.convert("RGB").resize((W, H), Image.BILINEAR), np.float32)
        if kind == "bgr":
            want = want[..., ::-1]
        np.testing.assert_array_equal(got[0], want.transpose(2, 0, 1))
        assert got.max() > 2.0   # raw pixels: the model's data_scale does the /255
