"""hb_mapper's camera input path against tuner's (issue 26; skipped without the toolchain): the camera toy
converted at O0 with ``input_type_rt`` nv12 (rgb and bgr training order) and rgb. The preprocess node hb
inserts carries the weights and bias tuner computes, its int8 weights are tuner's, the quantized model takes
int8 (NHWC for nv12), and the real quantized model fed hb's runtime values scores as tuner's simulation does."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from camera_toys import write_camera_project
from onnx import numpy_helper

from tuner.toolchain.fidelity import COSINE_TOL, check_case
from tuner.workspace import Workspace


def _preprocess(path):
    g = onnx.load(str(path)).graph
    node = next(n for n in g.node if n.name == "HZ_PREPROCESS_FOR_data")
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    return node, [inits.get(i) for i in node.input[1:3]], g.input[0]


def _output_threshold(path):
    """The calibrated model's threshold on the preprocess output."""
    g = onnx.load(str(path)).graph
    node = next(n for n in g.node if n.op_type == "HzCalibration" and list(n.input) == ["HZ_PREPROCESS_FOR_data"])
    return next(a.floats[0] for a in node.attribute if a.name == "thresholds")


def _preprocess_outputs(tc, quantized, folder, feeds):
    """The quantized model's int8 preprocess output on each feed: the model with that tensor as an extra
    graph output, run by hmct's executor."""
    from tuner.toolchain.hbexec import run_models

    model = onnx.load(str(quantized))
    node = next(n for n in model.graph.node if n.op_type == "HzSQuantizedPreprocess")
    model.graph.output.append(onnx.helper.make_tensor_value_info(node.output[0], onnx.TensorProto.INT8, None))
    path = folder / "preprocess_out.onnx"
    onnx.save(model, str(path))
    return [o[node.output[0]].astype(np.float64) for o in run_models(tc, [path], feeds)[0]]


def _matrix(w):
    """hb's weight as a (C, C) matrix: it stores only the diagonal when there is no colour mixing."""
    w = np.asarray(w, np.float64).ravel()
    return np.diag(w) if w.size == 3 else w.reshape(3, 3)


@pytest.mark.parametrize("rt,train", [("nv12", "rgb"), ("nv12", "bgr"), ("rgb", "rgb")])
def test_the_input_path_is_hbs(hb_toolchain, tmp_path, rt, train):
    from tuner.toolchain.hbrun import CompileKnobs, convert

    cfg = write_camera_project(tmp_path / "p", type_rt=rt, type_train=train)
    ws = Workspace.open(cfg)
    path = ws.calibration_data.inputs[0].path
    assert path is not None
    conv = convert(hb_toolchain, cfg, CompileKnobs(optimize_level="O0"))
    assert conv.ok, conv.error
    node, (w, b), _ = _preprocess(conv.model("original_float"))
    assert node.op_type == "HzPreprocess"
    # bitwise: hb computes W and b in float32 (inputpath._constant)
    np.testing.assert_array_equal(_matrix(w).astype(np.float32), path.weight.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(b, np.float32), path.bias.astype(np.float32))
    qnode, (wq, bq), qin = _preprocess(conv.model("quantized"))
    assert qnode.op_type == "HzSQuantizedPreprocess"
    steps = np.abs(path.weight).max(axis=1, keepdims=True) / 127
    np.testing.assert_allclose(_matrix(wq) * steps, path.weight_int8, atol=1e-9)
    # the int32 bias: tuner's bias in whole weight steps plus half an output step, rounded on its own; the
    # multiplier and shift of the requantization
    threshold = _output_threshold(conv.model("calibrated"))
    half, mult, shift = path.requant_params(threshold)
    np.testing.assert_array_equal(bq, np.rint(path.bias_int / steps[:, 0]) + half)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in qnode.attribute}
    assert list(mult) == list(attrs["scale"]) and list(shift) == list(attrs["out_shift"])
    # element by element: hb's int8 preprocess output (an extra graph output, hmct's executor) is tuner's
    ws_data = ws.simulator.dataset
    real = _preprocess_outputs(hb_toolchain, conv.model("quantized"), tmp_path, list(ws_data.hb_feeds()))
    scale = np.float32(threshold / 127)
    for sample, out in zip(ws_data, real):
        q = np.rint(path.requantize(sample["data"], threshold, scale) / scale)
        np.testing.assert_array_equal(q, out if out.shape == q.shape else out.transpose(0, 3, 1, 2))
    assert qin.type.tensor_type.elem_type == onnx.TensorProto.INT8
    if rt == "nv12":
        assert [d.dim_value for d in qin.type.tensor_type.shape.dim] == [1, 32, 32, 3]
    result, _ = check_case(hb_toolchain, ws, cfg, "camera", f"{rt}_{train}")
    assert result.ok, result.error
    for o in result.outputs:
        assert abs(o.sim_cosine - o.real_cosine) <= COSINE_TOL, o
    assert result.threshold_pairs > 0 and not result.threshold_off, result.threshold_off
    assert not result.dtype_off
    if rt == "nv12":     # the toy's pixel-level chroma is lost by 4:2:0: a visible loss, reproduced
        assert result.outputs[0].real_cosine < 0.9


def test_the_bias_ties_round_away_from_zero(hb_toolchain, tmp_path):
    """Scale 127/128 makes the weight step 1/128, and means 126.5 / 128.5 / 127.5 put ``b`` on 190.5 / -63.5 /
    63.5 steps: hb's int32 bias is 191 / -64 / 64 plus half an output step (half to even would give 190,
    half up -63)."""
    from tuner.toolchain.hbrun import CompileKnobs, convert

    cfg = write_camera_project(tmp_path / "p", type_rt="rgb", mean="126.5 128.5 127.5", scale=" ".join(["0.9921875"] * 3))
    path = Workspace.open(cfg).calibration_data.inputs[0].path
    assert path is not None
    np.testing.assert_allclose(path.bias * 128, [190.5, -63.5, 63.5])
    conv = convert(hb_toolchain, cfg, CompileKnobs(optimize_level="O0"))
    assert conv.ok, conv.error
    _, (_, bq), _ = _preprocess(conv.model("quantized"))
    half = np.rint(0.5 * _output_threshold(conv.model("calibrated")) / 127 * 128)
    np.testing.assert_array_equal(bq - half, [191, -64, 64])
    np.testing.assert_array_equal(path.bias_int * 128, [191, -64, 64])
