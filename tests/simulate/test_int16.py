"""int16 as hb_mapper (X5, bayes-e) spreads it, refuses it and drops it, in the plan and the simulated model.

The rules were measured with toy models on the real toolchain (hb_mapper 1.24.3, O0; docs/hb_rules/placement.md
section 3): an int16 request on one member of a threshold group makes the whole group int16; Resize,
ConvTranspose and GlobalAveragePool's input refuse it (int8, requantized at the boundary); some Convs are set
back to int8 at quantization; an int16 residual input unfuses Conv+Add(+Relu).
"""

import numpy as np
import pytest
from helpers import Toy, write_int16_rules_project
from onnx import numpy_helper

from tuner.candidate import Calibration, Candidate
from tuner.graph import Graph, load_target
from tuner.simulate.plan import make_plan
from tuner.simulate.qdq import build_sim_model
from tuner.workspace import Workspace

DROPPED = "the quantization parameters of conv int16 is not supported, the input datatype of node:{} will be set back to int8."


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    # |x| up to 2: the Conv floor max|w| x T_in = 10 x 2 lies above the Sigmoid's fixed int16 input 11.09
    return Workspace.open(write_int16_rules_project(tmp_path_factory.mktemp("rules"), amplitude=2.0))


@pytest.fixture(scope="module")
def target():
    return load_target("bayes-e")


def sim_scales(ws, cand) -> dict[str, float]:
    """Quantization point -> scale (per-tensor) in the model the simulator runs."""
    sim = ws.simulator
    model = build_sim_model(ws.model.proto, sim.graph, sim.target, sim.plan(cand), sim.scales(cand.calibration),
                            sim.weights)
    inits = {t.name: t for t in model.graph.initializer}
    return {n.name[:-len("_Q")]: float(numpy_helper.to_array(inits[n.input[1]]))
            for n in model.graph.node if n.op_type == "QuantizeLinear"}


def dtype_in(plan, node, k=0):
    return (plan.edges.get((node, k)) or plan.passthrough[(node, k)])[1]


def plan_for(graph, target, nodes=None, optimization=()):
    return make_plan(graph, target, Candidate.make(nodes=nodes or {}, optimization=optimization))


# -- the int16 groups ----------------------------------------------------------------------------------


def slices_and_concat() -> Graph:
    """x -> Slice a (ch 0..3) -> Conv_a; x -> Slice b (ch 4..7); Conv_c(x) -> Relu r; Concat(b, r) -> Conv_f
    (and r also read by Conv_g): the example's input Slices and radar Concat in small."""
    t = Toy()
    a = t.op("Slice", "/Slice_a", ["x", t.const("s0", [0], np.int64), t.const("e0", [4], np.int64),
                                   t.const("ax", [1], np.int64)])
    b = t.op("Slice", "/Slice_b", ["x", t.const("s1", [4], np.int64), t.const("e1", [8], np.int64), "ax"])
    ya = t.conv("/conv_a", a, 4, 4)
    r = t.op("Relu", "/relu_c", [t.conv("/conv_c", "x", 8, 4)])
    cat = t.op("Concat", "/Concat", [b, r], axis=1)
    yf = t.conv("/conv_f", cat, 8, 4)
    yg = t.conv("/conv_g", r, 4, 4)
    return t.graph([ya, yf, yg])


def test_int16_on_one_slice_reader_makes_the_input_group_and_the_concat_int16(target):
    """Measured (the example's int16_2convs, InputType int16 on /stem/conv/Conv which reads /Slice): the input,
    its three Slices, the Concat one of them feeds (every input, also one with another reader: the radar
    Clip output, read by /radar_gate too) and the Concat's reader are int16; the other producers emit it."""
    g = slices_and_concat()
    plan = plan_for(g, target, {"/conv_a": {"InputType": "int16"}})
    assert dtype_in(plan, "/conv_a") == dtype_in(plan, "/Slice_b") == "int16"
    assert dtype_in(plan, "/Concat", 0) == dtype_in(plan, "/Concat", 1) == dtype_in(plan, "/conv_f") == "int16"
    assert dtype_in(plan, "/conv_g") == "int16"                 # r is in the Concat's group
    assert plan.out_dtype["/relu_c"] == "int16"                  # Conv_c+Relu emits int16
    assert dtype_in(plan, "/conv_c") == "int16"                  # x: the Slices' group
    assert plan.notes == []
    # nothing asked: all int8
    assert {d for _, d in plan_for(g, target).edges.values()} == {"int8"}


