"""Real hb_mapper YAMLs (real_yamls/, see PROVENANCE.md there): read as hb_mapper reads them."""

import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from PIL import Image

from tuner.errors import TunerError
from tuner.inputs.checks import ERROR, WARNING, check_data
from tuner.inputs.config import load_config
from tuner.inputs.data import dataset_from_config
from tuner.inputs.model import load_model

YAMLS = Path(__file__).with_name("real_yamls")
LEROBOT = YAMLS / "25_lerobot_act_transformer_3in_bayese.yaml"
WENET = YAMLS / "26_wenet_encoder_4in_bernoulli2.yaml"
UNET = YAMLS / "07_zoo_unet_bayese_preprocess_on.yaml"


def test_a_trailing_semicolon_ends_the_list():
    """The X5 LeRobot export ends every list with ';': hb_mapper drops the empty item."""
    cfg = load_config(LEROBOT)
    assert [i.name for i in cfg.inputs] == ["states", "laptop_features", "phone_features"]
    assert [i.type_train for i in cfg.inputs] == ["featuremap"] * 3
    assert [i.cal_dir.name for i in cfg.inputs] == ["state", "laptop", "phone"]
    assert [i.cal_type for i in cfg.inputs] == ["float32"] * 3
    assert cfg.optimization == ("set_all_nodes_int16", "set_Softmax_input_int16", "set_Softmax_output_int16")


def test_an_empty_item_inside_a_list_is_still_an_error(tmp_path):
    text = LEROBOT.read_text().replace('"states;laptop_features;phone_features;"', '"states;;phone_features"')
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(TunerError, match="input_name"):
        load_config(tmp_path / "c.yaml")


def test_featuremap_inputs_without_cal_data_type_are_float32():
    """The '_f32' folder-name rule is for non-featuremap inputs only (Horizon's PTQ docs)."""
    cfg = load_config(WENET)
    assert [(i.name, i.cal_type) for i in cfg.inputs] == [
        ("chunk", "float32"), ("att_cache", "float32"), ("cnn_cache", "float32"), ("att_mask", "float32")]
    assert not any("cal_data_type" in w for w in cfg.warnings)


H = W = 16


@pytest.fixture
def unet(tmp_path):
    """The model zoo's UNet YAML (preprocess_on: True) next to a one-Relu model and a folder of images."""
    root = tmp_path / "unet"
    root.mkdir()
    shutil.copy(UNET, root / "unet.yaml")
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, H, W])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, H, W])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["input"], ["y"], name="/relu")], "g",
                                                [x], [y]), opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    onnx.save(model, str(root / "UNet_11.onnx"))
    images = root / "unet"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i, fmt in enumerate(("jpg", "png", "bmp")):
        pixels = rng.integers(0, 256, (24 + 4 * i, 32, 3), dtype=np.uint8)   # other sizes than the model's
        Image.fromarray(pixels).save(images / f"{i:04d}.{fmt}")
    return root / "unet.yaml"


def test_preprocess_on_reads_the_images_as_hb_mapper_does(unet):
    cfg = load_config(unet)
    assert cfg.inputs[0].preprocess_on
    assert any("preprocess_on is True" in w and "training preprocessing" in w for w in cfg.warnings)
    model = load_model(cfg.onnx_model)
    samples = list(dataset_from_config(cfg.inputs, model.input_shapes))
    assert len(samples) == 3
    for sample, image in zip(samples, sorted((unet.parent / "unet").iterdir())):
        with Image.open(image) as img:
            want = np.asarray(img.convert("RGB").resize((W, H), Image.BILINEAR), np.float32).transpose(2, 0, 1)
        # resized to input_shape, rgb NCHW, 0..255, then the nv12 input path and the YAML's data_scale
        # (HzPreprocess): the luma-only part of the image (every channel equal) comes back within the int8
        # weights' rounding, the colour is changed by the 4:2:0 chroma
        path = cfg.inputs[0]
        assert path.type_rt == "nv12"
        grey = np.repeat(want.mean(axis=0, keepdims=True).round(), 3, axis=0)
        seen = dataset_from_config(cfg.inputs, model.input_shapes).inputs[0].normalize(grey[None])[0]
        np.testing.assert_allclose(seen, grey * np.float32(0.003921568627451), atol=0.012)
        assert np.abs(sample["input"][0] - want * np.float32(0.003921568627451)).max() > 0.05


def test_check_data_accepts_the_images_and_warns_about_preprocess_on(unet):
    report = check_data(unet)
    assert not [f for f in report.findings if f.severity == ERROR], report.findings
    [warn] = [f for f in report.findings if f.code == "preprocess_on"]
    assert warn.severity == WARNING and "make-cal-data" in warn.message


def test_preprocess_on_names_a_file_that_is_no_image(unet):
    np.zeros((1, 3, H, W), np.float32).tofile(unet.parent / "unet" / "0003.bin")
    cfg = load_config(unet)
    with pytest.raises(TunerError, match=r"0003\.bin: is not an image; calibration_parameters\.preprocess_on"):
        dataset_from_config(cfg.inputs, load_model(cfg.onnx_model).input_shapes)
    [bad] = [f for f in check_data(unet).findings if f.severity == ERROR]
    assert bad.code == "not_an_image" and "0003.bin" in bad.message


def test_preprocess_on_without_pillow_is_one_clear_line(unet, monkeypatch):
    cfg = load_config(unet)
    shapes = load_model(cfg.onnx_model).input_shapes
    monkeypatch.setitem(sys.modules, "PIL", None)      # import PIL fails as it does without Pillow
    with pytest.raises(TunerError) as err:
        dataset_from_config(cfg.inputs, shapes)
    assert "\n" not in str(err.value) and "pip install 'tuner[images]'" in str(err.value)
    assert "preprocess_on" in str(err.value)
