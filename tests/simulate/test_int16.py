"""int16 as hb_mapper (X5, bayes-e) spreads it, refuses it and drops it, in the plan and the simulated model.

The rules were measured with toy models on the real toolchain (hb_mapper 1.24.3, O0; docs/hb_rules/placement.md
section 3): an int16 request on one member of a threshold group makes the whole group int16; Resize,
ConvTranspose and GlobalAveragePool's input refuse it (int8, requantized at the boundary); some Convs are set
back to int8 at quantization; an int16 residual input unfuses Conv+Add(+Relu). Where an entry lands (section 3g):
an OutputType goes to the readers of the fusion group's output (a refusing Resize takes nothing), an InputType on
a fused Relu means the same, an int16 Conv input unfuses its residual Add, an entry on the Clip of Conv+Clip
unfuses it; tables with an int16 output read int16; a BPU comparison compares integers.
"""

from pathlib import Path

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


# -- where an int16 entry lands (toy series U, V, W, X, Y, Z, P, GU, Q on hb_mapper 1.24.3 at O0; placement.md 3g) ------


def decoder() -> Graph:
    """Conv0+Relu0 -> a; Conv1+Relu1 (stride 2) -> b; Conv2+Relu2 -> d -> Resize -> Concat(., a) -> Conv3+Relu3
    -> Conv4: the example's decoder step in small (toy series U)."""
    t = Toy()
    a = t.op("Relu", "/relu0", [t.conv("/c0", "x", 8, 8)])
    b = t.op("Relu", "/relu1", [t.conv("/c1", a, 8, 8, stride=2)])
    d = t.op("Relu", "/relu2", [t.conv("/c2", b, 8, 8)])
    up = t.op("Resize", "/rs", [d, t.const("roi", []), t.const("sc", [1, 1, 2, 2])], mode="nearest")
    e = t.op("Relu", "/relu3", [t.conv("/c3", t.op("Concat", "/cat", [up, a], axis=1), 16, 8)])
    return t.graph([t.conv("/c4", e, 8, 4, k=1)])


def int16_inputs(plan) -> set[tuple[str, int]]:
    return {key for key, (_, d) in list(plan.edges.items()) + list(plan.passthrough.items()) if d == "int16"}


def test_an_output_request_goes_to_the_readers_of_the_group_and_a_resize_takes_none(target):
    """hb hands an OutputType int16 (on any member of a fusion group; an InputType on the Relu fused after the
    Conv means the same) to the readers of the group's output, as an InputType on each. U1, U2, U3: only a
    Resize reads Conv2+Relu2, it refuses ("The input0 of Node(name:rs, type:Resize) does not support data type:
    int16") and nothing is int16; U4, U5, U6: Conv2 reads Conv1+Relu1, its input is int16; U7: Conv1 and the
    Concat read Conv0+Relu0, both take int16 and the Concat's group reaches the Resize (int16 in hb's calibrated
    model, int8 when it runs). The example's int16_top5 (int16 on /dec3/act/Relu, read by /up_1/Resize only)
    and pareto_t14 (/dec2/conv/Conv, read through its Relu by /up_2/Resize only) were int16 in tuner's plan from
    the Relu to the next Conv's input; hb kept them int8."""
    g = decoder()
    refused = "The input0 of Node(name:/rs, type:Resize) does not support data type: int16"
    for entry in ({"/relu2": {"OutputType": "int16"}}, {"/relu2": {"InputType": "int16"}}, {"/c2": {"OutputType": "int16"}}):
        plan = plan_for(g, target, entry)
        assert int16_inputs(plan) == set() and plan.out_dtype["/relu2"] == "int8", entry
        assert any(n.startswith(refused) for n in plan.notes), entry
    for entry in ({"/relu1": {"OutputType": "int16"}}, {"/relu1": {"InputType": "int16"}}, {"/c1": {"OutputType": "int16"}}):
        plan = plan_for(g, target, entry)
        assert int16_inputs(plan) == {("/c2", 0)} and plan.out_dtype["/relu1"] == "int16", entry
    plan = plan_for(g, target, {"/relu0": {"OutputType": "int16"}})
    assert int16_inputs(plan) == {("/c1", 0), ("/cat", 0), ("/cat", 1), ("/c3", 0)}
    assert plan.out_dtype["/relu2"] == "int16" and plan.calibrated[("/rs", 0)] == ("/relu2_out", "int16")