def test_output_type_int16_spreads_downstream_through_the_concat(target):
    g = slices_and_concat()
    plan = plan_for(g, target, {"/conv_c": {"OutputType": "int16"}})
    # a fused Conv's OutputType reaches its Relu's output (toy Conv+Add+Relu: OutputType on the Conv)
    assert plan.out_dtype["/relu_c"] == "int16"
    assert dtype_in(plan, "/Concat", 0) == dtype_in(plan, "/conv_f") == dtype_in(plan, "/conv_g") == "int16"
    assert dtype_in(plan, "/Slice_b") == "int16" and dtype_in(plan, "/conv_a") == "int16"   # b, hence x's group


def resize_model() -> Graph:
    """Conv_p -> Resize -> Concat(., Relu(Conv_q)) -> Conv_t; Conv_d -> Resize_2 -> Slice -> Sigmoid."""
    t = Toy()
    p = t.op("Relu", "/relu_p", [t.conv("/conv_p", "x", 8, 4, stride=2)])
    roi, scales = t.const("roi", []), t.const("scales", [1, 1, 2, 2])
    up = t.op("Resize", "/Resize", [p, roi, scales], mode="nearest")
    q = t.op("Relu", "/relu_q", [t.conv("/conv_q", "x", 8, 4)])
    yt = t.conv("/conv_t", t.op("Concat", "/Concat", [up, q], axis=1), 8, 4)
    up2 = t.op("Resize", "/Resize_2", [t.conv("/conv_d", "x", 8, 2, stride=2), "roi", "scales"], mode="nearest")
    sl = t.op("Slice", "/Slice", [up2, t.const("s0", [0], np.int64), t.const("e0", [1], np.int64),
                                  t.const("ax", [1], np.int64)])
    sg = t.op("Sigmoid", "/Sigmoid", [sl])
    return t.graph([yt, sg])


def test_a_resize_in_an_int16_group_stays_int8_and_is_requantized(target):
    """Measured (int16_2convs: /fuse/act/Relu_output_0 int16 reaches /dec2/act/Relu_output_0 through /Concat_4
    and /up_2/Resize): the Resize input is int16 in the calibrated model, but the Resize runs int8 (an
    HzRequantize in front), and its int8 output is requantized to int16 for the Concat; hb logs only the
    output line. A Slice behind an int8 Resize passes int8 through (set_all_nodes_int16: /Slice_3 int8)."""
    g = resize_model()
    plan = plan_for(g, target, {"/conv_t": {"InputType": "int16"}})
    assert dtype_in(plan, "/Concat", 0) == dtype_in(plan, "/Concat", 1) == "int16"
    assert dtype_in(plan, "/Resize") == "int8" and plan.out_dtype["/Resize"] == "int8"
    # rounded to int8, then to int16; the model-output Sigmoid reads int16 too (its int16 table), behind
    # the Slice that passes the other Resize's int8 on
    assert plan.emitted == {"/Resize_out": "int8", "/Slice_out": "int8"}
    assert plan.out_dtype["/relu_p"] == "int16"              # the producer emits int16 (requantized for the Resize)
    assert plan.notes == ["The output of Node(name:/Resize, type:Resize) does not support data type: int16 (on "
                          "bayes-e; it stays int8 and is requantized to int16 for its int16 readers, as hb_mapper "
                          "does)"]
    plan = plan_for(g, target, optimization=("set_all_nodes_int16",))
    assert dtype_in(plan, "/Slice") == "int8" and dtype_in(plan, "/Sigmoid") == "int16"
    assert plan.emitted == {"/Resize_out": "int8", "/Slice_out": "int8"} and plan.notes == []


