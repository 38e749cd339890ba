"""The camera input path (tuner.inputs.inputpath): hb_mapper's HzPreprocess and its runtime conversion,
applied when the samples are read (docs/hb_rules/input.md)."""

from __future__ import annotations

import numpy as np
import pytest
from camera_toys import camera_images, write_camera_project

from tuner.errors import TunerError
from tuner.inputs.config import load_config
from tuner.inputs.data import dataset_from_config
from tuner.inputs.inputpath import input_path
from tuner.inputs.model import load_model

MEAN = (123.675, 116.28, 103.53)
SCALE = (0.017125, 0.017507, 0.017429)
SHAPE = (1, 3, 32, 32)


def _ideal(x, mean=MEAN, scale=SCALE):
    return (x - np.reshape(mean, (1, 3, 1, 1))) * np.reshape(scale, (1, 3, 1, 1))


def test_nv12_keeps_luma_and_blocks_of_constant_colour():
    """A picture whose colour is constant on every 2x2 block survives 4:2:0 apart from the uint8
    truncation of Y/U/V and the int8 weights (a few thousandths after the scale); a colour that changes
    from pixel to pixel does not."""
    path = input_path("rgb", "nv12", "regular", "NCHW", SHAPE, MEAN, SCALE)
    assert path is not None
    rng = np.random.default_rng(0)
    blocks = np.repeat(np.repeat(rng.integers(0, 256, (1, 3, 16, 16)), 2, axis=2), 2, axis=3).astype(np.float32)
    err = np.abs(path(blocks) - _ideal(blocks))
    assert err.max() < 0.06 and err.mean() < 0.03
    pixels = rng.integers(0, 256, SHAPE).astype(np.float32)
    assert np.abs(path(pixels) - _ideal(pixels)).mean() > 3 * err.mean()


def test_bgr_training_order_is_the_rgb_path_reversed():
    rgb = camera_images(1)[0].astype(np.float32)
    p_rgb = input_path("rgb", "nv12", "regular", "NCHW", SHAPE, MEAN, SCALE)
    p_bgr = input_path("bgr", "nv12", "regular", "NCHW", SHAPE, MEAN[::-1], SCALE[::-1])
    assert p_rgb is not None and p_bgr is not None
    np.testing.assert_allclose(p_bgr(rgb[:, ::-1]), p_rgb(rgb)[:, ::-1], atol=1e-6)


@pytest.mark.parametrize("rt", ["rgb", "bgr", "yuv444"])
def test_full_resolution_paths_lose_only_rounding(rt):
    """rgb/bgr runtimes only swap and shift by 128, their bias rounded to whole weight steps (at most half a
    step, scale / 254); yuv444 converts in float (hb's loader) and back."""
    x = camera_images(1)[0].astype(np.float32)
    path = input_path("rgb", rt, "regular", "NCHW", SHAPE, MEAN, SCALE)
    assert path is not None
    tol = max(SCALE) / 254 + 1e-6 if rt != "yuv444" else 0.03
    np.testing.assert_allclose(path(x), _ideal(x), atol=tol)
    np.testing.assert_allclose(path(x, float_weights=True), _ideal(x), atol=1e-5 if rt != "yuv444" else 0.03)


def test_int8_weights_per_output_row():
    path = input_path("rgb", "nv12", "regular", "NCHW", SHAPE, MEAN, SCALE)
    assert path is not None
    steps = np.abs(path.weight).max(axis=1, keepdims=True) / 127
    q = path.weight_int8 / steps
    np.testing.assert_allclose(q, np.rint(q), atol=1e-9)
    assert (np.abs(np.rint(q)).max(axis=1) == 127).all()
    assert np.abs(path.weight_int8 - path.weight).max() <= steps.max() / 2 + 1e-12


