"""make-cal-data and check-data for camera inputs (issue 26 part 4), on scikit-image's colour photos
through the real code paths: the files hold what hb_mapper's loader reads (the training format, 0..255,
before mean/scale), and check-data's colour-order, layout and normalization rules fire on the mistake
and stay silent on the right files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from camera_toys import camera_model, write_camera_project
from onnx import TensorProto, helper

from tuner.errors import TunerError
from tuner.inputs.checks import check_data
from tuner.inputs.config import load_config
from tuner.inputs.data import dataset_from_config
from tuner.inputs.images import yaml_preprocess
from tuner.inputs.model import load_model
from tuner.inputs.preprocess import camera_note, make_cal_data

PIL = pytest.importorskip("PIL.Image")
skdata = pytest.importorskip("skimage.data")

SIZE = 96
PHOTOS = ("astronaut", "chelsea", "coffee", "immunohistochemistry")   # red above blue (rocket is not)
CAMERA_CODES = {"channel_order", "layout_mismatch", "double_normalization"}


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("photos")
    for name in PHOTOS:
        PIL.fromarray(getattr(skdata, name)()[..., :3]).save(folder / f"{name}.png")
    return folder


def project(root: Path, type_rt: str = "nv12", cal_type: str = "uint8", norm: str = "data_mean_and_scale") -> Path:
    """The camera toy at SIZE x SIZE (a photo's neighbouring pixels stay alike), its YAML's cal folder empty."""
    cfg = write_camera_project(root, type_rt=type_rt, norm=norm)
    onnx.save(camera_model(size=SIZE), str(root / "camera.onnx"))
    for f in (root / "cal").iterdir():
        f.unlink()
    cfg.write_text(cfg.read_text().replace("1x3x32x32", f"1x3x{SIZE}x{SIZE}")
                   .replace("cal_data_type: 'uint8'", f"cal_data_type: '{cal_type}'"))
    return cfg


def codes(cfg: Path) -> set[str]:
    return {f.code for f in check_data(cfg).findings} & CAMERA_CODES


def test_make_cal_data_writes_the_training_format_hb_reads(tmp_path, photos):
    cfg = project(tmp_path / "nv12")
    written = make_cal_data(cfg, photos, None, tmp_path / "nv12" / "cal")
    assert len(written) == len(PHOTOS)
    spec = load_config(cfg).inputs[0]
    first = np.fromfile(written[0], np.uint8).reshape(1, 3, SIZE, SIZE)       # uint8 RGB NCHW, 0..255
    expected = yaml_preprocess(spec, (1, 3, SIZE, SIZE))(sorted(photos.iterdir())[0])
    np.testing.assert_array_equal(first, expected)
    data = dataset_from_config(load_config(cfg).inputs, load_model(load_config(cfg).onnx_model).input_shapes)
    board, ideal = next(iter(data))["data"], next(data.float_samples())["data"]
    assert 0 < np.abs(board - ideal).mean() < 0.1        # photos lose little to 4:2:0, unlike the noisy toy
    assert "NV12" in (camera_note(cfg) or "")
    assert codes(cfg) == set()

    # yuv444 from rgb: hb's loader converts in float and fails on integer files: float32 pixels
    cfg = project(tmp_path / "yuv", type_rt="yuv444", cal_type="float32")
    written = make_cal_data(cfg, photos, None, tmp_path / "yuv" / "cal")
    assert written[0].stat().st_size == 4 * 3 * SIZE * SIZE
    np.testing.assert_array_equal(np.fromfile(written[0], np.float32).reshape(first.shape), first)
    assert "float32" in (camera_note(cfg) or "") and codes(cfg) == set()


def test_make_cal_data_refuses_normalized_values_for_a_camera_input(tmp_path, photos):
    cfg = project(tmp_path / "p", cal_type="float32")
    (tmp_path / "norm.py").write_text(
        "import numpy as np\nfrom PIL import Image\n"
        f"def pre(p):\n    a = np.asarray(Image.open(p).convert('RGB').resize(({SIZE}, {SIZE})), np.float32)\n"
        "    return ((a - 127.5) / 127.5).transpose(2, 0, 1)[None]\n")
    with pytest.raises(TunerError, match="0..255 rgb pixels"):
        make_cal_data(cfg, photos, str(tmp_path / "norm.py") + ":pre", tmp_path / "p" / "cal")
    assert not any((tmp_path / "p" / "cal").iterdir())


def _rewrite(cal: Path, fn) -> None:
    for f in sorted(cal.iterdir()):
        x = np.fromfile(f, np.uint8).reshape(1, 3, SIZE, SIZE)
        y = fn(x)
        y.tofile(f)


def test_check_data_names_swapped_channels_as_a_hint(tmp_path, photos):
    cfg = project(tmp_path / "p")
    make_cal_data(cfg, photos, None, tmp_path / "p" / "cal")
    _rewrite(tmp_path / "p" / "cal", lambda x: np.ascontiguousarray(x[:, ::-1]))      # BGR files, rgb YAML
    found = [f for f in check_data(cfg).findings if f.code == "channel_order"]
    assert len(found) == 1 and found[0].severity == "info" and "input_type_train: 'bgr'" in found[0].message
    cfg.write_text(cfg.read_text().replace("input_type_train: 'rgb'", "input_type_train: 'bgr'"))
    assert codes(cfg) == set()                                                         # the YAML says bgr


def test_check_data_names_the_files_layout(tmp_path, photos):
    cfg = project(tmp_path / "p")
    make_cal_data(cfg, photos, None, tmp_path / "p" / "cal")
    _rewrite(tmp_path / "p" / "cal", lambda x: np.ascontiguousarray(x.transpose(0, 2, 3, 1)))   # NHWC files
    found = [f for f in check_data(cfg).findings if f.code == "layout_mismatch"]
    assert len(found) == 1 and "look NHWC" in found[0].message
    nhwc = helper.make_graph([helper.make_node("Relu", ["data"], ["out"])], "nhwc",
                             [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, SIZE, SIZE, 3])],
                             [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, SIZE, SIZE, 3])])
    model = helper.make_model(nhwc, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    onnx.save(model, str(tmp_path / "p" / "camera.onnx"))                              # an NHWC model
    cfg.write_text(cfg.read_text().replace("input_layout_train: 'NCHW'", "input_layout_train: 'NHWC'")
                   .replace(f"1x3x{SIZE}x{SIZE}", f"1x{SIZE}x{SIZE}x3"))
    assert "layout_mismatch" not in codes(cfg)
    _rewrite(tmp_path / "p" / "cal", lambda x: x.reshape(1, SIZE, SIZE, 3).transpose(0, 3, 1, 2).copy())  # NCHW again
    found = [f for f in check_data(cfg).findings if f.code == "layout_mismatch"]
    assert len(found) == 1 and "look NCHW" in found[0].message


@pytest.mark.parametrize("norm", ["data_mean_and_scale", "no_preprocess"])
def test_check_data_names_normalized_files_for_a_camera_input(tmp_path, photos, norm):
    cfg = project(tmp_path / "p", cal_type="float32", norm=norm)
    make_cal_data(cfg, photos, None, tmp_path / "p" / "cal")
    assert "double_normalization" not in codes(cfg)
    for f in sorted((tmp_path / "p" / "cal").iterdir()):
        x = np.fromfile(f, np.float32)
        ((x - 127.5) / 127.5).astype(np.float32).tofile(f)
    found = [f for f in check_data(cfg).findings if f.code == "double_normalization"]
    assert len(found) == 1 and "input_type_rt is nv12" in found[0].message
