"""An int16 input into a Conv that writes a per-channel tensor (tuner.simulate.adjust,
docs/hb_rules/calibration.md section 5): hb's AdjustConvQuantParams copy multiplies the tensor by up to
~258 before its equalized reader, and the model collapses; tuner simulates the same.

The toy: x -> Conv -> Sigmoid -> Mul by 8 channel constants (20 .. 0.5, a lowered Mul, hb's unit Conv)
-> depthwise Conv -> Relu -> Conv; the Mul's output is per channel under per_channel (maximum 20 >= 16,
a depthwise reader). int16 on the Sigmoid's output makes the lowered Mul's input int16.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import hb_yaml
from onnx import TensorProto, helper, numpy_helper

from tuner.candidate import Calibration, Candidate
from tuner.simulate.adjust import QMAX16, adjustment
from tuner.simulate.perchannel import channel_scales
from tuner.workspace import Workspace

K = np.array([20, 10, 5, 2, 1, 0.5, 12, 3], np.float32)
PER_CHANNEL = Calibration("max", per_channel=True)
SIG16 = {"sig": {"OutputType": "int16"}}
MUL16 = {"mul": {"InputType": "int16", "OutputType": "int16"}}


def write_toy(root: Path, n: int = 8) -> Path:
    rng = np.random.default_rng(0)
    c = K.size
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (c, 3, 3, 3)).astype(np.float32), "w0"),
             numpy_helper.from_array(K.reshape(1, c, 1, 1), "k"),
             numpy_helper.from_array(rng.normal(0, 0.3, (c, 1, 3, 3)).astype(np.float32), "dw"),
             numpy_helper.from_array(rng.normal(0, 0.3, (4, c, 1, 1)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c0"], ["s"], name="sig"),
             helper.make_node("Mul", ["s", "k"], ["m"], name="mul"),
             helper.make_node("Conv", ["m", "dw"], ["d"], name="dwconv", group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["d"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2")]
    graph = helper.make_graph(nodes, "toy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])], inits)
    root.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7), str(root / "toy.onnx"))
    (root / "cal").mkdir(exist_ok=True)
    for i in range(n):
        rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32).tofile(root / "cal" / f"{i:04d}.bin")
    cfg = root / "hb_config.yaml"
    cfg.write_text(hb_yaml("toy.onnx", "x", "1x3x16x16", prefix="toy").replace("per_channel: False", "per_channel: True"))
    return cfg


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNER_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        cfg = write_toy(tmp_path_factory.mktemp("adjust"))
        yield cfg, Workspace.open(cfg)


def test_the_copy_of_ppocrs_p2o_add_15():
    """PP-OCRv4's p2o.Add.15 (hb's calibrated model, int16 on p2o.Mul.8, max-percentile 0.99999): the
    unit weight 0.633 x the int16 input's 69.35 = 43.89 replaces channel 0's 5.529 (T 46.0 over its scale
    8.32); the copy dequantizes with the int8 node's 0.3622 = 46.0 / 127: x 270."""
    out = np.array([46.0 / 8.3208, 46.0 / 2.4842, 46.0])
    thr, gain = adjustment(np.array([0.63297]), 69.348, out, 46.0 / 127)
    np.testing.assert_allclose(thr, [43.895, 43.895, 46.0], rtol=1e-4)
    np.testing.assert_allclose(gain, [46.0 / 127 * QMAX16 / 43.895] * 2 + [QMAX16 / 127], rtol=1e-4)
    assert gain[0] == pytest.approx(270.4, rel=1e-3)
    # an int16 output node dequantizes at T / 32767: only the 4.8 % of 46.0 over 43.89 is left
    assert adjustment(np.array([0.63297]), 69.348, out, 46.0 / QMAX16)[1][0] == pytest.approx(1.048, rel=1e-3)
    # nothing inserted where no channel's w x in reaches its threshold
    assert adjustment(np.array([0.5]), 10.0, out, 46.0 / 127) is None


def test_the_gain_is_the_copys_and_the_output_collapses(toy):
    """The simulated model carries the copy's gain, computed here from the statistics (w_c = |k_c|, the
    Sigmoid's int16 output at its fixed 1.0, T_c = T / cs_c); int16 or per_channel alone leave the toy
    at cosine > 0.999, together they collapse it (hb: 0.4287 quantized, 0.4286 calibrated)."""
    _, ws = toy
    sim = ws.simulator
    cand = Candidate.make(PER_CHANNEL, SIG16)
    plan = sim.plan(cand)
    cs = channel_scales(ws.graph, plan, sim.stats)["m"]
    T = float(np.max(sim.stats["m"].channel_absmax))
    t_c = T / cs
    expect = (T / 127) * QMAX16 / np.maximum(K * 1.0, t_c)
    gains = {t.name: numpy_helper.to_array(t).ravel() for t in _sim_model(sim, cand).graph.initializer
             if t.name.endswith("__adj_gain")}
    assert set(gains) == {"m__adj_gain"}
    np.testing.assert_allclose(gains["m__adj_gain"], expect, rtol=1e-4)
    assert np.all(gains["m__adj_gain"] > 200)
    assert sim.evaluate(cand).mean_cosine < 0.6
    for ok in (Candidate.make(PER_CHANNEL), Candidate.make(Calibration("max"), SIG16)):
        assert sim.evaluate(ok).mean_cosine > 0.999
        assert not any(t.name.endswith("__adj_gain") for t in _sim_model(sim, ok).graph.initializer)


def _sim_model(sim, cand: Candidate) -> onnx.ModelProto:
    cal, _ = sim.resolve(cand)
    return sim.side.build(sim.plan(cand, cal), sim.scales(cal), {})


def test_the_real_tool_collapses_as_simulated(hb_toolchain, toy, tmp_path):
    """The toy converted at O0: hb's calibrated model has the int16 copy with the int8 node's
    dequantize_scale, and its quantized model's output cosine is the simulated one (within 0.005), for
    int16 on the Sigmoid (int8 reader) and on the Mul (int16 reader: gain = the channel scale, clipped)."""
    from tuner.inputs.calibrated import read_calibrated
    from tuner.toolchain.fidelity import Case, check_case, write_case
    from tuner.toolchain.hbrun import CompileKnobs, convert

    cfg, ws = toy
    for name, nodes in (("sig16", SIG16), ("mul16", MUL16)):
        path = write_case(cfg, Case(name, node_info=nodes), tmp_path)
        result, _ = check_case(hb_toolchain, ws, path, "toy", name, knobs=CompileKnobs(optimize_level="O0"))
        assert result.ok, result.error
        (out,) = result.outputs
        assert out.real_cosine < 0.6, out
        assert abs(out.sim_cosine - out.real_cosine) <= 0.005, out
        real = read_calibrated(convert(hb_toolchain, path, CompileKnobs(optimize_level="O0")).model("calibrated"))
        copies = [n for n in real.activations() if n.tensor == "m" and n.qtype == "int16" and n.dequantize_scale]
        assert copies, name