def test_the_bias_is_rounded_to_weight_steps_ties_away_from_zero():
    """The camera toy hb_mapper converted with scale 127/128 (weight step 1/128): b / step = 190.5, -63.5, 63.5
    became 191, -64, 64 in its quantized bias (docs/hb_rules/input.md); the float bias stays for calibration."""
    path = input_path("rgb", "rgb", None, "NCHW", SHAPE, (126.5, 128.5, 127.5), (127 / 128,) * 3)
    assert path is not None
    np.testing.assert_allclose(path.bias * 128, [190.5, -63.5, 63.5])
    np.testing.assert_array_equal(path.bias_int * 128, [191, -64, 64])
    x = np.full((1, 3, 2, 2), 128.0)             # runtime input 0: the output is the bias alone
    np.testing.assert_allclose(path(x)[0, :, 0, 0], [191 / 128, -64 / 128, 64 / 128], rtol=1e-6)
    np.testing.assert_allclose(path(x, float_weights=True)[0, :, 0, 0], path.bias, rtol=1e-6)


def test_ppocr_pixel_128_lands_one_output_step_up():
    """PP-OCRv4 through rgb (mean 127.5, scale 1/127.5): b = 63.5 weight steps, 64 in hb's quantized model, so
    the pixel value 128 is just above half an output step (threshold 1.0) and rounds to 1, as the real
    preprocess output has it; the float bias leaves it just below (0)."""
    path = input_path("bgr", "rgb", None, "NCHW", SHAPE, (127.5,) * 3, (1 / 127.5,) * 3)
    assert path is not None
    x = np.full((1, 3, 1, 1), 128.0)
    ostep = 1.0 / 127
    assert np.rint(path(x)[0, 0, 0, 0] / ostep) == 1
    assert np.rint(path(x, float_weights=True)[0, 0, 0, 0] / ostep) == 0


def test_the_nv12_constant_is_summed_in_float32():
    """hb computes ``b = scale x (A . (128, 128, 128) - A . (0, 128, 128) - mean)`` in float32 (bitwise its
    HzPreprocess bias on the test cache's nv12 conversions): from YUV the constant is 128 only to float32
    rounding, so PP-OCRv4's G row (mean 127.5, scale 1/127.5) sits just below 63.5 weight steps and its integer
    bias is 63 (hb's quantized model: 170 = 63 + 107), while through rgb, where the constant is exactly 128,
    it is 63.5 and rounds to 64."""
    nv12 = input_path("bgr", "nv12", "regular", "NCHW", SHAPE, (127.5,) * 3, (1 / 127.5,) * 3)
    rgb = input_path("bgr", "rgb", None, "NCHW", SHAPE, (127.5,) * 3, (1 / 127.5,) * 3)
    assert nv12 is not None and rgb is not None
    steps = np.abs(nv12.weight).max(axis=1) / 127
    g = nv12.bias[1] / steps[1]
    assert 63.49 < g < 63.5 and np.rint(nv12.bias_int[1] / steps[1]) == 63
    np.testing.assert_array_equal(rgb.bias / (np.abs(rgb.weight).max(axis=1) / 127), [63.5] * 3)
    assert nv12.bias.dtype == np.float64 and np.array_equal(nv12.bias, nv12.bias.astype(np.float32))
    assert np.array_equal(nv12.weight, nv12.weight.astype(np.float32))