def test_an_int8_producer_is_rounded_to_int8_before_its_int16_reader(ws):
    """The simulated model rounds a ConvTranspose's output to int8 (its own dtype) before the int16 Conv after
    it reads it: the int16 point reads the int8 point's output, at the same threshold."""
    cand = Candidate.make(Calibration("max"), {"/up/Conv": {"InputType": "int16"}})
    sim = ws.simulator
    model = build_sim_model(ws.model.proto, sim.graph, sim.target, sim.plan(cand), sim.scales(cand.calibration),
                            sim.weights)
    by_out = {o: n for n in model.graph.node for o in n.output}
    q16 = next(n for n in model.graph.node if n.name == "/up/ct__int16_Q")
    assert by_out[q16.input[0]].name == "/up/ct__int8_DQ"
    scales = sim_scales(ws, cand)
    assert scales["/up/ct__int8"] * 127 == pytest.approx(scales["/up/ct__int16"] * 32767, rel=1e-6)
    assert np.isfinite(sim.evaluate(cand).outputs["y"]["cosine"])


def test_global_average_pool_refuses_int16_input_but_gives_int16_output(target):
    """Measured (notes 3b, D_gap16 / D_h16; PP-OCRv4 under set_all_nodes_int16): "The input0 of
    Node(name:GAP, type:GlobalAveragePool) does not support data type: int16"; an int16 Conv after it
    gets an int16 GAP output."""
    t = Toy()
    gap = t.op("GlobalAveragePool", "/GAP", [t.conv("/conv_g", "x", 8, 8)])
    y = t.conv("/conv_h", gap, 8, 4, k=1)
    g = t.graph([y])
    plan = plan_for(g, target, {"/GAP": {"InputType": "int16"}})
    assert dtype_in(plan, "/GAP") == "int8"
    assert plan.notes == ["The input0 of Node(name:/GAP, type:GlobalAveragePool) does not support data type: int16 "
                          "(on bayes-e; stays int8, as hb_mapper falls back)"]
    plan = plan_for(g, target, {"/conv_h": {"InputType": "int16"}})
    assert dtype_in(plan, "/conv_h") == "int16" and plan.out_dtype["/GAP"] == "int16" and plan.notes == []
    assert not target.int16_input("GlobalAveragePool") and target.int16_output("GlobalAveragePool")


# -- Convs hb sets back to int8 at quantization ---------------------------------------------------------


def conv_variants() -> Graph:
    t = Toy()
    r = t.op("Relu", "/relu0", [t.conv("/conv0", "x", 8, 8)])
    outs = [t.conv("/dw_s2", r, 8, 8, group=8, stride=2), t.conv("/dw_s1", r, 8, 8, group=8),
            t.conv("/g2_s2", r, 8, 8, group=4, stride=2),        # 2 channels per group
            t.conv("/dense_s2", r, 8, 8, stride=2)]
    t2 = t.op("Relu", "/relu1", [t.conv("/conv1", "x", 8, 29)])
    outs += [t.conv("/out_261", t2, 29, 4)]                         # 29 x 3 x 3 = 261 taps, a model output
    t3 = t.op("Relu", "/relu2", [t.conv("/conv2", "x", 8, 28)])
    outs += [t.conv("/out_252", t3, 28, 4)]                         # 252 taps
    t4 = t.op("Relu", "/relu3", [t.conv("/conv3", "x", 8, 64)])
    outs += [t.op("Relu", "/relu4", [t.conv("/inner_576", t4, 64, 4)])]   # 576 taps, read by the BPU Relu
    return t.graph(outs)


