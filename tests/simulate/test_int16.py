"""int16 on Conv and MatMul in the simulated model (bayes-e), on the model of helpers.build_int16_rules_model."""

import numpy as np
import pytest
from helpers import write_int16_rules_project
from onnx import numpy_helper

from tuner.candidate import Calibration, Candidate
from tuner.simulate.qdq import build_sim_model
from tuner.workspace import Workspace


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    # |x| up to 2: the Conv floor max|w| x T_in = 10 x 2 lies above the Sigmoid's fixed int16 input 11.09
    return Workspace.open(write_int16_rules_project(tmp_path_factory.mktemp("rules"), amplitude=2.0))


def sim_scales(ws, cand) -> dict[str, float]:
    """Quantization point -> scale (per-tensor) in the model the simulator runs."""
    sim = ws.simulator
    model = build_sim_model(ws.model.proto, sim.graph, sim.target, sim.plan(cand), sim.scales(cand.calibration),
                            sim.weights)
    inits = {t.name: t for t in model.graph.initializer}
    return {n.name[:-len("_Q")]: float(numpy_helper.to_array(inits[n.input[1]]))
            for n in model.graph.node if n.op_type == "QuantizeLinear"}


def test_int16_input_on_a_conv_is_quantized_with_the_int16_scale(ws):
    cand = Candidate.make(Calibration("max"), {"/cancel/Conv": {"InputType": "int16"}})
    table = ws.simulator.scales(cand.calibration)
    scales = sim_scales(ws, cand)
    assert ws.simulator.plan(cand).edges[("/cancel/Conv", 0)] == ("x", "int16")
    assert scales["x__int16"] == pytest.approx(table.threshold("x", "int16") / 32767, rel=1e-6)
    assert "x__int8" not in scales
    int8 = sim_scales(ws, Candidate.make(Calibration("max")))
    assert int8["x__int8"] == pytest.approx(table.threshold("x", "int8") / 127, rel=1e-6)


def test_adjust_conv_quant_params_floors_the_int16_conv_output(ws):
    """max|w| x T_in = 10 x ~2 is far above the cancelling Conv's own output range (~0.2) and above the
    fixed int16 input threshold of the Sigmoid that alone reads it (11.09031): the floor binds (hb keeps
    the floor on the Conv's output node and the Sigmoid's 11.09 on a second one, tuner one point at the
    floor: docs/hb_rules/calibration.md 6)."""
    cand = Candidate.make(Calibration("max"), {"/cancel/Conv": {"InputType": "int16"}})
    table = ws.simulator.scales(cand.calibration)
    t_in, t_out = table.threshold("x", "int16"), table.threshold("/cancel/Conv_out", "int16")
    assert 10 * t_in > 20 * t_out and 10 * t_in > 1.5 * 11.09031
    scales = sim_scales(ws, cand)
    assert scales["/cancel/Conv_out__int16"] == pytest.approx(10.0 * t_in / 32767, rel=1e-6)
    # no int16 input: no floor; the output, read by the Sigmoid alone, takes hb's fixed 5.49897
    plain = sim_scales(ws, Candidate.make(Calibration("max")))
    assert plain["/cancel/Conv_out__int8"] == pytest.approx(5.498970031738281 / 127, rel=1e-6)
    # under per_channel the output stays per-tensor (no Conv reads it: per-channel activation scales
    # exist only on Conv inputs, hb_quantizer_facts 1.5) and still gets the floor (max|w| = 10)
    pc = Candidate.make(Calibration("max", per_channel=True), {"/cancel/Conv": {"InputType": "int16"}})
    sim = ws.simulator
    model = build_sim_model(ws.model.proto, sim.graph, sim.target, sim.plan(pc), sim.scales(pc.calibration), sim.weights)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    s = inits["/cancel/Conv_out__int16_scale"]
    assert s.shape == () and np.all(s >= 10.0 * sim.scales(pc.calibration).threshold("x", "int16") / 32767 * (1 - 1e-6))


def test_matmul_int16_second_input_is_refused_in_the_evaluation(ws):
    ev = ws.simulator.evaluate(Candidate.make(Calibration("max"), {"/mm/MatMul": {"InputType": "int16"}}))
    assert "The input1 of Node(name:/mm/MatMul, type:MatMul) does not support data type: int16" in ev.notes[0]
    scales = sim_scales(ws, Candidate.make(Calibration("max"), {"/mm/MatMul": {"InputType": "int16"}}))
    assert "/mm/a__int16" in scales and "/mm/at__int16" not in scales
    assert np.isfinite(ev.outputs["y"]["cosine"])
