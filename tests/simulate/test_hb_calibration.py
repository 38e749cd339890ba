"""hb_mapper's per-channel and asymmetric rules (hb_quantizer_facts 1.5, 1.6), end to end."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import hb_yaml
from onnx import TensorProto, helper, numpy_helper

from tuner.candidate import Calibration, Candidate
from tuner.simulate.qdq import fake_quant_weight
from tuner.workspace import Workspace

#: r = |x| computed in float on the CPU, so that r's quantization at the Conv and the Sub is the only one
CPU_ABS = {"/abs": {"ON": "CPU"}}
CHANNEL_RANGE = np.array([0.05, 1.0, 10.0, 200.0], np.float32)


def write_project(root: Path, n: int = 6) -> Path:
    """x (4 channels on very different scales) -> Abs -> r; r feeds a Conv (y) and an Add (z)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((6, 4, 3, 3)) * 0.2).astype(np.float32), "w")
    b = numpy_helper.from_array((rng.standard_normal(6) * 0.1).astype(np.float32), "b")
    off = numpy_helper.from_array(np.array([0.5], np.float32), "off")
    nodes = [helper.make_node("Abs", ["x"], ["r"], name="/abs"),
             helper.make_node("Conv", ["r", "w", "b"], ["y"], name="/conv", pads=[1] * 4),
             helper.make_node("Sub", ["r", "off"], ["z"], name="/sub")]
    graph = helper.make_graph(nodes, "pc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 8, 8]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, 8, 8])], [w, b, off])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    onnx.save(model, str(root / "pc.onnx"))
    (root / "cal").mkdir(exist_ok=True)
    for i in range(n):
        x = (rng.uniform(-0.2, 1.0, (1, 4, 8, 8)) * CHANNEL_RANGE[None, :, None, None]).astype(np.float32)
        x.tofile(root / "cal" / f"{i:04d}.bin")
    cfg = root / "hb_config.yaml"
    cfg.write_text(hb_yaml("pc.onnx", "x", "1x4x8x8", prefix="pc"))
    return cfg


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNER_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        yield Workspace.open(write_project(tmp_path_factory.mktemp("pc")))


def _fq(x, scale, lo, hi, axis=None):
    if axis is not None:
        scale = scale.reshape((1, -1) + (1,) * (x.ndim - 2))
    return np.clip(np.round(x / scale), lo, hi) * scale


def test_per_channel_scales_reach_the_conv_only_by_equalization(ws):
    """Deployed arithmetic written out independently: the Conv input is quantized per channel
    (t_c / 127), dequantized with max_c t_c (dequantize_scale), and multiplied by the weights scaled
    by t_c / max t and only then int8-quantized per output channel; the Sub reading the same tensor
    gets one per-tensor scale."""
    sim = ws.simulator
    cand = Candidate.make(Calibration("max", per_channel=True), CPU_ABS)
    got = sim.evaluate(cand)
    sample = next(iter(ws.eval_data))
    x = sample["x"]
    r = np.abs(x)
    st = ws.stats["r"]
    t = np.asarray(st.channel_absmax, np.float64)
    T = t.max()
    q = np.clip(np.round(r / (t / 127).reshape(1, -1, 1, 1)), -128, 127)
    r_deq = (q * T / 127).astype(np.float32)
    w = numpy_helper.to_array(ws.graph.initializers["w"]).astype(np.float64)
    w_scaled = fake_quant_weight(w * (t / T).reshape(1, -1, 1, 1), 0).astype(np.float32)
    conv = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["a", "w"], ["y"], pads=[1] * 4)], "c",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w_scaled, "w")]),
        opset_imports=[helper.make_opsetid("", 11)])
    y_ref = ort.InferenceSession(conv.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": r_deq})[0]
    # the bias is int32 with scale dequantize_scale * w_scale[o]
    b = numpy_helper.to_array(ws.graph.initializers["b"]).astype(np.float64)
    w_s = np.abs(w * (t / T).reshape(1, -1, 1, 1)).reshape(6, -1).max(axis=1) / 127
    b_q = np.round(b / (T / 127 * w_s)) * (T / 127 * w_s)
    y_ref = y_ref + b_q.reshape(1, -1, 1, 1).astype(np.float32)
    sim_y, _ = sim.tensors(cand, ["y", "z"], sample)
    np.testing.assert_allclose(sim_y["y"], y_ref, rtol=1e-4, atol=1e-4 * float(np.abs(y_ref).max()))
    # z = r - 0.5 reads r through one per-tensor scale: channel 0 (range 0.05) is crushed there
    per_tensor = _fq(r, np.float64(st.absmax / 127), -127, 127)
    # the model output, rounded too: in int16 at its own threshold (a BPU Sub's output no BPU node reads
    # leaves the BPU in int16, hb's <out>_before node)
    z_scale = float(sim.scales(cand.calibration).get("z", "int16").scale)
    np.testing.assert_allclose(sim_y["z"], _fq(per_tensor - 0.5, z_scale, -32767, 32767), atol=1e-5)
    # and per-channel calibration helps the Conv's output but not the Sub's
    base = sim.evaluate(Candidate.make(Calibration("max"), CPU_ABS))
    assert got.outputs["y"]["sqnr_db"] > base.outputs["y"]["sqnr_db"] + 1
    assert got.outputs["z"]["cosine"] == pytest.approx(base.outputs["z"]["cosine"], abs=1e-12)


def test_asymmetric_leaves_a_non_negative_tensor_outside_a_conv_group_int8(ws):
    """r = |x| is non-negative, but hb's asymmetric pass makes only Conv+Relu/Clip outputs uint8
    (measured: an Abs output stays int8; tests/simulate/test_fixed.py has the rule): under every
    asymmetric method this model simulates exactly as its symmetric twin."""
    sim = ws.simulator
    for cal in (Calibration("max", asymmetric=True), Calibration("max", max_percentile=0.999, asymmetric=True)):
        twin = Calibration("max", max_percentile=cal.max_percentile)
        plan = sim.plan(Candidate.make(cal, CPU_ABS))
        assert not plan.unsigned
        asym, sym = sim.evaluate(Candidate.make(cal, CPU_ABS)), sim.evaluate(Candidate.make(twin, CPU_ABS))
        for out in ("y", "z"):
            assert asym.outputs[out]["cosine"] == sym.outputs[out]["cosine"]