def add_then(op: str) -> Graph:
    """Conv0+Relu0 and Conv1+Relu1 -> Add -> MaxPool / Clip(0, 6) "/mid" -> Resize -> Conv3 (toys Y2, Y3)."""
    t = Toy()
    a = t.op("Relu", "/relu0", [t.conv("/c0", "x", 8, 8)])
    b = t.op("Relu", "/relu1", [t.conv("/c1", "x", 8, 8)])
    s = t.op("Add", "/add", [a, b])
    if op == "MaxPool":
        m = t.op("MaxPool", "/mid", [s], kernel_shape=[2, 2], strides=[2, 2])
    else:
        m = t.op("Clip", "/mid", [s, t.const("lo", 0.0), t.const("hi", 6.0)])
    up = t.op("Resize", "/rs", [m, t.const("roi", []), t.const("sc", [1, 1, 2, 2])], mode="nearest")
    return t.graph([t.conv("/c3", up, 8, 4, k=1)])


@pytest.mark.parametrize("op", ["MaxPool", "Clip"])
def test_a_pass_through_op_takes_an_output_request_to_its_input(target, op):
    """Y2, Y3: OutputType int16 on a MaxPool or a standalone Clip whose only reader is a Resize: the Resize
    refuses, yet the op's input (the Add output), the op and the Conv behind the Resize are int16: the op joins
    its input's threshold group, which the request reaches. The Clip keeps its input's threshold (12.2 on
    both sides, measured also without any entry, Y4)."""
    g = add_then(op)
    plan = plan_for(g, target, {"/mid": {"OutputType": "int16"}})
    assert dtype_in(plan, "/mid") == dtype_in(plan, "/c3") == "int16" and plan.out_dtype["/add"] == "int16"
    assert dtype_in(plan, "/rs") == "int8"
    if op == "Clip":
        assert plan.scale_of["/mid_out"] == "/add_out" == plan_for(g, target).scale_of["/mid_out"]


def residual_block() -> Graph:
    """Conv0+Relu0 -> r; Conv1+Relu1 -> s; Conv2(s) + r -> Add -> Relu2 -> Conv3 (toy series V)."""
    t = Toy()
    r = t.op("Relu", "/relu0", [t.conv("/c0", "x", 8, 8)])
    s = t.op("Relu", "/relu1", [t.conv("/c1", r, 8, 8)])
    p = t.op("Relu", "/relu2", [t.op("Add", "/add", [t.conv("/c2", s, 8, 8), r])])
    return t.graph([t.conv("/c3", p, 8, 4, k=1)])


def test_an_int16_conv_input_unfuses_its_residual_add(target):
    """V3, V5: int16 on the input of the Conv heading Conv+Add+Relu (InputType on the Conv, or on the Relu fused
    before it), the residual int8, unfuses the group: the Conv's output gets an int8 calibration of its own
    (28.0), the Add and the Relu are rows of their own. V4, V6: OutputType on the Conv, InputType on its Relu
    keep it fused and make the Relu's output int16. R7: an InputType on the Add unfuses it and makes its Relu's
    output int16 (its input too: an int16 table). The example's pareto_t14: /enc3/enc3.1/conv2/Conv."""
    g = residual_block()
    assert ("/c2", "/add") in plan_for(g, target).fused
    for entry in ({"/c2": {"InputType": "int16"}}, {"/relu1": {"InputType": "int16"}}):
        plan = plan_for(g, target, entry)
        assert not {("/c2", "/add"), ("/add", "/relu2")} & plan.fused, entry
        assert dtype_in(plan, "/c2") == "int16" and dtype_in(plan, "/add", 0) == dtype_in(plan, "/add", 1) == "int8"
    for entry in ({"/c2": {"OutputType": "int16"}}, {"/relu2": {"InputType": "int16"}}):
        plan = plan_for(g, target, entry)
        assert ("/c2", "/add") in plan.fused and plan.out_dtype["/relu2"] == "int16", entry
        assert int16_inputs(plan) == {("/c3", 0)}
    plan = plan_for(g, target, {"/add": {"InputType": "int16"}})
    assert ("/c2", "/add") not in plan.fused
    assert dtype_in(plan, "/add", 0) == dtype_in(plan, "/add", 1) == dtype_in(plan, "/relu2") == "int16"
    assert dtype_in(plan, "/c3") == "int16"


