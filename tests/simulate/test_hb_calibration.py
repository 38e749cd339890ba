"""hb_mapper's asymmetric rule (docs/hb_rules/quantizer.md §1.6), end to end (per_channel: test_per_channel.py)."""

from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import hb_yaml
from onnx import TensorProto, helper, numpy_helper

from tuner.candidate import Calibration, Candidate
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