def test_stride_2_depthwise_and_wide_int32_output_convs_drop_int16_at_quantization(target):
    """Toy Convs with InputType int16 on hb_mapper 1.24.3 (O0): set back to int8 ("the quantization parameters
    of conv int16 is not supported ...") for a depthwise Conv with stride 2 and for a Conv leaving the BPU in
    int32 (a model output) with more than 256 taps; kept for a stride-1 depthwise, a 2-channels-per-group
    stride-2 Conv, a dense stride-2 Conv, a 252-tap output Conv and a 576-tap interior Conv."""
    g = conv_variants()
    names = ["/dw_s2", "/dw_s1", "/g2_s2", "/dense_s2", "/out_261", "/out_252", "/inner_576"]
    plan = plan_for(g, target, {n: {"InputType": "int16"} for n in names})
    dropped = {n for n in names if dtype_in(plan, n) == "int8"}
    assert dropped == {"/dw_s2", "/out_261"}
    assert [n for n in plan.notes if "set back" in n] == [DROPPED.format(n) + " (hb_mapper's warning at quantization "
                                                         "on bayes-e; its calibrated model still shows int16)"
                                                         for n in ("/dw_s2", "/out_261")]
    # the tensor stays int16 for its other readers (the calibrated model's qtype): the depthwise reads int8
    assert dtype_in(plan, "/dw_s1") == "int16" and plan.out_dtype["/relu0"] == "int16"
    # the same Conv with a BPU reader after it keeps its int16 input (its output is no int32 accumulator)
    assert dtype_in(plan, "/inner_576") == "int16"
    # J5 (bayes) has no such measurement: nothing dropped
    j5 = plan_for(g, load_target("bayes"), {n: {"InputType": "int16"} for n in names})
    assert all(dtype_in(j5, n) == "int16" for n in names)


# -- the simulated model -------------------------------------------------------------------------------


def test_int16_input_on_a_conv_is_quantized_with_the_int16_scale(ws):
    cand = Candidate.make(Calibration("max"), {"/cancel/Conv": {"InputType": "int16"}})
    table = ws.simulator.scales(cand.calibration)
    scales = sim_scales(ws, cand)
    assert ws.simulator.plan(cand).edges[("/cancel/Conv", 0)] == ("x", "int16")
    assert scales["x__int16"] == pytest.approx(table.threshold("x", "int16") / 32767, rel=1e-6)
    assert "x__int8" not in scales
    int8 = sim_scales(ws, Candidate.make(Calibration("max")))
    assert int8["x__int8"] == pytest.approx(table.threshold("x", "int8") / 127, rel=1e-6)


def test_an_int16_input_conv_keeps_its_own_output_threshold(ws):
    """hmct's AdjustConvQuantParams (hmct/quantizer/calibrater/post/adjust_conv_quant_params.py) puts an int16
    point at max(w thr) x input threshold *in front of* the output's calibration, which keeps its threshold
    and dtype: max|w| x T_in = 10 x ~2 is far above this Conv's output range (~0.2), and the output is
    still quantized in int8 with the threshold it has without the request: here the Sigmoid that alone reads
    it fixes it at 5.49897 (docs/hb_rules/calibration.md 6)."""
    cand = Candidate.make(Calibration("max"), {"/cancel/Conv": {"InputType": "int16"}})
    table = ws.simulator.scales(cand.calibration)
    t_in, t_out = table.threshold("x", "int16"), table.threshold("/cancel/Conv_out", "int8")
    assert 10 * t_in > 20 * t_out
    scales = sim_scales(ws, cand)
    assert scales["/cancel/Conv_out__int8"] == pytest.approx(5.498970031738281 / 127, rel=1e-6)
    assert "/cancel/Conv_out__int16" not in scales
    plain = sim_scales(ws, Candidate.make(Calibration("max")))
    assert plain["/cancel/Conv_out__int8"] == scales["/cancel/Conv_out__int8"]


def test_matmul_int16_second_input_is_refused_in_the_evaluation(ws):
    ev = ws.simulator.evaluate(Candidate.make(Calibration("max"), {"/mm/MatMul": {"InputType": "int16"}}))
    assert "The input1 of Node(name:/mm/MatMul, type:MatMul) does not support data type: int16" in ev.notes[0]
    scales = sim_scales(ws, Candidate.make(Calibration("max"), {"/mm/MatMul": {"InputType": "int16"}}))
    # input 0 (/mm/a, a Reshape of /up/Conv_out: one group) is int16 from /up/Conv on; input 1 (its Transpose)
    # is read in int8
    assert "/up/Conv_out__int16" in scales and "/mm/at__int8" in scales and "/mm/at__int16" not in scales
    assert np.isfinite(ev.outputs["y"]["cosine"])