def conv_clip_resize() -> Graph:
    """Conv0+Clip(0, 6) -> Resize -> Conv4 (toys W5, X4)."""
    t = Toy()
    c = t.op("Clip", "/clip", [t.conv("/c0", "x", 8, 8), t.const("lo", 0.0), t.const("hi", 6.0)])
    up = t.op("Resize", "/rs", [c, t.const("roi", []), t.const("sc", [1, 1, 2, 2])], mode="nearest")
    return t.graph([t.conv("/c4", up, 8, 4, k=1)])


def test_an_int16_entry_on_the_clip_of_conv_clip_unfuses_it(target):
    """W5 (InputType on the Clip), X4 (OutputType on it): the Conv's output gets an int16 calibration of its own
    at 9.72 / 18.6, the Clip (a table) keeps that threshold, the Conv after the Resize reads int16. The example's
    pareto_t22 and pareto_t23 (int16 in and out on /radar/act/Clip). set_all_nodes_int16 keeps Conv+Clip fused
    (the example's all_int16), so does an OutputType on the Conv (W6)."""
    g = conv_clip_resize()
    for entry in ({"/clip": {"InputType": "int16"}}, {"/clip": {"OutputType": "int16"}}):
        plan = plan_for(g, target, entry)
        assert ("/c0", "/clip") not in plan.fused, entry
        assert dtype_in(plan, "/clip") == dtype_in(plan, "/c4") == "int16" and plan.out_dtype["/c0"] == "int16"
        assert plan.scale_of["/clip_out"] == "/c0_out"
    assert ("/c0", "/clip") in plan_for(g, target, optimization=("set_all_nodes_int16",)).fused
    plan = plan_for(g, target, {"/c0": {"OutputType": "int16"}})
    assert ("/c0", "/clip") in plan.fused and int16_inputs(plan) == set()


def test_a_table_with_an_int16_output_reads_int16(target):
    """A function table whose output is int16 reads its input in int16, whatever made the output int16: toy S1
    (an int16 Mul reads a Sigmoid: the Sigmoid's input int16 at 11.09) and the example's pareto_t14 (/Sigmoid_2,
    read by the int16 /Mul_3; /Sigmoid_1 beside it through the shared Resize output); a standalone Relu too
    (pareto_t14's /enc3/enc3.1/relu/Relu after its unfused Add)."""
    t = Toy()
    sig = t.op("Sigmoid", "/sig", [t.conv("/c0", "x", 8, 8)])
    m = t.op("Mul", "/mul", [sig, t.op("Relu", "/relu1", [t.conv("/c1", "x", 8, 8)])])
    r = t.op("Relu", "/relu2", [t.op("Add", "/add", [m, "x"])])
    g = t.graph([t.conv("/c3", r, 8, 4, k=1)])
    plan = plan_for(g, target, {"/mul": {"InputType": "int16"}})
    assert dtype_in(plan, "/mul", 0) == dtype_in(plan, "/sig") == "int16" and plan.out_dtype["/c0"] == "int16"
    plan = plan_for(g, target, {"/c3": {"InputType": "int16"}})
    assert dtype_in(plan, "/relu2") == "int16" and plan.out_dtype["/add"] == "int16"
    assert dtype_in(plan, "/add", 0) == dtype_in(plan, "/sig") == "int8"        # an Add is no table


@pytest.mark.parametrize("back", [False, True])
def test_a_table_read_by_the_cpu_is_int8_when_the_cpu_feeds_the_bpu_again(target, back):
    """Z4 / Z8: a Sigmoid read only by a CPU Conv leaves the BPU in int16 (its input too) when that Conv is the
    model's end, in int8 when a BPU Conv reads the CPU Conv's output (so do Tanh and HardSwish, Z3 / Z10,
    Z1 / Z9; PP-OCRv4's HardSwish p2o.Mul.2 before its CPU p2o.Conv.2 in the latency benchmark's cpu_shallow)."""
    t = Toy()
    y = t.conv("/c1", t.op("Sigmoid", "/sig", [t.conv("/c0", "x", 8, 8)]), 8, 4, k=1)
    if back:
        y = t.conv("/c2", y, 4, 4, k=1)
    plan = plan_for(t.graph([y]), target, {"/c1": {"ON": "CPU"}})
    want = "int8" if back else "int16"
    assert plan.out_dtype["/sig"] == dtype_in(plan, "/sig") == want