@pytest.mark.parametrize("rt,train", [("nv12", "bgr"), ("rgb", "bgr"), ("nv12", "rgb")])
def test_requantize_is_hbs_integer_arithmetic(rt, train):
    """The preprocess output as ``HzSQuantizedPreprocess`` computes it, ``(acc + H) * M >> n``: on the
    int8 grid of the threshold, never more than one step from the simulator's half-to-even rounding of the
    same values, and only where those are within a hundredth of a half step; the simulator's rounding at
    that step leaves them unchanged (so its quantization point on the input is a no-op)."""
    mean, scale = ((127.5,) * 3, (1 / 127.5,) * 3) if train == "bgr" else (MEAN, SCALE)
    path = input_path(train, rt, "regular", "NCHW", SHAPE, mean, scale)
    assert path is not None
    x = np.concatenate([camera_images(4)[i] for i in range(4)]).astype(np.float32)
    y = path(x)
    for threshold in (float(np.abs(y).max()), 0.8 * float(np.abs(y).max())):
        half, mult, shift = path.requant_params(threshold)
        assert ((mult >= 2 ** 14) & (mult < 2 ** 15)).all()
        ratio = np.abs(path.weight).max(axis=1) / 127 / (threshold / 127)
        np.testing.assert_allclose(mult / 2.0 ** shift, ratio, rtol=2.0 ** -14)
        assert (np.abs(half - 0.5 / ratio) <= 0.5).all()
        s = np.float32(threshold / 127)
        out = path.requantize(y, threshold, s)
        assert out.dtype == np.float32 and out.shape == y.shape
        q = np.rint(out / s)
        assert np.abs(out / s - q).max() < 1e-4                        # on the grid
        assert q.min() >= -128 and q.max() <= 127
        np.testing.assert_array_equal(np.rint(np.clip(out / s, -128, 127)) * s, out)
        exact = y.astype(np.float64) / (threshold / 127)
        sim = np.clip(np.rint(exact), -128, 127)
        differ = q != sim
        assert np.abs(q - sim).max() <= 1
        frac = np.abs(exact - np.floor(exact) - 0.5)
        assert (frac[differ & (np.abs(exact) < 127)] < 0.01).all()


def test_the_simulator_feeds_the_requantized_input(tmp_path):
    """Evaluation reads the camera toy's samples requantized at the plan's input threshold (computed once
    per threshold), so its input quantization point sees values already on its grid; hb's calibrated model
    (the log's simulator) keeps the simulator's own rounding."""
    from tuner.workspace import Workspace

    ws = Workspace.open(write_camera_project(tmp_path / "p"))
    sim = ws.simulator
    cand = ws.base_candidate()
    cal, _ = sim.resolve(cand)
    steps = sim._board_steps(sim.plan(cand, cal), cal)
    threshold, s = steps["data"]
    assert threshold == sim.scales(cal).threshold("data")
    board = sim.on.board_samples(steps)
    assert sim.on.board_samples(steps) is board
    path = sim.dataset.inputs[0].path
    assert path is not None
    for x, b in zip(sim.data, board):
        np.testing.assert_array_equal(b["data"], path.requantize(x["data"], threshold, s))
    ev = sim.evaluate(cand)
    sim.calibrated_model = True
    assert sim._board_steps(sim.plan(cand, cal), cal) == {}
    sim.calibrated_model = False
    assert sim.evaluate(cand).outputs == ev.outputs


def test_nhwc_layout_and_no_path_for_featuremaps():
    x = camera_images(1)[0].astype(np.float32)
    nchw = input_path("rgb", "nv12", "regular", "NCHW", SHAPE, MEAN, SCALE)
    nhwc = input_path("rgb", "nv12", "regular", "NHWC", (1, 32, 32, 3), MEAN, SCALE)
    assert nchw is not None and nhwc is not None
    np.testing.assert_allclose(nhwc(x.transpose(0, 2, 3, 1)), nchw(x).transpose(0, 2, 3, 1), atol=1e-6)
    assert input_path("featuremap", "featuremap", None, "NCHW", SHAPE, None, None) is None
    assert input_path("rgb", None, None, "NCHW", SHAPE, MEAN, SCALE) is None


def test_the_data_set_reads_through_the_path_and_scores_against_float(tmp_path):
    cfg = load_config(write_camera_project(tmp_path / "p"))
    model = load_model(cfg.onnx_model)
    data = dataset_from_config(cfg.inputs, model.input_shapes)
    assert data.has_input_path
    raw = camera_images()[0].astype(np.float32)
    board, ideal = next(iter(data))["data"], next(data.float_samples())["data"]
    np.testing.assert_allclose(ideal, _ideal(raw), atol=1e-5)
    assert np.abs(board - ideal).mean() > 0.05                   # the chroma of the noisy toy is lost
    feed = next(data.hb_feeds())["data"]                          # what hb's models take: YUV - 128
    assert feed.min() >= -128 and feed.max() <= 127 and np.array_equal(feed, np.rint(feed))
    cal = data.for_calibration()
    assert cal.fingerprint() != data.fingerprint()
    assert 0 < np.abs(next(iter(cal))["data"] - board).max() < 0.05   # float weights: the rounding only