def concat_to_cpu(elementwise: bool) -> Graph:
    """Concat(Mul(Conv0+Relu0, Sigmoid(Conv4)) or Conv0+Relu0, Conv3+Clip) -> Conv1; Conv3+Clip also read by
    Conv2 (toys P1, Z6)."""
    t = Toy()
    a = t.op("Relu", "/relu0", [t.conv("/c0", "x", 8, 8)])
    if elementwise:
        a = t.op("Mul", "/mul", [a, t.op("Sigmoid", "/sig", [t.conv("/c4", "x", 8, 8)])])
    b = t.op("Clip", "/clip3", [t.conv("/c3", "x", 8, 8), t.const("lo", 0.0), t.const("hi", 6.0)])
    cat = t.op("Concat", "/cat", [a, b], axis=1)
    return t.graph([t.conv("/c1", cat, 16, 4, k=1), t.conv("/c2", b, 8, 4, k=1)])


def test_a_concat_follows_its_cpu_reader_only_when_its_inputs_can_be_handed_over(target):
    """Z6: a Concat of two Conv groups read by a CPU Conv goes to the CPU (the groups hand over int32); P1, P2: with
    a Mul or Add of two feature maps as one input it stays on the BPU and leaves in int16, which its group
    (also the Clip output the BPU Conv2 reads) takes. The example's cpu_shallow (latency benchmark): /Concat_1,
    of /Mul_1 and /radar/act/Clip, stays on the BPU before the CPU /fuse/conv/Conv, in int16."""
    plan = plan_for(concat_to_cpu(False), target, {"/c1": {"ON": "CPU"}})
    assert plan.placement["/cat"] == "CPU"
    plan = plan_for(concat_to_cpu(True), target, {"/c1": {"ON": "CPU"}})
    assert plan.placement["/cat"] == "BPU" and plan.out_dtype["/cat"] == "int16"
    assert dtype_in(plan, "/cat", 0) == dtype_in(plan, "/c2") == "int16"


def test_a_concat_with_an_entry_keeps_each_inputs_threshold(target):
    """The example's int16_concat4 (int16 in and out on /Concat_4): its Resize input keeps 4.647 while the Concat
    is at 11.484; without the entry (int16_2convs, or all int8) the Resize input takes the Concat's 11.484."""
    g = decoder()
    assert plan_for(g, target).scale_of.get("/rs_out") == "/cat_out"
    plan = plan_for(g, target, {"/cat": {"InputType": "int16", "OutputType": "int16"}})
    assert plan.scale_of.get("/rs_out") != "/cat_out" and "/cat_out" not in plan.scale_of
    assert dtype_in(plan, "/cat", 0) == dtype_in(plan, "/cat", 1) == "int16"


def test_on_cpu_on_an_activation_fused_into_a_bpu_conv_does_nothing(target):
    """Q1, Q2: ``ON: CPU`` on the Relu or Clip of a BPU Conv: hb fuses them all the same (no calibration between,
    no row); the latency benchmark's pareto_t37 (/radar/act/Clip)."""
    g = decoder()
    plan = plan_for(g, target, {"/relu1": {"ON": "CPU"}})
    assert plan.placement["/relu1"] == "BPU" and ("/c1", "/relu1") in plan.fused
    assert any("has no effect on an activation fused into its Conv /c1" in n for n in plan.notes)
    assert set(plan_for(g, target, {"/relu1": {"ON": "CPU"}, "/c1": {"ON": "CPU"}}).cpu_nodes) == {"/c1", "/relu1"}


# -- through tuner's graph optimizer (projects opened as workspaces) --------------------------------------


def radar_where(tmp_path) -> Path:
    """x[1,4,8,8]: Slice rgb (0..2) -> Conv0 -> Sigmoid -> a, Conv1 -> b; Slice radar (3) -> Greater(., 0.5) ->
    Where(., b, a) (toy GU: the example's radar mask). The radar channel: 0 or uniform in 0..2, one 80."""
    t = Toy(channels=4, size=8)
    i64 = np.int64
    rgb = t.op("Slice", "/sl0", ["x", t.const("s0", [0], i64), t.const("e0", [3], i64), t.const("ax", [1], i64)])
    rad = t.op("Slice", "/sl1", ["x", t.const("s1", [3], i64), t.const("e1", [4], i64), "ax"])
    a = t.op("Sigmoid", "/sig", [t.conv("/c0", rgb, 3, 1)])
    b = t.conv("/c1", rgb, 3, 1)
    m = t.op("Greater", "/gt", [rad, t.const("half", 0.5)])
    y = t.op("Where", "/wh", [m, b, a])

    def sample(rng):
        x = rng.standard_normal((1, 4, 8, 8))
        x[:, 3] = rng.uniform(0, 2, (8, 8)) * (rng.uniform(0, 1, (8, 8)) < 0.6)
        x[0, 3, 0, 0] = 80.0
        return x
    return t.project(tmp_path, [y], name="gt", sample=sample)


def test_a_bpu_comparison_compares_integers(tmp_path):
    """GU1, GU2: a Greater on the BPU (``HzQuantizedComparison``) compares the input's integers with the constant
    rounded on the grid of the compared tensor's own threshold (its calibration node, ``constant: 1``): int8, the
    radar quantized at its Slice group's 3.464, the constant is 1 (0.5 at 80/127) and the mask is x > 3.464/127
    (real output cosine 0.8677, sim now 0.8677, the float compare gave 0.9977); int16 at 80, 205 and
    x > 205 * 80/32767. On the CPU it compares floats. The example's /Greater (ON: BPU in the latency
    benchmark's Pareto trials): depth SQNR 37.99 dB real, 42.86 simulated with a float compare, 37.62 now.
    The Where's Cast is not in hb's graph then: simulated on the BPU, in the Greater's subgraph."""
    ws = Workspace.open(radar_where(tmp_path))
    sim = ws.simulator
    for nodes, dtype, qmax in (({"/gt": {"ON": "BPU"}}, "int8", 127),
                               ({"/gt": {"ON": "BPU"}, "/sl1": {"InputType": "int16", "OutputType": "int16"}},
                                "int16", 32767)):
        cand = Candidate.make(Calibration("max"), nodes)
        plan, table = sim.plan(cand), sim.scales(cand.calibration)
        assert plan.placement["/wh_cast"] == "BPU" and plan.subgraph["/wh_mul_x"] == plan.subgraph["/gt"]
        model = build_sim_model(ws.model.proto, sim.graph, sim.target, plan, table, sim.weights)
        gt = next(n for n in model.graph.node if n.name == "/gt")
        inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        own = table.threshold("/sl1_out", dtype)
        grid = table.threshold(plan.scale_of.get("/sl1_out", "/sl1_out"), dtype)
        assert float(inits[gt.input[1]]) == pytest.approx(np.round(0.5 / (own / qmax)) * grid / qmax, rel=1e-6)
        assert float(inits[gt.input[1]]) != pytest.approx(0.5, abs=1e-7)
        assert np.isfinite(sim.evaluate(cand).outputs["/wh_out"]["cosine"])
    plan = sim.plan(Candidate.make(Calibration("max")))
    assert plan.placement["/gt"] == plan.placement["/wh_cast"] == "CPU"
    model = build_sim_model(ws.model.proto, sim.graph, sim.target, plan, sim.scales(Calibration("max")), sim.weights)
    gt = next(n for n in model.graph.node if n.name == "/gt")
    assert gt.input[1] == "half"


def test_an_add_folded_into_a_lowered_mul_takes_no_int16_entry(tmp_path):
    """PP-OCRv4's int16_top10 of the latency benchmark: int16 in and out on p2o.Add.98, an Add of a constant
    that hb's optimizer folds into the bias of the lowered Mul p2o.Mul.70 before it, left p2o.Mul.70 int8 (the
    Add is gone when node_info is applied); tuner gave its fields to the Mul. An entry on the Mul itself works."""
    t = Toy()
    k = t.const("k", np.full((1, 8, 1, 1), 0.5))
    bias = t.const("bias", np.full((1, 8, 1, 1), 0.1))
    m = t.op("Mul", "/mul", [t.op("Sigmoid", "/sig", [t.conv("/c0", "x", 8, 8)]), k])
    y = t.conv("/c1", t.op("Add", "/add", [m, bias]), 8, 4)      # padded: the scale stays a node of its own
    ws = Workspace.open(t.project(tmp_path, [y]))
    sim = ws.simulator
    assert "/add" not in sim.graph.by_name and sim.graph.by_name["/mul"].op_type == "HzChannelScale"
    ev = sim.evaluate(Candidate.make(Calibration("max"), {"/add": {"InputType": "int16", "OutputType": "int16"}}))
    assert int16_inputs(ev.plan) == set()
    assert any("'/add'" in n and "has no effect" in n for n in ev.notes)
    plan = sim.plan(Candidate.make(Calibration("max"), {"/mul": {"InputType": "int16"}}))
    assert dtype_in(plan, "/mul") == "int16"