def test_refusals_where_hb_mapper_fails(tmp_path):
    cfg = write_camera_project(tmp_path / "p", type_rt="rgb")
    text = cfg.read_text()
    cfg.write_text(text.replace("  norm_type:", "  input_space_and_range: 'bt601_video'\n  norm_type:"))
    with pytest.raises(TunerError, match="bt601_video' needs input_type_rt 'nv12'"):
        load_config(cfg)
    cfg.write_text(text.replace("input_type_rt: 'rgb'", "input_type_rt: 'yuv444'"))
    with pytest.raises(TunerError, match="needs float32 calibration files"):
        load_config(cfg)
    cfg.write_text(text.replace("cal_data_type: 'uint8'", "cal_data_type: 'float32'").replace(
        "input_type_rt: 'rgb'", "input_type_rt: 'yuv444'"))
    assert load_config(cfg).inputs[0].type_rt == "yuv444"


@pytest.mark.parametrize("rt", ["rgb", "bgr", "yuv444", "gray", "featuremap"])
def test_input_layout_rt_is_required_but_for_nv12(tmp_path, rt):
    """hb_mapper's parser (horizon_tc_ui/config/mapper_conf_parser.py): without input_layout_rt, every
    input_type_rt but nv12 stops the conversion ("Input_layout_rt missing")."""
    cfg = write_camera_project(tmp_path / "p", type_rt="rgb")
    text = cfg.read_text()
    assert "input_layout_rt" in text
    no_layout = "\n".join(line for line in text.splitlines() if "input_layout_rt" not in line) + "\n"
    cfg.write_text(no_layout.replace("input_type_rt: 'rgb'", f"input_type_rt: '{rt}'"))
    with pytest.raises(TunerError, match="input_layout_rt is missing"):
        load_config(cfg)
    cfg.write_text(no_layout.replace("input_type_rt: 'rgb'", "input_type_rt: 'nv12'"))
    assert load_config(cfg).inputs[0].type_rt == "nv12"


def test_the_loss_split_puts_the_toys_loss_on_its_input_path(tmp_path):
    """The toy's colour noise is per pixel, so 4:2:0 alone costs about a quarter of the output cosine
    (the float model fed the path's values: ~0.74) while the quantized network against the float one on
    those same values keeps ~0.9999; the whole is the outputs' own figure. The network alone is scored
    against the per-node table's reference (the float model on the path values): its output row agrees."""
    from tuner.workspace import Workspace

    ws = Workspace.open(write_camera_project(tmp_path / "p"))
    sim = ws.simulator
    ev = sim.evaluate(ws.base_candidate(), per_node=True, split=True)
    path, net = ev.split["input_path"]["outputs"]["out"], ev.split["network"]["outputs"]["out"]
    assert 0.70 < path["cosine"] < 0.78 and net["cosine"] > 0.9995
    assert abs(ev.outputs["out"]["cosine"] - path["cosine"]) < 0.005
    assert net["sqnr_db"] > 30 > 5 > path["sqnr_db"]
    row = next(r for r in ev.nodes if r.name == "conv2")
    assert abs(row.cosine - net["cosine"]) < 1e-6
    first = sim.on.path_split()
    assert sim.evaluate(ws.base_candidate(), split=True).split["input_path"]["outputs"] == ev.split["input_path"]["outputs"]
    assert sim.on.path_split() is first                                  # one float pass per data set
    assert sim.evaluate(ws.base_candidate()).split is None               # only when asked for


def test_no_split_without_an_input_path(tmp_path):
    from tuner.workspace import Workspace

    cfg = write_camera_project(tmp_path / "p", norm="no_preprocess")
    text = cfg.read_text().replace("input_type_rt: 'nv12'", "input_type_rt: 'featuremap'\n  input_layout_rt: 'NCHW'")
    cfg.write_text(text.replace("input_type_train: 'rgb'", "input_type_train: 'featuremap'"))
    ws = Workspace.open(cfg)
    assert ws.simulator.on.path_split() is None
    assert ws.simulator.evaluate(ws.base_candidate(), split=True).split is None