# -- against the real tool -------------------------------------------------------------------------------


def _calibrated_dtypes(plan) -> dict[str, str]:
    """tensor -> the widest dtype the plan's calibrated view quantizes it in."""
    cal = plan.as_calibrated()
    out: dict[str, str] = {}
    for t, d in list(cal.edges.values()) + list(cal.passthrough.values()) + list(plan.outputs.items()) \
            + list(plan.cpu_reads.values()):
        if out.get(t) != "int16":
            out[t] = d
    return out


@pytest.mark.parametrize("case", ["relu2_out", "relu1_in", "c2_in", "clip_in"])
def test_the_int16_tensors_are_the_real_tools(hb_toolchain, tmp_path, case):
    """Converts a toy with one entry (O0, cached by content) and compares every calibrated tensor's qtype with the
    plan's: U1 (nothing int16 behind a Resize), U5 (the Relu's InputType is its group's output), V5 (the
    unfused residual block), W5 (the unfused Conv+Clip)."""
    from tuner.inputs.calibrated import read_calibrated
    from tuner.toolchain.hbrun import CompileKnobs, convert

    t = Toy()
    if case in ("relu2_out", "relu1_in"):
        a = t.op("Relu", "/relu0", [t.conv("/c0", "x", 8, 8)])
        b = t.op("Relu", "/relu1", [t.conv("/c1", a, 8, 8, stride=2)])
        d = t.op("Relu", "/relu2", [t.conv("/c2", b, 8, 8)])
        up = t.op("Resize", "/rs", [d, t.const("roi", []), t.const("sc", [1, 1, 2, 2])], mode="nearest")
        y = t.conv("/c4", t.op("Relu", "/relu3", [t.conv("/c3", t.op("Concat", "/cat", [up, a], axis=1), 16, 8)]),
                   8, 4, k=1)
        entry = "{'/relu2': {'OutputType': 'int16'}}" if case == "relu2_out" else "{'/relu1': {'InputType': 'int16'}}"
    elif case == "c2_in":
        r = t.op("Relu", "/relu0", [t.conv("/c0", "x", 8, 8)])
        s = t.op("Relu", "/relu1", [t.conv("/c1", r, 8, 8)])
        p = t.op("Relu", "/relu2", [t.op("Add", "/add", [t.conv("/c2", s, 8, 8), r])])
        y = t.conv("/c3", p, 8, 4, k=1)
        entry = "{'/c2': {'InputType': 'int16'}}"
    else:
        c = t.op("Clip", "/clip", [t.conv("/c0", "x", 8, 8), t.const("lo", 0.0), t.const("hi", 6.0)])
        up = t.op("Resize", "/rs", [c, t.const("roi", []), t.const("sc", [1, 1, 2, 2])], mode="nearest")
        y = t.conv("/c4", up, 8, 4, k=1)
        entry = "{'/clip': {'InputType': 'int16'}}"
    cfg = t.project(tmp_path, [y], name=f"int16_{case}", node_info=entry)
    conv = convert(hb_toolchain, cfg, CompileKnobs(optimize_level="O0"))
    assert conv.ok, conv.error
    real: dict[str, set[str]] = {}
    for n in read_calibrated(conv.model("calibrated")).activations():
        real.setdefault(n.tensor, set()).add(n.qtype)
    ws = Workspace.open(cfg)
    mine = _calibrated_dtypes(ws.simulator.plan(ws.base_candidate()))
    compared = [tensor for tensor in mine if tensor in real]
    assert len(compared) >= 4
    for tensor in compared:
        assert mine[tensor] in real[tensor], (tensor, mine[tensor], real[tensor])
    assert any(mine[t] == "int16" for t in compared) == (case != "relu2_out")
